/*
 * The AVX-512 kernel family (F + BW + VL + DQ + VNNI). The float types and the K-quants that
 * dominate real models (Q4_K, Q5_K, Q6_K) get 512-bit kernels here; every other type uses the
 * 256-bit kernels of the ymm_*.h headers compiled again in this file, where their byte dot
 * products become VNNI instructions (vpdpbusd / vpdpwssd).
 *
 * K-quant super-block layout in registers: one 512-bit register holds 64 codes that meet 64
 * consecutive activation bytes, so activations are loaded as they are and all rearranging is
 * done once per weight block (shared by the nc activation columns). Codes (unsigned, < 64) times
 * activations go through vpmaddubsw into int16 pairs (at most 2·63·127, no saturation), then
 * vpdpwssd multiplies by the sub-block scale and accumulates in int32, exactly as the reference
 * forms its integer sums.
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
#include "tensor/x86/zmm_q32.h"

/* 32 bytes loaded into both halves of a 512-bit register (a load-port broadcast, no shuffle) */
TR_ALWAYS_INLINE __m512i bcast256(const void *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* vpternlog immediates (A = first operand, B = second, C = third) */
#define TL_A_OR_B_AND_C 0xF8 /* A | (B & C) */
#define TL_SELECT_AC_B  0xE4 /* (A & C) | (B & ~C) */

TR_ALWAYS_INLINE float hsum_ps512(__m512 v) { return _mm512_reduce_add_ps(v); }

/* *p in all 16 lanes, loaded as a broadcast (no shuffle-port uop) */
TR_ALWAYS_INLINE __m512 bcast_mem_ps512(const float *p) {
    return _mm512_broadcastss_ps(_mm_load_ss(p));
}

/* Q4_K/Q5_K scales and mins (GGUF-FACTS §2.3.1) from the 12 packed bytes at p, the same in every
 * 128-bit lane, as dwords [sc0-3, mn0-3, sc4-7, mn4-7]: sc_k is byte k (k < 4) or k + 4, mn_k is
 * byte k + 4 or k + 8. Only broadcast loads, shifts and bit selects: nothing on the shuffle port,
 * which the rest of the super-block keeps busy. */
TR_ALWAYS_INLINE __m512i k4_scales_mins_x4(const uint8_t *p) {
    const __m512i v = _mm512_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p)); /* S0-7 */
    const __m512i s8 = _mm512_broadcastd_epi32(_mm_loadu_si32(p + 8));              /* S8-11 */
    const __m512i lo6 = _mm512_and_si512(v, _mm512_set4_epi32(0, 0, 0x3F3F3F3F, 0x3F3F3F3F));
    /* top 2 bits of S0-7 at bits 4-5, kept in dwords 2-3 */
    const __m512i top = _mm512_srli_epi32(v, 2);
    const __m512i x = _mm512_ternarylogic_epi32(
        lo6, top, _mm512_set4_epi32(0x30303030, 0x30303030, 0, 0), TL_A_OR_B_AND_C);
    /* low nibbles (dword 2) and high nibbles (dword 3) of S8-11; a shift by 32 clears dwords 0-1 */
    const __m512i nib = _mm512_srlv_epi32(s8, _mm512_set4_epi32(4, 0, 32, 32));
    return _mm512_ternarylogic_epi32(x, nib, _mm512_set1_epi8(0x0F), TL_A_OR_B_AND_C);
}

/* ------------------------------------------------------------------------------- float types */

enum { ZF_F32, ZF_F16, ZF_BF16 };

TR_ALWAYS_INLINE size_t zf_elem_bytes(int kind) { return kind == ZF_F32 ? 4 : 2; }

