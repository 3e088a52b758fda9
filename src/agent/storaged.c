/*
 * terrace-storaged: the storage agent of the tiered KV cache (protocol in src/kv/csd.h). Started
 * by the runtime with the shared region at descriptor 3 and the layers' segment files at 4, 5,
 * ...; it serves requests in order until QUIT or until the runtime goes (PR_SET_PDEATHSIG): row
 * requests on a thread of their own, so that the next layer's scoring runs while rows are read.
 * Or started by the user for a disk shared by several sessions: `--listen SOCKET` accepts
 * runtimes (--csd-socket SOCKET) and forks a process per connection at once, which receives the
 * same descriptors over the socket (with a deadline of its own, so an idle or broken client
 * delays nobody else) and serves that session the same way, until QUIT or until the connection
 * closes.
 *
 * Memory: its own buffers only, sized at start from the geometry and reported in the region
 * (mem_bytes): one layer's per-head scores for the context (n_head x n_ctx floats), its copy of
 * the key copies (reserved, filled as pages are first scored) and one layer's pages as read, one
 * chunk's aggregated scores and a staging area as large as the working set, where rows are read
 * and verified.
 *
 * Throttles (0: none) emulate a slower device: each chunk of scoring takes at least
 * max(bytes read / gbps, 2 x head_dim x heads x tokens / gflops), and each block sent to the host
 * at least its bytes / link_gbps (rows: max of the read and the link).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/io.h"
#include "core/pool.h"
#include "kv/csd.h"
#include "kv/score.h"
#include "tensor/kernels.h"

struct jobset {
    tr_io_job *jobs;
    int64_t pending;
    int failed; /* first failure, in msg */
    char msg[TR_CSD_MSG];
};

/* Row requests of the two areas (the two halves of the working set: a chunked selection, or
 * two layers' selections with --kv-spec) are served at once, each on its own thread, so the
 * second one's reads queue behind the first's instead of waiting for its last one */
struct rows_area {
    struct jobset io;
    const uint64_t *hashes;
    /* the request's runs, copied out of the shared region once checked (a read's completion
     * addresses memory by them), each with its part; and per read its first run (read j covers
     * runs job_run0[j] .. job_run0[j + 1] - 1; one entry past the last read) */
    tr_csd_run *runs;
    uint8_t *run_part;
    int32_t *job_run0;
    /* joined reads land here: runs a few records apart are read as one span, gap included,
     * and only the runs cross to the working set */
    uint8_t *bounce;
    size_t bounce_bytes;
    int32_t n_parts, part_end[TR_CSD_PARTS]; /* the request's parts: slot ends ... */
    int64_t part_pending[TR_CSD_PARTS];      /* ... reads outstanding (under mu) */
    tr_csd_req *req; /* the request served (NULL: idle), under mu */
    uint64_t seq;
    pthread_t th;
    struct agent *g;
};

typedef struct agent {
    tr_csd_ctl *c;
    uint8_t *base;
    const tr_kernels *kern;
    float *hs;      /* [n_head][n_ctx] this request's scores, then exponentials */
    size_t pregion; /* bytes of one page's key copy + trailer */
    size_t pstride; /* pregion rounded up to 4 KiB (O_DIRECT) */
    /* the agent's own copy of the key copies (its "device DRAM"): every page it has read and
     * verified once, rearranged as the host keeps them, [layer][KV head][position] rows of qrow
     * bytes, so each head's keys are one stream for the row kernel (in the pages' own order,
     * [position][KV head], a head's rows are nkv rows apart and scoring took twice as long);
     * reserved, filled as pages are first scored */
    uint8_t *keys;
    uint8_t *raw; /* [page] at pstride: one layer's pages as read, until verified */
    uint8_t *loaded; /* [layer][page] */
    int32_t n_pages;
    float *tmp;     /* [chunk] */
    int32_t a, b;   /* the range scored last */
    int32_t layer;
    tr_pool *pool;  /* scoring */
    tr_io_pool *io; /* storage reads */
    /* reads in flight, counted under mu: a SCORE's key pages ([n_pages] jobs) on the serving
     * thread, and each row area's request ([ws_cap] jobs) on that area's thread */
    struct jobset keys_io;
    struct rows_area area[TR_CSD_AREAS];
    bool rows_quit;
    uint64_t rows_clock; /* throttled: when the device and link are free again (under mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv, rows_cv;
    int32_t *iota; /* [n_ctx]: 0, 1, ... (the positions, as row indices) */
    /* rows land here first, the device's own DRAM, then cross to the working set in the shared
     * region (the link transfer). O_DIRECT reads into shmem's 4 KiB pages cost more per read
     * than into anonymous memory on 2 MiB pages, and shmem gets no transparent huge pages by
     * default (shmem_enabled = never). Measured at 8K (0.76 GiB of rows a step): the agent's
     * I/O wait went from 596-636 to 477-493 ms with this area; the host's own reads, with its
     * working set moved into a shared mapping as a test, went from 461-473 to 539-564 ms */
    uint8_t *stage;
    size_t stage_bytes;
} agent;

