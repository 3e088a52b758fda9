/*
 * full: every key and value in DRAM, exact attention — llama.cpp's behaviour and the accuracy
 * reference. The layout and the numerics follow llama.cpp's non-flash-attention CPU path, which
 * the parity tests compare with: K as F16 rows per position [n_ctx][n_head_kv * head_dim_k]; V
 * transposed, F16 rows per channel [n_head_kv * head_dim_v][n_ctx], so the attention-weighted sum
 * of V is a dot product along positions (the same F16 x F16 dot llama.cpp's mul_mat uses); q and
 * the probabilities rounded to F16 (its matmuls against the F16 cache convert the other operand).
 * Layers may have their own head counts (the arrays are sized by the largest).
 *
 * tr_kv_full_attend is the whole of this policy's attention: tasks of one KV head and a block of
 * consecutive rows (the attention kernel's tiles, kernels.h attn_f16: the block's positions × the
 * KV head's query heads, at most TR_ATTN_MAX_Q vectors), so each block of K and V is converted
 * once for the whole tile. With too few such tasks for the threads (decode), the query heads of a
 * KV head are split into smaller groups.
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
    size_t attn_floats;      /* the attention kernel's scratch per thread */
    float *scratch;          /* [nth][attn_floats] */
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

/* floats of one thread's attention scratch (a multiple of 16: each thread's part stays aligned) */
static size_t attn_floats(const tr_kv_shape *s) {
    return (tr_attn_scratch_floats(s->n_ctx, s->head_dim_k, s->head_dim_v) + 15) & ~(size_t)15;
}

/* the arrays, then the per-thread scratch, as create lays them out */
uint64_t tr_kv_full_bytes(const tr_kv_shape *s, const tr_kv_params *p) {
    const uint64_t kv = (uint64_t)s->n_layer * (uint64_t)s->n_ctx * (uint64_t)s->n_head_kv *
                        (uint64_t)(s->head_dim_k + s->head_dim_v) * 2;
    const uint64_t nth = (uint64_t)scratch_threads(p);
    return kv + nth * (uint64_t)attn_floats(s) * 4;
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
    /* the family's F16 conversion (the reference's bits) */
    const tr_from_float_fn to16 = kv->kern->from_float[TR_TYPE_F16];
    to16(k, layer_k(kv, layer) + (size_t)pos * (size_t)nk, nk);
    uint16_t *VT = layer_vt(kv, layer);
    uint16_t v16[256];
    for (int64_t i0 = 0; i0 < nv; i0 += 256) {
        const int64_t m = nv - i0 < 256 ? nv - i0 : 256;
        to16(v + i0, v16, m);
        for (int64_t i = 0; i < m; i++)
            VT[(size_t)(i0 + i) * (size_t)kv->shape.n_ctx + (size_t)pos] = v16[i];
    }
    F->len[layer] = pos + 1;
    return TR_OK;
}

typedef struct attn_job {
    const tr_kv *kv;
    const tr_kv_query *q;
    int32_t rows_per_block, n_blocks, heads_per_task, n_sub; /* n_sub: tasks per KV head */
    atomic_int_fast64_t next;
} attn_job;

/* rows [r0, r1), query heads [h0, h1) of KV head kvh */
static void attend_tile(attn_job *j, int ith, int32_t r0, int32_t r1, int32_t kvh, int32_t h0,
                        int32_t h1) {
    const tr_kv *kv = j->kv;
    const full *F = kv->pol;
    const tr_kv_query *Q = j->q;
    const int32_t layer = Q->layer, n_ctx = kv->shape.n_ctx;
    const int32_t hdk = kv->shape.head_dim_k, hdv = kv->shape.head_dim_v;
    tr_attn_q qs[TR_ATTN_MAX_Q];
    int n = 0;
    for (int32_t r = r0; r < r1; r++) {
        const int32_t pos = Q->pos[r];
        for (int32_t h = h0; h < h1; h++)
            qs[n++] = (tr_attn_q){
                .q = Q->q + (size_t)r * Q->q_stride + (size_t)h * hdk,
                .out = Q->out + (size_t)r * Q->out_stride + (size_t)h * hdv,
                .lo = tr_kv_visible_lo(pos, Q->swa),
                .hi = pos,
                /* gpt-oss sinks: an extra logit per head in the denominator, no value vector */
                .sink = Q->sinks ? Q->sinks[h] : -INFINITY,
            };
    }
    const tr_attn_kv akv = {
        .k = layer_k(kv, layer) + (size_t)kvh * hdk,
        .k_pos = (size_t)F->n_head_kv[layer] * hdk,
        .v = layer_vt(kv, layer) + (size_t)kvh * hdv * (size_t)n_ctx, /* V transposed */
        .v_pos = 1,
        .v_dim = (size_t)n_ctx,
        .hd_k = hdk,
        .hd_v = hdv,
        .scale = Q->scale,
    };
    tr_attn_f16_of(kv->kern)(n, qs, &akv, F->scratch + (size_t)ith * F->attn_floats);
}

