/*
 * knn and adaptive expert-cache policies (see adaptive.h for what they do and why).
 *
 * Fingerprint ring. Token tok's choice at layer l is a bitmask of n_expert bits (W words) at
 * ring[l * HIST + tok mod HIST]: one layer's history is contiguous, as the similarity update
 * reads it (every lag at one layer). A layer step with R rows (a prefill batch: R tokens, row-major
 * top-k) records R tokens; a step whose layer is not after the previous step's starts the next
 * token cycle, so the ring follows the forward pass without being told where tokens begin.
 *
 * Similarity by lag. During single-row (decode) cycles, S[d] is the overlap between the window
 * "token t's layers up to the current one, token t-1's after it" and the same window d tokens
 * earlier. Indexed by lag, S does not change when a token ends; each layer step j adds
 * |t ∩ (t-d)| and removes |(t-1) ∩ (t-1-d)| at layer j. After a batch it is recomputed once.
 *
 * A prediction at (t, j) takes the NEIGH lags with the largest S and, per layer m, adds S^3 to
 * every expert the neighbour chose at the aligned next visit: token t-d for the layers still
 * ahead in this token (m > j), t-d+1 for those already passed (m <= j, next visited at t+1). The
 * smallest lag, d = 1, is the recent past itself, so when routing simply repeats, the predictor
 * behaves like recency. Each neighbour also votes, at half the weight per token, for its choices
 * at the few tokens after that visit (HORIZON).
 */
#include "experts/adaptive.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "core/error.h"
#include "experts/policy_internal.h"

#define HIST  512 /* tokens of routing history: the window neighbours are searched in */
/* neighbours a prediction uses: on the shared trace and the generated ones 16 give the hit rates
 * of 32 within 0.1 points (0.4 on the shuffled trace, where neighbours mean little), at half the
 * cost */
#define NEIGH 16
/* A neighbour votes for what it chose at the aligned next visit and at the HORIZON-1 tokens
 * after it, the weight halving per token. Belady keeps what is used soonest; a vote for the next
 * visit alone leaves every expert the neighbours used only a little later at zero, where the
 * recency tie-break cannot tell them from the ones never used again. Halving makes a neighbour's
 * nearer use outweigh all of its later ones together (1 > 1/2 + 1/4 + 1/8), so the vote ranks by
 * the neighbours' reuse distance first; 4 tokens leave what lies beyond below an eighth of a
 * next-visit vote. */
#define HORIZON 4
/* Shadow hits are summed with this weight per token of age: the leader is the rule that did
 * best over the last few dozen tokens, so a change of regime (a new turn, a new topic) is
 * followed within a few tokens while one unlucky token does not flip it. */
#define SCORE_KEEP 0.97
/* A score is a (decayed) count of shadow hits, whose noise grows as its square root (a Poisson
 * count's). A rule ahead by less than that is as likely luck as a better order, and following it
 * costs: the real cache's resident set was built by the leader's order, and a change starts it
 * over. Where two rules were within a tenth of a point of each other, following whichever was
 * ahead one token late cost a point to both. Half a standard deviation: of 0, 0.5 and 1, tried
 * on the two generated traces where the floor failed (route_traces.py's mixed and relabeled),
 * 0.5 met it on both, and it meets it on every other trace (bench/results/replay.md). */
#define LEAD_MARGIN 0.5

enum { R_KNN, R_LAYERED, R_LRU, R_LFU };
_Static_assert(TR_POLICY_N_RULES == 4, "rules");

static const char *const k_rule_names[TR_POLICY_N_RULES] = {"knn", "layered", "lru", "lfu"};
static const tr_policy_kind k_rule_kinds[TR_POLICY_N_RULES] = {TR_POLICY_KNN, TR_POLICY_LAYERED,
                                                               TR_POLICY_LRU, TR_POLICY_LFU};

const char *tr_policy_rule_name(int rule) {
    return rule >= 0 && rule < TR_POLICY_N_RULES ? k_rule_names[rule] : "?";
}

/* popcount without relying on the POPCNT instruction (the baseline build has none) */
static inline int popcount64(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ull);
    x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
    return (int)((x * 0x0101010101010101ull) >> 56);
}

/* ---------------------------------------------------------------------------------------------- */
/* The predictor                                                                                  */

