/*
 * The request and response shapes of terrace serve: OpenAI's chat/completions, completions and
 * models (as llama-server and Ollama's OpenAI layer answer them) and Ollama's own /api/chat,
 * /api/generate and /api/tags.
 *
 * Every field a request gives is checked for its type and range before anything runs; a value
 * that does not fit (a wrong type, a huge number, an unknown role, a prompt longer than the
 * context) is a 400 naming the field, and a feature this server does not have (images, tool
 * calls, logprobs, JSON modes, n > 1) is refused rather than silently ignored.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "serve.h"

static bool fail(api_error *e, int status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static bool fail(api_error *e, int status, const char *type, const char *code, const char *param,
                 const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}
#define BAD(e, param, ...) fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

static bool is_ollama(api_kind k) { return k == API_OLLAMA_CHAT || k == API_OLLAMA_GENERATE; }

void api_error_json(const api_error *e, sbuf *out) {
    cJSON *root = cJSON_CreateObject();
    if (!root) {
        out->oom = true;
        return;
    }
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->msg);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param) cJSON_AddStringToObject(err, "param", e->param);
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNullToObject(err, "code");
    char *txt = cJSON_PrintUnformatted(root);
    if (txt) sb_str(out, txt);
    else out->oom = true;
    free(txt);
    cJSON_Delete(root);
}

/* ---------------------------------------------------------------------------------------------- */
/* typed fields; JSON null counts as absent, as the OpenAI SDKs send it for unset options           */

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static bool opt_num(const cJSON *o, const char *k, double lo, double hi, double *out,
                    api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return BAD(e, k, "'%s' must be a number", k);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return BAD(e, k, "'%s' must be between %g and %g, got %g", k, lo, hi, v->valuedouble);
    *out = v->valuedouble;
    return true;
}

static bool opt_float(const cJSON *o, const char *k, double lo, double hi, float *out,
                      api_error *e) {
    double d = *out;
    if (!opt_num(o, k, lo, hi, &d, e)) return false;
    *out = (float)d;
    return true;
}

static bool opt_int(const cJSON *o, const char *k, double lo, double hi, int64_t *out,
                    bool *given, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return BAD(e, k, "'%s' must be an integer", k);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return BAD(e, k, "'%s' must be an integer between %.0f and %.0f, got %g", k, lo, hi,
                   v->valuedouble);
    *out = (int64_t)v->valuedouble;
    if (given) *given = true;
    return true;
}

static bool opt_bool(const cJSON *o, const char *k, bool *out, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return true;
    if (!cJSON_IsBool(v)) return BAD(e, k, "'%s' must be true or false", k);
    *out = cJSON_IsTrue(v);
    return true;
}

static bool opt_str(const cJSON *o, const char *k, const char **out, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return true;
    if (!cJSON_IsString(v)) return BAD(e, k, "'%s' must be a string", k);
    *out = v->valuestring;
    return true;
}

/* rejects a field this server cannot honour when it asks for something */
static bool unsupported(const cJSON *o, const char *k, const char *what, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return true;
    const bool asks = cJSON_IsTrue(v) || (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) ||
                      (cJSON_IsObject(v) && v->child) || cJSON_IsString(v) ||
                      (cJSON_IsNumber(v) && v->valuedouble != 0);
    if (asks) return BAD(e, k, "'%s': %s", k, what);
    return true;
}

/* JSON text with a \u0000 escape: cJSON would cut the string there, so it is refused instead */
static bool has_nul_escape(const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return true;
        i++; /* skip the escaped character (a second backslash included) */
    }
    return false;
}

/* ---------------------------------------------------------------------------------------------- */
/* sampling and limits, shared by every endpoint                                                   */

typedef struct opt_names {
    const char *max_tokens[3]; /* the spellings of the length limit */
    const char *stop, *seed;
} opt_names;

static bool parse_stop(server *s, const cJSON *o, const char *k, job *j, api_error *e) {
    const cJSON *v = field(o, k);
    if (!v) return true;
    const cJSON *one[1] = {v};
    int n = 1;
    if (cJSON_IsArray(v)) n = cJSON_GetArraySize(v);
    else if (!cJSON_IsString(v)) return BAD(e, k, "'%s' must be a string or an array of strings", k);
    if (j->n_stop + n > SERVE_MAX_STOP)
        return BAD(e, k, "'%s': at most %d stop strings", k, SERVE_MAX_STOP - j->n_stop);
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, i) : one[0];
        if (!cJSON_IsString(x)) return BAD(e, k, "'%s' must be a string or an array of strings", k);
        if (!*x->valuestring) return BAD(e, k, "'%s': empty stop string", k);
        if (!(j->stop[j->n_stop++] = strdup(x->valuestring)))
            return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    (void)s;
    return true;
}

