/*
 * quest: pages of TR_KV_PAGE tokens with per-channel min/max key bounds; a row attends the pages
 * whose upper bound of q.k (the max over heads: a page can matter to any one head) is highest,
 * taking whole pages until they hold its share of the candidates.
 */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/kv_pooled.h"
#include "tensor/fp16.h"

typedef struct quest {
    tr_kv_pooled P;
    uint16_t *pmin, *pmax; /* [n_layer][n_kv][n_pages][hdk] F16 per-channel key bounds per page */
    int32_t *pg_order;     /* [n_pages] */
    float *qf;             /* [n_head][hdk] the row's query heads rounded to F16 */
} quest;

static size_t bound_off(const tr_kv *kv, int32_t layer, int32_t kvh, int32_t page) {
    const quest *Q = kv->pol;
    const size_t np = (size_t)Q->P.st.n_pages, hdk = (size_t)kv->shape.head_dim_k;
    return ((((size_t)layer * (size_t)kv->shape.n_head_kv) + (size_t)kvh) * np + (size_t)page) *
           hdk;
}

static void apply(tr_kv *kv, int32_t layer, int32_t pos, const uint8_t *rec, bool first) {
    quest *Q = kv->pol;
    const int32_t hdk = kv->shape.head_dim_k, page = pos / TR_KV_PAGE;
    const uint16_t *K = (const uint16_t *)rec;
    for (int32_t g = 0; g < kv->shape.n_head_kv; g++) {
        const size_t off = bound_off(kv, layer, g, page);
        uint16_t *mn = Q->pmin + off, *mx = Q->pmax + off;
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

static void appended(tr_kv *kv, int32_t layer, int32_t pos, const uint8_t *rec) {
    apply(kv, layer, pos, rec, pos % TR_KV_PAGE == 0);
}

/* the page that is open again after a truncate keeps bounds of the dropped tokens: recompute */
static tr_status truncated(tr_kv *kv, int32_t layer, int32_t len, int32_t n, tr_error *err) {
    (void)len;
    if (!(n % TR_KV_PAGE)) return TR_OK;
    quest *Q = kv->pol;
    const int32_t page = n / TR_KV_PAGE;
    for (int32_t p = page * TR_KV_PAGE; p < Q->P.st.layers[layer].len; p++) {
        const uint8_t *rec;
        tr_status st = tr_kv_store_record(&Q->P.st, layer, p, Q->P.st.rec_tmp, &rec, err);
        if (st) return st;
        apply(kv, layer, p, rec, p == page * TR_KV_PAGE);
    }
    return TR_OK;
}

float tr_kv_quest_bound(const tr_kv *kv, int32_t layer, int32_t page, int32_t kvh,
                        const float *q16) {
    const quest *Q = kv->pol;
    const int32_t hdk = kv->shape.head_dim_k;
    const size_t off = bound_off(kv, layer, kvh, page);
    const uint16_t *mn = Q->pmin + off, *mx = Q->pmax + off;
    float s = 0.0f;
    for (int32_t c = 0; c < hdk; c++) s += q16[c] * tr_kv_f16[q16[c] >= 0.0f ? mx[c] : mn[c]];
    return s;
}

typedef struct quest_job {
    const tr_kv *kv;
    int32_t layer;
    const int32_t *pages;
    int32_t n;
    float *out;
    atomic_int_fast64_t next;
} quest_job;

static void quest_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    quest_job *j = ctx;
    const tr_kv *kv = j->kv;
    const quest *Q = kv->pol;
    const int32_t group = kv->shape.n_head / kv->shape.n_head_kv;
    int64_t b, e;
    while (tr_claim(&j->next, j->n, 16, &b, &e))
        for (int64_t i = b; i < e; i++) {
            float acc = -INFINITY;
            for (int32_t h = 0; h < kv->shape.n_head; h++) {
                const float v = tr_kv_quest_bound(kv, j->layer, j->pages[i], h / group,
                                                  Q->qf + (size_t)h * kv->shape.head_dim_k);
                acc = tr_kv_maxf(acc, v);
            }
            j->out[i] = acc;
        }
}

static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *s = ctx;
    const float x = s[*(const int32_t *)a], y = s[*(const int32_t *)b];
    return x > y ? -1 : x < y ? 1 : (*(const int32_t *)a - *(const int32_t *)b);
}

