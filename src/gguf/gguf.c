/*
 * GGUF reader (GGUF-FACTS §1). The header, metadata and tensor table are read with ordinary
 * buffered reads; nothing read from the file is trusted: every count, length, dimension, type id
 * and offset is checked against the bytes that remain in the file and against overflow before it
 * is used to size anything. Errors name the file, the key or tensor, and the byte offset.
 *
 * Memory: strings (keys, metadata strings, tensor names) live in an arena owned by the tr_gguf;
 * numeric arrays in one allocation each. Tensor data is never read here: callers map the file or
 * pread exact byte ranges (the expert cache reads slices by offset).
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/mapguard.h"
#include "gguf/gguf_internal.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_TENSOR_NAME 63 /* ggml's GGML_MAX_NAME - 1 */
#define GGUF_MAX_KEY 65535
#define GGUF_MAX_SHARDS 99999

/* ---------------------------------------------------------------------------------------------- */
/* string arena                                                                                   */

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;
    char data[];
} arena_chunk;

static char *arena_alloc(tr_gguf *g, size_t n) {
    arena_chunk *c = g->arena;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = g->arena;
        g->arena = c;
    }
    char *p = c->data + c->used;
    c->used += n;
    return p;
}

/* ---------------------------------------------------------------------------------------------- */
/* buffered reader over one shard                                                                 */

typedef struct reader {
    int fd;
    const char *path;
    uint64_t size;    /* file size */
    uint64_t pos;     /* file offset of the next unread byte */
    uint8_t *buf;
    size_t buf_len;   /* valid bytes in buf */
    size_t buf_pos;   /* next unread byte in buf */
    tr_error *err;
} reader;

#define READER_BUF (1u << 16)

static uint64_t rd_remaining(const reader *r) { return r->size - r->pos; }

/* Reads exactly n bytes; a file that ends early is a truncation error naming `what`. */
static tr_status rd_bytes(reader *r, void *dst, uint64_t n, const char *what) {
    if (n > rd_remaining(r))
        return tr_fail(r->err, TR_E_FORMAT,
                       "%s: truncated file: %s at byte %" PRIu64 " needs %" PRIu64
                       " bytes but only %" PRIu64 " remain (file size %" PRIu64 ")",
                       r->path, what, r->pos, n, rd_remaining(r), r->size);
    uint8_t *out = dst;
    while (n > 0) {
        if (r->buf_pos == r->buf_len) {
            ssize_t got;
            do got = read(r->fd, r->buf, READER_BUF);
            while (got < 0 && errno == EINTR);
            if (got < 0)
                return tr_fail(r->err, TR_E_IO, "%s: read error at byte %" PRIu64 ": %s",
                               r->path, r->pos, strerror(errno));
            if (got == 0)
                return tr_fail(r->err, TR_E_IO,
                               "%s: file ended at byte %" PRIu64 " while reading %s (was it "
                               "truncated while being read?)",
                               r->path, r->pos, what);
            r->buf_len = (size_t)got;
            r->buf_pos = 0;
        }
        size_t take = r->buf_len - r->buf_pos;
        if (take > n) take = (size_t)n;
        memcpy(out, r->buf + r->buf_pos, take);
        r->buf_pos += take;
        r->pos += take;
        out += take;
        n -= take;
    }
    return TR_OK;
}

static tr_status rd_u32(reader *r, uint32_t *v, const char *what) {
    uint8_t b[4];
    tr_status s = rd_bytes(r, b, 4, what);
    if (s) return s;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return TR_OK;
}

static tr_status rd_u64(reader *r, uint64_t *v, const char *what) {
    uint8_t b[8];
    tr_status s = rd_bytes(r, b, 8, what);
    if (s) return s;
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | b[i];
    *v = x;
    return TR_OK;
}

/* Length-prefixed string into the arena (NUL-terminated for convenience). `max` bounds the
 * length beyond the file-size check (0 = no extra bound). */
static tr_status rd_string(tr_gguf *g, reader *r, tr_str *out, uint64_t max, const char *what) {
    const uint64_t at = r->pos;
    uint64_t len;
    tr_status s = rd_u64(r, &len, what);
    if (s) return s;
    if (len > rd_remaining(r))
        return tr_fail(r->err, TR_E_FORMAT,
                       "%s: %s at byte %" PRIu64 " claims a length of %" PRIu64
                       " bytes but only %" PRIu64 " bytes remain in the file",
                       r->path, what, at, len, rd_remaining(r));
    if (max && len > max)
        return tr_fail(r->err, TR_E_FORMAT,
                       "%s: %s at byte %" PRIu64 " is %" PRIu64 " bytes long (limit %" PRIu64 ")",
                       r->path, what, at, len, max);
    char *p = arena_alloc(g, (size_t)len + 1);
    if (!p) return tr_fail(r->err, TR_E_NOMEM, "%s: out of memory reading %s", r->path, what);
    s = rd_bytes(r, p, len, what);
    if (s) return s;
    p[len] = '\0';
    out->ptr = p;
    out->len = len;
    return TR_OK;
}

/* ---------------------------------------------------------------------------------------------- */
/* hash index (open addressing over int64 indices)                                                */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static tr_status index_init(tr_index *ix, int64_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2) cap <<= 1;
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots) return TR_E_NOMEM;
    memset(ix->slots, 0xff, cap * sizeof *ix->slots); /* -1 = empty */
    ix->mask = cap - 1;
    return TR_OK;
}

