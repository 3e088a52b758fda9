/*
 * --route-trace FILE: every routing decision of a MoE model, in the CSV format of the shared
 * Qwen3-30B trace (src/experts/trace.h), so `terrace replay` can study cache policies on what the
 * model really did. One row per (token, layer, slot): phase 0 for tokens computed in a batch
 * (prefill), 1 for single-token steps (decode); residency = the expert was already resident when
 * it was requested; expert_bytes = what it cost to read (0 when resident).
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "experts/cache.h"
#include "experts/trace.h"
#include "model/model.h"

typedef struct route_trace {
    tr_model *m;
    tr_trace_writer *w;
    uint64_t *expert_bytes; /* per layer */
    tr_status status;       /* first write error (reported at close) */
    tr_error err;
} route_trace;

static void hook(void *user, int32_t layer, int32_t rows, const int32_t *pos, const int32_t *sel,
                 const float *w, int32_t k) {
    route_trace *t = user;
    tr_model *m = t->m;
    if (t->status) return;
    for (int32_t r = 0; r < rows; r++) {
        for (int32_t s = 0; s < k; s++) {
            const int32_t e = sel[r * k + s];
            const bool resident = m->experts && tr_expert_cache_is_resident(m->experts, layer, e);
            const tr_trace_row row = {
                .turn = m->trace_turn,
                .phase = rows > 1 ? 0 : 1,
                .step = pos[r],
                .layer = layer,
                .slot = s,
                .expert = e,
                .weight = w[r * k + s],
                .residency = resident,
                .expert_bytes = resident ? 0 : t->expert_bytes[layer],
            };
            t->status = tr_trace_write_row(t->w, &row, &t->err);
            if (t->status) return;
        }
    }
}

tr_status tr_model_route_trace_open(tr_model *m, const char *path, tr_error *err) {
    const tr_hparams *hp = &m->hp;
    if (hp->n_expert == 0)
        return tr_fail(err, TR_E_ARG, "--route-trace: %s is not a mixture-of-experts model",
                       m->arch_name);
    route_trace *t = calloc(1, sizeof *t);
    uint64_t *dense = calloc((size_t)hp->n_layer, sizeof *dense);
    if (!t || !dense || !(t->expert_bytes = calloc((size_t)hp->n_layer, sizeof *t->expert_bytes))) {
        free(t);
        free(dense);
        return tr_fail(err, TR_E_NOMEM, "out of memory");
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const tr_layer *L = &m->layers[l];
        if (L->moe)
            t->expert_bytes[l] = L->gate_exps.expert_bytes + L->up_exps.expert_bytes +
                                 L->down_exps.expert_bytes;
        const tr_mat *d[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->router, &L->ffn_gate,
                             &L->ffn_up, &L->ffn_down, &L->shexp_gate, &L->shexp_up, &L->shexp_down};
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
            if (d[i]->data) dense[l] += d[i]->row_bytes * (uint64_t)d[i]->n_out;
    }
    const tr_trace_info info = {
        .model = tr_gguf_shard_path(m->gguf, 0),
        .arch = m->arch_name,
        .n_layer = hp->n_layer,
        .n_expert = hp->n_expert,
        .n_expert_used = hp->n_expert_used,
        .expert_bytes = t->expert_bytes,
        .dense_bytes = dense,
    };
    tr_status s = tr_trace_writer_open(path, &info, &t->w, err);
    free(dense);
    if (s) {
        free(t->expert_bytes);
        free(t);
        return s;
    }
    t->m = m;
    m->route_hook = hook;
    m->route_hook_user = t;
    return TR_OK;
}

tr_status tr_model_route_trace_close(tr_model *m, tr_error *err) {
    route_trace *t = m->route_hook == hook ? m->route_hook_user : NULL;
    if (!t) return TR_OK;
    m->route_hook = NULL;
    m->route_hook_user = NULL;
    tr_status s = t->status;
    if (s) tr_fail(err, s, "--route-trace: %s", t->err.msg);
    tr_status c = tr_trace_writer_close(t->w, s ? NULL : err);
    free(t->expert_bytes);
    free(t);
    return s ? s : c;
}
