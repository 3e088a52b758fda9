/*
 * Attention over what a policy selected: the positions are gathered (hot records copied, cold
 * runs read and verified by the I/O workers) into the compute working set, and every (row, head)
 * attends over its visible part of them, in parallel on the pool.
 *
 * Numerics follow llama.cpp's non-flash path, which the forward pass reproduces: F16 K and V, q
 * rounded to F16, score = dot(k, q) * scale, softmax with the max subtracted and the sum in
 * double (a softmax sink adds exp(sink - max), the max taken over the scores and the sink),
 * probabilities rounded to F16, output = sum of p * v accumulated in float row by row.
 *
 * When the gathered list does not fit the working set (offload over a long context, or a large
 * selection), it is processed in two halves of the working set: the next chunk is read while the
 * current one is computed, with an online softmax (running max and sum, the accumulator rescaled
 * when the max grows). The exponentials are then rounded to F16 relative to the running max
 * instead of after normalisation: the same relative rounding, at a different place.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/kv_internal.h"
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
    tr_kv *kv;
    int pass;
    bool first;          /* PASS_CHUNK: the first chunk (initialise the state) */
    bool keep;           /* h2o: keep the scaled scores in kv->hs */
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

static inline const uint16_t *ws_k(const tr_kv *kv, int32_t slot, int32_t g) {
    return (const uint16_t *)(kv->ws + (size_t)slot * kv->rec) + (size_t)g * kv->shape.head_dim_k;
}
static inline const uint16_t *ws_v(const tr_kv *kv, int32_t slot, int32_t g) {
    return (const uint16_t *)(kv->ws + (size_t)slot * kv->rec + kv->krec) +
           (size_t)g * kv->shape.head_dim_v;
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
    tr_kv *kv = j->kv;
    const int32_t hdk = kv->shape.head_dim_k, hdv = kv->shape.head_dim_v;
    const int32_t g = h / kv->group, nh = kv->shape.n_head;
    float *out = j->out + (size_t)r * j->out_stride + (size_t)h * hdv;
    float *m_st = &kv->st_m[(size_t)r * nh + h];
    double *l_st = &kv->st_l[(size_t)r * nh + h];
    const bool has_sink = j->sinks != NULL;
    const float sink = has_sink ? j->sinks[h] : -INFINITY;

    if (j->pass == PASS_FINAL) {
        const float inv = *l_st > 0.0 ? (float)(1.0 / *l_st) : 0.0f;
        for (int32_t d = 0; d < hdv; d++) out[d] *= inv;
        return;
    }

    int32_t lo = kv->vlo[r], hi = kv->vhi[r];
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

    float *sc = kv->th_s + (size_t)ith * (size_t)kv->ws_cap;
    uint16_t *p16 = kv->th_p + (size_t)ith * (size_t)kv->ws_cap;
    uint16_t *q16 = kv->th_q + (size_t)ith * (size_t)hdk;
    const float *q = j->q + (size_t)r * j->q_stride + (size_t)h * hdk;
    for (int32_t d = 0; d < hdk; d++) q16[d] = tr_f32_to_f16(q[d]);
    const tr_vec_dot_fn dot16 = kv->kern->vec_dot[TR_TYPE_F16];
    const tr_axpy_f16_fn axpy = tr_axpy_f16_of(kv->kern); /* out += p * v row */

    float mx = -INFINITY;
    const size_t kbytes = (size_t)hdk * 2, vbytes = (size_t)hdv * 2;
    for (int32_t i = 0; i < n; i++) {
        float v = -INFINITY;
        if (i + KV_PF_AHEAD < n) prefetch_row(ws_k(kv, sbase + lo + i + KV_PF_AHEAD, g), kbytes);
        if (!j->skip || !j->skip[lo + i]) {
            dot16(hdk, &v, ws_k(kv, sbase + lo + i, g), q16);
            v *= j->scale;
        }
        sc[i] = v;
        if (v > mx) mx = v;
    }
    if (j->keep) {
        float *hs = kv->hs + (size_t)h * (size_t)kv->shape.n_ctx;
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
                prefetch_row(ws_v(kv, sbase + lo + i + KV_PF_AHEAD, g), vbytes);
            if (p16[i]) axpy(hdv, out, ws_v(kv, sbase + lo + i, g), tr_kv_f16[p16[i]]);
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
        if (i + KV_PF_AHEAD < n) prefetch_row(ws_v(kv, sbase + lo + i + KV_PF_AHEAD, g), vbytes);
        if (e16) axpy(hdv, out, ws_v(kv, sbase + lo + i, g), tr_kv_f16[e16]);
    }
    *m_st = m;
    *l_st = l;
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)nth;
    attn_job *j = ctx;
    if (ith >= j->kv->n_scratch) return; /* a pool bigger than planned: the others do the work */
    const int32_t nh = j->kv->shape.n_head;
    const int64_t total = (int64_t)j->rows * nh;
    int64_t b, e;
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

