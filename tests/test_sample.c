/*
 * Sampler: llama.cpp's defaults; greedy = argmax (ties to the lower id, penalties applied); top-k 1
 * = greedy at any temperature; same seed -> same sequence, other seed -> another, reset -> replay;
 * sampled frequencies match the softmax (with and without temperature and top-k) within a
 * binomial tolerance; top-k / top-p / min-p keep exactly the allowed set (against a brute-force
 * sort on a 262144-token vocabulary) and draws never leave it; repetition / presence / frequency
 * penalties move the argmax as llama.cpp's arithmetic says and only within the window, and the
 * penalised top-k equals a brute-force sort of the penalised logits; NaN and
 * -inf logits; bad parameters rejected with the flag named. Prints timings for n_vocab 262144.
 */
#include <time.h>

#include "testutil.h"
#include "terrace.h"

#define BIG_VOCAB 262144

static tr_sampler *make(tr_sampler_params p, int32_t n_vocab) {
    tr_sampler *s = NULL;
    tr_error err = {0};
    tr_status st = tr_sampler_create(&p, n_vocab, &s, &err);
    TU_CHECK(st == TR_OK && s, "create failed: %s", err.msg);
    return s;
}

/* every filter off, temperature 1: the plain softmax */
static tr_sampler_params plain_params(uint64_t seed) {
    tr_sampler_params p = tr_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

static void fill_normal(tu_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = tu_normal(r) * scale;
}

static int32_t argmax_ref(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i; /* strict: ties stay with the lower id */
    return b;
}

/* descending by logit, ties by id: the sampler's order */
static const float *g_sort_logits;
static int cmp_desc(const void *a, const void *b) {
    const int32_t ia = *(const int32_t *)a, ib = *(const int32_t *)b;
    const float la = g_sort_logits[ia], lb = g_sort_logits[ib];
    if (la != lb) return la > lb ? -1 : 1;
    return ia < ib ? -1 : 1;
}
static int32_t *sorted_ids(const float *x, int32_t n) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int32_t i = 0; i < n; i++) ids[i] = i;
    g_sort_logits = x;
    qsort(ids, (size_t)n, sizeof *ids, cmp_desc);
    return ids;
}

/* -----------------------------------------------------------------------------------------------
 */

static void test_defaults(void) {
    tr_sampler_params p = tr_sampler_default_params();
    printf("defaults: temp %.2f top_k %d top_p %.2f min_p %.2f repeat_penalty %.2f "
           "repeat_last_n %d seed %s\n",
           (double)p.temp, p.top_k, (double)p.top_p, (double)p.min_p, (double)p.repeat_penalty,
           p.repeat_last_n, p.seed == TR_SAMPLER_SEED_RANDOM ? "random" : "fixed");
    TU_CHECK(p.temp == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0.05f,
             "defaults differ from llama.cpp's");
    TU_CHECK(p.repeat_penalty == 1.0f && p.repeat_last_n == 64 && p.presence_penalty == 0.0f &&
                 p.frequency_penalty == 0.0f && p.seed == TR_SAMPLER_SEED_RANDOM,
             "penalty/seed defaults differ from llama.cpp's");

    /* random seeds: drawn per sampler, reported, and re-enterable as a 32-bit -s */
    tr_sampler *a = make(p, 16), *b = make(p, 16);
    if (a && b) {
        printf("random seeds drawn: %llu %llu\n", (unsigned long long)tr_sampler_seed(a),
               (unsigned long long)tr_sampler_seed(b));
        TU_CHECK(tr_sampler_seed(a) != tr_sampler_seed(b), "two random seeds are equal");
        TU_CHECK(tr_sampler_seed(a) < 0xffffffffull && tr_sampler_seed(b) < 0xffffffffull,
                 "random seed does not fit a 32-bit -s");
    }
    tr_sampler_free(a);
    tr_sampler_free(b);
}

