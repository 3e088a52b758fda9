/*
 * Loading a tokenizer from GGUF metadata, following llama.cpp's llama_vocab::impl::load: model
 * type and defaults, pre-tokenizer flags, tokens/scores/types, merges, special ids, the fix-ups
 * that derive EOT/EOM/FIM/EOG tokens from their text, and the special-token list used to split
 * text before BPE/SPM. Plus the accessors.
 */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tok_internal.h"

#define KV(k) "tokenizer.ggml." k

/* ---- hash table lookups ---------------------------------------------------------------------- */

int32_t tr_vocab_find(const tr_tokenizer *t, const char *s, size_t n) {
    if (!t->tokmap.slots) return -1;
    size_t i = (size_t)tr_fnv(TR_FNV_INIT, s, n) & t->tokmap.mask;
    for (;;) {
        int32_t id = t->tokmap.slots[i];
        if (id < 0) return -1;
        const tr_tok_entry *e = &t->tok[id];
        if (e->len == n && !memcmp(t->pool + e->off, s, n)) return id;
        i = (i + 1) & t->tokmap.mask;
    }
}

/* The key of merge (l, r) is its GGUF string "l r": hashing l, ' ', r streams the same bytes, so
 * lookups need no concatenated copy. */
static uint64_t merge_hash(const char *l, size_t ln, const char *r, size_t rn) {
    uint64_t h = tr_fnv(TR_FNV_INIT, l, ln);
    h = tr_fnv(h, " ", 1);
    return tr_fnv(h, r, rn);
}

int32_t tr_merge_rank(const tr_tokenizer *t, const char *l, size_t ln, const char *r, size_t rn) {
    if (!t->mergemap.slots) return -1;
    size_t i = (size_t)merge_hash(l, ln, r, rn) & t->mergemap.mask;
    for (;;) {
        int32_t k = t->mergemap.slots[i];
        if (k < 0) return -1;
        const tr_merge *m = &t->merges[k];
        if (m->llen == ln && m->rlen == rn && !memcmp(t->mpool + m->off, l, ln) &&
            !memcmp(t->mpool + m->off + ln + 1, r, rn))
            return k;
        i = (i + 1) & t->mergemap.mask;
    }
}

/* ---- metadata helpers ------------------------------------------------------------------------ */

/* string key: absent -> *present = false; present with another type -> error */
static tr_status get_str(const tr_gguf *g, const char *key, tr_str *v, bool *present,
                         tr_error *err) {
    int64_t i = tr_gguf_find_key(g, key);
    *present = i >= 0;
    if (i < 0) return TR_OK;
    if (tr_gguf_kv_type(g, i) != TR_GGUF_STRING)
        return tr_fail(err, TR_E_FORMAT, "key %s has type %s, expected string", key,
                       tr_gguf_vtype_name(tr_gguf_kv_type(g, i)));
    *v = tr_gguf_get_str(g, i);
    return TR_OK;
}

/* bool key (integers accepted too); absent leaves *v unchanged */
static tr_status get_bool(const tr_gguf *g, const char *key, bool *v, bool *present,
                          tr_error *err) {
    int64_t i = tr_gguf_find_key(g, key), x;
    if (present) *present = i >= 0;
    if (i < 0) return TR_OK;
    if (!tr_gguf_get_int(g, i, &x))
        return tr_fail(err, TR_E_FORMAT, "key %s has type %s, expected bool", key,
                       tr_gguf_vtype_name(tr_gguf_kv_type(g, i)));
    *v = x != 0;
    return TR_OK;
}