static int pipe_np(const tr_kv *kv) {
    return kv->pipe < 1 ? 1 : kv->pipe > TR_KV_PIPE ? TR_KV_PIPE : kv->pipe;
}

static int32_t half_cap(const tr_kv *kv) {
    return kv->params.spec ? kv->ws_cap / 2 : kv->ws_cap;
}

/* the first working-set slot of a half */
static int32_t half_slot0(const tr_kv *kv, int half) { return half * half_cap(kv); }

static bool pipelined(const tr_kv *kv, int32_t nT) {
    return nT <= half_cap(kv) && kv->cold && nT >= kv->pipe_min && pipe_np(kv) > 1;
}

static void pipe_bounds(int32_t nT, int np, int32_t *bnd) {
    for (int c = 0; c <= np; c++) bnd[c] = (int32_t)((int64_t)nT * c / np);
}

static void pipe_start(tr_kv *kv, int half, int32_t layer, const int32_t *T, int32_t nT) {
    const int np = pipe_np(kv);
    int32_t bnd[TR_KV_PIPE + 1];
    pipe_bounds(nT, np, bnd);
    const int32_t slot0 = half_slot0(kv, half);
    if (kv->csd)
        tr_kv_gather_start_parts(kv, half, layer, T, nT, slot0, np, bnd);
    else
        for (int c = 0; c < np; c++)
            tr_kv_gather_start(kv, half * TR_KV_PIPE + c, layer, T + bnd[c], bnd[c + 1] - bnd[c],
                               slot0 + bnd[c]);
}

/* chunk c of half's list is in (the agent's last part: the request's wait, its counters) */
static tr_status pipe_wait(tr_kv *kv, int half, int c, tr_error *err) {
    if (kv->csd)
        return c + 1 < pipe_np(kv) ? tr_kv_csd_rows_wait_part(kv, half, c, err)
                                   : tr_kv_gather_wait(kv, half, err);
    return tr_kv_gather_wait(kv, half * TR_KV_PIPE + c, err);
}

/* the reads of chunks c.. of half's list, which target the working set, are over */
static void pipe_drain(tr_kv *kv, int half, int c) {
    if (kv->csd)
        tr_kv_gather_wait(kv, half, NULL);
    else
        for (int d = c; d < pipe_np(kv); d++) tr_kv_gather_wait(kv, half * TR_KV_PIPE + d, NULL);
}

void tr_kv_spec_drop(tr_kv *kv) {
    if (kv->pre.layer >= 0 && kv->pre.started) pipe_drain(kv, kv->pre.layer % 2, 0);
    kv->pre.layer = -1;
}

static tr_status spec_ahead(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos,
                            tr_error *err);

/* attention of rows (<= ROW_BLOCK) over the ascending positions T[0..nT) of a layer; half: the
 * working-set half of a pipelined read (--kv-spec), started: its reads were started ahead */
