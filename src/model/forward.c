/*
 * The forward pass shared by every architecture: a batch of rows (tokens; of one session during
 * prefill, of several during batched decode) goes through the layers together, so every weight
 * matrix is read once per batch (matrix-matrix products); attention runs per row against that
 * row's own session KV cache: the forward pass hands each layer's K/V and queries to it and asks
 * for the attention. Nothing is allocated here: all buffers come from the scratch the session
 * sized at creation.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv.h"
#include "model/moe.h"
#include "model/ops.h"
#include "model/session.h"
#include "tensor/fp16.h"

static void add_bias(float *y, const float *b, int32_t rows, int64_t n, int64_t stride) {
    if (!b) return;
    for (int32_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) y[(size_t)r * stride + i] += b[i];
}

void tr_fwd_matmul_group(tr_model *m, tr_scratch *sc, const tr_mat *W, const float *x,
                         int32_t rows, float *y, int32_t grp) {
    if (grp >= 0 && sc->grp_rowwise[grp]) tr_matmul_rowwise(m->pool, m->kern, W, x, rows, y, sc->mm);
    else tr_matmul(m->pool, m->kern, W, x, rows, y, sc->mm);
}

int32_t tr_fwd_group_of(const tr_scratch *sc, int32_t r) {
    if (sc->n_grp == 0) return -1;
    int32_t g = 0;
    while (g + 1 < sc->n_grp && r >= sc->grp_end[g]) g++;
    return g;
}

void tr_fwd_matmul(tr_model *m, tr_scratch *sc, const tr_mat *W, const float *x, int32_t rows,
                   float *y) {
    if (sc->n_grp == 0) {
        tr_matmul(m->pool, m->kern, W, x, rows, y, sc->mm);
        return;
    }
    /* consecutive gemm groups (chunks of several sessions) are one product: the gemm sums each
     * row in one order whatever the rows beside it (kernels.h, tr_gemm_fn), so every row keeps
     * its bits and the weight panels are decoded once for all the chunks of a step. Only the
     * dense weights: an expert's rows come from tr_fwd_matmul_group per group, since how many
     * rows of a chunk an expert gets decides between the gemm and the per-row kernels. */
    for (int32_t g = 0, r0 = 0; g < sc->n_grp && r0 < rows; r0 = sc->grp_end[g++]) {
        while (!sc->grp_rowwise[g] && g + 1 < sc->n_grp && !sc->grp_rowwise[g + 1]) g++;
        const int32_t r1 = sc->grp_end[g] < rows ? sc->grp_end[g] : rows;
        tr_fwd_matmul_group(m, sc, W, x + (size_t)r0 * W->n_in, r1 - r0,
                            y + (size_t)r0 * W->n_out, g);
    }
}

static void matmul(tr_model *m, tr_scratch *sc, const tr_mat *W, const float *x, int32_t rows,
                   float *y) {
    tr_fwd_matmul(m, sc, W, x, rows, y);
}

/* W[i] x into y[i] for i < n, all of this step's rows through the per-row kernels: one product
 * (tr_matmul_rows_multi) when every row would take them anyway (a decode step, a short chunk),
 * else one matmul each */
static void matmul_same_input(tr_model *m, tr_scratch *sc, int n, const tr_mat *const *W,
                              const float *x, int32_t rows, float *const *y) {
    const bool rowwise = sc->n_grp == 0 ? tr_matmul_per_row(m->kern, rows)
                                        : sc->n_grp == 1 && sc->grp_rowwise[0];
    if (rowwise) {
        tr_matmul_rows_multi(m->pool, m->kern, n, W, x, rows, y, sc->mm);
        return;
    }
    for (int i = 0; i < n; i++) matmul(m, sc, W[i], x, rows, y[i]);
}

/* RMSNorm with an optional bias (phimoe: llama.cpp applies RMSNorm, then the weight, then the
 * bias, although HF's PhiMoE uses LayerNorm) */
static void norm_rows(const tr_model *m, float *y, const float *x, const float *w, const float *b,
                      int32_t rows) {
    const int64_t E = m->hp.n_embd;
    for (int32_t r = 0; r < rows; r++) {
        tr_rmsnorm(y + r * E, x + r * E, w, E, m->hp.rms_eps);
        if (b)
            for (int64_t i = 0; i < E; i++) y[r * E + i] += b[i];
    }
}

