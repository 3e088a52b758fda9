/*
 * Scalar reference dot products: weight row (any supported type) x activation row (the type's
 * vec_dot_type). Integer sums per block, scaled in float, accumulated in double. Every SIMD kernel
 * is tested against these.
 */
#include "tensor/fp16.h"
#include "tensor/types.h"

void tr_vec_dot_f32_ref(int64_t n, float *restrict s, const void *restrict vw,
                        const void *restrict va) {
    const char *w = vw, *a = va; /* weights at any alignment (unaligned.h) */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(tr_load_f32(w + 4 * i) * tr_load_f32(a + 4 * i));
    *s = (float)sum;
}

void tr_vec_dot_f16_ref(int64_t n, float *restrict s, const void *restrict vw,
                        const void *restrict va) {
    const char *w = vw, *a = va;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(tr_f16_to_f32(tr_load_u16(w + 2 * i)) *
                        tr_f16_to_f32(tr_load_u16(a + 2 * i)));
    *s = (float)sum;
}

void tr_vec_dot_bf16_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const char *w = vw, *a = va;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(tr_bf16_to_f32(tr_load_u16(w + 2 * i)) *
                        tr_bf16_to_f32(tr_load_u16(a + 2 * i)));
    *s = (float)sum;
}

void tr_vec_dot_q4_0_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q4_0 *w = vw;
    const tr_blk_q8_0 *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK32; b++) {
        int si = 0;
        for (int j = 0; j < 16; j++) {
            si += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j];
            si += ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
        }
        sum += (double)((float)si * tr_f16_to_f32(w[b].d) * tr_f16_to_f32(a[b].d));
    }
    *s = (float)sum;
}

void tr_vec_dot_q4_1_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q4_1 *w = vw;
    const tr_blk_q8_1 *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK32; b++) {
        int si = 0;
        for (int j = 0; j < 16; j++) {
            si += (w[b].qs[j] & 0xF) * a[b].qs[j];
            si += (w[b].qs[j] >> 4) * a[b].qs[j + 16];
        }
        const float dd = tr_f16_to_f32(w[b].d) * tr_f16_to_f32(a[b].d);
        sum += (double)(dd * (float)si + tr_f16_to_f32(w[b].m) * tr_f16_to_f32(a[b].s));
    }
    *s = (float)sum;
}

static inline uint32_t load_u32_le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tr_vec_dot_q5_0_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q5_0 *w = vw;
    const tr_blk_q8_0 *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK32; b++) {
        const uint32_t qh = load_u32_le(w[b].qh);
        int si = 0;
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            si += (((w[b].qs[j] & 0xF) | h0) - 16) * a[b].qs[j];
            si += (((w[b].qs[j] >> 4) | h1) - 16) * a[b].qs[j + 16];
        }
        sum += (double)((float)si * tr_f16_to_f32(w[b].d) * tr_f16_to_f32(a[b].d));
    }
    *s = (float)sum;
}

void tr_vec_dot_q5_1_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q5_1 *w = vw;
    const tr_blk_q8_1 *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK32; b++) {
        const uint32_t qh = load_u32_le(w[b].qh);
        int si = 0;
        for (int j = 0; j < 16; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            si += ((w[b].qs[j] & 0xF) | h0) * a[b].qs[j];
            si += ((w[b].qs[j] >> 4) | h1) * a[b].qs[j + 16];
        }
        const float dd = tr_f16_to_f32(w[b].d) * tr_f16_to_f32(a[b].d);
        sum += (double)(dd * (float)si + tr_f16_to_f32(w[b].m) * tr_f16_to_f32(a[b].s));
    }
    *s = (float)sum;
}

void tr_vec_dot_q8_0_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q8_0 *w = vw;
    const tr_blk_q8_0 *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK32; b++) {
        int si = 0;
        for (int j = 0; j < 32; j++) si += w[b].qs[j] * a[b].qs[j];
        sum += (double)((float)si * tr_f16_to_f32(w[b].d) * tr_f16_to_f32(a[b].d));
    }
    *s = (float)sum;
}

