/*
 * Sessions: the KV cache and scratch are sized from the model and the session parameters before
 * anything is allocated, allocated once, and reused for every token.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv.h"
#include "model/session.h"

tr_session_params tr_session_default_params(void) {
    return (tr_session_params){.n_ctx = 0, .n_batch = 0, .kv = tr_kv_default_params()};
}

/* the KV cache's shape for this model; the full policy takes each layer's own head counts */
static tr_kv_shape kv_shape(const tr_model *m, int32_t n_ctx, int32_t *n_head, int32_t *n_head_kv) {
    const tr_hparams *hp = &m->hp;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        n_head[l] = m->layers[l].n_head;
        n_head_kv[l] = m->layers[l].n_head_kv;
    }
    return (tr_kv_shape){.n_layer = hp->n_layer,
                         .n_ctx = n_ctx,
                         .n_head = hp->n_head_max,
                         .n_head_kv = hp->n_head_kv_max,
                         .head_dim_k = hp->head_dim_k,
                         .head_dim_v = hp->head_dim_v,
                         .layer_n_head = n_head,
                         .layer_n_head_kv = n_head_kv};
}

/* the session's KV parameters: the caller's, sized to this session's batch and threads */
static tr_kv_params kv_params(const tr_model *m, const tr_session_params *p) {
    tr_kv_params kp = p->kv;
    kp.max_rows = p->n_batch; /* a batch's rows are appended before they attend */
    kp.n_threads = m->pool ? tr_pool_size(m->pool) : tr_cpu_physical_cores();
    return kp;
}

/* the full policy's arrays, allocated whole at create (the other policies' DRAM grows within
 * their plan and is counted as it is used) */
static uint64_t full_bytes(const tr_model *m, const tr_session_params *p) {
    if (p->kv.policy != TR_KV_FULL) return 0;
    const int32_t nl = m->hp.n_layer;
    int32_t *heads = malloc(sizeof(int32_t) * 2 * (size_t)nl);
    if (!heads) return 0;
    const tr_kv_shape shape = kv_shape(m, p->n_ctx, heads, heads + nl);
    const tr_kv_params kp = kv_params(m, p);
    const uint64_t b = tr_kv_dram_bytes(&shape, &kp);
    free(heads);
    return b;
}

static tr_status create_kv(const tr_model *m, const tr_session_params *p, struct tr_kv **out,
                           tr_error *err) {
    const int32_t nl = m->hp.n_layer;
    int32_t *heads = malloc(sizeof(int32_t) * 2 * (size_t)nl);
    if (!heads) return tr_fail(err, TR_E_NOMEM, "out of memory");
    const tr_kv_shape shape = kv_shape(m, p->n_ctx, heads, heads + nl);
    const tr_kv_params kp = kv_params(m, p);
    const tr_status st = tr_kv_create(&shape, &kp, out, err);
    free(heads);
    return st;
}

void tr_session_get_kv_stats(const tr_session *s, tr_kv_stats *out) {
    tr_kv_get_stats(s->kv, out);
}

/* bytes of quantized activations tr_matmul needs for `rows` rows against any weight matrix */
static size_t mm_scratch_bytes(const tr_model *m, int32_t rows) {
    size_t need = 0;
#define CONSIDER(mat)                                                                              \
    do {                                                                                           \
        if ((mat).data) {                                                                          \
            size_t b = tr_matmul_scratch_size((mat).type, (mat).n_in, rows);                       \
            if (b > need) need = b;                                                                \
        }                                                                                          \
    } while (0)
    CONSIDER(m->output);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const tr_layer *L = &m->layers[l];
        CONSIDER(L->wq);
        CONSIDER(L->wk);
        CONSIDER(L->wv);
        CONSIDER(L->wo);
        CONSIDER(L->ffn_gate);
        CONSIDER(L->ffn_up);
        CONSIDER(L->ffn_down);
        CONSIDER(L->router);
        CONSIDER(L->shexp_gate);
        CONSIDER(L->shexp_up);
        CONSIDER(L->shexp_down);
        if (L->moe) {
            const tr_exps *x[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
            for (int i = 0; i < 3; i++) {
                size_t b = tr_matmul_scratch_size(x[i]->type, x[i]->n_in, rows);
                if (b > need) need = b;
            }
        }
    }
#undef CONSIDER
    return need;
}

/* Lays the scratch of a forward pass of n_batch rows out in one block; with base NULL it only
 * sizes it. Returns the bytes. One function for both, so the estimate cannot drift from what is
 * allocated. */
