/*
 * Expert cache: arena, slots, request bookkeeping; reads go to the I/O pool (io.c), eviction
 * choices to the policy (policy.h).
 *
 * Slots. Experts of different layers differ in size (Qwen3-30B Q4_K_M: 3,059,712 B where a
 * layer's down projection is Q6_K, 2,654,208 B where it is Q4_K). Each layer gets a fixed part
 * layout: part p lives in a region of whole 4K pages at a fixed offset in the slot, big enough
 * for the aligned superset [floor4k(off), ceil4k(off + len)) of any expert's slice, so an O_DIRECT
 * read lands at the region start and the slice starts (off mod 4096) bytes in. A layer's slot size
 * is the sum of its regions. Distinct slot sizes form size classes; the arena is cut once, at
 * create, into n_c slots of each class c:
 *   - proportionally to each class's share of a token's working set (every layer runs once per
 *     token, so this is the split a global recency policy settles into), so no slot is wider than
 *     its class needs: no 13% loss on the smaller layers as uniform slots of the largest size have
 *     (Qwen3-30B Q4_K_M, 2 GiB: 748 experts resident instead of 699, +7%);
 *   - the largest class gets at least top-k slots, and an entry may take a slot of a larger class
 *     when its own has none to give, so any layer's top-k always fits: the minimum budget is the
 *     same as with uniform slots (top-k x largest slot), and near it the scheme *is* uniform slots.
 * A first-fit allocator would waste nothing either, but pinned experts fragment it: a hole for the
 * next expert is guaranteed only with about twice the minimum, and eviction would have to follow
 * addresses instead of the policy.
 *
 * Policy. Each class with slots has its own tr_policy over its slots: budget n_c * s_c, every item
 * charged s_c, so "the policy has room" is exactly "the class has a free slot" and an admit evicts
 * at most one victim, whose slot the newcomer takes. Its layers get expert bytes s_c, the others
 * 0, so "auto" sees the class's share of budget and working set, the same ratio as the whole.
 * Policy pins mirror "not evictable": an item is pinned once (count 0 or 1) while a request holds
 * it, while it loads, and after a failed read until it is dropped.
 *
 * Locking: one mutex guards all bookkeeping; it is held only for table updates, never across a
 * read. One condition variable signals "a read finished or a request released its pins". The
 * arena bytes of a slot are written only by I/O workers while the slot's entry is LOADING (then no
 * request can see them) and read by compute threads only while they pin a READY entry (then no
 * read targets the slot): the mutex hand-over at completion orders the two.
 */
#include "experts/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/io.h"
#include "experts/adaptive.h"
#include "experts/policy.h"

/* Reads are split into chunks of at most this size (default), so one missing expert (3 parts)
 * still keeps every worker busy and a layer's misses spread evenly over the pool. */
#define CHUNK_BYTES (512u << 10)

enum { E_ABSENT, E_LOADING, E_READY, E_FAILED };

typedef struct cfile {
    int fd;     /* the GGUF reader's O_RDONLY fd: borrowed, must outlive the cache */
    int dfd;    /* our own O_DIRECT fd on the same file, -1 when buffered */
    char *path; /* owned copy, for messages */
} cfile;

typedef struct cpart {
    uint32_t file;
    uint64_t offset, stride, bytes; /* as in tr_expert_part */
    uint64_t region_off;            /* where the part's pages start inside a slot */
} cpart;

typedef struct clayer {
    int n_parts; /* 0: not a MoE layer */
    int32_t cls;
    uint64_t slot_bytes, payload; /* sum of regions; sum of part bytes */
    uint32_t n_jobs;              /* chunks to read one expert */
    cpart part[TR_EXPERT_MAX_PARTS];
} clayer;

typedef struct cclass {
    uint64_t slot_bytes;
    uint32_t n_layers, n_slots;
    int32_t free_head; /* free slots, linked through cslot.next_free */
    tr_policy *pol;    /* NULL when the class has no slot */
} cclass;

typedef struct cslot {
    int32_t key; /* entry (layer * n_expert + expert) in the slot, -1 when free */
    int32_t cls, next_free;
    uint64_t base;    /* offset in the arena */
    uint32_t pending; /* reads not yet completed */
    /* first failure of the current load */
    bool failed;
    int err;
    uint32_t err_part;
    uint64_t err_off, err_got, err_need;
} cslot;

typedef struct centry {
    int32_t slot; /* -1: absent */
    uint8_t state;
    uint8_t prefetched; /* loaded by prefetch, no request has used it yet */
    uint32_t pins;      /* requests holding it */
} centry;

struct tr_expert_cache {
    int32_t n_layer, n_expert;
    clayer *layers;
    cfile *files;
    int n_files;
    cclass *classes;
    int n_classes;
    cslot *slots;
    uint32_t n_slots, jobs_per_slot;
    uint64_t chunk;     /* bytes per read */
    uint64_t inflight;  /* reads queued or running (under mu) */
    uint64_t busy_t0;   /* when inflight last became non-zero */
    tr_io_job *jobs;    /* [n_slots * jobs_per_slot]; a slot's jobs are the I/O pool's while it
                           loads, and untouched by anyone otherwise */
    centry *entries;    /* [n_layer * n_expert] */
    uint8_t *arena;     /* one allocation, TR_IO_ALIGN-aligned */
    int32_t last_route; /* layer of the last tr_policy_route, -1 none */
    tr_duel *duel;      /* adaptive: the one duel every class's policy follows */
    tr_io_pool *io;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tr_expert_stats st; /* counters; guarded by mu */
    /* while a waiter holding mu feeds the duel (feed_armed), the time the first read landed,
     * taken before read_done waits for mu: that read's waiting starts there */
    atomic_bool feed_armed;
    atomic_uint_fast64_t first_land_ns;
};

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* ---- geometry: the same numbers for min_budget, working set and create ------------------------
 */