static char *dup_str(const char *p, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

static bool str_is(tr_str s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && (!n || !memcmp(s.ptr, lit, n));
}

/* adds to the tokenizer's warning ("; " between items); later items are cut if it is full */
static void warn(tr_tokenizer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(tr_tokenizer *t, const char *fmt, ...) {
    size_t used = strlen(t->warning);
    if (used + 3 >= sizeof t->warning) return;
    if (used) {
        memcpy(t->warning + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->warning + used, sizeof t->warning - used, fmt, ap);
    va_end(ap);
}

static bool tok_is(const tr_tokenizer *t, int32_t id, const char *lit) {
    size_t n = strlen(lit);
    return t->tok[id].len == n && !memcmp(t->pool + t->tok[id].off, lit, n);
}

/* ---- text lists llama.cpp uses to recognise special tokens ----------------------------------- */

#define FW_BAR "\xef\xbd\x9c" /* U+FF5C, as in DeepSeek's <｜...｜> tokens */
#define SPM_SP "\xe2\x96\x81" /* U+2581 */

static const char *const EOT_TEXTS[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">",
                                        "<end_of_utterance>",
                                        NULL};
static const char *const EOM_TEXTS[] = {"<|eom_id|>", NULL};
static const char *const FIM_PRE_TEXTS[] = {"<|fim_prefix|>",
                                            "<fim-prefix>",
                                            "<fim_prefix>",
                                            "<" FW_BAR "fim" SPM_SP "begin" FW_BAR ">",
                                            "<PRE>",
                                            SPM_SP "<PRE>",
                                            "<|code_prefix|>",
                                            "<|prefix|>",
                                            NULL};
static const char *const FIM_SUF_TEXTS[] = {"<|fim_suffix|>",
                                            "<fim-suffix>",
                                            "<fim_suffix>",
                                            "<" FW_BAR "fim" SPM_SP "hole" FW_BAR ">",
                                            "<SUF>",
                                            SPM_SP "<SUF>",
                                            "<|code_suffix|>",
                                            "<|suffix|>",
                                            NULL};
static const char *const FIM_MID_TEXTS[] = {"<|fim_middle|>",
                                            "<fim-middle>",
                                            "<fim_middle>",
                                            "<" FW_BAR "fim" SPM_SP "end" FW_BAR ">",
                                            "<MID>",
                                            SPM_SP "<MID>",
                                            "<|code_middle|>",
                                            "<|middle|>",
                                            NULL};
static const char *const FIM_PAD_TEXTS[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const FIM_REP_TEXTS[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const FIM_SEP_TEXTS[] = {"<|file_sep|>", NULL};
static const char *const EOG_TEXTS[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<|flush|>",
                                        "<|calls|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "</s>",
                                        "<|eom_id|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "[EOS]",
                                        "<|end_of_text|>",
                                        "<end_of_utterance>",
                                        "<eos>",
                                        "<turn|>",
                                        "<|tool_response>",
                                        "<" FW_BAR "end" SPM_SP "of" SPM_SP "sentence" FW_BAR ">",
                                        "[e~[",
                                        NULL};

/* ---- load steps ------------------------------------------------------------------------------ */

static tr_status load_tokens(tr_tokenizer *t, const tr_gguf *g, tr_error *err) {
    int64_t ti = tr_gguf_find_key(g, KV("tokens"));
    if (ti < 0) return tr_fail(err, TR_E_FORMAT, "cannot find tokenizer vocab (%s)", KV("tokens"));
    if (tr_gguf_kv_type(g, ti) != TR_GGUF_ARRAY || tr_gguf_arr_type(g, ti) != TR_GGUF_STRING)
        return tr_fail(err, TR_E_FORMAT, "%s is not an array of strings", KV("tokens"));
    uint64_t n = tr_gguf_arr_len(g, ti);
    if (n == 0) return tr_fail(err, TR_E_FORMAT, "%s is empty", KV("tokens"));
    if (n > INT32_MAX)
        return tr_fail(err, TR_E_FORMAT, "%s has %llu entries; token ids are 32-bit", KV("tokens"),
                       (unsigned long long)n);
    t->n_vocab = (int32_t)n;

    const float *fscores = NULL;
    const int32_t *iscores = NULL;
    int64_t si = tr_gguf_find_key(g, KV("scores"));
    if (si >= 0) {
        tr_gguf_vtype at =
            tr_gguf_kv_type(g, si) == TR_GGUF_ARRAY ? tr_gguf_arr_type(g, si) : TR_GGUF_VTYPE_COUNT;
        if (at != TR_GGUF_F32 && at != TR_GGUF_I32)
            return tr_fail(err, TR_E_FORMAT, "%s is not an array of f32 or i32", KV("scores"));
        if (tr_gguf_arr_len(g, si) < n)
            return tr_fail(err, TR_E_FORMAT, "%s has %llu entries for %llu tokens", KV("scores"),
                           (unsigned long long)tr_gguf_arr_len(g, si), (unsigned long long)n);
        if (at == TR_GGUF_F32)
            fscores = tr_gguf_arr_data(g, si);
        else
            iscores = tr_gguf_arr_data(g, si);
    }
    const int32_t *types = NULL;
    int64_t yi = tr_gguf_find_key(g, KV("token_type"));
    if (yi >= 0) {
        if (tr_gguf_kv_type(g, yi) != TR_GGUF_ARRAY || tr_gguf_arr_type(g, yi) != TR_GGUF_I32)
            return tr_fail(err, TR_E_FORMAT, "%s is not an array of i32", KV("token_type"));
        if (tr_gguf_arr_len(g, yi) < n)
            return tr_fail(err, TR_E_FORMAT, "%s has %llu entries for %llu tokens",
                           KV("token_type"), (unsigned long long)tr_gguf_arr_len(g, yi),
                           (unsigned long long)n);
        types = tr_gguf_arr_data(g, yi);
    }

    /* one pool for all texts; an empty text becomes "[EMPTY_<id>]" as in llama.cpp */
    size_t pool = 0;
    for (uint64_t i = 0; i < n; i++) {
        tr_str s = tr_gguf_arr_str(g, ti, i);
        size_t l = s.len ? (size_t)s.len : 32;
        if (s.len >= (1u << 30))
            return tr_fail(err, TR_E_FORMAT, "token %llu is %llu bytes long", (unsigned long long)i,
                           (unsigned long long)s.len);
        pool += l + 1;
    }
    t->pool = malloc(pool);
    t->tok = calloc(n, sizeof *t->tok);
    if (!t->pool || !t->tok || !tr_hmap_init(&t->tokmap, n))
        return tr_fail(err, TR_E_NOMEM, "out of memory for a vocabulary of %llu tokens",
                       (unsigned long long)n);
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        tr_str s = tr_gguf_arr_str(g, ti, i);
        tr_tok_entry *e = &t->tok[i];
        e->off = off;
        if (s.len) {
            memcpy(t->pool + off, s.ptr, s.len);
            e->len = (uint32_t)s.len;
        } else {
            e->len = (uint32_t)snprintf(t->pool + off, 32, "[EMPTY_%llu]", (unsigned long long)i);
        }
        t->pool[off + e->len] = 0;
        off += e->len + 1;
        if (e->len > t->max_token_len) t->max_token_len = e->len;
        /* the arrays' data has no alignment guarantee beyond malloc's, read them bytewise */
        if (fscores) memcpy(&e->score, (const char *)fscores + 4 * i, 4);
        else if (iscores) {
            int32_t v;
            memcpy(&v, (const char *)iscores + 4 * i, 4);
            e->score = (float)v;
        } else e->score = 0.0f;
        if (types) memcpy(&e->type, (const char *)types + 4 * i, 4);
        else e->type = TR_TOKEN_TYPE_NORMAL;
        /* a type outside the enum would render as nothing: text lost without a word */
        if (e->type < TR_TOKEN_TYPE_UNDEFINED || e->type > TR_TOKEN_TYPE_BYTE)
            return tr_fail(err, TR_E_FORMAT,
                           "%s[%llu] = %d is not a token type (0 undefined, 1 normal, 2 unknown, "
                           "3 control, 4 user-defined, 5 unused, 6 byte)",
                           KV("token_type"), (unsigned long long)i, e->type);
        switch (e->type) {
        case TR_TOKEN_TYPE_UNKNOWN: e->attr = TR_TOKEN_ATTR_UNKNOWN; break;
        case TR_TOKEN_TYPE_UNUSED: e->attr = TR_TOKEN_ATTR_UNUSED; break;
        case TR_TOKEN_TYPE_NORMAL: e->attr = TR_TOKEN_ATTR_NORMAL; break;
        case TR_TOKEN_TYPE_CONTROL: e->attr = TR_TOKEN_ATTR_CONTROL; break;
        case TR_TOKEN_TYPE_USER_DEFINED: e->attr = TR_TOKEN_ATTR_USER_DEFINED; break;
        case TR_TOKEN_TYPE_BYTE: e->attr = TR_TOKEN_ATTR_BYTE; break;
        default: e->attr = TR_TOKEN_ATTR_UNDEFINED; break;
        }

        const char *txt = t->pool + e->off;
        size_t h = (size_t)tr_fnv(TR_FNV_INIT, txt, e->len) & t->tokmap.mask;
        for (;;) {
            int32_t o = t->tokmap.slots[h];
            if (o < 0) {
                t->tokmap.slots[h] = (int32_t)i;
                break;
            }
            if (t->tok[o].len == e->len && !memcmp(t->pool + t->tok[o].off, txt, e->len))
                return tr_fail(err, TR_E_FORMAT,
                               "duplicate token in vocabulary: '%.*s' has ids %d and %llu",
                               (int)(e->len > 200 ? 200 : e->len), txt, o, (unsigned long long)i);
            h = (h + 1) & t->tokmap.mask;
        }
    }
    return TR_OK;
}

static tr_status load_merges(tr_tokenizer *t, const tr_gguf *g, tr_error *err) {
    int64_t mi = tr_gguf_find_key(g, KV("merges"));
    if (mi < 0) return tr_fail(err, TR_E_FORMAT, "cannot find tokenizer merges (%s)", KV("merges"));
    if (tr_gguf_kv_type(g, mi) != TR_GGUF_ARRAY || tr_gguf_arr_type(g, mi) != TR_GGUF_STRING)
        return tr_fail(err, TR_E_FORMAT, "%s is not an array of strings", KV("merges"));
    uint64_t n = tr_gguf_arr_len(g, mi);
    if (n > INT32_MAX)
        return tr_fail(err, TR_E_FORMAT, "%s has %llu entries", KV("merges"),
                       (unsigned long long)n);
    size_t pool = 0;
    for (uint64_t i = 0; i < n; i++) {
        tr_str s = tr_gguf_arr_str(g, mi, i);
        if (s.len >= (1u << 30))
            return tr_fail(err, TR_E_FORMAT, "merge %llu is %llu bytes long", (unsigned long long)i,
                           (unsigned long long)s.len);
        pool += (size_t)s.len + 1;
    }
    t->mpool = malloc(pool ? pool : 1);
    t->merges = calloc(n ? n : 1, sizeof *t->merges);
    if (!t->mpool || !t->merges || !tr_hmap_init(&t->mergemap, n))
        return tr_fail(err, TR_E_NOMEM, "out of memory for %llu merges", (unsigned long long)n);
    t->n_merges = n;
    size_t off = 0, n_bad = 0;
    uint64_t first_bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        tr_str s = tr_gguf_arr_str(g, mi, i);
        tr_merge *m = &t->merges[i];
        m->off = off;
        if (s.len) memcpy(t->mpool + off, s.ptr, s.len);
        t->mpool[off + s.len] = 0;
        off += (size_t)s.len + 1;
        /* split at the first space at index >= 1; llama.cpp stores an entry without one as an
         * empty pair, which no lookup can match, so it is simply left out here */
        const char *p = s.len > 1 ? memchr(s.ptr + 1, ' ', (size_t)s.len - 1) : NULL;
        if (!p || p == s.ptr + s.len - 1) {
            if (!n_bad++) first_bad = i;
            if (!p) continue;
        }
        m->llen = (uint32_t)(p - s.ptr);
        m->rlen = (uint32_t)(s.len - m->llen - 1);
        const char *ms = t->mpool + m->off;
        size_t h = (size_t)merge_hash(ms, m->llen, ms + m->llen + 1, m->rlen) & t->mergemap.mask;
        for (;;) {
            int32_t o = t->mergemap.slots[h];
            if (o < 0) {
                t->mergemap.slots[h] = (int32_t)i;
                break;
            }
            const tr_merge *q = &t->merges[o];
            if (q->llen == m->llen && q->rlen == m->rlen &&
                !memcmp(t->mpool + q->off, ms, (size_t)s.len))
                break; /* a repeated pair keeps its first (lowest) rank, as std::map::emplace */
            h = (h + 1) & t->mergemap.mask;
        }
    }
    if (n_bad) {
        const tr_merge *b = &t->merges[first_bad];
        const size_t blen = strlen(t->mpool + b->off);
        warn(t, "%s: %zu of %llu merges are not two parts separated by a space (the first: [%llu] "
             "'%.*s'); they are ignored", KV("merges"), n_bad, (unsigned long long)n,
             (unsigned long long)first_bad, (int)(blen > 40 ? 40 : blen), t->mpool + b->off);
    }
    return TR_OK;
}

static const struct {
    const char *key;
    tr_special which;
} special_keys[] = {
    {KV("bos_token_id"), TR_SPECIAL_BOS},
    {KV("eos_token_id"), TR_SPECIAL_EOS},
    {KV("eot_token_id"), TR_SPECIAL_EOT},
    {KV("eom_token_id"), TR_SPECIAL_EOM},
    {KV("unknown_token_id"), TR_SPECIAL_UNK},
    {KV("seperator_token_id"), TR_SPECIAL_SEP},
    {KV("padding_token_id"), TR_SPECIAL_PAD},
    {KV("mask_token_id"), TR_SPECIAL_MASK},
    {KV("fim_pre_token_id"), TR_SPECIAL_FIM_PRE},
    {KV("fim_suf_token_id"), TR_SPECIAL_FIM_SUF},
    {KV("fim_mid_token_id"), TR_SPECIAL_FIM_MID},
    {KV("fim_pad_token_id"), TR_SPECIAL_FIM_PAD},
    {KV("fim_rep_token_id"), TR_SPECIAL_FIM_REP},
    {KV("fim_sep_token_id"), TR_SPECIAL_FIM_SEP},
    /* deprecated names */
    {KV("prefix_token_id"), TR_SPECIAL_FIM_PRE},
    {KV("suffix_token_id"), TR_SPECIAL_FIM_SUF},
    {KV("middle_token_id"), TR_SPECIAL_FIM_MID},
};

static tr_status load_special_ids(tr_tokenizer *t, const tr_gguf *g, tr_error *err) {
    for (size_t k = 0; k < sizeof special_keys / sizeof special_keys[0]; k++) {
        int32_t *id = &t->special[special_keys[k].which];
        if (*id >= t->n_vocab) *id = -1; /* a default outside this vocabulary: none */
        int64_t i = tr_gguf_find_key(g, special_keys[k].key), v;
        if (i < 0) continue;
        if (!tr_gguf_get_int(g, i, &v))
            return tr_fail(err, TR_E_FORMAT, "key %s has type %s, expected an integer",
                           special_keys[k].key, tr_gguf_vtype_name(tr_gguf_kv_type(g, i)));
        /* llama.cpp ignores an out-of-range id and keeps the default; an end-of-generation
         * token that is not the file's would stop (or not stop) at the wrong place, so say so */
        if (v >= 0 && v < t->n_vocab) {
            *id = (int32_t)v;
        } else if (*id >= 0) {
            warn(t, "%s = %lld is outside the vocabulary of %d tokens: ignored, id %d is used",
                 special_keys[k].key, (long long)v, t->n_vocab, *id);
        } else {
            warn(t, "%s = %lld is outside the vocabulary of %d tokens: ignored", special_keys[k].key,
                 (long long)v, t->n_vocab);
        }
    }
    return TR_OK;
}

/* EOT/EOM/FIM ids from token text when the file names none; the chosen token becomes CONTROL.
 * llama.cpp scans an unordered map, so with several candidates its choice is unspecified; here
 * the lowest id wins. */
static void detect_by_text(tr_tokenizer *t) {
    static const struct {
        tr_special which;
        const char *const *texts;
    } roles[] = {
        {TR_SPECIAL_EOT, EOT_TEXTS},         {TR_SPECIAL_EOM, EOM_TEXTS},
        {TR_SPECIAL_FIM_PRE, FIM_PRE_TEXTS}, {TR_SPECIAL_FIM_SUF, FIM_SUF_TEXTS},
        {TR_SPECIAL_FIM_MID, FIM_MID_TEXTS}, {TR_SPECIAL_FIM_PAD, FIM_PAD_TEXTS},
        {TR_SPECIAL_FIM_REP, FIM_REP_TEXTS}, {TR_SPECIAL_FIM_SEP, FIM_SEP_TEXTS},
    };
    for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++) {
        if (t->special[roles[r].which] >= 0) continue;
        for (const char *const *p = roles[r].texts; *p; p++) {
            int32_t id = tr_vocab_find(t, *p, strlen(*p));
            if (id < 0) continue;
            if (t->special[roles[r].which] < 0 || id < t->special[roles[r].which])
                t->special[roles[r].which] = id;
        }
        int32_t id = t->special[roles[r].which];
        if (id >= 0) t->tok[id].attr |= TR_TOKEN_ATTR_CONTROL;
    }
    /* control tokens named "unused" are unused (Gemma's <unused..>) */
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->tok[id].attr & TR_TOKEN_ATTR_CONTROL) && strstr(t->pool + t->tok[id].off, "unused"))
            t->tok[id].attr |= TR_TOKEN_ATTR_UNUSED;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static bool eog_has(const tr_ibuf *s, int32_t id) {
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == id) return true;
    return false;
}
static bool eog_add(tr_ibuf *s, int32_t id) {
    return id < 0 || eog_has(s, id) || tr_ibuf_push(s, id);
}
static void eog_remove(tr_ibuf *s, int32_t id) {
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == id) s->v[i--] = s->v[--s->n];
}

