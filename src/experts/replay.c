/*
 * Replay of route traces through expert-cache policies (include/terrace_replay.h): the public
 * door to the policy module and the trace reader for `terrace replay` and for anyone who wants
 * to judge a policy on recorded routing.
 *
 * A loaded trace is turned once into batches (one layer's request each, see the header) with
 * their distinct experts and router rows; every run then drives a fresh tr_policy over them.
 */
#include "terrace_replay.h"

#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/error.h"
#include "experts/policy.h"
#include "experts/trace.h"

/* ---------------------------------------------------------------------------------------------- */
/* Names                                                                                          */

const char *tr_expert_policy_names(void) { return tr_policy_names(); }

tr_status tr_expert_policy_check(const char *name, tr_error *err) {
    tr_policy_kind k;
    return tr_policy_parse(name, &k, err);
}

const char *tr_expert_policy_auto(uint64_t budget_bytes, uint64_t working_set) {
    return tr_policy_name(tr_policy_auto(budget_bytes, working_set));
}

bool tr_expert_policy_below_cliff(uint64_t budget_bytes, uint64_t working_set) {
    return tr_policy_lru_collapses(budget_bytes, working_set);
}

bool tr_expert_policy_cliff_warning(char *buf, size_t cap, uint64_t budget_bytes,
                                    uint64_t working_set, const char *policy) {
    tr_policy_kind k = TR_POLICY_AUTO;
    if (tr_policy_parse(policy ? policy : "auto", &k, NULL) || k == TR_POLICY_AUTO)
        k = tr_policy_auto(budget_bytes, working_set);
    return tr_policy_cliff_warning(buf, cap, budget_bytes, working_set, k);
}

_Static_assert(TR_EXPERT_N_RULES == TR_POLICY_N_RULES, "rules");
const char *tr_expert_rule_name(int rule) { return tr_policy_rule_name(rule); }

/* ---------------------------------------------------------------------------------------------- */
/* Batches                                                                                        */

typedef struct batch {
    int32_t layer;
    bool decode;
    int64_t tok;   /* decode token index (0-based, trace order); -1 for prefill */
    size_t u0, nu; /* distinct experts: uniq[u0 .. u0+nu) */
    size_t r0, nr; /* router rows: rexp/rw[r0 .. r0+nr) */
} batch;

struct tr_route_trace {
    tr_trace *t;
    const tr_trace_info *info;
    batch *b;
    size_t nb, n_prefill, n_decode, dec_lookups;
    int64_t n_dec_tok;
    int32_t *uniq;
    int32_t *rexp;
    float *rw;
    tr_policy_key *future;
    size_t n_future;
    uint64_t ws;
    int32_t n_moe;
    uint64_t eb_min, eb_max;
};

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
    CMP(b)
    CMP(slot)
    CMP(idx)
#undef CMP
    return 0;
}

void tr_route_trace_free(tr_route_trace *in) {
    if (!in) return;
    free(in->b);
    free(in->uniq);
    free(in->rexp);
    free(in->rw);
    free(in->future);
    tr_trace_free(in->t);
    free(in);
}

static tr_status build_batches(tr_route_trace *in, tr_error *err) {
    size_t n;
    const tr_trace_row *rows = tr_trace_rows(in->t, &n);
    const tr_trace_info *info = in->info;
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
        return tr_fail(err, TR_E_NOMEM, "replay: out of memory for %zu rows", n);
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
    int32_t last_turn = -1, last_step = -1;
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
        b->tok = -1;
        if (b->decode) {
            if (r0->turn != last_turn || r0->step != last_step) in->n_dec_tok++;
            last_turn = r0->turn;
            last_step = r0->step;
            b->tok = in->n_dec_tok - 1;
        }
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
    return TR_OK;
}

tr_status tr_route_trace_load(const char *path, tr_route_trace **out, tr_error *err) {
    *out = NULL;
    tr_route_trace *in = calloc(1, sizeof *in);
    if (!in) return tr_fail(err, TR_E_NOMEM, "replay: out of memory");
    tr_status s = tr_trace_read(path, &in->t, err);
    if (!s) {
        in->info = tr_trace_get_info(in->t);
        s = build_batches(in, err);
    }
    if (s) {
        tr_route_trace_free(in);
        return s;
    }
    *out = in;
    return TR_OK;
}

void tr_route_trace_get_info(const tr_route_trace *in, tr_route_trace_info *out) {
    const tr_trace_info *info = in->info;
    *out = (tr_route_trace_info){
        .model = info->model,
        .arch = info->arch,
        .n_layer = info->n_layer,
        .n_moe_layers = in->n_moe,
        .n_expert = info->n_expert,
        .n_expert_used = info->n_expert_used,
        .expert_bytes_min = in->eb_min,
        .expert_bytes_max = in->eb_max,
        .batches_prefill = in->n_prefill,
        .batches_decode = in->n_decode,
        .decode_tokens = (uint64_t)in->n_dec_tok,
        .decode_lookups = in->dec_lookups,
        .working_set_bytes = in->ws,
    };
}

/* ---------------------------------------------------------------------------------------------- */
/* One (policy, budget) run                                                                       */

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((s = (x)) != TR_OK) goto done;                                                         \
    } while (0)

/* prefetch: co-activation counts co[l][e][e'] = decode tokens in which expert e of layer l and
 * e' of layer l+1 were both chosen, learned as the replay goes (never from the future) */
typedef struct coact {
    int32_t n_layer, n_expert, n;
    uint32_t *co;
    float *score;
    uint8_t *pf; /* [n_layer * n_expert]: admitted by prefetch and not looked up since */
    const batch *prev;
} coact;

