/*
 * The operations every pooled policy shares (kv_pooled.h): create and free of the shared state,
 * append through the policy's hook, attend (every visible key, or the policy's selective path),
 * truncate, stats, the test seam; and the offload policy, which is nothing more.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/kv_pooled.h"

/* below this many attended tokens a layer's reads are too few to be worth splitting into chunks */
#define KV_PIPE_MIN 1024
/* the reads joined across one unselected cold token: on a virtio SSD that serves ~60K random
 * reads/s, that cut the reads per step by a fifth for a sixth more bytes (bench/results/kv.md) */
#define KV_READ_GAP 1

tr_status tr_kv_pooled_init(tr_kv *kv, tr_kv_pooled *P, const tr_kv_plan *pl,
                            const tr_kv_pooled_ops *ops, bool own_ws, uint64_t *total,
                            tr_error *err) {
    const tr_kv_shape *s = &kv->shape;
    const tr_kv_params *p = &kv->params;
    P->ops = ops;
    P->selective = p->policy != TR_KV_OFFLOAD && p->alpha < 1.0f;
    /* h2o's eviction is permanent and fed by every row's attention: it selects in prefill too */
    P->exact_rows = !p->prefill_select && p->policy != TR_KV_H2O;
    P->row_block = pl->row_block;
    P->halves = p->spec;
    /* with the agent, joined reads would send the records between the runs over the link: it
     * joins them in its own memory instead */
    P->read_gap = p->csd ? 0 : KV_READ_GAP;
    P->pipe = TR_KV_PIPE;
    P->pipe_min = KV_PIPE_MIN;
    P->n_scratch = pl->n_scratch;
    tr_status st = tr_kv_store_init(&P->st, s, p, pl, own_ws, total, err);
    if (st) return st;
    const size_t n_ctx = (size_t)s->n_ctx, nh = (size_t)s->n_head;
    bool ok = true;
#define ALLOC(ptr, n, align)                                                                       \
    do {                                                                                           \
        (ptr) = tr_kv_alloc((n), (align), total);                                                  \
        ok = ok && (ptr);                                                                          \
    } while (0)
    ALLOC(P->sel, n_ctx * 4, 0);
    ALLOC(P->cand, n_ctx * 4, 0);
    ALLOC(P->cscore, n_ctx * 4, 0);
    ALLOC(P->mark, n_ctx, 0);
    ALLOC(P->skip, n_ctx, 0);
    /* per thread: the attention's scratch (kv_attn.c) */
    P->th_floats = tr_kv_attn_floats(s, pl->ws_cap, &P->th_attn);
    ALLOC(P->th_k, (size_t)pl->n_scratch * P->th_floats * 4, 64);
    const size_t rb = (size_t)pl->row_block;
    ALLOC(P->st_m, rb * nh * 4, 0);
    ALLOC(P->st_l, rb * nh * 8, 0);
    ALLOC(P->vlo, rb * 4, 0);
    ALLOC(P->vhi, rb * 4, 0);
    ALLOC(P->layer_selected, (size_t)s->n_layer * 8, 0);
    ALLOC(P->sel_last_pos, (size_t)s->n_layer * 4, 0);
#undef ALLOC
    if (!ok)
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl->dram);
    for (int32_t l = 0; l < s->n_layer; l++) P->sel_last_pos[l] = -2; /* no row yet */
    return TR_OK;
}

void tr_kv_pooled_free(tr_kv *kv) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    if (!P) return;
    tr_kv_store_free(&P->st);
    free(P->sel);
    free(P->cand);
    free(P->cscore);
    free(P->mark);
    free(P->skip);
    free(P->th_k);
    free(P->st_m);
    free(P->st_l);
    free(P->vlo);
    free(P->vhi);
    free(P->layer_selected);
    free(P->sel_last_pos);
}

/* ---------------------------------------------------------------------------------------------- */

static int32_t pooled_len(const tr_kv *kv, int32_t layer) {
    return tr_kv_pooled_of(kv)->st.layers[layer].len;
}

/* positions >= n of a layer go, in the store and in the policy */
static void drop_layer(tr_kv *kv, int32_t layer, int32_t n) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    if (P->ops->dropped) P->ops->dropped(kv, layer, n);
    tr_kv_store_drop(&P->st, layer, n);
}

tr_status tr_kv_pooled_append_rec(tr_kv *kv, int32_t layer, const uint8_t *rec, tr_error *err) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    const int32_t pos = P->st.layers[layer].len;
    tr_status st = tr_kv_store_append(&P->st, layer, rec, err);
    if (st) return st;
    if (P->ops->appended) P->ops->appended(kv, layer, pos, rec);
    if ((st = tr_kv_store_page_done(&P->st, layer, err))) /* the token is not kept: the caller
                                                            may stop or retry */
        drop_layer(kv, layer, pos);
    return st;
}