/* 16 elements, or the first `mask` bits of them (masked-off elements are not read at all) */
TR_ALWAYS_INLINE __m512 zf_load16(int kind, const char *p, __mmask16 mask) {
    if (kind == ZF_F32) return _mm512_maskz_loadu_ps(mask, p);
    const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
    if (kind == ZF_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

TR_ALWAYS_INLINE void zf_impl(const int kind, int64_t n, const int nc, float *restrict s,
                              size_t s_stride, const void *restrict vw, const void *restrict va,
                              size_t a_stride) {
    const size_t eb = zf_elem_bytes(kind);
    const char *w = vw;
    const char *a[TR_MAX_NC];
    __m512 acc0[TR_MAX_NC], acc1[TR_MAX_NC];
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++) {
        a[j] = (const char *)va + (size_t)j * a_stride;
        acc0[j] = acc1[j] = _mm512_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        prefetch_block(w + (size_t)i * eb, 32 * eb);
        const __m512 w0 = zf_load16(kind, w + (size_t)i * eb, 0xFFFF);
        const __m512 w1 = zf_load16(kind, w + (size_t)(i + 16) * eb, 0xFFFF);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++) {
            acc0[j] = _mm512_fmadd_ps(w0, zf_load16(kind, a[j] + (size_t)i * eb, 0xFFFF), acc0[j]);
            acc1[j] =
                _mm512_fmadd_ps(w1, zf_load16(kind, a[j] + (size_t)(i + 16) * eb, 0xFFFF), acc1[j]);
        }
    }
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 w0 = zf_load16(kind, w + (size_t)i * eb, m);
#pragma GCC unroll 4
        for (int j = 0; j < nc; j++)
            acc0[j] = _mm512_fmadd_ps(w0, zf_load16(kind, a[j] + (size_t)i * eb, m), acc0[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < nc; j++)
        s[(size_t)j * s_stride] = hsum_ps512(_mm512_add_ps(acc0[j], acc1[j]));
}

#define ZF_IMPL(kind, fn)                                                                          \
    TR_ALWAYS_INLINE void fn(int64_t n, const int nc, float *restrict s, size_t ss,                \
                             const void *restrict w, const void *restrict a, size_t as) {          \
        zf_impl(kind, n, nc, s, ss, w, a, as);                                                     \
    }
ZF_IMPL(ZF_F32, zmm_f32_impl)
ZF_IMPL(ZF_F16, zmm_f16_impl)
ZF_IMPL(ZF_BF16, zmm_bf16_impl)
#undef ZF_IMPL

/* ----------------------------------------------------------------------------------- Q4_K/Q5_K */

/* pshufb control giving int16 lanes that hold byte `lo` of each 128-bit lane in the low 256 bits
 * and byte `hi` in the high 256 bits, zero-extended */
TR_ALWAYS_INLINE __m512i ctrl_u8_to_i16(int lo, int hi) {
    const __m256i l = _mm256_set1_epi16((short)(lo | 0x8000));
    const __m256i h = _mm256_set1_epi16((short)(hi | 0x8000));
    return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
}

/* Chunk c of a super-block: the 32 code bytes qs[32c..] hold sub-block 2c in their low nibbles
 * and 2c+1 in their high nibbles, which meet activations 64c..64c+31 and 64c+32..64c+63. With
 * the bytes in both register halves and the upper half shifted right by 4, one register holds
 * the 64 codes in activation order. Q5_K's fifth bits (bit 2c / 2c+1 of qh[l]) come from a
 * register holding qh in the low half and qh >> 1 in the high half, so both halves need bit 2c. */
TR_ALWAYS_INLINE void zmm_k45_impl(const bool five, int64_t n, const int nc, float *restrict s,
                                   size_t s_stride, const void *restrict w, const void *restrict va,
                                   size_t a_stride) {
    const int64_t nb = n / TR_QK_K;
    const size_t wb = five ? sizeof(tr_blk_q5_k) : sizeof(tr_blk_q4_k);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m10 = _mm512_set1_epi8(0x10);
    const __mmask32 upper = 0xFFFF0000u;
    /* mn0..mn7 are bytes 4-7 and 12-15 (k4_scales_mins_x4), each taken twice as int16 */
    const __m256i mn_ctrl =
        _mm256_setr_epi8(4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1, 12, -1, 12, -1, 13,
                         -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1);
    const tr_blk_q8_k *a[TR_SIDE_MAX_NC];
    __m512 acc[TR_SIDE_MAX_NC];
    __m256 accm[TR_SIDE_MAX_NC];
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) {
        a[j] = (const tr_blk_q8_k *)((const char *)va + (size_t)j * a_stride);
        acc[j] = _mm512_setzero_ps();
        accm[j] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const char *blk = (const char *)w + (size_t)b * wb;
        prefetch_block(blk, wb);
        const tr_blk_q4_k *x4 = (const tr_blk_q4_k *)blk; /* Q5_K starts the same way */
        const uint8_t *qs = five ? ((const tr_blk_q5_k *)blk)->qs : x4->qs;
        const __m512i sm = k4_scales_mins_x4(x4->scales);
        /* mins, each twice (one per 16-group of bsums), as int16 */
        const __m256i mn = _mm256_shuffle_epi8(_mm512_castsi512_si256(sm), mn_ctrl);
        __m512i hb = _mm512_setzero_si512();
        if (five) {
            hb = bcast256(((const tr_blk_q5_k *)blk)->qh);
            hb = _mm512_mask_srli_epi16(hb, upper, hb, 1);
        }
        __m512i q[4], sc[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i v = bcast256(qs + 32 * c);
            q[c] = _mm512_and_si512(_mm512_mask_srli_epi16(v, upper, v, 4), m4);
            if (five) {
                /* move bit 2c of every byte to bit 4 (16-bit shifts: what crosses into the
                 * neighbouring byte never lands on bit 4) */
                const __m512i h = c < 2    ? _mm512_slli_epi16(hb, 4 - 2 * c)
                                  : c == 2 ? hb
                                           : _mm512_srli_epi16(hb, 2);
                q[c] = _mm512_ternarylogic_epi32(q[c], h, m10, TL_A_OR_B_AND_C);
            }
            /* sc_k is byte k (k < 4) or byte k + 4 of each lane */
            sc[c] = _mm512_shuffle_epi8(sm, c < 2 ? ctrl_u8_to_i16(2 * c, 2 * c + 1)
                                                  : ctrl_u8_to_i16(2 * c + 4, 2 * c + 5));
        }
        /* d and dmin in one conversion (4 bytes read as f16 pairs, upper lanes zero) */
        const __m128 dm = _mm_cvtph_ps(_mm_loadu_si32(blk));
#pragma GCC unroll 8
        for (int j = 0; j < nc; j++) {
            const tr_blk_q8_k *y = &a[j][b];
            /* the two scale products go through memory so the FMAs below take them as
             * broadcast memory operands (load port) rather than register broadcasts (shuffle
             * port, the busiest one here) */
            float sd[4];
            _mm_storeu_ps(sd, _mm_mul_ps(dm, _mm_set1_ps(y->d)));
            __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const __m512i p = _mm512_maddubs_epi16(q[c], _mm512_loadu_si512(y->qs + 64 * c));
                isum = _mm512_dpwssd_epi32(isum, p, sc[c]);
            }
            const __m256i msum =
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), mn);
            acc[j] = _mm512_fmadd_ps(bcast_mem_ps512(&sd[0]), _mm512_cvtepi32_ps(isum), acc[j]);
            accm[j] =
                _mm256_fmadd_ps(_mm256_broadcast_ss(&sd[1]), _mm256_cvtepi32_ps(msum), accm[j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) s[(size_t)j * s_stride] = hsum_ps512(acc[j]) - hsum_ps256(accm[j]);
}

