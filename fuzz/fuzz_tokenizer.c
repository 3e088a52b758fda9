/*
 * libFuzzer target for the tokenizers: random bytes through every tokenizer type terrace has —
 * SPM ("llama", with and without a space prefix), byte-level BPE ("gpt2") once for every
 * pre-tokenizer family (each its own regex list), and raw-UTF-8 BPE ("gemma4") — plus, when
 * TERRACE_FUZZ_VOCAB names a directory, every vocabulary GGUF in it (the real ones in
 * ../shared/testdata/vocab; `make fuzz` sets it). The vocabularies built here are small but
 * have what the code paths need: byte tokens, merges, multi-byte pieces, special tokens of each
 * kind (control, user-defined, unknown) and end-of-turn texts.
 *
 * Input: byte 0 picks the tokenizer, byte 1 the flags (add_special, parse_special,
 * render_special, remove_special), the rest is the text. Checked: every id is inside the vocabulary, the count
 * protocol (a too-small buffer reports the size), detokenize accepts what tokenize produced,
 * token_to_piece's size protocol, and the dropped-character count is at most the text's length.
 *
 * build/run: make fuzz FUZZ=tokenizer   (corpus in fuzz/corpus-tokenizer, replayed by make test)
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "text/tok_internal.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TOK 256
static tr_tokenizer *g_tok[MAX_TOK];
static int g_n;

static tr_tokenizer *load(const fw_meta *m) {
    fw_buf b = {0};
    fw_serialise(m, NULL, 0, &b);
    tr_error err;
    tr_gguf *g = NULL;
    tr_tokenizer *t = NULL;
    if (tr_gguf_open(fw_memfd_path(&b), &g, &err) == TR_OK) {
        if (tr_tokenizer_load(g, &t, &err) != TR_OK) t = NULL;
        tr_gguf_close(g);
    }
    free(b.p);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer: a built-in vocabulary failed to load: %s\n", err.msg);
        abort();
    }
    return t;
}

/* strings of one array under construction */
typedef struct strs {
    fw_buf b;
    uint64_t n;
} strs;
static void add(strs *s, const char *p, size_t n) {
    fw_str(&s->b, p, n);
    s->n++;
}
static void set_strs(fw_meta *m, const char *key, const strs *s) {
    fw_buf *v = fw_set_arr(m, key, TR_GGUF_STRING, s->n);
    fw_put(v, s->b.p, s->b.n);
}
static void set_i32s(fw_meta *m, const char *key, const int32_t *v, uint64_t n) {
    fw_put(fw_set_arr(m, key, TR_GGUF_I32, n), v, (size_t)n * 4);
}

/* the special tokens every vocabulary here carries, by type */
static const struct {
    const char *text;
    int32_t type;
} k_specials[] = {
    {"<|endoftext|>", TR_TOKEN_TYPE_CONTROL}, {"<|im_start|>", TR_TOKEN_TYPE_CONTROL},
    {"<|im_end|>", TR_TOKEN_TYPE_CONTROL},    {"<tool>", TR_TOKEN_TYPE_USER_DEFINED},
    {"<|fim_prefix|>", TR_TOKEN_TYPE_CONTROL}, {"<eos>", TR_TOKEN_TYPE_CONTROL},
};
static const char *const k_pieces[] = {"he", "ll", "hello", "the", "in", "an", "er", "12",
                                       "ing", "on", "at", "\n\n", "  ", "é", "日本", "ab"};

