/*
 * Matrix-matrix products for prefill (kernels.h, gemm): compiled twice, as the AVX2 family
 * (256-bit, maddubs) and as the AVX-512 family (512-bit, VNNI).
 *
 * Weights are never repacked in memory. A panel of GM_MR weight rows × up to GM_KC elements is
 * decoded on the fly into a stack buffer: unsigned 8-bit codes interleaved by 4-element groups
 * ([group][row][4 bytes], so one vector holds the same 4 elements of GM_MR rows) plus one float
 * scale (and min) per row and sub-block. The panel (≤ 96 KiB) stays in L1/L2 while every
 * activation row passes over it, GM_NR rows at a time: each activation group of 4 bytes is
 * broadcast and multiplied into all GM_MR rows at once (one vpdpbusd, or maddubs + madd), so
 * each vector lane is one output row and no horizontal sum is ever needed. With a prompt of
 * M rows the decode costs 1/M of the multiply-adds.
 * On AVX-512, Q3_K, Q6_K and IQ4_XS take two panels at a time (gm_tile_wide), so that each
 * activation broadcast feeds two multiply-adds.
 *
 * Per sub-block (16 or 32 elements, the weight type's scale unit) the integer dot is exact in
 * int32 lanes; it starts from corr = -off·Σa (the codes are stored value + off), then is
 * converted and scaled in f32: by w_scale·a_scale for Q8_0/Q8_1 activations, by w_scale into a
 * per-super-block accumulator that is scaled once by the Q8_K d for the K-quants. Min terms
 * (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) add w_min times the activation's mf.
 *
 * AVX2 has no 32-bit byte dot: maddubs forms int16 pair sums, several groups are added in
 * int16 while they cannot saturate (GM_GS groups: 8 for 4-bit codes, 2 for 6-bit ones) and
 * widened once by pmaddwd. Its 8-bit codes (Q8_0, IQ4_NL, IQ4_XS: value + 128 would saturate
 * maddubs) stay signed and use the sign trick, |w|·sign(a, w), instead of corr.
 *
 * F16 and BF16 are decoded to f32 panels [k][GM_MRF rows] and multiplied with broadcast
 * FMAs, GM_MRF × GM_NRF outputs in registers. Each output is one f32 sum over its panel's K in
 * element order, whatever the tile shape.
 */
#ifndef TR_TENSOR_X86_GEMM_X86_H
#define TR_TENSOR_X86_GEMM_X86_H

#include "tensor/x86/simd_common.h"

#if defined(__x86_64__)

#if defined(__AVX512F__) && defined(__AVX512BW__) && TR_X86_VNNI
#define GM_ZMM 1
#define GM_MR 16  /* weight rows per panel: one vector of int32 lanes */
#define GM_NR 8   /* activation rows per micro-tile */
/* float types: rows per panel (three vectors) and activation rows per micro-tile. 3 × 8 keeps
 * 24 accumulators, 3 weight vectors and a broadcast in the 32 registers, one broadcast per three
 * FMAs; 2 × 12 (one per two) measured 22 % slower on Zen 4, where the FMAs' issue is the limit */
#define GM_MRF 48
#define GM_NRF 8
#else
#define GM_ZMM 0
#define GM_MR 8
#define GM_NR 4
#define GM_MRF 16
#define GM_NRF 6
#endif
#define GM_KC 4096  /* elements of K per panel (a multiple of 256) */
#define GM_KCF 1024 /* float types */
#define GMF_NV (GM_MRF / GM_MR) /* float types: vectors per panel row */

enum {
    GM_Q4_0, GM_Q4_1, GM_Q5_0, GM_Q5_1, GM_Q8_0, GM_IQ4_NL, GM_MXFP4,
    GM_Q2_K, GM_Q3_K, GM_Q4_K, GM_Q5_K, GM_Q6_K, GM_IQ4_XS,
};
enum { GM_A0, GM_A1, GM_AK }; /* activations: Q8_0, Q8_1, Q8_K */

TR_ALWAYS_INLINE int gm_act(int kind) {
    if (kind == GM_Q4_1 || kind == GM_Q5_1) return GM_A1;
    return kind >= GM_Q2_K ? GM_AK : GM_A0;
}
TR_ALWAYS_INLINE int gm_sub(int kind) {
    return kind == GM_Q2_K || kind == GM_Q3_K || kind == GM_Q6_K ? 16 : 32;
}
TR_ALWAYS_INLINE bool gm_min(int kind) {
    return kind == GM_Q4_1 || kind == GM_Q5_1 || kind == GM_Q2_K || kind == GM_Q4_K ||
           kind == GM_Q5_K;
}
/* codes kept signed (sign trick, no corr): the 8-bit kinds on AVX2 */
TR_ALWAYS_INLINE bool gm_signed(int kind) {
    return !GM_ZMM && (kind == GM_Q8_0 || kind == GM_IQ4_NL || kind == GM_IQ4_XS);
}
TR_ALWAYS_INLINE bool gm_uses_corr(int kind) {
    return !gm_signed(kind) && (kind == GM_Q4_0 || kind == GM_Q5_0 || kind == GM_Q8_0 ||
                                kind == GM_IQ4_NL || kind == GM_MXFP4 || kind == GM_Q3_K ||
                                kind == GM_Q6_K || kind == GM_IQ4_XS);
}
/* AVX2: 4-element groups whose maddubs int16 pair sums may be added before they could
 * saturate (2·umax·127 per pair and group), a divisor of the sub-block's groups */
