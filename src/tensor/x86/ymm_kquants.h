/*
 * 256-bit dot products for the 256-element super-block types Q2_K..Q6_K and IQ4_XS against Q8_K
 * activations (GGUF-FACTS §2.3). Per super-block the integer sum Σ scale_g · Σ q·a is formed
 * exactly: codes (unsigned, 0..63) times activation bytes through maddubs into int16 pairs, then
 * a multiply-add with the sub-block scales as int16 into int32. Offsets and mins (Q6_K's -32,
 * Q3_K's -4, the Q2_K/Q4_K/Q5_K mins) go through the Q8_K group sums `bsums` instead of being
 * applied per element. Only the final f32 scaling and summation order differ from the reference.
 *
 * Overflow: a maddubs pair sum is at most 2·63·127 < 32767; the int32 super-block sums are at
 * most 256·63·127·128 < 2^31 (Q6_K's signed scales) and the reference forms the same integers.
 */
#ifndef TR_TENSOR_X86_YMM_KQUANTS_H
#define TR_TENSOR_X86_YMM_KQUANTS_H

#include "tensor/x86/simd_common.h"

#if defined(__x86_64__)

/* pshufb controls that broadcast one int16 of a 128-bit lane to the whole lane: the low lane
 * takes element 2k, the high lane element 2k+1 (k = 0..3). Used where the 32 codes of one
 * register are two groups of 16 with one scale each (Q2_K, Q3_K, Q6_K). */
TR_ALWAYS_INLINE __m256i k_pair_ctrl(int k) {
    const char lo = (char)(4 * k), hi = (char)(4 * k + 2);
    return _mm256_setr_epi8(
        lo, (char)(lo + 1), lo, (char)(lo + 1), lo, (char)(lo + 1), lo, (char)(lo + 1), lo,
        (char)(lo + 1), lo, (char)(lo + 1), lo, (char)(lo + 1), lo, (char)(lo + 1), hi,
        (char)(hi + 1), hi, (char)(hi + 1), hi, (char)(hi + 1), hi, (char)(hi + 1), hi,
        (char)(hi + 1), hi, (char)(hi + 1), hi, (char)(hi + 1), hi, (char)(hi + 1));
}

/* control that broadcasts int16 element k of each 128-bit lane to the whole lane */
TR_ALWAYS_INLINE __m256i k_one_ctrl(int k) {
    const short v = (short)((2 * k) | ((2 * k + 1) << 8));
    return _mm256_set1_epi16(v);
}

/* 8 int16 scales (one 128-bit lane, repeated in both lanes) for the group pair (2k, 2k+1) */
TR_ALWAYS_INLINE __m256i k_pair_scales(__m256i s16x2, int k) {
    return _mm256_shuffle_epi8(s16x2, k_pair_ctrl(k));
}

/* ----------------------------------------------------------------------------------- Q4_K/Q5_K */

/* Shared by Q4_K and Q5_K: chunk c holds sub-blocks 2c (low nibbles + bit 2c) and 2c+1 (high
 * nibbles + bit 2c+1), each 32 codes against 32 consecutive activations. */
