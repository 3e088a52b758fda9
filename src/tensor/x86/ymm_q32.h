/*
 * 256-bit dot products for the 32-element block types: Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 against
 * Q8_0 activations and Q4_1, Q5_1 against Q8_1 (GGUF-FACTS §2.2, §2.4). One block is one
 * register of 32 byte codes; its integer dot product with the activation block is exact (byte
 * products summed in int32), then scaled by the two block scales in f32 like the reference.
 *
 * Signed codes use the sign trick: |w| (unsigned) times sign(w)·a (signed) equals w·a, so one
 * unsigned-by-signed byte multiply serves; |w| <= 128 and |a| <= 127 keep every pair sum below
 * the int16 saturation of maddubs. The weight block is decoded once and reused for up to
 * TR_MAX_NC activation rows (vec_dot_nc).
 */
#ifndef TR_TENSOR_X86_YMM_Q32_H
#define TR_TENSOR_X86_YMM_Q32_H

#include "tensor/x86/simd_common.h"

#if defined(__x86_64__)

enum { Q32_Q4_0, Q32_Q5_0, Q32_Q8_0, Q32_IQ4_NL, Q32_MXFP4, Q32_Q4_1, Q32_Q5_1 };

TR_ALWAYS_INLINE size_t q32_wbytes(int kind) {
    switch (kind) {
    case Q32_Q4_0: return sizeof(tr_blk_q4_0);
    case Q32_Q5_0: return sizeof(tr_blk_q5_0);
    case Q32_Q8_0: return sizeof(tr_blk_q8_0);
    case Q32_IQ4_NL: return sizeof(tr_blk_iq4_nl);
    case Q32_MXFP4: return sizeof(tr_blk_mxfp4);
    case Q32_Q4_1: return sizeof(tr_blk_q4_1);
    default: return sizeof(tr_blk_q5_1);
    }
}

TR_ALWAYS_INLINE bool q32_with_min(int kind) { return kind == Q32_Q4_1 || kind == Q32_Q5_1; }

/* One weight block -> its 32 byte codes in element order: signed values for the Q8_0-activation
 * kinds, 0..31 unsigned for Q4_1/Q5_1. */
TR_ALWAYS_INLINE __m256i q32_codes(int kind, const char *blk, __m256i table) {
    switch (kind) {
    case Q32_Q4_0:
        return _mm256_sub_epi8(unpack_nibbles32(((const tr_blk_q4_0 *)blk)->qs),
                               _mm256_set1_epi8(8));
    case Q32_Q5_0: {
        const tr_blk_q5_0 *x = (const tr_blk_q5_0 *)blk;
        /* q - 16 with q = nibble + 16·bit: bit set gives the nibble, bit clear gives nibble - 16,
         * which is the nibble with the top four bits set (two's complement) */
        const __m256i clear = _mm256_andnot_si256(expand_bits32(x->qh), _mm256_set1_epi8(-16));
        return _mm256_or_si256(unpack_nibbles32(x->qs), clear);
    }
    case Q32_Q8_0: return _mm256_loadu_si256((const __m256i *)((const tr_blk_q8_0 *)blk)->qs);
    case Q32_IQ4_NL: return lookup_nibbles32(((const tr_blk_iq4_nl *)blk)->qs, table);
    case Q32_MXFP4: return lookup_nibbles32(((const tr_blk_mxfp4 *)blk)->qs, table);
    case Q32_Q4_1: return unpack_nibbles32(((const tr_blk_q4_1 *)blk)->qs);
    default: {
        const tr_blk_q5_1 *x = (const tr_blk_q5_1 *)blk;
        const __m256i hi = _mm256_and_si256(expand_bits32(x->qh), _mm256_set1_epi8(16));
        return _mm256_or_si256(unpack_nibbles32(x->qs), hi);
    }
    }
}

/* the weight block's scale d and, for Q4_1/Q5_1, its min m */
TR_ALWAYS_INLINE float q32_scale(int kind, const char *blk, float *m) {
    if (kind == Q32_MXFP4) return tr_e8m0_to_f32_half(((const tr_blk_mxfp4 *)blk)->e);
    if (q32_with_min(kind)) *m = x86_f16(((const tr_blk_q4_1 *)blk)->m); /* Q5_1: same place */
    return x86_f16(((const tr_blk_q4_0 *)blk)->d); /* every other kind starts with d */
}

TR_ALWAYS_INLINE __m256i q32_table(int kind) {
    if (kind == Q32_IQ4_NL) return table16_256(tr_kvalues_iq4nl);
    if (kind == Q32_MXFP4) return table16_256(tr_kvalues_mxfp4);
    return _mm256_setzero_si256();
}

/* int32 lanes of the block dot: codes (from q32_codes; uq = |codes| for the signed kinds) with
 * one activation block. Signed codes use the sign trick: |w| times sign(w)·a equals w·a. */
TR_ALWAYS_INLINE __m256i q32_dot(int kind, __m256i q, __m256i uq, const int8_t *aqs) {
    const __m256i y = _mm256_loadu_si256((const __m256i *)aqs);
    if (q32_with_min(kind)) return dot_us8(q, y);
    return dot_us8(uq, _mm256_sign_epi8(y, q));
}

TR_ALWAYS_INLINE size_t q32_abytes(int kind) {
    return q32_with_min(kind) ? sizeof(tr_blk_q8_1) : sizeof(tr_blk_q8_0);
}

/* One block with scalar scales (row tails of fewer than 8 blocks). msum collects the Q4_1/Q5_1
 * min terms m·s (s = d_a·Σa as stored in the Q8_1 block). */
TR_ALWAYS_INLINE void q32_step(const int kind, const int nc, const char *wblk, const char *const *a,
                               int64_t b, __m256i table, __m256 *acc, float *msum) {
    float m = 0.0f;
    const float d = q32_scale(kind, wblk, &m);
    const __m256i q = q32_codes(kind, wblk, table);
    const __m256i uq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        /* Q8_0 and Q8_1 blocks both start with d; Q8_1 has s next, then the codes */
        const char *y = a[j] + (size_t)b * q32_abytes(kind);
        const int8_t *yq =
            q32_with_min(kind) ? ((const tr_blk_q8_1 *)y)->qs : ((const tr_blk_q8_0 *)y)->qs;
        const __m256i p = q32_dot(kind, q, uq, yq);
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d * x86_f16(tr_load_u16(y))),
                                 _mm256_cvtepi32_ps(p), acc[j]);
        if (q32_with_min(kind)) msum[j] += m * x86_f16(tr_load_u16(y + 2));
    }
}

