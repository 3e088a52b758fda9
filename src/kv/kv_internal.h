/*
 * Inside the tiered KV cache: the instance, per-layer state, and the functions the subsystems
 * (pools and segment files, scoring and selection, attention, save/restore) share. Tests include
 * this header to measure selection and scoring directly and to inject faults.
 *
 * Memory: everything below is allocated once in tr_kv_create from a plan that the budget check
 * computed first (kv_plan); nothing is allocated per token or per step.
 */
#ifndef TR_KV_KV_INTERNAL_H
#define TR_KV_KV_INTERNAL_H

#include <math.h>
#include <pthread.h>
#include <sys/types.h>
#include <stdatomic.h>
#include <stddef.h>

/* XXH3_state_t is only public with this */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "core/pool.h"
#include "experts/io.h"
#include "kv/kv.h"
#include "tensor/kernels.h"

/* default I/O workers: the random reads of a selection need many in flight for an SSD to reach
 * its random-read rate (64 against 16 workers: bench/results/kv.md) */
#define TR_KV_IO_THREADS 64

/* rows whose online-softmax state one attend pass keeps (bigger calls go in blocks) */
#define TR_KV_ROW_BLOCK 512

/* where a token's K/V live */
enum { TR_KV_TOK_NONE = 0, TR_KV_TOK_HOT, TR_KV_TOK_COLD, TR_KV_TOK_EVICTED };

/* A selection of the token adds TR_KV_HIT to its `hits`; with BKP on, every decode step takes
 * an eighth of them away again (kv_bkp.c), so hits / TR_KV_HIT reads as "selected in about that
 * many of the last ~8 steps" and saturates near 8 (128). */
#define TR_KV_HIT 16

/* Per (layer, position). `hits` counts how often a selective policy chose the token, recently:
 * the bidirectional pools promote cold tokens with many hits and demote hot ones with few;
 * `slot` and `where` let a token live in any hot slot. */
typedef struct tr_kv_tok {
    uint32_t slot; /* hot slot when where == HOT */
    uint16_t hits; /* TR_KV_HIT per selection, decayed, saturating */
    uint8_t where; /* TR_KV_TOK_* */
    uint8_t chosen; /* the layer's last selection chose it (not forced): sel_repeat */
} tr_kv_tok;

/* aggregation of per-head scores into one score per token (tiered, quest). MAX and SUM act on
 * the raw q.k; PMAX and PSUM (tiered) first turn each head's scores into its own softmax over the
 * visible keys (the sinks and the window, attended anyway, included): PMAX ranks a token by its
 * best log-probability relative to each head's peak, PSUM by the attention mass it carries summed
 * over heads (what leaving it out costs the heads). PSUM is the default: test_kv measures it best
 * on synthetic keys (top-2% recall, softmax mass held), and on SmolLM2 at 4K, alpha 0.1 its
 * perplexity is +1.3% over full against +4.2% for MAX and +3.0% for SUM. */
typedef enum {
    TR_KV_AGG_MAX = 0,
    TR_KV_AGG_SUM = 1,
    TR_KV_AGG_PMAX = 2,
    TR_KV_AGG_PSUM = 3
} tr_kv_agg;

/* per-channel equalisation of keys before the low-precision copy (tiered) */
typedef enum { TR_KV_EQ_NONE = 0, TR_KV_EQ_ABSMAX = 1, TR_KV_EQ_SQRT = 2 } tr_kv_eq;

