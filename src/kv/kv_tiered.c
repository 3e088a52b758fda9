/*
 * tiered: per step and layer, every visible token is scored by q.k against the low-precision key
 * copy (kv_keys.h; the tokens on storage by the storage agent with --csd, kv_csd.h, split by APP,
 * kv_app.h), the top alpha by attention mass is selected with the sinks and the window, their F16
 * K/V gathered from the hot or the cold pool (placed by BKP, kv_bkp.h) and attended. Two options
 * live here:
 *
 * The tail (--kv-tail): attending the selection alone renormalises each head's softmax over it.
 * The scoring already holds every candidate's share of each head's attention, so the unselected
 * ones' share-weighted value sum t and their total share e are one more pass over a low-precision
 * value copy; the row's output becomes (1 - e) x attention over the selection + t. Measured
 * (bench/results/kv-quality.md, alpha 0.1, 4-bit copy): perplexity against full +1.37 % -> -0.16 %
 * on SmolLM2, +3.25 % -> -0.26 % on Qwen2.5. Averaging the unselected values instead (over all of
 * them, or per 16 or 64 positions) was worse than leaving them out: the share-weighted sum needs
 * each token's own value. Only the tokens with a share of at least tail_min / n (n tokens scored) in
 * a head a KV head serves are summed; the rest, many small shares, stay out of both t and e, so
 * their share goes back to the attended tokens. At tail_min 1 (SmolLM2, 4K, alpha 0.1) 3.5 % of the
 * unselected tokens are summed for a perplexity of 7.419 against 7.389 summing all and 7.406 for
 * full (Qwen2.5: 12 %, 13.824 / 13.752 / 13.788); the pass shrinks with the fraction summed, if less
 * than in proportion (32K benchmark: +0.98 s a step summing all, +0.15 s summing 6.7 %).
 *
 * Speculation (--kv-spec): layer l + 1's query exists only once layer l is done, so its scoring
 * and then its reads would wait for layer l's reads to end. At the start of layer l's attend call
 * the cache asks the forward pass for layer l + 1's queries speculated from layer l's input (its
 * own norm and query projection of it, as InfiniGen does), and while layer l's reads are in flight
 * it selects layer l + 1's tokens with them and starts their reads into the other half of the
 * working set. The attention uses the real query; the selection then differs from the exact one
 * (bench/results/kv-quality.md measures what that costs).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/kv_bkp.h"
#include "kv/kv_csd.h"
#include "kv/kv_pooled.h"

typedef struct tiered {
    tr_kv_pooled P;
    tr_kv_keys K;
    tr_kv_app A;
    tr_kv_bkp_state B;
    bool bkp;        /* placement runs (a cold pool and --kv-bkp on|naive) */
    tr_kv_csd C;
    bool csd;        /* the storage agent scores and reads the cold pool */
    /* --kv-spec. The queries given for a layer of each parity (layer -1: none; layer l + 1's are
     * asked for as layer l attends, and layer l's are still to be used then) ... */
    struct spec_in {
        int32_t layer, rows, swa;
        const int32_t *pos;
        const float *q;
        size_t stride;
        float scale;
    } spec_in[2];
    /* ... and a selection made with it during the previous layer (layer -1: none): its list in
     * plist[layer % 2], its reads started (started) in that half of the working set */
    struct {
        int32_t layer, pos, n, nT;
        bool started, skip; /* skip: pskip[layer % 2] marks joined entries */
        const float *q;     /* the speculative query */
    } pre;
    int32_t *plist[2]; /* [n_ctx] each: the lists of two consecutive layers */
    uint8_t *pskip[2];
    uint64_t ahead_ns; /* this attend call's time selecting ahead (scoring, not attention) */
    /* the test seam's baseline: every cold key copy pulled from storage before host scoring */
    bool pull_keys;
    uint8_t *pull_buf;
    size_t pull_stride;
    /* statistics */
    uint64_t tail_rows, spec_rows, spec_early;
    double tail_share_sum, spec_cos_sum;
} tiered;

static tiered *tiered_of(const tr_kv *kv) { return (tiered *)kv->pol; }

float *tr_kv_tiered_scales(const tr_kv *kv, int32_t layer, size_t *bytes, bool **calibrated) {
    tiered *T = tiered_of(kv);
    *bytes = (size_t)kv->shape.n_head_kv * (size_t)T->K.hdk_pad * 4;
    *calibrated = &T->K.calibrated[layer];
    return tr_kv_eq_of(&T->K, layer);
}

