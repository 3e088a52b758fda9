/*
 * The AVX2 kernel family (AVX2 + FMA + F16C): 256-bit dot products for every supported weight
 * type (their code lives in the ymm_*.h headers, which kernels_avx512.c compiles again with VNNI)
 * and the Q8_0 / Q8_K activation quantizers, bit-identical with the scalar ones in quantize.c.
 */
#include "tensor/kernels.h"

#if defined(__x86_64__)

#include "tensor/x86/attn_x86.h"
#include "tensor/x86/ew_x86.h"
#include "tensor/x86/gemm_x86.h"
#include "tensor/x86/simd_common.h"
#include "tensor/x86/ymm_float.h"
#include "tensor/x86/ymm_kquants.h"
#include "tensor/x86/ymm_q32.h"

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

static inline float hmax_ps256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* four vectors of 8 int32 (each in -127..127) -> 32 int8 in element order */
static inline __m256i pack_i32x32_to_i8(__m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    /* the packs work per 128-bit lane, leaving the 4-element groups in the order 0 2 4 6 1 3 5 7 */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Same arithmetic as tr_quant_q8_0: amax exactly (max is order-free), d = amax/127 rounded to
 * F16 by the same scalar routine, x·(127/amax) rounded to nearest even by cvtps (MXCSR default),
 * as nearbyintf does. The test compares the bytes, so a change of the reference shows up there. */
static void avx2_quant_q8_0(const float *restrict x, void *restrict vy, int64_t n) {
    tr_blk_q8_0 *y = vy;
    for (int64_t b = 0; b < n / TR_QK32; b++, x += TR_QK32) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])),
                                       _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3])));
        const float amax = hmax_ps256(m);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = tr_f32_to_f16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        _mm256_storeu_si256((__m256i *)y[b].qs, pack_i32x32_to_i8(q[0], q[1], q[2], q[3]));
    }
}

/* F32 -> F16 as tr_f32_to_f16 gives it: F16C rounds to nearest even (subnormals, overflow to
 * infinity alike); a NaN becomes the reference's sign | 0x7E00 (F16C keeps part of its payload) */
static void avx2_quant_f16(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m128i nan16 =
            _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
        const __m128i canon =
            _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16((short)0x8000)), _mm_set1_epi16(0x7E00));
        _mm_storeu_si128((__m128i *)(y + i), _mm_blendv_epi8(h, canon, nan16));
    }
    for (; i < n; i++) y[i] = tr_f32_to_f16(x[i]);
}

/* Same arithmetic as tr_quant_q8_1: d = amax/127, id = 1/d (not 127/amax as for Q8_0), codes
 * x·id rounded to nearest even, s = d·Σcodes rounded to F16 by the scalar routine. */
static void avx2_quant_q8_1(const float *restrict x, void *restrict vy, int64_t n) {
    tr_blk_q8_1 *y = vy;
    for (int64_t b = 0; b < n / TR_QK32; b++, x += TR_QK32) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
        const __m256 m = _mm256_max_ps(_mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])),
                                       _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3])));
        const float amax = hmax_ps256(m);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        const __m256i s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
        _mm256_storeu_si256((__m256i *)y[b].qs, pack_i32x32_to_i8(q[0], q[1], q[2], q[3]));
        y[b].d = tr_f32_to_f16(d);
        y[b].s = tr_f32_to_f16((float)_mm_cvtsi128_si32(s) * d);
    }
}

/* Same arithmetic as tr_quant_q8_k: the element of largest magnitude (the first one on ties)
 * keeps its sign, iscale = -127/max, q = round-to-nearest-even(iscale·x) capped at 127. */
static void avx2_quant_q8_k(const float *restrict x, void *restrict vy, int64_t n) {
    tr_blk_q8_k *y = vy;
    for (int64_t b = 0; b < n / TR_QK_K; b++, x += TR_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 32; i++) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * i)));
        const float amax = hmax_ps256(m);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const __m256 vamax = _mm256_set1_ps(amax);
        float max = 0.0f;
        for (int i = 0; i < 32; i++) {
            const int hit = _mm256_movemask_ps(
                _mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + 8 * i)), vamax, _CMP_EQ_OQ));
            if (hit) {
                max = x[8 * i + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i cap = _mm256_set1_epi32(127);
        for (int g = 0; g < 8; g++) {
            __m256i q[4];
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * i), vs)),
                    cap);
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * g),
                                pack_i32x32_to_i8(q[0], q[1], q[2], q[3]));
        }
        /* group sums of 16: bias the bytes to unsigned, sum with psadbw, remove the bias */
        for (int g = 0; g < 16; g++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(y[b].qs + 16 * g));
            const __m128i sad =
                _mm_sad_epu8(_mm_xor_si128(v, _mm_set1_epi8((char)0x80)), _mm_setzero_si128());
            const int sum = _mm_cvtsi128_si32(sad) + _mm_extract_epi32(sad, 2) - 16 * 128;
            y[b].bsums[g] = (int16_t)sum;
        }
        y[b].d = 1.0f / iscale;
    }
}

