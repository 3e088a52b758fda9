/*
 * Every quantized weight type, decoded the same way for all Arm kernels: a block is one or two
 * parts, a part is up to 8 groups of 16 consecutive elements, and a group's 16 codes come out as
 * one int8x16 vector that meets 16 consecutive activation codes. With that one shape the
 * integer dot products (arm_qdot.h: SDOT or the ARMv8.0 widening multiply, and SMMLA for two
 * weight rows) are written once for all types, and each type only says how its bits unpack
 * (GGUF-FACTS §2.2, §2.3).
 *
 * Codes are the reference's integers: signed where the reference subtracts an offset per element
 * (Q4_0 - 8, Q5_0 - 16, Q3_K - 4, Q6_K - 32, the IQ4/MXFP4 code books), unsigned (0..31) for the
 * types with a min, whose min term goes through the activation sums (Q8_1's s, Q8_K's bsums)
 * exactly as in the reference. Every code fits in int8, and all integer sums are the reference's.
 */
#ifndef TR_TENSOR_ARM_BLOCKS_H
#define TR_TENSOR_ARM_BLOCKS_H

#include "tensor/arm/neon_common.h"

#if defined(__aarch64__)

enum {
    AK_Q4_0, AK_Q4_1, AK_Q5_0, AK_Q5_1, AK_Q8_0, AK_IQ4_NL, AK_MXFP4, /* 32 elements, Q8_0/Q8_1 */
    AK_Q2_K, AK_Q3_K, AK_Q4_K, AK_Q5_K, AK_Q6_K, AK_IQ4_XS            /* 256 elements, Q8_K */
};

TR_ALWAYS_INLINE bool ak_super(int k) { return k >= AK_Q2_K; }
TR_ALWAYS_INLINE int ak_elems(int k) { return ak_super(k) ? TR_QK_K : TR_QK32; }
TR_ALWAYS_INLINE int ak_parts(int k) { return ak_super(k) ? 2 : 1; }
TR_ALWAYS_INLINE int ak_groups(int k) { return ak_super(k) ? 8 : 2; } /* per part */
/* Q4_1 / Q5_1: + m·s per block (Q8_1 activations) */
TR_ALWAYS_INLINE bool ak_q81(int k) { return k == AK_Q4_1 || k == AK_Q5_1; }
/* Q2_K / Q4_K / Q5_K: - dmin·d_a·Σ min_g·bsum_g per super-block */
TR_ALWAYS_INLINE bool ak_kmin(int k) { return k == AK_Q2_K || k == AK_Q4_K || k == AK_Q5_K; }
/* elements per sub-block scale: 16 (Q2_K, Q3_K, Q6_K), 32 (Q4_K, Q5_K, IQ4_XS); 0: none */
TR_ALWAYS_INLINE int ak_scale_span(int k) {
    if (!ak_super(k)) return 0;
    return k == AK_Q4_K || k == AK_Q5_K || k == AK_IQ4_XS ? 32 : 16;
}

TR_ALWAYS_INLINE size_t ak_wbytes(int k) {
    switch (k) {
    case AK_Q4_0: return sizeof(tr_blk_q4_0);
    case AK_Q4_1: return sizeof(tr_blk_q4_1);
    case AK_Q5_0: return sizeof(tr_blk_q5_0);
    case AK_Q5_1: return sizeof(tr_blk_q5_1);
    case AK_Q8_0: return sizeof(tr_blk_q8_0);
    case AK_IQ4_NL: return sizeof(tr_blk_iq4_nl);
    case AK_MXFP4: return sizeof(tr_blk_mxfp4);
    case AK_Q2_K: return sizeof(tr_blk_q2_k);
    case AK_Q3_K: return sizeof(tr_blk_q3_k);
    case AK_Q4_K: return sizeof(tr_blk_q4_k);
    case AK_Q5_K: return sizeof(tr_blk_q5_k);
    case AK_Q6_K: return sizeof(tr_blk_q6_k);
    default: return sizeof(tr_blk_iq4_xs);
    }
}

/* ------------------------------------------------------------------------------ activations */

TR_ALWAYS_INLINE size_t ak_abytes(int k) {
    return ak_super(k) ? sizeof(tr_blk_q8_k) : ak_q81(k) ? sizeof(tr_blk_q8_1) : sizeof(tr_blk_q8_0);
}
/* the activation block's scale d */
TR_ALWAYS_INLINE float ak_act_d(int k, const uint8_t *y) {
    return ak_super(k) ? arm_f32(y + offsetof(tr_blk_q8_k, d)) : arm_f16(y);
}
/* its codes (Q8_0: after d; Q8_1: after d and s; Q8_K: after the f32 d) */
TR_ALWAYS_INLINE const int8_t *ak_act_qs(int k, const uint8_t *y) {
    return (const int8_t *)y + (ak_super(k) ? offsetof(tr_blk_q8_k, qs)
                                : ak_q81(k) ? offsetof(tr_blk_q8_1, qs)
                                            : offsetof(tr_blk_q8_0, qs));
}