struct tr_kv_keys *tr_kv_tiered_keys(const tr_kv *kv) { return &tiered_of(kv)->K; }
struct tr_kv_app *tr_kv_tiered_app(const tr_kv *kv) { return &tiered_of(kv)->A; }

int tr_kv_seam_agent_pid(const tr_kv *kv) {
    if (kv->params.policy != TR_KV_TIERED || kv->ops != &tr_kv_pooled_kv_ops) return 0;
    const tiered *T = tiered_of(kv);
    return T->csd ? (int)tr_kv_csd_pid(&T->C) : 0;
}

/* ---- what the store and the pooled operations ask of tiered ------------------------------------ */

static void appended(tr_kv *kv, int32_t layer, int32_t pos, const uint8_t *rec) {
    tiered *T = tiered_of(kv);
    tr_kv_quant_key(&T->K, layer, pos, rec);
    /* the per-channel scales come from the first page, which is still hot here (the hot pool
     * holds at least two pages); its tokens are quantized again with them */
    if (!T->K.calibrated[layer] && pos == TR_KV_PAGE - 1) tr_kv_calibrate(&T->K, &T->P.st, layer);
    if (T->K.vrow) tr_kv_quant_value(&T->K, layer, pos, rec);
}

/* a page's key copy, [position][KV head] rows, for a near-storage scorer */
static void page_extra(void *ctx, int32_t layer, int32_t page, uint8_t *dst) {
    const tiered *T = ctx;
    const size_t nkv = (size_t)T->K.shape->n_head_kv;
    const int32_t p0 = page * TR_KV_PAGE;
    for (int32_t i = 0; i < TR_KV_PAGE; i++)
        for (size_t g = 0; g < nkv; g++)
            memcpy(dst + ((size_t)i * nkv + g) * T->K.qrow, tr_kv_qk_row(&T->K, layer, g, p0 + i),
                   T->K.qrow);
}

static void dropped(tr_kv *kv, int32_t layer, int32_t n) {
    tiered *T = tiered_of(kv);
    if (T->bkp) tr_kv_bkp_dropped(&T->B, layer, n);
    if (T->csd) tr_kv_csd_invalidate(&T->C, layer, n / TR_KV_PAGE);
}

/* After a truncate from len to n, the host's key ring must hold [n - hk_ring, n) again: the
 * positions of it that newer ones wrote over are quantized again from their records (the hot
 * pool's, or read back from the pages, which a truncate leaves in place), giving the same bytes */
static tr_status truncated(tr_kv *kv, int32_t layer, int32_t len, int32_t n, tr_error *err) {
    tiered *T = tiered_of(kv);
    tr_kv_keys *K = &T->K;
    if (!K->hk_wrap) return TR_OK;
    tr_kv_store *S = &T->P.st;
    const tr_kv_slayer *L = &S->layers[layer];
    const int32_t RS = K->hk_sink, R = K->hk_ring;
    const int32_t a = n - R > RS ? n - R : RS, held = len - R > RS ? len - R : RS;
    const int32_t b = n < held ? n : held;
    for (int32_t p = a; p < b;) {
        const tr_kv_tok *t = &L->tok[p];
        if (t->where == TR_KV_TOK_HOT) {
            tr_kv_quant_key(K, layer, p, L->hot + (size_t)t->slot * S->rec);
            p++;
            continue;
        }
        if (t->where != TR_KV_TOK_COLD) { /* evicted: never scored again */
            p++;
            continue;
        }
        int32_t e = p + 1; /* a run of cold records within one page */
        while (e < b && e % TR_KV_PAGE && L->tok[e].where == TR_KV_TOK_COLD) e++;
        tr_status st = tr_kv_cold_read_sync(S, layer, p, e - p, S->ws, err);
        if (st) return st;
        for (int32_t i = p; i < e; i++) tr_kv_quant_key(K, layer, i, S->ws + (size_t)(i - p) * S->rec);
        p = e;
    }
    return TR_OK;
}

