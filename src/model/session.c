/*
 * Sessions: the KV cache and scratch are sized from the model and the session parameters before
 * anything is allocated, allocated once, and reused for every token.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kv/kv.h"
#include "model/session.h"

tr_session_params tr_session_default_params(void) {
    return (tr_session_params){.n_ctx = 0, .n_batch = 0, .kv = tr_kv_default_params()};
}

/* the KV cache's shape for this model; the full policy takes each layer's own head counts */
static tr_kv_shape kv_shape(const tr_model *m, int32_t n_ctx, int32_t *n_head, int32_t *n_head_kv) {
    const tr_hparams *hp = &m->hp;
    for (int32_t l = 0; l < hp->n_layer; l++) {
        n_head[l] = m->layers[l].n_head;
        n_head_kv[l] = m->layers[l].n_head_kv;
    }
    return (tr_kv_shape){.n_layer = hp->n_layer,
                         .n_ctx = n_ctx,
                         .n_head = hp->n_head_max,
                         .n_head_kv = hp->n_head_kv_max,
                         .head_dim_k = hp->head_dim_k,
                         .head_dim_v = hp->head_dim_v,
                         .layer_n_head = n_head,
                         .layer_n_head_kv = n_head_kv};
}

/* the session's KV parameters: the caller's, sized to this session's batch and threads */
static tr_kv_params kv_params(const tr_model *m, const tr_session_params *p) {
    tr_kv_params kp = p->kv;
    kp.max_rows = p->n_batch; /* a batch's rows are appended before they attend */
    kp.n_threads = m->pool ? tr_pool_size(m->pool) : tr_cpu_physical_cores();
    return kp;
}

/* the full policy's arrays, allocated whole at create (the other policies' DRAM grows within
 * their plan and is counted as it is used) */
static uint64_t full_bytes(const tr_model *m, const tr_session_params *p) {
    if (p->kv.policy != TR_KV_FULL) return 0;
    const int32_t nl = m->hp.n_layer;
    int32_t *heads = malloc(sizeof(int32_t) * 2 * (size_t)nl);
    if (!heads) return 0;
    const tr_kv_shape shape = kv_shape(m, p->n_ctx, heads, heads + nl);
    const tr_kv_params kp = kv_params(m, p);
    const uint64_t b = tr_kv_dram_bytes(&shape, &kp);
    free(heads);
    return b;
}

/* the machine's memory a KV configuration takes: this process's and the storage agent's (its own
 * process on this machine, under the same budget) */
static uint64_t kv_machine_bytes(const tr_kv_shape *shape, const tr_kv_params *kp) {
    const uint64_t d = tr_kv_dram_bytes(shape, kp);
    return d ? d + tr_kv_agent_dram_bytes(shape, kp) : 0;
}

static tr_status create_kv(const tr_model *m, const tr_session_params *p, struct tr_kv **out,
                           tr_error *err) {
    const int32_t nl = m->hp.n_layer;
    int32_t *heads = malloc(sizeof(int32_t) * 2 * (size_t)nl);
    if (!heads) return tr_fail(err, TR_E_NOMEM, "out of memory");
    const tr_kv_shape shape = kv_shape(m, p->n_ctx, heads, heads + nl);
    const tr_kv_params kp = kv_params(m, p);
    const tr_status st = tr_kv_create(&shape, &kp, out, err);
    free(heads);
    return st;
}

void tr_session_get_kv_stats(const tr_session *s, tr_kv_stats *out) {
    tr_kv_get_stats(s->kv, out);
}

/* bytes of quantized activations tr_matmul needs for `rows` rows against any weight matrix */
static size_t mm_scratch_bytes(const tr_model *m, int32_t rows) {
    size_t need = 0;
#define CONSIDER(mat)                                                                              \
    do {                                                                                           \
        if ((mat).data) {                                                                          \
            size_t b = tr_matmul_scratch_size((mat).type, (mat).n_in, rows);                       \
            if (b > need) need = b;                                                                \
        }                                                                                          \
    } while (0)
    CONSIDER(m->output);
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const tr_layer *L = &m->layers[l];
        CONSIDER(L->wq);
        CONSIDER(L->wk);
        CONSIDER(L->wv);
        CONSIDER(L->wo);
        CONSIDER(L->ffn_gate);
        CONSIDER(L->ffn_up);
        CONSIDER(L->ffn_down);
        CONSIDER(L->router);
        CONSIDER(L->shexp_gate);
        CONSIDER(L->shexp_up);
        CONSIDER(L->shexp_down);
        if (L->moe) {
            const tr_exps *x[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
            for (int i = 0; i < 3; i++) {
                size_t b = tr_matmul_scratch_size(x[i]->type, x[i]->n_in, rows);
                if (b > need) need = b;
            }
        }
    }
#undef CONSIDER
    return need;
}

