/*
 * 512-bit vec_dot_side kernels for the 32-element block types (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4,
 * Q4_1, Q5_1), up to TR_SIDE_MAX_NC activation rows per call: the decode path of a batch, where
 * one weight row meets every slot's activation row. They give the bits of the 256-bit side
 * kernels (ymm_q32.h, q32_side_impl; for Q4_1 q41h_side_impl) for every column and every column
 * count: a request served beside others gets the answer it gets alone, and both x86 families
 * agree. Q4_1 has an order of its own, in half-block lanes (zq41_side_impl, at the end), which
 * takes half the operations per column of the two-blocks-per-register order described here.
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
 * per block | [26nb, 34nb) Q8_1 rows: the codes in half-block lanes (zq41_side_impl) |
 * [34nb, 36nb) Q8_1 rows: d_a, 2 per block (one per half-block lane).
 */
#ifndef TR_TENSOR_X86_ZMM_Q32_H
#define TR_TENSOR_X86_ZMM_Q32_H

#include "tensor/x86/ymm_q32.h"

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

#define ZQ_SIDE_FLOATS 36
_Static_assert(ZQ_SIDE_FLOATS <= TR_SIDE_WIDE_FLOATS_MAX, "the matmul scratch holds the tables");

/* the parts of a row's table after d_a and the second values */
#define ZQ_DE(side, nb)    ((side) + 2 * (nb))
#define ZQ_CODES(side, nb) ((side) + 10 * (nb))
#define ZQ_CORR(side, nb)  ((side) + 18 * (nb))
#define ZQ_LANES(side, nb) ((side) + 26 * (nb))
#define ZQ_DA2(side, nb)   ((side) + 34 * (nb))

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
    for (int64_t b = b0; b < b1; b++) {
        zq_side_common(y[b].qs, side[b], nb, b, side);
        /* half-block lanes: in the group of 8 blocks from g0 (r of them), register t of the
         * group (r·8 bytes from its start, 2r lanes) holds in lane 2k + h the codes 16h + 4t ..
         * 16h + 4t + 3 of block g0 + k */
        const int64_t g0 = b & ~(int64_t)7, k = b - g0;
        const int64_t r = nb - g0 < 8 ? nb - g0 : 8;
        char *lanes = (char *)(ZQ_LANES(side, nb) + 8 * g0);
        for (int t = 0; t < 4; t++)
            for (int h = 0; h < 2; h++)
                memcpy(lanes + 4 * (t * 2 * r + 2 * k + h), y[b].qs + 16 * h + 4 * t, 4);
        ZQ_DA2(side, nb)[2 * b] = ZQ_DA2(side, nb)[2 * b + 1] = side[b];
    }
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
ZQ_SIDE_ENTRY(zmm_dot_side_q5_1, Q32_Q5_1)
#undef ZQ_SIDE_ENTRY
#undef ZQ_SIDE_CASE

/* Q4_1 against Q8_1 in half-block lanes: the order of q41h_side_impl (ymm_q32.h, where it is
 * described), for every column count. One group of 8 blocks (r of them at the row's end) is
 * 160 bytes of weights, loaded by three (masked) 512-bit loads; two permutes per register put the
 * 4-byte code group t of every block into the block's two lanes, a variable shift and a mask
 * pick the low nibbles (elements 0-15) for lane 2k and the high ones (16-31) for lane 2k + 1.
 * Each column then costs per group four VNNI products (its codes in the same lanes, from the
 * wide table), one conversion, one scale product, one FMA, and one 256-bit FMA for the mins:
 * 8 operations per 8 blocks where the two-blocks-per-register order above needs 16. */
/* dwords idx of the group's weights, held in R0..R2 (dwords 0-15, 16-31, 32-47): span 1 when
 * every index needed is below 16, 2 below 32 */
TR_ALWAYS_INLINE __m512i zq41_pick(const int span, __m512i idx, __m512i R0, __m512i R1,
                                   __m512i R2) {
    if (span == 1) return _mm512_permutexvar_epi32(idx, R0);
    const __m512i near = _mm512_permutex2var_epi32(R0, idx, R1);
    if (span == 2) return near;
    const __m512i far = _mm512_set1_epi32(32);
    return _mm512_mask_permutexvar_epi32(near, _mm512_cmpge_epi32_mask(idx, far),
                                         _mm512_sub_epi32(idx, far), R2);
}

