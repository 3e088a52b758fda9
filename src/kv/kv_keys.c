/*
 * Tiered's low-precision key copy, host scoring and the tail estimate (kv_keys.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv_keys.h"
#include "tensor/blocks.h"
#include "tensor/fp16.h"
#include "tensor/types.h"

tr_status tr_kv_keys_init(tr_kv_keys *K, const tr_kv_shape *s, const tr_kv_params *p,
                          const tr_kv_plan *pl, const tr_kernels *kern, uint64_t *total,
                          tr_error *err) {
    memset(K, 0, sizeof *K);
    K->shape = s;
    K->kern = kern;
    K->group = s->n_head / s->n_head_kv;
    K->qtype = pl->qtype;
    K->hdk_pad = pl->hdk_pad;
    K->qrow = pl->qrow;
    K->q8row = pl->q8row;
    K->hk_sink = pl->hk_sink;
    K->hk_ring = pl->hk_ring;
    K->hk_rows = pl->hk_sink + pl->hk_ring;
    K->hk_wrap = K->hk_rows < s->n_ctx;
    K->eq_mode = TR_KV_EQ_ABSMAX;
    K->agg = TR_KV_AGG_PSUM;
    K->vtype = pl->vtype;
    K->hdv_pad = pl->hdv_pad;
    K->vrow = pl->vrow;
    K->tail_min = p->tail_min;
    const size_t NL = (size_t)s->n_layer, n_ctx = (size_t)s->n_ctx;
    const size_t nkv = (size_t)s->n_head_kv, nh = (size_t)s->n_head;
    bool ok = true;
#define ALLOC(ptr, n, align)                                                                       \
    do {                                                                                           \
        (ptr) = tr_kv_alloc((n), (align), total);                                                  \
        ok = ok && (ptr);                                                                          \
    } while (0)
    ALLOC(K->qk, NL * nkv * (size_t)K->hk_rows * pl->qrow, 64);
    ALLOC(K->eq, NL * nkv * (size_t)pl->hdk_pad * 4, 0);
    ALLOC(K->calibrated, NL, 0);
    /* the query in float; also the staging row of the key and value copies */
    ALLOC(K->qf,
          (nh * (size_t)pl->hdk_pad > (size_t)pl->hdv_pad ? nh * (size_t)pl->hdk_pad
                                                          : (size_t)pl->hdv_pad) *
              4,
          0);
    ALLOC(K->q8, nh * pl->q8row, 64);
    ALLOC(K->hs, nh * n_ctx * 4, 0);
    ALLOC(K->hz, nh * 8, 0);
    if (p->tail_bits) {
        ALLOC(K->qv, NL * nkv * n_ctx * pl->vrow, 64);
        ALLOC(K->tail_o, nh * (size_t)pl->hdv_pad * 4, 64);
        ALLOC(K->tail_e, nh * 4, 0);
        ALLOC(K->tail_idx, nkv * n_ctx * 4, 0);
        ALLOC(K->tail_n, nkv * 4, 0);
    }
#undef ALLOC
    if (!ok)
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl->dram);
    for (size_t i = 0; i < NL * nkv * (size_t)pl->hdk_pad; i++) K->eq[i] = 1.0f;
    return TR_OK;
}

void tr_kv_keys_free(tr_kv_keys *K) {
    free(K->qk);
    free(K->eq);
    free(K->calibrated);
    free(K->qf);
    free(K->q8);
    free(K->hs);
    free(K->hz);
    free(K->qv);
    free(K->tail_o);
    free(K->tail_e);
    free(K->tail_idx);
    free(K->tail_n);
}

/* ggml's reference Q4_0 quantizer (round half away from zero after the 8.5 offset) */
static void quant_q4_0(const float *x, void *vy, int64_t n) {
    tr_blk_q4_0 *y = vy;
    for (int64_t b = 0; b < n / 32; b++, x += 32) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = tr_f32_to_f16(d);
        for (int j = 0; j < 16; j++) {
            const int8_t a = (int8_t)(x[j] * id + 8.5f), c = (int8_t)(x[16 + j] * id + 8.5f);
            const uint8_t xa = (uint8_t)(a < 15 ? a : 15), xc = (uint8_t)(c < 15 ? c : 15);
            y[b].qs[j] = (uint8_t)(xa | (xc << 4));
        }
    }
}

