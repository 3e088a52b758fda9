/*
 * Expert cache: a synthetic "expert file" written at test time (every byte of each (layer, expert,
 * part) range is a hash of those four numbers and the byte index; the gaps are a hash of the
 * offset), a layout pointing into it at unaligned offsets with layers of different expert sizes,
 * then: random request sequences against budgets from the minimum to "everything fits", in
 * O_DIRECT and buffered mode (and on tmpfs, where O_DIRECT falls back), checking every handed-out
 * byte against the file, pins (bytes checked again just before release), the budget, hit/miss and
 * prefetch accounting; faults (EIO / short read on the N-th read, a file truncated under the
 * cache) and budget errors; four threads sharing one cache (also built with -fsanitize=thread).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "experts/cache.h"
#include "testutil.h"

#define N_LAYER  6
#define N_EXPERT 16
#define TOPK     4

typedef struct {
    char path[256];
    int fd;
    uint8_t *bytes; /* the file's content, kept to compare against */
    uint64_t size;
    tr_expert_layer layers[N_LAYER];
    tr_expert_layout layout;
} efile;

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* byte i of (layer, expert, part): one hash per 8 bytes */
static void fill_range(uint8_t *d, int l, int e, int p, uint64_t n) {
    const uint64_t id = (uint64_t)l << 56 | (uint64_t)e << 40 | (uint64_t)p << 32;
    for (uint64_t i = 0; i < n; i += 8) {
        const uint64_t h = mix64(id ^ (i / 8 * 0x9e3779b97f4a7c15ull));
        for (uint64_t b = i; b < i + 8 && b < n; b++) d[b] = (uint8_t)(h >> (b % 8 * 8));
    }
}

/* per-layer part sizes (bytes of one expert); 0 ends. Layer 1 is dense (no parts). Layers 0 and 3
 * share a size (Q6_K-like down), 2 and 5 another; 4 has a part over the 512 KiB read chunk and
 * three small "bias" parts, like gpt-oss. */
static const uint64_t part_bytes[N_LAYER][TR_EXPERT_MAX_PARTS] = {
    {50000, 50000, 70000},
    {0},
    {50000, 50000, 50000},
    {50000, 50000, 70000},
    {600000, 100000, 100000, 1234, 1234, 2000},
    {50000, 50000, 50000},
};

static int write_all(int fd, const uint8_t *b, uint64_t n) {
    uint64_t done = 0;
    while (done < n) {
        const ssize_t r = pwrite(fd, b + done, (size_t)(n - done), (off_t)done);
        if (r <= 0) return -1;
        done += (uint64_t)r;
    }
    return 0;
}

/* dir: where to create the file. Returns 0 on success. */
static int efile_create(efile *f, const char *dir) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s/terrace-experts-XXXXXX", dir);
    f->fd = mkstemp(f->path);
    if (f->fd < 0) return -1;
    /* layout: parts in file order with odd gaps, so nothing is 4096-aligned */
    uint64_t off = 4096 + 37, total = 0;
    for (int l = 0; l < N_LAYER; l++) {
        tr_expert_layer *ly = &f->layers[l];
        for (int p = 0; p < TR_EXPERT_MAX_PARTS && part_bytes[l][p]; p++) {
            tr_expert_part *pt = &ly->part[p];
            pt->fd = f->fd;
            pt->path = f->path;
            pt->offset = off;
            pt->bytes = part_bytes[l][p];
            pt->stride = pt->bytes + (l == 3 ? 96 : 0); /* one layer with padding between experts */
            off += N_EXPERT * pt->stride + 32 * (uint64_t)(l + p) + 13;
            ly->n_parts = p + 1;
        }
    }
    total = off + 1000;
    f->size = total;
    f->bytes = malloc(total);
    if (!f->bytes) return -1;
    for (uint64_t i = 0; i < total; i++) f->bytes[i] = (uint8_t)(i * 131 + (i >> 9)); /* gaps */
    for (int l = 0; l < N_LAYER; l++)
        for (int p = 0; p < f->layers[l].n_parts; p++)
            for (int e = 0; e < N_EXPERT; e++) {
                const tr_expert_part *pt = &f->layers[l].part[p];
                uint8_t *d = f->bytes + pt->offset + (uint64_t)e * pt->stride;
                fill_range(d, l, e, p, pt->bytes);
            }
    if (write_all(f->fd, f->bytes, total)) return -1;
    f->layout = (tr_expert_layout){N_LAYER, N_EXPERT, TOPK, f->layers};
    return 0;
}

