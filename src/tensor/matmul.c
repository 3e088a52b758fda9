#include "tensor/matmul.h"

size_t tr_matmul_scratch_size(tr_type t, int64_t K, int64_t M) {
    const tr_type vt = tr_traits(t)->vec_dot_type;
    return tr_type_row_bytes(vt, K) * (size_t)M + 64;
}

typedef struct mm_job {
    const tr_kernels *k;
    const tr_mat *W;
    const float *x;
    int64_t M;
    float *y;
    char *xq;         /* quantized activations, M rows of xq_row bytes */
    size_t xq_row;
    tr_type vt;
    atomic_int_fast64_t next; /* dynamic row chunks: VM cores run at uneven speeds */
    int64_t chunk;
} mm_job;

static void quantize_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    const int64_t K = j->W->n_in;
    const tr_from_float_fn q = j->k->from_float[j->vt];
    if (j->M >= nth) {
        int64_t b, e;
        tr_split_range(j->M, ith, nth, &b, &e);
        for (int64_t m = b; m < e; m++) q(j->x + m * K, j->xq + (size_t)m * j->xq_row, K);
    } else {
        /* few rows: split each row by blocks so every thread has a share */
        const int64_t blck = tr_traits(j->vt)->blck;
        const size_t bb = tr_traits(j->vt)->bytes;
        const int64_t nb = K / blck;
        int64_t b, e;
        tr_split_range(nb, ith, nth, &b, &e);
        for (int64_t m = 0; m < j->M; m++)
            if (e > b)
                q(j->x + m * K + b * blck, j->xq + (size_t)m * j->xq_row + (size_t)b * bb,
                  (e - b) * blck);
    }
}

static void dot_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    mm_job *j = ctx;
    const tr_mat *W = j->W;
    const int64_t N = W->n_out, K = W->n_in;
    const tr_vec_dot_fn dot = j->k->vec_dot[W->type];
    const tr_vec_dot_nc_fn dot_nc = j->k->vec_dot_nc[W->type];
    int64_t b, e;
    while (tr_claim(&j->next, N, j->chunk, &b, &e)) {
        for (int64_t r = b; r < e; r++) {
            const char *row = (const char *)W->data + (size_t)r * W->row_bytes;
            int64_t m = 0;
            if (dot_nc) {
                for (; m + TR_MAX_NC <= j->M; m += TR_MAX_NC)
                    dot_nc(K, TR_MAX_NC, j->y + m * N + r, (size_t)N, row,
                           j->xq + (size_t)m * j->xq_row, j->xq_row);
                if (m < j->M)
                    dot_nc(K, (int)(j->M - m), j->y + m * N + r, (size_t)N, row,
                           j->xq + (size_t)m * j->xq_row, j->xq_row);
            } else {
                for (; m < j->M; m++)
                    dot(K, j->y + m * N + r, row, j->xq + (size_t)m * j->xq_row);
            }
        }
    }
}

void tr_matmul(tr_pool *pool, const tr_kernels *kern, const tr_mat *W, const float *x, int64_t M,
               float *y, void *scratch) {
    mm_job j = {
        .k = kern ? kern : tr_kernels_best(),
        .W = W,
        .x = x,
        .M = M,
        .y = y,
        .xq = scratch,
        .vt = tr_traits(W->type)->vec_dot_type,
    };
    j.xq_row = tr_type_row_bytes(j.vt, W->n_in);
    atomic_init(&j.next, 0);
    const int nth = pool ? tr_pool_size(pool) : 1;
    /* ~8 chunks per thread balances uneven cores without contending on the counter */
    j.chunk = W->n_out / (nth * 8);
    if (j.chunk < 1) j.chunk = 1;
    if (j.vt == TR_TYPE_F32) {
        j.xq = (char *)x; /* F32 weights take F32 activations as they are */
    } else if (pool) {
        tr_pool_run(pool, quantize_task, &j);
    } else {
        quantize_task(&j, 0, 1);
    }
    if (pool) tr_pool_run(pool, dot_task, &j);
    else dot_task(&j, 0, 1);
}
