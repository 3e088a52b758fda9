/*
 * The KV cache instance: parameters, the budget plan, create/free, append (with demotion from
 * the hot pool and write-through of complete pages to the cold pool), truncate and stats.
 *
 * Placement: every token enters the hot pool. When a page of TR_KV_PAGE positions is complete
 * and a cold pool exists, the page is written through to the layer's segment file at once, so a
 * hot token with a written page has a valid cold copy and demoting it costs no write (only its
 * slot is freed). When the hot pool is full, the oldest non-sink token outside the recent window
 * whose page is written is demoted (the window, being newest, goes last). Sinks stay hot; the open
 * page stays hot (it has no cold copy).
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "kv/kv_internal.h"

#define KV_WS_AUTO (64ull << 20)
/* below this many attended tokens a layer's reads are too few to be worth splitting (tr_kv.pipe) */
#define KV_PIPE_MIN 1024

/* see tr_kv.read_gap: on a virtio SSD that serves ~60K random reads/s, joining runs across one
 * unselected token cut the reads per step by a fifth for a sixth more bytes (bench/results/kv.md)
 */
#define KV_READ_GAP      1
/* the agent's (tr_kv.csd_gap), where the records between the runs cost storage reads only */
#define KV_CSD_READ_GAP 1
#define KV_TRAILER_BYTES 168 /* sizeof(page_trailer), kv_internal.h */

tr_kv_params tr_kv_default_params(void) {
    /* alpha 0.2: HillInfer's (and H2O's) importance rate */
    return (tr_kv_params){.policy = TR_KV_FULL,
                          .alpha = 0.2f,
                          .n_sink = 4,
                          .n_window = 64,
                          .score_bits = 8,
                          .tail_min = 1.0f,
                          .beta = -1.0f};
}

static const char *const policy_names[] = {"full", "offload", "h2o", "quest", "tiered"};

tr_status tr_kv_policy_parse(const char *name, tr_kv_policy *out, tr_error *err) {
    for (int i = 0; i < 5; i++)
        if (name && !strcmp(name, policy_names[i])) {
            *out = (tr_kv_policy)i;
            return TR_OK;
        }
    return tr_fail(err, TR_E_ARG, "unknown KV policy '%s' (full, offload, h2o, quest, tiered)",
                   name ? name : "(null)");
}

const char *tr_kv_policy_name(tr_kv_policy p) { return (unsigned)p < 5 ? policy_names[p] : "?"; }

/* ---------------------------------------------------------------------------------------------- */
/* the plan: every size derived once, checked against the budgets before anything is allocated   */

typedef struct kv_plan {
    size_t krec, rec;
    int32_t hot_slots, n_pages, ws_cap, hdk_pad, n_scratch;
    bool cold, aligned;
    tr_type qtype;
    size_t qrow, q8row;
    int32_t hdv_pad;
    int32_t hk_sink, hk_ring; /* the host's key copy (see tr_kv) */
    tr_type vtype;
    size_t vrow;
    size_t page_bytes, page_qoff, page_toff;
    uint64_t data_off;
    uint64_t dram, cold_bytes;
} kv_plan;

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

#define KV_HUGE (2u << 20)

