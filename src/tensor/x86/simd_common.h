/*
 * Helpers shared by the x86 kernel files. Only included by translation units compiled with at
 * least -mavx2 -mfma -mf16c (see the FLAGS_ lines of the Makefile); where the including file is
 * also built with AVX-512 VL + VNNI, the byte dot products below become single VNNI instructions,
 * so the 256-bit kernels written on top of them get faster without a second copy of their code.
 *
 * Everything here is static inline: each kernel file gets its own copy compiled for its ISA.
 * Scalar block fields are read through the block structs, as the reference kernels do (every
 * block start has its struct's alignment); everything wider goes through loadu intrinsics or
 * memcpy, so no access is misaligned for its type.
 */
#ifndef TR_TENSOR_X86_SIMD_COMMON_H
#define TR_TENSOR_X86_SIMD_COMMON_H

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "tensor/fp16.h"
#include "tensor/kernels.h"

/* The nc-column kernels are written once with `nc` as a parameter; forcing inlining into call
 * sites with a constant nc lets the compiler unroll the column loops and keep every accumulator
 * in a register. */
#define TR_ALWAYS_INLINE static inline __attribute__((always_inline))

/* Software prefetch distance in bytes ahead of the weight pointer. A matvec streams weights from
 * DRAM once; the hardware prefetchers alone keep too few lines in flight for one core to reach
 * the memory bandwidth while it also computes (measured: about half of it), so every kernel
 * touches the line TR_PF_DIST bytes ahead. Rows of a matrix are contiguous, so near the end of a
 * row this warms the next one; past the end of the matrix a prefetch is harmless (it never
 * faults). */
#ifndef TR_PF_DIST
#define TR_PF_DIST 1536
#endif
#define TR_PREFETCH(p) _mm_prefetch((const char *)(p) + TR_PF_DIST, _MM_HINT_T0)

/* prefetch (TR_PF_DIST ahead) every cache line a block of `bytes` may touch */
TR_ALWAYS_INLINE void prefetch_block(const void *p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) TR_PREFETCH((const char *)p + o);
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TR_X86_VNNI 1
#else
#define TR_X86_VNNI 0
#endif

/* F16C conversion: exact, like tr_f16_to_f32 (subnormals included; MXCSR has no DAZ set). */
TR_ALWAYS_INLINE float x86_f16(tr_half h) { return _cvtsh_ss(h); }

TR_ALWAYS_INLINE float hsum_ps256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 int32 sums of 4 products u[i]*s[i] (u unsigned bytes, s signed bytes). The maddubs form
 * saturates a pair sum at 32767; every caller keeps u*s pairs below that (|u| <= 128 with
 * |s| <= 127 from the activation quantizers, or u <= 63). */
TR_ALWAYS_INLINE __m256i dot_us8(__m256i u, __m256i s) {
#if TR_X86_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* acc + 8 int32 sums of pairs of int16 products */
TR_ALWAYS_INLINE __m256i dot_s16_acc(__m256i acc, __m256i x, __m256i y) {
#if TR_X86_VNNI
    return _mm256_dpwssd_epi32(acc, x, y);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(x, y));
#endif
}

/* 32 packed nibbles (16 bytes, GGUF order) -> 32 bytes 0..15: low nibbles are elements 0..15,
 * high nibbles elements 16..31. The bytes are loaded into both 128-bit lanes (a load-port
 * broadcast) and the high lane shifted right by 4, so no shuffle-port uop is needed. */
TR_ALWAYS_INLINE __m256i unpack_nibbles32(const uint8_t *qs) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i y = _mm256_srlv_epi32(x, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(y, _mm256_set1_epi8(0x0F));
}

/* 32 bits -> 32 bytes, byte i = 0xFF when bit i is set (the 5th bit of Q5_0/Q5_1). */
TR_ALWAYS_INLINE __m256i expand_bits32(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    /* byte i takes source byte i/8; pshufb works per 128-bit lane, and set1 puts all four source
     * bytes in both lanes */
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* 16 nibble codes -> the int8 code book values (IQ4_NL, MXFP4): one pshufb per 32 elements */
TR_ALWAYS_INLINE __m256i lookup_nibbles32(const uint8_t *qs, __m256i table) {
    return _mm256_shuffle_epi8(table, unpack_nibbles32(qs));
}

TR_ALWAYS_INLINE __m256i table16_256(const int8_t *t) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
}

/* Q4_K/Q5_K scales: 12 packed bytes -> bytes 0..7 = the eight 6-bit scales, 8..15 = the eight
 * 6-bit mins (GGUF-FACTS §2.3.1). `p` points at the 12 scale bytes; 16 bytes are read, which stay
 * inside the block (the quants follow). */
TR_ALWAYS_INLINE __m128i k4_scales_mins(const uint8_t *p) {
    const __m128i v = _mm_loadu_si128((const __m128i *)p);    /* u32 lanes: S0-3, S4-7, S8-11 */
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x3F)); /* [sc0-3, mn0-3] */
    /* low 4 bits of sc4-7 / mn4-7 are the low / high nibbles of S8-11 */
    const __m128i s8 =
        _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2)), _mm_setr_epi32(0, 4, 0, 4));
    /* their top 2 bits are the top 2 bits of S0-3 / S4-7, moved from bits 6-7 to bits 4-5 */
    const __m128i top = _mm_and_si128(_mm_srli_epi32(v, 2), _mm_set1_epi8(0x30));
    const __m128i hi = _mm_or_si128(_mm_and_si128(s8, _mm_set1_epi8(0x0F)), top);
    return _mm_unpacklo_epi32(lo, hi); /* [sc0-3, sc4-7, mn0-3, mn4-7] */
}

/* Q3_K scales: 12 packed bytes -> 16 signed scales (-32..31) as bytes (GGUF-FACTS §2.3.7). */
TR_ALWAYS_INLINE __m128i k3_scales(const uint8_t *p) {
    uint32_t a[3];
    memcpy(a, p, 12);
    /* low 4 bits: S0-7 low nibbles for 0..7, high nibbles for 8..15 */
    const __m128i s = _mm_setr_epi32((int)a[0], (int)a[1], (int)a[2], 0);
    const __m128i l = _mm_unpacklo_epi64(s, _mm_srli_epi32(s, 4));
    const __m128i low4 = _mm_and_si128(l, _mm_set1_epi8(0x0F));
    /* high 2 bits of scale i: (S[8 + i%4] >> 2*(i/4)) & 3; lane k (4 scales 4k..4k+3) takes the
     * 32-bit word S8-11 shifted right by 2k */
    const __m128i h = _mm_srlv_epi32(_mm_set1_epi32((int)a[2]), _mm_setr_epi32(0, 2, 4, 6));
    const __m128i high2 = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi8(0x03)), 4);
    return _mm_sub_epi8(_mm_or_si128(low4, high2), _mm_set1_epi8(32));
}

/* 8 vectors of 8 dwords (row i, dword j) -> (dword j, row i) */
TR_ALWAYS_INLINE void tr_transpose8x8(__m256i *v) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* u[0..3]: rows 0-3 in each lane, dwords (0,4) (1,5) (2,6) (3,7); u[4..7]: rows 4-7 */
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
        v[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
    }
}

/* vec_dot and vec_dot_nc entry points for an impl(n, nc, s, s_stride, w, a, a_stride); `unused`
 * because a file that includes these headers may replace some of them with wider kernels */
#define TR_X86_DOT_ENTRIES(name, impl)                                                             \
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

#endif /* __x86_64__ */
#endif
