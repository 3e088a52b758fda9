/*
 * Which keys a query attends: the low-precision key copy and its scoring (tiered), page bounds
 * (quest), accumulated attention mass and eviction (h2o), and the per-row selection.
 *
 * Tiered key copy: each key head is divided channel-wise by a per-(layer, KV head) scale and
 * stored in Q8_0 or Q4_0 blocks of 32 channels (one F16 scale per block and token). The per-
 * channel scale equalises the few large channels real keys have (they would otherwise set the
 * block scale and flatten the others); the query is multiplied by the same scale, so
 * q.k = (q*s).(k/s) and the scoring is one kernel-table dot product per token and head
 * (Q8_0 query x Q8_0/Q4_0 key, SIMD). The scales come from the first page of each layer (absmax
 * per channel, floored at 1% of the largest so dead channels are not blown up); before it is
 * complete the copy uses scale 1, and at completion the page is quantized again.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv_internal.h"
#include "tensor/blocks.h"
#include "tensor/fp16.h"
#include "tensor/types.h"

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
static void quant_copy_row(const tr_kv *kv, tr_type t, const float *x, void *dst, int64_t n) {
    if (t == TR_TYPE_Q4_0)
        quant_q4_0(x, dst, n);
    else
        kv->kern->from_float[TR_TYPE_Q8_0](x, dst, n);
}

void tr_kv_quant_key(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec) {
    const int32_t hdk = kv->shape.head_dim_k, pad = kv->hdk_pad;
    const uint16_t *K = (const uint16_t *)rec;
    float *tmp = kv->qf; /* free outside scoring; append and scoring never overlap */
    for (int32_t g = 0; g < kv->shape.n_head_kv; g++) {
        const float *eq = L->eq + (size_t)g * pad;
        for (int32_t c = 0; c < hdk; c++) tmp[c] = tr_kv_f16[K[(size_t)g * hdk + c]] / eq[c];
        for (int32_t c = hdk; c < pad; c++) tmp[c] = 0.0f;
        quant_copy_row(kv, kv->qtype, tmp, tr_kv_qk_row(kv, L, (size_t)g, pos), pad);
    }
}

void tr_kv_quant_value(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec) {
    const int32_t hdv = kv->shape.head_dim_v, pad = kv->hdv_pad;
    const uint16_t *V = (const uint16_t *)(rec + kv->krec);
    float *tmp = kv->qf; /* as in tr_kv_quant_key */
    for (int32_t g = 0; g < kv->shape.n_head_kv; g++) {
        for (int32_t c = 0; c < hdv; c++) tmp[c] = tr_kv_f16[V[(size_t)g * hdv + c]];
        for (int32_t c = hdv; c < pad; c++) tmp[c] = 0.0f;
        quant_copy_row(kv, kv->vtype, tmp,
                       L->qv + (g * (size_t)kv->shape.n_ctx + (size_t)pos) * kv->vrow, pad);
    }
}

void tr_kv_calibrate(tr_kv *kv, tr_kv_layer *L) {
    const int32_t hdk = kv->shape.head_dim_k, pad = kv->hdk_pad, n = TR_KV_PAGE;
    for (int32_t g = 0; g < kv->shape.n_head_kv; g++) {
        float *eq = L->eq + (size_t)g * pad;
        float top = 0.0f;
        for (int32_t c = 0; c < hdk; c++) {
            float a = 0.0f;
            for (int32_t p = 0; p < n; p++) {
                const uint16_t *K = (const uint16_t *)(L->hot + (size_t)L->tok[p].slot * kv->rec);
                a = fmaxf(a, fabsf(tr_kv_f16[K[(size_t)g * hdk + c]]));
            }
            eq[c] = a;
            top = fmaxf(top, a);
        }
        for (int32_t c = 0; c < hdk; c++) {
            float s = fmaxf(eq[c], 0.01f * top);
            if (!(s > 0.0f)) s = 1.0f;
            if (kv->eq_mode == TR_KV_EQ_NONE) s = 1.0f;
            if (kv->eq_mode == TR_KV_EQ_SQRT) s = sqrtf(s);
            eq[c] = s;
        }
    }
    L->calibrated = true;
    for (int32_t p = 0; p < n; p++)
        tr_kv_quant_key(kv, L, p, L->hot + (size_t)L->tok[p].slot * kv->rec);
}

