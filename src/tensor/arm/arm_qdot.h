/*
 * Integer dot products of every quantized weight type (decoded by arm_blocks.h) with its
 * activation format, for the Arm kernel files.
 *
 * One weight row against nc activation rows (vec_dot, vec_dot_nc): each block is decoded once
 * and its codes meet the nc activation blocks through dot16 (SDOT, or the ARMv8.0 widening
 * multiply). Per block the integer sum is the reference's — Σ codes·a for the 32-element types,
 * Σ_g scale_g·Σ codes·a for the super-block types — formed in int32 lanes, then scaled by the two
 * block scales in f32; min terms go through the activation sums as in the reference. Only the
 * f32 rounding and summation order differ from it.
 *
 * Two weight rows against pairs of activation rows (vec_dot_2r, with i8mm): SMMLA multiplies a
 * 2x8 byte matrix by an 8x2 one, so 8 bytes of each of the two weight rows (interleaved by a
 * 64-bit zip, once per block for all activation pairs) meet 8 bytes of two activation rows (put
 * side by side by two 64-bit loads) in one instruction, giving the 2x2 block of partial sums
 * [w0·a0, w0·a1, w1·a0, w1·a1]: 32 multiply-adds where an SDOT does 16. Per 16-element group and
 * 2x2 tile that is 2 SMMLA (+ the weight zips shared by the activation pairs) against 4 SDOT; the
 * matrix-matrix (prefill) path can use it, a matrix-vector product (one activation row) cannot.
 */
#ifndef TR_TENSOR_ARM_QDOT_H
#define TR_TENSOR_ARM_QDOT_H

#include "tensor/arm/arm_blocks.h"

#if defined(__aarch64__)

/* the block's min-term scales as int16 per 16-element group (Q2_K, Q4_K, Q5_K) */
TR_ALWAYS_INLINE void ak_mins16(const ak_scales *sc, int16x8_t mn[2]) {
    mn[0] = vld1q_s16(sc->mn);
    mn[1] = vld1q_s16(sc->mn + 8);
}

/* Part p of one weight block against the activation codes y (already at the part) into isum */
TR_ALWAYS_INLINE int32x4_t aq_part(int k, int p, const int8x16_t *q, const ak_scales *sc,
                                   const int8_t *y, int32x4_t isum) {
    const int32x4_t zero = vdupq_n_s32(0);
    if (!ak_super(k)) return dot16(dot16(isum, q[0], vld1q_s8(y)), q[1], vld1q_s8(y + 16));
    if (ak_scale_span(k) == 32) {
        for (int g = 0; g < 8; g += 2) {
            const int32x4_t t =
                dot16(dot16(zero, q[g], vld1q_s8(y + 16 * g)), q[g + 1], vld1q_s8(y + 16 * g + 16));
            isum = vmlaq_n_s32(isum, t, sc->sc[8 * p + g]);
        }
    } else {
        for (int g = 0; g < 8; g++)
            isum = vmlaq_n_s32(isum, dot16(zero, q[g], vld1q_s8(y + 16 * g)), sc->sc[8 * p + g]);
    }
    return isum;
}

/* One weight block against nc activation blocks: acc[j] += its scaled integer sum, corr[j] the
 * min terms */