static size_t scratch_plan(const tr_model *m, int32_t n_batch, bool spec, char *base,
                           tr_scratch *sc) {
    const tr_hparams *hp = &m->hp;
    const size_t R = (size_t)n_batch, E = (size_t)hp->n_embd;
    const size_t nq = (size_t)hp->n_head_max * hp->head_dim_k;
    const size_t no = (size_t)hp->n_head_max * hp->head_dim_v;
    const size_t nk = (size_t)hp->n_head_kv_max * hp->head_dim_k;
    const size_t nv = (size_t)hp->n_head_kv_max * hp->head_dim_v;
    const size_t natt = nq > no ? nq : no;
    const size_t NE = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    size_t total = 0;
#define TAKE(field, bytes)                                                                         \
    do {                                                                                           \
        total = (total + 63) & ~(size_t)63;                                                        \
        if (base) sc->field = (void *)(base + total);                                              \
        total += (bytes);                                                                          \
    } while (0)
    TAKE(x, R * E * 4);
    TAKE(xn, R * E * 4);
    TAKE(q, R * nq * 4);
    TAKE(k, R * nk * 4);
    TAKE(v, R * nv * 4);
    TAKE(att, R * (natt > nk ? natt : nk) * 4);
    TAKE(o, R * E * 4);
    TAKE(g, R * (size_t)hp->n_ff_max * 4);
    TAKE(u, R * (size_t)hp->n_ff_max * 4);
    TAKE(mm, mm_scratch_bytes(m, n_batch));
    TAKE(row_sess, R * sizeof(tr_session *));
    TAKE(row_pos, R * 4);
    TAKE(rope_cs, R * (size_t)hp->n_rot * 4);
    if (spec) {
        TAKE(qs[0], R * nq * 4);
        TAKE(qs[1], R * nq * 4);
    }
    if (NE > 0) {
        TAKE(moe_logits, R * NE * 4);
        TAKE(moe_sel, R * K * 4);
        TAKE(moe_w, R * K * 4);
        TAKE(moe_off, (NE + 1) * 4);
        TAKE(moe_fill, NE * 4);
        TAKE(moe_rows, R * K * 4);
        TAKE(moe_used, NE * 4);
        TAKE(moe_in, R * E * 4);
        TAKE(moe_slot, R * K * E * 4); /* weighted expert outputs, summed in slot order */
    }
#undef TAKE
    return total;
}

static void resolve_params(const tr_model *m, tr_session_params *p) {
    const tr_hparams *hp = &m->hp;
    if (p->n_ctx <= 0) p->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p->n_batch <= 0) p->n_batch = 512;
    if (p->n_batch > p->n_ctx) p->n_batch = p->n_ctx;
}

uint64_t tr_session_estimate(const tr_model *m, int32_t n_ctx, int32_t n_batch) {
    tr_session_params p = tr_session_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    resolve_params(m, &p);
    tr_scratch dummy;
    return full_bytes(m, &p) + scratch_plan(m, p.n_batch, false, NULL, &dummy);
}

uint64_t tr_session_estimate_default(const tr_model *m) { return tr_session_estimate(m, 0, 0); }

tr_status tr_session_create(tr_model *m, const tr_session_params *params, tr_session **out,
                            tr_error *err) {
    *out = NULL;
    tr_session_params p = params ? *params : tr_session_default_params();
    resolve_params(m, &p);
    if (p.n_ctx > (1 << 24))
        return tr_fail(err, TR_E_ARG, "context of %d tokens is out of range", p.n_ctx);
    tr_session *s = calloc(1, sizeof *s);
    if (!s) return tr_fail(err, TR_E_NOMEM, "out of memory");
    s->m = m;
    s->n_ctx = p.n_ctx;
    s->n_batch = p.n_batch;
    tr_status kst = create_kv(m, &p, &s->kv, err);
    if (kst) {
        tr_session_free(s);
        return kst;
    }
    tr_scratch *sc = &s->sc;
    const bool spec = p.kv.policy == TR_KV_TIERED && p.kv.spec;
    const size_t scratch = scratch_plan(m, p.n_batch, spec, NULL, sc);
    s->scratch_mem = aligned_alloc(64, (scratch + 63) & ~(size_t)63);
    if (!s->scratch_mem) {
        tr_session_free(s);
        return tr_fail(err, TR_E_NOMEM,
                       "cannot allocate the session's scratch: %zu MiB for batches of %d; lower -b",
                       scratch >> 20, p.n_batch);
    }
    s->bytes = scratch + full_bytes(m, &p);
    scratch_plan(m, p.n_batch, spec, s->scratch_mem, sc);
    sc->rows = p.n_batch;
    sc->n_ctx_cap = p.n_ctx;
    sc->qs_layer = -1;
    *out = s;
    return TR_OK;
}

void tr_session_free(tr_session *s) {
    if (!s) return;
    tr_kv_free(s->kv);
    free(s->scratch_mem);
    free(s);
}

uint64_t tr_session_bytes(const tr_session *s) {
    tr_kv_stats st;
    tr_kv_get_stats(s->kv, &st);
    return st.policy == TR_KV_FULL ? s->bytes : s->bytes + st.hot_bytes;
}
int32_t tr_session_n_ctx(const tr_session *s) { return s->n_ctx; }
int32_t tr_session_n_past(const tr_session *s) { return s->n_past; }
int32_t tr_session_n_batch(const tr_session *s) { return s->n_batch; }

