/*
 * Kernel families chosen once at start-up from CPU features. A table holds, per weight type, the
 * dot-product kernels and, per activation format, the quantizer; entries a family does not
 * accelerate fall back to the scalar reference. Tests compare every family with the reference.
 */
#ifndef TR_TENSOR_KERNELS_H
#define TR_TENSOR_KERNELS_H

#include "tensor/types.h"

#define TR_MAX_NC 4 /* activation columns one vec_dot_nc call handles */

/* s[j * s_stride] = dot(w, a + j * a_stride bytes) for j < nc (1 <= nc <= TR_MAX_NC): one weight
 * row against several activation rows, so the row is decoded once per group (prefill). */
typedef void (*tr_vec_dot_nc_fn)(int64_t n, int nc, float *restrict s, size_t s_stride,
                                 const void *restrict w, const void *restrict a, size_t a_stride);

/* s[r + j * s_stride] = dot(w + r * w_stride bytes, a + j * a_stride bytes) for r < 2 and
 * j < nc (1 <= nc <= TR_MAX_NC): two weight rows against several activation rows, for the int8
 * matrix-multiply instructions (Arm i8mm SMMLA: a 2x8 by 8x2 byte product) that need two rows on
 * each side. A row's sum then runs in another order than the one-row kernels', so, like the
 * gemm, tr_matmul uses it (for pairs of rows, nc >= 2) only from gemm_min_m activation rows on,
 * never on the per-row path whose rows keep the bits they get alone. */
typedef void (*tr_vec_dot_2r_fn)(int64_t n, int nc, float *restrict s, size_t s_stride,
                                 const void *restrict w, size_t w_stride, const void *restrict a,
                                 size_t a_stride);

/* Activation side table, for the weight types whose activations are Q8_0 or Q8_1: per activation
 * row of nb blocks, the nb block scales d as f32 and nb second values: for Q8_0 the sum of the
 * block's codes (exact as f32), for Q8_1 its stored s. tr_matmul builds it once per call
 * (act_side, per block range: blocks b0..b1-1 of the row whose first block is at aq), so the dot
 * products neither convert the same activation scales again for every weight row nor need the
 * sign trick for codes with an offset. A family's wide table (act_side_wide, act_side_wide_floats
 * · nb floats per row) starts the same way and holds more after that, of the family's own
 * layout (zmm_q32.h). */
typedef void (*tr_act_side_fn)(const void *restrict aq, int64_t nb, int64_t b0, int64_t b1,
                               float *restrict side);
/* vec_dot_nc taking the side table of each activation row (side + j * side_stride floats), for
 * up to TR_SIDE_MAX_NC rows: the decode rows of a batch */
#define TR_SIDE_MAX_NC 8
/* tr_matmul uses the wide tables for products of 2 to this many activation rows (the decode
 * rows of a step; a long prompt's tables would take MiBs of scratch per session), and for one
 * row only where the type has no vec_dot_side_rows */
#define TR_SIDE_WIDE_MAX_M 64
#define TR_SIDE_WIDE_FLOATS_MAX 36 /* the most floats per block of any family's wide table */
typedef void (*tr_vec_dot_side_fn)(int64_t n, int nc, float *restrict s, size_t s_stride,
                                   const void *restrict w, const void *restrict a, size_t a_stride,
                                   const float *restrict side, size_t side_stride);
/* vec_dot_side with one activation row (its side table at side) for `rows` weight rows w_stride
 * bytes apart: s[r] gets the bits vec_dot_side gives row r with nc = 1. A decode step makes one
 * call per tile of rows instead of one per row (the call and its set-up cost about a fifth of a
 * 640-element row's work). */
typedef void (*tr_vec_dot_side_rows_fn)(int64_t n, int64_t rows, float *restrict s,
                                        const void *restrict w, size_t w_stride,
                                        const void *restrict a, const float *restrict side);

/* out[i] = dot(rows + idx[i] * row_bytes, a) for i < n: one activation row (Q8_0) against n
 * weight rows picked by index, each n_el elements. The KV cache's scoring: one query head against
 * the low-precision copies of many keys, where a call per key costs more than the key. NULL in a
 * family: the generic loop over vec_dot (tr_dot_rows). */
typedef void (*tr_dot_rows_fn)(int64_t n_el, int64_t n, float *restrict out,
                               const void *restrict rows, size_t row_bytes,
                               const int32_t *restrict idx, const void *restrict a);