static void test_greedy(void) {
    tu_rng r = {11};
    const int32_t n = 1000;
    float *x = malloc(n * sizeof *x);
    int bad = 0;
    for (int temp_i = 0; temp_i < 2; temp_i++) {
        tr_sampler_params p = tr_sampler_default_params();
        p.temp = temp_i == 0 ? 0.0f : -1.0f; /* both mean greedy */
        p.seed = 1;
        tr_sampler *s = make(p, n);
        if (!s) break;
        for (int it = 0; it < 50; it++) {
            fill_normal(&r, x, n, 3.0f);
            if (tr_sampler_sample(s, x) != argmax_ref(x, n)) bad++;
        }
        /* ties go to the lower id */
        for (int32_t i = 0; i < n; i++) x[i] = -1.0f;
        x[700] = 5.0f;
        x[300] = 5.0f;
        x[900] = 5.0f;
        TU_CHECK(tr_sampler_sample(s, x) == 300, "greedy tie: got %d, want 300",
                 tr_sampler_sample(s, x));
        size_t nc = 0;
        const tr_token_prob *c = tr_sampler_candidates(s, x, &nc);
        TU_CHECK(nc == 1 && c[0].id == 300 && c[0].p == 1.0f, "greedy candidates: n %zu", nc);
        tr_sampler_free(s);
    }
    printf("greedy (temp 0 and -1): 100 random vectors, %d differ from argmax; ties -> lowest id\n",
           bad);
    TU_CHECK(bad == 0, "%d greedy samples differ from argmax", bad);

    /* top-k 1 is greedy whatever the temperature */
    const float temps[] = {0.1f, 0.8f, 1.0f, 5.0f, 100.0f};
    int bad_k1 = 0;
    for (size_t t = 0; t < sizeof temps / sizeof temps[0]; t++) {
        tr_sampler_params p = tr_sampler_default_params();
        p.temp = temps[t];
        p.top_k = 1;
        p.top_p = 1.0f;
        p.min_p = 0.0f;
        p.seed = 99 + t;
        tr_sampler *s = make(p, n);
        if (!s) break;
        for (int it = 0; it < 40; it++) {
            fill_normal(&r, x, n, 1.0f);
            if (tr_sampler_sample(s, x) != argmax_ref(x, n)) bad_k1++;
        }
        tr_sampler_free(s);
    }
    printf("top-k 1 at temps 0.1..100: 200 draws, %d differ from argmax\n", bad_k1);
    TU_CHECK(bad_k1 == 0, "top-k 1 differs from greedy %d times", bad_k1);
    free(x);
}

static void run_seq(tr_sampler *s, uint64_t logit_seed, int32_t n, int steps, int32_t *out) {
    tu_rng r = {logit_seed};
    float *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < steps; i++) {
        fill_normal(&r, x, (size_t)n, 2.0f);
        out[i] = tr_sampler_sample(s, x);
        tr_sampler_accept(s, out[i]);
    }
    free(x);
}

static void test_determinism(void) {
    enum { STEPS = 300 };
    const int32_t n = 5000;
    int32_t a[STEPS], b[STEPS], c[STEPS], d[STEPS];
    tr_sampler_params p = tr_sampler_default_params();
    p.repeat_penalty = 1.1f; /* history matters too */
    p.seed = 1234;
    tr_sampler *s1 = make(p, n), *s2 = make(p, n);
    p.seed = 1235;
    tr_sampler *s3 = make(p, n);
    if (!s1 || !s2 || !s3) return;
    run_seq(s1, 7, n, STEPS, a);
    run_seq(s2, 7, n, STEPS, b);
    run_seq(s3, 7, n, STEPS, c);
    tr_sampler_reset(s1);
    run_seq(s1, 7, n, STEPS, d);
    int same_ab = 0, same_ac = 0, same_ad = 0;
    for (int i = 0; i < STEPS; i++) {
        same_ab += a[i] == b[i];
        same_ac += a[i] == c[i];
        same_ad += a[i] == d[i];
    }
    printf("determinism: seed 1234 twice %d/%d equal, seed 1234 vs 1235 %d/%d equal, after reset "
           "%d/%d equal; seed reported %llu\n",
           same_ab, STEPS, same_ac, STEPS, same_ad, STEPS, (unsigned long long)tr_sampler_seed(s1));
    TU_CHECK(same_ab == STEPS, "same seed gave different sequences");
    TU_CHECK(same_ad == STEPS, "reset did not replay the sequence");
    /* with ~40 candidates of comparable weight, two independent streams agree rarely */
    TU_CHECK(same_ac < STEPS / 2, "seeds 1234 and 1235 agree on %d of %d tokens", same_ac, STEPS);
    TU_CHECK(tr_sampler_seed(s1) == 1234, "seed not reported");
    tr_sampler_free(s1);
    tr_sampler_free(s2);
    tr_sampler_free(s3);
}

/*
 * Draw N times from a sampler over a small vocabulary and compare the counts with `want`.
 * Tolerance: count_i ~ Binomial(N, q_i), sd_i = sqrt(N q_i (1 - q_i)); every |z_i| must be <= 5
 * (two-sided tail 5.7e-7 per token) and Pearson's chi-square over the k tokens must be <= 40
 * (df <= 7: tail below 1e-5). A correct sampler fails this about once in 10^5 seeds; one that gets
 * the temperature or the renormalisation wrong by a few percent fails for sure at N = 200000
 * (a 2% error on q = 0.3 is 0.006 * N = 1200 counts, ~5.9 sd).
 */
