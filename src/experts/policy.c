/*
 * Expert-cache replacement policies (see policy.h for the contract).
 *
 * One data structure serves every ordered policy: each layer keeps an indexed min-heap of its
 * evictable items (resident, not pinned), and a second heap orders the layers by their cheapest
 * item. Eviction takes the global minimum from the top of both, or (layered) the staging layer's
 * own minimum. An item's priority is a pair (a, b) compared lexicographically:
 *
 *   lru      (0, last access stamp)
 *   lfu      (accesses, last access stamp)
 *   belady   (-next use position, stamp)            never used again: -inf, evicted first
 *   lrfu     (log f - t log(decay), -stamp)         f: router-weighted count at the layer's visit t
 *
 * LRFU's value f decays by `decay` per visit of the item's own layer. Storing
 * K = log f - t log(decay) makes an item's key static between its own accesses; its current
 * log-value is K + visits[layer] * log(decay), so a layer's visit shifts all of its items by the
 * same amount. That shift lives in the layer heap's key (layer offset), not in the items: a visit
 * costs one layer-heap fix, not a pass over the layer's experts.
 *
 * Pinned items leave the heaps and come back on their last unpin, so the heap tops are always
 * evictable and an admit never scans. Protected items (tr_policy_protect) leave them the same way
 * and come back at the next route, or are taken last when nothing else is left.
 *
 * random, knn and adaptive keep the evictable items as a flat array instead: random draws from
 * it, knn and adaptive (adaptive.c) scan it once per layer step, because their order changes
 * with every step's prediction. The LRFU value is kept for them too (knn's tie order, the
 * layered rule adaptive may follow).
 */
#include "experts/policy_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define MAX_LAYERS  65536      /* sanity bounds on caller input, not capacity limits:    */
#define MAX_KEYS    (1u << 28) /* tables are sized from the values actually given        */
/* A selection adds w^0.5 (router weight w) to an item's LRFU count: weight-aware without letting
 * the top-1 expert dominate. On the shared Qwen3 trace weights against plain counts change the
 * hit rate by at most 0.2 points either way (replay.md); what carries the gain is the per-layer
 * visit clock and the layer shares, not the weights. */

/* w^0.5 as sqrt(w): correctly rounded, one instruction, where pow walks tables that
 * the layers' compute has evicted from the CPU caches. glibc's pow(w, 0.5) is one ulp away from it
 * for about 0.08% of the floats in (0, 1]; the replays of every trace in bench/results/replay.md
 * give the same hits and evictions with either. -0 gives +0, as pow does. */
static inline double sel_increment(float w) { return w > 0 ? sqrt((double)w) : 0.0; }

static const char *const k_names[TR_POLICY_COUNT] = {
    [TR_POLICY_AUTO] = "auto",       [TR_POLICY_LRU] = "lru",       [TR_POLICY_LFU] = "lfu",
    [TR_POLICY_RANDOM] = "random",   [TR_POLICY_BELADY] = "belady", [TR_POLICY_LRFU] = "lrfu",
    [TR_POLICY_LAYERED] = "layered", [TR_POLICY_KNN] = "knn",         [TR_POLICY_ADAPTIVE] = "adaptive",
};

const char *tr_policy_name(tr_policy_kind k) {
    return (unsigned)k < TR_POLICY_COUNT ? k_names[k] : "?";
}

const char *tr_policy_names(void) { return "auto,lru,lfu,random,belady,lrfu,layered,knn,adaptive"; }

tr_status tr_policy_parse(const char *name, tr_policy_kind *out, tr_error *err) {
    for (int k = 0; k < TR_POLICY_COUNT; k++)
        if (name && !strcmp(name, k_names[k])) {
            *out = (tr_policy_kind)k;
            return TR_OK;
        }
    return tr_fail(err, TR_E_ARG, "unknown expert policy '%s' (known: %s)", name ? name : "(null)",
                   tr_policy_names());
}

/* ---------------------------------------------------------------------------------------------- */
/* The cliff                                                                                      */

uint64_t tr_policy_working_set(int32_t n_layer, const uint64_t *expert_bytes,
                               int32_t n_expert_used) {
    uint64_t ws = 0;
    if (!expert_bytes || n_expert_used <= 0) return 0;
    for (int32_t l = 0; l < n_layer; l++) ws += (uint64_t)n_expert_used * expert_bytes[l];
    return ws;
}

bool tr_policy_lru_collapses(uint64_t budget_bytes, uint64_t working_set) {
    return budget_bytes < working_set;
}

tr_policy_kind tr_policy_auto(uint64_t budget_bytes, uint64_t working_set) {
    /* Below the cliff no rule may be LRU-like by construction: the adaptive policy's shadows see
     * LRU collapse there (0 hits) and follow another rule; above it they pick what the routing
     * favours (see policy.h) */
    (void)budget_bytes;
    (void)working_set;
    return TR_POLICY_ADAPTIVE;
}

