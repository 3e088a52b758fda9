/*
 * The tiered KV cache (src/kv): every policy at alpha = 1 against a straightforward reference
 * attention (MHA, GQA, MQA; hot only and with most tokens cold; sinks, SWA, multi-row calls; the
 * working set big enough and forced into chunks); selection against a brute-force top-k; recall of
 * INT8 and INT4 scoring against the exact per-head top-k, with four aggregations over heads (max, sum and their softmax-normalised forms) and the
 * channel equalisation measured (printed); h2o eviction; quest bounds; truncate; save/restore;
 * faults (cold directory not writable, disk full, corrupted page, failing reads and writes) and
 * budgets that cannot fit.
 */
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
#include "kv/kv_internal.h"
#include "tensor/fp16.h"
#include "testutil.h"

static tr_pool *g_pool;
static char g_tmp[256];

typedef struct shp {
    const char *name;
    int32_t nl, nctx, nh, nkv, hdk, hdv;
} shp;

static tr_kv_shape to_shape(const shp *s) {
    return (tr_kv_shape){s->nl, s->nctx, s->nh, s->nkv, s->hdk, s->hdv};
}

static float r16(float x) { return tr_f16_to_f32(tr_f32_to_f16(x)); }

/* ---- data: keys with the structure of real ones, values, queries -------------------------- */

typedef struct data {
    int32_t n, nkv, hdk, hdv;
    float *k, *v; /* [layer][n][nkv][hd] */
} data;

/* Keys like a real model's after RoPE: per-channel scales drawn log-normal with a few outlier
 * channels 8x larger, per-channel means, a rotation by position per channel pair, and a few
 * "anchor" tokens carrying a shared direction that queries also carry (heavy hitters). With
 * iid = true: plain noise. */