/* returns the index already stored under `name` (a duplicate), or -1 after inserting `id` */
typedef const char *(*name_of_fn)(const tr_gguf *g, int64_t id);

static int64_t index_insert(tr_index *ix, const tr_gguf *g, name_of_fn name_of, const char *name,
                            int64_t id) {
    uint64_t h = hash_bytes(name, strlen(name)) & ix->mask;
    for (;;) {
        int64_t cur = ix->slots[h];
        if (cur < 0) {
            ix->slots[h] = id;
            return -1;
        }
        if (strcmp(name_of(g, cur), name) == 0) return cur;
        h = (h + 1) & ix->mask;
    }
}

static int64_t index_find(const tr_index *ix, const tr_gguf *g, name_of_fn name_of,
                          const char *name) {
    if (!ix->slots) return -1;
    uint64_t h = hash_bytes(name, strlen(name)) & ix->mask;
    for (;;) {
        int64_t cur = ix->slots[h];
        if (cur < 0) return -1;
        if (strcmp(name_of(g, cur), name) == 0) return cur;
        h = (h + 1) & ix->mask;
    }
}

static const char *kv_name(const tr_gguf *g, int64_t i) { return g->kvs[i].key; }
static const char *tensor_name(const tr_gguf *g, int64_t i) { return g->tensors[i].info.name; }

/* ---------------------------------------------------------------------------------------------- */
/* metadata                                                                                       */

static const size_t k_vsize[TR_GGUF_VTYPE_COUNT] = {
    [TR_GGUF_U8] = 1,  [TR_GGUF_I8] = 1,  [TR_GGUF_U16] = 2, [TR_GGUF_I16] = 2,
    [TR_GGUF_U32] = 4, [TR_GGUF_I32] = 4, [TR_GGUF_F32] = 4, [TR_GGUF_BOOL] = 1,
    [TR_GGUF_U64] = 8, [TR_GGUF_I64] = 8, [TR_GGUF_F64] = 8,
};

