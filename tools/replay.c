/*
 * terrace replay TRACE [--budget LIST] [--policies LIST] [--seed N] [--tokens A:B] [--json]
 *
 * Replays a route trace through expert-cache policies at several byte budgets and prints the
 * decode-only hit rate of each: Belady's offline optimum (the ceiling), LRU (what a plain cache
 * does), LFU, random (the floor) and terrace's online policies. The simulation and its semantics
 * are the library's (include/terrace_replay.h); this file parses flags and prints.
 *
 * --prefetch N (an experiment, not the live cache's predictor): after each decode batch of layer
 * l, the N experts of layer l+1 most often seen with this batch's experts (a co-activation count
 * learned online from earlier tokens only) are admitted ahead of use. The trace has no hidden
 * states, so the live predictor (the next layer's router applied to this layer's input) cannot be
 * replayed; this is the best history-only stand-in we have.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "terrace_replay.h"

#define MIB         1048576.0
#define MAX_BUDGETS 64
#define MAX_POLICIES 16

static const double k_default_budgets[] = {250,  500,  750,  1000, 1500, 2000,
                                           2500, 3000, 4000, 6000, 8000};
static const char *const k_default_policies[] = {"belady", "lru",     "lfu",     "random",
                                                 "lrfu",   "layered", "knn",     "adaptive"};

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* ---------------------------------------------------------------------------------------------- */
/* Options                                                                                        */

/* "250" = 250 MiB; "512M", "2G", "1.5GiB", "300MiB", "1000000B" */
static bool parse_budget(const char *v, uint64_t *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || !isfinite(x) || x <= 0) return false;
    double mul = MIB;
    if (*end) {
        switch (*end) {
        case 'k':
        case 'K': mul = 1024.0; break;
        case 'm':
        case 'M': mul = MIB; break;
        case 'g':
        case 'G': mul = MIB * 1024.0; break;
        case 't':
        case 'T': mul = MIB * 1048576.0; break;
        case 'b':
        case 'B': mul = 1.0; break;
        default: return false;
        }
        end++;
        if (mul > 1.0) {
            if (*end == 'i' || *end == 'I') end++;
            if (*end == 'b' || *end == 'B') end++;
        }
        if (*end) return false;
    }
    double bytes = x * mul;
    if (bytes < 1 || bytes > 1e18) return false;
    *out = (uint64_t)llround(bytes);
    return true;
}

static void replay_usage(FILE *f) {
    fprintf(f,
            "usage: terrace replay TRACE [--budget LIST] [--policies LIST] [--seed N] [--tokens A:B]\n"
            "                            [--json]\n\n"
            "Replays a route trace (--route-trace CSV) through expert-cache policies and prints\n"
            "the decode-only hit %% for each budget.\n\n"
            "  --budget LIST    comma-separated budgets: MiB numbers or sizes (512M, 2G, 1.5GiB);\n"
            "                   default 250,500,750,1000,1500,2000,2500,3000,4000,6000,8000\n"
            "  --policies LIST  comma-separated, from %s\n"
            "                   (default: belady,lru,lfu,random,lrfu,layered,knn,adaptive)\n"
            "  --seed N         seed of the random policy (default 1)\n"
            "  --decay X        lrfu/layered/knn/adaptive: decay per layer visit, in (0,1]\n"
            "                   (default 0.9 lrfu, 0.95 the others)\n"
            "  --tokens A:B     count decode hits of decode tokens A..B-1 only (0-based, trace\n"
            "                   order; B empty: to the end); the whole trace still runs, so a test\n"
            "                   split is judged with the cache the earlier tokens left\n"
            "  --prefetch N     also read N experts of the next layer ahead, predicted from\n"
            "                   co-activation counts learned online (an experiment; default 0)\n"
            "  --json           print the results as one JSON document\n"
            "  -h, --help       this text\n",
            tr_expert_policy_names());
}

static int usage_error(const char *msg, const char *what) {
    cli_error("replay: %s%s%s", msg, what ? " " : "", what ? what : "");
    replay_usage(stderr);
    return CLI_EXIT_USAGE;
}

