/*
 * Text <-> ids at the level of llama_vocab::impl::tokenize / token_to_piece / detokenize: special
 * tokens are split out of the text first (tokenizer_st_partition), the remaining fragments go to
 * the SPM or BPE model, and BOS/EOS are added as the file asks.
 */
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

/* a piece of the input: a special token (tok >= 0) or raw text [off, off + len) */
typedef struct frag {
    int32_t tok;
    size_t off, len;
} frag;

typedef struct fragv {
    frag *v;
    size_t n, cap;
} fragv;

static bool frag_push(fragv *f, frag x) {
    if (x.tok < 0 && x.len == 0) return true;
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 16;
        frag *q = realloc(f->v, nc * sizeof *q);
        if (!q) return false;
        f->v = q;
        f->cap = nc;
    }
    f->v[f->n++] = x;
    return true;
}

/* isspace() of the C locale, which is what llama.cpp's strip loops see */
static bool c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

/*
 * llama.cpp's partition: for each special token, longest text first, every raw fragment is cut at
 * each occurrence (searching on after the previous one), with LSTRIP/RSTRIP tokens eating the
 * whitespace next to them. Only tokens that occur somewhere in the text can occur in a fragment,
 * so one trie pass over the text first picks those; the cuts then run in llama.cpp's order.
 */