static void rope(float *x, int32_t hd, int32_t pos) {
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

static void keystat_make(keystat *ks, int32_t nkv, int32_t hdk, uint64_t seed) {
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

static void keystat_free(keystat *ks) {
    free(ks->sig);
    free(ks->mu);
    free(ks->dir);
}

static void data_make(data *d, int32_t nl, int32_t n, int32_t nkv, int32_t hdk, int32_t hdv,
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

static void data_free(data *d) {
    free(d->k);
    free(d->v);
}

static const float *dk(const data *d, int32_t l, int32_t t) {
    return d->k + ((size_t)l * d->n + t) * d->nkv * d->hdk;
}
static const float *dv(const data *d, int32_t l, int32_t t) {
    return d->v + ((size_t)l * d->n + t) * d->nkv * d->hdv;
}

/* queries for n_head heads at position pos, sharing the anchor direction of their KV head; scaled
 * so that the logits (times 1/sqrt(d)) spread by ~2.5, which makes attention as peaked as in real
 * models (the top fifth of the keys holds most of the mass) */
static void query_make(float *q, const shp *s, int32_t pos, uint64_t seed, bool iid) {
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

static tr_kv_params params(tr_kv_policy pol, float alpha) {
    tr_kv_params p = tr_kv_default_params();
    p.policy = pol;
    p.alpha = alpha;
    p.n_sink = 2;
    p.n_window = 8;
    p.io_threads = 4;
    return p;
}

/* hot budget that holds the minimum: the sinks and one page per layer (everything else cold) */
static uint64_t hot_min(const shp *s, const tr_kv_params *p) {
    const uint64_t rec = (uint64_t)s->nkv * (uint64_t)(s->hdk + s->hdv) * 2;
    return (uint64_t)s->nl * (uint64_t)(p->n_sink + TR_KV_PAGE) * rec;
}

/* tiered at alpha 0.15 over a cold pool, the hot pool 32 tokens a layer over the minimum; with
 * csd, the agent scores in chunks of 64 (several chunks and score blocks per step) */
static tr_kv_params cold_params(const shp *s, bool csd) {
    const uint64_t rec = (uint64_t)s->nkv * (uint64_t)(s->hdk + s->hdv) * 2;
    tr_kv_params p = params(TR_KV_TIERED, 0.15f);
    p.hot_bytes = hot_min(s, &p) + (uint64_t)s->nl * 32 * rec;
    p.cold_dir = g_tmp;
    p.csd = csd;
    p.csd_chunk = 64;
    return p;
}

static tr_kv *mk(const shp *s, const tr_kv_params *p) {
    tr_kv *kv = NULL;
    tr_error err = {0};
    const tr_kv_shape sh = to_shape(s);
    tr_status st = tr_kv_create(&sh, p, &kv, &err);
    TU_CHECK(st == TR_OK, "%s %s: create: %s", s->name, tr_kv_policy_name(p->policy), err.msg);
    return kv;
}

static bool fill(tr_kv *kv, const data *d, int32_t from, int32_t to) {
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

static void ref_attend(const data *d, int32_t l, const shp *s, int32_t pos, const float *q,
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

static float maxdiff(const float *a, const float *b, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        const float e = fabsf(a[i] - b[i]);
        if (!(e <= m)) m = e; /* NaN propagates */
    }
    return m;
}

/* ---- 1. every policy at alpha = 1 equals the reference -------------------------------------- */

static const shp SHAPES[] = {
    {"MHA", 2, 200, 4, 4, 32, 32},
    {"GQA", 2, 200, 8, 2, 64, 64},
    {"MQA", 2, 200, 4, 1, 80, 64}, /* head dim not a multiple of 32, K and V dims differ */
};

static float g_alpha1_worst;

/* ws: 0 whole working set, 1 a small one (read in halves), 2 whole and read in TR_KV_PIPE
 * chunks at every size (attended chunk by chunk as they come in) */
static void check_policy_alpha1(const shp *s, tr_kv_policy pol, bool cold, int ws,
                                const data *d) {
    const bool small_ws = ws == 1;
    tr_kv_params p = params(pol, 1.0f);
    if (cold) {
        p.hot_bytes = hot_min(s, &p);
        p.cold_dir = g_tmp;
    }
    if (small_ws) p.ws_bytes = 40ull * (uint64_t)s->nkv * (uint64_t)(s->hdk + s->hdv) * 2;
    tr_kv *kv = mk(s, &p);
    if (!kv) return;
    if (ws == 2) kv->pipe_min = 1;
    if (!fill(kv, d, 0, s->nctx)) {
        tr_kv_free(kv);
        return;
    }
    if (cold) {
        tr_kv_stats stt;
        tr_kv_get_stats(kv, &stt);
        TU_CHECK(stt.cold_bytes > 0 && stt.hot_bytes <= p.hot_bytes,
                 "%s %s: hot %llu (budget %llu), cold %llu", s->name, tr_kv_policy_name(pol),
                 (unsigned long long)stt.hot_bytes, (unsigned long long)p.hot_bytes,
                 (unsigned long long)stt.cold_bytes);
    }
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    float *q = malloc(sizeof(float) * qn * 8), *o = malloc(sizeof(float) * on * 8),
          *ro = malloc(sizeof(float) * on);
    float *sinks = malloc(sizeof(float) * (size_t)s->nh);
    for (int32_t h = 0; h < s->nh; h++) sinks[h] = 0.5f * (float)h - 1.0f;
    const float scale = 1.0f / sqrtf((float)s->hdk);
    tr_error err = {0};
    float worst = 0;
    /* single rows (decode) at a few positions, in both layers */
    const int32_t at[] = {0, 17, 100, 199};
    for (int32_t l = 0; l < s->nl; l++)
        for (int i = 0; i < 4; i++) {
            query_make(q, s, at[i], 100 + (uint64_t)at[i], false);
            tr_status st =
                tr_kv_attend_rows(kv, g_pool, l, 1, &at[i], q, qn, scale, NULL, 0, o, on, &err);
            TU_CHECK(st == TR_OK, "%s %s attend: %s", s->name, tr_kv_policy_name(pol), err.msg);
            ref_attend(d, l, s, at[i], q, scale, NULL, 0, NULL, ro);
            const float e = maxdiff(o, ro, on);
            if (e > worst) worst = e;
        }
    /* 8 rows at once (prefill), each with its own causal limit, softmax sinks and SWA of 24 */
    int32_t pos[8];
    for (int r = 0; r < 8; r++) {
        pos[r] = 150 + r;
        query_make(q + r * qn, s, pos[r], 300 + (uint64_t)r, false);
    }
    tr_status st = tr_kv_attend_rows(kv, g_pool, 1, 8, pos, q, qn, scale, sinks, 24, o, on, &err);
    TU_CHECK(st == TR_OK, "%s %s attend rows: %s", s->name, tr_kv_policy_name(pol), err.msg);
    for (int r = 0; r < 8; r++) {
        ref_attend(d, 1, s, pos[r], q + r * qn, scale, sinks, 24, NULL, ro);
        const float e = maxdiff(o + r * on, ro, on);
        if (e > worst) worst = e;
    }
    TU_CHECK(worst <= TOL, "%s %s alpha=1 %s%s: max |diff| %.3g > %.3g", s->name,
             tr_kv_policy_name(pol), cold ? "cold" : "hot",
             ws == 1 ? " chunked" : ws == 2 ? " pipelined" : "", worst, TOL);
    if (worst > g_alpha1_worst) g_alpha1_worst = worst;
    tr_kv_stats stt;
    tr_kv_get_stats(kv, &stt);
    if (cold)
        TU_CHECK(stt.bytes_read > 0, "%s %s cold: nothing read from storage", s->name,
                 tr_kv_policy_name(pol));
    else
        TU_CHECK(stt.bytes_read == 0, "%s %s hot: %llu bytes read", s->name, tr_kv_policy_name(pol),
                 (unsigned long long)stt.bytes_read);
    free(q);
    free(o);
    free(ro);
    free(sinks);
    tr_kv_free(kv);
}

static void test_alpha1(void) {
    for (size_t i = 0; i < sizeof SHAPES / sizeof *SHAPES; i++) {
        const shp *s = &SHAPES[i];
        data d;
        data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 11 + i, false);
        for (int pol = TR_KV_FULL; pol <= TR_KV_TIERED; pol++)
            for (int cold = 0; cold < 2; cold++)
                for (int ws = 0; ws < 3; ws++) {
                    if ((pol == TR_KV_FULL && cold) || (ws == 2 && !cold)) continue;
                    check_policy_alpha1(s, (tr_kv_policy)pol, cold, ws, &d);
                }
        data_free(&d);
    }
    printf("alpha=1, every policy vs reference (MHA/GQA/MQA, hot/cold, whole/chunked working "
           "set, pipelined reads, sinks, SWA, 8-row calls): max |diff| %.2e (tolerance %.1e)\n",
           (double)g_alpha1_worst, (double)TOL);

    /* the comparison can fail: dropping the single most attended key moves the output by more */
    const shp *s = &SHAPES[0];
    data d;
    data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 11, false);
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    float *q = malloc(sizeof(float) * qn), *a = malloc(sizeof(float) * on),
          *b = malloc(sizeof(float) * on);
    uint8_t *allow = malloc(200);
    memset(allow, 1, 200);
    query_make(q, s, 199, 5, false);
    ref_attend(&d, 0, s, 199, q, 0.2f, NULL, 0, NULL, a);
    float best = 0;
    for (int32_t t = 0; t < 200; t++) {
        allow[t] = 0;
        ref_attend(&d, 0, s, 199, q, 0.2f, NULL, 0, allow, b);
        allow[t] = 1;
        const float e = maxdiff(a, b, on);
        if (e > best) best = e;
    }
    TU_CHECK(best > 4 * TOL, "dropping one key moves the output by only %.3g", best);
    printf("  (dropping the most attended of 200 keys moves the output by %.3g)\n", best);
    free(q);
    free(a);
    free(b);
    free(allow);
    data_free(&d);
}

/* ---- 2. selection against a brute-force top-k ------------------------------------------------ */

static int cmp_f_desc(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

/* the record checksum: the SIMD build picked at start, the library's baseline build and the
 * streaming form give one digest for every length (tails, short inputs, the 16 KiB records) */
static void test_hash(void) {
    tu_rng r = {5};
    const size_t cap = 40000;
    uint8_t *b = malloc(cap);
    for (size_t i = 0; i < cap; i++) b[i] = (uint8_t)tu_next(&r);
    int bad = 0;
    static const size_t lens[] = {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 4095, 16384, 39990};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (size_t off = 0; off < 3; off++) {
            const size_t n = lens[li];
            const uint64_t seed = off == 2 ? 0x1234 : 0;
            const uint64_t a = tr_kv_hash64(b + off, n, seed), c = tr_kv_hash64_ref(b + off, n, seed);
            tr_kv_hasher h;
            tr_kv_hasher_init(&h, seed);
            tr_kv_hasher_update(&h, b + off, n / 3);
            tr_kv_hasher_update(&h, b + off + n / 3, n - n / 3);
            bad += a != c || a != tr_kv_hasher_digest(&h);
        }
    /* a flipped bit changes the digest */
    const uint64_t h0 = tr_kv_hash64(b, 16384, 0);
    b[7777] ^= 8;
    bad += tr_kv_hash64(b, 16384, 0) == h0;
    TU_CHECK(bad == 0, "hash: SIMD, baseline and streaming digests agree (%d mismatches)", bad);
    free(b);
}

static void test_topk(void) {
    tu_rng r = {77};
    float *s = malloc(sizeof(float) * 1000), *srt = malloc(sizeof(float) * 1000),
          *got = malloc(sizeof(float) * 1000);
    int32_t *idx = malloc(sizeof(int32_t) * 1000);
    int bad = 0;
    for (int it = 0; it < 300; it++) {
        const int32_t n = 1 + (int32_t)(tu_next(&r) % 1000), k = (int32_t)(tu_next(&r) % (n + 1));
        const bool ties = it % 3 == 0;
        for (int32_t i = 0; i < n; i++) {
            s[i] = ties ? (float)(tu_next(&r) % 7) : tu_uniform(&r);
            srt[i] = s[i];
            idx[i] = i;
        }
        tr_kv_topk(s, idx, n, k);
        qsort(srt, (size_t)n, sizeof(float), cmp_f_desc);
        for (int32_t i = 0; i < k; i++) got[i] = s[idx[i]];
        qsort(got, (size_t)k, sizeof(float), cmp_f_desc);
        /* the k values chosen are the k largest (as a multiset), and idx stays a permutation */
        for (int32_t i = 0; i < k; i++)
            if (got[i] != srt[i]) bad++;
        int64_t sum = 0;
        for (int32_t i = 0; i < n; i++) sum += idx[i];
        if (sum != (int64_t)n * (n - 1) / 2) bad++;
    }
    TU_CHECK(bad == 0, "top-k differs from sorting in %d places", bad);
    free(s);
    free(srt);
    free(got);
    free(idx);
}

static void test_selection(void) {
    const shp s = {"GQA", 2, 500, 8, 2, 64, 64};
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 21, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on),
          *ro = malloc(sizeof(float) * on), *sc = malloc(sizeof(float) * 500);
    int32_t *cand = malloc(sizeof(int32_t) * 500), *sel = malloc(sizeof(int32_t) * 500);
    uint8_t *want = malloc(500);
    int checked = 0;
    for (int cold = 0; cold < 2; cold++)
        for (int ai = 0; ai < 2; ai++) {
            tr_kv_params p = params(TR_KV_TIERED, ai ? 0.3f : 0.1f);
            if (cold) {
                p.hot_bytes = hot_min(&s, &p);
                p.cold_dir = g_tmp;
            }
            tr_kv *kv = mk(&s, &p);
            if (!kv || !fill(kv, &d, 0, s.nctx)) {
                tr_kv_free(kv);
                continue;
            }
            tr_error err = {0};
            for (int32_t pos = 20; pos < 500; pos += 61) {
                for (int32_t l = 0; l < s.nl; l++) {
                    query_make(q, &s, pos, 900 + (uint64_t)pos, false);
                    const int32_t swa = pos % 2 ? 100 : 0;
                    /* brute force: forced keys plus the k best of the rest by the same scores */
                    const int32_t lo = tr_kv_visible_lo(pos, swa), nvis = pos - lo + 1;
                    const int32_t k = tr_kv_count(p.alpha, nvis);
                    int32_t nc = 0;
                    memset(want, 0, 500);
                    for (int32_t t = lo; t <= pos; t++) {
                        if (t < p.n_sink || t > pos - p.n_window)
                            want[t] = 1;
                        else
                            cand[nc++] = t;
                    }
                    /* the forced keys join the per-head normalisation, not the ranking */
                    int32_t nall = nc;
                    for (int32_t t = lo; t <= pos; t++)
                        if (want[t]) cand[nall++] = t;
                    /* group A: the candidates on storage (see tr_kv_score_tokens) */
                    int32_t na = 0;
                    const int32_t written =
                        kv->cold ? kv->layers[l].pages_written * TR_KV_PAGE : 0;
                    while (na < nc && cand[na] < written) na++;
                    tr_kv_score_tokens(kv, NULL, l, q, 0.125f, cand, nall, na, kv->agg, sc);
                    for (int32_t i = 0; i < nc && k < nc; i++) {
                        int32_t above = 0; /* rank by counting: brute force */
                        for (int32_t j = 0; j < nc; j++) above += sc[j] > sc[i];
                        if (above < k) want[cand[i]] = 1;
                    }
                    if (k >= nc)
                        for (int32_t i = 0; i < nc; i++) want[cand[i]] = 1;
                    int32_t n = 0;
                    tr_status st = tr_kv_select_row(kv, g_pool, l, pos, q, false, 0.125f, swa, &n, &err);
                    TU_CHECK(st == TR_OK, "select: %s", err.msg);
                    int32_t nwant = 0, miss = 0;
                    for (int32_t t = 0; t < 500; t++) nwant += want[t];
                    for (int32_t i = 0; i < n; i++) {
                        miss += !want[kv->sel[i]];
                        if (i) miss += kv->sel[i] <= kv->sel[i - 1];
                    }
                    TU_CHECK(n == nwant && miss == 0,
                             "tiered selection at %d (alpha %.1f, swa %d): %d chosen, %d expected, "
                             "%d wrong",
                             pos, (double)p.alpha, swa, n, nwant, miss);
                    /* and the attention over that selection (gathered from both pools) */
                    memcpy(sel, kv->sel, sizeof(int32_t) * (size_t)n);
                    st = tr_kv_attend_rows(kv, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, swa, o, on,
                                           &err);
                    TU_CHECK(st == TR_OK, "attend: %s", err.msg);
                    TU_CHECK(kv->layers[l].selected == (uint64_t)n, "selected %llu vs %d",
                             (unsigned long long)kv->layers[l].selected, n);
                    memset(want, 0, 500);
                    for (int32_t i = 0; i < n; i++) want[sel[i]] = 1;
                    ref_attend(&d, l, &s, pos, q, 0.125f, NULL, swa, want, ro);
                    const float e = maxdiff(o, ro, on);
                    TU_CHECK(e <= TOL, "tiered alpha %.1f attention over its selection: %.3g",
                             (double)p.alpha, e);
                    checked++;
                }
            }
            tr_kv_free(kv);
        }
    printf("selection: %d tiered selections equal the brute-force top-k plus sinks and window, "
           "and their attention the reference over them\n",
           checked);
    free(q);
    free(o);
    free(ro);
    free(sc);
    free(cand);
    free(sel);
    free(want);
    data_free(&d);
}

/* sel_follow / sel_repeat against the selections themselves: rows at consecutive positions (some
 * with the same query, so that much repeats), a jump (not counted), and an SWA layer */
static void test_sel_repeat(void) {
    const shp s = {"GQA", 2, 400, 8, 2, 64, 64};
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 23, false);
    float *q = malloc(sizeof(float) * (size_t)s.nh * s.hdk);
    uint8_t *prev = calloc(400, 1), *cur = calloc(400, 1);
    tr_kv_params p = params(TR_KV_TIERED, 0.2f);
    tr_kv *kv = mk(&s, &p);
    if (!kv || !fill(kv, &d, 0, s.nctx)) {
        TU_CHECK(0, "sel_repeat: cache");
        tr_kv_free(kv);
        return;
    }
    static const int32_t rows[] = {100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110,
                                   200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210};
    tr_error err = {0};
    for (int32_t l = 0; l < s.nl; l++) {
        const int32_t swa = l ? 150 : 0;
        uint64_t want_f = 0, want_r = 0;
        tr_kv_stats st0, st1;
        tr_kv_get_stats(kv, &st0);
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            const int32_t pos = rows[i];
            query_make(q, &s, pos, 700 + (uint64_t)(pos / 3), false); /* same query in threes */
            int32_t n = 0;
            tr_status st = tr_kv_select_row(kv, g_pool, l, pos, q, false, 0.125f, swa, &n, &err);
            TU_CHECK(st == TR_OK, "select: %s", err.msg);
            const int32_t lo = tr_kv_visible_lo(pos, swa);
            const int32_t win_lo = pos - p.n_window + 1 > lo ? pos - p.n_window + 1 : lo;
            memset(cur, 0, 400);
            for (int32_t j = 0; j < n; j++)
                if (kv->sel[j] >= p.n_sink && kv->sel[j] < win_lo) cur[kv->sel[j]] = 1;
            const bool follows = i > 0 && rows[i - 1] == pos - 1;
            for (int32_t t = 0; t < 400 && follows; t++) {
                want_f += cur[t];
                want_r += cur[t] && prev[t];
            }
            memcpy(prev, cur, 400);
        }
        tr_kv_get_stats(kv, &st1);
        const uint64_t f = st1.sel_follow - st0.sel_follow, r = st1.sel_repeat - st0.sel_repeat;
        TU_CHECK(f == want_f && r == want_r && r > 0 && r < f,
                 "layer %d: %llu of %llu selected tokens repeat, want %llu of %llu", l,
                 (unsigned long long)r, (unsigned long long)f, (unsigned long long)want_r,
                 (unsigned long long)want_f);
        printf("sel_repeat: layer %d (swa %d): %llu of %llu tokens selected by the row before too, "
               "as counted from the selections\n",
               l, swa, (unsigned long long)r, (unsigned long long)f);
    }
    tr_kv_free(kv);
    free(q);
    free(prev);
    free(cur);
    data_free(&d);
}

/* ---- 3. recall of low-precision scoring; max vs sum; channel equalisation -------------------- */

typedef struct recall_acc {
    double sum;
    int n;
} recall_acc;

/* share of each head's softmax mass (scale 1/sqrt(d)) on the chosen tokens, averaged over heads */
static double mass_of(const uint8_t *chosen, double *const *exact, int32_t nh, int32_t n,
                      double scale) {
    double r = 0;
    for (int32_t h = 0; h < nh; h++) {
        double mx = -INFINITY, all = 0, got = 0;
        for (int32_t t = 0; t < n; t++) mx = fmax(mx, exact[h][t] * scale);
        for (int32_t t = 0; t < n; t++) {
            const double e = exp(exact[h][t] * scale - mx);
            all += e;
            if (chosen[t]) got += e;
        }
        r += got / all;
    }
    return r / nh;
}

/* recall of each head's exact top-k by one selection of k tokens, averaged over heads */
static double recall_of(const uint8_t *chosen, double *const *exact, int32_t nh, int32_t n,
                        int32_t k, float *tmp, int32_t *idx) {
    /* k may be smaller than the selection: how many of each head's k best it holds */
    double r = 0;
    for (int32_t h = 0; h < nh; h++) {
        for (int32_t t = 0; t < n; t++) {
            tmp[t] = (float)exact[h][t];
            idx[t] = t;
        }
        tr_kv_topk(tmp, idx, n, k);
        int32_t hit = 0;
        for (int32_t i = 0; i < k; i++) hit += chosen[idx[i]];
        r += (double)hit / k;
    }
    return r / nh;
}

static void test_recall(void) {
    enum { N = 2048, NQ = 12 };
    const shp shapes[] = {{"MHA 8/8", 1, N, 8, 8, 128, 128},
                          {"GQA 8/2", 1, N, 8, 2, 128, 128},
                          {"MQA 8/1", 1, N, 8, 1, 128, 128}};
    const int32_t k = (int32_t)ceil(0.2 * N);
    /* [iid][shape][bits 8/4][eq][agg: max, sum, pmax, psum] */
    enum { NA = 4 };
    static const char *agg_name[NA] = {"max", "sum", "pmax", "psum"};
    double res[2][3][2][3][NA], mass[2][3][3][NA]; /* mass: [iid][shape][exact/INT8/INT4][agg] */
    double hh[2][3][3][NA];                        /* heavy hitters: recall of each head's top 2% */
    const int32_t k2 = (int32_t)ceil(0.02 * N);
    const double scale = 1 / sqrt(128.0);
    double exact_agg[2][3][NA], hmax[8], hsum[8];
    float *tmp = malloc(sizeof(float) * N), *sc = malloc(sizeof(float) * N);
    int32_t *idx = malloc(sizeof(int32_t) * N), *cand = malloc(sizeof(int32_t) * N);
    uint8_t *chosen = malloc(N);
    for (int32_t t = 0; t < N; t++) cand[t] = t;
    for (int iid = 0; iid < 2; iid++)
        for (int si = 0; si < 3; si++) {
            const shp *s = &shapes[si];
            data d;
            data_make(&d, 1, N, s->nkv, s->hdk, s->hdv, 31 + (uint64_t)si, iid);
            double *exact[8];
            for (int h = 0; h < 8; h++) exact[h] = malloc(sizeof(double) * N);
            float *q = malloc(sizeof(float) * (size_t)s->nh * s->hdk);
            tr_kv *kvs[2][3];
            for (int b = 0; b < 2; b++)
                for (int e = 0; e < 3; e++) {
                    tr_kv_params p = params(TR_KV_TIERED, 0.2f);
                    p.score_bits = b ? 4 : 8;
                    kvs[b][e] = mk(s, &p);
                    if (!kvs[b][e]) continue;
                    tr_kv_set_eq(kvs[b][e], (tr_kv_eq)e);
                    fill(kvs[b][e], &d, 0, N);
                }
            memset(res[iid][si], 0, sizeof res[iid][si]);
            memset(mass[iid][si], 0, sizeof mass[iid][si]);
            memset(hh[iid][si], 0, sizeof hh[iid][si]);
            memset(exact_agg[iid][si], 0, sizeof exact_agg[iid][si]);
            for (int qi = 0; qi < NQ; qi++) {
                query_make(q, s, N - 1, 4000 + (uint64_t)qi * 31 + (uint64_t)si, iid);
                const int32_t G = s->nh / s->nkv;
                for (int32_t h = 0; h < s->nh; h++)
                    for (int32_t t = 0; t < N; t++) {
                        const float *kk = dk(&d, 0, t) + (size_t)(h / G) * s->hdk;
                        double a = 0;
                        for (int32_t c = 0; c < s->hdk; c++)
                            a += (double)r16(q[h * s->hdk + c]) * (double)r16(kk[c]);
                        exact[h][t] = a;
                    }
                /* each head's softmax over all keys, for the normalised aggregations */
                for (int32_t h = 0; h < s->nh; h++) {
                    hmax[h] = -INFINITY;
                    hsum[h] = 0;
                    for (int32_t t = 0; t < N; t++) hmax[h] = fmax(hmax[h], exact[h][t] * scale);
                    for (int32_t t = 0; t < N; t++) hsum[h] += exp(exact[h][t] * scale - hmax[h]);
                }
                for (int agg = 0; agg < NA; agg++) {
                    /* aggregation alone: exact scores, aggregated */
                    for (int32_t t = 0; t < N; t++) {
                        double a = agg == 0 || agg == 2 ? -INFINITY : 0;
                        for (int32_t h = 0; h < s->nh; h++) {
                            const double l = exact[h][t] * scale - hmax[h];
                            a = agg == 0   ? fmax(a, exact[h][t])
                                : agg == 1 ? a + exact[h][t]
                                : agg == 2 ? fmax(a, l)
                                           : a + exp(l) / hsum[h];
                        }
                        sc[t] = (float)a;
                        idx[t] = t;
                    }
                    tr_kv_topk(sc, idx, N, k);
                    memset(chosen, 0, N);
                    for (int32_t i = 0; i < k; i++) chosen[idx[i]] = 1;
                    exact_agg[iid][si][agg] += recall_of(chosen, exact, s->nh, N, k, tmp, idx) / NQ;
                    mass[iid][si][0][agg] += mass_of(chosen, exact, s->nh, N, scale) / NQ;
                    hh[iid][si][0][agg] += recall_of(chosen, exact, s->nh, N, k2, tmp, idx) / NQ;
                    for (int b = 0; b < 2; b++)
                        for (int e = 0; e < 3; e++) {
                            if (!kvs[b][e]) continue;
                            tr_kv_score_tokens(kvs[b][e], g_pool, 0, q, (float)scale, cand, N, 0,
                                               (tr_kv_agg)agg, sc);
                            for (int32_t t = 0; t < N; t++) idx[t] = t;
                            tr_kv_topk(sc, idx, N, k);
                            memset(chosen, 0, N);
                            for (int32_t i = 0; i < k; i++) chosen[idx[i]] = 1;
                            res[iid][si][b][e][agg] +=
                                recall_of(chosen, exact, s->nh, N, k, tmp, idx) / NQ;
                            if (e == TR_KV_EQ_ABSMAX) {
                                mass[iid][si][1 + b][agg] +=
                                    mass_of(chosen, exact, s->nh, N, scale) / NQ;
                                hh[iid][si][1 + b][agg] +=
                                    recall_of(chosen, exact, s->nh, N, k2, tmp, idx) / NQ;
                            }
                        }
                }
            }
            for (int b = 0; b < 2; b++)
                for (int e = 0; e < 3; e++) tr_kv_free(kvs[b][e]);
            for (int h = 0; h < 8; h++) free(exact[h]);
            free(q);
            data_free(&d);
        }
    printf("recall of each head's exact top-20%% (%d of %d keys, head dim 128, %d queries), "
           "tiered scoring:\n",
           k, N, NQ);
    printf("  %-10s %-8s %-4s | %-5s | %-17s | %-17s | %-17s | %s\n", "keys", "shape", "agg",
           "exact", "INT8 eq none/abs/sqrt", "INT4 eq none/abs/sqrt", "top-2% exact/8/4",
           "softmax mass exact/8/4");
    double tot[NA] = {0};
    for (int iid = 0; iid < 2; iid++)
        for (int si = 0; si < 3; si++)
            for (int agg = 0; agg < NA; agg++) {
                const double(*r)[3][NA] = res[iid][si];
                printf("  %-10s %-8s %-4s | %.3f | %.3f %.3f %.3f     | %.3f %.3f %.3f     | "
                       "%.3f %.3f %.3f | %.3f %.3f %.3f\n",
                       iid ? "iid noise" : "realistic", shapes[si].name, agg_name[agg],
                       exact_agg[iid][si][agg], r[0][0][agg], r[0][1][agg], r[0][2][agg],
                       r[1][0][agg], r[1][1][agg], r[1][2][agg], hh[iid][si][0][agg],
                       hh[iid][si][1][agg], hh[iid][si][2][agg], mass[iid][si][0][agg],
                       mass[iid][si][1][agg], mass[iid][si][2][agg]);
                for (int b = 0; b < 2; b++) tot[agg] += r[b][TR_KV_EQ_ABSMAX][agg];
                /* quantization must not lose much against the exact aggregated scores */
                TU_CHECK(r[0][TR_KV_EQ_ABSMAX][agg] >= 0.93 * exact_agg[iid][si][agg],
                         "INT8 recall %.3f vs exact %.3f", r[0][1][agg], exact_agg[iid][si][agg]);
                TU_CHECK(r[1][TR_KV_EQ_ABSMAX][agg] >= 0.80 * exact_agg[iid][si][agg],
                         "INT4 recall %.3f vs exact %.3f", r[1][1][agg], exact_agg[iid][si][agg]);
            }
    double eqtot[3] = {0, 0, 0}, hht[NA] = {0}, mst[NA] = {0};
    for (int iid = 0; iid < 2; iid++)
        for (int si = 0; si < 3; si++) {
            for (int b = 0; b < 2; b++)
                for (int e = 0; e < 3; e++)
                    for (int agg = 0; agg < NA; agg++) eqtot[e] += res[iid][si][b][e][agg];
            for (int agg = 0; agg < NA; agg++)
                for (int b = 1; b < 3; b++) {
                    hht[agg] += hh[iid][si][b][agg] / 12;
                    mst[agg] += mass[iid][si][b][agg] / 12;
                }
        }
    /* The decision: the recall of each head's top 2% (the keys that carry its attention) and the
     * softmax mass the selection holds, which bounds the output error. Recall of the whole top
     * 20% favours sum: it rewards the flat middle of each head's ranking, which carries little
     * attention. */
    int best = 0;
    printf("  mean over shapes, INT8+INT4 (absmax):\n");
    for (int agg = 0; agg < NA; agg++) {
        printf("    %-4s top-20%% recall %.3f, top-2%% recall %.3f, softmax mass %.3f\n",
               agg_name[agg], tot[agg] / 12, hht[agg], mst[agg]);
        if (hht[agg] + mst[agg] > hht[best] + mst[best]) best = agg;
    }
    const tr_kv_agg chosen_agg = (tr_kv_agg)best;
    printf("  -> %s\n", agg_name[best]);
    printf("  channel equalisation (mean top-20%% recall): none %.3f, absmax %.3f, sqrt %.3f\n",
           eqtot[0] / (12 * NA), eqtot[1] / (12 * NA), eqtot[2] / (12 * NA));
    /* the defaults are the measured better choices */
    tr_kv_params p = params(TR_KV_TIERED, 0.2f);
    tr_kv *kv = mk(&shapes[0], &p);
    if (kv) {
        TU_CHECK(kv->agg == chosen_agg, "default aggregation is not the better one");
        TU_CHECK(eqtot[kv->eq_mode] >= fmax(eqtot[0], fmax(eqtot[1], eqtot[2])) - 0.005 * 12 * NA,
                 "default equalisation is not the better one");
        tr_kv_free(kv);
    }
    free(tmp);
    free(sc);
    free(idx);
    free(cand);
    free(chosen);
}

/* ---- 4. h2o: permanent eviction ---------------------------------------------------------------
 */

static void test_h2o(void) {
    const shp s = {"MHA", 1, 160, 4, 4, 32, 32};
    data d;
    data_make(&d, 1, s.nctx, s.nkv, s.hdk, s.hdv, 41, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn * 16), *o = malloc(sizeof(float) * on * 16),
          *ro = malloc(sizeof(float) * on);
    uint8_t *allow = malloc(160), *ever = malloc(160);
    for (int cold = 0; cold < 2; cold++) {
        tr_kv_params p = params(TR_KV_H2O, 0.4f);
        if (cold) {
            p.hot_bytes = hot_min(&s, &p);
            p.cold_dir = g_tmp;
        }
        tr_kv *kv = mk(&s, &p), *kv2 = mk(&s, &p);
        if (!kv || !kv2) {
            tr_kv_free(kv);
            tr_kv_free(kv2);
            continue;
        }
        tr_error err = {0};
        memset(ever, 0, 160);
        float worst = 0;
        int broken = 0;
        /* decode one token at a time */
        for (int32_t t = 0; t < 128; t++) {
            fill(kv, &d, t, t + 1);
            query_make(q, &s, t, 7000 + (uint64_t)t, false);
            for (int32_t i = 0; i <= t; i++)
                allow[i] = kv->layers[0].tok[i].where != TR_KV_TOK_EVICTED;
            tr_status st =
                tr_kv_attend_rows(kv, g_pool, 0, 1, &t, q, qn, 0.2f, NULL, 0, o, on, &err);
            TU_CHECK(st == TR_OK, "h2o attend: %s", err.msg);
            ref_attend(&d, 0, &s, t, q, 0.2f, NULL, 0, allow, ro);
            const float e = maxdiff(o, ro, on);
            if (e > worst) worst = e;
            int32_t kept = 0;
            for (int32_t i = 0; i <= t; i++) {
                const bool ev = kv->layers[0].tok[i].where == TR_KV_TOK_EVICTED;
                if (ever[i] && !ev) broken++; /* an evicted token came back */
                ever[i] |= ev;
                kept += !ev;
                if (ev && (i < p.n_sink || i > t - p.n_window)) broken++;
            }
            const int32_t forced =
                p.n_sink + (t + 1 - p.n_sink < p.n_window ? t + 1 - p.n_sink : p.n_window);
            int32_t budget = (int32_t)ceil(0.4 * (t + 1));
            if (budget < forced) budget = forced;
            if (kept > budget) broken++;
        }
        tr_kv_stats stt;
        tr_kv_get_stats(kv, &stt);
        TU_CHECK(broken == 0 && stt.evicted > 0,
                 "h2o eviction rules broken %d times (%llu evicted)", broken,
                 (unsigned long long)stt.evicted);
        TU_CHECK(worst <= TOL, "h2o attention over the kept tokens: %.3g", worst);
        /* the same 128 steps as one multi-row call: the same outputs and the same evictions */
        fill(kv2, &d, 0, 128);
        int32_t pos[16];
        float *o1 = malloc(sizeof(float) * on * 128);
        memset(o1, 0, sizeof(float) * on * 128);
        for (int32_t b = 0; b < 128; b += 16) {
            for (int r = 0; r < 16; r++) {
                pos[r] = b + r;
                query_make(q + r * qn, &s, pos[r], 7000 + (uint64_t)pos[r], false);
            }
            tr_kv_attend_rows(kv2, g_pool, 0, 16, pos, q, qn, 0.2f, NULL, 0, o1 + b * on, on, &err);
        }
        int diff = 0;
        for (int32_t i = 0; i < 128; i++)
            diff += (kv->layers[0].tok[i].where == TR_KV_TOK_EVICTED) !=
                    (kv2->layers[0].tok[i].where == TR_KV_TOK_EVICTED);
        TU_CHECK(diff == 0, "h2o: a 16-row call evicts differently from 16 single steps (%d)",
                 diff);
        /* truncate keeps earlier evictions; re-appended positions are new */
        tr_status st = tr_kv_truncate(kv, 100, &err);
        TU_CHECK(st == TR_OK, "truncate: %s", err.msg);
        int kept_ev = 0;
        for (int32_t i = 0; i < 100; i++)
            kept_ev += ever[i] == (kv->layers[0].tok[i].where == TR_KV_TOK_EVICTED);
        TU_CHECK(kept_ev == 100, "h2o truncate changed evictions below the cut");
        fill(kv, &d, 100, 120);
        for (int32_t i = 100; i < 120; i++)
            TU_CHECK(kv->layers[0].tok[i].where != TR_KV_TOK_EVICTED, "re-appended %d evicted", i);
        printf("h2o (%s): %llu of 128 tokens evicted at alpha 0.4, none returned, sinks and "
               "window kept; attention = reference over the kept set (%.2e); multi-row = "
               "sequential\n",
               cold ? "cold" : "hot", (unsigned long long)stt.evicted, (double)worst);
        free(o1);
        tr_kv_free(kv);
        tr_kv_free(kv2);
    }
    free(q);
    free(o);
    free(ro);
    free(allow);
    free(ever);
    data_free(&d);
}

/* ---- 5. quest: the page bounds are upper bounds -----------------------------------------------
 */

static void test_quest(void) {
    const shp s = {"GQA", 1, 300, 8, 2, 64, 64};
    data d;
    data_make(&d, 1, s.nctx, s.nkv, s.hdk, s.hdv, 51, false);
    tr_kv_params p = params(TR_KV_QUEST, 0.25f);
    p.hot_bytes = hot_min(&s, &p);
    p.cold_dir = g_tmp;
    tr_kv *kv = mk(&s, &p);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *q16 = malloc(sizeof(float) * (size_t)s.hdk),
          *o = malloc(sizeof(float) * on), *ro = malloc(sizeof(float) * on);
    uint8_t *allow = malloc(300);
    if (kv && fill(kv, &d, 0, 290)) {
        tr_error err = {0};
        /* truncating into a page and appending again must leave true bounds too */
        TU_CHECK(tr_kv_truncate(kv, 250, &err) == TR_OK, "truncate: %s", err.msg);
        fill(kv, &d, 250, 300);
        int viol = 0, checks = 0;
        double slack = INFINITY;
        for (int qi = 0; qi < 20; qi++) {
            query_make(q, &s, 299, 500 + (uint64_t)qi, qi % 2);
            for (int32_t h = 0; h < s.nh; h++) {
                for (int32_t c = 0; c < s.hdk; c++) q16[c] = r16(q[h * s.hdk + c]);
                const int32_t g = h / (s.nh / s.nkv);
                for (int32_t pg = 0; pg < (300 + 15) / 16; pg++) {
                    const float ub = tr_kv_quest_bound(kv, 0, pg, g, q16);
                    for (int32_t t = pg * 16; t < pg * 16 + 16 && t < 300; t++) {
                        double a = 0;
                        for (int32_t c = 0; c < s.hdk; c++)
                            a += (double)q16[c] * (double)r16(dk(&d, 0, t)[g * s.hdk + c]);
                        if ((double)ub < a - 1e-4 * (1 + fabs(a))) viol++;
                        if ((double)ub - a < slack) slack = (double)ub - a;
                        checks++;
                    }
                }
            }
        }
        TU_CHECK(viol == 0, "quest: %d of %d keys score above their page's bound", viol, checks);
        /* its attention over what it selects */
        int32_t pos = 299;
        query_make(q, &s, pos, 77, false);
        tr_status st =
            tr_kv_attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "quest attend: %s", err.msg);
        int32_t n = 0;
        st = tr_kv_select_row(kv, g_pool, 0, pos, q, false, 0.125f, 0, &n, &err);
        memset(allow, 0, 300);
        int whole = 1;
        for (int32_t i = 0; i < n; i++) allow[kv->sel[i]] = 1;
        for (int32_t t = p.n_sink; t <= pos - p.n_window; t++)
            if (allow[t] != allow[(t / 16) * 16 > p.n_sink ? (t / 16) * 16 : p.n_sink]) whole = 0;
        TU_CHECK(whole, "quest selected part of a page");
        TU_CHECK(n >= (int32_t)ceil(0.25 * 300) &&
                     n <= (int32_t)ceil(0.25 * 300) + 16 + p.n_sink + p.n_window,
                 "quest selected %d keys", n);
        ref_attend(&d, 0, &s, pos, q, 0.125f, NULL, 0, allow, ro);
        TU_CHECK(maxdiff(o, ro, on) <= TOL, "quest attention over its pages: %.3g",
                 maxdiff(o, ro, on));
        printf("quest: %d key scores checked against their page bounds, none above (smallest "
               "slack %.3g); %d keys attended in whole pages\n",
               checks, slack, n);
    }
    tr_kv_free(kv);
    free(q);
    free(q16);
    free(o);
    free(ro);
    free(allow);
    data_free(&d);
}