/* task b of a query's tiles (the last row blocks first: they see the most keys, and the threads
 * then finish together) */
static void run_task(attn_job *j, int ith, int64_t b) {
    const full *F = j->kv->pol;
    const int32_t layer = j->q->layer;
    const int32_t G = F->n_head[layer] / F->n_head_kv[layer];
    const int64_t per_block = (int64_t)F->n_head_kv[layer] * j->n_sub;
    const int32_t blk = j->n_blocks - 1 - (int32_t)(b / per_block);
    const int32_t kvh = (int32_t)(b % per_block / j->n_sub), sub = (int32_t)(b % j->n_sub);
    const int32_t h0 = kvh * G + sub * j->heads_per_task;
    const int32_t h1 = h0 + j->heads_per_task < (kvh + 1) * G ? h0 + j->heads_per_task : (kvh + 1) * G;
    const int32_t r0 = blk * j->rows_per_block;
    const int32_t r1 = r0 + j->rows_per_block < j->q->rows ? r0 + j->rows_per_block : j->q->rows;
    attend_tile(j, ith, r0, r1, kvh, h0, h1);
}

static int64_t n_tasks(const attn_job *j) {
    const full *F = j->kv->pol;
    return (int64_t)j->n_blocks * F->n_head_kv[j->q->layer] * j->n_sub;
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)nth;
    attn_job *j = ctx;
    const full *F = j->kv->pol;
    if (ith >= F->nth) return; /* a pool bigger than planned: the others do the work */
    int64_t b, e;
    while (tr_claim(&j->next, n_tasks(j), 1, &b, &e)) run_task(j, ith, b);
}

/* the row blocks of a query and the query heads per tile: one tile per KV head and block of rows
 * where that gives the threads enough tiles (`tiles_elsewhere`: the tiles run beside it in the
 * same pool run), else smaller head groups. Not more splitting than that: each tile converts its
 * KV head's keys and values to f32 once for all its query heads, so a split repeats that per
 * group (SmolLM2, GQA 3, 2 threads: one tile per KV head, 3 tiles, measured 3-15 % faster per
 * decode step than 9 one-head tiles); each query's result is the same in any grouping */
static void plan_tiles(attn_job *j, int nth, int64_t tiles_elsewhere) {
    const full *F = j->kv->pol;
    const int32_t G = F->n_head[j->q->layer] / F->n_head_kv[j->q->layer];
    const int64_t n_kv = F->n_head_kv[j->q->layer];
    j->heads_per_task = G < TR_ATTN_MAX_Q ? G : TR_ATTN_MAX_Q;
    j->rows_per_block = TR_ATTN_MAX_Q / j->heads_per_task;
    j->n_blocks = (j->q->rows + j->rows_per_block - 1) / j->rows_per_block;
    while (j->heads_per_task > 1 &&
           tiles_elsewhere + (int64_t)j->n_blocks * n_kv *
                                 ((G + j->heads_per_task - 1) / j->heads_per_task) < nth)
        j->heads_per_task = (j->heads_per_task + 1) / 2;
    j->n_sub = (G + j->heads_per_task - 1) / j->heads_per_task;
    atomic_init(&j->next, 0);
}

static tr_status check_rows(const tr_kv *kv, const tr_kv_query *q, tr_error *err) {
    const full *F = kv->pol;
    for (int32_t r = 0; r < q->rows; r++)
        if (q->pos[r] < 0 || q->pos[r] >= F->len[q->layer])
            return tr_fail(err, TR_E_ARG,
                           "KV attend: row %d at position %d, layer %d holds %d positions", r,
                           q->pos[r], q->layer, F->len[q->layer]);
    return TR_OK;
}