TR_ALWAYS_INLINE int gm_gs(int kind) {
    switch (kind) {
    case GM_Q4_0: case GM_Q4_1: case GM_Q4_K: return 8;          /* 15: 8 · 3810 */
    case GM_Q2_K: case GM_Q3_K: return 4;                        /* 7: 4 · 1778, one sub-block */
    case GM_Q5_0: case GM_Q5_1: case GM_Q5_K: case GM_MXFP4: return 4; /* 31: 4 · 7874 */
    case GM_Q6_K: return 2;                                      /* 63: 2 · 16002 */
    default: return 1;                                           /* signed: 128 · 127 · 2 */
    }
}

/* ---------------------------------------------------------------------------- decoding */

/* 16 bytes at p -> 32 codes: low nibbles elements 0..15, high nibbles 16..31 */
TR_ALWAYS_INLINE __m256i gm_nib(const uint8_t *p) { return unpack_nibbles32(p); }

/* The 32 codes of elements e .. e + 31 of one weight row (e a multiple of 32) in element
 * order, unsigned value + off (or signed, gm_signed), and the scales (and mins) of the one or
 * two sub-blocks they span. */
TR_ALWAYS_INLINE __m256i gm_dec32(const int kind, const uint8_t *row, int64_t e, float *ws,
                                  float *wm) {
    switch (kind) {
    case GM_Q4_0: {
        const tr_blk_q4_0 *b = (const tr_blk_q4_0 *)row + e / 32;
        ws[0] = x86_f16(b->d);
        return gm_nib(b->qs);
    }
    case GM_Q4_1: {
        const tr_blk_q4_1 *b = (const tr_blk_q4_1 *)row + e / 32;
        ws[0] = x86_f16(b->d);
        wm[0] = x86_f16(b->m);
        return gm_nib(b->qs);
    }
    case GM_Q5_0: case GM_Q5_1: {
        const bool one = kind == GM_Q5_1;
        const uint8_t *b = row + (size_t)(e / 32) * (one ? sizeof(tr_blk_q5_1) : sizeof(tr_blk_q5_0));
        const uint8_t *qh = one ? ((const tr_blk_q5_1 *)b)->qh : ((const tr_blk_q5_0 *)b)->qh;
        const uint8_t *qs = one ? ((const tr_blk_q5_1 *)b)->qs : ((const tr_blk_q5_0 *)b)->qs;
        ws[0] = x86_f16(((const tr_blk_q5_0 *)b)->d);
        if (one) wm[0] = x86_f16(((const tr_blk_q5_1 *)b)->m);
        const __m256i hi = _mm256_and_si256(expand_bits32(qh), _mm256_set1_epi8(16));
        return _mm256_or_si256(gm_nib(qs), hi);
    }
    case GM_Q8_0: {
        const tr_blk_q8_0 *b = (const tr_blk_q8_0 *)row + e / 32;
        ws[0] = x86_f16(b->d);
        const __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
        return gm_signed(kind) ? q : _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80));
    }
    case GM_IQ4_NL: {
        const tr_blk_iq4_nl *b = (const tr_blk_iq4_nl *)row + e / 32;
        ws[0] = x86_f16(b->d);
        const __m256i v = lookup_nibbles32(b->qs, table16_256(tr_kvalues_iq4nl));
        return gm_signed(kind) ? v : _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    }
    case GM_MXFP4: {
        const tr_blk_mxfp4 *b = (const tr_blk_mxfp4 *)row + e / 32;
        ws[0] = tr_e8m0_to_f32_half(b->e);
        const __m256i t = _mm256_add_epi8(table16_256(tr_kvalues_mxfp4), _mm256_set1_epi8(12));
        return lookup_nibbles32(b->qs, t);
    }
    case GM_Q4_K: case GM_Q5_K: {
        const bool five = kind == GM_Q5_K;
        const uint8_t *b = row + (size_t)(e / 256) * (five ? sizeof(tr_blk_q5_k) : sizeof(tr_blk_q4_k));
        const tr_blk_q4_k *x = (const tr_blk_q4_k *)b; /* Q5_K starts the same way */
        const int j = (int)(e % 256) / 32;             /* sub-block 0..7 */
        uint8_t sc, mn;
        tr_get_scale_min_k4(j, x->scales, &sc, &mn);
        ws[0] = x86_f16(x->d) * (float)sc;
        wm[0] = x86_f16(x->dmin) * (float)mn;
        const uint8_t *qs = five ? ((const tr_blk_q5_k *)b)->qs : x->qs;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
        __m256i c = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0F));
        if (five) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)((const tr_blk_q5_k *)b)->qh);
            /* bit j of every byte -> bit 4 */
            const __m256i bit = _mm256_and_si256(h, _mm256_set1_epi8((char)(1 << j)));
            const __m256i on = _mm256_cmpeq_epi8(bit, _mm256_set1_epi8((char)(1 << j)));
            c = _mm256_or_si256(c, _mm256_and_si256(on, _mm256_set1_epi8(16)));
        }
        return c;
    }
    case GM_Q6_K: {
        const tr_blk_q6_k *x = (const tr_blk_q6_k *)row + e / 256;
        const int h = (int)(e % 256) / 128, k = (int)(e % 128) / 32;
        const float d = x86_f16(x->d);
        ws[0] = d * (float)x->scales[8 * h + 2 * k];
        ws[1] = d * (float)x->scales[8 * h + 2 * k + 1];
        const __m256i l = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (k & 1)));
        const __m256i hq = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        const __m256i lo = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(l, 4) : l,
                                            _mm256_set1_epi8(0x0F));
        /* bits 2k, 2k+1 of qh -> bits 4, 5 (16-bit shifts: what crosses bytes is masked off) */
        const __m256i hb = 2 * k >= 4 ? _mm256_srli_epi16(hq, 2 * k - 4)
                                      : _mm256_slli_epi16(hq, 4 - 2 * k);
        return _mm256_or_si256(lo, _mm256_and_si256(hb, _mm256_set1_epi8(0x30)));
    }
    case GM_Q2_K: case GM_Q3_K: {
        const bool three = kind == GM_Q3_K;
        const int64_t sb = e / 256;
        const int h = (int)(e % 256) / 128, k = (int)(e % 128) / 32;
        const tr_blk_q2_k *x2 = (const tr_blk_q2_k *)row + sb;
        const tr_blk_q3_k *x3 = (const tr_blk_q3_k *)row + sb;
        const uint8_t *qs = three ? x3->qs : x2->qs;
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
        /* a 16-bit shift by 2k < 8 leaves the low 2 bits of each byte clean */
        __m256i c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), _mm256_set1_epi8(3));
        const int is = 8 * h + 2 * k;
        if (three) {
            const __m256i hm = _mm256_loadu_si256((const __m256i *)x3->hmask);
            const char m = (char)(1 << (4 * h + k));
            const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(hm, _mm256_set1_epi8(m)),
                                                 _mm256_set1_epi8(m));
            c = _mm256_or_si256(c, _mm256_and_si256(on, _mm256_set1_epi8(4)));
            int8_t s3[16];
            _mm_storeu_si128((__m128i *)s3, k3_scales(x3->scales));
            const float d = x86_f16(x3->d);
            ws[0] = d * (float)s3[is];
            ws[1] = d * (float)s3[is + 1];
        } else {
            const float d = x86_f16(x2->d), dm = x86_f16(x2->dmin);
            ws[0] = d * (float)(x2->scales[is] & 0xF);
            ws[1] = d * (float)(x2->scales[is + 1] & 0xF);
            wm[0] = dm * (float)(x2->scales[is] >> 4);
            wm[1] = dm * (float)(x2->scales[is + 1] >> 4);
        }
        return c;
    }
    default: { /* GM_IQ4_XS */
        const tr_blk_iq4_xs *x = (const tr_blk_iq4_xs *)row + e / 256;
        const int ib = (int)(e % 256) / 32;
        const int ls = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((x->scales_h >> 2 * ib) & 3) << 4);
        ws[0] = x86_f16(x->d) * (float)(ls - 32);
        const __m256i v = lookup_nibbles32(x->qs + 16 * ib, table16_256(tr_kvalues_iq4nl));
        return gm_signed(kind) ? v : _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
    }
    }
}