/* ---- 6. truncate and append again -------------------------------------------------------------
 */

static void test_truncate(void) {
    const shp s = {"GQA", 2, 160, 8, 2, 64, 64};
    data d1, d2;
    data_make(&d1, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 61, false);
    data_make(&d2, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 62, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on),
          *ro = malloc(sizeof(float) * on);
    /* d mixes: positions < 70 from d1, the rest from d2 */
    data dm;
    data_make(&dm, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 61, false);
    for (int32_t l = 0; l < s.nl; l++)
        for (int32_t t = 70; t < s.nctx; t++) {
            memcpy((float *)dk(&dm, l, t), dk(&d2, l, t), sizeof(float) * (size_t)(s.nkv * s.hdk));
            memcpy((float *)dv(&dm, l, t), dv(&d2, l, t), sizeof(float) * (size_t)(s.nkv * s.hdv));
        }
    float worst = 0;
    for (int pol = TR_KV_OFFLOAD; pol <= TR_KV_TIERED; pol++) {
        tr_kv_params p = params((tr_kv_policy)pol, 1.0f);
        p.hot_bytes = hot_min(&s, &p);
        p.cold_dir = g_tmp;
        tr_kv *kv = mk(&s, &p);
        if (!kv) continue;
        tr_error err = {0};
        fill(kv, &d1, 0, 120);
        /* position 70 is inside page 4 (64..79), whose first tokens are cold by now */
        TU_CHECK(kv->layers[0].tok[64].where == TR_KV_TOK_COLD, "token 64 should be cold");
        TU_CHECK(tr_kv_truncate(kv, 70, &err) == TR_OK, "truncate: %s", err.msg);
        fill(kv, &dm, 70, 160);
        for (int32_t l = 0; l < s.nl; l++)
            for (int32_t pos = 75; pos < 160; pos += 21) {
                query_make(q, &s, pos, 3 + (uint64_t)pos, false);
                tr_status st =
                    tr_kv_attend_rows(kv, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
                TU_CHECK(st == TR_OK, "attend after truncate: %s", err.msg);
                ref_attend(&dm, l, &s, pos, q, 0.125f, NULL, 0, NULL, ro);
                const float e = maxdiff(o, ro, on);
                if (e > worst) worst = e;
            }
        tr_kv_free(kv);
    }
    TU_CHECK(worst <= TOL, "attention after truncate + append: %.3g", worst);
    printf("truncate into a page with cold tokens, append new tokens: attention = reference "
           "(%.2e), offload/h2o/quest/tiered\n",
           (double)worst);
    free(q);
    free(o);
    free(ro);
    data_free(&d1);
    data_free(&d2);
    data_free(&dm);
}

/* ---- 7. save / restore ------------------------------------------------------------------------
 */

static void flip_byte(const char *path, off_t off) {
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

static void test_save_restore(void) {
    const shp s = {"GQA", 2, 200, 8, 2, 64, 64};
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 71, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    float *q = malloc(sizeof(float) * qn), *o1 = malloc(sizeof(float) * on),
          *o2 = malloc(sizeof(float) * on);
    char path[300];
    snprintf(path, sizeof path, "%s/kv.save", g_tmp);
    const tr_kv_policy pols[] = {TR_KV_TIERED, TR_KV_H2O, TR_KV_QUEST};
    for (int pi = 0; pi < 3; pi++) {
        tr_kv_params p = params(pols[pi], 0.3f);
        p.hot_bytes = hot_min(&s, &p);
        p.cold_dir = g_tmp;
        tr_kv *a = mk(&s, &p), *b = mk(&s, &p);
        if (!a || !b) {
            tr_kv_free(a);
            tr_kv_free(b);
            continue;
        }
        tr_error err = {0};
        fill(a, &d, 0, 180);
        /* some steps, so h2o has evicted and hits are counted */
        for (int32_t pos = 100; pos < 180; pos += 7)
            for (int32_t l = 0; l < s.nl; l++) {
                query_make(q, &s, pos, (uint64_t)pos, false);
                tr_kv_attend_rows(a, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o1, on, &err);
            }
        tr_status st = tr_kv_save(a, path, &err);
        TU_CHECK(st == TR_OK, "save: %s", err.msg);
        fill(b, &d, 0, 20); /* restore replaces what was there */
        st = tr_kv_restore(b, path, &err);
        TU_CHECK(st == TR_OK, "restore: %s", err.msg);
        int same_state = 1;
        for (int32_t l = 0; l < s.nl; l++) {
            same_state &= a->layers[l].len == b->layers[l].len;
            for (int32_t t = 0; t < 180; t++)
                same_state &= a->layers[l].tok[t].hits == b->layers[l].tok[t].hits &&
                              (a->layers[l].tok[t].where == TR_KV_TOK_EVICTED) ==
                                  (b->layers[l].tok[t].where == TR_KV_TOK_EVICTED);
        }
        TU_CHECK(same_state, "%s: restored token state differs", tr_kv_policy_name(pols[pi]));
        float worst = 0;
        for (int32_t l = 0; l < s.nl; l++) {
            int32_t pos = 179;
            query_make(q, &s, pos, 4242, false);
            tr_kv_attend_rows(a, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o1, on, &err);
            tr_kv_attend_rows(b, g_pool, l, 1, &pos, q, qn, 0.125f, NULL, 0, o2, on, &err);
            const float e = maxdiff(o1, o2, on);
            if (e > worst) worst = e;
        }
        TU_CHECK(worst == 0.0f, "%s: restored cache attends differently (%.3g)",
                 tr_kv_policy_name(pols[pi]), worst);
        if (pi == 0) {
            /* a damaged file is refused and leaves the cache empty */
            flip_byte(path, 5000);
            st = tr_kv_restore(b, path, &err);
            TU_CHECK(st == TR_E_FORMAT && strstr(err.msg, "checksum"), "damaged save: %d %s", st,
                     err.msg);
            TU_CHECK(b->layers[0].len == 0, "a failed restore left %d positions", b->layers[0].len);
            printf("save/restore: damaged file -> %s\n", err.msg);
            /* another shape is refused */
            shp s2 = s;
            s2.nctx = 100;
            tr_kv *c = mk(&s2, &p);
            tr_kv_save(a, path, &err);
            st = c ? tr_kv_restore(c, path, &err) : TR_E_INTERNAL;
            TU_CHECK(st == TR_E_FORMAT, "restore into another shape: %d", st);
            tr_kv_free(c);
        }
        tr_kv_free(a);
        tr_kv_free(b);
    }
    unlink(path);
    printf("save/restore: tiered, h2o, quest round trips attend identically (with evictions and "
           "hit counts)\n");
    free(q);
    free(o1);
    free(o2);
    data_free(&d);
}

/* ---- 8. faults and budgets --------------------------------------------------------------------
 */

static tr_status try_create(const shp *s, const tr_kv_params *p, tr_error *err, tr_kv **out) {
    const tr_kv_shape sh = to_shape(s);
    tr_kv_free(*out); /* one that was expected to fail and did not */
    *out = NULL;
    return tr_kv_create(&sh, p, out, err);
}

static void test_faults(void) {
    const shp s = {"GQA", 2, 256, 8, 2, 64, 64};
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 81, false);
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on);
    tr_error err = {0};
    tr_kv *kv = NULL;
    tr_kv_params p = params(TR_KV_TIERED, 0.5f);
    p.hot_bytes = hot_min(&s, &p);
    tr_status st;

    /* budgets */
    tr_kv_params b = p;
    b.hot_bytes = hot_min(&s, &p) - 1;
    b.cold_dir = g_tmp;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "need"), "hot pool too small: %d %s", st,
             err.msg);
    printf("budget: %s\n", err.msg);
    b = p;
    b.cold_dir = NULL;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "--kv-cold"), "no cold dir: %d %s", st, err.msg);
    printf("budget: %s\n", err.msg);
    b = p;
    b.policy = TR_KV_FULL;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "bytes"), "full over budget: %d %s", st, err.msg);
    printf("budget: %s\n", err.msg);
    b = p;
    b.cold_dir = g_tmp;
    b.ws_bytes = 1000;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "working set"), "ws too small: %d %s", st,
             err.msg);
    printf("budget: %s\n", err.msg);
    TU_CHECK(tr_kv_dram_bytes(&(tr_kv_shape){2, 256, 8, 2, 64, 64}, &p) > p.hot_bytes,
             "dram bytes");
    b = p;
    b.alpha = 0;
    TU_CHECK(try_create(&s, &b, &err, &kv) == TR_E_ARG, "alpha 0 accepted");

    /* cold directory not writable. Root ignores permission bits, so: (1) a path below a regular
     * file (ENOTDIR), (2) a read-only tmpfs mount (EROFS), when mounting is permitted */
    char path[300];
    snprintf(path, sizeof path, "%s/plainfile", g_tmp);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    b = p;
    b.cold_dir = path;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_IO && strstr(err.msg, path), "cold dir is a file: %d %s", st, err.msg);
    printf("cold dir: %s\n", err.msg);
    char sub[320];
    snprintf(sub, sizeof sub, "%s/sub", path);
    b.cold_dir = sub;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_E_IO && strstr(err.msg, sub), "cold dir below a file: %d %s", st, err.msg);
    printf("cold dir: %s\n", err.msg);
    unlink(path);

    char mnt[300];
    snprintf(mnt, sizeof mnt, "%s/mnt", g_tmp);
    mkdir(mnt, 0700);
    if (mount("tmpfs", mnt, "tmpfs", MS_RDONLY, "size=1m") == 0) {
        b = p;
        b.cold_dir = mnt;
        st = try_create(&s, &b, &err, &kv);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, mnt) && strstr(err.msg, "writable"),
                 "read-only cold dir: %d %s", st, err.msg);
        printf("cold dir (read-only tmpfs): %s\n", err.msg);
        tr_kv_free(kv);
        kv = NULL;
        umount2(mnt, MNT_DETACH);
        /* disk full: a 1 MiB tmpfs cannot hold the reserved segment files */
        if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") == 0) {
            shp big = s;
            big.nctx = 4096; /* 2 layers x 4096 x 512 bytes: 4 MiB of segment files */
            b.cold_dir = mnt;
            st = try_create(&big, &b, &err, &kv);
            TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "needs") && strstr(err.msg, mnt),
                     "disk full: %d %s", st, err.msg);
            printf("disk full (1 MiB tmpfs): %s\n", err.msg);
            tr_kv_free(kv);
            kv = NULL;
            /* a pool that fits is reserved in full at create: the device cannot fill up later */
            shp s2 = s;
            s2.nctx = 64;
            tr_kv_params b2 = b;
            b2.n_sink = 0;
            b2.hot_bytes = (uint64_t)s2.nl * 16 * 512;
            st = try_create(&s2, &b2, &err, &kv);
            TU_CHECK(st == TR_OK, "small pool on tmpfs: %s", err.msg);
            tr_kv_free(kv);
            kv = NULL;
            umount2(mnt, MNT_DETACH);
        } else {
            printf("disk full: SKIPPED (mount not permitted: %s)\n", strerror(errno));
        }
    } else {
        printf("read-only cold dir and disk full on tmpfs: SKIPPED (mount not permitted: %s)\n",
               strerror(errno));
    }
    rmdir(mnt);

    /* a write that fails (ENOSPC injected into the 5th page write) */
    b = p;
    b.cold_dir = g_tmp;
    st = try_create(&s, &b, &err, &kv);
    TU_CHECK(st == TR_OK, "create: %s", err.msg);
    if (kv) {
        tr_kv_set_write_fault(kv, 5, ENOSPC);
        st = TR_OK;
        for (int32_t t = 0; t < 256 && !st; t++)
            for (int32_t l = 0; l < s.nl && !st; l++)
                st = tr_kv_append(kv, l, t, dk(&d, l, t), dv(&d, l, t), &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "full") && strstr(err.msg, "page"),
                 "write fault: %d %s", st, err.msg);
        printf("write fault: %s\n", err.msg);
        tr_kv_free(kv);
        kv = NULL;
    }

    /* a corrupted page: one flipped bit in a cold record -> TR_E_IO naming file, layer, page */
    b = p;
    b.cold_dir = g_tmp;
    b.alpha = 1.0f;
    b.policy = TR_KV_OFFLOAD;
    st = try_create(&s, &b, &err, &kv);
    if (kv && fill(kv, &d, 0, 256)) {
        int32_t pos = 255;
        query_make(q, &s, pos, 1, false);
        st = tr_kv_attend_rows(kv, g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "attend before corruption: %s", err.msg);
        char seg[400], fdpath[64];
        tr_kv_seg_path(kv, 1, seg, sizeof seg);
        /* the file is unlinked already (it lives on through the cache's descriptor) */
        TU_CHECK(access(seg, F_OK) != 0, "%s still has a name", seg);
        snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", kv->layers[1].fd);
        flip_byte(fdpath, (off_t)(tr_kv_page_offset(kv, 3) + 2 * kv->rec + 77));
        st = tr_kv_attend_rows(kv, g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "checksum") && strstr(err.msg, "layer 1") &&
                     strstr(err.msg, "page 3") && strstr(err.msg, "position 50") &&
                     strstr(err.msg, seg),
                 "corrupted page: %d %s", st, err.msg);
        printf("corrupted page: %s\n", err.msg);
        /* the other layer is unaffected */
        st = tr_kv_attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "layer 0 after corrupting layer 1: %s", err.msg);
        /* a failing read (EIO on the next read) */
        tr_io_pool_set_faults(kv->io, kv->pool_reads + 1, 0);
        st = tr_kv_attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "Input/output error"), "read fault: %d %s", st,
                 err.msg);
        printf("read fault: %s\n", err.msg);
        /* the same with the reads in flight as chunks attended as they arrive (tr_kv.pipe): the
         * failing chunk is named, the others are waited for, and the cache works afterwards */
        kv->pipe_min = 1;
        st = tr_kv_attend_rows(kv, g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "checksum") && strstr(err.msg, "position 50"),
                 "corrupted page, pipelined: %d %s", st, err.msg);
        tr_io_pool_set_faults(kv->io, kv->pool_reads + 3, 0);
        st = tr_kv_attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "Input/output error"),
                 "read fault, pipelined: %d %s", st, err.msg);
        st = tr_kv_attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err);
        TU_CHECK(st == TR_OK, "layer 0 after a failed pipelined read: %s", err.msg);
        /* the cold files are removed at free */
        char dir[400];
        snprintf(dir, sizeof dir, "%s", tr_kv_cold_path(kv));
        tr_kv_free(kv);
        kv = NULL;
        TU_CHECK(access(dir, F_OK) != 0, "cold directory %s left behind", dir);
    }
    tr_kv_free(kv);
    /* ... and kept with keep */
    b = p;
    b.cold_dir = g_tmp;
    b.keep = true;
    if (try_create(&s, &b, &err, &kv) == TR_OK) {
        char dir[400], seg0[400], seg1[400];
        snprintf(dir, sizeof dir, "%s", tr_kv_cold_path(kv));
        fill(kv, &d, 0, 64);
        tr_kv_seg_path(kv, 0, seg0, sizeof seg0);
        tr_kv_seg_path(kv, 1, seg1, sizeof seg1);
        tr_kv_free(kv);
        TU_CHECK(access(seg0, F_OK) == 0 && access(seg1, F_OK) == 0, "keep: %s removed", seg0);
        unlink(seg0);
        unlink(seg1);
        rmdir(dir);
    }
    free(q);
    free(o);
    data_free(&d);
}

