/*
 * MoE models through the expert cache: every budget from the smallest legal one to "everything
 * fits", with and without the router lookahead's protection, with read-ahead of predicted
 * experts, and plain mmap, give bit-identical logits; a budget below one layer's top-k is refused
 * with the minimum; an I/O error while loading an expert fails the evaluation with a message
 * (never wrong tokens) and the model stays usable; two threads with their own sessions share one
 * model and its cache (this test also runs under ThreadSanitizer).
 *
 * usage: test_moe MODEL.gguf   (a synthetic MoE model, tests/py/synth.py)
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "terrace.h"
#include "testutil.h"

enum { N_TOK = 24 };
static int32_t g_toks[N_TOK];

static float *eval_all(tr_model *m, tr_error *err, tr_status *st) {
    const int32_t nv = tr_model_n_vocab(m);
    float *l = malloc(sizeof(float) * N_TOK * nv);
    tr_session *s = NULL;
    tr_session_params sp = tr_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 5; /* several prefill chunks: several rounds of expert requests */
    *st = tr_session_create(m, &sp, &s, err);
    if (*st == TR_OK) *st = tr_session_eval(s, g_toks, N_TOK, l, true, err);
    /* a few decode steps too (one row: the top-k request path) */
    for (int i = 0; *st == TR_OK && i < 3; i++) *st = tr_session_eval(s, g_toks + i, 1, NULL, false, err);
    tr_session_free(s);
    if (*st) {
        free(l);
        return NULL;
    }
    return l;
}

static bool g_lookahead;
static int g_prefetch;

static tr_model *load(const char *path, tr_experts_mode mode, uint64_t budget, tr_error *err,
                      tr_status *st) {
    tr_model_params mp = tr_model_default_params();
    mp.n_threads = 2;
    mp.experts = mode;
    mp.expert_cache_bytes = budget;
    mp.expert_lookahead = g_lookahead;
    mp.expert_prefetch = g_prefetch;
    tr_model *m = NULL;
    *st = tr_model_load(path, &mp, &m, err);
    return m;
}

typedef struct {
    tr_model *m;
    float *out;
    tr_status st;
    tr_error err;
} thread_arg;