struct tr_adapt {
    int32_t L, E, K, W;
    uint32_t n_keys;
    uint64_t *ring; /* [L][HIST][W] */
    /* the same choices as lists: [HIST][L][K] ids, [HIST][L] counts. The prediction adds by
     * list: a fixed-length loop, where walking the mask's bits costs a mispredicted branch per
     * word (measured: 3x slower on the shared trace) */
    uint16_t *ids;
    uint8_t *n_ids;
    int64_t n_tok;  /* tokens recorded so far */
    int64_t cyc_base;
    int32_t cyc_rows, last_layer, cur_layer;
    bool cyc_single;
    int32_t *S; /* [HIST] similarity by lag (a sum of overlaps: an integer) */
    /* the W == 1 similarity update: popcounts by the POPCNT instruction where the CPU has it */
    void (*sim_w1)(int32_t *S, const uint64_t *hist, uint64_t cur, uint64_t prev, int32_t ts,
                   int32_t dmax);
    bool S_valid;
    int64_t S_tok;
    float *acc; /* [n_keys] the prediction of the current step */
    uint64_t step;
    /* [L] the step whose prediction each layer's row of acc holds: a policy asks only for the
     * layers it holds experts of (a shadow: the sampled ones), and another asking at the same
     * step adds only the rows still missing */
    uint64_t *acc_step;
    uint64_t all_step; /* the step whose prediction every row holds (the real cache's ask) */
    int32_t *nb_lag; /* [NEIGH] */
    double *nb_s;
    int nb_n;
    uint64_t nb_step; /* the step nb_lag and nb_s were chosen at */
};

static uint64_t *mask_at(const tr_adapt *a, int64_t tok, int32_t layer) {
    if (tok < 0 || tok >= a->n_tok || tok < a->n_tok - HIST) return NULL;
    return a->ring + ((size_t)layer * HIST + (size_t)(tok % HIST)) * (size_t)a->W;
}

static size_t slot_of(int64_t tok) { return (size_t)(tok % HIST); }

static bool have(const tr_adapt *a, int64_t tok) {
    return tok >= 0 && tok < a->n_tok && tok >= a->n_tok - HIST;
}

static int overlap(const tr_adapt *a, int64_t x, int64_t y, int32_t layer) {
    const uint64_t *mx = mask_at(a, x, layer), *my = mask_at(a, y, layer);
    if (!mx || !my) return 0;
    int n = 0;
    for (int32_t w = 0; w < a->W; w++) n += popcount64(mx[w] & my[w]);
    return n;
}

static int32_t max_lag(int64_t t) { return (int32_t)(t < HIST - 2 ? t : HIST - 2); }

/* S for the window ending at (t, j), from scratch */
static void similarity_full(tr_adapt *a, int64_t t, int32_t j) {
    const int32_t dmax = max_lag(t);
    for (int32_t d = 1; d <= dmax; d++) {
        int32_t s = 0;
        for (int32_t m = 0; m < a->L; m++)
            s += m <= j ? overlap(a, t, t - d, m) : overlap(a, t - 1, t - 1 - d, m);
        a->S[d] = s;
    }
    a->S_valid = true;
    a->S_tok = t;
}

/* S moves from the window ending before layer j of token t to the one ending at it: layer j of
 * token t comes in, layer j of token t-1 goes out. The term going out is recomputed from the
 * ring rather than kept from when it came in: token t-1-d's mask is the neighbour of token
 * t-d's, on the line the update reads anyway, so a kept copy would only add lines to touch.
 * (Every MoE layer is routed once per token, so token t-1's layer j is the step the kept term
 * came from; the lags reach t-1-d >= t+1-HIST, still in the ring.) */
static void similarity_step(tr_adapt *a, int64_t t, int32_t j) {
    if (!a->S_valid || (a->S_tok != t && a->S_tok != t - 1)) {
        similarity_full(a, t, j);
        return;
    }
    const int32_t dmax = max_lag(t);
    const uint64_t *cur = mask_at(a, t, j);
    if (a->W == 1) {
        const uint64_t *prev = mask_at(a, t - 1, j);
        a->sim_w1(a->S, a->ring + (size_t)j * HIST, cur[0], prev ? prev[0] : 0,
                  (int32_t)(t % HIST), dmax);
    } else {
        for (int32_t d = 1; d <= dmax; d++)
            a->S[d] += overlap(a, t, t - d, j) - overlap(a, t - 1, t - 1 - d, j);
    }
    a->S_tok = t;
}

/* One layer's share of the similarity update for one-word masks: for every lag d, the overlap
 * of cur with the choice d tokens earlier (ring slot (ts - d) mod HIST: HIST is a power of two,
 * so the mask also maps the lags that wrap) replaces that of prev (the token before's choice)
 * with the one d tokens before it. */