/* a row of n floats into the key or value copy's block format (Q4_0 or Q8_0) */
static void quant_copy_row(const tr_kv_keys *K, tr_type t, const float *x, void *dst, int64_t n) {
    if (t == TR_TYPE_Q4_0)
        quant_q4_0(x, dst, n);
    else
        K->kern->from_float[TR_TYPE_Q8_0](x, dst, n);
}

void tr_kv_quant_key(tr_kv_keys *K, int32_t layer, int32_t pos, const uint8_t *rec) {
    const int32_t hdk = K->shape->head_dim_k, pad = K->hdk_pad;
    const uint16_t *k16 = (const uint16_t *)rec;
    float *tmp = K->qf; /* free outside scoring; append and scoring never overlap */
    const float *eq0 = tr_kv_eq_of(K, layer);
    for (int32_t g = 0; g < K->shape->n_head_kv; g++) {
        const float *eq = eq0 + (size_t)g * pad;
        for (int32_t c = 0; c < hdk; c++) tmp[c] = tr_kv_f16[k16[(size_t)g * hdk + c]] / eq[c];
        for (int32_t c = hdk; c < pad; c++) tmp[c] = 0.0f;
        quant_copy_row(K, K->qtype, tmp, tr_kv_qk_row(K, layer, (size_t)g, pos), pad);
    }
}

void tr_kv_quant_value(tr_kv_keys *K, int32_t layer, int32_t pos, const uint8_t *rec) {
    const int32_t hdv = K->shape->head_dim_v, pad = K->hdv_pad, nkv = K->shape->n_head_kv;
    const size_t n_ctx = (size_t)K->shape->n_ctx;
    const size_t krec = (size_t)nkv * (size_t)K->shape->head_dim_k * 2;
    const uint16_t *V = (const uint16_t *)(rec + krec);
    float *tmp = K->qf; /* as in tr_kv_quant_key */
    uint8_t *qv = K->qv + (size_t)layer * (size_t)nkv * n_ctx * K->vrow;
    for (int32_t g = 0; g < nkv; g++) {
        for (int32_t c = 0; c < hdv; c++) tmp[c] = tr_kv_f16[V[(size_t)g * hdv + c]];
        for (int32_t c = hdv; c < pad; c++) tmp[c] = 0.0f;
        quant_copy_row(K, K->vtype, tmp, qv + (g * n_ctx + (size_t)pos) * K->vrow, pad);
    }
}

void tr_kv_calibrate(tr_kv_keys *K, const tr_kv_store *st, int32_t layer) {
    const tr_kv_slayer *L = &st->layers[layer];
    const int32_t hdk = K->shape->head_dim_k, pad = K->hdk_pad, n = TR_KV_PAGE;
    for (int32_t g = 0; g < K->shape->n_head_kv; g++) {
        float *eq = tr_kv_eq_of(K, layer) + (size_t)g * pad;
        float top = 0.0f;
        for (int32_t c = 0; c < hdk; c++) {
            float a = 0.0f;
            for (int32_t p = 0; p < n; p++) {
                const uint16_t *k16 = (const uint16_t *)(L->hot + (size_t)L->tok[p].slot * st->rec);
                a = fmaxf(a, fabsf(tr_kv_f16[k16[(size_t)g * hdk + c]]));
            }
            eq[c] = a;
            top = fmaxf(top, a);
        }
        for (int32_t c = 0; c < hdk; c++) {
            float s = fmaxf(eq[c], 0.01f * top);
            if (!(s > 0.0f)) s = 1.0f;
            if (K->eq_mode == TR_KV_EQ_NONE) s = 1.0f;
            if (K->eq_mode == TR_KV_EQ_SQRT) s = sqrtf(s);
            eq[c] = s;
        }
    }
    K->calibrated[layer] = true;
    for (int32_t p = 0; p < n; p++)
        tr_kv_quant_key(K, layer, p, L->hot + (size_t)L->tok[p].slot * st->rec);
}