static void efile_restore(efile *f) {
    TU_CHECK(write_all(f->fd, f->bytes, f->size) == 0, "restore %s", f->path);
}

static void efile_destroy(efile *f) {
    if (f->fd >= 0) close(f->fd);
    unlink(f->path);
    free(f->bytes);
}

static const int moe_layers[] = {0, 2, 3, 4, 5};
#define N_MOE 5

/* every part of req's index i equals the file's bytes for that range */
static int check_expert(const efile *f, const tr_expert_request *req, int32_t i) {
    const tr_expert_layer *ly = &f->layers[req->layer];
    for (int p = 0; p < ly->n_parts; p++) {
        const tr_expert_part *pt = &ly->part[p];
        const uint8_t *want = f->bytes + pt->offset + (uint64_t)req->experts[i] * pt->stride;
        if (!req->data[i][p] || memcmp(req->data[i][p], want, pt->bytes)) return 0;
    }
    return 1;
}

/* experts skewed towards low numbers, so some budgets get hits */
static int32_t pick_expert(tu_rng *r) {
    const uint64_t x = tu_next(r) % 100;
    return x < 60 ? (int32_t)(tu_next(r) % 6) : (int32_t)(tu_next(r) % N_EXPERT);
}

static void pick_request(tu_rng *r, int32_t *layer, int32_t *ex, int32_t n) {
    *layer = moe_layers[tu_next(r) % N_MOE];
    for (int32_t i = 0; i < n; i++) {
        int dup;
        do {
            ex[i] = pick_expert(r);
            dup = 0;
            for (int32_t j = 0; j < i; j++) dup |= ex[j] == ex[i];
        } while (dup);
    }
}

/* One full request: acquire, take every expert as it becomes ready, check it, check all again
 * before release. Returns the number of experts whose bytes were wrong, -1 on an API error. */
static int run_request(tr_expert_cache *c, const efile *f, int32_t layer, const int32_t *ex,
                       int32_t n, tr_expert_request *req) {
    tr_error err;
    if (tr_expert_cache_acquire(c, layer, ex, n, req, &err)) {
        fprintf(stderr, "acquire: %s\n", err.msg);
        return -1;
    }
    int bad = 0, got = 0;
    for (;;) {
        int32_t idx;
        if (tr_expert_cache_next_ready(c, req, &idx, &err)) {
            fprintf(stderr, "next_ready: %s\n", err.msg);
            tr_expert_cache_release(c, req);
            return -1;
        }
        if (idx < 0) break;
        got++;
        bad += !check_expert(f, req, idx);
    }
    if (got != n) bad++;
    for (int32_t i = 0; i < n; i++) bad += !check_expert(f, req, i); /* still ours: unchanged */
    tr_expert_cache_release(c, req);
    return bad;
}

static tr_expert_cache *make_cache_policy(const efile *f, uint64_t budget, bool no_direct,
                                          int threads, const char *policy) {
    tr_expert_cache_params p = {.budget_bytes = budget,
                                .policy = policy,
                                .io_threads = threads,
                                .no_direct_io = no_direct,
                                .seed = 1};
    tr_expert_cache *c = NULL;
    tr_error err;
    char warn[512];
    if (tr_expert_cache_create(&f->layout, &p, &c, warn, sizeof warn, &err)) {
        fprintf(stderr, "create: %s\n", err.msg);
        return NULL;
    }
    return c;
}

static tr_expert_cache *make_cache(const efile *f, uint64_t budget, bool no_direct, int threads) {
    return make_cache_policy(f, budget, no_direct, threads, "auto");
}

static uint64_t all_bytes(const efile *f) {
    /* the budget at which every expert fits: a generous upper bound (slot slack included) */
    uint64_t s = 0;
    for (int l = 0; l < N_LAYER; l++)
        for (int p = 0; p < f->layers[l].n_parts; p++)
            s += N_EXPERT * (f->layers[l].part[p].bytes + 8192);
    return s;
}

/* ---- tests ------------------------------------------------------------------------------------
 */

