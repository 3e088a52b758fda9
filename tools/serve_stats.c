/*
 * The server's counters, printed two ways from one table: Prometheus text for GET /metrics and a
 * JSON object for the live page's GET /telemetry stream. A snapshot is copied under the lock and
 * printed without it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve.h"

/* ---------------------------------------------------------------------------------------------- */

void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        sb_add(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_add(b, big, (size_t)n);
    free(big);
}

void sb_free(sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

double serve_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long pages = 0, rss = 0;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return (double)rss * (double)sysconf(_SC_PAGESIZE);
}

/* ---------------------------------------------------------------------------------------------- */

static const char *const k_routes[ROUTE_COUNT] = {
    [ROUTE_CHAT] = "/v1/chat/completions", [ROUTE_COMPLETIONS] = "/v1/completions",
    [ROUTE_MODELS] = "/v1/models", [ROUTE_OLLAMA_CHAT] = "/api/chat",
    [ROUTE_OLLAMA_GENERATE] = "/api/generate", [ROUTE_OLLAMA_TAGS] = "/api/tags",
    [ROUTE_OLLAMA_VERSION] = "/api/version", [ROUTE_HEALTH] = "/health",
    [ROUTE_METRICS] = "/metrics", [ROUTE_TELEMETRY] = "/telemetry", [ROUTE_PAGE] = "/",
    [ROUTE_OTHER] = "other"};
static const int k_codes[CODE_COUNT] = {200, 400, 401, 404, 405, 413, 500, 503};
static const char *const k_finish[FINISH_ERROR + 1] = {
    [FINISH_NONE] = "none", [FINISH_STOP] = "stop", [FINISH_LENGTH] = "length",
    [FINISH_CANCELLED] = "cancelled", [FINISH_SHUTDOWN] = "shutdown",
    [FINISH_REFUSED] = "refused", [FINISH_ERROR] = "error"};
/* TTFT histogram bounds, seconds */
static const double k_ttft_le[TTFT_BUCKETS] = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

void stats_count_request(server *s, int route, int status) {
    int c = CODE_500;
    for (int i = 0; i < CODE_COUNT; i++)
        if (k_codes[i] == status) c = i;
    pthread_mutex_lock(&s->mu);
    s->st.requests[route][c]++;
    pthread_mutex_unlock(&s->mu);
}

void stats_ttft_locked(server *s, double ms) {
    for (int i = 0; i < TTFT_BUCKETS; i++)
        if (ms <= k_ttft_le[i] * 1e3) s->st.ttft_bucket[i]++;
    s->st.ttft_count++;
    s->st.ttft_sum_ms += ms;
}

void stats_after_step(server *s, double step_ms, int rows, int decode_rows) {
    serve_stats *st = &s->st;
    st->steps++;
    st->step_ms += step_ms;
    st->step_rows += (uint64_t)rows;
    st->step_decode_rows += (uint64_t)decode_rows;
    st->rate_t[st->rate_pos] = now_ms();
    st->rate_n[st->rate_pos] = st->gen_tokens;
    st->rate_pos = (st->rate_pos + 1) % RATE_WINDOW;
    if (st->rate_len < RATE_WINDOW) st->rate_len++;
}

/* tokens generated per second over the last ~2 s of steps (0 when idle for that long) */
double stats_recent_tok_s_locked(const server *s) {
    const serve_stats *st = &s->st;
    if (st->rate_len < 2) return 0;
    const double now = now_ms();
    const int last = (st->rate_pos + RATE_WINDOW - 1) % RATE_WINDOW;
    if (now - st->rate_t[last] > 2000) return 0;
    int first = last;
    for (int k = 1; k < st->rate_len; k++) {
        const int i = (last + RATE_WINDOW - k) % RATE_WINDOW;
        if (now - st->rate_t[i] > 2000) break;
        first = i;
    }
    const double dt = now - st->rate_t[first];
    return dt > 0 ? 1e3 * (double)(st->rate_n[last] - st->rate_n[first]) / dt : 0;
}

