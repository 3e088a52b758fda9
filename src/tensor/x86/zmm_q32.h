/*
 * 512-bit vec_dot_side kernels for the 32-element block types (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4,
 * Q4_1, Q5_1), up to TR_SIDE_MAX_NC activation rows per call: the decode path of a batch, where
 * one weight row meets every slot's activation row. They give the bits of the 256-bit side
 * kernels (ymm_q32.h, q32_side_impl) for every column and every column count: a request served
 * beside others gets the answer it gets alone, and both x86 families agree.
 *
 * How the bits are kept: the 256-bit kernel gives each block 8 int32 lanes (sums of 4 byte
 * products), scales them by d_w·d_a in f32 and adds them into accumulator k % 4 (k the block's
 * place in a group of 8), the row tail into accumulator 0. Here one 512-bit register holds two
 * consecutive blocks (k even: accumulators k % 4 and k % 4 + 1 side by side), so every lane sees
 * the same products, scales and adds in the same order; only the work per column halves.
 *
 * What this costs per column and block pair, all of it on the two 512-bit ports: one VNNI dot
 * product (the activation codes as a memory operand), one conversion, one scale product and one
 * FMA. What the columns share is done once per pair: the weight codes unpacked into a register
 * and the weight scales expanded. For that the activation side table of this family
 * (zq_act_side_*) also holds each row's codes contiguously (one 64-byte load per pair, where the
 * 34/36-byte blocks would need two loads and an insert), its scales d_a expanded to the 8 lanes
 * of their block (the scale product then takes them from memory) and, for Q8_0 rows, each lane's
 * -128·(sum of its 4 codes): signed weight codes w are multiplied as w + 128 (unsigned) and the
 * lane starts from that correction, which gives exactly Σ w·a without the sign trick (no 512-bit
 * vpsignb exists).
 *
 * One or two columns take the 256-bit kernel itself: what the columns share costs more on two
 * 512-bit ports than on the three 256-bit ones, and so few columns do not repay it (measured on an
 * Intel Xeon with AVX-512, SmolLM2's 576- and 1536-element rows: the same time at one column,
 * about a fifth less from four columns on).
 *
 * Wide side table of one row of nb blocks, in floats (kernels.h: act_side_wide_floats):
 *   [0, nb) d_a | [nb, 2nb) second value (code sum or Q8_1's s) | [2nb, 10nb) d_a, 8 per block |
 *   [10nb, 18nb) the codes, 32 bytes per block | [18nb, 26nb) Q8_0 rows: 8 int32 corrections
 * per block.
 */
#ifndef TR_TENSOR_X86_ZMM_Q32_H
#define TR_TENSOR_X86_ZMM_Q32_H

#include "tensor/x86/ymm_q32.h"

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

#define ZQ_SIDE_FLOATS 26
_Static_assert(ZQ_SIDE_FLOATS <= TR_SIDE_WIDE_FLOATS_MAX, "the matmul scratch holds the tables");

/* the parts of a row's table after d_a and the second values */
#define ZQ_DE(side, nb)    ((side) + 2 * (nb))
#define ZQ_CODES(side, nb) ((side) + 10 * (nb))
#define ZQ_CORR(side, nb)  ((side) + 18 * (nb))

/* the parts of block b's table both activation formats share */
TR_ALWAYS_INLINE void zq_side_common(const int8_t *qs, float d, int64_t nb, int64_t b,
                                     float *side) {
    _mm256_storeu_ps(ZQ_DE(side, nb) + 8 * b, _mm256_set1_ps(d));
    _mm256_storeu_si256((__m256i *)(ZQ_CODES(side, nb) + 8 * b),
                        _mm256_loadu_si256((const __m256i *)qs));
}