void tr_session_set_abort(tr_session *s, tr_abort_fn fn, void *user) {
    s->abort_fn = fn;
    s->abort_user = user;
}

tr_status tr_session_truncate(tr_session *s, int32_t n, tr_error *err) {
    if (n < 0 || n > s->n_past)
        return tr_fail(err, TR_E_ARG, "cannot truncate to %d tokens (session holds %d)", n,
                       s->n_past);
    tr_status st = tr_kv_truncate(s->kv, n, err);
    if (st) return st;
    s->n_past = n;
    return TR_OK;
}

tr_status tr_session_eval(tr_session *s, const int32_t *tokens, int32_t n, float *logits,
                          bool all_logits, tr_error *err) {
    if (n <= 0) return tr_fail(err, TR_E_ARG, "no tokens to evaluate");
    if ((int64_t)s->n_past + n > s->n_ctx)
        return tr_fail(err, TR_E_ARG,
                       "%d tokens do not fit in the context: %d of %d positions are used (raise -c)",
                       n, s->n_past, s->n_ctx);
    tr_model *m = s->m;
    const int32_t n_vocab = m->hp.n_vocab;
    pthread_mutex_lock(&m->lock);
    tr_status st = TR_OK;
    const int32_t start = s->n_past;
    bool aborted = false;
    for (int32_t done = 0; done < n && st == TR_OK;) {
        if (s->abort_fn && s->abort_fn(s->abort_user)) {
            st = tr_fail(err, TR_E_ABORTED, "aborted by the caller after %d of %d tokens", done, n);
            aborted = true;
            break;
        }
        const int32_t rows = n - done < s->n_batch ? n - done : s->n_batch;
        for (int32_t r = 0; r < rows; r++) {
            s->sc.row_sess[r] = s;
            s->sc.row_pos[r] = s->n_past + r;
        }
        const bool last_chunk = done + rows == n;
        int32_t lrows = 0;
        float *dst = NULL;
        if (logits && all_logits) {
            lrows = rows;
            dst = logits + (size_t)done * n_vocab;
        } else if (logits && last_chunk) {
            lrows = 1;
            dst = logits;
        }
        st = tr_forward(m, &s->sc, rows, tokens + done, dst, lrows, err);
        if (st == TR_OK) {
            s->n_past += rows;
            done += rows;
        }
    }
    /* all or nothing on errors; an abort keeps the chunks it let finish (the header says so) */
    if (st != TR_OK && !aborted) s->n_past = start;
    pthread_mutex_unlock(&m->lock);
    return st;
}

tr_status tr_decode_batch(tr_session **sessions, const int32_t *tokens, int32_t B, float *logits,
                          tr_error *err) {
    if (B <= 0) return tr_fail(err, TR_E_ARG, "empty batch");
    tr_session *s0 = sessions[0];
    tr_model *m = s0->m;
    if (B > s0->n_batch)
        return tr_fail(err, TR_E_ARG, "batch of %d sequences exceeds the first session's batch "
                       "size %d", B, s0->n_batch);
    for (int32_t b = 0; b < B; b++) {
        if (sessions[b]->m != m)
            return tr_fail(err, TR_E_ARG, "sequence %d belongs to another model", b);
        if (sessions[b]->n_past >= sessions[b]->n_ctx)
            return tr_fail(err, TR_E_ARG, "sequence %d: context full (%d tokens)", b,
                           sessions[b]->n_ctx);
        if (sessions[b]->n_past >= s0->sc.n_ctx_cap)
            return tr_fail(err, TR_E_ARG, "sequence %d is longer (%d tokens) than the first "
                           "session's context (%d): put the session with the largest context first",
                           b, sessions[b]->n_past + 1, s0->sc.n_ctx_cap);
        for (int32_t c = 0; c < b; c++)
            if (sessions[c] == sessions[b])
                return tr_fail(err, TR_E_ARG, "sequence %d appears twice in the batch", b);
    }
    for (int32_t b = 0; b < B; b++)
        if (sessions[b]->abort_fn && sessions[b]->abort_fn(sessions[b]->abort_user))
            return tr_fail(err, TR_E_ABORTED, "sequence %d: aborted by the caller", b);
    pthread_mutex_lock(&m->lock);
    for (int32_t b = 0; b < B; b++) {
        s0->sc.row_sess[b] = sessions[b];
        s0->sc.row_pos[b] = sessions[b]->n_past;
    }
    tr_status st = tr_forward(m, &s0->sc, B, tokens, logits, logits ? B : 0, err);
    if (st == TR_OK)
        for (int32_t b = 0; b < B; b++) sessions[b]->n_past++;
    pthread_mutex_unlock(&m->lock);
    return st;
}