/* ---------------------------------------------------------------------------------------------- */

typedef struct snapshot {
    serve_stats st;
    int queue, busy, n_slots;
    double tok_s, rss, uptime_s;
    int slot_state[256];
    int32_t slot_tokens[256];
    double slot_tok_s[256];
} snapshot;

static void take_snapshot(server *s, snapshot *o) {
    pthread_mutex_lock(&s->mu);
    o->st = s->st;
    o->queue = s->q_len;
    o->busy = slots_busy_locked(s);
    o->n_slots = s->n_slots < 256 ? s->n_slots : 256;
    o->tok_s = stats_recent_tok_s_locked(s);
    for (int i = 0; i < o->n_slots; i++)
        slot_figures_locked(s, i, &o->slot_state[i], &o->slot_tokens[i], &o->slot_tok_s[i]);
    pthread_mutex_unlock(&s->mu);
    o->rss = serve_rss_bytes();
    o->uptime_s = (now_ms() - s->started) / 1e3;
}

/* the unlabelled metrics: name (without terrace_), type, help, value */
#define SCALAR_METRICS(X)                                                                         \
    X("prompt_tokens_total", "counter", "prompt tokens of admitted requests",                     \
      (double)p->st.prompt_tokens)                                                                \
    X("prompt_tokens_reused_total", "counter",                                                    \
      "prompt tokens a slot already held (a shared prefix, not recomputed)",                      \
      (double)p->st.prompt_tokens_reused)                                                         \
    X("generated_tokens_total", "counter", "tokens generated", (double)p->st.gen_tokens)          \
    X("decode_tokens_per_second", "gauge", "tokens generated per second, last 2 s", p->tok_s)     \
    X("queue_length", "gauge", "requests waiting for a slot", (double)p->queue)                   \
    X("slots_busy", "gauge", "slots prefilling or generating", (double)p->busy)                   \
    X("slots_total", "gauge", "slots (--parallel)", (double)p->n_slots)                           \
    X("steps_total", "counter", "batched forward passes", (double)p->st.steps)                    \
    X("step_seconds_total", "counter", "time in batched forward passes", p->st.step_ms / 1e3)     \
    X("step_rows_total", "counter", "tokens computed in steps (prompt and generated)",            \
      (double)p->st.step_rows)                                                                    \
    X("step_decode_rows_total", "counter", "generating rows in steps",                            \
      (double)p->st.step_decode_rows)                                                             \
    X("expert_cache_hits_total", "counter", "routed experts found in the expert cache",           \
      (double)p->st.model.expert_hits)                                                            \
    X("expert_cache_misses_total", "counter", "routed experts read from storage",                 \
      (double)p->st.model.expert_misses)                                                          \
    X("expert_bytes_read_total", "counter", "bytes of experts read from storage",                 \
      (double)p->st.model.expert_bytes_read)                                                      \
    X("expert_io_wait_seconds_total", "counter", "compute blocked waiting for expert reads",      \
      (double)p->st.model.expert_io_wait_ns / 1e9)                                                \
    X("expert_cache_bytes", "gauge", "bytes of experts in the cache",                             \
      (double)p->st.model.expert_cache_bytes)                                                     \
    X("expert_cache_budget_bytes", "gauge", "the expert cache's budget",                          \
      (double)p->st.model.expert_budget_bytes)                                                    \
    X("kv_hot_bytes", "gauge", "KV cache bytes in DRAM, every slot", (double)p->st.kv_hot_bytes)  \
    X("kv_cold_bytes", "gauge", "KV cache bytes on storage, every slot",                          \
      (double)p->st.kv_cold_bytes)                                                                \
    X("kv_tokens", "gauge", "tokens held in the slots' KV caches", (double)p->st.kv_tokens)       \
    X("rss_bytes", "gauge", "resident set size of the server", p->rss)                            \
    X("uptime_seconds", "gauge", "seconds since the server started", p->uptime_s)