static tr_status build_eog(tr_tokenizer *t, tr_error *err) {
    tr_ibuf s = {0};
    bool ok = eog_add(&s, t->special[TR_SPECIAL_FIM_PAD]) &&
              eog_add(&s, t->special[TR_SPECIAL_FIM_REP]) &&
              eog_add(&s, t->special[TR_SPECIAL_FIM_SEP]);
    for (const char *const *p = EOG_TEXTS; ok && *p; p++) {
        int32_t id = tr_vocab_find(t, *p, strlen(*p));
        if (id < 0) continue;
        ok = eog_add(&s, id);
        t->tok[id].attr |= TR_TOKEN_ATTR_CONTROL;
    }
    /* gpt-oss: these structure tokens are always rendered (llama.cpp makes them USER_DEFINED) */
    static const char *const harmony[] = {"<|channel|>", "<|message|>", "<|start|>",
                                          "<|constrain|>", NULL};
    for (const char *const *p = harmony; *p; p++) {
        int32_t id = tr_vocab_find(t, *p, strlen(*p));
        if (id >= 0) t->tok[id].attr = TR_TOKEN_ATTR_USER_DEFINED;
    }
    ok = ok && eog_add(&s, t->special[TR_SPECIAL_EOS]) && eog_add(&s, t->special[TR_SPECIAL_EOT]) &&
         eog_add(&s, t->special[TR_SPECIAL_EOM]);
    if (!ok) {
        tr_ibuf_free(&s);
        return tr_fail(err, TR_E_NOMEM, "out of memory");
    }
    /* o200k_harmony / solar-open: <|end|> ends a message, not the generation */
    bool has_return = false, has_call = false, has_flush = false;
    int32_t end_id = -1, tool_resp = -1, s_id = -1;
    for (size_t i = 0; i < s.n; i++) {
        int32_t id = s.v[i];
        if (tok_is(t, id, "<|return|>"))
            has_return = true;
        else if (tok_is(t, id, "<|call|>") || tok_is(t, id, "<|calls|>"))
            has_call = true;
        else if (tok_is(t, id, "<|flush|>"))
            has_flush = true;
        else if (tok_is(t, id, "<|end|>"))
            end_id = id;
        if (tok_is(t, id, "<|tool_response>"))
            tool_resp = id;
        else if (tok_is(t, id, "</s>"))
            s_id = id;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
        eog_remove(&s, end_id);
        t->tok[end_id].attr = TR_TOKEN_ATTR_USER_DEFINED;
    }
    /* gemma4 (and paddleocr): </s> is not an end of generation there */
    if (tool_resp >= 0 && s_id >= 0) {
        eog_remove(&s, s_id);
        t->tok[s_id].attr = TR_TOKEN_ATTR_NORMAL;
    }
    qsort(s.v, s.n, sizeof *s.v, cmp_i32);
    t->eog = s.v;
    t->n_eog = s.n;
    return TR_OK;
}