/* out[h * out_stride + e] += sum over i < n of w[h * w_stride + i] * row_{idx[i]}[e], for h < nw
 * and e < n_el: weighted sums of many Q4_0 / Q8_0 rows picked by index, nw weight vectors at
 * once (the rows are decoded once for all of them). The KV cache's estimate of what the
 * unselected tokens add to each query head's attention, from a low-precision copy of the values.
 * NULL in a family: tr_axpy_rows_ref. */
typedef void (*tr_axpy_rows_fn)(int64_t n_el, int64_t n, int nw, float *restrict out,
                                size_t out_stride, const float *restrict w, size_t w_stride,
                                const void *restrict rows, size_t row_bytes,
                                const int32_t *restrict idx);

/* out[d] += p * v[d] for d < n, v F16: one value row of an attention's weighted sum (the KV
 * cache's attention over gathered rows). A multiply, then an add, in float (no fused multiply-add),
 * so every family gives the reference's bits. NULL in a family: tr_axpy_f16_ref. */
typedef void (*tr_axpy_f16_fn)(int64_t n, float *restrict out, const uint16_t *restrict v, float p);

/* ------------------------------------------------------------ matrix-matrix products (prefill)
 * With many activation rows at once (a prompt), a family may compute a whole matrix product
 * with gemm[t]: it decodes a panel of weight rows at a time, on the fly, into a form its inner
 * loop takes directly (unsigned 8-bit codes with one float scale per sub-block, or f32 for the
 * float types), keeps the panel in cache while every activation row passes over it, and never
 * writes a second copy of the weights (the model stays as mapped from the GGUF).
 *
 * Activations come in a layout of their own, built once per product by tr_gemm_act_row from
 * the rows the reference quantizer made (so the values are exactly those vec_dot would see):
 *   quantized vec_dot types (Q8_0, Q8_1, Q8_K), per row of K elements:
 *     int8 codes[K] | float d[K / ab] | int32 corr[K / sub] | float mf[K / sub]
 *   with ab the activation block (32, or 256 for Q8_K), sub the weight type's sub-block
 *   (tr_gemm_traits), corr[s] = -off · Σ codes of sub-block s (the weight codes are stored
 *   value + off) and mf[s] the min term's multiplier: the block's stored s for Q8_1, d · Σ codes
 *   of the sub-block for Q8_K; parts a type does not use are zero;
 *   float vec_dot types (F32, F16, BF16): float x[K], the values rounded to the vec_dot type.
 * Rows are tr_gemm_act_bytes apart (a multiple of 64). */
typedef struct tr_gemm_traits {
    int sub;  /* elements per weight scale (16 or 32; 1 for the float types); 0: no gemm form */
    int off;  /* unsigned code = value + off */
    bool min; /* a min term per sub-block (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) */
} tr_gemm_traits;

const tr_gemm_traits *tr_gemm_traits_of(tr_type t);
/* byte offsets of d, corr and mf in a quantized activation row of the gemm layout */
typedef struct tr_gemm_act_parts {
    size_t d, corr, mf;
} tr_gemm_act_parts;
tr_gemm_act_parts tr_gemm_act_parts_of(tr_type t, int64_t K);
/* bytes of one activation row in the gemm layout for weights of type t (0: no gemm form) */
size_t tr_gemm_act_bytes(tr_type t, int64_t K);
/* one activation row in the gemm layout: from the row quantized to t's vec_dot_type (aq), or,
 * for the float types, from the f32 row x (aq unused) */
void tr_gemm_act_row(tr_type t, int64_t K, const float *x, const void *aq, void *out);

/* y[m * y_stride + r] = dot(weight row r, activation row m) for r < n_rows, m < M: weight rows
 * of type t row_bytes apart (any alignment), activation rows in the gemm layout act_stride
 * bytes apart. Each y[m] comes from activation row m alone, summed in one order whatever M and
 * m: a batch puts several sessions' chunks in one product (model/forward.c) */
typedef void (*tr_gemm_fn)(int64_t K, int64_t n_rows, int64_t M, float *restrict y,
                           size_t y_stride, const void *restrict w, size_t row_bytes,
                           const void *restrict act, size_t act_stride);