/* ---- BKP: placement between the pools ----------------------------------------------------------
 * The same decode run (append a token, attend from it, in both layers) through four caches that
 * differ only in placement: off, naive, on, and on with a working set that forces chunks (against
 * off with the same working set). The output must be bit-identical: placement decides where rows
 * are read from, never which. Then: the hot pool stays within its budget with its slot maps
 * consistent and the sinks hot; BKP finds more selected tokens hot than static placement, and
 * makes at least 5x fewer ping-pong moves than naive promotion. */
static bool pools_consistent(const tr_kv *kv) {
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        const tr_kv_layer *L = &kv->layers[l];
        int32_t hot = 0;
        for (int32_t t = 0; t < L->len; t++) {
            if (L->tok[t].where != TR_KV_TOK_HOT) continue;
            hot++;
            if (L->slot_pos[L->tok[t].slot] != t) return false;
        }
        if (hot + L->n_free != kv->hot_slots) return false;
        for (int32_t t = 0; t < kv->params.n_sink && t < L->len; t++)
            if (L->tok[t].where != TR_KV_TOK_HOT) return false;
    }
    return true;
}

static void test_bkp(void) {
    const shp s = {"GQA", 2, 640, 8, 2, 64, 64};
    enum { N0 = 256, NK = 5 };
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 77, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    const uint64_t rec = (uint64_t)s.nkv * (uint64_t)(s.hdk + s.hdv) * 2;
    const tr_kv_bkp mode[NK] = {TR_KV_BKP_OFF, TR_KV_BKP_NAIVE, TR_KV_BKP_ON, TR_KV_BKP_OFF,
                                TR_KV_BKP_ON};
    tr_kv *kv[NK];
    tr_kv_params p[NK];
    for (int i = 0; i < NK; i++) {
        p[i] = params(TR_KV_TIERED, 0.15f);
        p[i].bkp = mode[i];
        p[i].hot_bytes = hot_min(&s, &p[i]) + (uint64_t)s.nl * 48 * rec; /* 66 of 640 tokens */
        p[i].cold_dir = g_tmp;
        if (i >= 3) p[i].ws_bytes = 40 * rec; /* chunks of 20 */
        kv[i] = mk(&s, &p[i]);
        /* joined reads (read gap) add placement-dependent entries to the gathered list, which
         * moves the chunk boundaries and so the online softmax's rounding: exact comparison of
         * chunked runs needs the list to be the selection itself */
        if (kv[i] && i >= 3) kv[i]->read_gap = 0;
        if (!kv[i] || !fill(kv[i], &d, 0, N0)) {
            for (int j = 0; j <= i; j++) tr_kv_free(kv[j]);
            data_free(&d);
            return;
        }
    }
    /* not with another policy */
    {
        tr_kv_params bad = params(TR_KV_QUEST, 0.15f);
        bad.bkp = TR_KV_BKP_ON;
        tr_kv *x = NULL;
        tr_error err = {0};
        const tr_kv_shape sh = to_shape(&s);
        TU_CHECK(tr_kv_create(&sh, &bad, &x, &err) == TR_E_ARG && strstr(err.msg, "tiered"),
                 "bkp with quest: %s", err.msg);
        tr_kv_free(x);
    }
    float *q = malloc(sizeof(float) * qn), *o[NK];
    for (int i = 0; i < NK; i++) o[i] = malloc(sizeof(float) * on);
    const float scale = 1.0f / sqrtf((float)s.hdk);
    tr_error err = {0};
    int differ = 0, inconsistent = 0;
    for (int32_t pos = N0; pos < s.nctx; pos++)
        for (int32_t l = 0; l < s.nl; l++) {
            /* decoding revisits what matters: the query of a step resembles one of a few
             * recurring ones (a topic), so the same tokens keep being selected */
            query_make(q, &s, pos, 500 + (uint64_t)((pos * 7) % 5) + 10 * (uint64_t)l, false);
            for (int i = 0; i < NK; i++) {
                if (tr_kv_append(kv[i], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err) ||
                    tr_kv_attend_rows(kv[i], g_pool, l, 1, &pos, q, qn, scale, NULL, 0, o[i], on,
                                      &err)) {
                    TU_CHECK(0, "bkp %s step %d: %s", tr_kv_bkp_name(mode[i]), pos, err.msg);
                    goto out;
                }
                inconsistent += !pools_consistent(kv[i]);
            }
            for (int i = 1; i < 3; i++) differ += memcmp(o[i], o[0], on * sizeof(float)) != 0;
            differ += memcmp(o[4], o[3], on * sizeof(float)) != 0;
        }
    TU_CHECK(differ == 0, "placement changed the attention output in %d steps", differ);
    TU_CHECK(inconsistent == 0, "hot pool inconsistent (slots, budget or sinks) in %d checks",
             inconsistent);
    tr_kv_stats st[NK];
    for (int i = 0; i < NK; i++) {
        tr_kv_get_stats(kv[i], &st[i]);
        TU_CHECK(st[i].hot_bytes <= p[i].hot_bytes, "hot %llu > budget %llu",
                 (unsigned long long)st[i].hot_bytes, (unsigned long long)p[i].hot_bytes);
        TU_CHECK(st[i].migrated_bytes == st[i].promotions * rec, "migrated bytes");
    }
    const int32_t steps = (s.nctx - N0) * s.nl;
    double hit[NK];
    for (int i = 0; i < NK; i++) {
        hit[i] = (double)st[i].sel_hot / (double)(st[i].sel_hot + st[i].sel_cold);
        printf("bkp %-5s%s: selected found hot %.1f %%, read %.2f MiB, %llu promotions, %llu "
               "demotions, ping-pong %.3f per layer-step\n",
               tr_kv_bkp_name(mode[i]), i >= 3 ? " (chunked)" : "", 100 * hit[i],
               (double)st[i].bytes_read / 1048576.0, (unsigned long long)st[i].promotions,
               (unsigned long long)st[i].demotions, (double)st[i].pingpong / steps);
    }
    TU_CHECK(st[0].promotions == 0 && st[2].promotions > 0 && st[4].promotions > 0,
             "promotions off %llu on %llu", (unsigned long long)st[0].promotions,
             (unsigned long long)st[2].promotions);
    TU_CHECK(hit[2] > hit[0] + 0.05, "BKP hot hit rate %.3f vs static %.3f", hit[2], hit[0]);
    TU_CHECK(st[2].bytes_read < st[0].bytes_read, "BKP read %llu bytes, static %llu",
             (unsigned long long)st[2].bytes_read, (unsigned long long)st[0].bytes_read);
    TU_CHECK(st[1].pingpong > 0 && st[2].pingpong * 5 <= st[1].pingpong,
             "ping-pong: BKP %llu, naive %llu (want 5x fewer)", (unsigned long long)st[2].pingpong,
             (unsigned long long)st[1].pingpong);
out:
    for (int i = 0; i < NK; i++) {
        tr_kv_free(kv[i]);
        free(o[i]);
    }
    free(q);
    data_free(&d);
}