static tr_status kv_plan_make(const tr_kv_shape *s, const tr_kv_params *p, kv_plan *o,
                              tr_error *err) {
    memset(o, 0, sizeof *o);
    if (s->n_layer < 1 || s->n_ctx < 1 || s->n_head < 1 || s->n_head_kv < 1 || s->head_dim_k < 1 ||
        s->head_dim_v < 1 || s->n_head % s->n_head_kv)
        return tr_fail(err, TR_E_ARG,
                       "KV shape: %d layers, n_ctx %d, %d heads / %d KV heads, head dims %d/%d",
                       s->n_layer, s->n_ctx, s->n_head, s->n_head_kv, s->head_dim_k, s->head_dim_v);
    if ((unsigned)p->policy > TR_KV_TIERED)
        return tr_fail(err, TR_E_ARG, "KV policy %d", (int)p->policy);
    if (!(p->alpha > 0.0f && p->alpha <= 1.0f))
        return tr_fail(err, TR_E_ARG, "--kv-alpha %g: must be in (0, 1]", (double)p->alpha);
    if (p->n_sink < 0 || p->n_window < 0)
        return tr_fail(err, TR_E_ARG, "--kv-sink %d / --kv-window %d: must be >= 0", p->n_sink,
                       p->n_window);
    if ((unsigned)p->bkp > TR_KV_BKP_ON)
        return tr_fail(err, TR_E_ARG, "--kv-bkp %d", (int)p->bkp);
    if (p->bkp != TR_KV_BKP_OFF && p->policy != TR_KV_TIERED)
        return tr_fail(err, TR_E_ARG, "--kv-bkp %s needs --kv-policy tiered (policy %s)",
                       tr_kv_bkp_name(p->bkp), tr_kv_policy_name(p->policy));
    if (p->csd && p->policy != TR_KV_TIERED)
        return tr_fail(err, TR_E_ARG, "--csd (the storage agent) needs --kv-policy tiered (policy "
                       "%s)", tr_kv_policy_name(p->policy));
    if (p->csd_chunk < 0 || p->csd_chunk > (1 << 20) || p->csd_gbps < 0 || p->csd_gflops < 0 ||
        p->csd_link_gbps < 0)
        return tr_fail(err, TR_E_ARG, "--csd-chunk %d / --csd-gbps %g / --csd-gflops %g / "
                       "--csd-link-gbps %g: must be >= 0", p->csd_chunk, p->csd_gbps,
                       p->csd_gflops, p->csd_link_gbps);
    if (p->score_bits != 8 && p->score_bits != 4)
        return tr_fail(err, TR_E_ARG, "--kv-score-bits %d: 8 or 4", p->score_bits);
    if (p->tail_bits != 0 && p->tail_bits != 8 && p->tail_bits != 4)
        return tr_fail(err, TR_E_ARG, "--kv-tail %d: 0 (off), 8 or 4", p->tail_bits);
    if (p->tail_bits && p->policy != TR_KV_TIERED)
        return tr_fail(err, TR_E_ARG, "--kv-tail %d needs --kv-policy tiered (policy %s)",
                       p->tail_bits, tr_kv_policy_name(p->policy));
    if (!(p->tail_min >= 0.0f && p->tail_min <= 1e6f))
        return tr_fail(err, TR_E_ARG, "--kv-tail-min %g: a share relative to the uniform one, 0 "
                       "(sum every unselected token) to 1e6", (double)p->tail_min);
    if (p->tail_bits && p->csd)
        return tr_fail(err, TR_E_ARG,
                       "--kv-tail %d needs host scoring: the storage agent (--csd) "
                       "returns no estimate for the tokens it leaves out",
                       p->tail_bits);
    if (p->spec && p->policy != TR_KV_TIERED)
        return tr_fail(err, TR_E_ARG, "--kv-spec needs --kv-policy tiered (policy %s)",
                       tr_kv_policy_name(p->policy));
    if (p->spec && p->tail_bits)
        return tr_fail(err, TR_E_ARG, "--kv-spec does not combine with --kv-tail %d: the tail "
                       "needs the scores of the layer's own query", p->tail_bits);
    if (p->host_keys < 0 || p->max_rows < 0)
        return tr_fail(err, TR_E_ARG, "--kv-host-keys %d / rows per call %d: must be >= 0",
                       p->host_keys, p->max_rows);
    if (p->host_keys && !p->csd)
        return tr_fail(err, TR_E_ARG, "--kv-host-keys %d needs the storage agent (--csd): without "
                       "it the host scores every position from its own key copy",
                       p->host_keys);
    if (p->n_threads < 0 || p->n_threads > 4096 || p->io_threads < 0 || p->io_threads > 256)
        return tr_fail(err, TR_E_ARG, "KV threads %d / I/O threads %d", p->n_threads,
                       p->io_threads);

    const uint64_t L = (uint64_t)s->n_layer, n_ctx = (uint64_t)s->n_ctx;
    const uint64_t nkv = (uint64_t)s->n_head_kv, nh = (uint64_t)s->n_head;
    o->krec = (size_t)(nkv * (uint64_t)s->head_dim_k * 2);
    o->rec = o->krec + (size_t)(nkv * (uint64_t)s->head_dim_v * 2);
    const uint64_t rec = o->rec;
    o->n_pages = (int32_t)((n_ctx + TR_KV_PAGE - 1) / TR_KV_PAGE);

    /* hot pool: 0 = everything hot */
    uint64_t slots = p->hot_bytes ? p->hot_bytes / (L * rec) : n_ctx;
    if (slots >= n_ctx) slots = n_ctx;
    o->cold = slots < n_ctx;
    const uint64_t all = L * n_ctx * rec;
    if (o->cold && p->policy == TR_KV_FULL)
        return tr_fail(err, TR_E_BUDGET,
                       "KV policy full keeps all KV in DRAM: %d layers x %d tokens x %zu bytes = "
                       "%llu bytes, --kv-hot gives %llu (raise it, or use offload or tiered)",
                       s->n_layer, s->n_ctx, o->rec, (unsigned long long)all,
                       (unsigned long long)p->hot_bytes);
    if (o->cold) {
        /* sinks stay hot, and so does the open page (it has no cold copy yet); the window is
         * the newest and so the last to be demoted, but it may be cold in a tiny pool */
        uint64_t need = (uint64_t)p->n_sink + TR_KV_PAGE;
        if (need > n_ctx) need = n_ctx;
        if (slots < need)
            return tr_fail(err, TR_E_BUDGET,
                           "KV hot pool: --kv-hot %llu bytes holds %llu tokens per layer; the "
                           "sinks (%d) and the open page (%d) need %llu tokens per layer = %llu "
                           "bytes",
                           (unsigned long long)p->hot_bytes, (unsigned long long)slots, p->n_sink,
                           TR_KV_PAGE, (unsigned long long)need,
                           (unsigned long long)(need * L * rec));
        if (!p->cold_dir || !*p->cold_dir)
            return tr_fail(err, TR_E_BUDGET,
                           "KV of %d tokens needs %llu bytes; --kv-hot %llu holds %llu tokens per "
                           "layer: the rest needs a cold pool (--kv-cold DIR)",
                           s->n_ctx, (unsigned long long)all, (unsigned long long)p->hot_bytes,
                           (unsigned long long)slots);
    }
    o->hot_slots = (int32_t)slots;

    /* working set */
    const uint64_t min_ws = n_ctx < 2 * TR_KV_PAGE ? n_ctx : 2 * TR_KV_PAGE;
    uint64_t ws = (p->ws_bytes ? p->ws_bytes : KV_WS_AUTO) / rec;
    if (!p->ws_bytes && ws < min_ws) ws = min_ws;
    if (ws > n_ctx) ws = n_ctx;
    if (ws < min_ws)
        return tr_fail(err, TR_E_BUDGET,
                       "KV working set: %llu bytes hold %llu tokens; at least %llu tokens (%llu "
                       "bytes) are needed",
                       (unsigned long long)p->ws_bytes, (unsigned long long)ws,
                       (unsigned long long)min_ws, (unsigned long long)(min_ws * rec));
    /* --kv-spec: the next layer's selection is read while this one's is attended, each in its
     * half of the working set (an automatic one is made big enough for two selections) */
    if (p->spec && !p->ws_bytes) {
        const uint64_t sel = (uint64_t)tr_kv_count(p->alpha, s->n_ctx) + (uint64_t)p->n_sink +
                             (uint64_t)p->n_window + 2 * TR_KV_PAGE;
        const uint64_t two = 2 * (sel < n_ctx ? sel : n_ctx);
        if (ws < two) ws = two;
    }
    if (ws > 1 && ws % 2) ws--; /* two halves when a step is processed in chunks */
    o->ws_cap = (int32_t)ws;

    /* tiered: low-precision key copy in blocks of 32 channels */
    o->hdk_pad = (int32_t)round_up((uint64_t)s->head_dim_k, 32);
    o->qtype = p->score_bits == 4 ? TR_TYPE_Q4_0 : TR_TYPE_Q8_0;
    o->qrow = (size_t)(o->hdk_pad / 32) * (p->score_bits == 4 ? 18 : 34);
    o->q8row = (size_t)(o->hdk_pad / 32) * 34;
    /* the host's key copy: every position, or (--kv-host-keys, with the agent) the sinks and a
     * ring of the newest positions, enough for the ones APP may give the host (M_0), the
     * window, the open page and the rows of one call, whose first row's window lies furthest
     * back */
    o->hk_sink = 0;
    o->hk_ring = s->n_ctx;
    if (p->host_keys && o->cold) {
        const uint64_t rows = p->max_rows ? (uint64_t)p->max_rows : TR_KV_ROW_BLOCK;
        const uint64_t ring = (uint64_t)p->host_keys + (uint64_t)p->n_window + 2 * TR_KV_PAGE + rows;
        if ((uint64_t)p->n_sink + ring < n_ctx) {
            o->hk_sink = p->n_sink;
            o->hk_ring = (int32_t)ring;
        }
    }
    const uint64_t hk_rows = (uint64_t)o->hk_sink + (uint64_t)o->hk_ring;
    /* tail: low-precision value copy, same block formats */
    o->hdv_pad = (int32_t)round_up((uint64_t)s->head_dim_v, 32);
    o->vtype = p->tail_bits == 4 ? TR_TYPE_Q4_0 : TR_TYPE_Q8_0;
    o->vrow = p->tail_bits ? tr_type_row_bytes(o->vtype, o->hdv_pad) : 0;
    const bool tiered = p->policy == TR_KV_TIERED, quest = p->policy == TR_KV_QUEST,
               h2o = p->policy == TR_KV_H2O;

    /* segment file geometry: records, then the key copy (tiered), then the trailer. With records
     * of whole 4 KiB blocks every read and write is aligned, and the files are read with
     * O_DIRECT (no page cache: what the step reads is what storage delivers). */
    o->aligned = rec % 4096 == 0;
    o->page_qoff = (size_t)(TR_KV_PAGE * rec);
    o->page_toff = o->page_qoff + (tiered ? (size_t)(TR_KV_PAGE * nkv) * o->qrow : 0);
    o->page_bytes = (size_t)round_up(o->page_toff + KV_TRAILER_BYTES, o->aligned ? 4096 : 64);
    o->data_off = 4096;
    o->cold_bytes = o->cold ? L * (o->data_off + (uint64_t)o->n_pages * o->page_bytes) : 0;

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->n_scratch = p->n_threads ? p->n_threads : (int32_t)(ncpu > 0 ? ncpu : 1);

    /* DRAM: what create allocates, to the byte where it matters */
    uint64_t d = L * slots * rec;                     /* hot pool */
    d += ws * rec;                                    /* working set */
    d += L * (n_ctx * sizeof(tr_kv_tok) + slots * 8); /* token table, slot maps */
    if (o->cold) d += L * n_ctx * 8 + o->page_bytes;  /* record hashes, page buffer */
    if (o->cold && p->bkp != TR_KV_BKP_OFF) /* last moves; victims, candidates */
        d += L * n_ctx * 4 + slots * 12 + ws * 4;
    if (o->cold && p->csd) { /* the shared region holds the working set (counted above) */
        d += tr_kv_csd_region_bytes(s, ws, o->q8row, rec) - ws * rec + nh * 16;
        /* the agent's own memory, when it runs on this machine: its copy of the key copies
         * (filled as pages are scored), one layer's per-head scores and the rows' staging */
        d += L * nkv * n_ctx * o->qrow +
             (uint64_t)o->n_pages * round_up(o->page_bytes - o->page_qoff, 4096) +
             nh * n_ctx * 4 + round_up(ws * rec, KV_HUGE);
    }
    if (tiered) d += L * nkv * (hk_rows * o->qrow + (uint64_t)o->hdk_pad * 4);
    if (quest) d += L * nkv * (uint64_t)o->n_pages * (uint64_t)s->head_dim_k * 4;
    if (h2o) d += L * n_ctx * 4 + nh * n_ctx * 4;     /* masses, the row's scores per head */
    if (tiered) d += nh * n_ctx * 4 + nh * 8;         /* scores per head, their max and sum */
    if (p->tail_bits) /* value copy; per head: the estimate and its share */
        d += L * nkv * n_ctx * o->vrow + nh * ((uint64_t)o->hdv_pad * 4 + 4) +
             nkv * (n_ctx + 1) * 4; /* positions summed per KV head */
    d += n_ctx * (4 + 4 + 4 + 1 + 1) + (uint64_t)o->n_pages * 4; /* selection scratch */
    if (p->spec) d += 2 * n_ctx * (4 + 1);                        /* two layers' lists */
    d += nh * ((uint64_t)o->hdk_pad * 4 + o->q8row);             /* quantized query */
    d += (uint64_t)o->n_scratch * (ws * 6 + (uint64_t)s->head_dim_k * 2);
    d += TR_KV_ROW_BLOCK * (nh * 12 + 8);               /* softmax state, ranges */
    if (o->cold) d += TR_KV_GATHERS * ws * (sizeof(tr_io_job) + 4); /* gather jobs */
    d += rec;
    o->dram = d;
    return TR_OK;
}

