/* Small helpers for the tokenizers: growable buffers, the hash table, UTF-8 with llama.cpp's
 * decoding rules, and the GPT-2 byte-to-unicode alphabet. */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

/* ---- growable buffers ------------------------------------------------------------------------ */

/* Grow *p (element size `sz`) to hold at least `need` elements; doubling keeps appends amortized
 * O(1). Overflow of the byte count is an allocation failure. */
static bool grow(void **p, size_t *cap, size_t need, size_t sz) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2) return false;
        nc *= 2;
    }
    if (nc > SIZE_MAX / sz) return false;
    void *q = realloc(*p, nc * sz);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

bool tr_ibuf_push(tr_ibuf *b, int32_t x) {
    if (!grow((void **)&b->v, &b->cap, b->n + 1, sizeof *b->v)) return false;
    b->v[b->n++] = x;
    return true;
}

bool tr_zbuf_push(tr_zbuf *b, size_t x) {
    if (!grow((void **)&b->v, &b->cap, b->n + 1, sizeof *b->v)) return false;
    b->v[b->n++] = x;
    return true;
}

bool tr_cbuf_reserve(tr_cbuf *b, size_t extra) {
    if (extra > SIZE_MAX - b->n) return false;
    return grow((void **)&b->p, &b->cap, b->n + extra, 1);
}

bool tr_cbuf_append(tr_cbuf *b, const void *p, size_t n) {
    if (!n) return true;
    if (!tr_cbuf_reserve(b, n)) return false;
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return true;
}

void tr_ibuf_free(tr_ibuf *b) {
    free(b->v);
    *b = (tr_ibuf){0};
}
void tr_cbuf_free(tr_cbuf *b) {
    free(b->p);
    *b = (tr_cbuf){0};
}
void tr_zbuf_free(tr_zbuf *b) {
    free(b->v);
    *b = (tr_zbuf){0};
}

/* ---- hash table ------------------------------------------------------------------------------ */

bool tr_hmap_init(tr_hmap *m, size_t n_expected) {
    size_t cap = 16;
    /* load factor <= 1/2 keeps probe sequences short */
    while (cap < n_expected * 2) {
        if (cap > SIZE_MAX / 2 / sizeof(int32_t)) return false;
        cap *= 2;
    }
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return false;
    memset(m->slots, 0xff, cap * sizeof *m->slots); /* all -1 */
    m->mask = cap - 1;
    return true;
}

void tr_hmap_free(tr_hmap *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
}

/* ---- UTF-8 ----------------------------------------------------------------------------------- */

uint32_t tr_utf8_decode(const unsigned char *s, size_t len, size_t *off) {
    size_t o = *off;
    unsigned char c = s[o];
    if (c < 0x80) {
        *off = o + 1;
        return c;
    }
    /* Lead byte, continuation bytes, then the value: overlong forms and values above U+10FFFF are
     * invalid (llama.cpp b11739 agrees byte for byte); surrogates are accepted as llama.cpp does.
     * An invalid sequence yields U+FFFD for its first byte only, and decoding resumes at the next
     * byte. */
    size_t n = c >= 0xf8 ? 0 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (!n || o + n > len) goto invalid;
    uint32_t cp = c & (0x7fu >> n);
    for (size_t k = 1; k < n; k++) {
        if ((s[o + k] & 0xc0) != 0x80) goto invalid;
        cp = cp << 6 | (s[o + k] & 0x3fu);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10ffff) goto invalid;
    *off = o + n;
    return cp;
invalid:
    *off = o + 1;
    return 0xFFFD;
}

size_t tr_utf8_encode(uint32_t cp, char out[4]) {
    if (cp <= 0x7f) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp <= 0x7ff) {
        out[0] = (char)(0xc0 | ((cp >> 6) & 0x1f));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp > 0x10ffff) cp = 0xFFFD;
    if (cp <= 0xffff) {
        out[0] = (char)(0xe0 | ((cp >> 12) & 0x0f));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | ((cp >> 18) & 0x07));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- GPT-2 byte alphabet --------------------------------------------------------------------- */

/* Printable bytes 0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF map to themselves; the other 68 bytes, in
 * increasing order, map to U+0100.. : 0x00-0x20 -> +0..32, 0x7F-0xA0 -> +33..66, 0xAD -> +67. */
uint32_t tr_byte_to_cp(unsigned char b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae) return b;
    if (b <= 0x20) return 0x100u + b;
    if (b <= 0xa0) return 0x100u + 33 + (b - 0x7fu);
    return 0x100u + 67; /* 0xAD */
}

int tr_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
        return (int)cp;
    if (cp >= 0x100 && cp <= 0x100 + 32) return (int)(cp - 0x100);
    if (cp >= 0x100 + 33 && cp <= 0x100 + 66) return (int)(cp - 0x100 - 33 + 0x7f);
    if (cp == 0x100 + 67) return 0xad;
    return -1;
}

/* ---- binary heap ------------------------------------------------------------------------------ */

bool tr_heap_push(tr_heap *h, const void *item) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        char *q = realloc(h->v, nc * h->size);
        if (!q) return false;
        h->v = q;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!h->before(item, h->v + p * h->size)) break;
        memcpy(h->v + i * h->size, h->v + p * h->size, h->size);
        i = p;
    }
    memcpy(h->v + i * h->size, item, h->size);
    return true;
}

void tr_heap_pop(tr_heap *h, void *out) {
    memcpy(out, h->v, h->size);
    const char *last = h->v + --h->n * h->size;
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->before(h->v + (c + 1) * h->size, h->v + c * h->size)) c++;
        if (!h->before(h->v + c * h->size, last)) break;
        memcpy(h->v + i * h->size, h->v + c * h->size, h->size);
        i = c;
    }
    if (h->n) memmove(h->v + i * h->size, last, h->size);
}

void tr_heap_free(tr_heap *h) {
    free(h->v);
    h->v = NULL;
    h->n = h->cap = 0;
}
