#include "tensor/matmul.h"

/* floats of activation side table per row (kernels.h, tr_act_side_fn) with per_block floats per
 * block: 2, or a family's wide tables */
static size_t side_floats(tr_type vt, int64_t K, int per_block) {
    return vt == TR_TYPE_Q8_0 || vt == TR_TYPE_Q8_1 ? (size_t)per_block * (size_t)(K / TR_QK32)
                                                    : 0;
}

/* quantized rows, then (64-byte aligned) the side tables */
static size_t xq_bytes(tr_type vt, int64_t K, int64_t M) {
    return (tr_type_row_bytes(vt, K) * (size_t)M + 63) & ~(size_t)63;
}

/* the larger of the two layouts that follow the quantized rows: side tables, or the gemm
 * activation rows (kernels.h) */
static size_t after_xq_bytes(tr_type t, int64_t K, int64_t M) {
    const tr_type vt = tr_traits(t)->vec_dot_type;
    const int64_t wide_m = M < TR_SIDE_WIDE_MAX_M ? M : TR_SIDE_WIDE_MAX_M;
    const size_t narrow = side_floats(vt, K, 2) * sizeof(float) * (size_t)M;
    const size_t wide =
        side_floats(vt, K, TR_SIDE_WIDE_FLOATS_MAX) * sizeof(float) * (size_t)wide_m;
    const size_t side = narrow > wide ? narrow : wide;
    const size_t gemm = tr_gemm_act_bytes(t, K) * (size_t)M;
    return side > gemm ? side : gemm;
}

size_t tr_matmul_scratch_size(tr_type t, int64_t K, int64_t M) {
    const tr_type vt = tr_traits(t)->vec_dot_type;
    return xq_bytes(vt, K, M) + after_xq_bytes(t, K, M) + 64;
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
    float *side; /* activation side tables, M rows of side_row floats; NULL: not used */
    size_t side_row;
    tr_act_side_fn act_side; /* the family's narrow or wide tables and their kernel */
    tr_vec_dot_side_fn dot_side;
    bool two_row; /* the family's two-row kernels may take pairs of rows (kernels.h, vec_dot_2r) */
    atomic_int_fast64_t next; /* dynamic row chunks: VM cores run at uneven speeds */
    int64_t chunk;
    char *ga; /* gemm activation rows, ga_row bytes apart; NULL: the vec_dot path */
    size_t ga_row;
    /* the per-row path over several matrices with the same input (tr_matmul_rows_multi): rows
     * [first[i], first[i + 1]) of the claimed range are the rows of Ws[i], written to ys[i] */
    int n_mat;
    const tr_mat *Ws[TR_MATMUL_MULTI_MAX];
    float *ys[TR_MATMUL_MULTI_MAX];
    int64_t first[TR_MATMUL_MULTI_MAX + 1];
} mm_job;

static void quantize_task(void *ctx, int ith, int nth) {
    mm_job *j = ctx;
    const int64_t K = j->W->n_in;
    const tr_from_float_fn q = j->k->from_float[j->vt];
    if (j->ga) { /* gemm: the quantized row, then its gemm layout (float types: from x) */
        int64_t b, e;
        tr_split_range(j->M, ith, nth, &b, &e);
        const bool flt = tr_gemm_traits_of(j->W->type)->sub == 1;
        for (int64_t m = b; m < e; m++) {
            char *aq = j->xq + (size_t)m * j->xq_row;
            if (!flt) q(j->x + m * K, aq, K);
            tr_gemm_act_row_k(j->k, j->W->type, K, j->x + m * K, aq, j->ga + (size_t)m * j->ga_row);
        }
        return;
    }
    if (j->M >= nth) {
        int64_t b, e;
        tr_split_range(j->M, ith, nth, &b, &e);
        for (int64_t m = b; m < e; m++) {
            q(j->x + m * K, j->xq + (size_t)m * j->xq_row, K);
            if (j->side)
                j->act_side(j->xq + (size_t)m * j->xq_row, K / TR_QK32, 0, K / TR_QK32,
                                      j->side + (size_t)m * j->side_row);
        }
    } else {
        /* few rows: split each row by blocks so every thread has a share */
        const int64_t blck = tr_traits(j->vt)->blck;
        const size_t bb = tr_traits(j->vt)->bytes;
        const int64_t nb = K / blck;
        int64_t b, e;
        tr_split_range(nb, ith, nth, &b, &e);
        for (int64_t m = 0; m < j->M; m++) {
            if (e <= b) continue;
            char *row = j->xq + (size_t)m * j->xq_row;
            q(j->x + m * K + b * blck, row + (size_t)b * bb, (e - b) * blck);
            if (j->side) /* side blocks are activation blocks (32 elements) */
                j->act_side(row, nb, b, e, j->side + (size_t)m * j->side_row);
        }
    }
}