/* forget a selection made ahead, after its reads (they target the working set) */
static void spec_drop(tr_kv *kv) {
    tiered *T = tiered_of(kv);
    if (T->pre.layer >= 0 && T->pre.started) tr_kv_pipe_drain(&T->P, T->pre.layer % 2, 0);
    T->pre.layer = -1;
}

/* ---- selection ---------------------------------------------------------------------------------- */

/* the positions a row attends at pos, ascending, into P->sel (*n). spec: q is a speculation, and
 * the row's own token, whose key may not be stored yet, is attended without being scored */
static tr_status select_row(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                            bool spec, float scale, int32_t swa, int32_t *n_sel, tr_error *err) {
    tiered *T = tiered_of(kv);
    tr_kv_pooled *P = &T->P;
    tr_kv_keys *K = &T->K;
    const tr_kv_slayer *L = &P->st.layers[layer];
    const tr_kv_research *rs = &kv->params.research;
    K->tail_row = false;
    tr_kv_cands c;
    tr_kv_select_begin(kv, layer, pos, spec, swa, &c);
    int32_t *cand = P->cand, *sel = P->sel;
    const int32_t n_cand = c.n_cand, k = c.k;
    const bool all = k >= n_cand;
    if (!all) {
        /* normalised aggregations weigh each head by the share of its attention the candidates
         * would get: the sinks and the window, attended anyway, join the normalisation */
        int32_t n_all = n_cand;
        if (K->agg >= TR_KV_AGG_PMAX) {
            for (int32_t t = c.lo; t < c.sink_hi && t <= c.top; t++)
                if (L->tok[t].where != TR_KV_TOK_EVICTED) cand[n_all++] = t;
            for (int32_t t = c.win_lo > c.c_lo ? c.win_lo : c.c_lo; t <= c.top; t++)
                if (L->tok[t].where != TR_KV_TOK_EVICTED) cand[n_all++] = t;
        }
        /* group A: the candidates whose pages are on storage (a prefix: cand is ascending),
         * less the most recent of them that APP gives the host (beta = host / agent tokens; the
         * host's share at most what its key copy holds, its budget M_0: --kv-host-keys).
         * Without an agent only a fixed beta splits, so that host scoring reproduces the
         * agent's groups exactly. */
        int32_t n_a = 0;
        const int32_t written = P->st.cold ? L->pages_written * TR_KV_PAGE : 0;
        while (n_a < n_cand && cand[n_a] < written) n_a++;
        if (T->csd && rs->beta < 0.0f && !T->A.probed && n_a > 0) {
            tr_status st = tr_kv_csd_probe(&T->C, pool, layer, q, scale, cand, n_a, err);
            if (st) return st;
            T->A.beta_first = tr_kv_app_beta(&T->A);
        }
        if (T->csd || rs->beta >= 0.0f) {
            int32_t n_c = tr_kv_app_host_part(&T->A, T->csd, n_a, n_all - n_a);
            if (K->hk_wrap) {
                const int32_t hlo = tr_kv_hk_lo(K, L->len);
                n_c = tr_kv_hk_held(K, L->len, cand, n_a, n_c);
                /* the rest of the host's part (the open page, the window, the sinks) is always
                 * held: the ring is sized for it */
                for (int32_t i = n_a; i < n_all; i++)
                    if (cand[i] >= K->hk_sink && cand[i] < hlo)
                        return tr_fail(err, TR_E_ARG,
                                       "KV cache: layer %d, row %d: the host's key copy holds "
                                       "positions from %d, the row needs %d (more rows in one "
                                       "call than planned)",
                                       layer, pos, hlo, cand[i]);
            }
            n_a -= n_c;
            tr_kv_app_note_split(&T->A, n_c, n_a);
        }
        if (T->csd && n_a > 0) {
            tr_status st = tr_kv_csd_score(&T->C, pool, layer, q, scale, cand, n_all, n_a,
                                           P->cscore, err);
            if (st) return st;
        } else {
            if (T->pull_keys) {
                tr_status st =
                    tr_kv_store_pull_keys(&P->st, layer, &T->pull_buf, &T->pull_stride, err);
                if (st) return st;
            }
            tr_kv_score_tokens(K, pool, layer, q, scale, cand, n_all, n_a, K->agg, P->cscore);
        }
        for (int32_t i = 0; i < n_cand; i++) sel[i] = i;
        tr_kv_topk(P->cscore, sel, n_cand, k);
        int32_t k_a = 0;
        for (int32_t i = 0; i < k; i++) {
            P->mark[cand[sel[i]]] = 1;
            k_a += sel[i] < n_a;
        }
        /* sel is free between the marking of the selection and its final listing */
        if (K->vrow && K->agg == TR_KV_AGG_PSUM)
            tr_kv_tail_estimate(K, pool, layer, cand, n_cand, n_all, n_a, P->mark, sel);
        if (n_a > 0 && n_cand > n_a) tr_kv_app_note_selected(&T->A, k_a, n_a, k - k_a, n_cand - n_a);
    }
    *n_sel = tr_kv_select_end(kv, layer, &c, all);
    return TR_OK;
}

