/*
 * The forward pass shared by every architecture: a batch of rows (tokens; of one session during
 * prefill, of several during batched decode) goes through the layers together, so every weight
 * matrix is read once per batch (matrix-matrix products); attention runs per row against that
 * row's own session KV cache. Nothing is allocated here: all buffers come from the scratch the
 * session sized at creation.
 */
#include <math.h>
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

/* ---------------------------------------------------------------------------------------------- */
/* attention                                                                                      */

/* The full policy's attention: tasks of one KV head and a block of consecutive rows (tr_attn's
 * tiles: the block's positions × the KV head's query heads, at most TR_ATTN_MAX_Q vectors), so
 * each block of K and V is converted once for the whole tile. With too few such tasks for the
 * threads (decode), the query heads of a KV head are split into smaller groups. */
typedef struct attn_job {
    tr_model *m;
    tr_scratch *sc;
    int32_t layer, rows;
    float scale;
    int32_t rows_per_block, n_blocks, heads_per_task, n_sub; /* n_sub: tasks per KV head */
    atomic_int_fast64_t next;
} attn_job;

/* rows [r0, r1) of one session, query heads [h0, h1) of KV head kvh */
static void attend_tile(attn_job *j, int ith, int32_t r0, int32_t r1, int32_t kvh, int32_t h0,
                        int32_t h1) {
    tr_model *m = j->m;
    tr_scratch *sc = j->sc;
    const tr_hparams *hp = &m->hp;
    const tr_layer *L = &m->layers[j->layer];
    const struct tr_session *s = sc->row_sess[r0];
    const int32_t hdk = hp->head_dim_k, hdv = hp->head_dim_v;
    tr_attn_q qs[TR_ATTN_MAX_Q];
    int n = 0;
    for (int32_t r = r0; r < r1; r++) {
        const int32_t pos = sc->row_pos[r];
        int32_t lo = 0;
        if (L->swa && hp->n_swa > 0 && pos >= hp->n_swa) lo = pos - hp->n_swa + 1;
        for (int32_t h = h0; h < h1; h++)
            qs[n++] = (tr_attn_q){
                .q = sc->q + (size_t)r * hp->n_head_max * hdk + (size_t)h * hdk,
                .out = sc->att + (size_t)r * hp->n_head_max * hdv + (size_t)h * hdv,
                .lo = lo,
                .hi = pos,
                .sink = L->sinks ? L->sinks[h] : -INFINITY,
            };
    }
    const tr_attn_kv kv = {
        .k = tr_sess_k(s, j->layer) + (size_t)kvh * hdk,
        .k_pos = (size_t)L->n_head_kv * hdk,
        .v = tr_sess_vt(s, j->layer) + (size_t)kvh * hdv * s->n_ctx, /* V transposed */
        .v_pos = 1,
        .v_dim = (size_t)s->n_ctx,
        .hd_k = hdk,
        .hd_v = hdv,
        .scale = j->scale,
    };
    tr_attn_f16_of(m->kern)(n, qs, &kv, sc->attn_scratch + (size_t)ith * sc->attn_floats);
}

static void attn_task(void *ctx, int ith, int nth) {
    (void)nth;
    attn_job *j = ctx;
    const tr_layer *L = &j->m->layers[j->layer];
    const int32_t G = L->n_head / L->n_head_kv;
    const int64_t per_block = (int64_t)L->n_head_kv * j->n_sub;
    const int64_t total = (int64_t)j->n_blocks * per_block;
    int64_t b, e;
    while (tr_claim(&j->next, total, 1, &b, &e)) {
        /* the last blocks first: they see the most keys, and the threads then finish together */
        const int32_t blk = j->n_blocks - 1 - (int32_t)(b / per_block);
        const int32_t kvh = (int32_t)(b % per_block / j->n_sub), sub = (int32_t)(b % j->n_sub);
        const int32_t h0 = kvh * G + sub * j->heads_per_task;
        const int32_t h1 = h0 + j->heads_per_task < (kvh + 1) * G ? h0 + j->heads_per_task : (kvh + 1) * G;
        const int32_t r0 = blk * j->rows_per_block;
        const int32_t r1 = r0 + j->rows_per_block < j->rows ? r0 + j->rows_per_block : j->rows;
        /* a block's rows may belong to several sessions (batched decode): a tile per session */
        for (int32_t a = r0, z; a < r1; a = z) {
            z = a + 1;
            while (z < r1 && j->sc->row_sess[z] == j->sc->row_sess[a]) z++;
            attend_tile(j, ith, a, z, kvh, h0, h1);
        }
    }
}

static void full_attention(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows) {
    const tr_layer *L = &m->layers[l];
    const int32_t G = L->n_head / L->n_head_kv;
    const int nth = tr_pool_size(m->pool);
    attn_job j = {.m = m, .sc = sc, .layer = l, .rows = rows,
                  .scale = m->arch->q_prescale ? 1.0f : m->hp.attn_scale};
    j.heads_per_task = G < TR_ATTN_MAX_Q ? G : TR_ATTN_MAX_Q;
    j.rows_per_block = TR_ATTN_MAX_Q / j.heads_per_task;
    j.n_blocks = (rows + j.rows_per_block - 1) / j.rows_per_block;
    /* decode: fewer tiles than a few per thread -> smaller head groups */
    while (j.heads_per_task > 1 &&
           (int64_t)j.n_blocks * L->n_head_kv * ((G + j.heads_per_task - 1) / j.heads_per_task) <
               4 * nth)
        j.heads_per_task = (j.heads_per_task + 1) / 2;
    j.n_sub = (G + j.heads_per_task - 1) / j.heads_per_task;
    atomic_init(&j.next, 0);
    tr_pool_run(m->pool, attn_task, &j);
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
        full_attention(m, sc, l, rows);
    }

    /* pack the per-head outputs [rows][n_head * hdv] and project */
    const int64_t no = (int64_t)L->n_head * hdv, att_stride = (int64_t)hp->n_head_max * hdv;
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
        matmul(m, sc, &L->ffn_down, sc->g, rows, sc->o);
    }
    for (int32_t r = 0; r < rows; r++) {
        float *o = sc->o + r * E;
        if (L->post_ffw_norm) tr_rmsnorm(o, o, L->post_ffw_norm, E, hp->rms_eps);
        float *x = sc->x + r * E;
        for (int64_t i = 0; i < E; i++) x[i] += o[i];
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
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        tr_status s = attention_block(m, sc, l, rows, err);
        if (!s) s = ffn_block(m, sc, l, rows, err);
        if (s) return s;
    }
    if (logits_rows <= 0) return TR_OK;
    const int32_t first = rows - logits_rows;
    norm_rows(m, sc->xn, sc->x + (size_t)first * E, m->output_norm, m->output_norm_b, logits_rows);
    matmul(m, sc, &m->output, sc->xn, logits_rows, logits);
    add_bias(logits, m->output_b, logits_rows, hp->n_vocab, hp->n_vocab);
    if (hp->final_logit_softcap > 0.0f) {
        const float c = hp->final_logit_softcap;
        for (int64_t i = 0; i < (int64_t)logits_rows * hp->n_vocab; i++)
            logits[i] = c * tanhf(logits[i] / c);
    }
    return TR_OK;
}