/* APP with its rates given (--kv-app-rates) rather than measured: beta from the balance equation
 * of tr_kv_app_beta, and the given rates are never overwritten by measurements */
static void test_app_rates(void) {
    const shp s = {"GQA", 2, 64, 8, 2, 64, 64};
    tr_kv_params p = params(TR_KV_TIERED, 0.25f);
    p.app_f_c = 2e6;
    p.app_f_s = 1e6;
    tr_kv *kv = mk(&s, &p);
    if (!kv) return;
    TU_CHECK(fabs(tr_kv_app_beta(kv) - 2.0) < 1e-9, "APP rates: beta %g, want 2 (agent half as "
             "fast: the host takes two tokens for each of the agent's)", tr_kv_app_beta(kv));
    /* the row rates are measured (and reported) but do not move the balance: the split moves
     * no rows (see tr_kv_app_beta) */
    tr_kv_app_note_rows(kv, 1000, 1000, 1000, 1000); /* measured link rates: 1 byte/ns */
    TU_CHECK(fabs(tr_kv_app_beta(kv) - 2.0) < 1e-9 && fabs(kv->app_bc - 1.0) < 1e-9,
             "APP rates with measured links: beta %g (want 2), B_c %g bytes/ns",
             tr_kv_app_beta(kv), kv->app_bc);
    tr_kv_free(kv);
    p.app_b_c = 4e9; /* 4 bytes/ns given: the measurement of the hot-pool copies is ignored */
    kv = mk(&s, &p);
    if (!kv) return;
    tr_kv_app_note_rows(kv, 1000, 1000, 1000, 1000);
    TU_CHECK(fabs(tr_kv_app_beta(kv) - 2.0) < 1e-9 && fabs(kv->app_bc - 4.0) < 1e-9,
             "APP rates, B_c given: beta %g (want 2), B_c %g bytes/ns", tr_kv_app_beta(kv),
             kv->app_bc);
    printf("APP with given rates: beta %.3f from f_c / f_s, the row rates measured or given and "
           "reported\n", tr_kv_app_beta(kv));
    tr_kv_free(kv);
}

/* APP's measured rates recover from a stale one: a start-up probe (or a step) that found the agent
 * 1000x slower than it is gives it ~0 tokens, too few to measure it again; every
 * TR_KV_APP_EXPLORE layers it gets TR_KV_APP_MIN_PART tokens, measured at half weight. Without
 * that, beta would stay at 1000. And one outlying sample moves an average by at most a tenth. */
static void test_app_explore(void) {
    double a = 100.0;
    tr_kv_app_avg(&a, 1e6);
    const double a1 = a;
    tr_kv_app_avg(&a, 0.0);
    TU_CHECK(fabs(a1 - 110.0) < 1e-9 && fabs(a - 104.5) < 1e-9,
             "APP average: 100 then a sample of 1e6 gives %g (want 110), then 0 gives %g (104.5)",
             a1, a);
    const shp s = {"GQA", 1, 2700, 4, 1, 32, 32};
    enum { N0 = 2600, ROWS = 48 };
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 93, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    tr_kv_params p = cold_params(&s, true);
    tr_kv *kv = mk(&s, &p);
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on);
    tr_error err = {0};
    int explored = 0, failed = 0;
    double beta0 = 0;
    if (!kv || !fill(kv, &d, 0, N0)) goto out;
    for (int32_t pos = N0; pos < N0 + ROWS && !failed; pos++) {
        query_make(q, &s, pos, 500 + (uint64_t)pos, false);
        if (tr_kv_append(kv, 0, pos, dk(&d, 0, pos), dv(&d, 0, pos), &err) ||
            tr_kv_attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, NULL, 0, o, on, &err)) {
            TU_CHECK(0, "APP explore, row %d: %s", pos, err.msg);
            failed = 1;
            break;
        }
        if (pos == N0) { /* after the probe and the first split: the agent's rate made stale */
            kv->app_ts = kv->app_tc * 1000.0;
            beta0 = tr_kv_app_beta(kv);
        } else {
            /* a split the agent gets TR_KV_APP_MIN_PART of (beta_split = host / agent) */
            explored += kv->app_beta_split < 10.0;
        }
    }
    const double beta1 = tr_kv_app_beta(kv);
    /* the layer's selections count from the first row: the 16th, 32nd and 48th explore */
    TU_CHECK(!failed && explored == ROWS / TR_KV_APP_EXPLORE && beta1 < beta0 / 4,
             "APP explore: %d splits fed the starved agent (want %d), beta %g -> %g", explored,
             ROWS / TR_KV_APP_EXPLORE, beta0, beta1);
    printf("APP explore: a stale agent rate (beta %.0f) measured again %d times in %d rows: beta "
           "%.1f\n", beta0, explored, ROWS - 1, beta1);
out:
    tr_kv_free(kv);
    free(q);
    free(o);
    data_free(&d);
}

/* The agent's baseline (tr_kv.pull_keys): host scoring that reads every cold page's key copy from
 * storage first. Same outputs as tiered, more bytes read (the key copies of every written page),
 * and a corrupted key copy on storage is a named error. */
static void test_pull_keys(void) {
    const shp s = {"GQA", 2, 256, 8, 2, 64, 64};
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 83, false);
    tr_kv_params p = params(TR_KV_TIERED, 0.25f);
    p.cold_dir = g_tmp;
    p.hot_bytes = hot_min(&s, &p);
    tr_kv *kv[2] = {mk(&s, &p), mk(&s, &p)};
    float *q = malloc(sizeof(float) * qn), *o[2] = {malloc(sizeof(float) * on),
                                                     malloc(sizeof(float) * on)};
    tr_error err = {0};
    if (!kv[0] || !kv[1] || !fill(kv[0], &d, 0, 256) || !fill(kv[1], &d, 0, 256)) goto out;
    kv[1]->pull_keys = true;
    int32_t pos = 255;
    query_make(q, &s, pos, 7, false);
    uint64_t bytes[2];
    for (int i = 0; i < 2; i++) {
        tr_kv_stats st;
        tr_kv_get_stats(kv[i], &st);
        const uint64_t b0 = st.bytes_read;
        TU_CHECK(tr_kv_attend_rows(kv[i], g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o[i], on,
                                   &err) == TR_OK,
                 "pull keys %d: %s", i, err.msg);
        tr_kv_get_stats(kv[i], &st);
        bytes[i] = st.bytes_read - b0;
    }
    const uint64_t keys = (uint64_t)kv[1]->layers[1].pages_written *
                          (uint64_t)(kv[1]->page_toff - kv[1]->page_qoff);
    TU_CHECK(memcmp(o[0], o[1], on * sizeof(float)) == 0, "pull keys: outputs differ");
    TU_CHECK(bytes[1] >= bytes[0] + keys, "pull keys: %llu bytes read vs %llu + key copies %llu",
             (unsigned long long)bytes[1], (unsigned long long)bytes[0],
             (unsigned long long)keys);
    printf("pull keys: same output, %llu bytes read vs %llu (key copies of %d pages: %llu)\n",
           (unsigned long long)bytes[1], (unsigned long long)bytes[0],
           kv[1]->layers[1].pages_written, (unsigned long long)keys);
    char fdpath[64];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", kv[1]->layers[1].fd);
    flip_byte(fdpath, (off_t)(tr_kv_page_offset(kv[1], 2) + kv[1]->page_qoff + 5));
    tr_status st = tr_kv_attend_rows(kv[1], g_pool, 1, 1, &pos, q, qn, 0.125f, NULL, 0, o[1], on,
                                     &err);
    TU_CHECK(st == TR_E_IO && strstr(err.msg, "key copy") && strstr(err.msg, "page 2") &&
                 strstr(err.msg, "layer 1"),
             "pull keys, corrupted key copy: %d %s", st, err.msg);
    printf("pull keys, corrupted key copy: %s\n", err.msg);
out:
    for (int i = 0; i < 2; i++) {
        tr_kv_free(kv[i]);
        free(o[i]);
    }
    free(q);
    data_free(&d);
}

/* ---- tail: the unselected tokens' estimated share ----------------------------------------------
 * Tiered at alpha 0.1 with --kv-tail 8 / 4 against the same selection without it: the output
 * must come closer to exact full attention (RMS over the last rows, every attention shape), with
 * the pools hot or mostly cold; alpha 1 leaves nothing out and must equal the reference; a bad
 * precision, another policy, the storage agent and attention sinks are named errors. */
static double rms_vs_ref(tr_kv *kv, const data *d, const shp *s, int32_t from, int32_t to,
                         double *ref_rms) {
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    float *q = malloc(sizeof(float) * qn), *o = malloc(sizeof(float) * on),
          *want = malloc(sizeof(float) * on);
    double se = 0.0, sr = 0.0;
    size_t cnt = 0;
    tr_error err = {0};
    for (int32_t pos = from; pos < to; pos++) {
        query_make(q, s, pos, 1000 + (uint64_t)pos, false);
        const int32_t l = pos % s->nl;
        if (tr_kv_attend_rows(kv, g_pool, l, 1, &pos, q, qn, 1.0f / sqrtf((float)s->hdk), NULL, 0,
                              o, on, &err)) {
            TU_CHECK(0, "tail %s pos %d: %s", s->name, pos, err.msg);
            break;
        }
        ref_attend(d, l, s, pos, q, 1.0f / sqrtf((float)s->hdk), NULL, 0, NULL, want);
        for (size_t i = 0; i < on; i++) {
            se += ((double)o[i] - want[i]) * ((double)o[i] - want[i]);
            sr += (double)want[i] * want[i];
        }
        cnt += on;
    }
    free(q);
    free(o);
    free(want);
    if (ref_rms) *ref_rms = sqrt(sr / (double)(cnt ? cnt : 1));
    return sqrt(se / (double)(cnt ? cnt : 1));
}

