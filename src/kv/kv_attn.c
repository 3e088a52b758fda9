/*
 * Attention over a gathered list of positions (kv_pooled.h says what it computes and why), and
 * the pipelined reads of a list, and the shared helpers of the KV cache (the F16 table, running
 * work on the pool or inline).
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv_pooled.h"
#include "tensor/fp16.h"

float tr_kv_f16[65536];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    for (uint32_t i = 0; i < 65536; i++) tr_kv_f16[i] = tr_f16_to_f32((uint16_t)i);
}

void tr_kv_tables_init(void) { pthread_once(&tables_once, init_tables); }

size_t tr_kv_attn_floats(const tr_kv_shape *s, int32_t ws_cap, size_t *kernel) {
    size_t k = tr_attn_scratch_floats(ws_cap, s->head_dim_k, s->head_dim_v);
    const size_t one = ((size_t)ws_cap * 6 + (size_t)s->head_dim_k * 2 + 3) / 4; /* attend_one */
    if (k < one) k = one;
    k = (k + 15) & ~(size_t)15;
    if (kernel) *kernel = k;
    return k + (((size_t)TR_ATTN_MAX_Q * (size_t)s->head_dim_v + 15) & ~(size_t)15);
}

#define KV_INLINE_WORK (1u << 20)

void tr_kv_run(tr_pool *pool, tr_pool_fn fn, void *ctx, uint64_t work) {
    if (pool && work >= KV_INLINE_WORK)
        tr_pool_run(pool, fn, ctx);
    else
        fn(ctx, 0, 1);
}

enum { PASS_EXACT, PASS_CHUNK, PASS_FINAL };

typedef struct attn_job {
    const tr_kv *kv;
    tr_kv_pooled *P;
    int pass;
    bool first;          /* PASS_CHUNK: the first chunk (initialise the state) */
    float *keep;         /* h2o: the scaled scores per head, [n_head][n_ctx] (NULL: not kept) */
    const uint8_t *skip; /* entries read only to join reads: not attended (NULL: none) */
    int32_t rows;
    const float *q;
    size_t q_stride;
    float scale;
    const float *sinks;
    float *out;
    size_t out_stride;
    /* rows > 1: tiles of rows_per_block rows × heads_per_task query heads of a KV head, n_sub
     * tiles per KV head and row block */
    int32_t rows_per_block, n_blocks, heads_per_task, n_sub;
    int32_t c0, c1; /* chunk: indices [c0, c1) of the gathered list ... */
    int32_t slot0;  /* ... held in working-set slots slot0 + (i - c0) */
    atomic_int_fast64_t next;
} attn_job;

static inline const uint16_t *ws_k(const tr_kv_store *st, int32_t hdk, int32_t slot, int32_t g) {
    return (const uint16_t *)(st->ws + (size_t)slot * st->rec) + (size_t)g * hdk;
}
static inline const uint16_t *ws_v(const tr_kv_store *st, int32_t hdv, int32_t slot, int32_t g) {
    return (const uint16_t *)(st->ws + (size_t)slot * st->rec + st->krec) + (size_t)g * hdv;
}

/* Each (row, head) walks its rows of the working set at the stride of a whole record (16 KiB for
 * a 7B-like shape): the hardware prefetchers do not follow that, so every row would be a demand
 * miss. Fetch the row a few tokens ahead (a GCC/Clang builtin; no ISA intrinsics). */
#define KV_PF_AHEAD 6
static inline void prefetch_row(const void *p, size_t bytes) {
#if defined(__GNUC__)
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
#else
    (void)p;
    (void)bytes;
#endif
}

