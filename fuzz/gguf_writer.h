/*
 * A small in-memory GGUF writer for the fuzz targets: metadata entries kept as a list that a
 * target can edit (set, replace the type, delete), then serialised with a fixed tensor table
 * and opened from a memfd. Only what the targets need; no error handling beyond abort() (a
 * fuzz target's own allocation failure is not a finding).
 */
#ifndef TR_FUZZ_GGUF_WRITER_H
#define TR_FUZZ_GGUF_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "terrace.h"

typedef struct fw_buf {
    uint8_t *p;
    size_t n, cap;
} fw_buf;

static inline void fw_put(fw_buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
static inline void fw_u32(fw_buf *b, uint32_t v) { fw_put(b, &v, 4); }
static inline void fw_u64(fw_buf *b, uint64_t v) { fw_put(b, &v, 8); }
static inline void fw_str(fw_buf *b, const void *s, size_t n) {
    fw_u64(b, n);
    fw_put(b, s, n);
}

/* one metadata entry: key, type and the value's bytes as GGUF stores them after the type */
typedef struct fw_kv {
    char key[96];
    uint32_t type;
    fw_buf val;
} fw_kv;

typedef struct fw_meta {
    fw_kv *kv;
    size_t n, cap;
} fw_meta;

static inline fw_kv *fw_find(fw_meta *m, const char *key) {
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->kv[i].key, key)) return &m->kv[i];
    return NULL;
}

/* the entry for key, emptied (created at the end if absent) */
static inline fw_kv *fw_slot(fw_meta *m, const char *key, uint32_t type) {
    fw_kv *e = fw_find(m, key);
    if (!e) {
        if (m->n == m->cap) {
            m->cap = m->cap ? m->cap * 2 : 32;
            m->kv = realloc(m->kv, m->cap * sizeof *m->kv);
            if (!m->kv) abort();
        }
        e = &m->kv[m->n++];
        memset(e, 0, sizeof *e);
        snprintf(e->key, sizeof e->key, "%s", key);
    }
    e->type = type;
    e->val.n = 0;
    return e;
}

static inline void fw_drop(fw_meta *m, const char *key) {
    fw_kv *e = fw_find(m, key);
    if (!e) return;
    free(e->val.p);
    *e = m->kv[--m->n];
}

static inline void fw_set_u32(fw_meta *m, const char *k, uint32_t v) {
    fw_u32(&fw_slot(m, k, TR_GGUF_U32)->val, v);
}
static inline void fw_set_f32(fw_meta *m, const char *k, float v) {
    fw_put(&fw_slot(m, k, TR_GGUF_F32)->val, &v, 4);
}
static inline void fw_set_str(fw_meta *m, const char *k, const char *v) {
    fw_str(&fw_slot(m, k, TR_GGUF_STRING)->val, v, strlen(v));
}
/* an array: element type, count, then the elements' bytes (strings length-prefixed) */
static inline fw_buf *fw_set_arr(fw_meta *m, const char *k, uint32_t et, uint64_t n) {
    fw_kv *e = fw_slot(m, k, TR_GGUF_ARRAY);
    fw_u32(&e->val, et);
    fw_u64(&e->val, n);
    return &e->val;
}

static inline void fw_meta_free(fw_meta *m) {
    for (size_t i = 0; i < m->n; i++) free(m->kv[i].val.p);
    free(m->kv);
    memset(m, 0, sizeof *m);
}

static inline fw_meta fw_meta_copy(const fw_meta *m) {
    fw_meta c = {0};
    c.cap = c.n = m->n;
    c.kv = malloc((m->n ? m->n : 1) * sizeof *c.kv);
    if (!c.kv) abort();
    for (size_t i = 0; i < m->n; i++) {
        c.kv[i] = m->kv[i];
        c.kv[i].val = (fw_buf){0};
        fw_put(&c.kv[i].val, m->kv[i].val.p, m->kv[i].val.n);
    }
    return c;
}

/* a tensor of the fixed table: F32 data, ne[0] innermost */
typedef struct fw_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[4];
    const float *data;
} fw_tensor;

static inline uint64_t fw_elems(const fw_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n;
}

/* header, metadata, tensor infos, data (each tensor 32-byte aligned) */
static inline void fw_serialise(const fw_meta *m, const fw_tensor *t, size_t n_t, fw_buf *out) {
    out->n = 0;
    fw_put(out, "GGUF", 4);
    fw_u32(out, 3);
    fw_u64(out, n_t);
    fw_u64(out, m->n);
    for (size_t i = 0; i < m->n; i++) {
        fw_str(out, m->kv[i].key, strlen(m->kv[i].key));
        fw_u32(out, m->kv[i].type);
        fw_put(out, m->kv[i].val.p, m->kv[i].val.n);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n_t; i++) {
        fw_str(out, t[i].name, strlen(t[i].name));
        fw_u32(out, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims; d++) fw_u64(out, t[i].ne[d]);
        fw_u32(out, TR_TYPE_F32);
        fw_u64(out, off);
        off += (fw_elems(&t[i]) * 4 + 31) / 32 * 32;
    }
    static const uint8_t zeros[32];
    fw_put(out, zeros, (32 - out->n % 32) % 32);
    for (size_t i = 0; i < n_t; i++) {
        const size_t bytes = (size_t)fw_elems(&t[i]) * 4;
        fw_put(out, t[i].data, bytes);
        fw_put(out, zeros, (32 - bytes % 32) % 32);
    }
}

/* one memfd per process, rewritten for each input; its /proc path opens it */
static inline const char *fw_memfd_path(const fw_buf *b) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz.gguf", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, b->p, b->n, 0) != (ssize_t)b->n) abort();
    return path;
}

/* the 256 characters of the GPT-2 byte alphabet, as UTF-8, for byte b */
static inline size_t fw_gpt2_byte(int b, char out[3]) {
    unsigned cp;
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae) {
        cp = (unsigned)b;
    } else {
        int n = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae)) n++;
        cp = 256u + (unsigned)n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

#endif