TR_ALWAYS_INLINE void aq_block(const int k, const int nc, const uint8_t *blk,
                               const uint8_t *const *a, int64_t b, float32x4_t *acc,
                               float *corr) {
    const size_t ab = ak_abytes(k);
    ak_scales sc;
    int16x8_t mn[2];
    if (ak_super(k)) ak_block_scales(k, blk, &sc);
    if (ak_kmin(k)) ak_mins16(&sc, mn);
    const float dw = ak_d(k, blk);
    const float mw = ak_q81(k) || ak_kmin(k) ? ak_dmin(k, blk) : 0.0f;
    int32x4_t isum[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) isum[j] = vdupq_n_s32(0);
#pragma GCC unroll 2
    for (int p = 0; p < ak_parts(k); p++) {
        int8x16_t q[8];
        ak_decode(k, blk, p, q);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++)
            isum[j] = aq_part(k, p, q, &sc, ak_act_qs(k, a[j] + (size_t)b * ab) + 128 * p, isum[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        const uint8_t *y = a[j] + (size_t)b * ab;
        const float da = ak_act_d(k, y);
        acc[j] = vfmaq_n_f32(acc[j], vcvtq_f32_s32(isum[j]), dw * da);
        if (ak_q81(k)) corr[j] += mw * arm_f16(y + offsetof(tr_blk_q8_1, s));
        if (ak_kmin(k)) corr[j] -= mw * da * (float)ak_min_dot(mn, y);
    }
}

TR_ALWAYS_INLINE void aq_impl(const int k, int64_t n, const int nc, float *restrict s,
                              size_t s_stride, const void *restrict vw, const void *restrict va,
                              size_t a_stride) {
    const int64_t nb = n / ak_elems(k);
    const size_t wb = ak_wbytes(k);
    const uint8_t *w = vw;
    const uint8_t *a[TR_MAX_NC];
    /* two accumulators per column: alternate blocks, so one column's FMAs do not wait on each
     * other's latency */
    float32x4_t acc0[TR_MAX_NC], acc1[TR_MAX_NC];
    float corr[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const uint8_t *)va + (size_t)j * a_stride;
        acc0[j] = acc1[j] = vdupq_n_f32(0.0f);
        corr[j] = 0.0f;
    }
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *blk = w + (size_t)b * wb;
        arm_prefetch_block(blk, 2 * wb);
        aq_block(k, nc, blk, a, b, acc0, corr);
        aq_block(k, nc, blk + wb, a, b + 1, acc1, corr);
    }
    if (b < nb) aq_block(k, nc, w + (size_t)b * wb, a, b, acc0, corr);
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++)
        s[(size_t)j * s_stride] = vaddvq_f32(vaddq_f32(acc0[j], acc1[j])) + corr[j];
}

#define AQ_IMPL(kind, fn)                                                                          \
    TR_ALWAYS_INLINE void fn(int64_t n, const int nc, float *restrict s, size_t ss,                \
                             const void *restrict w, const void *restrict a, size_t as) {          \
        aq_impl(kind, n, nc, s, ss, w, a, as);                                                     \
    }
AQ_IMPL(AK_Q4_0, arm_q4_0_impl)
AQ_IMPL(AK_Q4_1, arm_q4_1_impl)
AQ_IMPL(AK_Q5_0, arm_q5_0_impl)
AQ_IMPL(AK_Q5_1, arm_q5_1_impl)
AQ_IMPL(AK_Q8_0, arm_q8_0_impl)
AQ_IMPL(AK_IQ4_NL, arm_iq4_nl_impl)
AQ_IMPL(AK_MXFP4, arm_mxfp4_impl)
AQ_IMPL(AK_Q2_K, arm_q2_k_impl)
AQ_IMPL(AK_Q3_K, arm_q3_k_impl)
AQ_IMPL(AK_Q4_K, arm_q4_k_impl)
AQ_IMPL(AK_Q5_K, arm_q5_k_impl)
AQ_IMPL(AK_Q6_K, arm_q6_k_impl)
AQ_IMPL(AK_IQ4_XS, arm_iq4_xs_impl)
#undef AQ_IMPL

TR_ARM_DOT_ENTRIES(arm_dot_q4_0, arm_q4_0_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q4_1, arm_q4_1_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q5_0, arm_q5_0_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q5_1, arm_q5_1_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q8_0, arm_q8_0_impl)
TR_ARM_DOT_ENTRIES(arm_dot_iq4_nl, arm_iq4_nl_impl)
TR_ARM_DOT_ENTRIES(arm_dot_mxfp4, arm_mxfp4_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q2_k, arm_q2_k_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q3_k, arm_q3_k_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q4_k, arm_q4_k_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q5_k, arm_q5_k_impl)
TR_ARM_DOT_ENTRIES(arm_dot_q6_k, arm_q6_k_impl)
TR_ARM_DOT_ENTRIES(arm_dot_iq4_xs, arm_iq4_xs_impl)