TR_ALWAYS_INLINE void zq41_group(const int r, const int nc, const char *wg,
                                 const float *const *side, int64_t nb, int64_t g0, __m512 *acc,
                                 __m256 *cacc) {
    const int nd = 5 * r; /* dwords of the group's blocks */
    const int span = nd <= 16 ? 1 : nd <= 32 ? 2 : 3;
    const __m512i R0 = r == 8 ? _mm512_loadu_si512(wg)
                              : _mm512_maskz_loadu_epi32((__mmask16)((1u << (nd < 16 ? nd : 16)) - 1), wg);
    const __m512i R1 =
        r == 8 ? _mm512_loadu_si512(wg + 64)
        : span >= 2 ? _mm512_maskz_loadu_epi32(
                          (__mmask16)((1u << (nd < 32 ? nd - 16 : 16)) - 1), wg + 64)
                    : _mm512_setzero_si512();
    const __m512i R2 = span == 3 ? _mm512_maskz_loadu_epi32((__mmask16)((1u << (nd - 32)) - 1), wg + 128)
                                 : _mm512_setzero_si512();
    /* lane 2k + h: dword 5k + 1 + t of the group (the code group t of block k); lanes of
     * blocks past r may hold anything: their activation codes are zeros */
    const __m512i base = _mm512_setr_epi32(1, 1, 6, 6, 11, 11, 16, 16, 21, 21, 26, 26, 31, 31, 36, 36);
    const __m512i shift = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    __m512i W[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        const __m512i v = zq41_pick(span, _mm512_add_epi32(base, _mm512_set1_epi32(t)), R0, R1, R2);
        W[t] = _mm512_and_si512(_mm512_srlv_epi32(v, shift), _mm512_set1_epi8(0x0F));
    }
    /* block heads (d, m as f16) at dwords 5k, lanes 0-7, converted as 16 halves: lane 2k the
     * scale d, 2k + 1 the min m of block k; lanes of blocks past r zero */
    const __m512i hidx = _mm512_setr_epi32(0, 5, 10, 15, 20, 25, 30, 35, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 dm = _mm512_cvtph_ps(_mm512_castsi512_si256(zq41_pick(span, hidx, R0, R1, R2)));
    const __mmask16 mk = (__mmask16)((1u << (2 * r)) - 1);
    const __mmask8 m8 = (__mmask8)((1u << r) - 1);
    const __m512 dwe = _mm512_maskz_permutexvar_ps(
        mk, _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14), dm);
    const __m256 mw = _mm512_castps512_ps256(_mm512_maskz_permutexvar_ps(
        (__mmask16)m8, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 0, 0, 0, 0, 0, 0, 0, 0), dm));
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) {
        const float *sj = side[j];
        const int32_t *T = (const int32_t *)(const void *)(ZQ_LANES(sj, nb) + 8 * g0);
        const float *da = ZQ_DA2(sj, nb) + 2 * g0;
        __m512i i = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++)
            i = _mm512_dpbusd_epi32(i, W[t],
                                    r == 8 ? _mm512_loadu_si512(T + 16 * t)
                                           : _mm512_maskz_loadu_epi32(mk, T + 2 * r * t));
        const __m512 sc =
            _mm512_mul_ps(dwe, r == 8 ? _mm512_loadu_ps(da) : _mm512_maskz_loadu_ps(mk, da));
        acc[j] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(i), acc[j]);
        const __m256 sa = r == 8 ? _mm256_loadu_ps(sj + nb + g0) : _mm256_maskz_loadu_ps(m8, sj + nb + g0);
        cacc[j] = _mm256_fmadd_ps(mw, sa, cacc[j]);
    }
}

TR_ALWAYS_INLINE void zq41_side_impl(int64_t n, const int nc, float *restrict s, size_t s_stride,
                                     const void *restrict w, const float *restrict vside,
                                     size_t side_stride) {
    const int64_t nb = n / TR_QK32;
    const float *side[TR_SIDE_MAX_NC];
    __m512 acc[TR_SIDE_MAX_NC];
    __m256 cacc[TR_SIDE_MAX_NC];
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) {
        side[j] = vside + (size_t)j * side_stride;
        acc[j] = _mm512_setzero_ps();
        cacc[j] = _mm256_setzero_ps();
    }
    const char *wr = w;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        const char *wg = wr + (size_t)b * sizeof(tr_blk_q4_1);
        prefetch_block(wg, 8 * sizeof(tr_blk_q4_1));
        zq41_group(8, nc, wg, side, nb, b, acc, cacc);
    }
    if (b < nb)
        zq41_group((int)(nb - b), nc, wr + (size_t)b * sizeof(tr_blk_q4_1), side, nb, b, acc, cacc);
    /* hsum_ps256(lanes 0-7 + lanes 8-15) + hsum_ps256(cacc), two columns per register */
#pragma GCC unroll 4
    for (int j = 0; j < nc; j += 2) {
        const int k = j + 1 < nc ? j + 1 : j;
        const __m256 tj = _mm256_add_ps(_mm512_castps512_ps256(acc[j]), _mm512_extractf32x8_ps(acc[j], 1));
        const __m256 tk = _mm256_add_ps(_mm512_castps512_ps256(acc[k]), _mm512_extractf32x8_ps(acc[k], 1));
        const __m512 dot = zq_hsum_halves(_mm512_insertf32x8(_mm512_castps256_ps512(tj), tk, 1));
        const __m512 cs = zq_hsum_halves(_mm512_insertf32x8(_mm512_castps256_ps512(cacc[j]), cacc[k], 1));
        s[(size_t)j * s_stride] = _mm512_cvtss_f32(dot) + _mm512_cvtss_f32(cs);
        if (k > j)
            s[(size_t)k * s_stride] = _mm_cvtss_f32(_mm512_extractf32x4_ps(dot, 2)) +
                                      _mm_cvtss_f32(_mm512_extractf32x4_ps(cs, 2));
    }
}

#define ZQ41_CASE(k) case k: zq41_side_impl(n, k, s, s_stride, w, side, side_stride); break;
static void zmm_dot_side_q4_1h(int64_t n, int nc, float *restrict s, size_t s_stride,
                               const void *restrict w, const void *restrict a, size_t a_stride,
                               const float *restrict side, size_t side_stride) {
    (void)a;
    (void)a_stride;
    switch (nc) {
        ZQ41_CASE(1)
        ZQ41_CASE(2)
        ZQ41_CASE(3)
        ZQ41_CASE(4)
        ZQ41_CASE(5)
        ZQ41_CASE(6)
        ZQ41_CASE(7)
    default: ZQ41_CASE(8)
    }
}
#undef ZQ41_CASE

#endif
#endif