/* y[r * stride + i] = (W x_r)[i] for i < n: matmul writes packed rows, spread them if needed */
static void project(tr_model *m, tr_scratch *sc, const tr_mat *W, int32_t rows, float *y,
                    int64_t n, int64_t stride) {
    if (n == stride) {
        matmul(m, sc, W, sc->xn, rows, y);
        return;
    }
    matmul(m, sc, W, sc->xn, rows, sc->att);
    for (int32_t r = rows - 1; r >= 0; r--)
        memmove(y + r * stride, sc->att + r * n, (size_t)n * sizeof(float));
}

/* Corrupt weights (a NaN or Inf in a scale, a norm, an embedding row) would give garbage text
 * or PPL = nan with success: every row of the residual stream is checked after each block, and
 * the error names the block whose tensors produced the first non-finite value. A mapped file
 * that shrank under us reads as zeros (core/mapguard.h) and is reported as what it is. */
static tr_status nonfinite(const tr_model *m, tr_error *err, const char *where) {
    tr_status s = tr_gguf_mapping_check(m->gguf, err);
    if (s) return s;
    return tr_fail(err, TR_E_FORMAT,
                   "%s: non-finite values (NaN or Inf) %s: the model's weights are corrupt",
                   tr_gguf_shard_path(m->gguf, 0), where);
}

/* rows of n values `stride` apart. The inputs of quantized matrices are checked too: the Q8
 * activation quantizer turns a NaN into an ordinary code, so a NaN in an attention or FFN
 * activation would otherwise come out finite (and wrong) at the next residual check */
static bool rows_finite(const float *x, int32_t rows, int64_t n, int64_t stride) {
    if (n == stride) return tr_all_finite(x, (int64_t)rows * n);
    for (int32_t r = 0; r < rows; r++)
        if (!tr_all_finite(x + (size_t)r * stride, n)) return false;
    return true;
}

/* ---------------------------------------------------------------------------------------------- */

static tr_rope_params layer_rope(const tr_model *m, const tr_layer *L) {
    const tr_hparams *hp = &m->hp;
    return (tr_rope_params){
        .n_rot = hp->n_rot,
        .style = m->arch->rope,
        .base = L->rope_base,
        .freq_scale = L->rope_freq_scale,
        .ext_factor = hp->yarn_ext_factor,
        .attn_factor = hp->yarn_attn_factor,
        .beta_fast = hp->yarn_beta_fast,
        .beta_slow = hp->yarn_beta_slow,
        .n_ctx_orig = hp->rope_n_ctx_orig,
        .freq_factors = m->rope_freqs,
    };
}

/* the end of the run of consecutive rows from r0 that belong to r0's session */
static int32_t session_rows_end(const tr_scratch *sc, int32_t r0, int32_t rows) {
    int32_t r1 = r0 + 1;
    while (r1 < rows && sc->row_sess[r1] == sc->row_sess[r0]) r1++;
    return r1;
}

/* the layer's RoPE parameters for a row of session s (rp: the layer's), and its cos/sin */
static void rope_row(const tr_model *m, tr_rope_params *rp, const struct tr_session *s,
                     int32_t pos, float *cs) {
    if (m->rope_factors_long) {
        /* llama.cpp compares its context size, which it pads to a multiple of 256 */
        const int64_t n_ctx_pad = ((int64_t)s->n_ctx + 255) / 256 * 256;
        rp->freq_factors = n_ctx_pad > m->hp.rope_n_ctx_orig ? m->rope_factors_long
                                                             : m->rope_factors_short;
    }
    tr_rope_cache(cs, pos, rp);
}

/* a row's projected query heads as the attention takes them: QK norm, RoPE, pre-scaling */
static void finish_q(const tr_model *m, const tr_layer *L, const tr_rope_params *rp,
                     const float *cs, float *q) {
    const tr_hparams *hp = &m->hp;
    const int32_t hdk = hp->head_dim_k;
    const int64_t nq = (int64_t)L->n_head * hdk;
    if (m->arch->qk_norm == TR_QKNORM_HEAD)
        for (int32_t h = 0; h < L->n_head; h++)
            tr_rmsnorm(q + h * hdk, q + h * hdk, L->q_norm, hdk, hp->rms_eps);
    else if (m->arch->qk_norm == TR_QKNORM_FULL)
        tr_rmsnorm(q, q, L->q_norm, nq, hp->rms_eps);
    for (int32_t h = 0; h < L->n_head; h++) tr_rope_apply(q + h * hdk, cs, rp);
    if (m->arch->q_prescale)
        for (int64_t i = 0; i < nq; i++) q[i] *= hp->attn_scale;
}