static void attend_one(attn_job *j, int ith, int32_t r, int32_t h) {
    const tr_kv *kv = j->kv;
    tr_kv_pooled *P = j->P;
    const tr_kv_store *st = &P->st;
    const int32_t hdk = kv->shape.head_dim_k, hdv = kv->shape.head_dim_v;
    const int32_t g = h / (kv->shape.n_head / kv->shape.n_head_kv), nh = kv->shape.n_head;
    float *out = j->out + (size_t)r * j->out_stride + (size_t)h * hdv;
    float *m_st = &P->st_m[(size_t)r * nh + h];
    double *l_st = &P->st_l[(size_t)r * nh + h];
    const bool has_sink = j->sinks != NULL;
    const float sink = has_sink ? j->sinks[h] : -INFINITY;

    if (j->pass == PASS_FINAL) {
        const float inv = *l_st > 0.0 ? (float)(1.0 / *l_st) : 0.0f;
        for (int32_t d = 0; d < hdv; d++) out[d] *= inv;
        return;
    }

    int32_t lo = P->vlo[r], hi = P->vhi[r];
    if (j->pass == PASS_CHUNK) {
        if (j->first) {
            *m_st = sink;
            *l_st = has_sink ? 1.0 : 0.0;
            memset(out, 0, (size_t)hdv * sizeof(float));
        }
        if (lo < j->c0) lo = j->c0;
        if (hi > j->c1) hi = j->c1;
    }
    const int32_t n = hi > lo ? hi - lo : 0;
    const int32_t sbase = j->slot0 - j->c0; /* slot of list index i: sbase + i */

    /* the thread's scratch: scores [ws_cap], weights as F16 [ws_cap], the query as F16 [hdk] */
    float *sc = P->th_k + (size_t)ith * P->th_floats;
    uint16_t *p16 = (uint16_t *)(sc + st->ws_cap);
    uint16_t *q16 = p16 + st->ws_cap;
    const float *q = j->q + (size_t)r * j->q_stride + (size_t)h * hdk;
    for (int32_t d = 0; d < hdk; d++) q16[d] = tr_f32_to_f16(q[d]);
    const tr_vec_dot_fn dot16 = kv->kern->vec_dot[TR_TYPE_F16];
    const tr_axpy_f16_fn axpy = tr_axpy_f16_of(kv->kern); /* out += p * v row */

    float mx = -INFINITY;
    const size_t kbytes = (size_t)hdk * 2, vbytes = (size_t)hdv * 2;
    for (int32_t i = 0; i < n; i++) {
        float v = -INFINITY;
        if (i + KV_PF_AHEAD < n) prefetch_row(ws_k(st, hdk, sbase + lo + i + KV_PF_AHEAD, g), kbytes);
        if (!j->skip || !j->skip[lo + i]) {
            dot16(hdk, &v, ws_k(st, hdk, sbase + lo + i, g), q16);
            v *= j->scale;
        }
        sc[i] = v;
        if (v > mx) mx = v;
    }
    if (j->keep) {
        float *hs = j->keep + (size_t)h * (size_t)kv->shape.n_ctx;
        memcpy(hs + lo, sc, (size_t)n * sizeof(float));
    }

    if (j->pass == PASS_EXACT) {
        memset(out, 0, (size_t)hdv * sizeof(float));
        if (sink > mx) mx = sink;
        if (mx == -INFINITY) { /* no keys and no sink: nothing to attend */
            *m_st = mx;
            *l_st = 0.0;
            return;
        }
        double sum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            const float e = expf(sc[i] - mx);
            sc[i] = e;
            sum += (double)e;
        }
        if (has_sink) sum += (double)expf(sink - mx);
        *m_st = mx;
        *l_st = sum;
        const float inv = (float)(1.0 / sum);
        for (int32_t i = 0; i < n; i++) p16[i] = tr_f32_to_f16(sc[i] * inv);
        /* a probability that rounds to zero adds exactly nothing: skip its row */
        for (int32_t i = 0; i < n; i++) {
            if (i + KV_PF_AHEAD < n && p16[i + KV_PF_AHEAD])
                prefetch_row(ws_v(st, hdv, sbase + lo + i + KV_PF_AHEAD, g), vbytes);
            if (p16[i]) axpy(hdv, out, ws_v(st, hdv, sbase + lo + i, g), tr_kv_f16[p16[i]]);
        }
        return;
    }

    /* PASS_CHUNK: online softmax */
    if (!n) return;
    float m = *m_st;
    double l = *l_st;
    if (mx > m) {
        const float f = m == -INFINITY ? 0.0f : expf(m - mx);
        for (int32_t d = 0; d < hdv; d++) out[d] *= f;
        l *= (double)f;
        m = mx;
    }
    if (m == -INFINITY) return; /* only entries that are not attended */
    for (int32_t i = 0; i < n; i++) {
        const float e = expf(sc[i] - m);
        l += (double)e;
        const uint16_t e16 = tr_f32_to_f16(e);
        if (i + KV_PF_AHEAD < n) prefetch_row(ws_v(st, hdv, sbase + lo + i + KV_PF_AHEAD, g), vbytes);
        if (e16) axpy(hdv, out, ws_v(st, hdv, sbase + lo + i, g), tr_kv_f16[e16]);
    }
    *m_st = m;
    *l_st = l;
}

