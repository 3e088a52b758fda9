/*
 * full: every key and value in DRAM, exact attention — llama.cpp's behaviour and the accuracy
 * reference. The layout and the numerics follow llama.cpp's non-flash-attention CPU path, which
 * the parity tests compare with: K as F16 rows per position [n_ctx][n_head_kv * head_dim_k]; V
 * transposed, F16 rows per channel [n_head_kv * head_dim_v][n_ctx], so the attention-weighted sum
 * of V is a dot product along positions (the same F16 x F16 dot llama.cpp's mul_mat uses); q and
 * the probabilities rounded to F16 (its matmuls against the F16 cache convert the other operand).
 * Layers may have their own head counts (the arrays are sized by the largest).
 *
 * tr_kv_full_attend is the whole of this policy's attention; a tiled kernel for long prefill
 * chunks goes there.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/kv_core.h"
#include "tensor/fp16.h"

typedef struct full {
    uint16_t *mem;           /* one allocation: per layer K then V^T */
    size_t layer_k_elems, layer_v_elems;
    int32_t *len;            /* [n_layer] positions held */
    int32_t *n_head, *n_head_kv; /* [n_layer] */
    int nth;                 /* threads with scratch */
    float *scores;           /* [nth][n_ctx] */
    uint16_t *p16;           /* [nth][n_ctx] */
    uint16_t *q16;           /* [nth][head_dim_k] */
} full;

static uint16_t *layer_k(const tr_kv *kv, int32_t l) {
    const full *F = kv->pol;
    return F->mem + (size_t)l * (F->layer_k_elems + F->layer_v_elems);
}
static uint16_t *layer_vt(const tr_kv *kv, int32_t l) {
    return layer_k(kv, l) + ((const full *)kv->pol)->layer_k_elems;
}

static int scratch_threads(const tr_kv_params *p) {
    return p->n_threads > 0 ? p->n_threads : tr_cpu_physical_cores();
}

/* the arrays, then the per-thread scratch, as create lays them out */
uint64_t tr_kv_full_bytes(const tr_kv_shape *s, const tr_kv_params *p) {
    const uint64_t kv = (uint64_t)s->n_layer * (uint64_t)s->n_ctx * (uint64_t)s->n_head_kv *
                        (uint64_t)(s->head_dim_k + s->head_dim_v) * 2;
    const uint64_t nth = (uint64_t)scratch_threads(p);
    return kv + nth * (uint64_t)s->n_ctx * 6 + nth * (uint64_t)s->head_dim_k * 2;
}

static tr_status full_append(tr_kv *kv, int32_t layer, const float *k, const float *v,
                             tr_error *err) {
    full *F = kv->pol;
    const int32_t pos = F->len[layer];
    if (pos >= kv->shape.n_ctx)
        return tr_fail(err, TR_E_ARG, "KV cache full: layer %d holds %d positions (n_ctx)", layer,
                       kv->shape.n_ctx);
    const int64_t nk = (int64_t)F->n_head_kv[layer] * kv->shape.head_dim_k;
    const int64_t nv = (int64_t)F->n_head_kv[layer] * kv->shape.head_dim_v;
    uint16_t *K = layer_k(kv, layer) + (size_t)pos * (size_t)nk;
    for (int64_t i = 0; i < nk; i++) K[i] = tr_f32_to_f16(k[i]);
    uint16_t *VT = layer_vt(kv, layer);
    for (int64_t i = 0; i < nv; i++) VT[(size_t)i * (size_t)kv->shape.n_ctx + (size_t)pos] = tr_f32_to_f16(v[i]);
    F->len[layer] = pos + 1;
    return TR_OK;
}

typedef struct attn_job {
    const tr_kv *kv;
    const tr_kv_query *q;
    atomic_int_fast64_t next;
} attn_job;

/* one (row, head): scores against every visible key, softmax, weighted sum of V */
static void attend_one(attn_job *j, int ith, int32_t r, int32_t h) {
    const tr_kv *kv = j->kv;
    const full *F = kv->pol;
    const tr_kv_query *Q = j->q;
    const int32_t layer = Q->layer, n_ctx = kv->shape.n_ctx;
    const int32_t pos = Q->pos[r];
    const int32_t hdk = kv->shape.head_dim_k, hdv = kv->shape.head_dim_v;
    const int32_t kvh = h / (F->n_head[layer] / F->n_head_kv[layer]);
    const size_t k_stride = (size_t)F->n_head_kv[layer] * hdk;
    const int32_t j0 = tr_kv_visible_lo(pos, Q->swa);
    const int32_t n = pos - j0 + 1;

    float *scores = F->scores + (size_t)ith * (size_t)n_ctx;
    uint16_t *p16 = F->p16 + (size_t)ith * (size_t)n_ctx;
    uint16_t *q16 = F->q16 + (size_t)ith * (size_t)hdk;
    const float *q = Q->q + (size_t)r * Q->q_stride + (size_t)h * hdk;
    for (int32_t d = 0; d < hdk; d++) q16[d] = tr_f32_to_f16(q[d]);

    const tr_vec_dot_fn dot16 = kv->kern->vec_dot[TR_TYPE_F16];
    const uint16_t *K = layer_k(kv, layer) + (size_t)kvh * hdk;
    float mx = -INFINITY;
    for (int32_t t = 0; t < n; t++) {
        float v;
        dot16(hdk, &v, K + (size_t)(j0 + t) * k_stride, q16);
        v *= Q->scale;
        scores[t] = v;
        if (v > mx) mx = v;
    }
    /* gpt-oss sinks: an extra logit per head in the denominator, with no value vector */
    const float sink = Q->sinks ? Q->sinks[h] : -INFINITY;
    if (sink > mx) mx = sink;
    double sum = 0.0;
    for (int32_t t = 0; t < n; t++) {
        const float e = expf(scores[t] - mx);
        scores[t] = e;
        sum += (double)e;
    }
    if (Q->sinks) sum += (double)expf(sink - mx);
    const float inv = (float)(1.0 / sum);
    for (int32_t t = 0; t < n; t++) p16[t] = tr_f32_to_f16(scores[t] * inv);

    const uint16_t *VT = layer_vt(kv, layer) + (size_t)kvh * hdv * (size_t)n_ctx;
    float *out = Q->out + (size_t)r * Q->out_stride + (size_t)h * hdv;
    for (int32_t d = 0; d < hdv; d++) dot16(n, &out[d], VT + (size_t)d * n_ctx + j0, p16);
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)nth;
    attn_job *j = ctx;
    const full *F = j->kv->pol;
    if (ith >= F->nth) return; /* a pool bigger than planned: the others do the work */
    const int32_t n_head = F->n_head[j->q->layer];
    const int64_t total = (int64_t)j->q->rows * n_head;
    int64_t b, e;
    while (tr_claim(&j->next, total, 4, &b, &e))
        for (int64_t i = b; i < e; i++) attend_one(j, ith, (int32_t)(i / n_head), (int32_t)(i % n_head));
}