static void test_budget_errors(const efile *f) {
    const uint64_t min = tr_expert_cache_min_budget(&f->layout);
    const uint64_t ws = tr_expert_cache_token_working_set(&f->layout);
    TU_CHECK(min > 0 && ws > min, "min %llu ws %llu", (unsigned long long)min,
             (unsigned long long)ws);
    /* layer 4 is the widest: 4 x its parts, each rounded to pages with room for any phase */
    TU_CHECK(min >= TOPK * (600000ull + 100000 + 100000 + 1234 + 1234 + 2000), "min %llu",
             (unsigned long long)min);
    tr_expert_cache_params p = {.budget_bytes = min - 1};
    tr_expert_cache *c = NULL;
    tr_error err = {0};
    char warn[512] = "x";
    TU_CHECK(tr_expert_cache_create(&f->layout, &p, &c, warn, sizeof warn, &err) == TR_E_BUDGET,
             "below the minimum");
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)min);
    TU_CHECK(strstr(err.msg, num) != NULL, "message names the minimum %s: %s", num, err.msg);
    TU_CHECK(c == NULL, "no cache");

    p.budget_bytes = min;
    TU_CHECK(tr_expert_cache_create(&f->layout, &p, &c, warn, sizeof warn, &err) == TR_OK, "%s",
             err.msg);
    TU_CHECK(strstr(warn, "working set") != NULL, "warning below the working set: '%s'", warn);
    tr_expert_stats st;
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.arena_bytes <= min && st.arena_bytes > 0, "arena %llu",
             (unsigned long long)st.arena_bytes);
    TU_CHECK(tr_expert_cache_max_request(c, 4) == TOPK, "max request at the minimum: %d",
             tr_expert_cache_max_request(c, 4));
    TU_CHECK(tr_expert_cache_max_request(c, 1) == 0, "dense layer");
    /* bad requests */
    tr_expert_request req;
    int32_t dup[2] = {3, 3}, oor[1] = {N_EXPERT}, many[TOPK + 1] = {0, 1, 2, 3, 4};
    TU_CHECK(tr_expert_cache_acquire(c, 0, dup, 2, &req, &err) == TR_E_ARG && req.n == 0,
             "duplicate");
    TU_CHECK(tr_expert_cache_acquire(c, 0, oor, 1, &req, &err) == TR_E_ARG, "out of range");
    TU_CHECK(tr_expert_cache_acquire(c, 1, dup, 1, &req, &err) == TR_E_ARG, "dense layer");
    TU_CHECK(tr_expert_cache_acquire(c, N_LAYER, dup, 1, &req, &err) == TR_E_ARG, "layer range");
    TU_CHECK(tr_expert_cache_acquire(c, 4, many, TOPK + 1, &req, &err) == TR_E_BUDGET,
             "more than the budget holds");
    tr_expert_cache_release(c, &req); /* no-op after a failed acquire */
    tr_expert_cache_free(c);

    p.budget_bytes = ws;
    TU_CHECK(tr_expert_cache_create(&f->layout, &p, &c, warn, sizeof warn, &err) == TR_OK, "%s",
             err.msg);
    TU_CHECK(warn[0] == '\0', "no warning at the working set: '%s'", warn);
    tr_expert_cache_free(c);

    /* hostile layouts */
    tr_expert_layer bad[N_LAYER];
    memcpy(bad, f->layers, sizeof bad);
    tr_expert_layout bl = f->layout;
    bl.layers = bad;
    bad[0].part[1].bytes = 0;
    TU_CHECK(tr_expert_cache_create(&bl, &p, &c, warn, sizeof warn, &err) == TR_E_ARG, "0 bytes");
    memcpy(bad, f->layers, sizeof bad);
    bad[2].part[0].stride = UINT64_MAX / 4;
    TU_CHECK(tr_expert_cache_create(&bl, &p, &c, warn, sizeof warn, &err) == TR_E_ARG,
             "overflowing stride");
    memcpy(bad, f->layers, sizeof bad);
    bl.n_expert_used = N_EXPERT + 1;
    TU_CHECK(tr_expert_cache_create(&bl, &p, &c, warn, sizeof warn, &err) == TR_E_ARG, "top-k");
    TU_CHECK(tr_expert_cache_min_budget(&bl) == 0, "min of a bad layout");
}

