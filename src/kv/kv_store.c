/*
 * The storage layer (kv_store.h): hot pool, cold pool and gathers into the working set.
 *
 * The cold pool: one append-only segment file per layer in a fresh directory inside --kv-cold,
 * reserved in full at create (posix_fallocate), so a configuration that does not fit on the
 * device fails at start with what it needs instead of in the middle of a conversation. Unless
 * keep, the files are unlinked as soon as they are set up (their descriptors hold them), so they
 * disappear with the process however it ends; messages still name them by their path.
 *
 * Segment file: a 4 KiB header, then pages of TR_KV_PAGE tokens at data_off + page * page_bytes:
 *
 *   records   PAGE x rec bytes, the layout of the hot pool and the working set
 *   extra     what the policy adds (tiered: PAGE x n_kv low-precision key rows, for a near-storage
 *             scorer; the host keeps its own copy in DRAM)
 *   trailer   magic, layer, page, a 64-bit hash of every record and of the extra bytes, and a hash
 *             of the trailer
 *
 * Checksums: XXH3-64 (libxxhash; its AVX2 build where the CPU has it). Every record's hash is also
 * kept in DRAM, and every record read is verified against it: a mismatch (a flipped bit on disk, a
 * stale or misdirected write, another process writing the file) is a TR_E_IO naming the file,
 * layer, page and position, never attention over wrong values.
 *
 * Reads go through an I/O worker pool (core/io.h) so scattered runs are in flight together; the
 * workers verify the hashes as each read completes.
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
#include "kv/kv_store.h"

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
    tr_kv_page_trailer t;
    memcpy(&t, key_copy + kbytes, sizeof t);
    return !memcmp(t.magic, "TRKVPAGE", 8) && t.layer == (uint32_t)layer &&
           t.page == (uint32_t)page && t.key_copy_bytes == kbytes &&
           t.hash == tr_kv_hash64(&t, offsetof(tr_kv_page_trailer, hash), 0) &&
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
/* allocation                                                                                     */

tr_status tr_kv_store_init(tr_kv_store *st, const tr_kv_shape *s, const tr_kv_params *p,
                           const tr_kv_plan *pl, bool own_ws, uint64_t *total, tr_error *err) {
    memset(st, 0, sizeof *st);
    st->n_layer = s->n_layer;
    st->n_ctx = s->n_ctx;
    st->n_sink = p->n_sink;
    st->krec = pl->krec;
    st->rec = pl->rec;
    st->hot_slots = pl->hot_slots;
    st->n_pages = pl->n_pages;
    st->cold = pl->cold;
    st->data_off = pl->data_off;
    st->page_bytes = pl->page_bytes;
    st->page_qoff = pl->page_qoff;
    st->page_toff = pl->page_toff;
    st->seg_policy = (int32_t)p->policy;
    st->seg_score_bits = p->score_bits;
    st->seg_qrow = p->policy == TR_KV_TIERED ? pl->qrow : 0;
    st->cold_dir = p->cold_dir;
    st->keep = p->keep;
    st->ws_cap = pl->ws_cap;
    st->io_threads = p->io_threads ? p->io_threads : TR_KV_IO_THREADS;
    st->kern = tr_kernels_best();
    const size_t NL = (size_t)s->n_layer, n_ctx = (size_t)s->n_ctx;
    const size_t slots = (size_t)pl->hot_slots;
    st->layers = tr_kv_alloc(NL * sizeof(tr_kv_slayer), 0, total);
    if (!st->layers) return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    for (size_t l = 0; l < NL; l++) st->layers[l].fd = -1;
    /* layer 0 owns the blocks (freed through its pointers) */
    uint32_t *free_slots = tr_kv_alloc(NL * slots * 4, 0, total);
    int32_t *slot_pos = tr_kv_alloc(NL * slots * 4, 0, total);
    uint8_t *hot = tr_kv_alloc(NL * slots * pl->rec, 4096, total);
    tr_kv_tok *tok = tr_kv_alloc(NL * n_ctx * sizeof(tr_kv_tok), 0, total);
    uint64_t *hash = pl->cold ? tr_kv_alloc(NL * n_ctx * 8, 0, total) : NULL;
    if (!free_slots || !slot_pos || !hot || !tok || (pl->cold && !hash)) {
        free(free_slots);
        free(slot_pos);
        free(hot);
        free(tok);
        free(hash);
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl->dram);
    }
    for (size_t l = 0; l < NL; l++) {
        tr_kv_slayer *L = &st->layers[l];
        L->free_slots = free_slots + l * slots;
        L->slot_pos = slot_pos + l * slots;
        L->hot = hot + l * slots * pl->rec;
        L->tok = tok + l * n_ctx;
        L->hash = hash ? hash + l * n_ctx : NULL;
        L->n_free = (int32_t)slots;
        for (size_t i = 0; i < slots; i++) {
            L->free_slots[i] = (uint32_t)(slots - 1 - i); /* slot 0 first */
            L->slot_pos[i] = -1;
        }
        L->demote_next = p->n_sink;
    }
    if (own_ws && !(st->ws = tr_kv_alloc((size_t)pl->ws_cap * pl->rec, 4096, total)))
        return tr_fail(err, TR_E_NOMEM, "KV cache: cannot allocate %llu bytes",
                       (unsigned long long)pl->dram);
    if (pl->cold && !(st->pagebuf = tr_kv_alloc(pl->page_bytes, 4096, total)))
        return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    if (!(st->rec_tmp = tr_kv_alloc(pl->rec, 4096, total)))
        return tr_fail(err, TR_E_NOMEM, "KV cache: out of memory");
    return TR_OK;
}