typedef struct tr_kv_layer {
    int32_t len;           /* positions held */
    int32_t pages_written; /* complete pages in the segment file (written through, in order) */
    int32_t demote_next;   /* every non-sink position below it is not hot (demotion cursor) */
    int32_t n_free;        /* free hot slots (stack below) */
    int32_t n_evicted;     /* h2o */
    uint32_t *free_slots;  /* [hot_slots] */
    int32_t *slot_pos;     /* [hot_slots] position held by a slot, -1 free */
    uint8_t *hot;          /* [hot_slots][rec] F16 K (n_kv x hdk) then F16 V (n_kv x hdv) */
    tr_kv_tok *tok;        /* [n_ctx] */
    uint64_t *hash;        /* [n_ctx] hash of each record written to the segment file */
    uint8_t *qk;           /* tiered: [n_kv][hk_rows][qrow] low-precision key copy */
    uint8_t *qv;           /* tail: [n_kv][n_ctx][vrow] low-precision value copy */
    float *eq;             /* tiered: [n_kv][hdk_pad] per-channel scale the copy was divided by */
    bool calibrated;       /* eq came from the first page (else all ones) */
    uint16_t *pmin, *pmax; /* quest: [n_kv][n_pages][hdk] F16 per-channel key bounds per page */
    float *mass;           /* h2o: [n_ctx] accumulated attention probability (sum over heads) */
    uint32_t *moved;       /* BKP: [n_ctx] (step << 1 | 1 promoted / 0 demoted) of the last
                              move, 0 never moved */
    uint32_t step;         /* decode steps (selective rows) of this layer, from 1 */
    int32_t sel_last_pos;  /* the row of this layer's last selection (sel_repeat), -2 none */
    int32_t att_hi;        /* BKP: the highest position a row has attended from, -1 none */
    int32_t csd_inval;     /* the first page rewritten since the agent last scored this layer
                              (INT32_MAX: none) */
    int fd;                /* segment file, -1 without a cold pool */
    uint64_t selected;     /* tokens attended at this layer's last attend call (all rows) */
} tr_kv_layer;

/* One gather: a batch of storage reads into the working set, completed by the I/O workers. */
/* gathers in flight at once: the two halves of a working set too small for the selection, or
 * the chunks of one selection whose attention runs while the later chunks are still read */
#define TR_KV_PIPE    4 /* chunks of one pipelined selection */
#define TR_KV_GATHERS (2 * TR_KV_PIPE) /* --kv-spec: two layers' selections in flight */

typedef struct tr_kv_gather {
    struct tr_kv *kv;
    tr_io_job *jobs;  /* [ws_cap] */
    int32_t *job_pos; /* [ws_cap] first position of each job */
    int32_t layer;
    int32_t n_jobs;
    pthread_mutex_t mu; /* guards pending, err_* */
    pthread_cond_t cv;
    int32_t pending;
    bool failed;
    char err_msg[4608];
    uint64_t bytes;
    uint64_t csd_seq;      /* the storage agent's request for this gather */
    uint64_t csd_rows_ns0; /* the agent's rows time when it was posted */
    bool keys;             /* jobs read pages' key copies and trailers (tr_kv_pull_keys) */
    size_t key_shift;      /* ... starting this far into each job's buffer */
} tr_kv_gather;