bool tr_policy_cliff_warning(char *buf, size_t cap, uint64_t budget_bytes, uint64_t working_set,
                             tr_policy_kind kind) {
    if (cap) buf[0] = 0;
    if (!tr_policy_lru_collapses(budget_bytes, working_set)) return false;
    if (cap)
        snprintf(buf, cap,
                 "expert cache budget %.1f MiB is below one token's working set %.1f MiB (every "
                 "MoE layer x top-k x expert bytes, %.2fx the budget): plain LRU would evict each "
                 "expert before its layer comes round again (~0%% hits); policy '%s' is used%s",
                 budget_bytes / 1048576.0, working_set / 1048576.0,
                 budget_bytes ? (double)working_set / (double)budget_bytes : 0.0,
                 tr_policy_name(kind),
                 kind == TR_POLICY_LRU ? " anyway (asked for explicitly)" : " instead");
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* State                                                                                          */

static bool is_adaptive(const tr_policy *p) {
    return p->kind == TR_POLICY_KNN || p->kind == TR_POLICY_ADAPTIVE;
}
static bool uses_heaps(const tr_policy *p) { return p->kind != TR_POLICY_RANDOM && !is_adaptive(p); }
/* heap-ordered by the LRFU value */
static bool is_lrfu(const tr_policy *p) {
    return p->kind == TR_POLICY_LRFU || p->kind == TR_POLICY_LAYERED;
}
/* keeps the LRFU value of every key (the adaptive rules use it too) */
static bool keeps_lrfu(const tr_policy *p) { return is_lrfu(p) || is_adaptive(p); }

/* ---------------------------------------------------------------------------------------------- */
/* Indexed heaps. One routine pair serves both levels: ids, their positions and their keys.       */

typedef struct hview {
    uint32_t *h, *n, *pos;
    const char *a, *b; /* the keys of id x at a + x * stride, b + x * stride */
    size_t stride;
} hview;

static bool hless(const hview *v, uint32_t x, uint32_t y) {
    const double ax = *(const double *)(v->a + x * v->stride),
                 ay = *(const double *)(v->a + y * v->stride);
    return ax < ay || (ax == ay && *(const uint64_t *)(v->b + x * v->stride) <
                                       *(const uint64_t *)(v->b + y * v->stride));
}

static void hset(const hview *v, uint32_t i, uint32_t id) {
    v->h[i] = id;
    v->pos[id] = i;
}

static void hup(const hview *v, uint32_t i) {
    uint32_t id = v->h[i];
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!hless(v, id, v->h[parent])) break;
        hset(v, i, v->h[parent]);
        i = parent;
    }
    hset(v, i, id);
}

static void hdown(const hview *v, uint32_t i) {
    uint32_t id = v->h[i], n = *v->n;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && hless(v, v->h[c + 1], v->h[c])) c++;
        if (!hless(v, v->h[c], id)) break;
        hset(v, i, v->h[c]);
        i = c;
    }
    hset(v, i, id);
}

static void hpush(const hview *v, uint32_t id) {
    hset(v, (*v->n)++, id);
    hup(v, *v->n - 1);
}

static void hremove(const hview *v, uint32_t id) {
    uint32_t i = v->pos[id], last = --*v->n;
    v->pos[id] = NOT_IN_HEAP;
    if (i == last) return;
    uint32_t moved = v->h[last];
    hset(v, i, moved);
    hup(v, i);
    hdown(v, v->pos[moved]);
}

static void hfix(const hview *v, uint32_t id) {
    hup(v, v->pos[id]);
    hdown(v, v->pos[id]);
}

static hview item_heap(tr_policy *p, int32_t l) {
    return (hview){p->heap + (size_t)l * (size_t)p->n_expert, &p->heap_n[l], p->pos,
                   (const char *)&p->key[0].pa, (const char *)&p->key[0].pb, sizeof *p->key};
}

static hview layer_heap(tr_policy *p) {
    _Static_assert(sizeof *p->la == sizeof *p->lb, "layer keys");
    return (hview){p->lheap, &p->lheap_n, p->lpos, (const char *)p->la, (const char *)p->lb,
                   sizeof *p->la};
}

/* re-keys layer l in the layer heap after its item heap or its offset changed */
static void layer_sync(tr_policy *p, int32_t l) {
    hview lh = layer_heap(p);
    if (p->heap_n[l] == 0) {
        if (p->lpos[l] != NOT_IN_HEAP) hremove(&lh, (uint32_t)l);
        return;
    }
    uint32_t top = p->heap[(size_t)l * (size_t)p->n_expert];
    double offset = is_lrfu(p) ? (double)p->visits[l] * p->log_decay : 0.0;
    p->la[l] = p->key[top].pa + offset;
    p->lb[l] = p->key[top].pb;
    if (p->lpos[l] == NOT_IN_HEAP)
        hpush(&lh, (uint32_t)l);
    else
        hfix(&lh, (uint32_t)l);
}