/* --kv-spec: layer l + 1's queries speculated from layer l's input (its own norm and query
 * projection applied to the residual stream before layer l), for a KV cache that asks for them
 * as layer l attends, so that it selects l + 1's tokens and starts reading them while l's reads
 * are in flight (InfiniGen's observation: consecutive layers' inputs are close, the residual
 * stream changing little per layer). Computed once per layer for every row of the batch, at the
 * first request: the residual stream is still layer l's input then (the attention's output is
 * added after every session has attended), and sc->xn and the RoPE table are free again. */
typedef struct next_ctx {
    tr_model *m;
    tr_scratch *sc;
    int32_t rows;
} next_ctx;

static tr_status next_queries(void *ctx, int32_t layer, int32_t row0, int32_t rows,
                              tr_kv_next_query *out, tr_error *err) {
    (void)rows;
    (void)err;
    next_ctx *c = ctx;
    tr_model *m = c->m;
    tr_scratch *sc = c->sc;
    const tr_hparams *hp = &m->hp;
    const tr_layer *N = &m->layers[layer];
    const int64_t q_stride = (int64_t)hp->n_head_max * hp->head_dim_k;
    float *qs = sc->qs[layer % 2]; /* the other holds the previous layer's, still to be used */
    if (sc->qs_layer != layer) {
        norm_rows(m, sc->xn, sc->x, N->attn_norm, N->attn_norm_b, c->rows);
        project(m, sc, &N->wq, c->rows, qs, (int64_t)N->n_head * hp->head_dim_k, q_stride);
        add_bias(qs, N->bq, c->rows, (int64_t)N->n_head * hp->head_dim_k, q_stride);
        tr_rope_params rp = layer_rope(m, N);
        for (int32_t r = 0; r < c->rows; r++) {
            float *cs = sc->rope_cs + (size_t)r * hp->n_rot;
            rope_row(m, &rp, sc->row_sess[r], sc->row_pos[r], cs);
            finish_q(m, N, &rp, cs, qs + r * q_stride);
        }
        sc->qs_layer = layer;
    }
    *out = (tr_kv_next_query){.q = qs + (size_t)row0 * (size_t)q_stride,
                              .q_stride = (size_t)q_stride,
                              .scale = m->arch->q_prescale ? 1.0f : hp->attn_scale,
                              .swa = N->swa ? hp->n_swa : 0};
    return TR_OK;
}

/* each session's KV cache attends its rows of the layer; consecutive rows of one session go
 * together (a prefill chunk, or one row of a batched decode step), and the sessions of a step
 * together (tr_kv_attend_many: one pool run for all of them where their policy allows it) */
static tr_status attend_rows(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows,
                             tr_error *err) {
    const tr_hparams *hp = &m->hp;
    const tr_layer *L = &m->layers[l];
    const size_t q_stride = (size_t)hp->n_head_max * hp->head_dim_k;
    const size_t o_stride = (size_t)hp->n_head_max * hp->head_dim_v;
    next_ctx nc = {.m = m, .sc = sc, .rows = rows};
    sc->qs_layer = -1;
    tr_kv *kvs[TR_KV_ATTEND_MANY_MAX];
    tr_kv_query qs[TR_KV_ATTEND_MANY_MAX];
    int n = 0;
    for (int32_t r0 = 0, r1; r0 < rows; r0 = r1) {
        r1 = session_rows_end(sc, r0, rows);
        kvs[n] = sc->row_sess[r0]->kv;
        qs[n++] = (tr_kv_query){.layer = l,
                                .rows = r1 - r0,
                                .pos = sc->row_pos + r0,
                                .q = sc->q + (size_t)r0 * q_stride,
                                .q_stride = q_stride,
                                .scale = m->arch->q_prescale ? 1.0f : hp->attn_scale,
                                .sinks = L->sinks,
                                .swa = L->swa ? hp->n_swa : 0,
                                .out = sc->att + (size_t)r0 * o_stride,
                                .out_stride = o_stride,
                                .next = sc->qs[0] && l + 1 < hp->n_layer ? next_queries : NULL,
                                .next_ctx = &nc,
                                .next_row0 = r0};
        if (n == TR_KV_ATTEND_MANY_MAX || r1 == rows) {
            tr_status st = tr_kv_attend_many(kvs, m->pool, qs, n, err);
            if (st) return st;
            n = 0;
        }
    }
    return TR_OK;
}