/* axpy_f16 (kernels.h): 8 values a step, converted exactly (F16C), multiplied, then added */
static void ymm_axpy_f16(int64_t n, float *restrict out, const uint16_t *restrict v, float p) {
    const __m256 vp = _mm256_set1_ps(p);
    int64_t d = 0;
    for (; d + 8 <= n; d += 8) {
        const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + d)));
        _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_loadu_ps(out + d), _mm256_mul_ps(vp, x)));
    }
    for (; d < n; d++) out[d] += p * tr_f16_to_f32(v[d]);
}

void tr_kernels_fill_avx2(tr_kernels *k) {
#define SET(T, fn)                                                                                 \
    do {                                                                                           \
        k->vec_dot[TR_TYPE_##T] = fn;                                                              \
        k->vec_dot_nc[TR_TYPE_##T] = fn##_nc;                                                      \
    } while (0)
    SET(F32, ymm_dot_f32);
    SET(F16, ymm_dot_f16);
    SET(BF16, ymm_dot_bf16);
    SET(Q4_0, ymm_dot_q4_0);
    SET(Q4_1, ymm_dot_q4_1);
    SET(Q5_0, ymm_dot_q5_0);
    SET(Q5_1, ymm_dot_q5_1);
    SET(Q8_0, ymm_dot_q8_0);
    SET(IQ4_NL, ymm_dot_iq4_nl);
    SET(MXFP4, ymm_dot_mxfp4);
    SET(Q2_K, ymm_dot_q2_k);
    SET(Q3_K, ymm_dot_q3_k);
    SET(Q4_K, ymm_dot_q4_k);
    SET(Q5_K, ymm_dot_q5_k);
    SET(Q6_K, ymm_dot_q6_k);
    SET(IQ4_XS, ymm_dot_iq4_xs);
#undef SET
    /* matmul's path with activation side tables (kernels.h) for the 32-element block types */
    k->vec_dot_side[TR_TYPE_Q4_0] = ymm_dot_side_q4_0;
    k->vec_dot_side_rows[TR_TYPE_Q4_0] = ymm_dot_side_q4_0_rows;
    k->vec_dot_side[TR_TYPE_Q5_0] = ymm_dot_side_q5_0;
    k->vec_dot_side_rows[TR_TYPE_Q5_0] = ymm_dot_side_q5_0_rows;
    k->vec_dot_side[TR_TYPE_Q8_0] = ymm_dot_side_q8_0;
    k->vec_dot_side_rows[TR_TYPE_Q8_0] = ymm_dot_side_q8_0_rows;
    k->vec_dot_side[TR_TYPE_IQ4_NL] = ymm_dot_side_iq4_nl;
    k->vec_dot_side_rows[TR_TYPE_IQ4_NL] = ymm_dot_side_iq4_nl_rows;
    k->vec_dot_side[TR_TYPE_MXFP4] = ymm_dot_side_mxfp4;
    k->vec_dot_side_rows[TR_TYPE_MXFP4] = ymm_dot_side_mxfp4_rows;
    k->vec_dot_side[TR_TYPE_Q4_1] = ymm_dot_side_q4_1h;
    k->vec_dot_side_rows[TR_TYPE_Q4_1] = ymm_dot_side_q4_1h_rows;
    k->vec_dot_side[TR_TYPE_Q5_1] = ymm_dot_side_q5_1;
    k->vec_dot_side_rows[TR_TYPE_Q5_1] = ymm_dot_side_q5_1_rows;
    k->act_side[TR_TYPE_Q8_0] = ymm_act_side_q8_0;
    k->act_side[TR_TYPE_Q8_1] = ymm_act_side_q8_1;
    k->from_float[TR_TYPE_Q8_0] = avx2_quant_q8_0;
    k->from_float[TR_TYPE_Q8_1] = avx2_quant_q8_1;
    k->from_float[TR_TYPE_Q8_K] = avx2_quant_q8_k;
    k->from_float[TR_TYPE_F16] = avx2_quant_f16;
    k->axpy_f16 = ymm_axpy_f16;
    gm_fill(k);
    k->attn_f16 = av_attn_f16;
    k->rmsnorm = av_rmsnorm;
    k->swiglu = av_swiglu;
    k->geglu = av_geglu;
    k->f16_round = av_f16_round_row;
}

#else
typedef int tr_kernels_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