/* ---------------------------------------------------------------------------------------------- */
/* Evictable set: heaps, or the flat array of the random policy                                   */

static int32_t layer_of(const tr_policy *p, uint32_t k) {
    return (int32_t)(k / (uint32_t)p->n_expert);
}

static void evictable_add(tr_policy *p, uint32_t k) {
    if (uses_heaps(p)) {
        int32_t l = layer_of(p, k);
        hview v = item_heap(p, l);
        hpush(&v, k);
        layer_sync(p, l);
    } else {
        const uint32_t i = p->ev_n++;
        p->it[k].ev_pos = i;
        p->ev[i] = k;
        p->ev_stamp[i] = p->it[k].stamp;
        p->ev_freq[i] = p->it[k].freq;
        p->ev_pa[i] = p->key[k].pa;
        p->ev_layer[i] = layer_of(p, k);
        p->ev_pin[i] = 0;
    }
}

static void evictable_del(tr_policy *p, uint32_t k) {
    if (uses_heaps(p)) {
        int32_t l = layer_of(p, k);
        hview v = item_heap(p, l);
        hremove(&v, k);
        layer_sync(p, l);
    } else {
        const uint32_t i = p->it[k].ev_pos, n = --p->ev_n, last = p->ev[n];
        p->ev[i] = last;
        p->ev_stamp[i] = p->ev_stamp[n];
        p->ev_freq[i] = p->ev_freq[n];
        p->ev_pa[i] = p->ev_pa[n];
        p->ev_layer[i] = p->ev_layer[n];
        p->ev_pin[i] = p->ev_pin[n];
        p->it[last].ev_pos = i;
        p->it[k].ev_pos = NOT_IN_HEAP;
    }
}

static size_t next_use(const tr_policy *p, uint32_t k) {
    size_t i = p->occ_off[k] + p->occ_ptr[k];
    return i < p->occ_off[k + 1] ? p->occ_pos[i] : SIZE_MAX;
}

