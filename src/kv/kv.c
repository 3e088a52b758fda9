/*
 * The KV cache instance: parameters and their names, the plan (every size derived once and
 * checked against the budgets before anything is allocated), create and free, the operations
 * every policy implements dispatched to it, and the stats' one text and JSON form.
 */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "kv/csd.h"
#include "kv/kv_csd.h"
#include "kv/kv_pooled.h"

#define KV_WS_AUTO (64ull << 20)
#define KV_HUGE    (2u << 20)

tr_kv_params tr_kv_default_params(void) {
    /* alpha 0.2: HillInfer's (and H2O's) importance rate */
    return (tr_kv_params){.policy = TR_KV_AUTO,
                          .alpha = 0.2f,
                          .n_sink = 4,
                          .n_window = 64,
                          .score_bits = 8,
                          .tail_min = 1.0f,
                          .research = {.beta = -1.0f}};
}

static const char *const policy_names[] = {"full", "offload", "h2o", "quest", "tiered", "auto"};

tr_status tr_kv_policy_parse(const char *name, tr_kv_policy *out, tr_error *err) {
    for (int i = 0; i < 6; i++)
        if (name && !strcmp(name, policy_names[i])) {
            *out = (tr_kv_policy)i;
            return TR_OK;
        }
    return tr_fail(err, TR_E_ARG, "unknown KV policy '%s' (auto, full, offload, h2o, quest, tiered)",
                   name ? name : "(null)");
}

const char *tr_kv_policy_name(tr_kv_policy p) { return (unsigned)p < 6 ? policy_names[p] : "?"; }

/* ---------------------------------------------------------------------------------------------- */
/* the plan of a pooled policy                                                                    */

