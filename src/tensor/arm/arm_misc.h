/*
 * The activation quantizers (Q8_0, Q8_1, Q8_K, F16, BF16), bit-identical with the scalar ones in
 * quantize.c, and the KV cache's value kernels (axpy_rows over Q4_0 / Q8_0 rows, axpy_f16), for
 * the Arm kernel files. Only ARMv8.0 NEON: these are the same at every level.
 */
#ifndef TR_TENSOR_ARM_MISC_H
#define TR_TENSOR_ARM_MISC_H

#include "tensor/arm/neon_common.h"

#if defined(__aarch64__)

/* max |x| over 4n floats. FMAXNM ignores a NaN operand the way fmaxf does. */
TR_ALWAYS_INLINE float amax_f32(const float32x4_t *v, int n) {
    float32x4_t m = vabsq_f32(v[0]);
    for (int i = 1; i < n; i++) m = vmaxnmq_f32(m, vabsq_f32(v[i]));
    return vmaxnmvq_f32(m);
}

/* round to nearest even (FCVTNS, what nearbyintf does in the default mode), 16 at a time,
 * narrowed with saturation (the values are within -127..127, so nothing saturates) */
TR_ALWAYS_INLINE int8x16_t round_pack16(const float32x4_t *v, float scale) {
    int32x4_t q[4];
    for (int i = 0; i < 4; i++) q[i] = vcvtnq_s32_f32(vmulq_n_f32(v[i], scale));
    const int16x8_t a = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
    const int16x8_t b = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
    return vcombine_s8(vqmovn_s16(a), vqmovn_s16(b));
}

TR_ALWAYS_INLINE void put_f16(uint8_t *p, float f) {
    const uint16_t h = tr_f32_to_f16(f); /* the reference's own rounding of the scale */
    memcpy(p, &h, 2);
}

/* same arithmetic as tr_quant_q8_0: d = amax/127 rounded by the same routine, x·(127/amax) */
static __attribute__((unused)) void arm_quant_q8_0(const float *restrict x, void *restrict vy,
                                                   int64_t n) {
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / TR_QK32; b++, x += TR_QK32, y += sizeof(tr_blk_q8_0)) {
        float32x4_t v[8];
        for (int i = 0; i < 8; i++) v[i] = vld1q_f32(x + 4 * i);
        const float amax = amax_f32(v, 8);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        put_f16(y, d);
        vst1q_s8((int8_t *)y + 2, round_pack16(v, id));
        vst1q_s8((int8_t *)y + 18, round_pack16(v + 4, id));
    }
}

/* same arithmetic as tr_quant_q8_1: x·(1/d), and s = (Σ codes)·d */
static __attribute__((unused)) void arm_quant_q8_1(const float *restrict x, void *restrict vy,
                                                   int64_t n) {
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / TR_QK32; b++, x += TR_QK32, y += sizeof(tr_blk_q8_1)) {
        float32x4_t v[8];
        for (int i = 0; i < 8; i++) v[i] = vld1q_f32(x + 4 * i);
        const float amax = amax_f32(v, 8);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int8x16_t q0 = round_pack16(v, id), q1 = round_pack16(v + 4, id);
        vst1q_s8((int8_t *)y + 4, q0);
        vst1q_s8((int8_t *)y + 20, q1);
        const int sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
        put_f16(y, d);
        put_f16(y + 2, (float)sum * d);
    }
}

/* same arithmetic as tr_quant_q8_k: the element of largest magnitude (the first on ties) keeps
 * its sign, iscale = -127/max, codes rounded to nearest even and capped at 127 */
static __attribute__((unused)) void arm_quant_q8_k(const float *restrict x, void *restrict vy,
                                                   int64_t n) {
    uint8_t *y = vy;
    for (int64_t b = 0; b < n / TR_QK_K; b++, x += TR_QK_K, y += sizeof(tr_blk_q8_k)) {
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int i = 0; i < 64; i++) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + 4 * i)));
        const float amax = vmaxnmvq_f32(m);
        if (amax == 0.0f) {
            memset(y, 0, sizeof(tr_blk_q8_k));
            continue;
        }
        float max = 0.0f;
        for (int i = 0; i < 64; i++) {
            const uint32x4_t hit = vceqq_f32(vabsq_f32(vld1q_f32(x + 4 * i)), vdupq_n_f32(amax));
            if (vmaxvq_u32(hit)) {
                int l = 0;
                while (fabsf(x[4 * i + l]) != amax) l++;
                max = x[4 * i + l];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const int32x4_t cap = vdupq_n_s32(127);
        int8_t *qs = (int8_t *)y + offsetof(tr_blk_q8_k, qs);
        int16_t bsums[16];
        for (int g = 0; g < 16; g++) {
            int32x4_t q[4];
            for (int i = 0; i < 4; i++)
                q[i] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 16 * g + 4 * i), iscale)),
                                 cap);
            const int16x8_t a = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            const int16x8_t c = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            const int8x16_t v = vcombine_s8(vqmovn_s16(a), vqmovn_s16(c));
            vst1q_s8(qs + 16 * g, v);
            bsums[g] = vaddlvq_s8(v);
        }
        memcpy(y + offsetof(tr_blk_q8_k, bsums), bsums, sizeof bsums);
        const float d = 1.0f / iscale;
        memcpy(y + offsetof(tr_blk_q8_k, d), &d, 4);
    }
}

