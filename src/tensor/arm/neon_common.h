/*
 * Helpers shared by the Arm kernel files (kernels_neon.c, kernels_dotprod.c, kernels_i8mm.c).
 * Each of them includes the arm_*.h headers and gets its own copy of every kernel compiled for
 * its level: the byte dot product below is one SDOT where the including file is built with
 * +dotprod, and a widening multiply with a pairwise add-accumulate (ARMv8.0) where it is not, so
 * the kernels written on top of it need no second copy of their code.
 *
 * Memory access: every vector load is vld1 (no alignment requirement), every scalar field of a
 * block is read with memcpy, so rows at any byte offset are fine (GGUF alignment may be 1).
 */
#ifndef TR_TENSOR_ARM_NEON_COMMON_H
#define TR_TENSOR_ARM_NEON_COMMON_H

#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#include "tensor/fp16.h"
#include "tensor/kernels.h"

/* Kernels are written once with the column count `nc` (and the weight type) as parameters;
 * forcing inlining into call sites where both are constants lets the compiler unroll the column
 * loops and keep every accumulator in a register. */
#define TR_ALWAYS_INLINE static inline __attribute__((always_inline))

#if defined(__ARM_FEATURE_DOTPROD)
#define TR_ARM_DOTPROD 1
#else
#define TR_ARM_DOTPROD 0
#endif

/* Software prefetch distance in bytes ahead of the weight pointer: a matvec streams the weights
 * once, and a prefetch past the end of a matrix is harmless (PRFM never faults). */
#define TR_ARM_PF_DIST 1024
TR_ALWAYS_INLINE void arm_prefetch(const void *p) {
    __builtin_prefetch((const char *)p + TR_ARM_PF_DIST, 0, 3);
}
TR_ALWAYS_INLINE void arm_prefetch_block(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) arm_prefetch((const char *)p + o);
}
/* every cache line of the `bytes` at p itself (rows picked by index, no stream to run ahead of) */
TR_ALWAYS_INLINE void arm_prefetch_at(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 3);
}

/* the f16 at p (any alignment) as f32: FCVT, exact like tr_f16_to_f32 (FPCR.FZ16 is clear) */
TR_ALWAYS_INLINE float arm_f16(const void *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h;
}
TR_ALWAYS_INLINE float arm_f32(const void *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* 16-bit lanes from any address (byte loads: no pointer of a wider type is ever formed) */
TR_ALWAYS_INLINE int16x8_t ld_s16x8(const void *p) {
    return vreinterpretq_s16_u8(vld1q_u8((const uint8_t *)p));
}
TR_ALWAYS_INLINE uint16x8_t ld_u16x8(const void *p) {
    return vreinterpretq_u16_u8(vld1q_u8((const uint8_t *)p));
}

/* acc + dot products of 16 signed bytes: the four int32 lanes hold sums of four products each.
 * Which products a lane holds differs between the two forms, so callers only ever use the sum of
 * the four lanes (or multiply all four by one scale). Without SDOT, two products share an int16
 * lane before the pairwise add: |a·b + a'·b'| <= 2·128·127 < 32767 because one side is always an
 * activation code, which the quantizers keep in -127..127. */
TR_ALWAYS_INLINE int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if TR_ARM_DOTPROD
    return vdotq_s32(acc, a, b);
#else
    int16x8_t p = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    p = vmlal_high_s8(p, a, b);
    return vpadalq_s16(acc, p);
#endif
}

/* 16 packed nibbles (GGUF order) -> low nibbles (elements 0..15) and high nibbles (16..31) */
TR_ALWAYS_INLINE void unpack_nibbles(const uint8_t *qs, uint8x16_t *lo, uint8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vandq_u8(v, vdupq_n_u8(0x0F));
    *hi = vshrq_n_u8(v, 4);
}

/* the 32 bits at qh -> two vectors of 16 bytes, byte i 0xFF where bit i (resp. 16 + i) is set
 * (the fifth bit of Q5_0 / Q5_1) */
TR_ALWAYS_INLINE void expand_bits32(const uint8_t *qh, uint8x16_t *b0, uint8x16_t *b1) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const uint8x16_t v = vreinterpretq_u8_u32(vdupq_n_u32(bits));
    static const uint8_t pick0[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t pick1[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vld1q_u8(bit);
    *b0 = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(pick0)), m);
    *b1 = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(pick1)), m);
}

/* vec_dot and vec_dot_nc entry points for an impl(n, nc, s, s_stride, w, a, a_stride) */
#define TR_ARM_DOT_ENTRIES(name, impl)                                                             \
    static __attribute__((unused)) void name(int64_t n, float *restrict s, const void *restrict w, \
                                             const void *restrict a) {                             \
        impl(n, 1, s, 0, w, a, 0);                                                                 \
    }                                                                                              \
    static __attribute__((unused)) void name##_nc(int64_t n, int nc, float *restrict s,            \
                                                  size_t s_stride, const void *restrict w,         \
                                                  const void *restrict a, size_t a_stride) {       \
        switch (nc) {                                                                              \
        case 1: impl(n, 1, s, s_stride, w, a, a_stride); break;                                    \
        case 2: impl(n, 2, s, s_stride, w, a, a_stride); break;                                    \
        case 3: impl(n, 3, s, s_stride, w, a, a_stride); break;                                    \
        default: impl(n, 4, s, s_stride, w, a, a_stride); break;                                   \
        }                                                                                          \
    }

#endif /* __aarch64__ */
#endif