static tr_status partition(const tr_tokenizer *t, const char *text, size_t len, bool parse_special,
                           fragv *out, tr_error *err) {
    fragv cur = {0}, nxt = {0};
    unsigned char *seen = NULL;
    if (!frag_push(&cur, (frag){-1, 0, len})) goto oom;
    if (t->n_specials && len) {
        seen = calloc(t->n_specials, 1);
        if (!seen) goto oom;
        for (size_t pos = 0; pos < len; pos++) {
            int32_t node = t->root_child[(unsigned char)text[pos]];
            for (size_t j = pos; node >= 0;) {
                if (t->trie[node].special >= 0) seen[t->trie[node].special] = 1;
                if (++j >= len) break;
                unsigned char c = (unsigned char)text[j];
                for (node = t->trie[node].child; node >= 0 && t->trie[node].byte != c;)
                    node = t->trie[node].sibling;
            }
        }
    }
    for (size_t k = 0; seen && k < t->n_specials; k++) {
        if (!seen[k]) continue;
        int32_t id = t->specials[k];
        const tr_tok_entry *e = &t->tok[id];
        /* without parse_special only USER_DEFINED tokens are split out */
        if (!parse_special && (e->attr & (TR_TOKEN_ATTR_CONTROL | TR_TOKEN_ATTR_UNKNOWN))) continue;
        const char *tt = t->pool + e->off;
        nxt.n = 0;
        for (size_t i = 0; i < cur.n; i++) {
            frag f = cur.v[i];
            if (f.tok >= 0) {
                if (!frag_push(&nxt, f)) goto oom;
                continue;
            }
            size_t off = f.off, end = f.off + f.len;
            for (;;) {
                const char *m = find_bytes(text + off, end - off, tt, e->len);
                if (!m) {
                    if (!frag_push(&nxt, (frag){-1, off, end - off})) goto oom;
                    break;
                }
                size_t mo = (size_t)(m - text), left = mo - off;
                if (e->attr & TR_TOKEN_ATTR_LSTRIP)
                    while (left > 0 && c_space(text[off + left - 1])) left--;
                if (!frag_push(&nxt, (frag){-1, off, left}) || !frag_push(&nxt, (frag){id, 0, 0}))
                    goto oom;
                off = mo + e->len;
                if (e->attr & TR_TOKEN_ATTR_RSTRIP)
                    while (off < end && c_space(text[off])) off++;
                if (off >= end) break;
            }
        }
        fragv tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    free(seen);
    free(nxt.v);
    *out = cur;
    return TR_OK;
oom:
    free(seen);
    free(cur.v);
    free(nxt.v);
    return tr_fail(err, TR_E_NOMEM, "tokenize: out of memory");
}

tr_status tr_tokenize_buf(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                          bool parse_special, tr_ibuf *out, tr_tok_drops *drops, tr_error *err) {
    if (!text && len) return tr_fail(err, TR_E_ARG, "tokenize: NULL text of %zu bytes", len);
    fragv fr = {0};
    tr_cbuf buf = {0};
    tr_status st = partition(t, text, len, parse_special, &fr, err);
    if (st) return st;
    if (add_special && t->add_bos && !tr_ibuf_push(out, t->special[TR_SPECIAL_BOS])) goto oom;
    bool prev_special = true; /* SPM: the first fragment gets the space prefix too */
    for (size_t i = 0; i < fr.n; i++) {
        const frag *f = &fr.v[i];
        if (f->tok >= 0) {
            if (!tr_ibuf_push(out, f->tok)) goto oom;
            prev_special = true;
            continue;
        }
        if (t->kind == TR_TOK_BPE) {
            if ((st = tr_bpe_encode(t, text + f->off, f->len, out, drops, err))) goto done;
            continue;
        }
        /* SPM: optional leading space, then every space as U+2581 */
        buf.n = 0;
        if (t->add_space_prefix && prev_special && !tr_cbuf_append(&buf, "\xe2\x96\x81", 3))
            goto oom;
        for (size_t j = 0; j < f->len; j++) {
            const char *c = text + f->off + j;
            if (!(*c == ' ' ? tr_cbuf_append(&buf, "\xe2\x96\x81", 3) : tr_cbuf_append(&buf, c, 1)))
                goto oom;
        }
        if ((st = tr_spm_encode(t, buf.p, buf.n, out, drops, err))) goto done;
        prev_special = false;
    }
    if (add_special && t->add_eos && !tr_ibuf_push(out, t->special[TR_SPECIAL_EOS])) goto oom;
    goto done;
oom:
    st = tr_fail(err, TR_E_NOMEM, "tokenize: out of memory");
done:
    free(fr.v);
    tr_cbuf_free(&buf);
    return st;
}

tr_status tr_tokenize(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *out, size_t cap, size_t *n_out, tr_error *err) {
    return tr_tokenize_ex(t, text, len, add_special, parse_special, out, cap, n_out, NULL, NULL,
                          err);
}

tr_status tr_tokenize_ex(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, int32_t *out, size_t cap, size_t *n_out,
                         size_t *n_dropped, int *first_dropped, tr_error *err) {
    tr_ibuf ids = {0};
    tr_tok_drops drops = {0, -1};
    *n_out = 0;
    tr_status st = tr_tokenize_buf(t, text, len, add_special, parse_special, &ids, &drops, err);
    if (n_dropped) *n_dropped = drops.n;
    if (first_dropped) *first_dropped = drops.first;
    if (st) {
        tr_ibuf_free(&ids);
        return st;
    }
    *n_out = ids.n;
    if (ids.n > cap) {
        tr_ibuf_free(&ids);
        return tr_fail(err, TR_E_ARG, "tokenize: %zu tokens do not fit in %zu", *n_out, cap);
    }
    if (ids.n) memcpy(out, ids.v, ids.n * sizeof *out);
    tr_ibuf_free(&ids);
    return TR_OK;
}

/* ---- pieces ---------------------------------------------------------------------------------- */

/* counts every byte, stores what fits, and drops up to `lstrip` leading spaces */
typedef struct sink {
    char *buf;
    size_t cap, n;
    int lstrip;
} sink;

static void put(sink *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s->lstrip > 0 && s->n == 0 && p[i] == ' ') {
            s->lstrip--;
            continue;
        }
        s->lstrip = 0;
        if (s->n < s->cap) s->buf[s->n] = p[i];
        s->n++;
    }
}

static void put_unescaped(sink *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && !memcmp(p + i, "\xe2\x96\x81", 3)) {
            put(s, " ", 1);
            i += 2;
        } else {
            put(s, p + i, 1);
        }
    }
}

/* "<0xXX>" -> the byte (llama.cpp parses the two characters after "<0x" with strtol) */
static char token_byte(const char *p, size_t n) {
    unsigned v = 0;
    for (size_t i = 3; i < 5 && i < n; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d == 16) break;
        v = v * 16 + d;
    }
    return (char)v;
}

/* BPE: undo the GPT-2 byte alphabet; a character outside it is shown as llama.cpp does */
static void put_bpe_decoded(sink *s, const char *p, size_t n) {
    static const char hex[] = "0123456789abcdef";
    for (size_t off = 0; off < n;) {
        uint32_t cp = tr_utf8_decode((const unsigned char *)p, n, &off);
        int b = tr_cp_to_byte(cp);
        if (b >= 0) {
            char c = (char)b;
            put(s, &c, 1);
            continue;
        }
        char u[4];
        size_t un = tr_utf8_encode(cp, u);
        put(s, "[UNK_BYTE_0x", 12);
        for (size_t k = 0; k < un; k++) {
            char h[2] = {hex[(unsigned char)u[k] >> 4], hex[(unsigned char)u[k] & 15]};
            put(s, h, 2);
        }
        put(s, p, n);
        put(s, "]", 1);
    }
}