static tr_status check_layout(const tr_expert_layout *L, tr_error *err) {
    if (!L || !L->layers || L->n_layer < 1 || L->n_expert < 1)
        return tr_fail(err, TR_E_ARG, "expert cache: empty layout");
    if (L->n_expert_used < 1 || L->n_expert_used > L->n_expert ||
        L->n_expert_used > TR_EXPERT_MAX_TOPK)
        return tr_fail(err, TR_E_ARG, "expert cache: top-k %d (1..min(%d, %d))", L->n_expert_used,
                       L->n_expert, TR_EXPERT_MAX_TOPK);
    if ((int64_t)L->n_layer * L->n_expert > INT32_MAX)
        return tr_fail(err, TR_E_ARG, "expert cache: %d layers x %d experts is too many",
                       L->n_layer, L->n_expert);
    int moe = 0;
    for (int32_t l = 0; l < L->n_layer; l++) {
        const tr_expert_layer *ly = &L->layers[l];
        if (ly->n_parts < 0 || ly->n_parts > TR_EXPERT_MAX_PARTS)
            return tr_fail(err, TR_E_ARG, "expert cache: layer %d has %d parts (0..%d)", l,
                           ly->n_parts, TR_EXPERT_MAX_PARTS);
        moe += ly->n_parts > 0;
        for (int p = 0; p < ly->n_parts; p++) {
            const tr_expert_part *pt = &ly->part[p];
            const uint64_t lim = (uint64_t)1 << 50;
            if (pt->fd < 0 || !pt->path || pt->bytes == 0 || pt->bytes > lim ||
                pt->stride < pt->bytes || pt->stride > lim / (uint64_t)L->n_expert ||
                pt->offset > lim ||
                pt->offset + (uint64_t)(L->n_expert - 1) * pt->stride + pt->bytes > lim)
                return tr_fail(err, TR_E_ARG,
                               "expert cache: layer %d part %d: bad range (fd %d, offset %llu, "
                               "stride %llu, bytes %llu)",
                               l, p, pt->fd, (unsigned long long)pt->offset,
                               (unsigned long long)pt->stride, (unsigned long long)pt->bytes);
        }
    }
    if (!moe) return tr_fail(err, TR_E_ARG, "expert cache: the layout has no MoE layer");
    return TR_OK;
}

/* a slot's part regions: each holds the aligned superset of any expert's slice of its part;
 * chunk: bytes per read, for the job count */
static void layer_geometry(const tr_expert_layout *L, int32_t l, uint64_t chunk, clayer *out) {
    const tr_expert_layer *ly = &L->layers[l];
    memset(out, 0, sizeof *out);
    out->n_parts = ly->n_parts;
    out->cls = -1;
    uint64_t at = 0;
    for (int p = 0; p < ly->n_parts; p++) {
        const tr_expert_part *pt = &ly->part[p];
        cpart *cp = &out->part[p];
        cp->offset = pt->offset;
        cp->stride = pt->stride;
        cp->bytes = pt->bytes;
        /* room for any phase of the slice in its first page, not just this layer's phases: so
         * layers with the same tensor types get the same slot size whatever their offsets, and
         * share one size class (costs at most one page per part where every phase is 0) */
        const uint64_t w = align_up(pt->bytes + TR_IO_ALIGN - 1, TR_IO_ALIGN);
        cp->region_off = at;
        at += w;
        out->payload += pt->bytes;
        out->n_jobs += (uint32_t)((w + chunk - 1) / chunk);
    }
    out->slot_bytes = at;
}

static uint64_t max_slot_bytes(const tr_expert_layout *L) {
    uint64_t m = 0;
    for (int32_t l = 0; l < L->n_layer; l++) {
        clayer g;
        layer_geometry(L, l, CHUNK_BYTES, &g);
        if (g.slot_bytes > m) m = g.slot_bytes;
    }
    return m;
}

uint64_t tr_expert_cache_min_budget(const tr_expert_layout *layout) {
    if (check_layout(layout, NULL)) return 0;
    return (uint64_t)layout->n_expert_used * max_slot_bytes(layout);
}

uint64_t tr_expert_cache_token_working_set(const tr_expert_layout *layout) {
    if (check_layout(layout, NULL)) return 0;
    uint64_t s = 0;
    for (int32_t l = 0; l < layout->n_layer; l++) {
        clayer g;
        layer_geometry(layout, l, CHUNK_BYTES, &g);
        s += (uint64_t)layout->n_expert_used * g.slot_bytes;
    }
    return s;
}

/* Cut the budget into slots: the largest class first gets top-k slots; then one slot at a time
 * goes to the class furthest below its share of the working set (n_c / layers_c, as every layer
 * of class c needs k slots of size s_c per token), capped at every expert of the class, until no
 * slot fits. Create-time only: at most one step per expert of the model. */
static void partition(cclass *cl, int nc, int32_t n_expert, int32_t k, uint64_t budget) {
    uint64_t used = 0;
    for (int c = 0; c < nc; c++) cl[c].n_slots = 0;
    cl[nc - 1].n_slots = (uint32_t)k;
    used = (uint64_t)k * cl[nc - 1].slot_bytes;
    for (;;) {
        int best = -1;
        double best_fill = 0;
        for (int c = nc - 1; c >= 0; c--) {
            const uint64_t cap = (uint64_t)cl[c].n_layers * (uint64_t)n_expert;
            if (cl[c].n_slots >= cap || cl[c].slot_bytes > budget - used) continue;
            const double fill = (double)cl[c].n_slots / (double)cl[c].n_layers;
            if (best < 0 || fill < best_fill) {
                best = c;
                best_fill = fill;
            }
        }
        if (best < 0) break;
        cl[best].n_slots++;
        used += cl[best].slot_bytes;
    }
}

