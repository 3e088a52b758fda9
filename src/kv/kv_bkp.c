/*
 * Placement between the hot and the cold pool (BKP: bidirectional KV pools), kv_bkp.h.
 *
 * Every complete page is written through to the cold pool, so a hot token whose page is written
 * has a valid cold copy: demoting it only frees its slot. Promotion costs no read either: the
 * selection has just gathered (and verified) the token's record into the working set, and
 * promotion copies it from there into a free or freed hot slot. What BKP buys is that tokens the
 * selection keeps choosing are read from DRAM instead of storage in later steps.
 *
 * Hysteresis (ON): a cold token needs KV_BKP_PROMOTE hits, and KV_BKP_MARGIN more than the hot
 * token it displaces; a moved token stays where it went for KV_BKP_RESIDE steps; every step takes
 * 1 / 2^KV_BKP_DECAY_SHIFT of each token's hits away, so "often" means recently. NAIVE has none
 * of it: the baseline that shows why it is needed (a token promoted on one hit is the weakest hot
 * token at the next promotion, goes back, and is read again).
 *
 * The constants were chosen on bench_kv's queries that persist from step to step (--q-rho 0.96,
 * the selection's step-to-step repeat of real models), 48 steps at 8K, 24 at 32K: hits halved
 * every 32 steps with 3 / 2 / 16 (the first choice, made on queries drawn anew each step) held
 * 13.5 % of the selection hot at 8K and 11 % at 32K; decaying by an eighth every step with 2 / 1
 * / 4 holds 20 % and 21 %, at 12x fewer ping-pong moves than NAIVE (which holds 21 % and 24 %).
 * Decay by a quarter, 1 hit and a margin of half a hit: 20 % and 22 %, ping-pong only 8x and 9x
 * below NAIVE's.
 * The counters follow the selection as it drifts; halving every 32 steps left tokens chosen 20
 * steps ago ahead of the ones chosen now. Tried and left out: promoting tokens read on their own
 * before the ends of runs, and never one inside a run (which splits the run into two reads): at
 * 32K with the agent 2.5 % fewer reads, 1 % more bytes, 20.5 % hot instead of 21.3 %, and no
 * faster step.
 *
 * Costs per layer and decode step: one pass over the layer's tokens (the decay), one over the hot
 * slots when a victim is needed, a sort of the candidates. All scratch is allocated at create.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv_bkp.h"

#define KV_BKP_DECAY_SHIFT 3                /* every step: hits -= hits / 8, rounded up */
#define KV_BKP_PROMOTE     (2 * TR_KV_HIT) /* ON: hits a cold token needs to be promoted ... */
#define KV_BKP_MARGIN      TR_KV_HIT       /* ... and how many more than the token it displaces */
#define KV_BKP_RESIDE      4               /* ON: steps a moved token stays where it went */


static const char *const bkp_names[] = {"off", "naive", "on"};

tr_status tr_kv_bkp_parse(const char *name, tr_kv_bkp *out, tr_error *err) {
    for (int i = 0; i < 3; i++)
        if (name && !strcmp(name, bkp_names[i])) {
            *out = (tr_kv_bkp)i;
            return TR_OK;
        }
    return tr_fail(err, TR_E_ARG, "--kv-bkp '%s': expected off, naive or on",
                   name ? name : "(null)");
}

const char *tr_kv_bkp_name(tr_kv_bkp b) { return (unsigned)b < 3 ? bkp_names[b] : "?"; }

tr_status tr_kv_bkp_init(tr_kv_bkp_state *B, tr_kv_store *st, const tr_kv_params *p,
                         uint64_t *total, tr_error *err) {
    memset(B, 0, sizeof *B);
    B->st = st;
    B->mode = p->bkp;
    B->n_sink = p->n_sink;
    B->n_window = p->n_window;
    const size_t NL = (size_t)st->n_layer, slots = (size_t)st->hot_slots;
    B->moved = tr_kv_alloc(NL * (size_t)st->n_ctx * 4, 0, total);
    B->step = tr_kv_alloc(NL * 4, 0, total);
    B->att_hi = tr_kv_alloc(NL * 4, 0, total);
    B->vpos = tr_kv_alloc(slots * 4, 0, total);
    B->vkey = tr_kv_alloc(slots * 4, 0, total);
    B->vidx = tr_kv_alloc(slots * 4, 0, total);
    B->cand = tr_kv_alloc((size_t)st->ws_cap * 4, 0, total);
    if (!B->moved || !B->step || !B->att_hi || !B->vpos || !B->vkey || !B->vidx || !B->cand)
        return tr_fail(err, TR_E_NOMEM, "KV placement: out of memory");
    for (size_t l = 0; l < NL; l++) {
        B->step[l] = 1;
        B->att_hi[l] = -1;
    }
    return TR_OK;
}