_Static_assert((HIST & (HIST - 1)) == 0, "HIST is a power of two");
static void sim_w1_ref(int32_t *S, const uint64_t *hist, uint64_t cur, uint64_t prev, int32_t ts,
                       int32_t dmax) {
    for (int32_t d = 1; d <= dmax; d++)
        S[d] += popcount64(cur & hist[(ts - d) & (HIST - 1)]) -
                popcount64(prev & hist[(ts - 1 - d) & (HIST - 1)]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("popcnt"))) static void sim_w1_popcnt(int32_t *S, const uint64_t *hist,
                                                            uint64_t cur, uint64_t prev,
                                                            int32_t ts, int32_t dmax) {
    for (int32_t d = 1; d <= dmax; d++)
        S[d] += __builtin_popcountll(cur & hist[(ts - d) & (HIST - 1)]) -
                __builtin_popcountll(prev & hist[(ts - 1 - d) & (HIST - 1)]);
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* S[d] += sign * |m & hist[(t0 - d) mod HIST]| for d = 1..dmax, eight lags per instruction
 * (AVX512_VPOPCNTDQ): the lags d..d+7 read the ring slots t0-d-7..t0-d, one load reversed,
 * unless they wrap around the ring's start, where (as in the tail) the lags go one by one. */
__attribute__((target("avx512f,avx512vpopcntdq,popcnt"))) static void
sim_pass_vpopcnt(int32_t *S, const uint64_t *hist, uint64_t m, int32_t t0, int32_t dmax,
                 bool add) {
    const __m512i mv = _mm512_set1_epi64((long long)m);
    const __m512i rev = _mm512_set_epi64(0, 1, 2, 3, 4, 5, 6, 7); /* lane k <- lane 7 - k */
    int32_t d = 1;
    while (d <= dmax) {
        const int32_t hi = (t0 - d) & (HIST - 1);
        if (d + 7 <= dmax && hi >= 7) {
            const __m512i h = _mm512_permutexvar_epi64(rev, _mm512_loadu_si512(hist + hi - 7));
            const __m256i c = _mm512_cvtepi64_epi32(_mm512_popcnt_epi64(_mm512_and_si512(h, mv)));
            __m256i *sp = (__m256i *)(void *)(S + d);
            const __m256i sv = _mm256_loadu_si256(sp);
            _mm256_storeu_si256(sp, add ? _mm256_add_epi32(sv, c) : _mm256_sub_epi32(sv, c));
            d += 8;
        } else {
            const int32_t n = __builtin_popcountll(m & hist[hi]);
            S[d] += add ? n : -n;
            d++;
        }
    }
}

__attribute__((target("avx512f,avx512vpopcntdq,popcnt"))) static void
sim_w1_vpopcnt(int32_t *S, const uint64_t *hist, uint64_t cur, uint64_t prev, int32_t ts,
               int32_t dmax) {
    /* the incoming term, then the outgoing one: the sums are integers, so the order of the two
     * passes gives the same S as the reference's one pass */
    sim_pass_vpopcnt(S, hist, cur, ts, dmax, true);
    sim_pass_vpopcnt(S, hist, prev, ts - 1, dmax, false);
}
#endif

/* the update the CPU runs fastest. TERRACE_ISA lowers the choice as for the kernels: "scalar"
 * keeps the reference, "avx2" the POPCNT one (no AVX-512). */
static void choose_sim(tr_adapt *a) {
    a->sim_w1 = sim_w1_ref;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    const char *isa = getenv("TERRACE_ISA");
    if (isa && !strcmp(isa, "scalar")) return;
    if (__builtin_cpu_supports("popcnt")) a->sim_w1 = sim_w1_popcnt;
    if (isa && !strcmp(isa, "avx2")) return;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vpopcntdq"))
        a->sim_w1 = sim_w1_vpopcnt;
#endif
}

/* adds w to the prediction of every expert token slot `slot` chose at layers m0..m1-1. A row
 * holds at most K ids and nearly always exactly K: the switch adds them with one jump per row
 * instead of a loop's test per id (on the shared trace, top-6, the loop's remainder of two ids
 * cost a third of the predictor's instructions). The ids of one row are distinct, so the adds are
 * independent and their order within a row does not change any sum. */
static void vote(tr_adapt *a, size_t slot, int32_t m0, int32_t m1, float w) {
    const size_t K = (size_t)a->K, E = (size_t)a->E;
    const uint16_t *id = a->ids + (slot * (size_t)a->L + (size_t)m0) * K;
    const uint8_t *nid = a->n_ids + slot * (size_t)a->L + (size_t)m0;
    float *out = a->acc + (size_t)m0 * E;
    for (int32_t m = m0; m < m1; m++, id += K, nid++, out += E) {
        int32_t q = *nid;
        for (; q > 8; q--) out[id[q - 1]] += w;
        switch (q) {
        case 8: out[id[7]] += w; /* fallthrough */
        case 7: out[id[6]] += w; /* fallthrough */
        case 6: out[id[5]] += w; /* fallthrough */
        case 5: out[id[4]] += w; /* fallthrough */
        case 4: out[id[3]] += w; /* fallthrough */
        case 3: out[id[2]] += w; /* fallthrough */
        case 2: out[id[1]] += w; /* fallthrough */
        case 1: out[id[0]] += w; /* fallthrough */
        default: break;
        }
    }
}

/* Row by row, each neighbour's votes in the order of the whole-table loop (neighbour by
 * neighbour, token by token), so every key receives the same float adds in the same order and a
 * row is bit for bit what a prediction of all layers gives. */
const float *tr_adapt_predict_layers(tr_adapt *a, const uint64_t *need) {
    if (a->all_step == a->step) return a->acc; /* the common ask again: no pass over the rows */
    const int32_t L = a->L;
    int32_t n_row = 0;
    for (int32_t m = 0; m < L; m++) n_row += (!need || need[m]) && a->acc_step[m] != a->step;
    if (!n_row) return a->acc;
    const size_t E = (size_t)a->E;
    const int64_t t = a->cyc_base;
    const int32_t j = a->cur_layer;
    /* the NEIGH largest S: a min-heap on S (none inside a batch: the LRFU order decides), once
     * per step */
    int n = 0;
    const int32_t dmax = a->cyc_single && a->S_valid && a->nb_step != a->step ? max_lag(t) : 0;
    if (a->nb_step == a->step) n = a->nb_n;
    for (int32_t d = 1; d <= dmax; d++) {
        const double s = (double)a->S[d];
        if (s <= 0 || (n == NEIGH && s <= a->nb_s[0])) continue;
        int i;
        if (n < NEIGH) {
            i = n++;
            while (i > 0 && a->nb_s[(i - 1) / 2] > s) {
                a->nb_s[i] = a->nb_s[(i - 1) / 2];
                a->nb_lag[i] = a->nb_lag[(i - 1) / 2];
                i = (i - 1) / 2;
            }
        } else {
            i = 0;
            for (;;) {
                int c = 2 * i + 1;
                if (c >= n) break;
                if (c + 1 < n && a->nb_s[c + 1] < a->nb_s[c]) c++;
                if (a->nb_s[c] >= s) break;
                a->nb_s[i] = a->nb_s[c];
                a->nb_lag[i] = a->nb_lag[c];
                i = c;
            }
        }
        a->nb_s[i] = s;
        a->nb_lag[i] = d;
    }
    a->nb_step = a->step;
    a->nb_n = n;
    /* per neighbour and token of the horizon: its weight and the slots it votes from, for the
     * layers passed (m <= j: token t-d+1+h, up to t's own) and those ahead (m > j: token
     * t-d+h, up to the last complete one, t-1); -1 where the ring does not hold that token */
    float w_of[NEIGH * HORIZON];
    int32_t lo_slot[NEIGH * HORIZON], hi_slot[NEIGH * HORIZON];
    int nv = 0;
    for (int i = 0; i < n; i++) {
        const double s = a->nb_s[i];
        float w = (float)(s * s * s);
        const int32_t d = a->nb_lag[i];
        for (int32_t h = 0; h < HORIZON; h++, w *= 0.5f, nv++) {
            w_of[nv] = w;
            lo_slot[nv] = t - d + 1 + h <= t && have(a, t - d + 1 + h)
                              ? (int32_t)slot_of(t - d + 1 + h) : -1;
            hi_slot[nv] = t - d + h < t && have(a, t - d + h) ? (int32_t)slot_of(t - d + h) : -1;
        }
    }
    if (n_row == L) { /* every row: the neighbours' rows whole, layer range by layer range */
        memset(a->acc, 0, (size_t)a->n_keys * sizeof *a->acc);
        for (int32_t m = 0; m < L; m++) a->acc_step[m] = a->step;
        a->all_step = a->step;
        for (int v = 0; v < nv; v++) {
            if (lo_slot[v] >= 0) vote(a, (size_t)lo_slot[v], 0, j + 1, w_of[v]);
            if (hi_slot[v] >= 0) vote(a, (size_t)hi_slot[v], j + 1, L, w_of[v]);
        }
        return a->acc;
    }
    for (int32_t m = 0; m < L; m++) {
        if ((need && !need[m]) || a->acc_step[m] == a->step) continue;
        a->acc_step[m] = a->step;
        float *out = a->acc + (size_t)m * E;
        memset(out, 0, E * sizeof *out);
        const int32_t *slots = m <= j ? lo_slot : hi_slot;
        for (int v = 0; v < nv; v++)
            if (slots[v] >= 0) vote(a, (size_t)slots[v], m, m + 1, w_of[v]);
    }
    return a->acc;
}

const float *tr_adapt_predict(tr_adapt *a) { return tr_adapt_predict_layers(a, NULL); }

void tr_adapt_free(tr_adapt *a) {
    if (!a) return;
    free(a->ring);
    free(a->ids);
    free(a->n_ids);
    free(a->S);
    free(a->acc);
    free(a->acc_step);
    free(a->nb_lag);
    free(a->nb_s);
    free(a);
}

#define ALLOC(ptr, n) (((ptr) = calloc((n) ? (n) : 1, sizeof *(ptr))) != NULL)

tr_adapt *tr_adapt_create(int32_t n_layer, int32_t n_expert, int32_t n_expert_used) {
    tr_adapt *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->L = n_layer;
    a->E = n_expert;
    a->K = n_expert_used > 0 ? n_expert_used : 1;
    a->W = (n_expert + 63) / 64;
    a->n_keys = (uint32_t)n_layer * (uint32_t)n_expert;
    a->last_layer = -1;
    choose_sim(a);
    const size_t ring_words = (size_t)a->L * (size_t)a->W * HIST;
    const size_t id_rows = (size_t)a->L * HIST, id_words = id_rows * (size_t)a->K;
    if (n_expert > 65536 || !ALLOC(a->ring, ring_words) ||
        !ALLOC(a->ids, id_words) || !ALLOC(a->n_ids, id_rows) ||
        !ALLOC(a->S, HIST) || !ALLOC(a->acc, a->n_keys) ||
        !ALLOC(a->nb_lag, NEIGH) || !ALLOC(a->nb_s, NEIGH) || !ALLOC(a->acc_step, (size_t)a->L)) {
        tr_adapt_free(a);
        return NULL;
    }
    for (int32_t m = 0; m < a->L; m++) a->acc_step[m] = UINT64_MAX;
    a->nb_step = a->all_step = UINT64_MAX;
    return a;
}

void tr_adapt_route(tr_adapt *a, int32_t layer, const tr_policy_route_info *info) {
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
        for (int32_t r = rows - keep; r < rows; r++) {
            for (int32_t l = 0; l < a->L; l++)
                memset(mask_at(a, a->cyc_base + r, l), 0, (size_t)a->W * sizeof *a->ring);
            memset(a->n_ids + slot_of(a->cyc_base + r) * (size_t)a->L, 0, (size_t)a->L);
        }
        if (!a->cyc_single) a->S_valid = false;
    }
    a->last_layer = layer;
    for (int32_t i = 0; info && i < info->n; i++) {
        const int32_t e = info->experts[i];
        const int64_t tok = a->cyc_base + (rows > 1 ? i / a->K : 0);
        uint64_t *mk = mask_at(a, tok, layer);
        if (!mk || mk[e / 64] >> (e % 64) & 1) continue; /* outside the ring, or a repeat */
        mk[e / 64] |= 1ull << (e % 64);
        const size_t row = slot_of(tok) * (size_t)a->L + (size_t)layer;
        if (a->n_ids[row] < a->K) a->ids[row * (size_t)a->K + a->n_ids[row]++] = (uint16_t)e;
    }
    if (a->cyc_single) similarity_step(a, a->cyc_base, layer);
}

