/*
 * Scalar dequantization, bit-exact with ggml's dequantize_row_* (GGUF-FACTS §2). Built with
 * -ffp-contract=off so that `a*b - c` is never fused into an FMA: the test compares the f32 output
 * bit-for-bit against an independent numpy implementation.
 */
#include "tensor/fp16.h"
#include "tensor/types.h"

const int8_t tr_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};
const int8_t tr_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void tr_dequant_f32(const void *restrict x, float *restrict y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

void tr_dequant_f16(const void *restrict x, float *restrict y, int64_t n) {
    const char *h = x; /* any alignment (unaligned.h) */
    for (int64_t i = 0; i < n; i++) y[i] = tr_f16_to_f32(tr_load_u16(h + 2 * i));
}

void tr_dequant_bf16(const void *restrict x, float *restrict y, int64_t n) {
    const char *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = tr_bf16_to_f32(tr_load_u16(h + 2 * i));
}

void tr_dequant_q4_0(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q4_0 *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_f16_to_f32(x[b].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((x[b].qs[j] & 0xF) - 8) * d;
            y[j + 16] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

void tr_dequant_q4_1(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q4_1 *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_f16_to_f32(x[b].d);
        const float m = tr_f16_to_f32(x[b].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(x[b].qs[j] & 0xF) * d + m;
            y[j + 16] = (float)(x[b].qs[j] >> 4) * d + m;
        }
    }
}

static inline uint32_t load_u32_le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tr_dequant_q5_0(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q5_0 *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_f16_to_f32(x[b].d);
        const uint32_t qh = load_u32_le(x[b].qh);
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(((x[b].qs[j] & 0xF) | h0) - 16) * d;
            y[j + 16] = (float)(((x[b].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void tr_dequant_q5_1(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q5_1 *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_f16_to_f32(x[b].d);
        const float m = tr_f16_to_f32(x[b].m);
        const uint32_t qh = load_u32_le(x[b].qh);
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)((x[b].qs[j] & 0xF) | h0) * d + m;
            y[j + 16] = (float)((x[b].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void tr_dequant_q8_0(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q8_0 *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_f16_to_f32(x[b].d);
        for (int j = 0; j < 32; j++) y[j] = (float)x[b].qs[j] * d;
    }
}

void tr_dequant_q8_1(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q8_1 *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_f16_to_f32(x[b].d);
        for (int j = 0; j < 32; j++) y[j] = (float)x[b].qs[j] * d;
    }
}

void tr_dequant_iq4_nl(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_iq4_nl *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_f16_to_f32(x[b].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)tr_kvalues_iq4nl[x[b].qs[j] & 0xF];
            y[j + 16] = d * (float)tr_kvalues_iq4nl[x[b].qs[j] >> 4];
        }
    }
}

void tr_dequant_mxfp4(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_mxfp4 *x = vx;
    for (int64_t b = 0; b < n / TR_QK32; b++, y += TR_QK32) {
        const float d = tr_e8m0_to_f32_half(x[b].e);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)tr_kvalues_mxfp4[x[b].qs[j] & 0xF] * d;
            y[j + 16] = (float)tr_kvalues_mxfp4[x[b].qs[j] >> 4] * d;
        }
    }
}

void tr_dequant_q2_k(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q2_k *x = vx;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const float d = tr_f16_to_f32(x[b].d);
        const float min = tr_f16_to_f32(x[b].dmin);
        const uint8_t *q = x[b].qs;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int g = 0; g < 2; g++) {
                    const uint8_t sc = x[b].scales[is++];
                    const float dl = d * (float)(sc & 0xF);
                    const float ml = min * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[16 * g + l] >> shift) & 3) - ml;
                }
            }
        }
    }
}

/* the 16 signed 6-bit Q3_K scales (GGUF-FACTS §2.3.7) */
static void q3k_scales(const uint8_t *s, int8_t *out) {
    for (int i = 0; i < 16; i++) {
        const int low4 = i < 8 ? (s[i] & 15) : (s[i - 8] >> 4);
        const int high2 = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        out[i] = (int8_t)((low4 | (high2 << 4)) - 32);
    }
}

void tr_dequant_q3_k(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q3_k *x = vx;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const float d_all = tr_f16_to_f32(x[b].d);
        int8_t scales[16];
        q3k_scales(x[b].scales, scales);
        const uint8_t *q = x[b].qs;
        const uint8_t *hm = x[b].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int g = 0; g < 2; g++) {
                    const float dl = d_all * (float)scales[is++];
                    for (int l = 16 * g; l < 16 * g + 16; l++)
                        *y++ = dl * (float)((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                }
            }
        }
    }
}

void tr_dequant_q4_k(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q4_k *x = vx;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const float d = tr_f16_to_f32(x[b].d);
        const float min = tr_f16_to_f32(x[b].dmin);
        const uint8_t *q = x[b].qs;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc, mn;
            tr_get_scale_min_k4(2 * c, x[b].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = min * (float)mn;
            tr_get_scale_min_k4(2 * c + 1, x[b].scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = min * (float)mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void tr_dequant_q5_k(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q5_k *x = vx;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const float d = tr_f16_to_f32(x[b].d);
        const float min = tr_f16_to_f32(x[b].dmin);
        const uint8_t *ql = x[b].qs;
        const uint8_t *qh = x[b].qh;
        uint8_t u1 = 1, u2 = 2;
        for (int c = 0; c < 4; c++, ql += 32, u1 = (uint8_t)(u1 << 2), u2 = (uint8_t)(u2 << 2)) {
            uint8_t sc, mn;
            tr_get_scale_min_k4(2 * c, x[b].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = min * (float)mn;
            tr_get_scale_min_k4(2 * c + 1, x[b].scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = min * (float)mn;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

void tr_dequant_q6_k(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q6_k *x = vx;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const float d = tr_f16_to_f32(x[b].d);
        const uint8_t *ql = x[b].ql;
        const uint8_t *qh = x[b].qh;
        const int8_t *sc = x[b].scales;
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void tr_dequant_q8_k(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_q8_k *x = vx;
    for (int64_t b = 0; b < n / TR_QK_K; b++)
        for (int j = 0; j < TR_QK_K; j++) *y++ = x[b].d * (float)x[b].qs[j];
}

void tr_dequant_iq4_xs(const void *restrict vx, float *restrict y, int64_t n) {
    const tr_blk_iq4_xs *x = vx;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const float d = tr_f16_to_f32(x[b].d);
        const uint8_t *qs = x[b].qs;
        for (int ib = 0; ib < 8; ib++, qs += 16, y += 32) {
            const int ls = ((x[b].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) |
                           (((x[b].scales_h >> 2 * ib) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)tr_kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * (float)tr_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}
