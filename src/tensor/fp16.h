/*
 * Scalar conversions between f32 and the 16-bit float formats, bit-exact with ggml's reference
 * (round to nearest even; BF16 quiets NaNs), plus the E8M0 scale of MXFP4.
 */
#ifndef TR_TENSOR_FP16_H
#define TR_TENSOR_FP16_H

#include <stdint.h>
#include <string.h>

static inline float tr_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t tr_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* binary16 -> binary32, exact for normals, subnormals, infinities and NaNs. */
static inline float tr_f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    /* normals: shift exponent/mantissa into place and rescale by 2^-112 */
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = tr_bits_to_f32(0x7800000u); /* 2^-112 */
    const float normalized = tr_bits_to_f32((two_w >> 4) + exp_offset) * exp_scale;
    /* subnormals: use the magic-number trick */
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = tr_bits_to_f32((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denorm_cutoff = 1u << 27;
    const uint32_t result = sign | (two_w < denorm_cutoff ? tr_f32_to_bits(denormalized)
                                                          : tr_f32_to_bits(normalized));
    return tr_bits_to_f32(result);
}

/* binary32 -> binary16, round to nearest even; overflow to inf, NaN stays NaN. */
static inline uint16_t tr_f32_to_f16(float f) {
    const float scale_to_inf = tr_bits_to_f32(0x77800000u);  /* 2^112 */
    const float scale_to_zero = tr_bits_to_f32(0x08800000u); /* 2^-110 */
    float base = (f < 0 ? -f : f) * scale_to_inf;
    base *= scale_to_zero;
    const uint32_t w = tr_f32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = tr_bits_to_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = tr_f32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float tr_bf16_to_f32(uint16_t h) {
    return tr_bits_to_f32((uint32_t)h << 16);
}

static inline uint16_t tr_f32_to_bf16(float f) {
    uint32_t u = tr_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* MXFP4 block scale: 2^(e-128) (half the OCP E8M0 value; the value table is doubled). */
static inline float tr_e8m0_to_f32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    return tr_bits_to_f32(bits);
}

#endif