static void check_freq(const char *what, tr_sampler_params p, const float *logits, int32_t n,
                       const double *want) {
    enum { N = 200000 };
    tr_sampler *s = make(p, n);
    if (!s) return;
    long cnt[16] = {0};
    int out_of_range = 0;
    for (int i = 0; i < N; i++) {
        int32_t t = tr_sampler_sample(s, logits);
        if (t < 0 || t >= n)
            out_of_range++;
        else
            cnt[t]++;
    }
    double chi2 = 0, max_z = 0;
    int df = -1;
    bool zero_ok = true;
    for (int32_t i = 0; i < n; i++) {
        const double e = N * want[i];
        if (want[i] == 0) {
            if (cnt[i] != 0) zero_ok = false;
            continue;
        }
        df++;
        const double z = fabs((double)cnt[i] - e) / sqrt(e * (1 - want[i]));
        if (z > max_z) max_z = z;
        chi2 += ((double)cnt[i] - e) * ((double)cnt[i] - e) / e;
    }
    printf("distribution %-28s N=%d  max |z| %.2f (limit 5)  chi2 %.2f, df %d (limit 40)\n", what,
           N, max_z, chi2, df);
    TU_CHECK(out_of_range == 0, "%s: %d draws out of range", what, out_of_range);
    TU_CHECK(zero_ok, "%s: a token with probability 0 was drawn", what);
    TU_CHECK(max_z <= 5.0, "%s: frequency off by %.2f sd", what, max_z);
    TU_CHECK(chi2 <= 40.0, "%s: chi2 %.2f", what, chi2);

    /* the candidates' p must be the exact distribution too */
    size_t nc = 0;
    const tr_token_prob *c = tr_sampler_candidates(s, logits, &nc);
    double max_dp = 0;
    for (size_t i = 0; i < nc; i++) {
        double d = fabs((double)c[i].p - want[c[i].id]);
        if (d > max_dp) max_dp = d;
    }
    TU_CHECK(max_dp < 1e-6, "%s: candidate p off by %g", what, max_dp);
    tr_sampler_free(s);
}

static void test_distribution(void) {
    const double q[8] = {0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02};
    float logits[8];
    for (int i = 0; i < 8; i++) logits[i] = (float)log(q[i]) + 3.0f; /* offset: softmax-invariant */

    double want[8];
    for (int i = 0; i < 8; i++) want[i] = q[i];
    check_freq("temp 1, filters off", plain_params(42), logits, 8, want);

    /* temperature t: p_i ∝ exp(l_i / t) = q_i^(1/t) */
    const float temps[2] = {2.0f, 0.5f};
    for (int k = 0; k < 2; k++) {
        double sum = 0;
        for (int i = 0; i < 8; i++) sum += want[i] = pow(q[i], 1.0 / temps[k]);
        for (int i = 0; i < 8; i++) want[i] /= sum;
        tr_sampler_params p = plain_params(43 + k);
        p.temp = temps[k];
        check_freq(k == 0 ? "temp 2, filters off" : "temp 0.5, filters off", p, logits, 8, want);
    }

    /* top-k 3: the three best, renormalised */
    for (int i = 0; i < 8; i++) want[i] = i < 3 ? q[i] / (q[0] + q[1] + q[2]) : 0;
    tr_sampler_params p = plain_params(45);
    p.top_k = 3;
    check_freq("top-k 3, temp 1", p, logits, 8, want);
}

/* small hand-made cases: the allowed set is known; draws at a high temperature (applied last, so
 * it cannot change the set) would hit any wrongly allowed token quickly */
static void check_allowed(const char *what, tr_sampler_params p, const float *logits, int32_t n,
                          const bool *allowed) {
    tr_sampler *s = make(p, n);
    if (!s) return;
    int hits[16] = {0}, bad = 0;
    for (int i = 0; i < 4000; i++) {
        int32_t t = tr_sampler_sample(s, logits);
        if (t < 0 || t >= n || !allowed[t])
            bad++;
        else
            hits[t]++;
    }
    int missing = 0, n_allowed = 0;
    for (int32_t i = 0; i < n; i++) {
        if (allowed[i]) {
            n_allowed++;
            if (hits[i] == 0) missing++;
        }
    }
    printf("allowed set %-34s %d allowed, 4000 draws: %d outside, %d allowed never drawn\n", what,
           n_allowed, bad, missing);
    TU_CHECK(bad == 0, "%s: %d draws outside the allowed set", what, bad);
    TU_CHECK(missing == 0, "%s: %d allowed tokens never drawn at temp %g", what, missing,
             (double)p.temp);
    tr_sampler_free(s);
}

