/*
 * The cold pool: one append-only segment file per layer in a fresh directory inside --kv-cold,
 * reserved in full at create (posix_fallocate), so a configuration that does not fit on the
 * device fails at start with what it needs instead of in the middle of a conversation. Unless
 * keep, the files are unlinked as soon as they are set up (their descriptors hold them), so they
 * disappear with the process however it ends; messages still name them by their path.
 *
 * Segment file: a 4 KiB header, then pages of TR_KV_PAGE tokens at data_off + page * page_bytes:
 *
 *   records   PAGE x rec bytes: per token F16 K (n_kv x hdk) then F16 V (n_kv x hdv), the layout
 *             of the hot pool and the working set, so a run of records is read straight into the
 *             working set with one pread
 *   key copy  tiered only: PAGE x n_kv low-precision key rows (Q8_0 or Q4_0 blocks), for a
 *             near-storage scorer (the host keeps its own copy in DRAM)
 *   trailer   magic, layer, page, a 64-bit hash of every record and of the key copy, and a hash
 *             of the trailer
 *
 * Checksums: XXH3-64 (libxxhash; its AVX2 build where the CPU has it). Every record's hash is also
 * kept in DRAM, and every record read is verified against it: a mismatch (a flipped bit on disk, a stale or
 * misdirected write, another process writing the file) is a TR_E_IO naming the file, layer, page
 * and position, never attention over wrong values.
 *
 * Reads go through an I/O worker pool (src/experts/io.c) so scattered runs are in flight
 * together; the workers verify the hashes as each read completes.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/kv_internal.h"

/* ---------------------------------------------------------------------------------------------- */
/* Checksums: XXH3-64 from libxxhash                                                              */

/* The library's x86 build is SSE2 (~15 GB/s per core here); the AVX2 build of the same function
 * (src/tensor/x86/hash_avx2.c, ~25 GB/s) is picked at start with the kernel family: whenever the
 * family in use is not the scalar one (TERRACE_ISA=scalar lowers both). Verifying every record
 * read is on the decode step's path, so the rate matters. Same digests either way. */
static uint64_t hash_sse2(const void *data, size_t len, uint64_t seed) {
    return XXH3_64bits_withSeed(data, len, seed);
}
static uint64_t (*g_hash)(const void *, size_t, uint64_t) = hash_sse2;
static pthread_once_t g_hash_once = PTHREAD_ONCE_INIT;

static void pick_hash(void) {
#if defined(__x86_64__)
    if (strcmp(tr_kernels_best()->isa, "scalar") != 0) g_hash = tr_xxh3_avx2;
#endif
}

uint64_t tr_kv_hash64(const void *data, size_t len, uint64_t seed) {
    pthread_once(&g_hash_once, pick_hash);
    return g_hash(data, len, seed);
}

bool tr_kv_key_copy_ok(const uint8_t *key_copy, uint64_t kbytes, int32_t layer, int32_t page) {
    page_trailer t;
    memcpy(&t, key_copy + kbytes, sizeof t);
    return !memcmp(t.magic, "TRKVPAGE", 8) && t.layer == (uint32_t)layer &&
           t.page == (uint32_t)page && t.key_copy_bytes == kbytes &&
           t.hash == tr_kv_hash64(&t, offsetof(page_trailer, hash), 0) &&
           t.key_copy_hash == tr_kv_hash64(key_copy, kbytes, 0);
}

uint64_t tr_kv_hash64_ref(const void *data, size_t len, uint64_t seed) {
    return hash_sse2(data, len, seed);
}

void tr_kv_hasher_init(tr_kv_hasher *h, uint64_t seed) {
    XXH3_INITSTATE(&h->st);
    XXH3_64bits_reset_withSeed(&h->st, seed);
}

void tr_kv_hasher_update(tr_kv_hasher *h, const void *data, size_t len) {
    XXH3_64bits_update(&h->st, data, len);
}

