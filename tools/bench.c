/*
 * terrace bench -m MODEL [-p 512] [-n 128] [-pg PP,TG] [-d 0] [-t N] [-b 512] [-r 3]
 *               [-o md|csv|json|jsonl]
 *
 * Like llama-bench: -p, -n, -t, -b and -d take comma lists, and every combination is one row.
 * Tests: pp (-p tokens evaluated at once), tg (-n tokens decoded one at a time), pg (-pg PP,TG:
 * both in a row, the time of the whole), each at a context already filled to -d tokens ("at
 * depth"). The depth is filled once per (threads, batch, depth); before every repetition the
 * session is cut back to it, so each repetition sees the same cache llama-bench's refill gives.
 * Each test runs once untimed (warm-up) and then -r times; rows report mean ± standard deviation
 * of tokens per second, with the KV cache and expert settings used.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checks.h"
#include "common.h"

#define MAX_LIST 32

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: terrace bench -m MODEL.gguf [options]\n\n"
            "  -p N[,N...]        prompt lengths (pp tests; default 512, 0: none)\n"
            "  -n N[,N...]        tokens to decode (tg tests; default 128, 0: none)\n"
            "  -pg PP,TG          a prompt then a generation, timed together (repeatable)\n"
            "  -d N[,N...]        context already filled before each test (default 0)\n"
            "  -t N[,N...]        threads (default: physical cores)\n"
            "  -b N[,N...]        prompt tokens computed together (default 512)\n"
            "  -r N               repetitions (default 3)\n"
            "  -o md|csv|json|jsonl  output format (default md; --json = json)\n\n");
    gen_print_common_flags(f);
}

typedef struct ilist {
    int32_t v[MAX_LIST];
    int n;
} ilist;

/* "N[,N...]" into l (replacing what it held); values in [lo, hi] */
static bool parse_list(const char *flag, const char *s, int32_t lo, int32_t hi, ilist *l) {
    l->n = 0;
    const char *p = s;
    for (;;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > hi || (*end && *end != ',')) {
            cli_error("%s expects a comma-separated list of integers in [%d, %d], got '%s'", flag,
                      lo, hi, s);
            return false;
        }
        if (l->n == MAX_LIST) {
            cli_error("%s: at most %d values", flag, MAX_LIST);
            return false;
        }
        l->v[l->n++] = (int32_t)v;
        if (!*end) return true;
        p = end + 1;
    }
}

typedef struct test {
    int32_t np, ng; /* prompt tokens, generated tokens */
} test;

typedef enum { OUT_MD, OUT_CSV, OUT_JSON, OUT_JSONL } out_fmt;

typedef struct row {
    test t;
    int32_t depth, threads, batch;
    double mean, sd, *samples;
    int reps;
} row;

static void stats(const double *v, int n, double *mean, double *sd) {
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) s += v[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) s2 += (v[i] - *mean) * (v[i] - *mean);
    *sd = n > 1 ? sqrt(s2 / (n - 1)) : 0.0;
}

static void test_name(const test *t, int32_t depth, char *buf, size_t cap) {
    int k = t->np && t->ng ? snprintf(buf, cap, "pp%d+tg%d", t->np, t->ng)
            : t->np        ? snprintf(buf, cap, "pp%d", t->np)
                           : snprintf(buf, cap, "tg%d", t->ng);
    if (depth > 0 && k > 0 && (size_t)k < cap) snprintf(buf + k, cap - (size_t)k, " @ d%d", depth);
}

