/*
 * Element-wise kernels of the forward pass (kernels.h: rmsnorm, swiglu, geglu) for the AVX2 and
 * AVX-512 families, with the scalar references' arithmetic (src/model/ops.c): RMSNorm squares in
 * f32 and sums them in double (only the order of the double sum differs), then scales and
 * multiplies by the weight as two f32 products; GEGLU looks GELU up in the caller's F16 table
 * (gathered, 8 or 16 at a time). SwiGLU's exp is the family's (vecf_x86.h), as llama.cpp's CPU
 * SiLU uses a vector exp of its own.
 */
#ifndef TR_TENSOR_X86_EW_X86_H
#define TR_TENSOR_X86_EW_X86_H

#include "tensor/x86/vecf_x86.h"

#if defined(__x86_64__)

static __attribute__((unused)) void av_rmsnorm(float *y, const float *x, const float *w,
                                               int64_t n, float eps) {
    av_d acc = av_dzero();
    int64_t i = 0;
    for (; i + AV_W <= n; i += AV_W) {
        const av_f v = av_load(x + i);
        acc = av_dsum(acc, av_mul(v, v));
    }
    double sum = av_dhsum(acc);
    for (; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    const av_f vs = av_set1(scale);
    for (i = 0; i + AV_W <= n; i += AV_W) {
        const av_f v = av_mul(av_load(x + i), vs);
        av_store(y + i, w ? av_mul(v, av_load(w + i)) : v);
    }
    for (; i < n; i++) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

static __attribute__((unused)) void av_swiglu(float *g, const float *u, int64_t n) {
    const av_f one = av_set1(1.0f);
    int64_t i = 0;
    for (; i + AV_W <= n; i += AV_W) {
        const av_f x = av_load(g + i);
#if AV_W == 16
        const av_f s = _mm512_div_ps(x, _mm512_add_ps(one, av_exp(_mm512_sub_ps(_mm512_setzero_ps(), x))));
#else
        const av_f s = _mm256_div_ps(x, _mm256_add_ps(one, av_exp(_mm256_sub_ps(_mm256_setzero_ps(), x))));
#endif
        av_store(g + i, av_mul(s, av_load(u + i)));
    }
    for (; i < n; i++) g[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

/* table: gelu of every F16 bit pattern, as F16, with at least one entry of padding after the
 * last (the gathers read 4 bytes at 2·h) */
static __attribute__((unused)) void av_geglu(float *g, const float *u, int64_t n,
                                             const uint16_t *table) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
        const __m256i t = _mm256_i32gather_epi32((const int *)(const void *)table, h, 2);
        const __m256i lo = _mm256_and_si256(t, _mm256_set1_epi32(0xFFFF));
        const __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
        __m256 y = _mm256_cvtph_ps(p);
        /* x <= -10: 0; x >= 10: x (the reference's branches; NaN takes the table's value) */
        y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
        y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(y, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) {
        const float x = g[i];
        const float y = x <= -10.0f ? 0.0f : x >= 10.0f ? x : x86_f16(table[tr_f32_to_f16(x)]);
        g[i] = y * u[i];
    }
}

/* y = x rounded to F16 and back (kernels.h f16_round): the F16C conversions round to nearest
 * even like tr_f32_to_f16, subnormals included (MXCSR has no FTZ/DAZ set); only a NaN's payload
 * can differ, so a vector holding a NaN is done by the reference */
static __attribute__((unused)) void av_f16_round_row(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + AV_W <= n; i += AV_W) {
        const av_f v = av_load(x + i);
#if AV_W == 16
        if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
#else
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
#endif
            tr_f16_round_ref(y + i, x + i, AV_W);
            continue;
        }
        av_store(y + i, av_f16_round(v));
    }
    tr_f16_round_ref(y + i, x + i, n - i);
}

#endif /* __x86_64__ */
#endif