/* a row's selection at a layer (into P->sel, n), as a decode step begins there: the layer's
 * placement step first; the time taken is added to *ns */
static tr_status select_step(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                             bool spec, float scale, int32_t swa, int32_t *n, uint64_t *ns,
                             tr_error *err) {
    tiered *T = tiered_of(kv);
    if (T->bkp) tr_kv_bkp_step(&T->B, layer, pos);
    const uint64_t t0 = tr_now_ns();
    *n = 0;
    const tr_status st = select_row(kv, pool, layer, pos, q, spec, scale, swa, n, err);
    *ns += tr_now_ns() - t0;
    return st;
}

/* the list a selection (P->sel, n) is read as: joined runs, in this layer's own buffers with
 * --kv-spec (the next layer's selection reuses the scratch while this one is attended) */
static int32_t make_list(tr_kv *kv, int32_t layer, int32_t n, const int32_t **Tl,
                         const uint8_t **skip) {
    tiered *T = tiered_of(kv);
    tr_kv_pooled *P = &T->P;
    int32_t nT = tr_kv_join_reads(P, layer, n, Tl, skip);
    const bool spec = kv->params.spec;
    /* --kv-spec: a joined list too long for its half of the working set would lose the reads
     * ahead (measured at 32K: 3.3 s a step against 2.5 s without --kv-spec); the selection alone
     * is read instead */
    if (spec && nT > tr_kv_half_cap(P) && n <= tr_kv_half_cap(P)) {
        nT = n;
        *Tl = P->sel;
        *skip = NULL;
    }
    if (spec) {
        const int h = layer % 2;
        memcpy(T->plist[h], *Tl, (size_t)nT * sizeof(int32_t));
        *Tl = T->plist[h];
        if (*skip) {
            memcpy(T->pskip[h], *skip, (size_t)nT);
            *skip = T->pskip[h];
        }
    }
    return nT;
}

/* ---- speculation -------------------------------------------------------------------------------- */

static double cosine(const float *a, const float *b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
}

/* during layer's attention of the row at pos: the next layer's selection with the query given
 * for it, and its reads when they fit the other half of the working set */
static tr_status spec_ahead(void *ctx, tr_pool *pool, int32_t layer, int32_t pos, tr_error *err) {
    tr_kv *kv = ctx;
    tiered *T = tiered_of(kv);
    const int32_t nl = layer + 1;
    struct spec_in *in = &T->spec_in[nl % 2];
    if (in->layer != nl || in->rows != 1 || in->pos[0] != pos || T->pre.layer >= 0 ||
        nl >= kv->shape.n_layer)
        return TR_OK;
    if (T->P.st.layers[nl].len != pos) return TR_OK; /* not the step the query was given for */
    int32_t n;
    tr_status st = select_step(kv, pool, nl, pos, in->q, true, in->scale, in->swa, &n,
                               &T->ahead_ns, err);
    if (st) return st;
    const uint8_t *skip;
    const int32_t *Tl;
    const int32_t nT = make_list(kv, nl, n, &Tl, &skip);
    T->pre.layer = nl;
    T->pre.pos = pos;
    T->pre.n = n;
    T->pre.nT = nT;
    T->pre.skip = skip != NULL;
    T->pre.q = in->q;
    T->pre.started = tr_kv_pipelined(&T->P, nT);
    in->layer = -1;
    T->spec_rows++;
    if (T->pre.started) {
        tr_kv_pipe_start(&T->P, nl % 2, nl, Tl, nT);
        T->spec_early++;
    }
    return TR_OK;
}

