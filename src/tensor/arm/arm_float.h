/*
 * Dot products for the float weight types F32, F16 and BF16 against activations in the same
 * format (GGUF-FACTS §2.4), 128-bit NEON. F16 widens with FCVTL and BF16 with a 16-bit shift
 * (both exact, ARMv8.0), then f32 fused multiply-adds: only the summation order and the fused
 * rounding differ from the reference, as on x86. n is any positive count: the ragged tail is
 * copied into a zeroed buffer, so no load reads past the row.
 */
#ifndef TR_TENSOR_ARM_FLOAT_H
#define TR_TENSOR_ARM_FLOAT_H

#include "tensor/arm/neon_common.h"

#if defined(__aarch64__)

enum { AF_F32, AF_F16, AF_BF16 };

TR_ALWAYS_INLINE size_t af_elem_bytes(int kind) { return kind == AF_F32 ? 4 : 2; }

/* 8 elements at p (any alignment) -> two f32 vectors */
TR_ALWAYS_INLINE void af_load8(int kind, const uint8_t *p, float32x4_t *lo, float32x4_t *hi) {
    if (kind == AF_F32) {
        *lo = vreinterpretq_f32_u8(vld1q_u8(p));
        *hi = vreinterpretq_f32_u8(vld1q_u8(p + 16));
        return;
    }
    const uint16x8_t h = ld_u16x8(p);
    if (kind == AF_F16) {
        *lo = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
        *hi = vcvt_high_f32_f16(vreinterpretq_f16_u16(h));
    } else {
        *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16));
        *hi = vreinterpretq_f32_u32(vshll_high_n_u16(h, 16));
    }
}

TR_ALWAYS_INLINE void af_impl(const int kind, int64_t n, const int nc, float *restrict s,
                              size_t s_stride, const void *restrict vw, const void *restrict va,
                              size_t a_stride) {
    const size_t eb = af_elem_bytes(kind);
    const uint8_t *w = vw;
    const uint8_t *a[TR_MAX_NC];
    /* four accumulators per column: 16 elements a step, no FMA waits on the previous one */
    float32x4_t acc[4][TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const uint8_t *)va + (size_t)j * a_stride;
        acc[0][j] = acc[1][j] = acc[2][j] = acc[3][j] = vdupq_n_f32(0.0f);
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const uint8_t *wp = w + (size_t)i * eb;
        arm_prefetch_block(wp, 16 * eb);
        float32x4_t x[4];
        af_load8(kind, wp, &x[0], &x[1]);
        af_load8(kind, wp + 8 * eb, &x[2], &x[3]);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            float32x4_t y[4];
            af_load8(kind, a[j] + (size_t)i * eb, &y[0], &y[1]);
            af_load8(kind, a[j] + (size_t)(i + 8) * eb, &y[2], &y[3]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[u][j] = vfmaq_f32(acc[u][j], x[u], y[u]);
        }
    }
    if (i < n) { /* 1..15 elements, zero-padded: zeros add nothing to a dot product */
        uint8_t wt[64] = {0};
        memcpy(wt, w + (size_t)i * eb, (size_t)(n - i) * eb);
        float32x4_t x[4];
        af_load8(kind, wt, &x[0], &x[1]);
        af_load8(kind, wt + 8 * eb, &x[2], &x[3]);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            uint8_t at[64] = {0};
            memcpy(at, a[j] + (size_t)i * eb, (size_t)(n - i) * eb);
            float32x4_t y[4];
            af_load8(kind, at, &y[0], &y[1]);
            af_load8(kind, at + 8 * eb, &y[2], &y[3]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[u][j] = vfmaq_f32(acc[u][j], x[u], y[u]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++)
        s[(size_t)j * s_stride] = vaddvq_f32(
            vaddq_f32(vaddq_f32(acc[0][j], acc[1][j]), vaddq_f32(acc[2][j], acc[3][j])));
}

#define AF_IMPL(kind, fn)                                                                          \
    TR_ALWAYS_INLINE void fn(int64_t n, const int nc, float *restrict s, size_t ss,                \
                             const void *restrict w, const void *restrict a, size_t as) {          \
        af_impl(kind, n, nc, s, ss, w, a, as);                                                     \
    }
AF_IMPL(AF_F32, arm_f32_impl)
AF_IMPL(AF_F16, arm_f16_impl)
AF_IMPL(AF_BF16, arm_bf16_impl)
#undef AF_IMPL

TR_ARM_DOT_ENTRIES(arm_dot_f32, arm_f32_impl)
TR_ARM_DOT_ENTRIES(arm_dot_f16, arm_f16_impl)
TR_ARM_DOT_ENTRIES(arm_dot_bf16, arm_bf16_impl)

#endif /* __aarch64__ */
#endif