static void zq_act_side_q8_0(const void *restrict aq, int64_t nb, int64_t b0, int64_t b1,
                             float *restrict side) {
    const tr_blk_q8_0 *y = aq;
    ymm_act_side_q8_0(aq, nb, b0, b1, side);
    for (int64_t b = b0; b < b1; b++) {
        zq_side_common(y[b].qs, side[b], nb, b, side);
        /* each lane's 4 codes summed (a dot with ones: biased to unsigned, the bias removed) */
        const __m256i v = _mm256_loadu_si256((const __m256i *)y[b].qs);
        const __m256i biased = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
        const __m256i sum = _mm256_sub_epi32(
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), biased, _mm256_set1_epi8(1)),
            _mm256_set1_epi32(4 * 128));
        const __m256i corr = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), sum), 7);
        _mm256_storeu_si256((__m256i *)(ZQ_CORR(side, nb) + 8 * b), corr);
    }
}

static void zq_act_side_q8_1(const void *restrict aq, int64_t nb, int64_t b0, int64_t b1,
                             float *restrict side) {
    const tr_blk_q8_1 *y = aq;
    ymm_act_side_q8_1(aq, nb, b0, b1, side);
    for (int64_t b = b0; b < b1; b++) zq_side_common(y[b].qs, side[b], nb, b, side);
}

/* the weight codes are signed (Q8_0, IQ4_NL): multiplied as w + 128 with the lane corrections */
TR_ALWAYS_INLINE bool zq_signed(int kind) { return kind == Q32_Q8_0 || kind == Q32_IQ4_NL; }

/* 16 nibble bytes of two blocks -> 64 codes 0..15 in element order, block k in the low half */
TR_ALWAYS_INLINE __m512i zq_nibbles2(const uint8_t *q0, const uint8_t *q1) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q0));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q1));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    /* the upper 128-bit lane of each block holds the high nibbles */
    const __m512i sh = _mm512_srlv_epi32(
        v, _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4));
    return _mm512_and_si512(sh, _mm512_set1_epi8(0x0F));
}

/* the codes of blocks blk and blk + wb as the dot product takes them: unsigned as in
 * q32_side_codes, signed ones + 128 */
TR_ALWAYS_INLINE __m512i zq_codes2(int kind, const char *blk, size_t wb, __m512i table) {
    const char *nx = blk + wb;
    switch (kind) {
    case Q32_Q4_0:
        return zq_nibbles2(((const tr_blk_q4_0 *)blk)->qs, ((const tr_blk_q4_0 *)nx)->qs);
    case Q32_Q4_1:
        return zq_nibbles2(((const tr_blk_q4_1 *)blk)->qs, ((const tr_blk_q4_1 *)nx)->qs);
    case Q32_Q5_0:
    case Q32_Q5_1: {
        const bool one = kind == Q32_Q5_1;
        const uint8_t *qh0 = one ? ((const tr_blk_q5_1 *)blk)->qh : ((const tr_blk_q5_0 *)blk)->qh;
        const uint8_t *qh1 = one ? ((const tr_blk_q5_1 *)nx)->qh : ((const tr_blk_q5_0 *)nx)->qh;
        const uint8_t *qs0 = one ? ((const tr_blk_q5_1 *)blk)->qs : ((const tr_blk_q5_0 *)blk)->qs;
        const uint8_t *qs1 = one ? ((const tr_blk_q5_1 *)nx)->qs : ((const tr_blk_q5_0 *)nx)->qs;
        const __mmask64 hi = (__mmask64)tr_load_u32(qh0) | (__mmask64)tr_load_u32(qh1) << 32;
        const __m512i nib = zq_nibbles2(qs0, qs1);
        return _mm512_mask_add_epi8(nib, hi, nib, _mm512_set1_epi8(16)); /* nibble + 16·bit */
    }
    case Q32_Q8_0: {
        const __m256i lo = _mm256_loadu_si256((const __m256i *)((const tr_blk_q8_0 *)blk)->qs);
        const __m256i up = _mm256_loadu_si256((const __m256i *)((const tr_blk_q8_0 *)nx)->qs);
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), up, 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    }
    case Q32_IQ4_NL: /* the table holds the values + 128 */
        return _mm512_shuffle_epi8(table, zq_nibbles2(((const tr_blk_iq4_nl *)blk)->qs,
                                                      ((const tr_blk_iq4_nl *)nx)->qs));
    default: /* MXFP4: the table holds the values + 12 */
        return _mm512_shuffle_epi8(table, zq_nibbles2(((const tr_blk_mxfp4 *)blk)->qs,
                                                      ((const tr_blk_mxfp4 *)nx)->qs));
    }
}

