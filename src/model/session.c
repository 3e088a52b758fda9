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
    return (tr_session_params){
        .n_ctx = 0, .n_batch = 0, .kv_sink = -1, .kv_window = -1, .kv_tail_min = -1.0f,
        .kv_beta = -1.0f};
}

static uint64_t kv_bytes_of(const tr_model *m, int32_t n_ctx) {
    const tr_hparams *hp = &m->hp;
    return (uint64_t)hp->n_layer * (uint64_t)n_ctx * hp->n_head_kv_max *
           (uint64_t)(hp->head_dim_k + hp->head_dim_v) * 2;
}

/* a session's KV policy from its parameters: NULL kv for full (the forward pass's own arrays) */
static tr_status create_kv(const tr_model *m, const tr_session_params *p, struct tr_kv **out,
                           int *policy, tr_error *err) {
    *out = NULL;
    tr_kv_policy pol = TR_KV_FULL;
    if (p->kv_policy && tr_kv_policy_parse(p->kv_policy, &pol, err)) return TR_E_ARG;
    *policy = (int)pol;
    if (pol == TR_KV_FULL) return TR_OK;
    const tr_hparams *hp = &m->hp;
    const tr_kv_shape shape = {hp->n_layer, p->n_ctx, hp->n_head_max, hp->n_head_kv_max,
                               hp->head_dim_k, hp->head_dim_v};
    tr_kv_params kp = tr_kv_default_params();
    kp.policy = pol;
    if (p->kv_alpha > 0) kp.alpha = p->kv_alpha;
    if (p->kv_sink >= 0) kp.n_sink = p->kv_sink;
    if (p->kv_window >= 0) kp.n_window = p->kv_window;
    if (p->kv_score_bits) kp.score_bits = p->kv_score_bits;
    kp.tail_bits = p->kv_tail_bits;
    if (p->kv_tail_min >= 0.0f) kp.tail_min = p->kv_tail_min;
    kp.hot_bytes = p->kv_hot_bytes;
    kp.cold_dir = p->kv_cold_dir;
    kp.keep = p->kv_keep;
    if (p->kv_bkp && tr_kv_bkp_parse(p->kv_bkp, &kp.bkp, err)) return TR_E_ARG;
    kp.csd = p->csd;
    kp.csd_socket = p->csd_socket;
    kp.csd_chunk = p->csd_chunk;
    kp.csd_gbps = p->csd_gbps;
    kp.csd_gflops = p->csd_gflops;
    kp.csd_link_gbps = p->csd_link_gbps;
    kp.beta = p->kv_beta;
    kp.host_keys = p->kv_host_keys;
    kp.max_rows = p->n_batch; /* a batch's rows are appended before they attend */
    kp.app_f_c = p->kv_app_f_c;
    kp.app_f_s = p->kv_app_f_s;
    kp.app_b_c = p->kv_app_b_c;
    kp.app_b_s = p->kv_app_b_s;
    kp.spec = p->kv_spec;
    for (int32_t l = 0; l < hp->n_layer; l++)
        if (m->layers[l].n_head != hp->n_head_max || m->layers[l].n_head_kv != hp->n_head_kv_max)
            return tr_fail(err, TR_E_UNSUPPORTED,
                           "--kv-policy %s needs the same head counts in every layer",
                           tr_kv_policy_name(pol));
    return tr_kv_create(&shape, &kp, out, err);
}

