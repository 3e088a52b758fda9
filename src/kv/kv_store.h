/*
 * The storage layer of the pooled KV policies: where each token's K/V record lives.
 *
 *   hot pool     DRAM, hot_slots records per layer (--kv-hot)
 *   cold pool    one append-only segment file per layer in a fresh directory inside --kv-cold,
 *                reserved in full at create, pages of TR_KV_PAGE records each with a checksummed
 *                trailer, verified on every read
 *   working set  ws_cap record slots the attention reads from, filled by gathers: hot records
 *                copied, cold runs read (by the store's I/O workers, or by the storage agent
 *                when one is attached as the store's reader)
 *
 * A record is F16 K (n_kv x hdk) then F16 V (n_kv x hdv), the same layout in all three, so a run
 * of cold records is read straight into the working set with one pread.
 *
 * Placement: every token enters the hot pool. When a page is complete and a cold pool exists, it
 * is written through to the layer's segment file at once, so a hot token with a written page has
 * a valid cold copy and demoting it costs no write (only its slot is freed). When the hot pool is
 * full a slot is freed by the placement hook (BKP), or else by demoting the oldest non-sink token
 * whose page is written. Sinks stay hot; the open page stays hot (it has no cold copy).
 *
 * Memory: everything is allocated once at create from the plan; nothing per token or per step.
 */
#ifndef TR_KV_KV_STORE_H
#define TR_KV_KV_STORE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/io.h"
#include "kv/kv_core.h"

/* default I/O workers: the random reads of a selection need many in flight for an SSD to reach
 * its random-read rate (64 against 16 workers: bench/results/kv.md) */
#define TR_KV_IO_THREADS 64

/* where a token's K/V live */
enum { TR_KV_TOK_NONE = 0, TR_KV_TOK_HOT, TR_KV_TOK_COLD, TR_KV_TOK_EVICTED };

/* A selection of the token adds TR_KV_HIT to its `hits`; with BKP on, every decode step takes
 * an eighth of them away again (kv_bkp.c), so hits / TR_KV_HIT reads as "selected in about that
 * many of the last ~8 steps" and saturates near 8 (128). */
#define TR_KV_HIT 16

/* Per (layer, position): where it lives, and the selection's marks on it (`hits` counts how
 * often a selective policy chose it, recently; `chosen`: the layer's last selection chose it, not
 * forced, for the step-to-step repeat) */
typedef struct tr_kv_tok {
    uint32_t slot;  /* hot slot when where == HOT */
    uint16_t hits;  /* TR_KV_HIT per selection, decayed, saturating */
    uint8_t where;  /* TR_KV_TOK_* */
    uint8_t chosen;
} tr_kv_tok;

typedef struct tr_kv_slayer {
    int32_t len;           /* positions held */
    int32_t pages_written; /* complete pages in the segment file (written through, in order) */
    int32_t demote_next;   /* every non-sink position below it is not hot (demotion cursor) */
    int32_t n_free;        /* free hot slots (stack below) */
    int32_t n_evicted;     /* tokens marked evicted (h2o) */
    uint32_t *free_slots;  /* [hot_slots] */
    int32_t *slot_pos;     /* [hot_slots] position held by a slot, -1 free */
    uint8_t *hot;          /* [hot_slots][rec] */
    tr_kv_tok *tok;        /* [n_ctx] */
    uint64_t *hash;        /* [n_ctx] hash of each record written to the segment file */
    int fd;                /* segment file, -1 without a cold pool */
} tr_kv_slayer;

/* gathers in flight at once: the two halves of a working set too small for the selection, or
 * the chunks of one selection whose attention runs while the later chunks are still read, for
 * two layers' selections (--kv-spec) */
#define TR_KV_PIPE    4
#define TR_KV_GATHERS (2 * TR_KV_PIPE)

/* One gather: a batch of storage reads into the working set, completed by the I/O workers
 * (host reads; the storage agent's reads are tracked by its client with the same record). */
