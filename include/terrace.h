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

/* The library's version; TR_VERSION_MAJOR is the shared library's soname version
 * (libterrace.so.<major>), raised when the ABI changes incompatibly. */
#define TR_VERSION_MAJOR 0
#define TR_VERSION_MINOR 1
#define TR_VERSION_PATCH 0
#define TR_VERSION_STRING "0.1.0"

/* Marks what the shared library exports; it is built with -fvisibility=hidden, so a function
 * declared here without TR_API is not reachable from libterrace.so (the install test checks). */
#if defined(__GNUC__) || defined(__clang__)
#define TR_API __attribute__((visibility("default")))
#else
#define TR_API
#endif

/* the version of the library actually linked ("0.1.0"), to compare with TR_VERSION_STRING */
TR_API const char *tr_version(void);

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
    TR_E_ABORTED,     /* the caller's abort callback asked to stop (tr_session_set_abort) */
} tr_status;

typedef struct tr_error {
    tr_status status;
    char msg[1024];
} tr_error;

TR_API const char *tr_status_name(tr_status s);

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
TR_API bool tr_type_known(uint32_t id);
/* true if terrace can dequantize and multiply tensors of this type */
TR_API bool tr_type_supported(tr_type t);
TR_API const char *tr_type_name(tr_type t);     /* "Q4_K"; "?" for an unknown id */
TR_API int64_t tr_type_block_elems(tr_type t);  /* elements per block (1 for F32/F16/BF16) */
TR_API size_t tr_type_block_bytes(tr_type t);   /* bytes per block */
/* bytes of a row of n elements; n must be a multiple of the block size */
TR_API size_t tr_type_row_bytes(tr_type t, int64_t n);
/* dequantize n elements (a multiple of the block size) of a supported type to f32 */
TR_API tr_status tr_dequantize(tr_type t, const void *src, float *dst, int64_t n, tr_error *err);

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
TR_API tr_status tr_gguf_open(const char *path, tr_gguf **out, tr_error *err);
TR_API void tr_gguf_close(tr_gguf *g);

TR_API uint32_t tr_gguf_version(const tr_gguf *g);
TR_API uint32_t tr_gguf_alignment(const tr_gguf *g);
TR_API uint32_t tr_gguf_n_shards(const tr_gguf *g);
TR_API const char *tr_gguf_shard_path(const tr_gguf *g, uint32_t shard);
TR_API uint64_t tr_gguf_shard_size(const tr_gguf *g, uint32_t shard);
/* the start of a shard's mapping (after tr_gguf_map; NULL before) */
TR_API const void *tr_gguf_shard_map(const tr_gguf *g, uint32_t shard);
/* DATA_START of that shard */
TR_API uint64_t tr_gguf_data_offset(const tr_gguf *g, uint32_t shard);

/* metadata (key/values of the first shard; split bookkeeping keys included) */
TR_API int64_t tr_gguf_n_kv(const tr_gguf *g);
TR_API int64_t tr_gguf_find_key(const tr_gguf *g, const char *key); /* index or -1 */
TR_API const char *tr_gguf_key(const tr_gguf *g, int64_t i);
TR_API tr_gguf_vtype tr_gguf_kv_type(const tr_gguf *g, int64_t i);
TR_API tr_gguf_vtype tr_gguf_arr_type(const tr_gguf *g, int64_t i); /* element type of an array */
TR_API uint64_t tr_gguf_arr_len(const tr_gguf *g, int64_t i);
/* numeric arrays: packed LE values */
TR_API const void *tr_gguf_arr_data(const tr_gguf *g, int64_t i);
TR_API tr_str tr_gguf_arr_str(const tr_gguf *g, int64_t i, uint64_t j);
TR_API tr_str tr_gguf_get_str(const tr_gguf *g, int64_t i);
/* integer/bool scalar of any width, converted; false if the value is not an integer or bool
 * or does not fit */
TR_API bool tr_gguf_get_int(const tr_gguf *g, int64_t i, int64_t *out);
/* unsigned integer scalar of any width (negative values refused) */
TR_API bool tr_gguf_get_u64(const tr_gguf *g, int64_t i, uint64_t *out);
/* f32 or f64 scalar (integers are accepted too) */
TR_API bool tr_gguf_get_float(const tr_gguf *g, int64_t i, double *out);
/* helpers by key name */
TR_API bool tr_gguf_kv_int(const tr_gguf *g, const char *key, int64_t *out);
TR_API bool tr_gguf_kv_float(const tr_gguf *g, const char *key, double *out);
TR_API bool tr_gguf_kv_str(const tr_gguf *g, const char *key, tr_str *out);
TR_API const char *tr_gguf_vtype_name(tr_gguf_vtype t);

/* tensors (over all shards, in file order) */
TR_API int64_t tr_gguf_n_tensors(const tr_gguf *g);
TR_API int64_t tr_gguf_find_tensor(const tr_gguf *g, const char *name); /* index or -1 */
TR_API const tr_tensor_info *tr_gguf_tensor(const tr_gguf *g, int64_t i);

/* Map every shard read-only (idempotent). After this, tr_gguf_tensor_data returns pointers. */
TR_API tr_status tr_gguf_map(tr_gguf *g, tr_error *err);
TR_API const void *tr_gguf_tensor_data(const tr_gguf *g, int64_t i); /* NULL unless mapped */
/* After tr_gguf_map: TR_E_IO naming the file if a read of the mapping went past the end of a file
 * that shrank since it was opened (truncated or rewritten while in use). Such a read does not
 * kill the process (SIGBUS); it returns zeros, so whatever was computed from the mapping since
 * the last check must be discarded when this fails. */
TR_API tr_status tr_gguf_mapping_check(const tr_gguf *g, tr_error *err);
/* Read `len` bytes starting `off` bytes into tensor i into dst with pread; a short read (file
 * truncated under us) or an I/O error is reported, never silently returned. */
