/*
 * Matrix products over weight matrices of any supported type, parallel over rows on the thread
 * pool. Activations are first converted to the weight type's vec_dot_type as llama.cpp does
 * (GGUF-FACTS §2.4); the caller provides the scratch for that (sized by tr_matmul_scratch_size),
 * so nothing is allocated per call.
 */
#ifndef TR_TENSOR_MATMUL_H
#define TR_TENSOR_MATMUL_H

#include "core/pool.h"
#include "tensor/kernels.h"

typedef struct tr_mat {
    tr_type type;
    int64_t n_in;      /* elements per row (K) */
    int64_t n_out;     /* rows (N) */
    const void *data;  /* n_out rows of row_bytes */
    size_t row_bytes;
} tr_mat;

/* bytes of scratch tr_matmul needs for M activation rows of K elements against type t */
size_t tr_matmul_scratch_size(tr_type t, int64_t K, int64_t M);

/* Whether M activation rows take the per-row kernels with this family whatever the weight type
 * (fewer than gemm_min_m rows, or a family without a gemm): per row, each row sums in one order
 * for every M, so its result does not depend on the rows computed with it. tr_matmul's gate, the
 * batch's groups (session.h) and the fused per-row products of a step (forward.c) all ask this. */
static inline bool tr_matmul_per_row(const tr_kernels *kern, int64_t M) {
    return kern->gemm_min_m <= 0 || M < kern->gemm_min_m;
}

/* y[m * N + r] = sum_k W[r][k] * x[m * K + k] for m < M, r < N. `kern` NULL = best family. */
void tr_matmul(tr_pool *pool, const tr_kernels *kern, const tr_mat *W, const float *x, int64_t M,
               float *y, void *scratch);
/* The same with the per-row kernels whatever M: they sum each row in one order for every M, so a
 * row's result does not depend on the rows computed with it (tr_matmul's gemm, from gemm_min_m
 * rows on, sums in another order). */
void tr_matmul_rowwise(tr_pool *pool, const tr_kernels *kern, const tr_mat *W, const float *x,
                       int64_t M, float *y, void *scratch);
/* y[i] = W[i] x by tr_matmul_rowwise for i < n (n <= TR_MATMUL_MULTI_MAX), as one product where
 * the matrices have one type and n_in (q, k, v; gate, up): the activations are quantized once and
 * the rows of all of them are shared out in one pool run, so the threads meet once instead of
 * once per matrix. Each row's result is the one tr_matmul_rowwise gives. */
#define TR_MATMUL_MULTI_MAX 4
void tr_matmul_rows_multi(tr_pool *pool, const tr_kernels *kern, int n, const tr_mat *const *W,
                          const float *x, int64_t M, float *const *y, void *scratch);

#endif