/* recomputes k's key from its state and repositions it if it is in a heap */
static void rekey(tr_policy *p, uint32_t k) {
    if (!uses_heaps(p)) return;
    switch (p->kind) {
    case TR_POLICY_LRU: p->key[k].pa = 0; break;
    case TR_POLICY_LFU: p->key[k].pa = (double)p->it[k].freq; break;
    case TR_POLICY_BELADY: {
        size_t nu = next_use(p, k);
        p->key[k].pa = nu == SIZE_MAX ? -HUGE_VAL : -(double)nu;
        break;
    }
    default: break; /* lrfu: pa is maintained by the access itself */
    }
    /* Ties go to the least recent item, except for lrfu/layered: there equal values mean equal
     * chances at the next visit of the item's layer, and the most recent item is the one whose
     * layer the token has just left, so its next chance is the farthest away. Evicting it keeps
     * a stable subset resident under a pure layer cycle, where breaking ties by age would
     * rotate everything out just before use (the LRU cliff again). */
    p->key[k].pb = is_lrfu(p) ? UINT64_MAX - p->it[k].stamp : p->it[k].stamp;
    if (p->pos[k] != NOT_IN_HEAP) {
        int32_t l = layer_of(p, k);
        hview v = item_heap(p, l);
        hfix(&v, k);
        layer_sync(p, l);
    }
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The next victim for making room for `incoming` bytes of layer `staging` (-1: none), or
 * UINT32_MAX when nothing is evictable. */
static uint32_t pick_victim(tr_policy *p, int32_t staging, uint64_t incoming) {
    if (is_adaptive(p)) return tr_adapt_victim(p, staging, incoming);
    if (!uses_heaps(p)) {
        if (!p->ev_n) return UINT32_MAX;
        /* multiply-shift instead of %: unbiased enough for n << 2^32, and no division */
        return p->ev[(uint32_t)(((rng_next(&p->rng) >> 32) * p->ev_n) >> 32)];
    }
    /* layered: a layer over its fair share pays for its own misses, so one layer's burst cannot
     * push out the experts the other layers will want when the token reaches them */
    if (p->kind == TR_POLICY_LAYERED && staging >= 0 && p->heap_n[staging] &&
        p->layer_used[staging] + incoming > p->share[staging])
        return p->heap[(size_t)staging * (size_t)p->n_expert];
    if (!p->lheap_n) return UINT32_MAX;
    return p->heap[(size_t)p->lheap[0] * (size_t)p->n_expert];
}

/* Drops k from the protected list (it is no longer in the evictable set either). */
static void unprotect(tr_policy *p, uint32_t k) {
    p->prot[k] = 0;
    for (uint32_t i = 0; i < p->n_prot; i++)
        if (p->prot_list[i] == k) {
            memmove(p->prot_list + i, p->prot_list + i + 1, (p->n_prot - i - 1) * sizeof *p->prot_list);
            p->n_prot--;
            break;
        }
}

static void unprotect_all(tr_policy *p) {
    if (p->n_prot) p->cand_valid = false;
    for (uint32_t i = 0; i < p->n_prot; i++) {
        const uint32_t k = p->prot_list[i];
        p->prot[k] = 0;
        evictable_add(p, k); /* protected items are resident and unpinned */
    }
    p->n_prot = 0;
}

/* pick_victim, and when only protected items are left, the one protected last (the least likely
 * of the prediction), put back into the evictable set for evict() to take */
static uint32_t next_victim(tr_policy *p, int32_t staging, uint64_t incoming) {
    uint32_t v = pick_victim(p, staging, incoming);
    if (v != UINT32_MAX || !p->n_prot) return v;
    v = p->prot_list[--p->n_prot];
    p->prot[v] = 0;
    evictable_add(p, v);
    p->st.protected_evictions++;
    return v;
}

static void evict(tr_policy *p, uint32_t k) {
    uint64_t b = p->it[k].bytes;
    evictable_del(p, k);
    p->it[k].bytes = 0;
    p->n_resident--;
    p->used -= b;
    p->layer_used[layer_of(p, k)] -= b;
    p->victims[p->n_victims++] =
        (tr_policy_key){layer_of(p, k), (int32_t)(k % (uint32_t)p->n_expert)};
    p->st.evictions++;
    p->st.evicted_bytes += b;
}

/* ---------------------------------------------------------------------------------------------- */
/* Creation                                                                                       */

void tr_policy_free(tr_policy *p) {
    if (!p) return;
    free(p->it);
    free(p->key);
    free(p->visits);
    free(p->layer_used);
    free(p->share);
    free(p->heap);
    free(p->heap_n);
    free(p->pos);
    free(p->lheap);
    free(p->lpos);
    free(p->la);
    free(p->lb);
    free(p->ev);
    free(p->ev_stamp);
    free(p->ev_freq);
    free(p->ev_pa);
    free(p->ev_layer);
    free(p->ev_pin);
    free(p->future);
    free(p->occ_off);
    free(p->occ_pos);
    free(p->occ_ptr);
    free(p->victims);
    free(p->prot);
    free(p->prot_list);
    free(p->layer_bytes);
    if (!p->ad_borrowed) tr_adapt_free(p->ad);
    if (!p->duel_borrowed) tr_duel_free(p->duel);
    free(p->klayer);
    free(p->cand);
    free(p->cand_key);
    free(p);
}

#define ALLOC(ptr, n) (((ptr) = calloc((n) ? (n) : 1, sizeof *(ptr))) != NULL)

tr_status tr_policy_create(const tr_policy_params *pp, tr_policy **out, tr_error *err) {
    *out = NULL;
    if (!pp) return tr_fail(err, TR_E_ARG, "expert policy: no parameters");
    if (pp->n_layer <= 0 || pp->n_layer > MAX_LAYERS || pp->n_expert <= 0)
        return tr_fail(err, TR_E_ARG, "expert policy: bad shape n_layer=%d n_expert=%d",
                       pp->n_layer, pp->n_expert);
    if ((uint64_t)pp->n_layer * (uint64_t)pp->n_expert > MAX_KEYS)
        return tr_fail(err, TR_E_ARG, "expert policy: %d layers x %d experts is more than %u items",
                       pp->n_layer, pp->n_expert, MAX_KEYS);
    if ((unsigned)pp->kind >= TR_POLICY_COUNT)
        return tr_fail(err, TR_E_ARG, "expert policy: unknown kind %d", (int)pp->kind);
    if (pp->budget_bytes == 0) return tr_fail(err, TR_E_ARG, "expert policy: budget is 0 bytes");
    double decay = pp->decay;
    if (decay != 0 && !(decay > 0 && decay <= 1))
        return tr_fail(err, TR_E_ARG, "expert policy: decay %g is not in (0, 1]", decay);
    if (pp->kind == TR_POLICY_BELADY && pp->n_future && !pp->future)
        return tr_fail(err, TR_E_ARG, "expert policy: belady needs the future access sequence");

    tr_policy *p = calloc(1, sizeof *p);
    if (!p) return tr_fail(err, TR_E_NOMEM, "expert policy: out of memory");
    p->n_layer = pp->n_layer;
    p->n_expert_used = pp->n_expert_used;
    p->n_expert = pp->n_expert;
    p->n_keys = (uint32_t)pp->n_layer * (uint32_t)pp->n_expert;
    p->budget = pp->budget_bytes;
    p->last_layer = -1;
    p->rng = pp->seed ? pp->seed : 0x7e77ace5eedull;

    uint64_t ws = tr_policy_working_set(pp->n_layer, pp->expert_bytes, pp->n_expert_used);
    p->kind = pp->kind == TR_POLICY_AUTO ? tr_policy_auto(pp->budget_bytes, ws) : pp->kind;
    if (decay == 0) decay = p->kind == TR_POLICY_LRFU ? 0.9 : 0.95;
    p->log_decay = log(decay);

    const size_t nk = p->n_keys, nl = (size_t)p->n_layer;
    p->it = aligned_alloc(64, (nk ? nk : 1) * sizeof *p->it);
    if (p->it) memset(p->it, 0, (nk ? nk : 1) * sizeof *p->it);
    bool ok = p->it && ALLOC(p->key, nk) && ALLOC(p->visits, nl) && ALLOC(p->layer_used, nl) &&
              ALLOC(p->share, nl) && ALLOC(p->heap, nk) && ALLOC(p->heap_n, nl) &&
              ALLOC(p->pos, nk) && ALLOC(p->lheap, nl) && ALLOC(p->lpos, nl) && ALLOC(p->la, nl) &&
              ALLOC(p->lb, nl) && ALLOC(p->victims, nk) && ALLOC(p->prot, nk) &&
              ALLOC(p->prot_list, (size_t)p->n_expert) && ALLOC(p->layer_bytes, nl);
    if (ok && !uses_heaps(p))
        ok = ALLOC(p->ev, nk) && ALLOC(p->ev_stamp, nk) && ALLOC(p->ev_freq, nk) &&
             ALLOC(p->ev_pa, nk) && ALLOC(p->ev_layer, nk) && ALLOC(p->ev_pin, nk);
    if (ok && p->kind == TR_POLICY_BELADY)
        ok = ALLOC(p->future, pp->n_future) && ALLOC(p->occ_off, nk + 1) &&
             ALLOC(p->occ_pos, pp->n_future) && ALLOC(p->occ_ptr, nk);
    if (!ok) {
        tr_policy_free(p);
        return tr_fail(err, TR_E_NOMEM, "expert policy: out of memory for %zu items", nk);
    }
    for (size_t k = 0; k < nk; k++) {
        p->pos[k] = NOT_IN_HEAP;
        p->key[k].pa = -HUGE_VAL; /* lrfu: never accessed, f = 0 */
        p->it[k].pend_at = UINT64_MAX;
        p->it[k].ev_pos = NOT_IN_HEAP;
    }
    for (size_t l = 0; l < nl; l++) p->lpos[l] = NOT_IN_HEAP;

    /* layered: equal byte shares for the layers that have routed experts */
    size_t n_moe = 0;
    for (size_t l = 0; l < nl; l++) n_moe += !pp->expert_bytes || pp->expert_bytes[l] > 0;
    for (size_t l = 0; l < nl; l++)
        p->share[l] =
            (!pp->expert_bytes || pp->expert_bytes[l] > 0) && n_moe ? p->budget / n_moe : 0;

    if (p->kind == TR_POLICY_BELADY) {
        p->n_future = pp->n_future;
        for (size_t i = 0; i < pp->n_future; i++) {
            tr_policy_key f = pp->future[i];
            if (f.layer < 0 || f.layer >= p->n_layer || f.expert < 0 || f.expert >= p->n_expert) {
                tr_policy_free(p);
                return tr_fail(err, TR_E_ARG,
                               "expert policy: future access %zu (%d,%d) is out of "
                               "range",
                               i, f.layer, f.expert);
            }
            p->future[i] = f;
            p->occ_off[(size_t)f.layer * (size_t)p->n_expert + (size_t)f.expert + 1]++;
        }
        for (size_t k = 0; k < nk; k++) p->occ_off[k + 1] += p->occ_off[k];
        /* fill with occ_ptr as a per-key cursor, then rewind it */
        for (size_t i = 0; i < pp->n_future; i++) {
            size_t k =
                (size_t)p->future[i].layer * (size_t)p->n_expert + (size_t)p->future[i].expert;
            p->occ_pos[p->occ_off[k] + p->occ_ptr[k]++] = i;
        }
        memset(p->occ_ptr, 0, nk * sizeof *p->occ_ptr);
    }
    for (size_t l = 0; l < nl; l++) p->layer_bytes[l] = pp->expert_bytes ? pp->expert_bytes[l] : 1;
    if (is_adaptive(p)) {
        p->cand_cap = (uint32_t)(2 * (pp->n_expert_used > 0 ? pp->n_expert_used : 1) + 8);
        if (p->cand_cap > nk) p->cand_cap = (uint32_t)nk;
        ok = ALLOC(p->klayer, nk) && ALLOC(p->cand, p->cand_cap) &&
             (p->cand_key = calloc(p->cand_cap, TR_POLICY_CAND_KEY_BYTES)) != NULL;
        if (ok && p->kind == TR_POLICY_KNN)
            ok = (p->ad = tr_adapt_create(p->n_layer, p->n_expert, pp->n_expert_used)) != NULL;
        if (!ok) {
            tr_policy_free(p);
            return tr_fail(err, TR_E_NOMEM, "expert policy: out of memory for %zu items", nk);
        }
        for (size_t k = 0; k < nk; k++) p->klayer[k] = (int32_t)(k / (size_t)p->n_expert);
        if (p->kind == TR_POLICY_ADAPTIVE && pp->duel) {
            p->duel = pp->duel;
            p->duel_borrowed = true;
        } else if (p->kind == TR_POLICY_ADAPTIVE) {
            tr_policy_params sp = *pp;
            sp.decay = exp(p->log_decay);
            tr_status s = tr_duel_create(&sp, &p->duel, err);
            if (s) {
                tr_policy_free(p);
                return s;
            }
        }
    }
    p->st.budget_bytes = p->budget;
    *out = p;
    return TR_OK;
}

tr_policy_kind tr_policy_kind_of(const tr_policy *p) { return p->kind; }

/* ---------------------------------------------------------------------------------------------- */
/* Operations                                                                                     */

static tr_status check_key(const tr_policy *p, int32_t layer, int32_t expert, uint32_t *k,
                           const char *what, tr_error *err) {
    if (layer < 0 || layer >= p->n_layer || expert < 0 || expert >= p->n_expert)
        return tr_fail(err, TR_E_ARG, "expert policy %s: (layer %d, expert %d) is outside %d x %d",
                       what, layer, expert, p->n_layer, p->n_expert);
    *k = (uint32_t)layer * (uint32_t)p->n_expert + (uint32_t)expert;
    return TR_OK;
}

tr_status tr_policy_route(tr_policy *p, int32_t layer, const tr_policy_route_info *info,
                          tr_error *err) {
    if (layer < 0 || layer >= p->n_layer)
        return tr_fail(err, TR_E_ARG, "expert policy route: layer %d is outside 0..%d", layer,
                       p->n_layer - 1);
    if (info && info->n < 0)
        return tr_fail(err, TR_E_ARG, "expert policy route: %d experts", info->n);
    if (info && info->n && !info->experts)
        return tr_fail(err, TR_E_ARG, "expert policy route: no expert ids");
    /* validate before changing anything */
    for (int32_t i = 0; info && i < info->n; i++) {
        if (info->experts[i] < 0 || info->experts[i] >= p->n_expert)
            return tr_fail(err, TR_E_ARG,
                           "expert policy route: layer %d expert %d is outside "
                           "0..%d",
                           layer, info->experts[i], p->n_expert - 1);
        if (info->weights && !(info->weights[i] >= 0 && info->weights[i] <= 1e30f))
            return tr_fail(err, TR_E_ARG, "expert policy route: layer %d expert %d has weight %g",
                           layer, info->experts[i], (double)info->weights[i]);
    }
    unprotect_all(p);
    uint64_t v = ++p->visits[layer];
    if (keeps_lrfu(p)) {
        if (is_lrfu(p)) layer_sync(p, layer);
        for (int32_t i = 0; info && i < info->n; i++) {
            uint32_t k = (uint32_t)layer * (uint32_t)p->n_expert + (uint32_t)info->experts[i];
            if (p->it[k].pend_at != v) {
                p->it[k].pend_at = v;
                p->it[k].pend_w = 0;
            }
            p->it[k].pend_w += info->weights ? sel_increment(info->weights[i]) : 1.0;
        }
    }
    p->cand_valid = false;
    if (p->ad && !p->ad_borrowed) tr_adapt_route(p->ad, layer, info);
    if (p->duel && !p->duel_borrowed) tr_duel_route(p->duel, layer, info);
    return TR_OK;
}

tr_status tr_policy_lookup(tr_policy *p, int32_t layer, int32_t expert, bool *hit, tr_error *err) {
    uint32_t k = 0;
    tr_status s = check_key(p, layer, expert, &k, "lookup", err);
    if (s) return s;
    if (p->kind == TR_POLICY_BELADY) {
        if (p->cursor >= p->n_future)
            return tr_fail(err, TR_E_ARG,
                           "belady: lookup %zu of (%d,%d) is past the end of the "
                           "future sequence",
                           p->cursor, layer, expert);
        tr_policy_key f = p->future[p->cursor];
        if (f.layer != layer || f.expert != expert)
            return tr_fail(err, TR_E_ARG,
                           "belady: lookup %zu is (%d,%d) but the future sequence "
                           "says (%d,%d)",
                           p->cursor, layer, expert, f.layer, f.expert);
        p->cursor++;
        p->occ_ptr[k]++;
    }
    *hit = p->it[k].bytes != 0;
    p->st.lookups++;
    p->st.hits += *hit;
    p->it[k].stamp = ++p->clock;
    p->it[k].freq++;
    if (keeps_lrfu(p)) {
        uint64_t now = p->visits[layer];
        double inc = p->it[k].pend_at == now && p->it[k].pend_w > 0 ? p->it[k].pend_w : 1.0;
        p->it[k].pend_at = UINT64_MAX; /* consumed: a second lookup this visit counts 1 */
        /* decayed value now, plus this access; K = log f - now log(decay) */
        double logf = p->key[k].pa + (double)now * p->log_decay;
        double f = exp(logf) + inc;
        p->key[k].pa = log(f) - (double)now * p->log_decay;
    }
    rekey(p, k);
    if (p->duel) tr_duel_access(p->duel, layer, expert);
    const uint32_t ei = p->it[k].ev_pos;
    /* in ev: looked up while evictable (a replay pins after the lookup), or pinned (knn,
     * adaptive), which no scan takes before its unpin invalidates the scan anyway */
    if (ei != NOT_IN_HEAP) {
        p->ev_stamp[ei] = p->it[k].stamp;
        p->ev_freq[ei] = p->it[k].freq;
        p->ev_pa[ei] = p->key[k].pa;
        if (!(is_adaptive(p) && p->ev_pin[ei])) p->cand_valid = false;
    }
    return TR_OK;
}

tr_status tr_policy_admit(tr_policy *p, int32_t layer, int32_t expert, uint64_t bytes,
                          unsigned flags, tr_error *err) {
    uint32_t k = 0;
    tr_status s = check_key(p, layer, expert, &k, "admit", err);
    if (s) return s;
    p->n_victims = 0;
    if (bytes == 0)
        return tr_fail(err, TR_E_ARG, "expert policy admit: (layer %d, expert %d) has 0 bytes",
                       layer, expert);
    if (p->it[k].bytes)
        return tr_fail(err, TR_E_ARG,
                       "expert policy admit: (layer %d, expert %d) is already "
                       "resident",
                       layer, expert);
    if (bytes > p->budget)
        return tr_fail(err, TR_E_BUDGET,
                       "expert policy admit: (layer %d, expert %d) needs %llu "
                       "bytes, more than the whole budget of %llu",
                       layer, expert, (unsigned long long)bytes, (unsigned long long)p->budget);
    bool over = p->pinned_bytes + bytes > p->budget;
    if (over && !(flags & TR_POLICY_OVERCOMMIT))
        return tr_fail(err, TR_E_BUDGET,
                       "expert policy admit: (layer %d, expert %d) needs %llu "
                       "bytes but pinned experts hold %llu of the %llu-byte budget",
                       layer, expert, (unsigned long long)bytes,
                       (unsigned long long)p->pinned_bytes, (unsigned long long)p->budget);
    while (p->used + bytes > p->budget) {
        uint32_t v = next_victim(p, layer, bytes);
        if (v == UINT32_MAX) break; /* only with overcommit: the feasibility check above */
        evict(p, v);
    }
    if (p->used + bytes > p->budget) p->st.overcommits++;
    p->it[k].bytes = bytes;
    p->n_resident++;
    p->used += bytes;
    p->layer_used[layer] += bytes;
    p->last_layer = layer;
    p->st.admits++;
    rekey(p, k);
    evictable_add(p, k);
    return TR_OK;
}

tr_status tr_policy_trim(tr_policy *p, tr_error *err) {
    p->n_victims = 0;
    while (p->used > p->budget) {
        uint32_t v = next_victim(p, p->last_layer, 0);
        if (v == UINT32_MAX)
            return tr_fail(err, TR_E_BUDGET,
                           "expert policy trim: %llu bytes resident, budget "
                           "%llu, and the %llu pinned bytes cannot be evicted",
                           (unsigned long long)p->used, (unsigned long long)p->budget,
                           (unsigned long long)p->pinned_bytes);
        evict(p, v);
    }
    return TR_OK;
}

size_t tr_policy_victims(const tr_policy *p, const tr_policy_key **victims) {
    *victims = p->victims;
    return p->n_victims;
}

tr_status tr_policy_pin(tr_policy *p, int32_t layer, int32_t expert, tr_error *err) {
    uint32_t k = 0;
    tr_status s = check_key(p, layer, expert, &k, "pin", err);
    if (s) return s;
    if (!p->it[k].bytes)
        return tr_fail(err, TR_E_ARG, "expert policy pin: (layer %d, expert %d) is not resident",
                       layer, expert);
    if (p->it[k].pins == UINT32_MAX)
        return tr_fail(err, TR_E_ARG, "expert policy pin: (layer %d, expert %d) pinned too often",
                       layer, expert);
    if (p->it[k].pins++ == 0) {
        if (p->prot[k])
            unprotect(p, k); /* pinned now: out of the evictable set already */
        else if (is_adaptive(p))
            p->ev_pin[p->it[k].ev_pos] = 1;
        else
            evictable_del(p, k);
        p->pinned_bytes += p->it[k].bytes;
    }
    return TR_OK;
}

tr_status tr_policy_unpin(tr_policy *p, int32_t layer, int32_t expert, tr_error *err) {
    uint32_t k = 0;
    tr_status s = check_key(p, layer, expert, &k, "unpin", err);
    if (s) return s;
    if (!p->it[k].pins)
        return tr_fail(err, TR_E_ARG, "expert policy unpin: (layer %d, expert %d) is not pinned",
                       layer, expert);
    if (--p->it[k].pins == 0) {
        p->pinned_bytes -= p->it[k].bytes;
        if (is_adaptive(p) && p->it[k].ev_pos != NOT_IN_HEAP)
            p->ev_pin[p->it[k].ev_pos] = 0;
        else
            evictable_add(p, k);
        p->cand_valid = false;
    }
    return TR_OK;
}

tr_status tr_policy_remove(tr_policy *p, int32_t layer, int32_t expert, tr_error *err) {
    uint32_t k = 0;
    tr_status s = check_key(p, layer, expert, &k, "remove", err);
    if (s) return s;
    if (!p->it[k].bytes)
        return tr_fail(err, TR_E_ARG,
                       "expert policy remove: (layer %d, expert %d) is not "
                       "resident",
                       layer, expert);
    if (p->it[k].pins)
        return tr_fail(err, TR_E_ARG, "expert policy remove: (layer %d, expert %d) is pinned",
                       layer, expert);
    if (p->prot[k])
        unprotect(p, k);
    else
        evictable_del(p, k);
    p->used -= p->it[k].bytes;
    p->layer_used[layer] -= p->it[k].bytes;
    p->it[k].bytes = 0;
    p->n_resident--;
    return TR_OK;
}

tr_status tr_policy_protect(tr_policy *p, int32_t layer, const int32_t *experts, int32_t n,
                            tr_error *err) {
    if (layer < 0 || layer >= p->n_layer || n < 0 || (n && !experts))
        return tr_fail(err, TR_E_ARG, "expert policy protect: layer %d, %d experts", layer, n);
    for (int32_t i = 0; i < n; i++)
        if (experts[i] < 0 || experts[i] >= p->n_expert)
            return tr_fail(err, TR_E_ARG, "expert policy protect: expert %d is outside 0..%d",
                           experts[i], p->n_expert - 1);
    unprotect_all(p);
    p->cand_valid = false;
    for (int32_t i = 0; i < n && p->n_prot < (uint32_t)p->n_expert; i++) {
        const uint32_t k = (uint32_t)layer * (uint32_t)p->n_expert + (uint32_t)experts[i];
        if (!p->it[k].bytes || p->it[k].pins || p->prot[k]) continue;
        evictable_del(p, k);
        p->prot[k] = 1;
        p->prot_list[p->n_prot++] = k;
    }
    return TR_OK;
}

void tr_policy_prefetch(const tr_policy *p, int32_t layer, const int32_t *experts, int32_t n) {
    if (layer < 0 || layer >= p->n_layer) return;
    const size_t base = (size_t)layer * (size_t)p->n_expert;
    for (int32_t i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= p->n_expert) continue;
        const size_t k = base + (size_t)experts[i];
        __builtin_prefetch(&p->it[k], 1);
        __builtin_prefetch(&p->key[k], 1);
        if (uses_heaps(p)) __builtin_prefetch(&p->pos[k], 1);
    }
    if (!uses_heaps(p)) return;
    /* a sift compares keys of this layer along its heap: both, whole (64-byte lines) */
    const char *h0 = (const char *)(p->heap + base), *k0 = (const char *)(p->key + base);
    const size_t hb = (size_t)p->n_expert * sizeof *p->heap;
    const size_t kb = (size_t)p->n_expert * sizeof *p->key;
    for (size_t o = 0; o < hb; o += 64) __builtin_prefetch(h0 + o, 1);
    for (size_t o = 0; o < kb; o += 64) __builtin_prefetch(k0 + o, 1);
}

uint64_t tr_policy_resident_bytes(const tr_policy *p, int32_t layer, int32_t expert) {
    if (layer < 0 || layer >= p->n_layer || expert < 0 || expert >= p->n_expert) return 0;
    return p->it[(size_t)layer * (size_t)p->n_expert + (size_t)expert].bytes;
}

void tr_policy_get_stats(const tr_policy *p, tr_policy_stats *out) {
    *out = p->st;
    out->used_bytes = p->used;
    out->pinned_bytes = p->pinned_bytes;
    out->budget_bytes = p->budget;
    out->resident_items = p->n_resident;
    if (p->duel) tr_duel_lead_steps(p->duel, out->lead_steps);
}