typedef struct tr_kv_gather {
    struct tr_kv_store *st;
    tr_io_job *jobs;  /* [ws_cap] */
    int32_t *job_pos; /* [ws_cap] first position of each job */
    int32_t layer;
    int32_t n_jobs;
    pthread_mutex_t mu; /* guards pending, failed, err_msg */
    pthread_cond_t cv;
    int32_t pending;
    bool failed;
    char err_msg[4608];
    uint64_t bytes;
    uint64_t csd_seq;      /* the storage agent's request for this gather */
    uint64_t csd_rows_ns0; /* the agent's rows time when it was posted */
    bool keys;             /* jobs read pages' key copies and trailers (the pulled-keys baseline) */
    size_t key_shift;      /* ... starting this far into each job's buffer */
} tr_kv_gather;

/* Who reads the cold runs of a gather: NULL start = the store's own I/O workers. The storage
 * agent attaches itself here (kv_csd.c). Parts: part p is sel[bnd[p] .. bnd[p + 1]) (bnd NULL: one
 * part); the agent publishes them in order, the host's reads do not track them. */
typedef struct tr_kv_reader {
    void *ctx;
    void (*start)(void *ctx, int which, int32_t layer, const int32_t *sel, int32_t n,
                  int32_t slot0, int np, const int32_t *bnd);
    tr_status (*wait_part)(void *ctx, int which, int part, tr_error *err);
    tr_status (*wait)(void *ctx, int which, tr_error *err);
} tr_kv_reader;

/* What the policy on top adds to the storage */
typedef struct tr_kv_store_hooks {
    void *ctx;
    /* a free hot slot of `layer` for an append when none is left: false if nothing may go;
     * NULL: the oldest non-sink token whose page is written is demoted */
    bool (*make_room)(void *ctx, int32_t layer);
    /* the bytes a page carries after its records (page_toff - page_qoff: tiered's key copy) */
    void (*page_extra)(void *ctx, int32_t layer, int32_t page, uint8_t *dst);
    /* a gather's hot copies, with the storage agent reading the cold runs (APP's B_c) */
    void (*hot_copied)(void *ctx, uint64_t bytes, uint64_t ns);
} tr_kv_store_hooks;

typedef struct tr_kv_store {
    int32_t n_layer, n_ctx, n_sink;
    size_t krec, rec;
    int32_t hot_slots, n_pages;
    bool cold, direct;   /* a cold pool exists; its files are opened with O_DIRECT */
    /* segment file geometry and header */
    uint64_t data_off;
    size_t page_bytes, page_qoff, page_toff;
    int32_t seg_policy, seg_score_bits;
    size_t seg_qrow;
    const char *cold_dir;
    bool keep;
    char *cold_path;     /* the directory of the segment files */
    tr_kv_slayer *layers;
    uint8_t *ws;         /* the working set: ws_cap record slots (in the agent's shared region
                            when one is attached) */
    int32_t ws_cap;
    tr_kv_gather gath[TR_KV_GATHERS];
    tr_io_pool *io;
    int io_threads;
    uint8_t *pagebuf;    /* one page, aligned */
    uint8_t *rec_tmp;    /* one record */
    const tr_kernels *kern;
    tr_kv_reader reader;
    tr_kv_store_hooks hooks;
    /* counters */
    uint64_t bytes_read, read_ops, io_ns;
    uint64_t pool_reads; /* reads done by the I/O workers (fault injection counts them) */
    uint64_t promotions, demotions, migrated_bytes;
    /* the test seam: the fault_write_at-th page write fails with fault_errno */
    uint64_t fault_write_at, n_writes;
    int fault_errno;
} tr_kv_store;

/* allocation (from the plan; ws NULL when the storage agent provides it) and the segment files */
tr_status tr_kv_store_init(tr_kv_store *st, const tr_kv_shape *s, const tr_kv_params *p,
                           const tr_kv_plan *pl, bool own_ws, uint64_t *total, tr_error *err);
/* the segment files and the I/O workers (a cold pool only) */
tr_status tr_kv_store_open(tr_kv_store *st, const tr_kv_shape *s, tr_error *err);
void tr_kv_store_free(tr_kv_store *st);