TR_API tr_status tr_gguf_read(const tr_gguf *g, int64_t i, uint64_t off, void *dst, uint64_t len,
                              tr_error *err);
/* File descriptor of a shard, for callers that issue their own reads (O_RDONLY, buffered). */
TR_API int tr_gguf_shard_fd(const tr_gguf *g, uint32_t shard);

/* ---------------------------------------------------------------------------------------------- */
/* CPU and threads                                                                                */

/* Name of the kernel family chosen at start-up from CPU features: "avx512", "avx2" or "scalar".
 * The environment variable TERRACE_ISA=scalar|avx2|avx512 lowers the choice (for tests). */
TR_API const char *tr_cpu_isa(void);
/* Physical cores available to this process (at least 1). */
TR_API int tr_cpu_physical_cores(void);

typedef struct tr_pool tr_pool;
/* A persistent pool of n_threads workers (the caller counts as one). n_threads <= 0 means the
 * number of physical cores. Threads are created here once, never per call. */
TR_API tr_status tr_pool_create(int n_threads, tr_pool **out, tr_error *err);
TR_API void tr_pool_free(tr_pool *p);
TR_API int tr_pool_size(const tr_pool *p);


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

#define TR_EXPERT_PREFETCH_AUTO (-1)

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
    /* experts of the next layer to read ahead, predicted by its router from this layer's input:
     * 0 off; TR_EXPERT_PREFETCH_AUTO (tr_model_default_params): the router's top-k whenever the
     * expert cache cannot hold every expert, else off */
    int expert_prefetch;
    /* router lookahead: the next layer's router applied to this layer's input predicts its
     * experts; the resident ones are kept from eviction while this layer loads, none is read
     * early */
    bool expert_lookahead;
    int io_threads;              /* expert I/O workers (<= 0: 4) */
    /* the session the caller will create (context, batch), so that an auto-sized expert cache
     * leaves room for exactly it; 0: a default session */
    int32_t session_ctx, session_batch;
    /* the DRAM of every session the caller will create, together (a server's slots: each one's
     * KV cache + scratch, tr_session_estimate); nonzero: the auto-sized expert cache leaves this
     * instead of one session of session_ctx / session_batch */
    uint64_t session_bytes;
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

TR_API void tr_model_expert_plan(const tr_model *m, tr_expert_budget_plan *out);

TR_API tr_model_params tr_model_default_params(void);
/* The memory budget when none is given (mem_budget_bytes 0): the memory cgroup's limit if one is
 * set (page cache counts against it), else MemAvailable. */
TR_API uint64_t tr_mem_available(void);
TR_API tr_status tr_model_load(const char *path, const tr_model_params *params, tr_model **out,
                               tr_error *err);
TR_API void tr_model_free(tr_model *m);

TR_API const char *tr_model_arch(const tr_model *m);
TR_API int32_t tr_model_n_vocab(const tr_model *m);
TR_API int32_t tr_model_n_ctx_train(const tr_model *m);
TR_API int32_t tr_model_n_embd(const tr_model *m);
TR_API int32_t tr_model_n_layer(const tr_model *m);
TR_API uint64_t tr_model_weight_bytes(const tr_model *m);
TR_API const tr_gguf *tr_model_gguf(const tr_model *m);
TR_API tr_pool *tr_model_pool(tr_model *m);
/* comma-separated list of the architectures this build runs */
TR_API const char *tr_supported_archs(void);
/* a warning from loading (e.g. an expert budget below one token's working set), or NULL */
TR_API const char *tr_model_warning(const tr_model *m);

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
    uint64_t expert_policy_hidden_ns; /* the part of expert_policy_ns done while the compute
                                         thread waited for a read anyway (no read landed
                                         meanwhile): off the decode path */
} tr_model_stats;
TR_API void tr_model_get_stats(const tr_model *m, tr_model_stats *out);

/* --route-trace: write every routing decision (CSV, the format `terrace replay` reads) until
 * close; the file is complete only after tr_model_route_trace_close (or tr_model_free). */
TR_API tr_status tr_model_route_trace_open(tr_model *m, const char *path, tr_error *err);
TR_API tr_status tr_model_route_trace_close(tr_model *m, tr_error *err);

/* ---- the KV cache ------------------------------------------------------------------------------
 * How attention sees the past (--kv-policy): full keeps every key and value in DRAM and attends
 * over all of them (the accuracy reference); offload spills beyond the hot budget to a cold pool on
 * storage and reads all of it every step; h2o, quest and tiered attend over a selected fraction
 * alpha (plus sinks and a recent window), tiered scoring every token by q.k against a
 * low-precision key copy, optionally next to storage in the storage agent (terrace-storaged). */
typedef enum tr_kv_policy {
    TR_KV_FULL = 0,
    TR_KV_OFFLOAD,
    TR_KV_H2O,
    TR_KV_QUEST,
    TR_KV_TIERED,
    /* full while the KV fits its share of the memory budget (what the weights, the scratch and a
     * margin leave of tr_model_params.mem_budget_bytes), else tiered with the hot pool sized from
     * that share and the cold pool in cold_dir (NULL: $XDG_CACHE_HOME/terrace, else
     * ~/.cache/terrace, created; the cache's files in it are removed when it ends); resolved by
     * tr_session_create (tr_session_kv_note says what it chose). The default */
    TR_KV_AUTO,
} tr_kv_policy;

/* placement between the hot and the cold pool (tiered with a cold pool): off = the oldest tokens
 * go cold and nothing comes back; on = BKP, hit counts promote and demote with hysteresis; naive =
 * every cold token read is promoted (the baseline that shows ping-pong). Never changes outputs. */
typedef enum tr_kv_bkp { TR_KV_BKP_OFF = 0, TR_KV_BKP_NAIVE, TR_KV_BKP_ON } tr_kv_bkp;