/* ---- slot bookkeeping (mu held) ----------------------------------------------------------------
 */

static centry *entry_of(tr_expert_cache *c, int32_t key) { return &c->entries[key]; }

static void slot_free(tr_expert_cache *c, int32_t s) {
    cslot *sl = &c->slots[s];
    cclass *cl = &c->classes[sl->cls];
    sl->key = -1;
    sl->next_free = cl->free_head;
    cl->free_head = s;
}

static tr_policy *pol_of(const tr_expert_cache *c, int32_t s) {
    return c->classes[c->slots[s].cls].pol;
}

/* The policy calls below cannot fail unless this file's bookkeeping is wrong (they check only
 * ids, residency and pin counts, which mirror ours); errors are not reported for that reason. */
static void pol_pin(tr_expert_cache *c, int32_t s, bool pin) {
    const int32_t key = c->slots[s].key;
    if (pin)
        tr_policy_pin(pol_of(c, s), key / c->n_expert, key % c->n_expert, NULL);
    else
        tr_policy_unpin(pol_of(c, s), key / c->n_expert, key % c->n_expert, NULL);
}

/* The entry in slot s leaves the cache and the slot is freed. by_policy: the policy evicted it
 * (it already forgot it); otherwise it is unpinned and removed there (a failed read). */
static void slot_vacate(tr_expert_cache *c, int32_t s, bool by_policy) {
    cslot *sl = &c->slots[s];
    centry *e = entry_of(c, sl->key);
    const int32_t layer = sl->key / c->n_expert, ex = sl->key % c->n_expert;
    if (!by_policy) {
        pol_pin(c, s, false);
        tr_policy_remove(pol_of(c, s), layer, ex, NULL);
    }
    if (e->prefetched) c->st.prefetch_wasted_bytes += c->layers[layer].payload;
    c->st.resident_bytes -= c->classes[sl->cls].slot_bytes;
    c->st.payload_bytes -= c->layers[layer].payload;
    e->slot = -1;
    e->state = E_ABSENT;
    e->prefetched = 0;
    e->pins = 0;
    slot_free(c, s);
}

/* Admits key to the policy of its own class or, when every slot there is pinned, of the next
 * larger class with room; evicts the victims and returns the slot it takes (admitted and pinned
 * in the policy, reserved for key, not loaded yet). -1 when no class has room. */
static int32_t slot_find(tr_expert_cache *c, int32_t key) {
    const int32_t layer = key / c->n_expert, ex = key % c->n_expert;
    for (int k = c->layers[layer].cls; k < c->n_classes; k++) {
        cclass *cl = &c->classes[k];
        if (!cl->pol || tr_policy_admit(cl->pol, layer, ex, cl->slot_bytes, 0, NULL)) continue;
        const tr_policy_key *v;
        const size_t nv = tr_policy_victims(cl->pol, &v);
        for (size_t i = 0; i < nv; i++) {
            slot_vacate(c, entry_of(c, v[i].layer * c->n_expert + v[i].expert)->slot, true);
            c->st.evictions++;
        }
        const int32_t s = cl->free_head;
        if (s < 0) { /* cannot happen: the policy's room is this class's free slots */
            tr_policy_remove(cl->pol, layer, ex, NULL);
            continue;
        }
        cl->free_head = c->slots[s].next_free;
        c->slots[s].key = key;
        pol_pin(c, s, true); /* until its reads are done */
        return s;
    }
    return -1;
}

/* A request lets go of e; the last one makes it evictable, or drops it after a failed read (all
 * its reads are done then). A LOADING entry stays pinned: read_done decides when it lands. */
static void entry_unpin(tr_expert_cache *c, centry *e) {
    if (--e->pins) return;
    if (e->state == E_READY)
        pol_pin(c, e->slot, false);
    else if (e->state == E_FAILED)
        slot_vacate(c, e->slot, false);
}

/* Undoes slot_find for a slot that was never loaded. */
static void slot_unfind(tr_expert_cache *c, int32_t s) {
    const int32_t key = c->slots[s].key;
    pol_pin(c, s, false);
    tr_policy_remove(pol_of(c, s), key / c->n_expert, key % c->n_expert, NULL);
    slot_free(c, s);
}

/* Loads key into slot s (from slot_find): fills its read jobs, appended to the chain
 * first..last for the caller to submit. */
