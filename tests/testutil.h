/* Tiny test helpers shared by the C tests: checks that count failures, a seeded RNG. */
#ifndef TR_TESTUTIL_H
#define TR_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tu_failures = 0;

#define TU_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            tu_failures++;                                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* exit status for main(): 0 when every check passed */
static inline int tu_result(const char *name) {
    if (tu_failures) fprintf(stderr, "%s: %d check(s) FAILED\n", name, tu_failures);
    else printf("%s: all checks passed\n", name);
    return tu_failures ? 1 : 0;
}

/* splitmix64: deterministic across platforms */
typedef struct { uint64_t s; } tu_rng;
static inline uint64_t tu_next(tu_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static inline float tu_uniform(tu_rng *r) {
    return (float)((double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}
/* roughly normal (sum of uniforms), std ~1 */
static inline float tu_normal(tu_rng *r) {
    float s = 0;
    for (int i = 0; i < 6; i++) s += tu_uniform(r);
    return s * 0.7071f;
}

#endif