/* the sampling options of `o` (the request, or Ollama's "options") over the server's defaults */
static bool parse_sampling(server *s, const cJSON *o, const opt_names *nm, job *j, bool *max_given,
                           api_error *e) {
    tr_sampler_params *sp = &j->sampling;
    if (!opt_float(o, "temperature", 0, 1e4, &sp->temp, e)) return false;
    double top_p = sp->top_p;
    if (!opt_num(o, "top_p", 0, 1, &top_p, e)) return false;
    /* top_p 0 keeps only the most likely token (as in llama.cpp); the sampler wants (0, 1] */
    if (top_p == 0) sp->top_k = 1;
    else sp->top_p = (float)top_p;
    int64_t v = sp->top_k;
    if (!opt_int(o, "top_k", -1, 1e9, &v, NULL, e)) return false;
    if (top_p != 0) sp->top_k = (int32_t)v;
    if (!opt_float(o, "min_p", 0, 1, &sp->min_p, e)) return false;
    if (!opt_float(o, "presence_penalty", -2, 2, &sp->presence_penalty, e)) return false;
    if (!opt_float(o, "frequency_penalty", -2, 2, &sp->frequency_penalty, e)) return false;
    if (!opt_float(o, "repeat_penalty", 1e-3, 100, &sp->repeat_penalty, e)) return false;
    v = sp->repeat_last_n;
    if (!opt_int(o, "repeat_last_n", -1, 1 << 24, &v, NULL, e)) return false;
    sp->repeat_last_n = (int32_t)v;
    /* integers beyond 2^53 are not exact in JSON's doubles, so larger seeds are refused */
    int64_t seed = 0;
    bool seed_given = false;
    if (!opt_int(o, nm->seed, -1, 9007199254740992.0, &seed, &seed_given, e)) return false;
    if (seed_given) sp->seed = seed < 0 ? TR_SAMPLER_SEED_RANDOM : (uint64_t)seed;
    for (int i = 0; i < 3 && nm->max_tokens[i]; i++) {
        int64_t mt = j->max_tokens;
        bool g = false;
        if (!opt_int(o, nm->max_tokens[i], -1, 2147483647.0, &mt, &g, e)) return false;
        if (g) {
            j->max_tokens = (int32_t)mt;
            *max_given = true;
        }
    }
    if (!parse_stop(s, o, nm->stop, j, e)) return false;
    if (!opt_bool(o, "ignore_eos", &j->ignore_eos, e)) return false;
    if (!opt_bool(o, "cache_prompt", &j->cache_prompt, e)) return false;
    tr_error err = {0};
    tr_sampler_params check = *sp;
    if (check.repeat_last_n < 0) check.repeat_last_n = s->n_ctx;
    if (tr_sampler_validate(&check, &err)) return BAD(e, NULL, "%s", err.msg);
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* prompts                                                                                         */

/* the text of a message's content: a string, or OpenAI's array of parts (text parts only) */
static bool content_text(const cJSON *c, sbuf *out, api_error *e) {
    if (!c) return true; /* an assistant turn with tool calls only */
    if (cJSON_IsString(c)) {
        sb_str(out, c->valuestring);
        return true;
    }
    if (!cJSON_IsArray(c))
        return BAD(e, "messages", "a message's 'content' must be a string or an array of parts");
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const char *type = NULL, *text = NULL;
        if (!cJSON_IsObject(part)) return BAD(e, "messages", "a content part must be an object");
        if (!opt_str(part, "type", &type, e)) return false;
        if (!type || strcmp(type, "text"))
            return BAD(e, "messages", "content parts of type '%s' are not supported (this "
                       "server runs text models)", type ? type : "(none)");
        if (!opt_str(part, "text", &text, e)) return false;
        if (!text) return BAD(e, "messages", "a text part needs 'text'");
        sb_str(out, text);
    }
    return true;
}

/* the validated conversation, as the OpenAI-style JSON array the template engine takes */
typedef struct msg_list {
    cJSON *arr;
    size_t n;
} msg_list;

static void msgs_free(msg_list *l) {
    cJSON_Delete(l->arr);
    l->arr = NULL;
}

static cJSON *msgs_add(msg_list *l, const char *role, const char *content, const char *reasoning) {
    if (!l->arr && !(l->arr = cJSON_CreateArray())) return NULL;
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddItemToArray(l->arr, m);
    if (!cJSON_AddStringToObject(m, "role", role) ||
        !cJSON_AddStringToObject(m, "content", content) ||
        (reasoning && !cJSON_AddStringToObject(m, "reasoning_content", reasoning)) ||
        (reasoning && !cJSON_AddStringToObject(m, "thinking", reasoning)))
        return NULL;
    l->n++;
    return m;
}

/* an assistant turn's tool_calls for the template, as Hugging Face's templates read them: each
 * {"id", "type", "function": {"name", "arguments"}} with the arguments an object (OpenAI sends
 * them as a JSON string; a string that is not JSON stays a string) */
static bool copy_tool_calls(const cJSON *calls, cJSON *m, size_t i, api_error *e) {
    if (!cJSON_IsArray(calls))
        return BAD(e, "messages", "message %zu: 'tool_calls' must be an array", i);
    cJSON *dst = cJSON_AddArrayToObject(m, "tool_calls");
    if (!dst) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = field(c, "function");
        const cJSON *name = f ? field(f, "name") : NULL;
        if (!cJSON_IsObject(c) || !cJSON_IsObject(f) || !cJSON_IsString(name))
            return BAD(e, "messages", "message %zu: a tool call needs 'function' with a 'name'", i);
        cJSON *d = cJSON_Duplicate(c, true);
        if (!d) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
        cJSON_AddItemToArray(dst, d);
        cJSON *df = cJSON_GetObjectItemCaseSensitive(d, "function");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(df, "arguments");
        cJSON *obj = cJSON_IsString(a) ? cJSON_Parse(a->valuestring) : NULL;
        if (obj) cJSON_ReplaceItemInObjectCaseSensitive(df, "arguments", obj);
    }
    return true;
}

static char *msgs_json(const msg_list *l) {
    return l->arr ? cJSON_PrintUnformatted(l->arr) : strdup("[]");
}

/* messages -> (role, content[, reasoning_content]) in l; roles and types are checked. An
 * assistant turn's reasoning (OpenAI-style reasoning_content, Ollama's thinking) goes to the
 * template under both names (Qwen3's templates read reasoning_content, gpt-oss's thinking), and
 * the template decides whether to show it. */
static bool parse_messages(const cJSON *msgs, bool ollama, msg_list *l, api_error *e) {
    if (!msgs) return BAD(e, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return BAD(e, "messages", "'messages' must be an array");
    if (cJSON_GetArraySize(msgs) == 0) return BAD(e, "messages", "'messages' must not be empty");
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!cJSON_IsObject(m)) return BAD(e, "messages", "every message must be an object");
        const char *role = NULL, *reasoning = NULL;
        if (!opt_str(m, "role", &role, e)) return false;
        if (!role) return BAD(e, "messages", "message %zu has no 'role'", l->n);
        const char *known = NULL;
        for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++)
            if (!strcmp(role, roles[r])) known = roles[r];
        if (!known)
            return BAD(e, "messages", "message %zu: unknown role '%.64s' (system, developer, user, "
                       "assistant or tool)", l->n, role);
        if (ollama && field(m, "images"))
            return BAD(e, "messages", "images are not supported (this server runs text models)");
        const cJSON *c = field(m, "content");
        if (cJSON_IsNull(c)) c = NULL; /* an assistant turn of tool calls: content null */
        if (!c && strcmp(known, "assistant"))
            return BAD(e, "messages", "message %zu (%s) has no 'content'", l->n, known);
        if (!opt_str(m, ollama ? "thinking" : "reasoning_content", &reasoning, e)) return false;
        sbuf text = {0};
        if (!content_text(c, &text, e)) {
            sb_free(&text);
            return false;
        }
        sb_add(&text, "", 0);
        cJSON *added = text.oom ? NULL
                                : msgs_add(l, strcmp(known, "developer") ? known : "system",
                                           text.p ? text.p : "", reasoning);
        sb_free(&text);
        if (!added) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
        /* tool calls and tool results, as the templates that support tools read them */
        const cJSON *calls = field(m, "tool_calls");
        if (calls && !cJSON_IsNull(calls) && !copy_tool_calls(calls, added, l->n - 1, e))
            return false;
        static const char *const extra[] = {"tool_call_id", "name"};
        for (size_t k = 0; k < 2; k++) {
            const char *v = NULL;
            if (!opt_str(m, extra[k], &v, e)) return false;
            if (v && !cJSON_AddStringToObject(added, extra[k], v))
                return fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    return true;
}

