/*
 * terrace replay TRACE [--budget LIST] [--policies LIST] [--seed N] [--json]
 *
 * Replays a route trace (src/experts/trace.h) through expert-cache policies at several byte
 * budgets and prints the decode-only hit rate of each: Belady's offline optimum (the ceiling),
 * LRU (what a plain cache does), LFU, random (the floor) and terrace's online policies.
 *
 * Replay semantics (they reproduce BigMoeOnEdge's published curve for its trace):
 *   - One batch = one layer's request: a decode batch is one (token, layer); a prefill batch is one
 *     layer over every prompt token of the turn (the whole prompt is evaluated together), token-
 *     major. Batches run turn by turn, prefill first, then decode token by token, layer by layer.
 *   - In a batch each distinct expert is looked up once, in the order of its last appearance; hits
 *     are pinned, misses admitted at the layer's expert size and pinned, so a batch never evicts
 *     its own experts. A prefill batch larger than the budget is admitted over budget and the
 *     cache trimmed back after it (the only overcommit).
 *   - Prefill lookups warm the cache but do not count: the hit rate is decode hits / decode
 *     lookups. Budgets are MiB (2^20 bytes).
 *   - --prefetch N (an experiment, not the live cache's predictor): after each decode batch of
 *     layer l, the N experts of layer l+1 most often seen with this batch's experts (a
 *     co-activation count learned online from earlier tokens only) are admitted ahead of use,
 *     unpinned, at the policy's choice of victims. A lookup that finds a prefetched expert is a
 *     hit; prefetch reads count in the bytes read, and unused ones as wasted. The trace has no
 *     hidden states, so the live predictor (the next layer's router applied to this layer's
 *     input) cannot be replayed; this is the best history-only stand-in we have.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "core/error.h"
#include "experts/policy.h"
#include "experts/trace.h"

#define MIB         1048576.0
#define MAX_BUDGETS 64

static const double k_default_budgets[] = {250,  500,  750,  1000, 1500, 2000,
                                           2500, 3000, 4000, 6000, 8000};
static const tr_policy_kind k_default_policies[] = {TR_POLICY_BELADY, TR_POLICY_LRU,
                                                    TR_POLICY_LFU,    TR_POLICY_RANDOM,
                                                    TR_POLICY_LRFU,   TR_POLICY_LAYERED};

typedef struct batch {
    int32_t layer;
    bool decode;
    size_t u0, nu; /* distinct experts: uniq[u0 .. u0+nu) */
    size_t r0, nr; /* router rows: rexp/rw[r0 .. r0+nr) */
} batch;

typedef struct replay_input {
    const tr_trace_info *info;
    batch *b;
    size_t nb, n_prefill, n_decode, dec_lookups;
    int32_t *uniq;
    int32_t *rexp;
    float *rw;
    tr_policy_key *future;
    size_t n_future;
    uint64_t ws;
    int32_t n_moe;
    uint64_t eb_min, eb_max;
} replay_input;

typedef struct result {
    uint64_t dec_hits, dec_lookups, hits, lookups;
    uint64_t read_bytes, dec_read_bytes, evictions, over_batches;
    uint64_t pf_reads, pf_used, pf_bytes; /* --prefetch: admitted ahead, found by a lookup */
    tr_policy_kind ran;                   /* auto resolved */
} result;

/* ---------------------------------------------------------------------------------------------- */
/* Batches                                                                                        */

typedef struct sort_key {
    int32_t turn, a, b, slot;
    uint8_t phase;
    uint32_t idx;
} sort_key;

static int cmp_key(const void *x, const void *y) {
    const sort_key *p = x, *q = y;
#define CMP(f)                                                                                     \
    if (p->f != q->f) return p->f < q->f ? -1 : 1;
    CMP(turn)
    CMP(phase)
    CMP(a)
    CMP(b) CMP(slot) CMP(idx)
#undef CMP
        return 0;
}

static void input_free(replay_input *in) {
    free(in->b);
    free(in->uniq);
    free(in->rexp);
    free(in->rw);
    free(in->future);
}

