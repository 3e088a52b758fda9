/*
 * What the KV cache's tests share: synthetic keys with the structure of real ones, values and
 * queries; a reference attention in double; constructors of caches; and the layers' internals
 * (tests may reach into them: src/kv's headers).
 */
#ifndef TR_TESTS_KV_TEST_H
#define TR_TESTS_KV_TEST_H

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <limits.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/pool.h"
#include "kv/kv_app.h"
#include "kv/kv_csd.h"
#include "kv/kv_keys.h"
#include "kv/kv_pooled.h"
#include "tensor/fp16.h"
#include "testutil.h"

/* the tests' pool and temporary directory, set up by kv_test_main */
static tr_pool *g_pool;
static char g_tmp[256];

typedef struct shp {
    const char *name;
    int32_t nl, nctx, nh, nkv, hdk, hdv;
} shp;

/* the attention shapes the tests run: multi-head, grouped-query, multi-query */
static const shp SHAPES[] __attribute__((unused)) = {
    {"MHA", 2, 200, 4, 4, 32, 32},
    {"GQA", 2, 200, 8, 2, 64, 64},
    {"MQA", 2, 200, 4, 1, 80, 64}, /* head dim not a multiple of 32, K and V dims differ */
};

static inline tr_kv_shape to_shape(const shp *s) {
    return (tr_kv_shape){s->nl, s->nctx, s->nh, s->nkv, s->hdk, s->hdv, NULL, NULL};
}

static inline float r16(float x) { return tr_f16_to_f32(tr_f32_to_f16(x)); }

/* ---- data: keys with the structure of real ones, values, queries -------------------------- */

typedef struct data {
    int32_t n, nkv, hdk, hdv;
    float *k, *v; /* [layer][n][nkv][hd] */
} data;

/* Keys like a real model's after RoPE: per-channel scales drawn log-normal with a few outlier
 * channels 8x larger, per-channel means, a rotation by position per channel pair, and a few
 * "anchor" tokens carrying a shared direction that queries also carry (heavy hitters). With
 * iid = true: plain noise. */
static inline void rope(float *x, int32_t hd, int32_t pos) {
    for (int32_t c = 0; c < hd / 2; c++) {
        const double th = pos * pow(10000.0, -2.0 * c / hd);
        const double a = x[c], b = x[c + hd / 2];
        x[c] = (float)(a * cos(th) - b * sin(th));
        x[c + hd / 2] = (float)(a * sin(th) + b * cos(th));
    }
}

typedef struct keystat {
    float *sig, *mu, *dir; /* [nkv][hdk] */
} keystat;

static inline void keystat_make(keystat *ks, int32_t nkv, int32_t hdk, uint64_t seed) {
    tu_rng r = {seed};
    ks->sig = malloc(sizeof(float) * (size_t)(nkv * hdk));
    ks->mu = malloc(sizeof(float) * (size_t)(nkv * hdk));
    ks->dir = malloc(sizeof(float) * (size_t)(nkv * hdk));
    /* the shared direction and the outlier channels sit in the slowly rotating (low-frequency)
     * channel pairs, where RoPE keeps them aligned across positions, as in real keys */
    for (int32_t i = 0; i < nkv * hdk; i++) {
        const int32_t c = i % hdk, pair = c % (hdk / 2);
        ks->sig[i] = expf(0.5f * tu_normal(&r));
        ks->mu[i] = 0.3f * tu_normal(&r);
        ks->dir[i] = pair >= hdk / 4 ? 1.4f * tu_normal(&r) : 0.0f;
    }
    for (int32_t g = 0; g < nkv; g++)
        for (int o = 0; o < 3; o++) {
            const int32_t c = hdk / 4 + (int32_t)(tu_next(&r) % (uint64_t)(hdk / 4));
            ks->sig[g * hdk + c] *= 8.0f;
        }
}

static inline void keystat_free(keystat *ks) {
    free(ks->sig);
    free(ks->mu);
    free(ks->dir);
}