/* random sequences over budgets from the minimum to everything; mode: no_direct */
static void test_random(const efile *f, bool no_direct, bool expect_direct, const char *what,
                        bool quick) {
    const uint64_t min = tr_expert_cache_min_budget(&f->layout);
    const uint64_t ws = tr_expert_cache_token_working_set(&f->layout);
    const uint64_t budgets[] = {min, min + min / 3, ws - ws / 10, ws, 2 * ws, all_bytes(f)};
    const size_t nb = sizeof budgets / sizeof *budgets;
    for (size_t b = 0; b < nb; b++) {
        if (quick && b != 0 && b != 3 && b != nb - 1) continue; /* min, working set, all */
        tr_expert_cache *c = make_cache(f, budgets[b], no_direct, 4);
        TU_CHECK(c != NULL, "create %s budget %llu", what, (unsigned long long)budgets[b]);
        if (!c) continue;
        tu_rng r = {1234 + b};
        int bad = 0, errors = 0;
        uint64_t lookups = 0, max_resident = 0, distinct = 0;
        uint8_t seen[N_LAYER][N_EXPERT] = {{0}};
        tr_expert_stats st;
        for (int it = 0; it < 100; it++) {
            int32_t layer, ex[TOPK];
            const int32_t n = 1 + (int32_t)(tu_next(&r) % TOPK);
            pick_request(&r, &layer, ex, n);
            for (int32_t i = 0; i < n; i++) distinct += !seen[layer][ex[i]]++;
            tr_expert_request req;
            const int rc = run_request(c, f, layer, ex, n, &req);
            if (rc < 0)
                errors++;
            else
                bad += rc;
            lookups += (uint64_t)n;
            tr_expert_cache_stats(c, &st);
            if (st.resident_bytes > max_resident) max_resident = st.resident_bytes;
        }
        tr_expert_cache_stats(c, &st);
        TU_CHECK(bad == 0 && errors == 0, "%s budget %llu: %d wrong experts, %d errors", what,
                 (unsigned long long)budgets[b], bad, errors);
        TU_CHECK(st.hits + st.misses == lookups, "hits %llu + misses %llu != %llu",
                 (unsigned long long)st.hits, (unsigned long long)st.misses,
                 (unsigned long long)lookups);
        TU_CHECK(st.misses >= distinct, "misses %llu < distinct %llu",
                 (unsigned long long)st.misses, (unsigned long long)distinct);
        TU_CHECK(st.arena_bytes <= budgets[b] && max_resident <= st.arena_bytes,
                 "arena %llu resident %llu budget %llu", (unsigned long long)st.arena_bytes,
                 (unsigned long long)max_resident, (unsigned long long)budgets[b]);
        TU_CHECK(st.direct_io == expect_direct, "%s: direct_io %d", what, st.direct_io);
        TU_CHECK(st.reads >= st.misses && st.bytes_read > 0, "reads %llu",
                 (unsigned long long)st.reads);
        if (b == nb - 1) {
            /* everything fits: every expert is read once, and never evicted */
            TU_CHECK(st.misses == distinct && st.evictions == 0,
                     "misses %llu distinct %llu ev %llu", (unsigned long long)st.misses,
                     (unsigned long long)distinct, (unsigned long long)st.evictions);
            TU_CHECK(st.arena_bytes < budgets[b], "arena %llu only what everything needs",
                     (unsigned long long)st.arena_bytes);
        }
        if (b == 0) TU_CHECK(st.evictions > 0, "evictions at the minimum");
        printf("  %-9s budget %6.2f MiB: arena %6.2f MiB, %2u slots in %u classes, %s, hits %4llu, "
               "misses %4llu, evictions %4llu, reads %5llu, read %6.1f MiB\n",
               what, (double)budgets[b] / 1048576, (double)st.arena_bytes / 1048576, st.n_slots,
               st.n_classes, st.policy, (unsigned long long)st.hits, (unsigned long long)st.misses,
               (unsigned long long)st.evictions, (unsigned long long)st.reads,
               (double)st.bytes_read / 1048576);
        tr_expert_cache_free(c);
    }
}

/* every policy the live cache can run: right bytes, the policy named in the stats */
static void test_policies(const efile *f) {
    const char *names[] = {"lru", "lfu", "random", "lrfu", "layered"};
    const uint64_t min = tr_expert_cache_min_budget(&f->layout);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        tr_expert_cache *c = make_cache_policy(f, min + min / 2, true, 2, names[i]);
        if (!c) {
            TU_CHECK(0, "create %s", names[i]);
            continue;
        }
        tu_rng r = {77};
        int bad = 0;
        for (int it = 0; it < 60; it++) {
            int32_t layer, ex[TOPK];
            const int32_t n = 1 + (int32_t)(tu_next(&r) % TOPK);
            pick_request(&r, &layer, ex, n);
            float w[TOPK] = {0.5f, 0.25f, 0.15f, 0.1f};
            tr_expert_cache_observe(c, layer, ex, w, n, NULL);
            tr_expert_request req;
            bad += run_request(c, f, layer, ex, n, &req) != 0;
        }
        tr_expert_stats st;
        tr_expert_cache_stats(c, &st);
        TU_CHECK(bad == 0 && !strcmp(st.policy, names[i]), "%s: %d bad, policy %s", names[i], bad,
                 st.policy);
        tr_expert_cache_free(c);
    }
    tr_expert_cache_params p = {.budget_bytes = 2 * min, .policy = "belady"};
    tr_expert_cache *c = NULL;
    tr_error err;
    TU_CHECK(tr_expert_cache_create(&f->layout, &p, &c, NULL, 0, &err) == TR_E_ARG, "belady");
    p.policy = "mru";
    TU_CHECK(tr_expert_cache_create(&f->layout, &p, &c, NULL, 0, &err) == TR_E_ARG &&
                 strstr(err.msg, "mru"),
             "unknown policy: %s", err.msg);
}