/* f32 -> f16 with FCVTN (round to nearest even, the FPCR default, subnormals kept), NaNs made
 * the reference's 0x7E00 with the sign */
static __attribute__((unused)) void arm_quant_f16(const float *restrict x, void *restrict vy,
                                                  int64_t n) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        const uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(v));
        const uint16x4_t nan = vmovn_u32(vmvnq_u32(vceqq_f32(v, v)));
        const uint16x4_t qnan =
            vorr_u16(vshrn_n_u32(vandq_u32(vreinterpretq_u32_f32(v), vdupq_n_u32(0x80000000u)), 16),
                     vdup_n_u16(0x7E00));
        vst1_u8(y + 2 * i, vreinterpret_u8_u16(vbsl_u16(nan, qnan, h)));
    }
    for (; i < n; i++) {
        const uint16_t h = tr_f32_to_f16(x[i]);
        memcpy(y + 2 * i, &h, 2);
    }
}

/* f32 -> bf16: round to nearest even on the bits, NaNs quieted, as tr_f32_to_bf16 */
static __attribute__((unused)) void arm_quant_bf16(const float *restrict x, void *restrict vy,
                                                   int64_t n) {
    uint8_t *y = vy;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(x + i));
        const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
        const uint16x4_t r = vshrn_n_u32(vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7FFFu), lsb)), 16);
        const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7FFFFFFFu)),
                                         vdupq_n_u32(0x7F800000u));
        const uint16x4_t qnan = vorr_u16(vshrn_n_u32(u, 16), vdup_n_u16(64));
        vst1_u8(y + 2 * i, vreinterpret_u8_u16(vbsl_u16(vmovn_u32(nan), qnan, r)));
    }
    for (; i < n; i++) {
        const uint16_t h = tr_f32_to_bf16(x[i]);
        memcpy(y + 2 * i, &h, 2);
    }
}

/* axpy_f16 (kernels.h): 8 values a step, widened exactly (FCVTL), multiplied, then added — no
 * fused multiply-add, so the bits are the reference's */
static __attribute__((unused)) void arm_axpy_f16(int64_t n, float *restrict out,
                                                 const uint16_t *restrict v, float p) {
    int64_t d = 0;
    for (; d + 8 <= n; d += 8) {
        const uint16x8_t h = ld_u16x8(v + d);
        const float32x4_t lo = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
        const float32x4_t hi = vcvt_high_f32_f16(vreinterpretq_f16_u16(h));
        vst1q_f32(out + d, vaddq_f32(vld1q_f32(out + d), vmulq_n_f32(lo, p)));
        vst1q_f32(out + d + 4, vaddq_f32(vld1q_f32(out + d + 4), vmulq_n_f32(hi, p)));
    }
    for (; d < n; d++) out[d] += p * tr_f16_to_f32(v[d]);
}

/* ------------------------------------------------------------------------------ axpy_rows */