static inline void data_make(data *d, int32_t nl, int32_t n, int32_t nkv, int32_t hdk, int32_t hdv,
                      uint64_t seed, bool iid) {
    d->n = n;
    d->nkv = nkv;
    d->hdk = hdk;
    d->hdv = hdv;
    d->k = malloc(sizeof(float) * (size_t)nl * n * nkv * hdk);
    d->v = malloc(sizeof(float) * (size_t)nl * n * nkv * hdv);
    tu_rng r = {seed};
    keystat ks;
    keystat_make(&ks, nkv, hdk, seed * 7 + 1);
    for (int32_t l = 0; l < nl; l++)
        for (int32_t t = 0; t < n; t++) {
            const bool anchor = t < 2 || tu_next(&r) % 50 == 0;
            for (int32_t g = 0; g < nkv; g++) {
                float *k = d->k + (((size_t)l * n + t) * nkv + g) * hdk;
                for (int32_t c = 0; c < hdk; c++) {
                    const int32_t i = g * hdk + c;
                    k[c] = iid ? tu_normal(&r)
                               : ks.mu[i] + ks.sig[i] * 0.5f * tu_normal(&r) +
                                     (anchor ? 0.8f * ks.dir[i] : 0.0f);
                }
                if (!iid) rope(k, hdk, t);
                float *v = d->v + (((size_t)l * n + t) * nkv + g) * hdv;
                for (int32_t c = 0; c < hdv; c++) v[c] = tu_normal(&r);
            }
        }
    keystat_free(&ks);
}

static inline void data_free(data *d) {
    free(d->k);
    free(d->v);
}

static inline const float *dk(const data *d, int32_t l, int32_t t) {
    return d->k + ((size_t)l * d->n + t) * d->nkv * d->hdk;
}
static inline const float *dv(const data *d, int32_t l, int32_t t) {
    return d->v + ((size_t)l * d->n + t) * d->nkv * d->hdv;
}

/* queries for n_head heads at position pos, sharing the anchor direction of their KV head; scaled
 * so that the logits (times 1/sqrt(d)) spread by ~2.5, which makes attention as peaked as in real
 * models (the top fifth of the keys holds most of the mass) */
static inline void query_make(float *q, const shp *s, int32_t pos, uint64_t seed, bool iid) {
    tu_rng r = {seed};
    keystat ks;
    keystat_make(&ks, s->nkv, s->hdk, 12345); /* only dir is used */
    const int32_t G = s->nh / s->nkv;
    for (int32_t h = 0; h < s->nh; h++) {
        float *qh = q + (size_t)h * s->hdk;
        for (int32_t c = 0; c < s->hdk; c++)
            qh[c] = iid ? 2.5f * tu_normal(&r)
                        : 3.0f * (0.7f * tu_normal(&r) + 0.4f * ks.dir[(h / G) * s->hdk + c]);
        if (!iid) rope(qh, s->hdk, pos);
    }
    keystat_free(&ks);
}

/* ---- kv construction ---------------------------------------------------------------------- */

static inline tr_kv_params params(tr_kv_policy pol, float alpha) {
    tr_kv_params p = tr_kv_default_params();
    p.policy = pol;
    p.alpha = alpha;
    p.n_sink = 2;
    p.n_window = 8;
    p.io_threads = 4;
    /* the tests drive a call of several rows as that many decode steps (each its own selection);
     * the exact prefill of such calls is tested on its own (test_kv_tiered: prefill) */
    p.prefill_select = true;
    return p;
}

/* hot budget that holds the minimum: the sinks and one page per layer (everything else cold) */
static inline uint64_t hot_min(const shp *s, const tr_kv_params *p) {
    const uint64_t rec = (uint64_t)s->nkv * (uint64_t)(s->hdk + s->hdv) * 2;
    return (uint64_t)s->nl * (uint64_t)(p->n_sink + TR_KV_PAGE) * rec;
}

/* tiered at alpha 0.15 over a cold pool, the hot pool 32 tokens a layer over the minimum; with
 * csd, the agent scores in chunks of 64 (several chunks and score blocks per step) */
static inline tr_kv_params cold_params(const shp *s, bool csd) {
    const uint64_t rec = (uint64_t)s->nkv * (uint64_t)(s->hdk + s->hdv) * 2;
    tr_kv_params p = params(TR_KV_TIERED, 0.15f);
    p.hot_bytes = hot_min(s, &p) + (uint64_t)s->nl * 32 * rec;
    p.cold_dir = g_tmp;
    p.csd = csd;
    p.csd_chunk = 64;
    return p;
}