/* mark the candidates of the pages with the highest bounds until they hold c->k */
static void choose(tr_kv *kv, tr_pool *pool, int32_t layer, const float *q, const tr_kv_cands *c) {
    quest *Q = kv->pol;
    tr_kv_pooled *P = &Q->P;
    const tr_kv_slayer *L = &P->st.layers[layer];
    const int32_t hdk = kv->shape.head_dim_k;
    /* query heads rounded to F16, as the attention sees them */
    for (int32_t h = 0; h < kv->shape.n_head; h++)
        for (int32_t d = 0; d < hdk; d++)
            Q->qf[(size_t)h * hdk + d] = tr_kv_f16[tr_f32_to_f16(q[(size_t)h * hdk + d])];
    /* pages with candidates, how many each holds */
    int32_t *pages = P->sel, n_pg = 0;
    for (int32_t i = 0; i < c->n_cand; i++)
        if (!n_pg || P->cand[i] / TR_KV_PAGE != pages[n_pg - 1])
            pages[n_pg++] = P->cand[i] / TR_KV_PAGE;
    quest_job j = {.kv = kv, .layer = layer, .pages = pages, .n = n_pg, .out = P->cscore};
    atomic_init(&j.next, 0);
    tr_kv_run(pool, quest_task, &j,
              (uint64_t)n_pg * (uint64_t)kv->shape.n_head * (uint64_t)kv->shape.head_dim_k);
    /* rank pages by bound; take them until they hold k candidates */
    int32_t *order = Q->pg_order;
    for (int32_t i = 0; i < n_pg; i++) order[i] = i;
    qsort_r(order, (size_t)n_pg, sizeof *order, cmp_desc, P->cscore);
    int32_t got = 0;
    for (int32_t r = 0; r < n_pg && got < c->k; r++) {
        const int32_t pg = pages[order[r]];
        const int32_t a = pg * TR_KV_PAGE > c->c_lo ? pg * TR_KV_PAGE : c->c_lo;
        const int32_t b = (pg + 1) * TR_KV_PAGE < c->win_lo ? (pg + 1) * TR_KV_PAGE : c->win_lo;
        for (int32_t t = a; t < b; t++)
            if (L->tok[t].where != TR_KV_TOK_EVICTED) {
                P->mark[t] = 1;
                got++;
            }
    }
}

static tr_status select_row(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                            bool spec, float scale, int32_t swa, int32_t *n, tr_error *err) {
    (void)scale;
    (void)err;
    tr_kv_cands c;
    tr_kv_select_begin(kv, layer, pos, spec, swa, &c);
    const bool all = c.k >= c.n_cand;
    if (!all) choose(kv, pool, layer, q, &c);
    *n = tr_kv_select_end(kv, layer, &c, all);
    return TR_OK;
}

static tr_status attend_selected(tr_kv *kv, tr_pool *pool, const tr_kv_query *q,
                                 uint64_t *selected, uint64_t *score_ns, tr_error *err) {
    quest *Q = kv->pol;
    tr_kv_pooled *P = &Q->P;
    const int32_t layer = q->layer;
    tr_status st = TR_OK;
    for (int32_t r = 0; r < q->rows && !st; r++) {
        const float *qr = q->q + (size_t)r * q->q_stride;
        const uint64_t t0 = tr_now_ns();
        int32_t n;
        select_row(kv, pool, layer, q->pos[r], qr, false, q->scale, q->swa, &n, err);
        *score_ns += tr_now_ns() - t0;
        tr_kv_list list = {0};
        list.nT = tr_kv_join_reads(P, layer, n, &list.T, &list.skip);
        st = tr_kv_attend_list(kv, pool, layer, 1, q->pos + r, qr, q->q_stride, q->scale, q->sinks,
                               q->swa, q->out + (size_t)r * q->out_stride, q->out_stride, &list,
                               err);
        if (!st) *selected += (uint64_t)n;
    }
    return st;
}

static void quest_free(tr_kv *kv) {
    quest *Q = kv->pol;
    free(Q->pmin);
    free(Q->pmax);
    free(Q->pg_order);
    free(Q->qf);
}

static const tr_kv_pooled_ops quest_ops = {.appended = appended,
                                           .select_row = select_row,
                                           .attend_selected = attend_selected,
                                           .truncated = truncated,
                                           .free = quest_free};

tr_status tr_kv_quest_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err) {
    quest *Q = calloc(1, sizeof *Q);
    if (!Q) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    kv->pol = Q;
    kv->ops = &tr_kv_pooled_kv_ops;
    uint64_t total = 0;
    tr_status st = tr_kv_pooled_init(kv, &Q->P, pl, &quest_ops, true, &total, err);
    if (st) return st;
    const size_t nb = (size_t)kv->shape.n_layer * (size_t)kv->shape.n_head_kv *
                      (size_t)pl->n_pages * (size_t)kv->shape.head_dim_k * 2;
    Q->pmin = tr_kv_alloc(nb, 0, &total);
    Q->pmax = tr_kv_alloc(nb, 0, &total);
    Q->pg_order = tr_kv_alloc((size_t)pl->n_pages * 4, 0, &total);
    Q->qf = tr_kv_alloc((size_t)kv->shape.n_head * (size_t)kv->shape.head_dim_k * 4, 0, &total);
    if (!Q->pmin || !Q->pmax || !Q->pg_order || !Q->qf)
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl->dram);
    return tr_kv_store_open(&Q->P.st, &kv->shape, err);
}