/* exact counts on a sequence whose outcome is known whatever the policy */
static void test_accounting(const efile *f, bool no_direct) {
    tr_expert_cache *c = make_cache(f, all_bytes(f), no_direct, 2);
    if (!c) {
        TU_CHECK(0, "create");
        return;
    }
    tr_expert_request req;
    tr_expert_stats st;
    const int32_t a[4] = {0, 1, 2, 3}, b[3] = {2, 3, 9};
    TU_CHECK(run_request(c, f, 2, a, 4, &req) == 0, "first");
    TU_CHECK(run_request(c, f, 2, b, 3, &req) == 0, "second");
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.hits == 2 && st.misses == 5, "hits %llu misses %llu", (unsigned long long)st.hits,
             (unsigned long long)st.misses);
    TU_CHECK(tr_expert_cache_is_resident(c, 2, 9) && !tr_expert_cache_is_resident(c, 2, 4) &&
                 !tr_expert_cache_is_resident(c, 0, 9) && !tr_expert_cache_is_resident(c, 1, 0) &&
                 !tr_expert_cache_is_resident(c, 2, N_EXPERT),
             "is_resident");
    if (no_direct) /* buffered reads read exactly the slices */
        TU_CHECK(st.bytes_read == 5 * 150000ull, "bytes read %llu",
                 (unsigned long long)st.bytes_read);
    else
        TU_CHECK(st.bytes_read >= 5 * 150000ull && st.bytes_read <= 5 * (150000ull + 3 * 8192),
                 "bytes read %llu", (unsigned long long)st.bytes_read);
    /* prefetch: 3 issued (one already resident is skipped), one used */
    const int32_t pf[4] = {9, 10, 11, 12};
    tr_expert_cache_prefetch(c, 2, pf, 4);
    const int32_t u[2] = {10, 13};
    TU_CHECK(run_request(c, f, 2, u, 2, &req) == 0, "after prefetch");
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.prefetch_issued == 3 && st.prefetch_used == 1, "prefetch issued %llu used %llu",
             (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_used);
    TU_CHECK(st.hits == 3 && st.misses == 6, "hits %llu misses %llu", (unsigned long long)st.hits,
             (unsigned long long)st.misses);
    /* the largest layer's 4 experts are the whole arena at the minimum budget: a prefetch there,
     * then any other request of that class, wastes every prefetched expert */
    tr_expert_cache_free(c);
    c = make_cache(f, tr_expert_cache_min_budget(&f->layout), no_direct, 2);
    if (!c) {
        TU_CHECK(0, "create");
        return;
    }
    /* all four slots pinned by a request: a prefetch has no room and issues nothing */
    const int32_t p4[4] = {0, 1, 2, 3}, q4[4] = {4, 5, 6, 7};
    tr_error err = {0};
    TU_CHECK(tr_expert_cache_acquire(c, 4, p4, 4, &req, &err) == TR_OK, "%s", err.msg);
    tr_expert_cache_prefetch(c, 4, q4, 4);
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.prefetch_issued == 0, "issued %llu with every slot pinned",
             (unsigned long long)st.prefetch_issued);
    for (int32_t idx = 0; idx >= 0;)
        TU_CHECK(tr_expert_cache_next_ready(c, &req, &idx, &err) == TR_OK, "%s", err.msg);
    tr_expert_cache_release(c, &req);
    /* now it evicts the unpinned ones; then a request for others evicts every prefetched one
     * (waiting for their reads first): all wasted */
    tr_expert_cache_prefetch(c, 4, q4, 4);
    TU_CHECK(run_request(c, f, 4, p4, 4, &req) == 0, "after prefetch (waits for the reads)");
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.prefetch_issued == 4, "issued %llu", (unsigned long long)st.prefetch_issued);
    const uint64_t payload4 = 600000 + 100000 + 100000 + 1234 + 1234 + 2000;
    TU_CHECK(st.prefetch_used == 0 && st.prefetch_wasted_bytes == 4 * payload4,
             "used %llu wasted %llu", (unsigned long long)st.prefetch_used,
             (unsigned long long)st.prefetch_wasted_bytes);
    tr_expert_cache_free(c);
}