static bool build_batches(const tr_trace *t, replay_input *in) {
    size_t n;
    const tr_trace_row *rows = tr_trace_rows(t, &n);
    const tr_trace_info *info = tr_trace_get_info(t);
    memset(in, 0, sizeof *in);
    in->info = info;
    sort_key *k = calloc(n ? n : 1, sizeof *k);
    in->b = calloc(n ? n : 1, sizeof *in->b);
    in->uniq = calloc(n ? n : 1, sizeof *in->uniq);
    in->rexp = calloc(n ? n : 1, sizeof *in->rexp);
    in->rw = calloc(n ? n : 1, sizeof *in->rw);
    in->future = calloc(n ? n : 1, sizeof *in->future);
    uint64_t *seen = calloc((size_t)info->n_expert, sizeof *seen);
    if (!k || !in->b || !in->uniq || !in->rexp || !in->rw || !in->future || !seen) {
        free(k);
        free(seen);
        input_free(in);
        cli_error("replay: out of memory for %zu rows", n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        const tr_trace_row *r = &rows[i];
        bool pre = r->phase == 0;
        k[i] = (sort_key){
            r->turn,    pre ? r->layer : r->step, pre ? r->step : r->layer, r->slot, r->phase,
            (uint32_t)i};
    }
    qsort(k, n, sizeof *k, cmp_key);
    for (size_t i = 0; i < n; i++) {
        const tr_trace_row *r = &rows[k[i].idx];
        in->rexp[i] = r->expert;
        in->rw[i] = r->weight;
    }
    uint64_t stamp = 0;
    for (size_t i = 0; i < n;) {
        const tr_trace_row *r0 = &rows[k[i].idx];
        size_t j = i + 1;
        while (j < n) {
            const tr_trace_row *r = &rows[k[j].idx];
            if (r->turn != r0->turn || r->phase != r0->phase || r->layer != r0->layer ||
                (r0->phase == 1 && r->step != r0->step))
                break;
            j++;
        }
        batch *b = &in->b[in->nb++];
        b->layer = r0->layer;
        b->decode = r0->phase == 1;
        b->r0 = i;
        b->nr = j - i;
        b->u0 = in->n_future;
        /* distinct experts in the order of their last appearance: that is the recency order a
         * cache stamping every appearance would end the batch with */
        stamp++;
        size_t nu = 0;
        for (size_t q = j; q-- > i;) {
            int32_t e = in->rexp[q];
            if (seen[e] == stamp) continue;
            seen[e] = stamp;
            in->uniq[b->u0 + nu++] = e;
        }
        for (size_t q = 0; q < nu / 2; q++) {
            int32_t tmp = in->uniq[b->u0 + q];
            in->uniq[b->u0 + q] = in->uniq[b->u0 + nu - 1 - q];
            in->uniq[b->u0 + nu - 1 - q] = tmp;
        }
        b->nu = nu;
        for (size_t q = 0; q < nu; q++)
            in->future[in->n_future++] = (tr_policy_key){b->layer, in->uniq[b->u0 + q]};
        if (b->decode) {
            in->n_decode++;
            in->dec_lookups += nu;
        } else {
            in->n_prefill++;
        }
        i = j;
    }
    free(k);
    free(seen);
    in->ws = tr_policy_working_set(info->n_layer, info->expert_bytes, info->n_expert_used);
    in->eb_min = UINT64_MAX;
    for (int32_t l = 0; l < info->n_layer; l++) {
        uint64_t eb = info->expert_bytes[l];
        if (!eb) continue;
        in->n_moe++;
        if (eb < in->eb_min) in->eb_min = eb;
        if (eb > in->eb_max) in->eb_max = eb;
    }
    if (!in->n_moe) in->eb_min = 0;
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* One (policy, budget) run                                                                       */

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((s = (x)) != TR_OK) goto done;                                                         \
    } while (0)

/* --prefetch: co-activation counts co[l][e][e'] = decode tokens in which expert e of layer l and
 * e' of layer l+1 were both chosen, learned as the replay goes (never from the future) */
typedef struct coact {
    int32_t n_layer, n_expert, n;
    uint32_t *co;
    float *score;
    uint8_t *pf; /* [n_layer * n_expert]: admitted by prefetch and not looked up since */
    const batch *prev;
} coact;

static void coact_learn(coact *c, const replay_input *in, const batch *b) {
    const batch *a = c->prev;
    c->prev = b;
    if (!a || !a->decode || a->layer + 1 != b->layer) return;
    const int32_t E = c->n_expert;
    for (size_t i = 0; i < a->nu; i++) {
        uint32_t *row = c->co + ((size_t)a->layer * E + in->uniq[a->u0 + i]) * E;
        for (size_t q = 0; q < b->nu; q++) row[in->uniq[b->u0 + q]]++;
    }
}

/* prefetches up to n experts of layer b->layer + 1, the ones with the highest count summed
 * over this batch's experts (ties: lower id); resident ones are skipped without counting */
static tr_status coact_prefetch(coact *c, const replay_input *in, const batch *b, tr_policy *p,
                                result *res, tr_error *err) {
    const int32_t nl = b->layer + 1, E = c->n_expert;
    if (nl >= c->n_layer || !in->info->expert_bytes[nl]) return TR_OK;
    const uint64_t eb = in->info->expert_bytes[nl];
    for (int32_t e = 0; e < E; e++) c->score[e] = 0;
    for (size_t i = 0; i < b->nu; i++) {
        const uint32_t *row = c->co + ((size_t)b->layer * E + in->uniq[b->u0 + i]) * E;
        for (int32_t e = 0; e < E; e++) c->score[e] += (float)row[e];
    }
    for (int32_t k = 0; k < c->n; k++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++)
            if (c->score[e] > 0 && (best < 0 || c->score[e] > c->score[best])) best = e;
        if (best < 0) break;
        c->score[best] = 0;
        if (tr_policy_resident_bytes(p, nl, best)) continue;
        tr_status s = tr_policy_admit(p, nl, best, eb, 0, err);
        if (s == TR_E_BUDGET) return TR_OK; /* everything else pinned: no room to read ahead */
        if (s) return s;
        c->pf[(size_t)nl * E + best] = 1;
        res->pf_reads++;
        res->pf_bytes += eb;
        res->read_bytes += eb;
        res->dec_read_bytes += eb;
    }
    return TR_OK;
}