static void test_filters_small(void) {
    /* probabilities 0.5 0.3 0.1 0.05 0.05 placed at scrambled ids of a 10-token vocabulary */
    const double q[5] = {0.5, 0.3, 0.1, 0.05, 0.05};
    const int32_t at[5] = {7, 2, 9, 0, 4};
    float logits[10];
    for (int i = 0; i < 10; i++) logits[i] = -INFINITY; /* the other 5 can never be drawn */
    for (int i = 0; i < 5; i++) logits[at[i]] = (float)log(q[i]);

    bool allowed[10];
    tr_sampler_params p = plain_params(5);
    p.temp = 5.0f;

    /* top-p 0.75: 0.5 < 0.75 <= 0.8 -> the first two */
    memset(allowed, 0, sizeof allowed);
    allowed[7] = allowed[2] = true;
    p.top_p = 0.75f;
    check_allowed("top-p 0.75 (temp 5)", p, logits, 10, allowed);
    /* top-p 0.85 -> three (0.9 >= 0.85) */
    allowed[9] = true;
    p.top_p = 0.85f;
    check_allowed("top-p 0.85 (temp 5)", p, logits, 10, allowed);
    p.top_p = 1.0f;

    /* min-p 0.15: p >= 0.075 -> 0.5 0.3 0.1 */
    p.min_p = 0.15f;
    check_allowed("min-p 0.15 (temp 5)", p, logits, 10, allowed);
    /* min-p 0.7: only p >= 0.35 */
    memset(allowed, 0, sizeof allowed);
    allowed[7] = true;
    p.min_p = 0.7f;
    check_allowed("min-p 0.7 (temp 5)", p, logits, 10, allowed);
    p.min_p = 0.0f;

    /* top-k 4: the two 0.05 tie, the lower id (0) wins */
    memset(allowed, 0, sizeof allowed);
    allowed[7] = allowed[2] = allowed[9] = allowed[0] = true;
    p.top_k = 4;
    check_allowed("top-k 4, tie -> lower id (temp 5)", p, logits, 10, allowed);

    /* order of the chain: top-k 4 first renormalises over {0.5,0.3,0.1,0.05} (sum 0.95), so top-p
     * 0.9 needs 0.5/0.95 + 0.3/0.95 + 0.1/0.95 = 0.947 -> three; top-p on the full set would also
     * give three, so use 0.83: after top-k, 0.8/0.95 = 0.842 >= 0.83 -> two; without top-k first,
     * 0.8 < 0.83 -> three. */
    memset(allowed, 0, sizeof allowed);
    allowed[7] = allowed[2] = true;
    p.top_p = 0.83f;
    check_allowed("top-k 4 then top-p 0.83 (temp 5)", p, logits, 10, allowed);
}