static void slot_load(tr_expert_cache *c, int32_t s, int32_t key, tr_io_job **first,
                      tr_io_job **last) {
    cslot *sl = &c->slots[s];
    centry *e = entry_of(c, key);
    const int32_t layer = key / c->n_expert, ex = key % c->n_expert;
    const clayer *ly = &c->layers[layer];
    sl->key = key;
    sl->failed = false;
    sl->pending = 0;
    e->slot = s;
    e->state = E_LOADING;
    c->st.resident_bytes += c->classes[sl->cls].slot_bytes;
    c->st.payload_bytes += ly->payload;

    tr_io_job *jobs = c->jobs + (size_t)s * c->jobs_per_slot;
    uint32_t nj = 0;
    for (int p = 0; p < ly->n_parts; p++) {
        const cpart *cp = &ly->part[p];
        const cfile *f = &c->files[cp->file];
        const uint64_t off = cp->offset + (uint64_t)ex * cp->stride;
        uint8_t *region = c->arena + sl->base + cp->region_off;
        const bool direct = f->dfd >= 0;
        /* direct: the aligned superset into the region start; buffered: the exact slice at the
         * same place inside the region, so the handed-out pointer is the same either way */
        const uint64_t a0 = direct ? off / TR_IO_ALIGN * TR_IO_ALIGN : off;
        const uint64_t a1 = direct ? align_up(off + cp->bytes, TR_IO_ALIGN) : off + cp->bytes;
        uint8_t *dst = direct ? region : region + off % TR_IO_ALIGN;
        for (uint64_t x = a0; x < a1; x += c->chunk) {
            tr_io_job *j = &jobs[nj++];
            j->fd = direct ? f->dfd : f->fd;
            j->direct = direct;
            j->offset = x;
            j->len = a1 - x < c->chunk ? a1 - x : c->chunk;
            const uint64_t end = off + cp->bytes;
            j->need = end - x < j->len ? end - x : j->len;
            j->dst = dst + (x - a0);
            j->owner = (uint32_t)s;
            j->sub = (uint32_t)p;
            j->next = NULL;
            if (nj > 1) jobs[nj - 2].next = j;
        }
    }
    sl->pending = nj;
    /* wall time with at least one read in flight: bytes_read / io_busy_ns is the bandwidth the
     * storage delivered while we were reading */
    if (c->inflight == 0) c->busy_t0 = tr_now_ns();
    c->inflight += nj;
    if (*last)
        (*last)->next = &jobs[0];
    else
        *first = &jobs[0];
    *last = &jobs[nj - 1];
}