/* Lays the scratch of a forward pass of n_batch rows out in one block; with base NULL it only
 * sizes it. Returns the bytes. One function for both, so the estimate cannot drift from what is
 * allocated. */
static size_t scratch_plan(const tr_model *m, int32_t n_batch, bool spec, char *base,
                           tr_scratch *sc) {
    const tr_hparams *hp = &m->hp;
    const size_t R = (size_t)n_batch, E = (size_t)hp->n_embd;
    const size_t nq = (size_t)hp->n_head_max * hp->head_dim_k;
    const size_t no = (size_t)hp->n_head_max * hp->head_dim_v;
    const size_t nk = (size_t)hp->n_head_kv_max * hp->head_dim_k;
    const size_t nv = (size_t)hp->n_head_kv_max * hp->head_dim_v;
    const size_t natt = nq > no ? nq : no;
    const size_t NE = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used;
    size_t total = 0;
#define TAKE(field, bytes)                                                                         \
    do {                                                                                           \
        total = (total + 63) & ~(size_t)63;                                                        \
        if (base) sc->field = (void *)(base + total);                                              \
        total += (bytes);                                                                          \
    } while (0)
    TAKE(x, R * E * 4);
    TAKE(xn, R * E * 4);
    TAKE(q, R * nq * 4);
    TAKE(k, R * nk * 4);
    TAKE(v, R * nv * 4);
    TAKE(att, R * (natt > nk ? natt : nk) * 4);
    TAKE(o, R * E * 4);
    TAKE(g, R * (size_t)hp->n_ff_max * 4);
    TAKE(u, R * (size_t)hp->n_ff_max * 4);
    TAKE(mm, mm_scratch_bytes(m, n_batch));
    TAKE(row_sess, R * sizeof(tr_session *));
    TAKE(row_pos, R * 4);
    TAKE(out_rows, R * 4);
    TAKE(grp_end, R * 4);
    TAKE(grp_rowwise, R * 4);
    TAKE(rope_cs, R * (size_t)hp->n_rot * 4);
    if (spec) {
        TAKE(qs[0], R * nq * 4);
        TAKE(qs[1], R * nq * 4);
    }
    if (NE > 0) {
        TAKE(moe_logits, R * NE * 4);
        TAKE(moe_sel, R * K * 4);
        TAKE(moe_w, R * K * 4);
        TAKE(moe_off, (NE + 1) * 4);
        TAKE(moe_fill, NE * 4);
        TAKE(moe_rows, R * K * 4);
        TAKE(moe_used, NE * 4);
        TAKE(moe_in, R * E * 4);
        TAKE(moe_slot, R * K * E * 4); /* weighted expert outputs, summed in slot order */
    }
#undef TAKE
    return total;
}

static void resolve_params(const tr_model *m, tr_session_params *p) {
    const tr_hparams *hp = &m->hp;
    if (p->n_ctx <= 0) p->n_ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (p->n_batch <= 0) p->n_batch = 512;
    if (p->n_batch > p->n_ctx) p->n_batch = p->n_ctx;
}

uint64_t tr_session_estimate_ctx(const tr_model *m, int32_t n_ctx, int32_t n_batch) {
    tr_session_params p = tr_session_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    resolve_params(m, &p);
    p.kv.policy = TR_KV_FULL; /* auto's most: every token hot */
    tr_scratch dummy;
    return full_bytes(m, &p) + scratch_plan(m, p.n_batch, false, NULL, &dummy);
}

uint64_t tr_session_estimate_default(const tr_model *m) { return tr_session_estimate_ctx(m, 0, 0); }