const char *tr_gguf_vtype_name(tr_gguf_vtype t) {
    static const char *names[TR_GGUF_VTYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return (unsigned)t < TR_GGUF_VTYPE_COUNT ? names[t] : "?";
}

static uint64_t decode_le(const uint8_t *b, size_t n) {
    uint64_t x = 0;
    for (size_t i = n; i-- > 0;) x = (x << 8) | b[i];
    return x;
}

static tr_status read_scalar(reader *r, tr_gguf_kv *kv, tr_gguf_vtype t, const char *key,
                             uint64_t at) {
    uint8_t b[8];
    tr_status s = rd_bytes(r, b, k_vsize[t], key);
    if (s) return s;
    const uint64_t u = decode_le(b, k_vsize[t]);
    switch (t) {
    case TR_GGUF_I8: kv->v.i = (int8_t)u; break;
    case TR_GGUF_I16: kv->v.i = (int16_t)u; break;
    case TR_GGUF_I32: kv->v.i = (int32_t)u; break;
    case TR_GGUF_I64: kv->v.i = (int64_t)u; break;
    case TR_GGUF_F32: {
        float f;
        uint32_t u32 = (uint32_t)u;
        memcpy(&f, &u32, 4);
        kv->v.f = f;
        break;
    }
    case TR_GGUF_F64: memcpy(&kv->v.f, &u, 8); break;
    case TR_GGUF_BOOL: kv->v.u = u != 0; break; /* ggml treats any non-zero byte as true */
    default: kv->v.u = u; break;
    }
    (void)at;
    return TR_OK;
}

static tr_status read_kv(tr_gguf *g, reader *r, tr_gguf_kv *kv) {
    kv->file_offset = r->pos;
    tr_str key;
    tr_status s = rd_string(g, r, &key, GGUF_MAX_KEY, "metadata key");
    if (s) return s;
    if (key.len == 0)
        return tr_fail(r->err, TR_E_FORMAT, "%s: empty metadata key at byte %" PRIu64, r->path,
                       kv->file_offset);
    if (memchr(key.ptr, '\0', key.len))
        return tr_fail(r->err, TR_E_FORMAT, "%s: metadata key at byte %" PRIu64 " contains a NUL",
                       r->path, kv->file_offset);
    kv->key = key.ptr;
    uint32_t t;
    if ((s = rd_u32(r, &t, key.ptr))) return s;
    if (t >= TR_GGUF_VTYPE_COUNT)
        return tr_fail(r->err, TR_E_FORMAT,
                       "%s: key '%s' at byte %" PRIu64 " has unknown value type %u", r->path,
                       key.ptr, kv->file_offset, t);
    kv->type = (tr_gguf_vtype)t;
    if (t == TR_GGUF_STRING) return rd_string(g, r, &kv->str, 0, key.ptr);
    if (t != TR_GGUF_ARRAY) return read_scalar(r, kv, kv->type, key.ptr, kv->file_offset);

    uint32_t et;
    uint64_t n;
    if ((s = rd_u32(r, &et, key.ptr))) return s;
    if ((s = rd_u64(r, &n, key.ptr))) return s;
    if (et >= TR_GGUF_VTYPE_COUNT)
        return tr_fail(r->err, TR_E_FORMAT,
                       "%s: array '%s' at byte %" PRIu64 " has unknown element type %u", r->path,
                       key.ptr, kv->file_offset, et);
    if (et == TR_GGUF_ARRAY)
        return tr_fail(r->err, TR_E_FORMAT,
                       "%s: array '%s' at byte %" PRIu64 " nests arrays (not supported by GGUF "
                       "readers)",
                       r->path, key.ptr, kv->file_offset);
    kv->arr_type = (tr_gguf_vtype)et;
    /* every element needs at least this many bytes: reject absurd counts before allocating */
    const uint64_t min_elem = et == TR_GGUF_STRING ? 8 : k_vsize[et];
    if (n > rd_remaining(r) / min_elem)
        return tr_fail(r->err, TR_E_FORMAT,
                       "%s: array '%s' at byte %" PRIu64 " claims %" PRIu64
                       " elements of type %s, more than the %" PRIu64
                       " bytes left in the file can hold",
                       r->path, key.ptr, kv->file_offset, n, tr_gguf_vtype_name(kv->arr_type),
                       rd_remaining(r));
    kv->arr_len = n;
    if (et == TR_GGUF_STRING) {
        kv->arr_strs = malloc((n ? n : 1) * sizeof *kv->arr_strs);
        if (!kv->arr_strs)
            return tr_fail(r->err, TR_E_NOMEM, "%s: out of memory for array '%s'", r->path,
                           key.ptr);
        for (uint64_t j = 0; j < n; j++)
            if ((s = rd_string(g, r, &kv->arr_strs[j], 0, key.ptr))) return s;
        return TR_OK;
    }
    const uint64_t bytes = n * k_vsize[et];
    kv->arr_data = malloc(bytes ? bytes : 1);
    if (!kv->arr_data)
        return tr_fail(r->err, TR_E_NOMEM, "%s: out of memory for array '%s'", r->path, key.ptr);
    return rd_bytes(r, kv->arr_data, bytes, key.ptr);
}

/* ---------------------------------------------------------------------------------------------- */
/* one shard                                                                                      */

static bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

/* Parses the header of one file into `sh` and appends its KVs (when keep_kv) and tensor infos. */
static tr_status parse_shard(tr_gguf *g, tr_gguf_shard *sh, bool keep_kv, tr_error *err) {
    tr_status s;
    reader r = {.fd = sh->fd, .path = sh->path, .size = sh->size, .err = err};
    r.buf = malloc(READER_BUF);
    if (!r.buf) return tr_fail(err, TR_E_NOMEM, "out of memory");

    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    if ((s = rd_u32(&r, &magic, "magic"))) goto out;
    if (magic != GGUF_MAGIC) {
        char shown[5] = {0};
        for (int i = 0; i < 4; i++) {
            char c = (char)((magic >> (8 * i)) & 0xff);
            shown[i] = (c >= 32 && c < 127) ? c : '?';
        }
        s = tr_fail(err, TR_E_FORMAT,
                    "%s: not a GGUF file: bad magic \"%s\" (0x%08x) at byte 0, expected \"GGUF\"",
                    sh->path, shown, magic);
        goto out;
    }
    if ((s = rd_u32(&r, &version, "version"))) goto out;
    if ((version & 0xffffu) == 0) {
        s = tr_fail(err, TR_E_UNSUPPORTED,
                    "%s: big-endian GGUF file (version field 0x%08x at byte 4); only little-endian "
                    "files are supported",
                    sh->path, version);
        goto out;
    }
    if (version < 2 || version > 3) {
        s = tr_fail(err, TR_E_UNSUPPORTED,
                    "%s: GGUF version %u at byte 4 is not supported (versions 2 and 3 are)",
                    sh->path, version);
        goto out;
    }
    if ((s = rd_u64(&r, &n_tensors, "tensor count"))) goto out;
    if ((s = rd_u64(&r, &n_kv, "metadata count"))) goto out;
    /* smallest possible records: KV = 8 (len) + 1 (key) + 4 (type) + 1; tensor info = 8 + 1 +
     * 4 (n_dims) + 8 (ne0) + 4 (type) + 8 (offset) */
    if (n_kv > rd_remaining(&r) / 14) {
        s = tr_fail(err, TR_E_FORMAT,
                    "%s: metadata count %" PRIu64 " at byte 16 is absurd: the remaining %" PRIu64
                    " bytes hold at most %" PRIu64 " entries",
                    sh->path, n_kv, rd_remaining(&r), rd_remaining(&r) / 14);
        goto out;
    }
    if (n_tensors > rd_remaining(&r) / 33) {
        s = tr_fail(err, TR_E_FORMAT,
                    "%s: tensor count %" PRIu64 " at byte 8 is absurd: the remaining %" PRIu64
                    " bytes hold at most %" PRIu64 " tensor infos",
                    sh->path, n_tensors, rd_remaining(&r), rd_remaining(&r) / 33);
        goto out;
    }
    sh->version = version;

    /* metadata: the first shard's entries are kept; other shards are parsed for validation and
     * their split.* keys read */
    tr_gguf_kv *kvs = calloc(n_kv ? n_kv : 1, sizeof *kvs);
    if (!kvs) {
        s = tr_fail(err, TR_E_NOMEM, "%s: out of memory for %" PRIu64 " metadata entries",
                    sh->path, n_kv);
        goto out;
    }
    tr_gguf tmp = {.kvs = kvs};
    tr_index kix = {0};
    if (index_init(&kix, (int64_t)n_kv)) {
        free(kvs);
        s = tr_fail(err, TR_E_NOMEM, "out of memory");
        goto out;
    }
    uint32_t alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t split_no = -1, split_count = -1, split_tensors = -1;
    uint64_t i_kv;
    for (i_kv = 0; i_kv < n_kv; i_kv++) {
        tr_gguf_kv *kv = &kvs[i_kv];
        if ((s = read_kv(g, &r, kv))) break;
        int64_t dup = index_insert(&kix, &tmp, kv_name, kv->key, (int64_t)i_kv);
        if (dup >= 0) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: duplicate metadata key '%s' at byte %" PRIu64
                        " (first defined at byte %" PRIu64 ")",
                        sh->path, kv->key, kv->file_offset, kvs[dup].file_offset);
            break;
        }
        if (strcmp(kv->key, "general.alignment") == 0) {
            if (kv->type != TR_GGUF_U32 || kv->v.u == 0 || (kv->v.u & (kv->v.u - 1)) != 0) {
                s = tr_fail(err, TR_E_FORMAT,
                            "%s: general.alignment at byte %" PRIu64
                            " must be a non-zero power of two stored as u32 (got %s %" PRIu64 ")",
                            sh->path, kv->file_offset, tr_gguf_vtype_name(kv->type), kv->v.u);
                break;
            }
            alignment = (uint32_t)kv->v.u;
        }
        const bool is_int = kv->type != TR_GGUF_STRING && kv->type != TR_GGUF_ARRAY &&
                            kv->type != TR_GGUF_F32 && kv->type != TR_GGUF_F64;
        if (is_int && strcmp(kv->key, "split.no") == 0) split_no = (int64_t)kv->v.u;
        if (is_int && strcmp(kv->key, "split.count") == 0) split_count = (int64_t)kv->v.u;
        if (is_int && strcmp(kv->key, "split.tensors.count") == 0)
            split_tensors = (int64_t)kv->v.u;
    }
    free(kix.slots);
    if (s || !keep_kv) {
        for (uint64_t j = 0; j < n_kv; j++) { /* calloc'd: untouched entries hold NULLs */
            free(kvs[j].arr_data);
            free(kvs[j].arr_strs);
        }
        free(kvs);
        if (s) goto out;
    } else {
        g->kvs = kvs;
        g->n_kv = (int64_t)n_kv;
    }
    sh->alignment = alignment;
    sh->split_no = split_no;
    sh->split_count = split_count;
    sh->split_tensors = split_tensors;

    /* tensor infos */
    if (n_tensors > 0) {
        tr_gguf_tinfo *grown =
            realloc(g->tensors, ((size_t)g->n_tensors + n_tensors) * sizeof *g->tensors);
        if (!grown) {
            s = tr_fail(err, TR_E_NOMEM, "%s: out of memory for %" PRIu64 " tensor infos",
                        sh->path, n_tensors);
            goto out;
        }
        g->tensors = grown;
    }
    const int64_t first = g->n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        tr_gguf_tinfo *t = &g->tensors[first + (int64_t)i];
        memset(t, 0, sizeof *t);
        t->info_offset = r.pos;
        t->info.shard = sh->index;
        tr_str name;
        if ((s = rd_string(g, &r, &name, 0, "tensor name"))) goto out;
        if (name.len == 0 || name.len > GGUF_MAX_TENSOR_NAME || memchr(name.ptr, '\0', name.len)) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensor %" PRIu64 " at byte %" PRIu64 " has an invalid name (%" PRIu64
                        " bytes; names are 1..%d bytes without NULs)",
                        sh->path, i, t->info_offset, name.len, GGUF_MAX_TENSOR_NAME);
            goto out;
        }
        t->info.name = name.ptr;
        g->n_tensors++; /* from here on the entry is owned by g (freed with it) */
        uint32_t n_dims;
        if ((s = rd_u32(&r, &n_dims, name.ptr))) goto out;
        if (n_dims < 1 || n_dims > 4) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensor '%s' (info at byte %" PRIu64 ") has %u dimensions (1..4 allowed)",
                        sh->path, name.ptr, t->info_offset, n_dims);
            goto out;
        }
        t->info.n_dims = n_dims;
        uint64_t n_elems = 1;
        for (int d = 0; d < 4; d++) t->info.ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            if ((s = rd_u64(&r, &ne, name.ptr))) goto out;
            if (ne > (uint64_t)INT64_MAX || mul_overflows(n_elems, ne, &n_elems) ||
                n_elems > (uint64_t)INT64_MAX) {
                s = tr_fail(err, TR_E_FORMAT,
                            "%s: tensor '%s' (info at byte %" PRIu64 ") has an absurd shape: "
                            "dimension %u = %" PRIu64 " overflows the element count",
                            sh->path, name.ptr, t->info_offset, d, ne);
                goto out;
            }
            t->info.ne[d] = (int64_t)ne;
        }
        uint32_t type;
        if ((s = rd_u32(&r, &type, name.ptr))) goto out;
        if (!tr_type_known(type)) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensor '%s' (info at byte %" PRIu64 ") has unknown type id %u",
                        sh->path, name.ptr, t->info_offset, type);
            goto out;
        }
        t->info.type = (tr_type)type;
        const int64_t blck = tr_type_block_elems(t->info.type);
        if (t->info.ne[0] % blck != 0) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensor '%s' (info at byte %" PRIu64 "): row length %" PRId64
                        " is not a multiple of the %s block size %" PRId64,
                        sh->path, name.ptr, t->info_offset, t->info.ne[0],
                        tr_type_name(t->info.type), blck);
            goto out;
        }
        uint64_t nbytes = (uint64_t)(t->info.ne[0] / blck);
        bool ovf = mul_overflows(nbytes, tr_type_block_bytes(t->info.type), &nbytes);
        for (int d = 1; d < 4; d++) ovf |= mul_overflows(nbytes, (uint64_t)t->info.ne[d], &nbytes);
        if (ovf) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensor '%s' (info at byte %" PRIu64 "): byte size overflows",
                        sh->path, name.ptr, t->info_offset);
            goto out;
        }
        t->info.nbytes = nbytes;
        if ((s = rd_u64(&r, &t->rel_offset, name.ptr))) goto out;
    }

    /* data section */
    if (n_tensors > 0) {
        const uint64_t end = r.pos;
        const uint64_t pad = (alignment - end % alignment) % alignment;
        sh->data_start = end + pad;
        if (sh->data_start > sh->size) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: truncated file: tensor data should start at byte %" PRIu64
                        " but the file is %" PRIu64 " bytes",
                        sh->path, sh->data_start, sh->size);
            goto out;
        }
    } else {
        sh->data_start = r.pos;
    }
    const uint64_t data_size = sh->size - sh->data_start;
    for (int64_t i = first; i < g->n_tensors; i++) {
        tr_gguf_tinfo *t = &g->tensors[i];
        if (t->rel_offset % alignment != 0) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensor '%s' (info at byte %" PRIu64 "): data offset %" PRIu64
                        " is not a multiple of the alignment %u",
                        sh->path, t->info.name, t->info_offset, t->rel_offset, alignment);
            goto out;
        }
        if (t->rel_offset > data_size || t->info.nbytes > data_size - t->rel_offset) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensor '%s' (info at byte %" PRIu64 "): data [%" PRIu64 ", %" PRIu64
                        ") runs past the end of the file (%" PRIu64 " bytes)",
                        sh->path, t->info.name, t->info_offset, sh->data_start + t->rel_offset,
                        sh->data_start + t->rel_offset + t->info.nbytes, sh->size);
            goto out;
        }
        t->info.file_offset = sh->data_start + t->rel_offset;
    }
    sh->n_tensors = (int64_t)n_tensors;
    s = TR_OK;
