/*
 * A session: one timeline of tokens, its KV cache (src/kv, whatever the policy: the forward pass
 * hands each layer's K/V and queries to it and asks for the attention) and the scratch of a
 * forward pass.
 */
#ifndef TR_MODEL_SESSION_H
#define TR_MODEL_SESSION_H

#include "experts/cache.h"
#include "model/model.h"

typedef struct tr_scratch {
    int32_t rows;    /* capacity in rows (tokens computed together) */
    int32_t n_ctx_cap; /* the context of the session that owns the scratch */
    float *x;        /* [rows][n_embd] residual stream */
    float *xn;       /* [rows][n_embd] normed input of a block */
    float *q;        /* [rows][n_head * hd_k] */
    float *k;        /* [rows][n_head_kv * hd_k] */
    float *v;        /* [rows][n_head_kv * hd_v] */
    float *att;      /* [rows][n_head * hd_v] */
    float *o;        /* [rows][n_embd] */
    float *g, *u;    /* [rows][n_ff] */
    void *mm;        /* activation quantization scratch of tr_matmul */
    /* per row bookkeeping */
    struct tr_session **row_sess;
    int32_t *row_pos;
    int32_t *out_rows; /* rows whose logits a batch wants (tr_batch_eval) */
    /* The rows of a batch in groups, so that a row's products do not depend on the rows computed
     * with it: tr_matmul's gemm (from gemm_min_m rows on) sums a row in another order than the
     * per-row kernels, which sum it one way for every M. The rows of sessions with fewer tokens
     * than gemm_min_m (a decode row, a short chunk: alone they never reach the gemm) form groups
     * computed with the per-row kernels only; each longer chunk is a group of its own, computed
     * as its session alone computes it. Groups are runs of consecutive rows: group g ends at row
     * grp_end[g]. n_grp 0: the whole pass is one session's chunk, computed as tr_matmul chooses. */
    int32_t n_grp;
    int32_t *grp_end;
    int32_t *grp_rowwise; /* [g] 1: the per-row kernels only */
    float *rope_cs;  /* [rows][n_rot] cos/sin of the current layer's parameters */
    float *qs[2];    /* --kv-spec: [rows][n_head * hd_k] speculative queries of layers of each
                        parity (NULL without) */
    int32_t qs_layer; /* the layer whose speculative queries qs holds for this pass (-1: none) */
    /* mixture of experts (NULL for dense models) */
    float *moe_logits;   /* [rows][n_expert] router logits, then probabilities */
    int32_t *moe_sel;    /* [rows][k] selected experts */
    float *moe_w;        /* [rows][k] their weights */
    int32_t *moe_off;    /* [n_expert + 1] start of each expert's entries in moe_rows */
    int32_t *moe_fill;   /* [n_expert] */
    int32_t *moe_rows;   /* [rows * k] row * k + slot, grouped by expert */
    int32_t *moe_used;   /* [n_expert] experts used by this batch */
    float *moe_in;       /* [rows][n_embd] gathered inputs / expert outputs */
    float *moe_slot;     /* [rows][k][n_embd] weighted expert outputs per slot */
    struct tr_expert_request moe_req;
} tr_scratch;

struct tr_kv;

struct tr_session {
    tr_model *m;
    struct tr_kv *kv;
    int32_t n_ctx, n_batch, n_past;
    tr_scratch sc;
    tr_abort_fn abort_fn; /* asked before every chunk and batch step; NULL: never */
    void *abort_user;
    void *scratch_mem;
    uint64_t bytes; /* scratch, and the full policy's arrays */
    tr_kv_policy kv_policy; /* in effect (auto resolved) */
    char kv_note[768];      /* what auto chose and why ("" otherwise) */
    tr_mem_plan plan;       /* the memory plan it was created with */
};

/* KV + scratch bytes of a session with default parameters (for budgets computed at load) */
uint64_t tr_session_estimate_default(const tr_model *m);
/* the same for a context and batch (<= 0: the defaults) */
uint64_t tr_session_estimate_ctx(const tr_model *m, int32_t n_ctx, int32_t n_batch);

/* forward.c: y = W x for `rows` rows of x that all belong to group grp (-1: no groups) */
void tr_fwd_matmul_group(tr_model *m, tr_scratch *sc, const tr_mat *W, const float *x,
                         int32_t rows, float *y, int32_t grp);
/* the group of batch row r (-1 when the pass has no groups) */
int32_t tr_fwd_group_of(const tr_scratch *sc, int32_t r);
/* y = W x for the pass's rows 0..rows-1, group by group */
void tr_fwd_matmul(tr_model *m, tr_scratch *sc, const tr_mat *W, const float *x, int32_t rows,
                   float *y);

/* forward.c: compute `rows` rows (row r: token tokens[r] of sc->row_sess[r] at sc->row_pos[r]).
 * logits_rows: 0 = none, 1 = last row only, rows = every row; written to `logits`. With out_rows
 * (strictly ascending row indices, logits_rows of them) those rows' logits instead, packed. */
tr_status tr_forward(tr_model *m, tr_scratch *sc, int32_t rows, const int32_t *tokens,
                     float *logits, int32_t logits_rows, const int32_t *out_rows, tr_error *err);

#endif