static bool tokenize_text(server *s, const char *text, bool add_bos, job *j, api_error *e) {
    tr_error err = {0};
    size_t n = 0;
    j->prompt = tokenize_into(s->ld.tok, text, strlen(text), add_bos, true, &n, &err);
    if (!j->prompt) return fail(e, 500, "server_error", NULL, NULL, "tokenizing: %s", err.msg);
    j->n_prompt = (int32_t)n;
    return true;
}

static bool tokenize_prompt(server *s, const char *text, job *j, api_error *e) {
    return tokenize_text(s, text, true, j, e);
}

/* the chat template: the model's own (Jinja, rendered as Hugging Face does), --chat-template's,
 * or the built-in format of its family; one object shared by every request thread (rendering
 * reads it only) */
bool api_template_init(server *s, char *why, size_t cap) {
    tr_error err = {0};
    if (tr_chat_template_load(s->ld.model, s->cfg.gen.chat_template, &s->tmpl, &err)) {
        snprintf(why, cap, "%s", err.msg);
        s->tmpl = NULL;
        return false;
    }
    return true;
}

const char *api_template_name(const server *s) {
    return s->tmpl ? tr_chat_template_name(s->tmpl) : "none";
}

void api_template_free(server *s) {
    tr_chat_template_free(s->tmpl);
    s->tmpl = NULL;
}

/* the conversation through the template; a template that writes bos_token itself gets no second
 * one from the tokenizer (as in `terrace chat`), and the reply is split into reasoning and answer
 * where the template's family separates them */
static bool chat_prompt(server *s, const msg_list *l, const char *context_json, api_req *r,
                        api_error *e) {
    job *j = r->j;
    if (!s->tmpl)
        return BAD(e, "messages", "the model has no chat template; start the server with "
                   "--chat-template NAME|FILE.jinja or use the completions endpoint");
    char *mjson = msgs_json(l);
    if (!mjson) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    char *text = NULL;
    tr_error err = {0};
    const tr_status st = tr_chat_template_apply(s->tmpl, NULL, 0, mjson, context_json, true, NULL,
                                                &text, &err);
    free(mjson);
    if (st == TR_E_NOMEM) return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (st) return BAD(e, "messages", "the chat template: %s", err.msg);
    const char *bos = tr_token_text(s->ld.tok, tr_token_bos(s->ld.tok), NULL);
    const bool has_bos = bos && *bos && !strncmp(text, bos, strlen(bos));
    bool ok = tokenize_text(s, text, !has_bos, j, e);
    if (ok && !s->cfg.gen.reasoning_none &&
        tr_reasoning_create(s->tmpl, text, TR_REASONING_AUTO, &r->rs, &err)) {
        ok = fail(e, 500, "server_error", NULL, NULL, "reasoning: %s", err.msg);
    }
    tr_free(text);
    /* the template's end-of-turn strings end the answer, as in `terrace chat` */
    for (const char *const *sp = tr_chat_template_stop_strings(s->tmpl); ok && sp && *sp; sp++)
        if (j->n_stop < SERVE_MAX_STOP && !(j->stop[j->n_stop++] = strdup(*sp)))
            return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return ok;
}

/* a completions prompt: a string, an array holding one string, or an array of token ids */
static bool completion_prompt(server *s, const cJSON *p, api_req *r, api_error *e) {
    job *j = r->j;
    if (!p) return BAD(e, "prompt", "'prompt' is required");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) {
        if (r->echo && !(r->echo_text = strdup(p->valuestring)))
            return fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return tokenize_prompt(s, p->valuestring, j, e);
    }
    if (!cJSON_IsArray(p))
        return BAD(e, "prompt", "'prompt' must be a string or an array of token ids");
    const int n = cJSON_GetArraySize(p);
    if (n == 0) return BAD(e, "prompt", "'prompt' is empty");
    if (!(j->prompt = malloc(sizeof(int32_t) * (size_t)n)))
        return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *x;
    cJSON_ArrayForEach(x, p) {
        if (cJSON_IsString(x))
            return BAD(e, "prompt", "several prompts in one request are not supported (n = 1)");
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= s->n_vocab)
            return BAD(e, "prompt", "token ids must be integers in 0..%d", s->n_vocab - 1);
        j->prompt[j->n_prompt++] = (int32_t)x->valuedouble;
    }
    if (r->echo) {
        /* the ids' text, as the answer's prefix */
        sbuf t = {0};
        char piece[512];
        for (int32_t i = 0; i < j->n_prompt; i++)
            sb_add(&t, piece, (size_t)piece_of(s->ld.tok, j->prompt[i], piece, sizeof piece));
        sb_add(&t, "", 0);
        r->echo_text = cli_utf8_sanitize(t.p ? t.p : "", t.len);
        sb_free(&t);
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------- */

/* the model a request names: our id, the file's name with or without .gguf, Ollama's :latest */
static bool model_matches(const server *s, const char *name) {
    char buf[300];
    snprintf(buf, sizeof buf, "%s", name);
    const size_t n = strlen(buf);
    if (n > 7 && !strcmp(buf + n - 7, ":latest")) buf[n - 7] = '\0';
    char file_noext[256];
    snprintf(file_noext, sizeof file_noext, "%s", s->model_file);
    char *dot = strstr(file_noext, ".gguf");
    if (dot && !dot[5]) *dot = '\0';
    return !strcmp(buf, s->model_id) || !strcmp(buf, s->model_file) || !strcmp(buf, file_noext);
}

static void new_id(api_req *r, const char *prefix) {
    static const char hex[] = "0123456789abcdef";
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)r;
    char tail[25];
    for (int i = 0; i < 24; i++) {
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        tail[i] = hex[(x >> 40) & 15];
    }
    tail[24] = '\0';
    snprintf(r->id, sizeof r->id, "%s%s", prefix, tail);
    r->created = (long)time(NULL);
}