uint64_t tr_kv_hasher_digest(const tr_kv_hasher *h) { return XXH3_64bits_digest(&h->st); }

/* ---------------------------------------------------------------------------------------------- */
/* file format                                                                                    */

typedef struct seg_header {
    char magic[8]; /* "TRKVSEG1" */
    uint32_t version, layer;
    int32_t n_head_kv, head_dim_k, head_dim_v, page_tokens, score_bits, policy;
    uint64_t rec, page_bytes, data_off, qrow, n_pages;
    uint64_t hash; /* of the bytes above */
} seg_header;

void tr_kv_seg_path(const tr_kv *kv, int32_t layer, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/L%03d.seg", kv->cold_path ? kv->cold_path : "?", layer);
}

uint64_t tr_kv_page_offset(const tr_kv *kv, int32_t page) {
    return kv->data_off + (uint64_t)page * kv->page_bytes;
}

static uint64_t seg_bytes(const tr_kv *kv) {
    return kv->data_off + (uint64_t)kv->n_pages * kv->page_bytes;
}

static tr_status write_all(int fd, const void *buf, size_t len, uint64_t off, int *eno) {
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (w < 0) {
            if (errno == EINTR) continue;
            *eno = errno;
            return TR_E_IO;
        }
        if (w == 0) {
            *eno = ENOSPC;
            return TR_E_IO;
        }
        done += (size_t)w;
    }
    return TR_OK;
}

static tr_status space_error(tr_kv *kv, tr_error *err, int eno, const char *what) {
    const uint64_t need = (uint64_t)kv->shape.n_layer * seg_bytes(kv);
    return tr_fail(err, eno == ENOSPC || eno == EDQUOT ? TR_E_BUDGET : TR_E_IO,
                   "KV cold pool in %s: %s: %s (the pool needs %llu bytes: %d layers x %d pages x "
                   "%zu bytes)",
                   kv->params.cold_dir, what, strerror(eno), (unsigned long long)need,
                   kv->shape.n_layer, kv->n_pages, kv->page_bytes);
}