static tr_status run_one(const replay_input *in, tr_policy_kind kind, uint64_t budget,
                         uint64_t seed, double decay, int32_t prefetch, bool *miss, result *res,
                         tr_error *err) {
    const tr_trace_info *info = in->info;
    const int32_t E = info->n_expert;
    coact ca = {.n_layer = info->n_layer, .n_expert = E, .n = prefetch};
    if (prefetch > 0) {
        ca.co = calloc((size_t)info->n_layer * E * E, sizeof *ca.co);
        ca.score = calloc((size_t)E, sizeof *ca.score);
        ca.pf = calloc((size_t)info->n_layer * E, 1);
        if (!ca.co || !ca.score || !ca.pf) {
            free(ca.co);
            free(ca.score);
            free(ca.pf);
            return tr_fail(err, TR_E_NOMEM, "out of memory for the co-activation counts");
        }
    }
    tr_policy_params pp = {
        .kind = kind,
        .n_layer = info->n_layer,
        .n_expert = info->n_expert,
        .n_expert_used = info->n_expert_used,
        .budget_bytes = budget,
        .expert_bytes = info->expert_bytes,
        .seed = seed,
        .decay = decay,
        .future = in->future,
        .n_future = in->n_future,
    };
    tr_policy *p = NULL;
    memset(res, 0, sizeof *res);
    tr_status s = tr_policy_create(&pp, &p, err);
    if (s) return s;
    res->ran = tr_policy_kind_of(p);
    for (size_t bi = 0; bi < in->nb; bi++) {
        const batch *b = &in->b[bi];
        const int32_t *u = in->uniq + b->u0;
        const uint64_t eb = info->expert_bytes[b->layer];
        tr_policy_route_info ri = {in->rexp + b->r0, in->rw + b->r0, (int32_t)b->nr, NULL};
        TRY(tr_policy_route(p, b->layer, &ri, err));
        for (size_t q = 0; q < b->nu; q++) {
            bool hit;
            TRY(tr_policy_lookup(p, b->layer, u[q], &hit, err));
            miss[q] = !hit;
            if (ca.pf && ca.pf[(size_t)b->layer * E + u[q]]) {
                ca.pf[(size_t)b->layer * E + u[q]] = 0;
                res->pf_used += hit;
            }
            if (hit) TRY(tr_policy_pin(p, b->layer, u[q], err));
            res->lookups++;
            res->hits += hit;
            if (b->decode) {
                res->dec_lookups++;
                res->dec_hits += hit;
            }
        }
        for (size_t q = 0; q < b->nu; q++) {
            if (!miss[q]) continue;
            TRY(tr_policy_admit(p, b->layer, u[q], eb, TR_POLICY_OVERCOMMIT, err));
            TRY(tr_policy_pin(p, b->layer, u[q], err));
            res->read_bytes += eb;
            if (b->decode) res->dec_read_bytes += eb;
        }
        for (size_t q = 0; q < b->nu; q++) TRY(tr_policy_unpin(p, b->layer, u[q], err));
        if (ca.co && b->decode) {
            coact_learn(&ca, in, b);
            TRY(coact_prefetch(&ca, in, b, p, res, err));
        }
        tr_policy_stats st;
        tr_policy_get_stats(p, &st);
        if (st.used_bytes > st.budget_bytes) {
            res->over_batches++;
            TRY(tr_policy_trim(p, err));
        }
    }
    tr_policy_stats st;
    tr_policy_get_stats(p, &st);
    res->evictions = st.evictions;
done:
    free(ca.co);
    free(ca.score);
    free(ca.pf);
    tr_policy_free(p);
    return s;
}

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
            "usage: terrace replay TRACE [--budget LIST] [--policies LIST] [--seed N] [--json]\n\n"
            "Replays a route trace (--route-trace CSV) through expert-cache policies and prints\n"
            "the decode-only hit %% for each budget.\n\n"
            "  --budget LIST    comma-separated budgets: MiB numbers or sizes (512M, 2G, 1.5GiB);\n"
            "                   default 250,500,750,1000,1500,2000,2500,3000,4000,6000,8000\n"
            "  --policies LIST  comma-separated, from %s\n"
            "                   (default: belady,lru,lfu,random,lrfu,layered)\n"
            "  --seed N         seed of the random policy (default 1)\n"
            "  --decay X        lrfu/layered: decay per layer visit, in (0,1] (default 0.9/0.95)\n"
            "  --prefetch N     also read N experts of the next layer ahead, predicted from\n"
            "                   co-activation counts learned online (an experiment; default 0)\n"
            "  --json           print the results as one JSON document\n"
            "  -h, --help       this text\n",
            tr_policy_names());
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