/* ------------------------------------------------------------ attention over F16 K/V
 * Softmax attention of up to TR_ATTN_MAX_Q query vectors (the query heads of one KV head, at
 * several positions) against one KV head's F16 keys and values, with llama.cpp's non-flash
 * roundings (what the parity references hold): each query rounded to F16, scores
 * q·k · scale in f32, exp(s - max) summed in double (a sink adds exp(sink - max) and takes part
 * in the max), probabilities e / sum rounded to F16, outputs Σ p·v in f32. A family's kernel
 * tiles it: each block of TR_ATTN_KB keys and values is converted to f32 once for all the
 * queries, and the scores of the tile stay in cache between the passes. 32 vectors (8 positions
 * of a GQA group of 4): at depth the block conversions and the reads of K and V (from L3 for a
 * long context) are paid once per call, so the more queries a call holds the fewer times;
 * the scores cost 32 × keys floats of scratch per thread (576 KiB at 4.6K keys). */
#define TR_ATTN_MAX_Q 32
#define TR_ATTN_KB 64

typedef struct tr_attn_q {
    const float *q; /* hd_k values */
    float *out;     /* hd_v values */
    int32_t lo, hi; /* the visible keys: positions lo..hi */
    float sink;     /* extra logit in the softmax's denominator; -INFINITY: none */
    /* optional (NULL: not wanted): the softmax's max and its denominator (in double), so that a
     * caller can merge calls over parts of the keys (online softmax) */
    float *max;
    double *sum;
} tr_attn_q;

typedef struct tr_attn_kv {
    const uint16_t *k; /* K(t, d) = k[t * k_pos + d] */
    size_t k_pos;
    const uint16_t *v; /* V(t, d) = v[t * v_pos + d * v_dim] (rows, or transposed) */
    size_t v_pos, v_dim;
    int32_t hd_k, hd_v;
    float scale;
} tr_attn_kv;

typedef void (*tr_attn_fn)(int n_q, const tr_attn_q *q, const tr_attn_kv *kv, float *scratch);
/* floats of scratch one call needs when no query sees more than n_keys keys (64-byte aligned) */
size_t tr_attn_scratch_floats(int32_t n_keys, int32_t hd_k, int32_t hd_v);
/* the scalar reference, one query at a time */
void tr_attn_f16_ref(int n_q, const tr_attn_q *q, const tr_attn_kv *kv, float *scratch);

typedef struct tr_kernels {
    const char *isa; /* "scalar", "avx2", "avx512", "neon", "dotprod", "i8mm" */
    tr_vec_dot_fn vec_dot[TR_TYPE_COUNT];
    tr_vec_dot_nc_fn vec_dot_nc[TR_TYPE_COUNT];
    tr_from_float_fn from_float[TR_TYPE_COUNT]; /* activation formats only */
    /* optional (NULL: unused); a family that sets vec_dot_side[t] sets act_side[vec_dot_type] */
    tr_vec_dot_side_fn vec_dot_side[TR_TYPE_COUNT];
    tr_vec_dot_side_rows_fn vec_dot_side_rows[TR_TYPE_COUNT]; /* optional: with vec_dot_side[t] */
    tr_act_side_fn act_side[TR_TYPE_COUNT]; /* activation formats Q8_0, Q8_1 */
    /* optional: vec_dot_side over wide tables, the same bits as vec_dot_side; a family that sets
     * vec_dot_side_wide[t] sets act_side_wide[vec_dot_type] */
    tr_vec_dot_side_fn vec_dot_side_wide[TR_TYPE_COUNT];
    tr_act_side_fn act_side_wide[TR_TYPE_COUNT];
    int act_side_wide_floats; /* floats per activation block of a wide table */
    tr_dot_rows_fn dot_rows[TR_TYPE_COUNT];  /* optional: Q4_0, Q8_0 weight rows */
    tr_axpy_rows_fn axpy_rows[TR_TYPE_COUNT]; /* optional: Q4_0, Q8_0 rows */
    tr_axpy_f16_fn axpy_f16;                  /* optional */
    /* optional (NULL: vec_dot_nc per row); used from gemm_min_m activation rows on, split
     * between threads in units of gemm_rows weight rows; gemm_min_m is also where vec_dot_2r
     * starts (0: never) */
    tr_gemm_fn gemm[TR_TYPE_COUNT];
    int gemm_rows, gemm_min_m;
    tr_attn_fn attn_f16; /* optional (NULL: tr_attn_f16_ref) */
    /* optional element-wise ops of the forward pass (NULL: the tr_*_ref below): y = x / sqrt(mean(x²) + eps) · w (w may be NULL);
     * g = silu(g) · u; g = gelu(g) · u with GELU from an F16 table (65536 entries + padding) */
    void (*rmsnorm)(float *y, const float *x, const float *w, int64_t n, float eps);
    void (*swiglu)(float *g, const float *u, int64_t n);
    void (*geglu)(float *g, const float *u, int64_t n, const uint16_t *table);
    tr_vec_dot_2r_fn vec_dot_2r[TR_TYPE_COUNT]; /* optional: two weight rows at once */
    /* optional (NULL: tr_f16_round_ref): y = x rounded to F16 and back, the F16 gemm's
     * activation layout (tr_gemm_act_row) */
    void (*f16_round)(float *y, const float *x, int64_t n);
    /* optional: the most columns vec_dot_nc[t] takes (0: TR_MAX_NC; at most TR_SIDE_MAX_NC),
     * each column with the bits it gets alone */
    int nc_max[TR_TYPE_COUNT];
} tr_kernels;

