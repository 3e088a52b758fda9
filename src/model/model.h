/*
 * Model internals: hyperparameters, the architecture descriptor table, bound weights.
 *
 * An architecture is a descriptor (which tensors exist, RoPE style, norms, activation, ...) plus
 * an optional hook for what does not fit in flags (per-layer sliding-window pattern, per-layer
 * RoPE bases). The forward pass in forward.c is shared by all of them.
 */
#ifndef TR_MODEL_MODEL_H
#define TR_MODEL_MODEL_H

#include <pthread.h>

#include "terrace.h"
#include "tensor/matmul.h"

typedef enum { TR_ROPE_NORM = 0, TR_ROPE_NEOX = 2 } tr_rope_style;
typedef enum { TR_QKNORM_NONE, TR_QKNORM_HEAD, TR_QKNORM_FULL } tr_qknorm;
typedef enum { TR_ACT_SILU, TR_ACT_GELU, TR_ACT_SWIGLU_OAI } tr_act;
/* how router logits become expert weights (GGUF-FACTS §3.3-3.12) */
typedef enum {
    TR_ROUTE_SOFTMAX_TOPK_NORM, /* softmax over all, top-k, renormalise (mixtral, qwen3moe, phimoe) */
    TR_ROUTE_SOFTMAX_TOPK,      /* softmax over all, top-k, raw probabilities (qwen2moe, olmoe) */
    TR_ROUTE_TOPK_SOFTMAX,      /* top-k of the logits, softmax over those k (gpt-oss) */
} tr_route;
typedef enum { TR_ROPE_SCALING_NONE, TR_ROPE_SCALING_LINEAR, TR_ROPE_SCALING_YARN } tr_rope_scaling;

typedef struct tr_hparams {
    int32_t n_vocab, n_ctx_train, n_embd, n_layer;
    int32_t head_dim_k, head_dim_v, n_rot;
    int32_t n_head_max, n_head_kv_max, n_ff_max; /* maxima over layers, for buffer sizes */
    float rms_eps;
    float rope_base, rope_base_swa, rope_freq_scale; /* freq_scale = 1 / scaling factor */
    tr_rope_scaling rope_scaling;
    int32_t rope_n_ctx_orig;
    float yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    int32_t n_swa;           /* sliding window (0: none) */
    float attn_scale;        /* score scale (1/sqrt(head_dim) unless the arch says otherwise) */
    float embd_scale;        /* multiplies token embeddings (1 unless the arch says otherwise) */
    float final_logit_softcap;
    /* mixture of experts (0 experts: dense) */
    int32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
} tr_hparams;

struct tr_model;

typedef struct tr_arch {
    const char *name;
    tr_rope_style rope;
    tr_qknorm qk_norm;
    tr_act act;
    bool qkv_bias;        /* Q/K/V biases are expected (optional ones are probed anyway) */
    bool post_norms;      /* gemma: norm the attention and FFN outputs before the residual */
    bool q_prescale;      /* gemma: q *= attn_scale before attention, which then uses scale 1 */
    bool embd_scale_sqrt; /* gemma: embeddings * sqrt(n_embd) */
    bool norm_bias;       /* phimoe: every norm has a bias, logits an output bias */
    bool attn_sinks;      /* gpt-oss: a learned per-head sink in the softmax denominator */
    tr_route route;       /* MoE layers only */
    tr_act expert_act;    /* activation of routed (and shared) experts */
    const char *ffn_norm_name; /* NULL: "ffn_norm" (gpt-oss: "post_attention_norm") */
    bool expert_ff_key;   /* expert width from expert_feed_forward_length (else feed_forward_length) */
    /* per-architecture rules that are not flags (SWA layer pattern, RoPE bases, scales) */
    tr_status (*hook)(struct tr_model *m, tr_error *err);
} tr_arch;

/* A stacked expert tensor [n_in, n_out, n_expert]: expert e is the byte range
 * [file_offset + e * expert_bytes, + expert_bytes) of shard `shard` (GGUF-FACTS §3.11). */
typedef struct tr_exps {
    tr_type type;
    int64_t n_in, n_out;
    size_t row_bytes, expert_bytes;
    const char *base;     /* mapped data of expert 0 (the --experts mmap path) */
    uint32_t shard;
    uint64_t file_offset;
    const float *bias;    /* [n_expert][n_out] F32 or NULL (gpt-oss) */
} tr_exps;

typedef struct tr_layer {
    const float *attn_norm;
    tr_mat wq, wk, wv, wo;
    const float *bq, *bk, *bv, *bo;  /* NULL when absent */
    const float *q_norm, *k_norm;
    const float *post_attn_norm;
    const float *ffn_norm;
    tr_mat ffn_gate, ffn_up, ffn_down;
    const float *post_ffw_norm;
    const float *attn_norm_b, *ffn_norm_b; /* phimoe */
    const float *sinks;                    /* [n_head] gpt-oss */
    /* MoE */
    bool moe;
    tr_mat router;          /* [n_embd, n_expert] */
    const float *router_b;  /* [n_expert] or NULL */
    tr_exps gate_exps, up_exps, down_exps;
    tr_mat shexp_gate, shexp_up, shexp_down; /* shared expert (qwen2moe) */
    const float *shexp_gate_inp;             /* [n_embd] sigmoid gate of the shared expert */
    int32_t n_head, n_head_kv, n_ff;
    bool swa;         /* sliding-window attention layer */
    float rope_base;  /* RoPE theta of this layer */
    float rope_freq_scale;
} tr_layer;

