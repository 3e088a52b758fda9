/*
 * The embedding API end to end, built against an installed terrace:
 *
 *   cc simple.c $(pkg-config --cflags --libs terrace) -o simple
 *   ./simple MODEL.gguf "Why is the sky blue?" [N_PREDICT [PROMPT_OUT]]
 *
 * Loads the model, renders one user message with the model's own chat template, tokenizes it,
 * generates greedily until an end-of-generation token (or N_PREDICT tokens, default 64) and
 * prints the reply, detokenized. With PROMPT_OUT it also writes the rendered prompt there, so
 * that `terrace run -f PROMPT_OUT --temp 0 -n N_PREDICT --no-display-prompt` can be compared.
 * Ctrl-C stops the generation through the session's abort callback.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <terrace.h>

static volatile sig_atomic_t stop;

static void on_sigint(int sig) {
    (void)sig;
    stop = 1;
}

static bool should_stop(void *user) {
    (void)user;
    return stop != 0;
}

static int fail(const tr_error *err) {
    fprintf(stderr, "simple: %s (%s)\n", err->msg, tr_status_name(err->status));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf MESSAGE [N_PREDICT [PROMPT_OUT]]\n", argv[0]);
        return 2;
    }
    const int n_predict = argc > 3 ? atoi(argv[3]) : 64;
    if (strcmp(tr_version(), TR_VERSION_STRING)) {
        fprintf(stderr, "simple: built against terrace %s, running with %s\n", TR_VERSION_STRING,
                tr_version());
        return 1;
    }
    tr_error err = {0};
    tr_model *model = NULL;
    tr_chat_template *tmpl = NULL;
    tr_session *sess = NULL;
    tr_sampler *smp = NULL;
    char *prompt = NULL;
    int32_t *toks = NULL, *reply = NULL;
    float *logits = NULL;
    char *text = NULL;
    int rc = 1;

    tr_model_params mp = tr_model_default_params();
    if (tr_model_load(argv[1], &mp, &model, &err)) return fail(&err);
    const tr_tokenizer *tok = tr_model_tokenizer(model);
    if (!tok) {
        fprintf(stderr, "simple: %s has no vocabulary\n", argv[1]);
        goto out;
    }

    /* messages -> prompt text, with the model's own template */
    if (tr_chat_template_load(model, NULL, &tmpl, &err)) goto fail;
    const tr_chat_message msg = {"user", argv[2]};
    if (tr_chat_template_apply(tmpl, &msg, 1, NULL, NULL, true, NULL, &prompt, &err)) goto fail;
    if (argc > 4) {
        FILE *f = fopen(argv[4], "w");
        if (!f || fputs(prompt, f) < 0 || fclose(f)) {
            fprintf(stderr, "simple: cannot write %s\n", argv[4]);
            goto out;
        }
    }

    /* prompt text -> tokens: BOS as the file asks, special tokens parsed (the template wrote
     * them as text); a first call measures */
    size_t n_tok = 0;
    const size_t len = strlen(prompt);
    tr_status st = tr_tokenize(tok, prompt, len, true, true, NULL, 0, &n_tok, &err);
    if (st != TR_OK && st != TR_E_ARG) goto fail;
    if (!(toks = malloc(n_tok * sizeof *toks))) goto out;
    if (tr_tokenize(tok, prompt, len, true, true, toks, n_tok, &n_tok, &err)) goto fail;

    tr_session_params sp = tr_session_default_params();
    if (tr_session_create(model, &sp, &sess, &err)) goto fail;
    tr_session_set_abort(sess, should_stop, NULL);
    signal(SIGINT, on_sigint);

    tr_sampler_params sampling = tr_sampler_default_params();
    sampling.temp = 0; /* greedy */
    const int32_t n_vocab = tr_model_n_vocab(model);
    if (tr_sampler_create(&sampling, n_vocab, &smp, &err)) goto fail;
    for (size_t i = 0; i < n_tok; i++) tr_sampler_accept(smp, toks[i]);

    logits = malloc(sizeof(float) * (size_t)n_vocab);
    reply = malloc(sizeof(int32_t) * (size_t)(n_predict > 0 ? n_predict : 1));
    if (!logits || !reply) goto out;
    if (tr_session_eval(sess, toks, (int32_t)n_tok, logits, false, &err)) goto fail;
    int n_reply = 0;
    while (n_reply < n_predict) {
        const int32_t t = tr_sampler_sample(smp, logits);
        if (tr_token_is_eog(tok, t)) break;
        tr_sampler_accept(smp, t);
        reply[n_reply++] = t;
        if (n_reply == n_predict || tr_session_n_past(sess) >= tr_session_n_ctx(sess)) break;
        st = tr_session_eval(sess, &t, 1, logits, false, &err);
        if (st == TR_E_ABORTED) break;
        if (st) goto fail;
    }

    /* tokens -> text */
    size_t n_text = 0;
    st = tr_detokenize(tok, reply, (size_t)n_reply, false, false, NULL, 0, &n_text, &err);
    if (st != TR_OK && st != TR_E_ARG) goto fail;
    if (!(text = malloc(n_text + 1))) goto out;
    if (tr_detokenize(tok, reply, (size_t)n_reply, false, false, text, n_text, &n_text, &err))
        goto fail;
    fwrite(text, 1, n_text, stdout);
    fputc('\n', stdout);
    rc = 0;
    goto out;
fail:
    fail(&err);
out:
    free(text);
    free(reply);
    free(logits);
    free(toks);
    tr_free(prompt);
    tr_sampler_free(smp);
    tr_session_free(sess);
    tr_chat_template_free(tmpl);
    tr_model_free(model);
    return rc;
}