/* k->dot_rows[t] where the family has one, else a loop over k->vec_dot[t] */
void tr_dot_rows(const tr_kernels *k, tr_type t, int64_t n_el, int64_t n, float *restrict out,
                 const void *restrict rows, size_t row_bytes, const int32_t *restrict idx,
                 const void *restrict a);

/* the scalar reference of axpy_rows (Q4_0 and Q8_0 rows; n_el a multiple of 32) */
void tr_axpy_rows_ref(tr_type t, int64_t n_el, int64_t n, int nw, float *restrict out,
                      size_t out_stride, const float *restrict w, size_t w_stride,
                      const void *restrict rows, size_t row_bytes, const int32_t *restrict idx);
/* k->axpy_rows[t] where the family has one, else the reference */
void tr_axpy_rows(const tr_kernels *k, tr_type t, int64_t n_el, int64_t n, int nw,
                  float *restrict out, size_t out_stride, const float *restrict w, size_t w_stride,
                  const void *restrict rows, size_t row_bytes, const int32_t *restrict idx);

/* the scalar reference of axpy_f16, and k->axpy_f16 where the family has one */
void tr_axpy_f16_ref(int64_t n, float *restrict out, const uint16_t *restrict v, float p);
tr_axpy_f16_fn tr_axpy_f16_of(const tr_kernels *k);

/* the element-wise kernels' scalar references (src/tensor/ew.c) */
void tr_rmsnorm_ref(float *y, const float *x, const float *w, int64_t n, float eps);
void tr_swiglu_ref(float *g, const float *u, int64_t n);
void tr_geglu_ref(float *g, const float *u, int64_t n, const uint16_t *table);
/* GELU of x from the table, as tr_geglu_ref applies it */
float tr_gelu_lookup(float x, const uint16_t *table);

/* y[i] = tr_f16_to_f32(tr_f32_to_f16(x[i])) (every NaN: the reference's quiet NaN) */
void tr_f16_round_ref(float *y, const float *x, int64_t n);
/* tr_gemm_act_row with the family's kernels where they make it faster (k->f16_round): the same
 * bytes */
void tr_gemm_act_row_k(const tr_kernels *k, tr_type t, int64_t K, const float *x, const void *aq,
                       void *out);

/* k->attn_f16 where the family has one, else the reference */
tr_attn_fn tr_attn_f16_of(const tr_kernels *k);

/* the best family this CPU runs (lowered by TERRACE_ISA); initialised once, thread-safe */
const tr_kernels *tr_kernels_best(void);
/* a given family, or NULL if this build or CPU cannot run it ("scalar" always exists) */
const tr_kernels *tr_kernels_by_name(const char *isa);

/* per-ISA fillers (src/tensor/x86/..., src/tensor/arm/...): override the entries they accelerate */
void tr_kernels_fill_avx2(tr_kernels *k);
void tr_kernels_fill_avx512(tr_kernels *k);
void tr_kernels_fill_neon(tr_kernels *k);
void tr_kernels_fill_dotprod(tr_kernels *k);
void tr_kernels_fill_i8mm(tr_kernels *k);

/* generic nc-column dot built from a single-column dot (used where no fused kernel exists) */
void tr_vec_dot_nc_generic(tr_vec_dot_fn dot, int64_t n, int nc, float *restrict s, size_t s_stride,
                           const void *restrict w, const void *restrict a, size_t a_stride);

#endif