void tr_session_get_kv_stats(const tr_session *s, tr_session_kv_stats *out) {
    memset(out, 0, sizeof *out);
    out->policy = "full";
    out->tokens = s->n_past;
    if (!s->kv) {
        out->hot_bytes = s->n_past > 0 ? kv_bytes_of(s->m, s->n_past) : 0;
        return;
    }
    tr_kv_stats st;
    tr_kv_get_stats(s->kv, &st);
    out->managed = true;
    out->policy = tr_kv_policy_name((tr_kv_policy)s->kv_policy);
    out->tokens = st.tokens;
    out->hot_bytes = st.hot_bytes;
    out->cold_bytes = st.cold_bytes;
    out->selected = st.selected;
    out->bytes_read = st.bytes_read;
    out->score_ms = (double)st.score_ns / 1e6;
    out->attn_ms = (double)st.attn_ns / 1e6;
    out->promotions = st.promotions;
    out->demotions = st.demotions;
    out->pingpong = st.pingpong;
    out->migrated_bytes = st.migrated_bytes;
    out->sel_hot = st.sel_hot;
    out->sel_cold = st.sel_cold;
    out->sel_repeat = st.sel_follow ? (double)st.sel_repeat / (double)st.sel_follow : 0.0;
    out->csd_score_bytes = st.csd_score_bytes;
    out->csd_row_bytes = st.csd_row_bytes;
    out->csd_storage_bytes = st.csd_storage_bytes;
    out->beta = st.beta;
    out->beta_split = st.beta_split;
    out->f_c = st.f_c;
    out->f_s = st.f_s;
    out->b_c = st.b_c;
    out->b_s = st.b_s;
    out->tail_share = st.tail_rows ? st.tail_share_sum / (double)st.tail_rows : 0.0;
    out->spec_rows = st.spec_rows;
    out->spec_early = st.spec_early;
    out->spec_cos = st.spec_rows ? st.spec_cos_sum / (double)st.spec_rows : 0.0;
    out->tail_kept = st.tail_cand ? (double)st.tail_kept / (double)st.tail_cand : 0.0;
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
static size_t scratch_plan(const tr_model *m, int32_t n_ctx, int32_t n_batch, int nth, bool spec,
                           char *base, tr_scratch *sc) {
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
    const size_t attn_floats = (tr_attn_scratch_floats(n_ctx, hp->head_dim_k, hp->head_dim_v) + 15) & ~(size_t)15;
    if (base) sc->attn_floats = attn_floats;
    TAKE(attn_scratch, (size_t)nth * attn_floats * 4);
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

uint64_t tr_session_estimate_default(const tr_model *m) {
    tr_session_params p = tr_session_default_params();
    resolve_params(m, &p);
    tr_scratch dummy;
    const int nth = m->pool ? tr_pool_size(m->pool) : tr_cpu_physical_cores();
    return kv_bytes_of(m, p.n_ctx) + scratch_plan(m, p.n_ctx, p.n_batch, nth, false, NULL, &dummy);
}

tr_status tr_session_create(tr_model *m, const tr_session_params *params, tr_session **out,
                            tr_error *err) {
    *out = NULL;
    tr_session_params p = params ? *params : tr_session_default_params();
    resolve_params(m, &p);
    if (p.n_ctx > (1 << 24))
        return tr_fail(err, TR_E_ARG, "context of %d tokens is out of range", p.n_ctx);
    const tr_hparams *hp = &m->hp;
    tr_session *s = calloc(1, sizeof *s);
    if (!s) return tr_fail(err, TR_E_NOMEM, "out of memory");
    s->m = m;
    s->n_ctx = p.n_ctx;
    s->n_batch = p.n_batch;
    s->layer_k_elems = (size_t)p.n_ctx * hp->n_head_kv_max * hp->head_dim_k;
    s->layer_v_elems = (size_t)p.n_ctx * hp->n_head_kv_max * hp->head_dim_v;
    tr_status kst = create_kv(m, &p, &s->kv, &s->kv_policy, err);
    if (kst) {
        tr_session_free(s);
        return kst;
    }
    /* a managed KV cache keeps K/V itself: the session's arrays are not needed */
    const uint64_t kv_bytes = s->kv ? 0 : kv_bytes_of(m, p.n_ctx);
    const int nth = tr_pool_size(m->pool);
    tr_scratch *sc = &s->sc;
    s->kv_spec = s->kv && p.kv_spec;
    const size_t scratch = scratch_plan(m, p.n_ctx, p.n_batch, nth, s->kv_spec, NULL, sc);
    s->bytes = kv_bytes + scratch;
    if (kv_bytes) s->kvmem = aligned_alloc(64, (kv_bytes + 63) & ~(uint64_t)63);
    s->scratch_mem = aligned_alloc(64, (scratch + 63) & ~(size_t)63);
    if ((kv_bytes && !s->kvmem) || !s->scratch_mem) {
        char need[64];
        snprintf(need, sizeof need, "%.1f MiB", (double)s->bytes / (1024.0 * 1024.0));
        tr_session_free(s);
        return tr_fail(err, TR_E_NOMEM,
                       "cannot allocate the session: it needs %s (KV cache %" PRIu64 " MiB for %d "
                       "tokens + %zu MiB scratch for batches of %d); lower -c or -b",
                       need, kv_bytes >> 20, p.n_ctx, scratch >> 20, p.n_batch);
    }
    scratch_plan(m, p.n_ctx, p.n_batch, nth, s->kv_spec, s->scratch_mem, sc);
    sc->rows = p.n_batch;
    sc->n_ctx_cap = p.n_ctx;
    sc->nth = nth;
    *out = s;
    return TR_OK;
}

void tr_session_free(tr_session *s) {
    if (!s) return;
    tr_kv_free(s->kv);
    free(s->kvmem);
    free(s->scratch_mem);
    free(s);
}

uint64_t tr_session_bytes(const tr_session *s) {
    if (!s->kv) return s->bytes;
    tr_kv_stats st;
    tr_kv_get_stats(s->kv, &st);
    return s->bytes + st.hot_bytes;
}
int32_t tr_session_n_ctx(const tr_session *s) { return s->n_ctx; }
int32_t tr_session_n_past(const tr_session *s) { return s->n_past; }

void tr_session_set_abort(tr_session *s, tr_abort_fn fn, void *user) {
    s->abort_fn = fn;
    s->abort_user = user;
}

tr_status tr_session_truncate(tr_session *s, int32_t n, tr_error *err) {
    if (n < 0 || n > s->n_past)
        return tr_fail(err, TR_E_ARG, "cannot truncate to %d tokens (session holds %d)", n,
                       s->n_past);
    if (s->kv) {
        tr_status st = tr_kv_truncate(s->kv, n, err);
        if (st) return st;
    }
    s->n_past = n; /* later positions are overwritten before they are read again */
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
        if ((sessions[b]->kv != NULL) != (s0->kv != NULL))
            return tr_fail(err, TR_E_ARG, "sequence %d uses another kind of KV cache than the "
                           "first (mix --kv-policy full and the others in separate batches)", b);
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