/* Knobs that only benchmarks and sweeps set: they emulate other hardware or fix what the cache
 * would otherwise measure and choose. */
typedef struct tr_kv_research {
    /* the storage agent throttled to emulate a slower device and bus (0: none): its storage
     * reads (GB/s), its scoring (GFLOP/s), its link to the host (GB/s) */
    double csd_gbps, csd_gflops, csd_link_gbps;
    /* APP's beta (tokens scored by the host / by the agent among those on storage) fixed;
     * < 0 (the default): chosen every step from the measured rates */
    float beta;
    /* APP's rates given instead of measured (0: measured): host and agent scoring (tokens/s),
     * hot-pool copies and the agent's rows (bytes/s) */
    double app_f_c, app_f_s, app_b_c, app_b_s;
} tr_kv_research;

/* Every KV knob, once (tr_kv_default_params fills the defaults). The full policy uses `policy`
 * only; the others are checked against the policy at session creation. */
typedef struct tr_kv_params {
    tr_kv_policy policy;  /* default auto */
    float alpha;          /* fraction of the visible context selected per step, (0, 1]; 0.2 */
    int32_t n_sink;       /* first tokens always attended; 4 */
    int32_t n_window;     /* most recent tokens always attended; 64 */
    int score_bits;       /* tiered: 8 or 4, precision of the scoring key copy; 8 */
    int tail_bits;        /* tiered: 8 or 4 adds the unselected tokens' estimated share of each
                             head's attention from a value copy of that precision; 0 (off) */
    float tail_min;       /* with tail_bits: an unselected token is summed when its share of one
                             of the heads it serves is at least tail_min x the uniform share; 1 */
    uint64_t hot_bytes;   /* hot pool (DRAM) budget; 0: every token hot */
    const char *cold_dir; /* cold pool directory (needed when the hot pool cannot hold n_ctx) */
    bool keep;            /* keep the cold pool's files after the cache ends */
    tr_kv_bkp bkp;        /* tiered with a cold pool: placement; off */
    /* tiered: select each layer's tokens with a query speculated from the previous layer's input,
     * so that the selection and its reads overlap the previous layer's; not with tail_bits */
    bool spec;
    /* tiered with a cold pool: the storage agent scores the tokens on storage and returns the
     * selected rows */
    bool csd;
    const char *csd_socket; /* connect to `terrace-storaged --listen SOCKET`; NULL: start one */
    const char *csd_bin;    /* the agent's executable; NULL: $TERRACE_STORAGED, else next to the
                               running program (or one directory up) */
    int32_t csd_chunk;      /* tokens per score block; 0: 1024 */
    double csd_timeout;     /* seconds any wait on the agent may take before the step fails
                               naming it (a stopped or wedged agent); 0: 30 */
    /* with csd: APP's host budget M_0, the positions beyond the window whose low-precision keys the
     * host keeps (the sinks and a ring of the newest); the agent scores the rest. 0: every one */
    int32_t host_keys;
    /* sizing: 0 = automatic */
    uint64_t ws_bytes;    /* the working set (one layer's gathered K/V): 64 MiB, at most n_ctx */
    int32_t n_threads;    /* threads of the pool given to attention (per-thread scratch); 0: the
                             online CPUs (a session passes its model's pool size) */
    int32_t io_threads;   /* parallel cold-pool reads; 0: 64 */
    int32_t max_rows;     /* rows appended before they attend (a session passes its batch); 512 */
    /* the selecting policies (quest, tiered below alpha 1) select for every row of a call of
     * several rows too, each a decode step at its position (teacher-forced logits and perplexity
     * measure what decoding sees); false: such a call (a prefill chunk) attends exactly, every
     * visible key, reading each cold page at most once per layer. h2o always selects */
    bool prefill_select;
    tr_kv_research research;
} tr_kv_params;

TR_API tr_kv_params tr_kv_default_params(void);
/* "full", "offload", "h2o", "quest", "tiered" / "off", "naive", "on" */
TR_API tr_status tr_kv_policy_parse(const char *name, tr_kv_policy *out, tr_error *err);
TR_API const char *tr_kv_policy_name(tr_kv_policy p);
TR_API tr_status tr_kv_bkp_parse(const char *name, tr_kv_bkp *out, tr_error *err);
TR_API const char *tr_kv_bkp_name(tr_kv_bkp b);

/* What the KV cache did, cumulative unless said otherwise: one struct for the library's callers,
 * the CLI's summaries, telemetry and benchmarks (tr_kv_stats_format writes it). */
