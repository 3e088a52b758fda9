/*
 * terrace's test and benchmark seam: parts of the library driven on their own, without a model —
 * the KV cache (bench/bench_kv.c and the KV tests), the kernels (bench/bench_kernels.c) and the
 * expert cache's read path (bench/bench_expert_io.c) — and the knobs only benchmarks and tests
 * turn (baselines, fault injection, ablations).
 *
 * Not a stable API: it changes with the library, and the shared library does not export it (link
 * libterrace.a). Applications use terrace.h.
 */
#ifndef TERRACE_SEAM_H
#define TERRACE_SEAM_H

#include "terrace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* The KV cache on its own                                                                         */

typedef struct tr_kv_shape {
    int32_t n_layer, n_ctx;
    int32_t n_head, n_head_kv; /* the most over layers; GQA: query head h uses KV head
                                  h / (n_head / n_head_kv) */
    int32_t head_dim_k, head_dim_v;
    /* per layer (NULL: n_head and n_head_kv in every layer); only the full policy allows the
     * counts to differ between layers */
    const int32_t *layer_n_head, *layer_n_head_kv;
} tr_kv_shape;

typedef struct tr_kv tr_kv;

/* --kv-spec: the queries layer + 1 will have for the rows of an attend call, speculated from this
 * layer's input (the forward pass projects it with layer + 1's norm and query weights), as
 * tr_kv_attend takes them; swa: layer + 1's window */
typedef struct tr_kv_next_query {
    const float *q;
    size_t q_stride;
    float scale;
    int32_t swa;
} tr_kv_next_query;
/* rows [row0, row0 + rows) of the caller's batch; q valid until layer + 1 has attended */
typedef tr_status (*tr_kv_next_fn)(void *ctx, int32_t layer, int32_t row0, int32_t rows,
                                   tr_kv_next_query *out, tr_error *err);

/* One layer's queries handed to the cache: row r is at position pos[r] (it attends keys at
 * positions <= pos[r], already appended) with query q[r * q_stride ..] ([n_head][head_dim_k],
 * after RoPE and any pre-scaling); scores are multiplied by `scale`; `sinks` (per head, may be
 * NULL) add a softmax sink; swa > 0 restricts keys to pos - key < swa. The output goes to
 * out[r * out_stride ..] ([n_head][head_dim_v]). One row is a decode step; several rows are a
 * chunk of a prefill (the selective policies treat each row as a decode step at its position). */
typedef struct tr_kv_query {
    int32_t layer, rows;
    const int32_t *pos;
    const float *q;
    size_t q_stride;
    float scale;
    const float *sinks;
    int32_t swa;
    float *out;
    size_t out_stride;
    /* where layer + 1's speculated queries come from, asked for when the policy wants them
     * (tiered with spec); next NULL: none. next_row0: these rows' first row in that batch */
    tr_kv_next_fn next;
    void *next_ctx;
    int32_t next_row0;
} tr_kv_query;

/* Budgets are checked before anything is allocated: a configuration that cannot fit (a hot pool
 * smaller than the sinks plus one page per layer, a working set under two pages, no cold
 * directory when one is needed, one that is not writable or lacks the space the segment files
 * reserve) is an error that says what it needs. */
tr_status tr_kv_create(const tr_kv_shape *shape, const tr_kv_params *params, tr_kv **out,
                       tr_error *err);
void tr_kv_free(tr_kv *kv);
/* bytes a configuration needs in DRAM in this process (everything create allocates, the region
 * shared with the storage agent included); 0 if the shape or the parameters are invalid */
uint64_t tr_kv_dram_bytes(const tr_kv_shape *shape, const tr_kv_params *params);
/* bytes the storage agent (--csd) allocates in its own process for this configuration: the same
 * machine's memory, not this process's RSS; 0 without the agent or for invalid parameters */