/* The first 4 bytes of 8 consecutive blocks `stride` bytes apart, as 8 dwords, by eight scalar
 * loads inserted into two halves. Not a vpgatherdd: on AMD cores a gather is slow to issue, it is
 * the first instruction to touch each group's cache lines and the whole group's block work queues
 * behind it (measured: a quarter of the Q4_0 matvec's time); plain loads issue at once and the
 * inserts overlap with the previous group. Every dword read lies inside its block (>= 17 bytes). */
TR_ALWAYS_INLINE __m256i load8_head(const char *p, size_t stride) {
    const __m128i lo =
        _mm_setr_epi32((int)tr_load_u32(p), (int)tr_load_u32(p + stride),
                       (int)tr_load_u32(p + 2 * stride), (int)tr_load_u32(p + 3 * stride));
    const __m128i hi =
        _mm_setr_epi32((int)tr_load_u32(p + 4 * stride), (int)tr_load_u32(p + 5 * stride),
                       (int)tr_load_u32(p + 6 * stride), (int)tr_load_u32(p + 7 * stride));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* low 16 bits of 8 dwords, as f16, -> 8 floats */
TR_ALWAYS_INLINE __m256 f16_lo_to_f32(__m256i v) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0x08);
    return _mm256_cvtph_ps(_mm256_castsi256_si128(p));
}

/* low byte of 8 dwords, as an E8M0 exponent, -> 2^(e-128) exactly like tr_e8m0_to_f32_half */
TR_ALWAYS_INLINE __m256 e8m0_lo_to_f32(__m256i v) {
    const __m256i e = _mm256_and_si256(v, _mm256_set1_epi32(0xFF));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e); /* e = 0, 1 */
    const __m256i is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny));
}

/* accumulators per column in the 8-block groups: 4 independent FMA chains (one column alone would
 * wait on the FMA latency), the same for every column count, so that a row's result does not
 * depend on how many rows are computed with it: a server batching requests gives each the answer
 * it would get alone, and one column keeps the order the parity references were recorded with */
#define Q32_NACC(nc) 4

TR_ALWAYS_INLINE __m256 q32_acc_sum(__m256 (*acc)[TR_MAX_NC], int j) {
    return _mm256_add_ps(_mm256_add_ps(acc[0][j], acc[1][j]), _mm256_add_ps(acc[2][j], acc[3][j]));
}

/* Eight blocks b..b+7. The 8 weight scales and, per column, the 8 activation scales are
 * converted at once (one 8-dword load each) and their products stored, so each block's FMA takes
 * its scale as a broadcast from memory: a per-block scalar f16 conversion and register broadcast
 * would cost about as much as the block's dot product. */
TR_ALWAYS_INLINE void q32_group8(const int kind, const int nc, const char *w, const char *const *a,
                                 int64_t b, __m256i table, __m256 (*acc)[TR_MAX_NC], __m256 *mvec) {
    const int wb = (int)q32_wbytes(kind), ab = (int)q32_abytes(kind);
    const char *w0 = w + (size_t)b * (size_t)wb;
    prefetch_block(w0, 8 * (size_t)wb); /* once per cache line, not per 17..34-byte block */
    const __m256i gw = load8_head(w0, (size_t)wb);
    const __m256 dw = kind == Q32_MXFP4 ? e8m0_lo_to_f32(gw) : f16_lo_to_f32(gw);
    float sc[TR_MAX_NC][8];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        const __m256i ga = load8_head(a[j] + (size_t)b * (size_t)ab, (size_t)ab);
        _mm256_storeu_ps(sc[j], _mm256_mul_ps(dw, f16_lo_to_f32(ga)));
        if (q32_with_min(kind)) /* Σ m·s: weight min (high half) times activation s (high half) */
            mvec[j] = _mm256_fmadd_ps(f16_lo_to_f32(_mm256_srli_epi32(gw, 16)),
                                      f16_lo_to_f32(_mm256_srli_epi32(ga, 16)), mvec[j]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const char *blk = w0 + (size_t)k * (size_t)wb;
        const __m256i q = q32_codes(kind, blk, table);
        const __m256i uq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const char *y = a[j] + (size_t)(b + k) * (size_t)ab;
            const int8_t *yq =
                q32_with_min(kind) ? ((const tr_blk_q8_1 *)y)->qs : ((const tr_blk_q8_0 *)y)->qs;
            const __m256 p = _mm256_cvtepi32_ps(q32_dot(kind, q, uq, yq));
            /* independent accumulators: a single chain would wait on the FMA latency */
            __m256 *ak = &acc[k % Q32_NACC(nc)][j];
            *ak = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[j][k]), p, *ak);
        }
    }
}

TR_ALWAYS_INLINE void q32_impl(const int kind, int64_t n, const int nc, float *restrict s,
                               size_t s_stride, const void *restrict w, const void *restrict va,
                               size_t a_stride) {
    const int64_t nb = n / TR_QK32;
    const size_t wb = q32_wbytes(kind);
    const __m256i table = q32_table(kind);
    const char *a[TR_MAX_NC];
    __m256 acc[4][TR_MAX_NC], mvec[TR_MAX_NC];
    float msum[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const char *)va + (size_t)j * a_stride;
        acc[0][j] = acc[1][j] = acc[2][j] = acc[3][j] = mvec[j] = _mm256_setzero_ps();
        msum[j] = 0.0f;
    }
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) q32_group8(kind, nc, w, a, b, table, acc, mvec);
    for (; b < nb; b++)
        q32_step(kind, nc, (const char *)w + (size_t)b * wb, a, b, table, acc[0], msum);
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++)
        s[(size_t)j * s_stride] = hsum_ps256(_mm256_add_ps(q32_acc_sum(acc, j), mvec[j])) + msum[j];
}

/* ------------------------------------------------------------------ with activation side tables */

/* Activation side tables (kernels.h): block scales as f32, and the code sums (Q8_0) or the
 * stored s (Q8_1). Built once per activation row by tr_matmul. */
static __attribute__((unused)) void ymm_act_side_q8_0(const void *restrict aq, int64_t nb,
                                                      int64_t b0, int64_t b1,
                                                      float *restrict side) {
    const tr_blk_q8_0 *y = aq;
    float *d = side, *second = side + nb;
    for (int64_t b = b0; b < b1; b++) {
        d[b] = x86_f16(y[b].d);
        /* bias the bytes to unsigned, sum them with psadbw, remove the bias */
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)),
                                            _mm256_setzero_si256());
        const __m128i t =
            _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
        const int sum = (int)(_mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1)) - 32 * 128;
        second[b] = (float)sum;
    }
}

static __attribute__((unused)) void ymm_act_side_q8_1(const void *restrict aq, int64_t nb,
                                                      int64_t b0, int64_t b1,
                                                      float *restrict side) {
    const tr_blk_q8_1 *y = aq;
    float *d = side, *second = side + nb;
    for (int64_t b = b0; b < b1; b++) {
        d[b] = x86_f16(y[b].d);
        second[b] = x86_f16(y[b].s);
    }
}

/* With the activation code sums at hand, 4-bit and 5-bit codes with an offset are multiplied
 * unsigned (nibble, nibble + 16·bit, MXFP4 value + 12) and the offset is subtracted once per
 * block through the sums: Σ (u - off)·a = Σ u·a - off·Σ a. That saves the sign trick (two
 * instructions per block). Q8_0 and IQ4_NL keep it: their offsets would be 128. */
TR_ALWAYS_INLINE int q32_side_offset(int kind) {
    return kind == Q32_Q4_0 ? 8 : kind == Q32_Q5_0 ? 16 : kind == Q32_MXFP4 ? 12 : 0;
}

/* codes for the side kernels: unsigned for the offset kinds and Q4_1/Q5_1, as q32_codes else */
TR_ALWAYS_INLINE __m256i q32_side_codes(int kind, const char *blk, __m256i table) {
    switch (kind) {
    case Q32_Q4_0: return unpack_nibbles32(((const tr_blk_q4_0 *)blk)->qs);
    case Q32_Q5_0: {
        const tr_blk_q5_0 *x = (const tr_blk_q5_0 *)blk;
        const __m256i hi = _mm256_and_si256(expand_bits32(x->qh), _mm256_set1_epi8(16));
        return _mm256_or_si256(unpack_nibbles32(x->qs), hi);
    }
    case Q32_MXFP4: return lookup_nibbles32(((const tr_blk_mxfp4 *)blk)->qs, table);
    default: return q32_codes(kind, blk, table);
    }
}

TR_ALWAYS_INLINE __m256i q32_side_table(int kind) {
    if (kind == Q32_MXFP4) /* every value + 12: 0..24 */
        return _mm256_add_epi8(table16_256(tr_kvalues_mxfp4), _mm256_set1_epi8(12));
    return q32_table(kind);
}

/* int32 lanes of one block dot: unsigned codes directly, signed ones with the sign trick */
TR_ALWAYS_INLINE __m256i q32_side_dot(int kind, __m256i q, __m256i uq, const int8_t *aqs) {
    const __m256i y = _mm256_loadu_si256((const __m256i *)aqs);
    if (q32_side_offset(kind) || q32_with_min(kind)) return dot_us8(q, y);
    return dot_us8(uq, _mm256_sign_epi8(y, q));
}

TR_ALWAYS_INLINE const int8_t *q32_act_codes(int kind, const char *const *a, int j, int64_t b) {
    const char *y = a[j] + (size_t)b * q32_abytes(kind);
    return q32_with_min(kind) ? ((const tr_blk_q8_1 *)y)->qs : ((const tr_blk_q8_0 *)y)->qs;
}

/* Eight blocks b..b+7: weight scales by one 8-dword load, activation scales and second values read
 * from the side tables. cacc collects Σ d_w·d_a·(code sum) for the offset kinds and Σ m·s for
 * Q4_1/Q5_1. */
TR_ALWAYS_INLINE void q32_side_group8(const int kind, const int nc, const char *w,
                                      const char *const *a, const float *const *side, int64_t nb,
                                      int64_t b, __m256i table, __m256 (*acc)[TR_MAX_NC],
                                      __m256 *cacc) {
    const int wb = (int)q32_wbytes(kind);
    const char *w0 = w + (size_t)b * (size_t)wb;
    prefetch_block(w0, 8 * (size_t)wb);
    const __m256i gw = load8_head(w0, (size_t)wb);
    const __m256 dw = kind == Q32_MXFP4 ? e8m0_lo_to_f32(gw) : f16_lo_to_f32(gw);
    float sc[TR_MAX_NC][8];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        const __m256 scv = _mm256_mul_ps(dw, _mm256_loadu_ps(side[j] + b));
        _mm256_storeu_ps(sc[j], scv);
        const __m256 second = _mm256_loadu_ps(side[j] + nb + b);
        if (q32_side_offset(kind)) cacc[j] = _mm256_fmadd_ps(scv, second, cacc[j]);
        if (q32_with_min(kind)) /* weight min (high half of the loaded dword) times s */
            cacc[j] = _mm256_fmadd_ps(f16_lo_to_f32(_mm256_srli_epi32(gw, 16)), second, cacc[j]);
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        const __m256i q = q32_side_codes(kind, w0 + (size_t)k * (size_t)wb, table);
        const __m256i uq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const __m256 p =
                _mm256_cvtepi32_ps(q32_side_dot(kind, q, uq, q32_act_codes(kind, a, j, b + k)));
            __m256 *ak = &acc[k % Q32_NACC(nc)][j];
            *ak = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[j][k]), p, *ak);
        }
    }
}

/* The last r < 8 blocks b..b+r-1 of a row of at least 8 (r a constant after inlining): the same
 * products and sums in the same order as the one-block-at-a-time loop (every block into acc[0],
 * the code-sum terms into csum one after the other), with the weight scales converted and
 * multiplied by the activation scales eight at a time as in q32_side_group8 instead of one
 * scalar conversion per block. Only the r heads inside the row are read; the 8 activation scales
 * loaded from side + b lie inside the row's table (b + 8 <= nb + 8 - r <= 2·nb for nb >= 8). */
