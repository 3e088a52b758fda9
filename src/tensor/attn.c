/* The scalar reference of the attention kernel (kernels.h, attn_f16) and its scratch size. */
#include <math.h>

#include "tensor/fp16.h"
#include "tensor/kernels.h"

static size_t up16(size_t n) { return (n + 15) & ~(size_t)15; }

size_t tr_attn_scratch_floats(int32_t n_keys, int32_t hd_k, int32_t hd_v) {
    /* the kernels' layout: scores [MAX_Q][keys rounded up to blocks, plus one block for a
     * tile that does not start on a block], queries [MAX_Q][hd_k], keys [hd_k][KB], values
     * [KB][hd_v rounded to 64], outputs [MAX_Q][hd_v rounded to 64]; the reference uses less */
    const size_t keys = ((size_t)n_keys + 2 * TR_ATTN_KB - 1) / TR_ATTN_KB * TR_ATTN_KB;
    const size_t hv = ((size_t)hd_v + 63) & ~(size_t)63;
    return up16(TR_ATTN_MAX_Q * keys) + up16(TR_ATTN_MAX_Q * (size_t)hd_k) +
           up16((size_t)hd_k * TR_ATTN_KB) + up16(TR_ATTN_KB * hv) + up16(TR_ATTN_MAX_Q * hv) + 16;
}

void tr_attn_f16_ref(int n_q, const tr_attn_q *qs, const tr_attn_kv *kv, float *scratch) {
    for (int i = 0; i < n_q; i++) {
        const tr_attn_q *a = &qs[i];
        const int32_t n = a->hi - a->lo + 1;
        float *scores = scratch;
        uint16_t *q16 = (uint16_t *)(scores + n), *p16 = q16 + kv->hd_k, *k16 = p16 + n;
        for (int32_t d = 0; d < kv->hd_k; d++) q16[d] = tr_f32_to_f16(a->q[d]);
        float mx = -INFINITY;
        for (int32_t t = 0; t < n; t++) {
            for (int32_t d = 0; d < kv->hd_k; d++) k16[d] = kv->k[(size_t)(a->lo + t) * kv->k_pos + d];
            float s;
            tr_vec_dot_f16_ref(kv->hd_k, &s, k16, q16);
            s *= kv->scale;
            scores[t] = s;
            if (s > mx) mx = s;
        }
        if (a->sink > mx) mx = a->sink;
        double sum = 0.0;
        for (int32_t t = 0; t < n; t++) {
            const float e = expf(scores[t] - mx);
            scores[t] = e;
            sum += (double)e;
        }
        if (a->sink != -INFINITY) sum += (double)expf(a->sink - mx);
        if (a->max) *a->max = mx;
        if (a->sum) *a->sum = sum;
        const float inv = (float)(1.0 / sum);
        for (int32_t t = 0; t < n; t++) p16[t] = tr_f32_to_f16(scores[t] * inv);
        for (int32_t d = 0; d < kv->hd_v; d++) {
            double o = 0.0;
            for (int32_t t = 0; t < n; t++)
                o += (double)(tr_f16_to_f32(p16[t]) *
                              tr_f16_to_f32(kv->v[(size_t)(a->lo + t) * kv->v_pos + (size_t)d * kv->v_dim]));
            a->out[d] = (float)o;
        }
    }
}