/* Rows per tile for several activation rows: the tile's weight rows (a few KiB each) stay in L1/L2
 * while every group of TR_MAX_NC activation rows passes over them, and each activation group is
 * read from L1 for all rows of the tile, instead of each weight row sweeping all M activation
 * rows (MiBs for a long prompt, out of L2). */
#define MM_TILE_ROWS 16

/* Guided claiming for the row products: each claim takes 1 / (2·nth) of the rows not yet claimed
 * (at least j->chunk, a multiple of MM_TILE_ROWS), so the first claims are large (few atomic
 * operations on the shared counter) and the last ones small: the thread that finishes first
 * waits at most one small chunk for the other, instead of up to an eighth of a thread's share
 * with fixed chunks. A decode step runs seven such products per layer, each ending in that wait.
 * Which rows a thread computes changes nothing in any row's result. */
static bool claim_rows(mm_job *j, int64_t n, int nth, int64_t *begin, int64_t *end) {
    int_fast64_t cur = atomic_load_explicit(&j->next, memory_order_relaxed);
    for (;;) {
        if (cur >= n) return false;
        int64_t c = (n - cur) / (2 * (int64_t)nth);
        c = (c + MM_TILE_ROWS - 1) / MM_TILE_ROWS * MM_TILE_ROWS;
        if (c < j->chunk) c = j->chunk;
        if (atomic_compare_exchange_weak_explicit(&j->next, &cur, cur + c, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *begin = cur;
            *end = cur + c < n ? cur + c : n;
            return true;
        }
    }
}

/* rows [b, e) of W into y (M rows of W->n_out) */
static void dot_rows(const mm_job *j, const tr_mat *W, float *y, int64_t b, int64_t e) {
    const int64_t N = W->n_out, K = W->n_in;
    const tr_vec_dot_fn dot = j->k->vec_dot[W->type];
    const tr_vec_dot_nc_fn dot_nc = j->k->vec_dot_nc[W->type];
    const tr_vec_dot_side_fn dot_side = j->side ? j->dot_side : NULL;
    const tr_vec_dot_2r_fn dot_2r = j->two_row ? j->k->vec_dot_2r[W->type] : NULL;
    /* one call per tile for one activation row, where it is the kernel dot_side is */
    const tr_vec_dot_side_rows_fn side_rows =
        dot_side && dot_side == j->k->vec_dot_side[W->type] ? j->k->vec_dot_side_rows[W->type]
                                                            : NULL;
    for (int64_t r0 = b; r0 < e; r0 += MM_TILE_ROWS) {
        const int64_t r1 = r0 + MM_TILE_ROWS < e ? r0 + MM_TILE_ROWS : e;
        const int max_nc = dot_side                   ? TR_SIDE_MAX_NC
                           : j->k->nc_max[W->type] > 0 ? j->k->nc_max[W->type]
                                                       : TR_MAX_NC;
        /* the fewest column groups of at most max_nc, of even sizes (9 rows: 4 + 5): a group of
         * one column would pay a weight row's decode for itself. Each column's bits do not
         * depend on its group (kernels.h). */
        const int64_t n_grp = (j->M + max_nc - 1) / max_nc;
        for (int64_t gi = 0; gi < n_grp; gi++) {
            const int64_t m = gi * j->M / n_grp;
            const int nc = (int)((gi + 1) * j->M / n_grp - m);
            const char *xq = j->xq + (size_t)m * j->xq_row;
            int64_t r = r0;
            /* two rows at once where the family multiplies 2x2 row blocks (one activation
             * row would waste half of that) */
            if (dot_2r && nc >= 2)
                for (; r + 2 <= r1; r += 2)
                    dot_2r(K, nc, y + m * N + r, (size_t)N,
                           (const char *)W->data + (size_t)r * W->row_bytes, W->row_bytes, xq,
                           j->xq_row);
            if (side_rows && nc == 1) {
                side_rows(K, r1 - r, y + m * N + r, (const char *)W->data + (size_t)r * W->row_bytes,
                          W->row_bytes, xq, j->side + (size_t)m * j->side_row);
                r = r1;
            }
            for (; r < r1; r++) {
                const char *row = (const char *)W->data + (size_t)r * W->row_bytes;
                if (dot_side) {
                    dot_side(K, nc, y + m * N + r, (size_t)N, row, xq, j->xq_row,
                             j->side + (size_t)m * j->side_row, j->side_row);
                } else if (dot_nc) {
                    dot_nc(K, nc, y + m * N + r, (size_t)N, row, xq, j->xq_row);
                } else {
                    for (int c = 0; c < nc; c++)
                        dot(K, y + (m + c) * N + r, row, xq + (size_t)c * j->xq_row);
                }
            }
        }
    }
}

static void dot_task(void *ctx, int ith, int nth) {
    (void)ith;
    mm_job *j = ctx;
    int64_t b, e;
    if (j->n_mat == 0) {
        while (claim_rows(j, j->W->n_out, nth, &b, &e)) dot_rows(j, j->W, j->y, b, e);
        return;
    }
    while (claim_rows(j, j->first[j->n_mat], nth, &b, &e))
        for (int i = 0; i < j->n_mat; i++) {
            const int64_t lo = b > j->first[i] ? b : j->first[i];
            const int64_t hi = e < j->first[i + 1] ? e : j->first[i + 1];
            if (lo < hi) dot_rows(j, j->Ws[i], j->ys[i], lo - j->first[i], hi - j->first[i]);
        }
}

/* gemm: row chunks of gemm_rows (a panel multiple), claimed as they free up */
static void gemm_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    mm_job *j = ctx;
    const tr_mat *W = j->W;
    const tr_gemm_fn g = j->k->gemm[W->type];
    int64_t b, e;
    while (tr_claim(&j->next, W->n_out, j->chunk, &b, &e))
        g(W->n_in, e - b, j->M, j->y + b, (size_t)W->n_out,
          (const char *)W->data + (size_t)b * W->row_bytes, W->row_bytes, j->ga, j->ga_row);
}

