/*
 * What the pooled policies (offload, h2o, quest, tiered) share on top of the storage: attention
 * over a gathered list of positions, and the selection's candidates and bookkeeping. Each policy's
 * state begins with a tr_kv_pooled (kv->pol points at it), and its operations are the shared ones
 * plus the hooks below.
 *
 * Attention over a list (kv_attn.c): the positions are gathered (hot records copied, cold runs
 * read and verified) into the working set, and every (row, head) attends over its visible part of
 * them, in parallel on the pool. Numerics follow llama.cpp's non-flash path: F16 K and V, q rounded
 * to F16, score = dot(k, q) * scale, softmax with the max subtracted and the sum in double (a sink
 * adds exp(sink - max)), probabilities rounded to F16, output = sum of p * v in float row by row.
 * A list that does not fit the working set is processed in two halves, the next read while the
 * current one is computed, with an online softmax; a fitting selection of a cold pool is read in
 * TR_KV_PIPE chunks all in flight, attended chunk by chunk as each arrives.
 */
#ifndef TR_KV_KV_POOLED_H
#define TR_KV_KV_POOLED_H

#include "kv/kv_store.h"

typedef struct tr_kv_pooled tr_kv_pooled;

/* what a pooled policy adds (any may be NULL) */
typedef struct tr_kv_pooled_ops {
    /* a token was stored at the layer's end, before its page (if complete) is written */
    void (*appended)(tr_kv *kv, int32_t layer, int32_t pos, const uint8_t *rec);
    /* the positions one row attends at pos, ascending, into P->sel (*n): the policy's selection
     * (spec: q is a speculation, the row's own token is attended without being scored) */
    tr_status (*select_row)(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                            bool spec, float scale, int32_t swa, int32_t *n, tr_error *err);
    /* the selective path: rows of one layer, each a decode step with its own selection;
     * *selected: tokens attended, *score_ns: time selecting */
    tr_status (*attend_selected)(tr_kv *kv, tr_pool *pool, const tr_kv_query *q,
                                 uint64_t *selected, uint64_t *score_ns, tr_error *err);
    /* an attend call begins (tiered: the next layer's speculated queries) and ends */
    tr_status (*attend_begin)(tr_kv *kv, const tr_kv_query *q, tr_error *err);
    void (*attend_end)(tr_kv *kv, int32_t layer);
    /* positions >= n of a layer were dropped (from len); then whatever must be rebuilt */
    void (*dropped)(tr_kv *kv, int32_t layer, int32_t n);
    tr_status (*truncated)(tr_kv *kv, int32_t layer, int32_t len, int32_t n, tr_error *err);
    /* reads started ahead into the working set (the speculation's): wait for them and forget */
    void (*drain)(tr_kv *kv);
    void (*stats)(const tr_kv *kv, tr_kv_stats *out);
    void (*free)(tr_kv *kv);
} tr_kv_pooled_ops;

struct tr_kv_pooled {
    tr_kv_store st;
    const tr_kv_pooled_ops *ops;
    bool selective; /* the policy selects (h2o, quest, tiered below alpha 1) */
    /* a call of several rows attends every visible key, in one gather (prefill chunks: the
     * selecting policies other than h2o, without prefill_select) */
    bool exact_rows;
    int32_t row_block; /* rows with online-softmax state (the plan's) */
    /* exact calls of several rows: counted at layer 0, bytes read, the cold pool at each */
    uint64_t prefill_chunks, prefill_bytes_read, prefill_read_bound;
    /* attention over a list: per-thread scratch and per-row online-softmax state */
    int32_t n_scratch; /* threads with scratch */
    /* [n_scratch][th_floats]: the attention kernel's scratch for ws_cap keys (th_attn floats),
     * then a tile's outputs [TR_ATTN_MAX_Q][hdv]; one row at a time uses its start */
    float *th_k;
    size_t th_floats, th_attn;
    float *st_m;       /* [row_block][n_head] running max */
    double *st_l;      /* [row_block][n_head] running sum */
    int32_t *vlo, *vhi; /* [row_block] each row's visible range within the list */
    bool halves;       /* two layers' lists in the two halves of the working set (--kv-spec) */
    /* reads: joins across read_gap unselected cold tokens; pipe chunks from pipe_min tokens */
    int32_t read_gap, pipe, pipe_min;
    /* the selection's scratch, [n_ctx] each */
    int32_t *sel;  /* selected positions, ascending */
    int32_t *cand; /* candidate positions, then the joined list */
    float *cscore; /* candidate scores */
    uint8_t *mark; /* chosen candidates */
    uint8_t *skip; /* entries of the joined list read only to join reads */
    /* the selection's bookkeeping */
    uint64_t *layer_selected; /* [n_layer] tokens attended at the layer's last call */
    int32_t *sel_last_pos;    /* [n_layer] the row of the layer's last selection, -2 none */
    uint64_t sel_hot, sel_cold, sel_follow, sel_repeat;
};

static inline tr_kv_pooled *tr_kv_pooled_of(const tr_kv *kv) { return (tr_kv_pooled *)kv->pol; }

/* the shared operations (kv_pooled.c) */
tr_status tr_kv_pooled_init(tr_kv *kv, tr_kv_pooled *P, const tr_kv_plan *pl,
                            const tr_kv_pooled_ops *ops, bool own_ws, uint64_t *total,
                            tr_error *err);
