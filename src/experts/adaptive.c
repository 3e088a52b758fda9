/*
 * knn and adaptive expert-cache policies (see adaptive.h for what they do and why).
 *
 * Fingerprint ring. Token tok's choice at layer l is a bitmask of n_expert bits (W words) at
 * ring[(tok mod HIST) * L + l]. A layer step with R rows (a prefill batch: R tokens, row-major
 * top-k) records R tokens; a step whose layer is not after the previous step's starts the next
 * token cycle, so the ring follows the forward pass without being told where tokens begin.
 *
 * Similarity by lag. During single-row (decode) cycles, S[d] is the overlap between the window
 * "token t's layers up to the current one, token t-1's after it" and the same window d tokens
 * earlier. Indexed by lag, S does not change when a token ends; each layer step j adds
 * |t ∩ (t-d)| and removes |(t-1) ∩ (t-1-d)| at layer j. After a batch it is recomputed once.
 *
 * A prediction at (t, j) takes the NEIGH lags with the largest S and, per layer m, adds the
 * weight S^3 to every expert the neighbour chose at the aligned next visit: token t-d for the
 * layers still ahead in this token (m > j), t-d+1 for those already passed (m <= j, whose next
 * visit is token t+1). The largest lag, d = 1, is the recent past itself, so when routing simply
 * repeats the predictor behaves like recency.
 */
#include "experts/adaptive.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "experts/policy_internal.h"

#define HIST  512 /* tokens of routing history: the window neighbours are searched in */
#define NEIGH 32  /* neighbours a prediction uses (on the shared trace, 32 of 155 = all) */
/* Shadow hits are summed with this weight per token of age: the leader is the rule that did
 * best over the last few dozen tokens, so a change of regime (a new turn, a new topic) is
 * followed within a few tokens while one unlucky token does not flip it. */
#define SCORE_KEEP 0.97

enum { R_KNN, R_LAYERED, R_LFU, R_LRU };
_Static_assert(TR_POLICY_N_RULES == 4, "rules");

static const char *const k_rule_names[TR_POLICY_N_RULES] = {"knn", "layered", "lfu", "lru"};

const char *tr_policy_rule_name(int rule) {
    return rule >= 0 && rule < TR_POLICY_N_RULES ? k_rule_names[rule] : "?";
}

typedef struct shadow {
    uint8_t *res;             /* [n_keys] resident in this shadow */
    uint32_t *list, *pos, n;  /* its residents, for scans */
    uint64_t used, *layer_used;
    double score;             /* decayed decode hits */
} shadow;

struct tr_adapt {
    bool duel;
    int32_t L, E, K, W;
    uint32_t n_keys;
    uint64_t *sb; /* [L] bytes a shadow charges for an expert of layer l */

    uint64_t *ring; /* [HIST][L][W] */
    int64_t n_tok;  /* tokens recorded so far */
    int64_t cyc_base;
    int32_t cyc_rows, last_layer;
    bool cyc_single;

    double *S; /* [HIST] similarity by lag */
    bool S_valid;
    int64_t S_tok;

    float *acc;      /* [n_keys] prediction of the current step */
    uint64_t step, acc_step;
    int32_t cur_layer;
    uint64_t *in_step; /* [n_keys] the step in which the key was last routed or looked up */
    int32_t *nb_lag;   /* [NEIGH] */
    double *nb_w;

    shadow sh[TR_POLICY_N_RULES];
    int lead;
    uint64_t lead_steps[TR_POLICY_N_RULES];
};

/* ---------------------------------------------------------------------------------------------- */
/* Fingerprints                                                                                   */

static uint64_t *mask_at(const tr_adapt *a, int64_t tok, int32_t layer) {
    if (tok < 0 || tok >= a->n_tok || tok < a->n_tok - HIST) return NULL;
    return a->ring + ((size_t)(tok % HIST) * (size_t)a->L + (size_t)layer) * (size_t)a->W;
}

static int overlap(const tr_adapt *a, int64_t x, int64_t y, int32_t layer) {
    const uint64_t *mx = mask_at(a, x, layer), *my = mask_at(a, y, layer);
    if (!mx || !my) return 0;
    int n = 0;
    for (int32_t w = 0; w < a->W; w++) n += __builtin_popcountll(mx[w] & my[w]);
    return n;
}