TR_ALWAYS_INLINE void q32_side_tail(const int kind, const int r, const int nc, const char *w,
                                    const char *const *a, const float *const *side, int64_t nb,
                                    int64_t b, __m256i table, __m256 (*acc)[TR_MAX_NC],
                                    float *csum) {
    const size_t wb = q32_wbytes(kind);
    const char *w0 = w + (size_t)b * wb;
    __m128i h4[2];
    for (int g = 0; g < 2; g++)
        h4[g] = _mm_setr_epi32(4 * g + 0 < r ? (int)tr_load_u32(w0 + (4 * g + 0) * wb) : 0,
                               4 * g + 1 < r ? (int)tr_load_u32(w0 + (4 * g + 1) * wb) : 0,
                               4 * g + 2 < r ? (int)tr_load_u32(w0 + (4 * g + 2) * wb) : 0,
                               4 * g + 3 < r ? (int)tr_load_u32(w0 + (4 * g + 3) * wb) : 0);
    const __m256i gw = _mm256_inserti128_si256(_mm256_castsi128_si256(h4[0]), h4[1], 1);
    const __m256 dw = kind == Q32_MXFP4 ? e8m0_lo_to_f32(gw) : f16_lo_to_f32(gw);
    float sc[TR_MAX_NC][8];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) _mm256_storeu_ps(sc[j], _mm256_mul_ps(dw, _mm256_loadu_ps(side[j] + b)));
#pragma GCC unroll 8
    for (int k = 0; k < r; k++) {
        const __m256i q = q32_side_codes(kind, w0 + (size_t)k * wb, table);
        const __m256i uq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const __m256 p =
                _mm256_cvtepi32_ps(q32_side_dot(kind, q, uq, q32_act_codes(kind, a, j, b + k)));
            acc[0][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[j][k]), p, acc[0][j]);
            if (q32_side_offset(kind)) csum[j] += sc[j][k] * side[j][nb + b + k];
        }
    }
}

#define Q32_SIDE_TAIL(k)                                                                           \
    case k: q32_side_tail(kind, k, nc, w, a, side, nb, b, table, acc, csum); break;
TR_ALWAYS_INLINE void q32_side_impl(const int kind, int64_t n, const int nc, float *restrict s,
                                    size_t s_stride, const void *restrict w,
                                    const void *restrict va, size_t a_stride,
                                    const float *restrict vside, size_t side_stride) {
    const int64_t nb = n / TR_QK32;
    const size_t wb = q32_wbytes(kind);
    const __m256i table = q32_side_table(kind);
    const char *a[TR_MAX_NC];
    const float *side[TR_MAX_NC];
    __m256 acc[4][TR_MAX_NC], cacc[TR_MAX_NC];
    float csum[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const char *)va + (size_t)j * a_stride;
        side[j] = vside + (size_t)j * side_stride;
        acc[0][j] = acc[1][j] = acc[2][j] = acc[3][j] = cacc[j] = _mm256_setzero_ps();
        csum[j] = 0.0f;
    }
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) q32_side_group8(kind, nc, w, a, side, nb, b, table, acc, cacc);
    /* the tail's block count as a constant, so its unused blocks cost nothing */
    if (b > 0 && !q32_with_min(kind)) {
        switch (nb - b) {
            Q32_SIDE_TAIL(1) Q32_SIDE_TAIL(2) Q32_SIDE_TAIL(3) Q32_SIDE_TAIL(4) Q32_SIDE_TAIL(5)
            Q32_SIDE_TAIL(6) Q32_SIDE_TAIL(7)
        default: break;
        }
        b = nb;
    }
    for (; b < nb; b++) { /* row tail: one block at a time with scalar scales */
        const char *blk = (const char *)w + (size_t)b * wb;
        float m = 0.0f;
        const float dw = q32_scale(kind, blk, &m);
        const __m256i q = q32_side_codes(kind, blk, table);
        const __m256i uq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const float sc = dw * side[j][b];
            const __m256 p =
                _mm256_cvtepi32_ps(q32_side_dot(kind, q, uq, q32_act_codes(kind, a, j, b)));
            acc[0][j] = _mm256_fmadd_ps(_mm256_set1_ps(sc), p, acc[0][j]);
            if (q32_side_offset(kind)) csum[j] += sc * side[j][nb + b];
            if (q32_with_min(kind)) csum[j] += m * side[j][nb + b];
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        const float dot = hsum_ps256(q32_acc_sum(acc, j));
        const float c = hsum_ps256(cacc[j]) + csum[j];
        s[(size_t)j * s_stride] = q32_side_offset(kind) ? dot - (float)q32_side_offset(kind) * c
                                  : q32_with_min(kind)  ? dot + c
                                                        : dot;
    }
}

/* the vec_dot_side entry point of an impl(n, nc, s, s_stride, w, a, a_stride, side, side_stride):
 * up to TR_SIDE_MAX_NC columns, TR_MAX_NC at a time (sixteen registers hold four columns' four
 * accumulators). One column (decode, one call per weight row) has a function of its own: with
 * every column count inlined into one body, each call paid about 90 instructions of set-up for
 * the other counts' loops, a fifth of a 640-element Q8_0 row's work. */
#define TR_X86_SIDE_CASE(kind, k)                                                                  \
    case k: q32_side_impl(kind, n, k, s0, s_stride, w, a0, a_stride, d0, side_stride); break;