/* ---------------------------------------------------------------------------------------------- */
/* Victims of the real cache (knn, adaptive): the smallest key, compared lexicographically        */

typedef struct rkey {
    double a, b;
    uint64_t c;
} rkey;
_Static_assert(sizeof(rkey) == TR_POLICY_CAND_KEY_BYTES, "candidate key size");

static bool rless(rkey x, rkey y) {
    if (x.a != y.a) return x.a < y.a;
    if (x.b != y.b) return x.b < y.b;
    return x.c < y.c;
}

/* k (at ev position i) with key rk into the sorted prefix p->cand[0..*n) of at most cap keys,
 * after the keys it is not less than: a binary search, since an unordered scan inserts dozens of
 * times before the prefix holds the lowest keys */
static inline void cand_insert(tr_policy *p, rkey *ck, uint32_t *n, uint32_t cap, uint32_t k,
                               rkey rk) {
    if (*n == cap && !rless(rk, ck[*n - 1])) return;
    uint32_t lo = 0, hi = *n;
    while (lo < hi) {
        const uint32_t mid = (lo + hi) / 2;
        if (rless(rk, ck[mid])) hi = mid;
        else lo = mid + 1;
    }
    const uint32_t kept = *n < cap ? (*n)++ : *n - 1; /* full: the largest key drops out */
    memmove(p->cand + lo + 1, p->cand + lo, (kept - lo) * sizeof *p->cand);
    memmove(ck + lo + 1, ck + lo, (kept - lo) * sizeof *ck);
    p->cand[lo] = k;
    ck[lo] = rk;
}

