/*
 * The kernels' part of the test and benchmark seam (include/terrace_seam.h): what bench_kernels
 * drives, through the same calls the forward pass makes.
 */
#include "terrace_seam.h"

#include <string.h>

#include "core/pool.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/matmul.h"

const tr_kernels *tr_seam_kernels(const char *isa) {
    return isa ? tr_kernels_by_name(isa) : tr_kernels_best();
}

const char *tr_seam_kernels_isa(const tr_kernels *k) { return k->isa; }

size_t tr_seam_matvec_scratch(tr_type t, int64_t n_in) { return tr_matmul_scratch_size(t, n_in, 1); }

void tr_seam_matvec(tr_pool *pool, const tr_kernels *k, tr_type t, const void *w, size_t row_bytes,
                    int64_t n_in, int64_t n_out, const float *x, float *y, void *scratch) {
    const tr_mat mat = {.type = t, .n_in = n_in, .n_out = n_out, .data = w, .row_bytes = row_bytes};
    tr_matmul(pool, k, &mat, x, 1, y, scratch);
}

size_t tr_seam_matmul_scratch(tr_type t, int64_t n_in, int64_t M) {
    return tr_matmul_scratch_size(t, n_in, M);
}

void tr_seam_matmul(tr_pool *pool, const tr_kernels *k, bool gemm, tr_type t, const void *w,
                    size_t row_bytes, int64_t n_in, int64_t n_out, const float *x, int64_t M,
                    float *y, void *scratch) {
    const tr_mat mat = {.type = t, .n_in = n_in, .n_out = n_out, .data = w, .row_bytes = row_bytes};
    if (gemm) {
        tr_matmul(pool, k, &mat, x, M, y, scratch);
        return;
    }
    tr_kernels rowk = *k; /* the same family without its gemm: the per-row path */
    memset(rowk.gemm, 0, sizeof rowk.gemm);
    tr_matmul(pool, &rowk, &mat, x, M, y, scratch);
}

void tr_seam_pool_run(tr_pool *pool, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    tr_pool_run(pool, fn, ctx);
}

uint16_t tr_seam_f32_to_f16(float x) { return tr_f32_to_f16(x); }
uint16_t tr_seam_f32_to_bf16(float x) { return tr_f32_to_bf16(x); }
