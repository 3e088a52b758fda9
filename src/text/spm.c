/*
 * SentencePiece-style BPE as llama.cpp's llm_tokenizer_spm_session: the (already space-escaped)
 * fragment starts as one symbol per UTF-8 character (by lead byte, so invalid UTF-8 stays as
 * single bytes); the adjacent pair whose concatenation is a token with the highest score is merged
 * until no pair forms a token (ties: leftmost). What is left and is not a token becomes byte tokens
 * "<0xXX>". Same heap + linked-list scheme as bpe.c.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

typedef struct sym {
    size_t start, n;
    int32_t prev, next;
} sym;

typedef struct bigram {
    float score;
    int32_t left, right;
    size_t size;
} bigram;

/* a is popped before b: higher score, then the leftmost */
static bool before(const void *va, const void *vb) {
    const bigram *a = va, *b = vb;
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}


static bool try_add(const tr_tokenizer *t, const char *text, const sym *syms, tr_heap *q, int32_t l,
                    int32_t r) {
    if (l < 0 || r < 0) return true;
    size_t size = syms[l].n + syms[r].n; /* the two symbols are adjacent in the text */
    int32_t id = tr_vocab_find(t, text + syms[l].start, size);
    if (id < 0) return true;
    const bigram b = {t->tok[id].score, l, r, size};
    return tr_heap_push(q, &b);
}

tr_status tr_spm_encode(const tr_tokenizer *t, const char *text, size_t len, tr_ibuf *out,
                        tr_tok_drops *drops, tr_error *err) {
    if (!len) return TR_OK;
    sym *syms = malloc(len * sizeof *syms);
    tr_heap q = {.size = sizeof(bigram), .before = before};
    if (!syms) goto oom;
    int32_t ns = 0;
    for (size_t off = 0; off < len; ns++) {
        size_t l = tr_utf8_len((unsigned char)text[off]);
        if (l > len - off) l = len - off;
        syms[ns] = (sym){off, l, ns - 1, off + l == len ? -1 : ns + 1};
        off += l;
    }
    for (int32_t i = 1; i < ns; i++)
        if (!try_add(t, text, syms, &q, i - 1, i)) goto oom;
    while (q.n) {
        bigram b;
        tr_heap_pop(&q, &b);
        sym *l = &syms[b.left], *r = &syms[b.right];
        if (!l->n || !r->n || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) syms[r->next].prev = b.left;
        if (!try_add(t, text, syms, &q, l->prev, b.left) ||
            !try_add(t, text, syms, &q, b.left, l->next))
            goto oom;
    }
    /* Every merged symbol is a token (merges only happen into tokens), so llama.cpp's
     * resegmentation reduces to: a token, or its bytes. */
    for (int32_t i = 0; i >= 0; i = syms[i].next) {
        const sym *y = &syms[i];
        int32_t id = tr_vocab_find(t, text + y->start, y->n);
        if (id >= 0) {
            if (!tr_ibuf_push(out, id)) goto oom;
            continue;
        }
        for (size_t k = 0; k < y->n; k++) {
            unsigned char c = (unsigned char)text[y->start + k];
            int32_t b = t->byte_hex[c] >= 0 ? t->byte_hex[c] : t->byte_char[c];
            /* no token for this byte: llama.cpp throws here; <unk> is the closest meaning */
            if (b < 0) b = t->special[TR_SPECIAL_UNK];
            if (b >= 0 && !tr_ibuf_push(out, b)) goto oom;
            if (b < 0 && drops && !drops->n++) drops->first = c; /* no <unk> either: dropped */
        }
    }
    free(syms);
    tr_heap_free(&q);
    return TR_OK;
oom:
    free(syms);
    tr_heap_free(&q);
    return tr_fail(err, TR_E_NOMEM, "SPM: out of memory (fragment of %zu bytes)", len);
}