/* large vocabulary: the candidate set must be exactly what a brute-force sort says */
static void test_filters_big(void) {
    tu_rng r = {2024};
    const int32_t n = BIG_VOCAB;
    float *x = malloc((size_t)n * sizeof *x);
    double *pr = malloc((size_t)n * sizeof *pr);
    int fails = 0;

    for (int round = 0; round < 3; round++) {
        /* scales: flat (top-p needs many thousands of tokens), medium, peaked */
        const float scale = round == 0 ? 0.5f : round == 1 ? 2.0f : 5.0f;
        fill_normal(&r, x, (size_t)n, scale);
        /* a few exact ties across ids to exercise the tie rule */
        for (int i = 0; i < 8; i++) x[(size_t)(tu_next(&r) % (uint64_t)n)] = x[12345];
        int32_t *ids = sorted_ids(x, n);
        double mx = x[ids[0]], sum = 0;
        for (int32_t i = 0; i < n; i++) sum += pr[i] = exp((double)x[i] - mx);
        for (int32_t i = 0; i < n; i++) pr[i] /= sum;

        /* top-k 40: exactly the first 40 of the sort, in that order */
        {
            tr_sampler_params p = plain_params(1);
            p.top_k = 40;
            tr_sampler *s = make(p, n);
            size_t nc = 0;
            const tr_token_prob *c = tr_sampler_candidates(s, x, &nc);
            int wrong = 0;
            for (size_t i = 0; i < nc && i < 40; i++) wrong += c[i].id != ids[i];
            TU_CHECK(nc == 40 && wrong == 0, "top-k 40 (scale %g): n %zu, %d wrong", (double)scale,
                     nc, wrong);
            fails += !(nc == 40 && wrong == 0);
            tr_sampler_free(s);
        }
        /* top-p alone: the kept set (in any order) is the first nc of the sort, the shortest
         * prefix whose mass reaches p (1e-4 slack for the float weights at the boundary) */
        const float tps[3] = {0.5f, 0.9f, 0.99f};
        for (int k = 0; k < 3; k++) {
            tr_sampler_params p = plain_params(2);
            p.top_p = tps[k];
            tr_sampler *s = make(p, n);
            size_t nc = 0;
            const tr_token_prob *c = tr_sampler_candidates(s, x, &nc);
            unsigned char *kept = calloc((size_t)n, 1);
            for (size_t i = 0; i < nc; i++) kept[c[i].id]++;
            int wrong = 0;
            double cum_before = 0;
            for (size_t i = 0; i < nc; i++) {
                wrong += kept[ids[i]] != 1; /* each of the top nc exactly once */
                if (i + 1 < nc) cum_before += pr[ids[i]];
            }
            free(kept);
            const double cum = cum_before + pr[ids[nc - 1]];
            const bool ok = wrong == 0 && cum_before < tps[k] + 1e-4 && cum >= tps[k] - 1e-4;
            printf("top-p %.2f on %d tokens (scale %.1f): kept %zu, mass %.5f (before last %.5f)\n",
                   (double)tps[k], n, (double)scale, nc, cum, cum_before);
            TU_CHECK(ok,
                     "top-p %g: %d of the top kept not exactly once, mass before last %.6f, with "
                     "last %.6f",
                     (double)tps[k], wrong, cum_before, cum);
            fails += !ok;
            tr_sampler_free(s);
        }
        /* min-p alone: exactly {i : x_i >= max + log(min_p)} */
        {
            tr_sampler_params p = plain_params(3);
            p.min_p = 0.05f;
            tr_sampler *s = make(p, n);
            size_t nc = 0;
            const tr_token_prob *c = tr_sampler_candidates(s, x, &nc);
            const float thr = x[ids[0]] + logf(0.05f);
            size_t want = 0;
            for (int32_t i = 0; i < n; i++) want += x[i] >= thr;
            int wrong = 0;
            for (size_t i = 0; i < nc; i++) wrong += !(x[c[i].id] >= thr);
            printf("min-p 0.05 on %d tokens (scale %.1f): kept %zu, brute force %zu\n", n,
                   (double)scale, nc, want);
            TU_CHECK(nc == want && wrong == 0, "min-p: kept %zu, want %zu, %d below threshold", nc,
                     want, wrong);
            fails += !(nc == want && wrong == 0);
            tr_sampler_free(s);
        }
        /* defaults (top-k 40, top-p 0.95, min-p 0.05, temp 0.8): draws stay inside the set */
        {
            tr_sampler_params p = tr_sampler_default_params();
            p.seed = 77;
            tr_sampler *s = make(p, n);
            size_t nc = 0;
            const tr_token_prob *c = tr_sampler_candidates(s, x, &nc);
            int wrong = 0;
            for (size_t i = 0; i < nc; i++) wrong += c[i].id != ids[i]; /* prefix of top-40 */
            int outside = 0;
            for (int i = 0; i < 200; i++) {
                int32_t t = tr_sampler_sample(s, x);
                bool top40 = false;
                for (int j = 0; j < 40; j++) top40 |= ids[j] == t;
                /* the set after min-p: within the top 40 and p >= 0.05 * p_max (untempered) */
                if (!top40 || !(x[t] >= x[ids[0]] + logf(0.05f))) outside++;
            }
            TU_CHECK(nc >= 1 && nc <= 40 && wrong == 0 && outside == 0,
                     "defaults: %zu candidates, %d out of order, %d draws outside", nc, wrong,
                     outside);
            fails += !(nc >= 1 && nc <= 40 && wrong == 0 && outside == 0);
            tr_sampler_free(s);
        }
        free(ids);
    }
    printf("filters on %d tokens against brute force: %d failures\n", n, fails);
    free(x);
    free(pr);
}

/* top-k / greedy with a history window: the penalised top 40 must equal a brute-force sort of the
 * penalised logits, both on the large vocabulary (one-pass scan plus window merge) and on a small
 * one (window too large for the scan: copy, penalise by id, select) */