uint64_t tr_kv_dram_bytes(const tr_kv_shape *shape, const tr_kv_params *params) {
    kv_plan pl;
    /* the cold directory is not needed to size DRAM */
    tr_kv_params p = *params;
    if (!p.cold_dir) p.cold_dir = ".";
    return kv_plan_make(shape, &p, &pl, NULL) ? 0 : pl.dram;
}

uint64_t tr_kv_cold_bytes_needed(const tr_kv_shape *shape, const tr_kv_params *params) {
    kv_plan pl;
    tr_kv_params p = *params;
    if (!p.cold_dir) p.cold_dir = ".";
    return kv_plan_make(shape, &p, &pl, NULL) ? 0 : pl.cold_bytes;
}

const char *tr_kv_cold_path(const tr_kv *kv) { return kv ? kv->cold_path : NULL; }

/* ---------------------------------------------------------------------------------------------- */

/* Big buffers (hot pool, working set, key copy) on transparent huge pages where the kernel
 * offers them: attention walks each head's rows at the stride of a whole record (16 KiB for a
 * 7B-like shape), so with 4 KiB pages nearly every row is a TLB miss (measured: 2x slower). */

static void *kv_alloc(size_t n, size_t align, uint64_t *total) {
    void *p = NULL;
    if (!n) n = 1;
    if (align > 16 || n >= 2 * KV_HUGE) {
        const bool huge = n >= 2 * KV_HUGE;
        if (huge) align = KV_HUGE;
        if (posix_memalign(&p, align, round_up(n, align))) return NULL;
#ifdef MADV_HUGEPAGE
        if (huge) madvise(p, round_up(n, align), MADV_HUGEPAGE); /* advice only */
#endif
        memset(p, 0, n);
    } else {
        p = calloc(1, n);
    }
    *total += n;
    return p;
}

