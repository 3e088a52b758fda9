/*
 * terrace chat -m MODEL [-sys SYSTEM] [-p FIRST_MESSAGE] [--chat-template NAME]
 *
 * Interactive chat with the model's chat template. Each turn the whole conversation is rendered
 * and tokenized again; only the tokens after the longest prefix the session already holds are
 * evaluated, so earlier turns are not recomputed.
 *
 * When the context fills — before a reply or in the middle of one — the oldest turns after the
 * leading system messages are dropped, the conversation is rendered again and evaluated from the
 * common prefix (llama.cpp's context shift, done at turn granularity so the template's structure
 * stays intact); a reply in progress continues from its tokens so far. Ctrl-C stops a reply
 * (through the session's abort callback, so also in the middle of a long prefill) and returns to
 * the prompt; Ctrl-C or Ctrl-D at the prompt ends the chat with the summary.
 *
 * With -p (or -f FILE, the first message from a file) and stdin not a terminal it answers that one
 * message and exits (for scripts and the demo); without either it reads messages from stdin,
 * terminal or not.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checks.h"
#include "generate.h"

static const char k_commands[] =
    "  /help            this list\n"
    "  /clear           start a new conversation (leading system messages stay)\n"
    "  /save FILE       write the conversation to FILE as JSON: [{\"role\": ..., \"content\": "
    "...}, ...]\n"
    "  /load FILE       replace the conversation with the one in FILE (the same format)\n"
    "  /exit, /quit     leave (so do Ctrl-D and Ctrl-C at the prompt)\n"
    "  //text           send \"/text\" as a message\n"
    "A line ending in \\ continues on the next line; a line holding only \"\"\" starts a block\n"
    "that the next such line ends. Ctrl-C while the model answers stops the answer.\n";

static void chat_usage(FILE *f) {
    fprintf(f, "usage: terrace chat -m MODEL.gguf [-sys SYSTEM] [-p MESSAGE] [options]\n\n"
               "Type a message and press enter. With -p, answers that message first; it stays "
               "interactive only if stdin is a terminal.\n\ncommands at the prompt:\n%s\n",
            k_commands);
    gen_print_common_flags(f);
}

static bool to_stdout(void *user, const char *s, size_t n) {
    (void)user;
    return out_write(s, n);
}

/* ---- input: lines from fd 0 with read(2), so that Ctrl-C interrupts a wait ----------------- */

typedef struct reader {
    char buf[4096];
    size_t len, pos;
    bool eof;
} reader;

enum { IN_INTERRUPT = -1, IN_EOF = 0, IN_LINE = 1, IN_NOMEM = -2 };

static int read_line(reader *r, char **out) {
    *out = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    for (;;) {
        if (cli_interrupted) {
            free(line);
            return IN_INTERRUPT;
        }
        if (r->pos == r->len) {
            if (r->eof) break;
            const ssize_t got = read(0, r->buf, sizeof r->buf);
            if (got < 0 && errno == EINTR) continue; /* cli_interrupted says whether it was Ctrl-C */
            if (got <= 0) {
                r->eof = true;
                break;
            }
            r->len = (size_t)got;
            r->pos = 0;
        }
        const char *start = r->buf + r->pos;
        const char *nl = memchr(start, '\n', r->len - r->pos);
        const size_t take = nl ? (size_t)(nl - start) : r->len - r->pos;
        if (n + take + 1 > cap) {
            cap = (n + take + 1) * 2;
            char *g = realloc(line, cap);
            if (!g) {
                free(line);
                return IN_NOMEM;
            }
            line = g;
        }
        memcpy(line + n, start, take);
        n += take;
        r->pos += take + (nl ? 1 : 0);
        if (nl) break;
    }
    if (!line && r->eof) return IN_EOF;
    if (!line) line = calloc(1, 1);
    if (!line) return IN_NOMEM;
    line[n] = '\0';
    if (n && line[n - 1] == '\r') line[n - 1] = '\0';
    *out = line;
    return IN_LINE;
}