/* Decodes rows [0, nr) (nr <= GM_MR; the rest of the panel is zero) and elements [k0, k0+kc)
 * into codes [kc/4][GM_MR][4], ws and wm [kc/sub][GM_MR]. */
TR_ALWAYS_INLINE void gm_panel(const int kind, const uint8_t *w, size_t rb, int nr, int64_t k0,
                               int64_t kc, uint8_t *restrict codes, float *restrict ws,
                               float *restrict wm) {
    const int S = gm_sub(kind), spb = 32 / S; /* sub-blocks per 32 elements */
    for (int64_t e = 0; e < kc; e += 32) {
        for (int r0 = 0; r0 < GM_MR; r0 += 8) {
            __m256i v[8];
            for (int i = 0; i < 8; i++) {
                const int r = r0 + i;
                float s[2] = {0, 0}, m[2] = {0, 0};
                v[i] = r < nr ? gm_dec32(kind, w + (size_t)r * rb, k0 + e, s, m)
                              : _mm256_setzero_si256();
                for (int j = 0; j < spb; j++) {
                    ws[(e / S + j) * GM_MR + r] = s[j];
                    if (gm_min(kind)) wm[(e / S + j) * GM_MR + r] = m[j];
                }
            }
            tr_transpose8x8(v);
            for (int g = 0; g < 8; g++)
                _mm256_storeu_si256((__m256i *)(codes + ((e / 4 + g) * GM_MR + r0) * 4), v[g]);
        }
    }
}

/* -------------------------------------------------------------------------- the micro-tile */

