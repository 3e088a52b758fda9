/*
 * The runtime's client of the storage agent (terrace-storaged; protocol in csd.h): the shared
 * region (the working set lives in it), starting or connecting to the agent and ending it, waits
 * that notice the agent's death and give up at a deadline, and the agent's two services:
 *   scoring   the candidates on storage (group A) by the agent while the host scores the rest
 *             (group B), merged into the scores host scoring would give (tr_kv_csd_score)
 *   rows      the cold runs of a gather read by the agent into the working set, in parts the host
 *             attends as each is in (attached to the store as its reader)
 */
#ifndef TR_KV_KV_CSD_H
#define TR_KV_KV_CSD_H

#include <sys/types.h>

#include "kv/kv_app.h"
#include "kv/kv_keys.h"

typedef struct tr_kv_csd {
    tr_kv_store *st;
    tr_kv_keys *K;
    tr_kv_app *app;
    const tr_kv_shape *shape;
    const tr_kv_params *params;
    int32_t chunk;          /* tokens per scoring chunk and score block */
    int32_t read_gap;       /* the agent joins runs this many records' bytes apart, in its memory */
    uint64_t timeout_ns;    /* the longest any wait on the agent may take */
    struct tr_csd_ctl *ctl; /* the shared region */
    size_t bytes;
    int fd;
    pid_t pid;              /* the agent when it is our child; 0 otherwise */
    int sock;               /* the connection to a user-started agent; -1 otherwise */
    char where[160];        /* "pid N" or "pid N at SOCKET", for messages */
    char dead[512];         /* why the agent is gone; empty while it runs */
    float *m, *c;           /* [n_head] group B max; [2][n_head] factors */
    double *z;              /* [n_head] group B sum */
    int32_t *inval;         /* [n_layer] the first page rewritten since the agent last scored the
                               layer (INT32_MAX: none) */
} tr_kv_csd;

/* positions the agent scores in one chunk for --csd-chunk (0: its default) */
int32_t tr_kv_csd_chunk(int32_t csd_chunk);
/* bytes of the shared region (the working set included) */
uint64_t tr_kv_csd_region_bytes(const tr_kv_shape *s, uint64_t ws_cap, uint64_t q8row,
                                uint64_t rec);
/* the client's memory; start maps the region (the store's working set), starts or connects to
 * the agent, waits for it and attaches it to the store as its reader */
tr_status tr_kv_csd_init(tr_kv_csd *C, tr_kv_store *st, tr_kv_keys *K, tr_kv_app *app,
                         const tr_kv_shape *s, const tr_kv_params *p, uint64_t *total,
                         tr_error *err);
tr_status tr_kv_csd_start(tr_kv_csd *C, tr_error *err);
void tr_kv_csd_stop(tr_kv_csd *C);
void tr_kv_csd_free(tr_kv_csd *C);
pid_t tr_kv_csd_pid(const tr_kv_csd *C);
void tr_kv_csd_stats(const tr_kv_csd *C, tr_kv_stats *o);
/* pages of a layer from `page` on are rewritten (a truncate or a restore) */
void tr_kv_csd_invalidate(tr_kv_csd *C, int32_t layer, int32_t page);

/* tiered scoring with the agent: cand[0, n_a) (a range of positions on storage) by the agent,
 * the rest by the host meanwhile; the same scores as tr_kv_score_tokens */
tr_status tr_kv_csd_score(tr_kv_csd *C, tr_pool *pool, int32_t layer, const float *q, float scale,
                          const int32_t *cand, int32_t n, int32_t n_a, float *out, tr_error *err);
/* APP at start: before the first split, each rate not given is measured once on that layer's own
 * data (candidates cand[0, n_a) are on storage): the agent's and the host's scoring of the same
 * tokens, hot records copied into the working set, cold records read by the agent */
tr_status tr_kv_csd_probe(tr_kv_csd *C, tr_pool *pool, int32_t layer, const float *q,
                          float scale, const int32_t *cand, int32_t n_a, tr_error *err);

#endif