tr_status tr_kv_cold_open(tr_kv *kv, tr_error *err) {
    const char *dir = kv->params.cold_dir;
    struct stat sb;
    if (stat(dir, &sb))
        return tr_fail(err, TR_E_IO, "KV cold pool: directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return tr_fail(err, TR_E_IO, "KV cold pool: %s is not a directory", dir);
    const uint64_t need = (uint64_t)kv->shape.n_layer * seg_bytes(kv);
    struct statvfs vs;
    if (!statvfs(dir, &vs)) {
        const uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
        if (avail < need)
            return tr_fail(err, TR_E_BUDGET,
                           "KV cold pool in %s: needs %llu bytes (%d layers x %d pages x %zu "
                           "bytes), %llu available",
                           dir, (unsigned long long)need, kv->shape.n_layer, kv->n_pages,
                           kv->page_bytes, (unsigned long long)avail);
    }
    const size_t plen = strlen(dir) + 32;
    kv->cold_path = malloc(plen);
    if (!kv->cold_path) return tr_fail(err, TR_E_NOMEM, "KV cold pool: out of memory");
    snprintf(kv->cold_path, plen, "%s/terrace-kv-XXXXXX", dir);
    if (!mkdtemp(kv->cold_path)) {
        const int e = errno;
        free(kv->cold_path);
        kv->cold_path = NULL;
        return tr_fail(err, TR_E_IO,
                       "KV cold pool: cannot create a directory in %s: %s (it must be writable, "
                       "with %llu bytes free)",
                       dir, strerror(e), (unsigned long long)need);
    }

    /* records of whole 4 KiB blocks: try O_DIRECT (refused by tmpfs and some others) */
    const bool try_direct = kv->rec % 4096 == 0 && kv->page_bytes % 4096 == 0;
    kv->direct = try_direct;
    uint8_t *hdr = kv->pagebuf; /* page_bytes >= 4096 when aligned; else buffered I/O */
    uint8_t hdr_small[4096];
    if (kv->page_bytes < 4096 || !try_direct) hdr = hdr_small;
    char path[4200];
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        tr_kv_seg_path(kv, l, path, sizeof path);
        int fd = -1;
        for (;;) {
            fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (kv->direct ? O_DIRECT : 0),
                      0600);
            if (fd < 0 && kv->direct && errno == EINVAL && l == 0) {
                kv->direct = false;
                continue;
            }
            break;
        }
        if (fd < 0) {
            const int e = errno;
            if (!kv->params.keep) /* the files made so far are already unlinked */
                rmdir(kv->cold_path);
            return e == ENOSPC || e == EDQUOT
                       ? space_error(kv, err, e, "creating a segment file")
                       : tr_fail(err, TR_E_IO, "KV cold pool: cannot create %s: %s", path,
                                 strerror(e));
        }
        kv->layers[l].fd = fd;
        const int rc = posix_fallocate(fd, 0, (off_t)seg_bytes(kv));
        if (rc == ENOSPC || rc == EDQUOT || rc == EFBIG)
            return space_error(kv, err, rc == EFBIG ? ENOSPC : rc, "reserving the segment files");
        if (rc && rc != EOPNOTSUPP && rc != EINVAL && rc != ENOSYS)
            return tr_fail(err, TR_E_IO, "KV cold pool: reserving %s: %s", path, strerror(rc));
        if (!kv->direct)
            posix_fadvise(fd, 0, 0,
                          kv->params.policy == TR_KV_OFFLOAD ? POSIX_FADV_SEQUENTIAL
                                                             : POSIX_FADV_RANDOM);
        memset(hdr, 0, 4096);
        seg_header h = {.magic = "TRKVSEG",
                        .version = 2,
                        .layer = (uint32_t)l,
                        .n_head_kv = kv->shape.n_head_kv,
                        .head_dim_k = kv->shape.head_dim_k,
                        .head_dim_v = kv->shape.head_dim_v,
                        .page_tokens = TR_KV_PAGE,
                        .score_bits = kv->params.score_bits,
                        .policy = (int32_t)kv->params.policy,
                        .rec = kv->rec,
                        .page_bytes = kv->page_bytes,
                        .data_off = kv->data_off,
                        .qrow = kv->params.policy == TR_KV_TIERED ? kv->qrow : 0,
                        .n_pages = (uint64_t)kv->n_pages};
        memcpy(h.magic, "TRKVSEG1", 8);
        h.hash = tr_kv_hash64(&h, offsetof(seg_header, hash), 0);
        memcpy(hdr, &h, sizeof h);
        int eno = 0;
        if (write_all(fd, hdr, 4096, 0, &eno))
            return eno == ENOSPC || eno == EDQUOT
                       ? space_error(kv, err, eno, "writing a segment header")
                       : tr_fail(err, TR_E_IO, "KV cold pool: cannot write %s: %s", path,
                                 strerror(eno));
        /* Without keep, the name goes at once: the open descriptor holds the data, and a process
         * that dies without tr_kv_free does not leave gigabytes behind. */
        if (!kv->params.keep) unlink(path);
    }
    if (!kv->params.keep) rmdir(kv->cold_path);
    return TR_OK;
}

void tr_kv_cold_close(tr_kv *kv) {
    if (!kv->layers) return;
    char path[4200];
    for (int32_t l = 0; l < kv->shape.n_layer; l++) {
        tr_kv_layer *L = &kv->layers[l];
        if (L->fd < 0) continue;
        close(L->fd);
        L->fd = -1;
        if (!kv->params.keep) {
            tr_kv_seg_path(kv, l, path, sizeof path);
            unlink(path);
        }
    }
    if (kv->cold_path && !kv->params.keep) rmdir(kv->cold_path);
}

