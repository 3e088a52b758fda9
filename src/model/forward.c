/*
 * The forward pass shared by every architecture: a batch of rows (tokens; of one session during
 * prefill, of several during batched decode) goes through the layers together, so every weight
 * matrix is read once per batch (matrix-matrix products); attention runs per row against that
 * row's own session KV cache. Nothing is allocated here: all buffers come from the scratch the
 * session sized at creation.
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

static void matmul(tr_model *m, tr_scratch *sc, const tr_mat *W, const float *x, int32_t rows,
                   float *y) {
    tr_matmul(m->pool, m->kern, W, x, rows, y, sc->mm);
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
/* attention                                                                                      */

typedef struct attn_job {
    tr_model *m;
    tr_scratch *sc;
    int32_t layer, rows;
    float scale;
    atomic_int_fast64_t next;
} attn_job;

/* one (row, head): scores against every visible key, softmax, weighted sum of V — with the F16
 * roundings of llama.cpp's non-flash path (q and the probabilities are rounded to F16 because
 * its matmuls against the F16 cache convert the other operand to F16) */
static void attend_one(attn_job *j, int ith, int32_t r, int32_t h) {
    tr_model *m = j->m;
    tr_scratch *sc = j->sc;
    const tr_hparams *hp = &m->hp;
    const tr_layer *L = &m->layers[j->layer];
    const struct tr_session *s = sc->row_sess[r];
    const int32_t pos = sc->row_pos[r];
    const int32_t hdk = hp->head_dim_k, hdv = hp->head_dim_v;
    const int32_t kvh = h / (L->n_head / L->n_head_kv);
    const size_t k_stride = (size_t)L->n_head_kv * hdk;
    int32_t j0 = 0;
    if (L->swa && hp->n_swa > 0 && pos >= hp->n_swa) j0 = pos - hp->n_swa + 1;
    const int32_t n = pos - j0 + 1;

    float *scores = sc->scores + (size_t)ith * sc->n_ctx_cap;
    uint16_t *p16 = sc->p16 + (size_t)ith * sc->n_ctx_cap;
    uint16_t *q16 = sc->q16 + (size_t)ith * hdk;
    const float *q = sc->q + (size_t)r * hp->n_head_max * hdk + (size_t)h * hdk;
    for (int32_t d = 0; d < hdk; d++) q16[d] = tr_f32_to_f16(q[d]);

    const tr_vec_dot_fn dot16 = m->kern->vec_dot[TR_TYPE_F16];
    const uint16_t *K = tr_sess_k(s, j->layer) + (size_t)kvh * hdk;
    float mx = -INFINITY;
    for (int32_t t = 0; t < n; t++) {
        float v;
        dot16(hdk, &v, K + (size_t)(j0 + t) * k_stride, q16);
        v *= j->scale;
        scores[t] = v;
        if (v > mx) mx = v;
    }
    /* gpt-oss sinks: an extra logit per head in the denominator, with no value vector */
    const float sink = L->sinks ? L->sinks[h] : -INFINITY;
    if (sink > mx) mx = sink;
    double sum = 0.0;
    for (int32_t t = 0; t < n; t++) {
        const float e = expf(scores[t] - mx);
        scores[t] = e;
        sum += (double)e;
    }
    if (L->sinks) sum += (double)expf(sink - mx);
    const float inv = (float)(1.0 / sum);
    for (int32_t t = 0; t < n; t++) p16[t] = tr_f32_to_f16(scores[t] * inv);

    const uint16_t *VT = tr_sess_vt(s, j->layer) + (size_t)kvh * hdv * s->n_ctx;
    float *out = sc->att + (size_t)r * hp->n_head_max * hdv + (size_t)h * hdv;
    for (int32_t d = 0; d < hdv; d++) dot16(n, &out[d], VT + (size_t)d * s->n_ctx + j0, p16);
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)nth;
    attn_job *j = ctx;
    const int32_t n_head = j->m->layers[j->layer].n_head;
    const int64_t total = (int64_t)j->rows * n_head;
    int64_t b, e;
    while (tr_claim(&j->next, total, 4, &b, &e))
        for (int64_t i = b; i < e; i++) attend_one(j, ith, (int32_t)(i / n_head), (int32_t)(i % n_head));
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

/* --kv-spec: layer l + 1's queries, speculated from layer l's input (its own norm and query
 * projection applied to the residual stream before layer l), handed to each session's KV cache
 * before layer l attends, so that the cache selects l + 1's tokens and starts reading them while
 * l's reads are in flight (InfiniGen's observation: consecutive layers' inputs are close, the
 * residual stream changing little per layer). Only the scratch's own session decides whether the
 * buffers exist; rows of sessions without --kv-spec are skipped. */
