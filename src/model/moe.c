/*
 * The mixture-of-experts FFN of one layer for a batch of rows (GGUF-FACTS §3.3-3.12):
 * router logits -> per-row top-k experts and weights (the architecture's rule) -> rows grouped by
 * expert -> each expert's gate/up/down on its rows -> weighted outputs summed per row in top-k
 * slot order (llama.cpp's order), plus the shared expert where the architecture has one.
 *
 * Where expert weights come from is the expert cache's business (src/experts/cache.h): with a
 * cache, experts are requested per layer and computed in the order they become resident, so
 * compute overlaps the reads of the missing ones; without one (--experts mmap) they are read
 * through the mapping. The per-slot output buffer makes the result independent of that order —
 * the budget never changes the output.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "experts/cache.h"
#include "model/moe.h"
#include "model/ops.h"
#include "model/session.h"

/* softmax of n values in place, as ggml's soft_max (max-subtract, sum in double) */
static void softmax(float *v, int32_t n) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        v[i] = expf(v[i] - mx);
        sum += (double)v[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int32_t i = 0; i < n; i++) v[i] *= inv;
}

/* indices of the k largest values, largest first (ties: lower index first) */
static void top_k(const float *v, int32_t n, int32_t k, int32_t *idx) {
    for (int32_t j = 0; j < k; j++) idx[j] = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t j = k;
        while (j > 0 && (idx[j - 1] < 0 || v[i] > v[idx[j - 1]])) j--;
        if (j >= k) continue;
        memmove(idx + j + 1, idx + j, (size_t)(k - j - 1) * sizeof *idx);
        idx[j] = i;
    }
}

void tr_moe_route(const tr_model *m, float *logits, int32_t *sel, float *w) {
    const tr_hparams *hp = &m->hp;
    const int32_t n = hp->n_expert, k = hp->n_expert_used;
    if (m->arch->route == TR_ROUTE_TOPK_SOFTMAX) {
        top_k(logits, n, k, sel);
        for (int32_t j = 0; j < k; j++) w[j] = logits[sel[j]];
        softmax(w, k);
        return;
    }
    softmax(logits, n); /* the row becomes probabilities (it is scratch) */
    top_k(logits, n, k, sel);
    for (int32_t j = 0; j < k; j++) w[j] = logits[sel[j]];
    if (m->arch->route == TR_ROUTE_SOFTMAX_TOPK_NORM) {
        float s = 0.0f;
        for (int32_t j = 0; j < k; j++) s += w[j];
        if (s < 6.103515625e-5f) s = 6.103515625e-5f; /* llama.cpp's clamp */
        for (int32_t j = 0; j < k; j++) w[j] /= s;
    }
}

/* gate/up activation of experts: g = act(g) * u (in place) */
static void expert_act(const tr_model *m, float *g, const float *u, int64_t n) {
    switch (m->arch->expert_act) {
    case TR_ACT_GELU: tr_geglu(g, u, n); break;
    case TR_ACT_SWIGLU_OAI: {
        /* gpt-oss: clamp, then x * sigmoid(1.702 x) * (y + 1) */
        const float alpha = 1.702f, limit = 7.0f;
        for (int64_t i = 0; i < n; i++) {
            const float x = fminf(g[i], limit);
            const float y = fmaxf(fminf(u[i], limit), -limit);
            g[i] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
        }
        break;
    }
    default: tr_swiglu(g, u, n); break;
    }
}

static void add_rows_bias(float *y, const float *b, int32_t rows, int64_t n) {
    if (!b) return;
    for (int32_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) y[(size_t)r * n + i] += b[i];
}

static tr_status bad_values(const tr_model *m, int32_t l, const char *what, int32_t e,
                            tr_error *err) {
    tr_status s = tr_gguf_mapping_check(m->gguf, err);
    if (s) return s;
    char which[32] = "";
    if (e >= 0) snprintf(which, sizeof which, " %d", e);
    return tr_fail(err, TR_E_FORMAT,
                   "%s: non-finite values (NaN or Inf) in layer %d's %s%s (tensors blk.%d.%s): the "
                   "model's weights are corrupt",
                   tr_gguf_shard_path(m->gguf, 0), l, what, which, l,
                   e >= 0              ? "ffn_gate_exps, ffn_up_exps"
                   : what[0] == 's'    ? "ffn_gate_shexp, ffn_up_shexp"
                                       : "ffn_gate_inp.weight");
}

/* y = W x over an expert's gathered rows (list: their row * K + slot entries, ascending), one
 * product per run of rows in one group of the pass, so that each row is computed as its session
 * alone would compute it */