static bool append(char **dst, size_t *len, const char *s, bool newline) {
    const size_t sl = strlen(s);
    char *g = realloc(*dst, *len + sl + 2);
    if (!g) return false;
    *dst = g;
    if (newline) g[(*len)++] = '\n';
    memcpy(g + *len, s, sl + 1);
    *len += sl;
    return true;
}

/* One message: a line, lines continued by a trailing backslash, or a """ block. */
static int read_message(reader *r, bool prompt, char **out) {
    *out = NULL;
    char *line, *msg = NULL;
    size_t len = 0;
    if (prompt) {
        fputs("> ", stderr);
        fflush(stderr);
    }
    int st = read_line(r, &line);
    if (st != IN_LINE) return st;
    const bool block = !strcmp(line, "\"\"\"");
    bool more = block;
    if (!block) {
        const size_t n = strlen(line);
        more = n > 0 && line[n - 1] == '\\';
        if (more) line[n - 1] = '\0';
        if (!append(&msg, &len, line, false)) st = IN_NOMEM;
    }
    free(line);
    bool have = !block; /* msg holds a line already: the next one starts with a newline */
    while (more && st == IN_LINE) {
        if (prompt) {
            fputs(". ", stderr);
            fflush(stderr);
        }
        st = read_line(r, &line);
        if (st == IN_EOF) break; /* an unterminated block ends with the input */
        if (st != IN_LINE) break;
        if (block && !strcmp(line, "\"\"\"")) {
            free(line);
            break;
        }
        if (!block) {
            const size_t n = strlen(line);
            more = n > 0 && line[n - 1] == '\\';
            if (more) line[n - 1] = '\0';
        }
        if (!append(&msg, &len, line, have)) st = IN_NOMEM;
        have = true;
        free(line);
    }
    if (st == IN_INTERRUPT || st == IN_NOMEM) {
        free(msg);
        return st;
    }
    if (!msg) msg = calloc(1, 1);
    if (!msg) return IN_NOMEM;
    *out = msg;
    return IN_LINE;
}

/* ---- the conversation ---------------------------------------------------------------------- */

typedef struct convo {
    tr_chat_message *msgs; /* role and content owned (malloc) */
    size_t n, cap;
} convo;

static bool convo_add(convo *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        const size_t cap = c->cap ? c->cap * 2 : 16;
        tr_chat_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return false;
        c->msgs = m;
        c->cap = cap;
    }
    char *r = strdup(role), *t = strdup(content);
    if (!r || !t) {
        free(r);
        free(t);
        return false;
    }
    c->msgs[c->n].role = r;
    c->msgs[c->n].content = t;
    c->n++;
    return true;
}

/* drop messages [from, to) */
static void convo_drop(convo *c, size_t from, size_t to) {
    if (from >= to) return; /* also keeps an empty conversation's NULL array out of memmove */
    for (size_t i = from; i < to; i++) {
        free((char *)c->msgs[i].role);
        free((char *)c->msgs[i].content);
    }
    memmove(c->msgs + from, c->msgs + to, (c->n - to) * sizeof *c->msgs);
    c->n -= to - from;
}

static void convo_free(convo *c) {
    convo_drop(c, 0, c->n);
    free(c->msgs);
    memset(c, 0, sizeof *c);
}

/* the leading system messages, which context shifts and /clear keep */
static size_t convo_kept(const convo *c) {
    size_t k = 0;
    while (k < c->n && !strcmp(c->msgs[k].role, "system")) k++;
    return k;
}

/* Drops the oldest turn after the kept messages: everything before the second user message
 * that follows them, so the last user message (the one being answered) always stays. Returns
 * the number of messages dropped (0: nothing can go). */
static size_t convo_drop_oldest_turn(convo *c) {
    const size_t k = convo_kept(c);
    size_t u = k;
    while (u < c->n && strcmp(c->msgs[u].role, "user")) u++;
    size_t v = u + 1;
    while (v < c->n && strcmp(c->msgs[v].role, "user")) v++;
    if (u >= c->n || v >= c->n) return 0;
    convo_drop(c, k, v);
    return v - k;
}