#define TR_X86_SIDE_ENTRY(name, kind)                                                              \
    static __attribute__((noinline, unused)) void name##_one(                                     \
        int64_t n, float *restrict s, const void *restrict w, const void *restrict a,              \
        const float *restrict side) {                                                              \
        q32_side_impl(kind, n, 1, s, 0, w, a, 0, side, 0);                                         \
    }                                                                                              \
    static __attribute__((noinline, unused)) void name##_rows(                                     \
        int64_t n, int64_t rows, float *restrict s, const void *restrict w, size_t w_stride,       \
        const void *restrict a, const float *restrict side) {                                      \
        for (int64_t r = 0; r < rows; r++)                                                         \
            q32_side_impl(kind, n, 1, s + r, 0, (const char *)w + (size_t)r * w_stride, a, 0,      \
                          side, 0);                                                                \
    }                                                                                              \
    static __attribute__((noinline, unused)) void name##_many(                                     \
        int64_t n, int nc, float *restrict s, size_t s_stride, const void *restrict w,             \
        const void *restrict a, size_t a_stride, const float *restrict side, size_t side_stride) { \
        for (int j0 = 0; j0 < nc; j0 += TR_MAX_NC) {                                               \
            float *s0 = s + (size_t)j0 * s_stride;                                                 \
            const char *a0 = (const char *)a + (size_t)j0 * a_stride;                              \
            const float *d0 = side + (size_t)j0 * side_stride;                                     \
            switch (nc - j0) {                                                                     \
                TR_X86_SIDE_CASE(kind, 1)                                                          \
                TR_X86_SIDE_CASE(kind, 2)                                                          \
                TR_X86_SIDE_CASE(kind, 3)                                                          \
            default: TR_X86_SIDE_CASE(kind, 4)                                                     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static __attribute__((unused)) void name(                                                      \
        int64_t n, int nc, float *restrict s, size_t s_stride, const void *restrict w,             \
        const void *restrict a, size_t a_stride, const float *restrict side, size_t side_stride) { \
        if (nc == 1) name##_one(n, s, w, a, side);                                                 \
        else name##_many(n, nc, s, s_stride, w, a, a_stride, side, side_stride);                   \
    }
TR_X86_SIDE_ENTRY(ymm_dot_side_q4_0, Q32_Q4_0)
TR_X86_SIDE_ENTRY(ymm_dot_side_q5_0, Q32_Q5_0)
TR_X86_SIDE_ENTRY(ymm_dot_side_q8_0, Q32_Q8_0)
TR_X86_SIDE_ENTRY(ymm_dot_side_iq4_nl, Q32_IQ4_NL)
TR_X86_SIDE_ENTRY(ymm_dot_side_mxfp4, Q32_MXFP4)
TR_X86_SIDE_ENTRY(ymm_dot_side_q5_1, Q32_Q5_1)
#undef TR_X86_SIDE_ENTRY
#undef TR_X86_SIDE_CASE
#undef Q32_SIDE_TAIL

/* ------------------------------------------------------ Q4_1 with side tables, half-block lanes */

/* Q4_1 against Q8_1 rows in the order the 512-bit wide kernel (zmm_q32.h, zq41_side_impl) keeps,
 * so that a column's bits do not depend on the kernel, the family or the column count: the row
 * is taken in groups of 8 blocks, and in each group lane 2k + h (k the block in the group, h its
 * half of 16 elements) holds the exact integer dot of that half-block. Per lane and group: the
 * scale d_w·d_a (one product) times the converted dot, added by one FMA into the lane's
 * accumulator; per block, m_w·s into a second 8-lane accumulator (one FMA). The row's value is
 * hsum_ps256(lanes 0-7 + lanes 8-15) + hsum_ps256(the min accumulator). Blocks past the row's
 * end in its last group are zeros (every factor 0). Here the 16 lanes are two 256-bit halves
 * (blocks 0-3, 4-7) and a half-block's dot is an int16 reduction of one maddubs per block; the
 * 512-bit kernel gets them from one VNNI product per 4 elements of 16 half-blocks. */
/* A Q4_1 block's codes with the low nibbles (elements 0..15) in the low 128-bit lane and the
 * high ones in the high lane: one load, one shift, one insert, one and. */
TR_ALWAYS_INLINE __m256i q41h_codes(const tr_blk_q4_1 *x) {
    const __m128i v = _mm_loadu_si128((const __m128i *)x->qs);
    const __m256i b =
        _mm256_inserti128_si256(_mm256_castsi128_si256(v), _mm_srli_epi16(v, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}
/* int16 pair sums of two vectors at three strides; used as a reduction tree that takes the
 * 8 int16 partial sums of each half-block (one maddubs) of 8 blocks down to one int16 per
 * half-block in 7 adds and 14 unpacks, instead of a madd per block and the slow hadd_epi32s */
TR_ALWAYS_INLINE __m256i q41h_sum16(__m256i a, __m256i b) {
    return _mm256_add_epi16(_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
}
TR_ALWAYS_INLINE __m256i q41h_sum32(__m256i a, __m256i b) {
    return _mm256_add_epi16(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
TR_ALWAYS_INLINE __m256i q41h_sum64(__m256i a, __m256i b) {
    return _mm256_add_epi16(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
}
/* The d and m of blocks x[0..r-1] (zero past r), 8 floats each: each block's (d, m) f16 pair
 * -> [d d d d m m m m] per four blocks, then d and m of all 8 */
TR_ALWAYS_INLINE void q41h_scales(const int r, const tr_blk_q4_1 *x, __m256 *dw, __m256 *mw) {
    __m128i h4[2];
    for (int g = 0; g < 2; g++)
        h4[g] = _mm_setr_epi32(4 * g + 0 < r ? (int)tr_load_u32(&x[4 * g + 0]) : 0,
                               4 * g + 1 < r ? (int)tr_load_u32(&x[4 * g + 1]) : 0,
                               4 * g + 2 < r ? (int)tr_load_u32(&x[4 * g + 2]) : 0,
                               4 * g + 3 < r ? (int)tr_load_u32(&x[4 * g + 3]) : 0);
    const __m128i pick = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m128i s0 = _mm_shuffle_epi8(h4[0], pick), s1 = _mm_shuffle_epi8(h4[1], pick);
    *dw = _mm256_cvtph_ps(_mm_unpacklo_epi64(s0, s1));
    *mw = _mm256_cvtph_ps(_mm_unpackhi_epi64(s0, s1));
}
/* Blocks b..b+r-1 (r = 1..8, a constant after inlining). The half-block dots are exact in
 * int16 (16 products of at most 15·128 = 30720), so the lanes hold the same integers as the
 * 32-bit reduction the 512-bit kernel does, and the scales are applied in its order. */
TR_ALWAYS_INLINE void q41h_group(const int r, const int nc, const tr_blk_q4_1 *x,
                                 const char *const *a, const float *const *side, int64_t nb,
                                 int64_t b, __m256 *lo, __m256 *hi, __m256 *cacc) {
    __m256i q[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) q[k] = k < r ? q41h_codes(&x[b + k]) : _mm256_setzero_si256();
    __m256 dw, mw;
    q41h_scales(r, x + b, &dw, &mw);
    const __m256i live =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        __m256 da, sa;
        if (r == 8) {
            da = _mm256_loadu_ps(side[j] + b);
            sa = _mm256_loadu_ps(side[j] + nb + b);
        } else if (nb >= 8) {
            /* a short last group of a row of 8+ blocks: load the 8 values ending at the row's
             * end and rotate the live ones down (maskload is slow on this family) */
            const __m256i rot = _mm256_and_si256(
                _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 - r)),
                _mm256_set1_epi32(7));
            da = _mm256_and_ps(_mm256_castsi256_ps(live),
                               _mm256_permutevar8x32_ps(_mm256_loadu_ps(side[j] + b + r - 8), rot));
            sa = _mm256_and_ps(_mm256_castsi256_ps(live),
                               _mm256_permutevar8x32_ps(_mm256_loadu_ps(side[j] + nb + b + r - 8), rot));
        } else {
            da = _mm256_maskload_ps(side[j] + b, live);
            sa = _mm256_maskload_ps(side[j] + nb + b, live);
        }
        __m256i p[8];
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            p[k] = k < r ? _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)q32_act_codes(
                                                      Q32_Q4_1, a, j, b + k)))
                         : _mm256_setzero_si256();
        /* t: low lane the 8 blocks' first-half dots, high lane their second-half dots */
        const __m256i t = q41h_sum64(q41h_sum32(q41h_sum16(p[0], p[1]), q41h_sum16(p[2], p[3])),
                                     q41h_sum32(q41h_sum16(p[4], p[5]), q41h_sum16(p[6], p[7])));
        const __m128i A = _mm256_castsi256_si128(t), B = _mm256_extracti128_si256(t, 1);
        const __m256i il = _mm256_cvtepi16_epi32(_mm_unpacklo_epi16(A, B));
        const __m256i ih = _mm256_cvtepi16_epi32(_mm_unpackhi_epi16(A, B));
        /* d_w·d_a once per block, then duplicated to the block's two half lanes */
        const __m256 prod = _mm256_mul_ps(dw, da);
        const __m128 P = _mm256_castps256_ps128(prod), Q = _mm256_extractf128_ps(prod, 1);
        const __m256 sl = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_unpacklo_ps(P, P)),
                                               _mm_unpackhi_ps(P, P), 1);
        const __m256 sh = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_unpacklo_ps(Q, Q)),
                                               _mm_unpackhi_ps(Q, Q), 1);
        lo[j] = _mm256_fmadd_ps(sl, _mm256_cvtepi32_ps(il), lo[j]);
        hi[j] = _mm256_fmadd_ps(sh, _mm256_cvtepi32_ps(ih), hi[j]);
        cacc[j] = _mm256_fmadd_ps(mw, sa, cacc[j]);
    }
}