/* dot_rows (kernels.h), the KV cache's scoring: one Q8_0 query against rows picked by index.
 * Each row is the single-column kernel inlined here (no call per key), the row four ahead
 * prefetched (the picks jump around the table). */
TR_ALWAYS_INLINE void arm_dot_rows(const int k, int64_t n_el, int64_t n, float *restrict out,
                                   const void *restrict rows, size_t row_bytes,
                                   const int32_t *restrict idx, const void *restrict a) {
    const uint8_t *base = rows;
    for (int64_t i = 0; i < n; i++) {
        if (i + 4 < n) arm_prefetch_at(base + (size_t)idx[i + 4] * row_bytes, row_bytes);
        aq_impl(k, n_el, 1, &out[i], 0, base + (size_t)idx[i] * row_bytes, a, 0);
    }
}
static __attribute__((unused)) void arm_dot_rows_q4_0(int64_t n_el, int64_t n, float *restrict out,
                                                      const void *restrict rows, size_t row_bytes,
                                                      const int32_t *restrict idx,
                                                      const void *restrict a) {
    arm_dot_rows(AK_Q4_0, n_el, n, out, rows, row_bytes, idx, a);
}
static __attribute__((unused)) void arm_dot_rows_q8_0(int64_t n_el, int64_t n, float *restrict out,
                                                      const void *restrict rows, size_t row_bytes,
                                                      const int32_t *restrict idx,
                                                      const void *restrict a) {
    arm_dot_rows(AK_Q8_0, n_el, n, out, rows, row_bytes, idx, a);
}

/* ------------------------------------------------------------------- two rows with SMMLA */

#if defined(__ARM_FEATURE_MATMUL_INT8)

TR_ALWAYS_INLINE int8x16_t zip_lo64(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}
TR_ALWAYS_INLINE int8x16_t zip_hi64(int8x16_t a, int8x16_t b) {
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}

/* acc + the 2x2 partial sums of one 16-element group: wl / wh the two weight rows' codes
 * interleaved by 8 (zip_lo64 / zip_hi64 of their groups), against the activation codes at x
 * (column 0) and y (column 1). The activations are interleaved by their loads (8 bytes of each
 * row into the two halves of a register), which take the load ports rather than the vector pipes
 * SMMLA needs. */
TR_ALWAYS_INLINE int32x4_t mm16(int32x4_t acc, int8x16_t wl, int8x16_t wh, const int8_t *x,
                                const int8_t *y) {
    acc = vmmlaq_s32(acc, wl, vcombine_s8(vld1_s8(x), vld1_s8(y)));
    return vmmlaq_s32(acc, wh, vcombine_s8(vld1_s8(x + 8), vld1_s8(y + 8)));
}

/* [s0, s0, s1, s1]: a per-row value for the 2x2 lanes */
TR_ALWAYS_INLINE int32x4_t rows_s32(int32_t s0, int32_t s1) {
    return vcombine_s32(vdup_n_s32(s0), vdup_n_s32(s1));
}
TR_ALWAYS_INLINE float32x4_t rows_f32(float s0, float s1) {
    return vcombine_f32(vdup_n_f32(s0), vdup_n_f32(s1));
}
/* [c0, c1, c0, c1]: a per-column value for the 2x2 lanes */
TR_ALWAYS_INLINE float32x4_t cols_f32(float c0, float c1) {
    const float32x2_t v = vset_lane_f32(c1, vdup_n_f32(c0), 1);
    return vcombine_f32(v, v);
}

/* Part p of the two weight blocks (interleaved codes wl, wh per group) against two activation
 * columns (codes at y0, y1) into the 2x2 lanes of isum */