void tr_kv_free(tr_kv *kv) {
    if (!kv) return;
    tr_kv_spec_drop(kv); /* reads of a selection made ahead target the working set */
    tr_kv_csd_stop(kv); /* the agent reads the segment files: it goes first */
    tr_kv_io_free(kv);
    tr_kv_cold_close(kv);
    if (kv->layers) {
        /* per-layer arrays are views into a few big blocks owned by layer 0 */
        tr_kv_layer *L = &kv->layers[0];
        free(L->free_slots);
        free(L->slot_pos);
        free(L->hot);
        free(L->tok);
        free(L->hash);
        free(L->qk);
        free(L->qv);
        free(L->eq);
        free(L->pmin);
        free(L->pmax);
        free(L->mass);
        free(L->moved);
    }
    free(kv->layers);
    free(kv->ws);
    free(kv->pagebuf);
    free(kv->pull_buf);
    free(kv->rec_tmp);
    free(kv->sel);
    free(kv->cand);
    free(kv->cscore);
    free(kv->mark);
    free(kv->pg_order);
    free(kv->qf);
    free(kv->q8);
    free(kv->th_s);
    free(kv->th_p);
    free(kv->th_q);
    free(kv->st_m);
    free(kv->st_l);
    free(kv->hs);
    free(kv->hz);
    free(kv->tail_o);
    free(kv->tail_e);
    free(kv->tail_idx);
    free(kv->tail_n);
    free(kv->vlo);
    free(kv->vhi);
    free(kv->skip);
    for (int i = 0; i < 2; i++) {
        free(kv->plist[i]);
        free(kv->pskip[i]);
    }
    free(kv->csd_m);
    free(kv->csd_c);
    free(kv->csd_z);
    free(kv->bkp_pos);
    free(kv->bkp_key);
    free(kv->bkp_idx);
    free(kv->bkp_cand);
    free(kv->cold_path);
    free(kv->cold_dir_copy);
    free(kv);
}