/* ---------------------------------------------------------------------------- weight scales */

/* the block's scale d (MXFP4: the E8M0 exponent, as the reference reads it) */
TR_ALWAYS_INLINE float ak_d(int k, const uint8_t *b) {
    switch (k) {
    case AK_MXFP4: return tr_e8m0_to_f32_half(b[0]);
    case AK_Q2_K: return arm_f16(b + offsetof(tr_blk_q2_k, d));
    case AK_Q3_K: return arm_f16(b + offsetof(tr_blk_q3_k, d));
    case AK_Q6_K: return arm_f16(b + offsetof(tr_blk_q6_k, d));
    default: return arm_f16(b); /* every other type starts with d */
    }
}
/* the min scale: Q4_1 / Q5_1 m, Q4_K / Q5_K / Q2_K dmin */
TR_ALWAYS_INLINE float ak_dmin(int k, const uint8_t *b) {
    return k == AK_Q2_K ? arm_f16(b + offsetof(tr_blk_q2_k, dmin)) : arm_f16(b + 2);
}

/* Q4_K / Q5_K: the 12 packed scale bytes -> sc[0..7] and mn[0..7] (6 bits each, GGUF-FACTS
 * §2.3.1), the same values tr_get_scale_min_k4 gives, from three 32-bit words: bytes 0-3 hold
 * sc0-3 and the top bits of sc4-7, bytes 4-7 mn0-3 and the top bits of mn4-7, bytes 8-11 the low
 * nibbles of sc4-7 and (high nibbles) mn4-7. */
TR_ALWAYS_INLINE void k4_scales_mins(const uint8_t *p, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3];
    memcpy(u, p, 12);
    const uint32_t m6 = 0x3F3F3F3Fu, m4 = 0x0F0F0F0Fu, m2 = 0x03030303u;
    const uint32_t s[4] = {u[0] & m6, (u[2] & m4) | (((u[0] >> 6) & m2) << 4), u[1] & m6,
                           ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4)};
    memcpy(sc, &s[0], 4);
    memcpy(sc + 4, &s[1], 4);
    memcpy(mn, &s[2], 4);
    memcpy(mn + 4, &s[3], 4);
}

/* Per-block integer scales, one per 16-element group (a 32-element scale is given twice), and for
 * the types with a min, the min of each 16-element group as int16 (what meets bsums). */
typedef struct {
    int32_t sc[16];
    int16_t mn[16];
} ak_scales;

