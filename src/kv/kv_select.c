/*
 * The selection every selective policy (h2o, quest, tiered) shares: a row's candidates (the
 * visible tokens past the sinks and before the window), and, once the policy has chosen among
 * them, the ascending list the row attends, with the hit counts placement uses and the
 * step-to-step repeat of the selection measured. And the top-k they choose with, and the joined
 * reads of a selection.
 */
#include <string.h>

#include "kv/kv_pooled.h"

void tr_kv_select_begin(tr_kv *kv, int32_t layer, int32_t pos, bool spec, int32_t swa,
                        tr_kv_cands *c) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    const tr_kv_slayer *L = &P->st.layers[layer];
    const tr_kv_params *p = &kv->params;
    c->pos = pos;
    c->lo = tr_kv_visible_lo(pos, swa);
    const int32_t n_vis = pos - c->lo + 1;
    c->sink_hi = p->n_sink < pos + 1 ? p->n_sink : pos + 1;
    c->win_lo = pos - p->n_window + 1 > c->lo ? pos - p->n_window + 1 : c->lo;
    c->c_lo = c->sink_hi > c->lo ? c->sink_hi : c->lo;
    c->k = tr_kv_count(p->alpha, n_vis);
    /* a speculation (made before the row's token is stored) scores the tokens before it */
    c->own = spec ? pos : -1;
    c->top = spec ? pos - 1 : pos;
    int32_t n_cand = 0;
    for (int32_t t = c->c_lo; t < c->win_lo && t <= c->top; t++)
        if (L->tok[t].where != TR_KV_TOK_EVICTED) P->cand[n_cand++] = t;
    c->n_cand = n_cand;
}

int32_t tr_kv_select_end(tr_kv *kv, int32_t layer, const tr_kv_cands *c, bool all) {
    tr_kv_pooled *P = tr_kv_pooled_of(kv);
    tr_kv_slayer *L = &P->st.layers[layer];
    int32_t *sel = P->sel;
    uint8_t *mark = P->mark;
    const int32_t pos = c->pos, own = c->own;
    int32_t n = 0;
    /* sel_repeat: every visible token's flag says whether this selection chose it; a row that
     * follows the last one (the next position) sees every token that row saw */
    const bool follows = pos == P->sel_last_pos[layer] + 1;
    P->sel_last_pos[layer] = pos;
    for (int32_t t = c->lo; t <= pos; t++) {
        const bool forced = t < c->sink_hi || t >= c->win_lo || t == own;
        if (t != own && L->tok[t].where == TR_KV_TOK_EVICTED) continue;
        const bool pick = all || forced || mark[t];
        if (follows && pick && !forced) {
            P->sel_follow++;
            P->sel_repeat += L->tok[t].chosen;
        }
        L->tok[t].chosen = pick && !forced;
        if (pick) {
            sel[n++] = t;
            mark[t] = 0;
            if (forced) continue;
            /* a hit is a choice of the selection: the sinks and the window are attended anyway */
            if (L->tok[t].hits <= UINT16_MAX - TR_KV_HIT) L->tok[t].hits += TR_KV_HIT;
            if (L->tok[t].where == TR_KV_TOK_HOT)
                P->sel_hot++;
            else
                P->sel_cold++;
        }
    }
    return n;
}

/* Selective policies read scattered runs: join two runs of cold tokens in one page when at most
 * read_gap unselected cold tokens lie between them (those are read, marked in skip and not
 * attended). */
int32_t tr_kv_join_reads(tr_kv_pooled *P, int32_t layer, int32_t n, const int32_t **T,
                         const uint8_t **skip) {
    *T = P->sel;
    *skip = NULL;
    if (P->read_gap <= 0) return n;
    const tr_kv_slayer *L = &P->st.layers[layer];
    const int32_t *sel = P->sel;
    int32_t *out = P->cand; /* free once the selection is made */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t a = sel[i];
        P->skip[m] = 0;
        out[m++] = a;
        if (i + 1 == n || !P->st.cold) continue;
        const int32_t b = sel[i + 1], gap = b - a - 1;
        if (gap < 1 || gap > P->read_gap || a / TR_KV_PAGE != b / TR_KV_PAGE ||
            L->tok[a].where != TR_KV_TOK_COLD || L->tok[b].where != TR_KV_TOK_COLD)
            continue;
        bool ok = true;
        for (int32_t t = a + 1; t < b; t++) ok = ok && L->tok[t].where == TR_KV_TOK_COLD;
        if (!ok) continue;
        for (int32_t t = a + 1; t < b; t++) {
            P->skip[m] = 1;
            out[m++] = t;
        }
    }
    *T = out;
    if (m > n) *skip = P->skip;
    return m;
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