TR_ALWAYS_INLINE int32x4_t aq2_part(int k, int p, const int8x16_t *wl, const int8x16_t *wh,
                                    const ak_scales *sc0, const ak_scales *sc1, const int8_t *y0,
                                    const int8_t *y1, int32x4_t isum) {
    const int32x4_t zero = vdupq_n_s32(0);
    if (!ak_super(k)) {
        isum = mm16(isum, wl[0], wh[0], y0, y1);
        return mm16(isum, wl[1], wh[1], y0 + 16, y1 + 16);
    }
    const int span = ak_scale_span(k) / 16;
    for (int g = 0; g < 8; g += span) {
        int32x4_t t = mm16(zero, wl[g], wh[g], y0 + 16 * g, y1 + 16 * g);
        if (span == 2) t = mm16(t, wl[g + 1], wh[g + 1], y0 + 16 * g + 16, y1 + 16 * g + 16);
        isum = vmlaq_s32(isum, t, rows_s32(sc0->sc[8 * p + g], sc1->sc[8 * p + g]));
    }
    return isum;
}

/* Two weight rows (w, w + w_stride) against nc activation rows, taken in pairs (an odd last row
 * is paired with itself): s[r + j * s_stride] = dot(row r, activation j). */
TR_ALWAYS_INLINE void aq2_impl(const int k, int64_t n, const int nc, float *restrict s,
                               size_t s_stride, const void *restrict vw, size_t w_stride,
                               const void *restrict va, size_t a_stride) {
    enum { NP = (TR_MAX_NC + 1) / 2 };
    const int np = (nc + 1) / 2;
    const int64_t nb = n / ak_elems(k);
    const size_t wb = ak_wbytes(k), ab = ak_abytes(k);
    const uint8_t *w0 = vw, *w1 = (const uint8_t *)vw + w_stride;
    const uint8_t *a[NP][2];
    float32x4_t acc[NP], corr[NP];
#pragma GCC unroll 2
    for (int P = 0; P < np; P++) {
        a[P][0] = (const uint8_t *)va + (size_t)(2 * P) * a_stride;
        a[P][1] = (const uint8_t *)va + (size_t)(2 * P + 1 < nc ? 2 * P + 1 : 2 * P) * a_stride;
        acc[P] = corr[P] = vdupq_n_f32(0.0f);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = w0 + (size_t)b * wb, *b1 = w1 + (size_t)b * wb;
        arm_prefetch_block(b0, wb);
        arm_prefetch_block(b1, wb);
        ak_scales sc0, sc1;
        int16x8_t mn0[2], mn1[2];
        if (ak_super(k)) ak_block_scales(k, b0, &sc0), ak_block_scales(k, b1, &sc1);
        if (ak_kmin(k)) ak_mins16(&sc0, mn0), ak_mins16(&sc1, mn1);
        const float32x4_t dw = rows_f32(ak_d(k, b0), ak_d(k, b1));
        float32x4_t mw = vdupq_n_f32(0.0f);
        if (ak_q81(k) || ak_kmin(k)) mw = rows_f32(ak_dmin(k, b0), ak_dmin(k, b1));
        int32x4_t isum[NP];
#pragma GCC unroll 2
        for (int P = 0; P < np; P++) isum[P] = vdupq_n_s32(0);
#pragma GCC unroll 2
        for (int p = 0; p < ak_parts(k); p++) {
            /* decoded once, interleaved once, for every pair of activation rows */
            int8x16_t q0[8], q1[8], wl[8], wh[8];
            ak_decode(k, b0, p, q0);
            ak_decode(k, b1, p, q1);
            for (int g = 0; g < ak_groups(k); g++) {
                wl[g] = zip_lo64(q0[g], q1[g]);
                wh[g] = zip_hi64(q0[g], q1[g]);
            }
#pragma GCC unroll 2
            for (int P = 0; P < np; P++)
                isum[P] = aq2_part(k, p, wl, wh, &sc0, &sc1,
                                   ak_act_qs(k, a[P][0] + (size_t)b * ab) + 128 * p,
                                   ak_act_qs(k, a[P][1] + (size_t)b * ab) + 128 * p, isum[P]);
        }
#pragma GCC unroll 2
        for (int P = 0; P < np; P++) {
            const uint8_t *y0 = a[P][0] + (size_t)b * ab, *y1 = a[P][1] + (size_t)b * ab;
            const float32x4_t da = cols_f32(ak_act_d(k, y0), ak_act_d(k, y1));
            acc[P] = vfmaq_f32(acc[P], vcvtq_f32_s32(isum[P]), vmulq_f32(dw, da));
            if (ak_q81(k))
                corr[P] = vfmaq_f32(corr[P], mw,
                                    cols_f32(arm_f16(y0 + offsetof(tr_blk_q8_1, s)),
                                             arm_f16(y1 + offsetof(tr_blk_q8_1, s))));
            if (ak_kmin(k)) {
                const float m00 = (float)ak_min_dot(mn0, y0), m01 = (float)ak_min_dot(mn0, y1);
                const float m10 = (float)ak_min_dot(mn1, y0), m11 = (float)ak_min_dot(mn1, y1);
                const float32x2_t r0 = vset_lane_f32(m01, vdup_n_f32(m00), 1);
                const float32x2_t r1 = vset_lane_f32(m11, vdup_n_f32(m10), 1);
                corr[P] = vfmsq_f32(corr[P], vmulq_f32(mw, da), vcombine_f32(r0, r1));
            }
        }
    }
#pragma GCC unroll 2
    for (int P = 0; P < np; P++) {
        /* the row sums in f32 lanes; the min terms were kept apart, as in the one-row kernel */
        float t[4], c[4];
        vst1q_f32(t, acc[P]);
        vst1q_f32(c, corr[P]);
        const int j0 = 2 * P, j1 = 2 * P + 1;
        s[(size_t)j0 * s_stride] = t[0] + c[0];
        s[1 + (size_t)j0 * s_stride] = t[2] + c[2];
        if (j1 < nc) {
            s[(size_t)j1 * s_stride] = t[1] + c[1];
            s[1 + (size_t)j1 * s_stride] = t[3] + c[3];
        }
    }
}