static inline tr_kv *mk(const shp *s, const tr_kv_params *p) {
    tr_kv *kv = NULL;
    tr_error err = {0};
    const tr_kv_shape sh = to_shape(s);
    tr_status st = tr_kv_create(&sh, p, &kv, &err);
    TU_CHECK(st == TR_OK, "%s %s: create: %s", s->name, tr_kv_policy_name(p->policy), err.msg);
    return kv;
}

static inline bool fill(tr_kv *kv, const data *d, int32_t from, int32_t to) {
    tr_error err = {0};
    for (int32_t t = from; t < to; t++)
        for (int32_t l = 0; l < kv->shape.n_layer; l++)
            if (tr_kv_append(kv, l, t, dk(d, l, t), dv(d, l, t), &err)) {
                TU_CHECK(0, "append layer %d pos %d: %s", l, t, err.msg);
                return false;
            }
    return true;
}

/* ---- reference attention --------------------------------------------------------------------
 * In double, over the F16-rounded keys, values and query; allow[t] chooses the keys (NULL: all);
 * no F16 rounding of the probabilities. The cache rounds them to F16 (as llama.cpp does): each
 * probability moves by at most 2^-11 of itself, so the output moves by at most 2^-11 * max|v| =
 * 4.9e-4 * max|v| (max|v| < 5 here), plus float accumulation (~1e-6). TOL = 2.5e-3 covers that;
 * one dropped token of a few hundred moves the output by ~p*|v| >> TOL (checked below). */
#define TOL 2.5e-3f

static inline void ref_attend(const data *d, int32_t l, const shp *s, int32_t pos, const float *q,
                       float scale, const float *sinks, int32_t swa, const uint8_t *allow,
                       float *out) {
    const int32_t G = s->nh / s->nkv;
    double *sc = malloc(sizeof(double) * (size_t)(pos + 1));
    const int32_t lo = tr_kv_visible_lo(pos, swa);
    for (int32_t h = 0; h < s->nh; h++) {
        const int32_t g = h / G;
        double mx = -INFINITY;
        for (int32_t t = lo; t <= pos; t++) {
            if (allow && !allow[t]) continue;
            const float *k = dk(d, l, t) + (size_t)g * s->hdk;
            double a = 0;
            for (int32_t c = 0; c < s->hdk; c++)
                a += (double)r16(q[(size_t)h * s->hdk + c]) * (double)r16(k[c]);
            sc[t] = a * scale;
            if (sc[t] > mx) mx = sc[t];
        }
        if (sinks && sinks[h] > mx) mx = sinks[h];
        double sum = sinks ? exp(sinks[h] - mx) : 0.0;
        for (int32_t t = lo; t <= pos; t++)
            if (!allow || allow[t]) sum += exp(sc[t] - mx);
        for (int32_t c = 0; c < s->hdv; c++) {
            double o = 0;
            for (int32_t t = lo; t <= pos; t++)
                if (!allow || allow[t])
                    o += exp(sc[t] - mx) / sum * (double)r16(dv(d, l, t)[(size_t)g * s->hdv + c]);
            out[(size_t)h * s->hdv + c] = (float)o;
        }
    }
    free(sc);
}

static inline float maxdiff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        const float e = fabsf(a[i] - b[i]);
        if (!(e <= m)) m = e; /* NaN propagates */
    }
    return m;
}