/* longest text first; equal lengths by id, so the order is deterministic (llama.cpp uses an
 * unstable sort) */
typedef struct {
    uint32_t len;
    int32_t id;
} len_id;
static int cmp_len_id(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t trie_new(tr_tokenizer *t, size_t *cap, unsigned char byte) {
    if (t->n_trie == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        tr_trie_node *q = realloc(t->trie, nc * sizeof *q);
        if (!q) return -1;
        t->trie = q;
        *cap = nc;
    }
    t->trie[t->n_trie] = (tr_trie_node){.child = -1, .sibling = -1, .special = -1, .byte = byte};
    return (int32_t)t->n_trie++;
}

static tr_status build_specials(tr_tokenizer *t, tr_error *err) {
    const uint32_t mask =
        TR_TOKEN_ATTR_CONTROL | TR_TOKEN_ATTR_USER_DEFINED | TR_TOKEN_ATTR_UNKNOWN;
    size_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tok[id].attr & mask) n++;
    t->specials = malloc((n ? n : 1) * sizeof *t->specials);
    len_id *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!t->specials || !tmp) {
        free(tmp);
        return tr_fail(err, TR_E_NOMEM, "out of memory");
    }
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->tok[id].attr & mask) tmp[t->n_specials++] = (len_id){t->tok[id].len, id};
    qsort(tmp, t->n_specials, sizeof *tmp, cmp_len_id);
    for (size_t k = 0; k < t->n_specials; k++) t->specials[k] = tmp[k].id;
    free(tmp);

    /* trie over their texts: a single pass over a text then finds which ones occur in it */
    size_t cap = 0;
    for (int i = 0; i < 256; i++) t->root_child[i] = -1;
    if (trie_new(t, &cap, 0) < 0) goto oom;
    for (size_t k = 0; k < t->n_specials; k++) {
        const tr_tok_entry *e = &t->tok[t->specials[k]];
        const unsigned char *s = (const unsigned char *)t->pool + e->off;
        int32_t node = 0;
        for (uint32_t j = 0; j < e->len; j++) {
            int32_t c;
            if (node == 0) {
                c = t->root_child[s[j]];
                if (c < 0) {
                    if ((c = trie_new(t, &cap, s[j])) < 0) goto oom;
                    t->root_child[s[j]] = c;
                }
            } else {
                c = t->trie[node].child;
                while (c >= 0 && t->trie[c].byte != s[j]) c = t->trie[c].sibling;
                if (c < 0) {
                    if ((c = trie_new(t, &cap, s[j])) < 0) goto oom;
                    t->trie[c].sibling = t->trie[node].child;
                    t->trie[node].child = c;
                }
            }
            node = c;
        }
        t->trie[node].special = (int32_t)k; /* texts are unique, so each node ends at most one */
    }
    return TR_OK;