TR_ALWAYS_INLINE void zmm_q4_k_impl(int64_t n, const int nc, float *restrict s, size_t ss,
                                    const void *restrict w, const void *restrict a, size_t as) {
    zmm_k45_impl(false, n, nc, s, ss, w, a, as);
}
TR_ALWAYS_INLINE void zmm_q5_k_impl(int64_t n, const int nc, float *restrict s, size_t ss,
                                    const void *restrict w, const void *restrict a, size_t as) {
    zmm_k45_impl(true, n, nc, s, ss, w, a, as);
}

/* ----------------------------------------------------------------------------------------- Q6_K */

/* Half h of a super-block: the 64 bytes ql[64h..] give, in their low nibbles, the low 4 bits of
 * outputs 128h + 0..63 and, in their high nibbles, of 128h + 64..127 — both already in
 * activation order. The 2 high bits come from qh[32h + l] bits 0-1, 2-3, 4-5, 6-7 for the four
 * 32-output groups; a register with qh in the low half and qh >> 2 in the high half has the
 * first pair of groups in bits 0-1 and the second in bits 4-5. Codes are stored + 32: the offset
 * is removed once per super-block through the activation group sums. */
TR_ALWAYS_INLINE void zmm_q6_k_impl(int64_t n, const int nc, float *restrict s, size_t s_stride,
                                    const void *restrict vw, const void *restrict va,
                                    size_t a_stride) {
    const int64_t nb = n / TR_QK_K;
    const tr_blk_q6_k *w = vw;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m33 = _mm512_set1_epi8(0x33);
    const __mmask32 upper = 0xFFFF0000u;
    const tr_blk_q8_k *a[TR_SIDE_MAX_NC];
    __m512 acc[TR_SIDE_MAX_NC];
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) {
        a[j] = (const tr_blk_q8_k *)((const char *)va + (size_t)j * a_stride);
        acc[j] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const tr_blk_q6_k *x = w + b;
        prefetch_block(x, sizeof *x);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
        __m512i q[4], sc[4];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i l = _mm512_loadu_si512(x->ql + 64 * h);
            __m512i hz = bcast256(x->qh + 32 * h);
            hz = _mm512_and_si512(_mm512_mask_srli_epi16(hz, upper, hz, 2), m33);
            q[2 * h] = _mm512_ternarylogic_epi32(l, _mm512_slli_epi16(hz, 4), m4, TL_SELECT_AC_B);
            q[2 * h + 1] =
                _mm512_ternarylogic_epi32(_mm512_srli_epi16(l, 4), hz, m4, TL_SELECT_AC_B);
        }
        /* register k, 128-bit lane i (8 int16 lanes = 16 outputs) takes scale 4k + i: pshufb
         * puts the int8 scale in the high byte of each word, the arithmetic shift sign-extends
         * it (measured a little faster than vpermw on the sign-extended scales) */
        const __m512i sb = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)x->scales));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            const char b0 = (char)(4 * k);
            const __m512i ctrl = _mm512_set_epi8(
                (char)(b0 + 3), -1, (char)(b0 + 3), -1, (char)(b0 + 3), -1, (char)(b0 + 3), -1,
                (char)(b0 + 3), -1, (char)(b0 + 3), -1, (char)(b0 + 3), -1, (char)(b0 + 3), -1,
                (char)(b0 + 2), -1, (char)(b0 + 2), -1, (char)(b0 + 2), -1, (char)(b0 + 2), -1,
                (char)(b0 + 2), -1, (char)(b0 + 2), -1, (char)(b0 + 2), -1, (char)(b0 + 2), -1,
                (char)(b0 + 1), -1, (char)(b0 + 1), -1, (char)(b0 + 1), -1, (char)(b0 + 1), -1,
                (char)(b0 + 1), -1, (char)(b0 + 1), -1, (char)(b0 + 1), -1, (char)(b0 + 1), -1, b0,
                -1, b0, -1, b0, -1, b0, -1, b0, -1, b0, -1, b0, -1, b0, -1);
            sc[k] = _mm512_srai_epi16(_mm512_shuffle_epi8(sb, ctrl), 8);
        }
        /* d is the last half of the block: read it with the two scale bytes before it */
        const __m128 dw = _mm_cvtph_ps(_mm_loadu_si32(x->scales + 14)); /* lane 1 = d */