/* append a record at the layer's end (demoting by the hook or statically when the pool is full);
 * tr_kv_store_page_done writes the page it completes, if any, after the policy has seen it */
tr_status tr_kv_store_append(tr_kv_store *st, int32_t layer, const uint8_t *rec, tr_error *err);
tr_status tr_kv_store_page_done(tr_kv_store *st, int32_t layer, tr_error *err);
/* drop positions >= n of a layer (the policy resets its own per-position state) */
void tr_kv_store_drop(tr_kv_store *st, int32_t layer, int32_t n);
/* pool moves: free a hot token's slot; move a token cold (its page must be written); move a cold
 * token hot from a verified copy of its record (a free slot must exist) */
void tr_kv_store_drop_hot(tr_kv_store *st, tr_kv_slayer *L, int32_t pos);
void tr_kv_store_demote(tr_kv_store *st, tr_kv_slayer *L, int32_t pos);
void tr_kv_store_promote(tr_kv_store *st, tr_kv_slayer *L, int32_t pos, const uint8_t *rec);
/* mark a token evicted for good (h2o) */
void tr_kv_store_evict(tr_kv_store *st, tr_kv_slayer *L, int32_t pos);
/* a token's record: the hot pool's, or read from storage into dst */
tr_status tr_kv_store_record(tr_kv_store *st, int32_t layer, int32_t pos, uint8_t *dst,
                             const uint8_t **rec, tr_error *err);

/* cold pool */
tr_status tr_kv_cold_write_page(tr_kv_store *st, int32_t layer, int32_t page, tr_error *err);
/* read n consecutive records from the segment file, verified, into dst (one page at most) */
tr_status tr_kv_cold_read_sync(tr_kv_store *st, int32_t layer, int32_t pos, int32_t n,
                               uint8_t *dst, tr_error *err);
/* segment file of a layer (for messages and tests) */
void tr_kv_seg_path(const tr_kv_store *st, int32_t layer, char *buf, size_t cap);
uint64_t tr_kv_page_offset(const tr_kv_store *st, int32_t page);
/* the end of the run of cold positions that starts at sel[i] (consecutive, one page): i if
 * sel[i] is not cold */
int32_t tr_kv_cold_run_end(const tr_kv_slayer *L, const int32_t *sel, int32_t n, int32_t i);

/* gather positions sel[0..n) of a layer into working-set slots [slot0, slot0 + n): hot records
 * are copied now, cold runs are queued on the reader; tr_kv_gather_wait returns their status.
 * _parts: in np parts (see tr_kv_reader) */
void tr_kv_gather_start(tr_kv_store *st, int which, int32_t layer, const int32_t *sel, int32_t n,
                        int32_t slot0);
void tr_kv_gather_start_parts(tr_kv_store *st, int which, int32_t layer, const int32_t *sel,
                              int32_t n, int32_t slot0, int np, const int32_t *bnd);
tr_status tr_kv_gather_wait(tr_kv_store *st, int which, tr_error *err);
tr_status tr_kv_gather_wait_part(tr_kv_store *st, int which, int part, tr_error *err);
/* the baseline of host scoring without a DRAM key copy: every written page's key copy of the
 * layer read from storage (and verified) into buf ([n_pages][stride], allocated at the first
 * call) */
tr_status tr_kv_store_pull_keys(tr_kv_store *st, int32_t layer, uint8_t **buf, size_t *stride,
                                tr_error *err);

/* XXH3 the library's baseline build (tests compare the SIMD one with it), and streaming */
uint64_t tr_kv_hash64_ref(const void *data, size_t len, uint64_t seed);
uint64_t tr_xxh3_avx2(const void *data, size_t len, uint64_t seed);
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t is only public with this */
#include <xxhash.h>
typedef struct tr_kv_hasher {
    XXH3_state_t st;
} tr_kv_hasher;
void tr_kv_hasher_init(tr_kv_hasher *h, uint64_t seed);
void tr_kv_hasher_update(tr_kv_hasher *h, const void *data, size_t len);
uint64_t tr_kv_hasher_digest(const tr_kv_hasher *h);

#endif
