/*
 * Model loading: hyperparameters from "<arch>.*" keys (GGUF-FACTS §3.1) with llama.cpp's
 * defaults, validated before anything is sized by them; weights bound by name with their shapes
 * and types checked; the file mapped read-only (or copied into memory with no_mmap).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <unistd.h>

#include "core/error.h"
#include "experts/cache.h"
#include "model/session.h"
#include "model/model.h"
#include "tensor/types.h"

#define MAX_LAYERS 100000 /* sanity bound on a value read from the file, not a fixed table */

static bool key_lookup(const tr_model *m, const char *suffix, int64_t *idx) {
    char key[256];
    snprintf(key, sizeof key, "%s.%s", m->arch_name, suffix);
    *idx = tr_gguf_find_key(m->gguf, key);
    return *idx >= 0;
}

bool tr_model_has_key(const tr_model *m, const char *suffix) {
    int64_t i;
    return key_lookup(m, suffix, &i);
}

bool tr_model_key_int(const tr_model *m, const char *suffix, int64_t *out) {
    int64_t i;
    return key_lookup(m, suffix, &i) && tr_gguf_get_int(m->gguf, i, out);
}

bool tr_model_key_float(const tr_model *m, const char *suffix, float *out) {
    int64_t i;
    double d;
    if (!key_lookup(m, suffix, &i) || !tr_gguf_get_float(m->gguf, i, &d)) return false;
    *out = (float)d;
    return true;
}

static tr_status need_int(const tr_model *m, const char *suffix, int64_t lo, int64_t hi,
                          int64_t *out, tr_error *err) {
    int64_t i;
    if (!key_lookup(m, suffix, &i))
        return tr_fail(err, TR_E_FORMAT, "missing hyperparameter %s.%s", m->arch_name, suffix);
    if (!tr_gguf_get_int(m->gguf, i, out))
        return tr_fail(err, TR_E_FORMAT, "hyperparameter %s.%s is not an integer (%s)",
                       m->arch_name, suffix, tr_gguf_vtype_name(tr_gguf_kv_type(m->gguf, i)));
    if (*out < lo || *out > hi)
        return tr_fail(err, TR_E_FORMAT, "hyperparameter %s.%s = %" PRId64 " is out of range (%" PRId64
                       "..%" PRId64 ")", m->arch_name, suffix, *out, lo, hi);
    return TR_OK;
}

/* a key that is either one integer or an array with one entry per layer (get_key_or_arr) */
static tr_status per_layer(tr_model *m, const char *suffix, int64_t dflt, bool required,
                           int64_t lo, int64_t hi, int32_t *out, tr_error *err) {
    const int32_t n = m->hp.n_layer;
    int64_t i;
    if (!key_lookup(m, suffix, &i)) {
        if (required)
            return tr_fail(err, TR_E_FORMAT, "missing hyperparameter %s.%s", m->arch_name, suffix);
        for (int32_t l = 0; l < n; l++) out[l] = (int32_t)dflt;
        return TR_OK;
    }
    if (tr_gguf_kv_type(m->gguf, i) == TR_GGUF_ARRAY) {
        const tr_gguf_vtype et = tr_gguf_arr_type(m->gguf, i);
        if (tr_gguf_arr_len(m->gguf, i) != (uint64_t)n ||
            (et != TR_GGUF_U32 && et != TR_GGUF_I32))
            return tr_fail(err, TR_E_FORMAT,
                           "hyperparameter %s.%s is an array of %" PRIu64 " %s values; expected %d "
                           "32-bit integers (one per layer)",
                           m->arch_name, suffix, tr_gguf_arr_len(m->gguf, i),
                           tr_gguf_vtype_name(et), n);
        const uint8_t *d = tr_gguf_arr_data(m->gguf, i);
        for (int32_t l = 0; l < n; l++) {
            int64_t v;
            if (et == TR_GGUF_U32) {
                uint32_t u;
                memcpy(&u, d + 4 * l, 4);
                v = u;
            } else {
                int32_t s;
                memcpy(&s, d + 4 * l, 4);
                v = s;
            }
            if (v < lo || v > hi)
                return tr_fail(err, TR_E_FORMAT, "%s.%s[%d] = %" PRId64 " is out of range",
                               m->arch_name, suffix, l, v);
            out[l] = (int32_t)v;
        }
        return TR_OK;
    }
    int64_t v;
    tr_status s = need_int(m, suffix, lo, hi, &v, err);
    if (s) return s;
    for (int32_t l = 0; l < n; l++) out[l] = (int32_t)v;
    return TR_OK;
}

