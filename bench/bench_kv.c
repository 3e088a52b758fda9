/*
 * Decode-step speed of the KV policies on a 7B-like attention shape: 32 layers, 32 query heads
 * and 32 KV heads of 128 (F16 K+V: 512 KiB per token, 16 GiB at 32K), most of the KV in the cold
 * pool on local storage. Driven through the KV cache on its own (include/terrace_seam.h); no
 * model.
 *
 *   build/bench/bench_kv --cold DIR --ctx N --policy P [--batch B] [--alpha A] [--bits 4|8]
 *                        [--hot-frac F] [--steps S] [--threads T] [--io-threads N] [--plan]
 *
 * One JSON line per run (the script bench/bench_kv.sh runs each configuration in its own process,
 * inside a memory cgroup sized from --plan, which prints the DRAM the configuration needs).
 *
 * Fill: a full-attention prefill of 32K tokens is out of reach on 2 cores, so the pools are filled
 * directly through tr_kv_append with keys drawn to match the statistics of real ones: per layer and
 * KV head, per-channel scales (log-normal, with 3 outlier channels 8x larger), per-channel means,
 * RoPE applied at each token's position (base 10000), and 2% "anchor" tokens (plus the first 4)
 * carrying a direction in the slowly rotating channels that the queries share, so they draw much
 * of the attention as heavy hitters do. Values are N(0, 1). Queries: per head 0.7 N(0, 1) + 0.4 *
 * that direction, times 3 (logits spread ~2.5 after 1/sqrt(128)), rotated to the step's position.
 *
 * Timed: one decode step = for every layer, for every sequence of the batch, append the new
 * token's K/V and attend its query row (rows = 1). One untimed warm-up step first (h2o evicts down
 * to its budget there, the cache having been filled without attention). Storage bytes are what the
 * cache read (pread bytes) and what the kernel read for the process (/proc/self/io read_bytes).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "terrace_seam.h"

#define NL   32
#define NKV  32
#define NH   32
#define HD   128
#define POOL 4096

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float unif(uint64_t *s) { /* [-1, 1) */
    *s = mix(*s);
    return (float)((double)(*s >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static float normal(uint64_t *s) {
    float a = 0;
    for (int i = 0; i < 6; i++) a += unif(s);
    return a * 0.7071f;
}

static uint64_t dev_read_bytes(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return 0;
    char line[128];
    unsigned long long v = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %llu", &v) == 1) break;
    fclose(f);
    return v;
}

static int drop_caches(void) {
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f) return 0;
    const int ok = fputs("1\n", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* key statistics per (layer, KV head) and the noise pools */
static float *g_sig, *g_mu, *g_dir, *g_noise;

static void stats_make(void) {
    uint64_t s = 42;
    const size_t n = (size_t)NL * NKV * HD;
    g_sig = malloc(n * sizeof(float));
    g_mu = malloc(n * sizeof(float));
    g_dir = malloc(n * sizeof(float));
    g_noise = malloc((size_t)POOL * HD * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const int c = (int)(i % HD), pair = c % (HD / 2);
        g_sig[i] = expf(0.5f * normal(&s));
        g_mu[i] = 0.3f * normal(&s);
        g_dir[i] = pair >= HD / 4 ? 1.4f * normal(&s) : 0.0f;
    }
    for (size_t lg = 0; lg < (size_t)NL * NKV; lg++)
        for (int o = 0; o < 3; o++) {
            s = mix(s);
            g_sig[lg * HD + HD / 4 + (int)(s % (HD / 4))] *= 8.0f;
        }
    for (size_t i = 0; i < (size_t)POOL * HD; i++) g_noise[i] = normal(&s);
}

static void rope_table(float *cs, int32_t pos) {
    for (int c = 0; c < HD / 2; c++) {
        const double th = pos * pow(10000.0, -2.0 * c / HD);
        cs[2 * c] = (float)cos(th);
        cs[2 * c + 1] = (float)sin(th);
    }
}

static void rope(float *x, const float *cs) {
    for (int c = 0; c < HD / 2; c++) {
        const float a = x[c], b = x[c + HD / 2];
        x[c] = a * cs[2 * c] - b * cs[2 * c + 1];
        x[c + HD / 2] = a * cs[2 * c + 1] + b * cs[2 * c];
    }
}

/* A latent per (sequence, layer, KV head) that drifts along the positions (AR(1), rho per token)
 * in the slowly rotating channels: it makes the scores of neighbouring tokens alike, so the
 * selected tokens form runs as on a real model (bench/results/kv.md gives the calibration). */
static float g_rho = 0.9f, g_smooth = 8.0f;
static float *g_lat; /* [batch][NL][NKV][HD] */

/* K and V of token t of layer l ([NKV][HD] each); seq varies the sequence of a batch. Tokens must
 * come in order of t per (seq, l): the latent advances one step per call. */
static void make_kv(float *k, float *v, int l, int32_t t, int seq, const float *cs) {
    const uint64_t h = mix((uint64_t)t * 1315423911u + (uint64_t)seq * 2654435761u);
    const bool anchor = t < 4 || h % 50 == 0;
    const float a = g_rho, bnoise = sqrtf(1.0f - g_rho * g_rho);
    for (int g = 0; g < NKV; g++) {
        const size_t lg = ((size_t)l * NKV + (size_t)g) * HD;
        const uint64_t hk = mix(h + (uint64_t)(l * NKV + g));
        const float *z = g_noise + (hk % POOL) * HD, *zv = g_noise + ((hk >> 20) % POOL) * HD;
        const float *zl = g_noise + ((hk >> 40) % POOL) * HD;
        float *lat = g_lat + ((size_t)seq * NL * NKV) * HD + lg;
        float *kk = k + (size_t)g * HD, *vv = v + (size_t)g * HD;
        for (int c = 0; c < HD; c++) {
            const bool slow = c % (HD / 2) >= HD / 4;
            if (slow) lat[c] = a * lat[c] + bnoise * zl[c];
            kk[c] = g_mu[lg + c] + g_sig[lg + c] * 0.5f * z[c] +
                    (anchor ? 0.8f * g_dir[lg + c] : 0) + (slow ? g_smooth * lat[c] : 0);
            vv[c] = zv[c];
        }
        rope(kk, cs);
    }
}

/* The query's random part per (sequence, layer, head, channel): AR(1) along the decode steps,
 * correlation g_qrho from one step to the next (0: drawn anew each step). A real
 * model's queries at neighbouring positions are alike, so its selections repeat: at alpha 0.2 a
 * row selects about 72% of what the row before it selected (kv_sel_repeat on SmolLM2-135M and
 * Qwen2.5-0.5B); fresh draws give 23%, 0.96 gives 74% (bench/results/kv.md). */
static float g_qrho = 0.0f;
static float *g_qst;     /* [batch][NL][NH * HD] */
static float *g_qsb;     /* --spec: the speculation's own part, alike from step to step too */
static uint8_t *g_qset;  /* [batch][NL]: the state has been drawn */

static void make_q(float *q, int l, int32_t pos, int seq, const float *cs) {
    uint64_t s = mix((uint64_t)pos * 7919u + (uint64_t)l * 104729u + (uint64_t)seq);
    const size_t at = ((size_t)seq * NL + (size_t)l) * NH * HD;
    float *a = g_qst + at, *b = g_qsb + at;
    uint8_t *set = &g_qset[(size_t)seq * NL + (size_t)l];
    const float keep = *set ? g_qrho : 0.0f, fresh = sqrtf(1.0f - keep * keep);
    *set = 1;
    uint64_t s2 = mix(s ^ 0x5bd1e995u);
    for (int h = 0; h < NH; h++) {
        const size_t lg = ((size_t)l * NKV + (size_t)(h / (NH / NKV))) * HD;
        float *qh = q + (size_t)h * HD, *ah = a + (size_t)h * HD, *bh = b + (size_t)h * HD;
        for (int c = 0; c < HD; c++) {
            ah[c] = keep * ah[c] + fresh * normal(&s);
            bh[c] = keep * bh[c] + fresh * normal(&s2);
            qh[c] = 3.0f * (0.7f * ah[c] + 0.4f * g_dir[lg + c]);
        }
        rope(qh, cs);
    }
}

/* --spec R: layer l + 1's speculative query, given during layer l. A real model's speculation
 * (l + 1's projection of l's input) is close to the real query but not equal: here the query's
 * random part is correlated R with the real one's (the shared direction is kept); its own part
 * persists from step to step as the query's does. Call after make_q for the same (l, pos, seq). */
static void make_q_spec(float *q, int l, const float *cs, int seq, float rho) {
    const size_t at = ((size_t)seq * NL + (size_t)l) * NH * HD;
    const float *a = g_qst + at, *b = g_qsb + at;
    const float o = sqrtf(1.0f - rho * rho);
    for (int h = 0; h < NH; h++) {
        const size_t lg = ((size_t)l * NKV + (size_t)(h / (NH / NKV))) * HD;
        float *qh = q + (size_t)h * HD;
        const float *ah = a + (size_t)h * HD, *bh = b + (size_t)h * HD;
        for (int c = 0; c < HD; c++)
            qh[c] = 3.0f * (0.7f * (rho * ah[c] + o * bh[c]) + 0.4f * g_dir[lg + c]);
        rope(qh, cs);
    }
}

typedef struct bench {
    tr_kv **kv;
    tr_pool *pool;
    int batch, steps;
    int32_t pos_next;
    float spec; /* --spec: 0 off */
    float *cs, *k, *v, *q, *qs, *out;
} bench;

/* --spec: layer + 1's speculative query of sequence b, as the forward pass would give it */
typedef struct next_ctx {
    const bench *B;
    int b;
} next_ctx;

static tr_status next_query(void *ctx, int32_t layer, int32_t row0, int32_t rows,
                            tr_kv_next_query *out, tr_error *err) {
    (void)row0;
    (void)rows;
    (void)err;
    const next_ctx *c = ctx;
    const size_t o = (size_t)c->b * NL + (size_t)layer;
    *out = (tr_kv_next_query){.q = c->B->qs + o * NH * HD,
                              .q_stride = NH * HD,
                              .scale = 1.0f / sqrtf((float)HD),
                              .swa = 0};
    return TR_OK;
}

typedef struct step_result {
    double mean_ms, min_ms, bytes_read, dev_read, read_ops, selected, score_ms, attn_ms, io_ms;
    double csd_scores, csd_rows, csd_storage, promotions, demotions, pingpong, migrated;
    double sel_hot, sel_cold, sel_follow, sel_repeat;
    double spec_rows, spec_early, spec_cos; /* per step; spec_cos: the mean */
    double cpu_user_ms, cpu_sys_ms; /* the process's CPU time per step */
} step_result;

static double tv_ms(const struct timeval *a, const struct timeval *b) {
    return (double)(a->tv_sec - b->tv_sec) * 1e3 + (double)(a->tv_usec - b->tv_usec) / 1e3;
}

/* one warm-up step, then `steps` timed ones; sums over the batch, means over the steps */
static int measure(bench *B, step_result *r) {
    tr_error err = {0};
    const float scale = 1.0f / sqrtf((float)HD);
    memset(r, 0, sizeof *r);
    r->min_ms = 1e300;
    double cos_sum = 0;
    for (int s = -1; s < B->steps; s++) {
        const int32_t pos = B->pos_next++;
        rope_table(B->cs, pos);
        for (int b = 0; b < B->batch; b++)
            for (int l = 0; l < NL; l++) {
                const size_t o = (size_t)b * NL + l;
                make_kv(B->k + o * NKV * HD, B->v + o * NKV * HD, l, pos, b, B->cs);
                make_q(B->q + o * NH * HD, l, pos, b, B->cs);
                if (B->spec > 0) make_q_spec(B->qs + o * NH * HD, l, B->cs, b, B->spec);
            }
        tr_kv_stats st0[64], st1;
        for (int b = 0; b < B->batch; b++) tr_kv_get_stats(B->kv[b], &st0[b]);
        const uint64_t dev0 = dev_read_bytes();
        struct rusage ru0, ru1;
        getrusage(RUSAGE_SELF, &ru0);
        const double t0 = now_s();
        for (int l = 0; l < NL; l++)
            for (int b = 0; b < B->batch; b++) {
                const size_t o = (size_t)b * NL + l;
                /* the next layer's speculative query is asked for while this one attends */
                next_ctx nc = {B, b};
                const tr_kv_query kq = {.layer = l,
                                        .rows = 1,
                                        .pos = &pos,
                                        .q = B->q + o * NH * HD,
                                        .q_stride = NH * HD,
                                        .scale = scale,
                                        .out = B->out,
                                        .out_stride = NH * HD,
                                        .next = B->spec > 0 ? next_query : NULL,
                                        .next_ctx = &nc};
                if (tr_kv_append(B->kv[b], l, pos, B->k + o * NKV * HD, B->v + o * NKV * HD,
                                 &err) ||
                    tr_kv_attend(B->kv[b], B->pool, &kq, &err)) {
                    fprintf(stderr, "bench_kv: step: %s\n", err.msg);
                    return 1;
                }
            }
        const double ms = (now_s() - t0) * 1e3;
        getrusage(RUSAGE_SELF, &ru1);
        const uint64_t dev = dev_read_bytes() - dev0;
        if (s < 0) continue; /* warm-up */
        const double n = B->steps;
        r->mean_ms += ms / n;
        if (ms < r->min_ms) r->min_ms = ms;
        r->dev_read += (double)dev / n;
        r->cpu_user_ms += tv_ms(&ru1.ru_utime, &ru0.ru_utime) / n;
        r->cpu_sys_ms += tv_ms(&ru1.ru_stime, &ru0.ru_stime) / n;
        for (int b = 0; b < B->batch; b++) {
            tr_kv_get_stats(B->kv[b], &st1);
            r->bytes_read += (double)(st1.bytes_read - st0[b].bytes_read) / n;
            r->read_ops += (double)(st1.read_ops - st0[b].read_ops) / n;
            r->selected += (double)st1.selected / n;
            r->score_ms += (double)(st1.score_ns - st0[b].score_ns) / 1e6 / n;
            r->attn_ms += (double)(st1.attn_ns - st0[b].attn_ns) / 1e6 / n;
            r->io_ms += (double)(st1.io_ns - st0[b].io_ns) / 1e6 / n;
            r->csd_scores += (double)(st1.csd_score_bytes - st0[b].csd_score_bytes) / n;
            r->csd_rows += (double)(st1.csd_row_bytes - st0[b].csd_row_bytes) / n;
            r->csd_storage += (double)(st1.csd_storage_bytes - st0[b].csd_storage_bytes) / n;
            r->promotions += (double)(st1.promotions - st0[b].promotions) / n;
            r->demotions += (double)(st1.demotions - st0[b].demotions) / n;
            r->pingpong += (double)(st1.pingpong - st0[b].pingpong) / n;
            r->migrated += (double)(st1.migrated_bytes - st0[b].migrated_bytes) / n;
            r->sel_hot += (double)(st1.sel_hot - st0[b].sel_hot) / n;
            r->sel_cold += (double)(st1.sel_cold - st0[b].sel_cold) / n;
            r->sel_follow += (double)(st1.sel_follow - st0[b].sel_follow) / n;
            r->sel_repeat += (double)(st1.sel_repeat - st0[b].sel_repeat) / n;
            r->spec_rows += (double)(st1.spec_rows - st0[b].spec_rows) / n;
            r->spec_early += (double)(st1.spec_early - st0[b].spec_early) / n;
            cos_sum += st1.spec_cos_sum - st0[b].spec_cos_sum;
        }
    }
    r->spec_cos = r->spec_rows > 0 ? cos_sum / (r->spec_rows * B->steps) : 0.0;
    return 0;
}

static void usage(void) {
    fprintf(stderr, "usage: bench_kv --cold DIR --ctx N --policy P [--batch B] [--alpha A] "
                    "[--bits 4|8] [--hot-frac F] [--steps S] [--threads T] [--io-threads N] "
                    "[--read-gap G] [--bkp off|on|naive] [--csd] [--csd-gbps R] [--csd-gflops R] "
                    "[--csd-link-gbps R] [--csd-chunk N] [--beta B] [--host-keys N] [--pipe 1..4] [--pull-keys] [--spec R] "
                    "[--q-rho R] [--plan]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *cold = NULL, *policy = "tiered";
    int32_t ctx = 8192, batch = 1, steps = 3, threads = 2, io_threads = 0, bits = 4;
    int32_t gaps[8] = {-1}, n_gaps = 1;
    double alpha = 0.2, hot_frac = 1.0 / 16;
    bool plan = false, csd = false;
    const char *bkp = "off";
    double csd_gbps = 0, csd_gflops = 0, csd_link = 0;
    int32_t csd_chunk = 0;
    double beta = -1;
    int32_t host_keys = 0; /* --host-keys N: APP's host budget (0: the host keeps every key) */
    int pipe = 0; /* 0: the cache's default */
    bool pull_keys = false;
    int tail = 0;
    double tail_min = -1.0; /* < 0: the cache's default */
    int tail_every = 0;     /* sum 1 in N unselected tokens whatever their share (cost only) */
    double spec = 0;        /* --spec R: speculative queries correlated R (0: off) */
    static const struct option opts[] = {
        {"cold", 1, 0, 'c'},       {"ctx", 1, 0, 'n'},   {"policy", 1, 0, 'p'},
        {"batch", 1, 0, 'b'},      {"alpha", 1, 0, 'a'}, {"bits", 1, 0, 'q'},
        {"hot-frac", 1, 0, 'h'},   {"steps", 1, 0, 's'}, {"threads", 1, 0, 't'},
        {"io-threads", 1, 0, 'i'}, {"plan", 0, 0, 'P'},  {"read-gap", 1, 0, 'g'},
        {"smooth", 1, 0, 'S'},     {"rho", 1, 0, 'R'},   {"bkp", 1, 0, 'B'},
        {"csd", 0, 0, 'C'},        {"csd-gbps", 1, 0, 'G'}, {"csd-gflops", 1, 0, 'F'},
        {"csd-link-gbps", 1, 0, 'L'}, {"csd-chunk", 1, 0, 'K'}, {"beta", 1, 0, 'E'},
        {"pipe", 1, 0, 'W'},       {"pull-keys", 0, 0, 'U'}, {"tail", 1, 0, 'T'},
        {"tail-min", 1, 0, 'M'},   {"tail-every", 1, 0, 'V'}, {"spec", 1, 0, 'X'},
        {"host-keys", 1, 0, 'H'},  {"q-rho", 1, 0, 'Q'},   {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'c': cold = optarg; break;
        case 'n': ctx = atoi(optarg); break;
        case 'p': policy = optarg; break;
        case 'b': batch = atoi(optarg); break;
        case 'a': alpha = atof(optarg); break;
        case 'q': bits = atoi(optarg); break;
        case 'h': hot_frac = atof(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 't': threads = atoi(optarg); break;
        case 'i': io_threads = atoi(optarg); break;
        case 'P': plan = true; break;
        case 'B': bkp = optarg; break;
        case 'C': csd = true; break;
        case 'G': csd_gbps = atof(optarg); break;
        case 'F': csd_gflops = atof(optarg); break;
        case 'L': csd_link = atof(optarg); break;
        case 'K': csd_chunk = atoi(optarg); break;
        case 'E': beta = atof(optarg); break;
        case 'H': host_keys = atoi(optarg); break;
        case 'W': pipe = atoi(optarg); break;
        case 'T': tail = atoi(optarg); break;
        case 'M': tail_min = atof(optarg); break;
        case 'V': tail_every = atoi(optarg); break;
        case 'X': spec = atof(optarg); break;
        case 'U': pull_keys = true; break;
        case 'S': g_smooth = (float)atof(optarg); break;
        case 'R': g_rho = (float)atof(optarg); break;
        case 'Q': g_qrho = (float)atof(optarg); break;
        case 'g': { /* a list: the steps are measured once per value, on the same fill */
            n_gaps = 0;
            for (char *t = strtok(optarg, ","); t && n_gaps < 8; t = strtok(NULL, ","))
                gaps[n_gaps++] = atoi(t);
            if (!n_gaps) usage();
            break;
        }
        default: usage();
        }
    }
    if (ctx < 64 || batch < 1 || batch > 64 || steps < 1 || (!cold && !plan) || spec < 0 ||
        spec > 1 || g_qrho < 0 || g_qrho >= 1)
        usage();
    tr_error err = {0};
    tr_kv_params p = tr_kv_default_params();
    if (tr_kv_policy_parse(policy, &p.policy, &err)) {
        fprintf(stderr, "bench_kv: %s\n", err.msg);
        return 2;
    }
    const int32_t n_ctx = ctx + (steps + 1) * 8 + 2;
    const tr_kv_shape shape = {NL, n_ctx, NH, NKV, HD, HD, NULL, NULL};
    const uint64_t rec = (uint64_t)NKV * HD * 2 * 2;
    p.alpha = (float)alpha;
    p.score_bits = bits;
    p.tail_bits = tail;
    if (tail_min >= 0.0) p.tail_min = (float)tail_min;
    p.hot_bytes = (uint64_t)(hot_frac * (double)ctx) * NL * rec;
    p.cold_dir = cold ? cold : "/tmp";
    p.n_threads = threads;
    p.io_threads = io_threads;
    if (tr_kv_bkp_parse(bkp, &p.bkp, &err)) {
        fprintf(stderr, "bench_kv: %s\n", err.msg);
        return 2;
    }
    p.csd = csd;
    p.research.csd_gbps = csd_gbps;
    p.research.csd_gflops = csd_gflops;
    p.research.csd_link_gbps = csd_link;
    p.csd_chunk = csd_chunk;
    p.research.beta = (float)beta;
    p.host_keys = host_keys;
    p.spec = spec > 0;
    const uint64_t dram = tr_kv_dram_bytes(&shape, &p) * (uint64_t)batch;
    const uint64_t cold_need = tr_kv_cold_bytes_needed(&shape, &p) * (uint64_t)batch;
    if (plan) {
        printf("{\"dram_bytes\": %llu, \"cold_bytes\": %llu}\n", (unsigned long long)dram,
               (unsigned long long)cold_need);
        return 0;
    }

    tr_pool *pool = NULL;
    if (tr_pool_create(threads, &pool, &err)) {
        fprintf(stderr, "bench_kv: %s\n", err.msg);
        return 1;
    }
    tr_kv **kv = calloc((size_t)batch, sizeof *kv);
    for (int b = 0; b < batch; b++) {
        if (tr_kv_create(&shape, &p, &kv[b], &err)) {
            fprintf(stderr, "bench_kv: %s\n", err.msg);
            return 1;
        }
    }
    stats_make();
    g_lat = calloc((size_t)batch * NL * NKV * HD, sizeof(float));
    g_qst = calloc((size_t)batch * NL * NH * HD, sizeof(float));
    g_qsb = calloc((size_t)batch * NL * NH * HD, sizeof(float));
    g_qset = calloc((size_t)batch * NL, 1);
    float *cs = malloc(sizeof(float) * HD);
    float *k = malloc(sizeof(float) * (size_t)batch * NL * NKV * HD);
    float *v = malloc(sizeof(float) * (size_t)batch * NL * NKV * HD);
    float *q = malloc(sizeof(float) * (size_t)batch * NL * NH * HD);
    float *qs = spec > 0 ? malloc(sizeof(float) * (size_t)batch * NL * NH * HD) : NULL;
    float *out = malloc(sizeof(float) * NH * HD);

    /* fill */
    const double t_fill = now_s();
    for (int32_t t = 0; t < ctx; t++) {
        rope_table(cs, t);
        for (int b = 0; b < batch; b++)
            for (int l = 0; l < NL; l++) {
                make_kv(k, v, l, t, b, cs);
                if (tr_kv_append(kv[b], l, t, k, v, &err)) {
                    fprintf(stderr, "bench_kv: fill: %s\n", err.msg);
                    return 1;
                }
            }
    }
    const double fill_s = now_s() - t_fill;
    const int dropped = drop_caches();

    bench B = {.kv = kv,
               .pool = pool,
               .batch = batch,
               .steps = steps,
               .pos_next = ctx,
               .cs = cs,
               .k = k,
               .v = v,
               .q = q,
               .qs = qs,
               .spec = (float)spec,
               .out = out};
    for (int gi = 0; gi < n_gaps; gi++) {
        tr_kv_seam sm;
        for (int i = 0; i < batch; i++) {
            tr_kv_seam_get(kv[i], &sm);
            if (gaps[gi] >= 0) *(csd ? &sm.csd_read_gap : &sm.read_gap) = gaps[gi];
            if (pipe > 0) sm.pipe = pipe;
            sm.pull_keys = pull_keys;
            sm.tail_every = tail_every;
            if (tr_kv_seam_set(kv[i], &sm, &err)) {
                fprintf(stderr, "bench_kv: %s\n", err.msg);
                return 2;
            }
        }
        step_result r;
        if (measure(&B, &r)) return 1;
        tr_kv_stats fin;
        tr_kv_get_stats(kv[0], &fin);
        printf("{\"policy\": \"%s\", \"ctx\": %d, \"batch\": %d, \"alpha\": %.3g, \"bits\": %d, "
               "\"hot_bytes\": %llu, \"dram_bytes\": %llu, \"cold_bytes\": %llu, \"direct\": %s, "
               "\"fill_s\": %.1f, \"caches_dropped\": %s, \"steps\": %d, \"step_ms\": %.1f, "
               "\"step_ms_min\": %.1f, \"bytes_read\": %.0f, \"dev_read\": %.0f, "
               "\"read_ops\": %.0f, \"selected\": %.0f, \"score_ms\": %.1f, \"attn_ms\": %.1f, "
               "\"io_wait_ms\": %.1f, \"hot_used\": %llu, \"cold_used\": %llu, \"read_gap\": %d, "
               "\"pipe\": %d, \"pull_keys\": %s, \"tail\": %d, "
               "\"tail_min\": %g, \"tail_kept\": %.4f, \"io_threads\": %d, \"cpu_user_ms\": %.0f, \"cpu_sys_ms\": %.0f, \"smooth\": %.2f, "
               "\"rho\": %.3f, \"q_rho\": %.3f, \"runs_per_token\": %.3f, \"bkp\": \"%s\", \"csd\": %s, "
               "\"csd_gbps\": %g, \"csd_gflops\": %g, \"csd_link_gbps\": %g, "
               "\"csd_score_bytes\": %.0f, \"csd_row_bytes\": %.0f, \"csd_storage_bytes\": %.0f, "
               "\"promotions\": %.1f, \"demotions\": %.1f, \"pingpong\": %.1f, "
               "\"migrated_bytes\": %.0f, \"hot_hit_rate\": %.4f, \"csd_mem_bytes\": %llu, "
               "\"beta_set\": %g, \"beta\": %.4f, \"beta_split\": %.4f, \"f_c\": %.0f, \"f_s\": %.0f, \"b_c\": %.0f, "
               "\"b_s\": %.0f, \"alpha_c\": %.4f, \"alpha_s\": %.4f, \"spec\": %g, "
               "\"spec_rows\": %.1f, \"spec_early\": %.1f, \"spec_cos\": %.4f, \"host_keys\": %d, "
               "\"sel_repeat\": %.4f}\n",
               policy, ctx, batch, alpha, bits, (unsigned long long)p.hot_bytes * batch,
               (unsigned long long)dram, (unsigned long long)cold_need,
               tr_kv_seam_direct(kv[0]) ? "true" : "false", fill_s, dropped ? "true" : "false", steps,
               r.mean_ms, r.min_ms, r.bytes_read, r.dev_read, r.read_ops, r.selected, r.score_ms,
               r.attn_ms, r.io_ms, (unsigned long long)fin.hot_bytes * batch,
               (unsigned long long)fin.cold_bytes * batch,
               csd ? sm.csd_read_gap : sm.read_gap, sm.pipe,
               pull_keys ? "true" : "false", tail,
               (double)p.tail_min, fin.tail_cand ? (double)fin.tail_kept / (double)fin.tail_cand : 0.0,
               p.io_threads, r.cpu_user_ms, r.cpu_sys_ms,
               (double)g_smooth, (double)g_rho, (double)g_qrho,
               r.bytes_read > 0 ? r.read_ops / (r.bytes_read / (double)(NKV * HD * 4)) : 0.0,
               bkp, csd ? "true" : "false", csd_gbps, csd_gflops, csd_link, r.csd_scores,
               r.csd_rows, r.csd_storage, r.promotions, r.demotions, r.pingpong, r.migrated,
               r.sel_hot + r.sel_cold > 0 ? r.sel_hot / (r.sel_hot + r.sel_cold) : 0.0,
               (unsigned long long)fin.csd_mem_bytes, beta, fin.beta, fin.beta_split, fin.f_c, fin.f_s, fin.b_c,
               fin.b_s, fin.alpha_c, fin.alpha_s, spec, r.spec_rows, r.spec_early, r.spec_cos, host_keys,
               r.sel_follow > 0 ? r.sel_repeat / r.sel_follow : 0.0);
        fflush(stdout);
    }
    for (int b = 0; b < batch; b++) tr_kv_free(kv[b]);
    free(kv);
    tr_pool_free(pool);
    free(cs);
    free(k);
    free(v);
    free(q);
    free(qs);
    free(out);
    free(g_sig);
    free(g_mu);
    free(g_dir);
    free(g_noise);
    free(g_lat);
    return 0;
}