/* ---------------------------------------------------------------------------------------------- */
/* scoring                                                                                        */

typedef struct score_job {
    tr_kv_keys *K;
    int32_t layer;
    const int32_t *cand;
    int32_t i0, n;  /* entries [i0, n) of cand */
    int32_t n_a;    /* PSUM: entries [0, n_a) form group A, the rest group B */
    size_t stride;  /* of K->hs rows */
    tr_kv_agg agg;
    float scale;
    float *out;
    atomic_int_fast64_t next;
} score_job;

/* q.k of candidates [i0, n) and every query head: aggregated into out (MAX, SUM), or kept per
 * head in K->hs (PMAX, PSUM) */
static void score_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_job *j = ctx;
    const tr_kv_keys *K = j->K;
    const int32_t nkv = K->shape->n_head_kv, G = K->group, pad = K->hdk_pad;
    const bool mx = j->agg == TR_KV_AGG_MAX, per_head = j->agg >= TR_KV_AGG_PMAX;
    enum { CHUNK = 256 };
    float v[CHUNK];
    int64_t b, e;
    /* per chunk of tokens, one KV head at a time: each head's copy is read as one stream, and
     * one kernel call scores the whole chunk (a call per key cost more than the key) */
    int32_t rows[CHUNK];
    while (tr_claim(&j->next, j->n - j->i0, CHUNK, &b, &e)) {
        b += j->i0;
        e += j->i0;
        const int32_t *idx = j->cand + b; /* the candidates' rows in the key copy */
        if (K->hk_wrap) {
            for (int64_t i = b; i < e; i++) rows[i - b] = (int32_t)tr_kv_hk_index(K, j->cand[i]);
            idx = rows;
        }
        if (!per_head)
            for (int64_t i = b; i < e; i++) j->out[i] = mx ? -INFINITY : 0.0f;
        for (int32_t g = 0; g < nkv; g++)
            for (int32_t h = g * G; h < (g + 1) * G; h++) {
                const uint8_t *q8 = K->q8 + (size_t)h * K->q8row;
                tr_dot_rows(K->kern, K->qtype, pad, e - b, v, tr_kv_qk_row(K, j->layer, (size_t)g, 0),
                            K->qrow, idx, q8);
                if (per_head) {
                    float *hs = K->hs + (size_t)h * j->stride;
                    for (int64_t i = b; i < e; i++) hs[i] = v[i - b] * j->scale;
                } else if (mx) {
                    for (int64_t i = b; i < e; i++) j->out[i] = tr_kv_maxf(j->out[i], v[i - b]);
                } else {
                    for (int64_t i = b; i < e; i++) j->out[i] += v[i - b];
                }
            }
    }
}

void tr_kv_group_stats(float *hs, int32_t n, float *m, double *z) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = tr_kv_maxf(mx, hs[i]);
    double s = 0.0;
    if (mx > -INFINITY)
        for (int32_t i = 0; i < n; i++) {
            hs[i] = expf(hs[i] - mx);
            s += (double)hs[i];
        }
    *m = mx;
    *z = s;
}

void tr_kv_group_merge(int32_t nh, const float *m_a, const double *z_a, const float *m_b,
                       const double *z_b, float *c_a, float *c_b) {
    for (int32_t h = 0; h < nh; h++) {
        const float M = fmaxf(m_a[h], m_b[h]);
        const double ea = z_a[h] > 0.0 ? exp((double)m_a[h] - (double)M) : 0.0;
        const double eb = z_b[h] > 0.0 ? exp((double)m_b[h] - (double)M) : 0.0;
        const double Z = z_a[h] * ea + z_b[h] * eb;
        c_a[h] = Z > 0.0 ? (float)(ea / Z) : 0.0f;
        c_b[h] = Z > 0.0 ? (float)(eb / Z) : 0.0f;
    }
}