/* hsum_ps256 of each 256-bit half, with its additions in its order: the low half's sum in lane
 * 0, the high half's in lane 8 */
TR_ALWAYS_INLINE __m512 zq_hsum_halves(__m512 t) {
    const __m512 s = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xB1)); /* lo128 + hi128 */
    const __m512 u = _mm512_add_ps(s, _mm512_permute_ps(s, 0xEE));      /* + movehl */
    return _mm512_add_ps(u, _mm512_movehdup_ps(u));                      /* + movehdup */
}

TR_ALWAYS_INLINE __m512i zq_table(int kind) {
    const __m256i t = q32_side_table(kind);
    const __m512i z = _mm512_broadcast_i64x4(t);
    if (kind == Q32_IQ4_NL) return _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
    return z;
}

TR_ALWAYS_INLINE void zq_side_impl(const int kind, int64_t n, const int nc, float *restrict s,
                                   size_t s_stride, const void *restrict w, const void *restrict va,
                                   size_t a_stride, const float *restrict vside,
                                   size_t side_stride) {
    const int64_t nb = n / TR_QK32;
    const size_t wb = q32_wbytes(kind);
    const __m512i table = zq_table(kind);
    const __m256i table256 = q32_side_table(kind);
    const char *a[TR_SIDE_MAX_NC];
    const float *side[TR_SIDE_MAX_NC];
    /* z[0][j]: accumulators 0 and 1 of the 256-bit kernel, z[1][j]: 2 and 3 */
    __m512 z[2][TR_SIDE_MAX_NC];
    __m256 cacc[TR_SIDE_MAX_NC];
    float csum[TR_SIDE_MAX_NC];
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) {
        a[j] = (const char *)va + (size_t)j * a_stride;
        side[j] = vside + (size_t)j * side_stride;
        z[0][j] = z[1][j] = _mm512_setzero_ps();
        cacc[j] = _mm256_setzero_ps();
        csum[j] = 0.0f;
    }
    /* lanes 0-7 take weight scale 2p of the group, lanes 8-15 scale 2p + 1 */
    const __m512i pick0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i two = _mm512_set1_epi32(2);
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const char *w0 = (const char *)w + (size_t)b * wb;
        prefetch_block(w0, 8 * wb);
        const __m256i gw = load8_head(w0, wb);
        const __m256 dw = kind == Q32_MXFP4 ? e8m0_lo_to_f32(gw) : f16_lo_to_f32(gw);
        const __m256 mw = q32_with_min(kind) ? f16_lo_to_f32(_mm256_srli_epi32(gw, 16))
                                             : _mm256_setzero_ps();
#pragma GCC unroll 8
        for (int j = 0; j < nc; j++) { /* as q32_side_group8 */
            const __m256 second = _mm256_loadu_ps(side[j] + nb + b);
            if (q32_side_offset(kind))
                cacc[j] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(side[j] + b)), second,
                                          cacc[j]);
            if (q32_with_min(kind)) cacc[j] = _mm256_fmadd_ps(mw, second, cacc[j]);
        }
        const __m512 dwz = _mm512_castps256_ps512(dw);
        __m512i pick = pick0;
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const int64_t k = b + 2 * p;
            const __m512i q = zq_codes2(kind, w0 + (size_t)(2 * p) * wb, wb, table);
            const __m512 dwe = _mm512_permutexvar_ps(pick, dwz);
            pick = _mm512_add_epi32(pick, two);