/* the N-th read fails (EIO) or comes back short: one worker, so the N-th read is known */
static void test_fault(const efile *f, bool no_direct, const char *var, const char *kind) {
    setenv(var, "2", 1);
    tr_expert_cache *c = make_cache(f, all_bytes(f), no_direct, 1);
    unsetenv(var);
    if (!c) {
        TU_CHECK(0, "create");
        return;
    }
    /* layer 0, experts 5..8: reads in order expert 5 parts 0, 1, 2, ... the 2nd is expert 5 part 1
     */
    const int32_t ex[4] = {5, 6, 7, 8};
    tr_expert_request req;
    tr_error err = {0};
    TU_CHECK(tr_expert_cache_acquire(c, 0, ex, 4, &req, &err) == TR_OK, "%s", err.msg);
    int n_err = 0, n_ok = 0, bad = 0;
    for (;;) {
        int32_t idx;
        const tr_status s = tr_expert_cache_next_ready(c, &req, &idx, &err);
        if (s) {
            n_err++;
            const tr_expert_part *pt = &f->layers[0].part[1];
            char want[64];
            snprintf(want, sizeof want, "bytes [%llu,",
                     (unsigned long long)(pt->offset + 5 * pt->stride));
            TU_CHECK(s == TR_E_IO, "status %d", s);
            TU_CHECK(strstr(err.msg, f->path) && strstr(err.msg, "layer 0") &&
                         strstr(err.msg, "expert 5") && strstr(err.msg, "part 1") &&
                         strstr(err.msg, "byte offset") && strstr(err.msg, want) &&
                         strstr(err.msg, kind),
                     "message: %s", err.msg);
            continue;
        }
        if (idx < 0) break;
        n_ok++;
        bad += !check_expert(f, &req, idx) || req.experts[idx] == 5;
    }
    tr_expert_cache_release(c, &req);
    TU_CHECK(n_err == 1 && n_ok == 3 && bad == 0, "errors %d ok %d bad %d", n_err, n_ok, bad);
    tr_expert_stats st;
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.failed_reads == 1, "failed %llu", (unsigned long long)st.failed_reads);
    /* the failed expert was dropped; the cache works: it is read again, correctly */
    const uint64_t misses = st.misses;
    TU_CHECK(run_request(c, f, 0, ex, 4, &req) == 0, "after the fault");
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.misses == misses + 1, "only the failed one is a miss: %llu -> %llu",
             (unsigned long long)misses, (unsigned long long)st.misses);
    tr_expert_cache_free(c);

    /* four workers: some expert fails, every other one is right */
    setenv(var, "3", 1);
    c = make_cache(f, all_bytes(f), no_direct, 4);
    unsetenv(var);
    if (!c) return;
    const int32_t ey[4] = {0, 1, 2, 3};
    TU_CHECK(tr_expert_cache_acquire(c, 4, ey, 4, &req, &err) == TR_OK, "%s", err.msg);
    n_err = n_ok = bad = 0;
    for (;;) {
        int32_t idx;
        if (tr_expert_cache_next_ready(c, &req, &idx, &err)) {
            n_err++;
            TU_CHECK(strstr(err.msg, "layer 4") && strstr(err.msg, kind), "%s", err.msg);
            continue;
        }
        if (idx < 0) break;
        n_ok++;
        bad += !check_expert(f, &req, idx);
    }
    tr_expert_cache_release(c, &req);
    TU_CHECK(n_err == 1 && n_ok == 3 && bad == 0, "4 workers: errors %d ok %d bad %d", n_err, n_ok,
             bad);
    TU_CHECK(run_request(c, f, 4, ey, 4, &req) == 0, "after the fault, 4 workers");
    tr_expert_cache_free(c);
}

