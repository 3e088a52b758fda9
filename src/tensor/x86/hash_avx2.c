/*
 * XXH3-64 compiled for AVX2: libxxhash's header in its documented inline mode, built with this
 * file's -mavx2 so that the library selects its AVX2 accumulate loop (Debian builds the shared
 * library for the x86-64 baseline, SSE2). Same digests as the library's; src/kv/kv_cold.c picks
 * this one at start when the CPU has AVX2, and tests compare the two.
 */
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t tr_xxh3_avx2(const void *data, size_t len, uint64_t seed);

uint64_t tr_xxh3_avx2(const void *data, size_t len, uint64_t seed) {
    return XXH3_64bits_withSeed(data, len, seed);
}