static void test_tail(void) {
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const shp *s = &SHAPES[si];
        data d;
        data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 91 + si, false);
        /* [selection alone, tail 8, tail 4, tail 4 at the default tail_min (1), tail 8 with
         * a threshold no token reaches][hot, cold] */
        double e[5][2], ref = 0.0, kept[2] = {0};
        for (int cold = 0; cold < 2; cold++)
            for (int b = 0; b < 5; b++) {
                tr_kv_params p = params(TR_KV_TIERED, 0.1f);
                p.tail_bits = b == 0 ? 0 : b == 1 || b == 4 ? 8 : 4;
                p.tail_min = b == 3 ? 1.0f : b == 4 ? 1e6f : 0.0f;
                if (cold) {
                    p.cold_dir = g_tmp;
                    p.hot_bytes = hot_min(s, &p);
                }
                tr_kv *kv = mk(s, &p);
                e[b][cold] = kv && fill(kv, &d, 0, s->nctx)
                                 ? rms_vs_ref(kv, &d, s, s->nctx - 40, s->nctx, &ref)
                                 : 1e9;
                tr_kv_stats st;
                if (kv && b == 3) {
                    tr_kv_get_stats(kv, &st);
                    kept[cold] = st.tail_cand ? (double)st.tail_kept / (double)st.tail_cand : -1.0;
                }
                tr_kv_free(kv);
            }
        for (int cold = 0; cold < 2; cold++) {
            TU_CHECK(e[1][cold] < 0.5 * e[0][cold] && e[2][cold] < 0.7 * e[0][cold],
                     "tail %s %s: RMS error vs full %.3g (tail 8) / %.3g (tail 4), selection "
                     "alone %.3g",
                     s->name, cold ? "cold" : "hot", e[1][cold], e[2][cold], e[0][cold]);
            /* the default threshold sums a part of the unselected tokens and keeps most of the
             * gain; a threshold nobody reaches is the selection alone, bit for bit */
            TU_CHECK(kept[cold] > 0.0 && kept[cold] < 1.0 && e[3][cold] < 0.8 * e[0][cold],
                     "tail %s %s at tail_min 1: %.1f %% summed, RMS %.3g (all summed %.3g, none "
                     "%.3g)",
                     s->name, cold ? "cold" : "hot", 100.0 * kept[cold], e[3][cold], e[2][cold],
                     e[0][cold]);
            TU_CHECK(e[4][cold] == e[0][cold], "tail %s %s, threshold 1e6: RMS %.6g, not %.6g",
                     s->name, cold ? "cold" : "hot", e[4][cold], e[0][cold]);
            printf("tail %s %s, alpha 0.1: RMS error vs full %.4f selection alone, %.4f tail 8, "
                   "%.4f tail 4; %.4f tail 4 at tail_min 1 (%.1f %% of the unselected summed) "
                   "(output RMS %.3f)\n",
                   s->name, cold ? "cold" : "hot", e[0][cold], e[1][cold], e[2][cold], e[3][cold],
                   100.0 * kept[cold], ref);
        }
        /* alpha 1: nothing left out */
        tr_kv_params p = params(TR_KV_TIERED, 1.0f);
        p.tail_bits = 8;
        tr_kv *kv = mk(s, &p);
        const double e1 = kv && fill(kv, &d, 0, s->nctx)
                              ? rms_vs_ref(kv, &d, s, s->nctx - 10, s->nctx, NULL)
                              : 1e9;
        TU_CHECK(e1 < TOL, "tail %s alpha 1: RMS %.3g vs full", s->name, e1);
        tr_kv_free(kv);
        data_free(&d);
    }
    const shp *s = &SHAPES[1];
    const tr_kv_shape sh = to_shape(s);
    tr_error err = {0};
    tr_kv *kv = NULL;
    tr_kv_params p = params(TR_KV_TIERED, 0.1f);
    p.tail_bits = 3;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail 3"),
             "tail 3: %s", err.msg);
    p.tail_bits = 4;
    p.tail_min = -0.5f;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail-min"),
             "tail_min -0.5: %s", err.msg);
    p.tail_min = NAN;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail-min"),
             "tail_min NaN: %s", err.msg);
    p = params(TR_KV_QUEST, 0.1f);
    p.tail_bits = 8;
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "tiered"),
             "tail with quest: %s", err.msg);
    p = params(TR_KV_TIERED, 0.1f);
    p.tail_bits = 8;
    p.csd = true;
    p.cold_dir = g_tmp;
    p.hot_bytes = hot_min(s, &p);
    TU_CHECK(tr_kv_create(&sh, &p, &kv, &err) == TR_E_ARG && strstr(err.msg, "--csd"),
             "tail with the agent: %s", err.msg);
    p = params(TR_KV_TIERED, 0.1f);
    p.tail_bits = 8;
    kv = mk(s, &p);
    data d;
    data_make(&d, s->nl, s->nctx, s->nkv, s->hdk, s->hdv, 5, false);
    if (kv && fill(kv, &d, 0, s->nctx)) {
        const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
        float *q = calloc(qn, sizeof(float)), *o = calloc(on, sizeof(float)),
              *sinks = calloc((size_t)s->nh, sizeof(float));
        int32_t pos = s->nctx - 1;
        const tr_status st =
            tr_kv_attend_rows(kv, g_pool, 0, 1, &pos, q, qn, 0.125f, sinks, 0, o, on, &err);
        TU_CHECK(st == TR_E_ARG && strstr(err.msg, "sinks"), "tail with sinks: %d %s", st, err.msg);
        free(q);
        free(o);
        free(sinks);
    }
    tr_kv_free(kv);
    data_free(&d);
}

/* ---- the storage agent ---------------------------------------------------------------------------
 * The same decode run through host scoring and through terrace-storaged (tiered, most tokens
 * cold; with the default working set and with one that forces chunks): every selection and every
 * output bit-identical, the agent's rows and scores counted. Then the failures: a corrupted
 * record and a corrupted key copy on storage (the agent reports them; the step fails naming
 * them), and the agent killed mid-run (the next step fails within a second). */
static void test_csd(void) {
    const shp s = {"GQA", 2, 480, 8, 2, 64, 64};
    /* 0/1 host/agent, pipelined reads, BKP off; 2/3 host/agent, chunked, BKP on; 4 as 1 with
     * the agent joining every run of a page (and across key copies) into one read */
    enum { N0 = 200, NK = 5 };
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 91, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    const uint64_t rec = (uint64_t)s.nkv * (uint64_t)(s.hdk + s.hdv) * 2;
    tr_kv *kv[NK] = {0};
    tr_kv_params p[NK];
    for (int i = 0; i < NK; i++) {
        p[i] = cold_params(&s, i % 2 == 1 || i == 4);
        const bool first = i < 2 || i == 4;
        p[i].bkp = first ? TR_KV_BKP_OFF : TR_KV_BKP_ON;
        /* the same split of the tokens on storage between host and agent on both sides (APP
         * chooses it from measured rates, which differ between runs) */
        p[i].beta = first ? 0.5f : 0.0f;
        if (!first) p[i].ws_bytes = 48 * rec; /* chunked attention: double-buffered rows */
        kv[i] = mk(&s, &p[i]);
        if (kv[i]) kv[i]->read_gap = 0; /* as the agent reads: the same gathered lists */
        if (kv[i]) kv[i]->csd_gap = i == 4 ? TR_KV_PAGE : i == 1 ? 0 : kv[i]->csd_gap;
        /* runs 0/1 read every selection as TR_KV_PIPE chunks attended as they arrive (the
         * agent: one row request, attended in the same chunks) */
        if (kv[i] && first) kv[i]->pipe_min = 1;
        if (!kv[i] || !fill(kv[i], &d, 0, N0)) goto out;
    }
    {
        float *q = malloc(sizeof(float) * qn), *o[NK];
        for (int i = 0; i < NK; i++) o[i] = malloc(sizeof(float) * on);
        int32_t *sel0 = malloc(sizeof(int32_t) * (size_t)s.nctx);
        int32_t *sel2 = malloc(sizeof(int32_t) * (size_t)s.nctx);
        const float scale = 1.0f / sqrtf((float)s.hdk);
        tr_error err = {0};
        int differ = 0, seldiff = 0, failed = 0;
        for (int32_t pos = N0; pos < s.nctx && !failed; pos++)
            for (int32_t l = 0; l < s.nl && !failed; l++) {
                query_make(q, &s, pos, 900 + (uint64_t)((pos * 3) % 7) + 10 * (uint64_t)l, false);
                for (int i = 0; i < NK; i++) {
                    if (tr_kv_append(kv[i], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err) ||
                        tr_kv_attend_rows(kv[i], g_pool, l, 1, &pos, q, qn, scale, NULL, 0, o[i],
                                          on, &err)) {
                        TU_CHECK(0, "csd run %d, step %d: %s", i, pos, err.msg);
                        failed = 1;
                        break;
                    }
                    int32_t *ref = i < 2 || i == 4 ? sel0 : sel2;
                    const size_t nb = sizeof(int32_t) * (size_t)(pos + 1);
                    if (i == 0 || i == 2) memcpy(ref, kv[i]->sel, nb);
                    else
                        seldiff += memcmp(ref, kv[i]->sel, nb) != 0;
                }
                if (failed) break;
                differ += memcmp(o[0], o[1], on * sizeof(float)) != 0;
                differ += memcmp(o[2], o[3], on * sizeof(float)) != 0;
                differ += memcmp(o[0], o[4], on * sizeof(float)) != 0;
            }
        TU_CHECK(!failed && differ == 0 && seldiff == 0,
                 "agent vs host scoring: %d outputs and %d selections differ", differ, seldiff);
        tr_kv_stats st[NK];
        for (int i = 0; i < NK; i++) tr_kv_get_stats(kv[i], &st[i]);
        for (int i = 1; i < NK; i += 2) {
            TU_CHECK(st[i].csd_row_bytes == st[i].bytes_read && st[i].bytes_read > 0 &&
                         st[i].csd_score_bytes > 0 && st[i].csd_storage_bytes > st[i].bytes_read,
                     "agent counters: rows %llu (host read %llu), scores %llu, storage %llu",
                     (unsigned long long)st[i].csd_row_bytes, (unsigned long long)st[i].bytes_read,
                     (unsigned long long)st[i].csd_score_bytes,
                     (unsigned long long)st[i].csd_storage_bytes);
            TU_CHECK(st[i].bytes_read == st[i - 1].bytes_read, "rows: agent %llu, host %llu",
                     (unsigned long long)st[i].bytes_read, (unsigned long long)st[i - 1].bytes_read);
        }
        /* joined reads: fewer of them, more bytes from storage, the same bytes to the host */
        TU_CHECK(st[4].csd_row_bytes == st[1].csd_row_bytes &&
                     st[4].read_ops * 2 < st[1].read_ops &&
                     st[4].csd_storage_bytes > st[1].csd_storage_bytes,
                 "agent's joined reads: %llu reads of %llu bytes for %llu row bytes, against "
                 "%llu reads of %llu bytes for %llu",
                 (unsigned long long)st[4].read_ops, (unsigned long long)st[4].csd_storage_bytes,
                 (unsigned long long)st[4].csd_row_bytes, (unsigned long long)st[1].read_ops,
                 (unsigned long long)st[1].csd_storage_bytes,
                 (unsigned long long)st[1].csd_row_bytes);
        printf("storage agent joining runs up to a page apart: %llu reads (%llu run by run), "
               "%.1f KiB from storage (%.1f), the same %.1f KiB of rows to the host\n",
               (unsigned long long)st[4].read_ops, (unsigned long long)st[1].read_ops,
               (double)st[4].csd_storage_bytes / 1024, (double)st[1].csd_storage_bytes / 1024,
               (double)st[4].csd_row_bytes / 1024);
        printf("storage agent: %d steps, selections and outputs identical to host scoring "
               "(pipelined reads at beta 0.5, chunked + BKP at beta 0); agent -> host: scores "
               "%.1f KiB, rows %.1f KiB; agent read %.1f KiB from storage, its memory %.1f KiB\n",
               (s.nctx - N0) * s.nl, (double)st[1].csd_score_bytes / 1024,
               (double)st[1].csd_row_bytes / 1024, (double)st[1].csd_storage_bytes / 1024,
               (double)st[1].csd_mem_bytes / 1024);
        /* truncate into the middle of the stored pages and continue with other tokens: the
         * agent must drop its copies of the rewritten pages' keys */
        {
            data d2;
            data_make(&d2, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 4242, false);
            const int32_t cut = N0 - 37;
            int tdiff = 0, tfail = 0;
            for (int i = 0; i < 2; i++) tfail |= tr_kv_truncate(kv[i], cut, &err) != TR_OK;
            for (int32_t pos = cut; pos < cut + 120 && !tfail; pos++)
                for (int32_t l = 0; l < s.nl && !tfail; l++) {
                    query_make(q, &s, pos, 333 + (uint64_t)pos, false);
                    for (int i = 0; i < 2 && !tfail; i++)
                        tfail |= tr_kv_append(kv[i], l, pos, dk(&d2, l, pos), dv(&d2, l, pos),
                                              &err) ||
                                 tr_kv_attend_rows(kv[i], g_pool, l, 1, &pos, q, qn, scale, NULL,
                                                   0, o[i], on, &err);
                    tdiff += !tfail && memcmp(o[0], o[1], on * sizeof(float)) != 0;
                }
            TU_CHECK(!tfail && tdiff == 0,
                     "agent after a truncate: %d outputs differ from host scoring (%s)", tdiff,
                     tfail ? err.msg : "");
            data_free(&d2);
        }
        /* APP: a run with beta chosen from the measured rates */
        {
            tr_kv_params pa = p[1];
            pa.beta = -1.0f;
            tr_kv *k = mk(&s, &pa);
            int bad = !k || !fill(k, &d, 0, N0);
            for (int32_t pos = N0; pos < N0 + 24 && !bad; pos++)
                for (int32_t l = 0; l < s.nl && !bad; l++) {
                    query_make(q, &s, pos, 900 + (uint64_t)pos, false);
                    bad = tr_kv_append(k, l, pos, dk(&d, l, pos), dv(&d, l, pos), &err) ||
                          tr_kv_attend_rows(k, g_pool, l, 1, &pos, q, qn, scale, NULL, 0, o[0], on,
                                            &err);
                }
            tr_kv_stats sa;
            if (k) tr_kv_get_stats(k, &sa);
            TU_CHECK(!bad && sa.f_c > 0 && sa.f_s > 0 && sa.b_s > 0 && sa.beta > 0 &&
                         isfinite(sa.beta),
                     "APP: %s beta %.3g from f_c %.3g f_s %.3g B_s %.3g", bad ? err.msg : "",
                     k ? sa.beta : 0.0, k ? sa.f_c : 0.0, k ? sa.f_s : 0.0, k ? sa.b_s : 0.0);
            /* the split in effect: APP's beta, to a token of the ~200 on storage (the host keeps
             * every key here; a smaller budget is test_host_keys'), as the host's share */
            TU_CHECK(k && sa.beta_split > 0 &&
                         fabs(sa.beta_split / (1 + sa.beta_split) - sa.beta / (1 + sa.beta)) <= 0.005,
                     "APP: split %.4g for beta %.4g", k ? sa.beta_split : 0.0, k ? sa.beta : 0.0);
            /* the first split already comes from rates measured at start (not an even guess) */
            TU_CHECK(k && k->app_probed && k->app_beta_first > 0 && k->app_beta_first != 1.0 &&
                         isfinite(k->app_beta_first),
                     "APP at start: probed %d, first beta %.4g", k ? (int)k->app_probed : 0,
                     k ? k->app_beta_first : 0.0);
            if (k) printf("APP at start: the first layer's beta %.2f\n", k->app_beta_first);
            if (k && !bad)
                printf("APP: beta %.2f (split %.3f) from host scoring "
                       "%.2f M tokens/s, agent %.2f M tokens/s, hot-pool copies %.2f GB/s, agent "
                       "rows %.2f GB/s, selected fractions host %.3f / agent %.3f\n",
                       sa.beta, sa.beta_split, sa.f_c / 1e6, sa.f_s / 1e6, sa.b_c / 1e9, sa.b_s / 1e9, sa.alpha_c,
                       sa.alpha_s);
            tr_kv_free(k);
        }

        /* failures, on a fresh short run of cache 1's configuration */
        for (int f = 0; f < 3; f++) {
            tr_kv_params pf = p[1];
            tr_kv *k = mk(&s, &pf);
            /* selections read in parts (one row request, attended part by part): a bad record
             * fails the part it is in, and the step, with the agent's message */
            if (k) k->pipe_min = 1;
            if (!k || !fill(k, &d, 0, N0)) {
                tr_kv_free(k);
                break;
            }
            /* flip a byte in every record of pages 1-10 (f 0: a selection reads some of them) or
             * in page 2's key copy (f 1: every scoring reads it) */
            for (int32_t pg = f ? 2 : 1; f < 2 && pg <= (f ? 2 : 10); pg++)
                for (int32_t t = 0; t < (f ? 1 : TR_KV_PAGE); t++) {
                    int fd = dup(k->layers[1].fd);
                    int fl = fcntl(fd, F_GETFL);
                    const uint64_t off = tr_kv_page_offset(k, pg) +
                                         (f ? k->page_qoff + 5 : (uint64_t)t * k->rec + 7);
                    uint8_t blk[4096] __attribute__((aligned(4096)));
                    const uint64_t a0 = off / 4096 * 4096;
                    if (fl & O_DIRECT) fcntl(fd, F_SETFL, fl & ~O_DIRECT);
                    if (pread(fd, blk, 4096, (off_t)a0) > 0) {
                        blk[off - a0] ^= 0x40;
                        if (pwrite(fd, blk, 4096, (off_t)a0) < 0) perror("pwrite");
                    }
                    close(fd);
                }
            const pid_t pid = tr_kv_csd_pid(k);
            if (f == 2) kill(pid, SIGKILL);
            const uint64_t t0 = tr_now_ns();
            tr_status fst = TR_OK;
            for (int32_t pos = N0; pos < N0 + 40 && !fst; pos++)
                for (int32_t l = 0; l < s.nl && !fst; l++) {
                    query_make(q, &s, pos, 77 + (uint64_t)pos, false);
                    fst = tr_kv_append(k, l, pos, dk(&d, l, pos), dv(&d, l, pos), &err);
                    if (!fst)
                        fst = tr_kv_attend_rows(k, g_pool, l, 1, &pos, q, qn, scale, NULL, 0,
                                                o[0], on, &err);
                }
            const double ms = (double)(tr_now_ns() - t0) / 1e6;
            const char *want = f == 0 ? "checksum mismatch in layer 1"
                               : f == 1 ? "checksum mismatch in the key copy of layer 1"
                                        : "killed by signal 9";
            TU_CHECK(fst != TR_OK && strstr(err.msg, want), "agent fault %d: status %d, '%s'", f,
                     (int)fst, err.msg);
            if (f == 2) TU_CHECK(ms < 1000.0, "agent death noticed after %.0f ms", ms);
            printf("storage agent fault %d: %s (%.0f ms)\n", f, err.msg, ms);
            tr_kv_free(k);
        }
        free(q);
        for (int i = 0; i < NK; i++) free(o[i]);
        free(sel0);
        free(sel2);
    }
out:
    for (int i = 0; i < NK; i++) tr_kv_free(kv[i]);
    data_free(&d);
}

