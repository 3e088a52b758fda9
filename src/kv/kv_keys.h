/*
 * Tiered's low-precision key copy and host scoring, and the tail estimate built on its scores.
 *
 * Key copy: each key head is divided channel-wise by a per-(layer, KV head) scale and stored in
 * Q8_0 or Q4_0 blocks of 32 channels. The per-channel scale equalises the few large channels real
 * keys have (they would otherwise set the block scale and flatten the others); the query is
 * multiplied by the same scale, so q.k = (q*s).(k/s) and scoring is one kernel-table dot product
 * per token and head. The scales come from the first page of each layer (absmax per channel,
 * floored at 1% of the largest so dead channels are not blown up); before it is complete the copy
 * uses scale 1, and at completion the page is quantized again.
 *
 * The host's copy holds every position, or (--kv-host-keys, with the agent) the sinks and a ring
 * of the newest positions: hk_sink rows for [0, hk_sink), then hk_ring rows for the others
 * (position p in row hk_sink + (p - hk_sink) % hk_ring), holding [len - hk_ring, len).
 *
 * Aggregation into one score per token (tr_kv_agg): PSUM, the default, is the attention mass a
 * token carries summed over heads (each head's softmax over the visible keys, the sinks and the
 * window included); test_kv_select measures it best on synthetic keys and on SmolLM2 at 4K, alpha 0.1 its
 * perplexity is +1.3% over full against +4.2% for MAX and +3.0% for SUM. PSUM keeps two groups'
 * softmax statistics apart (group A: what the storage agent scores when there is one) and merges
 * them (score.h), so that the host alone and the host with the agent score bit for bit alike.
 */
#ifndef TR_KV_KV_KEYS_H
#define TR_KV_KV_KEYS_H

#include "kv/kv_store.h"

typedef struct tr_kv_keys {
    const tr_kv_shape *shape;
    const tr_kernels *kern;
    int32_t group;     /* query heads per KV head */
    tr_type qtype;     /* TR_TYPE_Q8_0 or TR_TYPE_Q4_0 */
    int32_t hdk_pad;   /* head_dim_k rounded up to 32 */
    size_t qrow;       /* bytes of one key head's low-precision row */
    size_t q8row;      /* bytes of one query head in Q8_0 */
    int32_t hk_sink, hk_ring, hk_rows;
    bool hk_wrap;      /* the ring is smaller than the context */
    uint8_t *qk;       /* [n_layer][n_kv][hk_rows][qrow] */
    float *eq;         /* [n_layer][n_kv][hdk_pad] per-channel scale the copy was divided by */
    bool *calibrated;  /* [n_layer] eq came from the first page (else all ones) */
    tr_kv_eq eq_mode;
    tr_kv_agg agg;
    float *qf;         /* [n_head][hdk_pad] the query times eq; staging of the copies' rows */
    uint8_t *q8;       /* [n_head][q8row] the query quantized */
    float *hs;         /* [n_head][n_ctx] per-head scaled scores (then exponentials) of a row */
    float *hz;         /* [n_head][2] per-head group factors (PSUM) or max (PMAX) */
    /* the tail (tail_bits): a low-precision copy of the values, same block formats, and the
     * current row's estimate of what the unselected tokens add per query head: tail_o[h] (their
     * share-weighted sum of values, hdv_pad floats) and tail_e[h] (their share) */
    tr_type vtype;
    int32_t hdv_pad;
    size_t vrow;       /* 0: no tail */
    uint8_t *qv;       /* [n_layer][n_kv][n_ctx][vrow] */
    float *tail_o, *tail_e;
    int32_t *tail_idx, *tail_n; /* [n_kv][n_ctx]: the positions summed per KV head; their count */
    float tail_min;
    int32_t tail_every; /* the test seam: also sum every tail_every-th unselected token */
    bool tail_row;      /* the estimate belongs to the row just selected */
    uint64_t tail_cand, tail_kept; /* unselected (token, KV head) pairs, and those summed */
} tr_kv_keys;