struct tr_kv {
    tr_kv_shape shape;
    tr_kv_params params; /* cold_dir points at cold_dir_copy */
    char *cold_dir_copy;
    const tr_kernels *kern;
    int32_t group;     /* query heads per KV head */
    size_t krec, rec;  /* bytes of one token's K (all KV heads) and K+V */
    int32_t hot_slots; /* per layer */
    bool cold;         /* a cold pool exists */
    bool direct;       /* segment files opened with O_DIRECT */
    int32_t n_pages;   /* per layer, ceil(n_ctx / PAGE) */
    /* tiered */
    tr_type qtype;   /* TR_TYPE_Q8_0 or TR_TYPE_Q4_0 */
    int32_t hdk_pad; /* head_dim_k rounded up to 32 */
    size_t qrow;     /* bytes of one key head's low-precision row */
    size_t q8row;    /* bytes of one query head in Q8_0 */
    /* the host's key copy (qk) per KV head: hk_sink rows for positions [0, hk_sink), then a ring
     * of hk_ring rows for the others (position p in row hk_sink + (p - hk_sink) % hk_ring); it
     * holds the sinks and [len - hk_ring, len). Without --kv-host-keys: hk_sink 0, hk_ring
     * n_ctx, every position in its own row (hk_wrap false) */
    int32_t hk_sink, hk_ring, hk_rows;
    bool hk_wrap;
    /* tail (params.tail_bits): the value copy's format, and the current row's estimate of what
     * the unselected tokens add, per query head: tail_o[h] (share-weighted sum of their values,
     * hdv_pad floats) and tail_e[h] (their share); tail_row says it belongs to the row just
     * selected */
    tr_type vtype;
    int32_t hdv_pad;
    size_t vrow;
    float *tail_o, *tail_e;
    int32_t *tail_idx, *tail_n; /* [n_kv][n_ctx]: the positions summed per KV head; their count */
    uint64_t tail_cand, tail_kept; /* statistics: unselected (token, KV head) pairs, summed ones */
    int32_t tail_every; /* benchmarks: also sum every tail_every-th unselected token whatever its
                           share (the cost at a given fraction summed); 0: off */
    bool tail_row;
    uint64_t tail_rows; /* statistics: rows completed, their summed mean share */
    double tail_share_sum;
    tr_kv_agg agg;
    tr_kv_eq eq_mode;
    int32_t pipe; /* chunks a fitting selection is read and attended in (1..TR_KV_PIPE) */
    /* a baseline for the storage agent (bench_kv --pull-keys): tiered host scoring that first
     * reads every cold page's key copy of the layer from storage, as a host without the DRAM
     * copy would (the scores then come from the DRAM copy: the same bytes, verified) */
    bool pull_keys;
    uint8_t *pull_buf; /* [n_pages][pull_stride], allocated at the first pull */
    size_t pull_stride;
    int32_t pipe_min; /* ... when at least this many tokens are attended */
    int32_t read_gap; /* selective policies: up to this many unselected cold tokens between two
                         selected ones of a page are read too, joining two reads into one */
    int32_t csd_gap;  /* the storage agent's own: it reads runs up to this many records' bytes
                         apart as one, into its memory, and sends only the selected records */
    /* segment file geometry */
    uint64_t data_off; /* first page */
    size_t page_bytes, page_qoff, page_toff;
    tr_kv_layer *layers;
    /* working set: ws_cap record slots (F16 K then V, as in the pools) */
    uint8_t *ws;
    int32_t ws_cap;
    tr_kv_gather gath[TR_KV_GATHERS];
    tr_io_pool *io;
    char *cold_path;  /* directory of the segment files */
    uint8_t *pagebuf; /* one page, aligned */
    uint8_t *rec_tmp; /* one record */
    /* selection scratch, [n_ctx] each */
    int32_t *sel;  /* selected positions, ascending */
    int32_t *cand; /* candidate positions */
    float *cscore; /* candidate scores */
    uint8_t *mark;
    int32_t *pg_order; /* quest: [n_pages] */
    float *qf;         /* [n_head][hdk_pad] query times eq */
    uint8_t *q8;       /* [n_head][q8row] */
    /* attention scratch */
    int32_t n_scratch;  /* threads with scratch */
    float *th_s;        /* [n_scratch][ws_cap] scores */
    uint16_t *th_p;     /* [n_scratch][ws_cap] probabilities as F16 */
    uint16_t *th_q;     /* [n_scratch][hdk] query as F16 */
    float *st_m;        /* [ROW_BLOCK][n_head] online softmax running max */
    double *st_l;       /* [ROW_BLOCK][n_head] running sum */
    float *hs;          /* h2o, tiered: [n_head][n_ctx] scaled scores of the current row */
    float *hz;          /* tiered: [n_head] per-head softmax max and sum (normalised aggregation) */
    int32_t *vlo, *vhi; /* [ROW_BLOCK] each row's visible range within the gathered list */
    uint8_t *skip;      /* [n_ctx] entries of the gathered list read only to join reads */
    /* the storage agent */
    bool csd;
    int32_t csd_chunk;
    struct tr_csd_ctl *csd_ctl; /* the shared region (the working set lives in it) */
    size_t csd_bytes;
    int csd_fd;
    pid_t csd_pid;  /* the agent when it is our child; 0 otherwise */
    int csd_sock;   /* the connection to a user-started agent; -1 otherwise */
    char csd_where[160]; /* "pid N" or "pid N at SOCKET", for messages */
    char csd_dead[512]; /* why the agent is gone; empty while it runs */
    float *csd_m, *csd_c; /* [n_head] group B max; [2][n_head] factors */
    double *csd_z;        /* [n_head] group B sum */
    /* APP: exponential averages of the measured rates (0: not measured yet), the current beta */
    double app_tc, app_ts;       /* ns per token scored: host, agent */
    double app_bc, app_bs;       /* bytes per ns of rows: hot-pool copies, agent reads */
    double app_ac, app_as;       /* selected fraction of the host's / agent's part */
    double app_beta;
    double app_beta_split; /* app_beta once the host's share is capped (M_0): the split used */
    bool app_probed;             /* the start-up measurement is done (tr_kv_app_probe) */
    uint32_t app_explore;        /* layers scored with a split (TR_KV_APP_EXPLORE) */
    int8_t app_exploring;        /* this layer's split feeds the starved side: 1 host, 2 agent */
    double app_beta_first;       /* the split of the first layer scored with the agent */
    int32_t app_host_lo;         /* this step's split: the host scores written positions >= it */
    /* --kv-spec. The queries given for a layer of each parity (layer -1: none; the forward pass
     * gives layer l + 1's before layer l attends, and layer l's is still to be used then) ... */
    struct spec_in {
        int32_t layer, rows, swa;
        const int32_t *pos;
        const float *q;
        size_t stride;
        float scale;
    } spec_in[2];
    /* ... and a selection made with it during the previous layer (layer -1: none): its gathered
     * list in plist[layer % 2], its reads started (started) in that half of the working set */
    struct {
        int32_t layer, pos, n, nT;
        bool started, skip; /* skip: pskip[layer % 2] marks joined entries */
        const float *q;     /* the speculative query */
    } pre;
    uint64_t ahead_ns; /* this attend call's time selecting ahead (scoring, not attention) */
    int32_t *plist[2]; /* [n_ctx] each: the gathered lists of two consecutive layers */
    uint8_t *pskip[2];
    uint64_t spec_rows, spec_early;
    double spec_cos_sum;
    /* BKP scratch: [hot_slots] */
    int32_t *bkp_pos;
    float *bkp_key;
    int32_t *bkp_idx;
    int32_t *bkp_cand; /* [ws_cap] promotion candidates: index into the gathered list */
    /* stats */
    uint64_t bytes_read, score_ns, attn_ns, io_ns, steps, read_ops;
    uint64_t promotions, demotions, pingpong, migrated_bytes, sel_hot, sel_cold;
    uint64_t sel_follow, sel_repeat; /* see tr_kv_stats */
    uint64_t pool_reads; /* reads done by the I/O workers (fault injection counts them) */
    /* test hooks: the n-th page write fails with fault_errno (0 = off) */
    uint64_t fault_write_at, n_writes;
    int fault_errno;
};

