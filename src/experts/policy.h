/*
 * Expert-cache replacement policies: a byte-budgeted set of resident items keyed by
 * (layer, expert), each with its own byte size, and the policy that picks eviction victims.
 * The same object drives `terrace replay` (over a recorded route trace) and the live expert cache
 * (src/experts/cache.h), so a policy measured offline is the one that runs.
 *
 * This module holds no expert memory: it only decides. The caller owns the bytes, frees or reuses
 * the memory of each victim an admit reports, and loads the admitted expert.
 *
 * Call sequence for one layer step (one MoE layer of one token, or of a prefill batch):
 *
 *     tr_policy_route(p, layer, &info)            router output of this layer (may be NULL)
 *     for each distinct selected expert e:
 *         tr_policy_lookup(p, layer, e, &hit)    hit: resident; updates the policy's state
 *         hit ? tr_policy_pin(p, layer, e)
 *             : tr_policy_admit(p, layer, e, bytes, 0) -> victims -> load e; tr_policy_pin(...)
 *     ... compute the layer ...
 *     tr_policy_unpin(...) for each
 *
 * Pinned items are never chosen as victims, so what the current layer uses stays put. When the
 * unpinned items cannot make room, admit fails with TR_E_BUDGET and changes nothing.
 *
 * Memory: every table is sized at creation from (n_layer, n_expert, budget, future length); no
 * call after tr_policy_create allocates. Cost: lookup, admit (per victim), pin, unpin and remove
 * are O(log n_expert + log n_layer); route is O(n) in the experts it is given.
 *
 * Threads: none inside, and no locking. The caller serialises every call on one tr_policy (the
 * expert cache does it under its lock); distinct tr_policy objects are independent.
 */
#ifndef TR_EXPERTS_POLICY_H
#define TR_EXPERTS_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "terrace.h"

typedef enum tr_policy_kind {
    TR_POLICY_AUTO = 0, /* resolved at creation by tr_policy_auto() from budget and working set */
    TR_POLICY_LRU,      /* least recently used */
    TR_POLICY_LFU,      /* least frequently used, no aging; counts survive eviction; ties: LRU */
    TR_POLICY_RANDOM,   /* uniform among evictable items, seeded (the "no information" floor) */
    TR_POLICY_BELADY,   /* offline optimum: evicts the item used farthest in the future */
    TR_POLICY_LRFU,     /* recency+frequency: router-weighted counts decaying per layer visit */
    TR_POLICY_LAYERED,  /* LRFU scores; a layer over its fair byte share evicts its own first */
    TR_POLICY_KNN,      /* least likely at its layer's next visit, by similar past routing */
    TR_POLICY_ADAPTIVE, /* set dueling: follows whichever of knn/layered/lfu/lru does best */
    TR_POLICY_COUNT
} tr_policy_kind;