void stats_prometheus(server *s, sbuf *o) {
    snapshot *p = malloc(sizeof *p);
    if (!p) {
        o->oom = true;
        return;
    }
    take_snapshot(s, p);
    sb_str(o, "# HELP terrace_requests_total HTTP requests answered, by route and status\n"
              "# TYPE terrace_requests_total counter\n");
    for (int r = 0; r < ROUTE_COUNT; r++)
        for (int c = 0; c < CODE_COUNT; c++)
            if (p->st.requests[r][c])
                sb_printf(o, "terrace_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                          k_routes[r], k_codes[c], (unsigned long long)p->st.requests[r][c]);
    sb_str(o, "# HELP terrace_requests_finished_total generations, by how they ended\n"
              "# TYPE terrace_requests_finished_total counter\n");
    for (int f = FINISH_STOP; f <= FINISH_ERROR; f++)
        sb_printf(o, "terrace_requests_finished_total{reason=\"%s\"} %llu\n", k_finish[f],
                  (unsigned long long)p->st.finished[f]);
#define PROM(name, type, help, value)                                                              \
    sb_printf(o, "# HELP terrace_" name " " help "\n# TYPE terrace_" name " " type                  \
                 "\nterrace_" name " %.17g\n", (double)(value));
    SCALAR_METRICS(PROM)
#undef PROM
    sb_str(o, "# HELP terrace_slot_tokens_per_second decode rate of each slot's request\n"
              "# TYPE terrace_slot_tokens_per_second gauge\n");
    for (int i = 0; i < p->n_slots; i++)
        sb_printf(o, "terrace_slot_tokens_per_second{slot=\"%d\"} %.6g\n", i, p->slot_tok_s[i]);
    sb_str(o, "# HELP terrace_slot_state 0 idle, 1 prefilling, 2 generating\n"
              "# TYPE terrace_slot_state gauge\n");
    for (int i = 0; i < p->n_slots; i++)
        sb_printf(o, "terrace_slot_state{slot=\"%d\"} %d\n", i, p->slot_state[i]);
    sb_str(o, "# HELP terrace_ttft_seconds time from a request's arrival to its first token\n"
              "# TYPE terrace_ttft_seconds histogram\n");
    for (int i = 0; i < TTFT_BUCKETS; i++)
        sb_printf(o, "terrace_ttft_seconds_bucket{le=\"%g\"} %llu\n", k_ttft_le[i],
                  (unsigned long long)p->st.ttft_bucket[i]);
    sb_printf(o, "terrace_ttft_seconds_bucket{le=\"+Inf\"} %llu\nterrace_ttft_seconds_sum %.6f\n"
                 "terrace_ttft_seconds_count %llu\n",
              (unsigned long long)p->st.ttft_count, p->st.ttft_sum_ms / 1e3,
              (unsigned long long)p->st.ttft_count);
    free(p);
}

void stats_json(server *s, sbuf *o) {
    snapshot *p = malloc(sizeof *p);
    if (!p) {
        o->oom = true;
        return;
    }
    take_snapshot(s, p);
    uint64_t requests = 0;
    for (int r = 0; r < ROUTE_COUNT; r++)
        for (int c = 0; c < CODE_COUNT; c++) requests += p->st.requests[r][c];
    sb_printf(o, "{\"requests_total\":%llu", (unsigned long long)requests);
#define JSON(name, type, help, value) sb_printf(o, ",\"" name "\":%.17g", (double)(value));
    SCALAR_METRICS(JSON)
#undef JSON
    sb_printf(o, ",\"ttft_count\":%llu,\"ttft_sum_seconds\":%.6f,\"moe\":%s,\"slots\":[",
              (unsigned long long)p->st.ttft_count, p->st.ttft_sum_ms / 1e3,
              p->st.model.moe ? "true" : "false");
    for (int i = 0; i < p->n_slots; i++)
        sb_printf(o, "%s{\"state\":%d,\"tokens\":%d,\"tok_s\":%.4g}", i ? "," : "",
                  p->slot_state[i], p->slot_tokens[i], p->slot_tok_s[i]);
    sb_str(o, "]}");
    free(p);
}
