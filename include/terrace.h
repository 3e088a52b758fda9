/*
 * terrace — run GGUF language models on machines whose memory is smaller than the model.
 *
 * Public API. Every handle is opaque; every fallible call returns a tr_status and, when it fails,
 * fills the caller's tr_error with a message that names what went wrong and where (file, key or
 * tensor name, byte offset). The library never prints and never exits; only the CLI does.
 */
#ifndef TERRACE_H
#define TERRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TR_VERSION_STRING "0.1.0"

/* ---------------------------------------------------------------------------------------------- */
/* Status and errors                                                                              */

typedef enum tr_status {
    TR_OK = 0,
    TR_E_ARG,         /* bad argument or flag value */
    TR_E_IO,          /* open/read/map failed, short read, I/O error */
    TR_E_FORMAT,      /* malformed or hostile file */
    TR_E_UNSUPPORTED, /* valid but not supported by this build (type, architecture, version) */
    TR_E_NOMEM,       /* allocation failed */
    TR_E_BUDGET,      /* a configured byte budget cannot hold what is needed */
    TR_E_INTERNAL,    /* a bug: an invariant did not hold */
} tr_status;

typedef struct tr_error {
    tr_status status;
    char msg[1024];
} tr_error;

const char *tr_status_name(tr_status s);

/* ---------------------------------------------------------------------------------------------- */
/* Tensor types (ids are ggml's, as stored in GGUF files)                                         */

typedef enum tr_type {
    TR_TYPE_F32 = 0,
    TR_TYPE_F16 = 1,
    TR_TYPE_Q4_0 = 2,
    TR_TYPE_Q4_1 = 3,
    TR_TYPE_Q5_0 = 6,
    TR_TYPE_Q5_1 = 7,
    TR_TYPE_Q8_0 = 8,
    TR_TYPE_Q8_1 = 9,
    TR_TYPE_Q2_K = 10,
    TR_TYPE_Q3_K = 11,
    TR_TYPE_Q4_K = 12,
    TR_TYPE_Q5_K = 13,
    TR_TYPE_Q6_K = 14,
    TR_TYPE_Q8_K = 15,
    TR_TYPE_IQ2_XXS = 16,
    TR_TYPE_IQ2_XS = 17,
    TR_TYPE_IQ3_XXS = 18,
    TR_TYPE_IQ1_S = 19,
    TR_TYPE_IQ4_NL = 20,
    TR_TYPE_IQ3_S = 21,
    TR_TYPE_IQ2_S = 22,
    TR_TYPE_IQ4_XS = 23,
    TR_TYPE_I8 = 24,
    TR_TYPE_I16 = 25,
    TR_TYPE_I32 = 26,
    TR_TYPE_I64 = 27,
    TR_TYPE_F64 = 28,
    TR_TYPE_IQ1_M = 29,
    TR_TYPE_BF16 = 30,
    TR_TYPE_TQ1_0 = 34,
    TR_TYPE_TQ2_0 = 35,
    TR_TYPE_MXFP4 = 39,
    TR_TYPE_NVFP4 = 40,
    TR_TYPE_Q1_0 = 41,
    TR_TYPE_Q2_0 = 42,
    TR_TYPE_COUNT = 43
} tr_type;

