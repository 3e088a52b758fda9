/*
 * h2o: accumulated attention decides which tokens are evicted for good. Every row attends every
 * token still kept (its selection chooses all of them); the attention probabilities it gave, summed
 * over heads, are added to each token's mass, and then the lowest masses outside the sinks and the
 * window are evicted until alpha of the context is kept, exactly as sequential decoding would.
 */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/kv_pooled.h"

typedef struct h2o {
    tr_kv_pooled P;
    float *mass; /* [n_layer][n_ctx] accumulated attention probability (sum over heads) */
    float *hs;   /* [n_head][n_ctx] the row's scaled scores, by list index */
} h2o;

float *tr_kv_h2o_mass(const tr_kv *kv, int32_t layer) {
    const h2o *H = kv->pol;
    return H->mass + (size_t)layer * (size_t)kv->shape.n_ctx;
}

/* add this row's attention probabilities (summed over heads) to each attended token */
static void accumulate(tr_kv *kv, float *mass, const int32_t *T) {
    const h2o *H = kv->pol;
    const tr_kv_pooled *P = &H->P;
    const int32_t nh = kv->shape.n_head;
    const size_t n_ctx = (size_t)kv->shape.n_ctx;
    for (int32_t i = P->vlo[0]; i < P->vhi[0]; i++) {
        float m = 0.0f;
        for (int32_t h = 0; h < nh; h++)
            if (P->st_l[h] > 0.0)
                m += (float)((double)expf(H->hs[(size_t)h * n_ctx + (size_t)i] - P->st_m[h]) /
                             P->st_l[h]);
        mass[T[i]] += m;
    }
}

static void evict(tr_kv *kv, int32_t layer, int32_t pos) {
    h2o *H = kv->pol;
    tr_kv_pooled *P = &H->P;
    tr_kv_slayer *L = &P->st.layers[layer];
    const float *mass = tr_kv_h2o_mass(kv, layer);
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
    int32_t *cand = P->cand, nc = 0;
    float *neg = P->cscore;
    for (int32_t t = sink_hi; t < win_lo; t++)
        if (L->tok[t].where != TR_KV_TOK_EVICTED) {
            neg[nc] = -mass[t];
            cand[nc++] = t;
        }
    int32_t excess = kept - budget < nc ? kept - budget : nc;
    int32_t *idx = P->sel;
    for (int32_t i = 0; i < nc; i++) idx[i] = i;
    tr_kv_topk(neg, idx, nc, excess);
    for (int32_t i = 0; i < excess; i++) tr_kv_store_evict(&P->st, L, cand[idx[i]]);
}

/* every token still kept */
static tr_status select_row(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                            bool spec, float scale, int32_t swa, int32_t *n, tr_error *err) {
    (void)pool;
    (void)q;
    (void)scale;
    (void)err;
    tr_kv_cands c;
    tr_kv_select_begin(kv, layer, pos, spec, swa, &c);
    *n = tr_kv_select_end(kv, layer, &c, true);
    return TR_OK;
}

static tr_status attend_selected(tr_kv *kv, tr_pool *pool, const tr_kv_query *q,
                                 uint64_t *selected, uint64_t *score_ns, tr_error *err) {
    h2o *H = kv->pol;
    tr_kv_pooled *P = &H->P;
    const int32_t layer = q->layer;
    float *mass = tr_kv_h2o_mass(kv, layer);
    tr_status st = TR_OK;
    /* each row is one decode step: every kept token, then eviction */
    for (int32_t r = 0; r < q->rows && !st; r++) {
        const uint64_t t0 = tr_now_ns();
        int32_t n;
        select_row(kv, pool, layer, q->pos[r], NULL, false, q->scale, q->swa, &n, err);
        *score_ns += tr_now_ns() - t0;
        tr_kv_list list = {.keep = H->hs};
        list.nT = tr_kv_join_reads(P, layer, n, &list.T, &list.skip);
        st = tr_kv_attend_list(kv, pool, layer, 1, q->pos + r, q->q + (size_t)r * q->q_stride,
                               q->q_stride, q->scale, q->sinks, q->swa,
                               q->out + (size_t)r * q->out_stride, q->out_stride, &list, err);
        if (st) break;
        *selected += (uint64_t)n;
        accumulate(kv, mass, list.T);
        evict(kv, layer, q->pos[r]);
    }
    return st;
}

static void appended(tr_kv *kv, int32_t layer, int32_t pos, const uint8_t *rec) {
    (void)rec;
    tr_kv_h2o_mass(kv, layer)[pos] = 0.0f;
}

static void dropped(tr_kv *kv, int32_t layer, int32_t n) {
    const h2o *H = kv->pol;
    float *mass = tr_kv_h2o_mass(kv, layer);
    for (int32_t p = n; p < H->P.st.layers[layer].len; p++) mass[p] = 0.0f;
}

static void h2o_free(tr_kv *kv) {
    h2o *H = kv->pol;
    free(H->mass);
    free(H->hs);
}

static const tr_kv_pooled_ops h2o_ops = {.appended = appended,
                                         .select_row = select_row,
                                         .attend_selected = attend_selected,
                                         .dropped = dropped,
                                         .free = h2o_free};

tr_status tr_kv_h2o_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err) {
    h2o *H = calloc(1, sizeof *H);
    if (!H) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    kv->pol = H;
    kv->ops = &tr_kv_pooled_kv_ops;
    uint64_t total = 0;
    tr_status st = tr_kv_pooled_init(kv, &H->P, pl, &h2o_ops, true, &total, err);
    if (st) return st;
    const size_t n_ctx = (size_t)kv->shape.n_ctx;
    H->mass = tr_kv_alloc((size_t)kv->shape.n_layer * n_ctx * 4, 0, &total);
    H->hs = tr_kv_alloc((size_t)kv->shape.n_head * n_ctx * 4, 0, &total);
    if (!H->mass || !H->hs)
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl->dram);
    return tr_kv_store_open(&H->P.st, &kv->shape, err);
}