static void expert_matmul(tr_model *m, tr_scratch *sc, const tr_mat *W, const float *x,
                          int32_t rows, float *y, const int32_t *list, int32_t K) {
    for (int32_t i0 = 0, i1; i0 < rows; i0 = i1) {
        const int32_t g = tr_fwd_group_of(sc, list[i0] / K);
        i1 = i0 + 1;
        while (g >= 0 && i1 < rows && tr_fwd_group_of(sc, list[i1] / K) == g) i1++;
        if (g < 0) i1 = rows;
        tr_fwd_matmul_group(m, sc, W, x + (size_t)i0 * W->n_in, i1 - i0,
                            y + (size_t)i0 * W->n_out, g);
    }
}

/* one expert on its rows: gather inputs, gate/up/act/down, scatter to the rows' slots; false if
 * the activation going into the down projection is not finite (its quantizer would hide it) */
static bool run_expert(tr_model *m, tr_scratch *sc, const tr_layer *L, int32_t e,
                       const void *const part[3], int32_t rows) {
    const tr_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, K = hp->n_expert_used;
    const int32_t *list = sc->moe_rows + sc->moe_off[e];
    for (int32_t i = 0; i < rows; i++)
        memcpy(sc->moe_in + (size_t)i * E, sc->xn + (size_t)(list[i] / K) * E, (size_t)E * 4);
    const tr_mat wg = {L->gate_exps.type, E, F, part[0], L->gate_exps.row_bytes};
    const tr_mat wu = {L->up_exps.type, E, F, part[1], L->up_exps.row_bytes};
    const tr_mat wd = {L->down_exps.type, F, E, part[2], L->down_exps.row_bytes};
    expert_matmul(m, sc, &wg, sc->moe_in, rows, sc->g, list, (int32_t)K);
    expert_matmul(m, sc, &wu, sc->moe_in, rows, sc->u, list, (int32_t)K);
    add_rows_bias(sc->g, L->gate_exps.bias ? L->gate_exps.bias + (size_t)e * F : NULL, rows, F);
    add_rows_bias(sc->u, L->up_exps.bias ? L->up_exps.bias + (size_t)e * F : NULL, rows, F);
    expert_act(m, sc->g, sc->u, (int64_t)rows * F);
    if (!tr_all_finite(sc->g, (int64_t)rows * F)) return false;
    expert_matmul(m, sc, &wd, sc->g, rows, sc->moe_in, list, (int32_t)K);
    add_rows_bias(sc->moe_in, L->down_exps.bias ? L->down_exps.bias + (size_t)e * E : NULL, rows, E);
    /* weighted output into the (row, slot) it belongs to: list entries are row * K + slot */
    for (int32_t i = 0; i < rows; i++) {
        const int32_t rs = list[i];
        const float w = sc->moe_w[rs];
        float *dst = sc->moe_slot + (size_t)rs * E;
        const float *src = sc->moe_in + (size_t)i * E;
        for (int64_t j = 0; j < E; j++) dst[j] = src[j] * w;
    }
    return true;
}

/* Lookahead: apply the next MoE layer's router to this layer's FFN input (the residual stream
 * changes little from one layer to the next, so its router's choice is a good guess). Prefetch
 * starts reading the top predicted experts while this layer computes; protection keeps the
 * predicted experts that are resident from being evicted by this layer's misses, reading
 * nothing. Decode only (few rows). */
