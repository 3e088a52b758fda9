/*
 * The generation loop shared by `run` and `chat`: prefill a prompt (with a progress bar when it
 * is long), then sample, stream and evaluate token by token until the end of generation, a stop
 * string, the token limit or the end of the context. Text is streamed as it comes, except what
 * could still turn out to be the start of a stop string.
 */
#include "generate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void out_append(gen_state *g, const char *s, size_t n) {
    if (g->len + n + 1 > g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 4096;
        while (cap < g->len + n + 1) cap *= 2;
        char *b = realloc(g->text, cap);
        if (!b) { /* the text could not be kept: stop rather than lose it */
            if (!g->sink_errno) g->sink_errno = ENOMEM;
            return;
        }
        g->text = b;
        g->cap = cap;
    }
    memcpy(g->text + g->len, s, n);
    g->len += n;
    g->text[g->len] = '\0';
}

/* prints what is safe to print; returns true if a stop string was found */
static bool flush_text(gen_state *g, const gen_opts *o, bool final) {
    bool stopped;
    const size_t end = cli_stop_scan(g->text, g->len, g->printed, o->stop, o->n_stop, final,
                                     &stopped);
    if (end > g->printed) {
        errno = 0;
        if (g->sink && !g->sink(g->sink_user, g->text + g->printed, end - g->printed) &&
            !g->sink_errno)
            g->sink_errno = errno ? errno : EIO;
        g->printed = end;
    }
    return stopped;
}

/* the output stream failed: generating on would only lose more text */
static bool sink_failed(const gen_state *g) {
    if (!g->sink_errno) return false;
    cli_error("cannot write the generated text to standard output: %s", strerror(g->sink_errno));
    return true;
}

static void prefill_progress(const gen_state *g, int32_t done, int32_t total) {
    if (total >= 256) progress_bar("prefill", (uint64_t)done, (uint64_t)total);
    (void)g;
}

bool gen_prefill(gen_state *g, tr_session *s, const int32_t *toks, size_t n, float *logits) {
    tr_error err = {0};
    /* one batch per call: a chunk is what the KV cache reads its cold pool once for */
    const int32_t chunk = tr_session_n_batch(s);
    const double t0 = now_ms();
    for (size_t done = 0; done < n;) {
        const int32_t k = n - done < (size_t)chunk ? (int32_t)(n - done) : chunk;
        const bool last = done + (size_t)k == n;
        const tr_status st = tr_session_eval(s, toks + done, k, last ? logits : NULL, false, &err);
        if (st == TR_E_ABORTED) {
            g->interrupted = true;
            g->stopped_by = "interrupted";
            g->prefill_ms += now_ms() - t0;
            return false;
        }
        if (st) {
            cli_error("%s", err.msg);
            return false;
        }
        done += (size_t)k;
        prefill_progress(g, (int32_t)done, (int32_t)n);
    }
    g->prefill_ms += now_ms() - t0;
    g->n_prompt += (int32_t)n;
    return true;
}

bool gen_run(gen_state *g, const gen_opts *o, const loaded *ld, tr_session *s, tr_sampler *smp,
             float *logits) {
    tr_error err = {0};
    char piece[512];
    const double t_start = now_ms();
    g->stopped_by = "limit";
    for (int32_t i = 0; o->n_predict < 0 || i < o->n_predict; i++) {
        if (g->interrupt && *g->interrupt) {
            g->interrupted = true;
            g->stopped_by = "interrupted";
            break;
        }
        const int32_t tok = tr_sampler_sample(smp, logits);
        if (g->n_gen == 0) g->ttft_ms = g->prefill_ms + (now_ms() - t_start);
        if (!o->ignore_eos && tr_token_is_eog(ld->tok, tok)) {
            g->stopped_by = "end of generation";
            break;
        }
        tr_sampler_accept(smp, tok);
        if (g->n_ids == g->cap_ids) {
            const size_t cap = g->cap_ids ? g->cap_ids * 2 : 256;
            int32_t *ids = realloc(g->ids, cap * sizeof *ids);
            if (!ids) {
                cli_error("out of memory for the generated tokens");
                return false;
            }
            g->ids = ids;
            g->cap_ids = cap;
        }
        g->ids[g->n_ids++] = tok;
        g->n_gen++;
        g->last_token = tok;
        if (g->tm && !telem_token(g->tm, g->n_gen - 1, tok, g->ttft_ms, NULL)) return false;
        const int n = piece_of(ld->tok, tok, piece, sizeof piece);
        out_append(g, piece, (size_t)n);
        const bool stop = flush_text(g, o, false);
        if (sink_failed(g)) return false;
        if (stop) {
            g->stopped_by = "stop string";
            break;
        }
        if (o->n_predict >= 0 && i + 1 >= o->n_predict) break;
        if (tr_session_n_past(s) >= tr_session_n_ctx(s)) {
            if (g->on_full && g->on_full(g->full_user, g, logits)) continue;
            if (!g->interrupted) g->stopped_by = "context full";
            break;
        }
        const double t0 = now_ms();
        const tr_status st = tr_session_eval(s, &tok, 1, logits, false, &err);
        if (st == TR_E_ABORTED) {
            g->interrupted = true;
            g->stopped_by = "interrupted";
            break;
        }
        if (st) {
            cli_error("%s", err.msg);
            return false;
        }
        g->decode_ms += now_ms() - t0;
        g->n_decoded++;
    }
    flush_text(g, o, true);
    return !sink_failed(g);
}