/* the request's tools ([{"type": "function", "function": {"name", "description", "parameters"}}],
 * OpenAI's and Ollama's shape) become the template's `tools` variable, and the reply's tool calls
 * are parsed (serve_tools.c); tool_choice "auto" (the default) or "none" (no tools) */
static bool parse_tools(const cJSON *root, api_req *r, cJSON **ctx, api_error *e) {
    const cJSON *tools = field(root, "tools"), *choice = field(root, "tool_choice");
    if (!tools || cJSON_IsNull(tools)) return true;
    if (!cJSON_IsArray(tools)) return BAD(e, "tools", "'tools' must be an array");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_IsObject(t) ? field(t, "type") : NULL;
        const cJSON *f = cJSON_IsObject(t) ? field(t, "function") : NULL;
        const cJSON *name = cJSON_IsObject(f) ? field(f, "name") : NULL;
        if (!cJSON_IsString(name) || !*name->valuestring ||
            (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function"))))
            return BAD(e, "tools", "every tool must be {\"type\": \"function\", \"function\": "
                       "{\"name\": ..., \"parameters\": ...}}");
    }
    if (choice && !cJSON_IsNull(choice)) {
        if (!cJSON_IsString(choice))
            return BAD(e, "tool_choice", "tool_choice naming a function is not supported (the "
                       "model's output is not constrained): use \"auto\" or \"none\"");
        if (!strcmp(choice->valuestring, "none")) return true;
        if (strcmp(choice->valuestring, "auto"))
            return BAD(e, "tool_choice", "tool_choice '%.32s' is not supported (the model's output "
                       "is not constrained): use \"auto\" or \"none\"", choice->valuestring);
    }
    const cJSON *par = field(root, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par) && !cJSON_IsNull(par))
        return BAD(e, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    if (cJSON_GetArraySize(tools) == 0) return true;
    if ((!*ctx && !(*ctx = cJSON_CreateObject())) || !(r->tools = cJSON_Duplicate(tools, true)) ||
        !cJSON_AddItemToObject(*ctx, "tools", cJSON_Duplicate(tools, true)))
        return fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return true;
}

bool api_parse(server *s, api_kind kind, const char *body, size_t len, api_req *r, api_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    if (has_nul_escape(body, len)) return BAD(e, NULL, "NUL characters (\\u0000) are not supported");
    /* cJSON records a parse error's position in a static of its own: one parse at a time */
    static pthread_mutex_t parse_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&parse_mu);
    cJSON *root = cJSON_ParseWithLength(body, len);
    const char *at = root ? NULL : cJSON_GetErrorPtr();
    const long off = at && at >= body && at <= body + len ? (long)(at - body) : -1;
    pthread_mutex_unlock(&parse_mu);
    if (!root) {
        if (len == 0) return BAD(e, NULL, "the body is empty (a JSON object is expected)");
        return BAD(e, NULL, "the body is not valid JSON (at byte %ld of %zu)", off, len);
    }
    bool ok = false;
    msg_list msgs = {0};
    cJSON *ctx = NULL;     /* extra template variables */
    char *ctx_json = NULL;
    if (!cJSON_IsObject(root)) {
        BAD(e, NULL, "the body must be a JSON object");
        goto out;
    }
    if (!(r->j = job_new())) {
        fail(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    job *j = r->j;
    j->sampling = s->cfg.gen.sampling;
    j->ignore_eos = s->cfg.gen.ignore_eos;
    for (int i = 0; i < s->cfg.gen.n_stop; i++)
        if (!(j->stop[j->n_stop++] = strdup(s->cfg.gen.stop[i]))) {
            fail(e, 500, "server_error", NULL, NULL, "out of memory");
            goto out;
        }

    const char *model = NULL;
    if (!opt_str(root, "model", &model, e)) goto out;
    if (model && *model && !model_matches(s, model)) {
        fail(e, 404, "invalid_request_error", "model_not_found", "model",
             "the model '%.200s' does not exist; this server serves '%s' (GET /v1/models)", model,
             s->model_id);
        goto out;
    }
    r->stream = is_ollama(kind); /* Ollama streams unless told not to */
    if (!opt_bool(root, "stream", &r->stream, e)) goto out;

    bool max_given = false;
    if (is_ollama(kind)) {
        static const opt_names nm = {{"num_predict"}, "stop", "seed"};
        j->max_tokens = s->cfg.gen.n_predict;
        const cJSON *opts = field(root, "options");
        if (opts && !cJSON_IsObject(opts)) {
            BAD(e, "options", "'options' must be an object");
            goto out;
        }
        if (opts && !parse_sampling(s, opts, &nm, j, &max_given, e)) goto out;
        if (!unsupported(root, "format", "structured output is not supported", e) ||
            (kind != API_OLLAMA_CHAT &&
             !unsupported(root, "tools", "tools apply to /api/chat", e)) ||
            !unsupported(root, "images", "images are not supported (text models)", e) ||
            !unsupported(root, "suffix", "fill-in-the-middle is not supported", e))
            goto out;
        /* Ollama's think: the template's enable_thinking (Qwen3's switch) */
        const cJSON *think = field(root, "think");
        if (think && !cJSON_IsBool(think)) {
            BAD(e, "think", "'think' must be true or false");
            goto out;
        }
        if (think && !(ctx = cJSON_CreateObject(),
                       ctx && cJSON_AddBoolToObject(ctx, "enable_thinking", cJSON_IsTrue(think)))) {
            fail(e, 500, "server_error", NULL, NULL, "out of memory");
            goto out;
        }
        if (kind == API_OLLAMA_CHAT && !parse_tools(root, r, &ctx, e)) goto out;
        if (ctx && !(ctx_json = cJSON_PrintUnformatted(ctx))) {
            fail(e, 500, "server_error", NULL, NULL, "out of memory");
            goto out;
        }
        if (kind == API_OLLAMA_CHAT) {
            if (!parse_messages(field(root, "messages"), true, &msgs, e)) goto out;
            if (!chat_prompt(s, &msgs, ctx_json, r, e)) goto out;
        } else {
            const char *prompt = NULL, *system = NULL;
            bool raw = false;
            if (!opt_str(root, "prompt", &prompt, e) || !opt_str(root, "system", &system, e) ||
                !opt_bool(root, "raw", &raw, e))
                goto out;
            if (!prompt) {
                BAD(e, "prompt", "'prompt' is required");
                goto out;
            }
            if (raw) {
                if (!tokenize_prompt(s, prompt, j, e)) goto out;
            } else {
                if ((system && !msgs_add(&msgs, "system", system, NULL)) ||
                    !msgs_add(&msgs, "user", prompt, NULL)) {
                    fail(e, 500, "server_error", NULL, NULL, "out of memory");
                    goto out;
                }
                if (!chat_prompt(s, &msgs, ctx_json, r, e)) goto out;
            }
        }
    } else {
        static const opt_names nm = {{"max_tokens", "max_completion_tokens", "n_predict"}, "stop",
                                     "seed"};
        j->max_tokens = kind == API_COMPLETION && s->cfg.gen.n_predict < 0 ? 16
                                                                            : s->cfg.gen.n_predict;
        if (!parse_sampling(s, root, &nm, j, &max_given, e)) goto out;
        int64_t n = 1;
        if (!opt_int(root, "n", 1, 1, &n, NULL, e)) {
            BAD(e, "n", "'n' must be 1: one answer per request");
            goto out;
        }
        const cJSON *so = field(root, "stream_options");
        if (so && !cJSON_IsObject(so)) {
            BAD(e, "stream_options", "'stream_options' must be an object");
            goto out;
        }
        if (so && !opt_bool(so, "include_usage", &r->include_usage, e)) goto out;
        if (!unsupported(root, "logprobs", "log probabilities are not supported", e) ||
            !unsupported(root, "top_logprobs", "log probabilities are not supported", e) ||
            !unsupported(root, "logit_bias", "logit_bias is not supported", e) ||
            (kind != API_CHAT &&
             !unsupported(root, "tools", "tools apply to /v1/chat/completions", e)) ||
            !unsupported(root, "functions", "the legacy 'functions' are not supported: use "
                         "'tools'", e) ||
            !unsupported(root, "suffix", "fill-in-the-middle is not supported", e))
            goto out;
        const cJSON *rf = field(root, "response_format");
        if (rf) {
            const char *type = NULL;
            if (!cJSON_IsObject(rf) || !opt_str(rf, "type", &type, e)) {
                BAD(e, "response_format", "'response_format' must be an object with a 'type'");
                goto out;
            }
            if (type && strcmp(type, "text")) {
                BAD(e, "response_format", "response_format '%.32s' is not supported (text only)",
                    type);
                goto out;
            }
        }
        if (kind == API_CHAT) {
            /* llama-server's chat_template_kwargs (enable_thinking ...) and OpenAI's
             * reasoning_effort become template variables */
            const cJSON *kw = field(root, "chat_template_kwargs");
            const char *effort = NULL;
            if (kw && !cJSON_IsObject(kw)) {
                BAD(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
                goto out;
            }
            if (!opt_str(root, "reasoning_effort", &effort, e)) goto out;
            if (kw || effort) {
                if (!(ctx = kw ? cJSON_Duplicate(kw, true) : cJSON_CreateObject()) ||
                    (effort && !cJSON_GetObjectItemCaseSensitive(ctx, "reasoning_effort") &&
                     !cJSON_AddStringToObject(ctx, "reasoning_effort", effort))) {
                    fail(e, 500, "server_error", NULL, NULL, "out of memory");
                    goto out;
                }
            }
            if (!parse_tools(root, r, &ctx, e)) goto out;
            if (ctx && !(ctx_json = cJSON_PrintUnformatted(ctx))) {
                fail(e, 500, "server_error", NULL, NULL, "out of memory");
                goto out;
            }
            if (!parse_messages(field(root, "messages"), false, &msgs, e)) goto out;
            if (!chat_prompt(s, &msgs, ctx_json, r, e)) goto out;
            new_id(r, "chatcmpl-");
        } else {
            if (!opt_bool(root, "echo", &r->echo, e)) goto out;
            if (!completion_prompt(s, field(root, "prompt"), r, e)) goto out;
            new_id(r, "cmpl-");
        }
    }
    if (!r->id[0]) new_id(r, "");
    if (j->n_prompt == 0) {
        BAD(e, "prompt", "the prompt is empty");
        goto out;
    }
    if (j->n_prompt >= s->n_ctx) {
        fail(e, 400, "invalid_request_error", "context_length_exceeded", "messages",
             "the prompt is %d tokens, but a slot's context holds %d (it needs room for at least "
             "one generated token; the server's -c)", j->n_prompt, s->n_ctx);
        goto out;
    }
    if (max_given && j->max_tokens > 0 && (int64_t)j->n_prompt + j->max_tokens > s->n_ctx) {
        fail(e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
             "the prompt (%d tokens) and max_tokens (%d) exceed a slot's context of %d tokens",
             j->n_prompt, j->max_tokens, s->n_ctx);
        goto out;
    }
    ok = true;
out:
    msgs_free(&msgs);
    cJSON_Delete(ctx);
    free(ctx_json);
    cJSON_Delete(root);
    return ok;
}

void api_req_free(api_req *r) {
    free(r->echo_text);
    r->echo_text = NULL;
    tr_reasoning_free(r->rs);
    r->rs = NULL;
    cJSON_Delete(r->tools);
    r->tools = NULL;
    sb_free(&r->held);
}

/* ---------------------------------------------------------------------------------------------- */
/* answers                                                                                         */

static const char *finish_name(finish_reason f) {
    /* a shutdown cuts the answer, which is what "length" tells a client */
    return f == FINISH_STOP ? "stop" : "length";
}

static void add_usage(cJSON *o, const job_view *v) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", v->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", v->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", v->n_prompt + v->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", v->n_reused);
}

/* llama-server's "timings" */
static void add_timings(cJSON *o, const job_view *v) {
    cJSON *t = cJSON_AddObjectToObject(o, "timings");
    cJSON_AddNumberToObject(t, "cache_n", v->n_reused);
    cJSON_AddNumberToObject(t, "prompt_n", v->n_prompt - v->n_reused);
    cJSON_AddNumberToObject(t, "prompt_ms", v->prefill_ms);
    cJSON_AddNumberToObject(t, "predicted_n", v->n_gen);
    cJSON_AddNumberToObject(t, "predicted_ms", v->decode_ms);
    cJSON_AddNumberToObject(t, "predicted_per_second",
                            v->decode_ms > 0 && v->n_gen > 1 ? 1e3 * (v->n_gen - 1) / v->decode_ms
                                                             : 0);
    cJSON_AddNumberToObject(t, "ttft_ms", v->t_first > 0 ? v->t_first - v->t_submit : 0);
    /* terrace's own: the steps that prefilled the prompt and the tokens the other requests
     * generated in them */
    cJSON_AddNumberToObject(t, "prompt_steps", v->prefill_steps);
    cJSON_AddNumberToObject(t, "prompt_beside_tokens", v->beside_tokens);
}

static void iso_now(char *buf, size_t cap) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const size_t n = strftime(buf, cap, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, cap - n, ".%06dZ", (int)(ts.tv_nsec / 1000) % 1000000);
}