static void *worker(void *p) {
    thread_arg *a = p;
    a->out = eval_all(a->m, &a->err, &a->st);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    tu_rng rng = {7};
    tr_error err = {0};
    tr_status st;
    tr_model *ref_m = load(path, TR_EXPERTS_MMAP, 0, &err, &st);
    if (!ref_m) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const int32_t nv = tr_model_n_vocab(ref_m);
    for (int i = 0; i < N_TOK; i++) g_toks[i] = (int32_t)(tu_next(&rng) % (uint64_t)(nv - 2));
    float *ref = eval_all(ref_m, &err, &st);
    TU_CHECK(ref != NULL, "mmap run: %s", err.msg);
    tr_model_stats ms;
    tr_model_get_stats(ref_m, &ms);
    tr_model_free(ref_m);
    if (!ref) return tu_result("test_moe");

    /* budgets: the minimum, a few in between, everything */
    const uint64_t budgets[] = {TR_EXPERT_CACHE_MIN, ms.expert_total_bytes / 7,
                                ms.expert_total_bytes / 3, ms.expert_total_bytes * 2};
    const size_t nbud = sizeof budgets / sizeof budgets[0];
    /* plain, with the lookahead's protection, with protection and the default read-ahead (auto:
     * the next layer's predicted top-k wherever the budget is below every expert) */
    for (size_t bb = 0; bb < 3 * nbud; bb++) {
        const size_t b = bb % nbud;
        g_lookahead = bb >= nbud;
        g_prefetch = bb >= 2 * nbud ? TR_EXPERT_PREFETCH_AUTO : 0;
        tr_model *m = load(path, TR_EXPERTS_CACHE, budgets[b], &err, &st);
        if (!m) {
            /* a fraction of the total may fall below the minimum for tiny models: fine if so */
            TU_CHECK(st == TR_E_BUDGET && budgets[b] != TR_EXPERT_CACHE_MIN, "load: %s", err.msg);
            continue;
        }
        float *got = eval_all(m, &err, &st);
        TU_CHECK(got != NULL, "cache run: %s", err.msg);
        tr_model_stats s;
        tr_model_get_stats(m, &s);
        if (got) {
            const int same = memcmp(got, ref, sizeof(float) * N_TOK * nv) == 0;
            TU_CHECK(same, "budget %llu changed the logits", (unsigned long long)s.expert_budget_bytes);
            printf("  budget %8.2f MiB (%s%s%s): hits %llu misses %llu read %.2f MiB -> logits %s\n",
                   (double)s.expert_budget_bytes / 1048576.0, s.expert_policy,
                   g_lookahead ? ", lookahead" : "", g_prefetch ? ", prefetch auto" : "",
                   (unsigned long long)s.expert_hits, (unsigned long long)s.expert_misses,
                   (double)s.expert_bytes_read / 1048576.0, same ? "identical to mmap" : "DIFFER");
        }
        TU_CHECK(s.expert_cache_bytes <= s.expert_budget_bytes, "arena over budget");
        free(got);
        tr_model_free(m);
    }

    g_lookahead = false;
    g_prefetch = TR_EXPERT_PREFETCH_AUTO;
    /* auto: the plan's arithmetic holds, its margin is at most a tenth of the cap, and the cache
     * got the budget it states; under a --mem-budget of dense + 24 MiB it is the arena that gives */
    for (int with_cap = 0; with_cap < 2; with_cap++) {
        tr_model_params mp = tr_model_default_params();
        mp.n_threads = 2;
        mp.session_ctx = 64;
        mp.mem_budget_bytes = with_cap ? ms.dense_bytes + (64u << 20) : 0;
        tr_model *am = NULL;
        st = tr_model_load(path, &mp, &am, &err);
        TU_CHECK(st == TR_OK, "auto load: %s", err.msg);
        if (!am) continue;
        tr_expert_budget_plan pl;
        tr_model_expert_plan(am, &pl);
        tr_model_stats s;
        tr_model_get_stats(am, &s);
        const uint64_t used = pl.in_use_bytes + pl.session_bytes + pl.bookkeeping_bytes + pl.margin_bytes;
        TU_CHECK(pl.automatic && pl.dense_cache_dropped, "plan: automatic %d, dense cache dropped %d",
                 pl.automatic, pl.dense_cache_dropped);
        TU_CHECK(pl.margin_bytes * 10 <= pl.cap_bytes, "margin %llu of cap %llu",
                 (unsigned long long)pl.margin_bytes, (unsigned long long)pl.cap_bytes);
        TU_CHECK(s.expert_budget_bytes == pl.budget_bytes, "cache budget %llu, plan %llu",
                 (unsigned long long)s.expert_budget_bytes, (unsigned long long)pl.budget_bytes);
        TU_CHECK(pl.holds_all || pl.raised_to_min || used + pl.budget_bytes == pl.cap_bytes,
                 "plan does not add up: %s", pl.how);
        TU_CHECK(!with_cap || !strcmp(pl.source, "--mem-budget"), "source %s", pl.source);
        printf("  auto%s: %s\n", with_cap ? " under --mem-budget" : "", pl.how);
        tr_model_free(am);
    }
    /* a budget below one layer's top-k */
    tr_model *m = load(path, TR_EXPERTS_CACHE, 4096, &err, &st);
    TU_CHECK(!m && st == TR_E_BUDGET && strstr(err.msg, "minimum"), "tiny budget: %s", err.msg);
    printf("  tiny budget: %s\n", err.msg);
    tr_model_free(m);

    /* an I/O error on the 3rd expert read: the evaluation fails, nothing wrong comes out, and
     * the model recovers (the fault fires once) */
    setenv("TERRACE_FAULT_READ", "3", 1);
    m = load(path, TR_EXPERTS_CACHE, TR_EXPERT_CACHE_MIN, &err, &st);
    unsetenv("TERRACE_FAULT_READ");
    TU_CHECK(m != NULL, "load with fault injection: %s", err.msg);
    if (m) {
        float *got = eval_all(m, &err, &st);
        TU_CHECK(got == NULL && st == TR_E_IO, "injected EIO not reported (status %d)", (int)st);
        printf("  injected EIO: %s\n", err.msg);
        free(got);
        got = eval_all(m, &err, &st);
        TU_CHECK(got && !memcmp(got, ref, sizeof(float) * N_TOK * nv), "after the fault: %s",
                 got ? "logits differ" : err.msg);
        free(got);
        tr_model_free(m);
    }

    /* two threads, two sessions, one model and one cache (TSan build checks the races) */
    m = load(path, TR_EXPERTS_CACHE, ms.expert_total_bytes / 3 + 1, &err, &st);
    if (!m) m = load(path, TR_EXPERTS_CACHE, TR_EXPERT_CACHE_MIN, &err, &st);
    TU_CHECK(m != NULL, "%s", err.msg);
    if (m) {
        thread_arg a[2] = {{.m = m}, {.m = m}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, &a[i]);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++) {
            TU_CHECK(a[i].out && !memcmp(a[i].out, ref, sizeof(float) * N_TOK * nv),
                     "thread %d: %s", i, a[i].out ? "logits differ" : a[i].err.msg);
            free(a[i].out);
        }
        printf("  two threads sharing one model and cache: identical logits\n");
        tr_model_free(m);
    }
    free(ref);
    return tu_result("test_moe");
}