static tr_status load_hparams(tr_model *m, int32_t *n_head, int32_t *n_head_kv, int32_t *n_ff,
                              tr_error *err) {
    tr_hparams *hp = &m->hp;
    int64_t v;
    tr_status s;
    if ((s = need_int(m, "embedding_length", 1, 1 << 20, &v, err))) return s;
    hp->n_embd = (int32_t)v;
    if ((s = per_layer(m, "attention.head_count", 0, true, 1, 1 << 16, n_head, err))) return s;
    if ((s = per_layer(m, "feed_forward_length", 0, false, 0, 1 << 24, n_ff, err))) return s;
    int64_t kv_idx;
    if (key_lookup(m, "attention.head_count_kv", &kv_idx)) {
        if ((s = per_layer(m, "attention.head_count_kv", 0, true, 1, 1 << 16, n_head_kv, err)))
            return s;
    } else {
        memcpy(n_head_kv, n_head, (size_t)hp->n_layer * sizeof *n_head);
    }
    hp->n_head_max = hp->n_head_kv_max = hp->n_ff_max = 0;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        if (n_head[l] % n_head_kv[l] != 0)
            return tr_fail(err, TR_E_FORMAT,
                           "layer %d: %d attention heads is not a multiple of %d KV heads", l,
                           n_head[l], n_head_kv[l]);
        if (n_head[l] > hp->n_head_max) hp->n_head_max = n_head[l];
        if (n_head_kv[l] > hp->n_head_kv_max) hp->n_head_kv_max = n_head_kv[l];
        if (n_ff[l] > hp->n_ff_max) hp->n_ff_max = n_ff[l];
    }
    /* mixture of experts */
    hp->n_expert = hp->n_expert_used = hp->n_ff_exp = hp->n_ff_shexp = 0;
    if (tr_model_key_int(m, "expert_count", &v) && v > 0) {
        if (v > 65536)
            return tr_fail(err, TR_E_FORMAT, "%s.expert_count = %" PRId64 " is out of range",
                           m->arch_name, v);
        hp->n_expert = (int32_t)v;
        if ((s = need_int(m, "expert_used_count", 1, hp->n_expert < 64 ? hp->n_expert : 64, &v,
                          err)))
            return s;
        hp->n_expert_used = (int32_t)v;
        if (m->arch->expert_ff_key) {
            int64_t w = n_ff[0] / hp->n_expert_used; /* llama.cpp's default */
            tr_model_key_int(m, "expert_feed_forward_length", &w);
            if (w <= 0 || w > (1 << 24))
                return tr_fail(err, TR_E_FORMAT, "missing or bad %s.expert_feed_forward_length",
                               m->arch_name);
            hp->n_ff_exp = (int32_t)w;
        } else {
            hp->n_ff_exp = n_ff[0];
        }
        int64_t sh = n_ff[0];
        tr_model_key_int(m, "expert_shared_feed_forward_length", &sh);
        hp->n_ff_shexp = (int32_t)(sh > 0 && sh < (1 << 24) ? sh : 0);
        if (hp->n_ff_exp > hp->n_ff_max) hp->n_ff_max = hp->n_ff_exp;
        if (hp->n_ff_shexp > hp->n_ff_max) hp->n_ff_max = hp->n_ff_shexp;
    }
    for (int32_t l = 0; l < hp->n_layer && hp->n_expert == 0; l++)
        if (n_ff[l] <= 0)
            return tr_fail(err, TR_E_FORMAT, "missing or zero %s.feed_forward_length (layer %d)",
                           m->arch_name, l);
    /* head dimensions: the keys when present, else n_embd / n_head; messages name where a value
     * came from, so they never name a key the file does not have */
    const int64_t hd_default = hp->n_embd / hp->n_head_max;
    char src_k[256], src_v[256];
    snprintf(src_k, sizeof src_k, "%s.embedding_length / %s.attention.head_count = %d / %d",
             m->arch_name, m->arch_name, hp->n_embd, hp->n_head_max);
    snprintf(src_v, sizeof src_v, "%s", src_k);
    int64_t hk = hd_default, hv = hd_default;
    if (tr_model_key_int(m, "attention.key_length", &hk))
        snprintf(src_k, sizeof src_k, "%s.attention.key_length", m->arch_name);
    if (tr_model_key_int(m, "attention.value_length", &hv))
        snprintf(src_v, sizeof src_v, "%s.attention.value_length", m->arch_name);
    if (hk <= 0 || hk > 4096)
        return tr_fail(err, TR_E_FORMAT, "key head dimension %" PRId64 " (%s) is out of range "
                       "(1..4096)", hk, src_k);
    if (hv <= 0 || hv > 4096)
        return tr_fail(err, TR_E_FORMAT, "value head dimension %" PRId64 " (%s) is out of range "
                       "(1..4096)", hv, src_v);
    hp->head_dim_k = (int32_t)hk;
    hp->head_dim_v = (int32_t)hv;
    int64_t rot = hp->head_dim_k;
    const bool rot_key = tr_model_key_int(m, "rope.dimension_count", &rot);
    if (rot <= 0 || rot > hp->head_dim_k || rot % 2) {
        if (rot_key)
            return tr_fail(err, TR_E_FORMAT,
                           "%s.rope.dimension_count = %" PRId64 " must be even, positive and at "
                           "most the key head dimension %d (%s)",
                           m->arch_name, rot, hp->head_dim_k, src_k);
        return tr_fail(err, TR_E_FORMAT,
                       "the key head dimension %d (%s) is odd: RoPE rotates pairs of dimensions",
                       hp->head_dim_k, src_k);
    }
    hp->n_rot = (int32_t)rot;
    if (!strcmp(m->arch->name, "llama") && hp->n_rot != hp->head_dim_k)
        return tr_fail(err, TR_E_FORMAT, "llama requires rope.dimension_count (%d) == head dim (%d)",
                       hp->n_rot, hp->head_dim_k);
    if ((s = need_int(m, "context_length", 1, INT32_MAX, &v, err))) return s;
    hp->n_ctx_train = (int32_t)v;

    if (!tr_model_key_float(m, "attention.layer_norm_rms_epsilon", &hp->rms_eps))
        return tr_fail(err, TR_E_FORMAT, "missing hyperparameter %s.attention.layer_norm_rms_epsilon",
                       m->arch_name);
    if (!(hp->rms_eps > 0.0f && hp->rms_eps < 1.0f))
        return tr_fail(err, TR_E_FORMAT, "%s.attention.layer_norm_rms_epsilon = %g is out of "
                       "range (0, 1)", m->arch_name, hp->rms_eps);

    hp->rope_base = 10000.0f;
    tr_model_key_float(m, "rope.freq_base", &hp->rope_base);
    hp->rope_base_swa = hp->rope_base;
    tr_model_key_float(m, "rope.freq_base_swa", &hp->rope_base_swa);
    if (!(hp->rope_base > 0.0f && hp->rope_base < INFINITY) ||
        !(hp->rope_base_swa > 0.0f && hp->rope_base_swa < INFINITY))
        return tr_fail(err, TR_E_FORMAT, "%s.rope.freq_base%s = %g is not a positive number",
                       m->arch_name, hp->rope_base > 0.0f && hp->rope_base < INFINITY ? "_swa" : "",
                       hp->rope_base > 0.0f && hp->rope_base < INFINITY ? hp->rope_base_swa
                                                                        : hp->rope_base);

    /* scaling: llama.cpp defaults the type to linear, forces freq_scale 1 for "none" */
    tr_str st = {0};
    char key[256];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch_name);
    hp->rope_scaling = TR_ROPE_SCALING_LINEAR;
    if (tr_gguf_kv_str(m->gguf, key, &st)) {
        if (st.len == 4 && !memcmp(st.ptr, "none", 4)) hp->rope_scaling = TR_ROPE_SCALING_NONE;
        else if (st.len == 6 && !memcmp(st.ptr, "linear", 6)) hp->rope_scaling = TR_ROPE_SCALING_LINEAR;
        else if (st.len == 4 && !memcmp(st.ptr, "yarn", 4)) hp->rope_scaling = TR_ROPE_SCALING_YARN;
        else
            return tr_fail(err, TR_E_UNSUPPORTED, "RoPE scaling type '%.*s' is not supported (none, "
                           "linear, yarn are)", (int)(st.len > 32 ? 32 : st.len), st.ptr);
    }
    float factor = 0.0f;
    if (!tr_model_key_float(m, "rope.scaling.factor", &factor))
        tr_model_key_float(m, "rope.scale_linear", &factor);
    hp->rope_freq_scale = (factor > 0.0f) ? 1.0f / factor : 1.0f;
    if (hp->rope_scaling == TR_ROPE_SCALING_NONE) hp->rope_freq_scale = 1.0f;
    hp->rope_n_ctx_orig = hp->n_ctx_train;
    if (tr_model_key_int(m, "rope.scaling.original_context_length", &v) && v > 0)
        hp->rope_n_ctx_orig = (int32_t)v;
    hp->yarn_ext_factor = hp->rope_scaling == TR_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    hp->yarn_attn_factor = 1.0f;
    tr_model_key_float(m, "rope.scaling.attn_factor", &hp->yarn_attn_factor);
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    tr_model_key_float(m, "rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast);
    tr_model_key_float(m, "rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow);

    hp->n_swa = 0;
    if (tr_model_key_int(m, "attention.sliding_window", &v)) {
        if (v < 0 || v > INT32_MAX)
            return tr_fail(err, TR_E_FORMAT, "%s.attention.sliding_window = %" PRId64 " is out of "
                           "range", m->arch_name, v);
        hp->n_swa = (int32_t)v;
    }
    hp->final_logit_softcap = 0.0f;
    tr_model_key_float(m, "final_logit_softcapping", &hp->final_logit_softcap);
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim_k);
    hp->embd_scale = m->arch->embd_scale_sqrt ? sqrtf((float)hp->n_embd) : 1.0f;
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* weights                                                                                        */

static void *own(tr_model *m, size_t bytes) {
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? m->cap_owned * 2 : 64;
        void **grown = realloc(m->owned, cap * sizeof *grown);
        if (!grown) return NULL;
        m->owned = grown;
        m->cap_owned = cap;
    }
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

static const void *tensor_ptr(const tr_model *m, const tr_tensor_info *t) {
    return (const char *)m->shard_base[t->shard] + t->file_offset;
}

static const tr_tensor_info *find(const tr_model *m, const char *name) {
    return tr_gguf_tensor(m->gguf, tr_gguf_find_tensor(m->gguf, name));
}

/* shape check: ne = [d0, d1] with any trailing dims of 1 */
static tr_status check_shape(const tr_tensor_info *t, int64_t d0, int64_t d1, tr_error *err) {
    const int64_t want[4] = {d0, d1, 1, 1};
    for (int k = 0; k < 4; k++)
        if (t->ne[k] != want[k])
            return tr_fail(err, TR_E_FORMAT,
                           "tensor '%s' has shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                           "], expected [%" PRId64 ", %" PRId64 "]",
                           t->name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], d0, d1);
    return TR_OK;
}

