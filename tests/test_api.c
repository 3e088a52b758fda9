/*
 * The embedding API through include/terrace.h alone (this file includes no private header), on a
 * synthetic model: version, metadata, the model's tokenizer and special tokens, tokenize /
 * detokenize / pieces, the sampler (greedy = argmax, seeded draws repeat), and the abort callback
 * (stops between chunks, keeps what it let finish, and resuming gives the logits of an
 * uninterrupted run).
 *
 * usage: test_api MODEL.gguf   (tests/py/synth.py qwen3 F32: byte-level BPE, <|bos|> <|eos|>)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "terrace.h"
#include "testutil.h"

static float max_diff(const float *a, const float *b, size_t n) {
    float d = 0;
    for (size_t i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

static void test_metadata(const tr_model *m) {
    TU_CHECK(!strcmp(tr_version(), TR_VERSION_STRING), "tr_version %s", tr_version());
    TU_CHECK(!strcmp(tr_model_name(m), "terrace synthetic qwen3 F32"), "name '%s'",
             tr_model_name(m));
    char buf[256];
    const int n = tr_model_desc(m, buf, sizeof buf);
    printf("  desc: %s (%llu parameters)\n", buf, (unsigned long long)tr_model_n_params(m));
    TU_CHECK(n > 0 && !strncmp(buf, "qwen3 ", 6) && strstr(buf, "ALL_F32"), "desc '%s'", buf);
    TU_CHECK(tr_model_n_params(m) > 0, "n_params");
    /* snprintf semantics: the length is what the whole text needs, the buffer holds a prefix */
    char small[4] = "xxx";
    TU_CHECK(tr_model_desc(m, small, sizeof small) == n && !strcmp(small, "qwe"), "truncated '%s'",
             small);
    TU_CHECK(tr_model_meta_val(m, "general.architecture", buf, sizeof buf) == 5 &&
                 !strcmp(buf, "qwen3"),
             "architecture '%s'", buf);
    TU_CHECK(tr_model_meta_val(m, "qwen3.context_length", buf, sizeof buf) > 0 &&
                 !strcmp(buf, "2048"),
             "context_length '%s'", buf);
    TU_CHECK(tr_model_meta_val(m, "qwen3.rope.freq_base", buf, sizeof buf) > 0 &&
                 !strcmp(buf, "1000000"),
             "freq_base '%s'", buf);
    const int nt = tr_model_meta_val(m, "tokenizer.ggml.merges", buf, sizeof buf);
    TU_CHECK(nt == 8 && !strcmp(buf, "[\"\xc4\xa0 t\"]"), "merges (%d) %s", nt, buf);
    const int ntok = tr_model_meta_val(m, "tokenizer.ggml.tokens", NULL, 0);
    TU_CHECK(ntok > 1024 * 4, "tokens array length %d", ntok);
    char *all = malloc((size_t)ntok + 1);
    TU_CHECK(all && tr_model_meta_val(m, "tokenizer.ggml.tokens", all, (size_t)ntok + 1) == ntok &&
                 strlen(all) == (size_t)ntok && all[0] == '[' && all[ntok - 1] == ']' &&
                 strstr(all, "\"<|eos|>\"]"),
             "tokens array rendering");
    free(all);
    TU_CHECK(tr_model_meta_val(m, "no.such.key", buf, sizeof buf) == -1, "missing key");
    TU_CHECK(tr_model_meta_val(m, NULL, buf, sizeof buf) == -1, "NULL key");
    const int64_t nkv = tr_model_meta_count(m);
    TU_CHECK(nkv > 10 && tr_model_meta_key(m, nkv) == NULL && tr_model_meta_key(m, -1) == NULL,
             "meta count %lld", (long long)nkv);
    bool found = false;
    for (int64_t i = 0; i < nkv; i++)
        if (!strcmp(tr_model_meta_key(m, i), "general.name")) {
            found = tr_model_meta_val_at(m, i, buf, sizeof buf) > 0 &&
                    !strcmp(buf, tr_model_name(m));
        }
    TU_CHECK(found, "general.name by index");
    TU_CHECK(!strcmp(tr_file_type_name(15), "Q4_K_M") && !strcmp(tr_file_type_name(15 | 1024),
                                                                 "Q4_K_M") &&
                 !strcmp(tr_file_type_name(999), "unknown"),
             "file type names");
    TU_CHECK(!strcmp(tr_status_name(TR_E_ABORTED), "aborted"), "status name");
}