/* worker thread: one read finished */
static void read_done(void *ctx, tr_io_job *j) {
    tr_expert_cache *c = ctx;
    if (atomic_load_explicit(&c->feed_armed, memory_order_acquire)) {
        uint_fast64_t none = 0;
        atomic_compare_exchange_strong(&c->first_land_ns, &none, tr_now_ns());
    }
    pthread_mutex_lock(&c->mu);
    cslot *sl = &c->slots[j->owner];
    c->st.reads++;
    c->st.bytes_read += j->got;
    c->st.read_ns += j->ns;
    if (--c->inflight == 0) c->st.io_busy_ns += tr_now_ns() - c->busy_t0;
    if ((j->err || j->got < j->need) && !sl->failed) {
        sl->failed = true;
        sl->err = j->err;
        sl->err_part = j->sub;
        sl->err_off = j->offset;
        sl->err_got = j->got;
        sl->err_need = j->need;
    }
    if (--sl->pending == 0) {
        centry *e = entry_of(c, sl->key);
        if (sl->failed) {
            e->state = E_FAILED;
            c->st.failed_reads++;
            if (e->pins == 0) slot_vacate(c, e->slot, false); /* nobody waits for it: drop */
        } else {
            e->state = E_READY;
            if (e->pins == 0) pol_pin(c, e->slot, false); /* else the requests' pin now */
        }
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- create / free -----------------------------------------------------------------------------
 */

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t env_u64(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    const unsigned long long x = strtoull(v, &end, 10);
    return *end ? 0 : (uint64_t)x;
}

/* Our own O_DIRECT fd on the file behind fd, or -1 where the file system refuses it (tmpfs:
 * EINVAL at open; some FUSE file systems: EINVAL at the first read) or the path no longer names
 * the same file. probe: TR_IO_ALIGN bytes of aligned scratch. */
static int open_direct(int fd, const char *path, void *probe) {
    const int d = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (d < 0) return -1;
    struct stat a, b;
    if (fstat(fd, &a) || fstat(d, &b) || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        close(d);
        return -1;
    }
    tr_io_job j = {.fd = d, .direct = true, .offset = 0, .len = TR_IO_ALIGN, .dst = probe};
    tr_io_read(&j);
    if (j.err) {
        close(d);
        return -1;
    }
    return d;
}

void tr_expert_cache_free(tr_expert_cache *c) {
    if (!c) return;
    tr_io_pool_free(c->io); /* joins the workers: no read touches the arena after this */
    for (int i = 0; i < c->n_files; i++) {
        if (c->files[i].dfd >= 0) close(c->files[i].dfd);
        free(c->files[i].path);
    }
    for (int k = 0; k < c->n_classes; k++) tr_policy_free(c->classes[k].pol);
    tr_duel_free(c->duel);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->files);
    free(c->classes);
    free(c->layers);
    free(c->slots);
    free(c->jobs);
    free(c->entries);
    free(c->arena);
    free(c);
}

tr_status tr_expert_cache_create(const tr_expert_layout *layout, const tr_expert_cache_params *p,
                                 tr_expert_cache **out, char *warning, size_t warning_cap,
                                 tr_error *err) {
    *out = NULL;
    if (warning && warning_cap) warning[0] = '\0';
    tr_status st = check_layout(layout, err);
    if (st) return st;
    if (!p) return tr_fail(err, TR_E_ARG, "expert cache: no parameters");
    tr_policy_kind kind;
    st = tr_policy_parse(p->policy ? p->policy : "auto", &kind, err);
    if (st) {
        tr_error_prefix(err, "expert cache: ");
        return st;
    }
    if (kind == TR_POLICY_BELADY)
        return tr_fail(err, TR_E_ARG,
                       "expert cache: policy 'belady' needs the future accesses; only a replay "
                       "of a recorded trace can run it");
    const int32_t k = layout->n_expert_used;
    const uint64_t min = tr_expert_cache_min_budget(layout);
    const uint64_t ws = tr_expert_cache_token_working_set(layout);
    if (p->budget_bytes < min)
        return tr_fail(err, TR_E_BUDGET,
                       "expert cache: budget %llu bytes (%.1f MiB) cannot hold one layer's top-%d "
                       "experts; the minimum is %llu bytes (%.1f MiB)",
                       (unsigned long long)p->budget_bytes, mib(p->budget_bytes), k,
                       (unsigned long long)min, mib(min));

    tr_expert_cache *c = calloc(1, sizeof *c);
    if (!c) return tr_fail(err, TR_E_NOMEM, "expert cache: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->n_layer = layout->n_layer;
    c->n_expert = layout->n_expert;
    c->last_route = -1;
    /* at least 64 KiB: smaller reads only add job tables and syscalls */
    c->chunk = p->read_chunk ? align_up(p->read_chunk, TR_IO_ALIGN) : CHUNK_BYTES;
    if (c->chunk < (64u << 10)) c->chunk = 64u << 10;
    const size_t n_keys = (size_t)layout->n_layer * (size_t)layout->n_expert;
    c->layers = calloc((size_t)layout->n_layer, sizeof *c->layers);
    c->entries = malloc(n_keys * sizeof *c->entries);
    /* at most one class and one file per part of every layer */
    const size_t max_parts = (size_t)layout->n_layer * TR_EXPERT_MAX_PARTS;
    uint64_t *sizes = malloc((size_t)layout->n_layer * sizeof *sizes); /* then expert bytes */
    c->classes = calloc((size_t)layout->n_layer, sizeof *c->classes);
    c->files = calloc(max_parts, sizeof *c->files);
    if (!c->layers || !c->entries || !sizes || !c->classes || !c->files) {
        free(sizes);
        tr_expert_cache_free(c);
        return tr_fail(err, TR_E_NOMEM, "expert cache: out of memory");
    }
    for (size_t i = 0; i < n_keys; i++) c->entries[i] = (centry){.slot = -1};

    /* layers, size classes (ascending slot size), files */
    int ns = 0;
    uint32_t jobs_per_slot = 0;
    for (int32_t l = 0; l < layout->n_layer; l++) {
        clayer *ly = &c->layers[l];
        layer_geometry(layout, l, c->chunk, ly);
        if (!ly->n_parts) continue;
        sizes[ns++] = ly->slot_bytes;
        if (ly->n_jobs > jobs_per_slot) jobs_per_slot = ly->n_jobs;
        for (int q = 0; q < ly->n_parts; q++) {
            const tr_expert_part *pt = &layout->layers[l].part[q];
            int f = 0;
            while (f < c->n_files && c->files[f].fd != pt->fd) f++;
            if (f == c->n_files) {
                c->files[f].fd = pt->fd;
                c->files[f].dfd = -1;
                c->files[f].path = strdup(pt->path);
                c->n_files++;
                if (!c->files[f].path) {
                    free(sizes);
                    tr_expert_cache_free(c);
                    return tr_fail(err, TR_E_NOMEM, "expert cache: out of memory");
                }
            }
            ly->part[q].file = (uint32_t)f;
        }
    }
    qsort(sizes, (size_t)ns, sizeof *sizes, cmp_u64);
    for (int i = 0; i < ns; i++)
        if (!c->n_classes || c->classes[c->n_classes - 1].slot_bytes != sizes[i])
            c->classes[c->n_classes++].slot_bytes = sizes[i];
    for (int32_t l = 0; l < layout->n_layer; l++) {
        clayer *ly = &c->layers[l];
        if (!ly->n_parts) continue;
        int q = 0;
        while (c->classes[q].slot_bytes != ly->slot_bytes) q++;
        ly->cls = q;
        c->classes[q].n_layers++;
    }
    partition(c->classes, c->n_classes, c->n_expert, k, p->budget_bytes);

    /* slots and the arena */
    uint64_t arena = 0;
    for (int q = 0; q < c->n_classes; q++) {
        c->n_slots += c->classes[q].n_slots;
        arena += (uint64_t)c->classes[q].n_slots * c->classes[q].slot_bytes;
    }
    c->jobs_per_slot = jobs_per_slot;
    c->slots = calloc(c->n_slots, sizeof *c->slots);
    c->jobs = calloc((size_t)c->n_slots * jobs_per_slot, sizeof *c->jobs);
    if (arena != (size_t)arena || posix_memalign((void **)&c->arena, TR_IO_ALIGN, (size_t)arena))
        c->arena = NULL;
    if (!c->slots || !c->jobs || !c->arena) {
        free(sizes);
        tr_expert_cache_free(c);
        return tr_fail(err, TR_E_NOMEM, "expert cache: cannot allocate the %.1f MiB arena",
                       mib(arena));
    }
    /* adaptive: one duel over the whole arena, which the classes' policies follow (policy.h,
     * tr_policy_params.duel) */
    if ((kind == TR_POLICY_AUTO ? tr_policy_auto(p->budget_bytes, ws) : kind) ==
        TR_POLICY_ADAPTIVE) {
        for (int32_t l = 0; l < c->n_layer; l++)
            sizes[l] = c->layers[l].n_parts ? c->layers[l].slot_bytes : 0;
        const tr_policy_params dp = {.kind = TR_POLICY_ADAPTIVE,
                                     .n_layer = c->n_layer,
                                     .n_expert = c->n_expert,
                                     .n_expert_used = k,
                                     .budget_bytes = arena,
                                     .expert_bytes = sizes};
        st = tr_duel_create(&dp, &c->duel, err);
        if (st) {
            free(sizes);
            tr_error_prefix(err, "expert cache: ");
            tr_expert_cache_free(c);
            return st;
        }
    }
    uint64_t base = 0;
    int32_t first = 0;
    for (int q = 0; q < c->n_classes; q++) {
        cclass *cl = &c->classes[q];
        cl->free_head = -1;
        for (int32_t i = 0; i < (int32_t)cl->n_slots; i++) {
            c->slots[first + i].cls = q;
            c->slots[first + i].base = base + (uint64_t)i * cl->slot_bytes;
        }
        /* pushed last to first: a young cache fills the arena from its start */
        for (int32_t i = (int32_t)cl->n_slots - 1; i >= 0; i--) slot_free(c, first + i);
        base += (uint64_t)cl->n_slots * cl->slot_bytes;
        first += (int32_t)cl->n_slots;
        if (!cl->n_slots) continue;
        uint64_t *ebytes = sizes;
        for (int32_t l = 0; l < c->n_layer; l++)
            ebytes[l] = c->layers[l].n_parts && c->layers[l].cls == q ? cl->slot_bytes : 0;
        const tr_policy_params pp = {.kind = kind,
                                     .n_layer = c->n_layer,
                                     .n_expert = c->n_expert,
                                     .n_expert_used = k,
                                     .budget_bytes = (uint64_t)cl->n_slots * cl->slot_bytes,
                                     .expert_bytes = ebytes,
                                     .seed = p->seed + (uint64_t)q,
                                     .duel = c->duel};
        st = tr_policy_create(&pp, &cl->pol, err);
        if (st) {
            free(sizes);
            tr_error_prefix(err, "expert cache: ");
            tr_expert_cache_free(c);
            return st;
        }
    }
    free(sizes);

    /* O_DIRECT where the file system allows it; the arena's first page is the probe buffer */
    bool direct = !p->no_direct_io;
    for (int f = 0; f < c->n_files; f++) {
        if (!p->no_direct_io)
            c->files[f].dfd = open_direct(c->files[f].fd, c->files[f].path, c->arena);
        if (c->files[f].dfd < 0) direct = false;
    }

    st = tr_io_pool_create(p->io_threads > 0 ? p->io_threads : 4, read_done, c, &c->io, err);
    if (st) {
        tr_error_prefix(err, "expert cache: ");
        tr_expert_cache_free(c);
        return st;
    }
    /* fault injection for tests: the N-th read (from 1) fails with EIO / comes back short */
    tr_io_pool_set_faults(c->io, env_u64("TERRACE_FAULT_READ"), env_u64("TERRACE_FAULT_SHORT"));

    c->st.budget_bytes = p->budget_bytes;
    c->st.arena_bytes = arena;
    c->st.n_slots = c->n_slots;
    c->st.n_classes = (uint32_t)c->n_classes;
    c->st.direct_io = direct;
    /* the largest class always has slots; every class resolves "auto" on the same ratio */
    const tr_policy_kind in_effect = tr_policy_kind_of(c->classes[c->n_classes - 1].pol);
    c->st.policy = tr_policy_name(in_effect);
    if (warning && warning_cap)
        tr_policy_cliff_warning(warning, warning_cap, p->budget_bytes, ws, in_effect);
    *out = c;
    return TR_OK;
}

/* ---- requests ----------------------------------------------------------------------------------
 */

int32_t tr_expert_cache_max_request(const tr_expert_cache *c, int32_t layer) {
    if (layer < 0 || layer >= c->n_layer || !c->layers[layer].n_parts) return 0;
    uint64_t n = 0;
    for (int q = c->layers[layer].cls; q < c->n_classes; q++) n += c->classes[q].n_slots;
    return n < TR_EXPERT_MAX_TOPK ? (int32_t)n : TR_EXPERT_MAX_TOPK;
}

/* Pins every expert of req, placing the misses; all or nothing. false: not enough unpinned slots
 * now (everything this call did is undone; evicted experts stay evicted). */
static bool try_acquire(tr_expert_cache *c, tr_expert_request *req, tr_io_job **first,
                        tr_io_job **last) {
    int32_t placed[TR_EXPERT_MAX_TOPK];
    int32_t n_placed = 0, misses = 0;
    for (int q = 0; q < c->n_classes; q++)
        if (c->classes[q].pol)
            tr_policy_prefetch(c->classes[q].pol, req->layer, req->experts, req->n);
    for (int32_t i = 0; i < req->n; i++)
        __builtin_prefetch(entry_of(c, req->layer * c->n_expert + req->experts[i]), 1);
    /* hits first, so placing the misses cannot evict them */
    for (int32_t i = 0; i < req->n; i++) {
        centry *e = entry_of(c, req->layer * c->n_expert + req->experts[i]);
        if (e->slot < 0)
            misses++;
        else if (e->pins++ == 0 && e->state == E_READY)
            pol_pin(c, e->slot, true);
    }
    for (int32_t i = 0; i < req->n && n_placed < misses; i++) {
        const int32_t key = req->layer * c->n_expert + req->experts[i];
        if (entry_of(c, key)->slot >= 0) continue;
        const int32_t s = slot_find(c, key);
        if (s < 0) break;
        placed[n_placed++] = s;
    }
    if (n_placed < misses) {
        for (int32_t i = 0; i < n_placed; i++) slot_unfind(c, placed[i]);
        for (int32_t i = 0; i < req->n; i++) {
            centry *e = entry_of(c, req->layer * c->n_expert + req->experts[i]);
            if (e->slot >= 0) entry_unpin(c, e);
        }
        return false;
    }
    int32_t next = 0;
    for (int32_t i = 0; i < req->n; i++) {
        const int32_t key = req->layer * c->n_expert + req->experts[i];
        centry *e = entry_of(c, key);
        if (e->slot >= 0) {
            c->st.hits++;
            if (e->prefetched) {
                c->st.prefetch_used++;
                e->prefetched = 0;
            }
        } else {
            c->st.misses++;
            slot_load(c, placed[next++], key, first, last);
            e->pins = 1; /* the policy's loading pin becomes the request's when the read lands */
        }
        /* the access, told to the policy that holds the expert (after admit for a miss: it
         * could only be placed once its class was known) */
        bool hit;
        tr_policy_lookup(pol_of(c, e->slot), req->layer, req->experts[i], &hit, NULL);
        req->slot[i] = e->slot;
    }
    return true;
}

/* One visit of layer for the policies (LRFU ages a layer's items by its visits): from observe
 * with the router's choice, or from the first acquire of a layer step that had none. */
static void route(tr_expert_cache *c, int32_t layer, const tr_policy_route_info *info) {
    const uint64_t t0 = tr_now_ns();
    for (int q = 0; q < c->n_classes; q++)
        if (c->classes[q].pol) tr_policy_route(c->classes[q].pol, layer, info, NULL);
    if (c->duel) tr_duel_route(c->duel, layer, info);
    c->last_route = layer;
    c->st.policy_ns += tr_now_ns() - t0;
}

tr_status tr_expert_cache_acquire(tr_expert_cache *c, int32_t layer, const int32_t *experts,
                                  int32_t n, tr_expert_request *req, tr_error *err) {
    req->n = 0;
    req->handed = 0;
    if (layer < 0 || layer >= c->n_layer || !c->layers[layer].n_parts)
        return tr_fail(err, TR_E_ARG, "expert cache: layer %d is not a MoE layer", layer);
    if (n < 1 || n > TR_EXPERT_MAX_TOPK)
        return tr_fail(err, TR_E_ARG, "expert cache: %d experts in one request (1..%d)", n,
                       TR_EXPERT_MAX_TOPK);
    for (int32_t i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= c->n_expert)
            return tr_fail(err, TR_E_ARG, "expert cache: layer %d: expert %d out of range (0..%d)",
                           layer, experts[i], c->n_expert - 1);
        for (int32_t j = 0; j < i; j++)
            if (experts[j] == experts[i])
                return tr_fail(err, TR_E_ARG, "expert cache: layer %d: expert %d requested twice",
                               layer, experts[i]);
    }
    const int32_t cap = tr_expert_cache_max_request(c, layer);
    if (n > cap)
        return tr_fail(err, TR_E_BUDGET,
                       "expert cache: layer %d: %d experts in one request, the budget holds %d at "
                       "once",
                       layer, n, cap);
    req->layer = layer;
    memcpy(req->experts, experts, (size_t)n * sizeof *experts);
    req->n = n;

    tr_io_job *first = NULL, *last = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->last_route != layer) route(c, layer, NULL);
    const uint64_t tp = tr_now_ns();
    const bool got = try_acquire(c, req, &first, &last);
    c->st.policy_ns += tr_now_ns() - tp;
    if (!got) {
        /* other requests pin what we need: wait for a release or a finished read */
        const uint64_t t0 = tr_now_ns();
        do pthread_cond_wait(&c->cv, &c->mu);
        while (!try_acquire(c, req, &first, &last));
        c->st.io_wait_ns += tr_now_ns() - t0;
    }
    pthread_mutex_unlock(&c->mu);
    /* demand reads before any prefetch still queued: the compute thread waits for these */
    tr_io_pool_submit_urgent(c->io, first, last);
    return TR_OK;
}