#pragma GCC unroll 8
            for (int j = 0; j < nc; j++) {
                const float *sj = side[j];
                const __m512i init = zq_signed(kind) ? _mm512_loadu_si512(ZQ_CORR(sj, nb) + 8 * k)
                                                     : _mm512_setzero_si512();
                const __m512i dot =
                    _mm512_dpbusd_epi32(init, q, _mm512_loadu_si512(ZQ_CODES(sj, nb) + 8 * k));
                const __m512 sc = _mm512_mul_ps(dwe, _mm512_loadu_ps(ZQ_DE(sj, nb) + 8 * k));
                z[p & 1][j] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(dot), z[p & 1][j]);
            }
        }
    }
    /* the row tail goes into accumulator 0 (the low half of z[0][j]) */
    __m256 acc0[TR_SIDE_MAX_NC];
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) acc0[j] = _mm512_castps512_ps256(z[0][j]);
    const bool tail = b < nb;
    /* two blocks per register for the dot products, conversions and scale products, then the
     * two FMAs in block order */
    for (; b + 2 <= nb; b += 2) {
        const char *blk = (const char *)w + (size_t)b * wb;
        float m0 = 0.0f, m1 = 0.0f;
        const float d0 = q32_scale(kind, blk, &m0), d1 = q32_scale(kind, blk + wb, &m1);
        const __m512i q = zq_codes2(kind, blk, wb, table);
        const __m512 dwe = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
#pragma GCC unroll 8
        for (int j = 0; j < nc; j++) {
            const float *sj = side[j];
            const __m512i init = zq_signed(kind) ? _mm512_loadu_si512(ZQ_CORR(sj, nb) + 8 * b)
                                                 : _mm512_setzero_si512();
            const __m512 p = _mm512_cvtepi32_ps(
                _mm512_dpbusd_epi32(init, q, _mm512_loadu_si512(ZQ_CODES(sj, nb) + 8 * b)));
            const __m512 sc = _mm512_mul_ps(dwe, _mm512_loadu_ps(ZQ_DE(sj, nb) + 8 * b));
            acc0[j] = _mm256_fmadd_ps(_mm512_castps512_ps256(sc), _mm512_castps512_ps256(p),
                                      acc0[j]);
            acc0[j] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(sc, 1), _mm512_extractf32x8_ps(p, 1),
                                      acc0[j]);
            if (q32_side_offset(kind)) {
                csum[j] += _mm512_cvtss_f32(sc) * sj[nb + b];
                csum[j] += d1 * sj[b + 1] * sj[nb + b + 1];
            }
            if (q32_with_min(kind)) {
                csum[j] += m0 * sj[nb + b];
                csum[j] += m1 * sj[nb + b + 1];
            }
        }
    }
    for (; b < nb; b++) { /* the last odd block: as q32_side_impl */
        const char *blk = (const char *)w + (size_t)b * wb;
        float m = 0.0f;
        const float dw = q32_scale(kind, blk, &m);
        const __m256i q = q32_side_codes(kind, blk, table256);
        const __m256i uq = _mm256_sign_epi8(q, q);
#pragma GCC unroll 8
        for (int j = 0; j < nc; j++) {
            const float sc = dw * side[j][b];
            const __m256 p =
                _mm256_cvtepi32_ps(q32_side_dot(kind, q, uq, q32_act_codes(kind, a, j, b)));
            acc0[j] = _mm256_fmadd_ps(_mm256_set1_ps(sc), p, acc0[j]);
            if (q32_side_offset(kind)) csum[j] += sc * side[j][nb + b];
            if (q32_with_min(kind)) csum[j] += m * side[j][nb + b];
        }
    }
    if (tail)