tr_status tr_kv_create(const tr_kv_shape *shape, const tr_kv_params *params, tr_kv **out,
                       tr_error *err) {
    *out = NULL;
    kv_plan pl;
    tr_status st = kv_plan_make(shape, params, &pl, err);
    if (st) return st;
    tr_kv_tables_init();

    tr_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    kv->csd_fd = -1; /* before anything can fail: tr_kv_free closes them */
    kv->csd_sock = -1;
    kv->shape = *shape;
    kv->params = *params;
    kv->params.cold_dir = NULL;
    if (params->cold_dir && pl.cold) {
        kv->cold_dir_copy = strdup(params->cold_dir);
        kv->params.cold_dir = kv->cold_dir_copy;
    }
    kv->kern = tr_kernels_best();
    kv->group = shape->n_head / shape->n_head_kv;
    kv->krec = pl.krec;
    kv->rec = pl.rec;
    kv->hot_slots = pl.hot_slots;
    kv->cold = pl.cold;
    kv->n_pages = pl.n_pages;
    kv->qtype = pl.qtype;
    kv->hdk_pad = pl.hdk_pad;
    kv->qrow = pl.qrow;
    kv->q8row = pl.q8row;
    kv->hk_sink = pl.hk_sink;
    kv->hk_ring = pl.hk_ring;
    kv->hk_rows = pl.hk_sink + pl.hk_ring;
    kv->hk_wrap = kv->hk_rows < shape->n_ctx;
    kv->vtype = pl.vtype;
    kv->hdv_pad = pl.hdv_pad;
    kv->vrow = pl.vrow;
    kv->agg = TR_KV_AGG_PSUM;
    kv->eq_mode = TR_KV_EQ_ABSMAX;
    /* the agent serves scattered reads on its own I/O threads, and joined reads would carry
     * unselected rows across the link */
    /* with the agent, joined reads would send the records between the runs over the link:
     * it joins them in its own memory instead */
    kv->read_gap = params->csd ? 0 : KV_READ_GAP;
    kv->csd_gap = KV_CSD_READ_GAP;
    kv->pipe = TR_KV_PIPE;
    tr_kv_app_init(kv);
    kv->pipe_min = KV_PIPE_MIN;
    kv->data_off = pl.data_off;
    kv->page_bytes = pl.page_bytes;
    kv->page_qoff = pl.page_qoff;
    kv->page_toff = pl.page_toff;
    kv->ws_cap = pl.ws_cap;
    kv->n_scratch = pl.n_scratch;

    const size_t NL = (size_t)shape->n_layer, n_ctx = (size_t)shape->n_ctx;
    const size_t nkv = (size_t)shape->n_head_kv, nh = (size_t)shape->n_head;
    const size_t slots = (size_t)pl.hot_slots, hdk = (size_t)shape->head_dim_k;
    const tr_kv_policy pol = params->policy;
    uint64_t total = 0;
    bool ok = true;
#define ALLOC(ptr, n, align)                                                                       \
    do {                                                                                           \
        (ptr) = kv_alloc((n), (align), &total);                                                    \
        ok = ok && (ptr);                                                                          \
    } while (0)

    ALLOC(kv->layers, NL * sizeof(tr_kv_layer), 0);
    if (!ok) {
        tr_kv_free(kv);
        return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    }
    uint32_t *free_slots;
    int32_t *slot_pos;
    uint8_t *hot, *qk = NULL, *qv = NULL;
    tr_kv_tok *tok;
    uint64_t *hash = NULL;
    float *eq = NULL, *mass = NULL;
    uint32_t *moved = NULL;
    const bool bkp = pl.cold && params->bkp != TR_KV_BKP_OFF;
    uint16_t *pmin = NULL, *pmax = NULL;
    ALLOC(free_slots, NL * slots * 4, 0);
    ALLOC(slot_pos, NL * slots * 4, 0);
    ALLOC(hot, NL * slots * pl.rec, 4096);
    ALLOC(tok, NL * n_ctx * sizeof(tr_kv_tok), 0);
    if (pl.cold) ALLOC(hash, NL * n_ctx * 8, 0);
    if (bkp) ALLOC(moved, NL * n_ctx * 4, 0);
    if (pol == TR_KV_TIERED) {
        ALLOC(qk, NL * nkv * (size_t)kv->hk_rows * pl.qrow, 64);
        ALLOC(eq, NL * nkv * (size_t)pl.hdk_pad * 4, 0);
    }
    if (params->tail_bits) {
        ALLOC(qv, NL * nkv * n_ctx * pl.vrow, 64);
        ALLOC(kv->tail_o, nh * (size_t)pl.hdv_pad * 4, 64);
        ALLOC(kv->tail_e, nh * 4, 0);
        ALLOC(kv->tail_idx, (size_t)nkv * n_ctx * 4, 0);
        ALLOC(kv->tail_n, (size_t)nkv * 4, 0);
    }
    if (pol == TR_KV_QUEST) {
        ALLOC(pmin, NL * nkv * (size_t)pl.n_pages * hdk * 2, 0);
        ALLOC(pmax, NL * nkv * (size_t)pl.n_pages * hdk * 2, 0);
    }
    if (pol == TR_KV_H2O) ALLOC(mass, NL * n_ctx * 4, 0);
    if (pol == TR_KV_H2O || pol == TR_KV_TIERED) ALLOC(kv->hs, nh * n_ctx * 4, 0);
    if (pol == TR_KV_TIERED) ALLOC(kv->hz, nh * 8, 0);
    /* layer 0 owns the blocks (freed through its pointers) */
    for (size_t l = 0; l < NL && ok; l++) {
        tr_kv_layer *L = &kv->layers[l];
        L->free_slots = free_slots + l * slots;
        L->slot_pos = slot_pos + l * slots;
        L->hot = hot + l * slots * pl.rec;
        L->tok = tok + l * n_ctx;
        L->hash = hash ? hash + l * n_ctx : NULL;
        L->qk = qk ? qk + l * nkv * (size_t)kv->hk_rows * pl.qrow : NULL;
        L->qv = qv ? qv + l * nkv * n_ctx * pl.vrow : NULL;
        L->eq = eq ? eq + l * nkv * (size_t)pl.hdk_pad : NULL;
        L->pmin = pmin ? pmin + l * nkv * (size_t)pl.n_pages * hdk : NULL;
        L->pmax = pmax ? pmax + l * nkv * (size_t)pl.n_pages * hdk : NULL;
        L->mass = mass ? mass + l * n_ctx : NULL;
        L->moved = moved ? moved + l * n_ctx : NULL;
        L->step = 1;
        L->att_hi = -1;
        L->sel_last_pos = -2; /* no row yet: none follows it */
        L->csd_inval = INT32_MAX;
        L->fd = -1;
        L->n_free = (int32_t)slots;
        for (size_t i = 0; i < slots; i++) {
            L->free_slots[i] = (uint32_t)(slots - 1 - i); /* slot 0 first */
            L->slot_pos[i] = -1;
        }
        L->demote_next = params->n_sink;
        if (L->eq)
            for (int32_t i = 0; i < (int32_t)nkv * pl.hdk_pad; i++) L->eq[i] = 1.0f;
    }
    if (!ok) { /* the layer views were not set: free the blocks directly */
        free(free_slots);
        free(slot_pos);
        free(hot);
        free(tok);
        free(hash);
        free(qk);
        free(qv);
        free(eq);
        free(pmin);
        free(pmax);
        free(mass);
        free(moved);
        memset(kv->layers, 0, NL * sizeof(tr_kv_layer));
        for (size_t l = 0; l < NL; l++) kv->layers[l].fd = -1;
        tr_kv_free(kv);
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl.dram);
    }

    const bool csd = pl.cold && params->csd;
    kv->csd = csd;
    kv->csd_chunk = params->csd_chunk ? (params->csd_chunk + TR_KV_PAGE - 1) / TR_KV_PAGE * TR_KV_PAGE
                                      : 1024;
    if (!csd) ALLOC(kv->ws, (size_t)pl.ws_cap * pl.rec, 4096); /* else in the shared region */
    if (csd) {
        ALLOC(kv->csd_m, nh * 4, 0);
        ALLOC(kv->csd_c, nh * 8, 0);
        ALLOC(kv->csd_z, nh * 8, 0);
    }
    if (pl.cold) ALLOC(kv->pagebuf, pl.page_bytes, 4096);
    ALLOC(kv->rec_tmp, pl.rec, 4096);
    ALLOC(kv->sel, n_ctx * 4, 0);
    ALLOC(kv->cand, n_ctx * 4, 0);
    ALLOC(kv->cscore, n_ctx * 4, 0);
    ALLOC(kv->mark, n_ctx, 0);
    ALLOC(kv->pg_order, (size_t)pl.n_pages * 4, 0);
    /* the query in float; also the staging row of the key and value copies */
    ALLOC(kv->qf,
          (nh * (size_t)pl.hdk_pad > (size_t)pl.hdv_pad ? nh * (size_t)pl.hdk_pad
                                                        : (size_t)pl.hdv_pad) *
              4,
          0);
    ALLOC(kv->q8, nh * pl.q8row, 64);
    ALLOC(kv->th_s, (size_t)pl.n_scratch * (size_t)pl.ws_cap * 4, 64);
    ALLOC(kv->th_p, (size_t)pl.n_scratch * (size_t)pl.ws_cap * 2, 64);
    ALLOC(kv->th_q, (size_t)pl.n_scratch * hdk * 2, 64);
    ALLOC(kv->st_m, TR_KV_ROW_BLOCK * nh * 4, 0);
    ALLOC(kv->st_l, TR_KV_ROW_BLOCK * nh * 8, 0);
    ALLOC(kv->vlo, TR_KV_ROW_BLOCK * 4, 0);
    ALLOC(kv->vhi, TR_KV_ROW_BLOCK * 4, 0);
    ALLOC(kv->skip, n_ctx, 0);
    kv->spec_in[0].layer = kv->spec_in[1].layer = kv->pre.layer = -1;
    if (params->spec)
        for (int i = 0; i < 2; i++) {
            ALLOC(kv->plist[i], n_ctx * 4, 0);
            ALLOC(kv->pskip[i], n_ctx, 0);
        }
    if (bkp) {
        ALLOC(kv->bkp_pos, slots * 4, 0);
        ALLOC(kv->bkp_key, slots * 4, 0);
        ALLOC(kv->bkp_idx, slots * 4, 0);
        ALLOC(kv->bkp_cand, (size_t)pl.ws_cap * 4, 0);
    }
