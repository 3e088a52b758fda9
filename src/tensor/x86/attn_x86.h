/*
 * The attention kernel (kernels.h, attn_f16) for the AVX2 and AVX-512 families: compiled by
 * both, 256-bit or 512-bit vectors.
 *
 * One call: n_q <= TR_ATTN_MAX_Q query vectors against one KV head. The keys any of them sees, [T0, T1],
 * are walked in blocks of TR_ATTN_KB: each block of K is converted to f32 transposed, [d][key],
 * so a vector holds 16 (8) keys and a score tile of AV_QI queries × 64 keys is one broadcast
 * FMA per query, dimension and vector. The scores of the whole tile, [query][T0..T1], stay in
 * the scratch (L2/L3: 32 queries × 4K keys is 512 KiB, walked in order), where each query's softmax is a pass
 * with the reference's roundings (max, exp, the sum in double, the probabilities rounded to
 * F16). Then each block of V is converted to f32 rows, [key][d], and the outputs, [query][d],
 * accumulate p·v with broadcast FMAs. K and V are read once per tile instead of once per query:
 * with a GQA group of 4 and 4 positions per tile, a 16th of the cache traffic and conversions.
 */
#ifndef TR_TENSOR_X86_ATTN_X86_H
#define TR_TENSOR_X86_ATTN_X86_H

#include <math.h>

#include "tensor/x86/vecf_x86.h"

#if defined(__x86_64__)

/* src[a * sa + b] (F16) for a < na, b < nb -> dst[b * ld + a] (f32); a past na reads nothing
 * and gives 0 up to a_pad; nb is any count */
TR_ALWAYS_INLINE void av_cvt_transpose(const uint16_t *src, size_t sa, int na, int a_pad, int nb,
                                       float *dst, size_t ld) {
    int b = 0;
    for (; b + 8 <= nb; b += 8)
        for (int a0 = 0; a0 < a_pad; a0 += 8) {
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = a0 + i < na
                           ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + (size_t)(a0 + i) * sa + b)))
                           : _mm256_setzero_ps();
            tr_transpose8x8((__m256i *)v);
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(dst + (size_t)(b + j) * ld + a0, v[j]);
        }
    for (; b < nb; b++)
        for (int a = 0; a < a_pad; a++)
            dst[(size_t)b * ld + a] = a < na ? x86_f16(src[(size_t)a * sa + b]) : 0.0f;
}

/* src[a * sa + b] (F16) -> dst[a * ld + b] (f32) for a < na (zeros up to a_pad), b < nb (zeros
 * up to ld) */
TR_ALWAYS_INLINE void av_cvt_rows(const uint16_t *src, size_t sa, int na, int a_pad, int nb,
                                  float *dst, size_t ld) {
    for (int a = 0; a < a_pad; a++) {
        float *d = dst + (size_t)a * ld;
        int b = 0;
        if (a < na) {
            const uint16_t *s = src + (size_t)a * sa;
            for (; b + 8 <= nb; b += 8)
                _mm256_storeu_ps(d + b, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + b))));
            for (; b < nb; b++) d[b] = x86_f16(s[b]);
        }
        for (; b < (int)ld; b++) d[b] = 0.0f;
    }
}

/* S[i][kc .. kc + AV_CH) = scale · Q_i · Kt[.][kc ..] for qi queries from i0 */
TR_ALWAYS_INLINE void av_qk(const int qi, int hd, const float *Qt, const float *Kt, int kc,
                            float scale, float *S, size_t ss) {
    av_f acc[AV_QI][AV_NV];
#pragma GCC unroll 4
    for (int i = 0; i < qi; i++)
#pragma GCC unroll 4
        for (int j = 0; j < AV_NV; j++) acc[i][j] = av_zero();
    for (int d = 0; d < hd; d++) {
        av_f k[AV_NV];
#pragma GCC unroll 4
        for (int j = 0; j < AV_NV; j++) k[j] = av_load(Kt + (size_t)d * TR_ATTN_KB + kc + j * AV_W);
#pragma GCC unroll 4
        for (int i = 0; i < qi; i++) {
            const av_f q = av_set1(Qt[(size_t)i * hd + d]);
#pragma GCC unroll 4
            for (int j = 0; j < AV_NV; j++) acc[i][j] = av_fma(q, k[j], acc[i][j]);
        }
    }
    const av_f vs = av_set1(scale);
#pragma GCC unroll 4
    for (int i = 0; i < qi; i++)
#pragma GCC unroll 4
        for (int j = 0; j < AV_NV; j++) av_store(S + (size_t)i * ss + kc + j * AV_W, av_mul(acc[i][j], vs));
}