out:
    free(r.buf);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* validation across the whole model                                                              */

static int cmp_by_offset(const void *a, const void *b, void *arg) {
    const tr_gguf *g = arg;
    const tr_gguf_tinfo *x = &g->tensors[*(const int64_t *)a];
    const tr_gguf_tinfo *y = &g->tensors[*(const int64_t *)b];
    if (x->info.shard != y->info.shard) return x->info.shard < y->info.shard ? -1 : 1;
    if (x->info.file_offset != y->info.file_offset)
        return x->info.file_offset < y->info.file_offset ? -1 : 1;
    return 0;
}

static tr_status check_tensors(tr_gguf *g, tr_error *err) {
    if (index_init(&g->tensor_index, g->n_tensors))
        return tr_fail(err, TR_E_NOMEM, "out of memory indexing tensors");
    for (int64_t i = 0; i < g->n_tensors; i++) {
        int64_t dup = index_insert(&g->tensor_index, g, tensor_name, g->tensors[i].info.name, i);
        if (dup >= 0)
            return tr_fail(err, TR_E_FORMAT,
                           "%s: duplicate tensor name '%s' (infos at byte %" PRIu64 " and %" PRIu64
                           ")",
                           g->shards[g->tensors[i].info.shard].path, g->tensors[i].info.name,
                           g->tensors[dup].info_offset, g->tensors[i].info_offset);
    }
    if (g->n_tensors < 2) return TR_OK;
    int64_t *order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order) return tr_fail(err, TR_E_NOMEM, "out of memory checking tensor overlap");
    for (int64_t i = 0; i < g->n_tensors; i++) order[i] = i;
    qsort_r(order, (size_t)g->n_tensors, sizeof *order, cmp_by_offset, g);
    tr_status s = TR_OK;
    for (int64_t k = 1; k < g->n_tensors; k++) {
        const tr_gguf_tinfo *a = &g->tensors[order[k - 1]];
        const tr_gguf_tinfo *b = &g->tensors[order[k]];
        if (a->info.shard != b->info.shard || a->info.nbytes == 0 || b->info.nbytes == 0)
            continue;
        if (a->info.file_offset + a->info.nbytes > b->info.file_offset) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64
                        ", %" PRIu64 ") overlap",
                        g->shards[a->info.shard].path, a->info.name, a->info.file_offset,
                        a->info.file_offset + a->info.nbytes, b->info.name, b->info.file_offset,
                        b->info.file_offset + b->info.nbytes);
            break;
        }
    }
    free(order);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* opening, split files                                                                           */

