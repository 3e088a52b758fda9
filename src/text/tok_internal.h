/* Tokenizer internals shared by the files in src/text: the tokenizer struct, growable buffers, the
 * byte-string hash table, UTF-8 helpers with llama.cpp's exact (lenient) decoding rules. */
#ifndef TR_TEXT_TOK_INTERNAL_H
#define TR_TEXT_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "terrace.h"

/* The tokenizer's public functions are declared in include/terrace.h; these are for the files of
 * src/text and the tokenizer's white-box tests. */

typedef enum tr_tok_kind {
    TR_TOK_SPM = 1, /* tokenizer.ggml.model = "llama" */
    TR_TOK_BPE = 2, /* "gpt2" (byte-level) and "gemma4" (raw UTF-8) */
} tr_tok_kind;

/* GGUF `tokenizer.ggml.token_type` values */
enum {
    TR_TOKEN_TYPE_UNDEFINED = 0,
    TR_TOKEN_TYPE_NORMAL = 1,
    TR_TOKEN_TYPE_UNKNOWN = 2,
    TR_TOKEN_TYPE_CONTROL = 3,
    TR_TOKEN_TYPE_USER_DEFINED = 4,
    TR_TOKEN_TYPE_UNUSED = 5,
    TR_TOKEN_TYPE_BYTE = 6,
};

tr_tok_kind tr_tokenizer_kind(const tr_tokenizer *t);
bool tr_tokenizer_add_space_prefix(const tr_tokenizer *t);
size_t tr_tokenizer_n_merges(const tr_tokenizer *t);
int32_t tr_token_type(const tr_tokenizer *t, int32_t id); /* GGUF token_type; -1 if out of range */

/* ---- growable buffers (all return false on allocation failure) ------------------------------- */

typedef struct tr_ibuf {
    int32_t *v;
    size_t n, cap;
} tr_ibuf;

typedef struct tr_cbuf {
    char *p;
    size_t n, cap;
} tr_cbuf;

typedef struct tr_zbuf {
    size_t *v;
    size_t n, cap;
} tr_zbuf;

bool tr_ibuf_push(tr_ibuf *b, int32_t x);
bool tr_cbuf_append(tr_cbuf *b, const void *p, size_t n);
bool tr_cbuf_reserve(tr_cbuf *b, size_t extra);
bool tr_zbuf_push(tr_zbuf *b, size_t x);
void tr_ibuf_free(tr_ibuf *b);
void tr_cbuf_free(tr_cbuf *b);
void tr_zbuf_free(tr_zbuf *b);

/* ---- hashing --------------------------------------------------------------------------------- */

#define TR_FNV_INIT 1469598103934665603ull
static inline uint64_t tr_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Open-addressing table of int32 values (>= 0) keyed by byte strings that the owner stores; the
 * owner supplies the hash and an equality callback, so the table holds no copies of the keys. */
typedef struct tr_hmap {
    int32_t *slots; /* -1 = empty */
    size_t mask;
} tr_hmap;

/* A binary min-heap of fixed-size items ordered by `before` (the merge queues of BPE and SPM). */
typedef bool (*tr_heap_before_fn)(const void *a, const void *b);
typedef struct tr_heap {
    char *v;
    size_t n, cap, size;
    tr_heap_before_fn before;
} tr_heap;
bool tr_heap_push(tr_heap *h, const void *item);
void tr_heap_pop(tr_heap *h, void *out); /* h->n > 0 */
void tr_heap_free(tr_heap *h);

bool tr_hmap_init(tr_hmap *m, size_t n_expected);
void tr_hmap_free(tr_hmap *m);

/* ---- UTF-8, as llama.cpp's unicode.cpp treats it --------------------------------------------- */

/* length of the sequence a lead byte announces (1 for continuation bytes, as llama.cpp) */
static inline size_t tr_utf8_len(unsigned char c) {
    static const unsigned char lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}
/* Decode one code point at s[*off] with llama.cpp's rules: overlong forms, values above U+10FFFF
 * and bad continuation bytes are invalid (U+FFFD, one byte consumed); surrogates are accepted. */
uint32_t tr_utf8_decode(const unsigned char *s, size_t len, size_t *off);
/* Encode like llama.cpp's unicode_cpt_to_utf8 (surrogates encode as 3 bytes); code points above
 * U+10FFFF (never produced by tr_utf8_decode) encode as U+FFFD. Returns the byte count (1..4). */
size_t tr_utf8_encode(uint32_t cp, char out[4]);

/* GPT-2 byte <-> unicode alphabet */
uint32_t tr_byte_to_cp(unsigned char b);
int tr_cp_to_byte(uint32_t cp); /* -1 if cp is not in the alphabet */

/* ---- pre-tokenizer families ------------------------------------------------------------------ */

typedef struct tr_pretok_family tr_pretok_family;

typedef struct tr_pretok {
    const tr_pretok_family *fam;
    void **re; /* pcre2_code *, one per regex of the family */
    size_t n_re;
} tr_pretok;