#define Q41H_TAIL(k)                                                                               \
    case k: q41h_group(k, nc, x, a, side, nb, b, lo, hi, cacc); break;
TR_ALWAYS_INLINE void q41h_side_impl(int64_t n, const int nc, float *restrict s, size_t s_stride,
                                     const void *restrict w, const void *restrict va,
                                     size_t a_stride, const float *restrict vside,
                                     size_t side_stride) {
    const int64_t nb = n / TR_QK32;
    const tr_blk_q4_1 *x = w;
    const char *a[TR_MAX_NC];
    const float *side[TR_MAX_NC];
    __m256 lo[TR_MAX_NC], hi[TR_MAX_NC], cacc[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const char *)va + (size_t)j * a_stride;
        side[j] = vside + (size_t)j * side_stride;
        lo[j] = hi[j] = cacc[j] = _mm256_setzero_ps();
    }
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        prefetch_block(&x[b], 8 * sizeof(tr_blk_q4_1));
        q41h_group(8, nc, x, a, side, nb, b, lo, hi, cacc);
    }
    /* the tail's block count as a constant, so its unused blocks cost nothing */
    switch (nb - b) {
        Q41H_TAIL(1) Q41H_TAIL(2) Q41H_TAIL(3) Q41H_TAIL(4) Q41H_TAIL(5) Q41H_TAIL(6) Q41H_TAIL(7)
    default: break;
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++)
        s[(size_t)j * s_stride] = hsum_ps256(_mm256_add_ps(lo[j], hi[j])) + hsum_ps256(cacc[j]);
}
#undef Q41H_TAIL

/* Q4_1 for 2..TR_SIDE_MAX_NC columns in one pass over the weight row, each column with the bits
 * q41h_side_impl gives it alone. The row's blocks are decoded once (q41h_dec, a chunk of groups
 * at a time, kept in L1) and then each column runs over the decoded chunk with its three
 * accumulators in registers, loading each decoded code vector again (sixteen registers do not
 * hold a group's eight code vectors and several columns' accumulators; a variant taking two
 * columns per loaded code vector measured slower on 576-element rows, Zen 4 running this family).
 *
 * Per column and group the work is cut to what the column needs: the eight maddubs, the int16
 * tree, two widenings, one scale product and three FMAs. The lanes are kept in the order the
 * tree leaves them: a0 holds the first-half dots of blocks 0-7, a1 the second-half dots, so the
 * scale of lane k in both is d_w·d_a of block k, the product itself, with no duplication to half
 * lanes. Each lane gets the same products and FMAs as in q41h_group; only its position differs,
 * and q41h_col_sum moves the lanes back to that order (lane 2k + h of blocks 0-3, then of blocks
 * 4-7) before the row's sum, so the sums are added in the same order too. */
#define Q41H_CHUNK 16 /* groups decoded at a time: 4096 elements, 5 KiB on the stack */
typedef struct q41h_dec {
    __m256i q[8];   /* q41h_codes of the group's blocks (zero past the row's end) */
    __m256 dw, mw;  /* their d and m, as q41h_group converts them */
} q41h_dec;

TR_ALWAYS_INLINE void q41h_decode(const int r, const tr_blk_q4_1 *x, int64_t b, q41h_dec *d) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) d->q[k] = k < r ? q41h_codes(&x[b + k]) : _mm256_setzero_si256();
    q41h_scales(r, x + b, &d->dw, &d->mw);
}

/* one column's share of blocks b..b+r-1 (decoded in d): activation scales and s as q41h_group
 * reads them, the eight half-block dot pairs, the scale products and the FMAs */
