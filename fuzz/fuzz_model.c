/*
 * libFuzzer target for the model loader's validation: a valid small model (a dense llama or a
 * qwen3moe, F32 weights, a byte-level BPE tokenizer) whose metadata values are changed by the
 * input, then loaded (the tokenizer with it), and — when it loads — a session created and a
 * few tokens evaluated, so a hyperparameter that passes validation but does not fit the tensors
 * surfaces under AddressSanitizer. Failures must say why (a non-empty message).
 *
 * Input: byte 0 picks the base model; then edits of [op][key][payload...]: op picks the value
 * type (u32, i32, u64, i64, f32, f64, bool, string, an array of u32 / i32 / f32 / strings,
 * delete), key one of the metadata keys terrace reads (hyperparameters of the base's
 * architecture, tokenizer keys, general.*), the payload bytes give the value. Token arrays can
 * also have one element replaced.
 *
 * build/run: make fuzz FUZZ=model   (corpus in fuzz/corpus-model, replayed by make test)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_VOCAB 300

typedef struct base {
    const char *arch;
    fw_meta meta;
    fw_tensor *t;
    size_t n_t;
} base;

static base g_base[2];
static float *g_weights; /* one pool of deterministic values all tensors point into */

static void tensor(base *b, const char *name, uint32_t nd, uint64_t a, uint64_t c, uint64_t d) {
    b->t = realloc(b->t, (b->n_t + 1) * sizeof *b->t);
    if (!b->t) abort();
    fw_tensor *t = &b->t[b->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = nd;
    t->ne[0] = a;
    t->ne[1] = c;
    t->ne[2] = d;
    t->data = g_weights;
}

static void tokenizer(fw_meta *m) {
    fw_buf tk = {0}, mg = {0};
    int32_t types[N_VOCAB];
    for (int b = 0; b < 256; b++) {
        char u[3];
        fw_str(&tk, u, fw_gpt2_byte(b, u));
        types[b] = 1;
    }
    for (int i = 256; i < N_VOCAB - 2; i++) {
        char s[16];
        snprintf(s, sizeof s, "<extra_%d>", i);
        fw_str(&tk, s, strlen(s));
        types[i] = 1;
    }
    fw_str(&tk, "<|bos|>", 7);
    fw_str(&tk, "<|eos|>", 7);
    types[N_VOCAB - 2] = types[N_VOCAB - 1] = 3;
    fw_str(&mg, "h e", 3);
    fw_buf *v = fw_set_arr(m, "tokenizer.ggml.tokens", TR_GGUF_STRING, N_VOCAB);
    fw_put(v, tk.p, tk.n);
    fw_put(fw_set_arr(m, "tokenizer.ggml.token_type", TR_GGUF_I32, N_VOCAB), types, sizeof types);
    fw_put(fw_set_arr(m, "tokenizer.ggml.merges", TR_GGUF_STRING, 1), mg.p, mg.n);
    fw_set_str(m, "tokenizer.ggml.model", "gpt2");
    fw_set_str(m, "tokenizer.ggml.pre", "gpt-2");
    fw_set_u32(m, "tokenizer.ggml.bos_token_id", N_VOCAB - 2);
    fw_set_u32(m, "tokenizer.ggml.eos_token_id", N_VOCAB - 1);
    free(tk.p);
    free(mg.p);
}

static void build(base *b, bool moe) {
    enum { E = 32, L = 2, H = 4, KV = 2, HD = 8, F = 64, NE = 4, K = 2, FE = 16 };
    b->arch = moe ? "qwen3moe" : "llama";
    fw_meta *m = &b->meta;
    char k[96];
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", b->arch, s), k)
    fw_set_str(m, "general.architecture", b->arch);
    fw_set_str(m, "general.name", "fuzz");
    fw_set_u32(m, KEY("context_length"), 256);
    fw_set_u32(m, KEY("embedding_length"), E);
    fw_set_u32(m, KEY("block_count"), L);
    fw_set_u32(m, KEY("feed_forward_length"), moe ? FE * K : F);
    fw_set_u32(m, KEY("attention.head_count"), H);
    fw_set_u32(m, KEY("attention.head_count_kv"), KV);
    fw_set_f32(m, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    fw_set_f32(m, KEY("rope.freq_base"), 10000.0f);
    if (moe) {
        fw_set_u32(m, KEY("attention.key_length"), HD);
        fw_set_u32(m, KEY("attention.value_length"), HD);
        fw_set_u32(m, KEY("expert_count"), NE);
        fw_set_u32(m, KEY("expert_used_count"), K);
        fw_set_u32(m, KEY("expert_feed_forward_length"), FE);
    } else {
        fw_set_u32(m, KEY("rope.dimension_count"), HD);
    }
#undef KEY
    tokenizer(m);
    tensor(b, "token_embd.weight", 2, E, N_VOCAB, 1);
    tensor(b, "output_norm.weight", 1, E, 1, 1);
    if (moe) tensor(b, "output.weight", 2, E, N_VOCAB, 1);
    for (int l = 0; l < L; l++) {
        char n[64];
#define T(s, nd, a, c, d) (snprintf(n, sizeof n, "blk.%d.%s", l, s), tensor(b, n, nd, a, c, d))
        T("attn_norm.weight", 1, E, 1, 1);
        T("attn_q.weight", 2, E, H * HD, 1);
        T("attn_k.weight", 2, E, KV * HD, 1);
        T("attn_v.weight", 2, E, KV * HD, 1);
        T("attn_output.weight", 2, H * HD, E, 1);
        T("ffn_norm.weight", 1, E, 1, 1);
        if (moe) {
            T("attn_q_norm.weight", 1, HD, 1, 1);
            T("attn_k_norm.weight", 1, HD, 1, 1);
            T("ffn_gate_inp.weight", 2, E, NE, 1);
            T("ffn_gate_exps.weight", 3, E, FE, NE);
            T("ffn_up_exps.weight", 3, E, FE, NE);
            T("ffn_down_exps.weight", 3, FE, E, NE);
        } else {
            T("ffn_gate.weight", 2, E, F, 1);
            T("ffn_up.weight", 2, E, F, 1);
            T("ffn_down.weight", 2, F, E, 1);
        }
#undef T
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const size_t n = 32 * N_VOCAB; /* the largest tensor */
    g_weights = malloc(n * sizeof *g_weights);
    if (!g_weights) abort();
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        g_weights[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.5f;
    }
    build(&g_base[0], false);
    build(&g_base[1], true);
    return 0;
}

/* the keys an edit can change; "%s" is the base's architecture */
static const char *const k_keys[] = {
    "general.architecture", "general.alignment", "general.name", "%s.context_length",
    "%s.embedding_length", "%s.block_count", "%s.feed_forward_length",
    "%s.attention.head_count", "%s.attention.head_count_kv", "%s.attention.key_length",
    "%s.attention.value_length", "%s.rope.dimension_count", "%s.rope.freq_base",
    "%s.rope.freq_base_swa", "%s.rope.scaling.type", "%s.rope.scaling.factor",
    "%s.rope.scale_linear", "%s.rope.scaling.original_context_length",
    "%s.rope.scaling.attn_factor", "%s.rope.scaling.yarn_beta_fast",
    "%s.attention.layer_norm_rms_epsilon", "%s.attention.sliding_window", "%s.expert_count",
    "%s.expert_used_count", "%s.expert_feed_forward_length",
    "%s.expert_shared_feed_forward_length", "%s.final_logit_softcapping",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_space_prefix", "split.count",
    "split.no",
};
#define N_KEYS (sizeof k_keys / sizeof k_keys[0])

typedef struct rd {
    const uint8_t *p;
    size_t n;
} rd;
static uint8_t take8(rd *r) {
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}
static void take(rd *r, void *dst, size_t n) {
    memset(dst, 0, n);
    const size_t k = n < r->n ? n : r->n;
    memcpy(dst, r->p, k);
    r->p += k;
    r->n -= k;
}

/* replaces element i of a string array entry with s (the entry is rebuilt) */
static void set_str_elem(fw_kv *e, uint64_t i, const uint8_t *s, size_t sl) {
    if (e->type != TR_GGUF_ARRAY || e->val.n < 12) return;
    uint32_t et;
    uint64_t n;
    memcpy(&et, e->val.p, 4);
    memcpy(&n, e->val.p + 4, 8);
    if (et != TR_GGUF_STRING || n == 0) return;
    i %= n;
    fw_buf out = {0};
    fw_put(&out, e->val.p, 12);
    size_t off = 12;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t l;
        memcpy(&l, e->val.p + off, 8);
        if (j == i) fw_str(&out, s, sl);
        else fw_put(&out, e->val.p + off, 8 + (size_t)l);
        off += 8 + (size_t)l;
    }
    free(e->val.p);
    e->val = out;
}

static void apply(fw_meta *m, const char *arch, rd *r) {
    const uint8_t op = take8(r) % 13;
    char key[96];
    const char *tmpl = k_keys[take8(r) % N_KEYS];
    if (!strncmp(tmpl, "%s.", 3)) snprintf(key, sizeof key, "%s.%s", arch, tmpl + 3);
    else snprintf(key, sizeof key, "%s", tmpl);
    fw_kv *e;
    switch (op) {
    case 0: { uint32_t v; take(r, &v, 4); fw_u32(&fw_slot(m, key, TR_GGUF_U32)->val, v); break; }
    case 1: { int32_t v; take(r, &v, 4); fw_put(&fw_slot(m, key, TR_GGUF_I32)->val, &v, 4); break; }
    case 2: { uint64_t v; take(r, &v, 8); fw_u64(&fw_slot(m, key, TR_GGUF_U64)->val, v); break; }
    case 3: { int64_t v; take(r, &v, 8); fw_put(&fw_slot(m, key, TR_GGUF_I64)->val, &v, 8); break; }
    case 4: { float v; take(r, &v, 4); fw_put(&fw_slot(m, key, TR_GGUF_F32)->val, &v, 4); break; }
    case 5: { double v; take(r, &v, 8); fw_put(&fw_slot(m, key, TR_GGUF_F64)->val, &v, 8); break; }
    case 6: { uint8_t v = take8(r); fw_put(&fw_slot(m, key, TR_GGUF_BOOL)->val, &v, 1); break; }
    case 7: { /* string of up to 31 bytes */
        uint8_t s[32];
        const size_t l = take8(r) % 32;
        take(r, s, l);
        fw_str(&fw_slot(m, key, TR_GGUF_STRING)->val, s, l);
        break;
    }
    case 8: case 9: case 10: { /* array of u32 / i32 / f32: up to 7 elements */
        const uint32_t et = op == 8 ? TR_GGUF_U32 : op == 9 ? TR_GGUF_I32 : TR_GGUF_F32;
        const uint64_t n = take8(r) % 8;
        fw_buf *v = fw_set_arr(m, key, et, n);
        for (uint64_t i = 0; i < n; i++) {
            uint32_t x;
            take(r, &x, 4);
            fw_u32(v, x);
        }
        break;
    }
    case 11: fw_drop(m, key); break;
    default: { /* one element of a string array (tokens, merges) */
        uint16_t i;
        take(r, &i, 2);
        uint8_t s[16];
        const size_t l = take8(r) % 16;
        take(r, s, l);
        if ((e = fw_find(m, key))) set_str_elem(e, i, s, l);
        break;
    }
    }
}

static void need_message(const tr_error *err) {
    if (err->msg[0] == '\0') abort(); /* a failure must say why */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rd r = {data, size};
    const base *b = &g_base[take8(&r) % 2];
    fw_meta m = fw_meta_copy(&b->meta);
    for (int edits = 0; r.n && edits < 16; edits++) apply(&m, b->arch, &r);
    fw_buf file = {0};
    fw_serialise(&m, b->t, b->n_t, &file);
    fw_meta_free(&m);
    const char *path = fw_memfd_path(&file);
    free(file.p);

    tr_model_params mp = tr_model_default_params();
    mp.n_threads = 1;
    mp.experts = TR_EXPERTS_MMAP; /* no I/O threads per input */
    tr_error err = {0};
    tr_model *model = NULL;
    if (tr_model_load(path, &mp, &model, &err) != TR_OK) {
        if (model) abort();
        need_message(&err);
        return 0;
    }
    const tr_tokenizer *tok = tr_model_tokenizer(model); /* loaded (and checked) with it */
    tr_session_params sp = tr_session_default_params();
    sp.n_ctx = 16;
    sp.n_batch = 4;
    tr_session *s = NULL;
    if (tr_session_create(model, &sp, &s, &err) == TR_OK) {
        const int32_t n_vocab = tr_model_n_vocab(model);
        int32_t ids[6];
        size_t n = 0;
        if (!tok || tr_tokenize(tok, "hello world", 11, true, true, ids, 6, &n, &err) != TR_OK)
            n = 0;
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= n_vocab) abort(); /* the loader matched the sizes */
        float *logits = malloc(sizeof(float) * (size_t)n_vocab);
        if (!logits) abort();
        if (n && tr_session_eval(s, ids, (int32_t)n, logits, false, &err) != TR_OK)
            need_message(&err);
        free(logits);
        tr_session_free(s);
    } else {
        need_message(&err);
    }
    tr_model_free(model);
    return 0;
}