static bool convo_save(const convo *c, const char *path) {
    cJSON *arr = cJSON_CreateArray();
    bool ok = arr != NULL;
    for (size_t i = 0; ok && i < c->n; i++) {
        cJSON *m = cJSON_CreateObject();
        ok = m && cJSON_AddStringToObject(m, "role", c->msgs[i].role) &&
             cJSON_AddStringToObject(m, "content", c->msgs[i].content);
        if (m) cJSON_AddItemToArray(arr, m);
    }
    char *text = ok ? cJSON_Print(arr) : NULL;
    cJSON_Delete(arr);
    if (!text) {
        cli_error("/save: out of memory");
        return false;
    }
    FILE *f = fopen(path, "w");
    ok = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f)) ok = false;
    free(text);
    if (!ok) cli_error("/save: cannot write %s: %s", path, strerror(errno));
    return ok;
}

/* content as OpenAI sends it: a string, null, or a list of parts of which the text ones count */
static bool content_text(const cJSON *v, char **out) {
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return (*out = calloc(1, 1)) != NULL;
    if (cJSON_IsString(v)) return (*out = strdup(v->valuestring)) != NULL;
    if (!cJSON_IsArray(v)) return false;
    char *text = calloc(1, 1);
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, v) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!text || !cJSON_IsString(t) || !append(&text, &len, t->valuestring, false)) {
            free(text);
            return false;
        }
    }
    *out = text;
    return text != NULL;
}

/* replaces *c with the conversation in the file; on any error *c is left as it was */
static bool convo_load(convo *c, const char *path) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) return false;
    cJSON *doc = cJSON_ParseWithLength(text, len);
    if (!doc) {
        const char *at = cJSON_GetErrorPtr();
        cli_error("/load: %s is not JSON (near byte %ld)", path, at ? (long)(at - text) : 0L);
        free(text);
        return false;
    }
    free(text);
    const cJSON *arr =
        cJSON_IsObject(doc) ? cJSON_GetObjectItemCaseSensitive(doc, "messages") : doc;
    convo next = {0};
    bool ok = cJSON_IsArray(arr);
    if (!ok)
        cli_error("/load: %s holds no list of messages ([{\"role\", \"content\"}, ...])", path);
    int i = 0;
    const cJSON *m;
    const cJSON *list = ok ? arr : NULL;
    cJSON_ArrayForEach(m, list) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        char *content = NULL;
        if (!cJSON_IsString(role) || !*role->valuestring) {
            cli_error("/load: %s: message %d has no role", path, i);
            ok = false;
        } else if (!content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), &content)) {
            cli_error("/load: %s: message %d: content is not text", path, i);
            ok = false;
        } else if (!convo_add(&next, role->valuestring, content)) {
            cli_error("/load: out of memory");
            ok = false;
        }
        free(content);
        if (!ok) break;
        i++;
    }
    cJSON_Delete(doc);
    if (!ok) {
        convo_free(&next);
        return false;
    }
    convo_free(c);
    *c = next;
    return true;
}

/* ---- the chat -------------------------------------------------------------------------------- */

typedef struct chat {
    gen_opts *o;
    loaded ld;
    tr_session *s;
    tr_sampler *smp;
    float *logits;
    int32_t n_ctx;
    int32_t *held; /* the tokens the session holds, [0, n_held) */
    size_t n_held;
    size_t n_prompt; /* the current reply's prompt: held[0, n_prompt), then its tokens */
    tr_chat_template *tmpl;
    tr_reasoning *rs; /* splits each reply into reasoning (shown apart) and answer */
    bool tty_err;     /* stderr is a terminal: reasoning is shown dimmed */
    bool in_reasoning;
    bool refused;     /* the template refused the conversation (render_tokens) */
    convo cv;
    gen_state total;
    telem tm;
    char *file_text; /* -f: the first message */
} chat;

/* the conversation as the template renders it for a reply (into *text if not NULL), tokenized;
 * NULL after an error (printed; c->refused if the template rejected the conversation) */