#if GM_ZMM
typedef __m512i gm_vi;
typedef __m512 gm_vf;
#define gm_loadi(p) _mm512_loadu_si512((const void *)(p))
#define gm_set1i _mm512_set1_epi32
#define gm_zeroi _mm512_setzero_si512
#define gm_zerof _mm512_setzero_ps
#define gm_cvt _mm512_cvtepi32_ps
#define gm_fma _mm512_fmadd_ps
#define gm_fnma _mm512_fnmadd_ps
#define gm_mul _mm512_mul_ps
#define gm_add _mm512_add_ps
#define gm_loadf _mm512_loadu_ps
#define gm_storef _mm512_storeu_ps
#define gm_set1f _mm512_set1_ps
#else
typedef __m256i gm_vi;
typedef __m256 gm_vf;
#define gm_loadi(p) _mm256_loadu_si256((const __m256i *)(p))
#define gm_set1i _mm256_set1_epi32
#define gm_zeroi _mm256_setzero_si256
#define gm_zerof _mm256_setzero_ps
#define gm_cvt _mm256_cvtepi32_ps
#define gm_fma _mm256_fmadd_ps
#define gm_fnma _mm256_fnmadd_ps
#define gm_mul _mm256_mul_ps
#define gm_add _mm256_add_ps
#define gm_loadf _mm256_loadu_ps
#define gm_storef _mm256_storeu_ps
#define gm_set1f _mm256_set1_ps
#endif

#if GM_ZMM
/* acc + the byte dot of w (unsigned) with the 4 bytes at p (signed) broadcast to every lane, the
 * broadcast folded into the multiply-add ({1to16}), which GCC does not do by itself: one
 * instruction fewer per multiply-add made the Q4_0, Q4_K and Q8_0 gemm 12-14 % faster on an
 * AVX-512 Xeon (bench_gemm, 2048 x 2048, M = 512) */
TR_ALWAYS_INLINE __m512i gm_dpb(__m512i acc, __m512i w, const void *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
    return acc;
}
#endif

TR_ALWAYS_INLINE int32_t gm_rd32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}
TR_ALWAYS_INLINE float gm_rdf(const void *p) {
    float v;
    memcpy(&v, p, 4);
    return v;
}

/* writes (first) or adds GM_MR outputs, of which the first nr are rows of y */
TR_ALWAYS_INLINE void gm_put(float *y, gm_vf v, int nr, bool first) {
    if (nr == GM_MR) {
        gm_storef(y, first ? v : gm_add(v, gm_loadf(y)));
        return;
    }
    float t[GM_MR];
    gm_storef(t, v);
    for (int r = 0; r < nr; r++) y[r] = first ? t[r] : y[r] + t[r];
}

/* Sub-block s of the panel (elements k0 + s·S ..) into the float accumulators facc (and, for
 * the K-quants on AVX-512, the per-super-block tacc) of nc activation rows */
TR_ALWAYS_INLINE void gm_sub_step(const int kind, const int nc, int64_t k0, int64_t s,
                                  const uint8_t *restrict codes, const float *restrict ws,
                                  const float *restrict wm, const char *const *a,
                                  tr_gemm_act_parts ap, gm_vf *facc, gm_vf *tacc) {
    const int S = gm_sub(kind), G = S / 4, act = gm_act(kind);
    const bool corr = gm_uses_corr(kind), mn = gm_min(kind);
    /* the K-quants' per-super-block accumulators need registers AVX2 does not have: there
     * the Q8_K d goes into the sub-block scale instead */
    const bool tacc_on = act == GM_AK && GM_ZMM;
    const int64_t e = k0 + s * S;
    const uint8_t *cp = codes + (size_t)s * (size_t)G * GM_MR * 4;
    gm_vi iacc[GM_NR];
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++)
        iacc[c] = corr ? gm_set1i(gm_rd32(a[c] + ap.corr + 4 * (size_t)(e / S))) : gm_zeroi();
#if GM_ZMM
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        const gm_vi w = gm_loadi(cp + (size_t)g * GM_MR * 4);
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            iacc[c] = gm_dpb(iacc[c], w, a[c] + e + 4 * g);
    }
#else
    const int GS = gm_gs(kind);