static bool split_budgets(const char *list, uint64_t *b, size_t *n) {
    char buf[1024];
    if (strlen(list) >= sizeof buf) return false;
    strcpy(buf, list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_BUDGETS || !parse_budget(tok, &b[*n])) return false;
        (*n)++;
    }
    return *n > 0;
}


typedef struct policy_list {
    char name[MAX_POLICIES][32];
    size_t n;
} policy_list;

static bool split_policies(const char *list, policy_list *pl) {
    char buf[512];
    if (strlen(list) >= sizeof buf) return false;
    strcpy(buf, list);
    pl->n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        tr_error err = {0};
        if (pl->n == MAX_POLICIES || strlen(tok) >= sizeof pl->name[0] ||
            tr_expert_policy_check(tok, &err) != TR_OK) {
            cli_error("replay: %s", err.msg[0] ? err.msg : "too many policies");
            return false;
        }
        strcpy(pl->name[pl->n++], tok);
    }
    if (!pl->n)
        cli_error("replay: --policies expects a comma-separated list from %s",
                  tr_expert_policy_names());
    return pl->n > 0;
}

/* "A:B", "A:" (to the end) */
static bool parse_tokens(const char *v, long long *from, long long *to) {
    char *end;
    *from = strtoll(v, &end, 10);
    if (end == v || *end != ':' || *from < 0) return false;
    const char *b = end + 1;
    if (!*b) {
        *to = 0;
        return true;
    }
    *to = strtoll(b, &end, 10);
    return *end == 0 && *to > *from;
}

/* ---------------------------------------------------------------------------------------------- */
/* Output                                                                                         */

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static void fmt_budget(char *buf, size_t cap, uint64_t b) {
    double mib = (double)b / MIB;
    if (fabs(mib - round(mib)) < 1e-9)
        snprintf(buf, cap, "%.0f", mib);
    else
        snprintf(buf, cap, "%.1f", mib);
}

typedef struct run_cfg {
    const char *path;
    const uint64_t *budgets;
    size_t nb;
    const policy_list *pol;
    uint64_t seed;
    int prefetch;
    long long from, to;
} run_cfg;

static void print_text(const run_cfg *c, const tr_route_trace_info *in,
                       const tr_replay_result *res) {
    const size_t np = c->pol->n;
    printf("trace   %s\n", c->path);
    printf("model   %s (%s)\n", base_name(in->model), in->arch);
    if (in->expert_bytes_min == in->expert_bytes_max)
        printf("shape   %d layers (%d MoE), %d experts, top-%d, %.2f MiB/expert\n", in->n_layer,
               in->n_moe_layers, in->n_expert, in->n_expert_used,
               (double)in->expert_bytes_max / MIB);
    else
        printf("shape   %d layers (%d MoE), %d experts, top-%d, %.2f-%.2f MiB/expert\n",
               in->n_layer, in->n_moe_layers, in->n_expert, in->n_expert_used,
               (double)in->expert_bytes_min / MIB, (double)in->expert_bytes_max / MIB);
    printf("batches %llu (%llu prefill + %llu decode), %llu decode tokens, %llu decode lookups\n",
           (unsigned long long)(in->batches_prefill + in->batches_decode),
           (unsigned long long)in->batches_prefill, (unsigned long long)in->batches_decode,
           (unsigned long long)in->decode_tokens, (unsigned long long)in->decode_lookups);
    if (c->from || c->to)
        printf("counted decode tokens %lld..%lld (the others warm the cache uncounted)\n", c->from,
               c->to ? c->to - 1 : (long long)in->decode_tokens - 1);
    const uint64_t ws = in->working_set_bytes;
    printf("T       %.0f MiB touched per token cycle (all layers x top-k, worst case)\n",
           (double)ws / MIB);
    const char *below = tr_expert_policy_auto(ws ? ws - 1 : 0, ws);
    const char *above = tr_expert_policy_auto(ws, ws);
    if (!strcmp(below, above))
        printf("cliff   below %.0f MiB plain LRU collapses (~0%% hits); 'auto' runs %s\n",
               (double)ws / MIB, below);
    else
        printf("cliff   below %.0f MiB plain LRU collapses (~0%% hits); 'auto' runs %s below, %s "
               "above\n",
               (double)ws / MIB, below, above);
    printf("\n%-10s", "budget");
    for (size_t j = 0; j < np; j++) printf(" %9s", c->pol->name[j]);
    printf("\n%-10s", "(MiB)");
    for (size_t j = 0; j < np; j++) printf(" %9s", "hit%");
    printf("\n");
    for (size_t i = 0; i < c->nb; i++) {
        char b[32];
        fmt_budget(b, sizeof b, c->budgets[i]);
        if (tr_expert_policy_below_cliff(c->budgets[i], ws)) strcat(b, " <T");
        printf("%-10s", b);
        for (size_t j = 0; j < np; j++) {
            const tr_replay_result *r = &res[i * np + j];
            printf(" %9.1f", pct(r->decode_hits, r->decode_lookups));
        }
        printf("\n");
    }
    if (c->prefetch > 0) {
        printf("\nprefetch %d (co-activation): decode GiB read (prefetched, of them used %%)\n",
               c->prefetch);
        for (size_t i = 0; i < c->nb; i++) {
            char b[32];
            fmt_budget(b, sizeof b, c->budgets[i]);
            printf("%-10s", b);
            for (size_t j = 0; j < np; j++) {
                const tr_replay_result *r = &res[i * np + j];
                printf("  %s %.1f (%.1f, %.0f%%)", c->pol->name[j],
                       (double)r->decode_read_bytes / (MIB * 1024),
                       (double)r->prefetch_bytes / (MIB * 1024),
                       pct(r->prefetch_used, r->prefetch_reads));
            }
            printf("\n");
        }
    }
    printf(
        "\n(decode-only hit%%: one lookup per distinct expert of a layer step; prefill warms the "
        "cache uncounted;\n <T: budget below one token's working set, where LRU collapses)\n");
}