static void io_free(tr_kv_store *st);
static void cold_close(tr_kv_store *st);

void tr_kv_store_free(tr_kv_store *st) {
    io_free(st);
    cold_close(st);
    if (st->layers) {
        /* per-layer arrays are views into a few big blocks owned by layer 0 */
        tr_kv_slayer *L = &st->layers[0];
        free(L->free_slots);
        free(L->slot_pos);
        free(L->hot);
        free(L->tok);
        free(L->hash);
    }
    free(st->layers);
    st->layers = NULL;
    if (!st->reader.start) free(st->ws); /* else the agent's shared region holds it */
    st->ws = NULL;
    free(st->pagebuf);
    free(st->rec_tmp);
    free(st->cold_path);
    st->cold_path = NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* the hot pool                                                                                   */

void tr_kv_store_drop_hot(tr_kv_store *st, tr_kv_slayer *L, int32_t pos) {
    (void)st;
    tr_kv_tok *t = &L->tok[pos];
    L->slot_pos[t->slot] = -1;
    L->free_slots[L->n_free++] = t->slot;
}

void tr_kv_store_demote(tr_kv_store *st, tr_kv_slayer *L, int32_t pos) {
    tr_kv_store_drop_hot(st, L, pos);
    L->tok[pos].where = TR_KV_TOK_COLD;
    st->demotions++;
}

void tr_kv_store_promote(tr_kv_store *st, tr_kv_slayer *L, int32_t pos, const uint8_t *rec) {
    const uint32_t slot = L->free_slots[--L->n_free];
    memcpy(L->hot + (size_t)slot * st->rec, rec, st->rec);
    L->tok[pos].slot = slot;
    L->tok[pos].where = TR_KV_TOK_HOT;
    L->slot_pos[slot] = pos;
    st->promotions++;
    st->migrated_bytes += st->rec;
}

void tr_kv_store_evict(tr_kv_store *st, tr_kv_slayer *L, int32_t pos) {
    tr_kv_tok *t = &L->tok[pos];
    if (t->where == TR_KV_TOK_HOT) tr_kv_store_drop_hot(st, L, pos);
    t->where = TR_KV_TOK_EVICTED;
    L->n_evicted++;
}

/* demote the oldest non-sink hot token whose page is written; false if none */
static bool demote_one(tr_kv_store *st, tr_kv_slayer *L) {
    for (int32_t p = L->demote_next; p < L->len; p++) {
        tr_kv_tok *t = &L->tok[p];
        if (t->where != TR_KV_TOK_HOT) continue;
        /* pages are written in order: past the first unwritten one nothing has a cold copy */
        if (p / TR_KV_PAGE >= L->pages_written) return false;
        L->demote_next = p + 1;
        tr_kv_store_demote(st, L, p);
        return true;
    }
    return false;
}

tr_status tr_kv_store_append(tr_kv_store *st, int32_t layer, const uint8_t *rec, tr_error *err) {
    tr_kv_slayer *L = &st->layers[layer];
    const int32_t pos = L->len;
    if (pos >= st->n_ctx)
        return tr_fail(err, TR_E_ARG, "KV cache full: layer %d holds %d positions (n_ctx)", layer,
                       st->n_ctx);
    if (!L->n_free &&
        !(st->hooks.make_room ? st->hooks.make_room(st->hooks.ctx, layer) : demote_one(st, L)))
        return tr_fail(err, TR_E_INTERNAL,
                       "KV hot pool of layer %d: %d slots, none can be demoted at position %d",
                       layer, st->hot_slots, pos);
    const uint32_t slot = L->free_slots[--L->n_free];
    memcpy(L->hot + (size_t)slot * st->rec, rec, st->rec);
    L->tok[pos] = (tr_kv_tok){.slot = slot, .hits = 0, .where = TR_KV_TOK_HOT};
    L->slot_pos[slot] = pos;
    L->len = pos + 1;
    return TR_OK;
}

tr_status tr_kv_store_page_done(tr_kv_store *st, int32_t layer, tr_error *err) {
    const int32_t len = st->layers[layer].len;
    if (!st->cold || len % TR_KV_PAGE) return TR_OK;
    return tr_kv_cold_write_page(st, layer, len / TR_KV_PAGE - 1, err);
}

void tr_kv_store_drop(tr_kv_store *st, int32_t layer, int32_t n) {
    tr_kv_slayer *L = &st->layers[layer];
    for (int32_t p = n; p < L->len; p++) {
        tr_kv_tok *t = &L->tok[p];
        if (t->where == TR_KV_TOK_HOT) tr_kv_store_drop_hot(st, L, p);
        if (t->where == TR_KV_TOK_EVICTED) L->n_evicted--;
        memset(t, 0, sizeof *t);
    }
    L->len = n;
    /* pages from the one holding n on may be written again with other tokens */
    if (L->pages_written > n / TR_KV_PAGE) L->pages_written = n / TR_KV_PAGE;
    const int32_t lo = n > st->n_sink ? n : st->n_sink;
    if (L->demote_next > lo) L->demote_next = lo;
}

tr_status tr_kv_store_record(tr_kv_store *st, int32_t layer, int32_t pos, uint8_t *dst,
                             const uint8_t **rec, tr_error *err) {
    const tr_kv_slayer *L = &st->layers[layer];
    const tr_kv_tok *t = &L->tok[pos];
    if (t->where == TR_KV_TOK_HOT) {
        *rec = L->hot + (size_t)t->slot * st->rec;
        return TR_OK;
    }
    *rec = dst;
    return tr_kv_cold_read_sync(st, layer, pos, 1, dst, err);
}

/* ---------------------------------------------------------------------------------------------- */
/* file format                                                                                    */

typedef struct seg_header {
    char magic[8]; /* "TRKVSEG1" */
    uint32_t version, layer;
    int32_t n_head_kv, head_dim_k, head_dim_v, page_tokens, score_bits, policy;
    uint64_t rec, page_bytes, data_off, qrow, n_pages;
    uint64_t hash; /* of the bytes above */
} seg_header;

void tr_kv_seg_path(const tr_kv_store *st, int32_t layer, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/L%03d.seg", st->cold_path ? st->cold_path : "?", layer);
}

uint64_t tr_kv_page_offset(const tr_kv_store *st, int32_t page) {
    return st->data_off + (uint64_t)page * st->page_bytes;
}

static uint64_t seg_bytes(const tr_kv_store *st) {
    return st->data_off + (uint64_t)st->n_pages * st->page_bytes;
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

static tr_status space_error(tr_kv_store *st, tr_error *err, int eno, const char *what) {
    const uint64_t need = (uint64_t)st->n_layer * seg_bytes(st);
    return tr_fail(err, eno == ENOSPC || eno == EDQUOT ? TR_E_BUDGET : TR_E_IO,
                   "KV cold pool in %s: %s: %s (the pool needs %llu bytes: %d layers x %d pages x "
                   "%zu bytes)",
                   st->cold_dir, what, strerror(eno), (unsigned long long)need, st->n_layer,
                   st->n_pages, st->page_bytes);
}

/* the shape fields of the segment header: what a reader of the file needs to check */
typedef struct seg_shape {
    int32_t n_head_kv, head_dim_k, head_dim_v;
} seg_shape;

static tr_status cold_open(tr_kv_store *st, const seg_shape *sh, tr_error *err) {
    const char *dir = st->cold_dir;
    struct stat sb;
    if (stat(dir, &sb))
        return tr_fail(err, TR_E_IO, "KV cold pool: directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return tr_fail(err, TR_E_IO, "KV cold pool: %s is not a directory", dir);
    const uint64_t need = (uint64_t)st->n_layer * seg_bytes(st);
    struct statvfs vs;
    if (!statvfs(dir, &vs)) {
        const uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
        if (avail < need)
            return tr_fail(err, TR_E_BUDGET,
                           "KV cold pool in %s: needs %llu bytes (%d layers x %d pages x %zu "
                           "bytes), %llu available",
                           dir, (unsigned long long)need, st->n_layer, st->n_pages,
                           st->page_bytes, (unsigned long long)avail);
    }
    const size_t plen = strlen(dir) + 32;
    st->cold_path = malloc(plen);
    if (!st->cold_path) return tr_fail(err, TR_E_NOMEM, "KV cold pool: out of memory");
    snprintf(st->cold_path, plen, "%s/terrace-kv-XXXXXX", dir);
    if (!mkdtemp(st->cold_path)) {
        const int e = errno;
        free(st->cold_path);
        st->cold_path = NULL;
        return tr_fail(err, TR_E_IO,
                       "KV cold pool: cannot create a directory in %s: %s (it must be writable, "
                       "with %llu bytes free)",
                       dir, strerror(e), (unsigned long long)need);
    }

    /* records of whole 4 KiB blocks: try O_DIRECT (refused by tmpfs and some others) */
    const bool try_direct = st->rec % 4096 == 0 && st->page_bytes % 4096 == 0;
    st->direct = try_direct;
    uint8_t *hdr = st->pagebuf; /* page_bytes >= 4096 when aligned; else buffered I/O */
    uint8_t hdr_small[4096];
    if (st->page_bytes < 4096 || !try_direct) hdr = hdr_small;
    char path[4200];
    for (int32_t l = 0; l < st->n_layer; l++) {
        tr_kv_seg_path(st, l, path, sizeof path);
        int fd = -1;
        for (;;) {
            fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | (st->direct ? O_DIRECT : 0),
                      0600);
            if (fd < 0 && st->direct && errno == EINVAL && l == 0) {
                st->direct = false;
                continue;
            }
            break;
        }
        if (fd < 0) {
            const int e = errno;
            if (!st->keep) /* the files made so far are already unlinked */
                rmdir(st->cold_path);
            return e == ENOSPC || e == EDQUOT
                       ? space_error(st, err, e, "creating a segment file")
                       : tr_fail(err, TR_E_IO, "KV cold pool: cannot create %s: %s", path,
                                 strerror(e));
        }
        st->layers[l].fd = fd;
        const int rc = posix_fallocate(fd, 0, (off_t)seg_bytes(st));
        if (rc == ENOSPC || rc == EDQUOT || rc == EFBIG)
            return space_error(st, err, rc == EFBIG ? ENOSPC : rc, "reserving the segment files");
        if (rc && rc != EOPNOTSUPP && rc != EINVAL && rc != ENOSYS)
            return tr_fail(err, TR_E_IO, "KV cold pool: reserving %s: %s", path, strerror(rc));
        if (!st->direct)
            posix_fadvise(fd, 0, 0,
                          st->seg_policy == TR_KV_OFFLOAD ? POSIX_FADV_SEQUENTIAL
                                                          : POSIX_FADV_RANDOM);
        memset(hdr, 0, 4096);
        seg_header h = {.magic = "TRKVSEG",
                        .version = 2,
                        .layer = (uint32_t)l,
                        .n_head_kv = sh->n_head_kv,
                        .head_dim_k = sh->head_dim_k,
                        .head_dim_v = sh->head_dim_v,
                        .page_tokens = TR_KV_PAGE,
                        .score_bits = st->seg_score_bits,
                        .policy = st->seg_policy,
                        .rec = st->rec,
                        .page_bytes = st->page_bytes,
                        .data_off = st->data_off,
                        .qrow = st->seg_qrow,
                        .n_pages = (uint64_t)st->n_pages};
        memcpy(h.magic, "TRKVSEG1", 8);
        h.hash = tr_kv_hash64(&h, offsetof(seg_header, hash), 0);
        memcpy(hdr, &h, sizeof h);
        int eno = 0;
        if (write_all(fd, hdr, 4096, 0, &eno))
            return eno == ENOSPC || eno == EDQUOT
                       ? space_error(st, err, eno, "writing a segment header")
                       : tr_fail(err, TR_E_IO, "KV cold pool: cannot write %s: %s", path,
                                 strerror(eno));
        /* Without keep, the name goes at once: the open descriptor holds the data, and a process
         * that dies without tr_kv_free does not leave gigabytes behind. */
        if (!st->keep) unlink(path);
    }
    if (!st->keep) rmdir(st->cold_path);
    return TR_OK;
}

static void cold_close(tr_kv_store *st) {
    if (!st->layers) return;
    char path[4200];
    for (int32_t l = 0; l < st->n_layer; l++) {
        tr_kv_slayer *L = &st->layers[l];
        if (L->fd < 0) continue;
        close(L->fd);
        L->fd = -1;
        if (!st->keep) {
            tr_kv_seg_path(st, l, path, sizeof path);
            unlink(path);
        }
    }
    if (st->cold_path && !st->keep) rmdir(st->cold_path);
}

static tr_status hash_mismatch(tr_kv_store *st, tr_error *err, int32_t layer, int32_t pos) {
    char path[4200];
    tr_kv_seg_path(st, layer, path, sizeof path);
    return tr_fail(err, TR_E_IO,
                   "KV cold pool: checksum mismatch in %s, layer %d, page %d (position %d): the "
                   "file was changed or the storage is failing",
                   path, layer, pos / TR_KV_PAGE, pos);
}

tr_status tr_kv_cold_read_sync(tr_kv_store *st, int32_t layer, int32_t pos, int32_t n,
                               uint8_t *dst, tr_error *err) {
    tr_kv_slayer *L = &st->layers[layer];
    tr_io_job j = {.fd = L->fd,
                   .direct = st->direct,
                   .offset = tr_kv_page_offset(st, pos / TR_KV_PAGE) +
                             (uint64_t)(pos % TR_KV_PAGE) * st->rec,
                   .len = (uint64_t)n * st->rec,
                   .dst = dst};
    j.need = j.len;
    tr_io_read(&j);
    st->bytes_read += j.got;
    st->read_ops++;
    if (j.err || j.got < j.need) {
        char path[4200];
        tr_kv_seg_path(st, layer, path, sizeof path);
        return tr_fail(err, TR_E_IO, "KV cold pool: reading %s (layer %d, page %d) failed: %s",
                       path, layer, pos / TR_KV_PAGE, j.err ? strerror(j.err) : "short read");
    }
    for (int32_t i = 0; i < n; i++)
        if (tr_kv_hash64(dst + (size_t)i * st->rec, st->rec, 0) != L->hash[pos + i])
            return hash_mismatch(st, err, layer, pos + i);
    return TR_OK;
}

tr_status tr_kv_cold_write_page(tr_kv_store *st, int32_t layer, int32_t page, tr_error *err) {
    tr_kv_slayer *L = &st->layers[layer];
    if (page != L->pages_written)
        return tr_fail(err, TR_E_INTERNAL, "KV cold pool: layer %d writes page %d after %d", layer,
                       page, L->pages_written);
    uint8_t *buf = st->pagebuf;
    const int32_t p0 = page * TR_KV_PAGE;
    tr_kv_page_trailer tr;
    memset(&tr, 0, sizeof tr);
    memcpy(tr.magic, "TRKVPAGE", 8);
    tr.layer = (uint32_t)layer;
    tr.page = (uint32_t)page;
    tr.n_tokens = TR_KV_PAGE;
    for (int32_t i = 0; i < TR_KV_PAGE; i++) {
        const int32_t pos = p0 + i;
        const tr_kv_tok *t = &L->tok[pos];
        uint8_t *dst = buf + (size_t)i * st->rec;
        if (t->where == TR_KV_TOK_HOT) {
            memcpy(dst, L->hot + (size_t)t->slot * st->rec, st->rec);
        } else if (t->where == TR_KV_TOK_COLD) {
            /* reopened by a truncate: the old page still holds this record */
            tr_status s = tr_kv_cold_read_sync(st, layer, pos, 1, dst, err);
            if (s) return s;
        } else {
            memset(dst, 0, st->rec); /* evicted: never read again */
        }
        L->hash[pos] = tr_kv_hash64(dst, st->rec, 0);
        tr.rec_hash[i] = L->hash[pos];
    }
    const size_t qbytes = st->page_toff - st->page_qoff;
    if (qbytes) {
        st->hooks.page_extra(st->hooks.ctx, layer, page, buf + st->page_qoff);
        tr.key_copy_bytes = (uint32_t)qbytes;
        tr.key_copy_hash = tr_kv_hash64(buf + st->page_qoff, qbytes, 0);
    }
    tr.hash = tr_kv_hash64(&tr, offsetof(tr_kv_page_trailer, hash), 0);
    memset(buf + st->page_toff, 0, st->page_bytes - st->page_toff);
    memcpy(buf + st->page_toff, &tr, sizeof tr);

    int eno = 0;
    tr_status s = TR_OK;
    if (st->fault_write_at && ++st->n_writes == st->fault_write_at) {
        eno = st->fault_errno ? st->fault_errno : EIO;
        s = TR_E_IO;
    } else {
        s = write_all(L->fd, buf, st->page_bytes, tr_kv_page_offset(st, page), &eno);
    }
    if (s) {
        char path[4200];
        tr_kv_seg_path(st, layer, path, sizeof path);
        if (eno == ENOSPC || eno == EDQUOT)
            return tr_fail(err, TR_E_IO,
                           "KV cold pool in %s is full: writing page %d of layer %d (%zu bytes) "
                           "to %s failed: %s",
                           st->cold_dir, page, layer, st->page_bytes, path, strerror(eno));
        return tr_fail(err, TR_E_IO, "KV cold pool: cannot write %s (layer %d, page %d): %s", path,
                       layer, page, strerror(eno));
    }
    L->pages_written = page + 1;
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* gathers: hot records copied by the caller, cold runs read by the I/O workers                   */

static void gather_done(void *ctx, tr_io_job *j) {
    tr_kv_store *st = ctx;
    tr_kv_gather *G = &st->gath[j->owner];
    const int32_t layer = G->layer, pos0 = G->job_pos[j->sub];
    const tr_kv_slayer *L = &st->layers[layer];
    char msg[sizeof G->err_msg];
    msg[0] = 0;
    char path[4200];
    if (j->err || j->got < j->need) {
        tr_kv_seg_path(st, layer, path, sizeof path);
        snprintf(msg, sizeof msg, "KV cold pool: reading %s (layer %d, page %d) failed: %s", path,
                 layer, G->keys ? pos0 : pos0 / TR_KV_PAGE,
                 j->err ? strerror(j->err) : "short read");
    } else if (G->keys) { /* job_pos holds the page */
        if (!tr_kv_key_copy_ok((const uint8_t *)j->dst + G->key_shift,
                               st->page_toff - st->page_qoff, layer, pos0)) {
            tr_kv_seg_path(st, layer, path, sizeof path);
            snprintf(msg, sizeof msg,
                     "KV cold pool: checksum mismatch in the key copy of %s, layer %d, page %d: "
                     "the file was changed or the storage is failing",
                     path, layer, pos0);
        }
    } else {
        const int32_t n = (int32_t)(j->len / st->rec);
        for (int32_t i = 0; i < n; i++)
            if (tr_kv_hash64((const uint8_t *)j->dst + (size_t)i * st->rec, st->rec, 0) !=
                L->hash[pos0 + i]) {
                tr_kv_seg_path(st, layer, path, sizeof path);
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

int32_t tr_kv_cold_run_end(const tr_kv_slayer *L, const int32_t *sel, int32_t n, int32_t i) {
    if (L->tok[sel[i]].where != TR_KV_TOK_COLD) return i;
    int32_t j = i + 1;
    while (j < n && sel[j] == sel[j - 1] + 1 && sel[j] / TR_KV_PAGE == sel[i] / TR_KV_PAGE &&
           L->tok[sel[j]].where == TR_KV_TOK_COLD)
        j++;
    return j;
}

void tr_kv_gather_start(tr_kv_store *st, int which, int32_t layer, const int32_t *sel, int32_t n,
                        int32_t slot0) {
    tr_kv_gather_start_parts(st, which, layer, sel, n, slot0, 1, NULL);
}

void tr_kv_gather_start_parts(tr_kv_store *st, int which, int32_t layer, const int32_t *sel,
                              int32_t n, int32_t slot0, int np, const int32_t *bnd) {
    tr_kv_gather *G = &st->gath[which];
    const tr_kv_slayer *L = &st->layers[layer];
    const size_t rec = st->rec;
    const bool remote = st->reader.start != NULL;
    G->layer = layer;
    G->n_jobs = 0;
    G->failed = false;
    G->bytes = 0;
    /* cold runs first, so the reads are in flight while the hot records are copied; a run is
     * consecutive positions within one page (the key copy and trailer sit between pages) */
    if (st->cold && remote) {
        st->reader.start(st->reader.ctx, which, layer, sel, n, slot0, np, bnd);
    } else if (st->cold) {
        for (int32_t i = 0, j; i < n; i = j) {
            const int32_t pos = sel[i];
            if ((j = tr_kv_cold_run_end(L, sel, n, i)) == i) {
                j++;
                continue;
            }
            tr_io_job *job = &G->jobs[G->n_jobs];
            *job = (tr_io_job){.fd = L->fd,
                               .direct = st->direct,
                               .offset = tr_kv_page_offset(st, pos / TR_KV_PAGE) +
                                         (uint64_t)(pos % TR_KV_PAGE) * rec,
                               .len = (uint64_t)(j - i) * rec,
                               .dst = st->ws + (size_t)(slot0 + i) * rec,
                               .owner = (uint32_t)which,
                               .sub = (uint32_t)G->n_jobs};
            job->need = job->len;
            if (G->n_jobs) G->jobs[G->n_jobs - 1].next = job;
            G->job_pos[G->n_jobs++] = pos;
        }
    }
    G->pending = remote ? 0 : G->n_jobs;
    if (G->n_jobs && !remote) tr_io_pool_submit(st->io, &G->jobs[0], &G->jobs[G->n_jobs - 1]);
    const uint64_t t0 = remote ? tr_now_ns() : 0;
    uint64_t copied = 0;
    for (int32_t i = 0; i < n; i++) {
        const tr_kv_tok *t = &L->tok[sel[i]];
        if (t->where == TR_KV_TOK_HOT) {
            memcpy(st->ws + (size_t)(slot0 + i) * rec, L->hot + (size_t)t->slot * rec, rec);
            copied += rec;
        }
    }
    if (remote && st->hooks.hot_copied)
        st->hooks.hot_copied(st->hooks.ctx, copied, tr_now_ns() - t0);
}

tr_status tr_kv_store_pull_keys(tr_kv_store *st, int32_t layer, uint8_t **buf, size_t *stride,
                                tr_error *err) {
    const tr_kv_slayer *L = &st->layers[layer];
    tr_kv_gather *G = &st->gath[0];
    if (!st->cold || !L->pages_written || st->page_toff <= st->page_qoff) return TR_OK;
    const uint64_t a = (uint64_t)st->page_qoff & ~(uint64_t)(TR_IO_ALIGN - 1);
    const uint64_t len = (st->page_bytes - a + TR_IO_ALIGN - 1) / TR_IO_ALIGN * TR_IO_ALIGN;
    if (!*buf) {
        *stride = (size_t)len;
        if (posix_memalign((void **)buf, TR_IO_ALIGN, (size_t)st->n_pages * *stride))
            return tr_fail(err, TR_E_NOMEM, "KV: no memory to pull key copies (%zu bytes)",
                           (size_t)st->n_pages * *stride);
    }
    G->layer = layer;
    G->failed = false;
    G->bytes = 0;
    G->keys = true;
    G->key_shift = (size_t)(st->page_qoff - a);
    int32_t done = 0;
    tr_status s = TR_OK;
    while (done < L->pages_written && !s) { /* at most ws_cap jobs at a time */
        G->n_jobs = 0;
        for (int32_t pg = done; pg < L->pages_written && G->n_jobs < st->ws_cap; pg++) {
            tr_io_job *job = &G->jobs[G->n_jobs];
            *job = (tr_io_job){.fd = L->fd,
                               .direct = st->direct,
                               .offset = tr_kv_page_offset(st, pg) + a,
                               .len = len,
                               .need = st->page_bytes - a,
                               .dst = *buf + (size_t)pg * *stride,
                               .owner = 0,
                               .sub = (uint32_t)G->n_jobs};
            if (G->n_jobs) G->jobs[G->n_jobs - 1].next = job;
            G->job_pos[G->n_jobs++] = pg;
        }
        done += G->n_jobs;
        G->pending = G->n_jobs;
        tr_io_pool_submit(st->io, &G->jobs[0], &G->jobs[G->n_jobs - 1]);
        s = tr_kv_gather_wait(st, 0, err);
    }
    G->keys = false;
    return s;
}

tr_status tr_kv_gather_wait(tr_kv_store *st, int which, tr_error *err) {
    if (st->reader.wait) return st->reader.wait(st->reader.ctx, which, err);
    tr_kv_gather *G = &st->gath[which];
    if (!G->n_jobs) return TR_OK;
    const uint64_t t0 = tr_now_ns();
    pthread_mutex_lock(&G->mu);
    while (G->pending > 0) pthread_cond_wait(&G->cv, &G->mu);
    pthread_mutex_unlock(&G->mu);
    st->io_ns += tr_now_ns() - t0;
    st->bytes_read += G->bytes;
    st->read_ops += (uint64_t)G->n_jobs;
    st->pool_reads += (uint64_t)G->n_jobs;
    G->n_jobs = 0;
    if (G->failed) return tr_fail(err, TR_E_IO, "%s", G->err_msg);
    return TR_OK;
}

tr_status tr_kv_gather_wait_part(tr_kv_store *st, int which, int part, tr_error *err) {
    if (st->reader.wait_part) return st->reader.wait_part(st->reader.ctx, which, part, err);
    return tr_kv_gather_wait(st, which, err);
}

static tr_status io_init(tr_kv_store *st, tr_error *err) {
    const size_t cap = (size_t)st->ws_cap;
    for (int w = 0; w < TR_KV_GATHERS; w++) {
        tr_kv_gather *G = &st->gath[w];
        G->st = st;
        G->jobs = calloc(cap, sizeof *G->jobs);
        G->job_pos = calloc(cap, sizeof *G->job_pos);
        pthread_mutex_init(&G->mu, NULL);
        pthread_cond_init(&G->cv, NULL);
        if (!G->jobs || !G->job_pos) return tr_fail(err, TR_E_NOMEM, "KV cold pool: out of memory");
    }
    tr_status s = tr_io_pool_create(st->io_threads, gather_done, st, &st->io, err);
    if (s) tr_error_prefix(err, "KV cold pool: ");
    return s;
}

static void io_free(tr_kv_store *st) {
    if (st->io) tr_io_pool_free(st->io);
    st->io = NULL;
    for (int w = 0; w < TR_KV_GATHERS; w++) {
        tr_kv_gather *G = &st->gath[w];
        if (!G->st) continue;
        free(G->jobs);
        free(G->job_pos);
        pthread_mutex_destroy(&G->mu);
        pthread_cond_destroy(&G->cv);
        G->st = NULL;
    }
}

tr_status tr_kv_store_open(tr_kv_store *st, const tr_kv_shape *s, tr_error *err) {
    if (!st->cold) return TR_OK;
    const seg_shape sh = {s->n_head_kv, s->head_dim_k, s->head_dim_v};
    tr_status r = cold_open(st, &sh, err);
    if (!r) r = io_init(st, err);
    return r;
}