static void test_tokenizer(const tr_model *m) {
    const tr_tokenizer *t = tr_model_tokenizer(m);
    TU_CHECK(t != NULL, "the model has its tokenizer");
    if (!t) return;
    const int32_t nv = tr_tokenizer_n_vocab(t);
    TU_CHECK(nv == tr_model_n_vocab(m), "n_vocab %d vs %d", nv, tr_model_n_vocab(m));
    const int32_t bos = tr_token_bos(t), eos = tr_token_eos(t);
    TU_CHECK(bos == nv - 2 && eos == nv - 1, "bos %d eos %d", bos, eos);
    TU_CHECK(tr_token_special(t, TR_SPECIAL_BOS) == bos && tr_token_special(t, TR_SPECIAL_EOT) == -1,
             "special roles");
    TU_CHECK(tr_token_is_eog(t, eos) && !tr_token_is_eog(t, bos) && !tr_token_is_eog(t, 'a'),
             "is_eog");
    TU_CHECK(tr_token_is_control(t, eos) && !tr_token_is_control(t, 65), "is_control");
    size_t n_eog = 0;
    const int32_t *eog = tr_tokenizer_eog_ids(t, &n_eog);
    TU_CHECK(n_eog >= 1 && eog && eog[n_eog - 1] == eos, "EOG set (%zu)", n_eog);
    TU_CHECK(!strcmp(tr_tokenizer_model(t), "gpt2") && !strcmp(tr_tokenizer_pre(t), "gpt-2"),
             "model/pre");
    size_t len = 0;
    TU_CHECK(!strcmp(tr_token_text(t, eos, &len), "<|eos|>") && len == 7, "token text");
    TU_CHECK(tr_token_find(t, "<|bos|>", 7) == bos && tr_token_find(t, "nope", 4) == -1, "find");
    TU_CHECK(tr_token_attr(t, eos) & TR_TOKEN_ATTR_CONTROL, "attr");

    /* parse_special: control token text becomes the token only when asked */
    tr_error err = {0};
    int32_t ids[64];
    size_t n = 0;
    const char *text = "<|bos|>hi you";
    TU_CHECK(tr_tokenize(t, text, strlen(text), false, true, ids, 64, &n, &err) == TR_OK && n > 1 &&
                 ids[0] == bos,
             "parse_special: %s", err.msg);
    size_t n_plain = 0;
    int32_t plain[64];
    TU_CHECK(tr_tokenize(t, text, strlen(text), false, false, plain, 64, &n_plain, &err) == TR_OK &&
                 n_plain > n && plain[0] != bos,
             "without parse_special the text stays text");
    /* too small a buffer: TR_E_ARG and the count needed */
    size_t need = 0;
    TU_CHECK(tr_tokenize(t, text, strlen(text), false, true, ids, 2, &need, &err) == TR_E_ARG &&
                 need == n,
             "cap too small: need %zu", need);
    /* add_special follows the file (gpt2 without add_bos_token: no BOS) */
    size_t n_sp = 0;
    TU_CHECK(tr_tokenize(t, "hi", 2, true, true, ids, 64, &n_sp, &err) == TR_OK &&
                 (ids[0] == bos) == tr_tokenizer_add_bos(t),
             "add_special vs add_bos");

    /* detokenize round trip; control tokens only with unparse_special; remove_special */
    char buf[128];
    size_t dn = 0;
    TU_CHECK(tr_tokenize(t, text, strlen(text), false, true, ids, 64, &n, &err) == TR_OK, "tok");
    TU_CHECK(tr_detokenize(t, ids, n, false, true, buf, sizeof buf, &dn, &err) == TR_OK &&
                 dn == strlen(text) && !memcmp(buf, text, dn),
             "round trip '%.*s'", (int)dn, buf);
    TU_CHECK(tr_detokenize(t, ids, n, false, false, buf, sizeof buf, &dn, &err) == TR_OK &&
                 dn == strlen(text) - 7 && !memcmp(buf, "hi you", dn),
             "control hidden '%.*s'", (int)dn, buf);
    TU_CHECK(tr_detokenize(t, ids, n, false, true, buf, 3, &dn, &err) == TR_E_ARG &&
                 dn == strlen(text),
             "detokenize cap");
    const int32_t bad = nv + 5;
    TU_CHECK(tr_detokenize(t, &bad, 1, false, false, buf, sizeof buf, &dn, &err) == TR_E_ARG,
             "id out of range refused");
    TU_CHECK(tr_token_to_piece(t, eos, buf, sizeof buf, false) == 0 &&
                 tr_token_to_piece(t, eos, buf, sizeof buf, true) == 7 &&
                 tr_token_to_piece(t, eos, buf, 2, true) == -7 &&
                 tr_token_to_piece(t, nv + 1, buf, sizeof buf, true) == 0,
             "pieces");
}