/* a list read ahead holds the row's own record as it was before the token was stored: now it is */
static tr_status own_record(tr_kv *kv, int32_t layer, const int32_t *Tl, int32_t nT, int32_t pos,
                            tr_error *err) {
    tiered *T = tiered_of(kv);
    tr_kv_store *S = &T->P.st;
    const tr_kv_slayer *L = &S->layers[layer];
    if (nT < 1 || Tl[nT - 1] != pos)
        return tr_fail(err, TR_E_INTERNAL, "KV: layer %d: the list read ahead ends at %d, not %d",
                       layer, nT ? Tl[nT - 1] : -1, pos);
    uint8_t *dst = S->ws + ((size_t)tr_kv_half_slot0(&T->P, layer % 2) + (size_t)nT - 1) * S->rec;
    if (L->tok[pos].where == TR_KV_TOK_HOT) {
        memcpy(dst, L->hot + (size_t)L->tok[pos].slot * S->rec, S->rec);
        return TR_OK;
    }
    return tr_kv_cold_read_sync(S, layer, pos, 1, dst, err);
}

/* --kv-spec: layer + 1's speculated queries for these rows, asked for as the layer's call begins
 * (the forward pass computes them from the layer's input, which the residual update after the
 * attention changes) */
static tr_status attend_begin(tr_kv *kv, const tr_kv_query *q, tr_error *err) {
    tiered *T = tiered_of(kv);
    T->ahead_ns = 0;
    if (!kv->params.spec || !q->next || q->layer + 1 >= kv->shape.n_layer) return TR_OK;
    tr_kv_next_query nq = {0};
    tr_status st = q->next(q->next_ctx, q->layer + 1, q->next_row0, q->rows, &nq, err);
    if (st || !nq.q) return st;
    T->spec_in[(q->layer + 1) % 2] = (struct spec_in){.layer = q->layer + 1,
                                                      .rows = q->rows,
                                                      .pos = q->pos,
                                                      .q = nq.q,
                                                      .stride = nq.q_stride,
                                                      .scale = nq.scale,
                                                      .swa = nq.swa};
    return TR_OK;
}

tr_status tr_kv_seam_spec_query(tr_kv *kv, int32_t layer, int32_t rows, const int32_t *pos,
                                const float *q, size_t q_stride, float scale, int32_t swa,
                                tr_error *err) {
    if (kv->params.policy != TR_KV_TIERED || !kv->params.spec)
        return tr_fail(err, TR_E_ARG, "KV: a speculative query without --kv-spec");
    if (layer < 0 || layer >= kv->shape.n_layer || rows < 1 || !pos || !q)
        return tr_fail(err, TR_E_ARG, "KV speculative query: layer %d of %d, %d rows", layer,
                       kv->shape.n_layer, rows);
    tiered_of(kv)->spec_in[layer % 2] = (struct spec_in){.layer = layer,
                                                         .rows = rows,
                                                         .pos = pos,
                                                         .q = q,
                                                         .stride = q_stride,
                                                         .scale = scale,
                                                         .swa = swa};
    return TR_OK;
}

static void attend_end(tr_kv *kv, int32_t layer) {
    tiered *T = tiered_of(kv);
    if (T->spec_in[layer % 2].layer == layer) T->spec_in[layer % 2].layer = -1; /* used */
}

/* ---- attention ---------------------------------------------------------------------------------- */

/* tail: out = (1 - e) x attention over the selection + the unselected share */
static void add_tail(tr_kv *kv, float *out) {
    tiered *T = tiered_of(kv);
    tr_kv_keys *K = &T->K;
    const int32_t hdv = kv->shape.head_dim_v;
    double share = 0.0;
    for (int32_t h = 0; h < kv->shape.n_head; h++) {
        share += (double)K->tail_e[h];
        const float keep = 1.0f - K->tail_e[h];
        const float *t = K->tail_o + (size_t)h * K->hdv_pad;
        float *o = out + (size_t)h * hdv;
        for (int32_t d = 0; d < hdv; d++) o[d] = keep * o[d] + t[d];
    }
    T->tail_rows++;
    T->tail_share_sum += share / kv->shape.n_head;
    K->tail_row = false;
}

/* BKP's promotions after a gather */
static void promote_hook(void *ctx, int32_t layer, const int32_t *Tl, int32_t c0, int32_t c1,
                         const uint8_t *skip, int32_t slot0) {
    tr_kv_bkp_promote(&tiered_of(ctx)->B, layer, Tl, c0, c1, skip, slot0);
}

