/*
 * terrace chat -m MODEL [-sys SYSTEM] [-p FIRST_MESSAGE] [--chat-template NAME]
 *
 * Interactive chat with the model's chat template (detected from tokenizer.chat_template, or
 * named with --chat-template); -f FILE gives the first message from a file. Each turn the whole
 * conversation is formatted and tokenized again; only the tokens after the part the session
 * already holds are evaluated, so earlier turns are not recomputed. With -p and stdin not a terminal (or -p alone), it answers one message and
 * exits — handy for scripts and the demo.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "generate.h"
#include "text/chat.h"

static void chat_usage(FILE *f) {
    fprintf(f, "usage: terrace chat -m MODEL.gguf [-sys SYSTEM] [-p MESSAGE] [options]\n\n"
               "Type a message and press enter; an empty line is ignored, /exit or end of input "
               "(Ctrl-D) quits.\nWith -p, answers that message; it stays interactive only if stdin "
               "is a terminal.\n\n");
    gen_print_common_flags(f);
}

static bool to_stdout(void *user, const char *s, size_t n) {
    (void)user;
    return out_write(s, n);
}

/* one line from stdin without its newline; NULL at end of input */
static char *read_line(void) {
    size_t cap = 256, n = 0;
    char *buf = malloc(cap);
    int c;
    while (buf && (c = getchar()) != EOF && c != '\n') {
        if (n + 1 == cap) {
            char *g = realloc(buf, cap *= 2);
            if (!g) {
                free(buf);
                return NULL;
            }
            buf = g;
        }
        buf[n++] = (char)c;
    }
    if (!buf || (c == EOF && n == 0)) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

typedef struct convo {
    tr_chat_msg *msgs;
    char **owned;
    size_t n, cap;
} convo;

static bool convo_add(convo *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        tr_chat_msg *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return false;
        c->msgs = m;
        char **o = realloc(c->owned, cap * sizeof *o);
        if (!o) return false;
        c->owned = o;
        c->cap = cap;
    }
    char *copy = strdup(content);
    if (!copy) return false;
    c->owned[c->n] = copy;
    c->msgs[c->n].role = role;
    c->msgs[c->n].content = copy;
    c->n++;
    return true;
}