oom:
    return tr_fail(err, TR_E_NOMEM, "out of memory");
}

static void set_attr_by_text(tr_tokenizer *t, const char *text, uint32_t attr, bool on) {
    int32_t id = tr_vocab_find(t, text, strlen(text));
    if (id < 0) return; /* llama.cpp would throw here; a missing token just has nothing to set */
    if (on)
        t->tok[id].attr |= attr;
    else
        t->tok[id].attr &= ~attr;
}

static bool contains_ci(const char *hay, const char *needle) {
    char low[256];
    size_t n = strlen(hay);
    if (n >= sizeof low) n = sizeof low - 1;
    for (size_t i = 0; i < n; i++) low[i] = (char)tolower((unsigned char)hay[i]);
    low[n] = 0;
    return strstr(low, needle) != NULL;
}

/* per-model attributes llama.cpp sets by model name (LSTRIP/RSTRIP around special tokens) */
static void model_attrs(tr_tokenizer *t, const char *pre, const char *arch, const char *name) {
    if (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") || strstr(pre, "jina-v2-code") ||
        strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")) {
        set_attr_by_text(t, "<mask>", TR_TOKEN_ATTR_LSTRIP, true);
    } else if (contains_ci(name, "phi-3") || contains_ci(name, "phi3")) {
        for (size_t k = 0; k < t->n_specials; k++)
            t->tok[t->specials[k]].attr |= TR_TOKEN_ATTR_RSTRIP;
        set_attr_by_text(t, "</s>", TR_TOKEN_ATTR_RSTRIP, true);
        set_attr_by_text(t, "<unk>", TR_TOKEN_ATTR_RSTRIP, false);
        set_attr_by_text(t, "<s>", TR_TOKEN_ATTR_RSTRIP, false);
        set_attr_by_text(t, "<|endoftext|>", TR_TOKEN_ATTR_RSTRIP, false);
    } else if (contains_ci(name, "modern-bert")) {
        set_attr_by_text(t, "[MASK]", TR_TOKEN_ATTR_LSTRIP, true);
    }
}