static int32_t max_lag(int64_t t) {
    return (int32_t)(t < HIST - 2 ? t : HIST - 2);
}

/* S for the window ending at (t, j), from scratch */
static void similarity_full(tr_adapt *a, int64_t t, int32_t j) {
    const int32_t dmax = max_lag(t);
    for (int32_t d = 1; d <= dmax; d++) {
        double s = 0;
        for (int32_t m = 0; m < a->L; m++)
            s += m <= j ? overlap(a, t, t - d, m) : overlap(a, t - 1, t - 1 - d, m);
        a->S[d] = s;
    }
    a->S_valid = true;
    a->S_tok = t;
}

/* S moves from the window ending before layer j of token t to the one ending at it */
static void similarity_step(tr_adapt *a, int64_t t, int32_t j) {
    if (!a->S_valid || (a->S_tok != t && a->S_tok != t - 1)) {
        similarity_full(a, t, j);
        return;
    }
    const int32_t dmax = max_lag(t);
    if (a->S_tok == t - 1 && dmax == t) a->S[dmax] = 0; /* a lag seen for the first time */
    for (int32_t d = 1; d <= dmax; d++)
        a->S[d] += overlap(a, t, t - d, j) - overlap(a, t - 1, t - 1 - d, j);
    a->S_tok = t;
}