#undef ALLOC
    if (!ok) {
        tr_kv_free(kv);
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl.dram);
    }
    if (pl.cold) {
        st = tr_kv_cold_open(kv, err);
        if (!st) st = tr_kv_io_init(kv, err);
        if (!st && csd) st = tr_kv_csd_start(kv, err);
        if (st) {
            tr_kv_free(kv);
            return st;
        }
    }
    *out = kv;
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */

void tr_kv_drop_hot(tr_kv *kv, tr_kv_layer *L, int32_t pos) {
    (void)kv;
    tr_kv_tok *t = &L->tok[pos];
    L->slot_pos[t->slot] = -1;
    L->free_slots[L->n_free++] = t->slot;
}

/* demote the oldest non-sink hot token whose page is written; false if none */
static bool demote_one(tr_kv *kv, tr_kv_layer *L) {
    for (int32_t p = L->demote_next; p < L->len; p++) {
        tr_kv_tok *t = &L->tok[p];
        if (t->where != TR_KV_TOK_HOT) continue;
        /* pages are written in order: past the first unwritten one nothing has a cold copy */
        if (p / TR_KV_PAGE >= L->pages_written) return false;
        tr_kv_drop_hot(kv, L, p);
        t->where = TR_KV_TOK_COLD;
        L->demote_next = p + 1;
        kv->demotions++;
        return true;
    }
    return false;
}