#pragma GCC unroll 8
        for (int j = 0; j < nc; j++) z[0][j] = _mm512_insertf32x8(z[0][j], acc0[j], 0);
    /* the sums of q32_side_impl, two columns per register: column j in the low half, j + 1 in
     * the high half (the last column of an odd count alone) */
#pragma GCC unroll 4
    for (int j = 0; j < nc; j += 2) {
        const int k = j + 1 < nc ? j + 1 : j;
        /* (acc0 + acc1) + (acc2 + acc3) */
        const __m512 lo = _mm512_add_ps(_mm512_shuffle_f32x4(z[0][j], z[0][k], 0x44),
                                        _mm512_shuffle_f32x4(z[0][j], z[0][k], 0xEE));
        const __m512 hi = _mm512_add_ps(_mm512_shuffle_f32x4(z[1][j], z[1][k], 0x44),
                                        _mm512_shuffle_f32x4(z[1][j], z[1][k], 0xEE));
        const __m512 dot = zq_hsum_halves(_mm512_add_ps(lo, hi));
        const __m512 cs =
            zq_hsum_halves(_mm512_insertf32x8(_mm512_castps256_ps512(cacc[j]), cacc[k], 1));
        const float d2[2] = {_mm512_cvtss_f32(dot), _mm_cvtss_f32(_mm512_extractf32x4_ps(dot, 2))};
        const float c2[2] = {_mm512_cvtss_f32(cs), _mm_cvtss_f32(_mm512_extractf32x4_ps(cs, 2))};
        for (int i = 0; i < (k > j ? 2 : 1); i++) {
            const float c = c2[i] + csum[j + i];
            s[(size_t)(j + i) * s_stride] = q32_side_offset(kind)
                                                ? d2[i] - (float)q32_side_offset(kind) * c
                                            : q32_with_min(kind) ? d2[i] + c
                                                                 : d2[i];
        }
    }
}

#define ZQ_SIDE_CASE(kind, k)                                                                      \
    case k: zq_side_impl(kind, n, k, s, s_stride, w, a, a_stride, side, side_stride); break;
#define ZQ_SIDE_ENTRY(name, kind)                                                                  \
    static void name(int64_t n, int nc, float *restrict s, size_t s_stride,                        \
                     const void *restrict w, const void *restrict a, size_t a_stride,              \
                     const float *restrict side, size_t side_stride) {                             \
        switch (nc) {                                                                              \
        case 1: q32_side_impl(kind, n, 1, s, s_stride, w, a, a_stride, side, side_stride); break;  \
        case 2: q32_side_impl(kind, n, 2, s, s_stride, w, a, a_stride, side, side_stride); break;  \
            ZQ_SIDE_CASE(kind, 3)                                                                  \
            ZQ_SIDE_CASE(kind, 4)                                                                  \
            ZQ_SIDE_CASE(kind, 5)                                                                  \
            ZQ_SIDE_CASE(kind, 6)                                                                  \
            ZQ_SIDE_CASE(kind, 7)                                                                  \
        default: zq_side_impl(kind, n, 8, s, s_stride, w, a, a_stride, side, side_stride); break;  \
        }                                                                                          \
    }
ZQ_SIDE_ENTRY(zmm_dot_side_q4_0, Q32_Q4_0)
ZQ_SIDE_ENTRY(zmm_dot_side_q5_0, Q32_Q5_0)
ZQ_SIDE_ENTRY(zmm_dot_side_q8_0, Q32_Q8_0)
ZQ_SIDE_ENTRY(zmm_dot_side_iq4_nl, Q32_IQ4_NL)
ZQ_SIDE_ENTRY(zmm_dot_side_mxfp4, Q32_MXFP4)
ZQ_SIDE_ENTRY(zmm_dot_side_q4_1, Q32_Q4_1)
ZQ_SIDE_ENTRY(zmm_dot_side_q5_1, Q32_Q5_1)
#undef ZQ_SIDE_ENTRY
#undef ZQ_SIDE_CASE

#endif
#endif