/* --kv-host-keys: the host keeps its key copy for the sinks and a ring of the newest positions.
 * With a split inside the ring, selections and outputs are those of the full copy, bit for bit,
 * also after a truncate that goes back further than the ring (its rows are quantized again from
 * the records); a bigger split is cut to what the ring holds; a call with more rows than planned
 * fails with a message; the DRAM plan shrinks by the rows not kept. */
static void test_host_keys(void) {
    const shp s = {"GQA", 2, 480, 8, 2, 64, 64};
    enum { N0 = 200, NK = 3, H = 100, HS = 20 };
    data d, d2;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 93, false);
    data_make(&d2, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 4343, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    const tr_kv_shape sh = to_shape(&s);
    tr_kv *kv[NK] = {0};
    tr_kv_params p[NK];
    for (int i = 0; i < NK; i++) {
        p[i] = cold_params(&s, true);
        p[i].max_rows = 1;
        /* 0: the full copy; 1: a ring that holds the split (at most 20% of ~470 tokens); 2: a
         * ring too small for an even split */
        p[i].host_keys = i == 0 ? 0 : i == 1 ? H : HS;
        p[i].beta = i < 2 ? 0.25f : 1.0f;
        kv[i] = mk(&s, &p[i]);
        if (!kv[i] || !fill(kv[i], &d, 0, N0)) goto out;
    }
    TU_CHECK(!kv[0]->hk_wrap && kv[1]->hk_wrap && kv[2]->hk_wrap &&
                 kv[1]->hk_rows == p[1].n_sink + H + p[1].n_window + 2 * TR_KV_PAGE + 1,
             "host key copy: rows %d / %d / %d", kv[0]->hk_rows, kv[1]->hk_rows, kv[2]->hk_rows);
    {
        const uint64_t full = tr_kv_dram_bytes(&sh, &p[0]), ring = tr_kv_dram_bytes(&sh, &p[1]);
        const uint64_t saved = (uint64_t)s.nl * (uint64_t)s.nkv *
                               (uint64_t)(s.nctx - kv[1]->hk_rows) * kv[1]->qrow;
        TU_CHECK(full - ring == saved, "DRAM plan: full copy %llu, ring %llu, saved %llu",
                 (unsigned long long)full, (unsigned long long)ring, (unsigned long long)saved);
    }
    float *q = malloc(sizeof(float) * qn), *o[NK];
    for (int i = 0; i < NK; i++) o[i] = malloc(sizeof(float) * on);
    const float scale = 1.0f / sqrtf((float)s.hdk);
    tr_error err = {0};
    int differ = 0, failed = 0;
    double split2 = 0.0;
    int over = 0;
    /* a step: append and attend on each cache; 0 and 1 compared */
#define HK_STEP(D, POS, SEED)                                                                       \
    for (int32_t l = 0; l < s.nl && !failed; l++) {                                                \
        query_make(q, &s, POS, SEED, false);                                                       \
        for (int i = 0; i < NK && !failed; i++)                                                    \
            if (tr_kv_append(kv[i], l, POS, dk(D, l, POS), dv(D, l, POS), &err) ||                 \
                tr_kv_attend_rows(kv[i], g_pool, l, 1, &(POS), q, qn, scale, NULL, 0, o[i], on,    \
                                  &err)) {                                                         \
                TU_CHECK(0, "host keys, cache %d, position %d: %s", i, POS, err.msg);              \
                failed = 1;                                                                        \
            }                                                                                      \
        differ += !failed && memcmp(o[0], o[1], on * sizeof(float)) != 0;                          \
    }
    for (int32_t pos = N0; pos < s.nctx - 40 && !failed; pos++) {
        HK_STEP(&d, pos, 500 + (uint64_t)pos);
        /* cache 2: beta 1 asks for half the tokens on storage; the ring gives the host only
         * those it holds, at most hk_ring of the n_a candidates on storage (n_a: those below
         * the window, on written pages, past the sinks) */
        tr_kv_stats st;
        tr_kv_get_stats(kv[2], &st);
        const int32_t wr = kv[2]->layers[s.nl - 1].pages_written * TR_KV_PAGE,
                      win = pos - p[2].n_window + 1;
        const int32_t n_a = (wr < win ? wr : win) - p[2].n_sink, R = kv[2]->hk_ring;
        over += !(st.beta_split <= (double)R / (double)(n_a - R) + 1e-9 && st.beta_split < 0.99);
        if (st.beta_split > split2) split2 = st.beta_split;
    }
    TU_CHECK(!failed && differ == 0, "host key ring vs full copy: %d outputs differ", differ);
    {
        TU_CHECK(split2 > 0 && over == 0, "small ring: split up to %.3f, %d steps over the ring",
                 split2, over);
        printf("host key ring: %d rows of %d positions; identical to the full copy over %d steps; "
               "a %d-row ring cut beta 1 to a split of %.3f\n",
               kv[1]->hk_rows, s.nctx, (s.nctx - 40 - N0) * s.nl, kv[2]->hk_rows, split2);
    }
    /* truncate further back than the ring holds and go on with other tokens */
    if (!failed) {
        const int32_t cut = 150, len = kv[1]->layers[0].len;
        TU_CHECK(len - kv[1]->hk_ring > cut, "truncate test: %d positions, ring %d", len,
                 kv[1]->hk_ring);
        for (int i = 0; i < NK && !failed; i++)
            if (tr_kv_truncate(kv[i], cut, &err)) {
                TU_CHECK(0, "truncate %d: %s", i, err.msg);
                failed = 1;
            }
        differ = 0;
        for (int32_t pos = cut; pos < cut + 200 && !failed; pos++) HK_STEP(&d2, pos, 77 + (uint64_t)pos);
        TU_CHECK(!failed && differ == 0, "host key ring after a truncate: %d outputs differ",
                 differ);
    }
#undef HK_STEP
    /* more rows in one call than planned: a named error, not keys from the wrong positions */
    if (!failed) {
        enum { NR = 60 };
        const int32_t base = kv[2]->layers[0].len;
        int32_t pos[NR];
        float *qs = malloc(sizeof(float) * qn * NR), *os = malloc(sizeof(float) * on * NR);
        tr_status st = TR_OK;
        for (int32_t r = 0; r < NR; r++) {
            pos[r] = base + r;
            query_make(qs + (size_t)r * qn, &s, pos[r], 9 + (uint64_t)r, false);
            if (!st) st = tr_kv_append(kv[2], 0, pos[r], dk(&d, 0, pos[r]), dv(&d, 0, pos[r]), &err);
        }
        if (!st)
            st = tr_kv_attend_rows(kv[2], g_pool, 0, NR, pos, qs, qn, scale, NULL, 0, os, on, &err);
        TU_CHECK(st == TR_E_ARG && strstr(err.msg, "more rows in one call than planned"),
                 "rows beyond the ring: status %d, '%s'", (int)st, err.msg);
        free(qs);
        free(os);
    }
    {
        tr_kv_params pe = params(TR_KV_TIERED, 0.15f);
        pe.hot_bytes = p[0].hot_bytes;
        pe.cold_dir = g_tmp;
        pe.host_keys = 64;
        tr_kv *k = NULL;
        const tr_status st = tr_kv_create(&sh, &pe, &k, &err);
        TU_CHECK(st == TR_E_ARG && strstr(err.msg, "needs the storage agent"),
                 "--kv-host-keys without the agent: status %d, '%s'", (int)st, err.msg);
        tr_kv_free(k);
    }
    free(q);
    for (int i = 0; i < NK; i++) free(o[i]);
out:
    for (int i = 0; i < NK; i++) tr_kv_free(kv[i]);
    data_free(&d);
    data_free(&d2);
}

/* a user-started agent (terrace-storaged --listen): $TERRACE_STORAGED as the runtime would take
 * it (under emulation, a wrapper that starts the emulator), else the one next to the test
 * binary's build directory; 0 if it did not come up */