/* acc = the neighbours' vote for each key's use at its layer's next visit */
static void predict(tr_adapt *a) {
    if (a->acc_step == a->step) return;
    a->acc_step = a->step;
    memset(a->acc, 0, (size_t)a->n_keys * sizeof *a->acc);
    if (!a->cyc_single || !a->S_valid) return; /* inside a batch: ties go to the LRFU value */
    const int64_t t = a->cyc_base;
    const int32_t j = a->cur_layer;
    /* the NEIGH largest S: a min-heap on S (ties: the smaller lag, the more recent, stays) */
    int n = 0;
    const int32_t dmax = max_lag(t);
    for (int32_t d = 1; d <= dmax; d++) {
        const double s = a->S[d];
        if (s <= 0) continue;
        if (n < NEIGH) {
            int i = n++;
            while (i > 0 && a->nb_w[(i - 1) / 2] > s) {
                a->nb_w[i] = a->nb_w[(i - 1) / 2];
                a->nb_lag[i] = a->nb_lag[(i - 1) / 2];
                i = (i - 1) / 2;
            }
            a->nb_w[i] = s;
            a->nb_lag[i] = d;
        } else if (s > a->nb_w[0]) {
            int i = 0;
            for (;;) {
                int c = 2 * i + 1;
                if (c >= n) break;
                if (c + 1 < n && a->nb_w[c + 1] < a->nb_w[c]) c++;
                if (a->nb_w[c] >= s) break;
                a->nb_w[i] = a->nb_w[c];
                a->nb_lag[i] = a->nb_lag[c];
                i = c;
            }
            a->nb_w[i] = s;
            a->nb_lag[i] = d;
        }
    }
    for (int i = 0; i < n; i++) {
        const double s = a->nb_w[i];
        const float w = (float)(s * s * s);
        const int32_t d = a->nb_lag[i];
        for (int32_t m = 0; m < a->L; m++) {
            const uint64_t *mk = mask_at(a, m > j ? t - d : t - d + 1, m);
            if (!mk) continue;
            float *row = a->acc + (size_t)m * (size_t)a->E;
            for (int32_t wd = 0; wd < a->W; wd++)
                for (uint64_t bits = mk[wd]; bits; bits &= bits - 1)
                    row[wd * 64 + __builtin_ctzll(bits)] += w;
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* Rules: the victim is the candidate with the smallest key, compared lexicographically            */

typedef struct rkey {
    double a, b;
    uint64_t c;
} rkey;

static bool rless(rkey x, rkey y) {
    if (x.a != y.a) return x.a < y.a;
    if (x.b != y.b) return x.b < y.b;
    return x.c < y.c;
}

static rkey rule_key(const tr_adapt *a, const tr_policy *p, int rule, uint32_t k) {
    switch (rule) {
    case R_LRU: return (rkey){(double)p->stamp[k], 0, 0};
    case R_LFU: return (rkey){(double)p->freq[k], (double)p->stamp[k], 0};
    /* layered's order; equal values: the most recent goes (see rekey in policy.c) */
    case R_LAYERED: return (rkey){tr_policy_lrfu_value(p, k), 0, UINT64_MAX - p->stamp[k]};
    default:
        return (rkey){(double)a->acc[k], tr_policy_lrfu_value(p, k), UINT64_MAX - p->stamp[k]};
    }
}

/* smallest key among list[0..n) (skipping keys of the current step when skip_step), restricted
 * to layer `only` when >= 0; UINT32_MAX when none */
static uint32_t scan(const tr_adapt *a, const tr_policy *p, int rule, const uint32_t *list,
                     uint32_t n, bool skip_step, int32_t only) {
    uint32_t best = UINT32_MAX;
    rkey bk = {0, 0, 0};
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t k = list[i];
        if (skip_step && a->in_step[k] == a->step) continue;
        if (only >= 0 && (int32_t)(k / (uint32_t)a->E) != only) continue;
        const rkey rk = rule_key(a, p, rule, k);
        if (best == UINT32_MAX || rless(rk, bk)) {
            best = k;
            bk = rk;
        }
    }
    return best;
}

static uint32_t victim(tr_adapt *a, const tr_policy *p, int rule, const uint32_t *list, uint32_t n,
                       const uint64_t *layer_used, bool skip_step, int32_t staging,
                       uint64_t incoming) {
    if (rule == R_KNN) predict(a);
    /* layered: a layer over its fair share pays for its own misses */
    if (rule == R_LAYERED && staging >= 0 && layer_used[staging] + incoming > p->share[staging]) {
        const uint32_t v = scan(a, p, rule, list, n, skip_step, staging);
        if (v != UINT32_MAX) return v;
    }
    return scan(a, p, rule, list, n, skip_step, -1);
}

/* ---------------------------------------------------------------------------------------------- */
/* Shadows                                                                                        */

static void shadow_add(tr_adapt *a, shadow *s, uint32_t k) {
    s->res[k] = 1;
    s->pos[k] = s->n;
    s->list[s->n++] = k;
    const uint32_t l = k / (uint32_t)a->E;
    s->used += a->sb[l];
    s->layer_used[l] += a->sb[l];
}

static void shadow_del(tr_adapt *a, shadow *s, uint32_t k) {
    const uint32_t i = s->pos[k], last = s->list[--s->n];
    s->list[i] = last;
    s->pos[last] = i;
    s->res[k] = 0;
    const uint32_t l = k / (uint32_t)a->E;
    s->used -= a->sb[l];
    s->layer_used[l] -= a->sb[l];
}

/* A miss in a shadow: admit k, evicting by the shadow's rule everything but this step's keys (the
 * shadow's pins). A prefill step bigger than the budget leaves it over until later admits. */
static void shadow_miss(tr_adapt *a, const tr_policy *p, int rule, uint32_t k) {
    shadow *s = &a->sh[rule];
    const int32_t layer = (int32_t)(k / (uint32_t)a->E);
    const uint64_t b = a->sb[layer];
    while (s->used + b > p->budget) {
        const uint32_t v = victim(a, p, rule, s->list, s->n, s->layer_used, true, layer, b);
        if (v == UINT32_MAX) break;
        shadow_del(a, s, v);
    }
    shadow_add(a, s, k);
}

/* ---------------------------------------------------------------------------------------------- */

void tr_adapt_free(tr_adapt *a) {
    if (!a) return;
    for (int r = 0; r < TR_POLICY_N_RULES; r++) {
        free(a->sh[r].res);
        free(a->sh[r].list);
        free(a->sh[r].pos);
        free(a->sh[r].layer_used);
    }
    free(a->sb);
    free(a->ring);
    free(a->S);
    free(a->acc);
    free(a->in_step);
    free(a->nb_lag);
    free(a->nb_w);
    free(a);
}

#define ALLOC(ptr, n) (((ptr) = calloc((n) ? (n) : 1, sizeof *(ptr))) != NULL)

tr_adapt *tr_adapt_create(const tr_policy *p, bool duel) {
    tr_adapt *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->duel = duel;
    a->L = p->n_layer;
    a->E = p->n_expert;
    a->K = p->n_expert_used > 0 ? p->n_expert_used : 1;
    a->W = (p->n_expert + 63) / 64;
    a->n_keys = p->n_keys;
    a->last_layer = -1;
    a->acc_step = UINT64_MAX;
    const size_t nk = a->n_keys, nl = (size_t)a->L;
    const size_t ring_words = nl * (size_t)a->W * HIST;
    bool ok = ALLOC(a->sb, nl) && ALLOC(a->ring, ring_words) &&
              ALLOC(a->S, HIST) && ALLOC(a->acc, nk) && ALLOC(a->in_step, nk) &&
              ALLOC(a->nb_lag, NEIGH) && ALLOC(a->nb_w, NEIGH);
    for (int r = 0; ok && duel && r < TR_POLICY_N_RULES; r++)
        ok = ALLOC(a->sh[r].res, nk) && ALLOC(a->sh[r].list, nk) && ALLOC(a->sh[r].pos, nk) &&
             ALLOC(a->sh[r].layer_used, nl);
    if (!ok) {
        tr_adapt_free(a);
        return NULL;
    }
    /* a key of a layer this policy was given no size for (the cache lends a larger class's slot
     * to a smaller layer) is charged the largest size */
    uint64_t big = 1;
    for (size_t l = 0; l < nl; l++) big = p->layer_bytes[l] > big ? p->layer_bytes[l] : big;
    for (size_t l = 0; l < nl; l++) a->sb[l] = p->layer_bytes[l] ? p->layer_bytes[l] : big;
    for (size_t k = 0; k < nk; k++) a->in_step[k] = UINT64_MAX;
    return a;
}

void tr_adapt_route(tr_adapt *a, const tr_policy *p, int32_t layer,
                    const tr_policy_route_info *info) {
    a->step++;
    a->cur_layer = layer;
    int32_t rows = 1;
    if (info && info->n >= a->K && info->n % a->K == 0) rows = info->n / a->K;
    if (a->last_layer < 0 || layer <= a->last_layer || rows != a->cyc_rows) {
        /* a new token cycle */
        a->cyc_base = a->n_tok;
        a->cyc_rows = rows;
        a->n_tok += rows;
        a->cyc_single = rows == 1;
        const int32_t keep = rows < HIST ? rows : HIST;
        for (int32_t r = rows - keep; r < rows; r++)
            memset(mask_at(a, a->cyc_base + r, 0), 0,
                   (size_t)a->L * (size_t)a->W * sizeof *a->ring);
        if (!a->cyc_single) a->S_valid = false;
        if (a->duel && a->cyc_single) {
            /* a rule takes the lead only when strictly ahead: on a tie the current one stays */
            int best = a->lead;
            for (int r = 0; r < TR_POLICY_N_RULES; r++) a->sh[r].score *= SCORE_KEEP;
            for (int r = 0; r < TR_POLICY_N_RULES; r++)
                if (a->sh[r].score > a->sh[best].score) best = r;
            a->lead = best;
        }
    }
    a->last_layer = layer;
    if (info && info->n > 0) {
        const int32_t per = rows > 1 ? a->K : info->n;
        for (int32_t i = 0; i < info->n; i++) {
            const int32_t r = rows > 1 ? i / per : 0;
            const int32_t e = info->experts[i];
            uint64_t *mk = mask_at(a, a->cyc_base + r, layer);
            if (mk) mk[e / 64] |= 1ull << (e % 64);
            a->in_step[(uint32_t)layer * (uint32_t)a->E + (uint32_t)e] = a->step;
        }
    }
    if (a->cyc_single) {
        similarity_step(a, a->cyc_base, layer);
        if (a->duel) a->lead_steps[a->lead]++;
    }
    (void)p;
}

void tr_adapt_access(tr_adapt *a, const tr_policy *p, uint32_t k) {
    a->in_step[k] = a->step;
    if (!a->duel) return;
    for (int r = 0; r < TR_POLICY_N_RULES; r++) {
        if (a->sh[r].res[k]) {
            a->sh[r].score += a->cyc_single;
            continue;
        }
        shadow_miss(a, p, r, k);
    }
}

uint32_t tr_adapt_victim(tr_adapt *a, const tr_policy *p, int32_t staging, uint64_t incoming) {
    const int rule = a->duel ? a->lead : R_KNN;
    return victim(a, p, rule, p->ev, p->ev_n, p->layer_used, false, staging, incoming);
}

void tr_adapt_lead_steps(const tr_adapt *a, uint64_t *out) {
    for (int r = 0; r < TR_POLICY_N_RULES; r++) out[r] = a->lead_steps[r];
}
