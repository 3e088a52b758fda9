/*
 * The architecture table. Adding an architecture is a descriptor here (plus a hook only for rules
 * that are not flags); the forward pass and the weight binding are shared (GGUF-FACTS §3).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"

/* gemma3: 5 sliding-window layers then 1 global (period 6, or the file's pattern when newer
 * converters store it); SWA layers use RoPE base 10000 (or rope.freq_base_swa) without scaling;
 * q is pre-scaled by 1/sqrt(head_dim) — 1/sqrt(n_embd/n_head) for the 62-layer 27B. */
static tr_status gemma3_hook(tr_model *m, tr_error *err) {
    (void)err;
    tr_hparams *hp = &m->hp;
    int64_t period = 6;
    tr_model_key_int(m, "attention.sliding_window_pattern", &period);
    float base_swa = 10000.0f;
    tr_model_key_float(m, "rope.freq_base_swa", &base_swa);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        tr_layer *L = &m->layers[l];
        L->swa = hp->n_swa > 0 && (period == 0 || (l % period) < period - 1);
        L->rope_base = L->swa ? base_swa : hp->rope_base;
        L->rope_freq_scale = L->swa ? 1.0f : hp->rope_freq_scale;
    }
    hp->rope_base_swa = base_swa;
    hp->attn_scale = hp->n_layer == 62 ? 1.0f / sqrtf((float)hp->n_embd / (float)hp->n_head_max)
                                       : 1.0f / sqrtf((float)hp->head_dim_k);
    return TR_OK;
}

/* gpt-oss: even layers use the sliding window (required), odd ones attend to everything */
static tr_status gpt_oss_hook(tr_model *m, tr_error *err) {
    if (m->hp.n_swa <= 0)
        return tr_fail(err, TR_E_FORMAT, "gpt-oss needs gpt-oss.attention.sliding_window > 0");
    for (int32_t l = 0; l < m->hp.n_layer; l++) m->layers[l].swa = (l % 2) == 0;
    return TR_OK;
}

/* phimoe: LongRoPE factors (long when the session's context exceeds the original one), q is
 * pre-scaled by 1/sqrt(head_dim); cos/sin carry rope.scaling.attn_factor (read with the other
 * RoPE keys) */
static tr_status phimoe_hook(tr_model *m, tr_error *err) {
    if (!m->rope_factors_long || !m->rope_factors_short) {
        if (m->rope_factors_long || m->rope_factors_short)
            return tr_fail(err, TR_E_FORMAT, "phimoe: rope_factors_long and rope_factors_short "
                                             "must come together");
    }
    return TR_OK;
}

static const tr_arch k_archs[] = {
    /* llama with expert_count > 0 is Mixtral-style MoE */
    {.name = "llama", .rope = TR_ROPE_NORM, .act = TR_ACT_SILU, .expert_act = TR_ACT_SILU,
     .route = TR_ROUTE_SOFTMAX_TOPK_NORM},
    {.name = "qwen2", .rope = TR_ROPE_NEOX, .act = TR_ACT_SILU, .qkv_bias = true},
    {.name = "qwen3", .rope = TR_ROPE_NEOX, .act = TR_ACT_SILU, .qk_norm = TR_QKNORM_HEAD},
    {.name = "qwen2moe", .rope = TR_ROPE_NEOX, .act = TR_ACT_SILU, .qkv_bias = true,
     .expert_act = TR_ACT_SILU, .route = TR_ROUTE_SOFTMAX_TOPK, .expert_ff_key = true},
    {.name = "qwen3moe", .rope = TR_ROPE_NEOX, .act = TR_ACT_SILU, .qk_norm = TR_QKNORM_HEAD,
     .expert_act = TR_ACT_SILU, .route = TR_ROUTE_SOFTMAX_TOPK_NORM, .expert_ff_key = true},
    {.name = "olmoe", .rope = TR_ROPE_NEOX, .act = TR_ACT_SILU, .qk_norm = TR_QKNORM_FULL,
     .expert_act = TR_ACT_SILU, .route = TR_ROUTE_SOFTMAX_TOPK},
    {.name = "phimoe", .rope = TR_ROPE_NEOX, .act = TR_ACT_SILU, .qkv_bias = true,
     .norm_bias = true, .q_prescale = true, .expert_act = TR_ACT_SILU,
     .route = TR_ROUTE_SOFTMAX_TOPK_NORM, .hook = phimoe_hook},
    {.name = "gpt-oss", .rope = TR_ROPE_NEOX, .act = TR_ACT_SILU, .qkv_bias = true,
     .attn_sinks = true, .expert_act = TR_ACT_SWIGLU_OAI, .route = TR_ROUTE_TOPK_SOFTMAX,
     .ffn_norm_name = "post_attention_norm", .expert_ff_key = true, .hook = gpt_oss_hook},
    {.name = "gemma3",
     .rope = TR_ROPE_NEOX,
     .act = TR_ACT_GELU,
     .qk_norm = TR_QKNORM_HEAD,
     .post_norms = true,
     .q_prescale = true,
     .embd_scale_sqrt = true,
     .hook = gemma3_hook},
};

const tr_arch *tr_arch_find(const char *name) {
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (!strcmp(k_archs[i].name, name)) return &k_archs[i];
    return NULL;
}

const char *tr_supported_archs(void) {
    static char list[256];
    if (!list[0]) {
        size_t o = 0;
        for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0] && o < sizeof list; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "",
                                  k_archs[i].name);
    }
    return list;
}