void tr_kv_bkp_free(tr_kv_bkp_state *B) {
    free(B->moved);
    free(B->step);
    free(B->att_hi);
    free(B->vpos);
    free(B->vkey);
    free(B->vidx);
    free(B->cand);
}

static uint32_t *moved_of(const tr_kv_bkp_state *B, int32_t layer) {
    return B->moved + (size_t)layer * (size_t)B->st->n_ctx;
}

static void note_move(tr_kv_bkp_state *B, int32_t layer, int32_t pos, uint32_t promoted) {
    uint32_t *moved = moved_of(B, layer);
    const uint32_t m = moved[pos], step = B->step[layer];
    if (m && (m & 1u) != promoted && step - (m >> 1) <= TR_KV_PINGPONG_W) B->pingpong++;
    moved[pos] = (step << 1) | promoted;
}

static bool recently_moved(const tr_kv_bkp_state *B, int32_t layer, int32_t pos,
                           uint32_t promoted) {
    const uint32_t m = moved_of(B, layer)[pos];
    return B->mode == TR_KV_BKP_ON && m && (m & 1u) == promoted &&
           B->step[layer] - (m >> 1) < KV_BKP_RESIDE;
}

static void demote(tr_kv_bkp_state *B, int32_t layer, int32_t pos) {
    tr_kv_store_demote(B->st, &B->st->layers[layer], pos);
    note_move(B, layer, pos, 0);
}

/* Hot tokens that may go to the cold pool, into vpos / vkey (key: hits, ties to the oldest).
 * Always written and not a sink; level 0: also outside the window of every row still to come
 * (attended anyway, and without hits since nobody chose them: a prefill batch appends its tokens
 * before its rows attend) and past their residence; 1: outside those windows; 2: any, the oldest
 * first (what static placement does). Returns how many. */
static int32_t victims(tr_kv_bkp_state *B, int32_t layer, int level) {
    const tr_kv_slayer *L = &B->st->layers[layer];
    const int32_t n_sink = B->n_sink;
    const int32_t win_lo = B->att_hi[layer] + 2 - B->n_window; /* the next row's window */
    const float inv = 1.0f / (float)B->st->n_ctx;
    int32_t n = 0;
    for (int32_t s = 0; s < B->st->hot_slots; s++) {
        const int32_t p = L->slot_pos[s];
        if (p < n_sink || p / TR_KV_PAGE >= L->pages_written) continue; /* free, sink, no copy */
        if (level < 2 && p >= win_lo) continue;
        if (level < 1 && recently_moved(B, layer, p, 1)) continue;
        B->vpos[n] = p;
        /* topk takes the largest */
        B->vkey[n] = level < 2 ? -((float)L->tok[p].hits + (float)p * inv) : -(float)p;
        n++;
    }
    return n;
}

static int cmp_key_desc(const void *a, const void *b, void *ctx) {
    const float *k = ctx;
    const float x = k[*(const int32_t *)a], y = k[*(const int32_t *)b];
    return x > y ? -1 : x < y;
}

/* the k weakest victims, weakest first, in vidx[0..k) */
static int32_t weakest(tr_kv_bkp_state *B, int32_t n, int32_t k) {
    if (k > n) k = n;
    for (int32_t i = 0; i < n; i++) B->vidx[i] = i;
    tr_kv_topk(B->vkey, B->vidx, n, k);
    qsort_r(B->vidx, (size_t)k, sizeof(int32_t), cmp_key_desc, B->vkey);
    return k;
}