typedef struct tr_kv_stats {
    tr_kv_policy policy;
    int64_t tokens;             /* positions held (per layer) */
    uint64_t hot_bytes;         /* DRAM holding K/V now (full: the positions held) */
    uint64_t cold_bytes;        /* cold pool pages written */
    uint64_t selected;          /* tokens attended at each layer's last attend call (all its
                                   rows), summed over layers */
    uint64_t bytes_read, read_ops; /* storage -> host */
    uint64_t score_ns, attn_ns, io_ns; /* selecting; attending (including the wait for reads,
                                   io_ns) */
    uint64_t steps;             /* attend calls */
    uint64_t evicted;           /* h2o: tokens evicted, summed over layers (now) */
    /* placement: moves between the pools, moves reversing one made within 64 steps, bytes copied
     * into the hot pool; selected tokens (not forced) found hot / read cold */
    uint64_t promotions, demotions, pingpong, migrated_bytes, sel_hot, sel_cold;
    /* of the tokens selected by a row that follows the layer's last selecting row, those that row
     * selected too: how stable selection is from step to step (real models: about 72 %) */
    uint64_t sel_follow, sel_repeat;
    /* the storage agent: bytes agent -> host as scores and as rows, bytes it read from storage,
     * its busy time, its own memory (now) */
    uint64_t csd_score_bytes, csd_row_bytes, csd_storage_bytes, csd_busy_ns, csd_mem_bytes;
    /* APP, now: beta, the split in effect once the host's budget caps it, the rates behind them
     * (scoring tokens/s host f_c and agent f_s; rows bytes/s hot copies b_c and agent b_s), the
     * selected fractions of the host's and the agent's parts */
    double beta, beta_split, f_c, f_s, b_c, b_s, alpha_c, alpha_s;
    /* --kv-tail: rows completed with the estimate and their summed mean share left to it; the
     * unselected (token, KV head) pairs and those summed */
    uint64_t tail_rows, tail_cand, tail_kept;
    double tail_share_sum;
    /* --kv-spec: rows selected with a speculative query, those selected (and read) during the
     * previous layer, the summed cosine between speculative and real queries */
    uint64_t spec_rows, spec_early;
    double spec_cos_sum;
    /* calls of several rows that attended exactly (prefill chunks), counted at layer 0; bytes
     * they read from storage; the sum over them of the cold pool's bytes at the call (each call
     * reads each cold page at most once, so prefill_bytes_read <= prefill_read_bound) */
    uint64_t prefill_chunks, prefill_bytes_read, prefill_read_bound;
    /* the storage agent's process (0: none), for figures of its own such as its peak RSS */
    int32_t csd_pid;
} tr_kv_stats;

typedef enum tr_kv_stats_style {
    TR_KV_STATS_TEXT, /* the summary: lines "<prefix>kv ...\n" (nothing for the full policy) */
    TR_KV_STATS_JSON, /* the telemetry members: "kv_policy": "tiered", "kv_tokens": ... (no braces) */
} tr_kv_stats_style;
/* Formats the stats (the library prints nothing). snprintf semantics: writes at most cap bytes,
 * NUL included, and returns the length the whole text needs. */
TR_API int tr_kv_stats_format(const tr_kv_stats *st, tr_kv_stats_style style, const char *prefix,
                              char *buf, size_t cap);

typedef struct tr_session_params {
    int32_t n_ctx;    /* context length in tokens; <= 0: min(training context, 4096) */
    int32_t n_batch;  /* most tokens one eval call computes at once; <= 0: 512 */
    tr_kv_params kv;  /* the KV cache (tr_kv_default_params) */
} tr_session_params;

TR_API void tr_session_get_kv_stats(const tr_session *s, tr_kv_stats *out);

TR_API tr_session_params tr_session_default_params(void);
/* Bytes of DRAM tr_session_create would allocate for these parameters (KV cache, or a KV policy's
 * pools and copies, plus the forward pass's scratch), so that a caller can fit several sessions
 * into a budget before allocating any; TR_E_ARG for parameters create would refuse. */
TR_API tr_status tr_session_estimate(const tr_model *m, const tr_session_params *params,
                                     uint64_t *bytes, tr_error *err);
/* Computes what the session needs (KV cache + scratch), reports it in the error if it cannot be
 * allocated, and allocates it once: nothing is allocated per token afterwards. */
TR_API tr_status tr_session_create(tr_model *m, const tr_session_params *params, tr_session **out,
                                   tr_error *err);
TR_API void tr_session_free(tr_session *s);
/* bytes of KV cache and scratch this session holds */
TR_API uint64_t tr_session_bytes(const tr_session *s);
TR_API int32_t tr_session_n_ctx(const tr_session *s);
TR_API int32_t tr_session_n_past(const tr_session *s);
/* rows computed together (the batch): a prefill's chunk */
TR_API int32_t tr_session_n_batch(const tr_session *s);
/* One memory budget, planned before anything is allocated: what goes where, in bytes. The cap
 * is --mem-budget (tr_model_params.mem_budget_bytes), else the memory cgroup's limit, else
 * MemAvailable; the margin (5 % of the cap, 16 MiB to 10 %) is for what no estimate sees (code,
 * thread stacks, allocator slack). What does not fit spills: routed experts beyond the expert
 * cache stay on storage, KV beyond the hot pool goes to the cold pool (kv_cold_bytes). */
typedef struct tr_mem_plan {
    uint64_t cap_bytes;
    const char *cap_source;   /* "--mem-budget", "the memory cgroup's limit", "MemAvailable" */
    uint64_t weight_bytes;    /* resident weights: the dense ones (all, for a dense model or
                                 --experts mmap) */
    uint64_t expert_cache_bytes; /* the expert cache's budget (MoE with the cache; 0 otherwise) */
    uint64_t expert_spill_bytes; /* routed experts left on storage */
    uint64_t kv_bytes;        /* KV in this process's DRAM: full's arrays, or the pooled plan
                                 (hot pool, working set, key copy, bookkeeping, the region
                                 shared with the storage agent) */
    uint64_t kv_full_bytes;   /* what every token hot (full) would take */
    uint64_t kv_hot_bytes;    /* the hot pool (pooled policies) */
    uint64_t kv_cold_bytes;   /* the cold pool on storage */
    uint64_t scratch_bytes;   /* the forward pass's */
    uint64_t margin_bytes;
    uint64_t total_bytes;     /* weights + expert cache + KV + the agent's + scratch + process
                                 + margin: what the budget holds */
    tr_kv_policy kv_policy;   /* auto resolved */
    int32_t n_ctx, n_batch;
    uint64_t process_bytes;   /* the process's own resident pages when the model began loading
                                 (code, libraries, stacks, the host program's memory): measured */
    uint64_t kv_agent_bytes;  /* the storage agent's own memory (--csd): on this machine, under
                                 the same budget, but in its process, so this one's peak RSS
                                 does not hold it (total_bytes - margin_bytes - kv_agent_bytes is
                                 this process's) */
} tr_mem_plan;
/* the plan of a session with these parameters on this model, nothing allocated; a budget that
 * cannot hold it is TR_E_BUDGET naming the minimum */