/* true if `id` names a type whose block layout terrace knows (it can size and skip such tensors) */
bool tr_type_known(uint32_t id);
/* true if terrace can dequantize and multiply tensors of this type */
bool tr_type_supported(tr_type t);
const char *tr_type_name(tr_type t);     /* "Q4_K"; "?" for an unknown id */
int64_t tr_type_block_elems(tr_type t);  /* elements per block (1 for F32/F16/BF16) */
size_t tr_type_block_bytes(tr_type t);   /* bytes per block */
/* bytes of a row of n elements; n must be a multiple of the block size */
size_t tr_type_row_bytes(tr_type t, int64_t n);
/* dequantize n elements (a multiple of the block size) of a supported type to f32 */
tr_status tr_dequantize(tr_type t, const void *src, float *dst, int64_t n, tr_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* GGUF files                                                                                     */

typedef struct tr_gguf tr_gguf;

typedef enum tr_gguf_vtype {
    TR_GGUF_U8 = 0,
    TR_GGUF_I8 = 1,
    TR_GGUF_U16 = 2,
    TR_GGUF_I16 = 3,
    TR_GGUF_U32 = 4,
    TR_GGUF_I32 = 5,
    TR_GGUF_F32 = 6,
    TR_GGUF_BOOL = 7,
    TR_GGUF_STRING = 8,
    TR_GGUF_ARRAY = 9,
    TR_GGUF_U64 = 10,
    TR_GGUF_I64 = 11,
    TR_GGUF_F64 = 12,
    TR_GGUF_VTYPE_COUNT = 13
} tr_gguf_vtype;

/* A string inside the file's metadata: not NUL-terminated, valid while the tr_gguf is open. */
typedef struct tr_str {
    const char *ptr;
    uint64_t len;
} tr_str;

typedef struct tr_tensor_info {
    const char *name;      /* NUL-terminated */
    tr_type type;
    uint32_t n_dims;       /* 1..4 */
    int64_t ne[4];         /* ne[0] innermost; missing dims are 1 */
    uint64_t nbytes;       /* exact byte size of the data */
    uint64_t file_offset;  /* absolute byte offset of the data in its shard file */
    uint32_t shard;        /* index of the shard file holding it (0 for single files) */
} tr_tensor_info;

/*
 * Open a GGUF file (or the first shard of a split model "<prefix>-00001-of-0000N.gguf"; any shard
 * name finds the others). The header, metadata and tensor table are read with ordinary reads and
 * fully validated: every count, length, dimension, type id and offset is checked against the file
 * size and against overflow before use. Tensor data is not touched until asked for.
 */
tr_status tr_gguf_open(const char *path, tr_gguf **out, tr_error *err);
void tr_gguf_close(tr_gguf *g);

uint32_t tr_gguf_version(const tr_gguf *g);
uint32_t tr_gguf_alignment(const tr_gguf *g);
uint32_t tr_gguf_n_shards(const tr_gguf *g);
const char *tr_gguf_shard_path(const tr_gguf *g, uint32_t shard);
uint64_t tr_gguf_shard_size(const tr_gguf *g, uint32_t shard);
uint64_t tr_gguf_data_offset(const tr_gguf *g, uint32_t shard); /* DATA_START of that shard */

/* metadata (key/values of the first shard; split bookkeeping keys included) */
int64_t tr_gguf_n_kv(const tr_gguf *g);
int64_t tr_gguf_find_key(const tr_gguf *g, const char *key); /* index or -1 */
const char *tr_gguf_key(const tr_gguf *g, int64_t i);
tr_gguf_vtype tr_gguf_kv_type(const tr_gguf *g, int64_t i);
tr_gguf_vtype tr_gguf_arr_type(const tr_gguf *g, int64_t i); /* element type of an array */
uint64_t tr_gguf_arr_len(const tr_gguf *g, int64_t i);
const void *tr_gguf_arr_data(const tr_gguf *g, int64_t i);    /* numeric arrays: packed LE values */
tr_str tr_gguf_arr_str(const tr_gguf *g, int64_t i, uint64_t j);
tr_str tr_gguf_get_str(const tr_gguf *g, int64_t i);
/* integer/bool scalar of any width, converted; false if the value is not an integer or bool
 * or does not fit */
bool tr_gguf_get_int(const tr_gguf *g, int64_t i, int64_t *out);
/* unsigned integer scalar of any width (negative values refused) */
bool tr_gguf_get_u64(const tr_gguf *g, int64_t i, uint64_t *out);
/* f32 or f64 scalar (integers are accepted too) */
bool tr_gguf_get_float(const tr_gguf *g, int64_t i, double *out);
/* helpers by key name */
bool tr_gguf_kv_int(const tr_gguf *g, const char *key, int64_t *out);
bool tr_gguf_kv_float(const tr_gguf *g, const char *key, double *out);
bool tr_gguf_kv_str(const tr_gguf *g, const char *key, tr_str *out);
const char *tr_gguf_vtype_name(tr_gguf_vtype t);

/* tensors (over all shards, in file order) */
int64_t tr_gguf_n_tensors(const tr_gguf *g);
int64_t tr_gguf_find_tensor(const tr_gguf *g, const char *name); /* index or -1 */
const tr_tensor_info *tr_gguf_tensor(const tr_gguf *g, int64_t i);

/* Map every shard read-only (idempotent). After this, tr_gguf_tensor_data returns pointers. */
tr_status tr_gguf_map(tr_gguf *g, tr_error *err);
const void *tr_gguf_tensor_data(const tr_gguf *g, int64_t i); /* NULL unless mapped */
/* Read `len` bytes starting `off` bytes into tensor i into dst with pread; a short read (file
 * truncated under us) or an I/O error is reported, never silently returned. */
tr_status tr_gguf_read(const tr_gguf *g, int64_t i, uint64_t off, void *dst, uint64_t len,
                       tr_error *err);
/* File descriptor of a shard, for callers that issue their own reads (O_RDONLY, buffered). */
int tr_gguf_shard_fd(const tr_gguf *g, uint32_t shard);

/* ---------------------------------------------------------------------------------------------- */
/* CPU and threads                                                                                */

/* Name of the kernel family chosen at start-up from CPU features: "avx512", "avx2" or "scalar".
 * The environment variable TERRACE_ISA=scalar|avx2|avx512 lowers the choice (for tests). */
const char *tr_cpu_isa(void);
/* Physical cores available to this process (at least 1). */
int tr_cpu_physical_cores(void);

typedef struct tr_pool tr_pool;
/* A persistent pool of n_threads workers (the caller counts as one). n_threads <= 0 means the
 * number of physical cores. Threads are created here once, never per call. */
tr_status tr_pool_create(int n_threads, tr_pool **out, tr_error *err);
void tr_pool_free(tr_pool *p);
int tr_pool_size(const tr_pool *p);


/* ---------------------------------------------------------------------------------------------- */
/* Models and sessions                                                                            */
/*
 * A tr_model holds the weights (mapped read-only by default) and the thread pool; a tr_session is
 * one timeline (one sequence) and owns its KV cache and scratch. Calls that compute (eval, decode)
 * on sessions of the same model are serialised by the model: one forward pass at a time.
 */

typedef struct tr_model tr_model;
typedef struct tr_session tr_session;

/* progress of long operations: `what` names the phase ("loading", "prefill"), done <= total */
typedef void (*tr_progress_fn)(void *user, const char *what, uint64_t done, uint64_t total);

typedef enum tr_experts_mode {
    TR_EXPERTS_CACHE = 0, /* routed experts in terrace's byte-budgeted cache, read explicitly */
    TR_EXPERTS_MMAP = 1,  /* routed experts through the mapping: the kernel decides (baseline) */
} tr_experts_mode;

#define TR_EXPERT_CACHE_MIN UINT64_MAX

typedef struct tr_model_params {
    int n_threads;         /* <= 0: physical cores */
    bool no_mmap;          /* true: read weights into memory instead of mapping them */
    tr_progress_fn progress;
    void *progress_user;
    /* MoE models */
    tr_experts_mode experts;
    uint64_t expert_cache_bytes; /* 0: auto — what mem_budget leaves after the dense weights;
                                    TR_EXPERT_CACHE_MIN: the smallest legal budget */
    uint64_t mem_budget_bytes;   /* 0: auto — the memory cgroup's limit, else MemAvailable */
    const char *expert_policy;   /* NULL: "auto" (= "adaptive": set dueling, src/experts) */
    int expert_prefetch;         /* experts of the next layer to read ahead (0: off) */
    /* router lookahead: the next layer's router applied to this layer's input predicts its
     * experts; the resident ones are kept from eviction while this layer loads, none is read
     * early */
    bool expert_lookahead;
    int io_threads;              /* expert I/O workers (<= 0: 4) */
    /* the session the caller will create (context, batch), so that an auto-sized expert cache
     * leaves room for exactly it; 0: a default session */
    int32_t session_ctx, session_batch;
} tr_model_params;

/* How `--expert-cache auto` sized the cache (tr_model_expert_plan): the cap, what it holds
 * besides the arena, and the budget left. */
typedef struct tr_expert_budget_plan {
    bool automatic;          /* false: the budget was given (nothing below is set) */
    const char *source;      /* "memory cgroup limit", "MemAvailable", "--mem-budget" */
    uint64_t cap_bytes;      /* the memory the process may use */
    uint64_t in_use_bytes;   /* charged once the dense weights were read (cgroup usage or RSS) */
    uint64_t dense_bytes;    /* the dense weights, read into memory terrace owns */
    bool dense_cache_dropped; /* their file pages dropped from the page cache after the read */
    uint64_t session_bytes, bookkeeping_bytes, margin_bytes;
    uint64_t budget_bytes;   /* the arena */
    bool holds_all;          /* capped at every expert of the model */
    bool raised_to_min;      /* below the smallest legal budget: raised to it */
    char how[384];           /* the same as one line of text */
} tr_expert_budget_plan;

void tr_model_expert_plan(const tr_model *m, tr_expert_budget_plan *out);

tr_model_params tr_model_default_params(void);
tr_status tr_model_load(const char *path, const tr_model_params *params, tr_model **out,
                        tr_error *err);
void tr_model_free(tr_model *m);

const char *tr_model_arch(const tr_model *m);
int32_t tr_model_n_vocab(const tr_model *m);
int32_t tr_model_n_ctx_train(const tr_model *m);
int32_t tr_model_n_embd(const tr_model *m);
int32_t tr_model_n_layer(const tr_model *m);
uint64_t tr_model_weight_bytes(const tr_model *m);
const tr_gguf *tr_model_gguf(const tr_model *m);
tr_pool *tr_model_pool(tr_model *m);
/* comma-separated list of the architectures this build runs */
const char *tr_supported_archs(void);
/* a warning from loading (e.g. an expert budget below one token's working set), or NULL */
const char *tr_model_warning(const tr_model *m);

/* Counters for telemetry: what the expert cache and the process did so far. */
typedef struct tr_model_stats {
    bool moe;                       /* the model has routed experts */
    bool expert_cache;              /* they go through the expert cache (else mmap) */
    const char *expert_policy;      /* in effect */
    bool direct_io;                 /* O_DIRECT reads */
    uint64_t expert_hits, expert_misses;
    uint64_t expert_bytes_read;     /* from storage */
    uint64_t expert_reads;
    uint64_t expert_io_wait_ns;     /* compute blocked waiting for expert reads */
    uint64_t expert_io_busy_ns;     /* wall time with at least one expert read in flight */
    uint64_t expert_cache_bytes;    /* occupied arena bytes */
    uint64_t expert_budget_bytes;   /* arena budget */
    uint64_t expert_evictions;
    uint64_t prefetch_issued, prefetch_used, prefetch_wasted_bytes;
    uint64_t prefetch_predicted, prefetch_correct; /* predictions made / that the router confirmed */
    uint64_t expert_policy_ns;      /* time in the cache's policy decisions (compute thread) */
    uint64_t protected_evictions;   /* lookahead-protected experts evicted (nothing else left) */
    uint64_t dense_bytes;           /* weights outside routed experts */
    uint64_t expert_total_bytes;    /* all routed experts in the file */
    uint64_t token_working_set;     /* one token's experts over all layers (top-k) */
} tr_model_stats;
void tr_model_get_stats(const tr_model *m, tr_model_stats *out);

/* --route-trace: write every routing decision (CSV, the format `terrace replay` reads) until
 * close; the file is complete only after tr_model_route_trace_close (or tr_model_free). */
tr_status tr_model_route_trace_open(tr_model *m, const char *path, tr_error *err);
tr_status tr_model_route_trace_close(tr_model *m, tr_error *err);

typedef struct tr_session_params {
    int32_t n_ctx;    /* context length in tokens; <= 0: min(training context, 4096) */
    int32_t n_batch;  /* most tokens one eval call computes at once; <= 0: 512 */
    /* KV cache policy: NULL or "full" = all KV in DRAM with exact attention; "offload", "h2o",
     * "quest", "tiered" (importance-selected attention over hot DRAM + cold storage pools) */
    const char *kv_policy;
    float kv_alpha;        /* fraction of the context attended per step; <= 0: 0.1 */
    int32_t kv_sink;       /* first tokens always attended; < 0: 4 */
    int32_t kv_window;     /* recent tokens always attended; < 0: 64 */
    int kv_score_bits;     /* 8 or 4 (tiered scoring copy); 0: 8 */
    float kv_tail_min;     /* with kv_tail_bits: an unselected token is summed when its share of
                              a head reaches this many times the uniform share; < 0: 1 */
    int kv_tail_bits;      /* tiered: 8 or 4 adds the unselected tokens' estimated share of the
                              attention from a value copy of that precision; 0: off */
    uint64_t kv_hot_bytes; /* hot pool budget; 0: every token hot */
    const char *kv_cold_dir; /* cold pool directory (needed when the hot pool cannot hold -c) */
    bool kv_keep;          /* keep the cold pool's files when the session ends */
    /* tiered with a cold pool: placement between the pools; NULL or "off" = static (the oldest
     * tokens go cold), "on" = BKP (hit counts promote and demote, with hysteresis), "naive" =
     * promote every cold token read (a baseline) */
    const char *kv_bkp;
    /* tiered with a cold pool: the storage agent (terrace-storaged) scores the tokens on storage
     * and returns the selected rows; chunk: tokens per score block (0: 1024); the rates (0: none)
     * throttle it to emulate a slower device: storage GB/s, scoring GFLOP/s, link GB/s */
    bool csd;
    int32_t csd_chunk;
    double csd_gbps, csd_gflops, csd_link_gbps;
    /* with csd: connect to a running `terrace-storaged --listen SOCKET` (a disk shared by several
     * sessions) instead of starting the agent; NULL: start it */
    const char *csd_socket;
    /* APP: host-scored / agent-scored tokens among those on storage; < 0 (the default): chosen
     * every step from the measured rates */
    float kv_beta;
    /* with csd: APP's host budget, positions (per layer) whose low-precision keys the host keeps
     * to score beyond the window; the agent scores the others. 0 (the default): every position */
    int32_t kv_host_keys;
    /* APP's rates taken from the caller instead of measured (0: measured): host and agent
     * scoring, tokens/s; hot-pool copies and the agent's rows, bytes/s */
    double kv_app_f_c, kv_app_f_s, kv_app_b_c, kv_app_b_s;
    /* tiered: select each layer's tokens with a query speculated from the previous layer's input,
     * so that the selection and its reads overlap the previous layer's (InfiniGen's idea); the
     * attention still uses the layer's own query. Not with kv_tail_bits */
    bool kv_spec;
} tr_session_params;

typedef struct tr_session_kv_stats {
    bool managed;          /* a non-full policy manages this session's KV */
    const char *policy;
    int64_t tokens;
    uint64_t hot_bytes, cold_bytes, selected, bytes_read;
    double score_ms, attn_ms;
    /* placement (cumulative): moves between the pools, moves that reversed one made within 64
     * steps, bytes copied into the hot pool; selected tokens found hot / read from the cold pool */
    uint64_t promotions, demotions, pingpong, migrated_bytes, sel_hot, sel_cold;
    /* of the tokens a row selects, the fraction the row before it (the previous position) selected
     * too: how stable selection is from step to step, what BKP can use (0 before two rows) */
    double sel_repeat;
    /* the storage agent: bytes agent -> host as scores and as rows, bytes it read */
    uint64_t csd_score_bytes, csd_row_bytes, csd_storage_bytes;
    /* APP: the last beta, host and agent scoring rates (tokens/s), hot-pool copy and agent row
     * rates (bytes/s): measured running averages, or the given ones; beta_split: the split used,
     * once the host's share is capped by its budget (the positions it keeps keys for) */
    double beta, f_c, f_s, b_c, b_s, beta_split;
    /* --kv-tail: mean share of each head's attention left to the estimate (over the rows
     * completed so far; 0 without) */
    double tail_share;
    /* --kv-tail: fraction of the unselected (token, KV head) pairs summed (see kv_tail_min) */
    double tail_kept;
    /* --kv-spec (cumulative): rows selected with a speculative query, those selected and read
     * during the previous layer, and the mean cosine between speculative and real queries */
    uint64_t spec_rows, spec_early;
    double spec_cos;
} tr_session_kv_stats;
void tr_session_get_kv_stats(const tr_session *s, tr_session_kv_stats *out);

tr_session_params tr_session_default_params(void);
/* Computes what the session needs (KV cache + scratch), reports it in the error if it cannot be
 * allocated, and allocates it once: nothing is allocated per token afterwards. */
tr_status tr_session_create(tr_model *m, const tr_session_params *params, tr_session **out,
                            tr_error *err);
void tr_session_free(tr_session *s);
/* bytes of KV cache and scratch this session holds */
uint64_t tr_session_bytes(const tr_session *s);
int32_t tr_session_n_ctx(const tr_session *s);
int32_t tr_session_n_past(const tr_session *s);
/* drop every token from position `n` on (0 clears the session) */
tr_status tr_session_truncate(tr_session *s, int32_t n, tr_error *err);

/*
 * Appends n tokens to the session's timeline and computes them in chunks of n_batch. Logits:
 * `logits` NULL = none; otherwise with all_logits false it receives the logits of the last token
 * ([n_vocab]), with all_logits true those of every token ([n][n_vocab]). A context overflow is an
 * error that changes nothing.
 */
tr_status tr_session_eval(tr_session *s, const int32_t *tokens, int32_t n, float *logits,
                          bool all_logits, tr_error *err);

/* One decode step of B independent sequences: token b is appended to sessions[b] and its logits
 * written to logits[b][n_vocab]. All sessions must belong to the same model. */
tr_status tr_decode_batch(tr_session **sessions, const int32_t *tokens, int32_t B, float *logits,
                          tr_error *err);

#ifdef __cplusplus
}
#endif
#endif
