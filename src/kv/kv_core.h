/*
 * Inside the KV cache: the instance, which holds what every policy needs and nothing more, the
 * interface every policy implements, and the plan (every size derived once from the shape and
 * the parameters, checked against the budgets before anything is allocated). Tests include the
 * headers of this folder to reach the layers directly.
 *
 * Layers, bottom up:
 *   kv_store.h   the storage: hot pool, cold pool (segment files of checksummed pages), the
 *                working set, and gathers of records into it (host reads or the storage agent's)
 *   kv_pooled.h  what the policies that pool their KV share: attention over a gathered list
 *                (chunked, pipelined), the selection's candidates and bookkeeping
 *   policies     kv_full.c; offload in kv_pooled.c; kv_h2o.c; kv_quest.c; kv_tiered.c
 *   tiered's     kv_keys.h (the low-precision key copy and host scoring), kv_csd.h (the storage
 *   modules      agent's client: scoring and rows next to storage), kv_bkp.h (placement), kv_app.h
 *                (the host/agent split), the tail estimate and speculation (kv_tiered.c)
 */
#ifndef TR_KV_KV_CORE_H
#define TR_KV_KV_CORE_H

#include <math.h>
#include <stdint.h>

#include "core/pool.h"
#include "kv/kv.h"
#include "kv/score.h"
#include "tensor/kernels.h"

/* rows whose online-softmax state one attend pass keeps at least (a call of more rows than the
 * plan's row_block goes in blocks); also the rows of a call the host's key ring is sized for when
 * max_rows is 0 */
#define TR_KV_ROW_BLOCK 512

typedef struct tr_kv_ops {
    tr_status (*append)(tr_kv *kv, int32_t layer, const float *k, const float *v, tr_error *err);
    tr_status (*attend)(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, tr_error *err);
    tr_status (*truncate)(tr_kv *kv, int32_t n, tr_error *err);
    int32_t (*len)(const tr_kv *kv, int32_t layer); /* positions the layer holds */
    void (*stats)(const tr_kv *kv, tr_kv_stats *out);
    void (*free)(tr_kv *kv);
} tr_kv_ops;

struct tr_kv {
    tr_kv_shape shape;     /* the per-layer counts are the full policy's copies (or NULL) */
    tr_kv_params params;   /* its strings point into `strings` */
    char *strings;
    const tr_kv_ops *ops;
    void *pol;             /* the policy's state */
    const tr_kernels *kern;
    uint64_t steps, score_ns, attn_ns; /* attend calls; selecting; attending */
};

/* the plan of a pooled policy: sizes and geometry, computed once */
typedef struct tr_kv_plan {
    size_t krec, rec;            /* bytes of one token's K (all KV heads), and of K + V */
    int32_t hot_slots, n_pages, ws_cap, n_scratch;
    /* rows one attend pass keeps state for: a whole batch (max_rows), so that a prefill chunk
     * reads its list once */
    int32_t row_block;
    bool cold, aligned;          /* a cold pool; records of whole 4 KiB blocks (O_DIRECT) */
    /* tiered: the key copy (blocks of 32 channels), the host's ring of it, the value copy */
    tr_type qtype, vtype;
    int32_t hdk_pad, hdv_pad, hk_sink, hk_ring;
    size_t qrow, q8row, vrow;
    /* segment files */
    size_t page_bytes, page_qoff, page_toff;
    uint64_t data_off;
    /* dram: what this process allocates; agent_dram: the storage agent's own memory, in its
     * process (its VmHWM, not this one's), 0 without the agent; the shared region between them
     * is this process's (in dram) */
    uint64_t dram, agent_dram, cold_bytes;
} tr_kv_plan;
tr_status tr_kv_plan_make(const tr_kv_shape *s, const tr_kv_params *p, tr_kv_plan *o,
                          tr_error *err);

/* the policies */
uint64_t tr_kv_full_bytes(const tr_kv_shape *s, const tr_kv_params *p);
tr_status tr_kv_full_create(tr_kv *kv, tr_error *err);
/* the full policy's attention, which is the forward pass's attention for it (kv_full.c): every
 * visible key of each row, llama.cpp's non-flash numerics */
tr_status tr_kv_full_attend(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, tr_error *err);
/* the same for n <= TR_KV_ATTEND_MANY_MAX caches of the full policy, in one pool run */
tr_status tr_kv_full_attend_many(tr_kv *const *kvs, tr_pool *pool, const tr_kv_query *qs, int n,
                                 tr_error *err);
tr_status tr_kv_pooled_create(tr_kv *kv, const tr_kv_plan *pl, tr_error *err);

/* big buffers on transparent huge pages, zeroed; *total counts the bytes */
void *tr_kv_alloc(size_t n, size_t align, uint64_t *total);
static inline uint64_t tr_kv_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* F16 bits -> f32, filled once (pthread_once) at the first create: converting V rows by table is
 * ~5x faster than the bit-twiddling conversion in portable C */
extern float tr_kv_f16[65536];
void tr_kv_tables_init(void);
/* floats of one thread's scratch for the pooled policies' attention over ws_cap gathered keys
 * (kv_attn.c: the attention kernel's tile, its outputs, or one row's scores and weights);
 * *kernel: where the tile's outputs start */
size_t tr_kv_attn_floats(const tr_kv_shape *s, int32_t ws_cap, size_t *kernel);
/* run fn on the pool, or inline as thread 0 of 1 without one or when the work (multiply-adds) is
 * too small to pay for waking the workers (a prefill calls this per row and layer) */
void tr_kv_run(tr_pool *pool, tr_pool_fn fn, void *ctx, uint64_t work);

/* reorders idx[0..n) (indices into score) so that idx[0..k) hold the k largest scores, in no
 * particular order (ties: any of them); expected O(n) */
void tr_kv_topk(const float *score, int32_t *idx, int32_t n, int32_t k);

/* the lowest key position a query at pos sees through a window of swa (0: none) */
static inline int32_t tr_kv_visible_lo(int32_t pos, int32_t swa) {
    return swa > 0 && pos >= swa ? pos - swa + 1 : 0;
}
/* ceil(alpha * n), where alpha is a float: 0.4f * 25 is 10.0000001, which must be 10 */
static inline int32_t tr_kv_count(float alpha, int32_t n) {
    return (int32_t)ceil((double)alpha * n - 1e-6 * n);
}

#endif