/* ---------------------------------------------------------------------------------------------- */
/* quest page bounds                                                                              */

static void quest_apply(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec, bool first) {
    const int32_t hdk = kv->shape.head_dim_k, page = pos / TR_KV_PAGE;
    const uint16_t *K = (const uint16_t *)rec;
    for (int32_t g = 0; g < kv->shape.n_head_kv; g++) {
        const size_t off = ((size_t)g * (size_t)kv->n_pages + (size_t)page) * (size_t)hdk;
        uint16_t *mn = L->pmin + off, *mx = L->pmax + off;
        const uint16_t *k = K + (size_t)g * hdk;
        if (first) {
            memcpy(mn, k, (size_t)hdk * 2);
            memcpy(mx, k, (size_t)hdk * 2);
            continue;
        }
        for (int32_t c = 0; c < hdk; c++) {
            const float v = tr_kv_f16[k[c]];
            if (v < tr_kv_f16[mn[c]]) mn[c] = k[c];
            if (v > tr_kv_f16[mx[c]]) mx[c] = k[c];
        }
    }
}

void tr_kv_quest_update(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec) {
    quest_apply(kv, L, pos, rec, pos % TR_KV_PAGE == 0);
}

tr_status tr_kv_quest_rebuild_page(tr_kv *kv, int32_t layer, int32_t page, tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    for (int32_t p = page * TR_KV_PAGE; p < L->len; p++) {
        const tr_kv_tok *t = &L->tok[p];
        const uint8_t *rec = kv->rec_tmp;
        if (t->where == TR_KV_TOK_HOT) {
            rec = L->hot + (size_t)t->slot * kv->rec;
        } else {
            tr_status st = tr_kv_cold_read_sync(kv, layer, p, 1, kv->rec_tmp, err);
            if (st) return st;
        }
        quest_apply(kv, L, p, rec, p == page * TR_KV_PAGE);
    }
    return TR_OK;
}

