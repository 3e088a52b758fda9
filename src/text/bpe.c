/*
 * Byte-level BPE as llama.cpp's llm_tokenizer_bpe_session: each pre-tokenized word starts as one
 * symbol per UTF-8 character (of the GPT-2 byte alphabet, or raw UTF-8 for gemma4), then the
 * adjacent pair with the lowest merge rank is merged until none is left (ties: leftmost). A
 * binary heap of candidate pairs plus a doubly linked list of symbols makes this O(n log n) in the
 * word length; a popped pair is stale (and skipped) when either side has changed since it was
 * pushed, which the byte lengths reveal because symbols only ever grow to the right.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

typedef struct sym {
    size_t start, n; /* bytes of the word; n == 0 once merged into its left neighbour */
    int32_t prev, next;
} sym;

typedef struct bigram {
    int32_t rank;
    int32_t left, right;
    size_t size;
} bigram;

/* a is popped before b: lower rank, then the leftmost */
static bool before(const void *va, const void *vb) {
    const bigram *a = va, *b = vb;
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}


typedef struct session {
    const tr_tokenizer *t;
    const char *w;
    sym *syms;
    size_t cap;
    tr_heap q;
    tr_tok_drops *drops; /* may be NULL */
} session;

static bool add_bigram(session *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return true;
    const sym *a = &s->syms[l], *b = &s->syms[r];
    int32_t rank = tr_merge_rank(s->t, s->w + a->start, a->n, s->w + b->start, b->n);
    if (rank < 0) return true;
    const bigram b2 = {rank, l, r, a->n + b->n};
    return tr_heap_push(&s->q, &b2);
}

/* a symbol that is not a token: one token per byte, if the vocabulary has one (else nothing, as
 * llama.cpp, counted in drops) */
static bool emit_bytes(const tr_tokenizer *t, const char *p, size_t n, tr_ibuf *out,
                       tr_tok_drops *drops) {
    bool dropped = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)p[i];
        int32_t id = t->byte_encode ? t->byte_char[b] : t->byte_hex[b];
        if (id >= 0 && !tr_ibuf_push(out, id)) return false;
        dropped |= id < 0;
    }
    if (dropped && drops) {
        /* the input byte it stood for: byte-level BPE symbols are characters of the GPT-2 byte
         * alphabet */
        int orig = (unsigned char)p[0];
        if (t->byte_encode) {
            size_t off = 0;
            const int b = tr_cp_to_byte(tr_utf8_decode((const unsigned char *)p, n, &off));
            if (b >= 0) orig = b;
        }
        if (!drops->n++) drops->first = orig;
    }
    return true;
}

static bool encode_word(session *s, const char *w, size_t n, tr_ibuf *out) {
    const tr_tokenizer *t = s->t;
    s->w = w;
    if (t->ignore_merges || t->gemma4) {
        bool whole = t->ignore_merges;
        if (!whole) { /* gemma4: a run of newlines that is a token stays whole */
            whole = true;
            for (size_t i = 0; i < n; i++) whole &= w[i] == '\n';
        }
        int32_t id = whole ? tr_vocab_find(t, w, n) : -1;
        if (id >= 0) return tr_ibuf_push(out, id);
    }
    if (n > s->cap) {
        sym *q = realloc(s->syms, n * sizeof *q);
        if (!q) return false;
        s->syms = q;
        s->cap = n;
    }
    int32_t ns = 0;
    for (size_t off = 0; off < n; ns++) {
        size_t l = tr_utf8_len((unsigned char)w[off]);
        if (l > n - off) l = n - off;
        s->syms[ns] = (sym){off, l, ns - 1, off + l == n ? -1 : ns + 1};
        off += l;
    }
    s->q.n = 0;
    for (int32_t i = 1; i < ns; i++)
        if (!add_bigram(s, i - 1, i)) return false;
    while (s->q.n) {
        bigram b;
        tr_heap_pop(&s->q, &b);
        sym *l = &s->syms[b.left], *r = &s->syms[b.right];
        if (!l->n || !r->n || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        if (!add_bigram(s, l->prev, b.left) || !add_bigram(s, b.left, l->next)) return false;
    }
    for (int32_t i = 0; i >= 0 && ns > 0; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        int32_t id = tr_vocab_find(t, w + y->start, y->n);
        if (id >= 0) {
            if (!tr_ibuf_push(out, id)) return false;
        } else if (!emit_bytes(t, w + y->start, y->n, out, s->drops)) {
            return false;
        }
    }
    return true;
}

tr_status tr_bpe_encode(const tr_tokenizer *t, const char *text, size_t len, tr_ibuf *out,
                        tr_tok_drops *drops, tr_error *err) {
    tr_cbuf esc = {0}, words = {0};
    tr_zbuf ends = {0};
    session s = {.t = t, .q = {.size = sizeof(bigram), .before = before}, .drops = drops};
    tr_status st = TR_OK;
    if (t->escape_ws) { /* SPM-style BPE (gemma4): spaces are U+2581 before splitting */
        for (size_t i = 0; i < len; i++) {
            bool ok = text[i] == ' ' ? tr_cbuf_append(&esc, "\xe2\x96\x81", 3)
                                     : tr_cbuf_append(&esc, text + i, 1);
            if (!ok) goto oom;
        }
        text = esc.p;
        len = esc.n;
    }
    if ((st = tr_pretok_split(&t->pretok, text, len, t->byte_encode, &words, &ends, err)))
        goto done;
    for (size_t i = 0, start = 0; i < ends.n; start = ends.v[i++])
        if (!encode_word(&s, words.p + start, ends.v[i] - start, out)) goto oom;
    goto done;
oom:
    st = tr_fail(err, TR_E_NOMEM, "BPE: out of memory");
done:
    tr_cbuf_free(&esc);
    tr_cbuf_free(&words);
    tr_zbuf_free(&ends);
    free(s.syms);
    tr_heap_free(&s.q);
    return st;
}