static tr_status read_error(tr_expert_cache *c, int32_t key, const cslot *sl, tr_error *err) {
    const int32_t layer = key / c->n_expert, ex = key % c->n_expert;
    const cpart *cp = &c->layers[layer].part[sl->err_part];
    const char *path = c->files[cp->file].path;
    const unsigned long long off = cp->offset + (unsigned long long)ex * cp->stride;
    if (sl->err) {
        char buf[128];
        const char *msg = strerror_r(sl->err, buf, sizeof buf);
        return tr_fail(err, TR_E_IO,
                       "expert cache: read error in %s at byte offset %llu (layer %d, expert %d, "
                       "part %u: bytes [%llu, %llu)): %s",
                       path, (unsigned long long)sl->err_off, layer, ex, sl->err_part, off,
                       off + cp->bytes, msg);
    }
    return tr_fail(err, TR_E_IO,
                   "expert cache: short read in %s at byte offset %llu (layer %d, expert %d, part "
                   "%u: bytes [%llu, %llu)): got %llu of %llu bytes; was the file truncated?",
                   path, (unsigned long long)sl->err_off, layer, ex, sl->err_part, off,
                   off + cp->bytes, (unsigned long long)sl->err_got,
                   (unsigned long long)sl->err_need);
}

tr_status tr_expert_cache_next_ready(tr_expert_cache *c, tr_expert_request *req, int32_t *index,
                                     tr_error *err) {
    *index = -1;
    if (req->n <= 0) return TR_OK;
    const uint64_t all = req->n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << req->n) - 1;
    if (req->handed == all) return TR_OK;
    tr_status st = TR_OK;
    uint64_t t0 = 0;
    bool fed = false;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        int32_t ready = -1, failed = -1;
        for (int32_t i = 0; i < req->n; i++) {
            if (req->handed >> i & 1) continue;
            const centry *e = entry_of(c, req->layer * c->n_expert + req->experts[i]);
            if (e->state == E_FAILED) {
                failed = i;
                break;
            }
            if (e->state == E_READY && ready < 0) ready = i;
        }
        if (failed >= 0) {
            /* the request fails: a failed expert is never handed out */
            req->handed |= (uint64_t)1 << failed;
            *index = -1;
            const int32_t key = req->layer * c->n_expert + req->experts[failed];
            st = read_error(c, key, &c->slots[req->slot[failed]], err);
            break;
        }
        if (ready >= 0) {
            const clayer *ly = &c->layers[req->layer];
            const uint8_t *base = c->arena + c->slots[req->slot[ready]].base;
            for (int p = 0; p < ly->n_parts; p++) {
                const cpart *cp = &ly->part[p];
                const uint64_t off = cp->offset + (uint64_t)req->experts[ready] * cp->stride;
                req->data[ready][p] = base + cp->region_off + off % TR_IO_ALIGN;
            }
            req->handed |= (uint64_t)1 << ready;
            *index = ready;
            break;
        }
        /* nothing ready: the thread waits for a read, so the duel's shadows get this step now
         * instead of at the next layer's route. Their time counts as policy time; the part
         * before the first read landed meanwhile (that read then waited for the lock) was
         * spent waiting anyway and counts as hidden too */
        if (c->duel && !fed) {
            fed = true;
            atomic_store_explicit(&c->first_land_ns, 0, memory_order_relaxed);
            atomic_store_explicit(&c->feed_armed, true, memory_order_release);
            const uint64_t f0 = tr_now_ns();
            const bool work = tr_duel_feed_now(c->duel);
            const uint64_t f1 = tr_now_ns();
            atomic_store_explicit(&c->feed_armed, false, memory_order_relaxed);
            if (work) {
                const uint64_t land = atomic_load_explicit(&c->first_land_ns, memory_order_relaxed);
                c->st.policy_ns += f1 - f0;
                c->st.policy_hidden_ns += land == 0 ? f1 - f0 : land > f0 ? land - f0 : 0;
                continue; /* look again: a read may have landed */
            }
        }
        if (!t0) t0 = tr_now_ns();
        pthread_cond_wait(&c->cv, &c->mu);
    }
    if (t0) c->st.io_wait_ns += tr_now_ns() - t0;
    pthread_mutex_unlock(&c->mu);
    return st;
}