/* Rows [r0, r1) × query heads [h0, h1) of KV head kvh (a prefill chunk) as one tile of the
 * attention kernel (kernels.h attn_f16), the full policy's: each block of the list's keys and
 * values is converted once for the whole tile, where one pass per (row, head) walked the list at
 * the stride of a record and made a long chunk's attention bound by memory. The working set's
 * slots hold K then V per record, so the kernel reads K and V as rows at the record's stride.
 * PASS_EXACT: the tile's softmax is the whole one. PASS_CHUNK: the kernel attends the chunk's
 * part of each row's range, and its normalised output, max and denominator are merged into the
 * row's running state (online softmax; the sink was counted when the state was initialised). */
static void attend_tile(attn_job *j, int ith, int32_t r0, int32_t r1, int32_t h0, int32_t h1) {
    const tr_kv *kv = j->kv;
    tr_kv_pooled *P = j->P;
    const tr_kv_store *st = &P->st;
    const int32_t hdk = kv->shape.head_dim_k, hdv = kv->shape.head_dim_v, nh = kv->shape.n_head;
    const int32_t g = h0 / (nh / kv->shape.n_head_kv);
    const bool chunk = j->pass == PASS_CHUNK;
    float *scratch = P->th_k + (size_t)ith * P->th_floats;
    float *tmp = scratch + P->th_attn; /* [TR_ATTN_MAX_Q][hdv]: a chunk's outputs */
    tr_attn_q qs[TR_ATTN_MAX_Q];
    float cm[TR_ATTN_MAX_Q];
    double cl[TR_ATTN_MAX_Q];
    int32_t qr[TR_ATTN_MAX_Q], qh[TR_ATTN_MAX_Q]; /* each query's row and head */
    int n = 0;
    for (int32_t r = r0; r < r1; r++)
        for (int32_t h = h0; h < h1; h++) {
            float *out = j->out + (size_t)r * j->out_stride + (size_t)h * hdv;
            float *m_st = &P->st_m[(size_t)r * nh + h];
            double *l_st = &P->st_l[(size_t)r * nh + h];
            const float sink = j->sinks ? j->sinks[h] : -INFINITY;
            int32_t lo = P->vlo[r], hi = P->vhi[r];
            if (chunk) {
                if (j->first) {
                    *m_st = sink;
                    *l_st = j->sinks ? 1.0 : 0.0;
                    memset(out, 0, (size_t)hdv * sizeof(float));
                }
                if (lo < j->c0) lo = j->c0;
                if (hi > j->c1) hi = j->c1;
            }
            if (hi <= lo) { /* no key of this row here */
                if (!chunk) { /* attend_one's result with no keys: the sink alone, or nothing */
                    memset(out, 0, (size_t)hdv * sizeof(float));
                    *m_st = sink;
                    *l_st = sink == -INFINITY ? 0.0 : 1.0;
                }
                continue;
            }
            qs[n] = (tr_attn_q){
                .q = j->q + (size_t)r * j->q_stride + (size_t)h * hdk,
                .out = chunk ? tmp + (size_t)n * hdv : out,
                .lo = lo - j->c0, /* the kernel's positions: slots from slot0 */
                .hi = hi - 1 - j->c0,
                .sink = chunk ? -INFINITY : sink,
                .max = chunk ? &cm[n] : m_st,
                .sum = chunk ? &cl[n] : l_st,
            };
            qr[n] = r;
            qh[n] = h;
            n++;
        }
    if (!n) return;
    const tr_attn_kv akv = {
        .k = ws_k(st, hdk, j->slot0, g),
        .k_pos = st->rec / 2,
        .v = ws_v(st, hdv, j->slot0, g),
        .v_pos = st->rec / 2,
        .v_dim = 1,
        .hd_k = hdk,
        .hd_v = hdv,
        .scale = j->scale,
    };
    tr_attn_f16_of(kv->kern)(n, qs, &akv, scratch);
    if (!chunk) return;
    for (int i = 0; i < n; i++) {
        const int32_t r = qr[i], h = qh[i];
        float *out = j->out + (size_t)r * j->out_stride + (size_t)h * hdv;
        float *m_st = &P->st_m[(size_t)r * nh + h];
        double *l_st = &P->st_l[(size_t)r * nh + h];
        float m = *m_st;
        double l = *l_st;
        if (cm[i] > m) {
            const float f = m == -INFINITY ? 0.0f : expf(m - cm[i]);
            for (int32_t d = 0; d < hdv; d++) out[d] *= f;
            l *= (double)f;
            m = cm[i];
        }
        /* the chunk's Σ p·v is normalised by its own denominator: weigh it by that, at m */
        const double w = cl[i] * (double)expf(cm[i] - m);
        const float wf = (float)w;
        const float *o = qs[i].out;
        for (int32_t d = 0; d < hdv; d++) out[d] += wf * o[d];
        *m_st = m;
        *l_st = l + w;
    }
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)nth;
    attn_job *j = ctx;
    if (ith >= j->P->n_scratch) return; /* a pool bigger than planned: the others do the work */
    const int32_t nh = j->kv->shape.n_head;
    int64_t b, e;
    if (j->pass != PASS_FINAL && j->rows > 1 && !j->keep && !j->skip) {
        /* tiles as the full policy makes them: the last rows first (they see the most keys,
         * and the threads then finish together) */
        const int32_t G = nh / j->kv->shape.n_head_kv;
        const int64_t per_block = (int64_t)j->kv->shape.n_head_kv * j->n_sub;
        const int64_t total = (int64_t)j->n_blocks * per_block;
        while (tr_claim(&j->next, total, 1, &b, &e))
            for (int64_t i = b; i < e; i++) {
                const int32_t blk = j->n_blocks - 1 - (int32_t)(i / per_block);
                const int32_t kvh = (int32_t)(i % per_block / j->n_sub), sub = (int32_t)(i % j->n_sub);
                const int32_t h0 = kvh * G + sub * j->heads_per_task;
                const int32_t h1 = h0 + j->heads_per_task < (kvh + 1) * G ? h0 + j->heads_per_task
                                                                         : (kvh + 1) * G;
                const int32_t r0 = blk * j->rows_per_block;
                const int32_t r1 = r0 + j->rows_per_block < j->rows ? r0 + j->rows_per_block : j->rows;
                attend_tile(j, ith, r0, r1, h0, h1);
            }
        return;
    }
    const int64_t total = (int64_t)j->rows * nh;
    while (tr_claim(&j->next, total, 2, &b, &e))
        for (int64_t i = b; i < e; i++) attend_one(j, ith, (int32_t)(i / nh), (int32_t)(i % nh));
}