/* one timed (or warm-up) run of a test from a session holding `depth` tokens */
static bool run_test(tr_session *s, const test *t, int32_t depth, const int32_t *toks,
                     float *logits, double *tps) {
    tr_error err = {0};
    if (tr_session_truncate(s, depth, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    const double t0 = now_ms();
    if (t->np > 0 && tr_session_eval(s, toks, t->np, logits, false, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    for (int32_t i = 0; i < t->ng; i++)
        if (tr_session_eval(s, toks + t->np + i, 1, logits, false, &err)) {
            cli_error("%s", err.msg);
            return false;
        }
    *tps = 1e3 * (t->np + t->ng) / (now_ms() - t0);
    return true;
}

/* the row's KV and expert settings, as the tables show them */
static void kv_desc(const gen_opts *o, char *buf, size_t cap) {
    if (o->kv.policy == TR_KV_FULL) snprintf(buf, cap, "full f16");
    else snprintf(buf, cap, "%s a%.2f f16", tr_kv_policy_name(o->kv.policy), o->kv.alpha);
}

static void experts_desc(const gen_opts *o, tr_model *m, char *buf, size_t cap) {
    tr_model_stats st;
    tr_model_get_stats(m, &st);
    char b[32];
    if (!st.moe) snprintf(buf, cap, "-");
    else if (!st.expert_cache) snprintf(buf, cap, "mmap");
    else
        snprintf(buf, cap, "cache %s%s", cli_bytes(st.expert_budget_bytes, b, sizeof b),
                 o->expert_cache ? "" : " (auto)");
}

typedef struct printer {
    out_fmt fmt;
    int rows;
    const char *model, *arch, *kernels;
    uint64_t size;
    char kv[64], experts[64];
    const tr_session *s; /* the session of the rows, for its KV counters */
} printer;

static void print_row(printer *p, const row *r) {
    char name[64], b1[32];
    test_name(&r->t, r->depth, name, sizeof name);
    const double rss = peak_rss_mib();
    if (p->fmt == OUT_MD) {
        if (p->rows == 0) {
            printf("| %-34s | %10s | %-8s | %-7s | %7s | %7s | %-14s | %-16s | %16s | %18s |\n",
                   "model", "size", "arch", "kernels", "threads", "n_batch", "kv", "experts",
                   "test", "t/s");
            printf("| %.34s | ---------: | %.8s | %.7s | ------: | ------: | %.14s | %.16s | "
                   "---------------: | -----------------: |\n",
                   "----------------------------------", "--------", "-------", "--------------",
                   "----------------");
        }
        printf("| %-34.34s | %10s | %-8s | %-7s | %7d | %7d | %-14s | %-16s | %16s | %9.2f ± %6.2f |\n",
               p->model, cli_bytes(p->size, b1, sizeof b1), p->arch, p->kernels, r->threads,
               r->batch, p->kv, p->experts, name, r->mean, r->sd);
    } else if (p->fmt == OUT_CSV) {
        if (p->rows == 0)
            printf("model_filename,model_type,model_size,kernels,n_threads,n_batch,kv,experts,"
                   "n_prompt,n_gen,n_depth,test,avg_ts,stddev_ts,peak_rss_mib\n");
        printf("\"%s\",\"%s\",%llu,\"%s\",%d,%d,\"%s\",\"%s\",%d,%d,%d,\"%s\",%.6f,%.6f,%.1f\n",
               p->model, p->arch, (unsigned long long)p->size, p->kernels, r->threads, r->batch,
               p->kv, p->experts, r->t.np, r->t.ng, r->depth, name, r->mean, r->sd, rss);
    } else {
        if (p->fmt == OUT_JSON) printf(p->rows == 0 ? "[\n  " : ",\n  ");
        char date[32];
        const time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        printf("{\"model_filename\": \"%s\", \"model_type\": \"%s\", \"model_size\": %llu, "
               "\"kernels\": \"%s\", \"n_threads\": %d, \"n_batch\": %d, \"kv\": \"%s\", "
               "\"type_k\": \"f16\", \"type_v\": \"f16\", \"experts\": \"%s\", \"n_prompt\": %d, "
               "\"n_gen\": %d, \"n_depth\": %d, \"test\": \"%s\", \"test_time\": \"%s\", "
               "\"reps\": %d, \"avg_ts\": %.6f, \"stddev_ts\": %.6f, \"samples_ts\": [",
               p->model, p->arch, (unsigned long long)p->size, p->kernels, r->threads, r->batch,
               p->kv, p->experts, r->t.np, r->t.ng, r->depth, name, date, r->reps, r->mean, r->sd);
        for (int i = 0; i < r->reps; i++) printf("%s%.6f", i ? ", " : "", r->samples[i]);
        printf("], \"peak_rss_mib\": %.1f", rss);
        /* a managed KV cache's counters, over the session so far (full: none) */
        tr_kv_stats kv;
        tr_session_get_kv_stats(p->s, &kv);
        char kvj[2048];
        if (kv.policy != TR_KV_FULL &&
            tr_kv_stats_format(&kv, TR_KV_STATS_JSON, NULL, kvj, sizeof kvj) < (int)sizeof kvj)
            printf(", %s", kvj);
        printf("}");
        if (p->fmt == OUT_JSONL) printf("\n");
    }
    fflush(stdout);
    p->rows++;
}

/* Takes the flags whose value is a list (and -o, -pg) out of argv; the rest goes to gen_parse */
typedef struct bench_args {
    ilist np, ng, depth, threads, batch;
    test pg[MAX_LIST];
    int n_pg;
    out_fmt fmt;
    bool fmt_set;
} bench_args;

static bool take_bench_args(int argc, char **argv, bench_args *b, int *rest_argc, char **rest) {
    memset(b, 0, sizeof *b);
    b->np = (ilist){{512}, 1};
    b->ng = (ilist){{128}, 1};
    b->depth = (ilist){{0}, 1};
    int n = 0;
    rest[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool list = !strcmp(a, "-p") || !strcmp(a, "-n") || !strcmp(a, "-d") ||
                          !strcmp(a, "--n-depth") || !strcmp(a, "-t") || !strcmp(a, "-b") ||
                          !strcmp(a, "-pg") || !strcmp(a, "-o") || !strcmp(a, "--output");
        if (!list) {
            rest[n++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            cli_error("bench: option %s needs a value", a);
            return false;
        }
        const char *v = argv[++i];
        bool ok = true;
        if (!strcmp(a, "-p")) ok = parse_list(a, v, 0, 1 << 20, &b->np);
        else if (!strcmp(a, "-n")) ok = parse_list(a, v, 0, 1 << 20, &b->ng);
        else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) ok = parse_list(a, v, 0, 1 << 24, &b->depth);
        else if (!strcmp(a, "-t")) ok = parse_list(a, v, 1, 1024, &b->threads);
        else if (!strcmp(a, "-b")) ok = parse_list(a, v, 1, 1 << 16, &b->batch);
        else if (!strcmp(a, "-pg")) {
            ilist l;
            ok = parse_list(a, v, 1, 1 << 20, &l);
            if (ok && l.n != 2) {
                cli_error("-pg expects two numbers, PP,TG, got '%s'", v);
                ok = false;
            }
            if (ok && b->n_pg == MAX_LIST) {
                cli_error("-pg: at most %d tests", MAX_LIST);
                ok = false;
            }
            if (ok) b->pg[b->n_pg++] = (test){l.v[0], l.v[1]};
        } else {
            b->fmt_set = true;
            if (!strcmp(v, "md")) b->fmt = OUT_MD;
            else if (!strcmp(v, "csv")) b->fmt = OUT_CSV;
            else if (!strcmp(v, "json")) b->fmt = OUT_JSON;
            else if (!strcmp(v, "jsonl")) b->fmt = OUT_JSONL;
            else {
                cli_error("-o expects md, csv, json or jsonl, got '%s'", v);
                ok = false;
            }
        }
        if (!ok) return false;
    }
    rest[n] = NULL;
    *rest_argc = n;
    return true;
}

int cmd_bench(int argc, char **argv) {
    bench_args ba;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int rest_argc = 0;
    if (!rest) {
        cli_error("out of memory");
        return CLI_EXIT_ERROR;
    }
    gen_opts o;
    if (!take_bench_args(argc, argv, &ba, &rest_argc, rest) ||
        !gen_parse(rest_argc, rest, &o, "bench", bench_usage)) {
        free(rest);
        return CLI_EXIT_USAGE;
    }
    free(rest);
    if (!ba.fmt_set && o.json) ba.fmt = OUT_JSON;
    if (ba.threads.n == 0) ba.threads = (ilist){{o.n_threads}, 1}; /* 0: the default */
    if (ba.batch.n == 0) ba.batch = (ilist){{o.n_batch > 0 ? o.n_batch : 512}, 1};
    test tests[3 * MAX_LIST];
    int nt = 0;
    for (int i = 0; i < ba.np.n; i++)
        if (ba.np.v[i] > 0) tests[nt++] = (test){ba.np.v[i], 0};
    for (int i = 0; i < ba.ng.n; i++)
        if (ba.ng.v[i] > 0) tests[nt++] = (test){0, ba.ng.v[i]};
    for (int i = 0; i < ba.n_pg; i++) tests[nt++] = ba.pg[i];
    if (nt == 0) {
        cli_error("bench: no tests (every -p and -n is 0 and no -pg)");
        return CLI_EXIT_USAGE;
    }
    int32_t max_tokens = 0, max_depth = 0; /* of a test, of the depths */
    for (int i = 0; i < nt; i++)
        if (tests[i].np + tests[i].ng > max_tokens) max_tokens = tests[i].np + tests[i].ng;
    for (int i = 0; i < ba.depth.n; i++)
        if (ba.depth.v[i] > max_depth) max_depth = ba.depth.v[i];
    const int32_t n_fill = max_depth > max_tokens ? max_depth : max_tokens;

    int rc = CLI_EXIT_ERROR;
    loaded ld;
    memset(&ld, 0, sizeof ld);
    tr_session *s = NULL;
    int32_t *toks = malloc(sizeof *toks * (size_t)(n_fill + max_tokens) + 4);
    double *tps = malloc(sizeof *tps * (size_t)o.reps);
    float *logits = NULL;
    tr_error err = {0};
    printer pr = {.fmt = ba.fmt};
    if (!toks || !tps) {
        cli_error("out of memory");
        goto out;
    }
    for (int ti = 0; ti < ba.threads.n; ti++) {
        o.n_threads = ba.threads.v[ti];
        if (ld.model) unload_model(&ld);
        memset(&ld, 0, sizeof ld);
        if (!load_model(&o, &ld)) {
            if (ld.usage_error) rc = CLI_EXIT_USAGE;
            goto out;
        }
        const int32_t n_vocab = tr_model_n_vocab(ld.model);
        free(logits);
        logits = malloc(sizeof *logits * (size_t)n_vocab);
        if (!logits) {
            cli_error("out of memory");
            goto out;
        }
        /* fixed random tokens: every run measures the same work; the depth's tokens, then the
         * test's */
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (int32_t i = 0; i < n_fill + max_tokens; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            toks[i] = (int32_t)(x % (uint64_t)n_vocab);
        }
        pr.model = strrchr(o.model, '/') ? strrchr(o.model, '/') + 1 : o.model;
        pr.arch = tr_model_arch(ld.model);
        pr.kernels = tr_cpu_isa();
        pr.size = tr_model_weight_bytes(ld.model);
        kv_desc(&o, pr.kv, sizeof pr.kv);
        experts_desc(&o, ld.model, pr.experts, sizeof pr.experts);
        const int nth = tr_pool_size(tr_model_pool(ld.model));
        for (int bi = 0; bi < ba.batch.n; bi++) {
            tr_session_params sp = session_params(&o);
            sp.n_ctx = max_depth + max_tokens + 1;
            sp.n_batch = ba.batch.v[bi];
            tr_session_free(s);
            s = NULL;
            if (tr_session_create(ld.model, &sp, &s, &err)) {
                cli_error("%s", err.msg);
                goto out;
            }
            if (bi == 0) print_kv_note(s, o.verbose);
            pr.s = s;
            for (int di = 0; di < ba.depth.n; di++) {
                const int32_t depth = ba.depth.v[di];
                /* fill the context to the depth once (untimed); runs cut back to it */
                tr_session_truncate(s, 0, &err);
                if (depth > 0 && tr_session_eval(s, toks, depth, logits, false, &err)) {
                    cli_error("%s", err.msg);
                    goto out;
                }
                for (int i = 0; i < nt; i++) {
                    double warm;
                    const int32_t *tt = toks + n_fill;
                    if (!run_test(s, &tests[i], depth, tt, logits, &warm)) goto out;
                    for (int r = 0; r < o.reps; r++)
                        if (!run_test(s, &tests[i], depth, tt, logits, &tps[r])) goto out;
                    row rw = {.t = tests[i], .depth = depth, .threads = nth,
                              .batch = ba.batch.v[bi], .samples = tps, .reps = o.reps};
                    stats(tps, o.reps, &rw.mean, &rw.sd);
                    print_row(&pr, &rw);
                }
            }
            print_kv_stats(stderr, s, "bench: ");
        }
    }
    if (pr.fmt == OUT_JSON) printf("\n]\n");
    if (pr.fmt == OUT_MD) printf("\nkernels %s, peak RSS %.1f MiB\n", tr_cpu_isa(), peak_rss_mib());
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
