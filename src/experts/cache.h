/*
 * The expert cache: routed expert weights live in a byte-budgeted arena that terrace owns, filled
 * by explicit reads of each expert's exact byte ranges in the GGUF (never touched through mmap),
 * evicted by policy (src/experts/policy.h), read by a persistent I/O worker pool so a layer's
 * missing experts load in parallel while the experts already resident are being computed.
 *
 * Shape of the data: a MoE layer l has up to TR_EXPERT_MAX_PARTS stacked tensors ("parts":
 * ffn_gate_exps, ffn_up_exps, ffn_down_exps and, for gpt-oss, their biases). Expert e of part p
 * is the contiguous byte range [offset + e * stride, offset + e * stride + bytes) of one shard
 * file (GGUF-FACTS §3.11). One cache entry = one (layer, expert) with all its parts.
 *
 * Threading: one compute thread drives acquire/next_ready/release for a layer at a time (the
 * model's forward pass holds the model lock); I/O workers run concurrently. Several sessions of
 * one model share one cache through that model; the cache's own lock makes the bookkeeping safe
 * if two models ever share a cache (tested under TSan).
 */
#ifndef TR_EXPERTS_CACHE_H
#define TR_EXPERTS_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "terrace.h"

#define TR_EXPERT_MAX_PARTS 6
#define TR_EXPERT_MAX_TOPK 64

typedef struct tr_expert_part {
    int fd;              /* shard file, opened O_RDONLY by the GGUF reader; borrowed: open until
                            tr_expert_cache_free (the cache opens its own O_DIRECT fd by path) */
    const char *path;    /* for messages */
    uint64_t offset;     /* file offset of expert 0 of this part */
    uint64_t stride;     /* bytes from one expert to the next (= bytes for stacked tensors) */
    uint64_t bytes;      /* bytes of one expert of this part */
} tr_expert_part;

typedef struct tr_expert_layer {
    int n_parts;                              /* 0: not a MoE layer */
    tr_expert_part part[TR_EXPERT_MAX_PARTS]; /* order defined by the caller (gate, up, down, ...) */
} tr_expert_layer;

typedef struct tr_expert_layout {
    int32_t n_layer, n_expert, n_expert_used; /* n_expert_used = top-k, for the cliff check */
    const tr_expert_layer *layers;            /* [n_layer] */
} tr_expert_layout;

typedef struct tr_expert_cache_params {
    uint64_t budget_bytes;  /* arena size; the arena never exceeds it */
    const char *policy;     /* "auto" (default), "lru", "lfu", ... (src/experts/policy.h) */
    int io_threads;         /* <= 0: 4 */
    bool no_direct_io;      /* true: buffered pread only (default: O_DIRECT where the FS allows) */
    uint64_t seed;          /* for the random policy */
    uint32_t read_chunk;    /* bytes per read operation (4 KiB multiple, >= 64 KiB); 0: 512 KiB */
} tr_expert_cache_params;

typedef struct tr_expert_cache tr_expert_cache;

/* The cache copies what it needs from the layout (paths included): it may be freed after create.
 * Checks the budget against the layout before allocating anything: below one layer's top-k
 * experts (the minimum: a layer must hold all of its selected experts at once) it fails with
 * TR_E_BUDGET naming the minimum. Below one token's working set (all layers x top-k) it succeeds
 * but *warning is set to a message with the numbers (LRU cliff; "auto" then avoids LRU). */
tr_status tr_expert_cache_create(const tr_expert_layout *layout, const tr_expert_cache_params *p,
                                 tr_expert_cache **out, char *warning, size_t warning_cap,
                                 tr_error *err);
void tr_expert_cache_free(tr_expert_cache *c);

/* smallest legal budget for this layout (one layer's top-k experts, allocation rounding
 * included: a slot holds each part in whole 4 KiB pages plus one page for O_DIRECT alignment,
 * so top-k x the largest layer's slot) and one token's working set (the same slots, every MoE
 * layer). The budget bounds the arena only; bookkeeping (tens of bytes per expert of the model
 * and per slot) is outside it. */
uint64_t tr_expert_cache_min_budget(const tr_expert_layout *layout);
uint64_t tr_expert_cache_token_working_set(const tr_expert_layout *layout);

/* One layer's request. acquire pins the n experts (so nothing this layer uses can be evicted),
 * counts hits/misses, starts reads for the misses on the I/O pool and returns at once. Then
 * next_ready hands out the experts one by one as they become resident — resident ones first —
 * so compute overlaps I/O; it blocks only when every remaining expert is still being read.
 * release unpins. A read error (EIO, short read: a file truncated under us) makes next_ready
 * fail with a message naming the file, layer, expert and offset; the entry is not kept. */
typedef struct tr_expert_request {
    int32_t layer, n;
    int32_t experts[TR_EXPERT_MAX_TOPK];
    /* filled as experts become ready: part pointers into the arena, valid until release; each
     * sits at its file offset's position within a 4 KiB page, as in an mmap of the file */
    const void *data[TR_EXPERT_MAX_TOPK][TR_EXPERT_MAX_PARTS];
    /* internal bookkeeping */
    uint64_t handed;  /* bitmask of indices already returned by next_ready (64 = MAX_TOPK) */
    int32_t slot[TR_EXPERT_MAX_TOPK];
} tr_expert_request;