static void predict_next(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows) {
    const tr_hparams *hp = &m->hp;
    int32_t ln = l + 1;
    while (ln < hp->n_layer && !m->layers[ln].moe) ln++;
    if (ln >= hp->n_layer) return;
    const tr_layer *N = &m->layers[ln];
    const int64_t E = hp->n_embd;
    const int32_t NE = hp->n_expert;
    int32_t want = m->expert_prefetch > hp->n_expert_used ? m->expert_prefetch : hp->n_expert_used;
    if (want > NE) want = NE;
    for (int32_t r = 0; r < rows; r++) {
        float *xn = sc->moe_in + (size_t)r * E;
        tr_rmsnorm(xn, sc->x + (size_t)r * E, N->ffn_norm, E, hp->rms_eps);
        if (N->ffn_norm_b)
            for (int64_t j = 0; j < E; j++) xn[j] += N->ffn_norm_b[j];
    }
    tr_matmul(m->pool, m->kern, &N->router, sc->moe_in, rows, sc->moe_logits, sc->mm);
    add_rows_bias(sc->moe_logits, N->router_b, rows, NE);
    int32_t n = 0;
    for (int32_t r = 0; r < rows && n < (int32_t)(sizeof m->pred / sizeof m->pred[0]); r++) {
        int32_t top[64];
        top_k(sc->moe_logits + (size_t)r * NE, NE, want > 64 ? 64 : want, top);
        for (int32_t j = 0; j < want && j < 64; j++) {
            bool dup = false;
            for (int32_t i = 0; i < n; i++) dup |= m->pred[i] == top[j];
            if (!dup && n < (int32_t)(sizeof m->pred / sizeof m->pred[0])) m->pred[n++] = top[j];
        }
    }
    m->pred_layer = ln;
    m->pred_n = n;
    if (m->expert_lookahead) tr_expert_cache_protect(m->experts, ln, m->pred, n);
    /* the first experts of the list are the router's most likely (one row: its top-k order) */
    if (m->expert_prefetch <= 0) return;
    const int32_t np = n < m->expert_prefetch ? n : m->expert_prefetch;
    if (!m->prefetch_auto) {
        tr_expert_cache_prefetch(m->experts, ln, m->pred, np);
        return;
    }
    /* auto: read an absent prediction ahead when absent predictions of its rank were used at
     * least half the time (Laplace estimate, so a rank starts at one half, read): a read that is
     * used hides one demand read, one that is not costs one read of disk time and one eviction */
    uint64_t read = 0;
    for (int32_t j = 0; j < np && j < 64; j++)
        if (2.0f * (m->rank_used[j] + 1.0f) >= m->rank_absent[j] + 2.0f) read |= (uint64_t)1 << j;
    m->pred_absent = tr_expert_cache_prefetch_some(m->experts, ln, m->pred, np, read);
}

/* the outcome of the read-ahead decision for layer l's prediction: was each absent prediction
 * chosen by some row? Counts decay (halved at 32) so the rate follows the routing as it shifts */
static void score_absent(tr_model *m, const int32_t *sel, int32_t n_sel) {
    for (uint64_t b = m->pred_absent; b; b &= b - 1) {
        const int j = __builtin_ctzll(b);
        bool used = false;
        for (int32_t i = 0; i < n_sel && !used; i++) used = sel[i] == m->pred[j];
        if (m->rank_absent[j] >= 32.0f) {
            m->rank_absent[j] *= 0.5f;
            m->rank_used[j] *= 0.5f;
        }
        m->rank_absent[j] += 1.0f;
        m->rank_used[j] += used ? 1.0f : 0.0f;
    }
    m->pred_absent = 0;
}