static tr_status not_a_file(const char *path, mode_t mode, tr_error *err) {
    if (S_ISDIR(mode)) return tr_fail(err, TR_E_IO, "%s: is a directory", path);
    const char *what = S_ISFIFO(mode)  ? "a FIFO (named pipe)"
                       : S_ISCHR(mode) ? "a character device"
                       : S_ISBLK(mode) ? "a block device"
                       : S_ISSOCK(mode) ? "a socket"
                                        : "not a regular file";
    return tr_fail(err, TR_E_IO, "%s: is %s; GGUF models must be regular files", path, what);
}

static tr_status open_shard(tr_gguf_shard *sh, const char *path, tr_error *err) {
    sh->fd = -1;
    sh->path = strdup(path);
    if (!sh->path) return tr_fail(err, TR_E_NOMEM, "out of memory");
    /* a FIFO or a device is refused before open(), which would block on a FIFO without a
     * writer; O_NONBLOCK covers a path replaced by one between the stat and the open */
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) return not_a_file(path, st.st_mode, err);
    int fd;
    do fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) return tr_fail(err, TR_E_IO, "%s: cannot open: %s", path, strerror(errno));
    sh->fd = fd;
    if (fstat(fd, &st) != 0)
        return tr_fail(err, TR_E_IO, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return not_a_file(path, st.st_mode, err);
    const int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    sh->size = (uint64_t)st.st_size;
    return TR_OK;
}