static void coact_learn(coact *c, const tr_route_trace *in, const batch *b) {
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
static tr_status coact_prefetch(coact *c, const tr_route_trace *in, const batch *b, tr_policy *p,
                                tr_replay_result *res, tr_error *err) {
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
        res->prefetch_reads++;
        res->prefetch_bytes += eb;
        res->read_bytes += eb;
        res->decode_read_bytes += eb;
    }
    return TR_OK;
}

tr_status tr_replay_run(const tr_route_trace *in, const tr_replay_params *rp,
                        tr_replay_result *res, tr_error *err) {
    memset(res, 0, sizeof *res);
    const tr_trace_info *info = in->info;
    const int32_t E = info->n_expert;
    tr_policy_kind kind = TR_POLICY_AUTO;
    tr_status s = tr_policy_parse(rp->policy ? rp->policy : "auto", &kind, err);
    if (s) return s;
    if (rp->budget_bytes < in->eb_max)
        return tr_fail(err, TR_E_BUDGET,
                       "replay: budget %llu bytes is smaller than one expert (%llu bytes)",
                       (unsigned long long)rp->budget_bytes, (unsigned long long)in->eb_max);
    if (rp->decay != 0 && !(rp->decay > 0 && rp->decay <= 1))
        return tr_fail(err, TR_E_ARG, "replay: decay %g is not in (0, 1]", rp->decay);
    if (rp->prefetch < 0 || rp->prefetch > E)
        return tr_fail(err, TR_E_ARG, "replay: prefetch %d is outside 0..%d", rp->prefetch, E);
    const int64_t from = rp->count_from > 0 ? rp->count_from : 0;
    const int64_t to = rp->count_to > 0 ? rp->count_to : INT64_MAX;
    bool *miss = calloc((size_t)E, sizeof *miss);
    coact ca = {.n_layer = info->n_layer, .n_expert = E, .n = rp->prefetch};
    if (!miss) return tr_fail(err, TR_E_NOMEM, "replay: out of memory");
    if (rp->prefetch > 0) {
        ca.co = calloc((size_t)info->n_layer * E * E, sizeof *ca.co);
        ca.score = calloc((size_t)E, sizeof *ca.score);
        ca.pf = calloc((size_t)info->n_layer * E, 1);
        if (!ca.co || !ca.score || !ca.pf) {
            free(ca.co);
            free(ca.score);
            free(ca.pf);
            free(miss);
            return tr_fail(err, TR_E_NOMEM, "replay: out of memory for the co-activation counts");
        }
    }
    tr_policy_params pp = {
        .kind = kind,
        .n_layer = info->n_layer,
        .n_expert = info->n_expert,
        .n_expert_used = info->n_expert_used,
        .budget_bytes = rp->budget_bytes,
        .expert_bytes = info->expert_bytes,
        .seed = rp->seed,
        .decay = rp->decay,
        .future = in->future,
        .n_future = in->n_future,
    };
    tr_policy *p = NULL;
    TRY(tr_policy_create(&pp, &p, err));
    res->ran = tr_policy_name(tr_policy_kind_of(p));
    uint64_t t_pol = 0;
    for (size_t bi = 0; bi < in->nb; bi++) {
        const batch *b = &in->b[bi];
        const int32_t *u = in->uniq + b->u0;
        const uint64_t eb = info->expert_bytes[b->layer];
        const bool counted = b->decode && b->tok >= from && b->tok < to;
        tr_policy_route_info ri = {in->rexp + b->r0, in->rw + b->r0, (int32_t)b->nr, NULL};
        const uint64_t t0 = tr_now_ns();
        TRY(tr_policy_route(p, b->layer, &ri, err));
        for (size_t q = 0; q < b->nu; q++) {
            bool hit;
            TRY(tr_policy_lookup(p, b->layer, u[q], &hit, err));
            miss[q] = !hit;
            if (ca.pf && ca.pf[(size_t)b->layer * E + u[q]]) {
                ca.pf[(size_t)b->layer * E + u[q]] = 0;
                res->prefetch_used += hit;
            }
            if (hit) TRY(tr_policy_pin(p, b->layer, u[q], err));
            res->lookups++;
            res->hits += hit;
            if (counted) {
                res->decode_lookups++;
                res->decode_hits += hit;
            }
        }
        for (size_t q = 0; q < b->nu; q++) {
            if (!miss[q]) continue;
            TRY(tr_policy_admit(p, b->layer, u[q], eb, TR_POLICY_OVERCOMMIT, err));
            TRY(tr_policy_pin(p, b->layer, u[q], err));
            res->read_bytes += eb;
            if (b->decode) res->decode_read_bytes += eb;
        }
        for (size_t q = 0; q < b->nu; q++) TRY(tr_policy_unpin(p, b->layer, u[q], err));
        t_pol += tr_now_ns() - t0;
        if (ca.co && b->decode) {
            coact_learn(&ca, in, b);
            TRY(coact_prefetch(&ca, in, b, p, res, err));
        }
        tr_policy_stats st;
        tr_policy_get_stats(p, &st);
        if (st.used_bytes > st.budget_bytes) {
            res->batches_over_budget++;
            TRY(tr_policy_trim(p, err));
        }
    }
    tr_policy_stats st;
    tr_policy_get_stats(p, &st);
    res->evictions = st.evictions;
    memcpy(res->lead_steps, st.lead_steps, sizeof res->lead_steps);
    res->policy_ns = t_pol;
done:
    free(ca.co);
    free(ca.score);
    free(ca.pf);
    free(miss);
    tr_policy_free(p);
    return s;
}
