/*
 * The monotonic clock every subsystem times itself by (thread-pool spins, I/O completions, the
 * KV step's phases, the storage agent's throttles), so that their nanoseconds add up.
 */
#ifndef TR_CORE_CLOCK_H
#define TR_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds */
static inline uint64_t tr_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