/* 16 elements (half h of a 32-element block) of a Q8_0 or Q4_0 row block as f32, without d */
TR_ALWAYS_INLINE void axpy_decode16(bool q8, const uint8_t *blk, int h, float32x4_t x[4]) {
    int8x16_t c;
    if (q8) {
        c = vld1q_s8((const int8_t *)blk + offsetof(tr_blk_q8_0, qs) + 16 * h);
    } else {
        const uint8x16_t v = vld1q_u8(blk + offsetof(tr_blk_q4_0, qs));
        const uint8x16_t u = h ? vshrq_n_u8(v, 4) : vandq_u8(v, vdupq_n_u8(0x0F));
        c = vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(8));
    }
    const int16x8_t lo = vmovl_s8(vget_low_s8(c)), hi = vmovl_high_s8(c);
    x[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    x[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    x[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    x[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

/* Rows are taken 64 at a time (they stay in L1 across the blocks); for each half block and up to
 * 4 weight vectors, the 16 accumulators stay in registers over the tile's rows, so a row costs
 * its decode plus 4 FMAs per vector and nothing is stored in between. */
#define ARM_AXPY_TILE 64

TR_ALWAYS_INLINE void axpy_tile(bool q8, int m, int64_t i0, int64_t i1, int64_t b, int h,
                                float *restrict out, size_t out_stride, const float *restrict w,
                                size_t w_stride, const uint8_t *base, size_t row_bytes, size_t bb,
                                const int32_t *restrict idx) {
    float32x4_t acc[4][4];
    for (int v = 0; v < m; v++)
        for (int u = 0; u < 4; u++) acc[v][u] = vdupq_n_f32(0.0f);
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *blk = base + (size_t)idx[i] * row_bytes + (size_t)b * bb;
        float32x4_t x[4];
        axpy_decode16(q8, blk, h, x);
        const float d = arm_f16(blk);
        for (int v = 0; v < m; v++) {
            const float sv = w[(size_t)v * w_stride + (size_t)i] * d;
            for (int u = 0; u < 4; u++) acc[v][u] = vfmaq_n_f32(acc[v][u], x[u], sv);
        }
    }
    for (int v = 0; v < m; v++) {
        float *o = out + (size_t)v * out_stride + (size_t)b * TR_QK32 + 16 * (size_t)h;
        for (int u = 0; u < 4; u++) vst1q_f32(o + 4 * u, vaddq_f32(vld1q_f32(o + 4 * u), acc[v][u]));
    }
}

TR_ALWAYS_INLINE void arm_axpy_rows(bool q8, int64_t n_el, int64_t n, int nw, float *restrict out,
                                    size_t out_stride, const float *restrict w, size_t w_stride,
                                    const void *restrict rows, size_t row_bytes,
                                    const int32_t *restrict idx) {
    const int64_t nb = n_el / TR_QK32;
    const size_t bb = q8 ? sizeof(tr_blk_q8_0) : sizeof(tr_blk_q4_0);
    const uint8_t *base = rows;
    for (int64_t i0 = 0; i0 < n; i0 += ARM_AXPY_TILE) {
        const int64_t i1 = i0 + ARM_AXPY_TILE < n ? i0 + ARM_AXPY_TILE : n;
        for (int64_t b = 0; b < nb; b++)
            for (int h = 0; h < 2; h++)
                for (int v0 = 0; v0 < nw; v0 += 4) {
                    float *o = out + (size_t)v0 * out_stride;
                    const float *wv = w + (size_t)v0 * w_stride;
                    /* m a constant after inlining: the accumulators are registers */
                    switch (nw - v0 < 4 ? nw - v0 : 4) {
                    case 1: axpy_tile(q8, 1, i0, i1, b, h, o, out_stride, wv, w_stride, base, row_bytes, bb, idx); break;
                    case 2: axpy_tile(q8, 2, i0, i1, b, h, o, out_stride, wv, w_stride, base, row_bytes, bb, idx); break;
                    case 3: axpy_tile(q8, 3, i0, i1, b, h, o, out_stride, wv, w_stride, base, row_bytes, bb, idx); break;
                    default: axpy_tile(q8, 4, i0, i1, b, h, o, out_stride, wv, w_stride, base, row_bytes, bb, idx); break;
                    }
                }
    }
}

static __attribute__((unused)) void arm_axpy_rows_q8_0(int64_t n_el, int64_t n, int nw,
                                                       float *restrict out, size_t out_stride,
                                                       const float *restrict w, size_t w_stride,
                                                       const void *restrict rows, size_t row_bytes,
                                                       const int32_t *restrict idx) {
    arm_axpy_rows(true, n_el, n, nw, out, out_stride, w, w_stride, rows, row_bytes, idx);
}
static __attribute__((unused)) void arm_axpy_rows_q4_0(int64_t n_el, int64_t n, int nw,
                                                       float *restrict out, size_t out_stride,
                                                       const float *restrict w, size_t w_stride,
                                                       const void *restrict rows, size_t row_bytes,
                                                       const int32_t *restrict idx) {
    arm_axpy_rows(false, n_el, n, nw, out, out_stride, w, w_stride, rows, row_bytes, idx);
}

#endif /* __aarch64__ */
#endif