static int32_t *render_tokens(chat *c, size_t *n, char **text_out) {
    tr_error err = {0};
    char *text = NULL;
    const tr_status st = tr_chat_template_apply(c->tmpl, c->cv.msgs, c->cv.n, NULL, NULL, true,
                                                NULL, &text, &err);
    if (st) {
        c->refused = st == TR_E_FORMAT || st == TR_E_UNSUPPORTED;
        cli_error("chat template: %s", err.msg);
        return NULL;
    }
    /* a template that writes bos_token itself gets no second one from the tokenizer */
    const char *bos = tr_token_text(c->ld.tok, tr_token_bos(c->ld.tok), NULL);
    const bool has_bos = bos && *bos && !strncmp(text, bos, strlen(bos));
    int32_t *toks = tokenize_alloc(c->ld.tok, text, strlen(text), !has_bos, true, n);
    if (text_out && toks) *text_out = text;
    else tr_free(text);
    return toks;
}

/*
 * The prompt for a reply with `extra` tokens of it already generated and `room` more wanted:
 * oldest turns are dropped until prompt + extra + room fit the context, or nothing more can go
 * (the caller checks what fits). *dropped counts the messages dropped, *freed the tokens.
 */
static int32_t *fit_prompt(chat *c, size_t extra, size_t room, size_t *n, size_t *dropped,
                           size_t *freed, char **text) {
    *dropped = *freed = 0;
    size_t first = 0;
    for (;;) {
        if (text) {
            tr_free(*text);
            *text = NULL;
        }
        int32_t *toks = render_tokens(c, n, text);
        if (!toks) return NULL;
        if (!*dropped) first = *n;
        *freed = first > *n ? first - *n : 0;
        if (*n + extra + room <= (size_t)c->n_ctx) return toks;
        const size_t d = convo_drop_oldest_turn(&c->cv);
        if (!d) return toks;
        free(toks);
        *dropped += d;
    }
}

/* Makes the session hold toks[0, n): keeps the common prefix with what it holds, evaluates the
 * rest (at least the last token, for its logits). false on an error or an interrupt. */
