/*
 * Element-wise and attention operations of the forward pass, written to follow llama.cpp's CPU
 * numerics (GGUF-FACTS §6): RMSNorm sums squares in double, RoPE angles advance iteratively in
 * float, softmax sums in double, GELU goes through ggml's F16 lookup table.
 */
#ifndef TR_MODEL_OPS_H
#define TR_MODEL_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"

/* y = x / sqrt(mean(x^2) + eps) * w   (w may be NULL; y may alias x) */
void tr_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);

typedef struct tr_rope_params {
    int32_t n_rot;
    tr_rope_style style;
    float base, freq_scale;
    float ext_factor, attn_factor, beta_fast, beta_slow;
    int32_t n_ctx_orig;
    const float *freq_factors; /* n_rot/2 divisors or NULL */
} tr_rope_params;

/* cos/sin for one position: cs[2i] = cos(theta_i), cs[2i+1] = sin(theta_i), i < n_rot/2 */
void tr_rope_cache(float *cs, int32_t pos, const tr_rope_params *p);
/* rotate one head of hd values in place with a cache from tr_rope_cache */
void tr_rope_apply(float *x, const float *cs, const tr_rope_params *p);

/* g = silu(g) * u */
void tr_swiglu(float *g, const float *u, int64_t n);
/* g = gelu(g) * u with ggml's F16 table */
void tr_geglu(float *g, const float *u, int64_t n);
/* the tanh GELU as ggml evaluates it on CPU (F16 table lookup) */
float tr_gelu_table(float x);

/* false if any of x[0..n) is NaN or infinite: the forward pass's check of corrupt weights, once
 * per row and block (an integer pass over the exponent bits; the compiler vectorises it) */
bool tr_all_finite(const float *x, int64_t n);

#endif