/* Text that no token covers falls back to one token per byte: the 256 characters of the GPT-2
 * byte alphabet in byte-level BPE. A vocabulary with none of them would drop every character
 * that is not part of a whole token: refused. Real ones lack a few (controls, bytes that never
 * occur in UTF-8); what a text loses to those is counted by tr_tokenize_ex, so the caller can
 * say so when it happens. */
static tr_status check_bytes(const tr_tokenizer *t, tr_error *err) {
    if (t->kind != TR_TOK_BPE || !t->byte_encode) return TR_OK;
    for (int b = 0; b < 256; b++) {
        char u[4];
        const size_t n = tr_utf8_encode(tr_byte_to_cp((unsigned char)b), u);
        if (tr_vocab_find(t, u, n) >= 0) return TR_OK;
    }
    return tr_fail(err, TR_E_FORMAT,
                   "%s holds none of the 256 byte tokens of a byte-level BPE vocabulary (the GPT-2 "
                   "byte alphabet): every character that is not part of a whole token would be "
                   "dropped", KV("tokens"));
}

static const char *const unsupported_models[] = {
    "bert", "t5", "rwkv", "plamo2", "no_vocab", "none", "hybriddna", "whitespace", NULL};

static tr_status load(tr_tokenizer *t, const tr_gguf *g, tr_error *err) {
    tr_status st;
    tr_str model = {0}, pre = {0}, s;
    bool has_model, has_pre, has;
    if ((st = get_str(g, KV("model"), &model, &has_model, err))) return st;
    if (!has_model) return tr_fail(err, TR_E_FORMAT, "missing key %s", KV("model"));
    if ((st = get_str(g, KV("pre"), &pre, &has_pre, err))) return st;
    t->model = dup_str(model.ptr, model.len);
    t->pre = has_pre && pre.len ? dup_str(pre.ptr, pre.len) : dup_str("default", 7);
    if (!t->model || !t->pre) return tr_fail(err, TR_E_NOMEM, "out of memory");
    for (int i = 0; i < TR_SPECIAL_COUNT; i++) t->special[i] = -1;

    const tr_pretok_family *fam = NULL;
    if (str_is(model, "llama")) {
        t->kind = TR_TOK_SPM;
        t->special[TR_SPECIAL_BOS] = 1;
        t->special[TR_SPECIAL_EOS] = 2;
        t->special[TR_SPECIAL_UNK] = 0;
        t->add_space_prefix = true;
        t->add_bos = true;
    } else if (str_is(model, "gpt2") || str_is(model, "gemma4")) {
        t->kind = TR_TOK_BPE;
        if (str_is(model, "gpt2")) {
            t->special[TR_SPECIAL_BOS] = 11;
            t->special[TR_SPECIAL_EOS] = 11;
        } else {
            free(t->pre); /* llama.cpp forces this pre-tokenizer for the gemma4 model */
            if (!(t->pre = dup_str("gemma4", 6))) return tr_fail(err, TR_E_NOMEM, "out of memory");
        }
        fam = tr_pretok_lookup(t->pre);
        if (!fam) {
            char names[900];
            tr_pretok_names(names, sizeof names);
            return tr_fail(err, TR_E_UNSUPPORTED,
                           "unsupported pre-tokenizer '%s' (%s); supported: %s", t->pre, KV("pre"),
                           names);
        }
        tr_pretok_flags fl = tr_pretok_family_flags(fam);
        t->ignore_merges = fl.ignore_merges;
        t->add_bos = fl.add_bos;
        t->clean_spaces = fl.clean_spaces;
        t->escape_ws = fl.escape_ws;
        t->byte_encode = fl.byte_encode;
        t->add_sep = fl.add_sep;
        t->gemma4 = tr_pretok_is_gemma4(fam);
        if (fl.no_bos_id) t->special[TR_SPECIAL_BOS] = -1;
    } else {
        bool known = false;
        for (const char *const *p = unsupported_models; *p; p++) known |= str_is(model, *p);
        return tr_fail(err, TR_E_UNSUPPORTED,
                       "unsupported tokenizer model '%s' (%s%s); supported: llama, gpt2, gemma4",
                       t->model, KV("model"), known ? ", known to llama.cpp" : "");
    }
    if ((st = get_bool(g, KV("add_space_prefix"), &t->add_space_prefix, NULL, err))) return st;
    if ((st = get_bool(g, KV("remove_extra_whitespaces"), &t->remove_extra_ws, NULL, err)))
        return st;

    if ((st = load_tokens(t, g, err))) return st;
    if (t->kind == TR_TOK_BPE && (st = load_merges(t, g, err))) return st;

    for (int b = 0; b < 256; b++) {
        char hex[7], c = (char)b;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        t->byte_hex[b] = tr_vocab_find(t, hex, 6);
        t->byte_char[b] = tr_vocab_find(t, &c, 1);
    }

    if ((st = load_special_ids(t, g, err))) return st;
    if ((st = check_bytes(t, err))) return st;
    if ((st = get_bool(g, KV("add_bos_token"), &t->add_bos, NULL, err))) return st;
    if ((st = get_bool(g, KV("add_eos_token"), &t->add_eos, NULL, err))) return st;
    if ((st = get_bool(g, KV("add_sep_token"), &t->add_sep, NULL, err))) return st;
    if (t->gemma4) t->add_bos = true; /* llama.cpp's Gemma 4 workaround */
    if (t->add_bos && t->special[TR_SPECIAL_BOS] < 0)
        return tr_fail(err, TR_E_FORMAT, "%s is true, but %s is not set", KV("add_bos_token"),
                       KV("bos_token_id"));
    if (t->add_eos && t->special[TR_SPECIAL_EOS] < 0)
        return tr_fail(err, TR_E_FORMAT, "%s is true, but %s is not set", KV("add_eos_token"),
                       KV("eos_token_id"));
    if (t->add_sep && t->special[TR_SPECIAL_SEP] < 0)
        return tr_fail(err, TR_E_FORMAT, "%s is true, but %s is not set", KV("add_sep_token"),
                       KV("seperator_token_id"));

    detect_by_text(t);
    if ((st = build_eog(t, err))) return st;
    if ((st = build_specials(t, err))) return st;

    char arch[128] = "", name[256] = "";
    if ((st = get_str(g, "general.architecture", &s, &has, err))) return st;
    if (has) snprintf(arch, sizeof arch, "%.*s", (int)(s.len < 127 ? s.len : 127), s.ptr);
    if ((st = get_str(g, "general.name", &s, &has, err))) return st;
    if (has) snprintf(name, sizeof name, "%.*s", (int)(s.len < 255 ? s.len : 255), s.ptr);
    model_attrs(t, has_pre ? t->pre : "", arch, name);

    if (t->kind == TR_TOK_BPE && (st = tr_pretok_compile(&t->pretok, fam, err))) return st;

    /* the newline token, as llama.cpp derives it */
    if (t->kind == TR_TOK_SPM) {
        int32_t nl = t->byte_hex['\n'] >= 0 ? t->byte_hex['\n'] : t->byte_char['\n'];
        t->special[TR_SPECIAL_NL] = nl >= 0 ? nl : t->special[TR_SPECIAL_PAD];
    } else {
        tr_ibuf ids = {0};
        if ((st = tr_tokenize_buf(t, "\n", 1, false, false, &ids, NULL, err))) return st;
        t->special[TR_SPECIAL_NL] = ids.n ? ids.v[0] : t->special[TR_SPECIAL_PAD];
        tr_ibuf_free(&ids);
    }
    return TR_OK;
}