static tr_status attend_list(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t rows,
                             const int32_t *pos, const float *q, size_t q_stride, float scale,
                             const float *sinks, int32_t swa, float *out, size_t out_stride,
                             const int32_t *T, int32_t nT, const uint8_t *skip, bool keep,
                             bool promote, int half, bool started, tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    for (int32_t r = 0; r < rows; r++) {
        kv->vlo[r] = lower_bound(T, nT, tr_kv_visible_lo(pos[r], swa));
        kv->vhi[r] = lower_bound(T, nT, pos[r] + 1);
    }
    attn_job j = {.kv = kv,
                  .keep = keep,
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
    if (started || pipelined(kv, nT)) {
        const int np = pipe_np(kv);
        int32_t bnd[TR_KV_PIPE + 1];
        pipe_bounds(nT, np, bnd);
        const int32_t slot0 = half_slot0(kv, half);
        if (!started) pipe_start(kv, half, layer, T, nT);
        /* --kv-spec: the next layer's selection, and its reads, while these are in flight */
        if (rows == 1 && kv->params.spec && (st = spec_ahead(kv, pool, layer, pos[0], err))) {
            pipe_drain(kv, half, 0);
            return st;
        }
        for (int c = 0; c < np; c++) {
            if ((st = pipe_wait(kv, half, c, err))) {
                pipe_drain(kv, half, c + 1);
                return st;
            }
            j.c0 = bnd[c];
            j.c1 = bnd[c + 1];
            j.slot0 = slot0 + bnd[c];
            j.first = c == 0;
            run_pass(pool, &j, PASS_CHUNK);
        }
        /* once, over the whole selection, as in the single gather below */
        if (promote) tr_kv_bkp_promote(kv, L, T, 0, nT, skip, slot0);
        run_pass(pool, &j, PASS_FINAL);
        return TR_OK;
    }
    if (nT <= kv->ws_cap) {
        tr_kv_gather_start(kv, 0, layer, T, nT, 0);
        if ((st = tr_kv_gather_wait(kv, 0, err))) return st;
        if (promote) tr_kv_bkp_promote(kv, L, T, 0, nT, skip, 0);
        j.c0 = 0;
        j.c1 = nT;
        j.slot0 = 0;
        run_pass(pool, &j, PASS_EXACT);
        return TR_OK;
    }
    const int32_t part = kv->ws_cap / 2;
    tr_kv_gather_start(kv, 0, layer, T, part, 0);
    for (int32_t c0 = 0, c = 0; c0 < nT; c0 += part, c++) {
        const int32_t c1 = c0 + part < nT ? c0 + part : nT;
        /* read the next chunk into the other half while this one is computed */
        if (c1 < nT) {
            const int32_t n1 = c1 + part < nT ? part : nT - c1;
            tr_kv_gather_start(kv, (c + 1) % 2, layer, T + c1, n1, ((c + 1) % 2) * part);
        }
        st = tr_kv_gather_wait(kv, c % 2, err);
        if (st) {
            tr_kv_gather_wait(kv, (c + 1) % 2, NULL); /* its reads target the working set */
            return st;
        }
        if (promote) tr_kv_bkp_promote(kv, L, T, c0, c1, skip, (c % 2) * part);
        j.c0 = c0;
        j.c1 = c1;
        j.slot0 = (c % 2) * part;
        j.first = c == 0;
        run_pass(pool, &j, PASS_CHUNK);
    }
    run_pass(pool, &j, PASS_FINAL);
    return TR_OK;
}

/* Selective policies read scattered runs: join two runs of cold tokens in one page when at most
 * read_gap unselected cold tokens lie between them (those are read, marked in kv->skip and not
 * attended). Writes the joined list to out (n_ctx entries); returns its length. */
static int32_t join_reads(tr_kv *kv, const tr_kv_layer *L, const int32_t *sel, int32_t n,
                          int32_t *out) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t a = sel[i];
        kv->skip[m] = 0;
        out[m++] = a;
        if (i + 1 == n || !kv->cold) continue;
        const int32_t b = sel[i + 1], gap = b - a - 1;
        if (gap < 1 || gap > kv->read_gap || a / TR_KV_PAGE != b / TR_KV_PAGE ||
            L->tok[a].where != TR_KV_TOK_COLD || L->tok[b].where != TR_KV_TOK_COLD)
            continue;
        bool ok = true;
        for (int32_t t = a + 1; t < b; t++) ok = ok && L->tok[t].where == TR_KV_TOK_COLD;
        if (!ok) continue;
        for (int32_t t = a + 1; t < b; t++) {
            kv->skip[m] = 1;
            out[m++] = t;
        }
    }
    return m;
}