static void test_topk_penalised(void) {
    tu_rng r = {31337};
    const int32_t sizes[2] = {BIG_VOCAB, 50};
    const struct {
        float rep, freq, pres;
    } pen[3] = {{1.5f, 0.0f, 0.0f}, {0.5f, 0.1f, -1.0f}, {1.3f, 0.4f, 0.6f}};
    int fails = 0, checks = 0;
    for (int si = 0; si < 2; si++) {
        const int32_t n = sizes[si];
        float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
        int32_t *cnt = calloc((size_t)n, sizeof *cnt);
        for (int pi = 0; pi < 3; pi++) {
            fill_normal(&r, x, (size_t)n, 2.0f);
            int32_t *raw = sorted_ids(x, n);
            tr_sampler_params p = plain_params(6);
            p.top_k = 40;
            p.repeat_penalty = pen[pi].rep;
            p.frequency_penalty = pen[pi].freq;
            p.presence_penalty = pen[pi].pres;
            p.repeat_last_n = 64;
            tr_sampler *s = make(p, n);
            p.temp = 0.0f;
            tr_sampler *g = make(p, n);
            memset(cnt, 0, (size_t)n * sizeof *cnt);
            /* 100 accepted tokens, the window keeps the last 64: half from the raw top 60, half
             * from anywhere (these can enter the top 40 when boosted) */
            int32_t hist[100];
            for (int i = 0; i < 100; i++) {
                hist[i] = i % 2 ? raw[tu_next(&r) % (uint64_t)(n < 60 ? n : 60)]
                                : (int32_t)(tu_next(&r) % (uint64_t)n);
                tr_sampler_accept(s, hist[i]);
                tr_sampler_accept(g, hist[i]);
            }
            for (int i = 100 - 64; i < 100; i++) cnt[hist[i]]++;
            for (int32_t i = 0; i < n; i++) {
                float l = x[i];
                if (cnt[i] > 0) {
                    l = l <= 0.0f ? l * p.repeat_penalty : l / p.repeat_penalty;
                    l -= (float)cnt[i] * p.frequency_penalty + p.presence_penalty;
                }
                y[i] = l;
            }
            int32_t *ids = sorted_ids(y, n);
            size_t nc = 0;
            const tr_token_prob *c = tr_sampler_candidates(s, x, &nc);
            int wrong = 0, moved = 0;
            for (size_t i = 0; i < nc && i < 40; i++) {
                wrong += c[i].id != ids[i] || c[i].logit != y[ids[i]];
                moved += ids[i] != raw[i];
            }
            const int32_t gt = tr_sampler_sample(g, x);
            const bool ok = nc == 40 && wrong == 0 && gt == ids[0];
            printf("top-k 40 with penalties (rep %.1f freq %.1f pres %.1f), n_vocab %6d: %d of 40 "
                   "positions differ from the raw top 40, %d wrong; greedy %d (want %d)\n",
                   (double)pen[pi].rep, (double)pen[pi].freq, (double)pen[pi].pres, n, moved, wrong,
                   gt, ids[0]);
            TU_CHECK(ok, "penalised top-k: n %zu, %d wrong, greedy %d want %d", nc, wrong, gt,
                     ids[0]);
            fails += !ok;
            checks++;
            free(ids);
            free(raw);
            tr_sampler_free(s);
            tr_sampler_free(g);
        }
        free(x);
        free(y);
        free(cnt);
    }
    printf("penalised top-k against brute force: %d of %d cases failed\n", fails, checks);
}

static void test_penalties(void) {
    tr_sampler_params p = tr_sampler_default_params();
    p.temp = 0.0f;
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 2;
    p.seed = 3;
    tr_sampler *s = make(p, 8);
    if (!s) return;

    /* positive logits are divided: 2.0 / 1.1 = 1.818 < 1.9 */
    float x[8] = {2.0f, 1.9f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    TU_CHECK(tr_sampler_sample(s, x) == 0, "no history: want 0");
    tr_sampler_accept(s, 0);
    int32_t t1 = tr_sampler_sample(s, x);
    /* window of 2: after two other tokens, 0 is forgotten */
    tr_sampler_accept(s, 5);
    tr_sampler_accept(s, 6);
    int32_t t2 = tr_sampler_sample(s, x);
    printf("repeat-penalty 1.1: logits 2.0/1.9, after accepting 0 -> %d (want 1); after 2 more "
           "tokens (window 2) -> %d (want 0)\n",
           t1, t2);
    TU_CHECK(t1 == 1, "repeat penalty did not move the argmax off token 0");
    TU_CHECK(t2 == 0, "token outside repeat_last_n still penalised");

    /* negative logits are multiplied: -1.0 * 1.1 = -1.1 < -1.05 (dividing would give -0.909) */
    float y[8] = {-1.0f, -1.05f, -5, -5, -5, -5, -5, -5};
    tr_sampler_reset(s);
    tr_sampler_accept(s, 0);
    int32_t t3 = tr_sampler_sample(s, y);
    printf("repeat-penalty 1.1: logits -1.0/-1.05, after accepting 0 -> %d (want 1)\n", t3);
    TU_CHECK(t3 == 1, "negative logit not multiplied by the penalty");
    tr_sampler_reset(s);
    TU_CHECK(tr_sampler_sample(s, y) == 0, "reset did not clear the history");
    tr_sampler_free(s);

    /* presence / frequency: exact values through the candidates (filters off, temp 1) */
    p = plain_params(4);
    p.repeat_penalty = 1.25f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    p.repeat_last_n = 64;
    s = make(p, 8);
    if (!s) return;
    float z[8] = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f};
    tr_sampler_accept(s, 0);
    tr_sampler_accept(s, 0);
    tr_sampler_accept(s, 0);  /* count 3 */
    tr_sampler_accept(s, 1);  /* count 1 */
    tr_sampler_accept(s, 99); /* out of range: ignored */
    tr_sampler_accept(s, -1);
    size_t nc = 0;
    const tr_token_prob *c = tr_sampler_candidates(s, z, &nc);
    float got[8] = {0};
    for (size_t i = 0; i < nc; i++) got[c[i].id] = c[i].logit;
    const float w0 = 2.0f / 1.25f - (3 * 0.5f + 0.25f);  /* 1.6 - 1.75 = -0.15 */
    const float w1 = -2.0f * 1.25f - (1 * 0.5f + 0.25f); /* -2.5 - 0.75 = -3.25 */
    printf("penalties (rep 1.25, freq 0.5, pres 0.25): token0 x3 %.4f (want %.4f), token1 x1 %.4f "
           "(want %.4f), token2 unseen %.4f (want 1)\n",
           (double)got[0], (double)w0, (double)got[1], (double)w1, (double)got[2]);
    TU_CHECK(nc == 8 && fabsf(got[0] - w0) < 1e-6f && fabsf(got[1] - w1) < 1e-6f &&
                 got[2] == 1.0f && got[3] == 0.5f,
             "penalised logits wrong");
    tr_sampler_free(s);

    /* presence alone moves the argmax: 1.0 - 0.3 = 0.7 < 0.8 */
    p = tr_sampler_default_params();
    p.temp = 0;
    p.presence_penalty = 0.3f;
    p.seed = 5;
    s = make(p, 3);
    float w[3] = {1.0f, 0.8f, 0.75f};
    tr_sampler_accept(s, 0);
    TU_CHECK(tr_sampler_sample(s, w) == 1, "presence penalty did not move the argmax");
    tr_sampler_free(s);

    /* repeat_last_n 0: penalties off whatever the factors */
    p.repeat_last_n = 0;
    p.repeat_penalty = 10.0f;
    s = make(p, 3);
    tr_sampler_accept(s, 0);
    TU_CHECK(tr_sampler_sample(s, w) == 0, "repeat_last_n 0 still penalises");
    tr_sampler_free(s);
}