/* allocation from the plan */
tr_status tr_kv_keys_init(tr_kv_keys *K, const tr_kv_shape *s, const tr_kv_params *p,
                          const tr_kv_plan *pl, const tr_kernels *kern, uint64_t *total,
                          tr_error *err);
void tr_kv_keys_free(tr_kv_keys *K);

/* the row of position pos in the host's key copy */
static inline size_t tr_kv_hk_index(const tr_kv_keys *K, int32_t pos) {
    if (!K->hk_wrap || pos < K->hk_sink) return (size_t)pos;
    return (size_t)K->hk_sink + (size_t)(pos - K->hk_sink) % (size_t)K->hk_ring;
}
static inline uint8_t *tr_kv_qk_row(const tr_kv_keys *K, int32_t layer, size_t g, int32_t pos) {
    const size_t nkv = (size_t)K->shape->n_head_kv;
    return K->qk + (((size_t)layer * nkv + g) * (size_t)K->hk_rows + tr_kv_hk_index(K, pos)) *
                       K->qrow;
}
/* the lowest position past the sinks the copy holds, for a layer of len positions */
static inline int32_t tr_kv_hk_lo(const tr_kv_keys *K, int32_t len) {
    if (!K->hk_wrap) return 0;
    return len - K->hk_ring > K->hk_sink ? len - K->hk_ring : K->hk_sink;
}
/* how many of the last of the ascending positions cand[0, n), at most `most`, the copy holds:
 * the host's part of a split */
static inline int32_t tr_kv_hk_held(const tr_kv_keys *K, int32_t len, const int32_t *cand,
                                    int32_t n, int32_t most) {
    const int32_t lo = tr_kv_hk_lo(K, len);
    int32_t k = 0;
    while (k < most && k < n && cand[n - 1 - k] >= lo) k++;
    return k;
}
static inline float *tr_kv_eq_of(const tr_kv_keys *K, int32_t layer) {
    return K->eq + (size_t)layer * (size_t)K->shape->n_head_kv * (size_t)K->hdk_pad;
}

/* a token's key into the copy (and value into the value copy) */
void tr_kv_quant_key(tr_kv_keys *K, int32_t layer, int32_t pos, const uint8_t *rec);
void tr_kv_quant_value(tr_kv_keys *K, int32_t layer, int32_t pos, const uint8_t *rec);
/* the per-channel scales from a layer's first page (hot) and that page quantized again */
void tr_kv_calibrate(tr_kv_keys *K, const tr_kv_store *st, int32_t layer);

/* Aggregated low-precision scores of positions cand[0..n) for the query row q ([n_head][hdk]);
 * prepares the quantized query itself. scale: the attention's score scale. PSUM: entries
 * [0, n_a) are group A, the rest group B. */
void tr_kv_score_tokens(tr_kv_keys *K, tr_pool *pool, int32_t layer, const float *q, float scale,
                        const int32_t *cand, int32_t n, int32_t n_a, tr_kv_agg agg, float *out);
/* the pieces: the query quantized into K->q8; per-head scaled scores of cand[i0..i1) into K->hs
 * rows of `stride` */
void tr_kv_prepare_query(tr_kv_keys *K, int32_t layer, const float *q);
void tr_kv_score_heads(tr_kv_keys *K, tr_pool *pool, int32_t layer, const int32_t *cand,
                       int32_t i0, int32_t i1, size_t stride, float scale);

/* the tail: after a PSUM selection (mark set on the chosen, per-head shares in K->hs), the
 * unselected candidates' share and share-weighted value sum per query head; exc: n_ctx scratch */
void tr_kv_tail_estimate(tr_kv_keys *K, tr_pool *pool, int32_t layer, const int32_t *cand,
                         int32_t n_cand, int32_t n_all, int32_t n_a, const uint8_t *mark,
                         int32_t *exc);

#endif