TR_ALWAYS_INLINE void q41h_col_group(const int r, const q41h_dec *d, const char *a,
                                     const float *side, int64_t nb, int64_t b, __m256 *a0,
                                     __m256 *a1, __m256 *c) {
    __m256 da, sa;
    if (r == 8) {
        da = _mm256_loadu_ps(side + b);
        sa = _mm256_loadu_ps(side + nb + b);
    } else {
        const __m256i live =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        if (nb >= 8) { /* as q41h_group: the 8 values ending at the row's end, rotated down */
            const __m256i rot = _mm256_and_si256(
                _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 - r)),
                _mm256_set1_epi32(7));
            da = _mm256_and_ps(_mm256_castsi256_ps(live),
                               _mm256_permutevar8x32_ps(_mm256_loadu_ps(side + b + r - 8), rot));
            sa = _mm256_and_ps(_mm256_castsi256_ps(live),
                               _mm256_permutevar8x32_ps(_mm256_loadu_ps(side + nb + b + r - 8), rot));
        } else {
            da = _mm256_maskload_ps(side + b, live);
            sa = _mm256_maskload_ps(side + nb + b, live);
        }
    }
    const char *const ap[1] = {a};
    __m256i p[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        p[k] = k < r ? _mm256_maddubs_epi16(d->q[k], _mm256_loadu_si256((const __m256i *)q32_act_codes(
                                                         Q32_Q4_1, ap, 0, b + k)))
                     : _mm256_setzero_si256();
    const __m256i t = q41h_sum64(q41h_sum32(q41h_sum16(p[0], p[1]), q41h_sum16(p[2], p[3])),
                                 q41h_sum32(q41h_sum16(p[4], p[5]), q41h_sum16(p[6], p[7])));
    const __m256i i0 = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(t));
    const __m256i i1 = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(t, 1));
    const __m256 prod = _mm256_mul_ps(d->dw, da);
    *a0 = _mm256_fmadd_ps(prod, _mm256_cvtepi32_ps(i0), *a0);
    *a1 = _mm256_fmadd_ps(prod, _mm256_cvtepi32_ps(i1), *a1);
    *c = _mm256_fmadd_ps(d->mw, sa, *c);
}

/* the row's value from a0, a1 (lanes as q41h_col_group keeps them) and c, in q41h_side_impl's
 * order: its lo is lanes 0-3 of a0 and a1 interleaved, its hi lanes 4-7 */
TR_ALWAYS_INLINE float q41h_col_sum(__m256 a0, __m256 a1, __m256 c) {
    const __m256 ul = _mm256_unpacklo_ps(a0, a1), uh = _mm256_unpackhi_ps(a0, a1);
    const __m256 lo = _mm256_permute2f128_ps(ul, uh, 0x20), hi = _mm256_permute2f128_ps(ul, uh, 0x31);
    return hsum_ps256(_mm256_add_ps(lo, hi)) + hsum_ps256(c);
}

/* the row's last r < 8 blocks, decoded once, for every column */
TR_ALWAYS_INLINE void q41h_many_tail(const int r, const int nc, const tr_blk_q4_1 *x,
                                     const char *va, size_t a_stride, const float *vside,
                                     size_t side_stride, int64_t nb, int64_t b, __m256 (*acc)[3]) {
    q41h_dec d;
    q41h_decode(r, x, b, &d);
    for (int j = 0; j < nc; j++)
        q41h_col_group(r, &d, va + (size_t)j * a_stride, vside + (size_t)j * side_stride, nb, b,
                       &acc[j][0], &acc[j][1], &acc[j][2]);
}

#define Q41H_MANY_TAIL(k)                                                                          \
    case k: q41h_many_tail(k, nc, x, a, a_stride, side, side_stride, nb, b, acc); break;
static __attribute__((noinline, unused)) void ymm_dot_side_q4_1h_many(
    int64_t n, int nc, float *restrict s, size_t s_stride, const void *restrict w,
    const void *restrict va, size_t a_stride, const float *restrict side, size_t side_stride) {
    const int64_t nb = n / TR_QK32;
    const tr_blk_q4_1 *x = w;
    const char *a = va;
    __m256 acc[TR_SIDE_MAX_NC][3]; /* per column: a0, a1, c */
    for (int j = 0; j < nc; j++) acc[j][0] = acc[j][1] = acc[j][2] = _mm256_setzero_ps();
    q41h_dec dec[Q41H_CHUNK];
    int64_t b = 0;
    while (b + 8 <= nb) {
        int ng = 0;
        for (; ng < Q41H_CHUNK && b + 8 * (ng + 1) <= nb; ng++) {
            prefetch_block(&x[b + 8 * ng], 8 * sizeof(tr_blk_q4_1));
            q41h_decode(8, x, b + 8 * ng, &dec[ng]);
        }
        for (int j = 0; j < nc; j++) {
            const char *aj = a + (size_t)j * a_stride;
            const float *sj = side + (size_t)j * side_stride;
            __m256 a0 = acc[j][0], a1 = acc[j][1], c = acc[j][2];
            for (int g = 0; g < ng; g++)
                q41h_col_group(8, &dec[g], aj, sj, nb, b + 8 * g, &a0, &a1, &c);
            acc[j][0] = a0, acc[j][1] = a1, acc[j][2] = c;
        }
        b += 8 * ng;
    }
    /* the tail's block count as a constant, so its unused blocks cost nothing */
    switch (nb - b) {
        Q41H_MANY_TAIL(1) Q41H_MANY_TAIL(2) Q41H_MANY_TAIL(3) Q41H_MANY_TAIL(4) Q41H_MANY_TAIL(5)
        Q41H_MANY_TAIL(6) Q41H_MANY_TAIL(7)
    default: break;
    }
    for (int j = 0; j < nc; j++)
        s[(size_t)j * s_stride] = q41h_col_sum(acc[j][0], acc[j][1], acc[j][2]);
}
#undef Q41H_MANY_TAIL

static __attribute__((unused)) void ymm_dot_side_q4_1h(int64_t n, int nc, float *restrict s,
                                                       size_t s_stride, const void *restrict w,
                                                       const void *restrict a, size_t a_stride,
                                                       const float *restrict side,
                                                       size_t side_stride) {
    if (nc == 1) q41h_side_impl(n, 1, s, s_stride, w, a, a_stride, side, side_stride);
    else ymm_dot_side_q4_1h_many(n, nc, s, s_stride, w, a, a_stride, side, side_stride);
}

/* One activation row (decode): q41h_group's arithmetic with its lanes arranged for one column.
 * Lane k of A holds what q41h_group's lane 2k (of lo for k < 4, of hi - 8 after) holds, lane k of
 * B lane 2k + 1: the first- and second-half dots of block k. Both then take block k's d_w·d_a
 * exactly as the product gives it (no duplication shuffles), the int16 sums are widened without
 * an interleave, and every lane gets the same FMAs in the same order; the lanes are put back in
 * q41h's order once per row (q41h1_sum), so a row has the bits of every other column count. */