void tr_kv_group_score(const float *hs, size_t stride, int32_t nh, const float *c, size_t c_stride,
                       int32_t i0, int32_t i1, float *out) {
    for (int32_t i = i0; i < i1; i++) out[i] = 0.0f;
    for (int32_t h = 0; h < nh; h++) {
        const float *r = hs + (size_t)h * stride;
        const float ch = c[(size_t)h * c_stride];
        for (int32_t i = i0; i < i1; i++) out[i] += r[i] * ch;
    }
}

/* normalised aggregation, step 1, per head. PSUM: each group's max and sum of exp(score - max)
 * (the scores replaced by those exponentials), merged into the factor that turns a group's
 * exponentials into shares of the head's attention (K->hz: c_a, c_b per head). PMAX: the max. */
static void norm_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_job *j = ctx;
    tr_kv_keys *K = j->K;
    int64_t b, e;
    while (tr_claim(&j->next, K->shape->n_head, 1, &b, &e))
        for (int64_t h = b; h < e; h++) {
            float *hs = K->hs + (size_t)h * j->stride;
            if (j->agg == TR_KV_AGG_PSUM) {
                float ma, mb;
                double za, zb;
                tr_kv_group_stats(hs, j->n_a, &ma, &za);
                tr_kv_group_stats(hs + j->n_a, j->n - j->n_a, &mb, &zb);
                tr_kv_group_merge(1, &ma, &za, &mb, &zb, &K->hz[2 * h], &K->hz[2 * h + 1]);
            } else {
                float m = -INFINITY;
                for (int32_t i = 0; i < j->n; i++) m = tr_kv_maxf(m, hs[i]);
                K->hz[2 * h] = m;
            }
        }
}

/* step 2, per token: the summed share of attention (PSUM) or the best log-probability relative
 * to each head's peak (PMAX) */
static void agg_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_job *j = ctx;
    const tr_kv_keys *K = j->K;
    const int32_t nh = K->shape->n_head;
    int64_t b, e;
    while (tr_claim(&j->next, j->n, 1024, &b, &e)) {
        if (j->agg == TR_KV_AGG_PSUM) {
            /* as the agent computes its group: tr_kv_group_score, head by head */
            const int64_t ea = e < j->n_a ? e : j->n_a, bb = b > j->n_a ? b : j->n_a;
            if (b < ea)
                tr_kv_group_score(K->hs, j->stride, nh, K->hz, 2, (int32_t)b, (int32_t)ea,
                                  j->out);
            if (bb < e)
                tr_kv_group_score(K->hs, j->stride, nh, K->hz + 1, 2, (int32_t)bb, (int32_t)e,
                                  j->out);
            continue;
        }
        for (int64_t i = b; i < e; i++) j->out[i] = -INFINITY;
        for (int32_t h = 0; h < nh; h++) {
            const float *hs = K->hs + (size_t)h * j->stride;
            const float m = K->hz[2 * h];
            for (int64_t i = b; i < e; i++) j->out[i] = tr_kv_maxf(j->out[i], hs[i] - m);
        }
    }
}

void tr_kv_prepare_query(tr_kv_keys *K, int32_t layer, const float *q) {
    const int32_t hdk = K->shape->head_dim_k, pad = K->hdk_pad, nh = K->shape->n_head;
    const float *eq0 = tr_kv_eq_of(K, layer);
    for (int32_t h = 0; h < nh; h++) {
        const float *eq = eq0 + (size_t)(h / K->group) * pad;
        float *qf = K->qf + (size_t)h * pad;
        for (int32_t c = 0; c < hdk; c++) qf[c] = q[(size_t)h * hdk + c] * eq[c];
        for (int32_t c = hdk; c < pad; c++) qf[c] = 0.0f;
        K->kern->from_float[TR_TYPE_Q8_0](qf, K->q8 + (size_t)h * K->q8row, pad);
    }
}