tr_status tr_expert_cache_acquire(tr_expert_cache *c, int32_t layer, const int32_t *experts,
                                  int32_t n, tr_expert_request *req, tr_error *err);
/* Rules for acquire: experts distinct and in range, 1 <= n <= tr_expert_cache_max_request (at least
 * n_expert_used for any legal budget; split a prefill's union of experts into groups of that
 * size). When other requests (other threads) pin the slots this one needs, acquire waits for
 * their release; so a thread must not hold a request while acquiring a second one unless the
 * budget holds both. On failure req->n is 0 and release is a no-op. */
int32_t tr_expert_cache_max_request(const tr_expert_cache *c, int32_t layer);
/* index (0..n-1) of the next ready expert of req, -1 when all were handed out */
tr_status tr_expert_cache_next_ready(tr_expert_cache *c, tr_expert_request *req, int32_t *index,
                                     tr_error *err);
void tr_expert_cache_release(tr_expert_cache *c, tr_expert_request *req);

/* Router information for router-aware policies: this layer's selected experts and their weights
 * (and, when available, the full probability vector over n_expert). Each call is one visit of the
 * layer for the policy (LRFU/"layered" age a layer's experts by its visits), so call it once per
 * layer step: for a prefill batch, pass every row's top-k in one call (duplicates are fine). A
 * layer step without a call is counted by its first acquire. */
void tr_expert_cache_observe(tr_expert_cache *c, int32_t layer, const int32_t *experts,
                             const float *weights, int32_t n, const float *probs);

/* Prefetch: start reading these experts of `layer` if absent and there is room without evicting
 * anything pinned; never blocks. Counted separately so its accuracy and cost can be reported. The
 * policy admits them without counting an access (the acquire that uses one does). */
void tr_expert_cache_prefetch(tr_expert_cache *c, int32_t layer, const int32_t *experts, int32_t n);

/* The same for the experts of the first min(n, 64) whose bit is set in `read`; returns the mask
 * of those (any bit) that were absent (neither resident nor loading) when asked, so a caller can
 * learn how often an absent prediction is then used without reading it. */
uint64_t tr_expert_cache_prefetch_some(tr_expert_cache *c, int32_t layer, const int32_t *experts,
                                       int32_t n, uint64_t read);

/* Router lookahead: keeps these resident experts of `layer` (the ones the next layer is predicted
 * to use) from being evicted until the next layer step begins (the next observe or acquire of
 * another layer), unless nothing else can make room; reads nothing. Never blocks. */
void tr_expert_cache_protect(tr_expert_cache *c, int32_t layer, const int32_t *experts, int32_t n);

/* Whether (layer, expert) is in the cache now: resident, or being read (an acquire would count it
 * a hit). A snapshot: another thread may change it right after. */
bool tr_expert_cache_is_resident(const tr_expert_cache *c, int32_t layer, int32_t expert);

typedef struct tr_expert_stats {
    uint64_t hits, misses;           /* acquire lookups; a hit is resident or already being read
                                        (a prefetch in flight), a miss starts a read */
    uint64_t bytes_read;             /* from storage, demand + prefetch */
    uint64_t reads;                  /* read operations issued */
    uint64_t io_wait_ns;             /* compute thread blocked in next_ready (and in acquire,
                                        waiting for slots pinned by other requests) */
    uint64_t read_ns;                /* I/O workers' time in pread, summed over workers */
    uint64_t resident_bytes;         /* occupied arena bytes (slots holding or loading an expert) */
    uint64_t payload_bytes;          /* expert bytes in those slots (resident_bytes less slack) */
    uint64_t arena_bytes;            /* the arena's one allocation: <= budget_bytes */
    uint64_t budget_bytes;
    uint32_t n_slots, n_classes;     /* arena slots, slot size classes (cache.c) */
    uint64_t failed_reads;           /* experts dropped after a read error */
    uint64_t io_busy_ns;             /* wall time with at least one read in flight */
    uint64_t prefetch_issued, prefetch_used, prefetch_wasted_bytes;
    uint64_t evictions;
    uint64_t policy_ns;              /* compute thread's time in the policy's decisions (routes,
                                        acquires, releases, protection: the policy's calls and the
                                        bookkeeping around them, under the lock) */
    uint64_t policy_hidden_ns;       /* the part of policy_ns spent while the thread waited for
                                        a read no read finished during (off the decode path) */
    uint64_t protected_evictions;    /* lookahead-protected experts evicted (nothing else left) */
    bool direct_io;                  /* O_DIRECT in use (for every file; false when any file
                                        fell back to buffered pread) */
    const char *policy;              /* the policy in effect ("auto" resolved) */
} tr_expert_stats;

void tr_expert_cache_stats(const tr_expert_cache *c, tr_expert_stats *out);

#endif
