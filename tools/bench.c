/*
 * terrace bench -m MODEL [-p 512] [-n 128] [-r 3] [-t N] [--json]
 *
 * Like llama-bench: prompt processing (pp: -p random tokens in one go from an empty context) and
 * text generation (tg: -n tokens decoded one at a time from an empty context), each repeated -r
 * times after a warm-up, reported as mean ± standard deviation of tokens per second.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "common.h"

static void bench_usage(FILE *f) {
    fprintf(f, "usage: terrace bench -m MODEL.gguf [-p N_PROMPT] [-n N_GEN] [-r REPS] [-t N] [--json]\n\n");
    gen_print_common_flags(f);
}

typedef struct result {
    const char *test;
    int32_t n;
    double mean, sd;
} result;

static void stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0.0;
}

int cmd_bench(int argc, char **argv) {
    gen_opts o;
    if (!gen_parse(argc, argv, &o, "bench", bench_usage)) return CLI_EXIT_USAGE;
    int rc = CLI_EXIT_ERROR;
    loaded ld;
    memset(&ld, 0, sizeof ld);
    tr_session *s = NULL;
    int32_t *toks = NULL;
    double *tps = NULL;
    float *logits = NULL;
    tr_error err = {0};
    if (!load_model(&o, &ld)) {
        if (ld.usage_error) rc = CLI_EXIT_USAGE;
        goto out;
    }
    const int32_t n_vocab = tr_model_n_vocab(ld.model);
    const int32_t np = o.n_prompt_bench, ng = o.n_gen_bench;
    tr_session_params sp = session_params(&o);
    sp.n_ctx = (np > ng ? np : ng) + 1;
    sp.n_batch = o.n_batch > 0 ? o.n_batch : 512;
    if (tr_session_create(ld.model, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    print_kv_note(s, o.verbose);
    toks = malloc(sizeof *toks * (size_t)(np > ng ? np : ng) + 4);
    tps = malloc(sizeof *tps * (size_t)o.reps);
    logits = malloc(sizeof *logits * (size_t)n_vocab);
    if (!toks || !tps || !logits) {
        cli_error("out of memory");
        goto out;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull; /* fixed random tokens: every run measures the same work */
    for (int32_t i = 0; i < (np > ng ? np : ng); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)n_vocab);
    }
    /* warm-up, as llama-bench: one token, and one unmeasured generation pass, so page-ins and
     * a cold expert cache are not what gets timed */
    if (tr_session_eval(s, toks, 1, logits, false, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    for (int32_t i = 1; i < ng; i++)
        if (tr_session_eval(s, toks + i, 1, logits, false, &err)) {
            cli_error("%s", err.msg);
            goto out;
        }
    result res[2];
    int n_res = 0;
    for (int t = 0; t < 2; t++) {
        const int32_t n = t == 0 ? np : ng;
        if (n <= 0) continue;
        for (int r = 0; r < o.reps; r++) {
            tr_session_truncate(s, 0, &err);
            const double t0 = now_ms();
            if (t == 0) {
                if (tr_session_eval(s, toks, n, logits, false, &err)) {
                    cli_error("%s", err.msg);
                    goto out;
                }
            } else {
                for (int32_t i = 0; i < n; i++)
                    if (tr_session_eval(s, toks + i, 1, logits, false, &err)) {
                        cli_error("%s", err.msg);
                        goto out;
                    }
            }
            tps[r] = 1e3 * n / (now_ms() - t0);
        }
        res[n_res].test = t == 0 ? "pp" : "tg";
        res[n_res].n = n;
        stats(tps, o.reps, &res[n_res].mean, &res[n_res].sd);
        n_res++;
    }
    char b1[32];
    const char *name = strrchr(o.model, '/') ? strrchr(o.model, '/') + 1 : o.model;
    const int nth = tr_pool_size(tr_model_pool(ld.model));
    /* a managed KV cache's counters, over the whole run (full: none) */
    tr_kv_stats kv;
    tr_session_get_kv_stats(s, &kv);
    char kvj[2048] = "";
    if (kv.policy != TR_KV_FULL) {
        kvj[0] = ',';
        kvj[1] = ' ';
        tr_kv_stats_format(&kv, TR_KV_STATS_JSON, NULL, kvj + 2, sizeof kvj - 2);
    }
    if (o.json) {
        printf("[\n");
        for (int i = 0; i < n_res; i++)
            printf("  {\"model\": \"%s\", \"arch\": \"%s\", \"size_bytes\": %llu, \"threads\": %d, "
                   "\"kernels\": \"%s\", \"test\": \"%s%d\", \"n\": %d, \"reps\": %d, "
                   "\"avg_ts\": %.3f, \"stddev_ts\": %.3f, \"peak_rss_mib\": %.1f%s}%s\n",
                   name, tr_model_arch(ld.model),
                   (unsigned long long)tr_model_weight_bytes(ld.model), nth, tr_cpu_isa(),
                   res[i].test, res[i].n, res[i].n, o.reps, res[i].mean, res[i].sd, peak_rss_mib(),
                   kvj, i + 1 < n_res ? "," : "");
        printf("]\n");
    } else {
        printf("| %-32s | %10s | %-8s | %7s | %8s | %18s |\n", "model", "size", "arch", "threads",
               "test", "t/s");
        printf("| %.32s | %.10s | %.8s | %.7s | %.8s | %.18s |\n",
               "--------------------------------", "----------", "--------", "-------",
               "--------", "------------------");
        for (int i = 0; i < n_res; i++) {
            char test[32];
            snprintf(test, sizeof test, "%s%d", res[i].test, res[i].n);
            printf("| %-32.32s | %10s | %-8s | %7d | %8s | %9.2f ± %6.2f |\n", name,
                   cli_bytes(tr_model_weight_bytes(ld.model), b1, sizeof b1),
                   tr_model_arch(ld.model), nth, test, res[i].mean, res[i].sd);
        }
        printf("\nkernels %s, peak RSS %.1f MiB\n", tr_cpu_isa(), peak_rss_mib());
    }
    print_kv_stats(stderr, s, "bench: ");
    if (!close_outputs(&ld)) goto out;
    rc = 0;
out:
    free(toks);
    free(tps);
    free(logits);
    tr_session_free(s);
    if (ld.model) unload_model(&ld);
    return rc;
}
