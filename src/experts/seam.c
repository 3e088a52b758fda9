/*
 * The expert cache's part of the test and benchmark seam (include/terrace_seam.h): one cold pass
 * over a file's experts through a fresh cache, as bench_expert_io measures it against dd.
 */
#include <stdlib.h>
#include <time.h>

#include "terrace_seam.h"

#include "core/error.h"
#include "experts/cache.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

tr_status tr_seam_expert_read_pass(tr_seam_expert_pass *p, tr_error *err) {
    if (p->n_layer < 1 || p->n_parts < 1 || p->n_parts > TR_EXPERT_MAX_PARTS || p->topk < 1 ||
        p->topk > TR_EXPERT_MAX_TOPK || p->topk > p->n_expert)
        return tr_fail(err, TR_E_ARG, "expert pass: %d layers, %d parts, top-%d of %d", p->n_layer,
                       p->n_parts, p->topk, p->n_expert);
    tr_expert_layer *layers = calloc((size_t)p->n_layer, sizeof *layers);
    if (!layers) return tr_fail(err, TR_E_NOMEM, "expert pass: out of memory");
    for (int32_t l = 0; l < p->n_layer; l++) {
        layers[l].n_parts = p->n_parts;
        for (int32_t k = 0; k < p->n_parts; k++) {
            const uint64_t b = p->bytes[(size_t)l * (size_t)p->n_parts + (size_t)k];
            layers[l].part[k] = (tr_expert_part){
                .fd = p->fd,
                .path = p->path,
                .offset = p->offset[(size_t)l * (size_t)p->n_parts + (size_t)k],
                .stride = b,
                .bytes = b};
        }
    }
    const tr_expert_layout layout = {p->n_layer, p->n_expert, p->topk, layers};
    tr_expert_cache_params cp = {.budget_bytes = (uint64_t)1 << 40,
                                 .policy = "lru",
                                 .io_threads = p->io_threads,
                                 .no_direct_io = p->buffered,
                                 .read_chunk = p->read_chunk};
    tr_expert_cache *c = NULL;
    tr_status st = tr_expert_cache_create(&layout, &cp, &c, NULL, 0, err);
    if (st) {
        free(layers);
        return st;
    }
    int32_t ex[TR_EXPERT_MAX_TOPK];
    for (int32_t i = 0; i < p->topk; i++) ex[i] = i;
    double t_all = 0;
    for (int32_t l = 0; l < p->n_layer && !st; l++) {
        tr_expert_request req;
        const double t0 = now_s();
        if ((st = tr_expert_cache_acquire(c, l, ex, p->topk, &req, err))) break;
        int32_t idx;
        do {
            st = tr_expert_cache_next_ready(c, &req, &idx, err);
        } while (!st && idx >= 0);
        t_all += now_s() - t0;
        tr_expert_cache_release(c, &req);
    }
    tr_expert_stats es;
    tr_expert_cache_stats(c, &es);
    p->seconds = t_all;
    p->reads = es.reads;
    p->direct_io = es.direct_io;
    tr_expert_cache_free(c);
    free(layers);
    return st;
}
