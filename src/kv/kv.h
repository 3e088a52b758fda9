/*
 * The KV cache behind one interface, one instance per session.
 *
 * Policies (--kv-policy):
 *   full     all KV in DRAM, exact attention — the accuracy reference (the forward pass keeps its
 *            own fast path for it; tr_kv implements it too, for tests and comparisons)
 *   offload  KV beyond the hot budget in the cold pool on storage; exact attention that reads all
 *            of it every step (the naive SSD-offload baseline)
 *   h2o      accumulated-attention-score eviction with a recent window (permanent eviction)
 *   quest    pages of 16 tokens with per-channel min/max key bounds; attend over the top pages
 *            by upper bound
 *   tiered   ours: per step and layer, score every token by q.k with an INT8 (or INT4) copy of the
 *            keys with per-channel scales, select the top alpha fraction plus sinks and a recent
 *            window, gather their original F16 K/V into the compute working set, attend over them
 *
 * Selection (h2o/quest/tiered at alpha < 1), per query row at position p over the visible keys
 * (p - swa < key <= p): the sinks (key < n_sink) and the window (key > p - n_window) always, plus
 * ceil(alpha * visible) of the others: tiered the best by the attention mass they carry summed
 * over query heads (each head's softmax of the low-precision q.k over the visible keys; measured
 * against max and sum over heads in test_kv and on real perplexity, see kv_internal.h);
 * quest whole pages by the max over heads of their bound until they hold that many; h2o keeps
 * that many by accumulated attention and evicts the rest for good.
 *
 * Tiers: the hot pool (DRAM, --kv-hot bytes), the cold pool (--kv-cold DIR: per-layer append-only
 * segment files holding F16 K, F16 V and the low-precision key copy, with a checksum per page,
 * verified on every read; removed at free unless keep), and the compute working set (a separate
 * buffer the attention reads from, so a GPU backend can replace it).
 *
 * Threading: tr_kv_attend_rows parallelises on the pool it is given; every other call is made by
 * one thread at a time (the model lock serialises forward passes). The cold pool reads through its
 * own I/O worker threads (created once, at create).
 *
 * Rows: every query row is treated as a decode step at its position: the policy chooses the keys
 * of each row (teacher-forced perplexity measures what decoding would see). Policies that attend
 * every key (full, offload, and any policy at alpha >= 1) share one gather among all rows of a
 * call; h2o processes rows in order, evicting after each, exactly as sequential decoding would.
 */
#ifndef TR_KV_KV_H
#define TR_KV_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "terrace.h"

typedef enum {
    TR_KV_FULL = 0,
    TR_KV_OFFLOAD,
    TR_KV_H2O,
    TR_KV_QUEST,
    TR_KV_TIERED,
} tr_kv_policy;

/* Placement between the hot and the cold pool (with a cold pool; tiered only):
 *   OFF    static: the oldest non-sink token outside the window is demoted when the hot pool is
 *          full, nothing comes back
 *   NAIVE  bidirectional without hysteresis: every cold token the selection reads is promoted
 *          (its record is in the working set already), displacing the hot token with the fewest
 *          hits — the baseline that shows ping-pong
 *   ON     BKP: a u16 hit counter per token (selected = hit, an eighth taken off every step);
 *          a cold token is promoted when its hits reach a threshold and exceed the weakest hot
 *          token's by a margin, and a token stays at least a minimum number of steps where it
 *          was moved to, so it does not move back and forth
 * Placement never changes which tokens are selected (scoring uses the DRAM key copy), so it never
 * changes the output: only where the selected rows are read from. */
typedef enum { TR_KV_BKP_OFF = 0, TR_KV_BKP_NAIVE, TR_KV_BKP_ON } tr_kv_bkp;
tr_status tr_kv_bkp_parse(const char *name, tr_kv_bkp *out, tr_error *err);
const char *tr_kv_bkp_name(tr_kv_bkp b);

/* a token moving both ways within this many steps of its layer is a ping-pong move */
#define TR_KV_PINGPONG_W 64

/* tokens per cold page (and per quest page) */
#define TR_KV_PAGE 16