/* truncate the file under a live cache: reads past the end come back short (0 bytes) */
static void test_truncate(efile *f, bool no_direct) {
    tr_expert_cache *c = make_cache(f, all_bytes(f), no_direct, 4);
    if (!c) {
        TU_CHECK(0, "create");
        return;
    }
    tr_expert_request req;
    const int32_t ex[4] = {0, 1, 2, 3};
    TU_CHECK(run_request(c, f, 0, ex, 4, &req) == 0, "before truncation");
    /* cut inside layer 5's last part: experts >= 8 of it are gone, layer 0 is resident */
    const tr_expert_part *pt = &f->layers[5].part[2];
    const uint64_t cut = pt->offset + 8 * pt->stride + 1000;
    TU_CHECK(ftruncate(f->fd, (off_t)cut) == 0, "truncate: %s", strerror(errno));
    tr_error err = {0};
    const int32_t ey[2] = {9, 2}; /* 9 lost, 2 fine */
    TU_CHECK(tr_expert_cache_acquire(c, 5, ey, 2, &req, &err) == TR_OK, "%s", err.msg);
    int n_err = 0, n_ok = 0, bad = 0;
    for (;;) {
        int32_t idx;
        if (tr_expert_cache_next_ready(c, &req, &idx, &err)) {
            n_err++;
            TU_CHECK(strstr(err.msg, "short read") && strstr(err.msg, "layer 5") &&
                         strstr(err.msg, "expert 9") && strstr(err.msg, f->path),
                     "%s", err.msg);
            continue;
        }
        if (idx < 0) break;
        n_ok++;
        bad += !check_expert(f, &req, idx) || req.experts[idx] != 2;
    }
    tr_expert_cache_release(c, &req);
    TU_CHECK(n_err == 1 && n_ok == 1 && bad == 0, "truncated: errors %d ok %d bad %d", n_err, n_ok,
             bad);
    TU_CHECK(run_request(c, f, 0, ex, 4, &req) == 0, "resident experts survive");
    efile_restore(f);
    TU_CHECK(run_request(c, f, 5, ey, 2, &req) == 0, "after the file is back");
    tr_expert_stats st;
    tr_expert_cache_stats(c, &st);
    TU_CHECK(st.failed_reads == 1, "failed %llu", (unsigned long long)st.failed_reads);
    tr_expert_cache_free(c);
}

/* ---- four threads, one cache -------------------------------------------------------------------
 */

typedef struct {
    tr_expert_cache *c;
    const efile *f;
    uint64_t seed;
    int bad, errors, requests;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *w = arg;
    tu_rng r = {w->seed};
    for (int it = 0; it < w->requests; it++) {
        int32_t layer, ex[TOPK];
        const int32_t n = 1 + (int32_t)(tu_next(&r) % TOPK);
        pick_request(&r, &layer, ex, n);
        float wts[TOPK] = {0.4f, 0.3f, 0.2f, 0.1f};
        tr_expert_cache_observe(w->c, layer, ex, wts, n, NULL);
        tr_expert_request req;
        const int rc = run_request(w->c, w->f, layer, ex, n, &req);
        if (rc < 0)
            w->errors++;
        else
            w->bad += rc;
        if (it % 5 == 0) {
            int32_t nl, pe[2];
            pick_request(&r, &nl, pe, 2);
            tr_expert_cache_prefetch(w->c, nl, pe, 2);
        }
        if (it % 17 == 0) {
            tr_expert_stats st;
            tr_expert_cache_stats(w->c, &st);
        }
    }
    return NULL;
}

static void test_threads(const efile *f, bool no_direct) {
    const uint64_t min = tr_expert_cache_min_budget(&f->layout);
    const uint64_t budgets[] = {min, 3 * min};
    for (int b = 0; b < 2; b++) {
        tr_expert_cache *c = make_cache(f, budgets[b], no_direct, 4);
        if (!c) {
            TU_CHECK(0, "create");
            continue;
        }
        pthread_t th[4];
        worker_arg wa[4];
        for (int i = 0; i < 4; i++) {
            wa[i] = (worker_arg){
                .c = c, .f = f, .seed = 99 + (uint64_t)i * 7 + (uint64_t)b, .requests = 40};
            TU_CHECK(pthread_create(&th[i], NULL, worker, &wa[i]) == 0, "thread");
        }
        int bad = 0, errors = 0;
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            bad += wa[i].bad;
            errors += wa[i].errors;
        }
        tr_expert_stats st;
        tr_expert_cache_stats(c, &st);
        TU_CHECK(bad == 0 && errors == 0, "threads budget %llu: %d wrong, %d errors",
                 (unsigned long long)budgets[b], bad, errors);
        TU_CHECK(st.resident_bytes <= st.arena_bytes && st.arena_bytes <= budgets[b], "budget");
        printf("  4 threads, budget %.2f MiB: hits %llu misses %llu prefetch %llu/%llu, "
               "wait %.1f ms\n",
               (double)budgets[b] / 1048576, (unsigned long long)st.hits,
               (unsigned long long)st.misses, (unsigned long long)st.prefetch_used,
               (unsigned long long)st.prefetch_issued, (double)st.io_wait_ns / 1e6);
        tr_expert_cache_free(c);
    }
}