static bool split_policies(const char *list, tr_policy_kind *k, size_t *n) {
    char buf[512];
    if (strlen(list) >= sizeof buf) return false;
    strcpy(buf, list);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        tr_error err = {0};
        if (*n == TR_POLICY_COUNT || tr_policy_parse(tok, &k[*n], &err) != TR_OK) {
            cli_error("replay: %s", err.msg[0] ? err.msg : "too many policies");
            return false;
        }
        (*n)++;
    }
    if (!*n)
        cli_error("replay: --policies expects a comma-separated list from %s", tr_policy_names());
    return *n > 0;
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

static void print_text(const char *path, const replay_input *in, const uint64_t *budgets, size_t nb,
                       const tr_policy_kind *pol, size_t np, const result *res, int prefetch) {
    const tr_trace_info *info = in->info;
    printf("trace   %s\n", path);
    printf("model   %s (%s)\n", base_name(info->model), info->arch);
    if (in->eb_min == in->eb_max)
        printf("shape   %d layers (%d MoE), %d experts, top-%d, %.2f MiB/expert\n", info->n_layer,
               in->n_moe, info->n_expert, info->n_expert_used, (double)in->eb_max / MIB);
    else
        printf("shape   %d layers (%d MoE), %d experts, top-%d, %.2f-%.2f MiB/expert\n",
               info->n_layer, in->n_moe, info->n_expert, info->n_expert_used,
               (double)in->eb_min / MIB, (double)in->eb_max / MIB);
    printf("batches %zu (%zu prefill + %zu decode), %zu decode lookups\n", in->nb, in->n_prefill,
           in->n_decode, in->dec_lookups);
    printf("T       %.0f MiB touched per token cycle (all layers x top-k, worst case)\n",
           (double)in->ws / MIB);
    tr_policy_kind below = tr_policy_auto(in->ws ? in->ws - 1 : 0, in->ws);
    tr_policy_kind above = tr_policy_auto(in->ws, in->ws);
    if (below == above)
        printf("cliff   below %.0f MiB plain LRU collapses (~0%% hits); 'auto' runs %s\n",
               (double)in->ws / MIB, tr_policy_name(below));
    else
        printf("cliff   below %.0f MiB plain LRU collapses (~0%% hits); 'auto' runs %s below, %s "
               "above\n",
               (double)in->ws / MIB, tr_policy_name(below), tr_policy_name(above));
    printf("\n%-10s", "budget");
    for (size_t j = 0; j < np; j++) printf(" %9s", tr_policy_name(pol[j]));
    printf("\n%-10s", "(MiB)");
    for (size_t j = 0; j < np; j++) printf(" %9s", "hit%");
    printf("\n");
    for (size_t i = 0; i < nb; i++) {
        char b[32];
        fmt_budget(b, sizeof b, budgets[i]);
        if (tr_policy_lru_collapses(budgets[i], in->ws)) strcat(b, " <T");
        printf("%-10s", b);
        for (size_t j = 0; j < np; j++) {
            const result *r = &res[i * np + j];
            printf(" %9.1f", pct(r->dec_hits, r->dec_lookups));
        }
        printf("\n");
    }
    if (prefetch > 0) {
        printf("\nprefetch %d (co-activation): decode GiB read (prefetched, of them used %%)\n",
               prefetch);
        for (size_t i = 0; i < nb; i++) {
            char b[32];
            fmt_budget(b, sizeof b, budgets[i]);
            printf("%-10s", b);
            for (size_t j = 0; j < np; j++) {
                const result *r = &res[i * np + j];
                printf("  %s %.1f (%.1f, %.0f%%)", tr_policy_name(pol[j]),
                       (double)r->dec_read_bytes / (MIB * 1024), (double)r->pf_bytes / (MIB * 1024),
                       pct(r->pf_used, r->pf_reads));
            }
            printf("\n");
        }
    }
    printf(
        "\n(decode-only hit%%: one lookup per distinct expert of a layer step; prefill warms the "
        "cache uncounted;\n <T: budget below one token's working set, where LRU collapses)\n");
}