TR_API tr_status tr_session_plan(tr_model *m, const tr_session_params *params, tr_mem_plan *out,
                                 tr_error *err);
/* the plan the session was created with */
TR_API void tr_session_get_plan(const tr_session *s, tr_mem_plan *out);
/* the KV policy in effect (auto resolved) */
TR_API tr_kv_policy tr_session_kv_policy(const tr_session *s);
/* one line saying what --kv-policy auto chose and why ("" for another policy) */
TR_API const char *tr_session_kv_note(const tr_session *s);
/* drop every token from position `n` on (0 clears the session) */
TR_API tr_status tr_session_truncate(tr_session *s, int32_t n, tr_error *err);

/*
 * Appends n tokens to the session's timeline and computes them in chunks of n_batch. Logits:
 * `logits` NULL = none; otherwise with all_logits false it receives the logits of the last token
 * ([n_vocab]), with all_logits true those of every token ([n][n_vocab]). A context overflow is an
 * error that changes nothing.
 */
TR_API tr_status tr_session_eval(tr_session *s, const int32_t *tokens, int32_t n, float *logits,
                                 bool all_logits, tr_error *err);

/* One decode step of B independent sequences: token b is appended to sessions[b] and its logits
 * written to logits[b][n_vocab]. All sessions must belong to the same model. */
TR_API tr_status tr_decode_batch(tr_session **sessions, const int32_t *tokens, int32_t B,
                                 float *logits, tr_error *err);

/*
 * One forward pass over new tokens of several sessions: session b appends n_tokens[b] >= 1 tokens,
 * taken from `tokens` session after session (a continuous-batching step: one token for each
 * sequence that is generating, a chunk of a prompt for one that is being prefilled). All tokens
 * together must fit in sessions[0]'s batch size (n_batch); every weight, and every routed expert
 * the batch needs, is read once for all of them, and each row's result is what that session alone
 * would compute. `logits` (NULL: none) receives the logits of the last token of every session
 * with want_logits[b] (want_logits NULL: every session), packed in batch order
 * ([n_wanted][n_vocab]). An error (a bad token, a context overflow) advances no session.
 */
TR_API tr_status tr_batch_eval(tr_session **sessions, const int32_t *n_tokens, int32_t n_seq,
                               const int32_t *tokens, const bool *want_logits, float *logits,
                               tr_error *err);

/* ============================================================================================== */
/* Text, sampling, metadata and abort: what an application needs to drive a model from text.      */
/* (The chat-template section, messages -> prompt text, is separate.)                             */
/* ============================================================================================== */

/* ---- model metadata -------------------------------------------------------------------------- */

/* general.name, or "" when the file has none */
TR_API const char *tr_model_name(const tr_model *m);
/* A one-line description like llama.cpp's llama_model_desc: "<arch> <params> <file type>", e.g.
 * "llama 135M Q4_1". snprintf semantics: writes at most cap bytes (NUL included) and returns the
 * length the whole text needs. */
TR_API int tr_model_desc(const tr_model *m, char *buf, size_t cap);
/* elements of every weight tensor */
TR_API uint64_t tr_model_n_params(const tr_model *m);
/* llama.cpp's name of a general.file_type value ("Q4_K_M"); "unknown" for values it has none for */
TR_API const char *tr_file_type_name(int64_t file_type);
/* Metadata by key, as text (llama_model_meta_val_str): numbers in decimal (floats with the digits
 * that round-trip), booleans as true/false, strings as stored, arrays as [a, b, ...] with strings
 * quoted and escaped as JSON strings. snprintf semantics; -1 when the key is absent. */
TR_API int64_t tr_model_meta_count(const tr_model *m);
TR_API const char *tr_model_meta_key(const tr_model *m, int64_t i); /* NULL out of range */
TR_API int tr_model_meta_val(const tr_model *m, const char *key, char *buf, size_t cap);
TR_API int tr_model_meta_val_at(const tr_model *m, int64_t i, char *buf, size_t cap);

/* ---- tokenizer ------------------------------------------------------------------------------- */
/*
 * The tokenizers reproduce llama.cpp's llama_tokenize / llama_token_to_piece / llama_detokenize
 * token for token. Supported `tokenizer.ggml.model` values: "llama" (SentencePiece-style),
 * "gpt2" (byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names) and "gemma4"; others
 * ("bert", "t5", ...) are refused with TR_E_UNSUPPORTED naming the value.
 *
 * A loaded tokenizer is immutable: every call below may run from several threads at once. Token
 * ids are int32_t as in llama.cpp; -1 means "none".
 */
typedef struct tr_tokenizer tr_tokenizer;

/* The model's tokenizer, loaded with the model and owned by it (valid until tr_model_free); NULL
 * if the file carries no vocabulary (tokenizer.ggml.model absent). */
TR_API const tr_tokenizer *tr_model_tokenizer(const tr_model *m);
/* A tokenizer from any GGUF file with tokenizer.ggml.* metadata (vocabulary-only files included);
 * it copies what it needs: the tr_gguf may be closed afterwards. TR_E_FORMAT for corrupt
 * metadata (token types outside the enum, a byte-level BPE vocabulary without any of its 256
 * byte tokens, ...), TR_E_UNSUPPORTED for an unknown model or pre-tokenizer. */
TR_API tr_status tr_tokenizer_load(const tr_gguf *g, tr_tokenizer **out, tr_error *err);
TR_API void tr_tokenizer_free(tr_tokenizer *t);
/* What loading accepted as llama.cpp does but that changes what the file asked for, naming the
 * key, or NULL: special ids outside the vocabulary (ignored, the default kept), merges without a
 * separating space (ignored). Meant to be shown once, when the model is loaded. */
TR_API const char *tr_tokenizer_warning(const tr_tokenizer *t);

