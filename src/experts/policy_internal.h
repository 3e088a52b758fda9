/*
 * The policy object's state, shared by the files of the policy module (policy.c: the bookkeeping
 * and the heap-ordered policies; adaptive.c: the routing-neighbour predictor and the set-dueling
 * default). Nothing outside src/experts/policy*.c and adaptive.c includes it.
 */
#ifndef TR_EXPERTS_POLICY_INTERNAL_H
#define TR_EXPERTS_POLICY_INTERNAL_H

#include "experts/adaptive.h"
#include "experts/policy.h"

#define NOT_IN_HEAP UINT32_MAX
#define TR_POLICY_CAND_KEY_BYTES 24

typedef struct tr_policy_item {
    _Alignas(64) uint64_t bytes; /* resident size; 0 = not resident */
    uint64_t stamp;   /* clock of the last access */
    uint64_t freq;    /* accesses (lfu) */
    double pend_w;    /* lrfu: router increment announced by route() for visit pend_at */
    uint64_t pend_at;
    uint32_t pins;
    uint32_t ev_pos; /* random, knn, adaptive: index in ev, NOT_IN_HEAP when absent */
} tr_policy_item;
_Static_assert(sizeof(tr_policy_item) == 64, "one cache line per key");

/* A key's heap order: priority pa (see the top of policy.c; the lrfu value for knn/adaptive),
 * ties by pb. Apart from the items, 16 bytes a key: a heap sift compares keys of one layer,
 * which then sit in a few cache lines instead of one line per compared item. */
typedef struct tr_policy_hkey {
    double pa;
    uint64_t pb;
} tr_policy_hkey;

struct tr_policy {
    tr_policy_kind kind;
    int32_t n_layer, n_expert, n_expert_used;
    uint32_t n_keys;
    uint64_t budget, used, pinned_bytes;
    double log_decay; /* lrfu/layered/knn/adaptive: log(decay) <= 0 */

    /* per key (layer * n_expert + expert): what a lookup, a pin or an admit touches, in one
     * cache line per key (the expert cache calls the policy between layers whose compute has
     * evicted its tables from the CPU caches: one line per key instead of one per field) */
    tr_policy_item *it;
    tr_policy_hkey *key; /* [n_keys] */
    uint8_t *prot;  /* protected (tr_policy_protect): resident, unpinned, out of the evictable set */

    /* per layer */
    uint64_t *visits;
    uint64_t *layer_used, *share;
    uint64_t *layer_bytes; /* the params' expert_bytes (0: no routed experts), all 1 when NULL */
    uint32_t *heap; /* [n_layer * n_expert]: layer l's item heap at heap + l * n_expert */
    uint32_t *heap_n;
    uint32_t *pos; /* [n_keys] index in its layer's heap, NOT_IN_HEAP when absent */
    uint32_t *lheap, lheap_n, *lpos; /* the heap of layers */
    double *la;                      /* layer key: its top item's key shifted by the layer offset */
    uint64_t *lb;

    /* random, knn, adaptive: the evictable items as a flat array */
    uint32_t *ev, ev_n;
    /* the keys' fields the victim scans compare, by position in ev (copies of it[k]'s, kept
     * equal by evictable_add/del and lookup): a scan reads these arrays in order instead of one
     * cache line of it[] per evictable item */
    uint64_t *ev_stamp, *ev_freq;
    double *ev_pa;
    int32_t *ev_layer;
    /* knn, adaptive: a pinned item keeps its place in ev, flagged here (by position), so that a
     * step's pins and unpins flip a byte instead of moving entries of five arrays; the scans
     * skip flagged entries. (The scans' keys end in the access stamp, unique per lookup, so the
     * order of ev does not decide.) The random policy removes pinned items: it draws from ev. */
    uint8_t *ev_pin;
    uint64_t rng;

    /* protected items (at most one layer's worth), in the order they were protected */
    uint32_t *prot_list, n_prot;

    /* knn: the predictor; adaptive: the shadows (and theirs) */
    tr_adapt *ad;
    bool ad_borrowed; /* adaptive's knn shadow: the duel's predictor, routed and freed there */
    tr_duel *duel;
    bool duel_borrowed; /* params.duel: the caller routes and frees it */
    int32_t *klayer; /* [n_keys] layer of each key (no division in scans) */
    /* the lowest evictable items of the last scan, in order, for the other admits of the step:
     * keys of evictable items do not change within a layer step (what is looked up is pinned
     * or not resident), so one scan serves the step; lookups of evictable items, unpins and
     * protection changes invalidate it */
    uint32_t *cand, cand_n, cand_i, cand_cap;
    void *cand_key; /* [cand_cap] their keys (adaptive.c's rkey) */
    int cand_rule;
    bool cand_valid;

    /* belady */
    tr_policy_key *future;
    size_t n_future, cursor;
    size_t *occ_off; /* [n_keys + 1] */
    size_t *occ_pos; /* [n_future] positions of each key's accesses, ascending */
    size_t *occ_ptr; /* [n_keys] index (relative) of the next access not yet looked up */

    tr_policy_key *victims;
    size_t n_victims;
    int32_t last_layer; /* the staging layer of the last admit, for trim */
    uint64_t clock, n_resident;
    tr_policy_stats st;
};

/* The decayed, router-weighted count of key k on its layer's visit clock, as a log (-inf: never
 * used): the LRFU value that lrfu, layered, knn and adaptive keep for every key. */
static inline double tr_policy_lrfu_value(const tr_policy *p, uint32_t k) {
    return p->key[k].pa + (double)p->visits[k / (uint32_t)p->n_expert] * p->log_decay;
}

#endif