/* a KV head's key rows of a layer */
static uint8_t *head_keys(const agent *g, int32_t layer, int32_t kh) {
    const tr_csd_ctl *c = g->c;
    return g->keys + ((size_t)layer * (size_t)c->n_head_kv + (size_t)kh) * (size_t)c->n_ctx * c->qrow;
}

static void pace(uint64_t t0, double seconds) {
    if (seconds < 0) return;
    const uint64_t want = t0 + (uint64_t)(seconds * 1e9), now = tr_now_ns();
    if (want <= now) return;
    const uint64_t d = want - now;
    struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

static double rate_time(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e9) : 0; }

static int fail(tr_csd_req *r, tr_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(tr_csd_req *r, tr_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    r->status = (int32_t)st;
    return -1;
}

/* where position pos's record is in its layer's segment file */
static uint64_t run_offset(const tr_csd_ctl *c, int32_t pos) {
    return c->data_off + (uint64_t)(pos / c->page_tokens) * c->page_bytes +
           (uint64_t)(pos % c->page_tokens) * c->rec;
}

/* the row area a run's read belongs to: its job is in that area's array */
static struct rows_area *area_of(agent *g, const tr_io_job *j) {
    for (int a = 0; a + 1 < TR_CSD_AREAS; a++)
        if (j >= g->area[a].io.jobs && j < g->area[a].io.jobs + g->c->ws_cap) return &g->area[a];
    return &g->area[TR_CSD_AREAS - 1];
}

/* a storage read finished (on an I/O thread): verify it */
static void io_done(void *ctx, tr_io_job *j) {
    agent *g = ctx;
    const tr_csd_ctl *c = g->c;
    char msg[TR_CSD_MSG] = "";
    const int32_t layer = (int32_t)(j->owner >> 24), P = c->page_tokens;
    atomic_fetch_add(&g->c->bytes_storage, j->got);
    struct rows_area *ar = j->sub == UINT32_MAX ? NULL : area_of(g, j); /* NULL: a key copy */
    const size_t ji = ar ? (size_t)(j - ar->io.jobs) : 0;
    if (j->err || j->got < j->need) {
        snprintf(msg, sizeof msg, "reading layer %d at byte %llu failed: %s", layer,
                 (unsigned long long)j->offset, j->err ? strerror(j->err) : "short read");
    } else if (!ar) { /* a page's key copy and trailer */
        const int32_t page = (int32_t)(j->owner & 0xffffff);
        if (!tr_kv_key_copy_ok(j->dst, c->page_toff - c->page_qoff, layer, page)) {
            snprintf(msg, sizeof msg,
                     "checksum mismatch in the key copy of layer %d, page %d: the file was "
                     "changed or the storage is failing",
                     layer, page);
        } else { /* [position][KV head] -> [KV head][position] */
            const int32_t nkv = c->n_head_kv;
            for (int32_t kh = 0; kh < nkv; kh++)
                for (int32_t i = 0; i < P && page * P + i < c->n_ctx; i++)
                    memcpy(head_keys(g, layer, kh) + ((size_t)page * P + (size_t)i) * c->qrow,
                           (const uint8_t *)j->dst + ((size_t)i * nkv + (size_t)kh) * c->qrow,
                           c->qrow);
            g->loaded[(size_t)layer * (size_t)g->n_pages + (size_t)page] = 1;
        }
    } else { /* runs of records: the job's index in its area says which */
        for (int32_t q = ar->job_run0[ji]; q < ar->job_run0[ji + 1] && !msg[0]; q++) {
            const tr_csd_run *u = &ar->runs[q];
            const uint8_t *src = (const uint8_t *)j->dst + (run_offset(c, u->pos) - j->offset);
            for (int32_t k = 0; k < u->n && !msg[0]; k++)
                if (tr_kv_hash64(src + (size_t)k * c->rec, c->rec, 0) !=
                    ar->hashes[u->hash0 + k])
                    snprintf(msg, sizeof msg,
                             "checksum mismatch in layer %d, page %d (position %d): the file "
                             "was changed or the storage is failing",
                             layer, (u->pos + k) / P, u->pos + k);
            /* verified: across to the working set, while the records are still in this
             * core's cache from the hash */
            if (!msg[0])
                memcpy(g->base + c->off_ws + (size_t)u->slot * c->rec, src,
                       (size_t)u->n * c->rec);
        }
    }
    const int part = ar ? ar->run_part[ar->job_run0[ji]] : -1; /* a read's part: its runs' */
    struct jobset *js = ar ? &ar->io : &g->keys_io;
    pthread_mutex_lock(&g->mu);
    if (msg[0] && !js->failed) {
        js->failed = 1;
        memcpy(js->msg, msg, sizeof msg);
    }
    const bool part_done = part >= 0 && --ar->part_pending[part] == 0;
    if (--js->pending == 0 || part_done || msg[0]) pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void submit_jobs(agent *g, struct jobset *js, int32_t n) {
    pthread_mutex_lock(&g->mu);
    js->failed = 0;
    js->pending = n;
    pthread_mutex_unlock(&g->mu);
    for (int32_t i = 0; i + 1 < n; i++) js->jobs[i].next = &js->jobs[i + 1];
    js->jobs[n - 1].next = NULL;
    tr_io_pool_submit(g->io, &js->jobs[0], &js->jobs[n - 1]);
}

/* every submitted read of the set done (they write into our buffers) */
static void wait_jobs(agent *g, struct jobset *js) {
    pthread_mutex_lock(&g->mu);
    while (js->pending > 0) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static int run_jobs(agent *g, struct jobset *js, tr_csd_req *r, int32_t n) {
    if (!n) return 0;
    submit_jobs(g, js, n);
    wait_jobs(g, js);
    if (js->failed) return fail(r, TR_E_IO, "%s", js->msg);
    return 0;
}

typedef struct score_ctx {
    agent *g;
    const tr_csd_req *r;
    atomic_int_fast64_t next;
    int32_t n;
} score_ctx;

static void score_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_ctx *s = ctx;
    agent *g = s->g;
    const tr_csd_ctl *c = g->c;
    const tr_csd_req *r = s->r;
    const int32_t nh = c->n_head, nkv = c->n_head_kv, G = nh / nkv, pad = c->hdk_pad;
    const int32_t a = r->a, n = r->b - r->a;
    const uint8_t *q8 = g->base + c->off_q8;
    enum { CHUNK = 256 };
    float v[CHUNK];
    int64_t b, e;
    /* the same row kernel on the same layout as the host's scoring (kv_score.c), so the scores
     * are bit-identical */
    while (tr_claim(&s->next, n, CHUNK, &b, &e))
        for (int32_t kh = 0; kh < nkv; kh++)
            for (int32_t h = kh * G; h < (kh + 1) * G; h++) {
                tr_dot_rows(g->kern, (tr_type)c->qtype, pad, e - b, v,
                            head_keys(g, r->layer, kh), c->qrow, g->iota + a + b,
                            q8 + (size_t)h * c->q8row);
                float *hs = g->hs + (size_t)h * (size_t)n;
                for (int64_t i = b; i < e; i++) hs[i] = v[i - b] * r->scale;
            }
}

/* per head: the max and the sum of exponentials (the scores replaced by them), on every
 * scoring thread */
static void stats_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    score_ctx *s = ctx;
    agent *g = s->g;
    const tr_csd_ctl *c = g->c;
    const int32_t nh = c->n_head;
    float *m = (float *)(g->base + c->off_stats);
    double *z = (double *)(g->base + c->off_stats + (uint64_t)nh * 4);
    int64_t b, e;
    while (tr_claim(&s->next, nh, 1, &b, &e))
        tr_kv_group_stats(g->hs + (size_t)b * (size_t)s->n, s->n, &m[b], &z[b]);
}

static int do_score(agent *g, tr_csd_req *r) {
    const tr_csd_ctl *c = g->c;
    const int32_t nh = c->n_head, pad = c->hdk_pad;
    const int32_t a = r->a, b = r->b, n = b - a, P = c->page_tokens;
    if (r->layer < 0 || r->layer >= c->n_layer || a < 0 || b > c->n_ctx || n <= 0)
        return fail(r, TR_E_ARG, "score request: layer %d, positions [%d, %d)", r->layer, a, b);
    const uint64_t t0 = tr_now_ns();
    if (r->inval_from >= 0 && r->inval_from < g->n_pages) /* rewritten since: read them again */
        memset(g->loaded + (size_t)r->layer * (size_t)g->n_pages + (size_t)r->inval_from, 0,
               (size_t)(g->n_pages - r->inval_from));
    /* pages not read yet come from storage, all in flight together, verified on arrival */
    int32_t nj = 0;
    uint64_t bytes = 0;
    for (int32_t pg = a / P; pg <= (b - 1) / P; pg++) {
        if (g->loaded[(size_t)r->layer * (size_t)g->n_pages + (size_t)pg]) continue;
        g->keys_io.jobs[nj++] = (tr_io_job){
            .fd = TR_CSD_FD_LAYER + r->layer,
            .direct = c->direct != 0,
            .offset = c->data_off + (uint64_t)pg * c->page_bytes + c->page_qoff,
            .len = g->pregion,
            .need = g->pregion,
            .dst = g->raw + (size_t)pg * g->pstride,
            .owner = ((uint32_t)r->layer << 24) | (uint32_t)pg,
            .sub = UINT32_MAX};
        bytes += g->pregion;
    }
    if (run_jobs(g, &g->keys_io, r, nj)) return -1;
    score_ctx sc = {.g = g, .r = r, .n = n};
    atomic_init(&sc.next, 0);
    tr_pool_run(g->pool, score_task, &sc);
    const double flops = 2.0 * pad * nh * (double)n;
    pace(t0, fmax(rate_time((double)bytes, c->gbps), c->gflops > 0 ? flops / (c->gflops * 1e9) : 0));
    atomic_store(&sc.next, 0);
    tr_pool_run(g->pool, stats_task, &sc);
    atomic_fetch_add(&g->c->bytes_scores, (uint64_t)nh * 12);
    atomic_fetch_add(&g->c->busy_ns, tr_now_ns() - t0);
    atomic_fetch_add(&g->c->score_ns, tr_now_ns() - t0);
    g->a = a;
    g->b = b;
    g->layer = r->layer;
    return 0;
}

static int do_finish(agent *g, tr_csd_req *r) {
    tr_csd_ctl *c = g->c;
    if (r->a != g->a || r->b != g->b || r->layer != g->layer)
        return fail(r, TR_E_ARG, "finish request for layer %d [%d, %d) after scoring layer %d "
                    "[%d, %d)", r->layer, r->a, r->b, g->layer, g->a, g->b);
    const int32_t n = g->b - g->a, nh = c->n_head;
    const float *cf = (const float *)(g->base + c->off_c);
    tr_csd_entry *e = (tr_csd_entry *)(g->base + c->off_scores);
    for (int32_t i0 = 0; i0 < n; i0 += c->chunk) {
        const uint64_t t0 = tr_now_ns();
        const int32_t i1 = i0 + c->chunk < n ? i0 + c->chunk : n;
        tr_kv_group_score(g->hs, (size_t)n, nh, cf, 1, i0, i1, g->tmp - i0);
        for (int32_t i = i0; i < i1; i++)
            e[i] = (tr_csd_entry){.pos = (uint32_t)(g->a + i), .score = g->tmp[i - i0]};
        const uint64_t bytes = (uint64_t)(i1 - i0) * sizeof(tr_csd_entry);
        pace(t0, rate_time((double)bytes, c->link_gbps));
        atomic_fetch_add(&c->bytes_scores, bytes);
        atomic_fetch_add(&c->busy_ns, tr_now_ns() - t0);
        atomic_fetch_add(&c->score_ns, tr_now_ns() - t0);
        /* publish the block, then wake the host under the lock (no lost wakeup) */
        atomic_store(&c->produced, (int64_t)i1);
        pthread_mutex_lock(&c->mu);
        pthread_cond_broadcast(&c->to_host);
        pthread_mutex_unlock(&c->mu);
    }
    return 0;
}

static int do_rows(struct rows_area *ar, tr_csd_req *r) {
    agent *g = ar->g;
    tr_csd_ctl *c = g->c;
    if (r->layer < 0 || r->layer >= c->n_layer || r->which < 0 || r->which >= TR_CSD_AREAS || r->n_runs < 0 ||
        r->n_runs > c->ws_cap || r->n_parts < 1 || r->n_parts > TR_CSD_PARTS)
        return fail(r, TR_E_ARG, "rows request: layer %d, %d runs in %d parts", r->layer,
                    r->n_runs, r->n_parts);
    for (int32_t p = 0; p < r->n_parts; p++)
        if (r->part_end[p] < (p ? r->part_end[p - 1] : 0) || r->part_end[p] > c->ws_cap)
            return fail(r, TR_E_ARG, "rows request: part %d ends at slot %d", p, r->part_end[p]);
    if (r->read_gap < 0 || r->read_gap > c->page_tokens)
        return fail(r, TR_E_ARG, "rows request: read gap %d", r->read_gap);
    const tr_csd_run *runs = (const tr_csd_run *)(g->base + c->off_runs[r->which]);
    ar->hashes = (const uint64_t *)(g->base + c->off_hashes[r->which]);
    const uint64_t t0 = tr_now_ns();
    /* link: the runs' bytes; storage: the reads' (gaps included) */
    uint64_t bytes = 0, part_bytes[TR_CSD_PARTS] = {0}, part_sbytes[TR_CSD_PARTS] = {0};
    const int32_t P = c->page_tokens;
    ar->n_parts = r->n_parts;
    memcpy(ar->part_end, r->part_end, sizeof ar->part_end);
    memset(ar->part_pending, 0, sizeof ar->part_pending);
    for (int32_t i = 0, p = 0; i < r->n_runs; i++) {
        const tr_csd_run u = runs[i]; /* once: the host could change the region meanwhile */
        if (u.n < 1 || u.slot < 0 || u.slot + u.n > c->ws_cap || u.pos < 0 ||
            u.pos + u.n > c->n_ctx || (u.pos % P) + u.n > P || u.hash0 < 0 ||
            u.hash0 + u.n > c->ws_cap || (i && u.slot < ar->runs[i - 1].slot))
            return fail(r, TR_E_ARG, "rows request: run %d (%d tokens at %d)", i, u.n, u.pos);
        while (p + 1 < r->n_parts && u.slot >= r->part_end[p]) p++;
        if (u.slot + u.n > r->part_end[p] && p + 1 < r->n_parts)
            return fail(r, TR_E_ARG, "rows request: run %d crosses the end of part %d", i, p);
        ar->runs[i] = u;
        ar->run_part[i] = (uint8_t)p;
    }
    /* the reads: a run, or runs of one part whose records lie at most read_gap records' bytes
     * apart in the file (a page's key copy counts as the bytes it takes), read as one span into
     * the bounce area while it has room. On the bench's disk a read costs about as much as 37 KiB
     * more transfer (fio, bench/results/kv.md): joining across a record's gap trades 16 KiB of
     * storage traffic, which never crosses the link, for a read. At 32K the step with gap 1 was
     * between 1 % slower and 3 % faster than with gap 0 in paired runs while the disk held
     * steady; its own swings are larger (bench/results/kv.md). */
    const uint64_t gap_max = (uint64_t)r->read_gap * c->rec, align = c->direct ? TR_IO_ALIGN : 1;
    size_t used = 0;
    int32_t nj = 0;
    for (int32_t i = 0, k; i < r->n_runs; i = k) {
        const tr_csd_run *u = &ar->runs[i];
        const uint64_t off = run_offset(c, u->pos);
        uint64_t end = off + (uint64_t)u->n * c->rec;
        for (k = i + 1; k < r->n_runs && ar->run_part[k] == ar->run_part[i]; k++) {
            const uint64_t o = run_offset(c, ar->runs[k].pos);
            const uint64_t e = o + (uint64_t)ar->runs[k].n * c->rec;
            if (o < end || o - end > gap_max || e - off > TR_CSD_JOIN_MAX ||
                used + (e - off) > ar->bounce_bytes)
                break;
            end = e;
        }
        uint8_t *dst = g->stage + (size_t)u->slot * c->rec;
        if (k - i > 1) {
            dst = ar->bounce + used;
            used += (size_t)((end - off + align - 1) / align * align);
        }
        ar->io.jobs[nj] = (tr_io_job){.fd = TR_CSD_FD_LAYER + r->layer,
                                      .direct = c->direct != 0,
                                      .offset = off,
                                      .len = end - off,
                                      .need = end - off,
                                      .dst = dst,
                                      .owner = ((uint32_t)r->layer << 24) | (uint32_t)u->pos};
        ar->job_run0[nj++] = i;
        const int p = ar->run_part[i];
        ar->part_pending[p]++;
        part_sbytes[p] += end - off;
        for (int32_t q = i; q < k; q++) {
            part_bytes[p] += (uint64_t)ar->runs[q].n * c->rec;
            bytes += (uint64_t)ar->runs[q].n * c->rec;
        }
    }
    ar->job_run0[nj] = r->n_runs;
    atomic_store(&c->rows_reads[r->which], nj);
    struct jobset *js = &ar->io;
    if (nj) submit_jobs(g, js, nj);
    /* publish the parts in order, each once its reads are in, verified and across (and, when
     * throttled, not before the device and the link could have delivered them) */
    for (int32_t p = 0; p < r->n_parts; p++) {
        pthread_mutex_lock(&g->mu);
        while (ar->part_pending[p] > 0 && !js->failed) pthread_cond_wait(&g->cv, &g->mu);
        const int failed = js->failed;
        /* one device and one link serve both areas: a part is due once the ones published
         * before it, of either area, and its own bytes could have gone through */
        uint64_t due = 0;
        if (!failed && (c->gbps > 0 || c->link_gbps > 0)) {
            const double dt = fmax(rate_time((double)part_sbytes[p], c->gbps),
                                   rate_time((double)part_bytes[p], c->link_gbps));
            const uint64_t from = g->rows_clock > t0 ? g->rows_clock : t0;
            g->rows_clock = due = from + (uint64_t)(dt * 1e9);
        }
        pthread_mutex_unlock(&g->mu);
        if (failed) break;
        if (due) pace(due, 0.0);
        atomic_store(&c->rows_parts[r->which], p + 1);
        pthread_mutex_lock(&c->mu);
        pthread_cond_broadcast(&c->to_host);
        pthread_mutex_unlock(&c->mu);
    }
    wait_jobs(g, js); /* before the request completes */
    ar->n_parts = 0;
    if (js->failed) return fail(r, TR_E_IO, "%s", js->msg);
    atomic_fetch_add(&c->bytes_rows, bytes);
    atomic_fetch_add(&c->busy_ns, tr_now_ns() - t0);
    atomic_fetch_add(&c->rows_ns, tr_now_ns() - t0);
    return 0;
}

/* request seq (taken as ring slot (seq - 1) % RING) is complete: mark it, and move completed
 * past every request complete in order (the host reuses those slots) */
static void complete(tr_csd_ctl *c, tr_csd_req *r, uint64_t seq) {
    if (pthread_mutex_lock(&c->mu) == EOWNERDEAD) pthread_mutex_consistent(&c->mu);
    r->done = seq;
    while (c->completed < c->taken &&
           c->ring[c->completed % TR_CSD_RING].done == c->completed + 1)
        c->completed++;
    pthread_cond_broadcast(&c->to_host);
    pthread_mutex_unlock(&c->mu);
}

/* a row area's thread: its requests one after another, while the serving thread goes on */
static void *rows_main(void *arg) {
    struct rows_area *ar = arg;
    agent *g = ar->g;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!ar->req && !g->rows_quit) pthread_cond_wait(&g->rows_cv, &g->mu);
        tr_csd_req *r = ar->req;
        const uint64_t seq = ar->seq;
        pthread_mutex_unlock(&g->mu);
        if (!r) return NULL;
        do_rows(ar, r);
        pthread_mutex_lock(&g->mu);
        ar->req = NULL;
        pthread_cond_broadcast(&g->rows_cv);
        pthread_mutex_unlock(&g->mu);
        complete(g->c, r, seq);
    }
}