void tr_expert_cache_release(tr_expert_cache *c, tr_expert_request *req) {
    if (req->n <= 0) return;
    pthread_mutex_lock(&c->mu);
    const uint64_t t0 = tr_now_ns();
    for (int32_t i = 0; i < req->n; i++)
        entry_unpin(c, entry_of(c, req->layer * c->n_expert + req->experts[i]));
    c->st.policy_ns += tr_now_ns() - t0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    req->n = 0;
    req->handed = 0;
}

void tr_expert_cache_observe(tr_expert_cache *c, int32_t layer, const int32_t *experts,
                             const float *weights, int32_t n, const float *probs) {
    if (layer < 0 || layer >= c->n_layer || !c->layers[layer].n_parts || n < 0) return;
    const tr_policy_route_info info = {experts, weights, n, probs};
    pthread_mutex_lock(&c->mu);
    route(c, layer, &info);
    pthread_mutex_unlock(&c->mu);
}

uint64_t tr_expert_cache_prefetch_some(tr_expert_cache *c, int32_t layer, const int32_t *experts,
                                       int32_t n, uint64_t read) {
    if (layer < 0 || layer >= c->n_layer || !c->layers[layer].n_parts) return 0;
    if (n > 64) n = 64;
    uint64_t absent = 0;
    bool room = true;
    tr_io_job *first = NULL, *last = NULL;
    pthread_mutex_lock(&c->mu);
    for (int32_t i = 0; i < n; i++) {
        if (experts[i] < 0 || experts[i] >= c->n_expert) continue;
        const int32_t key = layer * c->n_expert + experts[i];
        centry *e = entry_of(c, key);
        if (e->slot >= 0) continue;
        absent |= (uint64_t)1 << i;
        if (!room || !(read >> i & 1)) continue;
        /* admitted without a lookup: a prefetch is not an access; the demand acquire that uses
         * it tells the policy */
        const int32_t s = slot_find(c, key);
        if (s < 0) { /* everything pinned or loading: no room without waiting */
            room = false;
            continue;
        }
        slot_load(c, s, key, &first, &last);
        e->prefetched = 1;
        c->st.prefetch_issued++;
    }
    pthread_mutex_unlock(&c->mu);
    tr_io_pool_submit(c->io, first, last);
    return absent;
}

