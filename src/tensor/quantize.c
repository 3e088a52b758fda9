/*
 * Activation quantizers: the formats llama.cpp converts activations to before a dot product
 * (GGUF-FACTS §2.4). Rounding is to nearest, ties to even — what llama.cpp's x86 SIMD paths do
 * (its scalar reference rounds ties away from zero; ties are measure-zero on real activations).
 */
#include <math.h>

#include "tensor/fp16.h"
#include "tensor/types.h"

void tr_quant_f32(const float *restrict x, void *restrict y, int64_t n) {
    memcpy(y, x, (size_t)n * sizeof(float));
}

void tr_quant_f16(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = tr_f32_to_f16(x[i]);
}

void tr_quant_bf16(const float *restrict x, void *restrict vy, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = tr_f32_to_bf16(x[i]);
}

void tr_quant_q8_0(const float *restrict x, void *restrict vy, int64_t n) {
    tr_blk_q8_0 *y = vy;
    for (int64_t b = 0; b < n / TR_QK32; b++, x += TR_QK32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = tr_f32_to_f16(d);
        for (int j = 0; j < 32; j++) y[b].qs[j] = (int8_t)nearbyintf(x[j] * id);
    }
}

void tr_quant_q8_1(const float *restrict x, void *restrict vy, int64_t n) {
    tr_blk_q8_1 *y = vy;
    for (int64_t b = 0; b < n / TR_QK32; b++, x += TR_QK32) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            y[b].qs[j] = (int8_t)nearbyintf(x[j] * id);
            sum += y[b].qs[j];
        }
        y[b].d = tr_f32_to_f16(d);
        y[b].s = tr_f32_to_f16((float)sum * d);
    }
}

/* ggml's nearest_int: round to nearest even through the 1.5*2^23 magic number. Exact for
 * |v| < 2^22, which holds here (|v| <= 127 by construction). */
static inline int nearest_int(float v) {
    float val = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &val, 4);
    return (i & 0x007fffff) - 0x00400000;
}

void tr_quant_q8_k(const float *restrict x, void *restrict vy, int64_t n) {
    tr_blk_q8_k *y = vy;
    for (int64_t b = 0; b < n / TR_QK_K; b++, x += TR_QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < TR_QK_K; j++) {
            const float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            y[b].d = 0.0f;
            memset(y[b].qs, 0, sizeof y[b].qs);
            memset(y[b].bsums, 0, sizeof y[b].bsums);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < TR_QK_K; j++) {
            const int v = nearest_int(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < TR_QK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += y[b].qs[16 * g + l];
            y[b].bsums[g] = (int16_t)s;
        }
        y[b].d = 1.0f / iscale;
    }
}