static void test_odd_logits(void) {
    float x[6] = {NAN, -INFINITY, 1.0f, NAN, 0.5f, -INFINITY};
    tr_sampler_params p = tr_sampler_default_params();
    p.temp = 0;
    p.seed = 8;
    tr_sampler *g = make(p, 6);
    TU_CHECK(tr_sampler_sample(g, x) == 2, "greedy with NaN: want 2");
    tr_sampler_free(g);
    tr_sampler *s = make(plain_params(9), 6);
    int bad = 0;
    for (int i = 0; i < 1000; i++) {
        int32_t t = tr_sampler_sample(s, x);
        bad += t != 2 && t != 4;
    }
    TU_CHECK(bad == 0, "NaN / -inf tokens drawn %d times", bad);
    /* everything masked: still a valid token, never a crash */
    for (int i = 0; i < 6; i++) x[i] = -INFINITY;
    int32_t t = tr_sampler_sample(s, x);
    TU_CHECK(t >= 0 && t < 6, "all -inf: got %d", t);
    /* +inf dominates */
    x[3] = INFINITY;
    TU_CHECK(tr_sampler_sample(s, x) == 3, "+inf logit not chosen");
    tr_sampler_free(s);
    TU_CHECK(tr_sampler_sample(NULL, x) == -1, "NULL sampler");

    /* all logits equal, top-p 0.5 without top-k: nothing to bin; half the tokens, lowest ids */
    enum { NE = 1000 };
    float e[NE];
    for (int i = 0; i < NE; i++) e[i] = 0.25f;
    tr_sampler_params p2 = plain_params(10);
    p2.top_p = 0.5f;
    s = make(p2, NE);
    size_t nc = 0;
    const tr_token_prob *c = tr_sampler_candidates(s, e, &nc);
    int32_t max_id = -1;
    for (size_t i = 0; i < nc; i++) max_id = c[i].id > max_id ? c[i].id : max_id;
    printf("flat logits, top-p 0.5 of %d: kept %zu, highest id kept %d\n", NE, nc, max_id);
    TU_CHECK((nc == 500 || nc == 501) && max_id == (int32_t)nc - 1, "flat top-p: %zu kept", nc);
    tr_sampler_free(s);
    printf("odd logits: NaN as -inf, all -inf still samples, +inf dominates\n");
}