/* n_mat 0: y = W x; else the rows of Ws[0..n_mat) one after the other (per-row kernels only;
 * W is Ws[0], whose type and n_in they all have) */
static void matmul(tr_pool *pool, const tr_kernels *kern, const tr_mat *W, const float *x,
                   int64_t M, float *y, void *scratch, bool gemm, int n_mat,
                   const tr_mat *const *Ws, float *const *ys) {
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
    const int nth = pool ? tr_pool_size(pool) : 1;
    int64_t n_rows = W->n_out;
    if (n_mat > 0) {
        gemm = false;
        j.n_mat = n_mat;
        j.first[0] = 0;
        for (int i = 0; i < n_mat; i++) {
            j.Ws[i] = Ws[i];
            j.ys[i] = ys[i];
            j.first[i + 1] = j.first[i] + Ws[i]->n_out;
        }
        n_rows = j.first[n_mat];
    }
    /* the two-row kernels sum a row in another order than one row alone: like the gemm, they
     * take only products that need not keep each row's bits (tr_matmul_per_row) */
    j.two_row = gemm && !tr_matmul_per_row(j.k, M);
    if (gemm && j.k->gemm[W->type] && !tr_matmul_per_row(j.k, M)) {
        /* the gemm rows follow the quantized rows (the 64 spare bytes cover the alignment) */
        const uintptr_t at = (uintptr_t)scratch + xq_bytes(j.vt, W->n_in, M);
        j.ga = (char *)((at + 63) & ~(uintptr_t)63);
        j.ga_row = tr_gemm_act_bytes(W->type, W->n_in);
        atomic_init(&j.next, 0);
        /* chunks of panels: a few per thread, so uneven cores still finish together */
        const int64_t unit = j.k->gemm_rows;
        const int64_t units = (W->n_out + unit - 1) / unit;
        int64_t per = units / ((int64_t)nth * 4);
        if (per < 1) per = 1;
        j.chunk = per * unit;
        if (pool) {
            tr_pool_run(pool, quantize_task, &j);
            tr_pool_run(pool, gemm_task, &j);
        } else {
            quantize_task(&j, 0, 1);
            gemm_task(&j, 0, 1);
        }
        return;
    }
    if (j.k->vec_dot_side[W->type] && j.k->act_side[j.vt] && side_floats(j.vt, W->n_in, 2)) {
        /* the 64 spare bytes of the scratch size cover this alignment */
        const uintptr_t at = (uintptr_t)scratch + xq_bytes(j.vt, W->n_in, M);
        j.side = (float *)((at + 63) & ~(uintptr_t)63);
        /* the wide tables for a few rows (the same bits; kernels.h), but not for one row where
         * the narrow kernel has a rows entry: one call per tile of rows beats one wide-kernel
         * call per row (SmolLM2 Q4_1 decode on an AVX-512 Zen 4, both ways in one binary, two
         * rounds: 180, 177 -> 235, 202 tokens/s) */
        const bool wide = M <= TR_SIDE_WIDE_MAX_M && j.k->vec_dot_side_wide[W->type] &&
                          j.k->act_side_wide[j.vt] && (M > 1 || !j.k->vec_dot_side_rows[W->type]);
        j.side_row = side_floats(j.vt, W->n_in, wide ? j.k->act_side_wide_floats : 2);
        j.act_side = wide ? j.k->act_side_wide[j.vt] : j.k->act_side[j.vt];
        j.dot_side = wide ? j.k->vec_dot_side_wide[W->type] : j.k->vec_dot_side[W->type];
    }
    atomic_init(&j.next, 0);
    /* the smallest claim (claim_rows): one tile of rows, or fewer for a matrix with few rows per
     * thread */
    j.chunk = n_rows / (nth * 8);
    if (j.chunk > MM_TILE_ROWS) j.chunk = MM_TILE_ROWS;
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

void tr_matmul(tr_pool *pool, const tr_kernels *kern, const tr_mat *W, const float *x, int64_t M,
               float *y, void *scratch) {
    matmul(pool, kern, W, x, M, y, scratch, true, 0, NULL, NULL);
}

void tr_matmul_rowwise(tr_pool *pool, const tr_kernels *kern, const tr_mat *W, const float *x,
                       int64_t M, float *y, void *scratch) {
    matmul(pool, kern, W, x, M, y, scratch, false, 0, NULL, NULL);
}

void tr_matmul_rows_multi(tr_pool *pool, const tr_kernels *kern, int n, const tr_mat *const *W,
                          const float *x, int64_t M, float *const *y, void *scratch) {
    bool same = n >= 1 && n <= TR_MATMUL_MULTI_MAX;
    for (int i = 1; same && i < n; i++)
        same = W[i]->type == W[0]->type && W[i]->n_in == W[0]->n_in;
    if (!same || n == 1) {
        for (int i = 0; i < n; i++)
            matmul(pool, kern, W[i], x, M, y[i], scratch, false, 0, NULL, NULL);
        return;
    }
    matmul(pool, kern, W[0], x, M, NULL, scratch, false, n, W, y);
}