int cmd_chat(int argc, char **argv) {
    gen_opts o;
    if (!gen_parse(argc, argv, &o, "chat", chat_usage)) return CLI_EXIT_USAGE;
    if (o.prompt && o.prompt_file) {
        cli_error("chat: give the first message with -p or -f, not both");
        return CLI_EXIT_USAGE;
    }
    int rc = CLI_EXIT_ERROR;
    char *file_text = NULL;
    loaded ld;
    memset(&ld, 0, sizeof ld);
    tr_session *s = NULL;
    tr_sampler *smp = NULL;
    float *logits = NULL;
    int32_t *held = NULL; /* tokens the session holds, to find what a new turn adds */
    size_t n_held = 0;
    convo cv = {0};
    gen_state total = {0};
    telem tm = {0};
    tr_error err = {0};
    if (!load_model(&o, &ld)) {
        if (ld.usage_error) rc = CLI_EXIT_USAGE;
        goto out;
    }
    if (!telem_open(&tm, o.telemetry, ld.model)) goto out;

    tr_str tmpl = {0};
    char *tmpl_c = NULL;
    if (tr_gguf_kv_str(tr_model_gguf(ld.model), "tokenizer.chat_template", &tmpl)) {
        tmpl_c = strndup(tmpl.ptr, (size_t)tmpl.len);
        if (!tmpl_c) goto out;
    }
    /* files without a template: Gemma's converters often drop it, and its format is fixed */
    const char *override = o.chat_template;
    if (!tmpl_c && !override && !strcmp(tr_model_arch(ld.model), "gemma3")) {
        override = "gemma";
        fprintf(stderr, "terrace: no chat template in the file; using gemma for a gemma3 model\n");
    }
    tr_chat_style style;
    const tr_status ds = tr_chat_detect(tmpl_c, override, &style, &err);
    free(tmpl_c);
    if (ds) {
        cli_error("%s", err.msg);
        goto out;
    }
    /* the template's end-of-turn strings stop generation too */
    for (const char *const *st = tr_chat_stop_strings(style); st && *st; st++)
        if (o.n_stop < (int)(sizeof o.stop / sizeof o.stop[0])) o.stop[o.n_stop++] = *st;

    tr_session_params sp = session_params(&o);
    if (tr_session_create(ld.model, &sp, &s, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    tm.sess = s;
    warn_context(&ld, s);
    if (o.prompt_file) { /* -f: the first message, no longer than the context can hold */
        char why[96];
        snprintf(why, sizeof why, "a context of %d tokens can hold (raise -c)",
                 tr_session_n_ctx(s));
        size_t flen = 0;
        if (!(file_text = read_file_max(o.prompt_file, text_bound(ld.tok, (size_t)tr_session_n_ctx(s)),
                                        why, &flen)))
            goto out;
        if (strlen(file_text) != flen) {
            cli_error("%s holds a NUL byte: a chat message is text", o.prompt_file);
            goto out;
        }
        o.prompt = file_text;
    }
    if (o.sampling.repeat_last_n < 0) o.sampling.repeat_last_n = tr_session_n_ctx(s);
    if (tr_sampler_create(&o.sampling, tr_model_n_vocab(ld.model), &smp, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    const int32_t n_ctx = tr_session_n_ctx(s);
    if (!(logits = malloc(sizeof(float) * (size_t)tr_model_n_vocab(ld.model))) ||
        !(held = malloc(sizeof(int32_t) * (size_t)n_ctx))) {
        cli_error("out of memory");
        goto out;
    }
    if (o.system && !convo_add(&cv, "system", o.system)) goto out;
    const bool interactive = isatty(0) || !o.prompt;
    fprintf(stderr, "terrace: chat template %s, context %d tokens%s\n", tr_chat_style_name(style),
            n_ctx, interactive ? "; /exit or Ctrl-D to quit" : "");
    const char *pending = o.prompt;
    for (;;) {
        char *line = NULL;
        if (pending) {
            line = strdup(pending);
            pending = NULL;
            if (interactive) fprintf(stderr, "> %s\n", line);
        } else {
            if (!interactive) break;
            fputs("> ", stderr);
            fflush(stderr);
            line = read_line();
            if (!line) break;
        }
        if (!line) goto out;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!*line) {
            free(line);
            continue;
        }
        const bool ok = convo_add(&cv, "user", line);
        free(line);
        if (!ok) goto out;
        char *text = NULL;
        if (tr_chat_format(style, cv.msgs, cv.n, true, &text, &err)) {
            cli_error("%s", err.msg);
            goto out;
        }
        size_t n_tok = 0;
        int32_t *toks = tokenize_alloc(ld.tok, text, strlen(text), true, true, &n_tok);
        free(text);
        if (!toks) goto out;
        if ((int64_t)n_tok >= n_ctx) {
            free(toks);
            cli_error("the conversation (%zu tokens) no longer fits the context of %d (raise -c)",
                      n_tok, n_ctx);
            goto out;
        }
        /* keep the common prefix, evaluate the rest (at least the last token, for its logits) */
        size_t keep = 0;
        while (keep < n_held && keep < n_tok && held[keep] == toks[keep]) keep++;
        if (keep == n_tok) keep--;
        tr_session_truncate(s, (int32_t)keep, &err);
        memcpy(held + keep, toks + keep, (n_tok - keep) * sizeof *toks);
        n_held = n_tok;
        gen_state g = {.sink = to_stdout, .tm = &tm};
        tr_sampler_reset(smp);
        const bool prefilled = gen_prefill(&g, s, toks + keep, n_tok - keep, logits);
        free(toks);
        if (!prefilled || !gen_run(&g, &o, &ld, s, smp, logits)) {
            free(g.text);
            goto out;
        }
        if (!out_write("\n", 1)) {
            cli_error("cannot write to standard output: %s", strerror(errno));
            free(g.text);
            goto out;
        }
        /* the reply as the model wrote it (stop strings cut) becomes the assistant's turn; the
         * session holds its tokens up to the last one sampled, which was not evaluated */
        const bool added = convo_add(&cv, "assistant",
                                     g.text ? g.text : "");
        free(g.text);
        if (!added) goto out;
        n_held = (size_t)tr_session_n_past(s) < n_held ? (size_t)tr_session_n_past(s) : n_held;
        total.n_prompt += g.n_prompt;
        total.n_gen += g.n_gen;
        total.n_decoded += g.n_decoded;
        total.prefill_ms += g.prefill_ms;
        total.decode_ms += g.decode_ms;
        if (total.ttft_ms == 0) total.ttft_ms = g.ttft_ms;
        total.stopped_by = g.stopped_by;
        if (o.verbose)
            fprintf(stderr, "terrace: %d prompt tokens, %d generated, %.1f tok/s decode\n",
                    g.n_prompt, g.n_gen, g.decode_ms > 0 ? 1e3 * g.n_decoded / g.decode_ms : 0.0);
    }
    if (!telem_close(&tm) || !close_outputs(&ld)) goto out;
    if (total.stopped_by) gen_summary(&total, &ld, s);
    rc = 0;
out:
    telem_close(&tm);
    free(file_text);
    for (size_t i = 0; i < cv.n; i++) free(cv.owned[i]);
    free(cv.owned);
    free(cv.msgs);
    free(held);
    free(logits);
    tr_sampler_free(smp);
    tr_session_free(s);
    if (ld.model) unload_model(&ld);
    return rc;
}
