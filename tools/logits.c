/*
 * terrace logits -m MODEL --tokens 1,2,3 [--out FILE | --top1 FILE] [-b N] [-t N] [--no-mmap]
 *                [--greedy N] [--kv-policy P --kv-alpha A ...] [--experts ... --expert-cache ...]
 *
 * Evaluates a token sequence and writes the logits of every position (raw little-endian f32,
 * [n_tokens][n_vocab]) to FILE, or prints the top-5 of each position. With --greedy N it instead
 * continues the sequence greedily for N tokens and prints {"tokens": [...], "margins": [...]}
 * (top-1 minus top-2 logit at each step). With --tail N the first n - N tokens are a prompt
 * (one prefill, as a run computes it) and the last N are fed one at a time, each a decode step
 * with the KV policy's own selection: it prints {"top1": [...], "nll": [...]}, the argmax and
 * -log p(token) at each of those N positions (teacher-forced quality of the decoded region,
 * bench/bench_long.py). --tokens @FILE reads the ids from FILE (long sequences exceed one
 * argument's limit). Used by the parity scripts to compare with llama.cpp on the same file and
 * tokens.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static int parse_tokens(const char *s, int32_t **out, int32_t *n) {
    size_t cap = 64, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX) {
            free(v);
            return 0;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *g = realloc(v, cap * sizeof *v);
            if (!g) {
                free(v);
                return 0;
            }
            v = g;
        }
        v[k++] = (int32_t)x;
        s = end;
        while (*s == ',' || *s == ' ' || *s == '\n') s++;
    }
    *out = v;
    *n = (int32_t)k;
    return k > 0;
}

static void logits_usage(FILE *f) {
    fprintf(f, "usage: terrace logits -m MODEL.gguf --tokens ID,ID,... [--out FILE | --top1 FILE]\n"
               "                      [--greedy N] [options]\n\n"
               "  --tokens ID,...   the token ids to evaluate\n"
               "  --out FILE        every position's logits, raw little-endian f32 [n][n_vocab]\n"
               "  --top1 FILE       only each position's argmax (int32)\n"
               "  --greedy N        continue greedily for N tokens; print tokens and margins\n"
               "  --tail N          prefill all but the last N tokens, then feed those one at a\n"
               "                    time (decode steps); print each one's argmax and -log p\n"
               "  --tokens @FILE    read the ids from FILE\n\n");
    gen_print_common_flags(f);
}

int cmd_logits(int argc, char **argv) {
    /* this command's own flags are taken out here; the model, threads, batch, context, expert and
     * KV flags are the other commands' (gen_parse), so that each is defined once */
    const char *tokens_arg = NULL, *out_path = NULL, *top1_path = NULL, *greedy_arg = NULL,
               *tail_arg = NULL;
    char **rest = malloc((size_t)(argc + 1) * sizeof *rest);
    if (!rest) {
        cli_error("logits: out of memory");
        return CLI_EXIT_ERROR;
    }
    int nrest = 0;
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char **dst = !strcmp(argv[i], "--tokens") ? &tokens_arg
                           : !strcmp(argv[i], "--out") || !strcmp(argv[i], "-o") ? &out_path
                           : !strcmp(argv[i], "--top1")                           ? &top1_path
                           : !strcmp(argv[i], "--greedy")                         ? &greedy_arg
                           : !strcmp(argv[i], "--tail")                           ? &tail_arg
                                                                                   : NULL;
        if (!dst) {
            rest[nrest++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            cli_error("logits: option %s needs a value", argv[i]);
            free(rest);
            return CLI_EXIT_USAGE;
        }
        *dst = argv[++i];
    }
    rest[nrest] = NULL;
    gen_opts o;
    const bool parsed = gen_parse(nrest, rest, &o, "logits", logits_usage);
    free(rest);
    if (!parsed) return CLI_EXIT_USAGE;
    long greedy = -1, tail = -1;
    if (greedy_arg && !cli_parse_int("--greedy", greedy_arg, 0, 1 << 20, &greedy))
        return CLI_EXIT_USAGE;
    if (tail_arg && !cli_parse_int("--tail", tail_arg, 1, 1 << 20, &tail)) return CLI_EXIT_USAGE;
    if (tail > 0 && (greedy >= 0 || out_path || top1_path)) {
        cli_error("logits: --tail prints its own results (not with --greedy, --out or --top1)");
        return CLI_EXIT_USAGE;
    }
    const char *model = o.model;
    if (!model || !tokens_arg) {
        cli_error("usage: terrace logits -m MODEL.gguf --tokens ID,ID,... [--out FILE] [-t N] [-b N]");
        return CLI_EXIT_USAGE;
    }
    int32_t *tokens = NULL, n = 0;
    char *file_text = NULL;
    if (tokens_arg[0] == '@') {
        FILE *tf = fopen(tokens_arg + 1, "rb");
        long len = -1;
        if (tf && fseek(tf, 0, SEEK_END) == 0) len = ftell(tf);
        if (len >= 0 && fseek(tf, 0, SEEK_SET) == 0 && (file_text = malloc((size_t)len + 1)) &&
            fread(file_text, 1, (size_t)len, tf) == (size_t)len)
            file_text[len] = 0;
        else {
            free(file_text);
            file_text = NULL;
        }
        if (tf) fclose(tf);
        if (!file_text) {
            cli_error("--tokens %s: cannot read %s", tokens_arg, tokens_arg + 1);
            return CLI_EXIT_ERROR;
        }
        tokens_arg = file_text;
    }
    const bool parsed_tokens = parse_tokens(tokens_arg, &tokens, &n);
    if (!parsed_tokens) {
        cli_error("--tokens expects comma-separated token ids, got '%.200s'", tokens_arg);
        free(file_text);
        return CLI_EXIT_USAGE;
    }
    free(file_text);
    if (tail > 0 && tail >= n) {
        cli_error("logits: --tail %ld needs more than %ld tokens (got %d)", tail, tail, n);
        free(tokens);
        return CLI_EXIT_USAGE;
    }
    tr_error err = {0};
    tr_model_params mp = tr_model_default_params();
    mp.n_threads = o.n_threads;
    mp.no_mmap = o.no_mmap;
    mp.experts = o.experts_mmap ? TR_EXPERTS_MMAP : TR_EXPERTS_CACHE;
    mp.expert_cache_bytes = o.expert_cache;
    mp.mem_budget_bytes = o.mem_budget;
    mp.expert_policy = o.expert_policy;
    mp.expert_prefetch = o.expert_prefetch;
    if (o.io_threads) mp.io_threads = o.io_threads;
    tr_model *m = NULL;
    tr_session *s = NULL;
    float *logits = NULL;
    int rc = CLI_EXIT_ERROR;
    if (tr_model_load(model, &mp, &m, &err)) goto out;
    tr_session_params sp = session_params(&o);
    /* every position's logits as decoding would compute them there (its own selection); --tail:
     * the prompt prefilled as a run does (exact unless --kv-prefill-select), the tail's
     * positions are decode steps */
    sp.kv.prefill_select = tail < 0 || o.kv.prefill_select;
    sp.n_ctx = o.n_ctx ? o.n_ctx : n + (greedy > 0 ? (int32_t)greedy : 0);
    sp.n_batch = o.n_batch ? o.n_batch : 512;
    if (tr_session_create(m, &sp, &s, &err)) goto out;
    const int32_t nv = tr_model_n_vocab(m);
    /* --greedy and --tail read one row at a time */
    logits = malloc((size_t)(greedy >= 0 || tail > 0 ? 1 : n) * nv * sizeof *logits);
    if (!logits) {
        snprintf(err.msg, sizeof err.msg, "out of memory for %d x %d logits", n, nv);
        goto out;
    }
    if (greedy >= 0) {
        if (tr_session_eval(s, tokens, n, logits, false, &err)) goto out;
        printf("{\"tokens\": [");
        char margins[64 * 1024] = "";
        size_t mo = 0;
        for (long i = 0; i < greedy; i++) {
            int32_t best = 0, second = -1;
            for (int32_t v = 1; v < nv; v++) {
                if (logits[v] > logits[best]) {
                    second = best;
                    best = v;
                } else if (second < 0 || logits[v] > logits[second]) {
                    second = v;
                }
            }
            printf("%s%d", i ? ", " : "", best);
            if (mo < sizeof margins - 32)
                mo += (size_t)snprintf(margins + mo, sizeof margins - mo, "%s%.5f", i ? ", " : "",
                                       logits[best] - logits[second]);
            if (i + 1 < greedy && tr_session_eval(s, &best, 1, logits, false, &err)) goto out;
        }
        printf("], \"margins\": [%s]}\n", margins);
        rc = 0;
        goto out;
    }
    if (tail > 0) {
        const int32_t n0 = n - (int32_t)tail;
        int32_t *top1 = malloc((size_t)tail * sizeof *top1);
        double *nll = malloc((size_t)tail * sizeof *nll);
        print_kv_note(s, true);
        /* timed as a run times its prefill and decode steps: the eval calls only */
        double t0 = now_ms();
        bool ok = top1 && nll && !tr_session_eval(s, tokens, n0, logits, false, &err);
        const double prefill_ms = now_ms() - t0;
        double decode_ms = 0.0;
        for (int32_t i = n0; ok && i < n; i++)
            if (tokens[i] >= nv) {
                snprintf(err.msg, sizeof err.msg, "token %d at %d: the vocabulary has %d", tokens[i],
                         i, nv);
                ok = false;
            }
        for (int32_t i = n0; ok && i < n; i++) {
            /* position i's prediction of tokens[i], from the logits after tokens[..i) */
            int32_t best = 0;
            float mx = logits[0];
            for (int32_t v = 1; v < nv; v++)
                if (logits[v] > mx) {
                    mx = logits[v];
                    best = v;
                }
            double sum = 0.0;
            for (int32_t v = 0; v < nv; v++) sum += exp((double)logits[v] - (double)mx);
            top1[i - n0] = best;
            nll[i - n0] = log(sum) - ((double)logits[tokens[i]] - (double)mx);
            if (i + 1 < n) {
                t0 = now_ms();
                ok = !tr_session_eval(s, &tokens[i], 1, logits, false, &err);
                decode_ms += now_ms() - t0;
            }
        }
        if (ok) {
            printf("{\"top1\": [");
            for (long i = 0; i < tail; i++) printf("%s%d", i ? ", " : "", top1[i]);
            printf("], \"nll\": [");
            for (long i = 0; i < tail; i++) printf("%s%.6f", i ? ", " : "", nll[i]);
            /* what the run's summary reports, for one pass that measures and scores together:
             * prefill and decode time (tail - 1 decode steps), the KV cache's counters, the
             * plan without its margin and the peak RSS */
            tr_kv_stats kv;
            tr_session_get_kv_stats(s, &kv);
            char kvj[4096];
            tr_kv_stats_format(&kv, TR_KV_STATS_JSON, "", kvj, sizeof kvj);
            tr_mem_plan pl;
            tr_session_get_plan(s, &pl);
            /* plan_mib and peak_rss_mib: this process's; the storage agent's apart */
            printf("], \"prompt\": %d, \"prefill_ms\": %.3f, \"decode_steps\": %ld, "
                   "\"decode_ms\": %.3f, \"plan_mib\": %.3f, \"peak_rss_mib\": %.3f, "
                   "\"agent_plan_mib\": %.3f, \"agent_peak_rss_mib\": %.3f, %s}\n",
                   n0, prefill_ms, tail - 1, decode_ms, plan_host_mib(&pl), peak_rss_mib(),
                   (double)pl.kv_agent_bytes / (1024.0 * 1024.0), agent_peak_rss_mib(&kv), kvj);
        } else if (!top1 || !nll) {
            snprintf(err.msg, sizeof err.msg, "out of memory for %ld positions", tail);
        }
        free(top1);
        free(nll);
        if (ok) rc = 0;
        goto out;
    }
    if (tr_session_eval(s, tokens, n, logits, true, &err)) goto out;
    if (top1_path) {
        /* only the argmax of every position (int32): long contexts x big vocabularies */
        FILE *f = fopen(top1_path, "wb");
        bool ok = f != NULL;
        for (int32_t i = 0; ok && i < n; i++) {
            const float *l = logits + (size_t)i * nv;
            int32_t best = 0;
            for (int32_t v = 1; v < nv; v++) best = l[v] > l[best] ? v : best;
            ok = fwrite(&best, sizeof best, 1, f) == 1;
        }
        if (!f || !ok || fclose(f) != 0) {
            snprintf(err.msg, sizeof err.msg, "cannot write %s", top1_path);
            goto out;
        }
    } else if (out_path) {
        FILE *f = fopen(out_path, "wb");
        if (!f || fwrite(logits, sizeof *logits, (size_t)n * nv, f) != (size_t)n * nv ||
            fclose(f) != 0) {
            snprintf(err.msg, sizeof err.msg, "cannot write %s", out_path);
            goto out;
        }
    } else {
        for (int32_t i = 0; i < n; i++) {
            const float *l = logits + (size_t)i * nv;
            int32_t best[5] = {-1, -1, -1, -1, -1};
            for (int32_t v = 0; v < nv; v++)
                for (int k = 0; k < 5; k++)
                    if (best[k] < 0 || l[v] > l[best[k]]) {
                        memmove(best + k + 1, best + k, (size_t)(4 - k) * sizeof *best);
                        best[k] = v;
                        break;
                    }
            printf("pos %4d token %6d:", i, tokens[i]);
            for (int k = 0; k < 5; k++) printf("  %6d %9.4f", best[k], l[best[k]]);
            putchar('\n');
        }
    }
    rc = 0;
out:
    if (rc) cli_error("%s", err.msg);
    free(logits);
    free(tokens);
    tr_session_free(s);
    tr_model_free(m);
    return rc;
}