static void test_bad_params(void) {
    struct {
        const char *name;
        tr_sampler_params p;
        int32_t n_vocab;
        const char *want; /* substring of the message */
    } cases[16];
    int n = 0;
#define CASE(field, value, nv, msg)                                                                \
    do {                                                                                           \
        cases[n].name = #field " = " #value;                                                       \
        cases[n].p = tr_sampler_default_params();                                                  \
        cases[n].p.field = value;                                                                  \
        cases[n].n_vocab = nv;                                                                     \
        cases[n].want = msg;                                                                       \
        n++;                                                                                       \
    } while (0)
    CASE(top_p, 1.5f, 10, "--top-p must be in (0, 1], got 1.5");
    CASE(top_p, 0.0f, 10, "--top-p");
    CASE(top_p, -0.2f, 10, "--top-p");
    CASE(top_p, NAN, 10, "--top-p");
    CASE(min_p, -0.01f, 10, "--min-p must be in [0, 1]");
    CASE(min_p, 1.5f, 10, "--min-p");
    CASE(repeat_penalty, 0.0f, 10, "--repeat-penalty must be > 0");
    CASE(repeat_penalty, -1.0f, 10, "--repeat-penalty");
    CASE(repeat_last_n, -1, 10, "--repeat-last-n must be >= 0");
    CASE(temp, NAN, 10, "--temp");
    CASE(temp, INFINITY, 10, "--temp");
    CASE(presence_penalty, NAN, 10, "--presence-penalty");
    CASE(frequency_penalty, INFINITY, 10, "--frequency-penalty");
    CASE(top_k, 40, 0, "n_vocab");
    cases[n - 1].name = "n_vocab = 0";
#undef CASE
    int bad = 0;
    for (int i = 0; i < n; i++) {
        tr_sampler *s = (tr_sampler *)&bad; /* must be reset to NULL */
        tr_error err = {0};
        tr_status st = tr_sampler_create(&cases[i].p, cases[i].n_vocab, &s, &err);
        const bool ok = st == TR_E_ARG && s == NULL && strstr(err.msg, cases[i].want);
        printf("reject %-28s -> %s: \"%s\"\n", cases[i].name, tr_status_name(st), err.msg);
        TU_CHECK(ok, "%s: status %d, message \"%s\", want \"%s\"", cases[i].name, st, err.msg,
                 cases[i].want);
        bad += !ok;
        if (st == TR_OK) tr_sampler_free(s);
    }
    /* the edges that are valid */
    tr_sampler_params p = tr_sampler_default_params();
    p.temp = -1.0f;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.top_k = -5;
    p.repeat_last_n = 0;
    p.presence_penalty = -0.5f;
    tr_error err = {0};
    TU_CHECK(tr_sampler_validate(&p, &err) == TR_OK, "valid edges rejected: %s", err.msg);
    p.min_p = 0.0f;
    TU_CHECK(tr_sampler_validate(&p, &err) == TR_OK, "min_p 0 rejected: %s", err.msg);
    TU_CHECK(tr_sampler_create(NULL, 10, &(tr_sampler *){NULL}, &err) == TR_E_ARG, "NULL params");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench(void) {
    tu_rng r = {5};
    const int32_t n = BIG_VOCAB;
    float *x = malloc((size_t)n * sizeof *x);
    fill_normal(&r, x, (size_t)n, 3.0f);
    struct {
        const char *name;
        int32_t top_k;
        float top_p, min_p, rep;
    } cfg[] = {
        {"defaults (k40 p0.95 m0.05)", 40, 0.95f, 0.05f, 1.0f},
        {"defaults + repeat-penalty 1.1", 40, 0.95f, 0.05f, 1.1f},
        {"top-k off, top-p 0.95, min-p 0.05", 0, 0.95f, 0.05f, 1.0f},
        {"top-k off, top-p 0.95 only", 0, 0.95f, 0.0f, 1.0f},
        {"all filters off", 0, 1.0f, 0.0f, 1.0f},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        tr_sampler_params p = tr_sampler_default_params();
        p.top_k = cfg[i].top_k;
        p.top_p = cfg[i].top_p;
        p.min_p = cfg[i].min_p;
        p.repeat_penalty = cfg[i].rep;
        p.seed = 1;
        tr_sampler *s = make(p, n);
        if (!s) break;
        for (int j = 0; j < 64; j++) tr_sampler_accept(s, (int32_t)(tu_next(&r) % (uint64_t)n));
        const int iters = 50;
        double t0 = now_s();
        int32_t sink = 0;
        for (int j = 0; j < iters; j++) sink ^= tr_sampler_sample(s, x);
        double dt = (now_s() - t0) / iters;
        printf("time per token, n_vocab %d, %-36s %8.1f us (token %d)\n", n, cfg[i].name, dt * 1e6,
               sink & 0);
        tr_sampler_free(s);
    }
    free(x);
}

int main(void) {
    test_defaults();
    test_greedy();
    test_determinism();
    test_distribution();
    test_filters_small();
    test_filters_big();
    test_topk_penalised();
    test_penalties();
    test_odd_logits();
    test_bad_params();
    bench();
    return tu_result("test_sample");
}
