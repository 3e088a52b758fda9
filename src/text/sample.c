/*
 * Sampling chain (include/terrace.h gives the semantics). Performance notes, n_vocab = 262144:
 *   - top-k (and greedy, which is top-k 1) reads the logits once with a bounded heap and never
 *     copies or sorts the vocabulary; penalised window tokens are merged in afterwards.
 *   - Without top-k the logits are copied into the candidate array; top-p then bins the weights
 *     by logit and sorts only the bucket where the cumulative mass crosses p.
 *   - min-p on an unsorted set is a threshold filter on logits (p_i >= min_p * p_max is
 *     logit_i >= max_logit + log(min_p)), no sort.
 * Nothing here allocates after tr_sampler_create (heapsort rather than qsort, which may malloc).
 */
#include "terrace.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"

/* resolution of the top-p bucketing: enough that the crossing bucket holds a small share of a
 * 262144-token vocabulary, small enough to clear per call for nothing */
#define TR_TOPP_BUCKETS 1024

struct tr_sampler {
    tr_sampler_params params;
    int32_t n_vocab;
    uint64_t seed; /* effective seed (drawn once if the params asked for a random one) */
    uint64_t rng[4];

    tr_token_prob *cand; /* [n_vocab] working set, rebuilt per call */

    /* penalties: the last repeat_last_n accepted tokens and how often each occurs among them.
     * Allocated only when penalties can change something (params are fixed for a sampler). */
    bool penalize;
    int32_t *ring;   /* [repeat_last_n] */
    int32_t *counts; /* [n_vocab] occurrences in the ring */
    int32_t ring_head, ring_len;

    /* top-p without top-k: probability mass per logit bucket (see top_p_unsorted) */
    double bucket_mass[TR_TOPP_BUCKETS];
};