/* a matrix [n_in, n_out]; `required` false leaves it zeroed when absent */
static tr_status bind_mat(tr_model *m, tr_mat *out, const char *name, int64_t n_in, int64_t n_out,
                          bool required, tr_error *err) {
    memset(out, 0, sizeof *out);
    const tr_tensor_info *t = find(m, name);
    if (!t) {
        if (!required) return TR_OK;
        return tr_fail(err, TR_E_FORMAT, "missing tensor '%s' (required by %s)", name,
                       m->arch->name);
    }
    tr_status s = check_shape(t, n_in, n_out, err);
    if (s) return s;
    if (!tr_type_supported(t->type))
        return tr_fail(err, TR_E_UNSUPPORTED,
                       "tensor '%s' has type %s, which terrace cannot compute (supported: F32, F16, "
                       "BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4)",
                       name, tr_type_name(t->type));
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out;
    out->data = tensor_ptr(m, t);
    out->row_bytes = tr_type_row_bytes(t->type, n_in);
    return TR_OK;
}

/* a vector of n floats (norm weights, biases); converted to f32 if stored otherwise */
static tr_status bind_vec(tr_model *m, const float **out, const char *name, int64_t n,
                          bool required, tr_error *err) {
    *out = NULL;
    const tr_tensor_info *t = find(m, name);
    if (!t) {
        if (!required) return TR_OK;
        return tr_fail(err, TR_E_FORMAT, "missing tensor '%s' (required by %s)", name,
                       m->arch->name);
    }
    tr_status s = check_shape(t, n, 1, err);
    if (s) return s;
    if (t->type == TR_TYPE_F32 && ((uintptr_t)tensor_ptr(m, t) & 3) == 0) {
        *out = tensor_ptr(m, t);
        return TR_OK;
    }
    float *f = own(m, (size_t)n * sizeof *f);
    if (!f) return tr_fail(err, TR_E_NOMEM, "out of memory converting '%s'", name);
    if ((s = tr_dequantize(t->type, tensor_ptr(m, t), f, n, err))) {
        tr_error_prefix(err, "tensor '%s': ", name);
        return s;
    }
    *out = f;
    return TR_OK;
}

/* a stacked expert tensor [n_in, n_out, n_expert] and its optional bias [n_out, n_expert] */
static tr_status bind_exps(tr_model *m, tr_exps *out, const char *name, const char *bias_name,
                           int64_t n_in, int64_t n_out, tr_error *err) {
    memset(out, 0, sizeof *out);
    const int64_t n_exp = m->hp.n_expert;
    const tr_tensor_info *t = find(m, name);
    if (!t)
        return tr_fail(err, TR_E_FORMAT, "missing tensor '%s' (required by %s MoE layers)", name,
                       m->arch->name);
    if (t->ne[0] != n_in || t->ne[1] != n_out || t->ne[2] != n_exp || t->ne[3] != 1)
        return tr_fail(err, TR_E_FORMAT,
                       "tensor '%s' has shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                       "], expected [%" PRId64 ", %" PRId64 ", %" PRId64 "]",
                       name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], n_in, n_out, n_exp);
    if (!tr_type_supported(t->type))
        return tr_fail(err, TR_E_UNSUPPORTED, "tensor '%s' has type %s, which terrace cannot compute",
                       name, tr_type_name(t->type));
    out->type = t->type;
    out->n_in = n_in;
    out->n_out = n_out;
    out->row_bytes = tr_type_row_bytes(t->type, n_in);
    out->expert_bytes = out->row_bytes * (size_t)n_out;
    out->base = tensor_ptr(m, t);
    out->shard = t->shard;
    out->file_offset = t->file_offset;
    if (bias_name) {
        const tr_tensor_info *b = find(m, bias_name);
        if (b) {
            if (b->ne[0] != n_out || b->ne[1] != n_exp || b->ne[2] != 1 || b->ne[3] != 1)
                return tr_fail(err, TR_E_FORMAT, "tensor '%s' has shape [%" PRId64 ", %" PRId64
                               "], expected [%" PRId64 ", %" PRId64 "]", bias_name, b->ne[0],
                               b->ne[1], n_out, n_exp);
            float *f = own(m, (size_t)(n_out * n_exp) * sizeof *f);
            if (!f) return tr_fail(err, TR_E_NOMEM, "out of memory converting '%s'", bias_name);
            tr_status s = tr_dequantize(b->type, tensor_ptr(m, b), f, n_out * n_exp, err);
            if (s) return s;
            out->bias = f;
        }
    }
    return TR_OK;
}

