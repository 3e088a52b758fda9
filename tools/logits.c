/*
 * terrace logits -m MODEL --tokens 1,2,3 [--out FILE | --top1 FILE] [-b N] [-t N] [--no-mmap]
 *                [--greedy N] [--kv-policy P --kv-alpha A ...] [--experts ... --expert-cache ...]
 *
 * Evaluates a token sequence and writes the logits of every position (raw little-endian f32,
 * [n_tokens][n_vocab]) to FILE, or prints the top-5 of each position. With --greedy N it instead
 * continues the sequence greedily for N tokens and prints {"tokens": [...], "margins": [...]}
 * (top-1 minus top-2 logit at each step). Used by the parity scripts to compare with llama.cpp on
 * the same file and tokens.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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

int cmd_logits(int argc, char **argv) {
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'}, {"tokens", required_argument, NULL, 'k'},
        {"out", required_argument, NULL, 'o'},   {"threads", required_argument, NULL, 't'},
        {"batch-size", required_argument, NULL, 'b'}, {"no-mmap", no_argument, NULL, 'n'},
        {"ctx-size", required_argument, NULL, 'c'},   {"greedy", required_argument, NULL, 'g'},
        {"experts", required_argument, NULL, 'E'},    {"expert-cache", required_argument, NULL, 'C'},
        {"expert-policy", required_argument, NULL, 'P'},
        {"kv-policy", required_argument, NULL, 'K'},  {"kv-alpha", required_argument, NULL, 'A'},
        {"kv-hot", required_argument, NULL, 'H'},     {"kv-cold", required_argument, NULL, 'D'},
        {"kv-sink", required_argument, NULL, 'S'},    {"kv-window", required_argument, NULL, 'W'},
        {"kv-score-bits", required_argument, NULL, 'B'},
        {"kv-tail", required_argument, NULL, 0x100 + 1},
        {"kv-tail-min", required_argument, NULL, 0x100 + 2},
        {"csd-socket", required_argument, NULL, 0x100 + 3},
        {"kv-spec", no_argument, NULL, 0x100 + 4},
        {"kv-bkp", required_argument, NULL, 'O'},
        {"csd", no_argument, NULL, 'Q'},
        {"kv-beta", required_argument, NULL, 'J'},
        {"kv-host-keys", required_argument, NULL, 0x105},
        {"top1", required_argument, NULL, 'T'},
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *tokens_arg = NULL, *out_path = NULL, *top1_path = NULL;
    long threads = 0, batch = 0, ctx = 0, greedy = -1, host_keys = 0;
    bool no_mmap = false, experts_mmap = false;
    unsigned long long expert_cache = 0;
    const char *expert_policy = NULL;
    tr_session_params sp = tr_session_default_params();
    tr_error perr = {0};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:o:t:b:c:", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'k': tokens_arg = optarg; break;
        case 'o': out_path = optarg; break;
        case 't': if (!cli_parse_int("-t", optarg, 1, 1024, &threads)) return CLI_EXIT_USAGE; break;
        case 'b': if (!cli_parse_int("-b", optarg, 1, 1 << 20, &batch)) return CLI_EXIT_USAGE; break;
        case 'c': if (!cli_parse_int("-c", optarg, 1, 1 << 24, &ctx)) return CLI_EXIT_USAGE; break;
        case 'n': no_mmap = true; break;
        case 'E': experts_mmap = !strcmp(optarg, "mmap"); break;
        case 'C':
            if (!strcmp(optarg, "min")) expert_cache = TR_EXPERT_CACHE_MIN;
            else if (strcmp(optarg, "auto") && !cli_parse_size("--expert-cache", optarg, &expert_cache))
                return CLI_EXIT_USAGE;
            break;
        case 'P': expert_policy = optarg; break;
        case 'K':
            if (tr_kv_policy_parse(optarg, &sp.kv.policy, &perr)) {
                cli_error("--kv-policy: %s", perr.msg);
                return CLI_EXIT_USAGE;
            }
            break;
        case 'T': top1_path = optarg; break;
        case 'A': sp.kv.alpha = (float)atof(optarg); break;
        case 'H': {
            unsigned long long b;
            if (!cli_parse_size("--kv-hot", optarg, &b)) return CLI_EXIT_USAGE;
            sp.kv.hot_bytes = b;
            break;
        }
        case 'D': sp.kv.cold_dir = optarg; break;
        case 'S': sp.kv.n_sink = atoi(optarg); break;
        case 'W': sp.kv.n_window = atoi(optarg); break;
        case 'B': sp.kv.score_bits = atoi(optarg); break;
        case 0x101: sp.kv.tail_bits = atoi(optarg); break;
        case 0x102: sp.kv.tail_min = (float)atof(optarg); break;
        case 0x103:
            sp.kv.csd = true;
            sp.kv.csd_socket = optarg;
            break;
        case 0x104: sp.kv.spec = true; break;
        case 'O':
            if (tr_kv_bkp_parse(optarg, &sp.kv.bkp, &perr)) {
                cli_error("%s", perr.msg);
                return CLI_EXIT_USAGE;
            }
            break;
        case 'Q': sp.kv.csd = true; break;
        case 'J': sp.kv.research.beta = (float)atof(optarg); break;
        case 0x105:
            if (!cli_parse_int("--kv-host-keys", optarg, 1, 1 << 24, &host_keys))
                return CLI_EXIT_USAGE;
            sp.kv.host_keys = (int32_t)host_keys;
            break;
        case 'g': if (!cli_parse_int("--greedy", optarg, 0, 1 << 20, &greedy)) return CLI_EXIT_USAGE; break;
        default:
            cli_error("logits: unknown or incomplete option '%s'", argv[optind - 1]);
            return CLI_EXIT_USAGE;
        }
    }
    if (!model || !tokens_arg) {
        cli_error("usage: terrace logits -m MODEL.gguf --tokens ID,ID,... [--out FILE] [-t N] [-b N]");
        return CLI_EXIT_USAGE;
    }
    int32_t *tokens = NULL, n = 0;
    if (!parse_tokens(tokens_arg, &tokens, &n)) {
        cli_error("--tokens expects comma-separated token ids, got '%s'", tokens_arg);
        return CLI_EXIT_USAGE;
    }
    tr_error err = {0};
    tr_model_params mp = tr_model_default_params();
    mp.n_threads = (int)threads;
    mp.no_mmap = no_mmap;
    mp.experts = experts_mmap ? TR_EXPERTS_MMAP : TR_EXPERTS_CACHE;
    mp.expert_cache_bytes = expert_cache;
    mp.expert_policy = expert_policy;
    tr_model *m = NULL;
    tr_session *s = NULL;
    float *logits = NULL;
    int rc = CLI_EXIT_ERROR;
    if (tr_model_load(model, &mp, &m, &err)) goto out;
    sp.n_ctx = ctx ? (int32_t)ctx : n + (greedy > 0 ? (int32_t)greedy : 0);
    sp.n_batch = batch ? (int32_t)batch : 512;
    if (tr_session_create(m, &sp, &s, &err)) goto out;
    const int32_t nv = tr_model_n_vocab(m);
    logits = malloc((size_t)n * nv * sizeof *logits);
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