void tr_expert_cache_prefetch(tr_expert_cache *c, int32_t layer, const int32_t *experts,
                              int32_t n) {
    for (int32_t i0 = 0; i0 < n; i0 += 64)
        tr_expert_cache_prefetch_some(c, layer, experts + i0, n - i0, ~(uint64_t)0);
}

void tr_expert_cache_protect(tr_expert_cache *c, int32_t layer, const int32_t *experts, int32_t n) {
    if (layer < 0 || layer >= c->n_layer || !c->layers[layer].n_parts || n < 0) return;
    pthread_mutex_lock(&c->mu);
    const uint64_t t0 = tr_now_ns();
    /* every class: an expert may sit in a larger class's slot */
    for (int q = 0; q < c->n_classes; q++)
        if (c->classes[q].pol) tr_policy_protect(c->classes[q].pol, layer, experts, n, NULL);
    c->st.policy_ns += tr_now_ns() - t0;
    pthread_mutex_unlock(&c->mu);
}

bool tr_expert_cache_is_resident(const tr_expert_cache *c, int32_t layer, int32_t expert) {
    if (layer < 0 || layer >= c->n_layer || expert < 0 || expert >= c->n_expert) return false;
    tr_expert_cache *m = (tr_expert_cache *)c; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    const uint8_t state = c->entries[layer * c->n_expert + expert].state;
    pthread_mutex_unlock(&m->mu);
    return state == E_READY || state == E_LOADING;
}

void tr_expert_cache_stats(const tr_expert_cache *c, tr_expert_stats *out) {
    tr_expert_cache *m = (tr_expert_cache *)c; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    *out = c->st;
    for (int q = 0; q < c->n_classes; q++)
        if (c->classes[q].pol) {
            tr_policy_stats ps;
            tr_policy_get_stats(c->classes[q].pol, &ps);
            out->protected_evictions += ps.protected_evictions;
        }
    pthread_mutex_unlock(&m->mu);
}