void tr_kv_pooled_free(tr_kv *kv);
extern const tr_kv_ops tr_kv_pooled_kv_ops;
/* a record (F16 K then V) appended through the policy (also what restore replays) */
tr_status tr_kv_pooled_append_rec(tr_kv *kv, int32_t layer, const uint8_t *rec, tr_error *err);
/* every visible key: one gather shared by a block of rows (offload, or alpha 1) */
tr_status tr_kv_attend_all(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, uint64_t *selected,
                           tr_error *err);

/* ---- attention over a list (kv_attn.c) ---- */

typedef struct tr_kv_list {
    const int32_t *T;    /* ascending positions */
    int32_t nT;
    const uint8_t *skip; /* entries read only to join reads (NULL: none) */
    int half;            /* the working-set half of a pipelined read (--kv-spec: layer % 2) */
    bool started;        /* its reads were started ahead (tr_kv_pipe_start) */
    float *keep;         /* h2o: keep the row's scaled scores per head, [n_head][n_ctx] */
    void *ctx;           /* the hooks' */
    /* after the gather of entries [c0, c1) into slots slot0..: BKP's promotions */
    void (*gathered)(void *ctx, int32_t layer, const int32_t *T, int32_t c0, int32_t c1,
                     const uint8_t *skip, int32_t slot0);
    /* a single row's pipelined reads are in flight: select (and read) ahead */
    tr_status (*in_flight)(void *ctx, tr_pool *pool, int32_t layer, int32_t pos, tr_error *err);
} tr_kv_list;
tr_status tr_kv_attend_list(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t rows,
                            const int32_t *pos, const float *q, size_t q_stride, float scale,
                            const float *sinks, int32_t swa, float *out, size_t out_stride,
                            const tr_kv_list *list, tr_error *err);
/* pipelined reads of a list, used to read one ahead (--kv-spec) */
int32_t tr_kv_half_cap(const tr_kv_pooled *P);
int32_t tr_kv_half_slot0(const tr_kv_pooled *P, int half);
bool tr_kv_pipelined(const tr_kv_pooled *P, int32_t nT);
void tr_kv_pipe_start(tr_kv_pooled *P, int half, int32_t layer, const int32_t *T, int32_t nT);
/* the reads of chunks c.. of half's list, which target the working set, are over */
void tr_kv_pipe_drain(tr_kv_pooled *P, int half, int c);

/* ---- selection (kv_select.c) ---- */

/* a row's candidates: the visible positions past the sinks and before the window (not evicted),
 * ascending in P->cand[0, n_cand); the row sees [lo, pos], forces [lo, sink_hi) and [win_lo, pos],
 * may choose k. spec: the row's own token (pos) is not stored yet: it is forced, not scored */
typedef struct tr_kv_cands {
    int32_t pos, lo, sink_hi, win_lo, c_lo, k, own, top, n_cand;
} tr_kv_cands;
void tr_kv_select_begin(tr_kv *kv, int32_t layer, int32_t pos, bool spec, int32_t swa,
                        tr_kv_cands *c);
/* after the policy marked its choices in P->mark (or chose all): the ascending list of what the
 * row attends into P->sel, hits counted, the step-to-step repeat measured; returns its length */
int32_t tr_kv_select_end(tr_kv *kv, int32_t layer, const tr_kv_cands *c, bool all);
/* the list a selection (P->sel, n) is read as: runs of a page joined across read_gap unselected
 * cold tokens (in P->cand and P->skip) */
int32_t tr_kv_join_reads(tr_kv_pooled *P, int32_t layer, int32_t n, const int32_t **T,
                         const uint8_t **skip);

/* ---- the policies built on it ---- */
tr_status tr_kv_h2o_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err);
tr_status tr_kv_quest_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err);
tr_status tr_kv_tiered_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err);
tr_status tr_kv_offload_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err);
/* what save/restore keeps of the policies: h2o's masses [n_ctx]; tiered's per-channel key scales
 * [n_kv][hdk_pad] (their byte count) and whether they came from the first page */
float *tr_kv_h2o_mass(const tr_kv *kv, int32_t layer);
float *tr_kv_tiered_scales(const tr_kv *kv, int32_t layer, size_t *bytes, bool **calibrated);
/* the policy's selection of one row (tests measure it against brute force) */
tr_status tr_kv_select_row(tr_kv *kv, tr_pool *pool, int32_t layer, int32_t pos, const float *q,
                           bool spec, float scale, int32_t swa, int32_t *n, tr_error *err);
/* tiered's modules, for the tests that reach into them */
struct tr_kv_keys *tr_kv_tiered_keys(const tr_kv *kv);
struct tr_kv_app *tr_kv_tiered_app(const tr_kv *kv);
/* quest: upper bound of one head's q.k over one page (q as F16-rounded floats) */
float tr_kv_quest_bound(const tr_kv *kv, int32_t layer, int32_t page, int32_t kvh,
                        const float *q16);
/* tiered's part of the test seam */
void tr_kv_tiered_seam_get(const tr_kv *kv, tr_kv_seam *o);
tr_status tr_kv_tiered_seam_set(tr_kv *kv, const tr_kv_seam *s, tr_error *err);

#endif