static tr_status bind_moe(tr_model *m, tr_layer *L, int32_t l, tr_error *err) {
    const tr_hparams *hp = &m->hp;
    char n1[96], n2[96];
    tr_status s;
#define NAME(buf, fmt) (snprintf(buf, sizeof buf, "blk.%d." fmt, l), buf)
    L->moe = true;
    if ((s = bind_mat(m, &L->router, NAME(n1, "ffn_gate_inp.weight"), hp->n_embd, hp->n_expert,
                      true, err)) ||
        (s = bind_vec(m, &L->router_b, NAME(n1, "ffn_gate_inp.bias"), hp->n_expert, false, err)) ||
        (s = bind_exps(m, &L->gate_exps, NAME(n1, "ffn_gate_exps.weight"),
                       NAME(n2, "ffn_gate_exps.bias"), hp->n_embd, hp->n_ff_exp, err)) ||
        (s = bind_exps(m, &L->up_exps, NAME(n1, "ffn_up_exps.weight"),
                       NAME(n2, "ffn_up_exps.bias"), hp->n_embd, hp->n_ff_exp, err)) ||
        (s = bind_exps(m, &L->down_exps, NAME(n1, "ffn_down_exps.weight"),
                       NAME(n2, "ffn_down_exps.bias"), hp->n_ff_exp, hp->n_embd, err)))
        return s;
    if (find(m, NAME(n1, "ffn_gate_shexp.weight"))) {
        if (hp->n_ff_shexp <= 0)
            return tr_fail(err, TR_E_FORMAT, "shared expert present but no expert_shared_feed_forward_length");
        if ((s = bind_mat(m, &L->shexp_gate, NAME(n1, "ffn_gate_shexp.weight"), hp->n_embd,
                          hp->n_ff_shexp, true, err)) ||
            (s = bind_mat(m, &L->shexp_up, NAME(n1, "ffn_up_shexp.weight"), hp->n_embd,
                          hp->n_ff_shexp, true, err)) ||
            (s = bind_mat(m, &L->shexp_down, NAME(n1, "ffn_down_shexp.weight"), hp->n_ff_shexp,
                          hp->n_embd, true, err)) ||
            (s = bind_vec(m, &L->shexp_gate_inp, NAME(n1, "ffn_gate_inp_shexp.weight"),
                          hp->n_embd, false, err)))
            return s;
    }
#undef NAME
    return TR_OK;
}