static cJSON *num(double v) { return cJSON_CreateNumber(v); }

static cJSON *build_json(const char *path, const replay_input *in, const uint64_t *budgets,
                         size_t nb, const tr_policy_kind *pol, size_t np, const result *res,
                         uint64_t seed, int prefetch) {
    const tr_trace_info *info = in->info;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "trace", path);
    cJSON_AddStringToObject(d, "model", info->model);
    cJSON_AddStringToObject(d, "arch", info->arch);
    cJSON_AddItemToObject(d, "n_layer", num(info->n_layer));
    cJSON_AddItemToObject(d, "n_moe_layers", num(in->n_moe));
    cJSON_AddItemToObject(d, "n_expert", num(info->n_expert));
    cJSON_AddItemToObject(d, "n_expert_used", num(info->n_expert_used));
    cJSON_AddItemToObject(d, "expert_bytes_min", num((double)in->eb_min));
    cJSON_AddItemToObject(d, "expert_bytes_max", num((double)in->eb_max));
    cJSON_AddItemToObject(d, "batches_prefill", num((double)in->n_prefill));
    cJSON_AddItemToObject(d, "batches_decode", num((double)in->n_decode));
    cJSON_AddItemToObject(d, "decode_lookups", num((double)in->dec_lookups));
    cJSON_AddItemToObject(d, "working_set_bytes", num((double)in->ws));
    cJSON_AddItemToObject(d, "working_set_mib", num((double)in->ws / MIB));
    cJSON_AddItemToObject(d, "seed", num((double)seed));
    cJSON_AddItemToObject(d, "prefetch", num(prefetch));
    cJSON *pl = cJSON_AddArrayToObject(d, "policies");
    for (size_t j = 0; j < np; j++)
        cJSON_AddItemToArray(pl, cJSON_CreateString(tr_policy_name(pol[j])));
    cJSON *rows = cJSON_AddArrayToObject(d, "budgets");
    for (size_t i = 0; i < nb; i++) {
        cJSON *row = cJSON_CreateObject();
        cJSON_AddItemToObject(row, "budget_bytes", num((double)budgets[i]));
        cJSON_AddItemToObject(row, "budget_mib", num((double)budgets[i] / MIB));
        cJSON_AddBoolToObject(row, "below_cliff", tr_policy_lru_collapses(budgets[i], in->ws));
        cJSON_AddStringToObject(row, "auto_policy",
                                tr_policy_name(tr_policy_auto(budgets[i], in->ws)));
        char warn[512];
        if (tr_policy_cliff_warning(warn, sizeof warn, budgets[i], in->ws,
                                    tr_policy_auto(budgets[i], in->ws)))
            cJSON_AddStringToObject(row, "cliff_warning", warn);
        cJSON *hp = cJSON_AddObjectToObject(row, "decode_hit_pct");
        cJSON *det = cJSON_AddObjectToObject(row, "detail");
        for (size_t j = 0; j < np; j++) {
            const result *r = &res[i * np + j];
            const char *name = tr_policy_name(pol[j]);
            cJSON_AddItemToObject(hp, name,
                                  num(round(pct(r->dec_hits, r->dec_lookups) * 1000) / 1000));
            cJSON *o = cJSON_AddObjectToObject(det, name);
            cJSON_AddStringToObject(o, "ran", tr_policy_name(r->ran));
            cJSON_AddItemToObject(o, "decode_hits", num((double)r->dec_hits));
            cJSON_AddItemToObject(o, "decode_lookups", num((double)r->dec_lookups));
            cJSON_AddItemToObject(o, "hits", num((double)r->hits));
            cJSON_AddItemToObject(o, "lookups", num((double)r->lookups));
            cJSON_AddItemToObject(o, "read_bytes", num((double)r->read_bytes));
            cJSON_AddItemToObject(o, "decode_read_bytes", num((double)r->dec_read_bytes));
            cJSON_AddItemToObject(o, "evictions", num((double)r->evictions));
            cJSON_AddItemToObject(o, "batches_over_budget", num((double)r->over_batches));
            cJSON_AddItemToObject(o, "prefetch_reads", num((double)r->pf_reads));
            cJSON_AddItemToObject(o, "prefetch_used", num((double)r->pf_used));
            cJSON_AddItemToObject(o, "prefetch_bytes", num((double)r->pf_bytes));
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    uint64_t budgets[MAX_BUDGETS];
    size_t nb = 0, np = 0;
    tr_policy_kind pol[TR_POLICY_COUNT];
    bool json = false;
    long seed = 1;
    double decay = 0;
    long prefetch = 0;
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
            if (!split_policies(optarg, pol, &np)) {
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
    if (!np)
        for (; np < sizeof k_default_policies / sizeof *k_default_policies; np++)
            pol[np] = k_default_policies[np];

    tr_error err = {0};
    tr_trace *t = NULL;
    if (tr_trace_read(path, &t, &err) != TR_OK) {
        cli_error("%s", err.msg);
        return CLI_EXIT_ERROR;
    }
    replay_input in;
    if (!build_batches(t, &in)) {
        tr_trace_free(t);
        return CLI_EXIT_ERROR;
    }
    int rc = 0;
    result *res = calloc(nb * np, sizeof *res);
    bool *miss = calloc((size_t)in.info->n_expert, sizeof *miss);
    if (!res || !miss) {
        cli_error("replay: out of memory");
        rc = CLI_EXIT_ERROR;
        goto out;
    }
    if (!in.dec_lookups) {
        cli_error("replay: %s has no decode rows (phase 1): nothing to measure", path);
        rc = CLI_EXIT_ERROR;
        goto out;
    }
    for (size_t i = 0; i < nb && !rc; i++) {
        if (budgets[i] < in.eb_max) {
            char b[32];
            fmt_budget(b, sizeof b, budgets[i]);
            cli_error("replay: budget %s MiB is smaller than one expert (%.2f MiB)", b,
                      (double)in.eb_max / MIB);
            rc = CLI_EXIT_USAGE;
            break;
        }
        for (size_t j = 0; j < np; j++) {
            if (run_one(&in, pol[j], budgets[i], (uint64_t)seed, decay, (int32_t)prefetch, miss,
                        &res[i * np + j], &err)) {
                cli_error("replay: %s at %llu bytes: %s", tr_policy_name(pol[j]),
                          (unsigned long long)budgets[i], err.msg);
                rc = CLI_EXIT_ERROR;
                break;
            }
        }
    }
    if (!rc) {
        if (json) {
            cJSON *d =
                build_json(path, &in, budgets, nb, pol, np, res, (uint64_t)seed, (int)prefetch);
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
            print_text(path, &in, budgets, nb, pol, np, res, (int)prefetch);
        }
        if (fflush(stdout) != 0 || ferror(stdout)) {
            cli_error("replay: writing the results failed");
            rc = CLI_EXIT_ERROR;
        }
    }
out:
    free(res);
    free(miss);
    input_free(&in);
    tr_trace_free(t);
    return rc;
}