static tr_status attend_selected(tr_kv *kv, tr_pool *pool, const tr_kv_query *q,
                                 uint64_t *selected, uint64_t *score_ns, tr_error *err) {
    tiered *T = tiered_of(kv);
    tr_kv_pooled *P = &T->P;
    const int32_t layer = q->layer, rows = q->rows;
    const int32_t *pos = q->pos;
    if (T->K.vrow && q->sinks)
        return tr_fail(err, TR_E_ARG, "--kv-tail: this model's attention has sinks, which the "
                                      "estimate does not handle; use --kv-tail 0");
    /* each row is one decode step: its own selection */
    const bool spec = kv->params.spec;
    const size_t nq = (size_t)kv->shape.n_head * (size_t)kv->shape.head_dim_k;
    tr_status st = TR_OK;
    for (int32_t r = 0; r < rows && !st; r++) {
        const float *qr = q->q + (size_t)r * q->q_stride;
        const int32_t *Tl;
        const uint8_t *skip;
        int32_t n, nT;
        bool started = false;
        if (spec && rows == 1 && T->pre.layer == layer && T->pre.pos == pos[r]) {
            /* selected during the previous layer (spec_ahead) */
            n = T->pre.n;
            nT = T->pre.nT;
            Tl = T->plist[layer % 2];
            skip = T->pre.skip ? T->pskip[layer % 2] : NULL;
            started = T->pre.started;
            T->spec_cos_sum += cosine(T->pre.q, qr, nq);
            T->pre.layer = -1; /* consumed: its reads are awaited below */
            if (started && (st = own_record(kv, layer, Tl, nT, pos[r], err))) {
                tr_kv_pipe_drain(P, layer % 2, 0);
                break;
            }
        } else {
            spec_drop(kv); /* one made for another step */
            /* a query given for this layer and row (several rows) */
            const struct spec_in *in = &T->spec_in[layer % 2];
            const float *qs = spec && in->layer == layer && r < in->rows && in->pos[r] == pos[r]
                                  ? in->q + (size_t)r * in->stride
                                  : NULL;
            st = select_step(kv, pool, layer, pos[r], qs ? qs : qr, qs != NULL, q->scale, q->swa,
                             &n, score_ns, err);
            if (st) break;
            if (qs) {
                T->spec_rows++;
                T->spec_cos_sum += cosine(qs, qr, nq);
            }
            nT = make_list(kv, layer, n, &Tl, &skip);
        }
        const tr_kv_list list = {.T = Tl,
                                 .nT = nT,
                                 .skip = skip,
                                 .half = spec ? layer % 2 : 0,
                                 .started = started,
                                 .ctx = kv,
                                 .gathered = T->bkp ? promote_hook : NULL,
                                 .in_flight = spec ? spec_ahead : NULL};
        st = tr_kv_attend_list(kv, pool, layer, 1, pos + r, qr, q->q_stride, q->scale, q->sinks,
                               q->swa, q->out + (size_t)r * q->out_stride, q->out_stride, &list, err);
        if (st) break;
        if (T->K.tail_row) add_tail(kv, q->out + (size_t)r * q->out_stride);
        *selected += (uint64_t)n;
    }
    if (st) spec_drop(kv);
    *score_ns += T->ahead_ns;
    return st;
}

/* ---- the rest of the policy ------------------------------------------------------------------- */

/* the store's hooks (their context is the policy) */
static bool make_room(void *ctx, int32_t layer) {
    return tr_kv_bkp_make_room(&((tiered *)ctx)->B, layer);
}
static void hot_copied(void *ctx, uint64_t bytes, uint64_t ns) {
    tr_kv_app_note_hot(&((tiered *)ctx)->A, bytes, ns);
}