#pragma GCC unroll 8
        for (int j = 0; j < nc; j++) {
            const tr_blk_q8_k *y = &a[j][b];
            __m512i isum = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m512i p = _mm512_maddubs_epi16(q[k], _mm512_loadu_si512(y->qs + 64 * k));
                isum = _mm512_dpwssd_epi32(isum, p, sc[k]);
            }
            const __m256i off =
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y->bsums), s16);
            isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
            float sd[4]; /* through memory: the FMA takes it as a broadcast operand */
            _mm_storeu_ps(sd, _mm_mul_ps(dw, _mm_set1_ps(y->d)));
            acc[j] = _mm512_fmadd_ps(bcast_mem_ps512(&sd[1]), _mm512_cvtepi32_ps(isum), acc[j]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < nc; j++) s[(size_t)j * s_stride] = hsum_ps512(acc[j]);
}

TR_X86_DOT_ENTRIES(zmm_dot_f32, zmm_f32_impl)
TR_X86_DOT_ENTRIES(zmm_dot_f16, zmm_f16_impl)
TR_X86_DOT_ENTRIES(zmm_dot_bf16, zmm_bf16_impl)
/* the K-quant kernels take up to TR_SIDE_MAX_NC columns (nc_max): a super-block's unpacking is
 * shared by every decode row of a batch; each column's sums are its own, in one order for any nc */
#define ZMM_NC_CASE(impl, k)                                                                       \
    case k: impl(n, k, s, s_stride, w, a, a_stride); break;
#define ZMM_DOT_ENTRIES8(name, impl)                                                               \
    static void name(int64_t n, float *restrict s, const void *restrict w,                         \
                     const void *restrict a) {                                                     \
        impl(n, 1, s, 0, w, a, 0);                                                                 \
    }                                                                                              \
    static void name##_nc(int64_t n, int nc, float *restrict s, size_t s_stride,                   \
                          const void *restrict w, const void *restrict a, size_t a_stride) {       \
        switch (nc) {                                                                              \
            ZMM_NC_CASE(impl, 1)                                                                   \
            ZMM_NC_CASE(impl, 2)                                                                   \
            ZMM_NC_CASE(impl, 3)                                                                   \
            ZMM_NC_CASE(impl, 4)                                                                   \
            ZMM_NC_CASE(impl, 5)                                                                   \
            ZMM_NC_CASE(impl, 6)                                                                   \
            ZMM_NC_CASE(impl, 7)                                                                   \
        default: ZMM_NC_CASE(impl, 8)                                                              \
        }                                                                                          \
    }