tr_status tr_tokenizer_load(const tr_gguf *g, tr_tokenizer **out, tr_error *err) {
    *out = NULL;
    if (!g) return tr_fail(err, TR_E_ARG, "tr_tokenizer_load: no GGUF");
    tr_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tr_fail(err, TR_E_NOMEM, "out of memory");
    tr_status st = load(t, g, err);
    if (st) {
        tr_error_prefix(err, "tokenizer: ");
        tr_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TR_OK;
}

void tr_tokenizer_free(tr_tokenizer *t) {
    if (!t) return;
    free(t->model);
    free(t->pre);
    free(t->tok);
    free(t->pool);
    tr_hmap_free(&t->tokmap);
    free(t->merges);
    free(t->mpool);
    tr_hmap_free(&t->mergemap);
    tr_pretok_free(&t->pretok);
    free(t->eog);
    free(t->specials);
    free(t->trie);
    free(t);
}

/* ---- accessors ------------------------------------------------------------------------------- */

const char *tr_tokenizer_warning(const tr_tokenizer *t) {
    return t->warning[0] ? t->warning : NULL;
}
tr_tok_kind tr_tokenizer_kind(const tr_tokenizer *t) { return t->kind; }
const char *tr_tokenizer_model(const tr_tokenizer *t) { return t->model; }
const char *tr_tokenizer_pre(const tr_tokenizer *t) { return t->pre; }
int32_t tr_tokenizer_n_vocab(const tr_tokenizer *t) { return t->n_vocab; }
bool tr_tokenizer_add_bos(const tr_tokenizer *t) { return t->add_bos; }
bool tr_tokenizer_add_eos(const tr_tokenizer *t) { return t->add_eos; }
bool tr_tokenizer_add_space_prefix(const tr_tokenizer *t) { return t->add_space_prefix; }
size_t tr_tokenizer_n_merges(const tr_tokenizer *t) { return t->n_merges; }

static bool in_range(const tr_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab; }

const char *tr_token_text(const tr_tokenizer *t, int32_t id, size_t *len) {
    if (!in_range(t, id)) return NULL;
    if (len) *len = t->tok[id].len;
    return t->pool + t->tok[id].off;
}
float tr_token_score(const tr_tokenizer *t, int32_t id) {
    return in_range(t, id) ? t->tok[id].score : 0.0f;
}
int32_t tr_token_type(const tr_tokenizer *t, int32_t id) {
    return in_range(t, id) ? t->tok[id].type : -1;
}
uint32_t tr_token_attr(const tr_tokenizer *t, int32_t id) {
    return in_range(t, id) ? t->tok[id].attr : 0;
}
int32_t tr_token_find(const tr_tokenizer *t, const char *text, size_t len) {
    return tr_vocab_find(t, text, len);
}
int32_t tr_token_special(const tr_tokenizer *t, tr_special which) {
    return (unsigned)which < TR_SPECIAL_COUNT ? t->special[which] : -1;
}
int32_t tr_token_bos(const tr_tokenizer *t) { return t->special[TR_SPECIAL_BOS]; }
int32_t tr_token_eos(const tr_tokenizer *t) { return t->special[TR_SPECIAL_EOS]; }
int32_t tr_token_eot(const tr_tokenizer *t) { return t->special[TR_SPECIAL_EOT]; }
int32_t tr_token_eom(const tr_tokenizer *t) { return t->special[TR_SPECIAL_EOM]; }
int32_t tr_token_unk(const tr_tokenizer *t) { return t->special[TR_SPECIAL_UNK]; }
int32_t tr_token_pad(const tr_tokenizer *t) { return t->special[TR_SPECIAL_PAD]; }

bool tr_token_is_eog(const tr_tokenizer *t, int32_t id) {
    if (id < 0) return false;
    return bsearch(&id, t->eog, t->n_eog, sizeof *t->eog, cmp_i32) != NULL;
}
bool tr_token_is_control(const tr_tokenizer *t, int32_t id) {
    return (tr_token_attr(t, id) & TR_TOKEN_ATTR_CONTROL) != 0;
}
const int32_t *tr_tokenizer_eog_ids(const tr_tokenizer *t, size_t *n) {
    *n = t->n_eog;
    return t->eog;
}