static bool sync_session(chat *c, const int32_t *toks, size_t n, gen_state *g) {
    tr_error err = {0};
    size_t keep = 0;
    while (keep < c->n_held && keep < n && c->held[keep] == toks[keep]) keep++;
    if (keep == n) keep--;
    if (tr_session_truncate(c->s, (int32_t)keep, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    memcpy(c->held + keep, toks + keep, (n - keep) * sizeof *toks);
    const bool ok = gen_prefill(g, c->s, toks + keep, n - keep, c->logits);
    c->n_held = (size_t)tr_session_n_past(c->s); /* an interrupt keeps the chunks it let finish */
    return ok;
}

/* gen_run's hook when the context is full in the middle of a reply: drop turns, re-render,
 * evaluate the new prompt followed by the reply so far */
static bool shift_context(void *user, gen_state *g, float *logits) {
    chat *c = user;
    (void)logits; /* sync_session writes c->logits, which is this buffer */
    const size_t room = c->n_ctx / 8 > 16 ? (size_t)c->n_ctx / 8 : 16;
    size_t n, dropped, freed;
    int32_t *toks = fit_prompt(c, g->n_ids, room, &n, &dropped, &freed, NULL);
    if (!toks) return false;
    if (!dropped || n + g->n_ids >= (size_t)c->n_ctx) {
        free(toks);
        fprintf(stderr, "\nterrace: the context (%d tokens) is full and holds no older turn to "
                        "drop: the reply stops here (raise -c)\n", c->n_ctx);
        return false;
    }
    int32_t *seq = realloc(toks, (n + g->n_ids) * sizeof *seq);
    if (!seq) {
        free(toks);
        cli_error("out of memory");
        return false;
    }
    memcpy(seq + n, g->ids, g->n_ids * sizeof *seq);
    fprintf(stderr, "\nterrace: context full: dropped the %zu oldest messages (%zu tokens); the "
                    "reply goes on\n", dropped, freed);
    const bool ok = sync_session(c, seq, n + g->n_ids, g);
    free(seq);
    c->n_prompt = n;
    return ok;
}

static void remove_last(convo *cv) {
    if (cv->n) convo_drop(cv, cv->n - 1, cv->n);
}

/* answers the conversation's last (user) message; false only on errors that end the chat */
/* what the splitter made certain: reasoning on stderr (dimmed on a terminal, between markers
 * otherwise), the answer on stdout; false (errno set) when stdout failed */
static bool show(chat *c, const tr_reasoning_delta *d) {
    if (d->reasoning_len) {
        if (!c->in_reasoning) fputs(c->tty_err ? "\033[2m" : "[reasoning]\n", stderr);
        c->in_reasoning = true;
        fwrite(d->reasoning, 1, d->reasoning_len, stderr);
        fflush(stderr);
    }
    if (d->answer_len) {
        if (c->in_reasoning) fputs(c->tty_err ? "\033[0m\n" : "\n[/reasoning]\n", stderr);
        c->in_reasoning = false;
        return to_stdout(NULL, d->answer, d->answer_len);
    }
    return true;
}

static bool reply_sink(void *user, const char *s, size_t n) {
    chat *c = user;
    tr_error err = {0};
    tr_reasoning_delta d;
    /* out of memory in the splitter: show the text as it is */
    if (tr_reasoning_feed(c->rs, s, n, &d, &err)) return to_stdout(NULL, s, n);
    return show(c, &d);
}

/* answers the conversation's last (user) message; false only on errors that end the chat */
static bool answer(chat *c) {
    const gen_opts *o = c->o;
    tr_error err = {0};
    size_t room = (size_t)c->n_ctx / 4;
    if (o->n_predict >= 0 && (size_t)o->n_predict < room) room = (size_t)o->n_predict;
    size_t n, dropped, freed;
    char *prompt = NULL;
    c->refused = false;
    int32_t *toks = fit_prompt(c, 0, room, &n, &dropped, &freed, &prompt);
    if (!toks) {
        tr_free(prompt);
        if (!c->refused) return false;
        remove_last(&c->cv); /* the template rejected the conversation with it: not sent */
        fprintf(stderr, "terrace: the message was not sent\n");
        return true;
    }
    if (n >= (size_t)c->n_ctx) {
        free(toks);
        tr_free(prompt);
        remove_last(&c->cv);
        fprintf(stderr, "terrace: this message makes a prompt of %zu tokens, more than the context "
                        "holds (%d) even without the earlier turns: it was not sent (raise -c)\n",
                n, c->n_ctx);
        return true;
    }
    if (dropped)
        fprintf(stderr, "terrace: context: dropped the %zu oldest messages (%zu tokens) to make "
                        "room\n", dropped, freed);
    /* the prompt's end says whether the reply starts inside a reasoning block */
    const tr_status rst = tr_reasoning_reset(c->rs, prompt, &err);
    tr_free(prompt);
    if (rst) {
        free(toks);
        cli_error("%s", err.msg);
        return false;
    }
    c->in_reasoning = false;
    gen_state g = {.sink = reply_sink, .sink_user = c, .tm = &c->tm, .interrupt = &cli_interrupted,
                   .on_full = shift_context, .full_user = c};
    tr_sampler_reset(c->smp);
    const bool prefilled = sync_session(c, toks, n, &g);
    free(toks);
    c->n_prompt = n;
    bool ok = true;
    if (prefilled) {
        ok = gen_run(&g, o, &c->ld, c->s, c->smp, c->logits);
        tr_reasoning_delta d;
        bool out = tr_reasoning_finish(c->rs, &d, &err) != TR_OK || show(c, &d);
        if (c->in_reasoning) fputs(c->tty_err ? "\033[0m\n" : "\n[/reasoning]\n", stderr);
        c->in_reasoning = false;
        out = out_write("\n", 1) && out;
        if (ok && !out) {
            cli_error("cannot write to standard output: %s", strerror(errno));
            ok = false;
        }
    }
    if (g.interrupted) {
        fprintf(stderr, "terrace: [interrupted]\n");
        cli_interrupted = 0;
    }
    if (!prefilled && !g.interrupted) ok = false;
    if (prefilled && ok) {
        /* the answer as it came (stop strings cut, an interrupted one as far as it got; the
         * reasoning apart, as templates want past turns) is the assistant's turn; the session
         * holds the reply's tokens up to the last one evaluated */
        const size_t past = (size_t)tr_session_n_past(c->s);
        for (size_t j = 0; c->n_prompt + j < past && j < g.n_ids; j++)
            c->held[c->n_prompt + j] = g.ids[j];
        c->n_held = past;
        size_t alen = 0;
        const char *ans = tr_reasoning_answer(c->rs, &alen);
        if (!convo_add(&c->cv, "assistant", ans ? ans : "")) ok = false;
    } else if (!prefilled) {
        remove_last(&c->cv); /* nothing answered it */
    }
    c->total.n_prompt += g.n_prompt;
    c->total.n_gen += g.n_gen;
    c->total.n_decoded += g.n_decoded;
    c->total.prefill_ms += g.prefill_ms;
    c->total.decode_ms += g.decode_ms;
    if (c->total.ttft_ms == 0) c->total.ttft_ms = g.ttft_ms;
    c->total.stopped_by = g.stopped_by ? g.stopped_by : "interrupted";
    if (o->verbose)
        fprintf(stderr, "terrace: %d prompt tokens, %d generated, %.1f tok/s decode\n", g.n_prompt,
                g.n_gen, g.decode_ms > 0 ? 1e3 * g.n_decoded / g.decode_ms : 0.0);
    free(g.text);
    free(g.ids);
    return ok;
}

typedef enum { CMD_NONE, CMD_DONE, CMD_EXIT } cmd_result;

/* a line starting with '/': a command, or "//..." sent as "/..." */
static cmd_result command(chat *c, char *line) {
    if (line[0] != '/' || line[1] == '/') return CMD_NONE;
    char *arg = line + strcspn(line, " \t");
    if (*arg) *arg++ = '\0';
    arg += strspn(arg, " \t");
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) return CMD_EXIT;
    if (!strcmp(line, "/help")) {
        fputs(k_commands, stderr);
    } else if (!strcmp(line, "/clear")) {
        convo_drop(&c->cv, convo_kept(&c->cv), c->cv.n);
        fprintf(stderr, "terrace: new conversation\n");
    } else if (!strcmp(line, "/save") || !strcmp(line, "/load")) {
        if (!*arg) {
            fprintf(stderr, "terrace: %s needs a file name (%s FILE)\n", line, line);
        } else if (line[1] == 's') {
            if (convo_save(&c->cv, arg))
                fprintf(stderr, "terrace: saved %zu messages to %s\n", c->cv.n, arg);
        } else if (convo_load(&c->cv, arg)) {
            fprintf(stderr, "terrace: loaded %zu messages from %s\n", c->cv.n, arg);
        }
    } else {
        fprintf(stderr, "terrace: unknown command '%s' (/help lists them; start the line with // "
                        "to send it as text)\n", line);
    }
    return CMD_DONE;
}

static bool setup(chat *c) {
    tr_error err = {0};
    const gen_opts *o = c->o;
    if (!load_model(o, &c->ld)) return false;
    if (!telem_open(&c->tm, o->telemetry, c->ld.model)) return false;
    /* the model's own template (NULL), or --chat-template NAME|FILE */
    if (tr_chat_template_load(c->ld.model, o->chat_template, &c->tmpl, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    if (tr_reasoning_create(c->tmpl, NULL, o->reasoning_none ? TR_REASONING_NONE : TR_REASONING_AUTO,
                            &c->rs, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    c->tty_err = isatty(2);
    /* the template's end-of-turn strings stop generation too */
    for (const char *const *st = tr_chat_template_stop_strings(c->tmpl); st && *st; st++)
        if (c->o->n_stop < (int)(sizeof c->o->stop / sizeof c->o->stop[0]))
            c->o->stop[c->o->n_stop++] = *st;
    tr_session_params sp = session_params(o);
    if (tr_session_create(c->ld.model, &sp, &c->s, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    print_kv_note(c->s, o->verbose);
    c->tm.sess = c->s;
    c->n_ctx = tr_session_n_ctx(c->s);
    warn_context(&c->ld, c->s);
    if (o->prompt_file) { /* -f: the first message, no longer than the context can hold */
        char why[96];
        snprintf(why, sizeof why, "a context of %d tokens can hold (raise -c)", c->n_ctx);
        size_t flen = 0;
        if (!(c->file_text = read_file_max(o->prompt_file, text_bound(c->ld.tok, (size_t)c->n_ctx),
                                           why, &flen)))
            return false;
        if (strlen(c->file_text) != flen) {
            cli_error("%s holds a NUL byte: a chat message is text", o->prompt_file);
            return false;
        }
        c->o->prompt = c->file_text;
    }
    if (c->o->sampling.repeat_last_n < 0) c->o->sampling.repeat_last_n = c->n_ctx;
    if (tr_sampler_create(&o->sampling, tr_model_n_vocab(c->ld.model), &c->smp, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    if (!(c->logits = malloc(sizeof(float) * (size_t)tr_model_n_vocab(c->ld.model))) ||
        !(c->held = malloc(sizeof(int32_t) * (size_t)c->n_ctx))) {
        cli_error("out of memory");
        return false;
    }
    if (o->system && !convo_add(&c->cv, "system", o->system)) {
        cli_error("out of memory");
        return false;
    }
    tr_session_set_abort(c->s, cli_abort_on_interrupt, NULL);
    return true;
}

int cmd_chat(int argc, char **argv) {
    gen_opts o;
    if (!gen_parse(argc, argv, &o, "chat", chat_usage)) return CLI_EXIT_USAGE;
    if (o.prompt && o.prompt_file) {
        cli_error("chat: give the first message with -p or -f, not both");
        return CLI_EXIT_USAGE;
    }
    chat c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    int rc = CLI_EXIT_ERROR;
    reader in = {.len = 0};
    if (!setup(&c)) {
        if (c.ld.usage_error) rc = CLI_EXIT_USAGE;
        goto out;
    }
    cli_catch_interrupt();
    const bool interactive = isatty(0) || !o.prompt;
    fprintf(stderr, "terrace: chat template %s, context %d tokens%s\n",
            tr_chat_template_name(c.tmpl), c.n_ctx,
            interactive ? "; /help for commands, Ctrl-D or /exit to quit" : "");
    const char *pending = o.prompt;
    rc = 0;
    for (;;) {
        char *line = NULL;
        if (pending) {
            if (!(line = strdup(pending))) {
                rc = CLI_EXIT_ERROR;
                break;
            }
            pending = NULL;
            if (interactive) fprintf(stderr, "> %s\n", line);
        } else {
            if (!interactive) break;
            const int st = read_message(&in, true, &line);
            if (st == IN_EOF) {
                fputc('\n', stderr);
                break;
            }
            if (st == IN_INTERRUPT) {
                fputc('\n', stderr);
                rc = CLI_EXIT_INTERRUPT;
                break;
            }
            if (st == IN_NOMEM) {
                cli_error("out of memory reading input");
                rc = CLI_EXIT_ERROR;
                break;
            }
        }
        const cmd_result cr = command(&c, line);
        if (cr == CMD_EXIT) {
            free(line);
            break;
        }
        const char *text = line[0] == '/' && line[1] == '/' ? line + 1 : line;
        if (cr == CMD_DONE || !*text) {
            free(line);
            continue;
        }
        const bool added = convo_add(&c.cv, "user", text);
        free(line);
        if (!added || !answer(&c)) {
            if (!added) cli_error("out of memory");
            rc = CLI_EXIT_ERROR;
            break;
        }
    }
    if (!telem_close(&c.tm) || !close_outputs(&c.ld)) rc = CLI_EXIT_ERROR;
    if (c.total.stopped_by) gen_summary(&c.total, &c.ld, c.s);
out:
    telem_close(&c.tm);
    free(c.file_text);
    convo_free(&c.cv);
    tr_reasoning_free(c.rs);
    tr_chat_template_free(c.tmpl);
    free(c.held);
    free(c.logits);
    tr_sampler_free(c.smp);
    tr_session_free(c.s);
    if (c.ld.model) unload_model(&c.ld);
    return rc;
}