static tr_status make_plan(const tr_model *m, tr_session_params *p, bool make_dir, char *dir,
                           size_t dir_cap, char *note, size_t note_cap, tr_mem_plan *pl,
                           tr_error *err);

/* the plan create would make for these parameters (p: them resolved), nothing created */
static tr_status plan_only(const tr_model *m, const tr_session_params *params,
                           tr_session_params *p, tr_mem_plan *pl, tr_error *err) {
    *p = params ? *params : tr_session_default_params();
    resolve_params(m, p);
    if (p->n_ctx > (1 << 24))
        return tr_fail(err, TR_E_ARG, "context of %d tokens is out of range", p->n_ctx);
    char dir[4096], note[768];
    return make_plan(m, p, false, dir, sizeof dir, note, sizeof note, pl, err);
}

tr_status tr_session_estimate(const tr_model *m, const tr_session_params *params, uint64_t *bytes,
                              tr_error *err) {
    *bytes = 0;
    /* the plan create makes (auto resolved the same way): the KV layer's whole DRAM plan (a
     * pooled policy's hot pool and copies at their largest, not what it holds so far), 0 when
     * it would refuse the parameters */
    tr_session_params p;
    tr_mem_plan pl;
    const tr_status st = plan_only(m, params, &p, &pl, err);
    if (st) return st;
    if (!pl.kv_bytes)
        return tr_fail(err, TR_E_ARG, "the KV cache cannot be planned for these parameters "
                       "(--kv-policy %s, a context of %d tokens)", tr_kv_policy_name(pl.kv_policy),
                       p.n_ctx);
    tr_scratch dummy;
    const bool spec = p.kv.policy == TR_KV_TIERED && p.kv.spec;
    *bytes = pl.kv_bytes + pl.kv_agent_bytes + scratch_plan(m, p.n_batch, spec, NULL, &dummy);
    return TR_OK;
}

/* "1.5 MiB" */
static const char *mib(uint64_t b, char *s, size_t cap) {
    snprintf(s, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    return s;
}

/* --kv-policy auto's cold directory: $XDG_CACHE_HOME/terrace, else $HOME/.cache/terrace,
 * created (the cache makes its own directory in it and removes it when it ends) */
static tr_status auto_cold_dir(char *dir, size_t cap, bool make, tr_error *err) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg == '/')
        n = snprintf(dir, cap, "%s/terrace", xdg);
    else if (home && *home)
        n = snprintf(dir, cap, "%s/.cache/terrace", home);
    else
        return tr_fail(err, TR_E_ARG, "KV cache auto: the KV does not fit in memory and neither "
                       "$XDG_CACHE_HOME nor $HOME is set to put the cold pool under: give --kv-cold DIR");
    if (n < 0 || (size_t)n >= cap) return tr_fail(err, TR_E_ARG, "KV cache auto: cache directory path too long");
    if (!make) return TR_OK; /* a plan only */
    /* mkdir -p, 0700: the pool holds the conversation's keys and values */
    for (char *c = dir + 1; *c; c++) {
        if (*c != '/') continue;
        *c = '\0';
        const int r = mkdir(dir, 0700);
        *c = '/';
        if (r && errno != EEXIST)
            return tr_fail(err, TR_E_IO, "KV cache auto: cannot create %s: %s", dir, strerror(errno));
    }
    if (mkdir(dir, 0700) && errno != EEXIST)
        return tr_fail(err, TR_E_IO, "KV cache auto: cannot create the cold pool's directory %s: %s "
                       "(give --kv-cold DIR)", dir, strerror(errno));
    return TR_OK;
}

/* a least budget as the message prints it (a tenth of a MiB), rounded up so that the figure a
 * user copies is enough */
static uint64_t tenth_mib_up(uint64_t b) {
    const uint64_t tenths = (b * 10 + (1u << 20) - 1) >> 20;
    return (tenths * (1u << 20) + 9) / 10;
}

/* the process's pages in a least budget a message gives: they differ between runs, by a few
 * hundred KiB in a plain build and by over a MiB where the process is large (an ASan build's 36
 * MiB moved 35.7-37.1 MiB), so the figure a user copies allows 512 KiB and an eighth of the
 * process more, to hold on the next run too */
#define PROCESS_LEAST(m) ((m)->process_bytes + (m)->process_bytes / 8 + (512u << 10))

/* the least cap whose margin leaves `need` */
static uint64_t min_cap(uint64_t need) {
    uint64_t lo = need, hi = 2 * need + (32u << 20);
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        if (mid - tr_mem_margin(mid) >= need) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* the tiered working set auto gives a share (one layer's gathered K/V, 64 MiB at most): an eighth
 * of it, at least 64 tokens (a list longer than it is attended in parts) */
static uint64_t auto_ws(uint64_t share, uint64_t rec) {
    uint64_t w = share / 8;
    if (w > (64ull << 20)) w = 64ull << 20;
    if (w < 64 * rec) w = 64 * rec;
    return w;
}

/* the least --mem-budget whose share holds the smallest tiered plan; the working set grows with
 * the share, so the smallest plan is found at each candidate budget, not at the one refused */
static uint64_t auto_min_cap(const tr_kv_shape *shape, tr_kv_params t, uint64_t fixed,
                             uint64_t rec, bool ws_given, uint64_t need) {
    uint64_t lo = fixed, hi = 2 * (fixed + need) + (64ull << 20);
    while (lo < hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        const uint64_t used = fixed + tr_mem_margin(mid);
        const uint64_t share = mid > used ? mid - used : 0;
        if (!ws_given) t.ws_bytes = auto_ws(share, rec);
        const uint64_t d = kv_machine_bytes(shape, &t);
        if (d && d <= share) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* --kv-policy auto: full while its KV fits the share of the memory budget the weights, the
 * scratch and a margin leave (--kv-hot, when given, is that share); else tiered with the largest
 * hot pool whose whole plan (hot pool, working set, key copy, bookkeeping) fits the share */
static tr_status make_plan(const tr_model *m, tr_session_params *p, bool make_dir, char *dir,
                           size_t dir_cap, char *note, size_t note_cap, tr_mem_plan *pl,
                           tr_error *err) {
    tr_scratch dummy;
    const uint64_t scratch =
        scratch_plan(m, p->n_batch, p->kv.policy == TR_KV_TIERED && p->kv.spec, NULL, &dummy);
    const int32_t nl = m->hp.n_layer;
    int32_t *heads = malloc(sizeof(int32_t) * 2 * (size_t)nl);
    if (!heads) return tr_fail(err, TR_E_NOMEM, "out of memory");
    const tr_kv_shape shape = kv_shape(m, p->n_ctx, heads, heads + nl);
    tr_kv_params kp = kv_params(m, p);
    /* the weights that stay resident: the dense ones and the expert cache's arena, or all */
    tr_model_stats ms;
    tr_model_get_stats((tr_model *)m, &ms);
    const uint64_t weights = ms.moe && ms.expert_cache ? m->dense_bytes + ms.expert_budget_bytes
                                                       : m->weight_bytes;
    const uint64_t margin = tr_mem_margin(m->mem_cap);
    const uint64_t used = weights + scratch + m->process_bytes + margin;
    const uint64_t share = kp.hot_bytes ? kp.hot_bytes : m->mem_cap > used ? m->mem_cap - used : 0;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
    tr_kv_params full = kp;
    full.policy = TR_KV_FULL;
    full.hot_bytes = 0;
    const uint64_t need = tr_kv_dram_bytes(&shape, &full);
    tr_status st = TR_OK;
    *pl = (tr_mem_plan){.cap_bytes = m->mem_cap,
                        .cap_source = m->mem_source,
                        .weight_bytes = ms.moe && ms.expert_cache ? m->dense_bytes : m->weight_bytes,
                        .expert_cache_bytes = ms.moe && ms.expert_cache ? ms.expert_budget_bytes : 0,
                        .kv_full_bytes = need,
                        .scratch_bytes = scratch,
                        .margin_bytes = margin,
                        .process_bytes = m->process_bytes,
                        .n_ctx = p->n_ctx,
                        .n_batch = p->n_batch};
    if (pl->expert_cache_bytes < m->expert_total_bytes)
        pl->expert_spill_bytes = ms.moe && ms.expert_cache ? m->expert_total_bytes - pl->expert_cache_bytes : 0;
    if (p->kv.policy != TR_KV_AUTO) goto planned;
    const char *why = kp.hot_bytes ? "--kv-hot" : "its share of the memory budget";
    if (need && need <= share) {
        p->kv.policy = TR_KV_FULL;
        p->kv.hot_bytes = 0;
        snprintf(note, note_cap, "kv cache auto: full, the KV of %d tokens (%s) fits %s (%s)",
                 p->n_ctx, mib(need, b1, sizeof b1), why, mib(share, b2, sizeof b2));
        goto planned;
    }
    tr_kv_params t = kp;
    t.policy = TR_KV_TIERED;
    if (!t.cold_dir) t.cold_dir = "."; /* sizing only */
    const uint64_t rec = (uint64_t)shape.n_head_kv * (uint64_t)(shape.head_dim_k + shape.head_dim_v) * 2;
    const uint64_t per_slot = (uint64_t)nl * rec;
    const bool ws_given = t.ws_bytes != 0;
    if (!ws_given) t.ws_bytes = auto_ws(share, rec);
    /* the largest hot pool whose plan fits: the plan grows with the hot pool */
    uint64_t lo = (uint64_t)kp.n_sink + 16, hi = (uint64_t)p->n_ctx - 1, best = 0;
    while (lo <= hi) {
        const uint64_t mid = lo + (hi - lo) / 2;
        t.hot_bytes = mid * per_slot;
        const uint64_t d = kv_machine_bytes(&shape, &t);
        if (d && d <= share) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (!best) {
        t.hot_bytes = ((uint64_t)kp.n_sink + 16) * per_slot;
        const uint64_t min = kv_machine_bytes(&shape, &t);
        char b8[32], b9[32];
        if (kp.hot_bytes)
            st = tr_fail(err, TR_E_BUDGET,
                         "KV cache auto: the KV of %d tokens needs %s in DRAM, or at least %s with a "
                         "cold pool; --kv-hot gives it %s: raise --kv-hot or lower -c (without "
                         "--kv-hot the share is what --mem-budget leaves)",
                         p->n_ctx, mib(need, b1, sizeof b1), mib(min, b2, sizeof b2),
                         mib(share, b3, sizeof b3));
        else
            st = tr_fail(err, TR_E_BUDGET,
                         "KV cache auto: the KV of %d tokens needs %s in DRAM, or at least %s with a "
                         "cold pool; %s leaves %s (memory budget %s from %s - weights %s - scratch %s "
                         "- the process %s - margin %s): the least --mem-budget for this context is "
                         "%s; raise --mem-budget or lower -c",
                         p->n_ctx, mib(need, b1, sizeof b1), mib(min, b2, sizeof b2), why,
                         mib(share, b3, sizeof b3), mib(m->mem_cap, b4, sizeof b4), m->mem_source,
                         mib(weights, b5, sizeof b5), mib(scratch, b6, sizeof b6),
                         mib(m->process_bytes, b9, sizeof b9), mib(margin, b7, sizeof b7),
                         mib(tenth_mib_up(auto_min_cap(&shape, t, weights + scratch + PROCESS_LEAST(m),
                                                       rec, ws_given, need)),
                             b8, sizeof b8));
        goto out;
    }
    p->kv.policy = TR_KV_TIERED;
    p->kv.hot_bytes = best * per_slot;
    p->kv.ws_bytes = t.ws_bytes;
    if (!p->kv.cold_dir) {
        if ((st = auto_cold_dir(dir, dir_cap, make_dir, err))) goto out;
        p->kv.cold_dir = dir;
    }
    snprintf(note, note_cap,
             "kv cache auto: the KV of %d tokens (%s) does not fit %s (%s): tiered, hot pool %s "
             "(%" PRIu64 " of %d tokens per layer), the rest in a cold pool under %s%s",
             p->n_ctx, mib(need, b1, sizeof b1), why, mib(share, b2, sizeof b2),
             mib(p->kv.hot_bytes, b3, sizeof b3), best, p->n_ctx, p->kv.cold_dir,
             p->kv.keep ? " (kept)" : " (removed at exit)");
planned: {
    /* what the resolved policy takes */
    tr_kv_params r = kv_params(m, p);
    if (r.policy != TR_KV_FULL && !r.cold_dir) r.cold_dir = ".";
    pl->kv_policy = r.policy;
    pl->kv_bytes = tr_kv_dram_bytes(&shape, &r);
    pl->kv_agent_bytes = pl->kv_bytes ? tr_kv_agent_dram_bytes(&shape, &r) : 0;
    pl->kv_hot_bytes = r.policy == TR_KV_FULL ? need : r.hot_bytes ? r.hot_bytes : need;
    pl->kv_cold_bytes = tr_kv_cold_bytes_needed(&shape, &r);
    pl->total_bytes = pl->weight_bytes + pl->expert_cache_bytes + pl->kv_bytes +
                      pl->kv_agent_bytes + pl->scratch_bytes + pl->process_bytes + pl->margin_bytes;
    /* a budget the user gave is a promise: a plan over it is refused (an estimated cap, from the
     * cgroup or MemAvailable, only shows the plan as over it) */
    if (pl->total_bytes > m->mem_cap && !strcmp(m->mem_source, "--mem-budget")) {
        char c1[32], c2[32], agent[80] = "";
        if (pl->kv_agent_bytes)
            snprintf(agent, sizeof agent, "; the storage agent's own %s included",
                     mib(pl->kv_agent_bytes, b6, sizeof b6));
        st = tr_fail(err, TR_E_BUDGET,
                     "--mem-budget %s cannot hold the plan: weights %s + KV %s (%s, %d tokens%s) + "
                     "scratch %s + the process %s + margin = %s; the least --mem-budget for it is %s (or lower -c, "
                     "or let the KV spill: --kv-policy auto, or a smaller --kv-hot)",
                     mib(m->mem_cap, b1, sizeof b1), mib(pl->weight_bytes + pl->expert_cache_bytes, b2, sizeof b2),
                     mib(pl->kv_bytes + pl->kv_agent_bytes, b3, sizeof b3),
                     tr_kv_policy_name(pl->kv_policy), p->n_ctx, agent,
                     mib(pl->scratch_bytes, b4, sizeof b4), mib(pl->process_bytes, b5, sizeof b5),
                     mib(pl->total_bytes, c1, sizeof c1),
                     mib(tenth_mib_up(min_cap(pl->total_bytes - pl->margin_bytes - pl->process_bytes +
                                              PROCESS_LEAST(m))),
                         c2, sizeof c2));
    }
}
out:
    free(heads);
    return st;
}

tr_status tr_session_create(tr_model *m, const tr_session_params *params, tr_session **out,
                            tr_error *err) {
    *out = NULL;
    tr_session_params p = params ? *params : tr_session_default_params();
    resolve_params(m, &p);
    if (p.n_ctx > (1 << 24))
        return tr_fail(err, TR_E_ARG, "context of %d tokens is out of range", p.n_ctx);
    tr_session *s = calloc(1, sizeof *s);
    if (!s) return tr_fail(err, TR_E_NOMEM, "out of memory");
    s->m = m;
    s->n_ctx = p.n_ctx;
    s->n_batch = p.n_batch;
    char auto_dir[4096];
    tr_status ast = make_plan(m, &p, true, auto_dir, sizeof auto_dir, s->kv_note,
                              sizeof s->kv_note, &s->plan, err);
    if (ast) {
        free(s);
        return ast;
    }
    s->kv_policy = p.kv.policy;
    tr_status kst = create_kv(m, &p, &s->kv, err);
    if (kst) {
        tr_session_free(s);
        return kst;
    }
    tr_scratch *sc = &s->sc;
    const bool spec = p.kv.policy == TR_KV_TIERED && p.kv.spec;
    const size_t scratch = scratch_plan(m, p.n_batch, spec, NULL, sc);
    s->scratch_mem = aligned_alloc(64, (scratch + 63) & ~(size_t)63);
    if (!s->scratch_mem) {
        tr_session_free(s);
        return tr_fail(err, TR_E_NOMEM,
                       "cannot allocate the session's scratch: %zu MiB for batches of %d; lower -b",
                       scratch >> 20, p.n_batch);
    }
    s->bytes = scratch + full_bytes(m, &p);
    scratch_plan(m, p.n_batch, spec, s->scratch_mem, sc);
    sc->rows = p.n_batch;
    sc->n_ctx_cap = p.n_ctx;
    sc->qs_layer = -1;
    *out = s;
    return TR_OK;
}

void tr_session_free(tr_session *s) {
    if (!s) return;
    tr_kv_free(s->kv);
    free(s->scratch_mem);
    free(s);
}

uint64_t tr_session_bytes(const tr_session *s) {
    tr_kv_stats st;
    tr_kv_get_stats(s->kv, &st);
    return st.policy == TR_KV_FULL ? s->bytes : s->bytes + st.hot_bytes;
}
int32_t tr_session_n_ctx(const tr_session *s) { return s->n_ctx; }
int32_t tr_session_n_past(const tr_session *s) { return s->n_past; }
int32_t tr_session_n_batch(const tr_session *s) { return s->n_batch; }
tr_kv_policy tr_session_kv_policy(const tr_session *s) { return s->kv_policy; }
void tr_session_get_plan(const tr_session *s, tr_mem_plan *out) { *out = s->plan; }

tr_status tr_session_plan(tr_model *m, const tr_session_params *params, tr_mem_plan *out,
                          tr_error *err) {
    tr_session_params p;
    return plan_only(m, params, &p, out, err);
}
const char *tr_session_kv_note(const tr_session *s) { return s->kv_note; }

void tr_session_set_abort(tr_session *s, tr_abort_fn fn, void *user) {
    s->abort_fn = fn;
    s->abort_user = user;
}

tr_status tr_session_truncate(tr_session *s, int32_t n, tr_error *err) {
    if (n < 0 || n > s->n_past)
        return tr_fail(err, TR_E_ARG, "cannot truncate to %d tokens (session holds %d)", n,
                       s->n_past);
    tr_status st = tr_kv_truncate(s->kv, n, err);
    if (st) return st;
    s->n_past = n;
    return TR_OK;
}

tr_status tr_session_eval(tr_session *s, const int32_t *tokens, int32_t n, float *logits,
                          bool all_logits, tr_error *err) {
    if (n <= 0) return tr_fail(err, TR_E_ARG, "no tokens to evaluate");
    if ((int64_t)s->n_past + n > s->n_ctx)
        return tr_fail(err, TR_E_ARG,
                       "%d tokens do not fit in the context: %d of %d positions are used (raise -c)",
                       n, s->n_past, s->n_ctx);
    tr_model *m = s->m;
    const int32_t n_vocab = m->hp.n_vocab;
    pthread_mutex_lock(&m->lock);
    tr_status st = TR_OK;
    const int32_t start = s->n_past;
    bool aborted = false;
    for (int32_t done = 0; done < n && st == TR_OK;) {
        if (s->abort_fn && s->abort_fn(s->abort_user)) {
            st = tr_fail(err, TR_E_ABORTED, "aborted by the caller after %d of %d tokens", done, n);
            aborted = true;
            break;
        }
        const int32_t rows = n - done < s->n_batch ? n - done : s->n_batch;
        for (int32_t r = 0; r < rows; r++) {
            s->sc.row_sess[r] = s;
            s->sc.row_pos[r] = s->n_past + r;
        }
        const bool last_chunk = done + rows == n;
        int32_t lrows = 0;
        float *dst = NULL;
        if (logits && all_logits) {
            lrows = rows;
            dst = logits + (size_t)done * n_vocab;
        } else if (logits && last_chunk) {
            lrows = 1;
            dst = logits;
        }
        s->sc.n_grp = 0; /* one session's chunk */
        st = tr_forward(m, &s->sc, rows, tokens + done, dst, lrows, NULL, err);
        if (st == TR_OK) {
            s->n_past += rows;
            done += rows;
        }
    }
    /* all or nothing on errors; an abort keeps the chunks it let finish (the header says so) */
    if (st != TR_OK && !aborted) s->n_past = start;
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* tr_batch_eval with n_tokens NULL meaning one token per session (tr_decode_batch) */
static tr_status batch_eval(tr_session **sessions, const int32_t *n_tokens, int32_t n_seq,
                            const int32_t *tokens, const bool *want_logits, float *logits,
                            tr_error *err) {
    if (n_seq <= 0 || !sessions || !tokens) return tr_fail(err, TR_E_ARG, "empty batch");
    tr_session *s0 = sessions[0];
    tr_model *m = s0->m;
    int64_t rows = 0;
    for (int32_t b = 0; b < n_seq; b++) {
        const tr_session *sb = sessions[b];
        const int32_t n = n_tokens ? n_tokens[b] : 1;
        if (sb->m != m) return tr_fail(err, TR_E_ARG, "sequence %d belongs to another model", b);
        if (n < 1) return tr_fail(err, TR_E_ARG, "sequence %d: %d tokens (at least 1)", b, n);
        if ((int64_t)sb->n_past + n > sb->n_ctx)
            return tr_fail(err, TR_E_ARG, "sequence %d: %d tokens do not fit in the context: %d of "
                           "%d positions are used", b, n, sb->n_past, sb->n_ctx);
        if ((int64_t)sb->n_past + n > s0->sc.n_ctx_cap)
            return tr_fail(err, TR_E_ARG, "sequence %d is longer (%d tokens) than the first "
                           "session's context (%d): put the session with the largest context first",
                           b, sb->n_past + n, s0->sc.n_ctx_cap);
        /* each session's KV cache takes at most its own batch of rows before they attend */
        if (n > sb->n_batch)
            return tr_fail(err, TR_E_ARG, "sequence %d: %d tokens exceed its batch size %d", b, n,
                           sb->n_batch);
        for (int32_t c = 0; c < b; c++)
            if (sessions[c] == sb)
                return tr_fail(err, TR_E_ARG, "sequence %d appears twice in the batch", b);
        rows += n;
    }
    if (rows > s0->n_batch)
        return tr_fail(err, TR_E_ARG, "a batch of %lld tokens exceeds the first session's batch "
                       "size %d", (long long)rows, s0->n_batch);
    for (int32_t b = 0; b < n_seq; b++)
        if (sessions[b]->abort_fn && sessions[b]->abort_fn(sessions[b]->abort_user))
            return tr_fail(err, TR_E_ABORTED, "sequence %d: aborted by the caller", b);
    pthread_mutex_lock(&m->lock);
    tr_scratch *sc = &s0->sc;
    /* the groups (session.h): runs of sessions with fewer tokens than the gemm takes share one
     * per-row group, each longer chunk is a group of its own */
    sc->n_grp = 0;
    int32_t r = 0, n_out = 0;
    for (int32_t b = 0; b < n_seq; b++) {
        const int32_t n = n_tokens ? n_tokens[b] : 1;
        const int32_t rowwise = tr_matmul_per_row(m->kern, n);
        if (sc->n_grp > 0 && rowwise && sc->grp_rowwise[sc->n_grp - 1]) {
            sc->grp_end[sc->n_grp - 1] += n;
        } else {
            sc->grp_end[sc->n_grp] = r + n;
            sc->grp_rowwise[sc->n_grp++] = rowwise;
        }
        for (int32_t i = 0; i < n; i++, r++) {
            sc->row_sess[r] = sessions[b];
            sc->row_pos[r] = sessions[b]->n_past + i;
        }
        if (logits && (!want_logits || want_logits[b])) sc->out_rows[n_out++] = r - 1;
    }
    tr_status st = tr_forward(m, sc, r, tokens, logits, n_out, sc->out_rows, err);
    if (st == TR_OK)
        for (int32_t b = 0; b < n_seq; b++) sessions[b]->n_past += n_tokens ? n_tokens[b] : 1;
    pthread_mutex_unlock(&m->lock);
    return st;
}

tr_status tr_batch_eval(tr_session **sessions, const int32_t *n_tokens, int32_t n_seq,
                        const int32_t *tokens, const bool *want_logits, float *logits,
                        tr_error *err) {
    if (!n_tokens) return tr_fail(err, TR_E_ARG, "no token counts");
    return batch_eval(sessions, n_tokens, n_seq, tokens, want_logits, logits, err);
}

tr_status tr_decode_batch(tr_session **sessions, const int32_t *tokens, int32_t B, float *logits,
                          tr_error *err) {
    return batch_eval(sessions, NULL, B, tokens, NULL, logits, err);
}