void tr_vec_dot_iq4_nl_ref(int64_t n, float *restrict s, const void *restrict vw,
                           const void *restrict va) {
    const tr_blk_iq4_nl *w = vw;
    const tr_blk_q8_0 *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK32; b++) {
        int si = 0;
        for (int j = 0; j < 16; j++) {
            si += tr_kvalues_iq4nl[w[b].qs[j] & 0xF] * a[b].qs[j];
            si += tr_kvalues_iq4nl[w[b].qs[j] >> 4] * a[b].qs[j + 16];
        }
        sum += (double)((float)si * tr_f16_to_f32(w[b].d) * tr_f16_to_f32(a[b].d));
    }
    *s = (float)sum;
}

void tr_vec_dot_mxfp4_ref(int64_t n, float *restrict s, const void *restrict vw,
                          const void *restrict va) {
    const tr_blk_mxfp4 *w = vw;
    const tr_blk_q8_0 *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK32; b++) {
        int si = 0;
        for (int j = 0; j < 16; j++) {
            si += tr_kvalues_mxfp4[w[b].qs[j] & 0xF] * a[b].qs[j];
            si += tr_kvalues_mxfp4[w[b].qs[j] >> 4] * a[b].qs[j + 16];
        }
        const float d = tr_f16_to_f32(a[b].d) * tr_e8m0_to_f32_half(w[b].e);
        sum += (double)(d * (float)si);
    }
    *s = (float)sum;
}

void tr_vec_dot_q2_k_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q2_k *w = vw;
    const tr_blk_q8_k *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        int summs = 0;
        for (int j = 0; j < 16; j++) summs += a[b].bsums[j] * (w[b].scales[j] >> 4);
        const int8_t *q8 = a[b].qs;
        const uint8_t *q2 = w[b].qs;
        int isum = 0, is = 0;
        for (int half = 0; half < 2; half++, q2 += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int g = 0; g < 2; g++) {
                    const int sc = w[b].scales[is++] & 0xF;
                    int si = 0;
                    for (int l = 0; l < 16; l++) si += q8[l] * ((q2[16 * g + l] >> shift) & 3);
                    isum += sc * si;
                    q8 += 16;
                }
            }
        }
        const float dall = a[b].d * tr_f16_to_f32(w[b].d);
        const float dmin = a[b].d * tr_f16_to_f32(w[b].dmin);
        sum += (double)(dall * (float)isum - dmin * (float)summs);
    }
    *s = (float)sum;
}

void tr_vec_dot_q3_k_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q3_k *w = vw;
    const tr_blk_q8_k *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        int8_t scales[16];
        const uint8_t *sb = w[b].scales;
        for (int i = 0; i < 16; i++) {
            const int low4 = i < 8 ? (sb[i] & 15) : (sb[i - 8] >> 4);
            const int high2 = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
            scales[i] = (int8_t)((low4 | (high2 << 4)) - 32);
        }
        const int8_t *q8 = a[b].qs;
        const uint8_t *q3 = w[b].qs;
        const uint8_t *hm = w[b].hmask;
        uint8_t m = 1;
        int isum = 0, is = 0;
        for (int half = 0; half < 2; half++, q3 += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int g = 0; g < 2; g++) {
                    int si = 0;
                    for (int l = 16 * g; l < 16 * g + 16; l++) {
                        const int q = ((q3[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
                        si += q * q8[l - 16 * g];
                    }
                    isum += scales[is++] * si;
                    q8 += 16;
                }
            }
        }
        sum += (double)(a[b].d * tr_f16_to_f32(w[b].d) * (float)isum);
    }
    *s = (float)sum;
}