TR_ALWAYS_INLINE void q41h1_group(const int r, const tr_blk_q4_1 *x, const tr_blk_q8_1 *y,
                                  __m256 da, __m256 sa, __m256 *A, __m256 *B, __m256 *cacc) {
    __m256i p[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++)
        p[k] = k < r ? _mm256_maddubs_epi16(unpack_nibbles32(x[k].qs),
                                            _mm256_loadu_si256((const __m256i *)y[k].qs))
                     : _mm256_setzero_si256();
    __m256 dw, mw;
    q41h_scales(r, x, &dw, &mw);
    /* low lane: the 8 blocks' first-half dots, high lane: their second-half dots */
    const __m256i t = q41h_sum64(q41h_sum32(q41h_sum16(p[0], p[1]), q41h_sum16(p[2], p[3])),
                                 q41h_sum32(q41h_sum16(p[4], p[5]), q41h_sum16(p[6], p[7])));
    const __m256 prod = _mm256_mul_ps(dw, da);
    *A = _mm256_fmadd_ps(prod, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(t))),
                         *A);
    *B = _mm256_fmadd_ps(prod,
                         _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(t, 1))),
                         *B);
    *cacc = _mm256_fmadd_ps(mw, sa, *cacc);
}

/* q41h_side_impl's result from A and B: lo + hi is [A0+A4 B0+B4 A1+A5 B1+B5 | A2+A6 ... B3+B7],
 * then hsum_ps256's adds */
TR_ALWAYS_INLINE float q41h1_sum(__m256 A, __m256 B, __m256 cacc) {
    const __m256 ul = _mm256_unpacklo_ps(A, B), uh = _mm256_unpackhi_ps(A, B);
    __m128 v = _mm_add_ps(_mm_add_ps(_mm256_castps256_ps128(ul), _mm256_extractf128_ps(ul, 1)),
                          _mm_add_ps(_mm256_castps256_ps128(uh), _mm256_extractf128_ps(uh, 1)));
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v) + hsum_ps256(cacc);
}

/* rows of nb blocks, nb % 8 = r (a constant: the short last group costs only its blocks); the
 * short group's activation scales and sums are the same for every row, so they are picked (and
 * the lanes past the row zeroed) once */
TR_ALWAYS_INLINE void q41h1_rows(const int r, int64_t nb, int64_t rows, float *restrict s,
                                 const char *w, size_t w_stride, const tr_blk_q8_1 *y,
                                 const float *side) {
    const int64_t b8 = nb - r; /* blocks in whole groups */
    __m256 tda = _mm256_setzero_ps(), tsa = _mm256_setzero_ps();
    if (r) {
        const __m256i live =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        if (nb >= 8) { /* the 8 values ending at the row's end, rotated down, as in q41h_group */
            const __m256i rot = _mm256_and_si256(
                _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 - r)),
                _mm256_set1_epi32(7));
            tda = _mm256_and_ps(_mm256_castsi256_ps(live),
                                _mm256_permutevar8x32_ps(_mm256_loadu_ps(side + nb - 8), rot));
            tsa = _mm256_and_ps(_mm256_castsi256_ps(live),
                                _mm256_permutevar8x32_ps(_mm256_loadu_ps(side + 2 * nb - 8), rot));
        } else {
            tda = _mm256_maskload_ps(side, live);
            tsa = _mm256_maskload_ps(side + nb, live);
        }
    }
    for (int64_t row = 0; row < rows; row++) {
        const tr_blk_q4_1 *x = (const tr_blk_q4_1 *)(const void *)(w + (size_t)row * w_stride);
        __m256 A = _mm256_setzero_ps(), B = _mm256_setzero_ps(), cacc = _mm256_setzero_ps();
        for (int64_t b = 0; b < b8; b += 8) {
            prefetch_block(&x[b], 8 * sizeof(tr_blk_q4_1));
            q41h1_group(8, x + b, y + b, _mm256_loadu_ps(side + b), _mm256_loadu_ps(side + nb + b),
                        &A, &B, &cacc);
        }
        if (r) q41h1_group(r, x + b8, y + b8, tda, tsa, &A, &B, &cacc);
        s[row] = q41h1_sum(A, B, cacc);
    }
}

/* vec_dot_side_rows (kernels.h): one call per tile of weight rows for one activation row */
#define Q41H1_CASE(k)                                                                              \
    case k: q41h1_rows(k, nb, rows, s, w, w_stride, a, side); break;
static __attribute__((noinline, unused)) void ymm_dot_side_q4_1h_rows(
    int64_t n, int64_t rows, float *restrict s, const void *restrict w, size_t w_stride,
    const void *restrict a, const float *restrict side) {
    const int64_t nb = n / TR_QK32;
    switch (nb % 8) {
        Q41H1_CASE(0) Q41H1_CASE(1) Q41H1_CASE(2) Q41H1_CASE(3) Q41H1_CASE(4) Q41H1_CASE(5)
        Q41H1_CASE(6) Q41H1_CASE(7)
    default: break;
    }
}
#undef Q41H1_CASE

#define Q32_IMPL(kind, fn)                                                                         \
    TR_ALWAYS_INLINE void fn(int64_t n, const int nc, float *restrict s, size_t ss,                \
                             const void *restrict w, const void *restrict a, size_t as) {          \
        q32_impl(kind, n, nc, s, ss, w, a, as);                                                    \
    }
Q32_IMPL(Q32_Q4_0, ymm_q4_0_impl)
Q32_IMPL(Q32_Q5_0, ymm_q5_0_impl)
Q32_IMPL(Q32_Q8_0, ymm_q8_0_impl)
Q32_IMPL(Q32_IQ4_NL, ymm_iq4_nl_impl)
Q32_IMPL(Q32_MXFP4, ymm_mxfp4_impl)
Q32_IMPL(Q32_Q4_1, ymm_q4_1_impl)
Q32_IMPL(Q32_Q5_1, ymm_q5_1_impl)
#undef Q32_IMPL

TR_X86_DOT_ENTRIES(ymm_dot_q4_0, ymm_q4_0_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q5_0, ymm_q5_0_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q8_0, ymm_q8_0_impl)
TR_X86_DOT_ENTRIES(ymm_dot_iq4_nl, ymm_iq4_nl_impl)
TR_X86_DOT_ENTRIES(ymm_dot_mxfp4, ymm_mxfp4_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q4_1, ymm_q4_1_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q5_1, ymm_q5_1_impl)

#endif /* __x86_64__ */
#endif