int32_t tr_kv_visible_lo(int32_t pos, int32_t swa) {
    return swa > 0 && pos >= swa ? pos - swa + 1 : 0;
}

static void drop_positions(tr_kv *kv, tr_kv_layer *L, int32_t n) {
    for (int32_t p = n; p < L->len; p++) {
        tr_kv_tok *t = &L->tok[p];
        if (t->where == TR_KV_TOK_HOT) tr_kv_drop_hot(kv, L, p);
        if (t->where == TR_KV_TOK_EVICTED) L->n_evicted--;
        memset(t, 0, sizeof *t);
        if (L->mass) L->mass[p] = 0.0f;
        if (L->moved) L->moved[p] = 0;
    }
    L->len = n;
    if (L->att_hi > n - 1) L->att_hi = n - 1;
    /* pages from the one holding n on may be written again with other tokens */
    if (L->csd_inval > n / TR_KV_PAGE) L->csd_inval = n / TR_KV_PAGE;
    if (L->pages_written > n / TR_KV_PAGE) L->pages_written = n / TR_KV_PAGE;
    const int32_t lo = n > kv->params.n_sink ? n : kv->params.n_sink;
    if (L->demote_next > lo) L->demote_next = lo;
}

tr_status tr_kv_append_rec(tr_kv *kv, int32_t layer, const uint8_t *rec, tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    const int32_t pos = L->len;
    if (pos >= kv->shape.n_ctx)
        return tr_fail(err, TR_E_ARG, "KV cache full: layer %d holds %d positions (n_ctx)", layer,
                       kv->shape.n_ctx);
    if (!L->n_free && !(L->moved ? tr_kv_make_room(kv, L) : demote_one(kv, L)))
        return tr_fail(err, TR_E_INTERNAL,
                       "KV hot pool of layer %d: %d slots, none can be demoted at position %d",
                       layer, kv->hot_slots, pos);
    const uint32_t slot = L->free_slots[--L->n_free];
    memcpy(L->hot + (size_t)slot * kv->rec, rec, kv->rec);
    L->tok[pos] = (tr_kv_tok){.slot = slot, .hits = 0, .where = TR_KV_TOK_HOT};
    L->slot_pos[slot] = pos;
    L->len = pos + 1;
    if (L->mass) L->mass[pos] = 0.0f;
    if (L->qk) {
        tr_kv_quant_key(kv, L, pos, rec);
        /* the per-channel scales come from the first page, which is still hot here (the hot
         * pool holds at least two pages); its tokens are quantized again with them */
        if (!L->calibrated && pos == TR_KV_PAGE - 1) tr_kv_calibrate(kv, L);
    }
    if (L->qv) tr_kv_quant_value(kv, L, pos, rec);
    if (L->pmin) tr_kv_quest_update(kv, L, pos, rec);
    if (kv->cold && (pos + 1) % TR_KV_PAGE == 0) {
        tr_status st = tr_kv_cold_write_page(kv, layer, pos / TR_KV_PAGE, err);
        if (st) { /* the token is not kept: the caller may stop or retry */
            drop_positions(kv, L, pos);
            return st;
        }
    }
    return TR_OK;
}