TR_ALWAYS_INLINE void k45_impl(const bool five, int64_t n, const int nc, float *restrict s,
                               size_t s_stride, const void *restrict w, const void *restrict va,
                               size_t a_stride) {
    const int64_t nb = n / TR_QK_K;
    const size_t wb = five ? sizeof(tr_blk_q5_k) : sizeof(tr_blk_q4_k);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const tr_blk_q8_k *a[TR_MAX_NC];
    __m256 acc[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const tr_blk_q8_k *)((const char *)va + (size_t)j * a_stride);
        acc[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const char *blk = (const char *)w + (size_t)b * wb;
        prefetch_block(blk, wb);
        /* both layouts start with d, dmin, scales[12] */
        const tr_blk_q4_k *x4 = (const tr_blk_q4_k *)blk;
        const uint8_t *qs = five ? ((const tr_blk_q5_k *)blk)->qs : x4->qs;
        const __m256i sm16 = _mm256_cvtepu8_epi16(k4_scales_mins(x4->scales));
        const __m256i sc = _mm256_permute4x64_epi64(sm16, 0x44); /* sc0..7 in both lanes */
        /* mins per pair of 16-groups: mn0,mn0,mn1,mn1.. | mn4,mn4,..mn7,mn7 */
        const __m256i mn = _mm256_shuffle_epi8(
            _mm256_permute4x64_epi64(sm16, 0xEE),
            _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7, 8, 9, 8, 9, 10, 11, 10,
                             11, 12, 13, 12, 13, 14, 15, 14, 15));
        __m256i hb = five ? _mm256_loadu_si256((const __m256i *)((const tr_blk_q5_k *)blk)->qh)
                          : _mm256_setzero_si256();
        __m256i isum[TR_MAX_NC];
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) {
                /* bits 2c / 2c+1 are bits 0 / 1 after c right shifts by 2 (garbage shifted in
                 * from the neighbouring byte only reaches bits 2..7) */
                lo = _mm256_or_si256(
                    lo, _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(1)), 4));
                hi = _mm256_or_si256(
                    hi, _mm256_slli_epi16(_mm256_and_si256(hb, _mm256_set1_epi8(2)), 3));
                hb = _mm256_srli_epi16(hb, 2);
            }
            const __m256i s_lo = _mm256_shuffle_epi8(sc, k_one_ctrl(2 * c));
            const __m256i s_hi = _mm256_shuffle_epi8(sc, k_one_ctrl(2 * c + 1));
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++) {
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(a[j][b].qs + 64 * c));
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(a[j][b].qs + 64 * c + 32));
                isum[j] = dot_s16_acc(isum[j], _mm256_maddubs_epi16(lo, a0), s_lo);
                isum[j] = dot_s16_acc(isum[j], _mm256_maddubs_epi16(hi, a1), s_hi);
            }
        }
        const float dw = x86_f16(x4->d), mw = x86_f16(x4->dmin);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const __m256i bs = _mm256_loadu_si256((const __m256i *)a[j][b].bsums);
            const __m256i msum = _mm256_madd_epi16(bs, mn);
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[j][b].d), _mm256_cvtepi32_ps(isum[j]),
                                     acc[j]);
            acc[j] =
                _mm256_fnmadd_ps(_mm256_set1_ps(mw * a[j][b].d), _mm256_cvtepi32_ps(msum), acc[j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) s[(size_t)j * s_stride] = hsum_ps256(acc[j]);
}

TR_ALWAYS_INLINE void ymm_q4_k_impl(int64_t n, const int nc, float *restrict s, size_t ss,
                                    const void *restrict w, const void *restrict a, size_t as) {
    k45_impl(false, n, nc, s, ss, w, a, as);
}
TR_ALWAYS_INLINE void ymm_q5_k_impl(int64_t n, const int nc, float *restrict s, size_t ss,
                                    const void *restrict w, const void *restrict a, size_t as) {
    k45_impl(true, n, nc, s, ss, w, a, as);
}

/* ----------------------------------------------------------------------------------------- Q6_K */