/* "lru", "lfu", ...; "?" for out-of-range values */
const char *tr_policy_name(tr_policy_kind k);
/* the names a user may type, comma separated ("auto,lru,lfu,...,knn,adaptive") */
const char *tr_policy_names(void);
tr_status tr_policy_parse(const char *name, tr_policy_kind *out, tr_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* The LRU cliff                                                                                  */

/* One token's working set: sum over layers of n_expert_used * expert_bytes[l] (0 for a layer
 * without routed experts). A decode token touches this many expert bytes at most. */
uint64_t tr_policy_working_set(int32_t n_layer, const uint64_t *expert_bytes,
                               int32_t n_expert_used);

/* True when plain LRU collapses to ~0% hits: the layer cycle visits every layer before coming
 * back, so with room for less than one token's working set LRU evicts each expert before its
 * layer is visited again (GimmeMoE: a 1 GiB cache against a 1.02 GiB working set gave ~0%). */
bool tr_policy_lru_collapses(uint64_t budget_bytes, uint64_t working_set);

/* Writes a one-line warning with the numbers when the budget is below the cliff; returns false
 * (and writes "") above it. `kind` is the policy that will run there. */
bool tr_policy_cliff_warning(char *buf, size_t cap, uint64_t budget_bytes, uint64_t working_set,
                             tr_policy_kind kind);

/* What "auto" runs: "adaptive" on both sides of the cliff. It follows whichever of knn, layered,
 * lfu and lru its shadow caches find best on the routing it sees, so what it runs for a model is
 * measured on that model, not chosen here (bench/results/replay.md: the shared trace, traces
 * recorded from structured-router synthetic models of every architecture, traces inverting the
 * shared one's statistics). The budget and working set stay in the signature so the two regimes
 * can be told apart again if a measurement ever asks for it. */
tr_policy_kind tr_policy_auto(uint64_t budget_bytes, uint64_t working_set);

/* ---------------------------------------------------------------------------------------------- */
/* The policy object                                                                              */

/* The rules the adaptive policy duels (knn, layered, lfu, lru), for its statistics */
#define TR_POLICY_N_RULES 4
const char *tr_policy_rule_name(int rule);

typedef struct tr_policy_key {
    int32_t layer, expert;
} tr_policy_key;

typedef struct tr_policy_params {
    tr_policy_kind kind;
    int32_t n_layer, n_expert;
    int32_t n_expert_used; /* top-k; for "auto" and the layer shares */
    uint64_t budget_bytes;
    /* [n_layer] bytes of one expert of each layer, 0 for a layer without routed experts. Used
     * for the working set ("auto") and the layer shares ("layered"); admit takes each item's
     * own size. NULL: every layer is a MoE layer and "auto"/"layered" assume equal sizes. */
    const uint64_t *expert_bytes;
    uint64_t seed; /* random; 0 picks a fixed default */
    /* lrfu/layered/knn/adaptive: decay per visit of the item's layer, in (0,1]; 0 = the default
     * (0.9 lrfu, 0.95 the others). Router weights enter as w^0.5 per selection. */
    double decay;
    /* belady only: the lookups the caller will make, in order (n_future entries). Every lookup
     * must match the next entry; the future tells each item's next use. */
    const tr_policy_key *future;
    size_t n_future;
    /* adaptive only: follow this duel (adaptive.h) instead of running one of its own; the caller
     * created it for the whole cache, routes it (tr_duel_route) once per layer step and frees it.
     * A cache split into size classes runs one policy per class, and one duel serves them all:
     * the rule that fits the routing does not depend on the class, and each class's own duel
     * would route the predictor and the shadows again. NULL: the policy runs its own. */
    struct tr_duel *duel;
} tr_policy_params;

typedef struct tr_policy tr_policy;

tr_status tr_policy_create(const tr_policy_params *params, tr_policy **out, tr_error *err);
void tr_policy_free(tr_policy *p);

/* the kind in effect ("auto" resolved) */
tr_policy_kind tr_policy_kind_of(const tr_policy *p);

/* Router output of one layer step, for router-aware policies. experts/weights may hold
 * duplicates (a prefill batch: every token's top-k); probs, when non-NULL, is the full
 * probability vector over n_expert of the last token (accepted for policies that want it; the
 * current ones use the selected experts' weights). */
typedef struct tr_policy_route_info {
    const int32_t *experts; /* [n] */
    const float *weights;   /* [n], NULL: weight 1 */
    int32_t n;
    const float *probs; /* [n_expert] or NULL */
} tr_policy_route_info;

/* Marks one visit of `layer` (call it once per layer step, before that step's lookups, even
 * without router data: info may be NULL). lrfu and layered age a layer's items by its visits,
 * not by wall time, so that every layer is judged on the same clock. */
tr_status tr_policy_route(tr_policy *p, int32_t layer, const tr_policy_route_info *info,
                          tr_error *err);

/* One access. *hit tells whether the item is resident. Hit or miss, the access counts for the
 * policy (recency, frequency, Belady's position in the future). A miss admits nothing. */
tr_status tr_policy_lookup(tr_policy *p, int32_t layer, int32_t expert, bool *hit, tr_error *err);

enum {
    /* Admit even when the unpinned items cannot make room, leaving the set over its budget until
     * tr_policy_trim. For replaying traces whose batches (a prefill layer touching 160 experts)
     * exceed the budget; a cache with a fixed arena cannot use it. */
    TR_POLICY_OVERCOMMIT = 1u << 0,
};

/* Makes (layer, expert) resident at `bytes`, evicting unpinned victims chosen by the policy
 * until it fits; tr_policy_victims lists them. Errors (nothing changed): TR_E_ARG for a resident
 * item, bytes == 0 or out-of-range ids; TR_E_BUDGET for bytes > budget or when the unpinned
 * items cannot make room (without TR_POLICY_OVERCOMMIT). */
tr_status tr_policy_admit(tr_policy *p, int32_t layer, int32_t expert, uint64_t bytes,
                          unsigned flags, tr_error *err);
/* Evicts unpinned victims until the set fits its budget (after an overcommit). */
tr_status tr_policy_trim(tr_policy *p, tr_error *err);
/* The victims of the last admit or trim, in eviction order; valid until the next admit/trim. */
size_t tr_policy_victims(const tr_policy *p, const tr_policy_key **victims);

/* Pins nest (a count per item). Only resident items can be pinned; unpinning an item that is not
 * pinned is TR_E_ARG. */
tr_status tr_policy_pin(tr_policy *p, int32_t layer, int32_t expert, tr_error *err);
tr_status tr_policy_unpin(tr_policy *p, int32_t layer, int32_t expert, tr_error *err);

/* Drops a resident, unpinned item without counting an eviction (a failed read). */
tr_status tr_policy_remove(tr_policy *p, int32_t layer, int32_t expert, tr_error *err);

/* Protection: keeps these resident, unpinned experts of `layer` out of the victims until the next
 * tr_policy_route (of any layer), unless nothing else can make room; it replaces any earlier
 * protection. For the expert cache's router lookahead: the experts the next layer is predicted to
 * use are kept while the current layer evicts, without being read early. Experts that are not
 * resident, or pinned, are ignored. */
tr_status tr_policy_protect(tr_policy *p, int32_t layer, const int32_t *experts, int32_t n,
                            tr_error *err);

/* 0 when not resident */
uint64_t tr_policy_resident_bytes(const tr_policy *p, int32_t layer, int32_t expert);
/* A hint, changes nothing: starts loading what lookups, pins and unpins of these experts of
 * `layer` will touch (their items and heap keys, the layer's heap), so that the cache misses of
 * a step's calls overlap instead of following one another. */
void tr_policy_prefetch(const tr_policy *p, int32_t layer, const int32_t *experts, int32_t n);

typedef struct tr_policy_stats {
    uint64_t lookups, hits;
    uint64_t admits, evictions, evicted_bytes;
    uint64_t used_bytes, pinned_bytes, budget_bytes;
    uint64_t resident_items;
    uint64_t overcommits; /* admits that went over budget (TR_POLICY_OVERCOMMIT) */
    uint64_t protected_evictions; /* victims taken from the protected set (nothing else left) */
    /* adaptive: decode layer steps in which each rule (tr_policy_rule_name) led */
    uint64_t lead_steps[TR_POLICY_N_RULES];
} tr_policy_stats;

void tr_policy_get_stats(const tr_policy *p, tr_policy_stats *out);

#endif