struct tr_model {
    tr_gguf *gguf;
    tr_tokenizer *tok; /* NULL when the file has no vocabulary */
    const tr_arch *arch;
    tr_hparams hp;
    tr_layer *layers;
    tr_mat tok_embd;       /* rows are token embeddings */
    tr_mat output;         /* logits projection (tied to tok_embd when absent) */
    const float *output_norm;
    const float *output_norm_b, *output_b; /* phimoe */
    const float *rope_factors_long, *rope_factors_short; /* phimoe LongRoPE */
    /* expert residency: NULL = experts read through the mapping (--experts mmap) */
    struct tr_expert_cache *experts;
    /* called with each MoE layer's routing (route traces, telemetry); may be NULL */
    void (*route_hook)(void *user, int32_t layer, int32_t rows, const int32_t *pos,
                       const int32_t *sel, const float *w, int32_t k);
    void *route_hook_user;
    int32_t trace_turn;
    int expert_prefetch;          /* experts of the next layer to read ahead */
    bool expert_lookahead;        /* protect the next layer's predicted experts from eviction */
    int32_t pred_layer, pred_n;   /* the last prediction, checked when that layer routes */
    int32_t pred[256];
    /* read-ahead under auto: only the prediction ranks whose absent experts the router went on to
     * choose at least as often as not, measured online (decayed counts per rank of the list) */
    bool prefetch_auto;
    uint64_t pred_absent; /* which of pred[0..63] were absent when predicted */
    float rank_absent[64], rank_used[64];
    uint64_t prefetch_predicted, prefetch_correct;
    uint64_t dense_bytes, expert_total_bytes;
    uint64_t mem_cap;       /* the memory budget: --mem-budget, else auto (mem_source says which) */
    /* the process's resident pages when loading began (its code and libraries, stacks, the host
     * program's own memory): measured, a term of the session's plan */
    uint64_t process_bytes;
    const char *mem_source;
    char warning[1024];
    tr_expert_budget_plan plan; /* how an auto budget was chosen */
    const float *rope_freqs; /* optional per-pair divisors (llama3 rope) */
    void **owned;            /* buffers the model frees: converted vectors, --no-mmap copies */
    size_t n_owned, cap_owned;
    const void **shard_base; /* per shard: mapped file or a full in-memory copy */
    uint64_t weight_bytes;
    tr_pool *pool;
    const tr_kernels *kern;
    pthread_mutex_t lock; /* one forward pass at a time per model */
    char arch_name[64];
    char name[256]; /* general.name (truncated), "" if none */
};

/* src/model/arch.c */
const tr_arch *tr_arch_find(const char *name);

/* src/model/load.c helpers used by hooks */
bool tr_model_has_key(const struct tr_model *m, const char *suffix);
bool tr_model_key_float(const struct tr_model *m, const char *suffix, float *out);
bool tr_model_key_int(const struct tr_model *m, const char *suffix, int64_t *out);

/* The expert cache's auto budget (src/model/budget.c). tr_expert_plan is a pure function of its
 * inputs: no I/O, no allocation, callable more than once (load.c's read_memory fills the machine's
 * side, setup_experts the model's). A whole-process planner can call it with its own session and
 * bookkeeping figures, or with mem_budget set to the share it gives the experts. All in bytes.
 * The cap is mem_budget if set, else the cgroup limit if the cgroup is the tighter bound, else
 * MemAvailable + rss_now; budget = cap - in use - session - bookkeeping - margin (5% of the cap,
 * 16 MiB .. 10%), clamped to [min_budget, all_experts]; out->how says the same in one line. */
typedef struct tr_expert_plan_in {
    uint64_t mem_budget;          /* --mem-budget (0: none); in use is then rss_now */
    uint64_t cg_limit, cg_usage;  /* the memory cgroup's limit and usage (0: none), measured
                                   * after the dense weights are read (page cache included) */
    uint64_t mem_available;       /* /proc/meminfo MemAvailable */
    uint64_t rss_now;             /* the process, once the dense weights are in */
    uint64_t dense_bytes;         /* reported only: already inside the usage/RSS above */
    bool dense_cache_dropped;     /* reported only: their page cache was dropped after the read */
    uint64_t session_bytes;       /* KV + scratch of the session(s) the caller will create */
    uint64_t bookkeeping;         /* the cache's tables and policies outside the arena */
    uint64_t min_budget;          /* tr_expert_cache_min_budget: the smallest legal arena */
    uint64_t all_experts;         /* every expert with slot rounding: the largest useful arena */
} tr_expert_plan_in;

void tr_expert_plan(const tr_expert_plan_in *in, tr_expert_budget_plan *out);
/* the share of a memory cap kept for what no estimate sees (thread stacks, allocator slack, the
 * kernel's own pages charged to a cgroup): 5 %, at least 16 MiB, at most 10 %; the expert plan's
 * and the session's memory plan's */
uint64_t tr_mem_margin(uint64_t cap);

#endif