TR_ALWAYS_INLINE void ymm_q6_k_impl(int64_t n, const int nc, float *restrict s, size_t s_stride,
                                    const void *restrict vw, const void *restrict va,
                                    size_t a_stride) {
    const int64_t nb = n / TR_QK_K;
    const tr_blk_q6_k *w = vw;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const tr_blk_q8_k *a[TR_MAX_NC];
    __m256 acc[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const tr_blk_q8_k *)((const char *)va + (size_t)j * a_stride);
        acc[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const tr_blk_q6_k *x = w + b;
        prefetch_block(x, sizeof *x);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
        __m256i isum[TR_MAX_NC];
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
            const __m256i hq = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
            /* the four 32-output groups of this half (GGUF-FACTS §2.3.4) */
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hq, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_and_si256(_mm256_slli_epi16(hq, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_and_si256(hq, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(hq, 2), m30));
            const __m256i sh =
                h ? _mm256_permute4x64_epi64(s16, 0xEE) : _mm256_permute4x64_epi64(s16, 0x44);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i sk = k_pair_scales(sh, k);
#pragma GCC unroll 4
                for (int j = 0; j < nc; j++) {
                    const __m256i y =
                        _mm256_loadu_si256((const __m256i *)(a[j][b].qs + 128 * h + 32 * k));
                    isum[j] = dot_s16_acc(isum[j], _mm256_maddubs_epi16(q[k], y), sk);
                }
            }
        }
        const float dw = x86_f16(x->d);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            /* codes are stored +32: subtract 32 · Σ_g scale_g · bsum_g */
            const __m256i off =
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[j][b].bsums), s16);
            const __m256i t = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(off, 5));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[j][b].d), _mm256_cvtepi32_ps(t), acc[j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) s[(size_t)j * s_stride] = hsum_ps256(acc[j]);
}

/* ------------------------------------------------------------------------------------ Q2_K/Q3_K */

/* Q2_K and Q3_K share the output order: half h uses 32 code bytes, shift step k (0..3) takes 2
 * bits of each and yields 32 outputs = groups 8h+2k and 8h+2k+1 against activations
 * 128h+32k .. +31. Q3_K adds a high bit from hmask (bit 4h+k) that is set when the code is not
 * offset by -4: the code + 4 is then unsigned 0..7 and the offset goes through bsums. */
TR_ALWAYS_INLINE void k23_impl(const bool three, int64_t n, const int nc, float *restrict s,
                               size_t s_stride, const void *restrict w, const void *restrict va,
                               size_t a_stride) {
    const int64_t nb = n / TR_QK_K;
    const size_t wb = three ? sizeof(tr_blk_q3_k) : sizeof(tr_blk_q2_k);
    const __m256i m3 = _mm256_set1_epi8(3), m1 = _mm256_set1_epi8(1);
    const tr_blk_q8_k *a[TR_MAX_NC];
    __m256 acc[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const tr_blk_q8_k *)((const char *)va + (size_t)j * a_stride);
        acc[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const char *blk = (const char *)w + (size_t)b * wb;
        prefetch_block(blk, wb);
        const tr_blk_q2_k *x2 = (const tr_blk_q2_k *)blk;
        const tr_blk_q3_k *x3 = (const tr_blk_q3_k *)blk;
        const uint8_t *qs = three ? x3->qs : x2->qs;
        __m256i s16, m16 = _mm256_setzero_si256(), hm = _mm256_setzero_si256();
        if (three) {
            s16 = _mm256_cvtepi8_epi16(k3_scales(x3->scales));
            hm = _mm256_loadu_si256((const __m256i *)x3->hmask);
        } else {
            const __m128i sb = _mm_loadu_si128((const __m128i *)x2->scales);
            s16 = _mm256_cvtepu8_epi16(_mm_and_si128(sb, _mm_set1_epi8(0x0F)));
            m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0F)));
        }
        __m256i isum[TR_MAX_NC];
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            const __m256i sh =
                h ? _mm256_permute4x64_epi64(s16, 0xEE) : _mm256_permute4x64_epi64(s16, 0x44);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                if (three) {
                    /* bit 4h+k of each hmask byte; a 16-bit shift by < 8 leaves bit 0 clean */
                    const __m256i hbit = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + k), m1);
                    c = _mm256_or_si256(c, _mm256_slli_epi16(hbit, 2));
                }
                const __m256i sk = k_pair_scales(sh, k);