/* the row area's thread (every one's: NULL) has finished its request */
static void rows_idle(agent *g, struct rows_area *only) {
    pthread_mutex_lock(&g->mu);
    for (int a = 0; a < TR_CSD_AREAS; a++)
        while ((!only || only == &g->area[a]) && g->area[a].req)
            pthread_cond_wait(&g->rows_cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* whether the runtime we serve is still there: our parent, or the other end of the connection */
static bool host_alive(pid_t host, int sock) {
    return sock < 0 ? getppid() == host : !tr_csd_sock_closed(sock);
}

/* serves the region at descriptor 3 until QUIT or until the runtime goes */
static int serve(pid_t host, int sock) {
    tr_csd_ctl probe;
    if (pread(TR_CSD_FD_SHM, &probe, sizeof probe, 0) != (ssize_t)sizeof probe ||
        probe.magic != TR_CSD_MAGIC || probe.version != TR_CSD_VERSION) {
        fprintf(stderr, "terrace-storaged: descriptor %d is not a terrace KV region\n",
                TR_CSD_FD_SHM);
        return 2;
    }
    /* the geometry every size below is computed from (a user-started agent serves whatever
     * connects) */
    if (probe.n_layer < 1 || probe.n_ctx < 1 || probe.n_head < 1 || probe.n_head_kv < 1 ||
        probe.n_head % probe.n_head_kv || probe.page_tokens < 1 || probe.chunk < 1 ||
        probe.ws_cap < 0 || !probe.rec || !probe.qrow || probe.page_bytes <= probe.page_qoff) {
        fprintf(stderr, "terrace-storaged: the KV region at descriptor %d has an impossible "
                "geometry (%d layers, %d positions, %d/%d heads, pages of %d)\n", TR_CSD_FD_SHM,
                probe.n_layer, probe.n_ctx, probe.n_head, probe.n_head_kv, probe.page_tokens);
        return 2;
    }
    void *m = mmap(NULL, probe.total, PROT_READ | PROT_WRITE, MAP_SHARED, TR_CSD_FD_SHM, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "terrace-storaged: mapping the region: %s\n", strerror(errno));
        return 2;
    }
    agent g = {.c = m, .base = m, .kern = tr_kernels_best(), .layer = -1};
    tr_csd_ctl *c = g.c;
    g.pregion = (size_t)(c->page_bytes - c->page_qoff);
    g.pstride = (g.pregion + 4095) / 4096 * 4096;
    g.n_pages = (c->n_ctx + c->page_tokens - 1) / c->page_tokens;
    const size_t hs_bytes = (size_t)c->n_head * (size_t)c->n_ctx * 4;
    const size_t keys_bytes = (size_t)c->n_layer * (size_t)c->n_head_kv * (size_t)c->n_ctx * c->qrow;
    const size_t raw_bytes = (size_t)g.n_pages * g.pstride;
    g.hs = malloc(hs_bytes);
    g.tmp = malloc((size_t)c->chunk * 4);
    g.loaded = calloc((size_t)c->n_layer * (size_t)g.n_pages, 1);
    g.keys_io.jobs = calloc((size_t)g.n_pages, sizeof(tr_io_job));
    bool areas_ok = true;
    g.stage_bytes = ((size_t)c->ws_cap * (size_t)c->rec + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    for (int a = 0; a < TR_CSD_AREAS; a++) {
        struct rows_area *ar = &g.area[a];
        const size_t n = (size_t)(c->ws_cap > 0 ? c->ws_cap : 1);
        ar->g = &g;
        ar->io.jobs = calloc(n, sizeof(tr_io_job));
        ar->runs = calloc(n, sizeof(tr_csd_run));
        ar->run_part = calloc(n, 1);
        ar->job_run0 = calloc(n + 1, sizeof(int32_t));
        /* as large as the staging area: a request's runs with their gaps (joins stop when it is
         * full) */
        ar->bounce_bytes = g.stage_bytes;
        ar->bounce = mmap(NULL, ar->bounce_bytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
#ifdef MADV_HUGEPAGE
        if (ar->bounce != MAP_FAILED) madvise(ar->bounce, ar->bounce_bytes, MADV_HUGEPAGE);
#endif
        areas_ok = areas_ok && ar->io.jobs && ar->runs && ar->run_part && ar->job_run0 &&
                   ar->bounce != MAP_FAILED;
    }
    g.iota = malloc((size_t)c->n_ctx * sizeof *g.iota);
    for (int32_t t = 0; g.iota && t < c->n_ctx; t++) g.iota[t] = t;
    g.raw = mmap(NULL, raw_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    /* reserved, not committed: memory grows with the pages scored */
    g.keys = mmap(NULL, keys_bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    g.stage = mmap(NULL, g.stage_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
#ifdef MADV_HUGEPAGE
    if (g.stage != MAP_FAILED) madvise(g.stage, g.stage_bytes, MADV_HUGEPAGE); /* advice only */
#endif
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    tr_error err = {0};
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    pthread_cond_init(&g.rows_cv, NULL);
    if (!g.hs || !g.tmp || !g.loaded || !g.keys_io.jobs || !areas_ok || !g.iota ||
        g.keys == MAP_FAILED ||
        g.raw == MAP_FAILED || g.stage == MAP_FAILED ||
        tr_pool_create(ncpu > 0 ? (int)ncpu : 1, &g.pool, &err) ||
        tr_io_pool_create(64, io_done, &g, &g.io, &err) ||
        pthread_create(&g.area[0].th, NULL, rows_main, &g.area[0]) ||
        pthread_create(&g.area[1].th, NULL, rows_main, &g.area[1])) {
        fprintf(stderr, "terrace-storaged: out of memory or threads %s\n", err.msg);
        return 2;
    }
    atomic_store(&c->mem_bytes,
                 tr_csd_agent_bytes(c->n_layer, c->n_ctx, c->n_head, c->n_head_kv, c->page_tokens,
                                    c->chunk, c->ws_cap, c->rec, c->qrow, c->page_bytes,
                                    c->page_qoff));
    atomic_store(&c->agent_pid, (int32_t)getpid());
    atomic_store(&c->ready, 1);
    for (;;) {
        if (pthread_mutex_lock(&c->mu) == EOWNERDEAD) pthread_mutex_consistent(&c->mu);
        while (c->taken == c->posted) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += 1;
            if (pthread_cond_timedwait(&c->to_agent, &c->mu, &ts) == EOWNERDEAD)
                pthread_mutex_consistent(&c->mu);
            if (!host_alive(host, sock)) _exit(0); /* the runtime is gone */
        }
        tr_csd_req *r = &c->ring[c->taken % TR_CSD_RING];
        const uint64_t seq = ++c->taken;
        pthread_mutex_unlock(&c->mu);
        const int op = r->op;
        if (op == TR_CSD_OP_ROWS && r->which >= 0 && r->which < TR_CSD_AREAS) {
            /* to its area's thread, once that has finished its last request */
            struct rows_area *ar = &g.area[r->which];
            rows_idle(&g, ar);
            pthread_mutex_lock(&g.mu);
            ar->req = r;
            ar->seq = seq;
            pthread_cond_broadcast(&g.rows_cv);
            pthread_mutex_unlock(&g.mu);
            continue;
        }
        if (op == TR_CSD_OP_SCORE)
            do_score(&g, r);
        else if (op == TR_CSD_OP_FINISH)
            do_finish(&g, r);
        else if (op == TR_CSD_OP_QUIT)
            rows_idle(&g, NULL);
        else if (op == TR_CSD_OP_ROWS)
            fail(r, TR_E_ARG, "rows request: area %d of %d", r->which, TR_CSD_AREAS);
        else
            fail(r, TR_E_ARG, "unknown request %d", op);
        complete(c, r, seq);
        if (op == TR_CSD_OP_QUIT) break;
    }
    pthread_mutex_lock(&g.mu);
    g.rows_quit = true;
    pthread_cond_broadcast(&g.rows_cv);
    pthread_mutex_unlock(&g.mu);
    for (int a = 0; a < TR_CSD_AREAS; a++) pthread_join(g.area[a].th, NULL);
    tr_io_pool_free(g.io);
    tr_pool_free(g.pool);
    munmap(g.keys, keys_bytes);
    munmap(g.raw, raw_bytes);
    munmap(g.stage, g.stage_bytes);
    free(g.hs);
    free(g.tmp);
    free(g.loaded);
    free(g.keys_io.jobs);
    for (int a = 0; a < TR_CSD_AREAS; a++) {
        struct rows_area *ar = &g.area[a];
        free(ar->io.jobs);
        free(ar->runs);
        free(ar->run_part);
        free(ar->job_run0);
        munmap(ar->bounce, ar->bounce_bytes);
    }
    free(g.iota);
    munmap(m, probe.total);
    return 0;
}

/* ---- the user-started agent ------------------------------------------------------------------- */

static const char *g_listen_path;

static void on_signal(int sig) {
    (void)sig;
    if (g_listen_path) unlink(g_listen_path);
    _exit(0);
}

/* one runtime's hello and descriptors (several messages when there are many layers) */
static int receive_session(int cs, tr_csd_hello *h, int **fds_out) {
    *fds_out = NULL;
    int *fds = NULL, got = 0, want = -1;
    for (;;) {
        union {
            char buf[CMSG_SPACE(sizeof(int) * TR_CSD_FD_BATCH)];
            struct cmsghdr align;
        } cb;
        char one;
        struct iovec iov = {.iov_base = want < 0 ? (void *)h : (void *)&one,
                            .iov_len = want < 0 ? sizeof *h : 1};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.buf,
                           .msg_controllen = sizeof cb.buf};
        const ssize_t r = recvmsg(cs, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
        if (r != (ssize_t)iov.iov_len) goto bad;
        if (want < 0) {
            if (h->magic != TR_CSD_HELLO_MAGIC || h->version != TR_CSD_VERSION || h->n_fd < 2 ||
                h->n_fd > 1 + 65536)
                goto bad;
            want = h->n_fd;
            if (!(fds = malloc(sizeof(int) * (size_t)want))) goto bad;
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
            const int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            int tmp[TR_CSD_FD_BATCH];
            memcpy(tmp, CMSG_DATA(cm), sizeof(int) * (size_t)(n < TR_CSD_FD_BATCH ? n : 0));
            for (int i = 0; i < n && i < TR_CSD_FD_BATCH; i++) {
                if (got < want) fds[got++] = tmp[i];
                else close(tmp[i]);
            }
        }
        if (m.msg_flags & MSG_CTRUNC) goto bad;
        if (got == want) break;
    }
    *fds_out = fds;
    return 0;
bad:
    for (int i = 0; i < got; i++) close(fds[i]);
    free(fds);
    return -1;
}

/* one connection, in a process of its own: the hello and the descriptors (a runtime that sends
 * nothing, or junk, is dropped after HANDSHAKE_S), then the session */
#define HANDSHAKE_S 5
static int serve_connection(int cs) {
    const struct timeval tv = {.tv_sec = HANDSHAKE_S};
    setsockopt(cs, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    tr_csd_hello h;
    int *fds;
    if (receive_session(cs, &h, &fds)) {
        fprintf(stderr, "terrace-storaged: a connection without a valid terrace KV session "
                        "(version %d expected) was closed\n", TR_CSD_VERSION);
        close(cs);
        return 2;
    }
    fprintf(stderr, "terrace-storaged: serving runtime pid %d (%d layers) in pid %d\n",
            (int)h.host_pid, h.n_fd - 1, (int)getpid());
    /* the session's descriptors at 3, 4, ... (through copies above that range, as the runtime
     * does for its own child); the connection above them too */
    const int hi = TR_CSD_FD_SHM + h.n_fd + 16;
    const int sock = fcntl(cs, F_DUPFD_CLOEXEC, hi);
    close(cs);
    for (int i = 0; i < h.n_fd; i++) {
        const int t = fcntl(fds[i], F_DUPFD_CLOEXEC, hi);
        close(fds[i]);
        fds[i] = t;
    }
    for (int i = 0; i < h.n_fd; i++) {
        if (fds[i] < 0 || dup2(fds[i], TR_CSD_FD_SHM + i) < 0) return 2;
        close(fds[i]);
    }
    free(fds);
    return sock < 0 ? 2 : serve((pid_t)h.host_pid, sock);
}

static int listen_main(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        fprintf(stderr, "terrace-storaged: --listen %s: a socket path has at most %zu bytes\n",
                path, sizeof a.sun_path - 1);
        return 2;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    const int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (ls < 0) {
        fprintf(stderr, "terrace-storaged: socket: %s\n", strerror(errno));
        return 2;
    }
    int rc = bind(ls, (const struct sockaddr *)&a, sizeof a);
    if (rc && errno == EADDRINUSE) {
        /* a socket file left by an agent that is gone is reused; a live one is not */
        const int t = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const bool live = t >= 0 && connect(t, (const struct sockaddr *)&a, sizeof a) == 0;
        if (t >= 0) close(t);
        if (live) {
            fprintf(stderr, "terrace-storaged: another agent listens on %s\n", path);
            return 2;
        }
        unlink(path);
        rc = bind(ls, (const struct sockaddr *)&a, sizeof a);
    }
    if (rc || listen(ls, 16)) {
        fprintf(stderr, "terrace-storaged: cannot listen on %s: %s\n", path, strerror(errno));
        return 2;
    }
    g_listen_path = path;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGCHLD, SIG_IGN); /* the session processes are reaped as they end */
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "terrace-storaged: listening on %s (pid %d); runtimes connect with "
                    "--csd --csd-socket %s\n", path, (int)getpid(), path);
    for (;;) {
        const int cs = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (cs < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            fprintf(stderr, "terrace-storaged: accept on %s: %s\n", path, strerror(errno));
            unlink(path);
            return 1;
        }
        /* each connection gets its process before anything is read from it: the handshake is
         * that process's, so an idle or broken client never holds up the next one */
        const pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "terrace-storaged: fork for a connection: %s\n", strerror(errno));
            close(cs);
            continue;
        }
        if (pid == 0) {
            close(ls);
            g_listen_path = NULL;
            signal(SIGCHLD, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            _exit(serve_connection(cs));
        }
        close(cs);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--listen")) return listen_main(argv[2]);
    pid_t host = 0;
    if (argc == 3 && !strcmp(argv[1], "--host-pid")) host = (pid_t)atoi(argv[2]);
    if (host <= 0) {
        fprintf(stderr,
                "terrace-storaged: the KV cache's storage agent. The runtime starts it (terrace "
                "... --kv-policy tiered --kv-cold DIR --csd), or start it yourself for a disk "
                "that several sessions share:\n  terrace-storaged --listen SOCKET\nand give the "
                "runtimes --csd --csd-socket SOCKET.\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != host) return 3; /* the runtime has already gone */
    return serve(host, -1);
}