bool tr_kv_bkp_make_room(void *ctx, int32_t layer) {
    tr_kv_bkp_state *B = ctx;
    if (B->st->layers[layer].n_free) return true;
    /* a batch, so that the scan over the hot slots is paid once per batch of appends */
    int32_t batch = B->st->hot_slots / 32;
    if (batch < 1) batch = 1;
    /* the budget is hard: residence, then the window, give way if nothing else can go */
    int32_t n = 0;
    for (int level = 0; level < 3 && !n; level++) n = victims(B, layer, level);
    const int32_t k = weakest(B, n, batch);
    for (int32_t i = 0; i < k; i++) demote(B, layer, B->vpos[B->vidx[i]]);
    return k > 0;
}

void tr_kv_bkp_step(tr_kv_bkp_state *B, int32_t layer, int32_t pos) {
    tr_kv_slayer *L = &B->st->layers[layer];
    B->step[layer]++;
    const uint32_t round = (1u << KV_BKP_DECAY_SHIFT) - 1; /* up: one hit fades out in time */
    for (int32_t t = 0; t < L->len; t++)
        L->tok[t].hits -= (uint16_t)((L->tok[t].hits + round) >> KV_BKP_DECAY_SHIFT);
    if (pos > B->att_hi[layer]) B->att_hi[layer] = pos;
}

typedef struct cand_ctx {
    const tr_kv_slayer *L;
    const int32_t *T;
} cand_ctx;

static int cmp_cand(const void *a, const void *b, void *ctx) {
    const cand_ctx *c = ctx;
    const int x = c->L->tok[c->T[*(const int32_t *)a]].hits;
    const int y = c->L->tok[c->T[*(const int32_t *)b]].hits;
    return y - x;
}

static void promote(tr_kv_bkp_state *B, int32_t layer, int32_t pos, const uint8_t *rec) {
    tr_kv_store_promote(B->st, &B->st->layers[layer], pos, rec);
    note_move(B, layer, pos, 1);
}

void tr_kv_bkp_promote(void *ctx, int32_t layer, const int32_t *T, int32_t c0, int32_t c1,
                       const uint8_t *skip, int32_t slot0) {
    tr_kv_bkp_state *B = ctx;
    tr_kv_store *st = B->st;
    tr_kv_slayer *L = &st->layers[layer];
    if (B->mode == TR_KV_BKP_OFF || !st->cold) return;
    const bool on = B->mode == TR_KV_BKP_ON;
    int32_t *cand = B->cand, nc = 0;
    for (int32_t i = c0; i < c1; i++) {
        const int32_t p = T[i];
        if ((skip && skip[i]) || L->tok[p].where != TR_KV_TOK_COLD) continue;
        if (on && (L->tok[p].hits < KV_BKP_PROMOTE || recently_moved(B, layer, p, 0))) continue;
        cand[nc++] = i;
    }
    if (!nc) return;
    cand_ctx cc = {L, T};
    qsort_r(cand, (size_t)nc, sizeof *cand, cmp_cand, &cc); /* most hits first */
    int32_t ci = 0;
    for (; ci < nc && L->n_free; ci++)
        promote(B, layer, T[cand[ci]], st->ws + (size_t)(slot0 + cand[ci] - c0) * st->rec);
    if (ci == nc) return;
    const int32_t k = weakest(B, victims(B, layer, 0), nc - ci);
    for (int32_t v = 0; v < k && ci < nc; v++, ci++) {
        const int32_t vp = B->vpos[B->vidx[v]], cp = T[cand[ci]];
        if (on && L->tok[cp].hits < L->tok[vp].hits + KV_BKP_MARGIN) break;
        demote(B, layer, vp);
        promote(B, layer, cp, st->ws + (size_t)(slot0 + cand[ci] - c0) * st->rec);
    }
}

void tr_kv_bkp_dropped(tr_kv_bkp_state *B, int32_t layer, int32_t n) {
    uint32_t *moved = moved_of(B, layer);
    for (int32_t p = n; p < B->st->layers[layer].len; p++) moved[p] = 0;
    if (B->att_hi[layer] > n - 1) B->att_hi[layer] = n - 1;
}