/* "<prefix>-00002-of-00005.gguf" -> prefix length and the two numbers */
static bool parse_split_name(const char *path, size_t *prefix_len, int *no, int *count) {
    const size_t n = strlen(path);
    const char *suffix = "-NNNNN-of-NNNNN.gguf";
    const size_t sl = strlen(suffix);
    if (n <= sl) return false;
    const char *p = path + n - sl;
    int a = 0, b = 0;
    for (size_t i = 0; i < sl; i++) {
        const char c = p[i], want = suffix[i];
        if (want == 'N') {
            if (c < '0' || c > '9') return false;
            if (i < 7) a = a * 10 + (c - '0');
            else b = b * 10 + (c - '0');
        } else if (c != want) {
            return false;
        }
    }
    *prefix_len = n - sl;
    *no = a;
    *count = b;
    return true;
}

static void free_gguf(tr_gguf *g) {
    if (!g) return;
    for (uint32_t i = 0; i < g->n_shards; i++) {
        tr_gguf_shard *sh = &g->shards[i];
        tr_mapguard_remove(sh->guard);
        if (sh->map) munmap(sh->map, sh->size);
        if (sh->fd >= 0) close(sh->fd);
        free(sh->path);
    }
    free(g->shards);
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kvs[i].arr_data);
        free(g->kvs[i].arr_strs);
    }
    free(g->kvs);
    free(g->tensors);
    free(g->key_index.slots);
    free(g->tensor_index.slots);
    while (g->arena) {
        arena_chunk *next = g->arena->next;
        free(g->arena);
        g->arena = next;
    }
    free(g);
}

void tr_gguf_close(tr_gguf *g) { free_gguf(g); }

static tr_status add_shard(tr_gguf *g, const char *path, bool keep_kv, tr_error *err) {
    tr_gguf_shard *grown = realloc(g->shards, (g->n_shards + 1) * sizeof *g->shards);
    if (!grown) return tr_fail(err, TR_E_NOMEM, "out of memory");
    g->shards = grown;
    tr_gguf_shard *sh = &g->shards[g->n_shards];
    memset(sh, 0, sizeof *sh);
    sh->index = g->n_shards;
    g->n_shards++;
    tr_status s = open_shard(sh, path, err);
    if (s) return s;
    return parse_shard(g, sh, keep_kv, err);
}