static void test_sampler(const tr_model *m) {
    tr_error err = {0};
    const int32_t nv = tr_model_n_vocab(m);
    float *logits = malloc(sizeof(float) * (size_t)nv);
    tu_rng r = {7};
    for (int32_t i = 0; i < nv; i++) logits[i] = 3.0f * tu_normal(&r);
    int32_t best = 0;
    for (int32_t i = 1; i < nv; i++) best = logits[i] > logits[best] ? i : best;
    tr_sampler_params p = tr_sampler_default_params();
    p.temp = 0;
    tr_sampler *g = NULL, *a = NULL, *b = NULL;
    TU_CHECK(tr_sampler_create(&p, nv, &g, &err) == TR_OK, "%s", err.msg);
    TU_CHECK(tr_sampler_sample(g, logits) == best, "greedy is the argmax");
    p = tr_sampler_default_params();
    p.seed = 1234;
    p.temp = 1.5f;
    TU_CHECK(tr_sampler_create(&p, nv, &a, &err) == TR_OK && tr_sampler_create(&p, nv, &b, &err) ==
                                                                  TR_OK,
             "%s", err.msg);
    bool same = true, varied = false;
    int32_t first = -1;
    for (int i = 0; i < 50; i++) {
        const int32_t x = tr_sampler_sample(a, logits), y = tr_sampler_sample(b, logits);
        same = same && x == y;
        if (first < 0) first = x;
        varied = varied || x != first;
    }
    TU_CHECK(same && varied && tr_sampler_seed(a) == 1234, "seeded draws repeat and vary");
    size_t nc = 0;
    const tr_token_prob *c = tr_sampler_candidates(a, logits, &nc);
    TU_CHECK(c && nc >= 1 && nc <= 40 && c[0].id == best, "candidates (%zu)", nc);
    p.top_p = 1.5f;
    TU_CHECK(tr_sampler_validate(&p, &err) == TR_E_ARG && strstr(err.msg, "--top-p"), "validate: %s",
             err.msg);
    tr_sampler_free(g);
    tr_sampler_free(a);
    tr_sampler_free(b);
    free(logits);
}

typedef struct abort_counter {
    int calls, stop_at;
} abort_counter;

static bool abort_after(void *user) {
    abort_counter *a = user;
    return ++a->calls > a->stop_at;
}

static void test_abort(tr_model *m) {
    tr_error err = {0};
    const int32_t nv = tr_model_n_vocab(m);
    enum { N = 30 };
    int32_t toks[N];
    tu_rng r = {99};
    for (int i = 0; i < N; i++) toks[i] = (int32_t)(tu_next(&r) % (uint64_t)(nv - 2));
    tr_session_params sp = tr_session_default_params();
    sp.n_ctx = 64;
    sp.n_batch = 8;
    tr_session *s = NULL, *ref = NULL;
    TU_CHECK(tr_session_create(m, &sp, &s, &err) == TR_OK, "%s", err.msg);
    TU_CHECK(tr_session_create(m, &sp, &ref, &err) == TR_OK, "%s", err.msg);
    if (!s || !ref) return;
    float *la = malloc(sizeof(float) * (size_t)nv), *lb = malloc(sizeof(float) * (size_t)nv);
    TU_CHECK(tr_session_eval(ref, toks, N, la, false, &err) == TR_OK, "%s", err.msg);

    /* stops before the third chunk of 8: two chunks stay */
    abort_counter ac = {0, 2};
    tr_session_set_abort(s, abort_after, &ac);
    tr_status st = tr_session_eval(s, toks, N, lb, false, &err);
    TU_CHECK(st == TR_E_ABORTED && tr_session_n_past(s) == 16 && ac.calls == 3,
             "abort between chunks: %s, n_past %d, %d calls", tr_status_name(st),
             tr_session_n_past(s), ac.calls);
    /* a callback that never stops; the rest evaluated later gives the uninterrupted logits */
    ac.stop_at = 1 << 30;
    TU_CHECK(tr_session_eval(s, toks + 16, N - 16, lb, false, &err) == TR_OK, "%s", err.msg);
    const float d = max_diff(la, lb, (size_t)nv);
    printf("  aborted after 16 tokens, resumed: max |dlogit| vs one run %.2e\n", d);
    TU_CHECK(d < 2e-3f, "resumed logits differ by %g", d);
    /* between tokens: a decode step is refused before it runs and changes nothing */
    ac.calls = 0;
    ac.stop_at = 0;
    const int32_t next = toks[0];
    st = tr_session_eval(s, &next, 1, lb, false, &err);
    TU_CHECK(st == TR_E_ABORTED && tr_session_n_past(s) == N, "abort before a token");
    tr_session *batch[2] = {ref, s};
    const int32_t two[2] = {1, 2};
    float *l2 = malloc(sizeof(float) * 2 * (size_t)nv);
    st = tr_decode_batch(batch, two, 2, l2, &err);
    TU_CHECK(st == TR_E_ABORTED && strstr(err.msg, "sequence 1") && tr_session_n_past(ref) == N &&
                 tr_session_n_past(s) == N,
             "batch step aborted: %s", err.msg);
    tr_session_set_abort(s, NULL, NULL);
    TU_CHECK(tr_decode_batch(batch, two, 2, l2, &err) == TR_OK && tr_session_n_past(s) == N + 1,
             "callback removed: %s", err.msg);
    free(l2);
    free(la);
    free(lb);
    tr_session_free(s);
    tr_session_free(ref);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    tr_error err = {0};
    tr_model_params mp = tr_model_default_params();
    mp.n_threads = 2;
    tr_model *m = NULL;
    if (tr_model_load(argv[1], &mp, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_metadata(m);
    test_tokenizer(m);
    test_sampler(m);
    test_abort(m);
    tr_model_free(m);
    return tu_result("test_api");
}
