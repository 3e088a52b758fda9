/*
 * 256-bit dot products for the float weight types F32, F16 and BF16 (activations in the same
 * format, GGUF-FACTS §2.4). Products and sums in f32 with FMA; only the summation order differs
 * from the scalar reference. n is any positive count: the ragged tail is copied into a zeroed
 * 8-element buffer, so no load reads past the row.
 */
#ifndef TR_TENSOR_X86_YMM_FLOAT_H
#define TR_TENSOR_X86_YMM_FLOAT_H

#include "tensor/x86/simd_common.h"

#if defined(__x86_64__)

/* the three float formats, widened to 8 f32 lanes */
enum { YF_F32, YF_F16, YF_BF16 };

TR_ALWAYS_INLINE size_t yf_elem_bytes(int kind) { return kind == YF_F32 ? 4 : 2; }

TR_ALWAYS_INLINE __m256 yf_load8(int kind, const char *p) {
    if (kind == YF_F32) return _mm256_loadu_ps((const float *)p);
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (kind == YF_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the last n % 8 elements (1..7), zero-padded: zeros add nothing to a dot product */
TR_ALWAYS_INLINE __m256 yf_load_tail(int kind, const char *p, int64_t rem) {
    char buf[32] = {0};
    memcpy(buf, p, (size_t)rem * yf_elem_bytes(kind));
    return yf_load8(kind, buf);
}

TR_ALWAYS_INLINE void yf_impl(const int kind, int64_t n, const int nc, float *restrict s,
                              size_t s_stride, const void *restrict vw, const void *restrict va,
                              size_t a_stride) {
    const size_t eb = yf_elem_bytes(kind);
    const char *w = vw;
    const char *a[TR_MAX_NC];
    /* two accumulators per column hide the FMA latency in the single-column (decode) case */
    __m256 acc0[TR_MAX_NC], acc1[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const char *)va + (size_t)j * a_stride;
        acc0[j] = _mm256_setzero_ps();
        acc1[j] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        TR_PREFETCH(w + (size_t)i * eb);
        const __m256 w0 = yf_load8(kind, w + (size_t)i * eb);
        const __m256 w1 = yf_load8(kind, w + (size_t)(i + 8) * eb);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            acc0[j] = _mm256_fmadd_ps(w0, yf_load8(kind, a[j] + (size_t)i * eb), acc0[j]);
            acc1[j] = _mm256_fmadd_ps(w1, yf_load8(kind, a[j] + (size_t)(i + 8) * eb), acc1[j]);
        }
    }
    if (i + 8 <= n) {
        const __m256 w0 = yf_load8(kind, w + (size_t)i * eb);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++)
            acc0[j] = _mm256_fmadd_ps(w0, yf_load8(kind, a[j] + (size_t)i * eb), acc0[j]);
        i += 8;
    }
    if (i < n) {
        const __m256 w0 = yf_load_tail(kind, w + (size_t)i * eb, n - i);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++)
            acc1[j] =
                _mm256_fmadd_ps(w0, yf_load_tail(kind, a[j] + (size_t)i * eb, n - i), acc1[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++)
        s[(size_t)j * s_stride] = hsum_ps256(_mm256_add_ps(acc0[j], acc1[j]));
}

#define YF_IMPL(kind, fn)                                                                          \
    TR_ALWAYS_INLINE void fn(int64_t n, const int nc, float *restrict s, size_t ss,                \
                             const void *restrict w, const void *restrict a, size_t as) {          \
        yf_impl(kind, n, nc, s, ss, w, a, as);                                                     \
    }
YF_IMPL(YF_F32, ymm_f32_impl)
YF_IMPL(YF_F16, ymm_f16_impl)
YF_IMPL(YF_BF16, ymm_bf16_impl)
#undef YF_IMPL

TR_X86_DOT_ENTRIES(ymm_dot_f32, ymm_f32_impl)
TR_X86_DOT_ENTRIES(ymm_dot_f16, ymm_f16_impl)
TR_X86_DOT_ENTRIES(ymm_dot_bf16, ymm_bf16_impl)

#endif /* __x86_64__ */
#endif