/*
 * Tokenize `len` bytes of `text` (need not be NUL-terminated or valid UTF-8), as llama_tokenize:
 * add_special adds BOS (and EOS) where the file asks for them (tokenizer.ggml.add_bos_token ...;
 * tr_tokenizer_add_bos says); parse_special turns the text of control and user-defined tokens
 * ("<|im_start|>") into those tokens, as a rendered chat template needs (without it only
 * user-defined ones are). Writes up to `cap` ids and the full count to *n_out; if they do not fit,
 * TR_E_ARG with *n_out = the count needed (call again with room). BPE vocabularies see invalid
 * UTF-8 as llama.cpp does (U+FFFD per bad byte); SPM keeps raw bytes through byte tokens.
 */
TR_API tr_status tr_tokenize(const tr_tokenizer *t, const char *text, size_t len,
                             bool add_special, bool parse_special, int32_t *out, size_t cap,
                             size_t *n_out, tr_error *err);
/* tr_tokenize that also counts the characters of the text the vocabulary cannot represent (no
 * token and no byte token covers them, and SPM has no <unk>): left out, as llama.cpp does, and
 * reported here so that the caller can say so. *first_dropped: the first one's byte, -1 if none.
 * Either pointer may be NULL. */
TR_API tr_status tr_tokenize_ex(const tr_tokenizer *t, const char *text, size_t len,
                                bool add_special, bool parse_special, int32_t *out, size_t cap,
                                size_t *n_out, size_t *n_dropped, int *first_dropped,
                                tr_error *err);

/*
 * The text of one token, as llama_token_to_piece(lstrip = 0): control and unknown tokens render
 * as their text only with render_special, else as nothing. Returns the bytes written (no NUL);
 * minus the size needed if it exceeds cap; 0 for an id outside the vocabulary. A piece may end in
 * the middle of a UTF-8 character that the next token completes.
 */
TR_API int tr_token_to_piece(const tr_tokenizer *t, int32_t id, char *buf, size_t cap,
                             bool render_special);

/*
 * Ids back to text, as llama_detokenize: remove_special drops a leading BOS and a trailing EOS
 * where the tokenizer adds them; unparse_special renders control tokens as their text. Writes up
 * to cap bytes (no NUL) and the full size to *n_out; TR_E_ARG if it does not fit (*n_out = the
 * size needed) or an id is out of range.
 */
TR_API tr_status tr_detokenize(const tr_tokenizer *t, const int32_t *ids, size_t n,
                               bool remove_special, bool unparse_special, char *buf, size_t cap,
                               size_t *n_out, tr_error *err);

TR_API int32_t tr_tokenizer_n_vocab(const tr_tokenizer *t);
TR_API const char *tr_tokenizer_model(const tr_tokenizer *t); /* "llama", "gpt2", "gemma4" */
TR_API const char *tr_tokenizer_pre(const tr_tokenizer *t);   /* as in the file, or "default" */
TR_API bool tr_tokenizer_add_bos(const tr_tokenizer *t);  /* tokenize(add_special) adds BOS */
TR_API bool tr_tokenizer_add_eos(const tr_tokenizer *t);  /* ... and EOS */

/* Token attribute bits, llama.cpp's llama_token_attr values: from the file's token types, adjusted
 * as llama.cpp does (end-of-generation texts become CONTROL, ...). */
enum {
    TR_TOKEN_ATTR_UNDEFINED = 0,
    TR_TOKEN_ATTR_UNKNOWN = 1u << 0,
    TR_TOKEN_ATTR_UNUSED = 1u << 1,
    TR_TOKEN_ATTR_NORMAL = 1u << 2,
    TR_TOKEN_ATTR_CONTROL = 1u << 3,
    TR_TOKEN_ATTR_USER_DEFINED = 1u << 4,
    TR_TOKEN_ATTR_BYTE = 1u << 5,
    TR_TOKEN_ATTR_NORMALIZED = 1u << 6,
    TR_TOKEN_ATTR_LSTRIP = 1u << 7,
    TR_TOKEN_ATTR_RSTRIP = 1u << 8,
    TR_TOKEN_ATTR_SINGLE_WORD = 1u << 9,
};

/* the token's text as stored (NUL-terminated; *len, if not NULL, gets its length); NULL out of
 * range */
TR_API const char *tr_token_text(const tr_tokenizer *t, int32_t id, size_t *len);
TR_API float tr_token_score(const tr_tokenizer *t, int32_t id);   /* 0 out of range */
TR_API uint32_t tr_token_attr(const tr_tokenizer *t, int32_t id); /* TR_TOKEN_ATTR_* bits */
/* the id of the token whose stored text is exactly these bytes, or -1 */
TR_API int32_t tr_token_find(const tr_tokenizer *t, const char *text, size_t len);

/* ---- special tokens -------------------------------------------------------------------------- */

typedef enum tr_special {
    TR_SPECIAL_BOS,
    TR_SPECIAL_EOS,
    TR_SPECIAL_EOT,
    TR_SPECIAL_EOM,
    TR_SPECIAL_UNK,
    TR_SPECIAL_SEP,
    TR_SPECIAL_PAD,
    TR_SPECIAL_MASK,
    TR_SPECIAL_NL, /* the newline token llama.cpp derives */
    TR_SPECIAL_FIM_PRE,
    TR_SPECIAL_FIM_SUF,
    TR_SPECIAL_FIM_MID,
    TR_SPECIAL_FIM_PAD,
    TR_SPECIAL_FIM_REP,
    TR_SPECIAL_FIM_SEP,
    TR_SPECIAL_COUNT
} tr_special;