static cJSON *base_object(server *s, api_req *r, const char *object) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (is_ollama(r->kind)) {
        char when[48];
        iso_now(when, sizeof when);
        cJSON_AddStringToObject(o, "model", s->model_id);
        cJSON_AddStringToObject(o, "created_at", when);
        return o;
    }
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddStringToObject(o, "model", s->model_id);
    cJSON_AddStringToObject(o, "system_fingerprint", "terrace-" TR_VERSION_STRING);
    return o;
}

/* Ollama's closing figures (nanoseconds) */
static void ollama_done(cJSON *o, const job_view *v) {
    cJSON_AddBoolToObject(o, "done", true);
    cJSON_AddStringToObject(o, "done_reason", finish_name(v->finish));
    cJSON_AddNumberToObject(o, "total_duration", (v->t_end - v->t_submit) * 1e6);
    cJSON_AddNumberToObject(o, "load_duration", 0);
    cJSON_AddNumberToObject(o, "prompt_eval_count", v->n_prompt);
    cJSON_AddNumberToObject(o, "prompt_eval_duration", v->prefill_ms * 1e6);
    cJSON_AddNumberToObject(o, "eval_count", v->n_gen);
    cJSON_AddNumberToObject(o, "eval_duration", v->decode_ms * 1e6);
}