/* ---- kv_attn.c ---- */
/* F16 bits -> f32, filled once (pthread_once) at the first create: converting V rows by table is
 * ~5x faster than the bit-twiddling conversion in portable C */
extern float tr_kv_f16[65536];
void tr_kv_tables_init(void);
/* run fn on the pool, or inline as thread 0 of 1 without one or when the work (multiply-adds) is
 * too small to pay for waking the workers (a prefill calls this per row and layer) */
void tr_kv_run(tr_pool *pool, tr_pool_fn fn, void *ctx, uint64_t work);
/* --kv-spec: forget a selection made ahead, after its reads (they target the working set) */
void tr_kv_spec_drop(tr_kv *kv);

/* ---- kv.c ---- */
tr_status tr_kv_append_rec(tr_kv *kv, int32_t layer, const uint8_t *rec, tr_error *err);
void tr_kv_drop_hot(tr_kv *kv, tr_kv_layer *L, int32_t pos);
int32_t tr_kv_visible_lo(int32_t pos, int32_t swa);

/* ---- kv_bkp.c: placement between the pools ---- */
/* a free hot slot for an append: demote by the placement policy; false if nothing can go */
bool tr_kv_make_room(tr_kv *kv, tr_kv_layer *L);
/* one decode step of a layer begins: step count, hit decay */
void tr_kv_bkp_step(tr_kv *kv, tr_kv_layer *L);
/* after the gather of list entries [c0, c1) (in working-set slots slot0 + i - c0): promote the
 * cold ones the policy wants hot, copying their verified records from the working set */
void tr_kv_bkp_promote(tr_kv *kv, tr_kv_layer *L, const int32_t *T, int32_t c0, int32_t c1,
                       const uint8_t *skip, int32_t slot0);

/* ---- csd_host.c: the storage agent ---- */
uint64_t tr_kv_csd_region_bytes(const tr_kv_shape *s, uint64_t ws_cap, uint64_t q8row,
                                uint64_t rec);
tr_status tr_kv_csd_start(tr_kv *kv, tr_error *err);
void tr_kv_csd_stop(tr_kv *kv);
pid_t tr_kv_csd_pid(const tr_kv *kv);
void tr_kv_csd_counters(const tr_kv *kv, uint64_t *scores, uint64_t *rows, uint64_t *storage,
                        uint64_t *busy_ns, uint64_t *mem);