typedef struct tr_kv_params {
    tr_kv_policy policy;
    float alpha;          /* share of the context selected per step (default 0.2); 1: all */
    int32_t n_sink;       /* first tokens always attended (default 4) */
    int32_t n_window;     /* most recent tokens always attended (default 64) */
    int score_bits;       /* 8 or 4: precision of the key copy used for scoring (tiered) */
    int tail_bits;        /* tiered: 0 (default) attends the selection only; 8 or 4 also adds
                             the unselected tokens' share of each head's attention, estimated from
                             their scores and a low-precision copy of the values kept in DRAM
                             (host scoring only) */
    float tail_min;       /* tail: an unselected token is summed when its share of one of the
                             heads it serves is at least tail_min / (tokens scored); the others'
                             share goes back to the attended tokens. Default 1 (the uniform
                             share); 0 sums every unselected token */
    uint64_t hot_bytes;   /* hot pool budget; 0: everything hot (no cold pool needed) */
    const char *cold_dir; /* cold pool directory (needed when hot_bytes cannot hold n_ctx) */
    bool keep;            /* keep the cold files after free */
    uint64_t ws_bytes;    /* compute working set (gathered K/V of one layer); 0: auto (64 MiB, at
                             most the whole context); a step whose selection does not fit is
                             processed in chunks with an online softmax */
    int32_t n_threads;    /* most threads of a pool passed to attend (per-thread scratch); 0: the
                             online CPUs; a bigger pool works, its extra threads stay idle */
    int32_t io_threads;   /* parallel storage reads of the cold pool; 0: 64 */
    tr_kv_bkp bkp;        /* hot/cold placement (tiered with a cold pool; default OFF) */
    /* the storage agent (tiered with a cold pool): terrace-storaged scores the tokens whose pages
     * are on storage and returns the selected rows (see csd.h) */
    bool csd;
    int32_t csd_chunk;    /* tokens per scoring chunk and score block; 0: 1024 */
    double csd_gbps, csd_gflops, csd_link_gbps; /* throttles; 0: none */
    const char *csd_bin;  /* the agent's executable; NULL: $TERRACE_STORAGED, else next to the
                             running program (or one directory up) */
    const char *csd_socket; /* connect to a running `terrace-storaged --listen SOCKET` instead of
                               starting one (a disk shared by several sessions); NULL: start it */
    /* APP: beta = tokens scored by the host / tokens scored by the agent, among those on storage
     * (the host takes the most recent ones, as many as its key copy holds). < 0 (default): chosen
     * every step from the measured rates (see tr_kv_app_beta); >= 0: fixed (--kv-beta, for
     * sweeps; 0 = the agent scores all) */
    float beta;
    /* APP's host budget M_0 (--kv-host-keys, with the agent): the host keeps its low-precision
     * keys for the sinks and the most recent positions only, host_keys of them that it may score
     * beyond the window, the open page and one call's rows; the agent scores the rest from its
     * own copy. 0 (default): the host keeps every position's keys */
    int32_t host_keys;
    /* rows appended before they attend, at most (the forward pass's batch; 0: 512): the host's
     * key copy also covers the window of the first of them */
    int32_t max_rows;
    /* APP's rates given instead of measured (--kv-app-rates; 0: measured): host and agent
     * scoring, tokens/s; hot-pool copies and the agent's rows, bytes/s */
    double app_f_c, app_f_s, app_b_c, app_b_s;
    /* tiered, --kv-spec: a layer's selection may be made with a speculative query given by
     * tr_kv_spec_query before its own query exists, so that its scoring and its reads overlap
     * the previous layer's (InfiniGen's idea); not with tail_bits */
    bool spec;
} tr_kv_params;

typedef struct tr_kv_shape {
    int32_t n_layer, n_ctx;
    int32_t n_head, n_head_kv; /* GQA: query head h uses KV head h / (n_head / n_head_kv) */
    int32_t head_dim_k, head_dim_v;
} tr_kv_shape;

typedef struct tr_kv tr_kv;

tr_kv_params tr_kv_default_params(void);
/* parse "full", "offload", "h2o", "quest", "tiered" */
tr_status tr_kv_policy_parse(const char *name, tr_kv_policy *out, tr_error *err);
const char *tr_kv_policy_name(tr_kv_policy p);

/* Budgets are checked here, before anything is allocated: a configuration that cannot fit (hot
 * pool smaller than the sinks plus one page per layer, a working set under two pages, no cold
 * directory when one is needed, a cold directory that is not writable or lacks the space the
 * segment files reserve) is an error that says what it needs. */
tr_status tr_kv_create(const tr_kv_shape *shape, const tr_kv_params *params, tr_kv **out,
                       tr_error *err);
void tr_kv_free(tr_kv *kv);

/* bytes a configuration needs in DRAM (hot pool + working set + scoring copies + metadata and
 * scratch); 0 if the shape or parameters are invalid */
uint64_t tr_kv_dram_bytes(const tr_kv_shape *shape, const tr_kv_params *params);
/* bytes the cold pool reserves on storage (0: no cold pool needed) */
uint64_t tr_kv_cold_bytes_needed(const tr_kv_shape *shape, const tr_kv_params *params);
/* the directory holding this cache's segment files (a fresh one inside cold_dir), NULL if none;
 * without keep it is removed at create (the open files live on until free) */
const char *tr_kv_cold_path(const tr_kv *kv);

/* Store token `pos` of `layer` (positions are appended in order per layer; pos == the layer's
 * current length, or a rewrite after truncate). k: [n_head_kv * head_dim_k], v: [n_head_kv *
 * head_dim_v], f32 (stored as F16, plus the low-precision key copy). */
tr_status tr_kv_append(tr_kv *kv, int32_t layer, int32_t pos, const float *k, const float *v,
                       tr_error *err);