/* ---- --kv-spec ---------------------------------------------------------------------------------
 * Layer l + 1's query exists only after layer l is done, so its scoring (and the agent's) and
 * its reads would wait for l's reads to end. With a speculative query for l + 1 (the forward
 * pass: l + 1's query projection of l's input, as InfiniGen does), its selection is made while
 * l's reads are in flight, and its reads are started behind them, so storage never waits for
 * scoring. The selection then differs from the exact one; bench/results/kv-quality.md measures
 * what that costs. */

static double cosine(const float *a, const float *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
}

/* a row's selection at a layer (into kv->sel, n), as a decode step begins there: the layer's
 * placement step and attended range first; the time taken is added to *ns */
static tr_status select_step(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                             bool spec, float scale, int32_t swa, int32_t *n, uint64_t *ns,
                             tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    if (L->moved) tr_kv_bkp_step(kv, L);
    if (pos > L->att_hi) L->att_hi = pos;
    const uint64_t t0 = tr_now_ns();
    *n = 0;
    const tr_status st = tr_kv_select_row(kv, pool, layer, pos, q, spec, scale, swa, n, err);
    *ns += tr_now_ns() - t0;
    return st;
}

/* the list of a selection (kv->sel, n) as it is read: joined runs, in this layer's own buffers
 * with --kv-spec (the next layer's selection reuses the scratch while this one is attended) */
static int32_t make_list(tr_kv *kv, const tr_kv_layer *L, int32_t layer, int32_t n,
                         const int32_t **T, const uint8_t **skip) {
    int32_t nT = n;
    *T = kv->sel;
    *skip = NULL;
    if (kv->read_gap > 0) { /* cand is free once the selection is made */
        nT = join_reads(kv, L, kv->sel, n, kv->cand);
        *T = kv->cand;
        if (nT > n) *skip = kv->skip;
        /* --kv-spec: a joined list too long for its half of the working set would lose the
         * reads ahead (measured at 32K: 3.3 s a step against 2.5 s without --kv-spec); the
         * selection alone is read instead */
        if (kv->params.spec && nT > half_cap(kv) && n <= half_cap(kv)) {
            nT = n;
            *T = kv->sel;
            *skip = NULL;
        }
    }
    if (kv->params.spec) {
        const int h = layer % 2;
        memcpy(kv->plist[h], *T, (size_t)nT * sizeof(int32_t));
        *T = kv->plist[h];
        if (*skip) {
            memcpy(kv->pskip[h], *skip, (size_t)nT);
            *skip = kv->pskip[h];
        }
    }
    return nT;
}

/* during layer's attention of the row at pos: the next layer's selection with the query given
 * for it, and its reads when they fit the other half of the working set */
static tr_status spec_ahead(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos,
                            tr_error *err) {
    const int32_t nl = layer + 1;
    struct spec_in *in = &kv->spec_in[nl % 2];
    if (in->layer != nl || in->rows != 1 || in->pos[0] != pos ||
        kv->pre.layer >= 0 || nl >= kv->shape.n_layer)
        return TR_OK;
    const tr_kv_layer *L = &kv->layers[nl];
    if (L->len != pos) return TR_OK; /* not the step the query was given for */
    int32_t n;
    tr_status st = select_step(kv, pool, nl, pos, in->q, true, in->scale, in->swa, &n,
                               &kv->ahead_ns, err);
    if (st) return st;
    const uint8_t *skip;
    const int32_t *T;
    const int32_t nT = make_list(kv, L, nl, n, &T, &skip);
    kv->pre.layer = nl;
    kv->pre.pos = pos;
    kv->pre.n = n;
    kv->pre.nT = nT;
    kv->pre.skip = skip != NULL;
    kv->pre.q = in->q;
    kv->pre.started = pipelined(kv, nT);
    in->layer = -1;
    kv->spec_rows++;
    if (kv->pre.started) {
        pipe_start(kv, nl % 2, nl, T, nT);
        kv->spec_early++;
    }
    return TR_OK;
}

tr_status tr_kv_spec_query(tr_kv *kv, int32_t layer, int32_t rows, const int32_t *pos,
                           const float *q, size_t q_stride, float scale, int32_t swa,
                           tr_error *err) {
    if (!kv->params.spec)
        return tr_fail(err, TR_E_ARG, "KV: a speculative query without --kv-spec");
    if (layer < 0 || layer >= kv->shape.n_layer || rows < 1 || !pos || !q)
        return tr_fail(err, TR_E_ARG, "KV speculative query: layer %d of %d, %d rows", layer,
                       kv->shape.n_layer, rows);
    kv->spec_in[layer % 2] = (struct spec_in){.layer = layer,
                                              .rows = rows,
                                              .pos = pos,
                                              .q = q,
                                              .stride = q_stride,
                                              .scale = scale,
                                              .swa = swa};
    return TR_OK;
}