#pragma GCC unroll 8
    for (int g0 = 0; g0 < G; g0 += GS) {
        __m256i s16[GM_NR];
#pragma GCC unroll 8
        for (int g = g0; g < g0 + GS; g++) {
            const __m256i w = gm_loadi(cp + (size_t)g * GM_MR * 4);
            const __m256i uw = gm_signed(kind) ? _mm256_sign_epi8(w, w) : w;
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++) {
                __m256i x = gm_set1i(gm_rd32(a[c] + e + 4 * g));
                if (gm_signed(kind)) x = _mm256_sign_epi8(x, w);
                const __m256i p = _mm256_maddubs_epi16(uw, x);
                s16[c] = g == g0 ? p : _mm256_add_epi16(s16[c], p);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            iacc[c] = _mm256_add_epi32(iacc[c], _mm256_madd_epi16(s16[c], _mm256_set1_epi16(1)));
    }
#endif
    const gm_vf vws = gm_loadf(ws + (size_t)s * GM_MR);
    const gm_vf vwm = mn ? gm_loadf(wm + (size_t)s * GM_MR) : gm_zerof();
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) {
        const gm_vf p = gm_cvt(iacc[c]);
        if (tacc_on) {
            tacc[c] = gm_fma(p, vws, tacc[c]);
        } else {
            const int64_t ab = act == GM_AK ? 256 : 32;
            const float da = gm_rdf(a[c] + ap.d + 4 * (size_t)(e / ab));
            facc[c] = gm_fma(p, gm_mul(vws, gm_set1f(da)), facc[c]);
        }
        if (mn) {
            const gm_vf m = gm_set1f(gm_rdf(a[c] + ap.mf + 4 * (size_t)(e / S)));
            facc[c] = act == GM_A1 ? gm_fma(vwm, m, facc[c]) : gm_fnma(vwm, m, facc[c]);
        }
    }
    if (tacc_on && (e + S) % 256 == 0) {
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) {
            const float d = gm_rdf(a[c] + ap.d + 4 * (size_t)(e / 256));
            facc[c] = gm_fma(tacc[c], gm_set1f(d), facc[c]);
            tacc[c] = gm_zerof();
        }
    }
}

/* y[c * y_stride + r] (+)= panel row r · activation row a[c] over elements [k0, k0 + kc), for
 * c < nc, r < nr; the accumulators stay in registers for the whole panel */
TR_ALWAYS_INLINE void gm_tile(const int kind, const int nc, int64_t k0, int64_t kc,
                              const uint8_t *restrict codes, const float *restrict ws,
                              const float *restrict wm, const char *const *a,
                              tr_gemm_act_parts ap, float *y, size_t y_stride, int nr) {
    /* two accumulators per output, for even and odd sub-blocks: half the rounding chain. The
     * loop takes sub-blocks in pairs so each set is named statically: picked by s & 1 at run
     * time, they live on the stack and every sub-block stores and reloads them, which costs the
     * Q4_0, Q8_0 and Q4_K kernels 11-17 % of their speed with AVX-512, 23-37 % with AVX2 (Zen 4) */
    gm_vf facc0[GM_NR], facc1[GM_NR], tacc[GM_NR];
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) facc0[c] = facc1[c] = tacc[c] = gm_zerof();
    /* with per-super-block accumulators (K-quants, AVX-512) and no min terms the float sums
     * change only at the end of a super-block, an odd sub-block: facc1 alone. Naming it for
     * both keeps facc0 (zero) out of the registers the inner loop needs, and the sums as they are */
    const bool once = gm_act(kind) == GM_AK && GM_ZMM && !gm_min(kind);
    gm_vf *even = once ? facc1 : facc0;
    const int64_t nsub = kc / gm_sub(kind);
    int64_t s = 0;
    for (; s + 2 <= nsub; s += 2) {
        gm_sub_step(kind, nc, k0, s, codes, ws, wm, a, ap, even, tacc);
        gm_sub_step(kind, nc, k0, s + 1, codes, ws, wm, a, ap, facc1, tacc);
    }
    if (s < nsub) gm_sub_step(kind, nc, k0, s, codes, ws, wm, a, ap, even, tacc);
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++)
        gm_put(y + (size_t)c * y_stride, gm_add(facc0[c], facc1[c]), nr, k0 == 0);
}

#if GM_ZMM
/* Kinds whose float sums change once per super-block (K-quant activations, no min terms: Q3_K,
 * Q6_K, IQ4_XS) take two panels (2·GM_MR weight rows) against GM_NRW activation rows: each
 * activation broadcast feeds two multiply-adds. That is for the 16-element sub-blocks of Q3_K
 * and Q6_K, whose corr, convert and scale every four multiply-adds leave gm_tile short of the
 * multiply-adds' rate (Q6_K 7-9 % faster this way on an AVX-512 Xeon). Every output is the same
 * sequence of operations as in gm_tile, so the same bits. */
#define GM_NRW 4
TR_ALWAYS_INLINE bool gm_wide(int kind) { return gm_act(kind) == GM_AK && !gm_min(kind); }

TR_ALWAYS_INLINE void gm_tile_wide(const int kind, const int nc, int64_t k0, int64_t kc,
                                   const uint8_t *restrict codes, const uint8_t *restrict codes1,
                                   const float *restrict ws, const float *restrict ws1,
                                   const char *const *a, tr_gemm_act_parts ap, float *y,
                                   size_t y_stride) {
    const int S = gm_sub(kind), G = S / 4;
    gm_vf facc[2][GM_NRW], tacc[2][GM_NRW];
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++)
        facc[0][c] = facc[1][c] = tacc[0][c] = tacc[1][c] = gm_zerof();
    const int64_t nsub = kc / S;
    for (int64_t s = 0; s < nsub; s++) {
        const int64_t e = k0 + s * S;
        const uint8_t *cp0 = codes + (size_t)s * (size_t)G * GM_MR * 4;
        const uint8_t *cp1 = codes1 + (size_t)s * (size_t)G * GM_MR * 4;
        gm_vi iacc[2][GM_NRW];
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++)
            iacc[0][c] = iacc[1][c] = gm_set1i(gm_rd32(a[c] + ap.corr + 4 * (size_t)(e / S)));
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            const gm_vi w0 = gm_loadi(cp0 + (size_t)g * GM_MR * 4);
            const gm_vi w1 = gm_loadi(cp1 + (size_t)g * GM_MR * 4);
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                const gm_vi x = gm_set1i(gm_rd32(a[c] + e + 4 * g));
                iacc[0][c] = _mm512_dpbusd_epi32(iacc[0][c], w0, x);
                iacc[1][c] = _mm512_dpbusd_epi32(iacc[1][c], w1, x);
            }
        }
        const gm_vf v0 = gm_loadf(ws + (size_t)s * GM_MR), v1 = gm_loadf(ws1 + (size_t)s * GM_MR);