void tr_kv_score_heads(tr_kv_keys *K, tr_pool *pool, int32_t layer, const int32_t *cand,
                       int32_t i0, int32_t i1, size_t stride, float scale) {
    score_job j = {.K = K,
                   .layer = layer,
                   .cand = cand,
                   .i0 = i0,
                   .n = i1,
                   .stride = stride,
                   .agg = TR_KV_AGG_PSUM,
                   .scale = scale};
    atomic_init(&j.next, 0);
    tr_kv_run(pool, score_task, &j,
              (uint64_t)(i1 - i0) * (uint64_t)K->shape->n_head * (uint64_t)K->hdk_pad);
}

void tr_kv_score_tokens(tr_kv_keys *K, tr_pool *pool, int32_t layer, const float *q, float scale,
                        const int32_t *cand, int32_t n, int32_t n_a, tr_kv_agg agg, float *out) {
    const int32_t nh = K->shape->n_head;
    tr_kv_prepare_query(K, layer, q);
    if (n_a < 0 || n_a > n || agg != TR_KV_AGG_PSUM) n_a = 0;
    score_job j = {.K = K,
                   .layer = layer,
                   .cand = cand,
                   .i0 = 0,
                   .n = n,
                   .n_a = n_a,
                   .stride = (size_t)n,
                   .agg = agg,
                   .scale = scale,
                   .out = out};
    atomic_init(&j.next, 0);
    const uint64_t work = (uint64_t)n * (uint64_t)nh;
    tr_kv_run(pool, score_task, &j, work * (uint64_t)K->hdk_pad);
    if (agg < TR_KV_AGG_PMAX) return;
    atomic_store(&j.next, 0);
    tr_kv_run(pool, norm_task, &j, work * (agg == TR_KV_AGG_PSUM ? 16 : 1));
    atomic_store(&j.next, 0);
    tr_kv_run(pool, agg_task, &j, work);
}

/* ---------------------------------------------------------------------------------------------- */
/* tail: what the unselected tokens add                                                           */

/* Attending the selection alone renormalises each head's softmax over it, as if the unselected
 * tokens had no weight. The scoring pass already holds every candidate's share of each head's
 * attention (PSUM: exp(score - group max) x the group's factor), so the unselected ones' share-
 * weighted value sum t and their total share e are one more pass over a low-precision value copy
 * in DRAM; the row's output becomes (1 - e) x attention over the selection + t. Measured
 * (bench/results/kv-quality.md, alpha 0.1, 4-bit copy): perplexity against full +1.37 % ->
 * -0.16 % on SmolLM2, +3.25 % -> -0.26 % on Qwen2.5. Averaging the values of the unselected
 * tokens instead (over all of them, or per 16 or 64 positions) made it worse than leaving them
 * out: the share-weighted sum needs each token's own value.
 *
 * Only the unselected tokens with a share of at least tail_min / n (n tokens scored) in one of
 * the heads a KV head serves are summed; the rest, many small shares, stay out of both t and e,
 * so their share goes back to the attended tokens as without the tail. At tail_min 1 (SmolLM2,
 * 4K, alpha 0.1, one chunk) 3.5 % of the unselected tokens are summed and perplexity is 7.419
 * against 7.389 summing all of them and 7.406 for full (Qwen2.5: 12 %, 13.824 / 13.752 / 13.788);
 * the pass over the value copy, ~1/3 of a 32K step's CPU when it summed all of them, shrinks
 * with the fraction summed, if less than in proportion: scattered rows cost more each (32K
 * benchmark: +0.98 s summing all, +0.15 s summing 6.7 %, bench/results/kv.md). */
typedef struct tail_job {
    tr_kv_keys *K;
    int32_t layer;
    const int32_t *exc;  /* the unselected candidates (indices into cand, ascending) */
    const int32_t *cand; /* candidate index -> position */
    int32_t ne, n_a;
    float min_share;
    size_t stride; /* of K->hs rows */
    atomic_int_fast64_t next;
} tail_job;