tr_status tr_kv_plan_make(const tr_kv_shape *s, const tr_kv_params *p, tr_kv_plan *o,
                          tr_error *err) {
    memset(o, 0, sizeof *o);
    if (s->n_layer < 1 || s->n_ctx < 1 || s->n_head < 1 || s->n_head_kv < 1 || s->head_dim_k < 1 ||
        s->head_dim_v < 1 || s->n_head % s->n_head_kv)
        return tr_fail(err, TR_E_ARG,
                       "KV shape: %d layers, n_ctx %d, %d heads / %d KV heads, head dims %d/%d",
                       s->n_layer, s->n_ctx, s->n_head, s->n_head_kv, s->head_dim_k, s->head_dim_v);
    if (p->policy == TR_KV_AUTO)
        return tr_fail(err, TR_E_ARG, "KV policy auto is resolved by the session (it knows the "
                       "memory budget): the cache itself takes full, offload, h2o, quest or tiered");
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
    if (p->csd_chunk < 0 || p->csd_chunk > (1 << 20) || p->research.csd_gbps < 0 ||
        p->research.csd_gflops < 0 || p->research.csd_link_gbps < 0 || !(p->csd_timeout >= 0))
        return tr_fail(err, TR_E_ARG, "--csd-chunk %d / --csd-gbps %g / --csd-gflops %g / "
                       "--csd-link-gbps %g / --csd-timeout %g: must be >= 0", p->csd_chunk,
                       p->research.csd_gbps, p->research.csd_gflops, p->research.csd_link_gbps,
                       p->csd_timeout);
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
    o->hdk_pad = (int32_t)tr_kv_round_up((uint64_t)s->head_dim_k, 32);
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
    o->hdv_pad = (int32_t)tr_kv_round_up((uint64_t)s->head_dim_v, 32);
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
    o->page_bytes = (size_t)tr_kv_round_up(o->page_toff + sizeof(tr_kv_page_trailer), o->aligned ? 4096 : 64);
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
    o->agent_dram = 0;
    if (o->cold && p->csd) { /* the shared region holds the working set (counted above) */
        d += tr_kv_csd_region_bytes(s, ws, o->q8row, rec) - ws * rec + nh * 16;
        /* the agent's own memory (its copy of the key copies, filled as pages are scored; one
         * layer's per-head scores; the rows' staging and bounce buffers) is its process's, apart
         * from this one's: a budget holds both, this process's peak RSS only the first */
        o->agent_dram = tr_csd_agent_bytes(s->n_layer, s->n_ctx, s->n_head, s->n_head_kv,
                                           TR_KV_PAGE, tr_kv_csd_chunk(p->csd_chunk), (int32_t)ws,
                                           rec, o->qrow, o->page_bytes, o->page_qoff);
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
    d += (uint64_t)o->n_scratch * tr_kv_attn_floats(s, (int32_t)ws, NULL) * 4; /* attention */
    o->row_block = p->max_rows > TR_KV_ROW_BLOCK ? p->max_rows : TR_KV_ROW_BLOCK;
    d += (uint64_t)o->row_block * (nh * 12 + 8);        /* softmax state, ranges */
    if (o->cold) d += TR_KV_GATHERS * ws * (sizeof(tr_io_job) + 4); /* gather jobs */
    d += rec;
    o->dram = d;
    return TR_OK;
}

/* the full policy: the shape (its per-layer head counts within the maxima), and its arrays within
 * the hot budget when one is given */
static tr_status full_plan(const tr_kv_shape *s, const tr_kv_params *p, tr_error *err) {
    if (s->n_layer < 1 || s->n_ctx < 1 || s->n_head < 1 || s->n_head_kv < 1 || s->head_dim_k < 1 ||
        s->head_dim_v < 1)
        return tr_fail(err, TR_E_ARG,
                       "KV shape: %d layers, n_ctx %d, %d heads / %d KV heads, head dims %d/%d",
                       s->n_layer, s->n_ctx, s->n_head, s->n_head_kv, s->head_dim_k, s->head_dim_v);
    for (int32_t l = 0; l < s->n_layer; l++) {
        const int32_t h = s->layer_n_head ? s->layer_n_head[l] : s->n_head;
        const int32_t g = s->layer_n_head_kv ? s->layer_n_head_kv[l] : s->n_head_kv;
        if (h < 1 || g < 1 || h > s->n_head || g > s->n_head_kv || h % g)
            return tr_fail(err, TR_E_ARG, "KV shape: layer %d has %d heads / %d KV heads (at most "
                           "%d / %d)", l, h, g, s->n_head, s->n_head_kv);
    }
    const uint64_t rec = (uint64_t)s->n_head_kv * (uint64_t)(s->head_dim_k + s->head_dim_v) * 2;
    const uint64_t all = (uint64_t)s->n_layer * (uint64_t)s->n_ctx * rec;
    if (p->hot_bytes && p->hot_bytes < all)
        return tr_fail(err, TR_E_BUDGET,
                       "KV policy full keeps all KV in DRAM: %d layers x %d tokens x %llu bytes = "
                       "%llu bytes, --kv-hot gives %llu (raise it, or use offload or tiered)",
                       s->n_layer, s->n_ctx, (unsigned long long)rec, (unsigned long long)all,
                       (unsigned long long)p->hot_bytes);
    return TR_OK;
}

/* the managed policies need the same head counts in every layer */
static tr_status uniform_heads(const tr_kv_shape *s, const tr_kv_params *p, tr_error *err) {
    for (int32_t l = 0; l < s->n_layer; l++)
        if ((s->layer_n_head && s->layer_n_head[l] != s->n_head) ||
            (s->layer_n_head_kv && s->layer_n_head_kv[l] != s->n_head_kv))
            return tr_fail(err, TR_E_UNSUPPORTED,
                           "--kv-policy %s needs the same head counts in every layer",
                           tr_kv_policy_name(p->policy));
    return TR_OK;
}

/* a pooled configuration's plan for sizing, false if the parameters are invalid: the cold
 * directory is not needed to size memory or storage */
static bool sizing_plan(const tr_kv_shape *shape, const tr_kv_params *params, tr_kv_plan *pl) {
    tr_kv_params p = *params;
    if (!p.cold_dir) p.cold_dir = ".";
    return tr_kv_plan_make(shape, &p, pl, NULL) == TR_OK;
}

uint64_t tr_kv_dram_bytes(const tr_kv_shape *shape, const tr_kv_params *params) {
    if (params->policy == TR_KV_FULL)
        return full_plan(shape, params, NULL) ? 0 : tr_kv_full_bytes(shape, params);
    tr_kv_plan pl;
    return sizing_plan(shape, params, &pl) ? pl.dram : 0;
}

uint64_t tr_kv_agent_dram_bytes(const tr_kv_shape *shape, const tr_kv_params *params) {
    tr_kv_plan pl;
    return params->policy != TR_KV_FULL && sizing_plan(shape, params, &pl) ? pl.agent_dram : 0;
}

uint64_t tr_kv_cold_bytes_needed(const tr_kv_shape *shape, const tr_kv_params *params) {
    tr_kv_plan pl;
    return params->policy != TR_KV_FULL && sizing_plan(shape, params, &pl) ? pl.cold_bytes : 0;
}

const char *tr_kv_cold_path(const tr_kv *kv) {
    if (!kv || kv->ops != &tr_kv_pooled_kv_ops) return NULL;
    return tr_kv_pooled_of(kv)->st.cold_path;
}

/* ---------------------------------------------------------------------------------------------- */

/* Big buffers (hot pool, working set, key copy) on transparent huge pages where the kernel
 * offers them: attention walks each head's rows at the stride of a whole record (16 KiB for a
 * 7B-like shape), so with 4 KiB pages nearly every row is a TLB miss (measured: 2x slower). */
void *tr_kv_alloc(size_t n, size_t align, uint64_t *total) {
    void *p = NULL;
    if (!n) n = 1;
    if (align > 16 || n >= 2 * KV_HUGE) {
        const bool huge = n >= 2 * KV_HUGE;
        if (huge) align = KV_HUGE;
        if (posix_memalign(&p, align, tr_kv_round_up(n, align))) return NULL;
#ifdef MADV_HUGEPAGE
        if (huge) madvise(p, tr_kv_round_up(n, align), MADV_HUGEPAGE); /* advice only */
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
    if (kv->ops) kv->ops->free(kv);
    free(kv->strings);
    free(kv);
}

/* the caller's strings, copied: the cache outlives the caller's buffers */
static bool copy_strings(tr_kv *kv, const tr_kv_params *p) {
    const char *src[3] = {p->cold_dir, p->csd_socket, p->csd_bin};
    size_t total = 0;
    for (int i = 0; i < 3; i++) total += src[i] ? strlen(src[i]) + 1 : 0;
    kv->strings = malloc(total ? total : 1);
    if (!kv->strings) return false;
    char *w = kv->strings;
    const char **dst[3] = {&kv->params.cold_dir, &kv->params.csd_socket, &kv->params.csd_bin};
    for (int i = 0; i < 3; i++) {
        *dst[i] = NULL;
        if (!src[i]) continue;
        strcpy(w, src[i]);
        *dst[i] = w;
        w += strlen(src[i]) + 1;
    }
    return true;
}

tr_status tr_kv_create(const tr_kv_shape *shape, const tr_kv_params *params, tr_kv **out,
                       tr_error *err) {
    *out = NULL;
    tr_kv_plan pl;
    tr_status st;
    const bool full = params->policy == TR_KV_FULL;
    if (full)
        st = full_plan(shape, params, err);
    else if (!(st = uniform_heads(shape, params, err)))
        st = tr_kv_plan_make(shape, params, &pl, err);
    if (st) return st;
    tr_kv_tables_init();

    tr_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    kv->shape = *shape;
    kv->shape.layer_n_head = kv->shape.layer_n_head_kv = NULL; /* the full policy copies them */
    kv->params = *params;
    kv->kern = tr_kernels_best();
    if (!copy_strings(kv, params)) {
        free(kv);
        return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    }
    if (full) {
        kv->shape = *shape; /* for create */
        st = tr_kv_full_create(kv, err);
        kv->shape.layer_n_head = kv->shape.layer_n_head_kv = NULL;
    } else {
        switch (params->policy) {
        case TR_KV_OFFLOAD: st = tr_kv_offload_create(kv, &pl, err); break;
        case TR_KV_H2O: st = tr_kv_h2o_create(kv, &pl, err); break;
        case TR_KV_QUEST: st = tr_kv_quest_create(kv, &pl, err); break;
        default: st = tr_kv_tiered_create(kv, &pl, err); break;
        }
        /* the pooled policies keep the plan's cold directory only when there is a cold pool */
    }
    if (st) {
        tr_kv_free(kv);
        return st;
    }
    *out = kv;
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */

tr_status tr_kv_append(tr_kv *kv, int32_t layer, int32_t pos, const float *k, const float *v,
                       tr_error *err) {
    if (layer < 0 || layer >= kv->shape.n_layer)
        return tr_fail(err, TR_E_ARG, "KV append: layer %d of %d", layer, kv->shape.n_layer);
    const int32_t len = kv->ops->len(kv, layer);
    if (pos != len)
        return tr_fail(err, TR_E_ARG, "KV append: layer %d holds %d positions, got position %d",
                       layer, len, pos);
    return kv->ops->append(kv, layer, k, v, err);
}

/* what every attention call checks before the policy sees its query */
static tr_status check_query(const tr_kv *kv, const tr_kv_query *q, tr_error *err) {
    if (q->layer < 0 || q->layer >= kv->shape.n_layer)
        return tr_fail(err, TR_E_ARG, "KV attend: layer %d of %d", q->layer, kv->shape.n_layer);
    if (q->rows < 1 || !q->pos || !q->q || !q->out)
        return tr_fail(err, TR_E_ARG, "KV attend: %d rows", q->rows);
    return TR_OK;
}

tr_status tr_kv_attend(tr_kv *kv, tr_pool *pool, const tr_kv_query *q, tr_error *err) {
    tr_status st = check_query(kv, q, err);
    return st ? st : kv->ops->attend(kv, pool, q, err);
}

tr_status tr_kv_attend_many(tr_kv *const *kvs, tr_pool *pool, const tr_kv_query *qs, int n,
                            tr_error *err) {
    for (int i = 0; i < n;) {
        /* a run of full caches goes together; any other policy attends on its own */
        int e = i;
        while (e < n && e - i < TR_KV_ATTEND_MANY_MAX && kvs[e]->ops->attend == tr_kv_full_attend)
            e++;
        tr_status st;
        if (e - i > 1) {
            for (int k = i; k < e; k++)
                if ((st = check_query(kvs[k], &qs[k], err))) return st;
            st = tr_kv_full_attend_many(kvs + i, pool, qs + i, e - i, err);
        } else {
            st = tr_kv_attend(kvs[i], pool, &qs[i], err);
            e = i + 1;
        }
        if (st) return st;
        i = e;
    }
    return TR_OK;
}

tr_status tr_kv_truncate(tr_kv *kv, int32_t n, tr_error *err) {
    if (n < 0) return tr_fail(err, TR_E_ARG, "KV truncate to %d", n);
    return kv->ops->truncate(kv, n, err);
}

void tr_kv_get_stats(const tr_kv *kv, tr_kv_stats *o) {
    memset(o, 0, sizeof *o);
    o->policy = kv->params.policy;
    o->steps = kv->steps;
    o->score_ns = kv->score_ns;
    o->attn_ns = kv->attn_ns;
    kv->ops->stats(kv, o);
}

/* ---------------------------------------------------------------------------------------------- */
/* the stats' text and JSON                                                                       */

typedef struct out {
    char *buf;
    size_t cap;
    int len;
} out;

static void emit(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const size_t at = (size_t)o->len;
    const int n = vsnprintf(o->buf && at < o->cap ? o->buf + at : NULL,
                            o->buf && at < o->cap ? o->cap - at : 0, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += n;
}

/* 1536 -> "1.5 KiB" */
static const char *bytes_str(uint64_t b, char *s, size_t cap) {
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024.0 && i < 4) {
        v /= 1024.0;
        i++;
    }
    if (i == 0)
        snprintf(s, cap, "%" PRIu64 " B", b);
    else
        snprintf(s, cap, "%.2f %s", v, u[i]);
    return s;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

int tr_kv_stats_format(const tr_kv_stats *st, tr_kv_stats_style style, const char *prefix,
                       char *buf, size_t cap) {
    out o = {buf, cap, 0};
    if (buf && cap) buf[0] = 0;
    const char *pf = prefix ? prefix : "";
    const double hot_hit = ratio(st->sel_hot, st->sel_hot + st->sel_cold);
    const double repeat = ratio(st->sel_repeat, st->sel_follow);
    const double tail_share = st->tail_rows ? st->tail_share_sum / (double)st->tail_rows : 0.0;
    const double tail_kept = ratio(st->tail_kept, st->tail_cand);
    const double spec_cos = st->spec_rows ? st->spec_cos_sum / (double)st->spec_rows : 0.0;
    if (style == TR_KV_STATS_JSON) {
        emit(&o,
             "\"kv_policy\": \"%s\", \"kv_tokens\": %" PRId64 ", \"kv_hot_bytes\": %" PRIu64
             ", \"kv_cold_bytes\": %" PRIu64 ", \"kv_selected\": %" PRIu64
             ", \"kv_bytes_read\": %" PRIu64 ", \"kv_score_ms\": %.3f, \"kv_attn_ms\": %.3f, "
             "\"kv_promotions\": %" PRIu64 ", \"kv_demotions\": %" PRIu64
             ", \"kv_pingpong\": %" PRIu64 ", \"kv_migrated_bytes\": %" PRIu64
             ", \"kv_hot_hit_rate\": %.5f, \"kv_agent_score_bytes\": %" PRIu64
             ", \"kv_agent_row_bytes\": %" PRIu64 ", \"kv_beta\": %.4f, \"kv_beta_split\": %.4f, "
             "\"kv_f_c\": %.0f, \"kv_f_s\": %.0f, \"kv_b_c\": %.0f, \"kv_b_s\": %.0f, "
             "\"kv_tail_share\": %.5f, \"kv_tail_kept\": %.5f, \"kv_spec_rows\": %" PRIu64
             ", \"kv_spec_early\": %" PRIu64 ", \"kv_spec_cos\": %.4f, \"kv_sel_repeat\": %.4f"
             ", \"kv_prefill_chunks\": %" PRIu64 ", \"kv_prefill_bytes_read\": %" PRIu64
             ", \"kv_prefill_read_bound\": %" PRIu64,
             tr_kv_policy_name(st->policy), st->tokens, st->hot_bytes, st->cold_bytes,
             st->selected, st->bytes_read, (double)st->score_ns / 1e6, (double)st->attn_ns / 1e6,
             st->promotions, st->demotions, st->pingpong, st->migrated_bytes, hot_hit,
             st->csd_score_bytes, st->csd_row_bytes, st->beta, st->beta_split, st->f_c, st->f_s,
             st->b_c, st->b_s, tail_share, tail_kept, st->spec_rows, st->spec_early, spec_cos,
             repeat, st->prefill_chunks, st->prefill_bytes_read, st->prefill_read_bound);
        return o.len;
    }
    if (st->policy == TR_KV_FULL) return 0;
    char b1[32], b2[32], b3[32];
    emit(&o,
         "%skv cache     %s: %" PRId64 " tokens, hot %s, cold %s, read %s from storage, scoring "
         "%.1f ms, attention %.1f ms, %" PRIu64 " tokens attended at the last step\n",
         pf, tr_kv_policy_name(st->policy), st->tokens, bytes_str(st->hot_bytes, b1, sizeof b1),
         bytes_str(st->cold_bytes, b2, sizeof b2), bytes_str(st->bytes_read, b3, sizeof b3),
         (double)st->score_ns / 1e6, (double)st->attn_ns / 1e6, st->selected);
    if (st->prefill_chunks && st->cold_bytes)
        emit(&o,
             "%skv prefill   %" PRIu64 " chunks attended exactly, read %s from storage (at most "
             "%s: each chunk reads each cold page once); the other steps read %s\n",
             pf, st->prefill_chunks, bytes_str(st->prefill_bytes_read, b1, sizeof b1),
             bytes_str(st->prefill_read_bound, b2, sizeof b2),
             bytes_str(st->bytes_read - st->prefill_bytes_read, b3, sizeof b3));
    if (st->sel_hot + st->sel_cold)
        emit(&o,
             "%skv pools     selected tokens found hot %.1f %%, selected by the step before too "
             "%.1f %%; %" PRIu64 " promoted, %" PRIu64 " demoted, %" PRIu64 " ping-pong moves\n",
             pf, 100.0 * hot_hit, 100.0 * repeat, st->promotions, st->demotions, st->pingpong);
    if (tail_kept > 0.0 || tail_share > 0.0)
        emit(&o,
             "%skv tail      %.1f %% of the unselected tokens summed, holding on average %.2f %% "
             "of each head's attention\n",
             pf, 100.0 * tail_kept, 100.0 * tail_share);
    if (st->spec_rows)
        emit(&o,
             "%skv spec      %" PRIu64 " rows selected with a speculative query (%" PRIu64
             " during the previous layer), cosine to the real query %.3f\n",
             pf, st->spec_rows, st->spec_early, spec_cos);
    if (st->csd_score_bytes)
        emit(&o,
             "%skv agent     to the host: scores %s, rows %s; read %s from storage; beta %.2f, "
             "split %.2f (host scores %.2f M tokens/s, agent %.2f M)\n",
             pf, bytes_str(st->csd_score_bytes, b1, sizeof b1),
             bytes_str(st->csd_row_bytes, b2, sizeof b2),
             bytes_str(st->csd_storage_bytes, b3, sizeof b3), st->beta, st->beta_split,
             st->f_c / 1e6, st->f_s / 1e6);
    return o.len;
}