static void build_spm(bool prefix) {
    fw_meta m = {0};
    strs tk = {0};
    int32_t types[512];
    float scores[512];
    int n = 0;
    add(&tk, "<unk>", 5), types[n] = TR_TOKEN_TYPE_UNKNOWN, scores[n++] = 0;
    add(&tk, "<s>", 3), types[n] = TR_TOKEN_TYPE_CONTROL, scores[n++] = 0;
    add(&tk, "</s>", 4), types[n] = TR_TOKEN_TYPE_CONTROL, scores[n++] = 0;
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        add(&tk, hex, 6), types[n] = TR_TOKEN_TYPE_BYTE, scores[n++] = 0;
    }
    add(&tk, "\xe2\x96\x81", 3), types[n] = 1, scores[n++] = -1;
    for (int c = 'a'; c <= 'z'; c++) {
        char ch = (char)c;
        add(&tk, &ch, 1), types[n] = 1, scores[n++] = -2;
    }
    for (size_t i = 0; i < sizeof k_pieces / sizeof k_pieces[0]; i++) {
        char sp[32];
        add(&tk, k_pieces[i], strlen(k_pieces[i])), types[n] = 1, scores[n++] = -3 - (float)i;
        snprintf(sp, sizeof sp, "\xe2\x96\x81%s", k_pieces[i]);
        add(&tk, sp, strlen(sp)), types[n] = 1, scores[n++] = -2.5f - (float)i;
    }
    for (size_t i = 0; i < sizeof k_specials / sizeof k_specials[0]; i++)
        add(&tk, k_specials[i].text, strlen(k_specials[i].text)), types[n] = k_specials[i].type,
            scores[n++] = 0;
    fw_set_str(&m, "general.architecture", "llama");
    fw_set_str(&m, "tokenizer.ggml.model", "llama");
    set_strs(&m, "tokenizer.ggml.tokens", &tk);
    set_i32s(&m, "tokenizer.ggml.token_type", types, (uint64_t)n);
    fw_put(fw_set_arr(&m, "tokenizer.ggml.scores", TR_GGUF_F32, (uint64_t)n), scores, (size_t)n * 4);
    if (!prefix) {
        fw_kv *e = fw_slot(&m, "tokenizer.ggml.add_space_prefix", TR_GGUF_BOOL);
        fw_put(&e->val, "\0", 1);
    }
    g_tok[g_n++] = load(&m);
    free(tk.b.p);
    fw_meta_free(&m);
}

/* byte-level BPE with pre-tokenizer `pre`, or raw-UTF-8 BPE (gemma4) when pre is NULL */
static void build_bpe(const char *pre) {
    fw_meta m = {0};
    strs tk = {0}, mg = {0};
    int32_t types[600];
    int n = 0;
    const bool gemma4 = pre == NULL;
    if (gemma4) {
        for (int b = 0; b < 256; b++) {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            add(&tk, hex, 6), types[n++] = TR_TOKEN_TYPE_BYTE;
        }
        add(&tk, "\xe2\x96\x81", 3), types[n++] = 1;
        for (int c = 'a'; c <= 'z'; c++) {
            char ch = (char)c;
            add(&tk, &ch, 1), types[n++] = 1;
        }
    } else {
        for (int b = 0; b < 256; b++) {
            char u[3];
            add(&tk, u, fw_gpt2_byte(b, u)), types[n++] = 1;
        }
    }
    for (size_t i = 0; i < sizeof k_pieces / sizeof k_pieces[0]; i++) {
        const char *p = k_pieces[i];
        const size_t l = strlen(p);
        if (l < 2 || (unsigned char)p[0] >= 0x80) continue;
        add(&tk, p, l), types[n++] = 1;
        /* merge chain left to right: "h e", "he l", ... (a prefix that is not a token merges
         * into a non-token, which falls back to bytes) */
        char buf[64];
        for (size_t k = 1; k < l; k++) {
            snprintf(buf, sizeof buf, "%.*s %c", (int)k, p, p[k]);
            add(&mg, buf, strlen(buf));
        }
    }
    add(&tk, "\xc4\xa0t", 3), types[n++] = 1; /* " t" in the GPT-2 alphabet */
    add(&mg, "\xc4\xa0 t", 4);
    for (size_t i = 0; i < sizeof k_specials / sizeof k_specials[0]; i++)
        add(&tk, k_specials[i].text, strlen(k_specials[i].text)), types[n++] = k_specials[i].type;
    fw_set_str(&m, "general.architecture", gemma4 ? "gemma4" : "qwen2");
    fw_set_str(&m, "tokenizer.ggml.model", gemma4 ? "gemma4" : "gpt2");
    if (pre) fw_set_str(&m, "tokenizer.ggml.pre", pre);
    set_strs(&m, "tokenizer.ggml.tokens", &tk);
    set_i32s(&m, "tokenizer.ggml.token_type", types, (uint64_t)n);
    set_strs(&m, "tokenizer.ggml.merges", &mg);
    fw_set_u32(&m, "tokenizer.ggml.bos_token_id", (uint32_t)(n - 6));
    fw_set_u32(&m, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 1));
    fw_set_u32(&m, "tokenizer.ggml.seperator_token_id", (uint32_t)(n - 1)); /* add_sep families */
    g_tok[g_n++] = load(&m);
    free(tk.b.p);
    free(mg.b.p);
    fw_meta_free(&m);
}

