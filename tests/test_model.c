/*
 * Sessions on a real (synthetic) model: the same tokens give the same logits whether evaluated in
 * one batch, in ragged chunks or one at a time; B sequences decoded together give what each gives
 * alone; truncation rewinds; bad input is refused with a message and leaves the session as it
 * was.
 *
 * usage: test_model MODEL.gguf
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "terrace.h"
#include "testutil.h"

/* A row's result must not depend on the rows of other sessions computed with it: the per-row
 * kernels sum a row in one order whatever the batch, and a session's chunk long enough for the
 * gemm is its own product, so a batch gives every session bit for bit what it would compute alone
 * with the same chunks (a server batching requests gives each the answer it would get alone). */
#define TOL 0.0f
/* The gemm (prefill chunks from gemm_min_m rows on) sums in another order than the per-row
 * kernels: with F32 weights ~1e-4 on logits of magnitude ~10. The small quantized real models fed
 * random tokens amplify it (the worst of 40 x n_vocab logits: SmolLM2 Q4_1 ~1.1, Gemma 3 Q4_K_M
 * ~8; the greedy token agrees on 90 % and 80 % of rows, random text leaving near ties), so there
 * only a gross error is caught here (rows mixed up agree on almost none); the gemm's accuracy is
 * judged against llama.cpp by the parity tests. */
#define GEMM_TOL 2e-3f
#define GEMM_AGREE 0.6
/* the pooled KV policies (tiered, through auto) attend with F16 softmax weights: ~1e-3 on these
 * logits against full's F32 ones, growing with the context (test_kv_policies.py allows 2e-2).
 * The quantized real models amplify that as they amplify the gemm's order (above): there the
 * tiered prefill may differ from full by at most KV_NOISE times what the kernel choice alone
 * makes on the same model (SmolLM2 Q4_1: 1.6 vs 1.1; Gemma 3 Q4_K_M: 9.3 vs 7.2), which an
 * attention over the wrong tokens exceeds. */
#define KV_TOL 1e-2f
#define KV_NOISE 3.0f