#pragma GCC unroll 4
        for (int c = 0; c < nc; c++) {
            tacc[0][c] = gm_fma(gm_cvt(iacc[0][c]), v0, tacc[0][c]);
            tacc[1][c] = gm_fma(gm_cvt(iacc[1][c]), v1, tacc[1][c]);
        }
        if ((e + S) % 256 == 0) {
#pragma GCC unroll 4
            for (int c = 0; c < nc; c++) {
                const gm_vf d = gm_set1f(gm_rdf(a[c] + ap.d + 4 * (size_t)(e / 256)));
                facc[0][c] = gm_fma(tacc[0][c], d, facc[0][c]);
                facc[1][c] = gm_fma(tacc[1][c], d, facc[1][c]);
                tacc[0][c] = tacc[1][c] = gm_zerof();
            }
        }
    }
    /* gm_tile's even-sub-block sums, zero here, are added as there */
#pragma GCC unroll 4
    for (int c = 0; c < nc; c++) {
        float *yc = y + (size_t)c * y_stride;
        gm_put(yc, gm_add(gm_zerof(), facc[0][c]), GM_MR, k0 == 0);
        gm_put(yc + GM_MR, gm_add(gm_zerof(), facc[1][c]), GM_MR, k0 == 0);
    }
}
#endif

/* the gemm of one quantized kind (kernels.h, tr_gemm_fn) */
TR_ALWAYS_INLINE void gm_gemm(const int kind, tr_type t, int64_t K, int64_t n_rows, int64_t M,
                              float *restrict y, size_t y_stride, const void *restrict w,
                              size_t row_bytes, const void *restrict act, size_t act_stride) {
    /* codes and scales of one panel; wm only where the kind has mins */
    uint8_t codes[GM_KC * GM_MR] __attribute__((aligned(64)));
    float ws[GM_KC / 16 * GM_MR] __attribute__((aligned(64)));
    float wm[GM_KC / 16 * GM_MR] __attribute__((aligned(64)));
    const tr_gemm_act_parts ap = tr_gemm_act_parts_of(t, K);
    const char *A = act;
    int64_t r0 = 0;
#if GM_ZMM
    if (gm_wide(kind)) { /* pairs of panels while 2·GM_MR rows are left (gm_tile_wide) */
        uint8_t codes1[GM_KC * GM_MR] __attribute__((aligned(64)));
        float ws1[GM_KC / 16 * GM_MR] __attribute__((aligned(64)));
        for (; r0 + 2 * GM_MR <= n_rows; r0 += 2 * GM_MR) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * row_bytes;
            for (int64_t k0 = 0; k0 < K; k0 += GM_KC) {
                const int64_t kc = K - k0 < GM_KC ? K - k0 : GM_KC;
                gm_panel(kind, wr, row_bytes, GM_MR, k0, kc, codes, ws, wm);
                gm_panel(kind, wr + (size_t)GM_MR * row_bytes, row_bytes, GM_MR, k0, kc, codes1,
                         ws1, wm);
                for (int64_t m0 = 0; m0 < M; m0 += GM_NRW) {
                    const int nc = M - m0 < GM_NRW ? (int)(M - m0) : GM_NRW;
                    const char *a[GM_NRW];
                    for (int c = 0; c < GM_NRW; c++)
                        a[c] = A + (size_t)(m0 + (c < nc ? c : 0)) * act_stride;
                    float *yt = y + (size_t)m0 * y_stride + r0;
                    switch (nc) {
#define GM_CASE(n)                                                                                 \
    case n:                                                                                        \
        gm_tile_wide(kind, n, k0, kc, codes, codes1, ws, ws1, a, ap, yt, y_stride);               \
        break;
                        GM_CASE(1) GM_CASE(2) GM_CASE(3)
#undef GM_CASE
                    default:
                        gm_tile_wide(kind, GM_NRW, k0, kc, codes, codes1, ws, ws1, a, ap, yt,
                                     y_stride);
                        break;
                    }
                }
            }
        }
    }