float tr_kv_quest_bound(const tr_kv *kv, int32_t layer, int32_t page, int32_t kvh,
                        const float *q16) {
    const tr_kv_layer *L = &kv->layers[layer];
    const int32_t hdk = kv->shape.head_dim_k;
    const size_t off = ((size_t)kvh * (size_t)kv->n_pages + (size_t)page) * (size_t)hdk;
    const uint16_t *mn = L->pmin + off, *mx = L->pmax + off;
    float s = 0.0f;
    for (int32_t c = 0; c < hdk; c++) s += q16[c] * tr_kv_f16[q16[c] >= 0.0f ? mx[c] : mn[c]];
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* scoring                                                                                        */

typedef struct score_job {
    tr_kv *kv;
    const tr_kv_layer *L;
    const int32_t *cand;
    int32_t i0, n;  /* entries [i0, n) of cand */
    int32_t n_a;    /* PSUM: entries [0, n_a) form group A, the rest group B */
    size_t stride;  /* of kv->hs rows */
    tr_kv_agg agg;
    float scale;
    float *out;
    atomic_int_fast64_t next;
} score_job;

/* q.k of candidates [i0, n) and every query head: aggregated into out (MAX, SUM), or kept per
 * head in kv->hs (PMAX, PSUM) */
static void score_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_job *j = ctx;
    const tr_kv *kv = j->kv;
    const int32_t nkv = kv->shape.n_head_kv, G = kv->group, pad = kv->hdk_pad;
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
        if (kv->hk_wrap) {
            for (int64_t i = b; i < e; i++) rows[i - b] = (int32_t)tr_kv_hk_index(kv, j->cand[i]);
            idx = rows;
        }
        if (!per_head)
            for (int64_t i = b; i < e; i++) j->out[i] = mx ? -INFINITY : 0.0f;
        for (int32_t g = 0; g < nkv; g++)
            for (int32_t h = g * G; h < (g + 1) * G; h++) {
                const uint8_t *q8 = kv->q8 + (size_t)h * kv->q8row;
                tr_dot_rows(kv->kern, kv->qtype, pad, e - b, v, tr_kv_qk_row(kv, j->L, (size_t)g, 0),
                            kv->qrow, idx, q8);
                if (per_head) {
                    float *hs = kv->hs + (size_t)h * j->stride;
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
 * exponentials into shares of the head's attention (kv->hz: c_a, c_b per head). PMAX: the max. */
static void norm_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_job *j = ctx;
    tr_kv *kv = j->kv;
    int64_t b, e;
    while (tr_claim(&j->next, kv->shape.n_head, 1, &b, &e))
        for (int64_t h = b; h < e; h++) {
            float *hs = kv->hs + (size_t)h * j->stride;
            if (j->agg == TR_KV_AGG_PSUM) {
                float ma, mb;
                double za, zb;
                tr_kv_group_stats(hs, j->n_a, &ma, &za);
                tr_kv_group_stats(hs + j->n_a, j->n - j->n_a, &mb, &zb);
                tr_kv_group_merge(1, &ma, &za, &mb, &zb, &kv->hz[2 * h], &kv->hz[2 * h + 1]);
            } else {
                float m = -INFINITY;
                for (int32_t i = 0; i < j->n; i++) m = tr_kv_maxf(m, hs[i]);
                kv->hz[2 * h] = m;
            }
        }
}

/* step 2, per token: the summed share of attention (PSUM) or the best log-probability relative
 * to each head's peak (PMAX) */
static void agg_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_job *j = ctx;
    const tr_kv *kv = j->kv;
    const int32_t nh = kv->shape.n_head;
    int64_t b, e;
    while (tr_claim(&j->next, j->n, 1024, &b, &e)) {
        if (j->agg == TR_KV_AGG_PSUM) {
            /* as the agent computes its group: tr_kv_group_score, head by head */
            const int64_t ea = e < j->n_a ? e : j->n_a, bb = b > j->n_a ? b : j->n_a;
            if (b < ea)
                tr_kv_group_score(kv->hs, j->stride, nh, kv->hz, 2, (int32_t)b, (int32_t)ea,
                                  j->out);
            if (bb < e)
                tr_kv_group_score(kv->hs, j->stride, nh, kv->hz + 1, 2, (int32_t)bb, (int32_t)e,
                                  j->out);
            continue;
        }
        for (int64_t i = b; i < e; i++) j->out[i] = -INFINITY;
        for (int32_t h = 0; h < nh; h++) {
            const float *hs = kv->hs + (size_t)h * j->stride;
            const float m = kv->hz[2 * h];
            for (int64_t i = b; i < e; i++) j->out[i] = tr_kv_maxf(j->out[i], hs[i] - m);
        }
    }
}

void tr_kv_prepare_query(tr_kv *kv, int32_t layer, const float *q) {
    const tr_kv_layer *L = &kv->layers[layer];
    const int32_t hdk = kv->shape.head_dim_k, pad = kv->hdk_pad, nh = kv->shape.n_head;
    for (int32_t h = 0; h < nh; h++) {
        const float *eq = L->eq + (size_t)(h / kv->group) * pad;
        float *qf = kv->qf + (size_t)h * pad;
        for (int32_t c = 0; c < hdk; c++) qf[c] = q[(size_t)h * hdk + c] * eq[c];
        for (int32_t c = hdk; c < pad; c++) qf[c] = 0.0f;
        kv->kern->from_float[TR_TYPE_Q8_0](qf, kv->q8 + (size_t)h * kv->q8row, pad);
    }
}

void tr_kv_score_heads(tr_kv *kv, tr_pool *pool, int32_t layer, const int32_t *cand, int32_t i0,
                       int32_t i1, size_t stride, float scale) {
    score_job j = {.kv = kv,
                   .L = &kv->layers[layer],
                   .cand = cand,
                   .i0 = i0,
                   .n = i1,
                   .stride = stride,
                   .agg = TR_KV_AGG_PSUM,
                   .scale = scale};
    atomic_init(&j.next, 0);
    tr_kv_run(pool, score_task, &j,
              (uint64_t)(i1 - i0) * (uint64_t)kv->shape.n_head * (uint64_t)kv->hdk_pad);
}

void tr_kv_score_tokens(tr_kv *kv, tr_pool *pool, int32_t layer, const float *q, float scale,
                        const int32_t *cand, int32_t n, int32_t n_a, tr_kv_agg agg, float *out) {
    const tr_kv_layer *L = &kv->layers[layer];
    const int32_t nh = kv->shape.n_head;
    tr_kv_prepare_query(kv, layer, q);
    if (agg >= TR_KV_AGG_PMAX && !kv->hs) agg = TR_KV_AGG_MAX; /* no per-head buffer */
    if (n_a < 0 || n_a > n || agg != TR_KV_AGG_PSUM) n_a = 0;
    score_job j = {.kv = kv,
                   .L = L,
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
    tr_kv_run(pool, score_task, &j, work * (uint64_t)kv->hdk_pad);
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
    tr_kv *kv;
    const tr_kv_layer *L;
    const int32_t *exc;  /* the unselected candidates (indices into cand, ascending) */
    const int32_t *cand; /* candidate index -> position */
    int32_t ne, n_a;
    float min_share;
    size_t stride; /* of kv->hs rows */
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
    tr_kv *kv = j->kv;
    const int32_t G = kv->group;
    int64_t b, e;
    while (tr_claim(&j->next, kv->shape.n_head_kv, 1, &b, &e))
        for (int64_t g = b; g < e; g++) {
            float *hs0 = kv->hs + (size_t)g * G * j->stride;
            const float *hz = kv->hz + 2 * (size_t)g * G;
            int32_t *idx = kv->tail_idx + (size_t)g * (size_t)kv->shape.n_ctx, n = 0;
            for (int32_t x = 0; x < j->ne; x++) {
                const int32_t i = j->exc[x], ab = i < j->n_a ? 0 : 1;
                float m = 0.0f;
                for (int32_t u = 0; u < G; u++) {
                    float *hs = hs0 + (size_t)u * j->stride;
                    hs[n] = hs[i] * hz[2 * u + ab];
                    m = tr_kv_maxf(m, hs[n]);
                }
                if (m >= j->min_share || (kv->tail_every && x % kv->tail_every == 0))
                    idx[n++] = j->cand[i];
            }
            kv->tail_n[g] = n;
            for (int32_t u = 0; u < G; u++) {
                const float *hs = hs0 + (size_t)u * j->stride;
                double s = 0.0;
                for (int32_t x = 0; x < n; x++) s += (double)hs[x];
                kv->tail_e[g * G + u] = (float)s;
            }
        }
}

/* per KV head: the weighted sum of the value copy, for all the query heads it serves */
static void tail_sum_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    tail_job *j = ctx;
    tr_kv *kv = j->kv;
    const int32_t G = kv->group, pad = kv->hdv_pad;
    const size_t n_ctx = (size_t)kv->shape.n_ctx;
    int64_t b, e;
    while (tr_claim(&j->next, kv->shape.n_head_kv, 1, &b, &e))
        for (int64_t g = b; g < e; g++) {
            float *o = kv->tail_o + (size_t)g * G * pad;
            memset(o, 0, (size_t)G * pad * sizeof(float));
            tr_axpy_rows(kv->kern, kv->vtype, pad, kv->tail_n[g], G, o, (size_t)pad,
                         kv->hs + (size_t)g * G * j->stride, j->stride,
                         j->L->qv + (size_t)g * n_ctx * kv->vrow, kv->vrow,
                         kv->tail_idx + (size_t)g * n_ctx);
        }
}

void tr_kv_tail_estimate(tr_kv *kv, tr_pool *pool, const tr_kv_layer *L, const int32_t *cand,
                         int32_t n_cand, int32_t n_all, int32_t n_a) {
    /* kv->sel is free between the marking of the selection and its final listing */
    int32_t *exc = kv->sel, ne = 0;
    for (int32_t i = 0; i < n_cand; i++)
        if (!kv->mark[cand[i]]) exc[ne++] = i;
    tail_job j = {.kv = kv,
                  .L = L,
                  .exc = exc,
                  .cand = cand,
                  .ne = ne,
                  .n_a = n_a,
                  .min_share = kv->params.tail_min / (float)n_all,
                  .stride = (size_t)n_all};
    atomic_init(&j.next, 0);
    const int32_t nkv = kv->shape.n_head_kv;
    tr_kv_run(pool, tail_weights_task, &j, (uint64_t)ne * (uint64_t)kv->shape.n_head);
    uint64_t kept = 0;
    for (int32_t g = 0; g < nkv; g++) kept += (uint64_t)kv->tail_n[g];
    kv->tail_cand += (uint64_t)ne * (uint64_t)nkv;
    kv->tail_kept += kept;
    atomic_store(&j.next, 0);
    tr_kv_run(pool, tail_sum_task, &j, kept * (uint64_t)kv->group * (uint64_t)kv->hdv_pad);
    kv->tail_row = true;
}

/* ---------------------------------------------------------------------------------------------- */
/* top-k (quickselect, median of three)                                                           */

void tr_kv_topk(const float *s, int32_t *idx, int32_t n, int32_t k) {
    if (k <= 0 || k >= n) return;
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        /* median of three as pivot, moved to hi */
        int32_t a = idx[lo], b = idx[mid], c = idx[hi];
        int32_t m;
        if ((s[a] >= s[b]) == (s[b] >= s[c]))
            m = mid;
        else if ((s[b] >= s[a]) == (s[a] >= s[c]))
            m = lo;
        else
            m = hi;
        int32_t t = idx[m];
        idx[m] = idx[hi];
        idx[hi] = t;
        const float pv = s[idx[hi]];
        int32_t st = lo;
        for (int32_t i = lo; i < hi; i++)
            if (s[idx[i]] > pv) { /* descending: larger first */
                t = idx[i];
                idx[i] = idx[st];
                idx[st] = t;
                st++;
            }
        t = idx[st];
        idx[st] = idx[hi];
        idx[hi] = t;
        /* idx[lo..st) > pivot, idx[st] = pivot, idx(st..hi] <= pivot */
        if (st == k || st == k - 1) return;
        if (st > k)
            hi = st - 1;
        else
            lo = st + 1;
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* selection                                                                                      */

typedef struct quest_job {
    tr_kv *kv;
    int32_t layer;
    const int32_t *pages;
    int32_t n;
    tr_kv_agg agg;
    float *out;
    atomic_int_fast64_t next;
} quest_job;

static void quest_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    quest_job *j = ctx;
    const tr_kv *kv = j->kv;
    int64_t b, e;
    while (tr_claim(&j->next, j->n, 16, &b, &e))
        for (int64_t i = b; i < e; i++) {
            float acc = j->agg == TR_KV_AGG_MAX ? -INFINITY : 0.0f;
            for (int32_t h = 0; h < kv->shape.n_head; h++) {
                const float v = tr_kv_quest_bound(kv, j->layer, j->pages[i], h / kv->group,
                                                  kv->qf + (size_t)h * kv->hdk_pad);
                acc = j->agg == TR_KV_AGG_MAX ? tr_kv_maxf(acc, v) : acc + v;
            }
            j->out[i] = acc;
        }
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *s = ctx;
    const float x = s[*(const int32_t *)a], y = s[*(const int32_t *)b];
    return x > y ? -1 : x < y ? 1 : (*(const int32_t *)a - *(const int32_t *)b);
}

tr_status tr_kv_select_row(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                           bool spec, float scale, int32_t swa, int32_t *n_sel, tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    const tr_kv_params *p = &kv->params;
    const int32_t lo = tr_kv_visible_lo(pos, swa), n_vis = pos - lo + 1;
    const int32_t sink_hi = p->n_sink < pos + 1 ? p->n_sink : pos + 1;
    const int32_t win_lo = pos - p->n_window + 1 > lo ? pos - p->n_window + 1 : lo;
    const int32_t c_lo = sink_hi > lo ? sink_hi : lo;
    const int32_t k = tr_kv_count(p->alpha, n_vis);
    /* a speculation (made before the row's token is stored) scores the tokens before it */
    const int32_t own = spec ? pos : -1, top = spec ? pos - 1 : pos;
    int32_t *sel = kv->sel, *cand = kv->cand;
    uint8_t *mark = kv->mark;
    int32_t n_cand = 0;
    kv->tail_row = false;
    for (int32_t t = c_lo; t < win_lo && t <= top; t++)
        if (L->tok[t].where != TR_KV_TOK_EVICTED) cand[n_cand++] = t;

    bool all = p->policy == TR_KV_H2O || k >= n_cand;
    if (!all && p->policy == TR_KV_TIERED) {
        /* normalised aggregations weigh each head by the share of its attention the candidates
         * would get: the sinks and the window, attended anyway, join the normalisation */
        int32_t n_all = n_cand;
        if (kv->agg >= TR_KV_AGG_PMAX) {
            for (int32_t t = lo; t < sink_hi && t <= top; t++)
                if (L->tok[t].where != TR_KV_TOK_EVICTED) cand[n_all++] = t;
            for (int32_t t = win_lo > c_lo ? win_lo : c_lo; t <= top; t++)
                if (L->tok[t].where != TR_KV_TOK_EVICTED) cand[n_all++] = t;
        }
        /* group A: the candidates whose pages are on storage (a prefix: cand is ascending),
         * less the most recent of them that APP gives the host (beta = host / agent tokens; the
         * host's share at most what its key copy holds, its budget M_0: --kv-host-keys).
         * Without an agent only a fixed beta splits, so that host scoring reproduces the
         * agent's groups exactly. */
        int32_t n_a = 0;
        const int32_t written = kv->cold ? L->pages_written * TR_KV_PAGE : 0;
        while (n_a < n_cand && cand[n_a] < written) n_a++;
        if (kv->csd && p->beta < 0.0f && !kv->app_probed && n_a > 0) {
            tr_status st = tr_kv_app_probe(kv, pool, layer, q, scale, cand, n_a, err);
            if (st) return st;
            kv->app_beta_first = tr_kv_app_beta(kv);
        }
        if (kv->csd || p->beta >= 0.0f) {
            const double beta = kv->csd ? tr_kv_app_beta(kv) : (double)p->beta;
            int32_t n_c = (int32_t)lround((double)n_a * beta / (1.0 + beta));
            /* APP keeps measuring both sides: a starved side gets a part big enough to be
             * measured once in TR_KV_APP_EXPLORE layers */
            const int32_t n_b = n_all - n_a, mp = TR_KV_APP_MIN_PART;
            kv->app_exploring = 0;
            if (kv->csd && p->beta < 0.0f && n_a >= 2 * mp &&
                ++kv->app_explore % TR_KV_APP_EXPLORE == 0) {
                if (n_a - n_c < mp) {
                    n_c = n_a - mp;
                    kv->app_exploring = 2;
                } else if (n_c + n_b < mp) {
                    n_c = mp - n_b;
                    kv->app_exploring = 1;
                }
            }
            if (kv->hk_wrap) {
                const int32_t hlo = tr_kv_hk_lo(kv, L);
                n_c = tr_kv_hk_held(kv, L, cand, n_a, n_c);
                /* the rest of the host's part (the open page, the window, the sinks) is always
                 * held: the ring is sized for it */
                for (int32_t i = n_a; i < n_all; i++)
                    if (cand[i] >= kv->hk_sink && cand[i] < hlo)
                        return tr_fail(err, TR_E_ARG,
                                       "KV cache: layer %d, row %d: the host's key copy holds "
                                       "positions from %d, the row needs %d (more rows in one "
                                       "call than planned)",
                                       layer, pos, hlo, cand[i]);
            }
            kv->app_beta = beta;
            n_a -= n_c;
            kv->app_beta_split = n_a > 0 ? (double)n_c / n_a : 0.0;
        }
        if (kv->csd && n_a > 0) {
            tr_status st = tr_kv_csd_score(kv, pool, layer, q, scale, cand, n_all, n_a,
                                           kv->cscore, err);
            if (st) return st;
        } else {
            if (kv->pull_keys) {
                tr_status st = tr_kv_pull_keys(kv, layer, err);
                if (st) return st;
            }
            tr_kv_score_tokens(kv, pool, layer, q, scale, cand, n_all, n_a, kv->agg, kv->cscore);
        }
        for (int32_t i = 0; i < n_cand; i++) sel[i] = i;
        tr_kv_topk(kv->cscore, sel, n_cand, k);
        int32_t k_a = 0;
        for (int32_t i = 0; i < k; i++) {
            mark[cand[sel[i]]] = 1;
            k_a += sel[i] < n_a;
        }
        if (kv->vrow && kv->agg == TR_KV_AGG_PSUM)
            tr_kv_tail_estimate(kv, pool, L, cand, n_cand, n_all, n_a);
        /* APP: how selective each part is (BKP skews it: the hot part holds more winners) */
        if (n_a > 0 && n_cand > n_a) {
            tr_kv_app_avg(&kv->app_as, (double)k_a / n_a);
            tr_kv_app_avg(&kv->app_ac, (double)(k - k_a) / (n_cand - n_a));
        }
    } else if (!all && p->policy == TR_KV_QUEST) {
        /* query heads rounded to F16, as the attention sees them */
        const int32_t hdk = kv->shape.head_dim_k;
        for (int32_t h = 0; h < kv->shape.n_head; h++)
            for (int32_t c = 0; c < hdk; c++)
                kv->qf[(size_t)h * kv->hdk_pad + c] =
                    tr_kv_f16[tr_f32_to_f16(q[(size_t)h * hdk + c])];
        /* pages with candidates, how many each holds */
        int32_t n_pg = 0;
        for (int32_t i = 0; i < n_cand; i++)
            if (!n_pg || cand[i] / TR_KV_PAGE != sel[n_pg - 1]) sel[n_pg++] = cand[i] / TR_KV_PAGE;
        quest_job j = {
            .kv = kv, .layer = layer, .pages = sel, .n = n_pg, .agg = TR_KV_AGG_MAX, .out = kv->cscore}; /* a page can matter to any one head */
        atomic_init(&j.next, 0);
        tr_kv_run(pool, quest_task, &j,
                  (uint64_t)n_pg * (uint64_t)kv->shape.n_head * (uint64_t)kv->shape.head_dim_k);
        /* rank pages by bound; take them until they hold k candidates */
        int32_t *order = kv->pg_order;
        for (int32_t i = 0; i < n_pg; i++) order[i] = i;
        qsort_r(order, (size_t)n_pg, sizeof *order, cmp_desc, kv->cscore);
        int32_t got = 0;
        for (int32_t r = 0; r < n_pg && got < k; r++) {
            const int32_t pg = sel[order[r]];
            const int32_t a = pg * TR_KV_PAGE > c_lo ? pg * TR_KV_PAGE : c_lo;
            const int32_t b = (pg + 1) * TR_KV_PAGE < win_lo ? (pg + 1) * TR_KV_PAGE : win_lo;
            for (int32_t t = a; t < b; t++)
                if (L->tok[t].where != TR_KV_TOK_EVICTED) {
                    mark[t] = 1;
                    got++;
                }
        }
    } else if (!all) {
        return tr_fail(err, TR_E_INTERNAL, "KV policy %s does not select",
                       tr_kv_policy_name(p->policy));
    }
    int32_t n = 0;
    /* sel_repeat: every visible token's flag says whether this selection chose it; a row that
     * follows the last one (the next position) sees every token that row saw */
    const bool follows = pos == L->sel_last_pos + 1;
    L->sel_last_pos = pos;
    for (int32_t t = lo; t <= pos; t++) {
        const bool forced = t < sink_hi || t >= win_lo || t == own;
        if (t != own && L->tok[t].where == TR_KV_TOK_EVICTED) continue;
        const bool pick = all || forced || mark[t];
        if (follows && pick && !forced) {
            kv->sel_follow++;
            kv->sel_repeat += L->tok[t].chosen;
        }
        L->tok[t].chosen = pick && !forced;
        if (pick) {
            sel[n++] = t;
            mark[t] = 0;
            if (forced) continue;
            /* a hit is a choice of the selection: the sinks and the window are attended anyway */
            if (L->tok[t].hits <= UINT16_MAX - TR_KV_HIT) L->tok[t].hits += TR_KV_HIT;
            if (L->tok[t].where == TR_KV_TOK_HOT)
                kv->sel_hot++;
            else
                kv->sel_cold++;
        }
    }
    *n_sel = n;
    return TR_OK;
}

void tr_kv_h2o_evict(tr_kv *kv, int32_t layer, int32_t pos) {
    tr_kv_layer *L = &kv->layers[layer];
    const tr_kv_params *p = &kv->params;
    const int32_t n = pos + 1;
    const int32_t sink_hi = p->n_sink < n ? p->n_sink : n;
    const int32_t win_lo = pos - p->n_window + 1 > sink_hi ? pos - p->n_window + 1 : sink_hi;
    const int32_t forced = sink_hi + (pos - win_lo + 1);
    int32_t budget = tr_kv_count(p->alpha, n);
    if (budget < forced) budget = forced;
    const int32_t kept = n - L->n_evicted;
    if (kept <= budget) return;
    /* the (kept - budget) lowest masses among the evictable tokens: usually one per step, many
     * after a cache was filled without attention (restore, a benchmark's direct fill) */
    int32_t *cand = kv->cand, nc = 0;
    float *neg = kv->cscore;
    for (int32_t t = sink_hi; t < win_lo; t++)
        if (L->tok[t].where != TR_KV_TOK_EVICTED) {
            neg[nc] = -L->mass[t];
            cand[nc++] = t;
        }
    int32_t excess = kept - budget < nc ? kept - budget : nc;
    int32_t *idx = kv->sel;
    for (int32_t i = 0; i < nc; i++) idx[i] = i;
    tr_kv_topk(neg, idx, nc, excess);
    for (int32_t i = 0; i < excess; i++) {
        const int32_t pos_e = cand[idx[i]];
        tr_kv_tok *t = &L->tok[pos_e];
        if (t->where == TR_KV_TOK_HOT) tr_kv_drop_hot(kv, L, pos_e);
        t->where = TR_KV_TOK_EVICTED;
        L->n_evicted++;
    }
}