/* a list read ahead holds the row's own record as it was before the token was stored: now it is */
static tr_status own_record(tr_kv *kv, int32_t layer, const int32_t *T, int32_t nT, int32_t pos,
                            tr_error *err) {
    const tr_kv_layer *L = &kv->layers[layer];
    if (nT < 1 || T[nT - 1] != pos)
        return tr_fail(err, TR_E_INTERNAL, "KV: layer %d: the list read ahead ends at %d, not %d",
                       layer, nT ? T[nT - 1] : -1, pos);
    uint8_t *dst = kv->ws + ((size_t)half_slot0(kv, layer % 2) + (size_t)nT - 1) * kv->rec;
    if (L->tok[pos].where == TR_KV_TOK_HOT) {
        memcpy(dst, L->hot + (size_t)L->tok[pos].slot * kv->rec, kv->rec);
        return TR_OK;
    }
    return tr_kv_cold_read_sync(kv, layer, pos, 1, dst, err);
}

/* h2o: add this row's attention probabilities (summed over heads) to each attended token */
static void h2o_accumulate(tr_kv *kv, tr_kv_layer *L, const int32_t *T) {
    const int32_t nh = kv->shape.n_head;
    const size_t n_ctx = (size_t)kv->shape.n_ctx;
    for (int32_t i = kv->vlo[0]; i < kv->vhi[0]; i++) {
        float m = 0.0f;
        for (int32_t h = 0; h < nh; h++)
            if (kv->st_l[h] > 0.0)
                m += (float)((double)expf(kv->hs[(size_t)h * n_ctx + (size_t)i] - kv->st_m[h]) /
                             kv->st_l[h]);
        L->mass[T[i]] += m;
    }
}

/* tail (kv_score.c): out = (1 - e) x attention over the selection + the unselected share */
static void add_tail(tr_kv *kv, float *out) {
    const int32_t hdv = kv->shape.head_dim_v;
    double share = 0.0;
    for (int32_t h = 0; h < kv->shape.n_head; h++) {
        share += (double)kv->tail_e[h];
        const float keep = 1.0f - kv->tail_e[h];
        const float *t = kv->tail_o + (size_t)h * kv->hdv_pad;
        float *o = out + (size_t)h * hdv;
        for (int32_t d = 0; d < hdv; d++) o[d] = keep * o[d] + t[d];
    }
    kv->tail_rows++;
    kv->tail_share_sum += share / kv->shape.n_head;
    kv->tail_row = false;
}