/* tiered scoring with the agent: cand[0, n_a) (a range of positions on storage) by the agent,
 * the rest by the host meanwhile; the same scores as tr_kv_score_tokens */
tr_status tr_kv_csd_score(tr_kv *kv, tr_pool *pool, int32_t layer, const float *q, float scale,
                          const int32_t *cand, int32_t n, int32_t n_a, float *out, tr_error *err);
/* the agent's row request for sel[0..n) into slots slot0..: in np parts, part p the positions
 * sel[bnd[p] .. bnd[p + 1]) (bnd NULL: one part) */
void tr_kv_csd_rows_start(tr_kv *kv, int which, int32_t layer, const int32_t *sel, int32_t n,
                          int32_t slot0, int np, const int32_t *bnd);
/* part `part` of the request in, or the request's error */
tr_status tr_kv_csd_rows_wait_part(tr_kv *kv, int which, int part, tr_error *err);
tr_status tr_kv_csd_rows_wait(tr_kv *kv, int which, tr_error *err);

/* ---- APP (csd_host.c) ---- */
/* tokens: smaller parts do not update the measured scoring rates (per-call costs dominate them) */
#define TR_KV_APP_MIN_PART 1024
/* layers scored: a side whose part is kept below TR_KV_APP_MIN_PART gets that many tokens once
 * in this many, so that its rate is measured again, and that measurement weighs half (else the
 * split that starved it would keep the rate it had then for good: seen at 8K and 32K, beta stuck
 * at 9-36 from the start-up probe on) */
#define TR_KV_APP_EXPLORE 16
/* the running averages of the measured rates: the first sample, then 0.9 old + 0.1 new, a sample
 * taken as at most twice and at least half the average, so that one step slowed by something
 * else (a burst of reads on the same cores) moves the average by at most a tenth */
static inline void tr_kv_app_avg(double *avg, double sample) {
    if (*avg > 0) {
        if (sample > 2.0 * *avg) sample = 2.0 * *avg;
        if (sample < 0.5 * *avg) sample = 0.5 * *avg;
    }
    *avg = *avg > 0 ? 0.9 * *avg + 0.1 * sample : sample;
}
/* the rates given by the caller (tr_kv_params.app_*) are set at create and never measured */
void tr_kv_app_init(tr_kv *kv);
/* beta for the next step from the measured scoring rates: equal time on both paths (see the
 * function for why the row terms of DESIGN.md's balance drop out here) */
double tr_kv_app_beta(const tr_kv *kv);
/* APP at start: before the first split with the agent, each rate APP uses not given by flags is
 * measured once on that layer's own data (candidates cand[0, n_a) are on storage) */
tr_status tr_kv_app_probe(tr_kv *kv, tr_pool *pool, int32_t layer, const float *q, float scale,
                          const int32_t *cand, int32_t n_a, tr_error *err);
void tr_kv_app_note_rows(tr_kv *kv, uint64_t hot_bytes, uint64_t hot_ns, uint64_t agent_bytes,
                         uint64_t agent_ns);

/* ---- kv_cold.c: segment files, page format, hashes, reads ---- */
/* the trailer that ends every cold page (also read by the storage agent) */
typedef struct page_trailer {
    char magic[8]; /* "TRKVPAGE" */
    uint32_t layer, page, n_tokens, key_copy_bytes;
    uint64_t rec_hash[TR_KV_PAGE];
    uint64_t key_copy_hash;
    uint64_t hash; /* of the bytes above */
} page_trailer;
_Static_assert(sizeof(page_trailer) == 168, "KV_TRAILER_BYTES in kv.c");
/* a page's key copy (kbytes) followed by its trailer, as read from storage: the trailer belongs
 * to (layer, page), is intact, and vouches for the key copy */
bool tr_kv_key_copy_ok(const uint8_t *key_copy, uint64_t kbytes, int32_t layer, int32_t page);

