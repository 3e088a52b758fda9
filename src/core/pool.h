/*
 * Persistent thread pool. Workers are created once and wait for work by spinning briefly, then
 * sleeping on a condition variable, so back-to-back calls within a token cost no thread creation
 * and little wake-up latency, while an idle pool burns no CPU.
 *
 * One caller at a time: tr_pool_run is not re-entrant and must not be called concurrently on the
 * same pool (a model's forward pass owns its pool while it runs).
 */
#ifndef TR_CORE_POOL_H
#define TR_CORE_POOL_H

#include <stdatomic.h>

#include "terrace.h"

/* fn runs once for every part ith in [0, nth), each on whichever thread claims it first (the
 * caller among them): a part may not depend on the thread it runs on */
typedef void (*tr_pool_fn)(void *ctx, int ith, int nth);

void tr_pool_run(tr_pool *p, tr_pool_fn fn, void *ctx);

/* static split of [0, n) into nth nearly equal ranges */
static inline void tr_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    *begin = n * ith / nth;
    *end = n * (ith + 1) / nth;
}

/* dynamic chunking: each call claims the next chunk of `chunk` items; false when none left */
static inline bool tr_claim(atomic_int_fast64_t *next, int64_t n, int64_t chunk, int64_t *begin,
                            int64_t *end) {
    const int64_t b = atomic_fetch_add_explicit(next, chunk, memory_order_relaxed);
    if (b >= n) return false;
    *begin = b;
    *end = b + chunk < n ? b + chunk : n;
    return true;
}

#endif