static tr_status hash_mismatch(tr_kv *kv, tr_error *err, int32_t layer, int32_t pos) {
    char path[4200];
    tr_kv_seg_path(kv, layer, path, sizeof path);
    return tr_fail(err, TR_E_IO,
                   "KV cold pool: checksum mismatch in %s, layer %d, page %d (position %d): the "
                   "file was changed or the storage is failing",
                   path, layer, pos / TR_KV_PAGE, pos);
}

tr_status tr_kv_cold_read_sync(tr_kv *kv, int32_t layer, int32_t pos, int32_t n, uint8_t *dst,
                               tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    tr_io_job j = {.fd = L->fd,
                   .direct = kv->direct,
                   .offset = tr_kv_page_offset(kv, pos / TR_KV_PAGE) +
                             (uint64_t)(pos % TR_KV_PAGE) * kv->rec,
                   .len = (uint64_t)n * kv->rec,
                   .dst = dst};
    j.need = j.len;
    tr_io_read(&j);
    kv->bytes_read += j.got;
    kv->read_ops++;
    if (j.err || j.got < j.need) {
        char path[4200];
        tr_kv_seg_path(kv, layer, path, sizeof path);
        return tr_fail(err, TR_E_IO, "KV cold pool: reading %s (layer %d, page %d) failed: %s",
                       path, layer, pos / TR_KV_PAGE, j.err ? strerror(j.err) : "short read");
    }
    for (int32_t i = 0; i < n; i++)
        if (tr_kv_hash64(dst + (size_t)i * kv->rec, kv->rec, 0) != L->hash[pos + i])
            return hash_mismatch(kv, err, layer, pos + i);
    return TR_OK;
}