static tr_status bind_weights(tr_model *m, tr_error *err) {
    const tr_hparams *hp = &m->hp;
    tr_status s;
    char n1[96];
    const tr_tensor_info *emb = find(m, "token_embd.weight");
    if (!emb) return tr_fail(err, TR_E_FORMAT, "missing tensor 'token_embd.weight'");
    if (emb->ne[0] != hp->n_embd || emb->ne[1] < 1 || emb->ne[2] != 1 || emb->ne[3] != 1)
        return tr_fail(err, TR_E_FORMAT, "tensor 'token_embd.weight' has shape [%" PRId64 ", %" PRId64
                       "], expected [%d, n_vocab]", emb->ne[0], emb->ne[1], hp->n_embd);
    if (emb->ne[1] > INT32_MAX)
        return tr_fail(err, TR_E_FORMAT, "tensor 'token_embd.weight' has %" PRId64 " rows; token "
                       "ids are 32-bit", emb->ne[1]);
    m->hp.n_vocab = (int32_t)emb->ne[1];
    /* ids past the tokenizer's vocabulary could be generated and would render as nothing; ids
     * past the embeddings could be tokenized and not computed: both must agree (as llama.cpp
     * requires) */
    const int64_t tk = tr_gguf_find_key(m->gguf, "tokenizer.ggml.tokens");
    if (tk >= 0 && tr_gguf_kv_type(m->gguf, tk) == TR_GGUF_ARRAY &&
        tr_gguf_arr_len(m->gguf, tk) != (uint64_t)emb->ne[1])
        return tr_fail(err, TR_E_FORMAT,
                       "the vocabulary has %" PRIu64 " tokens (tokenizer.ggml.tokens) but "
                       "token_embd.weight has %" PRId64 " rows: they must be the same",
                       tr_gguf_arr_len(m->gguf, tk), emb->ne[1]);
    if ((s = bind_mat(m, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, true, err)))
        return s;
    const tr_tensor_info *out = find(m, "output.weight");
    if (out && out->ne[0] == hp->n_embd && out->ne[1] != hp->n_vocab)
        return tr_fail(err, TR_E_FORMAT,
                       "tensor 'output.weight' has %" PRId64 " rows but token_embd.weight (the "
                       "vocabulary) has %d: they must be the same", out->ne[1], hp->n_vocab);
    if ((s = bind_mat(m, &m->output, "output.weight", hp->n_embd, hp->n_vocab, false, err)))
        return s;
    if (!m->output.data) m->output = m->tok_embd; /* tied embeddings */
    if ((s = bind_vec(m, &m->output_norm, "output_norm.weight", hp->n_embd, true, err))) return s;
    if ((s = bind_vec(m, &m->rope_freqs, "rope_freqs.weight", hp->n_rot / 2, false, err))) return s;
    if ((s = bind_vec(m, &m->output_norm_b, "output_norm.bias", hp->n_embd, false, err)) ||
        (s = bind_vec(m, &m->output_b, "output.bias", hp->n_vocab, false, err)) ||
        (s = bind_vec(m, &m->rope_factors_long, "rope_factors_long.weight", hp->n_rot / 2, false,
                      err)) ||
        (s = bind_vec(m, &m->rope_factors_short, "rope_factors_short.weight", hp->n_rot / 2,
                      false, err)))
        return s;

    const tr_arch *a = m->arch;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        tr_layer *L = &m->layers[l];
        const int64_t nq = (int64_t)L->n_head * hp->head_dim_k;
        const int64_t nk = (int64_t)L->n_head_kv * hp->head_dim_k;
        const int64_t nv = (int64_t)L->n_head_kv * hp->head_dim_v;
        const int64_t no = (int64_t)L->n_head * hp->head_dim_v;
#define NAME(fmt) (snprintf(n1, sizeof n1, "blk.%d." fmt, l), n1)
        if (a->norm_bias &&
            (s = bind_vec(m, &L->attn_norm_b, NAME("attn_norm.bias"), hp->n_embd, true, err)))
            return s;
        if (a->attn_sinks &&
            (s = bind_vec(m, &L->sinks, NAME("attn_sinks.weight"), L->n_head, true, err)))
            return s;
        if ((s = bind_vec(m, &L->attn_norm, NAME("attn_norm.weight"), hp->n_embd, true, err)) ||
            (s = bind_mat(m, &L->wq, NAME("attn_q.weight"), hp->n_embd, nq, true, err)) ||
            (s = bind_mat(m, &L->wk, NAME("attn_k.weight"), hp->n_embd, nk, true, err)) ||
            (s = bind_mat(m, &L->wv, NAME("attn_v.weight"), hp->n_embd, nv, true, err)) ||
            (s = bind_mat(m, &L->wo, NAME("attn_output.weight"), no, hp->n_embd, true, err)) ||
            (s = bind_vec(m, &L->bq, NAME("attn_q.bias"), nq, a->qkv_bias, err)) ||
            (s = bind_vec(m, &L->bk, NAME("attn_k.bias"), nk, a->qkv_bias, err)) ||
            (s = bind_vec(m, &L->bv, NAME("attn_v.bias"), nv, a->qkv_bias, err)) ||
            (s = bind_vec(m, &L->bo, NAME("attn_output.bias"), hp->n_embd, false, err)))
            return s;
        if (a->qk_norm == TR_QKNORM_HEAD &&
            ((s = bind_vec(m, &L->q_norm, NAME("attn_q_norm.weight"), hp->head_dim_k, true, err)) ||
             (s = bind_vec(m, &L->k_norm, NAME("attn_k_norm.weight"), hp->head_dim_k, true, err))))
            return s;
        if (a->qk_norm == TR_QKNORM_FULL &&
            ((s = bind_vec(m, &L->q_norm, NAME("attn_q_norm.weight"), nq, true, err)) ||
             (s = bind_vec(m, &L->k_norm, NAME("attn_k_norm.weight"), nk, true, err))))
            return s;
        if (a->post_norms &&
            ((s = bind_vec(m, &L->post_attn_norm, NAME("post_attention_norm.weight"), hp->n_embd,
                           true, err)) ||
             (s = bind_vec(m, &L->post_ffw_norm, NAME("post_ffw_norm.weight"), hp->n_embd, true,
                           err))))
            return s;
        const char *fnorm = a->ffn_norm_name ? a->ffn_norm_name : "ffn_norm";
        snprintf(n1, sizeof n1, "blk.%d.%s.weight", l, fnorm);
        if ((s = bind_vec(m, &L->ffn_norm, n1, hp->n_embd, true, err))) return s;
        snprintf(n1, sizeof n1, "blk.%d.%s.bias", l, fnorm);
        if ((s = bind_vec(m, &L->ffn_norm_b, n1, hp->n_embd, a->norm_bias, err))) return s;
        snprintf(n1, sizeof n1, "blk.%d.ffn_gate_inp.weight", l);
        if (hp->n_expert > 0 && find(m, n1)) {
            if ((s = bind_moe(m, L, l, err))) return s;
            continue;
        }
        if (find(m, n1)) {
            int64_t ne;
            const bool has = tr_model_key_int(m, "expert_count", &ne);
            return tr_fail(err, TR_E_FORMAT,
                           "tensor '%s' is a mixture-of-experts router, but %s.expert_count is "
                           "%s: the number of experts must be positive",
                           n1, m->arch_name, has ? (ne == 0 ? "0" : "negative") : "missing");
        }
        if (L->n_ff <= 0)
            return tr_fail(err, TR_E_FORMAT, "layer %d is dense but %s.feed_forward_length is 0", l,
                           m->arch_name);
        if ((s = bind_mat(m, &L->ffn_gate, NAME("ffn_gate.weight"), hp->n_embd, L->n_ff, true, err)) ||
            (s = bind_mat(m, &L->ffn_up, NAME("ffn_up.weight"), hp->n_embd, L->n_ff, true, err)) ||
            (s = bind_mat(m, &L->ffn_down, NAME("ffn_down.weight"), L->n_ff, hp->n_embd, true, err)))
            return s;
#undef NAME
    }
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */

tr_model_params tr_model_default_params(void) {
    return (tr_model_params){.n_threads = 0, .no_mmap = false,
                             .expert_prefetch = TR_EXPERT_PREFETCH_AUTO};
}

/* routed expert weights: the expert cache reads these itself (their small F32 biases, gpt-oss,
 * are read with the dense weights) */
static bool is_routed_expert(const char *name) {
    const char *x = strstr(name, "_exps.");
    return x && !strcmp(x, "_exps.weight");
}