uint64_t tr_kv_agent_dram_bytes(const tr_kv_shape *shape, const tr_kv_params *params);
/* bytes the cold pool reserves on storage (0: none needed) */
uint64_t tr_kv_cold_bytes_needed(const tr_kv_shape *shape, const tr_kv_params *params);
/* the directory holding this cache's segment files, NULL if none */
const char *tr_kv_cold_path(const tr_kv *kv);

/* Store token `pos` of `layer` (pos == the layer's length: positions come in order per layer).
 * k: [n_head_kv * head_dim_k], v: [n_head_kv * head_dim_v] of that layer, f32 (stored as F16). */
tr_status tr_kv_append(tr_kv *kv, int32_t layer, int32_t pos, const float *k, const float *v,
                       tr_error *err);
/* attention of one layer's query rows; the policy decides which keys take part. pool: the
 * threads to compute on (NULL: the caller's thread) */
tr_status tr_kv_attend(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, tr_error *err);
/* the queries of n caches (distinct, one layer): what tr_kv_attend of each in turn computes,
 * caches of the full policy TR_KV_ATTEND_MANY_MAX at a time in one pool run (a batched decode
 * step: the threads share every session's tiles, and wake once) */
#define TR_KV_ATTEND_MANY_MAX 64
tr_status tr_kv_attend_many(tr_kv *const *kvs, tr_pool *pool, const tr_kv_query *qs, int n,
                            tr_error *err);
/* drop positions >= n in every layer (h2o: tokens evicted before n stay evicted) */
tr_status tr_kv_truncate(tr_kv *kv, int32_t n, tr_error *err);
/* the whole cache (every layer, both pools) to / from one file; restore needs the same shape,
 * policy and score bits, verifies every block's checksum and leaves the cache empty if it fails.
 * Not for the full policy (its arrays are the forward pass's, saved by the session). */
tr_status tr_kv_save(const tr_kv *kv, const char *path, tr_error *err);
tr_status tr_kv_restore(tr_kv *kv, const char *path, tr_error *err);
void tr_kv_get_stats(const tr_kv *kv, tr_kv_stats *out);

/* ---- benchmark baselines, ablations and faults ---------------------------------------------- */

/* how tiered turns per-head scores into one score per token: MAX and SUM of the raw q.k; PMAX and
 * PSUM (the default) of each head's softmax over the visible keys */
typedef enum { TR_KV_AGG_MAX = 0, TR_KV_AGG_SUM, TR_KV_AGG_PMAX, TR_KV_AGG_PSUM } tr_kv_agg;
/* per-channel equalisation of keys before tiered's low-precision copy (default ABSMAX) */
typedef enum { TR_KV_EQ_NONE = 0, TR_KV_EQ_ABSMAX, TR_KV_EQ_SQRT } tr_kv_eq;

typedef struct tr_kv_seam {
    /* selective policies on the host: up to read_gap unselected cold tokens between two
     * selected ones of a page are read too, joining the reads (default 1); the storage agent's
     * own joins, in its memory (csd_read_gap, default 1) */
    int32_t read_gap, csd_read_gap;
    /* a selection that fits the working set is read in `pipe` chunks (1..4, default 4), all in
     * flight, attended as each arrives, when it has at least pipe_min tokens (default 1024) */
    int32_t pipe, pipe_min;
    /* the storage agent's baseline: tiered host scoring that first reads every cold page's key
     * copy from storage each step, as a host without the DRAM copy would */
    bool pull_keys;
    /* the tail also sums every tail_every-th unselected token whatever its share (what the
     * estimate costs at a given fraction); 0: off */
    int32_t tail_every;
    tr_kv_agg agg;
    tr_kv_eq eq; /* takes effect when a layer's first page completes */
    /* the fault_write_at-th page write from now fails with fault_errno (0: none) */
    uint64_t fault_write_at;
    int fault_errno;
} tr_kv_seam;
/* the knobs in effect; set changes them all (get, change some, set). Only the pooled policies
 * (not full) have them. */