ZMM_DOT_ENTRIES8(zmm_dot_q4_k, zmm_q4_k_impl)
ZMM_DOT_ENTRIES8(zmm_dot_q5_k, zmm_q5_k_impl)
ZMM_DOT_ENTRIES8(zmm_dot_q6_k, zmm_q6_k_impl)
#undef ZMM_DOT_ENTRIES8
#undef ZMM_NC_CASE

/* ---------------------------------------------------------------------------------------------- */
/* dot_rows: one Q8_0 query row against many Q4_0 / Q8_0 key rows (KV scoring, kernels.h)         */

/* The query is unpacked into registers once per call; each key row then costs a few loads, two
 * VNNI dot products per 4 (Q4_0) or 2 (Q8_0) blocks and one reduction, with no call per row.
 * Codes enter VNNI as unsigned bytes: Q4_0's nibbles as they are (their -8 offset comes back as
 * 8 x the query's block sums), Q8_0's with the sign bit flipped (+128, likewise). */
#define ROWS_MAX_GROUPS 8 /* 4 Q4_0 blocks or 2 Q8_0 blocks per group: rows up to 1024 / 512 */

TR_ALWAYS_INLINE uint16_t rd_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void zmm_dot_rows_q4_0(int64_t n_el, int64_t n, float *restrict out,
                              const void *restrict rows, size_t row_bytes,
                              const int32_t *restrict idx, const void *restrict va) {
    const int64_t nb = n_el / TR_QK32, ng = (nb + 3) / 4;
    const uint8_t *base = rows;
    if (ng > ROWS_MAX_GROUPS) {
        for (int64_t i = 0; i < n; i++)
            ymm_dot_q4_0(n_el, &out[i], base + (size_t)idx[i] * row_bytes, va);
        return;
    }
    const tr_blk_q8_0 *a = va;
    __m512i qlo[ROWS_MAX_GROUPS], qhi[ROWS_MAX_GROUPS], sq8[ROWS_MAX_GROUPS];
    __m128 dq[ROWS_MAX_GROUPS];
    const __m512i ones = _mm512_set1_epi8(1), m4 = _mm512_set1_epi8(0x0F);
    for (int64_t g = 0; g < ng; g++) {
        uint8_t lo[64] = {0}, hi[64] = {0};
        float d[4] = {0};
        for (int64_t j = 0; j < 4 && 4 * g + j < nb; j++) {
            const tr_blk_q8_0 *q = &a[4 * g + j];
            memcpy(lo + 16 * j, q->qs, 16);
            memcpy(hi + 16 * j, q->qs + 16, 16);
            d[j] = x86_f16(q->d);
        }
        qlo[g] = _mm512_loadu_si512(lo);
        qhi[g] = _mm512_loadu_si512(hi);
        const __m512i sq = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones,
                                                                   qlo[g]),
                                               ones, qhi[g]);
        sq8[g] = _mm512_slli_epi32(sq, 3);
        dq[g] = _mm_loadu_ps(d);
    }
    const __m512i expand = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const size_t blk = sizeof(tr_blk_q4_0);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *r = base + (size_t)idx[i] * row_bytes;
        if (i + 4 < n) prefetch_block(base + (size_t)idx[i + 4] * row_bytes, row_bytes);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *p = r + 4 * blk * (size_t)g;
            __m512i nib;
            __m128i dh;
            if (4 * g + 4 <= nb) {
                nib = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + 2)));
                nib = _mm512_inserti32x4(nib, _mm_loadu_si128((const __m128i *)(p + blk + 2)), 1);
                nib = _mm512_inserti32x4(nib, _mm_loadu_si128((const __m128i *)(p + 2 * blk + 2)),
                                         2);
                nib = _mm512_inserti32x4(nib, _mm_loadu_si128((const __m128i *)(p + 3 * blk + 2)),
                                         3);
                dh = _mm_setr_epi16((short)rd_u16(p), (short)rd_u16(p + blk),
                                    (short)rd_u16(p + 2 * blk), (short)rd_u16(p + 3 * blk), 0, 0,
                                    0, 0);
            } else { /* the last, partial group: missing blocks are zero codes and scales */
                uint8_t tmp[64] = {0};
                uint16_t dd[8] = {0};
                for (int64_t j = 0; 4 * g + j < nb; j++) {
                    memcpy(tmp + 16 * j, p + j * blk + 2, 16);
                    dd[j] = rd_u16(p + j * blk);
                }
                nib = _mm512_loadu_si512(tmp);
                dh = _mm_loadu_si128((const __m128i *)dd);
            }
            const __m512i lo = _mm512_and_si512(nib, m4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(nib, 4), m4);
            __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, qlo[g]);
            is = _mm512_sub_epi32(_mm512_dpbusd_epi32(is, hi, qhi[g]), sq8[g]);
            const __m128 d = _mm_mul_ps(_mm_cvtph_ps(dh), dq[g]);
            const __m512 sc = _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(d));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc);
        }
        out[i] = hsum_ps512(acc);
    }
}