/* O_DIRECT refused: the cache reads through the caller's fd, buffered, and says so. Here the
 * path names another file (or none), which the cache must detect: tmpfs on this kernel (6.6+)
 * accepts O_DIRECT, so a refusing file system is not at hand. */
static void test_fallback(efile *f) {
    char other[300];
    snprintf(other, sizeof other, "%s.other", f->path);
    const int o = open(other, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    TU_CHECK(o >= 0 && write_all(o, f->bytes, 8192) == 0, "write %s", other);
    if (o >= 0) close(o);
    const char *paths[2] = {other, "/nonexistent/terrace-experts"};
    for (int i = 0; i < 2; i++) {
        efile g = *f;
        g.layout.layers = g.layers;
        for (int l = 0; l < N_LAYER; l++)
            for (int p = 0; p < g.layers[l].n_parts; p++) g.layers[l].part[p].path = paths[i];
        tr_expert_cache *c = make_cache(&g, tr_expert_cache_min_budget(&g.layout), false, 2);
        if (!c) {
            TU_CHECK(0, "create");
            continue;
        }
        tu_rng r = {55};
        int bad = 0;
        for (int it = 0; it < 40; it++) {
            int32_t layer, ex[TOPK];
            pick_request(&r, &layer, ex, TOPK);
            tr_expert_request req;
            bad += run_request(c, &g, layer, ex, TOPK, &req) != 0;
        }
        tr_expert_stats st;
        tr_expert_cache_stats(c, &st);
        TU_CHECK(!st.direct_io && bad == 0, "fallback (%s): direct %d, %d bad", paths[i],
                 st.direct_io, bad);
        tr_expert_cache_free(c);
    }
    unlink(other);
}

/* seconds since the previous call, for the section timings */
static double lap(void) {
    static struct timespec prev;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double d =
        (double)(now.tv_sec - prev.tv_sec) + (double)(now.tv_nsec - prev.tv_nsec) * 1e-9;
    prev = now;
    return d;
}

static bool direct_ok(const char *path) {
    const int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) return false;
    void *buf = NULL;
    bool ok = posix_memalign(&buf, 4096, 4096) == 0 && pread(fd, buf, 4096, 0) >= 0;
    free(buf);
    close(fd);
    return ok;
}

int main(void) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    efile f;
    if (efile_create(&f, dir)) {
        fprintf(stderr, "cannot write the expert file in %s: %s\n", dir, strerror(errno));
        return 1;
    }
    const bool can_direct = direct_ok(f.path);
    printf("  expert file %s: %.1f MiB, O_DIRECT %s\n", f.path, (double)f.size / 1048576,
           can_direct ? "supported" : "NOT supported here (buffered fallback)");
    lap();
    test_budget_errors(&f);
    test_random(&f, false, can_direct, can_direct ? "direct" : "fallback", false);
    test_random(&f, true, false, "buffered", true);
    printf("  [random sequences: %.1f s]\n", lap());
    test_policies(&f);
    for (int m = 0; m < 2; m++) {
        const bool no_direct = m == 1;
        test_accounting(&f, no_direct);
        test_fault(&f, no_direct, "TERRACE_FAULT_READ", "read error");
        test_fault(&f, no_direct, "TERRACE_FAULT_SHORT", "short read");
        test_truncate(&f, no_direct);
    }
    printf("  [policies, accounting, faults: %.1f s]\n", lap());
    test_threads(&f, false);
    printf("  [threads: %.1f s]\n", lap());
    test_fallback(&f);
    efile_destroy(&f);

    /* tmpfs: refuses O_DIRECT before Linux 6.6 (then the cache falls back), accepts it since */
    struct stat sb;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode)) {
        efile g;
        if (efile_create(&g, "/dev/shm") == 0) {
            const bool d = direct_ok(g.path);
            printf("  /dev/shm: O_DIRECT %s\n", d ? "supported" : "refused");
            test_random(&g, false, d, "tmpfs", true);
            efile_destroy(&g);
        } else {
            efile_destroy(&g);
        }
    }
    return tu_result("test_expert_cache");
}