/* XXH3-64: the SIMD build chosen at start; _ref the library's baseline build (tests compare) */
uint64_t tr_kv_hash64(const void *data, size_t len, uint64_t seed);
uint64_t tr_kv_hash64_ref(const void *data, size_t len, uint64_t seed);
uint64_t tr_xxh3_avx2(const void *data, size_t len, uint64_t seed);
typedef struct tr_kv_hasher {
    XXH3_state_t st;
} tr_kv_hasher;
void tr_kv_hasher_init(tr_kv_hasher *h, uint64_t seed);
void tr_kv_hasher_update(tr_kv_hasher *h, const void *data, size_t len);
uint64_t tr_kv_hasher_digest(const tr_kv_hasher *h);

tr_status tr_kv_cold_open(tr_kv *kv, tr_error *err);
tr_status tr_kv_pull_keys(tr_kv *kv, int32_t layer, tr_error *err);
void tr_kv_cold_close(tr_kv *kv);
tr_status tr_kv_cold_write_page(tr_kv *kv, int32_t layer, int32_t page, tr_error *err);
/* read n consecutive records from the segment file, verified, into dst (one page at most) */
tr_status tr_kv_cold_read_sync(tr_kv *kv, int32_t layer, int32_t pos, int32_t n, uint8_t *dst,
                               tr_error *err);
/* segment file of a layer (for messages and tests) */
void tr_kv_seg_path(const tr_kv *kv, int32_t layer, char *buf, size_t cap);
uint64_t tr_kv_page_offset(const tr_kv *kv, int32_t page);
/* gather positions sel[0..n) of a layer into ws slots [slot0, slot0 + n): hot records are copied
 * now, cold runs are queued on the I/O workers; tr_kv_gather_wait returns their status */
void tr_kv_gather_start(tr_kv *kv, int which, int32_t layer, const int32_t *sel, int32_t n,
                        int32_t slot0);
/* the same in np parts (part p: sel[bnd[p] .. bnd[p + 1])); with the storage agent, one request
 * whose parts arrive in order (tr_kv_csd_rows_wait_part); on the host, parts are not tracked */
void tr_kv_gather_start_parts(tr_kv *kv, int which, int32_t layer, const int32_t *sel,
                              int32_t n, int32_t slot0, int np, const int32_t *bnd);
/* the end of the run of cold positions that starts at sel[i] (consecutive, one page): i if
 * sel[i] is not cold */
int32_t tr_kv_cold_run_end(const tr_kv_layer *L, const int32_t *sel, int32_t n, int32_t i);
tr_status tr_kv_gather_wait(tr_kv *kv, int which, tr_error *err);
tr_status tr_kv_io_init(tr_kv *kv, tr_error *err);
void tr_kv_io_free(tr_kv *kv);

/* ---- kv_score.c: low-precision key copy, scoring, selection, quest bounds, h2o ---- */
void tr_kv_quant_key(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec);
/* tail: the value copy of a token (blocks of 32, no per-channel scale: values have no outlier
 * channels to equalise) */
void tr_kv_quant_value(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec);
/* tail: after a tiered selection (kv->mark set, per-head scores in kv->hs), the unselected
 * candidates' share and share-weighted value sum per query head (kv->tail_e, kv->tail_o) */
void tr_kv_tail_estimate(tr_kv *kv, tr_pool *pool, const tr_kv_layer *L, const int32_t *cand,
                         int32_t n_cand, int32_t n_all, int32_t n_a);
void tr_kv_calibrate(tr_kv *kv, tr_kv_layer *L);
void tr_kv_quest_update(tr_kv *kv, tr_kv_layer *L, int32_t pos, const uint8_t *rec);
tr_status tr_kv_quest_rebuild_page(tr_kv *kv, int32_t layer, int32_t page, tr_error *err);
/* Aggregated low-precision scores of positions cand[0..n) for the query row q ([n_head][hdk]);
 * prepares the quantized query itself. scale: the attention's score scale (the normalised
 * aggregations take each head's softmax of scale * q.k). PSUM: entries [0, n_a) are group A
 * (what the storage agent scores when there is one), the rest group B; each group's softmax
 * statistics are computed separately and merged (tr_kv_group_*), so that the host alone and the
 * host with the agent compute the same scores bit for bit. */
void tr_kv_score_tokens(tr_kv *kv, tr_pool *pool, int32_t layer, const float *q, float scale,
                        const int32_t *cand, int32_t n, int32_t n_a, tr_kv_agg agg, float *out);