#endif
    for (; r0 < n_rows; r0 += GM_MR) {
        const int nr = n_rows - r0 < GM_MR ? (int)(n_rows - r0) : GM_MR;
        const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * row_bytes;
        for (int64_t k0 = 0; k0 < K; k0 += GM_KC) {
            const int64_t kc = K - k0 < GM_KC ? K - k0 : GM_KC;
            gm_panel(kind, wr, row_bytes, nr, k0, kc, codes, ws, wm);
            for (int64_t m0 = 0; m0 < M; m0 += GM_NR) {
                const int nc = M - m0 < GM_NR ? (int)(M - m0) : GM_NR;
                const char *a[GM_NR];
                for (int c = 0; c < GM_NR; c++)
                    a[c] = A + (size_t)(m0 + (c < nc ? c : 0)) * act_stride;
                float *yt = y + (size_t)m0 * y_stride + r0;
                switch (nc) {
#define GM_CASE(n)                                                                                 \
    case n: gm_tile(kind, n, k0, kc, codes, ws, wm, a, ap, yt, y_stride, nr); break;
                    GM_CASE(1) GM_CASE(2) GM_CASE(3)
#if GM_NR > 4
                    GM_CASE(4) GM_CASE(5) GM_CASE(6) GM_CASE(7)
#endif
                default: gm_tile(kind, GM_NR, k0, kc, codes, ws, wm, a, ap, yt, y_stride, nr);
                    break;
#undef GM_CASE
                }
            }
        }
    }
}

/* ----------------------------------------------------------------------------- float types */

enum { GMF_F16, GMF_BF16 };

/* 8 elements of a weight row as f32 */
TR_ALWAYS_INLINE __m256 gmf_load8(int kind, const uint8_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (kind == GMF_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* rows [0, nr) of the panel, elements [k0, k0 + kc), into p[k][GM_MRF] (kc any count; the
 * ragged end of a row is padded with zeros, as are rows past nr) */
TR_ALWAYS_INLINE void gmf_panel(const int kind, const uint8_t *w, size_t rb, int nr, int64_t k0,
                                int64_t kc, float *restrict p) {
    const size_t eb = 2;
    for (int64_t e = 0; e < kc; e += 8) {
        const int64_t n8 = kc - e < 8 ? kc - e : 8;
        for (int r0 = 0; r0 < GM_MRF; r0 += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++) {
                const int r = r0 + i;
                if (r >= nr) {
                    v[i] = _mm256_setzero_ps();
                } else if (n8 == 8) {
                    v[i] = gmf_load8(kind, w + (size_t)r * rb + (size_t)(k0 + e) * eb);
                } else {
                    uint8_t buf[32] = {0};
                    memcpy(buf, w + (size_t)r * rb + (size_t)(k0 + e) * eb, (size_t)n8 * eb);
                    v[i] = gmf_load8(kind, buf);
                }
            }
            tr_transpose8x8((__m256i *)v);
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(p + (e + j) * GM_MRF + r0, v[j]);
        }
    }
}

TR_ALWAYS_INLINE void gmf_tile(const int nc, int64_t k0, int64_t kc, const float *restrict p,
                               const float *const *x, float *y, size_t y_stride, int nr) {
    gm_vf acc[GM_NRF][GMF_NV];
#pragma GCC unroll 12
    for (int c = 0; c < nc; c++)
#pragma GCC unroll 4
        for (int v = 0; v < GMF_NV; v++) acc[c][v] = gm_zerof();
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k++) {
        gm_vf w[GMF_NV];
#pragma GCC unroll 4
        for (int v = 0; v < GMF_NV; v++) w[v] = gm_loadf(p + k * GM_MRF + v * GM_MR);
#pragma GCC unroll 12
        for (int c = 0; c < nc; c++) {
            const gm_vf b = gm_set1f(x[c][k0 + k]);
#pragma GCC unroll 4
            for (int v = 0; v < GMF_NV; v++) acc[c][v] = gm_fma(w[v], b, acc[c][v]);
        }
    }
#pragma GCC unroll 12
    for (int c = 0; c < nc; c++) {
        float *yc = y + (size_t)c * y_stride;
#pragma GCC unroll 4
        for (int v = 0; v < GMF_NV; v++)
            if (nr > v * GM_MR)
                gm_put(yc + v * GM_MR, acc[c][v], nr - v * GM_MR < GM_MR ? nr - v * GM_MR : GM_MR,
                       k0 == 0);
    }
}