TR_API int32_t tr_token_special(const tr_tokenizer *t, tr_special which); /* -1 if none */
TR_API int32_t tr_token_bos(const tr_tokenizer *t);
TR_API int32_t tr_token_eos(const tr_tokenizer *t);
TR_API int32_t tr_token_eot(const tr_tokenizer *t);
TR_API int32_t tr_token_eom(const tr_tokenizer *t);
TR_API int32_t tr_token_unk(const tr_tokenizer *t);
TR_API int32_t tr_token_pad(const tr_tokenizer *t);
/* true if the token ends generation: llama.cpp's EOG set (eos, eot, eom, the FIM pad/rep/sep and
 * tokens whose text is one of its end-of-turn strings: <|im_end|>, <|eot_id|>, <|return|>, ...) */
TR_API bool tr_token_is_eog(const tr_tokenizer *t, int32_t id);
/* true for control tokens (attribute CONTROL), which a reply shows only if asked */
TR_API bool tr_token_is_control(const tr_tokenizer *t, int32_t id);
/* the EOG set, ascending, *n its size; owned by the tokenizer */
TR_API const int32_t *tr_tokenizer_eog_ids(const tr_tokenizer *t, size_t *n);

/* ---- sampling -------------------------------------------------------------------------------- */
/*
 * logits [n_vocab] -> one token, with llama.cpp's samplers, defaults and default order:
 *   penalties -> top-k -> top-p -> min-p -> temperature -> draw (seeded)
 * so top-p and min-p see the untempered distribution. Penalties act on the last repeat_last_n
 * accepted tokens (tr_sampler_accept): a token seen c > 0 times gets logit / repeat_penalty if
 * positive, logit * repeat_penalty otherwise, then minus c * frequency_penalty + presence_penalty.
 * top-k <= 0, top-p >= 1 and min-p <= 0 are off; each filter keeps at least one token and
 * renormalises. temp <= 0 is greedy: the argmax of the penalised logits. Ties go to the lower id,
 * so a result depends only on (params, seed, accepted history, logits). The draw is xoshiro256**
 * seeded through splitmix64: the same seed gives the same tokens on every platform (it does not
 * reproduce llama.cpp's mt19937 draws, which depend on the C++ library).
 *
 * Everything a sampler needs is allocated by tr_sampler_create; sampling allocates nothing. A
 * sampler is not thread-safe: one per sequence.
 */

/* seed meaning "pick one at random" (llama.cpp's -s -1; 0xFFFFFFFF is read the same way) */
#define TR_SAMPLER_SEED_RANDOM UINT64_MAX

typedef struct tr_sampler_params {
    float temp;              /* --temp; <= 0: greedy */
    int32_t top_k;           /* --top-k; <= 0: off */
    float top_p;             /* --top-p, in (0, 1]; 1: off */
    float min_p;             /* --min-p, in [0, 1]; 0: off */
    float repeat_penalty;    /* --repeat-penalty, > 0; 1: off */
    int32_t repeat_last_n;   /* --repeat-last-n, >= 0; 0: no penalties (llama.cpp's -1, the
                                context size, is the caller's to resolve to n_ctx) */
    float presence_penalty;  /* --presence-penalty; 0: off */
    float frequency_penalty; /* --frequency-penalty; 0: off */
    uint64_t seed;           /* -s/--seed; TR_SAMPLER_SEED_RANDOM: random */
} tr_sampler_params;

/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, penalties off
 * (repeat_penalty 1, repeat_last_n 64), random seed */
TR_API tr_sampler_params tr_sampler_default_params(void);
/* TR_E_ARG with a message naming the flag ("--top-p must be in (0, 1], got 1.5") */
TR_API tr_status tr_sampler_validate(const tr_sampler_params *p, tr_error *err);

typedef struct tr_sampler tr_sampler;

/* validates the params and allocates everything for n_vocab tokens (tr_model_n_vocab) */
TR_API tr_status tr_sampler_create(const tr_sampler_params *p, int32_t n_vocab,
                                   tr_sampler **out, tr_error *err);
TR_API void tr_sampler_free(tr_sampler *s);
/* forget the accepted history and restart the random sequence from the seed */
TR_API void tr_sampler_reset(tr_sampler *s);
/* record a token of the sequence (prompt or generated) for the penalties; ids out of range are
 * ignored. Sampling does not accept by itself (llama.cpp's common_sampler_accept). */
TR_API void tr_sampler_accept(tr_sampler *s, int32_t token);
/* the seed in use (drawn at create time if the params asked for a random one), for -s */
TR_API uint64_t tr_sampler_seed(const tr_sampler *s);
TR_API const tr_sampler_params *tr_sampler_get_params(const tr_sampler *s);
/* one token from logits [n_vocab] (NaN counts as -inf); -1 for NULL arguments */
TR_API int32_t tr_sampler_sample(tr_sampler *s, const float *logits);

/* a candidate after the filters: its logit after penalties and temperature, its probability in
 * the distribution the draw uses */
typedef struct tr_token_prob {
    int32_t id;
    float logit;
    float p;
} tr_token_prob;
/* The chain up to the draw: the surviving candidates (*n >= 1), in the sampler's own array, valid
 * until the next call; descending when top-k is on (else unordered); greedy gives the argmax with
 * p = 1. For showing probabilities (--n-probs, logprobs). NULL and *n = 0 for NULL arguments. */
TR_API const tr_token_prob *tr_sampler_candidates(tr_sampler *s, const float *logits, size_t *n);

/* ---- abort ----------------------------------------------------------------------------------- */

/* Returns true to stop. Called from the thread computing, before every chunk of n_batch tokens
 * that tr_session_eval computes (so between prefill chunks and, for a decode loop that evaluates
 * one token per call, between tokens) and before every tr_decode_batch step; it must be cheap
 * and may read a flag set by a signal handler or another thread. */
typedef bool (*tr_abort_fn)(void *user);
/* Install (fn NULL: remove) the session's abort callback. A stopped call returns TR_E_ABORTED;
 * the chunks computed before it stay in the session (tr_session_n_past says how many: truncate
 * to undo, or evaluate the rest later). */