static tr_status attention_block(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows,
                                 tr_error *err) {
    const tr_hparams *hp = &m->hp;
    const tr_layer *L = &m->layers[l];
    const int32_t hdk = hp->head_dim_k, hdv = hp->head_dim_v;
    const int64_t nq = (int64_t)L->n_head * hdk, nk = (int64_t)L->n_head_kv * hdk,
                  nv = (int64_t)L->n_head_kv * hdv;
    const int64_t q_stride = (int64_t)hp->n_head_max * hdk, k_stride = (int64_t)hp->n_head_kv_max * hdk,
                  v_stride = (int64_t)hp->n_head_kv_max * hdv;
    const int64_t E = hp->n_embd;

    norm_rows(m, sc->xn, sc->x, L->attn_norm, L->attn_norm_b, rows);

    /* projections; with per-layer head counts below the maximum the outputs are re-spread to
     * the buffers' row strides */
    if (nq == q_stride && nk == k_stride && nv == v_stride) {
        const tr_mat *const W[3] = {&L->wq, &L->wk, &L->wv};
        float *const y[3] = {sc->q, sc->k, sc->v};
        matmul_same_input(m, sc, 3, W, sc->xn, rows, y);
    } else {
        project(m, sc, &L->wq, rows, sc->q, nq, q_stride);
        project(m, sc, &L->wk, rows, sc->k, nk, k_stride);
        project(m, sc, &L->wv, rows, sc->v, nv, v_stride);
    }
    add_bias(sc->q, L->bq, rows, nq, q_stride);
    add_bias(sc->k, L->bk, rows, nk, k_stride);
    add_bias(sc->v, L->bv, rows, nv, v_stride);

    tr_rope_params rp = layer_rope(m, L);
    for (int32_t r = 0; r < rows; r++) {
        float *q = sc->q + r * q_stride, *k = sc->k + r * k_stride;
        float *cs = sc->rope_cs + (size_t)r * hp->n_rot;
        rope_row(m, &rp, sc->row_sess[r], sc->row_pos[r], cs);
        finish_q(m, L, &rp, cs, q);
        if (m->arch->qk_norm == TR_QKNORM_HEAD)
            for (int32_t h = 0; h < L->n_head_kv; h++)
                tr_rmsnorm(k + h * hdk, k + h * hdk, L->k_norm, hdk, hp->rms_eps);
        else if (m->arch->qk_norm == TR_QKNORM_FULL)
            tr_rmsnorm(k, k, L->k_norm, nk, hp->rms_eps);
        for (int32_t h = 0; h < L->n_head_kv; h++) tr_rope_apply(k + h * hdk, cs, &rp);

        /* the new K/V enter the row's session cache */
        tr_status st = tr_kv_append(sc->row_sess[r]->kv, l, sc->row_pos[r], k,
                                    sc->v + r * v_stride, err);
        if (st) return st;
    }

    tr_status st = attend_rows(m, sc, l, rows, err);
    if (st) return st;

    /* pack the per-head outputs [rows][n_head * hdv] and project */
    const int64_t no = (int64_t)L->n_head * hdv, att_stride = (int64_t)hp->n_head_max * hdv;
    if (!rows_finite(sc->att, rows, no, att_stride)) {
        char where[112];
        snprintf(where, sizeof where, "in layer %d's attention (tensors blk.%d.attn_norm, attn_q, "
                 "attn_k, attn_v)", l, l);
        return nonfinite(m, err, where);
    }
    if (no != att_stride)
        for (int32_t r = 1; r < rows; r++)
            memmove(sc->att + r * no, sc->att + r * att_stride, (size_t)no * sizeof(float));
    matmul(m, sc, &L->wo, sc->att, rows, sc->o);
    add_bias(sc->o, L->bo, rows, E, E);
    for (int32_t r = 0; r < rows; r++) {
        float *o = sc->o + r * E;
        if (L->post_attn_norm) tr_rmsnorm(o, o, L->post_attn_norm, E, hp->rms_eps);
        float *x = sc->x + r * E;
        for (int64_t i = 0; i < E; i++) x[i] += o[i];
    }
    if (!rows_finite(sc->x, rows, E, E)) {
        char where[96];
        snprintf(where, sizeof where, "after layer %d's attention (tensors blk.%d.attn_*)", l, l);
        return nonfinite(m, err, where);
    }
    return TR_OK;
}