TR_ALWAYS_INLINE void gmf_gemm(const int kind, int64_t K, int64_t n_rows, int64_t M,
                               float *restrict y, size_t y_stride, const void *restrict w,
                               size_t row_bytes, const void *restrict act, size_t act_stride) {
    float p[GM_KCF * GM_MRF] __attribute__((aligned(64))); /* 192 KiB (AVX-512): in L2 */
    for (int64_t r0 = 0; r0 < n_rows; r0 += GM_MRF) {
        const int nr = n_rows - r0 < GM_MRF ? (int)(n_rows - r0) : GM_MRF;
        const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * row_bytes;
        for (int64_t k0 = 0; k0 < K; k0 += GM_KCF) {
            const int64_t kc = K - k0 < GM_KCF ? K - k0 : GM_KCF;
            gmf_panel(kind, wr, row_bytes, nr, k0, kc, p);
            for (int64_t m0 = 0; m0 < M; m0 += GM_NRF) {
                const int nc = M - m0 < GM_NRF ? (int)(M - m0) : GM_NRF;
                const float *x[GM_NRF];
                for (int c = 0; c < GM_NRF; c++)
                    x[c] = (const float *)((const char *)act +
                                           (size_t)(m0 + (c < nc ? c : 0)) * act_stride);
                float *yt = y + (size_t)m0 * y_stride + r0;
                switch (nc) {
#define GMF_CASE(n)                                                                                \
    case n: gmf_tile(n, k0, kc, p, x, yt, y_stride, nr); break;
                    GMF_CASE(1) GMF_CASE(2) GMF_CASE(3) GMF_CASE(4) GMF_CASE(5)
#if GM_NRF > 6
                    GMF_CASE(6) GMF_CASE(7)
#endif
#if GM_NRF > 8
                    GMF_CASE(8) GMF_CASE(9) GMF_CASE(10) GMF_CASE(11)
#endif
                default: gmf_tile(GM_NRF, k0, kc, p, x, yt, y_stride, nr); break;
#undef GMF_CASE
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------- the entry points */

#define GM_ENTRY(name, kind, type)                                                                 \
    static void name(int64_t K, int64_t n_rows, int64_t M, float *restrict y, size_t y_stride,    \
                     const void *restrict w, size_t row_bytes, const void *restrict act,           \
                     size_t act_stride) {                                                          \
        gm_gemm(kind, type, K, n_rows, M, y, y_stride, w, row_bytes, act, act_stride);            \
    }
GM_ENTRY(gm_gemm_q4_0, GM_Q4_0, TR_TYPE_Q4_0)
GM_ENTRY(gm_gemm_q4_1, GM_Q4_1, TR_TYPE_Q4_1)
GM_ENTRY(gm_gemm_q5_0, GM_Q5_0, TR_TYPE_Q5_0)
GM_ENTRY(gm_gemm_q5_1, GM_Q5_1, TR_TYPE_Q5_1)
GM_ENTRY(gm_gemm_q8_0, GM_Q8_0, TR_TYPE_Q8_0)
GM_ENTRY(gm_gemm_iq4_nl, GM_IQ4_NL, TR_TYPE_IQ4_NL)
GM_ENTRY(gm_gemm_mxfp4, GM_MXFP4, TR_TYPE_MXFP4)
GM_ENTRY(gm_gemm_q2_k, GM_Q2_K, TR_TYPE_Q2_K)
GM_ENTRY(gm_gemm_q3_k, GM_Q3_K, TR_TYPE_Q3_K)
GM_ENTRY(gm_gemm_q4_k, GM_Q4_K, TR_TYPE_Q4_K)
GM_ENTRY(gm_gemm_q5_k, GM_Q5_K, TR_TYPE_Q5_K)
GM_ENTRY(gm_gemm_q6_k, GM_Q6_K, TR_TYPE_Q6_K)
GM_ENTRY(gm_gemm_iq4_xs, GM_IQ4_XS, TR_TYPE_IQ4_XS)
#undef GM_ENTRY

#define GMF_ENTRY(name, kind)                                                                      \
    static void name(int64_t K, int64_t n_rows, int64_t M, float *restrict y, size_t y_stride,    \
                     const void *restrict w, size_t row_bytes, const void *restrict act,           \
                     size_t act_stride) {                                                          \
        gmf_gemm(kind, K, n_rows, M, y, y_stride, w, row_bytes, act, act_stride);                 \
    }
GMF_ENTRY(gm_gemm_f16, GMF_F16)
GMF_ENTRY(gm_gemm_bf16, GMF_BF16)
#undef GMF_ENTRY

/* fills a family's gemm slots */
static inline void gm_fill(tr_kernels *k) {
    k->gemm[TR_TYPE_Q4_0] = gm_gemm_q4_0;
    k->gemm[TR_TYPE_Q4_1] = gm_gemm_q4_1;
    k->gemm[TR_TYPE_Q5_0] = gm_gemm_q5_0;
    k->gemm[TR_TYPE_Q5_1] = gm_gemm_q5_1;
    k->gemm[TR_TYPE_Q8_0] = gm_gemm_q8_0;
    k->gemm[TR_TYPE_IQ4_NL] = gm_gemm_iq4_nl;
    k->gemm[TR_TYPE_MXFP4] = gm_gemm_mxfp4;
    k->gemm[TR_TYPE_Q2_K] = gm_gemm_q2_k;
    k->gemm[TR_TYPE_Q3_K] = gm_gemm_q3_k;
    k->gemm[TR_TYPE_Q4_K] = gm_gemm_q4_k;
    k->gemm[TR_TYPE_Q5_K] = gm_gemm_q5_k;
    k->gemm[TR_TYPE_Q6_K] = gm_gemm_q6_k;
    k->gemm[TR_TYPE_IQ4_XS] = gm_gemm_iq4_xs;
    /* F32 weights keep the per-row kernels: in GGUF files they are the small matrices (MoE
     * routers), and with them a batch gives the bits one row at a time gives (test_model) */
    k->gemm[TR_TYPE_F16] = gm_gemm_f16;
    k->gemm[TR_TYPE_BF16] = gm_gemm_bf16;
    k->gemm_rows = GM_MRF; /* a multiple of GM_MR */
    k->gemm_min_m = 16;
}

#endif /* __x86_64__ */
#endif