void gen_summary(const gen_state *g, const loaded *ld, const tr_session *s) {
    char b1[32];
    fprintf(stderr, "\n");
    fprintf(stderr, "terrace: model        %s, %s of weights, %d layers, kernels %s, %d threads\n",
            tr_model_arch(ld->model), cli_bytes(tr_model_weight_bytes(ld->model), b1, sizeof b1),
            tr_model_n_layer(ld->model), tr_cpu_isa(), tr_pool_size(tr_model_pool(ld->model)));
    fprintf(stderr, "terrace: load time    %10.1f ms\n", ld->load_ms);
    fprintf(stderr, "terrace: prompt       %10d tokens  %10.1f ms  %8.2f tok/s (prefill)\n",
            g->n_prompt, g->prefill_ms, g->prefill_ms > 0 ? 1e3 * g->n_prompt / g->prefill_ms : 0.0);
    fprintf(stderr, "terrace: TTFT         %10.1f ms\n", g->ttft_ms);
    fprintf(stderr, "terrace: generated    %10d tokens  %10.1f ms  %8.2f tok/s (decode), stopped by %s\n",
            g->n_gen, g->decode_ms, g->decode_ms > 0 ? 1e3 * g->n_decoded / g->decode_ms : 0.0,
            g->stopped_by);
    tr_model_stats st;
    tr_model_get_stats(ld->model, &st);
    if (st.moe && st.expert_cache) {
        const uint64_t n = st.expert_hits + st.expert_misses;
        char b2[32], b3[32];
        fprintf(stderr, "terrace: experts      cache %s of %s (%s policy, %s reads), hit rate %.1f%%, "
                        "read %s, I/O wait %.1f ms, %llu evictions, policy %.1f ms\n",
                cli_bytes(st.expert_cache_bytes, b1, sizeof b1),
                cli_bytes(st.expert_budget_bytes, b2, sizeof b2), st.expert_policy,
                st.direct_io ? "O_DIRECT" : "buffered", n ? 100.0 * st.expert_hits / n : 0.0,
                cli_bytes(st.expert_bytes_read, b3, sizeof b3), st.expert_io_wait_ns / 1e6,
                (unsigned long long)st.expert_evictions, st.expert_policy_ns / 1e6);
        if (st.prefetch_predicted)
            fprintf(stderr, "terrace: prefetch     %llu predictions, %.1f%% right; %llu reads issued, "
                            "%llu used, %s wasted\n",
                    (unsigned long long)st.prefetch_predicted,
                    100.0 * st.prefetch_correct / st.prefetch_predicted,
                    (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_used,
                    cli_bytes(st.prefetch_wasted_bytes, b2, sizeof b2));
    } else if (st.moe) {
        fprintf(stderr, "terrace: experts      through mmap (--experts mmap): the kernel's page cache decides\n");
    }
    print_kv_stats(stderr, s, "terrace: ");
    tr_mem_plan pl;
    tr_session_get_plan(s, &pl);
    print_plan(stderr, &pl, "terrace: ");
    /* this process's plan against this process's peak; the storage agent's apart (its own
     * process: its VmHWM holds its own pages and the shared region's it touched) */
    const double host = plan_host_mib(&pl);
    fprintf(stderr, "terrace: memory       plan without the margin %.1f MiB, peak RSS %.1f MiB (%.2fx)\n",
            host, peak_rss_mib(), host > 0 ? peak_rss_mib() / host : 0.0);
    if (pl.kv_agent_bytes) {
        tr_kv_stats kv;
        tr_session_get_kv_stats(s, &kv);
        fprintf(stderr, "terrace: memory       storage agent (pid %d, its own process): plan %.1f MiB "
                        "of its own, peak RSS %.1f MiB (with the shared region's pages it touched)\n",
                (int)kv.csd_pid, (double)pl.kv_agent_bytes / (1024.0 * 1024.0),
                agent_peak_rss_mib(&kv));
    }
    fprintf(stderr, "terrace: memory       peak RSS %.1f MiB; session %.1f MiB (KV + scratch), "
                    "context %d/%d\n",
            peak_rss_mib(), (double)tr_session_bytes(s) / (1024.0 * 1024.0), tr_session_n_past(s),
            tr_session_n_ctx(s));
}