static tr_status ffn_block(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows, tr_error *err) {
    const tr_hparams *hp = &m->hp;
    const tr_layer *L = &m->layers[l];
    const int64_t E = hp->n_embd, F = L->n_ff;
    norm_rows(m, sc->xn, sc->x, L->ffn_norm, L->ffn_norm_b, rows);
    if (L->moe) {
        tr_status s = tr_moe_ffn(m, sc, l, rows, sc->o, err);
        if (s) return s;
    } else {
        const tr_mat *const W[2] = {&L->ffn_gate, &L->ffn_up};
        float *const y[2] = {sc->g, sc->u};
        matmul_same_input(m, sc, 2, W, sc->xn, rows, y);
        if (m->arch->act == TR_ACT_GELU) tr_geglu(sc->g, sc->u, rows * F);
        else tr_swiglu(sc->g, sc->u, rows * F);
        if (!rows_finite(sc->g, rows, F, F)) {
            char where[112];
            snprintf(where, sizeof where, "in layer %d's feed-forward (tensors blk.%d.ffn_norm, "
                     "ffn_gate, ffn_up)", l, l);
            return nonfinite(m, err, where);
        }
        matmul(m, sc, &L->ffn_down, sc->g, rows, sc->o);
    }
    for (int32_t r = 0; r < rows; r++) {
        float *o = sc->o + r * E;
        if (L->post_ffw_norm) tr_rmsnorm(o, o, L->post_ffw_norm, E, hp->rms_eps);
        float *x = sc->x + r * E;
        for (int64_t i = 0; i < E; i++) x[i] += o[i];
    }
    if (!rows_finite(sc->x, rows, E, E)) {
        char where[128];
        snprintf(where, sizeof where, "after layer %d's feed-forward (tensors blk.%d.ffn_*%s)", l,
                 l, L->moe ? ": the experts or the shared expert" : "");
        return nonfinite(m, err, where);
    }
    return TR_OK;
}

tr_status tr_forward(tr_model *m, tr_scratch *sc, int32_t rows, const int32_t *tokens,
                     float *logits, int32_t logits_rows, const int32_t *out_rows, tr_error *err) {
    const tr_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd;
    if (rows < 1 || rows > sc->rows)
        return tr_fail(err, TR_E_INTERNAL, "forward: %d rows (capacity %d)", rows, sc->rows);
    const tr_to_float_fn embd_row = tr_traits(m->tok_embd.type)->to_float;
    for (int32_t r = 0; r < rows; r++) {
        if (tokens[r] < 0 || tokens[r] >= hp->n_vocab)
            return tr_fail(err, TR_E_ARG, "token id %d is outside the vocabulary (0..%d)",
                           tokens[r], hp->n_vocab - 1);
        float *x = sc->x + r * E;
        embd_row((const char *)m->tok_embd.data + (size_t)tokens[r] * m->tok_embd.row_bytes, x, E);
        if (hp->embd_scale != 1.0f)
            for (int64_t i = 0; i < E; i++) x[i] *= hp->embd_scale;
        if (!tr_all_finite(x, E)) {
            char where[96];
            snprintf(where, sizeof where, "in row %d of token_embd.weight (the embedding of "
                     "token %d)", tokens[r], tokens[r]);
            return nonfinite(m, err, where);
        }
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        tr_status s = attention_block(m, sc, l, rows, err);
        if (!s) s = ffn_block(m, sc, l, rows, err);
        if (s) return s;
    }
    if (logits_rows <= 0) return tr_gguf_mapping_check(m->gguf, err);
    int32_t first = rows - logits_rows;
    if (out_rows) {
        /* the wanted rows moved to the front (ascending, so row k's source is never a later
         * row's destination) and computed as one block */
        for (int32_t k = 0; k < logits_rows; k++)
            if (out_rows[k] != k)
                memcpy(sc->x + (size_t)k * E, sc->x + (size_t)out_rows[k] * E, (size_t)E * 4);
        first = 0;
    }
    norm_rows(m, sc->xn, sc->x + (size_t)first * E, m->output_norm, m->output_norm_b, logits_rows);
    if (!rows_finite(sc->xn, logits_rows, E, E))
        return nonfinite(m, err, "after the output norm (output_norm.weight)");
    /* a batch's logits are each one session's last row, which alone is a product of one row */
    if (out_rows) tr_matmul_rowwise(m->pool, m->kern, &m->output, sc->xn, logits_rows, logits, sc->mm);
    else matmul(m, sc, &m->output, sc->xn, logits_rows, logits);
    add_bias(logits, m->output_b, logits_rows, hp->n_vocab, hp->n_vocab);
    if (hp->final_logit_softcap > 0.0f) {
        const float c = hp->final_logit_softcap;
        for (int64_t i = 0; i < (int64_t)logits_rows * hp->n_vocab; i++)
            logits[i] = c * tanhf(logits[i] / c);
    }
    if (!rows_finite(logits, logits_rows, hp->n_vocab, hp->n_vocab))
        return nonfinite(m, err, m->output.data == m->tok_embd.data
                                     ? "in the logits (token_embd.weight, the tied output)"
                                     : "in the logits (output.weight)");
    /* a mapping that faulted reads zeros, which are finite: the last word is the guard's */
    return tr_gguf_mapping_check(m->gguf, err);
}