tr_status tr_kv_attend_rows(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t rows,
                            const int32_t *pos, const float *q, size_t q_stride, float scale,
                            const float *sinks, int32_t swa, float *out, size_t out_stride,
                            tr_error *err) {
    if (layer < 0 || layer >= kv->shape.n_layer)
        return tr_fail(err, TR_E_ARG, "KV attend: layer %d of %d", layer, kv->shape.n_layer);
    tr_kv_layer *L = &kv->layers[layer];
    if (rows < 1 || !pos || !q || !out) return tr_fail(err, TR_E_ARG, "KV attend: %d rows", rows);
    for (int32_t r = 0; r < rows; r++)
        if (pos[r] < 0 || pos[r] >= L->len)
            return tr_fail(err, TR_E_ARG,
                           "KV attend: row %d at position %d, layer %d holds %d positions", r,
                           pos[r], layer, L->len);
    const uint64_t t0 = tr_now_ns();
    uint64_t t_score = 0, selected = 0;
    kv->ahead_ns = 0;
    const tr_kv_policy pol = kv->params.policy;
    const bool selective =
        (pol == TR_KV_H2O || pol == TR_KV_QUEST || pol == TR_KV_TIERED) && kv->params.alpha < 1.0f;
    tr_status st = TR_OK;
    if (!selective) {
        /* every visible key: one gather shared by a block of rows */
        for (int32_t r0 = 0; r0 < rows && !st; r0 += TR_KV_ROW_BLOCK) {
            const int32_t nr = rows - r0 < TR_KV_ROW_BLOCK ? rows - r0 : TR_KV_ROW_BLOCK;
            int32_t lo = INT32_MAX, hi = -1;
            for (int32_t r = r0; r < r0 + nr; r++) {
                const int32_t a = tr_kv_visible_lo(pos[r], swa);
                if (a < lo) lo = a;
                if (pos[r] > hi) hi = pos[r];
            }
            int32_t nT = 0;
            for (int32_t t = lo; t <= hi; t++)
                if (L->tok[t].where != TR_KV_TOK_EVICTED) kv->sel[nT++] = t;
            st = attend_list(kv, pool, layer, nr, pos + r0, q + (size_t)r0 * q_stride, q_stride,
                             scale, sinks, swa, out + (size_t)r0 * out_stride, out_stride, kv->sel,
                             nT, NULL, false, false, 0, false, err);
            for (int32_t r = 0; r < nr; r++) selected += (uint64_t)(kv->vhi[r] - kv->vlo[r]);
        }
    } else if (kv->vrow && sinks) {
        st = tr_fail(err, TR_E_ARG, "--kv-tail: this model's attention has sinks, which the "
                                    "estimate does not handle; use --kv-tail 0");
    } else {
        /* each row is one decode step: its own selection; h2o evicts after each */
        const bool spec = kv->params.spec;
        const size_t nq = (size_t)kv->shape.n_head * (size_t)kv->shape.head_dim_k;
        for (int32_t r = 0; r < rows && !st; r++) {
            const float *qr = q + (size_t)r * q_stride;
            const int32_t *T;
            const uint8_t *skip;
            int32_t n, nT;
            bool started = false;
            if (spec && rows == 1 && kv->pre.layer == layer && kv->pre.pos == pos[r]) {
                /* selected during the previous layer (spec_ahead) */
                n = kv->pre.n;
                nT = kv->pre.nT;
                T = kv->plist[layer % 2];
                skip = kv->pre.skip ? kv->pskip[layer % 2] : NULL;
                started = kv->pre.started;
                kv->spec_cos_sum += cosine(kv->pre.q, qr, nq);
                kv->pre.layer = -1; /* consumed: its reads are awaited below */
                if (started && (st = own_record(kv, layer, T, nT, pos[r], err))) {
                    pipe_drain(kv, layer % 2, 0);
                    break;
                }
            } else {
                tr_kv_spec_drop(kv); /* one made for another step */
                /* a query given for this layer and row (tr_kv_spec_query, several rows) */
                const struct spec_in *in = &kv->spec_in[layer % 2];
                const float *qs = spec && in->layer == layer && r < in->rows && in->pos[r] == pos[r]
                                      ? in->q + (size_t)r * in->stride
                                      : NULL;
                st = select_step(kv, pool, layer, pos[r], qs ? qs : qr, qs != NULL, scale, swa, &n,
                                 &t_score, err);
                if (st) break;
                if (qs) {
                    kv->spec_rows++;
                    kv->spec_cos_sum += cosine(qs, qr, nq);
                }
                nT = make_list(kv, L, layer, n, &T, &skip);
            }
            st = attend_list(kv, pool, layer, 1, pos + r, qr, q_stride, scale, sinks, swa,
                             out + (size_t)r * out_stride, out_stride, T, nT, skip,
                             pol == TR_KV_H2O, L->moved != NULL, spec ? layer % 2 : 0, started,
                             err);
            if (st) break;
            if (kv->tail_row) add_tail(kv, out + (size_t)r * out_stride);
            selected += (uint64_t)n;
            if (pol == TR_KV_H2O) {
                h2o_accumulate(kv, L, T);
                tr_kv_h2o_evict(kv, layer, pos[r]);
            }
        }
        if (st) tr_kv_spec_drop(kv);
    }
    if (kv->spec_in[layer % 2].layer == layer) kv->spec_in[layer % 2].layer = -1; /* used */
    t_score += kv->ahead_ns;
    L->selected = selected;
    kv->steps++;
    kv->score_ns += t_score;
    kv->attn_ns += tr_now_ns() - t0 - t_score;
    return st;
}