tr_status tr_moe_ffn(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows, float *out,
                     tr_error *err) {
    const tr_hparams *hp = &m->hp;
    const tr_layer *L = &m->layers[l];
    const int32_t K = hp->n_expert_used, NE = hp->n_expert;
    const int64_t E = hp->n_embd;

    /* router (F32 activations, as llama.cpp) and the per-row choice */
    tr_fwd_matmul(m, sc, &L->router, sc->xn, rows, sc->moe_logits);
    add_rows_bias(sc->moe_logits, L->router_b, rows, NE);
    /* a NaN among the router's logits would leave top-k without a choice (and the grouping
     * below with an index of -1): checked once per row, with the probabilities it gives */
    if (!tr_all_finite(sc->moe_logits, (int64_t)rows * NE))
        return bad_values(m, l, "router logits", -1, err);
    for (int32_t r = 0; r < rows; r++)
        tr_moe_route(m, sc->moe_logits + (size_t)r * NE, sc->moe_sel + (size_t)r * K,
                     sc->moe_w + (size_t)r * K);
    if (!tr_all_finite(sc->moe_w, (int64_t)rows * K))
        return bad_values(m, l, "router's expert probabilities", -1, err);
    /* one layer visit for the policies, with every row's choice (duplicates are fine) */
    if (m->experts) tr_expert_cache_observe(m->experts, l, sc->moe_sel, sc->moe_w, rows * K, NULL);
    if (m->route_hook)
        m->route_hook(m->route_hook_user, l, rows, sc->row_pos, sc->moe_sel, sc->moe_w, K);
    /* how good was the prediction made for this layer? (predicted experts the router chose) */
    if (m->pred_layer == l && m->pred_n > 0) {
        for (int32_t i = 0; i < rows * K; i++)
            for (int32_t j = 0; j < m->pred_n; j++)
                if (sc->moe_sel[i] == m->pred[j]) {
                    m->prefetch_correct++;
                    break;
                }
        m->prefetch_predicted += (uint64_t)rows * (uint64_t)K;
        if (m->prefetch_auto) score_absent(m, sc->moe_sel, rows * K);
        m->pred_n = 0;
    }

    /* group (row, slot) pairs by expert: counting sort, rows ascending within an expert */
    memset(sc->moe_off, 0, (size_t)(NE + 1) * sizeof *sc->moe_off);
    for (int32_t i = 0; i < rows * K; i++) sc->moe_off[sc->moe_sel[i] + 1]++;
    for (int32_t e = 0; e < NE; e++) sc->moe_off[e + 1] += sc->moe_off[e];
    int32_t *fill = sc->moe_fill;
    memcpy(fill, sc->moe_off, (size_t)NE * sizeof *fill);
    for (int32_t i = 0; i < rows * K; i++) sc->moe_rows[fill[sc->moe_sel[i]]++] = i;

    int32_t n_used = 0;
    for (int32_t e = 0; e < NE; e++)
        if (sc->moe_off[e + 1] > sc->moe_off[e]) sc->moe_used[n_used++] = e;

    if (!m->experts) {
        for (int32_t u = 0; u < n_used; u++) {
            const int32_t e = sc->moe_used[u];
            const void *part[3] = {L->gate_exps.base + (size_t)e * L->gate_exps.expert_bytes,
                                   L->up_exps.base + (size_t)e * L->up_exps.expert_bytes,
                                   L->down_exps.base + (size_t)e * L->down_exps.expert_bytes};
            if (!run_expert(m, sc, L, e, part, sc->moe_off[e + 1] - sc->moe_off[e]))
                return bad_values(m, l, "expert", e, err);
        }
    } else {
        /* at most top-k experts per request: the smallest legal budget holds exactly that */
        for (int32_t u0 = 0; u0 < n_used; u0 += K) {
            const int32_t n = n_used - u0 < K ? n_used - u0 : K;
            tr_expert_request *req = &sc->moe_req;
            tr_status st = tr_expert_cache_acquire(m->experts, l, sc->moe_used + u0, n, req, err);
            if (st) return st;
            /* the next layer's prediction once this layer's misses are on their way (and its
             * experts pinned, so a prefetch cannot evict them): its router runs while they load */
            if (u0 == 0 && (m->expert_prefetch > 0 || m->expert_lookahead) && rows <= 4)
                predict_next(m, sc, l, rows);
            for (;;) {
                int32_t idx;
                st = tr_expert_cache_next_ready(m->experts, req, &idx, err);
                if (st || idx < 0) break;
                const int32_t e = req->experts[idx];
                const void *part[3] = {req->data[idx][0], req->data[idx][1], req->data[idx][2]};
                if (!run_expert(m, sc, L, e, part, sc->moe_off[e + 1] - sc->moe_off[e])) {
                    tr_expert_cache_release(m->experts, req);
                    return bad_values(m, l, "expert", e, err);
                }
            }
            tr_expert_cache_release(m->experts, req);
            if (st) return st;
        }
    }

    /* sum the slots in order, as llama.cpp adds the weighted expert outputs */
    for (int32_t r = 0; r < rows; r++) {
        float *o = out + (size_t)r * E;
        const float *s0 = sc->moe_slot + (size_t)r * K * E;
        memcpy(o, s0, (size_t)E * sizeof *o);
        for (int32_t k = 1; k < K; k++) {
            const float *sk = s0 + (size_t)k * E;
            for (int64_t j = 0; j < E; j++) o[j] += sk[j];
        }
    }

    /* shared expert: out += sigmoid(gate . x) * down(act(gate x) * up x) */
    if (L->shexp_gate.data) {
        const int64_t F = hp->n_ff_shexp;
        tr_fwd_matmul(m, sc, &L->shexp_gate, sc->xn, rows, sc->g);
        tr_fwd_matmul(m, sc, &L->shexp_up, sc->xn, rows, sc->u);
        expert_act(m, sc->g, sc->u, (int64_t)rows * F);
        if (!tr_all_finite(sc->g, (int64_t)rows * F))
            return bad_values(m, l, "shared expert", -1, err);
        tr_fwd_matmul(m, sc, &L->shexp_down, sc->g, rows, sc->moe_in);
        for (int32_t r = 0; r < rows; r++) {
            float gate = 1.0f;
            if (L->shexp_gate_inp) {
                double z = 0.0;
                for (int64_t j = 0; j < E; j++)
                    z += (double)(L->shexp_gate_inp[j] * sc->xn[(size_t)r * E + j]);
                gate = 1.0f / (1.0f + expf(-(float)z));
            }
            float *o = out + (size_t)r * E;
            const float *sh = sc->moe_in + (size_t)r * E;
            for (int64_t j = 0; j < E; j++) o[j] += sh[j] * gate;
        }
    }
    return TR_OK;
}