/* the pieces: the query quantized into kv->q8; per-head scaled scores of cand[i0..i1) into
 * kv->hs rows of `stride`; a group's max and sum of exp (scores replaced by the exponentials);
 * two groups' statistics merged into per-head factors; a group's scores out[i] = sum over heads
 * of hs[h][i] * c[h * c_stride], heads in order */
void tr_kv_prepare_query(tr_kv *kv, int32_t layer, const float *q);
void tr_kv_score_heads(tr_kv *kv, tr_pool *pool, int32_t layer, const int32_t *cand, int32_t i0,
                       int32_t i1, size_t stride, float scale);
void tr_kv_group_stats(float *hs, int32_t n, float *m, double *z);
void tr_kv_group_merge(int32_t nh, const float *m_a, const double *z_a, const float *m_b,
                       const double *z_b, float *c_a, float *c_b);
void tr_kv_group_score(const float *hs, size_t stride, int32_t nh, const float *c, size_t c_stride,
                       int32_t i0, int32_t i1, float *out);
/* quest: upper bound of one head's q.k over one page (q as F16-rounded floats) */
float tr_kv_quest_bound(const tr_kv *kv, int32_t layer, int32_t page, int32_t kvh,
                        const float *q16);
/* reorders idx[0..n) (indices into score) so that idx[0..k) hold the k largest scores, in no
 * particular order (ties: any of them); expected O(n) */
void tr_kv_topk(const float *score, int32_t *idx, int32_t n, int32_t k);
/* the positions a selective policy attends for a query at pos: ascending, into kv->sel. spec:
 * q is a speculation (--kv-spec), and the row's own token, whose key may not be stored yet, is
 * attended without being scored */
tr_status tr_kv_select_row(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                           bool spec, float scale, int32_t swa, int32_t *n_sel, tr_error *err);
void tr_kv_h2o_evict(tr_kv *kv, int32_t layer, int32_t pos);

/* ceil(alpha * n), where alpha is a float: 0.4f * 25 is 10.0000001, which must be 10 */
/* the larger of two scores or shares (never NaN): fmaxf is a libm call without
 * -ffinite-math-only, and the per-token loops take most of their time in it */
static inline float tr_kv_maxf(float a, float b) { return a > b ? a : b; }

/* the row of position pos in the host's key copy, and the lowest position past the sinks that
 * the copy holds (see hk_ring) */
static inline size_t tr_kv_hk_index(const tr_kv *kv, int32_t pos) {
    if (!kv->hk_wrap || pos < kv->hk_sink) return (size_t)pos;
    return (size_t)kv->hk_sink + (size_t)(pos - kv->hk_sink) % (size_t)kv->hk_ring;
}
static inline uint8_t *tr_kv_qk_row(const tr_kv *kv, const tr_kv_layer *L, size_t g, int32_t pos) {
    return L->qk + (g * (size_t)kv->hk_rows + tr_kv_hk_index(kv, pos)) * kv->qrow;
}
static inline int32_t tr_kv_hk_lo(const tr_kv *kv, const tr_kv_layer *L) {
    if (!kv->hk_wrap) return 0;
    return L->len - kv->hk_ring > kv->hk_sink ? L->len - kv->hk_ring : kv->hk_sink;
}
/* how many of the last of the ascending positions cand[0, n), at most `most`, the host's key
 * copy holds: the host's part of a split */
static inline int32_t tr_kv_hk_held(const tr_kv *kv, const tr_kv_layer *L, const int32_t *cand,
                                    int32_t n, int32_t most) {
    const int32_t lo = tr_kv_hk_lo(kv, L);
    int32_t k = 0;
    while (k < most && k < n && cand[n - 1 - k] >= lo) k++;
    return k;
}

static inline int32_t tr_kv_count(float alpha, int32_t n) {
    return (int32_t)ceil((double)alpha * n - 1e-6 * n);
}

/* ---- test hooks ---- */
static inline void tr_kv_set_agg(tr_kv *kv, tr_kv_agg a) { kv->agg = a; }
static inline void tr_kv_set_eq(tr_kv *kv, tr_kv_eq e) { kv->eq_mode = e; }
static inline void tr_kv_set_write_fault(tr_kv *kv, uint64_t at, int e) {
    kv->fault_write_at = at;
    kv->n_writes = 0;
    kv->fault_errno = e;
}

#endif