/* Attention of `rows` query rows of one layer: row r is at position pos[r] (it may attend to keys
 * at positions <= pos[r], already appended) with query q[r * q_stride ..] ([n_head * head_dim_k],
 * after RoPE and any pre-scaling); scores are multiplied by `scale`; `sinks` (per head, may be
 * NULL) add a softmax sink; `swa` > 0 restricts keys to pos - key < swa. Output:
 * out[r * out_stride ..] = [n_head * head_dim_v]. The policy decides which keys take part. */
tr_status tr_kv_attend_rows(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t rows,
                            const int32_t *pos, const float *q, size_t q_stride, float scale,
                            const float *sinks, int32_t swa, float *out, size_t out_stride,
                            tr_error *err);

/* --kv-spec: the queries that will select the tokens `layer` attends for rows at positions
 * pos[0..rows) (after RoPE and any pre-scaling, as tr_kv_attend_rows takes them; `scale` and
 * `swa` are that layer's), made before the layer's own queries exist: the forward pass projects
 * the previous layer's input with this layer's query weights. The row's own token, whose key is
 * not stored yet, is always attended and not scored; the attention itself uses the real queries.
 * - one row, given before tr_kv_attend_rows of layer - 1: that call makes the selection and
 *   starts its reads while its own reads are in flight, so scoring and storage overlap across
 *   layers;
 * - otherwise: the next tr_kv_attend_rows of `layer` selects with them.
 * q must stay valid until that call. An error if spec is off or the layer is out of range. */
tr_status tr_kv_spec_query(tr_kv *kv, int32_t layer, int32_t rows, const int32_t *pos,
                           const float *q, size_t q_stride, float scale, int32_t swa,
                           tr_error *err);

/* drop positions >= n in every layer (h2o: tokens evicted before n stay evicted) */
tr_status tr_kv_truncate(tr_kv *kv, int32_t n, tr_error *err);

/* save / restore the whole cache (all layers, both pools) to / from one file; restore needs the
 * same shape, policy and score bits, verifies every block's checksum, and leaves the cache empty
 * if it fails */
tr_status tr_kv_save(const tr_kv *kv, const char *path, tr_error *err);
tr_status tr_kv_restore(tr_kv *kv, const char *path, tr_error *err);

typedef struct tr_kv_stats {
    int64_t tokens; /* positions held (per layer) */
    uint64_t hot_bytes, cold_bytes;
    uint64_t selected;          /* tokens attended at each layer's last attend call (a call of
                                   several rows: summed over them), summed over layers */
    uint64_t bytes_read;        /* storage -> host, cumulative */
    uint64_t score_ns, attn_ns; /* cumulative */
    uint64_t steps;             /* attend calls */
    uint64_t io_ns;             /* time attend waited for storage reads, cumulative (in attn_ns) */
    uint64_t read_ops;          /* storage reads issued, cumulative */
    uint64_t evicted;           /* h2o: tokens evicted, summed over layers */
    /* placement, cumulative, summed over layers */
    uint64_t promotions, demotions; /* cold -> hot, hot -> cold moves */
    uint64_t pingpong;              /* moves reversing one made within TR_KV_PINGPONG_W steps */
    uint64_t migrated_bytes;        /* bytes copied into the hot pool by promotions (a demotion
                                       copies nothing: the cold copy is written through) */
    uint64_t sel_hot, sel_cold;     /* selected (non-forced) tokens found hot / read cold */
    /* of the tokens selected by a row that follows the layer's last selecting row (the next
     * position), those that row selected too: how stable selection is from one step to the next,
     * which is what BKP can use (real models at alpha 0.2 keep about 72%) */
    uint64_t sel_follow, sel_repeat;
    /* the storage agent, cumulative: bytes agent -> host as scores and as K/V rows, bytes it
     * read from storage, its busy time, its own memory */
    uint64_t csd_score_bytes, csd_row_bytes, csd_storage_bytes, csd_busy_ns, csd_mem_bytes;
    /* APP: the last beta and the rates it came from: host and agent scoring (tokens/s), host and
     * agent row rates (bytes/s: DRAM copy, agent reads to the shared working set), the measured
     * selection fractions of the host's and the agent's parts */
    double beta, f_c, f_s, b_c, b_s, alpha_c, alpha_s;
    /* the split in effect at the last layer scored: beta after the host budget M_0 (the
     * positions the host keeps keys for, --kv-host-keys) caps the host's share */
    double beta_split;
    /* tail: rows completed with the estimate, and their summed share of attention left to it
     * (mean over query heads), cumulative */
    uint64_t tail_rows;
    uint64_t tail_cand, tail_kept; /* unselected (token, KV head) pairs, and those summed */
    double tail_share_sum;
    /* --kv-spec, cumulative: selections made with a speculative query, those made (and their
     * reads started) during the previous layer, and the summed cosine between each row's
     * speculative and real query (all heads as one vector) */
    uint64_t spec_rows, spec_early;
    double spec_cos_sum;
} tr_kv_stats;
void tr_kv_get_stats(const tr_kv *kv, tr_kv_stats *out);

#endif