/* the lowest keys among p->ev (only layer `only` when >= 0) into p->cand, ascending. One loop
 * per rule over the ev-ordered copies of the keys' fields (policy_internal.h); most items lose
 * on the key's first two fields, tested before the key is built. Equal keys keep ev's order. */
static void fill_candidates(tr_policy *p, int rule, const float *acc, int32_t only) {
    double *off = p->la; /* scratch [n_layer]: the layer heaps are unused by these kinds */
    for (int32_t l = 0; l < p->n_layer; l++) off[l] = (double)p->visits[l] * p->log_decay;
    uint32_t n = 0;
    const uint32_t cap = p->cand_cap, ne = p->ev_n;
    rkey *ck = (rkey *)p->cand_key;
    const uint32_t *ev = p->ev;
    const uint64_t *st = p->ev_stamp, *fr = p->ev_freq;
    const double *pa = p->ev_pa;
    const int32_t *ly = p->ev_layer;
    const uint8_t *pin = p->ev_pin;
#define SKIP_ABOVE(a_, b_) \
    (n == cap && ((a_) > ck[n - 1].a || ((a_) == ck[n - 1].a && (b_) > ck[n - 1].b)))
    switch (rule) {
    case R_LRU:
        for (uint32_t i = 0; i < ne; i++) {
            if (pin[i] || (only >= 0 && ly[i] != only)) continue;
            const double a = (double)st[i];
            if (SKIP_ABOVE(a, 0.0)) continue;
            cand_insert(p, ck, &n, cap, ev[i], (rkey){a, 0, 0});
        }
        break;
    case R_LFU:
        for (uint32_t i = 0; i < ne; i++) {
            if (pin[i] || (only >= 0 && ly[i] != only)) continue;
            const double a = (double)fr[i], b = (double)st[i];
            if (SKIP_ABOVE(a, b)) continue;
            cand_insert(p, ck, &n, cap, ev[i], (rkey){a, b, 0});
        }
        break;
    /* layered's order; equal values: the most recent goes (see rekey in policy.c) */
    case R_LAYERED:
        for (uint32_t i = 0; i < ne; i++) {
            if (pin[i] || (only >= 0 && ly[i] != only)) continue;
            const double a = pa[i] + off[ly[i]];
            if (SKIP_ABOVE(a, 0.0)) continue;
            cand_insert(p, ck, &n, cap, ev[i], (rkey){a, 0, UINT64_MAX - st[i]});
        }
        break;
    default:
        for (uint32_t i = 0; i < ne; i++) {
            if (pin[i] || (only >= 0 && ly[i] != only)) continue;
            const double a = (double)acc[ev[i]], b = pa[i] + off[ly[i]];
            if (SKIP_ABOVE(a, b)) continue;
            cand_insert(p, ck, &n, cap, ev[i], (rkey){a, b, UINT64_MAX - st[i]});
        }
        break;
    }
#undef SKIP_ABOVE
    p->cand_n = n;
    p->cand_i = 0;
    p->cand_rule = rule;
    p->cand_valid = only < 0;
}

