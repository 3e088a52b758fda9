/*
 * What the host's tiered scoring and the storage agent share, so that both compute the same
 * scores from the same bytes and the agent selects exactly what host scoring selects: the page
 * format's trailer (the agent verifies the key copies it reads with it), the record hash, and the
 * per-head softmax statistics of a group of scores (the host scores one group, the agent the
 * other, and their statistics are merged into each head's share of the attention).
 */
#ifndef TR_KV_SCORE_H
#define TR_KV_SCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* tokens per cold page (and per quest page) */
#define TR_KV_PAGE 16

/* the trailer that ends every cold page */
typedef struct tr_kv_page_trailer {
    char magic[8]; /* "TRKVPAGE" */
    uint32_t layer, page, n_tokens, key_copy_bytes;
    uint64_t rec_hash[TR_KV_PAGE];
    uint64_t key_copy_hash;
    uint64_t hash; /* of the bytes above */
} tr_kv_page_trailer;
_Static_assert(sizeof(tr_kv_page_trailer) == 168, "the segment file format");

/* XXH3-64, the SIMD build chosen at start (the same digests either way) */
uint64_t tr_kv_hash64(const void *data, size_t len, uint64_t seed);

/* a page's key copy (kbytes) followed by its trailer, as read from storage: the trailer belongs
 * to (layer, page), is intact, and vouches for the key copy */
bool tr_kv_key_copy_ok(const uint8_t *key_copy, uint64_t kbytes, int32_t layer, int32_t page);

/* a group's max and sum of exp(score - max) of one head's n scores (replaced by those
 * exponentials) */
void tr_kv_group_stats(float *hs, int32_t n, float *m, double *z);
/* two groups' statistics merged into per-head factors c_a, c_b that turn each group's
 * exponentials into shares of the head's attention over both */
void tr_kv_group_merge(int32_t nh, const float *m_a, const double *z_a, const float *m_b,
                       const double *z_b, float *c_a, float *c_b);
/* a group's scores out[i] = sum over heads of hs[h][i] * c[h * c_stride], heads in order, for
 * i in [i0, i1) (hs rows of `stride`) */
void tr_kv_group_score(const float *hs, size_t stride, int32_t nh, const float *c, size_t c_stride,
                       int32_t i0, int32_t i1, float *out);

/* the larger of two scores or shares (never NaN): fmaxf is a libm call without
 * -ffinite-math-only, and the per-token loops take most of their time in it */
static inline float tr_kv_maxf(float a, float b) { return a > b ? a : b; }

#endif