TR_API void tr_session_set_abort(tr_session *s, tr_abort_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------- */
/* Chat templates and reasoning                                                                   */
/*
 * A chat template turns a conversation into the prompt text the model was trained on. terrace
 * renders the GGUF's own `tokenizer.chat_template` (Jinja) exactly as Python's jinja2 does in
 * Hugging Face's apply_chat_template, or one of the built-in formats by name (chatml, llama3,
 * gemma, mistral-v1/v3/v3-tekken/v7/v7-tekken, llama2 variants).
 */

typedef struct tr_chat_message {
    const char *role;    /* "system", "user", "assistant", "tool", ... */
    const char *content;
} tr_chat_message;

typedef struct tr_chat_template tr_chat_template;

/* name_or_path: NULL or "" for the model's own tokenizer.chat_template (a model without one
 * falls back to the built-in format of its family where there is one, else fails naming
 * --chat-template); the name of a template the file carries (tokenizer.chat_template.NAME, e.g.
 * "tool_use"); a built-in format's name; a .jinja file; or Jinja text itself. The model's BOS and
 * EOS token texts become the bos_token / eos_token variables. */
TR_API tr_status tr_chat_template_load(const tr_model *m, const char *name_or_path,
                                       tr_chat_template **out, tr_error *err);
/* the same from an open GGUF file (no weights needed) */
TR_API tr_status tr_chat_template_load_gguf(const tr_gguf *g, const char *name_or_path,
                                            tr_chat_template **out, tr_error *err);
/* a Jinja template from text; bos_token / eos_token may be NULL (the variables are then
 * undefined) */
TR_API tr_status tr_chat_template_from_string(const char *source, const char *bos_token,
                                              const char *eos_token, tr_chat_template **out,
                                              tr_error *err);
/* "chatml" for a built-in, the file name for a file, "<family> (model)" for the model's template */
TR_API const char *tr_chat_template_name(const tr_chat_template *t);
/* Jinja text, or NULL for a built-in */
TR_API const char *tr_chat_template_source(const tr_chat_template *t);
/*
 * Renders a conversation. messages: either msgs[n] or messages_json (an OpenAI-style JSON array,
 * which may carry tool_calls, content parts, reasoning_content ...; takes precedence when not
 * NULL). context_json: a JSON object of extra template variables (tools, enable_thinking,
 * reasoning_effort ...) or NULL. now_iso ("2025-01-15T12:00:00"): the time strftime_now formats,
 * or NULL for the local time. *out is malloc'd; free it with tr_free. Template errors (a
 * raise_exception in the template, a value it cannot use) are TR_E_FORMAT with jinja2's message;
 * constructs the engine does not implement are TR_E_UNSUPPORTED, naming them.
 */
TR_API tr_status tr_chat_template_apply(const tr_chat_template *t, const tr_chat_message *msgs,
                                        size_t n, const char *messages_json,
                                        const char *context_json, bool add_generation_prompt,
                                        const char *now_iso, char **out, tr_error *err);
/* strings that end the assistant's turn for this template's family ("<|im_end|>" ...),
 * NULL-terminated; stopping at the tokenizer's end-of-generation tokens covers most models, these
 * cover files whose end-of-generation set misses the turn end */
TR_API const char *const *tr_chat_template_stop_strings(const tr_chat_template *t);
TR_API void tr_chat_template_free(tr_chat_template *t);
/* frees what the library allocated for the caller (rendered prompts, ...) */
TR_API void tr_free(void *p);

/*
 * Reasoning: separates a reply's reasoning from its answer as the text is generated, for display
 * and for an API's reasoning_content. Formats: gpt-oss harmony channels (analysis -> reasoning,
 * final and commentary -> answer), <think>...</think> at the start of a reply (Qwen3, DeepSeek-R1;
 * a prompt that ends inside an open <think>, as DeepSeek-R1's template leaves it, starts the reply
 * in reasoning). Plain text passes through as answer. A marker split across pieces is held back
 * until it is complete.
 */
typedef enum tr_reasoning_format {
    TR_REASONING_AUTO = 0, /* from the template and the prompt */
    TR_REASONING_NONE,     /* everything is answer, markers included (llama.cpp's
                              --reasoning-format none) */
} tr_reasoning_format;

typedef struct tr_reasoning tr_reasoning;

/* the text of one feed that became certain: reasoning first, then answer (pieces are tokens, so
 * one feed rarely holds both); valid until the next call */
typedef struct tr_reasoning_delta {
    const char *reasoning;
    size_t reasoning_len;
    const char *answer;
    size_t answer_len;
} tr_reasoning_delta;

/* t may be NULL (think tags only); prompt: the rendered prompt of this reply (its end says
 * whether the reply starts inside <think>), may be NULL */
TR_API tr_status tr_reasoning_create(const tr_chat_template *t, const char *prompt,
                                     tr_reasoning_format fmt, tr_reasoning **out, tr_error *err);
/* starts a new reply */
TR_API tr_status tr_reasoning_reset(tr_reasoning *r, const char *prompt, tr_error *err);
TR_API tr_status tr_reasoning_feed(tr_reasoning *r, const char *text, size_t len,
                                   tr_reasoning_delta *out, tr_error *err);
/* the end of the reply: releases text held back as a possible marker */
TR_API tr_status tr_reasoning_finish(tr_reasoning *r, tr_reasoning_delta *out, tr_error *err);
/* everything so far (NUL-terminated) */
TR_API const char *tr_reasoning_text(const tr_reasoning *r, size_t *len);
TR_API const char *tr_reasoning_answer(const tr_reasoning *r, size_t *len);
TR_API void tr_reasoning_free(tr_reasoning *r);

#ifdef __cplusplus
}
#endif
#endif
