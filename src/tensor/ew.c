/* Scalar references of the element-wise kernels (kernels.h: rmsnorm, swiglu, geglu), following
 * llama.cpp's CPU numerics (GGUF-FACTS §6): RMSNorm sums squares in double and scales, then
 * multiplies by the weight in a separate f32 product; SiLU = x / (1 + expf(-x)); GELU from ggml's
 * F16 table, 0 at and below -10, the identity at and above 10. */
#include <math.h>

#include "tensor/fp16.h"
#include "tensor/kernels.h"

void tr_rmsnorm_ref(float *y, const float *x, const float *w, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w) {
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] * scale) * w[i];
    } else {
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
    }
}

void tr_swiglu_ref(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

float tr_gelu_lookup(float x, const uint16_t *table) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return tr_f16_to_f32(table[tr_f32_to_f16(x)]);
}

void tr_geglu_ref(float *g, const float *u, int64_t n, const uint16_t *table) {
    for (int64_t i = 0; i < n; i++) g[i] = tr_gelu_lookup(g[i], table) * u[i];
}