uint32_t tr_adapt_victim(tr_policy *p, int32_t staging, uint64_t incoming) {
    const int rule = p->duel ? tr_duel_lead(p->duel) : R_KNN;
    /* a shadow (knn's, the duel's predictor borrowed) holds the sampled layers only and asks
     * for their rows; the real cache asks for every row, whose whole-table loop costs less than
     * row by row when its size classes (one policy each) hold layers in turn */
    const float *acc = rule != R_KNN ? NULL
                       : p->duel     ? tr_duel_predict(p->duel)
                                     : tr_adapt_predict_layers(p->ad, p->ad_borrowed ? p->layer_used
                                                                                     : NULL);
    /* layered: a layer over its fair share pays for its own misses */
    if (rule == R_LAYERED && staging >= 0 &&
        p->layer_used[staging] + incoming > p->share[staging]) {
        /* its lowest key only: a list of one is that list's first entry (equal keys keep ev's
         * order either way) at a fraction of the inserts */
        const uint32_t cap = p->cand_cap;
        p->cand_cap = 1;
        fill_candidates(p, rule, acc, staging);
        p->cand_cap = cap;
        if (p->cand_n) return p->cand[0];
    }
    for (int pass = 0; pass < 2; pass++) {
        if (!p->cand_valid || p->cand_rule != rule) fill_candidates(p, rule, acc, -1);
        while (p->cand_i < p->cand_n) {
            const uint32_t k = p->cand[p->cand_i++];
            const uint32_t e = p->it[k].ev_pos;
            if (e != NOT_IN_HEAP && !p->ev_pin[e]) return k;
        }
        p->cand_valid = false; /* used up: scan again */
    }
    return UINT32_MAX;
}

/* ---------------------------------------------------------------------------------------------- */
/* Dueling                                                                                        */