tr_status tr_kv_cold_write_page(tr_kv *kv, int32_t layer, int32_t page, tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    if (page != L->pages_written)
        return tr_fail(err, TR_E_INTERNAL, "KV cold pool: layer %d writes page %d after %d", layer,
                       page, L->pages_written);
    uint8_t *buf = kv->pagebuf;
    const int32_t p0 = page * TR_KV_PAGE;
    page_trailer tr;
    memset(&tr, 0, sizeof tr);
    memcpy(tr.magic, "TRKVPAGE", 8);
    tr.layer = (uint32_t)layer;
    tr.page = (uint32_t)page;
    tr.n_tokens = TR_KV_PAGE;
    for (int32_t i = 0; i < TR_KV_PAGE; i++) {
        const int32_t pos = p0 + i;
        const tr_kv_tok *t = &L->tok[pos];
        uint8_t *dst = buf + (size_t)i * kv->rec;
        if (t->where == TR_KV_TOK_HOT) {
            memcpy(dst, L->hot + (size_t)t->slot * kv->rec, kv->rec);
        } else if (t->where == TR_KV_TOK_COLD) {
            /* reopened by a truncate: the old page still holds this record */
            tr_status st = tr_kv_cold_read_sync(kv, layer, pos, 1, dst, err);
            if (st) return st;
        } else {
            memset(dst, 0, kv->rec); /* evicted: never read again */
        }
        L->hash[pos] = tr_kv_hash64(dst, kv->rec, 0);
        tr.rec_hash[i] = L->hash[pos];
    }
    const size_t qbytes = kv->page_toff - kv->page_qoff;
    if (qbytes) {
        const size_t nkv = (size_t)kv->shape.n_head_kv;
        for (int32_t i = 0; i < TR_KV_PAGE; i++)
            for (size_t g = 0; g < nkv; g++)
                memcpy(buf + kv->page_qoff + ((size_t)i * nkv + g) * kv->qrow,
                       tr_kv_qk_row(kv, L, g, p0 + i), kv->qrow);
        tr.key_copy_bytes = (uint32_t)qbytes;
        tr.key_copy_hash = tr_kv_hash64(buf + kv->page_qoff, qbytes, 0);
    }
    tr.hash = tr_kv_hash64(&tr, offsetof(page_trailer, hash), 0);
    memset(buf + kv->page_toff, 0, kv->page_bytes - kv->page_toff);
    memcpy(buf + kv->page_toff, &tr, sizeof tr);

    int eno = 0;
    tr_status st = TR_OK;
    if (kv->fault_write_at && ++kv->n_writes == kv->fault_write_at) {
        eno = kv->fault_errno ? kv->fault_errno : EIO;
        st = TR_E_IO;
    } else {
        st = write_all(L->fd, buf, kv->page_bytes, tr_kv_page_offset(kv, page), &eno);
    }
    if (st) {
        char path[4200];
        tr_kv_seg_path(kv, layer, path, sizeof path);
        if (eno == ENOSPC || eno == EDQUOT)
            return tr_fail(err, TR_E_IO,
                           "KV cold pool in %s is full: writing page %d of layer %d (%zu bytes) "
                           "to %s failed: %s",
                           kv->params.cold_dir, page, layer, kv->page_bytes, path, strerror(eno));
        return tr_fail(err, TR_E_IO, "KV cold pool: cannot write %s (layer %d, page %d): %s", path,
                       layer, page, strerror(eno));
    }
    L->pages_written = page + 1;
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* gathers: hot records copied by the caller, cold runs read by the I/O workers                   */

static void gather_done(void *ctx, tr_io_job *j) {
    tr_kv *kv = ctx;
    tr_kv_gather *G = &kv->gath[j->owner];
    const int32_t layer = G->layer, pos0 = G->job_pos[j->sub];
    const tr_kv_layer *L = &kv->layers[layer];
    char msg[sizeof G->err_msg];
    msg[0] = 0;
    char path[4200];
    if (j->err || j->got < j->need) {
        tr_kv_seg_path(kv, layer, path, sizeof path);
        snprintf(msg, sizeof msg, "KV cold pool: reading %s (layer %d, page %d) failed: %s", path,
                 layer, G->keys ? pos0 : pos0 / TR_KV_PAGE,
                 j->err ? strerror(j->err) : "short read");
    } else if (G->keys) { /* job_pos holds the page */
        if (!tr_kv_key_copy_ok((const uint8_t *)j->dst + G->key_shift,
                               kv->page_toff - kv->page_qoff, layer, pos0)) {
            tr_kv_seg_path(kv, layer, path, sizeof path);
            snprintf(msg, sizeof msg,
                     "KV cold pool: checksum mismatch in the key copy of %s, layer %d, page %d: "
                     "the file was changed or the storage is failing",
                     path, layer, pos0);
        }
    } else {
        const int32_t n = (int32_t)(j->len / kv->rec);
        for (int32_t i = 0; i < n; i++)
            if (tr_kv_hash64((const uint8_t *)j->dst + (size_t)i * kv->rec, kv->rec, 0) !=
                L->hash[pos0 + i]) {
                tr_kv_seg_path(kv, layer, path, sizeof path);
                snprintf(msg, sizeof msg,
                         "KV cold pool: checksum mismatch in %s, layer %d, page %d (position %d): "
                         "the file was changed or the storage is failing",
                         path, layer, (pos0 + i) / TR_KV_PAGE, pos0 + i);
                break;
            }
    }
    pthread_mutex_lock(&G->mu);
    if (msg[0] && !G->failed) {
        G->failed = true;
        memcpy(G->err_msg, msg, sizeof msg);
    }
    G->bytes += j->got;
    if (--G->pending == 0) pthread_cond_broadcast(&G->cv);
    pthread_mutex_unlock(&G->mu);
}

int32_t tr_kv_cold_run_end(const tr_kv_layer *L, const int32_t *sel, int32_t n, int32_t i) {
    if (L->tok[sel[i]].where != TR_KV_TOK_COLD) return i;
    int32_t j = i + 1;
    while (j < n && sel[j] == sel[j - 1] + 1 && sel[j] / TR_KV_PAGE == sel[i] / TR_KV_PAGE &&
           L->tok[sel[j]].where == TR_KV_TOK_COLD)
        j++;
    return j;
}

void tr_kv_gather_start(tr_kv *kv, int which, int32_t layer, const int32_t *sel, int32_t n,
                        int32_t slot0) {
    tr_kv_gather_start_parts(kv, which, layer, sel, n, slot0, 1, NULL);
}

void tr_kv_gather_start_parts(tr_kv *kv, int which, int32_t layer, const int32_t *sel,
                              int32_t n, int32_t slot0, int np, const int32_t *bnd) {
    tr_kv_gather *G = &kv->gath[which];
    const tr_kv_layer *L = &kv->layers[layer];
    const size_t rec = kv->rec;
    G->layer = layer;
    G->n_jobs = 0;
    G->failed = false;
    G->bytes = 0;
    /* cold runs first, so the reads are in flight while the hot records are copied; a run is
     * consecutive positions within one page (the key copy and trailer sit between pages) */
    if (kv->cold && kv->csd) {
        tr_kv_csd_rows_start(kv, which, layer, sel, n, slot0, np, bnd);
    } else if (kv->cold) {
        for (int32_t i = 0, j; i < n; i = j) {
            const int32_t pos = sel[i];
            if ((j = tr_kv_cold_run_end(L, sel, n, i)) == i) {
                j++;
                continue;
            }
            tr_io_job *job = &G->jobs[G->n_jobs];
            *job = (tr_io_job){.fd = L->fd,
                               .direct = kv->direct,
                               .offset = tr_kv_page_offset(kv, pos / TR_KV_PAGE) +
                                         (uint64_t)(pos % TR_KV_PAGE) * rec,
                               .len = (uint64_t)(j - i) * rec,
                               .dst = kv->ws + (size_t)(slot0 + i) * rec,
                               .owner = (uint32_t)which,
                               .sub = (uint32_t)G->n_jobs};
            job->need = job->len;
            if (G->n_jobs) G->jobs[G->n_jobs - 1].next = job;
            G->job_pos[G->n_jobs++] = pos;
        }
    }
    G->pending = kv->csd ? 0 : G->n_jobs;
    if (G->n_jobs && !kv->csd) tr_io_pool_submit(kv->io, &G->jobs[0], &G->jobs[G->n_jobs - 1]);
    const uint64_t t0 = kv->csd ? tr_now_ns() : 0;
    uint64_t copied = 0;
    for (int32_t i = 0; i < n; i++) {
        const tr_kv_tok *t = &L->tok[sel[i]];
        if (t->where == TR_KV_TOK_HOT) {
            memcpy(kv->ws + (size_t)(slot0 + i) * rec, L->hot + (size_t)t->slot * rec, rec);
            copied += rec;
        }
    }
    if (kv->csd) tr_kv_app_note_rows(kv, copied, tr_now_ns() - t0, 0, 0);
}

tr_status tr_kv_pull_keys(tr_kv *kv, int32_t layer, tr_error *err) {
    const tr_kv_layer *L = &kv->layers[layer];
    tr_kv_gather *G = &kv->gath[0];
    if (!kv->cold || !L->pages_written || kv->page_toff <= kv->page_qoff) return TR_OK;
    const uint64_t a = (uint64_t)kv->page_qoff & ~(uint64_t)(TR_IO_ALIGN - 1);
    const uint64_t len = (kv->page_bytes - a + TR_IO_ALIGN - 1) / TR_IO_ALIGN * TR_IO_ALIGN;
    if (!kv->pull_buf) {
        kv->pull_stride = (size_t)len;
        if (posix_memalign((void **)&kv->pull_buf, TR_IO_ALIGN,
                           (size_t)kv->n_pages * kv->pull_stride))
            return tr_fail(err, TR_E_NOMEM, "KV: no memory to pull key copies (%zu bytes)",
                           (size_t)kv->n_pages * kv->pull_stride);
    }
    G->layer = layer;
    G->failed = false;
    G->bytes = 0;
    G->keys = true;
    G->key_shift = (size_t)(kv->page_qoff - a);
    int32_t done = 0;
    tr_status st = TR_OK;
    while (done < L->pages_written && !st) { /* at most ws_cap jobs at a time */
        G->n_jobs = 0;
        for (int32_t pg = done; pg < L->pages_written && G->n_jobs < kv->ws_cap; pg++) {
            tr_io_job *job = &G->jobs[G->n_jobs];
            *job = (tr_io_job){.fd = L->fd,
                               .direct = kv->direct,
                               .offset = tr_kv_page_offset(kv, pg) + a,
                               .len = len,
                               .need = kv->page_bytes - a,
                               .dst = kv->pull_buf + (size_t)pg * kv->pull_stride,
                               .owner = 0,
                               .sub = (uint32_t)G->n_jobs};
            if (G->n_jobs) G->jobs[G->n_jobs - 1].next = job;
            G->job_pos[G->n_jobs++] = pg;
        }
        done += G->n_jobs;
        G->pending = G->n_jobs;
        tr_io_pool_submit(kv->io, &G->jobs[0], &G->jobs[G->n_jobs - 1]);
        st = tr_kv_gather_wait(kv, 0, err);
    }
    G->keys = false;
    return st;
}

tr_status tr_kv_gather_wait(tr_kv *kv, int which, tr_error *err) {
    if (kv->csd) return tr_kv_csd_rows_wait(kv, which, err);
    tr_kv_gather *G = &kv->gath[which];
    if (!G->n_jobs) return TR_OK;
    const uint64_t t0 = tr_now_ns();
    pthread_mutex_lock(&G->mu);
    while (G->pending > 0) pthread_cond_wait(&G->cv, &G->mu);
    pthread_mutex_unlock(&G->mu);
    kv->io_ns += tr_now_ns() - t0;
    kv->bytes_read += G->bytes;
    kv->read_ops += (uint64_t)G->n_jobs;
    kv->pool_reads += (uint64_t)G->n_jobs;
    G->n_jobs = 0;
    if (G->failed) return tr_fail(err, TR_E_IO, "%s", G->err_msg);
    return TR_OK;
}

tr_status tr_kv_io_init(tr_kv *kv, tr_error *err) {
    const size_t cap = (size_t)kv->ws_cap;
    for (int w = 0; w < TR_KV_GATHERS; w++) {
        tr_kv_gather *G = &kv->gath[w];
        G->kv = kv;
        G->jobs = calloc(cap, sizeof *G->jobs);
        G->job_pos = calloc(cap, sizeof *G->job_pos);
        pthread_mutex_init(&G->mu, NULL);
        pthread_cond_init(&G->cv, NULL);
        if (!G->jobs || !G->job_pos) return tr_fail(err, TR_E_NOMEM, "KV cold pool: out of memory");
    }
    const int n = kv->params.io_threads ? kv->params.io_threads : TR_KV_IO_THREADS;
    tr_status st = tr_io_pool_create(n, gather_done, kv, &kv->io, err);
    if (st) tr_error_prefix(err, "KV cold pool: ");
    return st;
}

void tr_kv_io_free(tr_kv *kv) {
    if (kv->io) tr_io_pool_free(kv->io);
    kv->io = NULL;
    for (int w = 0; w < TR_KV_GATHERS; w++) {
        tr_kv_gather *G = &kv->gath[w];
        if (!G->kv) continue;
        free(G->jobs);
        free(G->job_pos);
        pthread_mutex_destroy(&G->mu);
        pthread_cond_destroy(&G->cv);
        G->kv = NULL;
    }
}
