/*
 * terrace run -m MODEL -p PROMPT [-n N] ...  — prompt in, streamed text out, then a summary of
 * load time, TTFT, prefill and decode speed, and peak memory (on stderr, so stdout is only the
 * text).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "generate.h"

static void run_usage(FILE *f) {
    fprintf(f, "usage: terrace run -m MODEL.gguf (-p PROMPT | -f FILE) [options]\n\n"
               "Generates a continuation of the prompt. With --jinja or --chat-template, the prompt\n"
               "(and -sys) is first formatted as a user turn by the chat template (see `terrace chat`).\n\n");
    gen_print_common_flags(f);
}

static bool to_stdout(void *user, const char *s, size_t n) {
    (void)user;
    return out_write(s, n);
}

int cmd_run(int argc, char **argv) {
    gen_opts o;
    if (!gen_parse(argc, argv, &o, "run", run_usage)) return CLI_EXIT_USAGE;
    char *file_text = NULL;
    size_t plen = 0;
    const char *prompt = o.prompt;
    if (o.prompt_file && o.prompt) {
        cli_error("run: give the prompt with -p or -f, not both");
        return CLI_EXIT_USAGE;
    }
    if (!o.prompt && !o.prompt_file && !o.dry_run) {
        cli_error("run: no prompt (-p TEXT or -f FILE)");
        return CLI_EXIT_USAGE;
    }
    if (!o.prompt_file && prompt) plen = strlen(prompt);

    int rc = CLI_EXIT_ERROR;
    loaded ld;
    tr_session *s = NULL;
    tr_sampler *smp = NULL;
    float *logits = NULL;
    int32_t *toks = NULL;
    char *chat_text = NULL;
    gen_state g = {.sink = to_stdout};
    telem tm = {0};
    tr_error err = {0};
    if (!load_model(&o, &ld)) {
        if (ld.usage_error) rc = CLI_EXIT_USAGE;
        goto out;
    }
    if (o.dry_run) {
        tr_session_params dp = session_params(&o);
        tr_mem_plan pl;
        if (tr_session_plan(ld.model, &dp, &pl, &err)) {
            cli_error("%s", err.msg);
            goto out;
        }
        print_plan(stdout, &pl, "terrace: ");
        rc = 0;
        goto out;
    }
    tr_session_params sp = session_params(&o);
    if (tr_session_create(ld.model, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    print_kv_note(s, o.verbose);
    warn_context(&ld, s);
    if (o.prompt_file) {
        /* no more than the context can hold: a file that cannot fit is an error, not an OOM */
        char why[96];
        snprintf(why, sizeof why, "a context of %d tokens can hold (raise -c)",
                 tr_session_n_ctx(s));
        const size_t max = text_bound(ld.tok, (size_t)tr_session_n_ctx(s));
        if (!(file_text = read_file_max(o.prompt_file, max, why, &plen))) goto out;
        prompt = file_text;
    }
    if (!telem_open(&tm, o.telemetry, ld.model)) goto out;
    g.tm = &tm;
    bool add_bos = true;
    if (o.jinja || o.chat_template) {
        /* the prompt as the user's turn of a conversation, formatted by the chat template */
        tr_chat_template *t = NULL;
        char *text = strndup(prompt, plen);
        const tr_chat_message m[2] = {{"system", o.system ? o.system : ""}, {"user", text ? text : ""}};
        const tr_status st = !text ? TR_E_NOMEM
                           : tr_chat_template_load(ld.model, o.chat_template, &t, &err) ? err.status
                           : tr_chat_template_apply(t, o.system ? m : m + 1, o.system ? 2 : 1, NULL, NULL, true,
                                                    NULL, &chat_text, &err);
        tr_chat_template_free(t);
        free(text);
        if (st) {
            cli_error("%s", st == TR_E_NOMEM && !err.msg[0] ? "out of memory" : err.msg);
            goto out;
        }
        prompt = chat_text;
        plen = strlen(chat_text);
        /* a template that writes bos_token itself gets no second one from the tokenizer */
        const char *bos = tr_token_text(ld.tok, tr_token_bos(ld.tok), NULL);
        add_bos = !(bos && *bos && !strncmp(chat_text, bos, strlen(bos)));
    }
    size_t n_tok = 0;
    if (!(toks = tokenize_alloc(ld.tok, prompt, plen, add_bos, true, &n_tok))) goto out;
    if (n_tok == 0) {
        cli_error("run: the prompt is empty after tokenization");
        goto out;
    }
    tm.sess = s;
    /* Ctrl-C stops the generation (also in the middle of a long prefill); the text so far and
     * the summary are still printed */
    tr_session_set_abort(s, cli_abort_on_interrupt, NULL);
    g.interrupt = &cli_interrupted;
    cli_catch_interrupt();
    if ((int64_t)n_tok >= tr_session_n_ctx(s)) {
        cli_error("the prompt is %zu tokens but the context holds %d (raise -c, up to the model's "
                  "%d)", n_tok, tr_session_n_ctx(s), tr_model_n_ctx_train(ld.model));
        goto out;
    }
    if (o.sampling.repeat_last_n < 0) o.sampling.repeat_last_n = tr_session_n_ctx(s);
    if (tr_sampler_create(&o.sampling, tr_model_n_vocab(ld.model), &smp, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    if (o.verbose) {
        fprintf(stderr, "terrace: prompt tokens (%zu):", n_tok);
        for (size_t i = 0; i < n_tok; i++) fprintf(stderr, " %d", toks[i]);
        fputc('\n', stderr);
    }
    if (!(logits = malloc(sizeof(float) * (size_t)tr_model_n_vocab(ld.model)))) {
        cli_error("out of memory");
        goto out;
    }
    if (!o.no_display_prompt && !to_stdout(NULL, prompt, plen)) {
        cli_error("cannot write to standard output: %s", strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < n_tok; i++) tr_sampler_accept(smp, toks[i]);
    if (!gen_prefill(&g, s, toks, n_tok, logits) && !g.interrupted) goto out;
    if (!g.interrupted && !gen_run(&g, &o, &ld, s, smp, logits)) goto out;
    if (!telem_close(&tm) || !close_outputs(&ld)) goto out;
    if (!out_write("\n", 1)) {
        cli_error("cannot write to standard output: %s", strerror(errno));
        goto out;
    }
    gen_summary(&g, &ld, s);
    rc = g.interrupted ? CLI_EXIT_INTERRUPT : 0;
out:
    telem_close(&tm);
    free(g.text);
    free(g.ids);
    free(logits);
    free(toks);
    free(file_text);
    tr_free(chat_text);
    tr_sampler_free(smp);
    tr_session_free(s);
    if (ld.model) unload_model(&ld);
    return rc;
}