static cJSON *num(double v) { return cJSON_CreateNumber(v); }

static cJSON *build_json(const run_cfg *c, const tr_route_trace_info *in,
                         const tr_replay_result *res) {
    const size_t np = c->pol->n;
    const uint64_t ws = in->working_set_bytes;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "trace", c->path);
    cJSON_AddStringToObject(d, "model", in->model);
    cJSON_AddStringToObject(d, "arch", in->arch);
    cJSON_AddItemToObject(d, "n_layer", num(in->n_layer));
    cJSON_AddItemToObject(d, "n_moe_layers", num(in->n_moe_layers));
    cJSON_AddItemToObject(d, "n_expert", num(in->n_expert));
    cJSON_AddItemToObject(d, "n_expert_used", num(in->n_expert_used));
    cJSON_AddItemToObject(d, "expert_bytes_min", num((double)in->expert_bytes_min));
    cJSON_AddItemToObject(d, "expert_bytes_max", num((double)in->expert_bytes_max));
    cJSON_AddItemToObject(d, "batches_prefill", num((double)in->batches_prefill));
    cJSON_AddItemToObject(d, "batches_decode", num((double)in->batches_decode));
    cJSON_AddItemToObject(d, "decode_tokens", num((double)in->decode_tokens));
    cJSON_AddItemToObject(d, "decode_lookups", num((double)in->decode_lookups));
    cJSON_AddItemToObject(d, "counted_tokens_from", num((double)c->from));
    cJSON_AddItemToObject(d, "counted_tokens_to",
                          num((double)(c->to ? c->to : (long long)in->decode_tokens)));
    cJSON_AddItemToObject(d, "working_set_bytes", num((double)ws));
    cJSON_AddItemToObject(d, "working_set_mib", num((double)ws / MIB));
    cJSON_AddItemToObject(d, "seed", num((double)c->seed));
    cJSON_AddItemToObject(d, "prefetch", num(c->prefetch));
    cJSON *pl = cJSON_AddArrayToObject(d, "policies");
    for (size_t j = 0; j < np; j++) cJSON_AddItemToArray(pl, cJSON_CreateString(c->pol->name[j]));
    cJSON *rows = cJSON_AddArrayToObject(d, "budgets");
    for (size_t i = 0; i < c->nb; i++) {
        const uint64_t b = c->budgets[i];
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToObject(row, "budget_bytes", num((double)b));
        cJSON_AddItemToObject(row, "budget_mib", num((double)b / MIB));
        cJSON_AddBoolToObject(row, "below_cliff", tr_expert_policy_below_cliff(b, ws));
        cJSON_AddStringToObject(row, "auto_policy", tr_expert_policy_auto(b, ws));
        char warn[512];
        if (tr_expert_policy_cliff_warning(warn, sizeof warn, b, ws, "auto"))
            cJSON_AddStringToObject(row, "cliff_warning", warn);
        cJSON *hp = cJSON_AddObjectToObject(row, "decode_hit_pct");
        cJSON *det = cJSON_AddObjectToObject(row, "detail");
        for (size_t j = 0; j < np; j++) {
            const tr_replay_result *r = &res[i * np + j];
            const char *name = c->pol->name[j];
            cJSON_AddItemToObject(hp, name,
                                  num(round(pct(r->decode_hits, r->decode_lookups) * 1000) / 1000));
            cJSON *o = cJSON_AddObjectToObject(det, name);
            cJSON_AddStringToObject(o, "ran", r->ran);
            cJSON_AddItemToObject(o, "decode_hits", num((double)r->decode_hits));
            cJSON_AddItemToObject(o, "decode_lookups", num((double)r->decode_lookups));
            cJSON_AddItemToObject(o, "hits", num((double)r->hits));
            cJSON_AddItemToObject(o, "lookups", num((double)r->lookups));
            cJSON_AddItemToObject(o, "read_bytes", num((double)r->read_bytes));
            cJSON_AddItemToObject(o, "decode_read_bytes", num((double)r->decode_read_bytes));
            cJSON_AddItemToObject(o, "evictions", num((double)r->evictions));
            cJSON_AddItemToObject(o, "batches_over_budget", num((double)r->batches_over_budget));
            cJSON_AddItemToObject(o, "prefetch_reads", num((double)r->prefetch_reads));
            cJSON_AddItemToObject(o, "prefetch_used", num((double)r->prefetch_used));
            cJSON_AddItemToObject(o, "prefetch_bytes", num((double)r->prefetch_bytes));
            cJSON_AddItemToObject(o, "policy_ns_per_lookup",
                                  num(r->lookups ? (double)r->policy_ns / (double)r->lookups : 0));
            if (!strcmp(r->ran, "adaptive")) {
                cJSON *ls = cJSON_AddObjectToObject(o, "lead_steps");
                for (int k = 0; k < TR_EXPERT_N_RULES; k++)
                    cJSON_AddItemToObject(ls, tr_expert_rule_name(k),
                                          num((double)r->lead_steps[k]));
            }
        }
        cJSON_AddItemToArray(rows, row);
    }
    return d;
}