tr_status tr_kv_full_attend(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, tr_error *err) {
    tr_status st = check_rows(kv, q, err);
    if (st) return st;
    const uint64_t t0 = tr_now_ns();
    const int nth = pool ? tr_pool_size(pool) : 1;
    attn_job j = {.kv = kv, .q = q};
    plan_tiles(&j, nth, 0);
    if (pool)
        tr_pool_run(pool, attn_task, &j);
    else
        attn_task(&j, 0, 1);
    kv->steps++;
    kv->attn_ns += tr_now_ns() - t0;
    return TR_OK;
}

/* the queries of several caches in one pool run: the tiles of all of them claimed from one
 * counter, so that the threads share a batched decode step's attention evenly (one session's
 * decode row has a tile per KV head: 3 for SmolLM2, which 2 threads split 2 to 1) and wake once
 * per layer instead of once per session */
typedef struct many_job {
    attn_job sub[TR_KV_ATTEND_MANY_MAX];
    int64_t first[TR_KV_ATTEND_MANY_MAX + 1]; /* task indices of sub[i]: [first[i], first[i + 1]) */
    int n, nth_min; /* nth_min: the fewest threads any of the caches has scratch for */
    atomic_int_fast64_t next;
} many_job;

static void many_task(void *ctx, int ith, int nth) {
    (void)nth;
    many_job *m = ctx;
    if (ith >= m->nth_min) return;
    int64_t b, e;
    int i = 0;
    while (tr_claim(&m->next, m->first[m->n], 1, &b, &e)) {
        while (b >= m->first[i + 1]) i++; /* claims only grow */
        run_task(&m->sub[i], ith, b - m->first[i]);
    }
}

tr_status tr_kv_full_attend_many(tr_kv *const *kvs, tr_pool *pool, const tr_kv_query *qs, int n,
                                 tr_error *err) {
    if (n < 1 || n > TR_KV_ATTEND_MANY_MAX)
        return tr_fail(err, TR_E_INTERNAL, "KV attend: %d caches in one run (1..%d)", n,
                       TR_KV_ATTEND_MANY_MAX);
    for (int i = 0; i < n; i++) {
        tr_status st = check_rows(kvs[i], &qs[i], err);
        if (st) return st;
    }
    const uint64_t t0 = tr_now_ns();
    const int nth = pool ? tr_pool_size(pool) : 1;
    many_job m = {.n = n, .nth_min = nth};
    m.first[0] = 0;
    for (int i = 0; i < n; i++) {
        attn_job *j = &m.sub[i];
        j->kv = kvs[i];
        j->q = &qs[i];
        const full *F = kvs[i]->pol;
        /* every other query has a tile per KV head at least: they count towards the threads'
         * share */
        plan_tiles(j, nth, (int64_t)(n - 1) * F->n_head_kv[qs[i].layer]);
        m.first[i + 1] = m.first[i] + n_tasks(j);
        if (F->nth < m.nth_min) m.nth_min = F->nth;
    }
    atomic_init(&m.next, 0);
    if (pool)
        tr_pool_run(pool, many_task, &m);
    else
        many_task(&m, 0, 1);
    /* the run's time, shared among the caches it served */
    const uint64_t dt = (tr_now_ns() - t0) / (uint64_t)n;
    for (int i = 0; i < n; i++) {
        kvs[i]->steps++;
        kvs[i]->attn_ns += dt;
    }
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
    free(F->scratch);
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
    F->attn_floats = attn_floats(s);
    F->scratch = aligned_alloc(64, (size_t)F->nth * F->attn_floats * 4);
    if (!F->mem || !F->len || !F->n_head || !F->n_head_kv || !F->scratch)
        return tr_fail(err, TR_E_NOMEM,
                       "KV cache: cannot allocate %llu MiB for %d tokens (lower -c)",
                       (unsigned long long)(tr_kv_full_bytes(s, &kv->params) >> 20), s->n_ctx);
    for (int32_t l = 0; l < s->n_layer; l++) {
        F->n_head[l] = s->layer_n_head ? s->layer_n_head[l] : s->n_head;
        F->n_head_kv[l] = s->layer_n_head_kv ? s->layer_n_head_kv[l] : s->n_head_kv;
    }
    return TR_OK;
}