/* o = a response object with one choice, index 0, which is returned (NULL when out of memory:
 * cJSON's adders take a NULL object as a no-op) */
static cJSON *one_choice(server *s, api_req *r, const char *object, cJSON **o) {
    *o = base_object(s, r, object);
    cJSON *ch = cJSON_AddArrayToObject(*o, "choices"), *c = cJSON_CreateObject();
    if (!ch || !c || !cJSON_AddItemToArray(ch, c)) {
        cJSON_Delete(c);
        return NULL;
    }
    cJSON_AddNumberToObject(c, "index", 0);
    return c;
}

/* the end of a streamed chunk's choice: logprobs, finish_reason (NULL: null) and, when the
 * client asked for usage, "usage": null (only the last chunk carries the counts) */
static void chunk_tail(const api_req *r, cJSON *o, cJSON *c, const char *finish) {
    cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    if (r->include_usage) cJSON_AddNullToObject(o, "usage");
}

static void emit(cJSON *o, sbuf *out, const char *pre, const char *post) {
    char *txt = o ? cJSON_PrintUnformatted(o) : NULL;
    if (!txt) {
        out->oom = true;
        cJSON_Delete(o);
        return;
    }
    sb_str(out, pre);
    sb_str(out, txt);
    sb_str(out, post);
    free(txt);
    cJSON_Delete(o);
}

static void error_view(const job_view *v, api_error *e) {
    fail(e, 500, "server_error", NULL, NULL, "generation failed: %s", v->error);
}

/* a piece of a chat reply into its reasoning and answer (all answer without a splitter); `end`:
 * the reply is complete, so text held back as a possible marker is released. An error of the
 * splitter (out of memory) leaves the piece as answer. */
static void split_reply(api_req *r, const char *text, size_t n, bool end, sbuf *reasoning,
                        sbuf *answer) {
    if (!r->rs) {
        sb_add(answer, text, n);
        return;
    }
    tr_error err = {0};
    tr_reasoning_delta d;
    if (n) {
        if (tr_reasoning_feed(r->rs, text, n, &d, &err)) {
            sb_add(answer, text, n);
        } else {
            if (d.reasoning_len) sb_add(reasoning, d.reasoning, d.reasoning_len);
            if (d.answer_len) sb_add(answer, d.answer, d.answer_len);
        }
    }
    if (end && !tr_reasoning_finish(r->rs, &d, &err)) {
        if (d.reasoning_len) sb_add(reasoning, d.reasoning, d.reasoning_len);
        if (d.answer_len) sb_add(answer, d.answer, d.answer_len);
    }
}

/* "" for an empty buffer */
static const char *sb_cstr(const sbuf *b) { return b->p ? b->p : ""; }

/* the tail of the request's id, to derive its tool calls' ids from */
static const char *id_tail(const api_req *r) {
    const size_t n = strlen(r->id);
    return r->id + (n > 24 ? n - 24 : 0);
}

/* a chat message's answer: with the request's tools, the tool calls in it become `tool_calls`
 * (content: the text around them, null for none, as OpenAI answers); true if there were calls */
static bool answer_message(api_req *r, const char *answer, cJSON *m, bool ollama) {
    char *content = NULL;
    cJSON *calls = r->tools ? tools_parse(answer, r->tools, id_tail(r), ollama, &content) : NULL;
    if (!calls) {
        cJSON_AddStringToObject(m, "content", answer);
        return false;
    }
    if (content) cJSON_AddStringToObject(m, "content", content);
    else if (ollama) cJSON_AddStringToObject(m, "content", "");
    else cJSON_AddNullToObject(m, "content");
    free(content);
    cJSON_AddItemToObject(m, "tool_calls", calls);
    return true;
}

