/*
 * What the runtime is doing, while it does it: a status line on the terminal and, with
 * --telemetry FILE, one JSON object per generated token (JSON lines: easy to tail, grep or plot).
 *
 * Figures are cumulative since the model was loaded unless named otherwise; tok_s is the decode
 * rate over the last second, so it tracks cache warm-up and stalls.
 */
#include "telemetry.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

bool telem_open(telem *t, const char *path, tr_model *m) {
    memset(t, 0, sizeof *t);
    t->model = m;
    t->t0 = now_ms();
    if (path) {
        t->path = path;
        t->f = fopen(path, "w");
        if (!t->f) {
            cli_error("cannot write the telemetry file %s: %s", path, strerror(errno));
            return false;
        }
    }
    /* status line: on stderr when it is a terminal. If stdout is the same terminal (the text
     * streams there), the bottom line is reserved with a scroll region so text and status do
     * not overwrite each other. */
    t->status = isatty(2);
    if (t->status && isatty(1)) {
        struct stat a, b;
        struct winsize ws;
        if (fstat(1, &a) == 0 && fstat(2, &b) == 0 && a.st_rdev == b.st_rdev &&
            ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 2) {
            t->rows = ws.ws_row;
            /* make room, confine scrolling to rows 1..rows-1, return into the region */
            fprintf(stderr, "\n\033[1;%dr\033[%d;1H", t->rows - 1, t->rows - 1);
            fflush(stderr);
        }
    }
    return true;
}

static void put_status(telem *t, const char *s) {
    if (!t->status) return;
    if (t->rows) {
        fflush(stdout);
        fprintf(stderr, "\0337\033[%d;1H\033[K%s\0338", t->rows, s);
    } else {
        fprintf(stderr, "\r\033[K%s", s);
    }
    fflush(stderr);
}

bool telem_close(telem *t) {
    bool ok = true;
    if (t->status) {
        if (t->rows) {
            fflush(stdout);
            fprintf(stderr, "\0337\033[%d;1H\033[K\0338\033[r", t->rows);
        } else if (t->shown) {
            fputs("\r\033[K", stderr);
        }
        fflush(stderr);
    }
    if (t->f) {
        errno = 0;
        const bool bad = ferror(t->f);
        if (fclose(t->f) != 0 || bad) {
            cli_error("cannot write the telemetry file %s: %s", t->path,
                      strerror(errno ? errno : EIO));
            ok = false;
        }
    }
    t->f = NULL;
    t->status = false;
    t->rows = 0;
    return ok;
}

bool telem_token(telem *t, int32_t index, int32_t token, double ttft_ms, const gen_sink_info *info) {
    const double now = now_ms();
    /* decode rate over the last second (a ring of recent token times) */
    t->times[t->n_times % TELEM_WINDOW] = now;
    t->n_times++;
    double tok_s = 0;
    const int n = t->n_times < TELEM_WINDOW ? t->n_times : TELEM_WINDOW;
    if (n >= 2) {
        const double oldest = t->times[(t->n_times - n) % TELEM_WINDOW];
        int k = n - 1;
        double span = now - oldest;
        /* shrink the window to about a second */
        for (int i = 1; i < n - 1 && span > 1000.0; i++) {
            span = now - t->times[(t->n_times - n + i) % TELEM_WINDOW];
            k = n - 1 - i;
        }
        if (span > 0) tok_s = 1e3 * k / span;
    }
    tr_model_stats st;
    tr_model_get_stats(t->model, &st);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double rss = current_rss_mib();
    const uint64_t lookups = st.expert_hits + st.expert_misses;
    const double hit = lookups ? (double)st.expert_hits / (double)lookups : 0.0;
    if (t->f) {
        errno = 0; /* whichever write of the line fails first sets it */
        fprintf(t->f,
                "{\"token\": %d, \"id\": %d, \"t_ms\": %.3f, \"tok_s\": %.3f, \"ttft_ms\": %.3f, "
                "\"rss_mb\": %.1f, \"hit_rate\": %.5f, \"expert_hits\": %llu, \"expert_misses\": %llu, "
                "\"bytes_read\": %llu, \"io_wait_ms\": %.3f, \"io_busy_ms\": %.3f, \"cache_bytes\": %llu, "
                "\"budget_bytes\": %llu, \"evictions\": %llu, \"majflt\": %ld, \"minflt\": %ld, "
                "\"prefetch_issued\": %llu, \"prefetch_used\": %llu, \"prefetch_wasted_bytes\": %llu, "
                "\"policy_ms\": %.3f, \"policy_hidden_ms\": %.3f, \"protected_evictions\": %llu",
                index, token, now - t->t0, tok_s, ttft_ms, rss, hit,
                (unsigned long long)st.expert_hits, (unsigned long long)st.expert_misses,
                (unsigned long long)st.expert_bytes_read, (double)st.expert_io_wait_ns / 1e6,
                (double)st.expert_io_busy_ns / 1e6,
                (unsigned long long)st.expert_cache_bytes, (unsigned long long)st.expert_budget_bytes,
                (unsigned long long)st.expert_evictions, ru.ru_majflt, ru.ru_minflt,
                (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_used,
                (unsigned long long)st.prefetch_wasted_bytes, (double)st.expert_policy_ns / 1e6,
                (double)st.expert_policy_hidden_ns / 1e6, (unsigned long long)st.protected_evictions);
        if (t->sess) {
            tr_kv_stats kv;
            tr_session_get_kv_stats(t->sess, &kv);
            char buf[2048];
            tr_kv_stats_format(&kv, TR_KV_STATS_JSON, NULL, buf, sizeof buf);
            fprintf(t->f, ", %s", buf);
        }
        if (info && info->extra) fprintf(t->f, ", %s", info->extra);
        if (fputs("}\n", t->f) == EOF || ferror(t->f)) {
            cli_error("cannot write the telemetry file %s: %s", t->path,
                      strerror(errno ? errno : EIO));
            fclose(t->f); /* the error is reported; close does not report it again */
            t->f = NULL;
            return false;
        }
    }
    if (!t->status || now - t->last_status < 250.0) return true;
    t->last_status = now;
    t->shown = true;
    char line[256];
    int o = snprintf(line, sizeof line, "%6.2f tok/s | TTFT %.0f ms | RSS %.0f MiB", tok_s, ttft_ms,
                     rss);
    if (st.expert_cache) {
        const double wall = now - t->t0;
        o += snprintf(line + o, sizeof line - (size_t)o,
                      " | hit %.1f%% | read %.0f MiB | I/O wait %.0f%% | cache %.0f/%.0f MiB",
                      100.0 * hit, (double)st.expert_bytes_read / 1048576.0,
                      wall > 0 ? 100.0 * ((double)st.expert_io_wait_ns / 1e6) / wall : 0.0,
                      (double)st.expert_cache_bytes / 1048576.0,
                      (double)st.expert_budget_bytes / 1048576.0);
    }
    snprintf(line + o, sizeof line - (size_t)o, " | majflt %ld", ru.ru_majflt);
    put_status(t, line);
    return true;
}