tr_status tr_kv_full_attend(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, tr_error *err) {
    const full *F = kv->pol;
    for (int32_t r = 0; r < q->rows; r++)
        if (q->pos[r] < 0 || q->pos[r] >= F->len[q->layer])
            return tr_fail(err, TR_E_ARG,
                           "KV attend: row %d at position %d, layer %d holds %d positions", r,
                           q->pos[r], q->layer, F->len[q->layer]);
    const uint64_t t0 = tr_now_ns();
    attn_job j = {.kv = kv, .q = q};
    atomic_init(&j.next, 0);
    if (pool)
        tr_pool_run(pool, attn_task, &j);
    else
        attn_task(&j, 0, 1);
    kv->steps++;
    kv->attn_ns += tr_now_ns() - t0;
    return TR_OK;
}

static tr_status full_truncate(tr_kv *kv, int32_t n, tr_error *err) {
    (void)err;
    full *F = kv->pol;
    /* later positions are overwritten before they are read again */
    for (int32_t l = 0; l < kv->shape.n_layer; l++)
        if (F->len[l] > n) F->len[l] = n;
    return TR_OK;
}

static int32_t full_len(const tr_kv *kv, int32_t layer) {
    return ((const full *)kv->pol)->len[layer];
}

static void full_stats(const tr_kv *kv, tr_kv_stats *o) {
    const full *F = kv->pol;
    for (int32_t l = 0; l < kv->shape.n_layer; l++)
        if (F->len[l] > o->tokens) o->tokens = F->len[l];
    o->hot_bytes = (uint64_t)kv->shape.n_layer * (uint64_t)o->tokens *
                   (uint64_t)kv->shape.n_head_kv *
                   (uint64_t)(kv->shape.head_dim_k + kv->shape.head_dim_v) * 2;
}

static void full_free(tr_kv *kv) {
    full *F = kv->pol;
    if (!F) return;
    free(F->mem);
    free(F->len);
    free(F->n_head);
    free(F->n_head_kv);
    free(F->scores);
    free(F->p16);
    free(F->q16);
    free(F);
    kv->pol = NULL;
}

static const tr_kv_ops full_ops = {.append = full_append,
                                   .attend = tr_kv_full_attend,
                                   .truncate = full_truncate,
                                   .len = full_len,
                                   .stats = full_stats,
                                   .free = full_free};

tr_status tr_kv_full_create(tr_kv *kv, tr_error *err) {
    const tr_kv_shape *s = &kv->shape;
    full *F = calloc(1, sizeof *F);
    if (!F) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    kv->pol = F;
    kv->ops = &full_ops;
    F->layer_k_elems = (size_t)s->n_ctx * (size_t)s->n_head_kv * (size_t)s->head_dim_k;
    F->layer_v_elems = (size_t)s->n_ctx * (size_t)s->n_head_kv * (size_t)s->head_dim_v;
    const uint64_t bytes = (uint64_t)s->n_layer * (F->layer_k_elems + F->layer_v_elems) * 2;
    F->nth = scratch_threads(&kv->params);
    F->mem = aligned_alloc(64, (bytes + 63) & ~(uint64_t)63);
    F->len = calloc((size_t)s->n_layer, sizeof *F->len);
    F->n_head = malloc(sizeof(int32_t) * (size_t)s->n_layer);
    F->n_head_kv = malloc(sizeof(int32_t) * (size_t)s->n_layer);
    F->scores = malloc((size_t)F->nth * (size_t)s->n_ctx * 4);
    F->p16 = malloc((size_t)F->nth * (size_t)s->n_ctx * 2);
    F->q16 = malloc((size_t)F->nth * (size_t)s->head_dim_k * 2);
    if (!F->mem || !F->len || !F->n_head || !F->n_head_kv || !F->scores || !F->p16 || !F->q16)
        return tr_fail(err, TR_E_NOMEM,
                       "KV cache: cannot allocate %llu MiB for %d tokens (lower -c)",
                       (unsigned long long)(tr_kv_full_bytes(s, &kv->params) >> 20), s->n_ctx);
    for (int32_t l = 0; l < s->n_layer; l++) {
        F->n_head[l] = s->layer_n_head ? s->layer_n_head[l] : s->n_head;
        F->n_head_kv[l] = s->layer_n_head_kv ? s->layer_n_head_kv[l] : s->n_head_kv;
    }
    return TR_OK;
}