/* ---- random numbers -------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256** (Blackman & Vigna): fast, well tested, defined bit for bit */
static uint64_t rng_next(uint64_t s[4]) {
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4]) {
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static void rng_seed(uint64_t s[4], uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s[i] = splitmix64(&x);
}

/* A seed for "-s -1". Clock readings plus a process-wide counter (so two samplers created in the
 * same nanosecond differ) plus an address (ASLR). Kept below 2^32 - 1 so that it can be passed
 * back with -s even by a CLI that reads seeds as llama.cpp's uint32, where 0xFFFFFFFF means
 * "random". */
static uint64_t random_seed(const void *salt) {
    static atomic_uint_fast64_t counter;
    uint64_t x = atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ull;
    struct timespec ts;
    if (timespec_get(&ts, TIME_UTC) == TIME_UTC) {
        x ^= (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
    }
    x ^= (uint64_t)clock() << 20;
    x ^= (uint64_t)(uintptr_t)salt;
    uint64_t seed = splitmix64(&x) & 0xffffffffull;
    return seed == 0xffffffffull ? 0 : seed;
}

/* ---- ordering -------------------------------------------------------------------------------- */

/* The one total order used everywhere: higher logit first, equal logits by lower id. Because ids
 * are unique no two candidates compare equal, so every selection below has a unique answer. */
static inline bool before(const tr_token_prob *a, const tr_token_prob *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static inline void swap_tp(tr_token_prob *a, tr_token_prob *b) {
    tr_token_prob t = *a;
    *a = *b;
    *b = t;
}

/* Sift down in a heap whose root is the element that comes LAST in `before` order (the worst). */
static void sift_down_worst(tr_token_prob *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, w = i;
        if (l < n && before(&h[w], &h[l])) w = l;
        if (l + 1 < n && before(&h[w], &h[l + 1])) w = l + 1;
        if (w == i) return;
        swap_tp(&h[i], &h[w]);
        i = w;
    }
}

/* Move the best m of a[0..n) to a[0..m) in descending order (m <= n). One pass with a bounded heap
 * of the best m seen so far, its root the worst of them, so most elements cost one comparison;
 * then heapsort of the m, which pops the worst to the back and so leaves them descending. */
static void select_sorted(tr_token_prob *a, size_t n, size_t m) {
    if (m == 0) return;
    for (size_t i = m / 2; i-- > 0;) sift_down_worst(a, m, i);
    for (size_t i = m; i < n; i++) {
        if (before(&a[i], &a[0])) {
            swap_tp(&a[i], &a[0]);
            sift_down_worst(a, m, 0);
        }
    }
    for (size_t end = m; end > 1; end--) {
        swap_tp(&a[0], &a[end - 1]);
        sift_down_worst(a, end - 1, 0);
    }
}

/* ---- parameters ------------------------------------------------------------------------------ */

tr_sampler_params tr_sampler_default_params(void) {
    tr_sampler_params p = {
        .temp = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .repeat_last_n = 64,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = TR_SAMPLER_SEED_RANDOM,
    };
    return p;
}

tr_status tr_sampler_validate(const tr_sampler_params *p, tr_error *err) {
    if (!p) return tr_fail(err, TR_E_ARG, "sampler parameters are NULL");
    /* written as !(in range) so that NaN fails every check */
    if (!isfinite(p->temp))
        return tr_fail(err, TR_E_ARG, "--temp must be a finite number, got %g (<= 0 means greedy)",
                       (double)p->temp);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return tr_fail(err, TR_E_ARG, "--top-p must be in (0, 1], got %g (1 turns top-p off)",
                       (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return tr_fail(err, TR_E_ARG, "--min-p must be in [0, 1], got %g (0 turns min-p off)",
                       (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return tr_fail(err, TR_E_ARG, "--repeat-penalty must be > 0, got %g (1 turns it off)",
                       (double)p->repeat_penalty);
    if (p->repeat_last_n < 0)
        return tr_fail(err, TR_E_ARG,
                       "--repeat-last-n must be >= 0, got %d (0 turns penalties off; llama.cpp's "
                       "-1, the context size, must be resolved to n_ctx by the caller)",
                       (int)p->repeat_last_n);
    if (!isfinite(p->presence_penalty))
        return tr_fail(err, TR_E_ARG, "--presence-penalty must be a finite number, got %g",
                       (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return tr_fail(err, TR_E_ARG, "--frequency-penalty must be a finite number, got %g",
                       (double)p->frequency_penalty);
    return TR_OK;
}

/* ---- lifetime -------------------------------------------------------------------------------- */

tr_status tr_sampler_create(const tr_sampler_params *p, int32_t n_vocab, tr_sampler **out,
                            tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_sampler_create: out is NULL");
    *out = NULL;
    tr_status st = tr_sampler_validate(p, err);
    if (st != TR_OK) return st;
    if (n_vocab <= 0)
        return tr_fail(err, TR_E_ARG, "sampler: n_vocab must be > 0, got %d", (int)n_vocab);
    if ((size_t)n_vocab > SIZE_MAX / sizeof(tr_token_prob))
        return tr_fail(err, TR_E_ARG, "sampler: n_vocab %d is too large", (int)n_vocab);

    tr_sampler *s = calloc(1, sizeof *s);
    if (!s) return tr_fail(err, TR_E_NOMEM, "sampler: out of memory");
    s->params = *p;
    s->n_vocab = n_vocab;
    /* llama.cpp skips the penalty step entirely in this case; then history serves nothing */
    s->penalize =
        p->repeat_last_n > 0 &&
        !(p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f);

    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (s->penalize) {
        s->ring = malloc((size_t)p->repeat_last_n * sizeof *s->ring);
        s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    }
    if (!s->cand || (s->penalize && (!s->ring || !s->counts))) {
        const size_t need = (size_t)n_vocab * (sizeof *s->cand + (s->penalize ? 4 : 0)) +
                            (s->penalize ? (size_t)p->repeat_last_n * 4 : 0);
        tr_sampler_free(s);
        return tr_fail(err, TR_E_NOMEM, "sampler: cannot allocate %zu bytes for %d tokens", need,
                       (int)n_vocab);
    }

    const bool random = p->seed == TR_SAMPLER_SEED_RANDOM || p->seed == 0xffffffffull;
    s->seed = random ? random_seed(s) : p->seed;
    rng_seed(s->rng, s->seed);
    *out = s;
    return TR_OK;
}

void tr_sampler_free(tr_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->ring);
    free(s->counts);
    free(s);
}

void tr_sampler_reset(tr_sampler *s) {
    if (!s) return;
    if (s->penalize) {
        /* only tokens in the ring have non-zero counts */
        for (int32_t i = 0; i < s->ring_len; i++) s->counts[s->ring[i]] = 0;
    }
    s->ring_head = 0;
    s->ring_len = 0;
    rng_seed(s->rng, s->seed);
}

void tr_sampler_accept(tr_sampler *s, int32_t token) {
    if (!s || !s->penalize || token < 0 || token >= s->n_vocab) return;
    const int32_t cap = s->params.repeat_last_n;
    if (s->ring_len == cap) {
        /* full: the oldest token (at head) leaves the window */
        s->counts[s->ring[s->ring_head]]--;
    } else {
        s->ring_len++;
    }
    s->ring[s->ring_head] = token;
    s->counts[token]++;
    s->ring_head = s->ring_head + 1 == cap ? 0 : s->ring_head + 1;
}

uint64_t tr_sampler_seed(const tr_sampler *s) { return s ? s->seed : 0; }

const tr_sampler_params *tr_sampler_get_params(const tr_sampler *s) {
    return s ? &s->params : NULL;
}

/* ---- the chain ------------------------------------------------------------------------------- */

static inline float clean_logit(float l) { return isnan(l) ? -INFINITY : l; }

static inline float penalise(const tr_sampler_params *p, float l, int32_t count) {
    /* as llama.cpp: dividing a negative logit would make the token MORE likely, so multiply it */
    l = l <= 0.0f ? l * p->repeat_penalty : l / p->repeat_penalty;
    return l - ((float)count * p->frequency_penalty + p->presence_penalty);
}

/* Full path: the candidate array is in id order, so window tokens are penalised by index. Each
 * distinct token once: its count is negated when applied and restored after, which avoids a
 * per-call "seen" array. */
static void penalise_by_id(tr_sampler *s, tr_token_prob *c) {
    for (int32_t i = 0; i < s->ring_len; i++) {
        const int32_t t = s->ring[i];
        const int32_t n = s->counts[t];
        if (n <= 0) continue;
        c[t].logit = penalise(&s->params, c[t].logit, n);
        s->counts[t] = -n;
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        const int32_t t = s->ring[i];
        if (s->counts[t] < 0) s->counts[t] = -s->counts[t];
    }
}

/* Distinct tokens currently in the window (for sizing the top-k scan). */
static int32_t n_window_distinct(tr_sampler *s) {
    int32_t d = 0;
    for (int32_t i = 0; i < s->ring_len; i++) {
        const int32_t t = s->ring[i];
        if (s->counts[t] > 0) {
            d++;
            s->counts[t] = -s->counts[t];
        }
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        const int32_t t = s->ring[i];
        if (s->counts[t] < 0) s->counts[t] = -s->counts[t];
    }
    return d;
}

/*
 * Top-k without copying the vocabulary: the best k of the penalised logits, descending, in c[0..k).
 * The scan reads the raw logits once with a heap of the best m = k + w seen so far (w = distinct
 * window tokens): a token that is in the penalised top k has fewer than k non-window tokens ahead
 * of it, so it is within the raw top k + w. Ids are scanned in ascending order, so a later token
 * with an equal logit is worse and "l > worst" is the whole admission test (NaN fails it, as -inf
 * would). Then the window tokens get their penalised values, those outside the heap are added, and
 * the best k of these <= k + 2w are selected. Returns k.
 */
static size_t scan_top_k(tr_sampler *s, const float *x, size_t n, size_t k, size_t w) {
    tr_token_prob *c = s->cand;
    const size_t m = k + w; /* caller guarantees m < n */
    for (size_t i = 0; i < m; i++) {
        c[i].id = (int32_t)i;
        c[i].logit = clean_logit(x[i]);
    }
    for (size_t i = m / 2; i-- > 0;) sift_down_worst(c, m, i);
    float worst = c[0].logit;
    for (size_t i = m; i < n; i++) {
        const float l = x[i];
        if (l > worst) {
            c[0].id = (int32_t)i;
            c[0].logit = l;
            sift_down_worst(c, m, 0);
            worst = c[0].logit;
        }
    }
    if (w == 0) {
        select_sorted(c, m, m); /* heapsort of the k */
        return k;
    }
    size_t len = m;
    for (size_t i = 0; i < m; i++) {
        const int32_t t = c[i].id, cnt = s->counts[t];
        if (cnt > 0) {
            c[i].logit = penalise(&s->params, c[i].logit, cnt);
            s->counts[t] = -cnt;
        }
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        const int32_t t = s->ring[i], cnt = s->counts[t];
        if (cnt > 0) { /* in the window, not in the heap: len < m + w <= n */
            c[len].id = t;
            c[len].logit = penalise(&s->params, clean_logit(x[t]), cnt);
            len++;
            s->counts[t] = -cnt;
        }
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        const int32_t t = s->ring[i];
        if (s->counts[t] < 0) s->counts[t] = -s->counts[t];
    }
    select_sorted(c, len, k);
    return k;
}

static float max_logit(const tr_token_prob *c, size_t n) {
    float m = c[0].logit;
    for (size_t i = 1; i < n; i++) m = c[i].logit > m ? c[i].logit : m;
    return m;
}

/* exp(l - max) with the infinite cases made well defined: if the max is +inf only the +inf tokens
 * carry mass; if it is -inf (everything masked) all are equally likely. */
static inline float rel_weight(float l, float max) {
    if (isinf(max)) return l == max ? 1.0f : 0.0f;
    return expf(l - max);
}

/*
 * Walk c[from..n) in descending order, adding the weights in c[].p to *cum, until *cum reaches
 * target; returns the index one past the token that reached it (n if none did). The descending
 * order is produced lazily: the sorted prefix grows by selection from the unsorted rest (64 first,
 * then 4x), so only about as much is sorted as the walk needs.
 */
static size_t walk_sorted(tr_token_prob *c, size_t from, size_t n, double *cum, double target) {
    size_t sorted = from;
    for (size_t i = from; i < n; i++) {
        if (i == sorted) {
            size_t want = sorted - from ? from + (sorted - from) * 4 : from + 64;
            if (want > n) want = n;
            select_sorted(c + sorted, n - sorted, want - sorted);
            sorted = want;
        }
        *cum += c[i].p;
        if (*cum >= target) return i + 1;
    }
    return n;
}

/*
 * top-p on a set that is not sorted (top-k off), without sorting it: the weights are binned by
 * logit into TR_TOPP_BUCKETS equal-width buckets between max - 80 (or the minimum) and the max;
 * walking the buckets down finds the one where the cumulative mass crosses p. Every token of a
 * higher bucket has a strictly higher logit than every token of that bucket (the bucket index is
 * monotonic in the logit), so those are kept unsorted, and only the crossing bucket is sorted as
 * far as needed. The result is left unsorted (*sorted_n = 0).
 */
static size_t top_p_unsorted(tr_sampler *s, size_t n, float p) {
    tr_token_prob *c = s->cand;
    float mx = c[0].logit, mn = c[0].logit;
    for (size_t i = 1; i < n; i++) {
        mx = c[i].logit > mx ? c[i].logit : mx;
        mn = c[i].logit < mn ? c[i].logit : mn;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += c[i].p = rel_weight(c[i].logit, mx);
    const double target = (double)p * sum;
    const float lo = mn > mx - 80.0f ? mn : mx - 80.0f; /* exp(-80) ~ 2e-35: below, mass is nil */
    if (!(mx > lo) || isinf(mx)) {
        /* all equal, or infinities: no spread to bin; the lazy sort handles it */
        double cum = 0.0;
        return walk_sorted(c, 0, n, &cum, target);
    }
    const float scale = (float)(TR_TOPP_BUCKETS - 1) / (mx - lo);
    memset(s->bucket_mass, 0, sizeof s->bucket_mass);
#define BUCKET(l) ((l) <= lo ? 0 : (int)fminf(((l)-lo) * scale, (float)(TR_TOPP_BUCKETS - 1)))
    for (size_t i = 0; i < n; i++) s->bucket_mass[BUCKET(c[i].logit)] += c[i].p;
    double cum = 0.0;
    int b = TR_TOPP_BUCKETS - 1;
    for (; b > 0; b--) {
        if (cum + s->bucket_mass[b] >= target) break;
        cum += s->bucket_mass[b];
    }
    /* move the buckets above b to the front, then bucket b after them; drop the rest */
    size_t above = 0;
    for (size_t i = 0; i < n; i++) {
        if (BUCKET(c[i].logit) > b) swap_tp(&c[above++], &c[i]);
    }
    size_t end = above;
    for (size_t i = above; i < n; i++) {
        if (BUCKET(c[i].logit) == b) swap_tp(&c[end++], &c[i]);
    }
#undef BUCKET
    return walk_sorted(c, above, end, &cum, target);
}

/* top-p on a sorted set (after top-k): the shortest prefix whose mass reaches p */
static size_t top_p_sorted(tr_token_prob *c, size_t n, float p) {
    const float mx = c[0].logit;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += c[i].p = rel_weight(c[i].logit, mx);
    double cum = 0.0;
    return walk_sorted(c, 0, n, &cum, (double)p * sum); /* already sorted: no selection runs */
}

static size_t apply_min_p(tr_token_prob *c, size_t n, bool sorted, float p) {
    const float mx = sorted ? c[0].logit : max_logit(c, n);
    const float thr = mx + logf(p); /* p_i >= p * p_max  <=>  l_i >= l_max + log p */
    if (sorted) {
        size_t i = 1; /* the first always stays */
        while (i < n && c[i].logit >= thr) i++;
        return i;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (c[i].logit >= thr) c[k++] = c[i];
    }
    return k; /* >= 1: the max passes its own threshold */
}

const tr_token_prob *tr_sampler_candidates(tr_sampler *s, const float *logits, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!s || !logits) return NULL;
    const tr_sampler_params *p = &s->params;
    tr_token_prob *c = s->cand;
    const size_t n_vocab = (size_t)s->n_vocab;
    const bool greedy = p->temp <= 0.0f;
    /* greedy is top-k 1: every filter keeps the argmax */
    const size_t k = greedy ? 1 : p->top_k > 0 ? (size_t)p->top_k : n_vocab;
    const size_t w = s->penalize ? (size_t)n_window_distinct(s) : 0;

    size_t n;
    bool sorted;
    if (k + w < n_vocab) {
        n = scan_top_k(s, logits, n_vocab, k, w);
        sorted = true;
    } else {
        for (size_t i = 0; i < n_vocab; i++) {
            c[i].id = (int32_t)i;
            c[i].logit = clean_logit(logits[i]);
        }
        if (s->penalize) penalise_by_id(s, c);
        n = n_vocab;
        sorted = false;
        if (k < n) { /* top-k with a window too large for the scan to pay off */
            select_sorted(c, n, k);
            n = k;
            sorted = true;
        } else if (greedy) { /* n_vocab tiny: k + w >= n_vocab */
            select_sorted(c, n, 1);
            n = 1;
            sorted = true;
        }
    }
    if (greedy) {
        c[0].p = 1.0f;
        if (n_out) *n_out = 1;
        return c;
    }
    if (p->top_p < 1.0f) {
        n = sorted ? top_p_sorted(c, n, p->top_p) : top_p_unsorted(s, n, p->top_p);
    }
    if (p->min_p > 0.0f) n = apply_min_p(c, n, sorted, p->min_p);

    /* temperature, then the distribution the draw uses. Divide rather than multiply by 1/temp: a
     * tiny temp would make 1/temp infinite and 0 * inf NaN, while 0 / tiny stays 0 and the rest
     * go to +-inf, which rel_weight handles. */
    if (p->temp != 1.0f) {
        for (size_t i = 0; i < n; i++) c[i].logit /= p->temp;
    }
    const float mx = sorted ? c[0].logit : max_logit(c, n);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += c[i].p = rel_weight(c[i].logit, mx);
    const double inv = 1.0 / sum; /* sum >= 1: the max contributes exp(0) (or 1 if infinite) */
    for (size_t i = 0; i < n; i++) c[i].p = (float)(c[i].p * inv);
    if (n_out) *n_out = n;
    return c;
}

int32_t tr_sampler_sample(tr_sampler *s, const float *logits) {
    size_t n = 0;
    const tr_token_prob *c = tr_sampler_candidates(s, logits, &n);
    if (!c || n == 0) return -1;
    if (n == 1) return c[0].id;
    /* inverse CDF over the candidates in their current order; the float p's may not sum to exactly
     * 1, so scale u by their sum rather than assume it */
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += c[i].p;
    const double u = rng_uniform(s->rng) * total;
    double cum = 0.0;
    size_t last_nz = 0;
    for (size_t i = 0; i < n; i++) {
        if (c[i].p <= 0.0f) continue;
        cum += c[i].p;
        last_nz = i;
        if (u < cum) return c[i].id;
    }
    return c[last_nz].id;
}