static tr_status pooled_append(tr_kv *kv, int32_t layer, const float *k, const float *v,
                               tr_error *err) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    /* through the kernel table (round to nearest even), so a family with a SIMD conversion
     * speeds appends up */
    uint16_t *r = (uint16_t *)P->st.rec_tmp;
    const size_t nk = P->st.krec / 2, nv = (P->st.rec - P->st.krec) / 2;
    const tr_from_float_fn to16 = kv->kern->from_float[TR_TYPE_F16];
    to16(k, r, (int64_t)nk);
    to16(v, r + nk, (int64_t)nv);
    return tr_kv_pooled_append_rec(kv, layer, P->st.rec_tmp, err);
}

tr_status tr_kv_attend_all(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, uint64_t *selected,
                           tr_error *err) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    const tr_kv_slayer *L = &P->st.layers[q->layer];
    const tr_kv_list none = {0};
    tr_status st = TR_OK;
    const int32_t rb = P->row_block;
    for (int32_t r0 = 0; r0 < q->rows && !st; r0 += rb) {
        const int32_t nr = q->rows - r0 < rb ? q->rows - r0 : rb;
        int32_t lo = INT32_MAX, hi = -1;
        for (int32_t r = r0; r < r0 + nr; r++) {
            const int32_t a = tr_kv_visible_lo(q->pos[r], q->swa);
            if (a < lo) lo = a;
            if (q->pos[r] > hi) hi = q->pos[r];
        }
        int32_t nT = 0;
        for (int32_t t = lo; t <= hi; t++)
            if (L->tok[t].where != TR_KV_TOK_EVICTED) P->sel[nT++] = t;
        tr_kv_list list = none;
        list.T = P->sel;
        list.nT = nT;
        st = tr_kv_attend_list(kv, pool, q->layer, nr, q->pos + r0, q->q + (size_t)r0 * q->q_stride,
                               q->q_stride, q->scale, q->sinks, q->swa,
                               q->out + (size_t)r0 * q->out_stride, q->out_stride, &list, err);
        for (int32_t r = 0; r < nr; r++) *selected += (uint64_t)(P->vhi[r] - P->vlo[r]);
    }
    return st;
}

static tr_status pooled_attend(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, tr_error *err) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    const int32_t layer = q->layer;
    const tr_kv_slayer *L = &P->st.layers[layer];
    for (int32_t r = 0; r < q->rows; r++)
        if (q->pos[r] < 0 || q->pos[r] >= L->len)
            return tr_fail(err, TR_E_ARG,
                           "KV attend: row %d at position %d, layer %d holds %d positions", r,
                           q->pos[r], layer, L->len);
    const uint64_t t0 = tr_now_ns();
    uint64_t t_score = 0, selected = 0;
    /* a prefill chunk (several rows of one session) attends exactly: one gather of everything
     * visible, each cold page read at most once, as full computes it; selection is for decode */
    const bool exact = !P->selective || (q->rows > 1 && P->exact_rows);
    tr_status st = TR_OK;
    if (exact && P->selective && P->ops->drain) P->ops->drain(kv); /* nothing selected ahead */
    else if (P->ops->attend_begin) st = P->ops->attend_begin(kv, q, err);
    if (st) return st;
    const uint64_t read0 = P->st.bytes_read;
    if (exact)
        st = tr_kv_attend_all(kv, pool, q, &selected, err);
    else
        st = P->ops->attend_selected(kv, pool, q, &selected, &t_score, err);
    if (exact && q->rows > 1) {
        if (layer == 0) P->prefill_chunks++;
        P->prefill_bytes_read += P->st.bytes_read - read0;
        if (P->st.cold) P->prefill_read_bound += (uint64_t)L->pages_written * P->st.page_bytes;
    }
    if (P->ops->attend_end) P->ops->attend_end(kv, layer);
    P->layer_selected[layer] = selected;
    kv->steps++;
    kv->score_ns += t_score;
    kv->attn_ns += tr_now_ns() - t0 - t_score;
    return st;
}

static tr_status pooled_truncate(tr_kv *kv, int32_t n, tr_error *err) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    if (P->ops->drain) P->ops->drain(kv);
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        P->layer_selected[l] = 0;
        const int32_t len = P->st.layers[l].len;
        if (n >= len) continue;
        drop_layer(kv, l, n);
        if (P->ops->truncated) {
            tr_status st = P->ops->truncated(kv, l, len, n, err);
            if (st) return st;
        }
    }
    return TR_OK;
}