/* axpy_rows (kernels.h). Rows are taken 64 at a time (they stay in L1); for each block of 32
 * elements, the accumulators of every weight vector (2 registers each, up to 8 vectors at a time)
 * stay in registers across those rows, so a row-block costs its decode plus 2 FMAs per vector,
 * with no stores in between: accumulating in memory makes every row wait for the previous one's
 * store (perf: the FMAs on stack slots took most of the time). With at most 4 vectors, even and
 * odd rows use separate accumulators to hide the FMA latency. */
#define AXPY_ROWS_TILE 64

TR_ALWAYS_INLINE void axpy_decode(tr_type t, const uint8_t *blk, __m512 *x0, __m512 *x1, float *d) {
    if (t == TR_TYPE_Q8_0) {
        const tr_blk_q8_0 *q = (const tr_blk_q8_0 *)blk;
        *x0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q->qs)));
        *x1 = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q->qs + 16))));
        *d = x86_f16(rd_u16(blk));
    } else {
        const tr_blk_q4_0 *q = (const tr_blk_q4_0 *)blk;
        const __m128i m4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
        const __m128i v = _mm_loadu_si128((const __m128i *)q->qs);
        *x0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(v, m4), eight)));
        *x1 = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m4), eight)));
        *d = x86_f16(rd_u16(blk));
    }
}

/* one tile of rows and one block for m (1..8, a constant after inlining) weight vectors: with m
 * known the accumulators are registers (a runtime m left them on the stack) */
TR_ALWAYS_INLINE void axpy_tile(tr_type t, int m, int64_t i0, int64_t i1, int64_t b,
                                float *restrict out, size_t out_stride, const float *restrict w,
                                size_t w_stride, const uint8_t *base, size_t row_bytes, size_t bb,
                                const int32_t *restrict idx) {
    __m512 acc[16], acc2[8];
    for (int h = 0; h < m; h++) {
        acc[2 * h] = acc[2 * h + 1] = _mm512_setzero_ps();
        if (h < 4) acc2[2 * h] = acc2[2 * h + 1] = _mm512_setzero_ps();
    }
    int64_t i = i0;
    if (m <= 4)
        for (; i + 1 < i1; i += 2) {
            __m512 x0, x1, y0, y1;
            float d, e;
            axpy_decode(t, base + (size_t)idx[i] * row_bytes + (size_t)b * bb, &x0, &x1, &d);
            axpy_decode(t, base + (size_t)idx[i + 1] * row_bytes + (size_t)b * bb, &y0, &y1, &e);
            for (int h = 0; h < m; h++) {
                const float *wh = w + (size_t)h * w_stride;
                const __m512 s = _mm512_set1_ps(wh[i] * d), u = _mm512_set1_ps(wh[i + 1] * e);
                acc[2 * h] = _mm512_fmadd_ps(s, x0, acc[2 * h]);
                acc[2 * h + 1] = _mm512_fmadd_ps(s, x1, acc[2 * h + 1]);
                acc2[2 * h] = _mm512_fmadd_ps(u, y0, acc2[2 * h]);
                acc2[2 * h + 1] = _mm512_fmadd_ps(u, y1, acc2[2 * h + 1]);
            }
        }
    for (; i < i1; i++) {
        __m512 x0, x1;
        float d;
        axpy_decode(t, base + (size_t)idx[i] * row_bytes + (size_t)b * bb, &x0, &x1, &d);
        for (int h = 0; h < m; h++) {
            const __m512 s = _mm512_set1_ps(w[(size_t)h * w_stride + i] * d);
            acc[2 * h] = _mm512_fmadd_ps(s, x0, acc[2 * h]);
            acc[2 * h + 1] = _mm512_fmadd_ps(s, x1, acc[2 * h + 1]);
        }
    }
    for (int h = 0; h < m; h++) {
        float *o = out + (size_t)h * out_stride + (size_t)b * TR_QK32;
        __m512 a0 = acc[2 * h], a1 = acc[2 * h + 1];
        if (m <= 4) {
            a0 = _mm512_add_ps(a0, acc2[2 * h]);
            a1 = _mm512_add_ps(a1, acc2[2 * h + 1]);
        }
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), a0));
        _mm512_storeu_ps(o + 16, _mm512_add_ps(_mm512_loadu_ps(o + 16), a1));
    }
}