static void load_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char *names[MAX_TOK];
    int k = 0;
    while ((e = readdir(d)) && k < MAX_TOK) {
        const size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".gguf")) names[k++] = strdup(e->d_name);
    }
    closedir(d);
    /* a fixed order, so an input picks the same vocabulary in every run */
    for (int i = 0; i < k; i++)
        for (int j = i + 1; j < k; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    for (int i = 0; i < k && g_n < MAX_TOK; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        tr_error err;
        tr_gguf *g = NULL;
        tr_tokenizer *t = NULL;
        if (tr_gguf_open(path, &g, &err) == TR_OK) {
            if (tr_tokenizer_load(g, &t, &err) == TR_OK) g_tok[g_n++] = t; /* bert: unsupported */
            tr_gguf_close(g);
        }
        free(names[i]);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    build_spm(true);
    build_spm(false);
    build_bpe(NULL);
    /* one byte-level BPE per distinct pre-tokenizer family */
    char names[8192];
    tr_pretok_names(names, sizeof names);
    const tr_pretok_family *seen[128];
    int n_seen = 0;
    for (char *save = NULL, *p = strtok_r(names, ", ", &save); p; p = strtok_r(NULL, ", ", &save)) {
        const tr_pretok_family *f = tr_pretok_lookup(p);
        bool dup = !f || tr_pretok_is_gemma4(f);
        for (int i = 0; i < n_seen && !dup; i++) dup = seen[i] == f;
        if (dup || n_seen == 128 || g_n == MAX_TOK) continue;
        seen[n_seen++] = f;
        build_bpe(p);
    }
    const char *dir = getenv("TERRACE_FUZZ_VOCAB");
    if (dir) load_dir(dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const tr_tokenizer *t = g_tok[data[0] % g_n];
    const bool add_special = data[1] & 1, parse_special = data[1] & 2, render = data[1] & 4,
               remove_special = data[1] & 8;
    const char *text = (const char *)data + 2;
    const size_t len = size - 2;
    const int32_t n_vocab = tr_tokenizer_n_vocab(t);

    tr_error err;
    size_t need = 0, dropped = 0;
    int first = -1;
    int32_t one[1];
    tr_status st = tr_tokenize_ex(t, text, len, add_special, parse_special, one, 1, &need,
                                  &dropped, &first, &err);
    if (st != TR_OK && st != TR_E_ARG) abort(); /* only "does not fit" may fail here */
    if (st == TR_E_ARG && need <= 1) abort();
    if (dropped > len || (dropped && (first < 0 || first > 255)) || (!dropped && first != -1))
        abort();
    int32_t *ids = malloc((need ? need : 1) * sizeof *ids);
    size_t n = 0;
    if (!ids) abort();
    if (tr_tokenize(t, text, len, add_special, parse_special, ids, need, &n, &err) != TR_OK ||
        n != need)
        abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) abort();

    /* pieces: the size protocol, then the text */
    char small[4], big[1 << 12];
    for (size_t i = 0; i < n; i++) {
        const int k = tr_token_to_piece(t, ids[i], small, sizeof small, render);
        if (k < 0) {
            const int k2 = tr_token_to_piece(t, ids[i], big, sizeof big, render);
            if (-k < (int)sizeof big && k2 != -k) abort();
        }
    }
    size_t dn = 0;
    st = tr_detokenize(t, ids, n, remove_special, render, big, sizeof big, &dn, &err);
    if (st == TR_E_ARG && dn > sizeof big) {
        char *out = malloc(dn);
        if (!out) abort();
        if (tr_detokenize(t, ids, n, remove_special, render, out, dn, &dn, &err) != TR_OK)
            abort();
        free(out);
    } else if (st != TR_OK) {
        abort();
    }
    free(ids);
    return 0;
}
