/*
 * terrace — replaying recorded MoE routing through expert-cache policies.
 *
 * A route trace (written by `terrace run --route-trace FILE`, or by BigMoeOnEdge, in the same
 * CSV format) records which experts every layer's router chose, token by token. Replaying it
 * through a policy at a byte budget tells, without running the model, what hit rate the expert
 * cache would get: Belady's offline optimum (the ceiling), LRU, LFU, random and terrace's online
 * policies (`terrace replay` prints them side by side).
 *
 * Replay semantics (they reproduce BigMoeOnEdge's published curve for its trace):
 *   - One batch = one layer's request: a decode batch is one (token, layer); a prefill batch is one
 *     layer over every prompt token of the turn, token-major. Batches run turn by turn, prefill
 *     first, then decode token by token, layer by layer.
 *   - In a batch each distinct expert is looked up once, in the order of its last appearance; hits
 *     are pinned, misses admitted at the layer's expert size and pinned, so a batch never evicts
 *     its own experts. A prefill batch larger than the budget is admitted over budget and the
 *     cache trimmed back after it (the only overcommit).
 *   - Prefill lookups warm the cache but do not count: the hit rate is decode hits / decode
 *     lookups, over the decode tokens the parameters select (all by default).
 *
 * Same conventions as terrace.h: opaque handles, status + message, nothing printed.
 */
#ifndef TERRACE_REPLAY_H
#define TERRACE_REPLAY_H

#include "terrace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Expert-cache policy names                                                                      */

/* the names a policy may be given, comma separated ("auto,lru,lfu,random,belady,...") */
TR_API const char *tr_expert_policy_names(void);
/* TR_OK when `name` is one of them; else TR_E_ARG with a message listing them */
TR_API tr_status tr_expert_policy_check(const char *name, tr_error *err);
/* what "auto" runs at this budget for a model whose token working set is `working_set` bytes */
TR_API const char *tr_expert_policy_auto(uint64_t budget_bytes, uint64_t working_set);
/* true when plain LRU collapses to ~0% hits there (budget below one token's working set) */
TR_API bool tr_expert_policy_below_cliff(uint64_t budget_bytes, uint64_t working_set);
/* below the cliff: a one-line warning with the numbers, naming the policy that runs; returns
 * false (and writes "") above it */
TR_API bool tr_expert_policy_cliff_warning(char *buf, size_t cap, uint64_t budget_bytes,
                                    uint64_t working_set, const char *policy);
/* the rules the adaptive policy chooses between, for its statistics */
#define TR_EXPERT_N_RULES 4
TR_API const char *tr_expert_rule_name(int rule); /* "knn", "layered", "lfu", "lru" */

/* ---------------------------------------------------------------------------------------------- */
/* Traces                                                                                         */

typedef struct tr_route_trace tr_route_trace;

/* Reads, validates and prepares a trace for replay. Errors name the file and line (TR_E_IO,
 * TR_E_FORMAT, TR_E_UNSUPPORTED for another format version). */
TR_API tr_status tr_route_trace_load(const char *path, tr_route_trace **out, tr_error *err);
TR_API void tr_route_trace_free(tr_route_trace *t);

typedef struct tr_route_trace_info {
    const char *model, *arch; /* valid while the trace lives */
    int32_t n_layer, n_moe_layers, n_expert, n_expert_used;
    uint64_t expert_bytes_min, expert_bytes_max;
    uint64_t batches_prefill, batches_decode;
    uint64_t decode_tokens;     /* distinct (turn, step) decode positions */
    uint64_t decode_lookups;    /* over every decode token */
    uint64_t working_set_bytes; /* one token's experts: every MoE layer x top-k x expert bytes */
} tr_route_trace_info;

TR_API void tr_route_trace_get_info(const tr_route_trace *t, tr_route_trace_info *out);

/* ---------------------------------------------------------------------------------------------- */
/* One replay                                                                                     */

typedef struct tr_replay_params {
    const char *policy;    /* a name from tr_expert_policy_names(); NULL: "auto" */
    uint64_t budget_bytes; /* at least one expert of the largest layer */
    uint64_t seed;         /* random; 0: a fixed default */
    double decay;          /* lrfu/layered/knn/adaptive: per layer visit, (0,1]; 0: the default */
    /* read N experts of the next layer ahead, predicted from co-activation counts learned online
     * (an experiment: prefetch reads count in the bytes); 0: off */
    int32_t prefetch;
    /* count decode hits only for the decode tokens [count_from, count_to) in trace order (0-based
     * over the decode tokens; count_to <= 0: to the end). Every batch is replayed either way, so a
     * test split is judged with the cache the earlier tokens left. */
    int64_t count_from, count_to;
} tr_replay_params;

typedef struct tr_replay_result {
    const char *ran; /* the policy in effect ("auto" resolved); static storage */
    uint64_t decode_hits, decode_lookups; /* the counted decode tokens */
    uint64_t hits, lookups;               /* every lookup, prefill included */
    uint64_t read_bytes, decode_read_bytes, evictions, batches_over_budget;
    uint64_t prefetch_reads, prefetch_used, prefetch_bytes;
    uint64_t lead_steps[TR_EXPERT_N_RULES]; /* adaptive: decode layer steps each rule led */
    uint64_t policy_ns;                     /* time spent in the policy's calls */
} tr_replay_result;

TR_API tr_status tr_replay_run(const tr_route_trace *t, const tr_replay_params *params,
                        tr_replay_result *out, tr_error *err);

#ifdef __cplusplus
}
#endif
#endif
