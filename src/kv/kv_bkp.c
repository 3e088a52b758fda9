/*
 * Placement between the hot and the cold pool (BKP: bidirectional KV pools), see tr_kv_bkp.
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
#include "kv/kv_internal.h"

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

static void note_move(tr_kv *kv, tr_kv_layer *L, int32_t pos, uint32_t promoted) {
    const uint32_t m = L->moved[pos];
    if (m && (m & 1u) != promoted && L->step - (m >> 1) <= TR_KV_PINGPONG_W) kv->pingpong++;
    L->moved[pos] = (L->step << 1) | promoted;
}

static bool recently_moved(const tr_kv *kv, const tr_kv_layer *L, int32_t pos, uint32_t promoted) {
    const uint32_t m = L->moved[pos];
    return kv->params.bkp == TR_KV_BKP_ON && m && (m & 1u) == promoted &&
           L->step - (m >> 1) < KV_BKP_RESIDE;
}

static void demote(tr_kv *kv, tr_kv_layer *L, int32_t pos) {
    tr_kv_drop_hot(kv, L, pos);
    L->tok[pos].where = TR_KV_TOK_COLD;
    kv->demotions++;
    note_move(kv, L, pos, 0);
}

/* Hot tokens that may go to the cold pool, into kv->bkp_pos / bkp_key (key: hits, ties to the
 * oldest). Always written and not a sink; level 0: also outside the window of every row still to
 * come (attended anyway, and without hits since nobody chose them: a prefill batch appends its
 * tokens before its rows attend) and past their residence; 1: outside those windows; 2: any, the
 * oldest first (what static placement does). Returns how many. */
static int32_t victims(tr_kv *kv, const tr_kv_layer *L, int level) {
    const int32_t n_sink = kv->params.n_sink;
    const int32_t win_lo = L->att_hi + 2 - kv->params.n_window; /* the next row's window */
    const float inv = 1.0f / (float)kv->shape.n_ctx;
    int32_t n = 0;
    for (int32_t s = 0; s < kv->hot_slots; s++) {
        const int32_t p = L->slot_pos[s];
        if (p < n_sink || p / TR_KV_PAGE >= L->pages_written) continue; /* free, sink, no copy */
        if (level < 2 && p >= win_lo) continue;
        if (level < 1 && recently_moved(kv, L, p, 1)) continue;
        kv->bkp_pos[n] = p;
        /* topk takes the largest */
        kv->bkp_key[n] = level < 2 ? -((float)L->tok[p].hits + (float)p * inv) : -(float)p;
        n++;
    }
    return n;
}

static int cmp_key_desc(const void *a, const void *b, void *ctx) {
    const float *k = ctx;
    const float x = k[*(const int32_t *)a], y = k[*(const int32_t *)b];
    return x > y ? -1 : x < y;
}

/* the k weakest victims, weakest first, in kv->bkp_idx[0..k) */
static int32_t weakest(tr_kv *kv, int32_t n, int32_t k) {
    if (k > n) k = n;
    for (int32_t i = 0; i < n; i++) kv->bkp_idx[i] = i;
    tr_kv_topk(kv->bkp_key, kv->bkp_idx, n, k);
    qsort_r(kv->bkp_idx, (size_t)k, sizeof(int32_t), cmp_key_desc, kv->bkp_key);
    return k;
}

bool tr_kv_make_room(tr_kv *kv, tr_kv_layer *L) {
    if (L->n_free) return true;
    /* a batch, so that the scan over the hot slots is paid once per batch of appends */
    int32_t batch = kv->hot_slots / 32;
    if (batch < 1) batch = 1;
    /* the budget is hard: residence, then the window, give way if nothing else can go */
    int32_t n = 0;
    for (int level = 0; level < 3 && !n; level++) n = victims(kv, L, level);
    const int32_t k = weakest(kv, n, batch);
    for (int32_t i = 0; i < k; i++) demote(kv, L, kv->bkp_pos[kv->bkp_idx[i]]);
    return k > 0;
}

void tr_kv_bkp_step(tr_kv *kv, tr_kv_layer *L) {
    (void)kv;
    L->step++;
    const uint32_t round = (1u << KV_BKP_DECAY_SHIFT) - 1; /* up: one hit fades out in time */
    for (int32_t t = 0; t < L->len; t++)
        L->tok[t].hits -= (uint16_t)((L->tok[t].hits + round) >> KV_BKP_DECAY_SHIFT);
}

typedef struct cand_ctx {
    const tr_kv_layer *L;
    const int32_t *T;
} cand_ctx;

static int cmp_cand(const void *a, const void *b, void *ctx) {
    const cand_ctx *c = ctx;
    const int x = c->L->tok[c->T[*(const int32_t *)a]].hits;
    const int y = c->L->tok[c->T[*(const int32_t *)b]].hits;
    return y - x;
}

static void promote(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec) {
    const uint32_t slot = L->free_slots[--L->n_free];
    memcpy(L->hot + (size_t)slot * kv->rec, rec, kv->rec);
    L->tok[pos].slot = slot;
    L->tok[pos].where = TR_KV_TOK_HOT;
    L->slot_pos[slot] = pos;
    kv->promotions++;
    kv->migrated_bytes += kv->rec;
    note_move(kv, L, pos, 1);
}

void tr_kv_bkp_promote(tr_kv *kv, tr_kv_layer *L, const int32_t *T, int32_t c0, int32_t c1,
                       const uint8_t *skip, int32_t slot0) {
    if (kv->params.bkp == TR_KV_BKP_OFF || !kv->cold) return;
    const bool on = kv->params.bkp == TR_KV_BKP_ON;
    int32_t *cand = kv->bkp_cand, nc = 0;
    for (int32_t i = c0; i < c1; i++) {
        const int32_t p = T[i];
        if ((skip && skip[i]) || L->tok[p].where != TR_KV_TOK_COLD) continue;
        if (on && (L->tok[p].hits < KV_BKP_PROMOTE || recently_moved(kv, L, p, 0))) continue;
        cand[nc++] = i;
    }
    if (!nc) return;
    cand_ctx cc = {L, T};
    qsort_r(cand, (size_t)nc, sizeof *cand, cmp_cand, &cc); /* most hits first */
    int32_t ci = 0;
    for (; ci < nc && L->n_free; ci++)
        promote(kv, L, T[cand[ci]], kv->ws + (size_t)(slot0 + cand[ci] - c0) * kv->rec);
    if (ci == nc) return;
    const int32_t k = weakest(kv, victims(kv, L, 0), nc - ci);
    for (int32_t v = 0; v < k && ci < nc; v++, ci++) {
        const int32_t vp = kv->bkp_pos[kv->bkp_idx[v]], cp = T[cand[ci]];
        if (on && L->tok[cp].hits < L->tok[vp].hits + KV_BKP_MARGIN) break;
        demote(kv, L, vp);
        promote(kv, L, cp, kv->ws + (size_t)(slot0 + cand[ci] - c0) * kv->rec);
    }
}