#define AQ2_ENTRY(name, kind)                                                                      \
    static __attribute__((unused)) void name(int64_t n, int nc, float *restrict s,                 \
                                             size_t s_stride, const void *restrict w,              \
                                             size_t w_stride, const void *restrict a,              \
                                             size_t a_stride) {                                    \
        switch (nc) {                                                                              \
        case 1: aq2_impl(kind, n, 1, s, s_stride, w, w_stride, a, a_stride); break;                \
        case 2: aq2_impl(kind, n, 2, s, s_stride, w, w_stride, a, a_stride); break;                \
        case 3: aq2_impl(kind, n, 3, s, s_stride, w, w_stride, a, a_stride); break;                \
        default: aq2_impl(kind, n, 4, s, s_stride, w, w_stride, a, a_stride); break;               \
        }                                                                                          \
    }
AQ2_ENTRY(arm_dot2_q4_0, AK_Q4_0)
AQ2_ENTRY(arm_dot2_q4_1, AK_Q4_1)
AQ2_ENTRY(arm_dot2_q5_0, AK_Q5_0)
AQ2_ENTRY(arm_dot2_q5_1, AK_Q5_1)
AQ2_ENTRY(arm_dot2_q8_0, AK_Q8_0)
AQ2_ENTRY(arm_dot2_iq4_nl, AK_IQ4_NL)
AQ2_ENTRY(arm_dot2_mxfp4, AK_MXFP4)
AQ2_ENTRY(arm_dot2_q2_k, AK_Q2_K)
AQ2_ENTRY(arm_dot2_q3_k, AK_Q3_K)
AQ2_ENTRY(arm_dot2_q4_k, AK_Q4_K)
AQ2_ENTRY(arm_dot2_q5_k, AK_Q5_K)
AQ2_ENTRY(arm_dot2_q6_k, AK_Q6_K)
AQ2_ENTRY(arm_dot2_iq4_xs, AK_IQ4_XS)
#undef AQ2_ENTRY

#endif /* __ARM_FEATURE_MATMUL_INT8 */

#endif /* __aarch64__ */
#endif
