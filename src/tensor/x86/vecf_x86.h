/*
 * f32 vector helpers shared by the attention and element-wise kernels of the x86 families:
 * 512-bit where the including file is built with AVX-512, 256-bit otherwise.
 */
#ifndef TR_TENSOR_X86_VECF_X86_H
#define TR_TENSOR_X86_VECF_X86_H

#include <math.h>

#include "tensor/x86/simd_common.h"

#if defined(__x86_64__)

#if defined(__AVX512F__)
#define AV_W 16
#define AV_QI 4 /* queries per register tile */
typedef __m512 av_f;
#define av_load _mm512_loadu_ps
#define av_store _mm512_storeu_ps
#define av_set1 _mm512_set1_ps
#define av_zero _mm512_setzero_ps
#define av_fma _mm512_fmadd_ps
#define av_mul _mm512_mul_ps
#define av_sub _mm512_sub_ps
#define av_max _mm512_max_ps
#define av_hmax _mm512_reduce_max_ps
#else
#define AV_W 8
#define AV_QI 2
typedef __m256 av_f;
#define av_load _mm256_loadu_ps
#define av_store _mm256_storeu_ps
#define av_set1 _mm256_set1_ps
#define av_zero _mm256_setzero_ps
#define av_fma _mm256_fmadd_ps
#define av_mul _mm256_mul_ps
#define av_sub _mm256_sub_ps
#define av_max _mm256_max_ps
TR_ALWAYS_INLINE float av_hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
#endif
#define AV_NV 4 /* vectors per register tile: 64 (32) keys or dimensions */
#define AV_CH (AV_NV * AV_W)

/* exp(x): Cephes' expf polynomial on x - n·ln 2, then exact scaling by 2^n; below -86 (near
 * where expf turns subnormal, and where the -inf of masked attention keys lands) it returns 0,
 * from the first float above ln(FLT_MAX) on +inf as expf does (so SiLU's x / (1 + exp(-x)) is
 * ±0 there, not a subnormal), and exp(88.3) between 88.3 and that. Within 2 ulp of expf below
 * 88.3. llama.cpp's CPU softmax and SiLU use an approximation of their own of the same accuracy.
 * NaN gives NaN, as expf does: the clamps take x as their second operand, which max/min return
 * when either is NaN (a NaN score or gate must reach the forward pass's finiteness checks). */
TR_ALWAYS_INLINE av_f av_exp(av_f x) {
#if AV_W == 16
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-86.0f), _CMP_LT_OQ);
    const __mmask16 huge = _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283935546875f), _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-86.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-86.0f), _CMP_LT_OQ);
    const __m256 huge = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.3f), _mm256_max_ps(_mm256_set1_ps(-86.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
    av_f r = av_fma(n, av_set1(-0.693359375f), x);
    r = av_fma(n, av_set1(2.12194440e-4f), r);
    av_f p = av_set1(1.9875691500e-4f);
    p = av_fma(p, r, av_set1(1.3981999507e-3f));
    p = av_fma(p, r, av_set1(8.3334519073e-3f));
    p = av_fma(p, r, av_set1(4.1665795894e-2f));
    p = av_fma(p, r, av_set1(1.6666665459e-1f));
    p = av_fma(p, r, av_set1(5.0000001201e-1f));
    p = av_fma(p, av_mul(r, r), r);
#if AV_W == 16
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    const __m512 y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
    return _mm512_mask_blend_ps(huge, _mm512_mask_blend_ps(tiny, y, _mm512_setzero_ps()),
                                _mm512_set1_ps(INFINITY));
#else
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    const __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    return _mm256_blendv_ps(_mm256_blendv_ps(y, _mm256_setzero_ps(), tiny), _mm256_set1_ps(INFINITY),
                            huge);
#endif
}

/* v rounded to F16 and back (round to nearest even, as tr_f32_to_f16) */
TR_ALWAYS_INLINE av_f av_f16_round(av_f v) {
#if AV_W == 16
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#else
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#endif
}

/* Σ of the floats of v, in double, added to acc (two or four double lanes) */
#if AV_W == 16
typedef __m512d av_d;
#define av_dzero _mm512_setzero_pd
TR_ALWAYS_INLINE av_d av_dsum(av_d acc, av_f v) {
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
    return _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
TR_ALWAYS_INLINE double av_dhsum(av_d v) { return _mm512_reduce_add_pd(v); }
#else
typedef __m256d av_d;
#define av_dzero _mm256_setzero_pd
TR_ALWAYS_INLINE av_d av_dsum(av_d acc, av_f v) {
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}
TR_ALWAYS_INLINE double av_dhsum(av_d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}
#endif

#endif /* __x86_64__ */
#endif
