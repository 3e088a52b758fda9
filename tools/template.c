/*
 * terrace template FILE.jinja|-m MODEL.gguf --messages MSGS.json [options]
 *
 * Renders a chat template for a conversation and prints the prompt text to stdout, exactly as
 * the model would see it (no newline added): for checking a template against Hugging Face's
 * apply_chat_template, and for scripts. Only the GGUF's metadata is read, not its weights.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void template_usage(FILE *f) {
    fprintf(f,
            "usage: terrace template FILE.jinja|-m MODEL.gguf --messages MSGS.json [options]\n\n"
            "Prints the prompt a chat template renders for a conversation (stdout, no newline added).\n\n"
            "  -m,--model FILE            the GGUF whose tokenizer.chat_template (and BOS/EOS) to use\n"
            "  --chat-template NAME|FILE  with -m: a template the file carries (tokenizer.chat_template.NAME),\n"
            "                             a built-in format, or a .jinja file, instead of the model's own\n"
            "  --messages FILE            the conversation: a JSON array of {role, content, ...} (- for stdin)\n"
            "  --context FILE             a JSON object of extra template variables (tools, enable_thinking ...)\n"
            "  --no-generation-prompt     do not open the assistant's turn at the end\n"
            "  --bos-token S, --eos-token S  the bos_token / eos_token variables (default: the model's)\n"
            "  --now YYYY-MM-DDTHH:MM:SS  the time strftime_now formats (default: now, local time)\n"
            "  -h,--help                  this text\n");
}

static char *slurp(const char *path) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        cli_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *g = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2 + 1) : NULL;
        if (!g) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = g;
        cap *= 2;
    }
    const bool bad = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || bad) {
        free(buf);
        cli_error("cannot read %s", path);
        return NULL;
    }
    buf[n] = '\0';
    if (strlen(buf) != n) {
        free(buf);
        cli_error("%s contains a NUL byte", path);
        return NULL;
    }
    return buf;
}

int cmd_template(int argc, char **argv) {
    const char *file = NULL, *model = NULL, *name = NULL, *messages = NULL, *context = NULL;
    const char *bos = NULL, *eos = NULL, *now = NULL;
    bool gen = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool has_v = i + 1 < argc;
        const char **dst = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            template_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-generation-prompt")) {
            gen = false;
            continue;
        }
        if (!strcmp(a, "--jinja")) continue; /* llama.cpp's switch: Jinja is always on */
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dst = &model;
        else if (!strcmp(a, "--chat-template")) dst = &name;
        else if (!strcmp(a, "--messages")) dst = &messages;
        else if (!strcmp(a, "--context")) dst = &context;
        else if (!strcmp(a, "--bos-token")) dst = &bos;
        else if (!strcmp(a, "--eos-token")) dst = &eos;
        else if (!strcmp(a, "--now")) dst = &now;
        if (dst) {
            if (!has_v) {
                cli_error("template: option %s needs a value", a);
                return CLI_EXIT_USAGE;
            }
            *dst = argv[++i];
            continue;
        }
        if (a[0] == '-' && a[1]) {
            cli_error("template: unknown option '%s' (see terrace template --help)", a);
            return CLI_EXIT_USAGE;
        }
        if (file) {
            cli_error("template: more than one template file ('%s', '%s')", file, a);
            return CLI_EXIT_USAGE;
        }
        file = a;
    }
    if (!file == !model) {
        cli_error("template: give a template file or -m MODEL.gguf (one of them)");
        template_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (file && name) {
        cli_error("template: --chat-template goes with -m; the template file is already given");
        return CLI_EXIT_USAGE;
    }
    if (!messages) {
        cli_error("template: no conversation (--messages MSGS.json)");
        return CLI_EXIT_USAGE;
    }
    int rc = CLI_EXIT_ERROR;
    tr_error err = {0};
    tr_gguf *g = NULL;
    tr_chat_template *t = NULL;
    char *src = NULL, *msgs = NULL, *ctx = NULL, *out = NULL;
    if (!(msgs = slurp(messages))) goto done;
    if (context && !(ctx = slurp(context))) goto done;
    if (file) {
        if (!(src = slurp(file))) goto done;
        if (tr_chat_template_from_string(src, bos, eos, &t, &err)) {
            cli_error("%s: %s", file, err.msg);
            goto done;
        }
    } else {
        if (tr_gguf_open(model, &g, &err) || tr_chat_template_load_gguf(g, name, &t, &err)) {
            cli_error("%s", err.msg);
            goto done;
        }
        if ((bos || eos) && tr_chat_template_source(t)) {
            /* the same text with the caller's token strings */
            tr_chat_template *u = NULL;
            if (tr_chat_template_from_string(tr_chat_template_source(t), bos, eos, &u, &err)) {
                cli_error("%s", err.msg);
                goto done;
            }
            tr_chat_template_free(t);
            t = u;
        }
    }
    if (tr_chat_template_apply(t, NULL, 0, msgs, ctx, gen, now, &out, &err)) {
        cli_error("%s", err.msg);
        goto done;
    }
    fputs(out, stdout);
    rc = fflush(stdout) ? CLI_EXIT_ERROR : 0;
done:
    tr_free(out);
    tr_chat_template_free(t);
    tr_gguf_close(g);
    free(src);
    free(msgs);
    free(ctx);
    return rc;
}