static tr_status spec_queries(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows,
                              tr_error *err) {
    const tr_hparams *hp = &m->hp;
    const tr_layer *N = &m->layers[l + 1];
    bool any = false;
    for (int32_t r = 0; r < rows; r++) any = any || sc->row_sess[r]->kv_spec;
    if (!any) return TR_OK;
    const int64_t q_stride = (int64_t)hp->n_head_max * hp->head_dim_k;
    float *qs = sc->qs[(l + 1) % 2]; /* the other holds layer l's, still to be used */
    norm_rows(m, sc->xn, sc->x, N->attn_norm, N->attn_norm_b, rows);
    project(m, sc, &N->wq, rows, qs, (int64_t)N->n_head * hp->head_dim_k, q_stride);
    add_bias(qs, N->bq, rows, (int64_t)N->n_head * hp->head_dim_k, q_stride);
    tr_rope_params rp = layer_rope(m, N);
    for (int32_t r = 0; r < rows; r++) {
        float *cs = sc->rope_cs + (size_t)r * hp->n_rot;
        rope_row(m, &rp, sc->row_sess[r], sc->row_pos[r], cs);
        finish_q(m, N, &rp, cs, qs + r * q_stride);
    }
    const float scale = m->arch->q_prescale ? 1.0f : hp->attn_scale;
    for (int32_t r0 = 0, r1; r0 < rows; r0 = r1) {
        struct tr_session *s = sc->row_sess[r0];
        r1 = session_rows_end(sc, r0, rows);
        if (s->kv_spec) {
            tr_status st = tr_kv_spec_query(s->kv, l + 1, r1 - r0, sc->row_pos + r0,
                                            qs + (size_t)r0 * q_stride, q_stride, scale,
                                            N->swa ? hp->n_swa : 0, err);
            if (st) return st;
        }
    }
    return TR_OK;
}

/* rows whose session has a managed KV cache (a --kv-policy other than full): the policy stores
 * K/V and runs the attention; consecutive rows of one session go together */
static tr_status managed_attention(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows,
                                   tr_error *err) {
    const tr_hparams *hp = &m->hp;
    const tr_layer *L = &m->layers[l];
    const size_t q_stride = (size_t)hp->n_head_max * hp->head_dim_k;
    const size_t o_stride = (size_t)hp->n_head_max * hp->head_dim_v;
    const float scale = m->arch->q_prescale ? 1.0f : hp->attn_scale;
    for (int32_t r0 = 0, r1; r0 < rows; r0 = r1) {
        r1 = session_rows_end(sc, r0, rows);
        tr_status st = tr_kv_attend_rows(sc->row_sess[r0]->kv, m->pool, l, r1 - r0,
                                         sc->row_pos + r0, sc->q + (size_t)r0 * q_stride, q_stride,
                                         scale, L->sinks, L->swa ? hp->n_swa : 0,
                                         sc->att + (size_t)r0 * o_stride, o_stride, err);
        if (st) return st;
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
    project(m, sc, &L->wq, rows, sc->q, nq, q_stride);
    project(m, sc, &L->wk, rows, sc->k, nk, k_stride);
    project(m, sc, &L->wv, rows, sc->v, nv, v_stride);
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

        /* the new K/V enter the row's session cache (F16, V transposed; or the policy's pools) */
        struct tr_session *s = sc->row_sess[r];
        const int32_t pos = sc->row_pos[r];
        if (s->kv) {
            tr_status st = tr_kv_append(s->kv, l, pos, k, sc->v + r * v_stride, err);
            if (st) return st;
            continue;
        }
        uint16_t *K = tr_sess_k(s, l) + (size_t)pos * nk;
        for (int64_t i = 0; i < nk; i++) K[i] = tr_f32_to_f16(k[i]);
        uint16_t *VT = tr_sess_vt(s, l);
        const float *v = sc->v + r * v_stride;
        for (int64_t i = 0; i < nv; i++) VT[(size_t)i * s->n_ctx + pos] = tr_f32_to_f16(v[i]);
    }

    if (sc->row_sess[0]->kv) {
        tr_status st = sc->qs[0] && l + 1 < hp->n_layer ? spec_queries(m, sc, l, rows, err) : TR_OK;
        if (!st) st = managed_attention(m, sc, l, rows, err);
        if (st) return st;
    } else {
        attn_job j = {.m = m, .sc = sc, .layer = l, .rows = rows,
                      .scale = m->arch->q_prescale ? 1.0f : hp->attn_scale};
        atomic_init(&j.next, 0);
        tr_pool_run(m->pool, attn_task, &j);
    }

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
        matmul(m, sc, &L->ffn_gate, sc->xn, rows, sc->g);
        matmul(m, sc, &L->ffn_up, sc->xn, rows, sc->u);
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
                     float *logits, int32_t logits_rows, tr_error *err) {
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
    const int32_t first = rows - logits_rows;
    norm_rows(m, sc->xn, sc->x + (size_t)first * E, m->output_norm, m->output_norm_b, logits_rows);
    if (!rows_finite(sc->xn, logits_rows, E, E))
        return nonfinite(m, err, "after the output norm (output_norm.weight)");
    matmul(m, sc, &m->output, sc->xn, logits_rows, logits);
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
