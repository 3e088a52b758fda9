/*
 * Per-type traits (ggml's pattern): block geometry, the activation format a dot product expects,
 * and the scalar reference kernels. Fast kernels live in kernels.h and are chosen at start-up.
 */
#ifndef TR_TENSOR_TYPES_H
#define TR_TENSOR_TYPES_H

#include "terrace.h"
#include "tensor/blocks.h"

/* y[0..n) = dequant(x); n a multiple of the block size */
typedef void (*tr_to_float_fn)(const void *restrict x, float *restrict y, int64_t n);
/* quantize/convert n floats into the activation format */
typedef void (*tr_from_float_fn)(const float *restrict x, void *restrict y, int64_t n);
/* *s = dot(w[0..n), a[0..n)) where w is a weight row and a an activation row in vec_dot_type */
typedef void (*tr_vec_dot_fn)(int64_t n, float *restrict s, const void *restrict w,
                              const void *restrict a);

typedef struct tr_type_traits {
    const char *name;
    int64_t blck;          /* elements per block; 0 = unknown id */
    size_t bytes;          /* bytes per block */
    tr_type vec_dot_type;  /* activation format the dot product takes */
    tr_to_float_fn to_float;         /* NULL: cannot be dequantized by terrace */
    tr_from_float_fn from_float_ref; /* set for the activation formats */
    tr_vec_dot_fn vec_dot_ref;       /* scalar reference dot */
} tr_type_traits;

const tr_type_traits *tr_traits(tr_type t); /* never NULL; blck == 0 for unknown ids */

/* scalar reference kernels (src/tensor/dequant.c, quantize.c, vecdot_ref.c) */
void tr_dequant_f32(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_f16(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_bf16(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q4_0(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q4_1(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q5_0(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q5_1(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q8_0(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q8_1(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q2_k(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q3_k(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q4_k(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q5_k(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q6_k(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_q8_k(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_iq4_nl(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_iq4_xs(const void *restrict x, float *restrict y, int64_t n);
void tr_dequant_mxfp4(const void *restrict x, float *restrict y, int64_t n);

void tr_quant_f32(const float *restrict x, void *restrict y, int64_t n);
void tr_quant_f16(const float *restrict x, void *restrict y, int64_t n);
void tr_quant_bf16(const float *restrict x, void *restrict y, int64_t n);
void tr_quant_q8_0(const float *restrict x, void *restrict y, int64_t n);
void tr_quant_q8_1(const float *restrict x, void *restrict y, int64_t n);
void tr_quant_q8_k(const float *restrict x, void *restrict y, int64_t n);

void tr_vec_dot_f32_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_f16_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_bf16_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q4_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q4_1_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q5_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q5_1_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q8_0_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q2_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q3_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q4_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q5_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_q6_k_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_iq4_nl_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_iq4_xs_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);
void tr_vec_dot_mxfp4_ref(int64_t n, float *restrict s, const void *restrict w, const void *restrict a);

/* Q4_K/Q5_K 6-bit scale and min j of a 12-byte packed scale array (GGUF-FACTS §2.3.1) */
static inline void tr_get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *mn = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif
