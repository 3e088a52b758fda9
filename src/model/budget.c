/*
 * `--expert-cache auto`: the expert cache's budget from the memory really left (model.h,
 * tr_expert_plan). A function of its own, apart from loading, so that a whole-process memory plan
 * can call it with the same inputs.
 *
 * What the cap has to hold besides the arena, in the order it is taken:
 *   - what is in use once the dense weights are in: in a memory cgroup its usage (the process,
 *     page cache and anything else charged there), else the process's RSS under --mem-budget;
 *     without either, MemAvailable is already net of it
 *   - the dense weights' page cache: reading them left their file pages cached, charged to the
 *     cgroup and reclaimable only under pressure. Loading drops them (posix_fadvise DONTNEED)
 *     right after the read, so what is left of them is in the usage measured after it
 *   - the session the caller said it will create (KV + scratch), or a default one
 *   - the cache's bookkeeping outside the arena (per-expert tables, the policies' shadows)
 *   - a margin of 5% of the cap (at most 10%, at least 16 MiB) for what no estimate sees: thread
 *     stacks, allocator slack, the kernel's own pages charged to the group
 * The arena is then at most every expert and at least the smallest legal budget.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"

#define MIB (1024.0 * 1024.0)

static uint64_t sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

uint64_t tr_mem_margin(uint64_t cap) {
    uint64_t margin = cap / 20;
    if (margin < (16u << 20)) margin = 16u << 20;
    if (margin > cap / 10) margin = cap / 10;
    return margin;
}

void tr_expert_plan(const tr_expert_plan_in *in, tr_expert_budget_plan *out) {
    memset(out, 0, sizeof *out);
    uint64_t cap, in_use, headroom;
    if (in->mem_budget) {
        cap = in->mem_budget;
        in_use = in->rss_now;
        headroom = sub(cap, in_use);
        out->source = "--mem-budget";
    } else if (in->cg_limit && (!in->mem_available || sub(in->cg_limit, in->cg_usage) <= in->mem_available)) {
        cap = in->cg_limit;
        in_use = in->cg_usage;
        headroom = sub(cap, in_use);
        out->source = "memory cgroup limit";
    } else {
        in_use = in->rss_now;
        cap = in->mem_available + in_use;
        headroom = in->mem_available;
        out->source = "MemAvailable";
    }
    const uint64_t margin = tr_mem_margin(cap);
    out->cap_bytes = cap;
    out->in_use_bytes = in_use;
    out->session_bytes = in->session_bytes;
    out->bookkeeping_bytes = in->bookkeeping;
    out->margin_bytes = margin;
    out->dense_bytes = in->dense_bytes;
    out->dense_cache_dropped = in->dense_cache_dropped;
    uint64_t b = sub(sub(sub(headroom, in->session_bytes), in->bookkeeping), margin);
    if (b > in->all_experts) {
        b = in->all_experts;
        out->holds_all = true;
    }
    if (b < in->min_budget) {
        b = in->min_budget;
        out->raised_to_min = true;
    }
    out->budget_bytes = b;
    int n = snprintf(out->how, sizeof out->how,
                     "%.0f MiB = %s %.0f MiB - in use %.0f MiB (dense weights %.0f MiB read, their "
                     "page cache %s) - session %.0f MiB - cache bookkeeping %.0f MiB - margin "
                     "%.0f MiB (%.0f%% of the cap)",
                     b / MIB, out->source, cap / MIB, in_use / MIB, in->dense_bytes / MIB,
                     in->dense_cache_dropped ? "dropped" : "kept", in->session_bytes / MIB,
                     in->bookkeeping / MIB, margin / MIB, cap ? 100.0 * margin / cap : 0.0);
    if (n > 0 && (size_t)n < sizeof out->how && (out->holds_all || out->raised_to_min))
        snprintf(out->how + n, sizeof out->how - (size_t)n, "; %s",
                 out->holds_all ? "capped at every expert (the model's experts fit)"
                                : "raised to the smallest legal budget (the cap is too small)");
}