static void run_pass(tr_pool *pool, attn_job *j, int pass) {
    j->pass = pass;
    atomic_store(&j->next, 0);
    const tr_kv_shape *s = &j->kv->shape;
    const uint64_t per =
        pass == PASS_FINAL ? (uint64_t)s->head_dim_v
                           : (uint64_t)(j->c1 - j->c0) * (uint64_t)(s->head_dim_k + s->head_dim_v);
    tr_kv_run(pool, attn_task, j, (uint64_t)j->rows * (uint64_t)s->n_head * per);
}

/* first index of T[0..n) with T[i] >= v */
static int32_t lower_bound(const int32_t *T, int32_t n, int32_t v) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (T[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---- pipelined reads ---------------------------------------------------------------------------
 * A selection that fits is read as pipe chunks, all in flight at once, and attended chunk by
 * chunk (online softmax) as each arrives, while the later ones are still read: the attention's
 * pass over the rows hides under the storage wait (the chunk boundaries depend only on nT and
 * pipe, so host and agent paths attend identically). The storage agent serves one row area's
 * requests one after another, so there the chunks are the parts of one request, published in
 * order: as separate requests, their reads would no longer all be in flight together (measured at
 * 32K: 3.8 s a step against 2.8 s).
 * With --kv-spec the list of layer l goes to half l % 2 of the working set (gathers and agent
 * row area l % 2), so that layer l + 1's list, selected ahead, is read into the other half while
 * layer l is attended. Without it, half 0 is the whole working set. */

static int pipe_np(const tr_kv_pooled *P) {
    return P->pipe < 1 ? 1 : P->pipe > TR_KV_PIPE ? TR_KV_PIPE : P->pipe;
}

int32_t tr_kv_half_cap(const tr_kv_pooled *P) {
    return P->halves ? P->st.ws_cap / 2 : P->st.ws_cap;
}

/* the first working-set slot of a half */
int32_t tr_kv_half_slot0(const tr_kv_pooled *P, int half) { return half * tr_kv_half_cap(P); }

bool tr_kv_pipelined(const tr_kv_pooled *P, int32_t nT) {
    return nT <= tr_kv_half_cap(P) && P->st.cold && nT >= P->pipe_min && pipe_np(P) > 1;
}

static void pipe_bounds(int32_t nT, int np, int32_t *bnd) {
    for (int c = 0; c <= np; c++) bnd[c] = (int32_t)((int64_t)nT * c / np);
}

/* the storage agent reads this store's cold runs (it serves a request's parts in order) */
static bool remote(const tr_kv_pooled *P) { return P->st.reader.start != NULL; }

void tr_kv_pipe_start(tr_kv_pooled *P, int half, int32_t layer, const int32_t *T, int32_t nT) {
    const int np = pipe_np(P);
    int32_t bnd[TR_KV_PIPE + 1];
    pipe_bounds(nT, np, bnd);
    const int32_t slot0 = tr_kv_half_slot0(P, half);
    if (remote(P))
        tr_kv_gather_start_parts(&P->st, half, layer, T, nT, slot0, np, bnd);
    else
        for (int c = 0; c < np; c++)
            tr_kv_gather_start(&P->st, half * TR_KV_PIPE + c, layer, T + bnd[c],
                               bnd[c + 1] - bnd[c], slot0 + bnd[c]);
}

/* chunk c of half's list is in (the agent's last part: the request's wait, its counters) */
static tr_status pipe_wait(tr_kv_pooled *P, int half, int c, tr_error *err) {
    if (remote(P))
        return c + 1 < pipe_np(P) ? tr_kv_gather_wait_part(&P->st, half, c, err)
                                  : tr_kv_gather_wait(&P->st, half, err);
    return tr_kv_gather_wait(&P->st, half * TR_KV_PIPE + c, err);
}

void tr_kv_pipe_drain(tr_kv_pooled *P, int half, int c) {
    if (remote(P))
        tr_kv_gather_wait(&P->st, half, NULL);
    else
        for (int d = c; d < pipe_np(P); d++)
            tr_kv_gather_wait(&P->st, half * TR_KV_PIPE + d, NULL);
}

tr_status tr_kv_attend_list(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t rows,
                            const int32_t *pos, const float *q, size_t q_stride, float scale,
                            const float *sinks, int32_t swa, float *out, size_t out_stride,
                            const tr_kv_list *list, tr_error *err) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    tr_kv_store *S = &P->st;
    const int32_t *T = list->T, nT = list->nT;
    const uint8_t *skip = list->skip;
    const int half = list->half;
    const bool started = list->started;
    for (int32_t r = 0; r < rows; r++) {
        P->vlo[r] = lower_bound(T, nT, tr_kv_visible_lo(pos[r], swa));
        P->vhi[r] = lower_bound(T, nT, pos[r] + 1);
    }
    attn_job j = {.kv = kv,
                  .P = P,
                  .keep = list->keep,
                  .skip = skip,
                  .rows = rows,
                  .q = q,
                  .q_stride = q_stride,
                  .scale = scale,
                  .sinks = sinks,
                  .out = out,
                  .out_stride = out_stride};
    /* the tiles, as the full policy sizes them: fewer tiles than a few per thread -> smaller
     * head groups */
    const int32_t G = kv->shape.n_head / kv->shape.n_head_kv;
    const int nth = pool ? tr_pool_size(pool) : 1;
    j.heads_per_task = G < TR_ATTN_MAX_Q ? G : TR_ATTN_MAX_Q;
    j.rows_per_block = TR_ATTN_MAX_Q / j.heads_per_task;
    j.n_blocks = (rows + j.rows_per_block - 1) / j.rows_per_block;
    while (j.heads_per_task > 1 &&
           (int64_t)j.n_blocks * kv->shape.n_head_kv * ((G + j.heads_per_task - 1) / j.heads_per_task) <
               4 * nth)
        j.heads_per_task = (j.heads_per_task + 1) / 2;
    j.n_sub = (G + j.heads_per_task - 1) / j.heads_per_task;
    atomic_init(&j.next, 0);
    tr_status st;
    if (started || tr_kv_pipelined(P, nT)) {
        const int np = pipe_np(P);
        int32_t bnd[TR_KV_PIPE + 1];
        pipe_bounds(nT, np, bnd);
        const int32_t slot0 = tr_kv_half_slot0(P, half);
        if (!started) tr_kv_pipe_start(P, half, layer, T, nT);
        /* --kv-spec: the next layer's selection, and its reads, while these are in flight */
        if (rows == 1 && list->in_flight &&
            (st = list->in_flight(list->ctx, pool, layer, pos[0], err))) {
            tr_kv_pipe_drain(P, half, 0);
            return st;
        }
        for (int c = 0; c < np; c++) {
            if ((st = pipe_wait(P, half, c, err))) {
                tr_kv_pipe_drain(P, half, c + 1);
                return st;
            }
            j.c0 = bnd[c];
            j.c1 = bnd[c + 1];
            j.slot0 = slot0 + bnd[c];
            j.first = c == 0;
            run_pass(pool, &j, PASS_CHUNK);
        }
        /* once, over the whole selection, as in the single gather below */
        if (list->gathered) list->gathered(list->ctx, layer, T, 0, nT, skip, slot0);
        run_pass(pool, &j, PASS_FINAL);
        return TR_OK;
    }
    if (nT <= S->ws_cap) {
        tr_kv_gather_start(S, 0, layer, T, nT, 0);
        if ((st = tr_kv_gather_wait(S, 0, err))) return st;
        if (list->gathered) list->gathered(list->ctx, layer, T, 0, nT, skip, 0);
        j.c0 = 0;
        j.c1 = nT;
        j.slot0 = 0;
        run_pass(pool, &j, PASS_EXACT);
        return TR_OK;
    }
    const int32_t part = S->ws_cap / 2;
    tr_kv_gather_start(S, 0, layer, T, part, 0);
    for (int32_t c0 = 0, c = 0; c0 < nT; c0 += part, c++) {
        const int32_t c1 = c0 + part < nT ? c0 + part : nT;
        /* read the next chunk into the other half while this one is computed */
        if (c1 < nT) {
            const int32_t n1 = c1 + part < nT ? part : nT - c1;
            tr_kv_gather_start(S, (c + 1) % 2, layer, T + c1, n1, ((c + 1) % 2) * part);
        }
        st = tr_kv_gather_wait(S, c % 2, err);
        if (st) {
            tr_kv_gather_wait(S, (c + 1) % 2, NULL); /* its reads target the working set */
            return st;
        }
        if (list->gathered) list->gathered(list->ctx, layer, T, c0, c1, skip, (c % 2) * part);
        j.c0 = c0;
        j.c1 = c1;
        j.slot0 = (c % 2) * part;
        j.first = c == 0;
        run_pass(pool, &j, PASS_CHUNK);
    }
    run_pass(pool, &j, PASS_FINAL);
    return TR_OK;
}