/* Resolve a BPE pre-tokenizer name (empty = "default"); NULL if unknown. */
const tr_pretok_family *tr_pretok_lookup(const char *name);
/* Comma-separated list of every accepted name, for error messages. */
void tr_pretok_names(char *buf, size_t cap);
/* Per-family flags as llama.cpp's load() sets them. */
typedef struct tr_pretok_flags {
    bool ignore_merges, add_bos, clean_spaces, escape_ws, byte_encode, no_bos_id, add_sep;
} tr_pretok_flags;
tr_pretok_flags tr_pretok_family_flags(const tr_pretok_family *f);
bool tr_pretok_is_gemma4(const tr_pretok_family *f);

tr_status tr_pretok_compile(tr_pretok *p, const tr_pretok_family *fam, tr_error *err);
void tr_pretok_free(tr_pretok *p);
/* Split text into words with the family's regex list (each regex applied to the pieces left by the
 * previous one). Words are appended to `words` (re-encoded UTF-8, GPT-2 byte-encoded if
 * byte_encode) and their end offsets to `ends`. */
tr_status tr_pretok_split(const tr_pretok *p, const char *text, size_t len, bool byte_encode,
                          tr_cbuf *words, tr_zbuf *ends, tr_error *err);

/* ---- the tokenizer --------------------------------------------------------------------------- */

typedef struct tr_tok_entry {
    size_t off;   /* text in t->pool, NUL-terminated there */
    uint32_t len; /* text length in bytes */
    uint32_t attr;
    float score;
    int32_t type; /* GGUF token_type as stored (TR_TOKEN_TYPE_NORMAL if the file has none) */
} tr_tok_entry;

typedef struct tr_merge {
    size_t off;          /* "left right" in t->mpool */
    uint32_t llen, rlen; /* split at the first space at index >= 1 */
} tr_merge;

/* byte trie over the texts of special tokens, used to find which of them occur in a text */
typedef struct tr_trie_node {
    int32_t child;   /* first child, -1 if none */
    int32_t sibling; /* next sibling, -1 if none */
    int32_t special; /* index into t->specials of the token ending here, -1 if none */
    unsigned char byte;
} tr_trie_node;

struct tr_tokenizer {
    tr_tok_kind kind;
    char *model; /* tokenizer.ggml.model */
    char *pre;   /* tokenizer.ggml.pre, "default" if absent */

    /* flags, as llama.cpp's vocab impl */
    bool add_space_prefix, add_bos, add_eos, add_sep, ignore_merges, clean_spaces;
    bool remove_extra_ws, escape_ws, byte_encode, gemma4;

    int32_t n_vocab;
    tr_tok_entry *tok;
    char *pool;
    tr_hmap tokmap;
    uint32_t max_token_len;

    tr_merge *merges; /* rank = index */
    size_t n_merges;
    char *mpool;
    tr_hmap mergemap;

    tr_pretok pretok;

    int32_t special[TR_SPECIAL_COUNT];
    int32_t *eog;
    size_t n_eog;

    /* tokens split out before BPE/SPM: CONTROL, USER_DEFINED or UNKNOWN, longest text first */
    int32_t *specials;
    size_t n_specials;
    tr_trie_node *trie; /* node 0 is the root */
    size_t n_trie;
    int32_t root_child[256]; /* the root's children, directly indexed */

    int32_t byte_hex[256];  /* "<0xXX>" token per byte, -1 if none */
    int32_t byte_char[256]; /* one-byte token per byte, -1 if none */

    /* what load accepted but the user should hear about (tr_tokenizer_warning); "" if none */
    char warning[768];
};

/* id of the token with exactly this text, -1 if none */
int32_t tr_vocab_find(const tr_tokenizer *t, const char *s, size_t n);
/* rank of merge (left, right), -1 if none */
int32_t tr_merge_rank(const tr_tokenizer *t, const char *l, size_t ln, const char *r, size_t rn);

/* input the vocabulary cannot represent: characters left out because neither a token nor a
 * byte token covers them (as llama.cpp does), counted so the caller can say so */
typedef struct tr_tok_drops {
    size_t n;
    int first; /* the first one's byte (its first byte, for a character), -1 if none */
} tr_tok_drops;

/* models: append the ids of one text fragment (special tokens already split out); drops may be
 * NULL */
tr_status tr_bpe_encode(const tr_tokenizer *t, const char *text, size_t len, tr_ibuf *out,
                        tr_tok_drops *drops, tr_error *err);
tr_status tr_spm_encode(const tr_tokenizer *t, const char *text, size_t len, tr_ibuf *out,
                        tr_tok_drops *drops, tr_error *err);

/* tokenize into a growable buffer (used by load to find the newline token); drops may be NULL */
tr_status tr_tokenize_buf(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                          bool parse_special, tr_ibuf *out, tr_tok_drops *drops, tr_error *err);

#endif