/* per KV head: the shares of the unselected tokens worth summing in the query heads it serves,
 * compacted to the front of those heads' hs rows (in place: the n-th kept is at most the x-th
 * unselected, at most its candidate index), their positions to the KV head's index list, and
 * each query head's summed share */
static void tail_weights_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    tail_job *j = ctx;
    tr_kv_keys *K = j->K;
    const int32_t G = K->group;
    int64_t b, e;
    while (tr_claim(&j->next, K->shape->n_head_kv, 1, &b, &e))
        for (int64_t g = b; g < e; g++) {
            float *hs0 = K->hs + (size_t)g * G * j->stride;
            const float *hz = K->hz + 2 * (size_t)g * G;
            int32_t *idx = K->tail_idx + (size_t)g * (size_t)K->shape->n_ctx, n = 0;
            for (int32_t x = 0; x < j->ne; x++) {
                const int32_t i = j->exc[x], ab = i < j->n_a ? 0 : 1;
                float m = 0.0f;
                for (int32_t u = 0; u < G; u++) {
                    float *hs = hs0 + (size_t)u * j->stride;
                    hs[n] = hs[i] * hz[2 * u + ab];
                    m = tr_kv_maxf(m, hs[n]);
                }
                if (m >= j->min_share || (K->tail_every && x % K->tail_every == 0))
                    idx[n++] = j->cand[i];
            }
            K->tail_n[g] = n;
            for (int32_t u = 0; u < G; u++) {
                const float *hs = hs0 + (size_t)u * j->stride;
                double s = 0.0;
                for (int32_t x = 0; x < n; x++) s += (double)hs[x];
                K->tail_e[g * G + u] = (float)s;
            }
        }
}

/* per KV head: the weighted sum of the value copy, for all the query heads it serves */
static void tail_sum_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    tail_job *j = ctx;
    tr_kv_keys *K = j->K;
    const int32_t G = K->group, pad = K->hdv_pad, nkv = K->shape->n_head_kv;
    const size_t n_ctx = (size_t)K->shape->n_ctx;
    const uint8_t *qv = K->qv + (size_t)j->layer * (size_t)nkv * n_ctx * K->vrow;
    int64_t b, e;
    while (tr_claim(&j->next, nkv, 1, &b, &e))
        for (int64_t g = b; g < e; g++) {
            float *o = K->tail_o + (size_t)g * G * pad;
            memset(o, 0, (size_t)G * pad * sizeof(float));
            tr_axpy_rows(K->kern, K->vtype, pad, K->tail_n[g], G, o, (size_t)pad,
                         K->hs + (size_t)g * G * j->stride, j->stride,
                         qv + (size_t)g * n_ctx * K->vrow, K->vrow,
                         K->tail_idx + (size_t)g * n_ctx);
        }
}

void tr_kv_tail_estimate(tr_kv_keys *K, tr_pool *pool, int32_t layer, const int32_t *cand,
                         int32_t n_cand, int32_t n_all, int32_t n_a, const uint8_t *mark,
                         int32_t *exc) {
    int32_t ne = 0;
    for (int32_t i = 0; i < n_cand; i++)
        if (!mark[cand[i]]) exc[ne++] = i;
    tail_job j = {.K = K,
                  .layer = layer,
                  .exc = exc,
                  .cand = cand,
                  .ne = ne,
                  .n_a = n_a,
                  .min_share = K->tail_min / (float)n_all,
                  .stride = (size_t)n_all};
    atomic_init(&j.next, 0);
    const int32_t nkv = K->shape->n_head_kv;
    tr_kv_run(pool, tail_weights_task, &j, (uint64_t)ne * (uint64_t)K->shape->n_head);
    uint64_t kept = 0;
    for (int32_t g = 0; g < nkv; g++) kept += (uint64_t)K->tail_n[g];
    K->tail_cand += (uint64_t)ne * (uint64_t)nkv;
    K->tail_kept += kept;
    atomic_store(&j.next, 0);
    tr_kv_run(pool, tail_sum_task, &j, kept * (uint64_t)K->group * (uint64_t)K->hdv_pad);
    K->tail_row = true;
}