void api_response(server *s, api_req *r, const char *text, size_t n, const job_view *v,
                  sbuf *out) {
    if (v->finish == FINISH_ERROR || v->finish == FINISH_REFUSED) {
        api_error e;
        error_view(v, &e);
        api_error_json(&e, out);
        return;
    }
    sbuf all = {0};
    if (r->echo_text) sb_str(&all, r->echo_text);
    sb_add(&all, text, n);
    sb_add(&all, "", 0);
    const char *t = all.p ? all.p : "";
    cJSON *o = NULL;
    switch (r->kind) {
    case API_CHAT: {
        cJSON *c = one_choice(s, r, "chat.completion", &o);
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        sbuf rs = {0}, an = {0};
        split_reply(r, t, strlen(t), true, &rs, &an);
        const bool called = answer_message(r, sb_cstr(&an), m, false);
        if (rs.len) cJSON_AddStringToObject(m, "reasoning_content", sb_cstr(&rs));
        sb_free(&rs);
        sb_free(&an);
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", called ? "tool_calls" : finish_name(v->finish));
        add_usage(o, v);
        add_timings(o, v);
        break;
    }
    case API_COMPLETION: {
        cJSON *c = one_choice(s, r, "text_completion", &o);
        cJSON_AddStringToObject(c, "text", t);
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason", finish_name(v->finish));
        add_usage(o, v);
        add_timings(o, v);
        break;
    }
    case API_OLLAMA_CHAT: {
        o = base_object(s, r, NULL);
        cJSON *m = cJSON_AddObjectToObject(o, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        sbuf rs = {0}, an = {0};
        split_reply(r, t, strlen(t), true, &rs, &an);
        answer_message(r, sb_cstr(&an), m, true);
        if (rs.len) cJSON_AddStringToObject(m, "thinking", sb_cstr(&rs));
        sb_free(&rs);
        sb_free(&an);
        ollama_done(o, v);
        break;
    }
    case API_OLLAMA_GENERATE: {
        o = base_object(s, r, NULL);
        sbuf rs = {0}, an = {0};
        split_reply(r, t, strlen(t), true, &rs, &an);
        cJSON_AddStringToObject(o, "response", sb_cstr(&an));
        if (rs.len) cJSON_AddStringToObject(o, "thinking", sb_cstr(&rs));
        sb_free(&rs);
        sb_free(&an);
        ollama_done(o, v);
        break;
    }
    }
    sb_free(&all);
    emit(o, out, "", "");
}

/* streaming with tools: the answer piece in *an is held back where a tool call may start; at the
 * end the held text is parsed, *an becomes the content around the calls, and the calls are
 * returned (NULL: none, everything held is released as content) */
static cJSON *hold_tool_calls(api_req *r, sbuf *an, bool end, bool ollama) {
    if (!r->tools) return NULL;
    sb_add(&r->held, sb_cstr(an), an->len);
    an->len = 0;
    if (an->p) an->p[0] = '\0';
    if (!end) {
        const size_t from = tools_hold_from(sb_cstr(&r->held), r->held.len, r->emitted);
        if (from) {
            sb_add(an, r->held.p, from);
            memmove(r->held.p, r->held.p + from, r->held.len - from + 1);
            r->held.len -= from;
            r->emitted += from;
        }
        return NULL;
    }
    char *content = NULL;
    cJSON *calls = tools_parse(sb_cstr(&r->held), r->tools, id_tail(r), ollama, &content);
    if (calls) {
        if (content) sb_str(an, content);
    } else {
        sb_add(an, sb_cstr(&r->held), r->held.len);
    }
    free(content);
    r->held.len = 0;
    return calls;
}

void api_stream_chunk(server *s, api_req *r, const char *delta, size_t n, const job_view *end,
                      sbuf *out) {
    const bool openai = !is_ollama(r->kind);
    const char *pre = openai ? "data: " : "", *post = openai ? "\n\n" : "\n";
    if (end && (end->finish == FINISH_ERROR || end->finish == FINISH_REFUSED)) {
        api_error e;
        error_view(end, &e);
        sbuf t = {0};
        if (openai) {
            api_error_json(&e, &t);
        } else {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "error", e.msg);
            emit(o, &t, "", "");
        }
        sb_add(&t, "", 0);
        sb_str(out, pre);
        sb_str(out, t.p ? t.p : "{}");
        sb_str(out, post);
        sb_free(&t);
        if (openai) sb_str(out, "data: [DONE]\n\n");
        return;
    }
    char *piece = malloc(n + 1);
    if (!piece) {
        out->oom = true;
        return;
    }
    memcpy(piece, delta, n);
    piece[n] = '\0';
    /* completions with echo: the prompt comes first */
    if (r->echo_text && !r->role_sent) {
        char *both = malloc(strlen(r->echo_text) + n + 1);
        if (both) {
            strcpy(both, r->echo_text);
            strcat(both, piece);
        }
        free(piece);
        if (!(piece = both)) {
            out->oom = true;
            return;
        }
    }
    cJSON *o = NULL;
    switch (r->kind) {
    case API_CHAT: {
        sbuf rs = {0}, an = {0};
        split_reply(r, piece, strlen(piece), end != NULL, &rs, &an);
        cJSON *calls = hold_tool_calls(r, &an, end != NULL, false);
        if (!r->role_sent || rs.len || an.len) {
            cJSON *c = one_choice(s, r, "chat.completion.chunk", &o);
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (!r->role_sent) cJSON_AddStringToObject(d, "role", "assistant");
            /* as llama-server streams them: reasoning_content pieces, then content pieces */
            if (rs.len) cJSON_AddStringToObject(d, "reasoning_content", sb_cstr(&rs));
            if (an.len || !rs.len) cJSON_AddStringToObject(d, "content", sb_cstr(&an));
            chunk_tail(r, o, c, NULL);
            emit(o, out, pre, post);
        }
        sb_free(&rs);
        sb_free(&an);
        if (calls) { /* each call whole in one delta, with its index, as llama-server sends it */
            int i = 0;
            for (cJSON *call = calls->child; call; call = call->next)
                cJSON_AddNumberToObject(call, "index", i++);
            cJSON *c = one_choice(s, r, "chat.completion.chunk", &o);
            cJSON *d = cJSON_AddObjectToObject(c, "delta");
            if (!d || !cJSON_AddItemToObject(d, "tool_calls", calls)) cJSON_Delete(calls);
            chunk_tail(r, o, c, NULL);
            emit(o, out, pre, post);
        }
        if (end) {
            cJSON *c = one_choice(s, r, "chat.completion.chunk", &o);
            cJSON_AddObjectToObject(c, "delta");
            chunk_tail(r, o, c, calls ? "tool_calls" : finish_name(end->finish));
            add_timings(o, end);
            emit(o, out, pre, post);
        }
        break;
    }
    case API_COMPLETION: {
        if (n || r->echo_text) {
            cJSON *c = one_choice(s, r, "text_completion", &o);
            cJSON_AddStringToObject(c, "text", piece);
            chunk_tail(r, o, c, NULL);
            emit(o, out, pre, post);
        }
        if (end) {
            cJSON *c = one_choice(s, r, "text_completion", &o);
            cJSON_AddStringToObject(c, "text", "");
            chunk_tail(r, o, c, finish_name(end->finish));
            add_timings(o, end);
            emit(o, out, pre, post);
        }
        break;
    }
    case API_OLLAMA_CHAT:
    case API_OLLAMA_GENERATE: {
        sbuf rs = {0}, an = {0};
        split_reply(r, piece, strlen(piece), end != NULL, &rs, &an);
        cJSON *calls = hold_tool_calls(r, &an, end != NULL, true);
        if (rs.len || an.len || end) {
            o = base_object(s, r, NULL);
            cJSON *m = o;
            if (r->kind == API_OLLAMA_CHAT) {
                m = cJSON_AddObjectToObject(o, "message");
                cJSON_AddStringToObject(m, "role", "assistant");
            }
            cJSON_AddStringToObject(m, r->kind == API_OLLAMA_CHAT ? "content" : "response",
                                    sb_cstr(&an));
            if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
            calls = NULL;
            if (rs.len) cJSON_AddStringToObject(m, "thinking", sb_cstr(&rs));
            if (end) ollama_done(o, end);
            else cJSON_AddBoolToObject(o, "done", false);
            emit(o, out, pre, post);
        }
        sb_free(&rs);
        sb_free(&an);
        break;
    }
    }
    free(piece);
    r->role_sent = true;
    if (end && openai) {
        if (r->include_usage) {
            o = base_object(s, r, r->kind == API_CHAT ? "chat.completion.chunk" : "text_completion");
            cJSON_AddArrayToObject(o, "choices");
            add_usage(o, end);
            emit(o, out, pre, post);
        }
        sb_str(out, "data: [DONE]\n\n");
    }
}

