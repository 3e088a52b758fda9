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

    float *sc = P->th_s + (size_t)ith * (size_t)st->ws_cap;
    uint16_t *p16 = P->th_p + (size_t)ith * (size_t)st->ws_cap;
    uint16_t *q16 = P->th_q + (size_t)ith * (size_t)hdk;
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

/* A block of up to TR_KV_TILE_ROWS rows of one head (a prefill chunk): the same computation as
 * attend_one for each row, with every key and value row of the list loaded once for the whole
 * block instead of once per row (a row walks its list at the stride of a record, so one pass per
 * row made a long chunk's attention bound by memory). Each row's scores, softmax and ascending
 * sum of values are attend_one's, so the outputs are identical to it. */
static void attend_block(attn_job *j, int ith, int32_t r0, int32_t nr, int32_t h) {
    const tr_kv *kv = j->kv;
    tr_kv_pooled *P = j->P;
    const tr_kv_store *st = &P->st;
    const int32_t hdk = kv->shape.head_dim_k, hdv = kv->shape.head_dim_v;
    const int32_t g = h / (kv->shape.n_head / kv->shape.n_head_kv), nh = kv->shape.n_head;
    const bool has_sink = j->sinks != NULL;
    const float sink = has_sink ? j->sinks[h] : -INFINITY;
    const size_t cap = (size_t)st->ws_cap;
    float *sc = P->th_s + (size_t)ith * cap * TR_KV_TILE_ROWS;
    uint16_t *p16 = P->th_p + (size_t)ith * cap * TR_KV_TILE_ROWS;
    uint16_t *q16 = P->th_q + (size_t)ith * (size_t)hdk * TR_KV_TILE_ROWS;
    const tr_vec_dot_fn dot16 = kv->kern->vec_dot[TR_TYPE_F16];
    const tr_axpy_f16_fn axpy = tr_axpy_f16_of(kv->kern);
    const int32_t sbase = j->slot0 - j->c0;
    int32_t lo[TR_KV_TILE_ROWS], hi[TR_KV_TILE_ROWS], ulo = INT32_MAX, uhi = INT32_MIN;
    float *out[TR_KV_TILE_ROWS];
    bool live[TR_KV_TILE_ROWS]; /* the row sums values */
    for (int32_t k = 0; k < nr; k++) {
        const int32_t r = r0 + k;
        lo[k] = P->vlo[r];
        hi[k] = P->vhi[r];
        out[k] = j->out + (size_t)r * j->out_stride + (size_t)h * hdv;
        if (j->pass == PASS_CHUNK) {
            if (j->first) {
                P->st_m[(size_t)r * nh + h] = sink;
                P->st_l[(size_t)r * nh + h] = has_sink ? 1.0 : 0.0;
                memset(out[k], 0, (size_t)hdv * sizeof(float));
            }
            if (lo[k] < j->c0) lo[k] = j->c0;
            if (hi[k] > j->c1) hi[k] = j->c1;
        }
        if (hi[k] < lo[k]) hi[k] = lo[k];
        if (hi[k] > lo[k]) {
            if (lo[k] < ulo) ulo = lo[k];
            if (hi[k] > uhi) uhi = hi[k];
        }
        const float *q = j->q + (size_t)r * j->q_stride + (size_t)h * hdk;
        for (int32_t d = 0; d < hdk; d++) q16[(size_t)k * hdk + d] = tr_f32_to_f16(q[d]);
    }
    /* scores: each key row once for the block */
    for (int32_t t = ulo; t < uhi; t++) {
        const uint16_t *kr = ws_k(st, hdk, sbase + t, g);
        const bool skipped = j->skip && j->skip[t];
        for (int32_t k = 0; k < nr; k++) {
            if (t < lo[k] || t >= hi[k]) continue;
            float v = -INFINITY;
            if (!skipped) {
                dot16(hdk, &v, kr, q16 + (size_t)k * hdk);
                v *= j->scale;
            }
            sc[(size_t)k * cap + (size_t)(t - lo[k])] = v;
        }
    }
    /* per row: the softmax (exact) or the online-softmax step (chunk) into F16 weights */
    for (int32_t k = 0; k < nr; k++) {
        const int32_t r = r0 + k, n = hi[k] - lo[k];
        float *s = sc + (size_t)k * cap;
        uint16_t *p = p16 + (size_t)k * cap;
        float *m_st = &P->st_m[(size_t)r * nh + h];
        double *l_st = &P->st_l[(size_t)r * nh + h];
        float mx = -INFINITY;
        for (int32_t i = 0; i < n; i++)
            if (s[i] > mx) mx = s[i];
        live[k] = false;
        if (j->pass == PASS_EXACT) {
            memset(out[k], 0, (size_t)hdv * sizeof(float));
            if (sink > mx) mx = sink;
            if (mx == -INFINITY) {
                *m_st = mx;
                *l_st = 0.0;
                continue;
            }
            double sum = 0.0;
            for (int32_t i = 0; i < n; i++) {
                const float e = expf(s[i] - mx);
                s[i] = e;
                sum += (double)e;
            }
            if (has_sink) sum += (double)expf(sink - mx);
            *m_st = mx;
            *l_st = sum;
            const float inv = (float)(1.0 / sum);
            for (int32_t i = 0; i < n; i++) p[i] = tr_f32_to_f16(s[i] * inv);
            live[k] = n > 0;
            continue;
        }
        if (!n) continue;
        float m = *m_st;
        double l = *l_st;
        if (mx > m) {
            const float f = m == -INFINITY ? 0.0f : expf(m - mx);
            for (int32_t d = 0; d < hdv; d++) out[k][d] *= f;
            l *= (double)f;
            m = mx;
        }
        if (m == -INFINITY) continue;
        for (int32_t i = 0; i < n; i++) {
            const float e = expf(s[i] - m);
            l += (double)e;
            p[i] = tr_f32_to_f16(e);
        }
        *m_st = m;
        *l_st = l;
        live[k] = true;
    }
    /* values: each value row once for the block, each row's sum in ascending key order */
    for (int32_t t = ulo; t < uhi; t++) {
        const uint16_t *vr = ws_v(st, hdv, sbase + t, g);
        for (int32_t k = 0; k < nr; k++) {
            if (!live[k] || t < lo[k] || t >= hi[k]) continue;
            const uint16_t w = p16[(size_t)k * cap + (size_t)(t - lo[k])];
            if (w) axpy(hdv, out[k], vr, tr_kv_f16[w]);
        }
    }
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)nth;
    attn_job *j = ctx;
    if (ith >= j->P->n_scratch) return; /* a pool bigger than planned: the others do the work */
    const int32_t nh = j->kv->shape.n_head;
    int64_t b, e;
    if (j->pass != PASS_FINAL && j->rows > 1 && !j->keep) {
        const int32_t nb = (j->rows + TR_KV_TILE_ROWS - 1) / TR_KV_TILE_ROWS;
        while (tr_claim(&j->next, (int64_t)nb * nh, 1, &b, &e))
            for (int64_t i = b; i < e; i++) {
                const int32_t r0 = (int32_t)(i / nh) * TR_KV_TILE_ROWS;
                const int32_t nr = j->rows - r0 < TR_KV_TILE_ROWS ? j->rows - r0 : TR_KV_TILE_ROWS;
                attend_block(j, ith, r0, nr, (int32_t)(i % nh));
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