void tr_kv_seam_get(const tr_kv *kv, tr_kv_seam *out);
tr_status tr_kv_seam_set(tr_kv *kv, const tr_kv_seam *s, tr_error *err);
/* the cold pool's files are read with O_DIRECT */
bool tr_kv_seam_direct(const tr_kv *kv);
/* the storage agent's process (0: none) */
int tr_kv_seam_agent_pid(const tr_kv *kv);
/* --kv-spec: the queries that will select the tokens `layer` attends for rows at positions
 * pos[0..rows), given directly instead of through tr_kv_query.next (tests that drive the timing
 * themselves): given before the attend call of layer - 1 (one row), that call selects and reads
 * ahead; otherwise the next attend call of `layer` selects with them. q must stay valid until
 * then. An error if spec is off or the layer is out of range. */
tr_status tr_kv_seam_spec_query(tr_kv *kv, int32_t layer, int32_t rows, const int32_t *pos,
                                const float *q, size_t q_stride, float scale, int32_t swa,
                                tr_error *err);

/* ---------------------------------------------------------------------------------------------- */
/* Kernels                                                                                         */

/* a kernel family by name ("avx512", "avx2", "scalar"; NULL: the best this CPU runs), NULL if it
 * is not available here */
typedef struct tr_kernels tr_kernels;
const tr_kernels *tr_seam_kernels(const char *isa);
const char *tr_seam_kernels_isa(const tr_kernels *k);
/* y = W x for one row x of n_in floats against n_out rows of W (type t, row_bytes each), on the
 * pool, as the forward pass computes it; scratch: tr_seam_matvec_scratch(t, n_in) bytes */
size_t tr_seam_matvec_scratch(tr_type t, int64_t n_in);
void tr_seam_matvec(tr_pool *pool, const tr_kernels *k, tr_type t, const void *w, size_t row_bytes,
                    int64_t n_in, int64_t n_out, const float *x, float *y, void *scratch);
/* Y = W X for M rows of X (n_in floats each; Y: M rows of n_out) on the pool (NULL: the caller
 * alone), through the family's gemm where it has one for t and M is large enough, or, gemm false,
 * through its per-row kernels as if it had none; scratch: tr_seam_matmul_scratch(t, n_in, M) */
size_t tr_seam_matmul_scratch(tr_type t, int64_t n_in, int64_t M);
void tr_seam_matmul(tr_pool *pool, const tr_kernels *k, bool gemm, tr_type t, const void *w,
                    size_t row_bytes, int64_t n_in, int64_t n_out, const float *x, int64_t M,
                    float *y, void *scratch);
/* fn(ctx, ith, nth) once for every part ith of the pool's size, the caller among the threads */
void tr_seam_pool_run(tr_pool *pool, void (*fn)(void *ctx, int ith, int nth), void *ctx);
uint16_t tr_seam_f32_to_f16(float x);
uint16_t tr_seam_f32_to_bf16(float x);

/* ---------------------------------------------------------------------------------------------- */
/* The expert cache's read path                                                                   */

/* n_layer layers of n_expert experts in one file, each expert n_parts contiguous parts at
 * offset[l][p] + e * bytes[l][p]. One pass creates a cache that holds everything and requests
 * experts 0 .. topk-1 of every layer in turn, as a cold decode step would: the time from each
 * layer's request to its last expert handed out, summed, and the reads the cache issued. */
typedef struct tr_seam_expert_pass {
    int fd;
    const char *path;
    int32_t n_layer, n_expert, topk, n_parts;
    const uint64_t *offset, *bytes; /* [n_layer][n_parts] */
    int io_threads;
    bool buffered;       /* buffered pread instead of O_DIRECT */
    uint32_t read_chunk; /* bytes per read (0: the cache's default) */
    /* results */
    double seconds;
    uint64_t reads;
    bool direct_io;
} tr_seam_expert_pass;
tr_status tr_seam_expert_read_pass(tr_seam_expert_pass *p, tr_error *err);

#ifdef __cplusplus
}
#endif
#endif