const char *api_stream_content_type(api_kind kind) {
    return is_ollama(kind) ? "application/x-ndjson" : "text/event-stream";
}

void api_models(server *s, bool ollama, sbuf *out) {
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        out->oom = true;
        return;
    }
    const tr_gguf *g = tr_model_gguf(s->ld.model);
    uint64_t size = 0;
    for (uint32_t i = 0; i < tr_gguf_n_shards(g); i++) size += tr_gguf_shard_size(g, i);
    if (ollama) {
        cJSON *arr = cJSON_AddArrayToObject(o, "models");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, m);
        cJSON_AddStringToObject(m, "name", s->model_id);
        cJSON_AddStringToObject(m, "model", s->model_id);
        char when[48] = "";
        struct stat sb;
        if (!stat(tr_gguf_shard_path(g, 0), &sb)) {
            struct tm tm;
            gmtime_r(&sb.st_mtime, &tm);
            strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        }
        cJSON_AddStringToObject(m, "modified_at", when);
        cJSON_AddNumberToObject(m, "size", (double)size);
        cJSON_AddStringToObject(m, "digest", "");
        cJSON *d = cJSON_AddObjectToObject(m, "details");
        cJSON_AddStringToObject(d, "format", "gguf");
        cJSON_AddStringToObject(d, "family", tr_model_arch(s->ld.model));
        cJSON *fam = cJSON_AddArrayToObject(d, "families");
        cJSON_AddItemToArray(fam, cJSON_CreateString(tr_model_arch(s->ld.model)));
        /* Ollama's "135M" / "Q4_1" */
        const double np = (double)tr_model_n_params(s->ld.model);
        char ps[32];
        if (np >= 1e9) snprintf(ps, sizeof ps, "%.1fB", np / 1e9);
        else snprintf(ps, sizeof ps, "%.0fM", np / 1e6);
        cJSON_AddStringToObject(d, "parameter_size", ps);
        int64_t ft = -1;
        cJSON_AddStringToObject(d, "quantization_level",
                                tr_gguf_kv_int(g, "general.file_type", &ft) ? tr_file_type_name(ft)
                                                                            : "unknown");
    } else {
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *arr = cJSON_AddArrayToObject(o, "data");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, m);
        cJSON_AddStringToObject(m, "id", s->model_id);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)s->created);
        cJSON_AddStringToObject(m, "owned_by", "terrace");
        cJSON *meta = cJSON_AddObjectToObject(m, "meta");
        cJSON_AddStringToObject(meta, "arch", tr_model_arch(s->ld.model));
        cJSON_AddNumberToObject(meta, "n_ctx_train", tr_model_n_ctx_train(s->ld.model));
        cJSON_AddNumberToObject(meta, "n_ctx_slot", s->n_ctx);
        cJSON_AddNumberToObject(meta, "n_slots", s->n_slots);
        cJSON_AddNumberToObject(meta, "n_vocab", s->n_vocab);
        cJSON_AddNumberToObject(meta, "size", (double)size);
        cJSON_AddNumberToObject(meta, "n_params", (double)tr_model_n_params(s->ld.model));
        char desc[256];
        tr_model_desc(s->ld.model, desc, sizeof desc);
        cJSON_AddStringToObject(meta, "desc", desc);
    }
    emit(o, out, "", "");
}