static void piece(const tr_tokenizer *t, int32_t id, bool special, sink *s) {
    if (id < 0 || id >= t->n_vocab) return;
    const tr_tok_entry *e = &t->tok[id];
    const uint32_t attr_special = TR_TOKEN_ATTR_UNKNOWN | TR_TOKEN_ATTR_CONTROL;
    if (!special && (e->attr & attr_special)) return;
    const char *p = t->pool + e->off;
    if (e->attr & (attr_special | TR_TOKEN_ATTR_USER_DEFINED)) {
        put(s, p, e->len);
    } else if (e->attr & TR_TOKEN_ATTR_NORMAL) {
        if (t->kind == TR_TOK_SPM || t->escape_ws)
            put_unescaped(s, p, e->len);
        else
            put_bpe_decoded(s, p, e->len);
    } else if (e->attr & TR_TOKEN_ATTR_BYTE) {
        char c = token_byte(p, e->len);
        put(s, &c, 1);
    }
    /* UNDEFINED and UNUSED-only tokens render as nothing, as in llama.cpp */
}

int tr_token_to_piece(const tr_tokenizer *t, int32_t id, char *buf, size_t cap,
                      bool render_special) {
    sink s = {buf, buf ? cap : 0, 0, 0};
    piece(t, id, render_special, &s);
    /* token texts are capped at 2^30 bytes at load, so the size fits an int */
    return s.n <= s.cap ? (int)s.n : -(int)s.n;
}

/* llama.cpp's clean_up_tokenization_spaces, in place, with its exact three passes */
static size_t clean_spaces(char *text, size_t total) {
    size_t total1 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total1; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
        text[total++] = x;
    }
    size_t total2 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total2; i++) {
        char x = text[i];
        if (x == '\'' && i + 1 < total2 && text[i - 1] == ' ' && text[i + 1] == ' ') {
            total--;
            text[++i] = '\0';
        }
        text[total++] = x;
    }
    size_t total3 = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < total3; i++) {
        char x = text[i];
        if (text[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
            char x1 = text[i + 1];
            if (x1 == 's' || x1 == 'm')
                total--; /* " 's", " 'm" */
            else if (i + 2 < total3 &&
                     ((x1 == 'r' && text[i + 2] == 'e') || (x1 == 'v' && text[i + 2] == 'e')))
                total--; /* " 're", " 've" */
        }
        text[total++] = x;
    }
    return total;
}

tr_status tr_detokenize(const tr_tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                        bool render_special, char *buf, size_t cap, size_t *n_out, tr_error *err) {
    *n_out = 0;
    if (!ids && n > 0) return tr_fail(err, TR_E_ARG, "detokenize: ids is NULL");
    /* as llama.cpp: only the BOS/EOS that tokenizing with add_special would have added */
    if (remove_special && t->add_bos && n > 0 && ids[0] == t->special[TR_SPECIAL_BOS]) {
        ids++;
        n--;
    }
    if (remove_special && t->add_eos && n > 0 && ids[n - 1] == t->special[TR_SPECIAL_EOS]) n--;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return tr_fail(err, TR_E_ARG,
                           "detokenize: id %d at %zu is outside the vocabulary of %d", ids[i], i,
                           t->n_vocab);
    /* measure, then render into a scratch buffer (the space clean-up needs the whole text) */
    sink m = {NULL, 0, 0, t->add_space_prefix ? 1 : 0};
    for (size_t i = 0; i < n; i++) {
        piece(t, ids[i], render_special, &m);
        m.lstrip = 0;
    }
    char *tmp = malloc(m.n ? m.n : 1);
    if (!tmp) return tr_fail(err, TR_E_NOMEM, "detokenize: out of memory (%zu bytes)", m.n);
    sink s = {tmp, m.n, 0, t->add_space_prefix ? 1 : 0};
    for (size_t i = 0; i < n; i++) {
        piece(t, ids[i], render_special, &s);
        s.lstrip = 0;
    }
    size_t total = t->clean_spaces ? clean_spaces(tmp, s.n) : s.n;
    *n_out = total;
    if (total > cap) {
        free(tmp);
        return tr_fail(err, TR_E_ARG, "detokenize: %zu bytes do not fit in %zu", total, cap);
    }
    if (total) memcpy(buf, tmp, total);
    free(tmp);
    return TR_OK;
}