/* ---------------------------------------------------------------------------------------------- */

int cmd_replay(int argc, char **argv) {
    static const struct option opts[] = {
        {"budget", required_argument, NULL, 'b'},
        {"budgets", required_argument, NULL, 'b'},
        {"policies", required_argument, NULL, 'p'},
        {"seed", required_argument, NULL, 's'},
        {"decay", required_argument, NULL, 'd'},
        {"json", no_argument, NULL, 'j'},
        {"prefetch", required_argument, NULL, 'f'},
        {"tokens", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    uint64_t budgets[MAX_BUDGETS];
    size_t nb = 0;
    static policy_list pol;
    pol.n = 0;
    bool json = false;
    long seed = 1;
    double decay = 0;
    long prefetch = 0;
    long long from = 0, to = 0;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            if (!split_budgets(optarg, budgets, &nb))
                return usage_error("--budget expects a comma-separated list of MiB numbers or "
                                   "sizes (512M, 2G), at most 64, got",
                                   optarg);
            break;
        case 'p':
            if (!split_policies(optarg, &pol)) {
                replay_usage(stderr);
                return CLI_EXIT_USAGE;
            }
            break;
        case 's':
            if (!cli_parse_int("--seed", optarg, 0, 0x7fffffffL, &seed)) return CLI_EXIT_USAGE;
            break;
        case 'd': {
            char *end;
            decay = strtod(optarg, &end);
            if (*end || !(decay > 0 && decay <= 1))
                return usage_error("--decay expects a number in (0, 1], got", optarg);
            break;
        }
        case 'f':
            if (!cli_parse_int("--prefetch", optarg, 0, 64, &prefetch)) return CLI_EXIT_USAGE;
            break;
        case 't':
            if (!parse_tokens(optarg, &from, &to))
                return usage_error("--tokens expects A:B (0 <= A < B) or A:, got", optarg);
            break;
        case 'j': json = true; break;
        case 'h': replay_usage(stdout); return 0;
        default: return usage_error("unknown or incomplete option", argv[optind - 1]);
        }
    }
    if (optind + 1 != argc)
        return usage_error(optind < argc ? "expected one trace file" : "no trace file given", NULL);
    const char *path = argv[optind];
    if (!nb)
        for (; nb < sizeof k_default_budgets / sizeof *k_default_budgets; nb++)
            budgets[nb] = (uint64_t)(k_default_budgets[nb] * MIB);
    if (!pol.n)
        for (; pol.n < sizeof k_default_policies / sizeof *k_default_policies; pol.n++)
            strcpy(pol.name[pol.n], k_default_policies[pol.n]);

    tr_error err = {0};
    tr_route_trace *t = NULL;
    if (tr_route_trace_load(path, &t, &err) != TR_OK) {
        cli_error("%s", err.msg);
        return CLI_EXIT_ERROR;
    }
    tr_route_trace_info in;
    tr_route_trace_get_info(t, &in);
    const size_t np = pol.n;
    int rc = 0;
    tr_replay_result *res = calloc(nb * np, sizeof *res);
    if (!res) {
        cli_error("replay: out of memory");
        rc = CLI_EXIT_ERROR;
        goto out;
    }
    if (!in.decode_lookups) {
        cli_error("replay: %s has no decode rows (phase 1): nothing to measure", path);
        rc = CLI_EXIT_ERROR;
        goto out;
    }
    if ((unsigned long long)from >= in.decode_tokens) {
        cli_error("replay: --tokens starts at %lld but %s has %llu decode tokens", from, path,
                  (unsigned long long)in.decode_tokens);
        rc = CLI_EXIT_USAGE;
        goto out;
    }
    for (size_t i = 0; i < nb && !rc; i++) {
        if (budgets[i] < in.expert_bytes_max) {
            char b[32];
            fmt_budget(b, sizeof b, budgets[i]);
            cli_error("replay: budget %s MiB is smaller than one expert (%.2f MiB)", b,
                      (double)in.expert_bytes_max / MIB);
            rc = CLI_EXIT_USAGE;
            break;
        }
        for (size_t j = 0; j < np; j++) {
            const tr_replay_params rp = {.policy = pol.name[j],
                                         .budget_bytes = budgets[i],
                                         .seed = (uint64_t)seed,
                                         .decay = decay,
                                         .prefetch = (int32_t)prefetch,
                                         .count_from = from,
                                         .count_to = to};
            if (tr_replay_run(t, &rp, &res[i * np + j], &err)) {
                cli_error("replay: %s at %llu bytes: %s", pol.name[j],
                          (unsigned long long)budgets[i], err.msg);
                rc = CLI_EXIT_ERROR;
                break;
            }
        }
    }
    if (!rc) {
        const run_cfg cfg = {path, budgets, nb, &pol, (uint64_t)seed, (int)prefetch, from, to};
        if (json) {
            cJSON *d = build_json(&cfg, &in, res);
            char *txt = d ? cJSON_Print(d) : NULL;
            if (!txt) {
                cli_error("replay: out of memory printing JSON");
                rc = CLI_EXIT_ERROR;
            } else {
                puts(txt);
            }
            free(txt);
            cJSON_Delete(d);
        } else {
            print_text(&cfg, &in, res);
        }
        if (fflush(stdout) != 0 || ferror(stdout)) {
            cli_error("replay: writing the results failed");
            rc = CLI_EXIT_ERROR;
        }
    }
out:
    free(res);
    tr_route_trace_free(t);
    return rc;
}