#pragma GCC unroll 4
                for (int j = 0; j < nc; j++) {
                    const __m256i y =
                        _mm256_loadu_si256((const __m256i *)(a[j][b].qs + 128 * h + 32 * k));
                    isum[j] = dot_s16_acc(isum[j], _mm256_maddubs_epi16(c, y), sk);
                }
            }
        }
        const float dw = x86_f16(three ? x3->d : x2->d);
        const float mw = three ? 0.0f : x86_f16(x2->dmin);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            const __m256i bs = _mm256_loadu_si256((const __m256i *)a[j][b].bsums);
            if (three) {
                /* codes were stored +4: subtract 4 · Σ_g scale_g · bsum_g */
                const __m256i off = _mm256_madd_epi16(bs, s16);
                const __m256i t = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(off, 2));
                acc[j] =
                    _mm256_fmadd_ps(_mm256_set1_ps(dw * a[j][b].d), _mm256_cvtepi32_ps(t), acc[j]);
            } else {
                const __m256i msum = _mm256_madd_epi16(bs, m16);
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[j][b].d),
                                         _mm256_cvtepi32_ps(isum[j]), acc[j]);
                acc[j] = _mm256_fnmadd_ps(_mm256_set1_ps(mw * a[j][b].d), _mm256_cvtepi32_ps(msum),
                                          acc[j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) s[(size_t)j * s_stride] = hsum_ps256(acc[j]);
}

TR_ALWAYS_INLINE void ymm_q2_k_impl(int64_t n, const int nc, float *restrict s, size_t ss,
                                    const void *restrict w, const void *restrict a, size_t as) {
    k23_impl(false, n, nc, s, ss, w, a, as);
}
TR_ALWAYS_INLINE void ymm_q3_k_impl(int64_t n, const int nc, float *restrict s, size_t ss,
                                    const void *restrict w, const void *restrict a, size_t as) {
    k23_impl(true, n, nc, s, ss, w, a, as);
}

/* --------------------------------------------------------------------------------------- IQ4_XS */

TR_ALWAYS_INLINE void ymm_iq4_xs_impl(int64_t n, const int nc, float *restrict s, size_t s_stride,
                                      const void *restrict vw, const void *restrict va,
                                      size_t a_stride) {
    const int64_t nb = n / TR_QK_K;
    const tr_blk_iq4_xs *w = vw;
    const __m256i table = table16_256(tr_kvalues_iq4nl);
    const tr_blk_q8_k *a[TR_MAX_NC];
    __m256 acc[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const tr_blk_q8_k *)((const char *)va + (size_t)j * a_stride);
        acc[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const tr_blk_iq4_xs *x = w + b;
        prefetch_block(x, sizeof *x);
        uint32_t sl;
        memcpy(&sl, x->scales_l, 4);
        const uint32_t sh = x->scales_h;
        __m256i isum[TR_MAX_NC];
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) isum[j] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ib++) {
            const int ls = (int)(((sl >> 4 * ib) & 0xF) | (((sh >> 2 * ib) & 3) << 4)) - 32;
            const __m256i sc = _mm256_set1_epi16((short)ls);
            const __m256i v = lookup_nibbles32(x->qs + 16 * ib, table);
            const __m256i uv = _mm256_sign_epi8(v, v);
#pragma GCC unroll 4
            for (int j = 0; j < nc; j++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(a[j][b].qs + 32 * ib));
                const __m256i p = _mm256_maddubs_epi16(uv, _mm256_sign_epi8(y, v));
                isum[j] = dot_s16_acc(isum[j], p, sc);
            }
        }
        const float dw = x86_f16(x->d);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++)
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[j][b].d), _mm256_cvtepi32_ps(isum[j]),
                                     acc[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) s[(size_t)j * s_stride] = hsum_ps256(acc[j]);
}

TR_X86_DOT_ENTRIES(ymm_dot_q2_k, ymm_q2_k_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q3_k, ymm_q3_k_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q4_k, ymm_q4_k_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q5_k, ymm_q5_k_impl)
TR_X86_DOT_ENTRIES(ymm_dot_q6_k, ymm_q6_k_impl)
TR_X86_DOT_ENTRIES(ymm_dot_iq4_xs, ymm_iq4_xs_impl)

#endif /* __x86_64__ */
#endif