void tr_vec_dot_q4_k_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q4_k *w = vw;
    const tr_blk_q8_k *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const uint8_t *q4 = w[b].qs;
        const int8_t *q8 = a[b].qs;
        int isum = 0, msum = 0;
        for (int c = 0; c < 4; c++, q4 += 32, q8 += 64) {
            uint8_t sc1, mn1, sc2, mn2;
            tr_get_scale_min_k4(2 * c, w[b].scales, &sc1, &mn1);
            tr_get_scale_min_k4(2 * c + 1, w[b].scales, &sc2, &mn2);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += (q4[l] & 0xF) * q8[l];
                s2 += (q4[l] >> 4) * q8[l + 32];
            }
            isum += sc1 * s1 + sc2 * s2;
            msum += mn1 * (a[b].bsums[4 * c] + a[b].bsums[4 * c + 1]) +
                    mn2 * (a[b].bsums[4 * c + 2] + a[b].bsums[4 * c + 3]);
        }
        const float d = a[b].d * tr_f16_to_f32(w[b].d);
        const float dmin = a[b].d * tr_f16_to_f32(w[b].dmin);
        sum += (double)(d * (float)isum - dmin * (float)msum);
    }
    *s = (float)sum;
}

void tr_vec_dot_q5_k_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q5_k *w = vw;
    const tr_blk_q8_k *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const uint8_t *ql = w[b].qs;
        const uint8_t *qh = w[b].qh;
        const int8_t *q8 = a[b].qs;
        int isum = 0, msum = 0;
        for (int c = 0; c < 4; c++, ql += 32, q8 += 64) {
            uint8_t sc1, mn1, sc2, mn2;
            tr_get_scale_min_k4(2 * c, w[b].scales, &sc1, &mn1);
            tr_get_scale_min_k4(2 * c + 1, w[b].scales, &sc2, &mn2);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += ((ql[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4)) * q8[l];
                s2 += ((ql[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4)) * q8[l + 32];
            }
            isum += sc1 * s1 + sc2 * s2;
            msum += mn1 * (a[b].bsums[4 * c] + a[b].bsums[4 * c + 1]) +
                    mn2 * (a[b].bsums[4 * c + 2] + a[b].bsums[4 * c + 3]);
        }
        const float d = a[b].d * tr_f16_to_f32(w[b].d);
        const float dmin = a[b].d * tr_f16_to_f32(w[b].dmin);
        sum += (double)(d * (float)isum - dmin * (float)msum);
    }
    *s = (float)sum;
}

void tr_vec_dot_q6_k_ref(int64_t n, float *restrict s, const void *restrict vw,
                         const void *restrict va) {
    const tr_blk_q6_k *w = vw;
    const tr_blk_q8_k *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const uint8_t *ql = w[b].ql;
        const uint8_t *qh = w[b].qh;
        const int8_t *sc = w[b].scales;
        const int8_t *q8 = a[b].qs;
        int isum = 0;
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, q8 += 128) {
            int sums[8] = {0};
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                sums[is + 0] += q1 * q8[l];
                sums[is + 2] += q2 * q8[l + 32];
                sums[is + 4] += q3 * q8[l + 64];
                sums[is + 6] += q4 * q8[l + 96];
            }
            for (int k = 0; k < 8; k++) isum += sc[k] * sums[k];
        }
        sum += (double)(a[b].d * tr_f16_to_f32(w[b].d) * (float)isum);
    }
    *s = (float)sum;
}

void tr_vec_dot_iq4_xs_ref(int64_t n, float *restrict s, const void *restrict vw,
                           const void *restrict va) {
    const tr_blk_iq4_xs *w = vw;
    const tr_blk_q8_k *a = va;
    double sum = 0.0;
    for (int64_t b = 0; b < n / TR_QK_K; b++) {
        const uint8_t *qs = w[b].qs;
        const int8_t *q8 = a[b].qs;
        int isum = 0;
        for (int ib = 0; ib < 8; ib++, qs += 16, q8 += 32) {
            const int ls = ((w[b].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) |
                           (((w[b].scales_h >> 2 * ib) & 3) << 4);
            int si = 0;
            for (int j = 0; j < 16; j++) {
                si += tr_kvalues_iq4nl[qs[j] & 0xF] * q8[j];
                si += tr_kvalues_iq4nl[qs[j] >> 4] * q8[j + 16];
            }
            isum += (ls - 32) * si;
        }
        sum += (double)(tr_f16_to_f32(w[b].d) * a[b].d * (float)isum);
    }
    *s = (float)sum;
}