tr_status tr_gguf_open(const char *path, tr_gguf **out, tr_error *err) {
    *out = NULL;
    if (!path || !*path) return tr_fail(err, TR_E_ARG, "no GGUF path given");
    tr_gguf *g = calloc(1, sizeof *g);
    if (!g) return tr_fail(err, TR_E_NOMEM, "out of memory");
    tr_status s = add_shard(g, path, true, err);
    if (s) goto fail;
    tr_gguf_shard *first = &g->shards[0];
    g->version = first->version;
    g->alignment = first->alignment;

    if (first->split_count > 1 || first->split_no > 0) {
        const int64_t count = first->split_count;
        size_t prefix_len;
        int no, name_count;
        if (count < 1 || count > GGUF_MAX_SHARDS) {
            s = tr_fail(err, TR_E_FORMAT, "%s: split.count %" PRId64 " is out of range (1..%d)",
                        path, count, GGUF_MAX_SHARDS);
            goto fail;
        }
        if (!parse_split_name(path, &prefix_len, &no, &name_count)) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: split model (split.count %" PRId64 ") whose file name does not follow "
                        "<prefix>-NNNNN-of-NNNNN.gguf, so the other shards cannot be found",
                        path, count);
            goto fail;
        }
        if (name_count != count) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: file name says %d shards but split.count says %" PRId64, path,
                        name_count, count);
            goto fail;
        }
        char *buf = malloc(prefix_len + 32);
        if (!buf) {
            s = tr_fail(err, TR_E_NOMEM, "out of memory");
            goto fail;
        }
        memcpy(buf, path, prefix_len);
        if (first->split_no != 0) {
            /* the user named a later shard: restart from shard 1, whose metadata is the model's */
            snprintf(buf + prefix_len, 32, "-%05d-of-%05d.gguf", 1, (int)count);
            free_gguf(g);
            s = tr_gguf_open(buf, out, err);
            free(buf);
            return s;
        }
        for (int64_t k = 1; k < count && !s; k++) {
            snprintf(buf + prefix_len, 32, "-%05d-of-%05d.gguf", (int)k + 1, (int)count);
            s = add_shard(g, buf, false, err);
            if (s) break;
            const tr_gguf_shard *sh = &g->shards[g->n_shards - 1];
            if (sh->split_no < 0 || sh->split_count < 0)
                s = tr_fail(err, TR_E_FORMAT,
                            "%s: shard %" PRId64 " of %" PRId64 " has no %s key: not a shard of "
                            "this split model",
                            buf, k + 1, count, sh->split_no < 0 ? "split.no" : "split.count");
            else if (sh->split_no != k || sh->split_count != count)
                s = tr_fail(err, TR_E_FORMAT,
                            "%s: shard metadata says split.no %" PRId64 " of split.count %" PRId64
                            ", expected %" PRId64 " of %" PRId64,
                            buf, sh->split_no, sh->split_count, k, count);
        }
        free(buf);
        if (s) goto fail;
        first = &g->shards[0]; /* add_shard reallocated the shard array */
        if (first->split_tensors >= 0 && first->split_tensors != g->n_tensors) {
            s = tr_fail(err, TR_E_FORMAT,
                        "%s: split.tensors.count says %" PRId64 " tensors but the %" PRId64
                        " shards hold %" PRId64,
                        path, first->split_tensors, count, g->n_tensors);
            goto fail;
        }
    }
    if (index_init(&g->key_index, g->n_kv)) {
        s = tr_fail(err, TR_E_NOMEM, "out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < g->n_kv; i++) index_insert(&g->key_index, g, kv_name, g->kvs[i].key, i);
    if ((s = check_tensors(g, err))) goto fail;
    *out = g;
    return TR_OK;
fail:
    free_gguf(g);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* accessors                                                                                      */

uint32_t tr_gguf_version(const tr_gguf *g) { return g->version; }
uint32_t tr_gguf_alignment(const tr_gguf *g) { return g->alignment; }
uint32_t tr_gguf_n_shards(const tr_gguf *g) { return g->n_shards; }
const char *tr_gguf_shard_path(const tr_gguf *g, uint32_t i) {
    return i < g->n_shards ? g->shards[i].path : NULL;
}
uint64_t tr_gguf_shard_size(const tr_gguf *g, uint32_t i) {
    return i < g->n_shards ? g->shards[i].size : 0;
}
const void *tr_gguf_shard_map(const tr_gguf *g, uint32_t i) {
    return i < g->n_shards ? g->shards[i].map : NULL;
}
uint64_t tr_gguf_data_offset(const tr_gguf *g, uint32_t i) {
    return i < g->n_shards ? g->shards[i].data_start : 0;
}
int tr_gguf_shard_fd(const tr_gguf *g, uint32_t i) {
    return i < g->n_shards ? g->shards[i].fd : -1;
}

int64_t tr_gguf_n_kv(const tr_gguf *g) { return g->n_kv; }
int64_t tr_gguf_find_key(const tr_gguf *g, const char *key) {
    return index_find(&g->key_index, g, kv_name, key);
}

static const tr_gguf_kv *kv_at(const tr_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_kv) ? &g->kvs[i] : NULL;
}

const char *tr_gguf_key(const tr_gguf *g, int64_t i) {
    const tr_gguf_kv *kv = kv_at(g, i);
    return kv ? kv->key : NULL;
}
tr_gguf_vtype tr_gguf_kv_type(const tr_gguf *g, int64_t i) {
    const tr_gguf_kv *kv = kv_at(g, i);
    return kv ? kv->type : TR_GGUF_VTYPE_COUNT;
}
tr_gguf_vtype tr_gguf_arr_type(const tr_gguf *g, int64_t i) {
    const tr_gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == TR_GGUF_ARRAY ? kv->arr_type : TR_GGUF_VTYPE_COUNT;
}
uint64_t tr_gguf_arr_len(const tr_gguf *g, int64_t i) {
    const tr_gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == TR_GGUF_ARRAY ? kv->arr_len : 0;
}
const void *tr_gguf_arr_data(const tr_gguf *g, int64_t i) {
    const tr_gguf_kv *kv = kv_at(g, i);
    return kv && kv->type == TR_GGUF_ARRAY ? kv->arr_data : NULL;
}
tr_str tr_gguf_arr_str(const tr_gguf *g, int64_t i, uint64_t j) {
    const tr_gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type != TR_GGUF_ARRAY || kv->arr_type != TR_GGUF_STRING || j >= kv->arr_len)
        return (tr_str){NULL, 0};
    return kv->arr_strs[j];
}
tr_str tr_gguf_get_str(const tr_gguf *g, int64_t i) {
    const tr_gguf_kv *kv = kv_at(g, i);
    if (!kv || kv->type != TR_GGUF_STRING) return (tr_str){NULL, 0};
    return kv->str;
}

bool tr_gguf_get_int(const tr_gguf *g, int64_t i, int64_t *out) {
    const tr_gguf_kv *kv = kv_at(g, i);
    if (!kv) return false;
    switch (kv->type) {
    case TR_GGUF_U8: case TR_GGUF_U16: case TR_GGUF_U32: case TR_GGUF_BOOL:
        *out = (int64_t)kv->v.u;
        return true;
    case TR_GGUF_U64:
        if (kv->v.u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)kv->v.u;
        return true;
    case TR_GGUF_I8: case TR_GGUF_I16: case TR_GGUF_I32: case TR_GGUF_I64:
        *out = kv->v.i;
        return true;
    default: return false;
    }
}