static tr_status read_shards(tr_model *m, const tr_model_params *p, tr_error *err) {
    const uint32_t n = tr_gguf_n_shards(m->gguf);
    m->shard_base = calloc(n, sizeof *m->shard_base);
    if (!m->shard_base) return tr_fail(err, TR_E_NOMEM, "out of memory");
    /* With the expert cache the dense weights are read into memory terrace owns as well: next
     * to the experts they are small, every token needs all of them, and under memory pressure
     * the kernel would evict mapped pages and fault them back in (explicit residency, DESIGN.md) */
    const bool moe_cache = p->experts == TR_EXPERTS_CACHE && m->hp.n_expert > 0;
    if (!p->no_mmap && !moe_cache) {
        tr_status s = tr_gguf_map(m->gguf, err);
        if (s) return s;
        for (uint32_t i = 0; i < n; i++) m->shard_base[i] = tr_gguf_shard_map(m->gguf, i);
        return TR_OK;
    }
    /* --no-mmap: every tensor is read into one buffer per shard at its file offset (so the
     * pointer arithmetic is the same as with the mapping); routed experts are skipped when the
     * expert cache owns them — their pages of the buffer are never touched, so never resident */
    uint64_t total = 0, done = 0;
    for (int64_t t = 0; t < tr_gguf_n_tensors(m->gguf); t++) {
        const tr_tensor_info *ti = tr_gguf_tensor(m->gguf, t);
        if (!(p->experts == TR_EXPERTS_CACHE && is_routed_expert(ti->name))) total += ti->nbytes;
    }
    for (uint32_t i = 0; i < n; i++) {
        const uint64_t size = tr_gguf_shard_size(m->gguf, i);
        char *buf = own(m, size ? size : 1);
        if (!buf)
            return tr_fail(err, TR_E_NOMEM, "--no-mmap: cannot allocate %" PRIu64 " bytes for %s",
                           size, tr_gguf_shard_path(m->gguf, i));
        m->shard_base[i] = buf;
    }
    for (int64_t t = 0; t < tr_gguf_n_tensors(m->gguf); t++) {
        const tr_tensor_info *ti = tr_gguf_tensor(m->gguf, t);
        if (p->experts == TR_EXPERTS_CACHE && is_routed_expert(ti->name)) continue;
        char *dst = (char *)m->shard_base[ti->shard] + ti->file_offset;
        for (uint64_t off = 0; off < ti->nbytes;) {
            const uint64_t chunk = ti->nbytes - off < (64u << 20) ? ti->nbytes - off : (64u << 20);
            tr_status s = tr_gguf_read(m->gguf, t, off, dst + off, chunk, err);
            if (s) return s;
            off += chunk;
            done += chunk;
            if (p->progress) p->progress(p->progress_user, "loading", done, total);
        }
    }
    /* The dense weights are in memory terrace owns now; their file pages would stay in the page
     * cache, charged to a memory cgroup and given back only under pressure, where the expert
     * cache could use them. The routed experts are read with O_DIRECT (or, buffered, would be
     * cached by the kernel anyway): dropping the whole file's pages loses nothing. */
    if (moe_cache) {
        bool dropped = true;
        for (uint32_t i = 0; i < n; i++)
            dropped &= posix_fadvise(tr_gguf_shard_fd(m->gguf, i), 0, 0, POSIX_FADV_DONTNEED) == 0;
        m->plan.dense_cache_dropped = dropped;
    }
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* the expert cache                                                                               */

/* What the memory planner needs to know about the machine (tr_expert_plan): the memory cgroup's
 * limit and usage, if the process is in one with a limit, MemAvailable, and the process's RSS. */
static void read_memory(tr_expert_plan_in *in) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f) {
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            char *mem = strstr(line, ":memory:");
            if (!mem) continue;
            char *path = mem + strlen(":memory:");
            path[strcspn(path, "\n")] = '\0';
            char file[1200];
            unsigned long long lim = 0, use = 0;
            snprintf(file, sizeof file, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", path);
            FILE *lf = fopen(file, "r");
            const bool ok = lf && fscanf(lf, "%llu", &lim) == 1 && lim < (1ULL << 60);
            if (lf) fclose(lf);
            snprintf(file, sizeof file, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", path);
            FILE *uf = fopen(file, "r");
            if (ok && uf && fscanf(uf, "%llu", &use) == 1) {
                in->cg_limit = lim;
                in->cg_usage = use;
            }
            if (uf) fclose(uf);
        }
        fclose(f);
    }
    f = fopen("/proc/meminfo", "r");
    if (f) {
        char key[64];
        unsigned long long kb;
        while (fscanf(f, "%63s %llu kB", key, &kb) == 2)
            if (!strcmp(key, "MemAvailable:")) in->mem_available = (uint64_t)kb * 1024;
        fclose(f);
    }
    f = fopen("/proc/self/statm", "r");
    if (f) {
        unsigned long long size, res;
        if (fscanf(f, "%llu %llu", &size, &res) == 2)
            in->rss_now = (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
        fclose(f);
    }
}

/* the memory budget when none is given: the memory cgroup's limit if one is set (page cache
 * counts against it, and that is where "bigger than memory" runs live), else MemAvailable */
uint64_t tr_mem_available(void) {
    tr_expert_plan_in in = {0};
    read_memory(&in);
    return in.cg_limit ? in.cg_limit : in.mem_available;
}

/* a byte count for messages: "912 B", "1.5 KiB", "98.4 MiB", "2.00 GiB" */
static const char *human_bytes(uint64_t n, char buf[32]) {
    if (n < 1024) snprintf(buf, 32, "%" PRIu64 " B", n);
    else if (n < (1u << 20)) snprintf(buf, 32, "%.1f KiB", (double)n / 1024.0);
    else if (n < (1u << 30)) snprintf(buf, 32, "%.1f MiB", (double)n / 1048576.0);
    else snprintf(buf, 32, "%.2f GiB", (double)n / 1073741824.0);
    return buf;
}

static tr_status setup_experts(tr_model *m, const tr_model_params *p, tr_error *err) {
    const tr_hparams *hp = &m->hp;
    tr_expert_layer *layers = calloc((size_t)hp->n_layer, sizeof *layers);
    if (!layers) return tr_fail(err, TR_E_NOMEM, "out of memory");
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const tr_layer *L = &m->layers[l];
        if (!L->moe) continue;
        const tr_exps *x[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        layers[l].n_parts = 3;
        for (int i = 0; i < 3; i++) {
            layers[l].part[i] = (tr_expert_part){
                .fd = tr_gguf_shard_fd(m->gguf, x[i]->shard),
                .path = tr_gguf_shard_path(m->gguf, x[i]->shard),
                .offset = x[i]->file_offset,
                .stride = x[i]->expert_bytes,
                .bytes = x[i]->expert_bytes,
            };
        }
    }
    const tr_expert_layout layout = {hp->n_layer, hp->n_expert, hp->n_expert_used, layers};
    uint64_t budget = p->expert_cache_bytes;
    const uint64_t min_budget = tr_expert_cache_min_budget(&layout);
    bool clamped = false;
    if (p->mem_budget_bytes) {
        /* what a run needs at the least: the dense weights, the smallest session (a context of
         * one token) and the smallest expert cache; a budget below that cannot be honoured */
        const uint64_t sess = tr_session_estimate_ctx(m, 1, 1);
        const uint64_t need = m->dense_bytes + sess + min_budget;
        if (p->mem_budget_bytes < need) {
            free(layers);
            char b[5][32];
            return tr_fail(err, TR_E_BUDGET,
                           "--mem-budget %s is below the least this model needs: %s of dense "
                           "weights + %s for the smallest session + %s for the smallest expert "
                           "cache (one layer's top-%d experts) = %s",
                           human_bytes(p->mem_budget_bytes, b[0]), human_bytes(m->dense_bytes, b[1]),
                           human_bytes(sess, b[2]), human_bytes(min_budget, b[3]),
                           hp->n_expert_used, human_bytes(need, b[4]));
        }
    }
    if (budget == TR_EXPERT_CACHE_MIN) budget = min_budget;
    if (!budget) {
        tr_expert_plan_in in = {
            .mem_budget = p->mem_budget_bytes,
            .dense_bytes = m->dense_bytes,
            .dense_cache_dropped = m->plan.dense_cache_dropped,
            .session_bytes = p->session_bytes ? p->session_bytes
                                              : tr_session_estimate_ctx(m, p->session_ctx,
                                                                        p->session_batch),
            /* per expert: the cache's entry, the real policy's and its four shadows' tables,
             * generously; and the two routing-history rings of knn (one in adaptive's shadow) */
            .bookkeeping = (uint64_t)hp->n_layer * (uint64_t)hp->n_expert * 1024 + (4u << 20),
            .min_budget = min_budget,
            /* every expert with its slot's page rounding: more would never be used */
            .all_experts = m->expert_total_bytes + (uint64_t)hp->n_layer * hp->n_expert * 3 * 8192,
        };
        read_memory(&in);
        const bool dropped = m->plan.dense_cache_dropped;
        tr_expert_plan(&in, &m->plan);
        m->plan.automatic = true;
        m->plan.dense_cache_dropped = dropped;
        budget = m->plan.budget_bytes;
        clamped = p->mem_budget_bytes != 0 && m->plan.raised_to_min;
    }
    tr_expert_cache_params cp = {
        .budget_bytes = budget,
        .policy = p->expert_policy ? p->expert_policy : "auto",
        .io_threads = p->io_threads,
    };
    tr_status s = tr_expert_cache_create(&layout, &cp, &m->experts, m->warning, sizeof m->warning,
                                         err);
    free(layers);
    if (s == TR_OK && clamped) {
        /* the budget holds the minimum but not the default session and headroom on top */
        const size_t used = strlen(m->warning);
        char b[2][32];
        snprintf(m->warning + used, sizeof m->warning - used,
                 "%s--mem-budget %s leaves no room for an expert cache after the dense weights, a "
                 "default session and headroom; using the smallest cache, %s",
                 used ? "; " : "", human_bytes(p->mem_budget_bytes, b[0]),
                 human_bytes(min_budget, b[1]));
    }
    return s;
}

tr_status tr_model_load(const char *path, const tr_model_params *params, tr_model **out,
                        tr_error *err) {
    *out = NULL;
    tr_model_params p = params ? *params : tr_model_default_params();
    tr_model *m = calloc(1, sizeof *m);
    if (!m) return tr_fail(err, TR_E_NOMEM, "out of memory");
    pthread_mutex_init(&m->lock, NULL);
    {
        tr_expert_plan_in now = {0};
        read_memory(&now);
        m->process_bytes = now.rss_now;
    }
    int32_t *n_head = NULL, *n_head_kv = NULL, *n_ff = NULL;
    tr_status s = tr_gguf_open(path, &m->gguf, err);
    if (s) goto fail;
    tr_str arch;
    if (!tr_gguf_kv_str(m->gguf, "general.architecture", &arch)) {
        s = tr_fail(err, TR_E_FORMAT, "%s: no general.architecture key: not a model file", path);
        goto fail;
    }
    if (memchr(arch.ptr, '\0', (size_t)arch.len)) {
        s = tr_fail(err, TR_E_FORMAT, "%s: general.architecture contains a NUL byte (at %zu of "
                    "its %" PRIu64 " bytes)", path,
                    (size_t)((const char *)memchr(arch.ptr, '\0', (size_t)arch.len) - arch.ptr),
                    arch.len);
        goto fail;
    }
    snprintf(m->arch_name, sizeof m->arch_name, "%.*s", (int)(arch.len < 63 ? arch.len : 63),
             arch.ptr);
    tr_str name;
    if (tr_gguf_kv_str(m->gguf, "general.name", &name))
        snprintf(m->name, sizeof m->name, "%.*s",
                 (int)(name.len < sizeof m->name - 1 ? name.len : sizeof m->name - 1), name.ptr);
    m->arch = tr_arch_find(m->arch_name);
    if (!m->arch) {
        s = tr_fail(err, TR_E_UNSUPPORTED,
                    "%s: architecture '%s' is not supported (supported: %s)", path, m->arch_name,
                    tr_supported_archs());
        goto fail;
    }
    /* the vocabulary first: a file whose tokenizer is broken fails before any weight is read */
    if (tr_gguf_find_key(m->gguf, "tokenizer.ggml.model") >= 0 &&
        (s = tr_tokenizer_load(m->gguf, &m->tok, err)))
        goto fail; /* its messages start with "tokenizer: " */
    int64_t n_layer;
    if ((s = need_int(m, "block_count", 1, MAX_LAYERS, &n_layer, err))) goto fail;
    m->hp.n_layer = (int32_t)n_layer;
    m->layers = calloc((size_t)n_layer, sizeof *m->layers);
    n_head = calloc((size_t)n_layer, sizeof *n_head);
    n_head_kv = calloc((size_t)n_layer, sizeof *n_head_kv);
    n_ff = calloc((size_t)n_layer, sizeof *n_ff);
    if (!m->layers || !n_head || !n_head_kv || !n_ff) {
        s = tr_fail(err, TR_E_NOMEM, "out of memory");
        goto fail;
    }
    if ((s = load_hparams(m, n_head, n_head_kv, n_ff, err))) goto fail;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        m->layers[l].n_head = n_head[l];
        m->layers[l].n_head_kv = n_head_kv[l];
        m->layers[l].n_ff = n_ff[l];
        m->layers[l].rope_base = m->hp.rope_base;
        m->layers[l].rope_freq_scale = m->hp.rope_freq_scale;
        m->layers[l].swa = false;
    }
    if ((s = read_shards(m, &p, err))) goto fail;
    if ((s = bind_weights(m, err))) goto fail;
    {
        /* FFN widths the scratch is sized by: only those of what was bound, so a width in the
         * metadata that no tensor has (a shared expert's in a file without one) sizes nothing */
        tr_hparams *hp = &m->hp;
        hp->n_ff_max = 0;
        for (int32_t l = 0; l < hp->n_layer; l++) {
            const tr_layer *L = &m->layers[l];
            int32_t w = L->moe ? hp->n_ff_exp : L->n_ff;
            if (L->shexp_gate.data && hp->n_ff_shexp > w) w = hp->n_ff_shexp;
            if (w > hp->n_ff_max) hp->n_ff_max = w;
        }
    }
    /* binding converted vectors from the mapping: a file cut short since it was opened */
    if ((s = tr_gguf_mapping_check(m->gguf, err))) goto fail;
    if (m->arch->hook && (s = m->arch->hook(m, err))) goto fail;
    for (int64_t i = 0; i < tr_gguf_n_tensors(m->gguf); i++) {
        const tr_tensor_info *ti = tr_gguf_tensor(m->gguf, i);
        m->weight_bytes += ti->nbytes;
        if (is_routed_expert(ti->name)) m->expert_total_bytes += ti->nbytes;
    }
    m->dense_bytes = m->weight_bytes - m->expert_total_bytes;
    m->expert_prefetch = p.expert_prefetch > 0 ? p.expert_prefetch : 0;
    m->expert_lookahead = p.expert_lookahead;
    if (m->hp.n_expert > 0 && p.experts == TR_EXPERTS_CACHE && (s = setup_experts(m, &p, err)))
        goto fail;
    /* auto: read the next layer's predicted top-k ahead while this layer computes, where misses
     * are to come (a cache that holds every expert misses only while it fills) */
    if (m->experts && p.expert_prefetch == TR_EXPERT_PREFETCH_AUTO) {
        tr_expert_stats es;
        tr_expert_cache_stats(m->experts, &es);
        if (es.budget_bytes < m->expert_total_bytes) {
            m->expert_prefetch = m->hp.n_expert_used;
            m->prefetch_auto = true;
        }
    }
    /* the memory budget the expert cache and --kv-policy auto share: tr_expert_plan's cap, from
     * the reading the cache's automatic budget was planned with, else from one taken now */
    if (m->plan.automatic) {
        m->mem_cap = m->plan.cap_bytes;
        m->mem_source = m->plan.source;
    } else {
        tr_expert_plan_in in = {.mem_budget = p.mem_budget_bytes};
        read_memory(&in);
        tr_expert_budget_plan cap;
        tr_expert_plan(&in, &cap);
        m->mem_cap = cap.cap_bytes;
        m->mem_source = cap.source;
    }
    m->kern = tr_kernels_best();
    if ((s = tr_pool_create(p.n_threads, &m->pool, err))) goto fail;
    free(n_head);
    free(n_head_kv);
    free(n_ff);
    *out = m;
    return TR_OK;
fail:
    free(n_head);
    free(n_head_kv);
    free(n_ff);
    if (s == TR_OK) s = TR_E_INTERNAL;
    if (m->gguf && err && strstr(err->msg, path) == NULL) tr_error_prefix(err, "%s: ", path);
    tr_model_free(m);
    return s;
}