/* O[i][dc ..] += Σ_{t < nt} P[i][t] · Vb[t][dc ..] for qi queries */
TR_ALWAYS_INLINE void av_pv(const int qi, int nt, const float *P, size_t ps, const float *Vb,
                            size_t ld, int dc, float *O, size_t os) {
    av_f acc[AV_QI][AV_NV];
#pragma GCC unroll 4
    for (int i = 0; i < qi; i++)
#pragma GCC unroll 4
        for (int j = 0; j < AV_NV; j++) acc[i][j] = av_load(O + (size_t)i * os + dc + j * AV_W);
    for (int t = 0; t < nt; t++) {
        av_f v[AV_NV];
#pragma GCC unroll 4
        for (int j = 0; j < AV_NV; j++) v[j] = av_load(Vb + (size_t)t * ld + dc + j * AV_W);
#pragma GCC unroll 4
        for (int i = 0; i < qi; i++) {
            const av_f p = av_set1(P[(size_t)i * ps + t]);
#pragma GCC unroll 4
            for (int j = 0; j < AV_NV; j++) acc[i][j] = av_fma(p, v[j], acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < qi; i++)
#pragma GCC unroll 4
        for (int j = 0; j < AV_NV; j++) av_store(O + (size_t)i * os + dc + j * AV_W, acc[i][j]);
}

static __attribute__((unused)) void av_attn_f16(int n_q, const tr_attn_q *qs, const tr_attn_kv *kv,
                                                float *scratch) {
    const int hdk = kv->hd_k, hdv = kv->hd_v, KB = TR_ATTN_KB;
    const int hvp = (hdv + AV_CH - 1) / AV_CH * AV_CH; /* padded value row */
    int32_t T0 = qs[0].lo, T1 = qs[0].hi;
    for (int i = 1; i < n_q; i++) {
        if (qs[i].lo < T0) T0 = qs[i].lo;
        if (qs[i].hi > T1) T1 = qs[i].hi;
    }
    const int nkeys = T1 - T0 + 1, nblk = (nkeys + KB - 1) / KB;
    const size_t ss = (size_t)nblk * KB; /* score row stride */
    /* the scratch, as tr_attn_scratch_floats sized it (16-float aligned parts) */
    float *base = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *S = base;
    float *Qt = S + ((TR_ATTN_MAX_Q * ss + 15) & ~(size_t)15);
    float *Kt = Qt + ((TR_ATTN_MAX_Q * (size_t)hdk + 15) & ~(size_t)15);
    float *Vb = Kt + (((size_t)hdk * KB + 15) & ~(size_t)15);
    float *O = Vb + (((size_t)KB * hvp + 15) & ~(size_t)15);
    for (int i = 0; i < n_q; i++) {
        for (int d = 0; d < hdk; d++) Qt[(size_t)i * hdk + d] = x86_f16(tr_f32_to_f16(qs[i].q[d]));
        memset(O + (size_t)i * hvp, 0, sizeof(float) * (size_t)hvp);
    }

    /* pass 1: scores, block by block; keys outside a query's range get -inf */
    for (int b = 0; b < nblk; b++) {
        const int tb = T0 + b * KB, nt = nkeys - b * KB < KB ? nkeys - b * KB : KB;
        av_cvt_transpose(kv->k + (size_t)tb * kv->k_pos, kv->k_pos, nt, KB, hdk, Kt, KB);
        for (int kc = 0; kc < KB; kc += AV_CH)
            for (int i0 = 0; i0 < n_q; i0 += AV_QI) {
                const int qi = n_q - i0 < AV_QI ? n_q - i0 : AV_QI;
                float *Si = S + (size_t)i0 * ss + (size_t)b * KB;
                const float *Qi = Qt + (size_t)i0 * hdk;
                switch (qi) {
                case 1: av_qk(1, hdk, Qi, Kt, kc, kv->scale, Si, ss); break;
#if AV_QI > 2
                case 2: av_qk(2, hdk, Qi, Kt, kc, kv->scale, Si, ss); break;
                case 3: av_qk(3, hdk, Qi, Kt, kc, kv->scale, Si, ss); break;
#endif
                default: av_qk(AV_QI, hdk, Qi, Kt, kc, kv->scale, Si, ss); break;
                }
            }
        for (int i = 0; i < n_q; i++)
            if (tb < qs[i].lo || tb + KB - 1 > qs[i].hi)
                for (int t = 0; t < KB; t++)
                    if (tb + t < qs[i].lo || tb + t > qs[i].hi)
                        S[(size_t)i * ss + (size_t)b * KB + t] = -INFINITY;
    }

    /* pass 2: each query's softmax over its row, with the reference's roundings */
    for (int i = 0; i < n_q; i++) {
        float *Si = S + (size_t)i * ss;
        av_f m = av_set1(-INFINITY);
        for (size_t t = 0; t < ss; t += AV_W) m = av_max(m, av_load(Si + t));
        float mx = av_hmax(m);
        if (qs[i].sink > mx) mx = qs[i].sink;
        const av_f vmx = av_set1(mx);
        av_d dsum = av_dzero();
        for (size_t t = 0; t < ss; t += AV_W) {
            const av_f e = av_exp(av_sub(av_load(Si + t), vmx));
            av_store(Si + t, e);
            dsum = av_dsum(dsum, e);
        }
        double sum = av_dhsum(dsum);
        if (qs[i].sink != -INFINITY) sum += (double)expf(qs[i].sink - mx);
        if (qs[i].max) *qs[i].max = mx;
        if (qs[i].sum) *qs[i].sum = sum;
        const av_f inv = av_set1((float)(1.0 / sum));
        for (size_t t = 0; t < ss; t += AV_W) av_store(Si + t, av_f16_round(av_mul(av_load(Si + t), inv)));
    }

    /* pass 3: outputs, block by block of V */
    for (int b = 0; b < nblk; b++) {
        const int tb = T0 + b * KB, nt = nkeys - b * KB < KB ? nkeys - b * KB : KB;
        const uint16_t *vb = kv->v + (size_t)tb * kv->v_pos;
        if (kv->v_dim == 1) av_cvt_rows(vb, kv->v_pos, nt, nt, hdv, Vb, (size_t)hvp);
        else if (kv->v_pos == 1) {
            av_cvt_transpose(vb, kv->v_dim, hdv, hvp, nt, Vb, (size_t)hvp);
        } else {
            for (int t = 0; t < nt; t++)
                for (int d = 0; d < hvp; d++)
                    Vb[(size_t)t * hvp + d] =
                        d < hdv ? x86_f16(vb[(size_t)t * kv->v_pos + (size_t)d * kv->v_dim]) : 0.0f;
        }
        for (int dc = 0; dc < hvp; dc += AV_CH)
            for (int i0 = 0; i0 < n_q; i0 += AV_QI) {
                const int qi = n_q - i0 < AV_QI ? n_q - i0 : AV_QI;
                const float *Pi = S + (size_t)i0 * ss + (size_t)b * KB;
                float *Oi = O + (size_t)i0 * hvp;
                switch (qi) {
                case 1: av_pv(1, nt, Pi, ss, Vb, (size_t)hvp, dc, Oi, (size_t)hvp); break;
#if AV_QI > 2
                case 2: av_pv(2, nt, Pi, ss, Vb, (size_t)hvp, dc, Oi, (size_t)hvp); break;
                case 3: av_pv(3, nt, Pi, ss, Vb, (size_t)hvp, dc, Oi, (size_t)hvp); break;
#endif
                default: av_pv(AV_QI, nt, Pi, ss, Vb, (size_t)hvp, dc, Oi, (size_t)hvp); break;
                }
            }
    }
    for (int i = 0; i < n_q; i++) memcpy(qs[i].out, O + (size_t)i * hvp, sizeof(float) * (size_t)hdv);
}

#endif /* __x86_64__ */
#endif