static float max_diff(const float *a, const float *b, size_t n) {
    float d = 0;
    for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* the share of rows whose greedy token agrees */
static double agree(const float *a, const float *b, int32_t rows, int32_t nv) {
    int32_t same = 0;
    for (int32_t r = 0; r < rows; r++)
        same += argmax(a + (size_t)r * nv, nv) == argmax(b + (size_t)r * nv, nv);
    return (double)same / rows;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    tr_error err = {0};
    tr_model_params mp = tr_model_default_params();
    mp.n_threads = 2;
    tr_model *m = NULL;
    if (tr_model_load(argv[1], &mp, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int32_t nv = tr_model_n_vocab(m);
    /* float weights (the synthetic models) or quantized ones (the real models) */
    const bool float_w = tr_model_weight_bytes(m) >= 3 * tr_model_n_params(m);
    enum { N = 40 };
    int32_t toks[N];
    tu_rng rng = {42};
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(tu_next(&rng) % (uint64_t)(nv - 2));

    tr_session_params sp = tr_session_default_params();
    sp.n_ctx = 64;
    tr_session *a = NULL, *b = NULL, *c = NULL;
    TU_CHECK(tr_session_create(m, &sp, &a, &err) == TR_OK, "%s", err.msg);
    sp.n_batch = 7;
    TU_CHECK(tr_session_create(m, &sp, &b, &err) == TR_OK, "%s", err.msg);
    sp.n_batch = 1;
    TU_CHECK(tr_session_create(m, &sp, &c, &err) == TR_OK, "%s", err.msg);
    float *la = malloc(sizeof(float) * N * nv), *lb = malloc(sizeof(float) * N * nv),
          *lc = malloc(sizeof(float) * N * nv);

    /* one batch vs chunks of 7 vs one token at a time */
    TU_CHECK(tr_session_eval(a, toks, N, la, true, &err) == TR_OK, "%s", err.msg);
    TU_CHECK(tr_session_eval(b, toks, N, lb, true, &err) == TR_OK, "%s", err.msg);
    for (int i = 0; i < N; i++)
        TU_CHECK(tr_session_eval(c, toks + i, 1, lc + (size_t)i * nv, false, &err) == TR_OK, "%s",
                 err.msg);
    /* chunks of 7 and single tokens never reach the gemm: the same kernels, the same bits */
    const float d1 = max_diff(lb, lc, (size_t)N * nv), d2 = max_diff(la, lc, (size_t)N * nv);
    const double a2 = agree(la, lc, N, nv);
    printf("  chunks of 7 vs one token at a time: max |dlogit| %.2e; one chunk of %d (the gemm) vs "
           "one at a time: %.2e, greedy token agrees on %.0f %% of rows (%s weights)\n",
           d1, N, d2, 100 * a2, float_w ? "float" : "quantized");
    TU_CHECK(d1 <= TOL, "chunking changed the logits: %g", d1);
    TU_CHECK(float_w ? d2 <= GEMM_TOL : a2 >= GEMM_AGREE, "the gemm's chunk differs: %g, %.2f", d2,
             a2);
    TU_CHECK(tr_session_n_past(a) == N && tr_session_n_past(c) == N, "n_past");

    /* last-token logits equal the last row of all-logits (the same chunks: 35 = 5 x 7, then 5) */
    float *last = malloc(sizeof(float) * nv);
    TU_CHECK(tr_session_truncate(b, N - 5, &err) == TR_OK, "%s", err.msg);
    TU_CHECK(tr_session_eval(b, toks + N - 5, 5, last, false, &err) == TR_OK, "%s", err.msg);
    float d3 = max_diff(last, lb + (size_t)(N - 1) * nv, (size_t)nv);
    printf("  truncate + re-eval of the last 5 tokens: max |dlogit| %.2e\n", d3);
    TU_CHECK(d3 <= TOL, "truncate/re-eval differs by %g", d3);

    /* B = 3 sequences decoded together == each alone: prefixes of different lengths */
    tr_session *seq[3];
    int32_t plen[3] = {5, 11, 17};
    sp.n_batch = 16;
    for (int s = 0; s < 3; s++) {
        TU_CHECK(tr_session_create(m, &sp, &seq[s], &err) == TR_OK, "%s", err.msg);
        TU_CHECK(tr_session_eval(seq[s], toks + s, plen[s], NULL, false, &err) == TR_OK, "%s",
                 err.msg);
    }
    float *lbatch = malloc(sizeof(float) * 3 * nv);
    int32_t next[3] = {toks[30], toks[31], toks[32]};
    for (int step = 0; step < 3; step++) {
        TU_CHECK(tr_decode_batch(seq, next, 3, lbatch, &err) == TR_OK, "%s", err.msg);
        for (int s = 0; s < 3; s++) {
            /* reference: a fresh session fed the same timeline alone, in the same calls */
            tr_session *ref = NULL;
            tr_session_create(m, &sp, &ref, &err);
            tr_session_eval(ref, toks + s, plen[s], NULL, false, &err);
            for (int k = 0; k <= step; k++)
                tr_session_eval(ref, &toks[30 + s + 3 * k], 1, last, false, &err);
            const float d = max_diff(last, lbatch + (size_t)s * nv, (size_t)nv);
            TU_CHECK(d <= TOL, "decode batch step %d seq %d differs by %g", step, s, d);
            tr_session_free(ref);
        }
        if (step + 1 < 3)
            for (int s = 0; s < 3; s++) next[s] = toks[30 + s + 3 * (step + 1)];
    }
    printf("  decode batch of 3 sequences matches each sequence alone\n");

    /* a continuous-batching step: a prompt chunk of 7 tokens for one sequence next to one token
     * for two others, logits for the first and last only; each equals its sequence alone */
    {
        tr_session *mix[3];
        const int32_t mlen[3] = {4, 9, 13}, mn[3] = {7, 1, 1};
        for (int s = 0; s < 3; s++) {
            TU_CHECK(tr_session_create(m, &sp, &mix[s], &err) == TR_OK, "%s", err.msg);
            TU_CHECK(tr_session_eval(mix[s], toks + s, mlen[s], NULL, false, &err) == TR_OK, "%s",
                     err.msg);
        }
        int32_t mt[9];
        for (int i = 0; i < 9; i++) mt[i] = toks[20 + i];
        const bool want[3] = {true, false, true};
        float *lmix = malloc(sizeof(float) * 2 * nv);
        TU_CHECK(tr_batch_eval(mix, mn, 3, mt, want, lmix, &err) == TR_OK, "%s", err.msg);
        int exact = 1;
        for (int s = 0, w = 0, off = 0; s < 3; off += mn[s], s++) {
            TU_CHECK(tr_session_n_past(mix[s]) == mlen[s] + mn[s], "n_past after the mixed batch");
            if (!want[s]) continue;
            tr_session *ref = NULL;
            TU_CHECK(tr_session_create(m, &sp, &ref, &err) == TR_OK, "%s", err.msg);
            tr_session_eval(ref, toks + s, mlen[s], NULL, false, &err);
            tr_session_eval(ref, mt + off, mn[s], last, false, &err);
            const float d = max_diff(last, lmix + (size_t)w * nv, (size_t)nv);
            exact = exact && d == 0.0f;
            TU_CHECK(d <= TOL, "mixed batch seq %d differs by %g", s, d);
            tr_session_free(ref);
            w++;
        }
        printf("  mixed batch (a 7-token chunk + 2 decode rows) matches each alone (%s)\n",
               exact ? "bit-exact" : "within tolerance");
        /* an error advances no session */
        const int32_t badn[3] = {1, 0, 1};
        TU_CHECK(tr_batch_eval(mix, badn, 3, mt, NULL, NULL, &err) == TR_E_ARG, "0 tokens");
        const int32_t big[3] = {10, 10, 10};
        TU_CHECK(tr_batch_eval(mix, big, 3, toks, NULL, NULL, &err) == TR_E_ARG, "over n_batch");
        TU_CHECK(strstr(err.msg, "batch size") != NULL, "message: %s", err.msg);
        int32_t badtok[9] = {1, 2, 3, 4, 5, 6, 7, nv + 1, 1};
        TU_CHECK(tr_batch_eval(mix, mn, 3, badtok, NULL, NULL, &err) == TR_E_ARG, "bad token");
        for (int s = 0; s < 3; s++)
            TU_CHECK(tr_session_n_past(mix[s]) == mlen[s] + mn[s], "a failed batch moved n_past");
        /* the estimate is what create allocates */
        uint64_t est = 0;
        TU_CHECK(tr_session_estimate(m, &sp, &est, &err) == TR_OK, "%s", err.msg);
        TU_CHECK(est == tr_session_bytes(mix[0]), "estimate %llu vs %llu allocated",
                 (unsigned long long)est, (unsigned long long)tr_session_bytes(mix[0]));
        for (int s = 0; s < 3; s++) tr_session_free(mix[s]);
        free(lmix);
    }

    /* a batch past the gemm's threshold: more decode rows than gemm_min_m, beside two chunks
     * long enough for the gemm (side by side: one product for both) and a short one; every row
     * equals its session alone */
    {
        enum { ND = 18, NS = ND + 3, CH = 24, CH2 = 17, SH = 5 };
        tr_session_params gp = sp;
        gp.n_batch = ND + CH + CH2 + SH;
        tr_session *g[NS];
        int32_t gn[NS], gt[ND + CH + CH2 + SH], nrow = 0;
        for (int s = 0; s < NS; s++) {
            TU_CHECK(tr_session_create(m, &gp, &g[s], &err) == TR_OK, "%s", err.msg);
            TU_CHECK(tr_session_eval(g[s], toks + s % 20, 3 + s % 5, NULL, false, &err) == TR_OK,
                     "%s", err.msg);
            gn[s] = s == 1 ? CH : s == 2 ? CH2 : s == 5 ? SH : 1; /* chunks among decode rows */
            for (int i = 0; i < gn[s]; i++) gt[nrow++] = toks[(s * 7 + i) % N];
        }
        float *lg = malloc(sizeof(float) * NS * nv);
        TU_CHECK(lg && tr_batch_eval(g, gn, NS, gt, NULL, lg, &err) == TR_OK, "%s", err.msg);
        float worst = 0;
        for (int s = 0, off = 0; s < NS; off += gn[s], s++) {
            tr_session *ref = NULL;
            TU_CHECK(tr_session_create(m, &gp, &ref, &err) == TR_OK, "%s", err.msg);
            tr_session_eval(ref, toks + s % 20, 3 + s % 5, NULL, false, &err);
            TU_CHECK(tr_session_eval(ref, gt + off, gn[s], last, false, &err) == TR_OK, "%s",
                     err.msg);
            worst = fmaxf(worst, max_diff(last, lg + (size_t)s * nv, (size_t)nv));
            tr_session_free(ref);
        }
        printf("  batch of %d decode rows, %d- and %d-token chunks side by side and a %d-token "
               "chunk: max |dlogit| to each alone %.2e\n", ND, CH, CH2, SH, worst);
        TU_CHECK(worst <= TOL, "a gemm-sized batch differs from each alone by %g", worst);
        for (int s = 0; s < NS; s++) tr_session_free(g[s]);
        free(lg);
    }

    /* bad input: refused with a message, session unchanged */
    const int32_t before = tr_session_n_past(a);
    int32_t bad[2] = {1, nv + 5};
    TU_CHECK(tr_session_eval(a, bad, 2, NULL, false, &err) == TR_E_ARG, "bad token accepted");
    TU_CHECK(strstr(err.msg, "vocabulary") != NULL, "message: %s", err.msg);
    TU_CHECK(tr_session_n_past(a) == before, "failed eval changed n_past");
    int32_t many[64] = {0};
    TU_CHECK(tr_session_eval(a, many, 64, NULL, false, &err) == TR_E_ARG, "context overflow");
    TU_CHECK(strstr(err.msg, "context") != NULL, "message: %s", err.msg);
    TU_CHECK(tr_session_n_past(a) == before, "failed eval changed n_past");
    tr_session *dup[2] = {a, a};
    TU_CHECK(tr_decode_batch(dup, toks, 2, NULL, &err) == TR_E_ARG, "same session twice");
    TU_CHECK(tr_session_truncate(a, before + 1, &err) == TR_E_ARG, "truncate beyond n_past");
    sp.n_ctx = 1 << 30;
    tr_session *huge = NULL;
    TU_CHECK(tr_session_create(m, &sp, &huge, &err) != TR_OK, "absurd context accepted");
    printf("  errors: %s\n", err.msg);

    /* --kv-policy auto (the default): full while the KV fits its share (here --kv-hot, the
     * share when given), else tiered with a cold pool under $XDG_CACHE_HOME/terrace, whose
     * files go when the session ends; the prefill attends exactly, so the logits are full's;
     * a share too small for even the smallest tiered plan is refused naming the budget */
    {
        char xdg[] = "/tmp/terrace-test-xdg.XXXXXX";
        TU_CHECK(mkdtemp(xdg) != NULL, "mkdtemp");
        setenv("XDG_CACHE_HOME", xdg, 1);
        tr_session_params ap = tr_session_default_params();
        ap.n_ctx = 1024; /* a KV big against the cache's fixed costs (working set, key copy) */
        ap.n_batch = 128;
        TU_CHECK(ap.kv.policy == TR_KV_AUTO, "auto is not the default KV policy");
        tr_session *x = NULL;
        TU_CHECK(tr_session_create(m, &ap, &x, &err) == TR_OK && x, "auto: %s", err.msg);
        TU_CHECK(x && tr_session_kv_policy(x) == TR_KV_FULL && strstr(tr_session_kv_note(x), "full"),
                 "auto with room: policy %d, '%s'", x ? (int)tr_session_kv_policy(x) : -1,
                 x ? tr_session_kv_note(x) : "");
        /* the reference: a prompt longer than the spilled hot pool, prefilled in 6 chunks */
        enum { M = 700 };
        int32_t *long_toks = malloc(sizeof(int32_t) * M);
        float *lf = malloc(sizeof(float) * (size_t)M * nv), *lt = malloc(sizeof(float) * (size_t)M * nv);
        TU_CHECK(long_toks && lf && lt, "out of memory");
        for (int i = 0; i < M; i++) long_toks[i] = (int32_t)(tu_next(&rng) % (uint64_t)(nv - 2));
        TU_CHECK(tr_session_eval(x, long_toks, M, lf, true, &err) == TR_OK, "%s", err.msg);
        tr_session_free(x);
        int spilled = 0, refused = 0;
        for (uint64_t share = 64u << 20; share >= 1024; share = share * 4 / 5) {
            ap.kv.hot_bytes = share;
            x = NULL;
            const tr_status st = tr_session_create(m, &ap, &x, &err);
            if (st) {
                TU_CHECK(st == TR_E_BUDGET && strstr(err.msg, "--mem-budget"),
                         "auto, share %llu: %d %s", (unsigned long long)share, (int)st, err.msg);
                refused++;
                break;
            }
            if (tr_session_kv_policy(x) == TR_KV_TIERED && !spilled) {
                spilled++;
                const char *note = tr_session_kv_note(x);
                TU_CHECK(strstr(note, "tiered") && strstr(note, xdg) && strstr(note, "removed at exit"),
                         "auto spill note: %s", note);
                printf("  %s\n", note);
                /* prefill attends exactly through the tiers: full's logits at every position,
                 * the tokens past the hot pool written to the cold pool and read back, each
                 * cold page at most once per chunk */
                TU_CHECK(tr_session_eval(x, long_toks, M, lt, true, &err) == TR_OK, "%s", err.msg);
                const float dt = max_diff(lf, lt, (size_t)M * nv);
                const double at = agree(lf, lt, M, nv);
                tr_kv_stats ks;
                tr_session_get_kv_stats(x, &ks);
                printf("  auto spilled (share %.1f KiB): %d-token prefill in %llu chunks, max "
                       "|dlogit| to full %.2e (greedy token agrees on %.1f %% of rows), cold pool "
                       "%llu bytes, read %llu bytes (bound %llu)\n",
                       share / 1024.0, (int)M, (unsigned long long)ks.prefill_chunks, dt, 100 * at,
                       (unsigned long long)ks.cold_bytes, (unsigned long long)ks.prefill_bytes_read,
                       (unsigned long long)ks.prefill_read_bound);
                TU_CHECK((float_w || d2 == 0 ? dt < KV_TOL : dt <= KV_NOISE * d2) && ks.cold_bytes > 0 && ks.prefill_chunks == (M + 127) / 128 &&
                             ks.prefill_bytes_read > 0 &&
                             ks.prefill_bytes_read <= ks.prefill_read_bound,
                         "auto spilled: |dlogit| %g (the gemm's %g), cold %llu, %llu chunks, read "
                         "%llu", dt, d2,
                         (unsigned long long)ks.cold_bytes, (unsigned long long)ks.prefill_chunks,
                         (unsigned long long)ks.prefill_bytes_read);
                /* decode goes on through the tiers */
                int32_t nt = long_toks[0];
                TU_CHECK(tr_session_eval(x, &nt, 1, lt, false, &err) == TR_OK, "decode: %s", err.msg);
                char sub[512];
                snprintf(sub, sizeof sub, "%s/terrace", xdg);
                tr_session_free(x);
                x = NULL;
                TU_CHECK(rmdir(sub) == 0, "auto's cold pool left files in %s", sub);
            }
            tr_session_free(x);
        }
        free(long_toks);
        free(lf);
        free(lt);
        TU_CHECK(spilled == 1 && refused == 1, "auto: spilled %d, refused %d", spilled, refused);
        printf("  auto, share too small: %s\n", err.msg);
        char sub[512];
        snprintf(sub, sizeof sub, "%s/terrace", xdg);
        rmdir(sub);
        rmdir(xdg);
        unsetenv("XDG_CACHE_HOME");
    }

    for (int s = 0; s < 3; s++) tr_session_free(seq[s]);
    tr_session_free(a);
    tr_session_free(b);
    tr_session_free(c);
    free(la);
    free(lb);
    free(lc);
    free(last);
    free(lbatch);
    tr_model_free(m);
    return tu_result("test_model");
}