tr_status tr_kv_append(tr_kv *kv, int32_t layer, int32_t pos, const float *k, const float *v,
                       tr_error *err) {
    if (layer < 0 || layer >= kv->shape.n_layer)
        return tr_fail(err, TR_E_ARG, "KV append: layer %d of %d", layer, kv->shape.n_layer);
    if (pos != kv->layers[layer].len)
        return tr_fail(err, TR_E_ARG, "KV append: layer %d holds %d positions, got position %d",
                       layer, kv->layers[layer].len, pos);
    /* through the kernel table (round to nearest even), so a family with a SIMD conversion
     * speeds appends up */
    uint16_t *r = (uint16_t *)kv->rec_tmp;
    const size_t nk = kv->krec / 2, nv = (kv->rec - kv->krec) / 2;
    const tr_from_float_fn to16 = kv->kern->from_float[TR_TYPE_F16];
    to16(k, r, (int64_t)nk);
    to16(v, r + nk, (int64_t)nv);
    return tr_kv_append_rec(kv, layer, kv->rec_tmp, err);
}

/* After a truncate from len to n, the host's key ring must hold [n - hk_ring, n) again: the
 * positions of it that newer ones wrote over are quantized again from their records (the hot
 * pool's, or read back from the pages, which a truncate leaves in place), giving the same bytes */
static tr_status refill_host_keys(tr_kv *kv, int32_t layer, int32_t len, int32_t n,
                                  tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    const int32_t S = kv->hk_sink, R = kv->hk_ring;
    const int32_t a = n - R > S ? n - R : S, held = len - R > S ? len - R : S;
    const int32_t b = n < held ? n : held;
    for (int32_t p = a; p < b;) {
        const tr_kv_tok *t = &L->tok[p];
        if (t->where == TR_KV_TOK_HOT) {
            tr_kv_quant_key(kv, L, p, L->hot + (size_t)t->slot * kv->rec);
            p++;
            continue;
        }
        if (t->where != TR_KV_TOK_COLD) { /* evicted: never scored again */
            p++;
            continue;
        }
        int32_t e = p + 1; /* a run of cold records within one page */
        while (e < b && e % TR_KV_PAGE && L->tok[e].where == TR_KV_TOK_COLD) e++;
        tr_status st = tr_kv_cold_read_sync(kv, layer, p, e - p, kv->ws, err);
        if (st) return st;
        for (int32_t i = p; i < e; i++)
            tr_kv_quant_key(kv, L, i, kv->ws + (size_t)(i - p) * kv->rec);
        p = e;
    }
    return TR_OK;
}

tr_status tr_kv_truncate(tr_kv *kv, int32_t n, tr_error *err) {
    if (n < 0) return tr_fail(err, TR_E_ARG, "KV truncate to %d", n);
    tr_kv_spec_drop(kv);
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        tr_kv_layer *L = &kv->layers[l];
        L->selected = 0;
        if (n >= L->len) continue;
        const int32_t len = L->len;
        drop_positions(kv, L, n);
        if (kv->hk_wrap && L->qk) {
            tr_status st = refill_host_keys(kv, l, len, n, err);
            if (st) return st;
        }
        /* the page that is open again keeps bounds of the dropped tokens: recompute them */
        if (L->pmin && n % TR_KV_PAGE) {
            tr_status st = tr_kv_quest_rebuild_page(kv, l, n / TR_KV_PAGE, err);
            if (st) return st;
        }
    }
    return TR_OK;
}

void tr_kv_get_stats(const tr_kv *kv, tr_kv_stats *o) {
    memset(o, 0, sizeof *o);
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        const tr_kv_layer *L = &kv->layers[l];
        if (L->len > o->tokens) o->tokens = L->len;
        o->hot_bytes += (uint64_t)(kv->hot_slots - L->n_free) * kv->rec;
        if (kv->cold) o->cold_bytes += (uint64_t)L->pages_written * kv->page_bytes;
        o->selected += L->selected;
        o->evicted += (uint64_t)L->n_evicted;
    }
    o->bytes_read = kv->bytes_read;
    o->score_ns = kv->score_ns;
    o->attn_ns = kv->attn_ns;
    o->steps = kv->steps;
    o->io_ns = kv->io_ns;
    o->read_ops = kv->read_ops;
    o->promotions = kv->promotions;
    o->demotions = kv->demotions;
    o->pingpong = kv->pingpong;
    o->migrated_bytes = kv->migrated_bytes;
    o->sel_hot = kv->sel_hot;
    o->sel_cold = kv->sel_cold;
    o->sel_follow = kv->sel_follow;
    o->sel_repeat = kv->sel_repeat;
    o->beta = kv->app_beta;
    o->beta_split = kv->app_beta_split;
    o->f_c = kv->app_tc > 0 ? 1e9 / kv->app_tc : 0;
    o->f_s = kv->app_ts > 0 ? 1e9 / kv->app_ts : 0;
    o->b_c = kv->app_bc * 1e9;
    o->b_s = kv->app_bs * 1e9;
    o->alpha_c = kv->app_ac;
    o->alpha_s = kv->app_as;
    o->tail_rows = kv->tail_rows;
    o->tail_share_sum = kv->tail_share_sum;
    o->tail_cand = kv->tail_cand;
    o->tail_kept = kv->tail_kept;
    o->spec_rows = kv->spec_rows;
    o->spec_early = kv->spec_early;
    o->spec_cos_sum = kv->spec_cos_sum;
    tr_kv_csd_counters(kv, &o->csd_score_bytes, &o->csd_row_bytes, &o->csd_storage_bytes,
                       &o->csd_busy_ns, &o->csd_mem_bytes);
}