static pid_t start_listener(const char *sock) {
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

/* --kv-spec: a selection made ahead (during the previous layer's attention, its reads started
 * then) equals the same speculative selection made at the layer itself; the agent's equals the
 * host's; the speculation is used (outputs differ from selecting with the real query); the row's
 * own record, stored after the reads were started, is attended; misuse is a named error */
static void test_spec(void) {
    const shp s = {"GQA", 3, 400, 8, 2, 64, 64};
    enum { N0 = 200, NR = 4 };
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 77, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    /* 0: ahead, host; 1: at the layer, host; 2: ahead, agent; 3: no speculation */
    tr_kv *kv[NR] = {0};
    for (int i = 0; i < NR; i++) {
        tr_kv_params p = cold_params(&s, i == 2);
        p.n_window = TR_KV_PAGE; /* as in use: at least a page (see tr_kv_select_row) */
        p.bkp = TR_KV_BKP_ON;
        p.beta = 0.5f; /* the same host/agent split everywhere */
        p.spec = i != 3;
        kv[i] = mk(&s, &p);
        if (!kv[i]) goto out;
        kv[i]->read_gap = 0;
        kv[i]->pipe_min = 1; /* pipelined reads at every size: the ones started ahead */
        if (!fill(kv[i], &d, 0, N0)) goto out;
    }
    {
        float *q = malloc(sizeof(float) * qn * s.nl), *qs = malloc(sizeof(float) * qn * s.nl);
        float *o[NR];
        for (int i = 0; i < NR; i++) o[i] = malloc(sizeof(float) * on);
        const float scale = 1.0f / sqrtf((float)s.hdk);
        tr_error err = {0};
        int same01 = 0, same02 = 0, same03 = 0, n = 0, failed = 0;
        for (int32_t pos = N0; pos < s.nctx && !failed; pos++) {
            for (int32_t l = 0; l < s.nl; l++) {
                query_make(q + l * qn, &s, pos, 500 + (uint64_t)l, false);
                query_make(qs + l * qn, &s, pos, 7000 + (uint64_t)l * 31 + (uint64_t)pos, false);
            }
            for (int32_t l = 0; l < s.nl && !failed; l++) {
                for (int i = 0; i < NR && !failed; i++) {
                    tr_status st = TR_OK;
                    if ((i == 0 || i == 2) && l + 1 < s.nl) /* ahead: during layer l */
                        st = tr_kv_spec_query(kv[i], l + 1, 1, &pos, qs + (l + 1) * qn, qn, scale,
                                              0, &err);
                    if (!st) st = tr_kv_append(kv[i], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err);
                    if (!st && i == 1 && l > 0) /* at the layer itself */
                        st = tr_kv_spec_query(kv[i], l, 1, &pos, qs + l * qn, qn, scale, 0, &err);
                    if (!st)
                        st = tr_kv_attend_rows(kv[i], g_pool, l, 1, &pos, q + l * qn, qn, scale,
                                               NULL, 0, o[i], on, &err);
                    if (st) {
                        TU_CHECK(0, "spec run %d, step %d, layer %d: %s", i, pos, l, err.msg);
                        failed = 1;
                    }
                }
                if (failed) break;
                if (l == 0) continue; /* layer 0 has no speculation */
                n++;
                same01 += !memcmp(o[0], o[1], on * sizeof(float));
                same02 += !memcmp(o[0], o[2], on * sizeof(float));
                same03 += !memcmp(o[0], o[3], on * sizeof(float));
            }
        }
        tr_kv_stats st[NR];
        for (int i = 0; i < NR; i++) tr_kv_get_stats(kv[i], &st[i]);
        TU_CHECK(!failed && same01 == n && same02 == n,
                 "speculative selection: ahead vs at the layer %d of %d outputs identical, agent "
                 "vs host %d", same01, n, same02);
        TU_CHECK(same03 < n / 2, "the speculative query is not used: %d of %d outputs equal to "
                 "the real query's selection", same03, n);
        TU_CHECK(st[0].spec_rows == (uint64_t)n && st[0].spec_early == (uint64_t)n &&
                     st[2].spec_early == (uint64_t)n && st[1].spec_rows == (uint64_t)n &&
                     st[1].spec_early == 0 && st[3].spec_rows == 0,
                 "spec counters: ahead %llu/%llu, agent %llu, at the layer %llu/%llu of %d",
                 (unsigned long long)st[0].spec_early, (unsigned long long)st[0].spec_rows,
                 (unsigned long long)st[2].spec_early, (unsigned long long)st[1].spec_early,
                 (unsigned long long)st[1].spec_rows, n);
        TU_CHECK(st[2].bytes_read == st[0].bytes_read && st[0].bytes_read > 0,
                 "rows read: agent %llu, host %llu", (unsigned long long)st[2].bytes_read,
                 (unsigned long long)st[0].bytes_read);
        printf("spec: %d layer steps selected ahead, identical to the same selection made at the "
               "layer and to the agent's; %d of them equal to the real query's; mean cosine %.3f\n",
               n, same03, st[0].spec_rows ? st[0].spec_cos_sum / (double)st[0].spec_rows : 0.0);
        /* a selection made ahead for a step that does not come (truncated): dropped, its reads
         * waited for; the next steps are exact again */
        int32_t pos = s.nctx - 8;
        tr_status ts = tr_kv_truncate(kv[2], pos, &err);
        for (int32_t l = 0; l < 1 && !ts; l++) {
            ts = tr_kv_spec_query(kv[2], 1, 1, &pos, qs + qn, qn, scale, 0, &err);
            if (!ts) ts = tr_kv_append(kv[2], 0, pos, dk(&d, 0, pos), dv(&d, 0, pos), &err);
            if (!ts)
                ts = tr_kv_attend_rows(kv[2], g_pool, 0, 1, &pos, q, qn, scale, NULL, 0, o[2],
                                       on, &err);
        }
        if (!ts) ts = tr_kv_truncate(kv[2], pos, &err); /* layer 1's selection was made ahead */
        for (int32_t l = 0; l < s.nl && !ts; l++) {
            ts = tr_kv_append(kv[2], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err);
            if (!ts)
                ts = tr_kv_attend_rows(kv[2], g_pool, l, 1, &pos, q, qn, scale, NULL, 0, o[2],
                                       on, &err);
        }
        TU_CHECK(!ts, "spec: truncate with a selection made ahead: %s", err.msg);
        /* rows computed together (a prefill), as the forward pass gives them: layer l + 1's
         * queries before layer l attends; each layer's rows select with its own */
        const uint64_t rows0 = kv[0]->spec_rows;
        pos = s.nctx - 8;
        ts = tr_kv_truncate(kv[0], pos, &err);
        const int32_t prow[2] = {pos, pos + 1};
        for (int32_t l = 0; l < s.nl && !ts; l++) {
            if (l + 1 < s.nl)
                ts = tr_kv_spec_query(kv[0], l + 1, 2, prow, qs + (l + 1) * qn, 0, scale, 0, &err);
            for (int r = 0; r < 2 && !ts; r++)
                ts = tr_kv_append(kv[0], l, prow[r], dk(&d, l, prow[r]), dv(&d, l, prow[r]), &err);
            float o2[2 * 8 * 64];
            if (!ts)
                ts = tr_kv_attend_rows(kv[0], g_pool, l, 2, prow, q + l * qn, 0, scale, NULL, 0,
                                       o2, on, &err);
        }
        /* the agent killed while the rows of layer 1, requested ahead during layer 0, are
         * awaited: the step fails within a second naming it, and nothing hangs (the free below
         * waits for the request made ahead) */
        {
            pos = s.nctx - 7; /* the next position: the runs above stored up to s.nctx - 8 */
            tr_status fs = tr_kv_truncate(kv[2], pos, &err);
            if (!fs) fs = tr_kv_spec_query(kv[2], 1, 1, &pos, qs + qn, qn, scale, 0, &err);
            if (!fs) fs = tr_kv_append(kv[2], 0, pos, dk(&d, 0, pos), dv(&d, 0, pos), &err);
            if (!fs)
                fs = tr_kv_attend_rows(kv[2], g_pool, 0, 1, &pos, q, qn, scale, NULL, 0, o[2], on,
                                       &err);
            const bool ahead = kv[2]->pre.layer == 1 && kv[2]->pre.started;
            kill(tr_kv_csd_pid(kv[2]), SIGKILL);
            const uint64_t t0 = tr_now_ns();
            for (int32_t l = 1; l < s.nl && !fs; l++) {
                fs = tr_kv_append(kv[2], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err);
                if (!fs)
                    fs = tr_kv_attend_rows(kv[2], g_pool, l, 1, &pos, q + l * qn, qn, scale, NULL,
                                           0, o[2], on, &err);
            }
            const double ms = (double)(tr_now_ns() - t0) / 1e6;
            TU_CHECK(ahead && fs != TR_OK && strstr(err.msg, "killed by signal 9") && ms < 1000.0,
                     "spec: agent killed with rows requested ahead (%s): status %d after %.0f ms, "
                     "'%s'", ahead ? "they were" : "they were NOT", (int)fs, ms, err.msg);
            printf("spec: agent killed with the next layer's rows requested ahead: %s (%.0f ms)\n",
                   err.msg, ms);
        }
        TU_CHECK(!ts && kv[0]->spec_rows - rows0 == (uint64_t)(2 * (s.nl - 1)),
                 "spec, 2 rows at once: %llu rows selected with their speculative query, want %d "
                 "(%s)", (unsigned long long)(kv[0]->spec_rows - rows0), 2 * (s.nl - 1),
                 ts ? err.msg : "ok");
        for (int i = 0; i < NR; i++) free(o[i]);
        free(q);
        free(qs);
    }
    {
        tr_error err = {0};
        int32_t pos = 0;
        float qq[8] = {0};
        TU_CHECK(tr_kv_spec_query(kv[3], 1, 1, &pos, qq, 0, 1.0f, 0, &err) == TR_E_ARG &&
                     strstr(err.msg, "--kv-spec"),
                 "a speculative query without --kv-spec: %s", err.msg);
        tr_kv_params p = params(TR_KV_TIERED, 0.15f);
        p.spec = true;
        p.tail_bits = 4;
        tr_kv *bad = NULL;
        const tr_kv_shape sh = to_shape(&s);
        TU_CHECK(tr_kv_create(&sh, &p, &bad, &err) == TR_E_ARG && strstr(err.msg, "--kv-tail"),
                 "--kv-spec with --kv-tail: %s", err.msg);
        p = params(TR_KV_QUEST, 0.15f);
        p.spec = true;
        TU_CHECK(tr_kv_create(&sh, &p, &bad, &err) == TR_E_ARG && strstr(err.msg, "tiered"),
                 "--kv-spec with quest: %s", err.msg);
    }
out:
    for (int i = 0; i < NR; i++) tr_kv_free(kv[i]);
    data_free(&d);
}

/* one decode step at pos through every layer: append, then attend one query row */
static tr_status decode_step(tr_kv *kv, const data *d, const shp *s, int32_t pos, float *q,
                             float *o, tr_error *err) {
    const size_t qn = (size_t)s->nh * s->hdk, on = (size_t)s->nh * s->hdv;
    tr_status st = TR_OK;
    for (int32_t l = 0; l < s->nl && !st; l++) {
        query_make(q, s, pos, 91 + (uint64_t)l, false);
        st = tr_kv_append(kv, l, pos, dk(d, l, pos), dv(d, l, pos), err);
        if (!st)
            st = tr_kv_attend_rows(kv, g_pool, l, 1, &pos, q, qn, 1.0f / sqrtf((float)s->hdk), NULL,
                                   0, o, on, err);
    }
    return st;
}

/* the agent started by the user for a shared disk: two sessions served at once by one listener,
 * each bit-identical to host scoring; one session's agent process killed fails that session
 * alone, within a second; a connection with garbage is dropped without harm; a missing socket is
 * a named error */
static void test_csd_listen(void) {
    const shp s = {"GQA", 2, 320, 8, 2, 64, 64};
    enum { N0 = 160, NK = 3 };
    char sock[PATH_MAX];
    snprintf(sock, sizeof sock, "%s/agent.sock", g_tmp);
    const pid_t lpid = start_listener(sock);
    TU_CHECK(lpid > 0, "terrace-storaged --listen %s did not come up", sock);
    if (lpid <= 0) return;
    { /* garbage on a connection: dropped, the listener goes on */
        const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%.100s", sock);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            write(fd, "not a hello, not at all", 24) < 0)
            perror("write");
        if (fd >= 0) close(fd);
    }
    data d;
    data_make(&d, s.nl, s.nctx, s.nkv, s.hdk, s.hdv, 17, false);
    const size_t qn = (size_t)s.nh * s.hdk, on = (size_t)s.nh * s.hdv;
    const uint64_t rec = (uint64_t)s.nkv * (uint64_t)(s.hdk + s.hdv) * 2;
    tr_kv *kv[NK] = {0};
    for (int i = 0; i < NK; i++) {
        tr_kv_params p = params(TR_KV_TIERED, 0.15f);
        p.hot_bytes = hot_min(&s, &p) + (uint64_t)s.nl * 32 * rec;
        p.cold_dir = g_tmp;
        p.csd = i > 0;
        p.csd_socket = i > 0 ? sock : NULL;
        p.csd_chunk = 64;
        p.beta = 0.5f; /* the same split on every side */
        kv[i] = mk(&s, &p);
        if (kv[i]) kv[i]->read_gap = 0;
        if (!kv[i] || !fill(kv[i], &d, 0, N0)) goto out;
    }
    {
        const pid_t a1 = tr_kv_csd_pid(kv[1]), a2 = tr_kv_csd_pid(kv[2]);
        TU_CHECK(a1 > 0 && a2 > 0 && a1 != a2 && a1 != lpid && a2 != lpid,
                 "listener %d serves the sessions in their own processes: %d, %d", (int)lpid,
                 (int)a1, (int)a2);
        float *q = malloc(sizeof(float) * qn), *o[NK];
        for (int i = 0; i < NK; i++) o[i] = malloc(sizeof(float) * on);
        const float scale = 1.0f / sqrtf((float)s.hdk);
        tr_error err = {0};
        int differ = 0, failed = 0;
        for (int32_t pos = N0; pos < N0 + 60 && !failed; pos++)
            for (int32_t l = 0; l < s.nl && !failed; l++) {
                query_make(q, &s, pos, 500 + (uint64_t)pos + 7 * (uint64_t)l, false);
                for (int i = 0; i < NK && !failed; i++)
                    if (tr_kv_append(kv[i], l, pos, dk(&d, l, pos), dv(&d, l, pos), &err) ||
                        tr_kv_attend_rows(kv[i], g_pool, l, 1, &pos, q, qn, scale, NULL, 0, o[i],
                                          on, &err)) {
                        TU_CHECK(0, "listen run %d, step %d: %s", i, pos, err.msg);
                        failed = 1;
                    }
                differ += !failed && (memcmp(o[0], o[1], on * sizeof(float)) != 0 ||
                                      memcmp(o[0], o[2], on * sizeof(float)) != 0);
            }
        tr_kv_stats st;
        tr_kv_get_stats(kv[1], &st);
        TU_CHECK(!failed && differ == 0 && st.csd_score_bytes > 0 && st.csd_row_bytes > 0,
                 "user-started agent: %d steps differ from host scoring, scores %llu B, rows %llu B",
                 differ, (unsigned long long)st.csd_score_bytes,
                 (unsigned long long)st.csd_row_bytes);
        /* session 2's agent process dies: session 2 fails within a second, session 1 goes on */
        kill(a2, SIGKILL);
        const uint64_t t0 = tr_now_ns();
        const tr_status f2 = decode_step(kv[2], &d, &s, N0 + 60, q, o[2], &err);
        const double ms = (double)(tr_now_ns() - t0) / 1e6;
        TU_CHECK(f2 != TR_OK && strstr(err.msg, "has gone") && ms < 1000.0,
                 "user-started agent killed: status %d after %.0f ms, '%s'", (int)f2, ms, err.msg);
        printf("user-started agent killed: %s (%.0f ms)\n", err.msg, ms);
        const tr_status f1 = decode_step(kv[1], &d, &s, N0 + 60, q, o[1], &err);
        TU_CHECK(f1 == TR_OK, "the other session after one agent process died: %s", err.msg);
        /* a session that ends ends its agent process; the listener stays */
        tr_kv_free(kv[1]);
        kv[1] = NULL;
        bool gone = false;
        for (int i = 0; i < 300 && !gone; i++) {
            gone = kill(a1, 0) != 0 && errno == ESRCH;
            if (!gone) usleep(10000);
        }
        TU_CHECK(gone && kill(lpid, 0) == 0,
                 "session end: its agent process %s, the listener %s", gone ? "ended" : "remains",
                 kill(lpid, 0) == 0 ? "stays" : "is gone");
        free(q);
        for (int i = 0; i < NK; i++) free(o[i]);
        printf("user-started agent (--listen): 2 sessions at once, %d steps bit-identical to host "
               "scoring\n", 60 * s.nl);
    }
    { /* no agent at that socket */
        tr_kv_params p = params(TR_KV_TIERED, 0.15f);
        p.hot_bytes = hot_min(&s, &p);
        p.cold_dir = g_tmp;
        p.csd = true;
        char nope[PATH_MAX + 16];
        snprintf(nope, sizeof nope, "%s/nobody.sock", g_tmp);
        p.csd_socket = nope;
        const tr_kv_shape sh = to_shape(&s);
        tr_kv *k = NULL;
        tr_error err = {0};
        const tr_status st = tr_kv_create(&sh, &p, &k, &err);
        TU_CHECK(st == TR_E_IO && strstr(err.msg, "cannot connect to") && strstr(err.msg, nope),
                 "missing agent socket: %d '%s'", (int)st, err.msg);
        tr_kv_free(k);
    }
out:
    for (int i = 0; i < NK; i++) tr_kv_free(kv[i]);
    data_free(&d);
    kill(lpid, SIGTERM);
    waitpid(lpid, NULL, 0);
    TU_CHECK(access(sock, F_OK) != 0, "the listener left its socket %s behind", sock);
}

/* usage: test_kv [NAME...] — every test, or only the named ones (the emulated suite runs the
 * ones that reach the kernels, within its time) */
int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"hash", test_hash},
        {"alpha1", test_alpha1},
        {"topk", test_topk},
        {"selection", test_selection},
        {"sel_repeat", test_sel_repeat},
        {"recall", test_recall},
        {"h2o", test_h2o},
        {"quest", test_quest},
        {"truncate", test_truncate},
        {"save_restore", test_save_restore},
        {"faults", test_faults},
        {"bkp", test_bkp},
        {"pull_keys", test_pull_keys},
        {"tail", test_tail},
        {"app_rates", test_app_rates},
        {"app_explore", test_app_explore},
        {"csd", test_csd},
        {"host_keys", test_host_keys},
        {"csd_listen", test_csd_listen},
        {"spec", test_spec},
    };
    const int n_tests = (int)(sizeof tests / sizeof tests[0]);
    for (int i = 1; i < argc; i++) {
        int k = 0;
        while (k < n_tests && strcmp(argv[i], tests[k].name) != 0) k++;
        if (k == n_tests) {
            fprintf(stderr, "test_kv: no test named %s\n", argv[i]);
            return 2;
        }
    }
    tr_error err = {0};
    if (tr_pool_create(2, &g_pool, &err)) {
        fprintf(stderr, "pool: %s\n", err.msg);
        return 1;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/test_kv-XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    for (int k = 0; k < n_tests; k++) {
        bool wanted = argc == 1;
        for (int i = 1; i < argc; i++) wanted |= strcmp(argv[i], tests[k].name) == 0;
        if (wanted) tests[k].fn();
    }
    rmdir(g_tmp);
    tr_pool_free(g_pool);
    return tu_result("test_kv");
}