static void pooled_stats(const tr_kv *kv, tr_kv_stats *o) {
    const tr_kv_pooled *P = tr_kv_pooled_of(kv);
    const tr_kv_store *S = &P->st;
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        const tr_kv_slayer *L = &S->layers[l];
        if (L->len > o->tokens) o->tokens = L->len;
        o->hot_bytes += (uint64_t)(S->hot_slots - L->n_free) * S->rec;
        if (S->cold) o->cold_bytes += (uint64_t)L->pages_written * S->page_bytes;
        o->selected += P->layer_selected[l];
        o->evicted += (uint64_t)L->n_evicted;
    }
    o->bytes_read = S->bytes_read;
    o->read_ops = S->read_ops;
    o->io_ns = S->io_ns;
    o->promotions = S->promotions;
    o->demotions = S->demotions;
    o->migrated_bytes = S->migrated_bytes;
    o->sel_hot = P->sel_hot;
    o->sel_cold = P->sel_cold;
    o->sel_follow = P->sel_follow;
    o->sel_repeat = P->sel_repeat;
    o->prefill_chunks = P->prefill_chunks;
    o->prefill_bytes_read = P->prefill_bytes_read;
    o->prefill_read_bound = P->prefill_read_bound;
    if (P->ops->stats) P->ops->stats(kv, o);
}

static void pooled_free(tr_kv *kv) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    if (!P) return;
    if (P->ops->drain) P->ops->drain(kv); /* reads ahead target the working set */
    if (P->ops->free) P->ops->free(kv);   /* the agent reads the segment files: it goes first */
    tr_kv_pooled_free(kv);
    free(P);
    kv->pol = NULL;
}

const tr_kv_ops tr_kv_pooled_kv_ops = {.append = pooled_append,
                                       .attend = pooled_attend,
                                       .truncate = pooled_truncate,
                                       .len = pooled_len,
                                       .stats = pooled_stats,
                                       .free = pooled_free};

tr_status tr_kv_select_row(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                           bool spec, float scale, int32_t swa, int32_t *n, tr_error *err) {
    const tr_kv_pooled *P = tr_kv_pooled_of(kv);
    if (kv->ops != &tr_kv_pooled_kv_ops || !P->ops->select_row)
        return tr_fail(err, TR_E_ARG, "KV policy %s does not select",
                       tr_kv_policy_name(kv->params.policy));
    return P->ops->select_row(kv, pool, layer, pos, q, spec, scale, swa, n, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* the test seam                                                                                  */

void tr_kv_seam_get(const tr_kv *kv, tr_kv_seam *o) {
    memset(o, 0, sizeof *o);
    if (kv->ops != &tr_kv_pooled_kv_ops) return;
    const tr_kv_pooled *P = tr_kv_pooled_of(kv);
    o->read_gap = P->read_gap;
    o->pipe = P->pipe;
    o->pipe_min = P->pipe_min;
    o->fault_write_at = P->st.fault_write_at;
    o->fault_errno = P->st.fault_errno;
    o->agg = TR_KV_AGG_PSUM;
    o->eq = TR_KV_EQ_ABSMAX;
    o->csd_read_gap = 1;
    if (kv->params.policy == TR_KV_TIERED) tr_kv_tiered_seam_get(kv, o);
}

tr_status tr_kv_seam_set(tr_kv *kv, const tr_kv_seam *s, tr_error *err) {
    if (kv->ops != &tr_kv_pooled_kv_ops)
        return tr_fail(err, TR_E_ARG, "KV seam: the %s policy has no knobs",
                       tr_kv_policy_name(kv->params.policy));
    if (s->pipe < 1 || s->pipe > TR_KV_PIPE || s->read_gap < 0 || s->read_gap > TR_KV_PAGE ||
        s->csd_read_gap < 0 || s->csd_read_gap > TR_KV_PAGE || s->pipe_min < 0 ||
        s->tail_every < 0 || (unsigned)s->agg > TR_KV_AGG_PSUM || (unsigned)s->eq > TR_KV_EQ_SQRT)
        return tr_fail(err, TR_E_ARG, "KV seam: pipe %d, read gaps %d / %d, pipe_min %d, tail "
                       "every %d", s->pipe, s->read_gap, s->csd_read_gap, s->pipe_min,
                       s->tail_every);
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    P->read_gap = s->read_gap;
    P->pipe = s->pipe;
    P->pipe_min = s->pipe_min;
    P->st.fault_write_at = s->fault_write_at;
    P->st.n_writes = 0;
    P->st.fault_errno = s->fault_errno;
    if (kv->params.policy == TR_KV_TIERED) return tr_kv_tiered_seam_set(kv, s, err);
    return TR_OK;
}

bool tr_kv_seam_direct(const tr_kv *kv) {
    return kv->ops == &tr_kv_pooled_kv_ops && tr_kv_pooled_of(kv)->st.direct;
}

/* ---------------------------------------------------------------------------------------------- */
/* offload: every key, from wherever it lives                                                     */

static const tr_kv_pooled_ops offload_ops = {0};

tr_status tr_kv_offload_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err) {
    tr_kv_pooled *P = calloc(1, sizeof *P);
    if (!P) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    kv->pol = P;
    kv->ops = &tr_kv_pooled_kv_ops;
    uint64_t total = 0;
    tr_status st = tr_kv_pooled_init(kv, P, pl, &offload_ops, true, &total, err);
    if (!st) st = tr_kv_store_open(&P->st, &kv->shape, err);
    return st;
}