TR_ALWAYS_INLINE void zmm_axpy_rows(tr_type t, int64_t n_el, int64_t n, int nw,
                                    float *restrict out, size_t out_stride,
                                    const float *restrict w, size_t w_stride,
                                    const void *restrict rows, size_t row_bytes,
                                    const int32_t *restrict idx) {
    const int64_t nb = n_el / TR_QK32;
    const size_t bb = t == TR_TYPE_Q8_0 ? sizeof(tr_blk_q8_0) : sizeof(tr_blk_q4_0);
    const uint8_t *base = rows;
    for (int h0 = 0; h0 < nw; h0 += 8) {
        const int m = nw - h0 < 8 ? nw - h0 : 8;
        float *o = out + (size_t)h0 * out_stride;
        const float *wh = w + (size_t)h0 * w_stride;
        for (int64_t i0 = 0; i0 < n; i0 += AXPY_ROWS_TILE) {
            const int64_t i1 = i0 + AXPY_ROWS_TILE < n ? i0 + AXPY_ROWS_TILE : n;
            for (int64_t b = 0; b < nb; b++) {
#define TILE(M)                                                                                    \
    case M:                                                                                        \
        axpy_tile(t, M, i0, i1, b, o, out_stride, wh, w_stride, base, row_bytes, bb, idx);        \
        break;
                switch (m) {
                    TILE(1)
                    TILE(2)
                    TILE(3)
                    TILE(4)
                    TILE(5)
                    TILE(6)
                    TILE(7)
                    default: axpy_tile(t, 8, i0, i1, b, o, out_stride, wh, w_stride, base,
                                       row_bytes, bb, idx);
                }
#undef TILE
            }
        }
    }
}

static void zmm_axpy_rows_q8_0(int64_t n_el, int64_t n, int nw, float *restrict out,
                               size_t out_stride, const float *restrict w, size_t w_stride,
                               const void *restrict rows, size_t row_bytes,
                               const int32_t *restrict idx) {
    zmm_axpy_rows(TR_TYPE_Q8_0, n_el, n, nw, out, out_stride, w, w_stride, rows, row_bytes, idx);
}

static void zmm_axpy_rows_q4_0(int64_t n_el, int64_t n, int nw, float *restrict out,
                               size_t out_stride, const float *restrict w, size_t w_stride,
                               const void *restrict rows, size_t row_bytes,
                               const int32_t *restrict idx) {
    zmm_axpy_rows(TR_TYPE_Q4_0, n_el, n, nw, out, out_stride, w, w_stride, rows, row_bytes, idx);
}

static void zmm_dot_rows_q8_0(int64_t n_el, int64_t n, float *restrict out,
                              const void *restrict rows, size_t row_bytes,
                              const int32_t *restrict idx, const void *restrict va) {
    const int64_t nb = n_el / TR_QK32, ng = (nb + 1) / 2;
    const uint8_t *base = rows;
    if (ng > ROWS_MAX_GROUPS) {
        for (int64_t i = 0; i < n; i++)
            ymm_dot_q8_0(n_el, &out[i], base + (size_t)idx[i] * row_bytes, va);
        return;
    }
    const tr_blk_q8_0 *a = va;
    __m512i qv[ROWS_MAX_GROUPS], sq128[ROWS_MAX_GROUPS];
    __m128 dq[ROWS_MAX_GROUPS];
    const __m512i ones = _mm512_set1_epi8(1), flip = _mm512_set1_epi8((char)0x80);
    for (int64_t g = 0; g < ng; g++) {
        int8_t q[64] = {0};
        float d[4] = {0};
        for (int64_t j = 0; j < 2 && 2 * g + j < nb; j++) {
            memcpy(q + 32 * j, a[2 * g + j].qs, 32);
            d[j] = x86_f16(a[2 * g + j].d);
        }
        qv[g] = _mm512_loadu_si512(q);
        sq128[g] = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, qv[g]), 7);
        dq[g] = _mm_loadu_ps(d);
    }
    const __m512i expand = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const size_t blk = sizeof(tr_blk_q8_0);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *r = base + (size_t)idx[i] * row_bytes;
        if (i + 4 < n) prefetch_block(base + (size_t)idx[i + 4] * row_bytes, row_bytes);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *p = r + 2 * blk * (size_t)g;
            __m512i k;
            __m128i dh;
            if (2 * g + 2 <= nb) {
                k = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2)));
                k = _mm512_inserti64x4(k, _mm256_loadu_si256((const __m256i *)(p + blk + 2)), 1);
                dh = _mm_setr_epi16((short)rd_u16(p), (short)rd_u16(p + blk), 0, 0, 0, 0, 0, 0);
            } else { /* one block left: the upper half is zero codes (flipped to 128) x zero */
                k = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 2)));
                k = _mm512_inserti64x4(k, _mm256_setzero_si256(), 1);
                dh = _mm_setr_epi16((short)rd_u16(p), 0, 0, 0, 0, 0, 0, 0);
            }
            __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(k, flip),
                                             qv[g]);
            is = _mm512_sub_epi32(is, sq128[g]);
            const __m128 d = _mm_mul_ps(_mm_cvtph_ps(dh), dq[g]);
            const __m512 sc = _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(d));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, acc);
        }
        out[i] = hsum_ps512(acc);
    }
}