void tr_model_free(tr_model *m) {
    if (!m) return;
    tr_model_route_trace_close(m, NULL);
    tr_expert_cache_free(m->experts);
    tr_pool_free(m->pool);
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->shard_base);
    free(m->layers);
    tr_tokenizer_free(m->tok);
    tr_gguf_close(m->gguf);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

const char *tr_model_arch(const tr_model *m) { return m->arch_name; }
const char *tr_model_warning(const tr_model *m) { return m->warning[0] ? m->warning : NULL; }

void tr_model_expert_plan(const tr_model *m, tr_expert_budget_plan *out) {
    *out = m->plan;
    if (!out->automatic) memset(out, 0, sizeof *out);
}

void tr_model_get_stats(const tr_model *m, tr_model_stats *out) {
    memset(out, 0, sizeof *out);
    out->moe = m->hp.n_expert > 0;
    out->dense_bytes = m->dense_bytes;
    out->expert_total_bytes = m->expert_total_bytes;
    out->prefetch_predicted = m->prefetch_predicted;
    out->prefetch_correct = m->prefetch_correct;
    if (!m->experts) return;
    tr_expert_stats st;
    tr_expert_cache_stats(m->experts, &st);
    out->expert_cache = true;
    out->expert_policy = st.policy;
    out->direct_io = st.direct_io;
    out->expert_hits = st.hits;
    out->expert_misses = st.misses;
    out->expert_bytes_read = st.bytes_read;
    out->expert_reads = st.reads;
    out->expert_io_wait_ns = st.io_wait_ns;
    out->expert_io_busy_ns = st.io_busy_ns;
    out->expert_cache_bytes = st.resident_bytes;
    out->expert_budget_bytes = st.budget_bytes;
    out->expert_evictions = st.evictions;
    out->prefetch_issued = st.prefetch_issued;
    out->prefetch_used = st.prefetch_used;
    out->prefetch_wasted_bytes = st.prefetch_wasted_bytes;
    out->expert_policy_ns = st.policy_ns;
    out->expert_policy_hidden_ns = st.policy_hidden_ns;
    out->protected_evictions = st.protected_evictions;
}
int32_t tr_model_n_vocab(const tr_model *m) { return m->hp.n_vocab; }
int32_t tr_model_n_ctx_train(const tr_model *m) { return m->hp.n_ctx_train; }
int32_t tr_model_n_embd(const tr_model *m) { return m->hp.n_embd; }
int32_t tr_model_n_layer(const tr_model *m) { return m->hp.n_layer; }
uint64_t tr_model_weight_bytes(const tr_model *m) { return m->weight_bytes; }
const tr_gguf *tr_model_gguf(const tr_model *m) { return m->gguf; }
const tr_tokenizer *tr_model_tokenizer(const tr_model *m) { return m->tok; }
tr_pool *tr_model_pool(tr_model *m) { return m->pool; }