bool tr_gguf_get_u64(const tr_gguf *g, int64_t i, uint64_t *out) {
    const tr_gguf_kv *kv = kv_at(g, i);
    if (kv && kv->type == TR_GGUF_U64) {
        *out = kv->v.u;
        return true;
    }
    int64_t v;
    if (!tr_gguf_get_int(g, i, &v) || v < 0) return false;
    *out = (uint64_t)v;
    return true;
}

bool tr_gguf_get_float(const tr_gguf *g, int64_t i, double *out) {
    const tr_gguf_kv *kv = kv_at(g, i);
    if (!kv) return false;
    if (kv->type == TR_GGUF_F32 || kv->type == TR_GGUF_F64) {
        *out = kv->v.f;
        return true;
    }
    int64_t v;
    if (!tr_gguf_get_int(g, i, &v)) return false;
    *out = (double)v;
    return true;
}

bool tr_gguf_kv_int(const tr_gguf *g, const char *key, int64_t *out) {
    return tr_gguf_get_int(g, tr_gguf_find_key(g, key), out);
}
bool tr_gguf_kv_float(const tr_gguf *g, const char *key, double *out) {
    return tr_gguf_get_float(g, tr_gguf_find_key(g, key), out);
}
bool tr_gguf_kv_str(const tr_gguf *g, const char *key, tr_str *out) {
    int64_t i = tr_gguf_find_key(g, key);
    if (tr_gguf_kv_type(g, i) != TR_GGUF_STRING) return false;
    *out = g->kvs[i].str;
    return true;
}

int64_t tr_gguf_n_tensors(const tr_gguf *g) { return g->n_tensors; }
int64_t tr_gguf_find_tensor(const tr_gguf *g, const char *name) {
    return index_find(&g->tensor_index, g, tensor_name, name);
}
const tr_tensor_info *tr_gguf_tensor(const tr_gguf *g, int64_t i) {
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i].info : NULL;
}

tr_status tr_gguf_map(tr_gguf *g, tr_error *err) {
    for (uint32_t i = 0; i < g->n_shards; i++) {
        tr_gguf_shard *sh = &g->shards[i];
        if (sh->map || sh->size == 0) continue;
        void *p = mmap(NULL, sh->size, PROT_READ, MAP_SHARED, sh->fd, 0);
        if (p == MAP_FAILED)
            return tr_fail(err, TR_E_IO, "%s: cannot map %" PRIu64 " bytes: %s", sh->path,
                           sh->size, strerror(errno));
        sh->map = p;
        sh->guard = tr_mapguard_add(p, sh->size);
    }
    return TR_OK;
}

tr_status tr_gguf_mapping_check(const tr_gguf *g, tr_error *err) {
    for (uint32_t i = 0; i < g->n_shards; i++) {
        uint64_t off;
        if (tr_mapguard_faulted(g->shards[i].guard, &off))
            return tr_fail(err, TR_E_IO,
                           "%s: the file changed or was truncated while in use: its data at byte "
                           "%" PRIu64 " can no longer be read (it was %" PRIu64 " bytes when "
                           "opened); the request was stopped, reload the model",
                           g->shards[i].path, off, g->shards[i].size);
    }
    return TR_OK;
}

const void *tr_gguf_tensor_data(const tr_gguf *g, int64_t i) {
    const tr_tensor_info *t = tr_gguf_tensor(g, i);
    if (!t || !g->shards[t->shard].map) return NULL;
    return (const char *)g->shards[t->shard].map + t->file_offset;
}

tr_status tr_gguf_read(const tr_gguf *g, int64_t i, uint64_t off, void *dst, uint64_t len,
                       tr_error *err) {
    const tr_tensor_info *t = tr_gguf_tensor(g, i);
    if (!t) return tr_fail(err, TR_E_ARG, "tensor index %" PRId64 " out of range", i);
    if (off > t->nbytes || len > t->nbytes - off)
        return tr_fail(err, TR_E_ARG,
                       "read of [%" PRIu64 ", %" PRIu64 ") is outside tensor '%s' (%" PRIu64
                       " bytes)",
                       off, off + len, t->name, t->nbytes);
    return tr_pread_full(g->shards[t->shard].fd, g->shards[t->shard].path, dst, len,
                         t->file_offset + off, err);
}

tr_status tr_pread_full(int fd, const char *path, void *dst, uint64_t len, uint64_t at,
                        tr_error *err) {
    uint8_t *p = dst;
    while (len > 0) {
        size_t want = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t got = pread(fd, p, want, (off_t)at);
        if (got < 0) {
            if (errno == EINTR) continue;
            return tr_fail(err, TR_E_IO, "%s: read error at byte %" PRIu64 ": %s", path, at,
                           strerror(errno));
        }
        if (got == 0)
            return tr_fail(err, TR_E_IO,
                           "%s: unexpected end of file at byte %" PRIu64 " (%" PRIu64
                           " bytes still wanted): the file is shorter than its header says "
                           "(truncated while in use?)",
                           path, at, len);
        p += got;
        at += (uint64_t)got;
        len -= (uint64_t)got;
    }
    return TR_OK;
}