static void tiered_stats(const tr_kv *kv, tr_kv_stats *o) {
    const tiered *T = tiered_of(kv);
    const tr_kv_app *A = &T->A;
    o->pingpong = T->bkp ? T->B.pingpong : 0;
    o->beta = A->beta;
    o->beta_split = A->beta_split;
    o->f_c = A->tc > 0 ? 1e9 / A->tc : 0;
    o->f_s = A->ts > 0 ? 1e9 / A->ts : 0;
    o->b_c = A->bc * 1e9;
    o->b_s = A->bs * 1e9;
    o->alpha_c = A->ac;
    o->alpha_s = A->as;
    o->tail_rows = T->tail_rows;
    o->tail_share_sum = T->tail_share_sum;
    o->tail_cand = T->K.tail_cand;
    o->tail_kept = T->K.tail_kept;
    o->spec_rows = T->spec_rows;
    o->spec_early = T->spec_early;
    o->spec_cos_sum = T->spec_cos_sum;
    if (T->csd) tr_kv_csd_stats(&T->C, o);
}

void tr_kv_tiered_seam_get(const tr_kv *kv, tr_kv_seam *o) {
    const tiered *T = tiered_of(kv);
    o->csd_read_gap = T->csd ? T->C.read_gap : 1;
    o->pull_keys = T->pull_keys;
    o->tail_every = T->K.tail_every;
    o->agg = T->K.agg;
    o->eq = T->K.eq_mode;
}

tr_status tr_kv_tiered_seam_set(tr_kv *kv, const tr_kv_seam *s, tr_error *err) {
    (void)err;
    tiered *T = tiered_of(kv);
    if (T->csd) T->C.read_gap = s->csd_read_gap;
    T->pull_keys = s->pull_keys;
    T->K.tail_every = s->tail_every;
    T->K.agg = s->agg;
    T->K.eq_mode = s->eq;
    return TR_OK;
}

static void tiered_free(tr_kv *kv) {
    tiered *T = tiered_of(kv);
    if (T->csd) tr_kv_csd_free(&T->C); /* the agent reads the segment files: it goes first */
    if (T->bkp) tr_kv_bkp_free(&T->B);
    tr_kv_keys_free(&T->K);
    for (int i = 0; i < 2; i++) {
        free(T->plist[i]);
        free(T->pskip[i]);
    }
    free(T->pull_buf);
}

static const tr_kv_pooled_ops tiered_ops = {.appended = appended,
                                            .select_row = select_row,
                                            .attend_selected = attend_selected,
                                            .attend_begin = attend_begin,
                                            .attend_end = attend_end,
                                            .dropped = dropped,
                                            .truncated = truncated,
                                            .drain = spec_drop,
                                            .stats = tiered_stats,
                                            .free = tiered_free};

tr_status tr_kv_tiered_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err) {
    tiered *T = calloc(1, sizeof *T);
    if (!T) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    kv->pol = T;
    kv->ops = &tr_kv_pooled_kv_ops;
    const tr_kv_params *p = &kv->params;
    T->csd = pl->cold && p->csd;
    T->bkp = pl->cold && p->bkp != TR_KV_BKP_OFF;
    T->spec_in[0].layer = T->spec_in[1].layer = T->pre.layer = -1;
    uint64_t total = 0;
    /* with the agent the working set lives in the shared region */
    tr_status st = tr_kv_pooled_init(kv, &T->P, pl, &tiered_ops, !T->csd, &total, err);
    if (!st) st = tr_kv_keys_init(&T->K, &kv->shape, p, pl, kv->kern, &total, err);
    if (st) return st;
    tr_kv_app_init(&T->A, &p->research);
    tr_kv_store *S = &T->P.st;
    S->hooks.ctx = T;
    S->hooks.page_extra = page_extra;
    if (T->bkp) {
        if ((st = tr_kv_bkp_init(&T->B, S, p, &total, err))) return st;
        S->hooks.make_room = make_room;
    }
    if (T->csd) {
        if ((st = tr_kv_csd_init(&T->C, S, &T->K, &T->A, &kv->shape, p, &total, err))) return st;
        S->hooks.hot_copied = hot_copied;
    }
    if (p->spec)
        for (int i = 0; i < 2; i++) {
            T->plist[i] = tr_kv_alloc((size_t)kv->shape.n_ctx * 4, 0, &total);
            T->pskip[i] = tr_kv_alloc((size_t)kv->shape.n_ctx, 0, &total);
            if (!T->plist[i] || !T->pskip[i])
                return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                               (unsigned long long)pl->dram);
        }
    if ((st = tr_kv_store_open(S, &kv->shape, err))) return st;
    if (T->csd && (st = tr_kv_csd_start(&T->C, err))) return st;
    return TR_OK;
}