#define KVS(kv) (&tr_kv_pooled_of(kv)->st)
#define KEYS(kv) tr_kv_tiered_keys(kv)
#define APP(kv) tr_kv_tiered_app(kv)
static inline tr_status attend_rows(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t rows,
                             const int32_t *pos, const float *q, size_t q_stride, float scale,
                             const float *sinks, int32_t swa, float *out, size_t out_stride,
                             tr_error *err) {
    const tr_kv_query kq = {.layer = layer, .rows = rows, .pos = pos, .q = q, .q_stride = q_stride,
                            .scale = scale, .sinks = sinks, .swa = swa, .out = out,
                            .out_stride = out_stride};
    return tr_kv_attend(kv, pool, &kq, err);
}
static inline void set_write_fault(tr_kv *kv, uint64_t at, int e) {
    KVS(kv)->fault_write_at = at;
    KVS(kv)->n_writes = 0;
    KVS(kv)->fault_errno = e;
}
static inline void note_rows(tr_kv *kv, uint64_t hb, uint64_t hn, uint64_t ab, uint64_t an) {
    tr_kv_app_note_hot(APP(kv), hb, hn);
    tr_kv_app_note_agent_rows(APP(kv), ab, an);
}
static inline tr_kv_stats stats_of(const tr_kv *kv) {
    tr_kv_stats st;
    tr_kv_get_stats(kv, &st);
    return st;
}
static inline void set_pull_keys(tr_kv *kv, bool on) {
    tr_kv_seam sm;
    tr_kv_seam_get(kv, &sm);
    sm.pull_keys = on;
    tr_kv_seam_set(kv, &sm, NULL);
}
static inline void set_csd_gap(tr_kv *kv, int32_t gap) {
    tr_kv_seam sm;
    tr_kv_seam_get(kv, &sm);
    sm.csd_read_gap = gap;
    tr_kv_seam_set(kv, &sm, NULL);
}

static inline int cmp_f_desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

static inline void flip_byte(const char *path, off_t off) {
    int fd = open(path, O_RDWR);
    unsigned char c = 0;
    if (fd < 0 || pread(fd, &c, 1, off) != 1) {
        TU_CHECK(0, "cannot open %s", path);
        if (fd >= 0) close(fd);
        return;
    }
    c ^= 0x10;
    TU_CHECK(pwrite(fd, &c, 1, off) == 1, "cannot write %s", path);
    close(fd);
}

static inline tr_status try_create(const shp *s, const tr_kv_params *p, tr_error *err, tr_kv **out) {
    const tr_kv_shape sh = to_shape(s);
    tr_kv_free(*out); /* one that was expected to fail and did not */
    *out = NULL;
    return tr_kv_create(&sh, p, out, err);
}

/* one decode step at pos through every layer: append, then attend one query row */
static inline tr_status decode_step(tr_kv *kv, const data *d, const shp *s, int32_t pos, float *q,
                             float *o, tr_error *err) {
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    tr_status st = TR_OK;
    for (int32_t l = 0; l < s->nl && !st; l++) {
        query_make(q, s, pos, 91 + (uint64_t)l, false);
        st = tr_kv_append(kv, l, pos, dk(d, l, pos), dv(d, l, pos), err);
        if (!st)
            st = attend_rows(kv, g_pool, l, 1, &pos, q, qn, 1.0f / sqrtf((float)s->hdk), NULL,
                                   0, o, on, err);
    }
    return st;
}

/* a user-started agent (terrace-storaged --listen): $TERRACE_STORAGED as the runtime would take
 * it (under emulation, a wrapper that starts the emulator), else the one next to the test
 * binary's build directory; 0 if it did not come up */
static inline pid_t start_listener(const char *sock) {
    char exe[PATH_MAX], bin[PATH_MAX + 32];
    const char *env = getenv("TERRACE_STORAGED");
    if (env && *env) {
        snprintf(bin, sizeof bin, "%s", env);
    } else {
        const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return 0;
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(bin, sizeof bin, "%s/../terrace-storaged", exe);
    }
    const pid_t pid = fork();
    if (pid == 0) {
        execl(bin, bin, "--listen", sock, (char *)NULL);
        _exit(127);
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%.100s", sock);
    for (int i = 0; i < 500; i++) { /* up to 5 s */
        const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        const bool up = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0) close(fd); /* a connection that sends nothing: the agent drops it */
        if (up) return pid;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 0;
}

/* sets up the pool and the temporary directory, runs the tests, cleans up */
static inline int kv_test_main(const char *name, void (*const *tests)(void), int n) {
    tr_error err = {0};
    if (tr_pool_create(2, &g_pool, &err)) {
        fprintf(stderr, "pool: %s\n", err.msg);
        return 1;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/%s-XXXXXX", name);
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    for (int i = 0; i < n; i++) tests[i]();
    rmdir(g_tmp);
    tr_pool_free(g_pool);
    return tu_result(name);
}

#endif