/* Shadows simulate a sample of the layers, as set dueling samples cache sets: the MoE layers in
 * blocks of s = ceil(n_moe / SAMPLE_LAYERS) consecutive ones (at most SAMPLE_LAYERS blocks: a
 * model of 9 to 16 layers has 5 to 8 sampled, not all of them, so the shadows' cost stays a small
 * share of the layer steps whatever the depth), and one layer of each block at an offset drawn
 * from a fixed hash of the block, with the budget's share of those layers in a token's working
 * set. Each rule meets the same routing at a fraction of the cost. The offset varies from block to block because a fixed one aliases with any structure
 * that repeats across layers: every 6th layer of 48 is an even one, and on a trace whose odd
 * layers route at random (route_traces.py's "mixed") the shadows never saw the layers where the
 * rules differ and the cache followed the wrong one (1.6 points below LFU). */
#define SAMPLE_LAYERS 8

static uint32_t block_hash(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

struct tr_duel {
    tr_policy *sh[TR_POLICY_N_RULES];
    tr_adapt *pred; /* the routing-neighbour predictor, every layer: the real cache's and knn's */
    bool *sampled;  /* [n_layer] */
    int32_t n_expert, n_expert_used;
    double score[TR_POLICY_N_RULES];
    int lead;
    uint64_t lead_steps[TR_POLICY_N_RULES];
    /* the current step's distinct lookups, replayed into the shadows when it ends */
    int32_t step_layer, *step_ex, step_n;
    uint64_t *seen, step;
    bool step_single;
    int32_t last_layer;
    bool *miss;
};

void tr_duel_free(tr_duel *d) {
    if (!d) return;
    for (int r = 0; r < TR_POLICY_N_RULES; r++) tr_policy_free(d->sh[r]);
    tr_adapt_free(d->pred);
    free(d->sampled);
    free(d->step_ex);
    free(d->seen);
    free(d->miss);
    free(d);
}

tr_status tr_duel_create(const tr_policy_params *pp, tr_duel **out, tr_error *err) {
    *out = NULL;
    tr_duel *d = calloc(1, sizeof *d);
    if (!d) return tr_fail(err, TR_E_NOMEM, "expert policy: out of memory");
    d->n_expert = pp->n_expert;
    d->n_expert_used = pp->n_expert_used;
    d->step_layer = -1;
    d->last_layer = -1;
    const size_t nk = (size_t)pp->n_layer * (size_t)pp->n_expert, nl = (size_t)pp->n_layer;
    uint64_t *eb = calloc(nl, sizeof *eb);
    if (!eb || !ALLOC(d->step_ex, (size_t)pp->n_expert) || !ALLOC(d->seen, nk) ||
        !ALLOC(d->miss, (size_t)pp->n_expert) || !ALLOC(d->sampled, nl) ||
        !(d->pred = tr_adapt_create(pp->n_layer, pp->n_expert, pp->n_expert_used))) {
        free(eb);
        tr_duel_free(d);
        return tr_fail(err, TR_E_NOMEM, "expert policy: out of memory");
    }
    int32_t n_moe = 0;
    for (size_t l = 0; l < nl; l++) n_moe += !pp->expert_bytes || pp->expert_bytes[l] > 0;
    const int32_t stride =
        n_moe > SAMPLE_LAYERS ? (n_moe + SAMPLE_LAYERS - 1) / SAMPLE_LAYERS : 1;
    uint64_t all = 0, part = 0;
    for (int32_t l = 0, i = 0; l < (int32_t)nl; l++) {
        const uint64_t b = pp->expert_bytes ? pp->expert_bytes[l] : 1;
        if (!b) continue;
        all += b;
        const int32_t blk = i / stride, in_blk = i % stride;
        /* the last block may be short: its offset is drawn within what it has */
        const int32_t blk_len = n_moe - blk * stride < stride ? n_moe - blk * stride : stride;
        d->sampled[l] = in_blk == (int32_t)(block_hash((uint32_t)blk + 1) % (uint32_t)blk_len);
        i++;
        if (d->sampled[l]) {
            eb[l] = b;
            part += b;
        }
    }
    uint64_t budget = all ? (uint64_t)((double)pp->budget_bytes * (double)part / (double)all) : 1;
    if (!budget) budget = 1;
    for (int r = 0; r < TR_POLICY_N_RULES; r++) {
        tr_policy_params sp = *pp;
        sp.kind = k_rule_kinds[r];
        sp.future = NULL;
        sp.n_future = 0;
        sp.expert_bytes = eb;
        sp.budget_bytes = budget;
        tr_status s = tr_policy_create(&sp, &d->sh[r], err);
        if (s) {
            free(eb);
            tr_duel_free(d);
            return s;
        }
    }
    free(eb);
    /* knn's shadow votes with the shared predictor, which the duel routes */
    tr_policy *k = d->sh[R_KNN];
    tr_adapt_free(k->ad);
    k->ad = d->pred;
    k->ad_borrowed = true;
    *out = d;
    return TR_OK;
}

/* The step's lookups reach every shadow as a replay batch would: hits pinned, misses admitted
 * (over budget if the step needs it) and pinned, all unpinned, the excess trimmed. */
static void flush_step(tr_duel *d) {
    if (d->step_layer < 0 || !d->step_n || !d->sampled[d->step_layer]) {
        d->step_n = 0;
        return;
    }
    const int32_t l = d->step_layer;
    for (int r = 0; r < TR_POLICY_N_RULES; r++)
        tr_policy_prefetch(d->sh[r], l, d->step_ex, d->step_n);
    for (int r = 0; r < TR_POLICY_N_RULES; r++) {
        tr_policy *s = d->sh[r];
        const uint64_t bytes = s->layer_bytes[l] ? s->layer_bytes[l] : 1;
        uint64_t hits = 0;
        for (int32_t i = 0; i < d->step_n; i++) {
            bool hit = false;
            tr_policy_lookup(s, l, d->step_ex[i], &hit, NULL);
            d->miss[i] = !hit;
            hits += hit;
        }
        if (d->step_single) d->score[r] += (double)hits;
        /* the hits are pinned only against the misses' admits: a step that hit throughout
         * leaves the shadow as it is (the keys are totally ordered, so pinning after all the
         * lookups instead of after each one evicts the same) */
        if (hits == (uint64_t)d->step_n) continue;
        for (int32_t i = 0; i < d->step_n; i++)
            if (!d->miss[i]) tr_policy_pin(s, l, d->step_ex[i], NULL);
        for (int32_t i = 0; i < d->step_n; i++)
            if (d->miss[i] && !tr_policy_admit(s, l, d->step_ex[i], bytes, TR_POLICY_OVERCOMMIT,
                                               NULL))
                tr_policy_pin(s, l, d->step_ex[i], NULL);
        for (int32_t i = 0; i < d->step_n; i++)
            if (tr_policy_resident_bytes(s, l, d->step_ex[i]))
                tr_policy_unpin(s, l, d->step_ex[i], NULL);
        if (s->used > s->budget) tr_policy_trim(s, NULL);
    }
    d->step_n = 0;
}

void tr_duel_route(tr_duel *d, int32_t layer, const tr_policy_route_info *info) {
    flush_step(d); /* before the predictor moves on: knn's shadow votes with that step's vote */
    tr_adapt_route(d->pred, layer, info);
    const bool single = !info || info->n <= d->n_expert_used;
    if (d->last_layer >= 0 && layer <= d->last_layer && single) {
        /* a token boundary: a rule ahead of the leader by more than LEAD_MARGIN standard
         * deviations of the leader's score takes the lead (among several, the best) */
        int best = d->lead;
        for (int r = 0; r < TR_POLICY_N_RULES; r++) d->score[r] *= SCORE_KEEP;
        const double bar = d->score[d->lead] + LEAD_MARGIN * sqrt(d->score[d->lead]);
        for (int r = 0; r < TR_POLICY_N_RULES; r++)
            if (d->score[r] > (best == d->lead ? bar : d->score[best])) best = r;
        d->lead = best;
    }
    d->last_layer = layer;
    d->step++;
    d->step_layer = layer;
    d->step_single = single;
    if (single) d->lead_steps[d->lead]++;
    if (d->sampled[layer])
        for (int r = 0; r < TR_POLICY_N_RULES; r++) tr_policy_route(d->sh[r], layer, info, NULL);
}

void tr_duel_access(tr_duel *d, int32_t layer, int32_t expert) {
    if (!d->sampled[layer]) return;
    if (layer != d->step_layer || d->step_n == d->n_expert) {
        /* lookups without a route in between: each layer change is a step */
        flush_step(d);
        d->step_layer = layer;
        d->step++;
    }
    const size_t k = (size_t)layer * (size_t)d->n_expert + (size_t)expert;
    if (d->seen[k] == d->step + 1) return;
    d->seen[k] = d->step + 1;
    d->step_ex[d->step_n++] = expert;
}

bool tr_duel_feed_now(tr_duel *d) {
    if (!d->step_single || d->step_layer < 0 || !d->step_n) return false;
    const bool work = d->sampled[d->step_layer];
    flush_step(d);
    return work;
}

int tr_duel_lead(const tr_duel *d) { return d->lead; }

const float *tr_duel_predict(tr_duel *d) { return tr_adapt_predict(d->pred); }

void tr_duel_lead_steps(const tr_duel *d, uint64_t *out) {
    for (int r = 0; r < TR_POLICY_N_RULES; r++) out[r] = d->lead_steps[r];
}