TR_ALWAYS_INLINE void ak_block_scales(int k, const uint8_t *b, ak_scales *s) {
    switch (k) {
    case AK_Q2_K:
        for (int g = 0; g < 16; g++) {
            s->sc[g] = b[g] & 0xF;
            s->mn[g] = (int16_t)(b[g] >> 4);
        }
        break;
    case AK_Q3_K: {
        const uint8_t *sb = b + offsetof(tr_blk_q3_k, scales);
        for (int i = 0; i < 16; i++) {
            const int low4 = i < 8 ? (sb[i] & 15) : (sb[i - 8] >> 4);
            const int high2 = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
            s->sc[i] = (low4 | (high2 << 4)) - 32;
        }
        break;
    }
    case AK_Q4_K:
    case AK_Q5_K: {
        uint8_t sc[8], mn[8];
        k4_scales_mins(b + offsetof(tr_blk_q4_k, scales), sc, mn);
        for (int j = 0; j < 8; j++) {
            s->sc[2 * j] = s->sc[2 * j + 1] = sc[j];
            s->mn[2 * j] = s->mn[2 * j + 1] = mn[j];
        }
        break;
    }
    case AK_Q6_K: {
        const int8_t *sc = (const int8_t *)b + offsetof(tr_blk_q6_k, scales);
        for (int g = 0; g < 16; g++) s->sc[g] = sc[g];
        break;
    }
    case AK_IQ4_XS: {
        uint16_t sh;
        memcpy(&sh, b + offsetof(tr_blk_iq4_xs, scales_h), 2);
        const uint8_t *sl = b + offsetof(tr_blk_iq4_xs, scales_l);
        for (int ib = 0; ib < 8; ib++) {
            const int ls = ((sl[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((sh >> 2 * ib) & 3) << 4);
            s->sc[2 * ib] = s->sc[2 * ib + 1] = ls - 32;
        }
        break;
    }
    default: break;
    }
}

/* ------------------------------------------------------------------------------------ codes */

TR_ALWAYS_INLINE int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* Part p of block b -> q[0..ak_groups(k)) in activation order (the part's group g meets the
 * activation codes 128p + 16g .. +15 of the block). */
TR_ALWAYS_INLINE void ak_decode(int k, const uint8_t *b, int p, int8x16_t *q) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    switch (k) {
    case AK_Q4_0: {
        uint8x16_t lo, hi;
        unpack_nibbles(b + offsetof(tr_blk_q4_0, qs), &lo, &hi);
        q[0] = vsubq_s8(s8(lo), vdupq_n_s8(8));
        q[1] = vsubq_s8(s8(hi), vdupq_n_s8(8));
        break;
    }
    case AK_Q4_1: {
        uint8x16_t lo, hi;
        unpack_nibbles(b + offsetof(tr_blk_q4_1, qs), &lo, &hi);
        q[0] = s8(lo), q[1] = s8(hi);
        break;
    }
    case AK_Q5_0: {
        /* q - 16 with q = nibble + 16·bit: the nibble less 16 where the bit is clear */
        uint8x16_t lo, hi, h0, h1;
        unpack_nibbles(b + offsetof(tr_blk_q5_0, qs), &lo, &hi);
        expand_bits32(b + offsetof(tr_blk_q5_0, qh), &h0, &h1);
        const uint8x16_t sixteen = vdupq_n_u8(16);
        q[0] = s8(vsubq_u8(lo, vbicq_u8(sixteen, h0)));
        q[1] = s8(vsubq_u8(hi, vbicq_u8(sixteen, h1)));
        break;
    }
    case AK_Q5_1: {
        uint8x16_t lo, hi, h0, h1;
        unpack_nibbles(b + offsetof(tr_blk_q5_1, qs), &lo, &hi);
        expand_bits32(b + offsetof(tr_blk_q5_1, qh), &h0, &h1);
        const uint8x16_t sixteen = vdupq_n_u8(16);
        q[0] = s8(vorrq_u8(lo, vandq_u8(sixteen, h0)));
        q[1] = s8(vorrq_u8(hi, vandq_u8(sixteen, h1)));
        break;
    }
    case AK_Q8_0:
        q[0] = vld1q_s8((const int8_t *)b + offsetof(tr_blk_q8_0, qs));
        q[1] = vld1q_s8((const int8_t *)b + offsetof(tr_blk_q8_0, qs) + 16);
        break;
    case AK_IQ4_NL:
    case AK_MXFP4: {
        const int8x16_t tab = vld1q_s8(k == AK_IQ4_NL ? tr_kvalues_iq4nl : tr_kvalues_mxfp4);
        uint8x16_t lo, hi;
        unpack_nibbles(b + (k == AK_IQ4_NL ? offsetof(tr_blk_iq4_nl, qs)
                                           : offsetof(tr_blk_mxfp4, qs)),
                       &lo, &hi);
        q[0] = vqtbl1q_s8(tab, lo);
        q[1] = vqtbl1q_s8(tab, hi);
        break;
    }
    case AK_Q2_K:
    case AK_Q3_K: {
        /* 32 code bytes per part; shift step s (0..3) takes bits 2s..2s+1 of each byte, bytes
         * 0..15 giving group 2s, bytes 16..31 group 2s+1. Q3_K: hmask bit 4p+s clear means the
         * code is 4 lower. */
        const uint8_t *qs = b + (k == AK_Q2_K ? offsetof(tr_blk_q2_k, qs)
                                              : offsetof(tr_blk_q3_k, qs)) +
                            32 * (size_t)p;
        const uint8x16_t v[2] = {vld1q_u8(qs), vld1q_u8(qs + 16)};
        uint8x16_t hm[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if (k == AK_Q3_K) hm[0] = vld1q_u8(b), hm[1] = vld1q_u8(b + 16);
        const uint8x16_t m3 = vdupq_n_u8(3);
        for (int sft = 0; sft < 4; sft++)
            for (int g = 0; g < 2; g++) {
                uint8x16_t c;
                switch (sft) { /* vshrq_n needs a constant */
                case 0: c = vandq_u8(v[g], m3); break;
                case 1: c = vandq_u8(vshrq_n_u8(v[g], 2), m3); break;
                case 2: c = vandq_u8(vshrq_n_u8(v[g], 4), m3); break;
                default: c = vshrq_n_u8(v[g], 6); break;
                }
                if (k == AK_Q3_K) {
                    const uint8x16_t set = vtstq_u8(hm[g], vdupq_n_u8((uint8_t)(1u << (4 * p + sft))));
                    c = vsubq_u8(c, vbicq_u8(vdupq_n_u8(4), set));
                }
                q[2 * sft + g] = s8(c);
            }
        break;
    }
    case AK_Q4_K:
    case AK_Q5_K: {
        /* chunk c (32 code bytes) holds sub-block 2c in its low nibbles and 2c+1 in its high
         * nibbles; part p is chunks 2p and 2p+1. Q5_K's fifth bits: bit 2c / 2c+1 of qh[l]. */
        const bool five = k == AK_Q5_K;
        const uint8_t *qs = b + (five ? offsetof(tr_blk_q5_k, qs) : offsetof(tr_blk_q4_k, qs));
        uint8x16_t qh[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if (five) {
            qh[0] = vld1q_u8(b + offsetof(tr_blk_q5_k, qh));
            qh[1] = vld1q_u8(b + offsetof(tr_blk_q5_k, qh) + 16);
        }
        for (int cc = 0; cc < 2; cc++) {
            const int c = 2 * p + cc;
            for (int g = 0; g < 2; g++) {
                const uint8x16_t v = vld1q_u8(qs + 32 * c + 16 * g);
                uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);
                if (five) {
                    const uint8x16_t sixteen = vdupq_n_u8(16);
                    lo = vorrq_u8(lo, vandq_u8(vtstq_u8(qh[g], vdupq_n_u8((uint8_t)(1u << (2 * c)))),
                                               sixteen));
                    hi = vorrq_u8(hi, vandq_u8(vtstq_u8(qh[g],
                                                        vdupq_n_u8((uint8_t)(2u << (2 * c)))),
                                               sixteen));
                }
                q[4 * cc + g] = s8(lo);
                q[4 * cc + 2 + g] = s8(hi);
            }
        }
        break;
    }
    case AK_Q6_K: {
        /* half p: ql[64p..] low nibbles give outputs 0..63 and high nibbles 64..127; the two
         * high bits come from qh[32p + l] bits 0-1, 2-3, 4-5, 6-7 for the four 32-output runs;
         * codes are stored + 32 */
        const uint8_t *ql = b + offsetof(tr_blk_q6_k, ql) + 64 * (size_t)p;
        const uint8_t *qhp = b + offsetof(tr_blk_q6_k, qh) + 32 * (size_t)p;
        const uint8x16_t m30 = vdupq_n_u8(0x30);
        const int8x16_t k32 = vdupq_n_s8(32);
        uint8x16_t l[4], h[2];
        for (int i = 0; i < 4; i++) l[i] = vld1q_u8(ql + 16 * i);
        h[0] = vld1q_u8(qhp), h[1] = vld1q_u8(qhp + 16);
        for (int i = 0; i < 4; i++) {
            const uint8x16_t hh = h[i % 2];
            const uint8x16_t hlo = i < 2 ? vandq_u8(vshlq_n_u8(hh, 4), m30)
                                         : vandq_u8(vshlq_n_u8(hh, 2), m30);
            const uint8x16_t hhi = i < 2 ? vandq_u8(hh, m30) : vandq_u8(vshrq_n_u8(hh, 2), m30);
            q[i] = vsubq_s8(s8(vorrq_u8(vandq_u8(l[i], m4), hlo)), k32);
            q[4 + i] = vsubq_s8(s8(vorrq_u8(vshrq_n_u8(l[i], 4), hhi)), k32);
        }
        break;
    }
    default: { /* IQ4_XS: sub-block ib (16 bytes), low nibbles then high nibbles */
        const int8x16_t tab = vld1q_s8(tr_kvalues_iq4nl);
        const uint8_t *qs = b + offsetof(tr_blk_iq4_xs, qs) + 64 * (size_t)p;
        for (int i = 0; i < 4; i++) {
            uint8x16_t lo, hi;
            unpack_nibbles(qs + 16 * i, &lo, &hi);
            q[2 * i] = vqtbl1q_s8(tab, lo);
            q[2 * i + 1] = vqtbl1q_s8(tab, hi);
        }
        break;
    }
    }
}

/* Σ_g mn_g · bsum_g over the 16 groups of a Q8_K block (the min term of Q2_K, Q4_K, Q5_K) */
TR_ALWAYS_INLINE int32_t ak_min_dot(const int16x8_t mn[2], const uint8_t *y) {
    const int16x8_t b0 = ld_s16x8(y + offsetof(tr_blk_q8_k, bsums));
    const int16x8_t b1 = ld_s16x8(y + offsetof(tr_blk_q8_k, bsums) + 16);
    int32x4_t t = vmull_s16(vget_low_s16(mn[0]), vget_low_s16(b0));
    t = vmlal_high_s16(t, mn[0], b0);
    t = vmlal_s16(t, vget_low_s16(mn[1]), vget_low_s16(b1));
    t = vmlal_high_s16(t, mn[1], b1);
    return vaddvq_s32(t);
}

#endif /* __aarch64__ */
#endif