void tr_kernels_fill_avx512(tr_kernels *k) {
#define SET(T, fn)                                                                                 \
    do {                                                                                           \
        k->vec_dot[TR_TYPE_##T] = fn;                                                              \
        k->vec_dot_nc[TR_TYPE_##T] = fn##_nc;                                                      \
    } while (0)
    SET(F32, zmm_dot_f32);
    SET(F16, zmm_dot_f16);
    SET(BF16, zmm_dot_bf16);
    SET(Q4_K, zmm_dot_q4_k);
    SET(Q5_K, zmm_dot_q5_k);
    SET(Q6_K, zmm_dot_q6_k);
    k->nc_max[TR_TYPE_Q4_K] = k->nc_max[TR_TYPE_Q5_K] = k->nc_max[TR_TYPE_Q6_K] = TR_SIDE_MAX_NC;
    /* the 256-bit kernels compiled here use VNNI */
    SET(Q4_0, ymm_dot_q4_0);
    SET(Q4_1, ymm_dot_q4_1);
    SET(Q5_0, ymm_dot_q5_0);
    SET(Q5_1, ymm_dot_q5_1);
    SET(Q8_0, ymm_dot_q8_0);
    SET(IQ4_NL, ymm_dot_iq4_nl);
    SET(MXFP4, ymm_dot_mxfp4);
    SET(Q2_K, ymm_dot_q2_k);
    SET(Q3_K, ymm_dot_q3_k);
    SET(IQ4_XS, ymm_dot_iq4_xs);
#undef SET
    /* matmul's path with activation side tables (kernels.h) for the 32-element block types */
    k->dot_rows[TR_TYPE_Q4_0] = zmm_dot_rows_q4_0;
    k->dot_rows[TR_TYPE_Q8_0] = zmm_dot_rows_q8_0;
    k->axpy_rows[TR_TYPE_Q4_0] = zmm_axpy_rows_q4_0;
    k->axpy_rows[TR_TYPE_Q8_0] = zmm_axpy_rows_q8_0;
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
    /* the same products over wide tables, two blocks per 512-bit register (zmm_q32.h) */
    k->vec_dot_side_wide[TR_TYPE_Q4_0] = zmm_dot_side_q4_0;
    k->vec_dot_side_wide[TR_TYPE_Q5_0] = zmm_dot_side_q5_0;
    k->vec_dot_side_wide[TR_TYPE_Q8_0] = zmm_dot_side_q8_0;
    k->vec_dot_side_wide[TR_TYPE_IQ4_NL] = zmm_dot_side_iq4_nl;
    k->vec_dot_side_wide[TR_TYPE_MXFP4] = zmm_dot_side_mxfp4;
    k->vec_dot_side_wide[TR_TYPE_Q4_1] = zmm_dot_side_q4_1h;
    k->vec_dot_side_wide[TR_TYPE_Q5_1] = zmm_dot_side_q5_1;
    k->act_side_wide[TR_TYPE_Q8_0] = zq_act_side_q8_0;
    k->act_side_wide[TR_TYPE_Q8_1] = zq_act_side_q8_1;
    k->act_side_wide_floats = ZQ_SIDE_FLOATS;
    gm_fill(k);
    k->attn_f16 = av_attn_f16;
    k->rmsnorm = av_rmsnorm;
    k->swiglu = av_swiglu;
    k->geglu = av_geglu;
    k->f16_round = av_f16_round_row;
}

#else
typedef int tr_kernels_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
