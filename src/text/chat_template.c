/*
 * Chat templates behind the public API: the GGUF's own Jinja template rendered by the engine in
 * jinja*.c, or a built-in format (chat.c) by name.
 *
 * The variables a Jinja template sees are those Hugging Face's apply_chat_template passes:
 * messages, tools (None unless given), documents (None), add_generation_prompt, bos_token and
 * eos_token (the model's BOS/EOS texts), then the caller's context variables, which override
 * these. The messages go to the engine as JSON text, so a caller's OpenAI-style messages_json
 * (tool_calls, content parts, reasoning_content ...) arrives unchanged.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "text/chat.h"
#include "text/jinja.h"

struct tr_chat_template {
    char *name;
    char *source;       /* NULL for a built-in */
    bool builtin;
    tr_chat_style style;
    tr_jinja *jinja;
    char *bos, *eos;
    const char *const *stops;
};

void tr_free(void *p) { free(p); }

tr_status tr_reasoning_create(const tr_chat_template *t, const char *prompt, tr_reasoning_format fmt,
                              tr_reasoning **out, tr_error *err) {
    return tr_reasoning_create_for(t ? t->source : NULL, prompt, fmt, out, err);
}

/* ---- stop strings ----------------------------------------------------------------------------- */

static const char *const stop_none[] = {NULL};
static const char *const stop_harmony[] = {"<|return|>", "<|call|>", NULL};
static const char *const stop_deepseek3[] = {"<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", NULL};
static const char *const stop_phi3[] = {"<|end|>", "<|endoftext|>", NULL};

static const char *const *family_stops(const char *family) {
    tr_chat_style st;
    if (!family) return stop_none;
    if (tr_chat_style_from_name(family, &st)) return tr_chat_stop_strings(st);
    if (!strcmp(family, "gpt-oss")) return stop_harmony;
    if (!strcmp(family, "deepseek3")) return stop_deepseek3;
    if (!strcmp(family, "phi3")) return stop_phi3;
    return stop_none;
}

/* ---- construction ----------------------------------------------------------------------------- */


static tr_status make_jinja(const char *src, size_t len, const char *name, const char *bos,
                            const char *eos, tr_chat_template **out, tr_error *err) {
    tr_chat_template *t = calloc(1, sizeof *t);
    if (!t) return tr_fail(err, TR_E_NOMEM, "out of memory loading a chat template");
    t->source = malloc(len + 1);
    t->name = strdup(name);
    if (!t->source || !t->name || (bos && !(t->bos = strdup(bos))) || (eos && !(t->eos = strdup(eos)))) {
        tr_chat_template_free(t);
        return tr_fail(err, TR_E_NOMEM, "out of memory loading a chat template");
    }
    memcpy(t->source, src, len);
    t->source[len] = '\0';
    if (strlen(t->source) != len) {
        tr_chat_template_free(t);
        return tr_fail(err, TR_E_FORMAT, "chat template '%s' contains a NUL byte", name);
    }
    const tr_status st = tr_jinja_parse(t->source, len, &t->jinja, err);
    if (st) {
        tr_error_prefix(err, "chat template '%s': ", name);
        tr_chat_template_free(t);
        return st;
    }
    t->stops = family_stops(tr_chat_family(t->source));
    *out = t;
    return TR_OK;
}

static tr_status make_builtin(tr_chat_style style, tr_chat_template **out, tr_error *err) {
    tr_chat_template *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(tr_chat_style_name(style)))) {
        free(t);
        return tr_fail(err, TR_E_NOMEM, "out of memory loading a chat template");
    }
    t->builtin = true;
    t->style = style;
    t->stops = tr_chat_stop_strings(style);
    *out = t;
    return TR_OK;
}

tr_status tr_chat_template_from_string(const char *source, const char *bos_token,
                                       const char *eos_token, tr_chat_template **out,
                                       tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_chat_template_from_string: out is NULL");
    *out = NULL;
    if (!source) return tr_fail(err, TR_E_ARG, "tr_chat_template_from_string: no template text");
    return make_jinja(source, strlen(source), "jinja", bos_token, eos_token, out, err);
}

static char *gguf_string(const tr_gguf *g, const char *key) {
    tr_str s;
    if (!tr_gguf_kv_str(g, key, &s)) return NULL;
    char *p = malloc((size_t)s.len + 1);
    if (!p) return NULL;
    memcpy(p, s.ptr, (size_t)s.len);
    p[s.len] = '\0';
    return p;
}

/* the text of the token whose id is stored under key, or NULL */
static char *token_text(const tr_gguf *g, const char *key) {
    int64_t id;
    const int64_t toks = tr_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (!tr_gguf_kv_int(g, key, &id) || toks < 0 || tr_gguf_kv_type(g, toks) != TR_GGUF_ARRAY ||
        tr_gguf_arr_type(g, toks) != TR_GGUF_STRING || id < 0 || (uint64_t)id >= tr_gguf_arr_len(g, toks))
        return NULL;
    const tr_str s = tr_gguf_arr_str(g, toks, (uint64_t)id);
    char *p = malloc((size_t)s.len + 1);
    if (!p) return NULL;
    memcpy(p, s.ptr, (size_t)s.len);
    p[s.len] = '\0';
    return p;
}

static bool has_token(const tr_gguf *g, const char *text) {
    const int64_t toks = tr_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (toks < 0 || tr_gguf_kv_type(g, toks) != TR_GGUF_ARRAY || tr_gguf_arr_type(g, toks) != TR_GGUF_STRING)
        return false;
    const size_t n = strlen(text);
    for (uint64_t i = 0; i < tr_gguf_arr_len(g, toks); i++) {
        const tr_str s = tr_gguf_arr_str(g, toks, i);
        if (s.len == n && !memcmp(s.ptr, text, n)) return true;
    }
    return false;
}

/* a file without a template: the built-in format its special tokens belong to, if any */
static bool fallback_style(const tr_gguf *g, tr_chat_style *st) {
    tr_str arch = {0};
    tr_gguf_kv_str(g, "general.architecture", &arch);
    if (has_token(g, "<|im_start|>") && has_token(g, "<|im_end|>")) *st = TR_CHAT_CHATML;
    else if (has_token(g, "<|start_header_id|>") && has_token(g, "<|eot_id|>")) *st = TR_CHAT_LLAMA3;
    else if (has_token(g, "<start_of_turn>") || (arch.len == 6 && !memcmp(arch.ptr, "gemma3", 6))) *st = TR_CHAT_GEMMA;
    else return false;
    return true;
}

static tr_status read_text_file(const char *path, char **text, size_t *len, tr_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return tr_fail(err, TR_E_IO, "cannot open chat template %s: %s", path, strerror(errno));
    size_t cap = 1 << 14, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap || cap >= (64u << 20)) break;
        char *g = realloc(buf, cap * 2 + 1);
        if (!g) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = g;
        cap *= 2;
    }
    const bool bad = ferror(f);
    fclose(f);
    if (!buf) return tr_fail(err, TR_E_NOMEM, "out of memory reading %s", path);
    if (bad) {
        free(buf);
        return tr_fail(err, TR_E_IO, "cannot read chat template %s", path);
    }
    if (n == cap) {
        free(buf);
        return tr_fail(err, TR_E_ARG, "chat template %s is larger than 64 MiB", path);
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return TR_OK;
}

static bool looks_like_jinja(const char *s) { return strstr(s, "{{") || strstr(s, "{%"); }

static tr_status load_file(const char *name_or_path, const char *bos, const char *eos,
                           tr_chat_template **out, tr_error *err);

tr_status tr_chat_template_load_gguf(const tr_gguf *g, const char *name_or_path,
                                     tr_chat_template **out, tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_chat_template_load: out is NULL");
    *out = NULL;
    if (!g) return tr_fail(err, TR_E_ARG, "tr_chat_template_load: no model");
    char *bos = token_text(g, "tokenizer.ggml.bos_token_id");
    char *eos = token_text(g, "tokenizer.ggml.eos_token_id");
    tr_status st;
    tr_chat_style style;
    if (!name_or_path || !*name_or_path) {
        char *src = gguf_string(g, "tokenizer.chat_template");
        if (src) {
            const char *fam = tr_chat_family(src);
            char name[96];
            snprintf(name, sizeof name, "%s (the model's Jinja template)", fam ? fam : "jinja");
            st = make_jinja(src, strlen(src), name, bos, eos, out, err);
            free(src);
        } else if (fallback_style(g, &style)) {
            st = make_builtin(style, out, err);
        } else {
            st = tr_fail(err, TR_E_UNSUPPORTED,
                         "the model has no chat template (tokenizer.chat_template); choose one with "
                         "--chat-template NAME|FILE.jinja, NAME one of: %s", tr_chat_style_list());
        }
    } else {
        char key[256];
        snprintf(key, sizeof key, "tokenizer.chat_template.%s", name_or_path);
        char *named = strlen(name_or_path) < 200 ? gguf_string(g, key) : NULL;
        if (named) {
            st = make_jinja(named, strlen(named), name_or_path, bos, eos, out, err);
            free(named);
        } else if (tr_chat_style_from_name(name_or_path, &style)) {
            st = make_builtin(style, out, err);
        } else {
            st = load_file(name_or_path, bos, eos, out, err);
        }
    }
    free(bos);
    free(eos);
    return st;
}

tr_status tr_chat_template_load(const tr_model *m, const char *name_or_path, tr_chat_template **out,
                                tr_error *err) {
    if (!m) {
        if (out) *out = NULL;
        return tr_fail(err, TR_E_ARG, "tr_chat_template_load: no model");
    }
    return tr_chat_template_load_gguf(tr_model_gguf(m), name_or_path, out, err);
}

/* a built-in name, a .jinja file or inline Jinja text */
static tr_status load_file(const char *name_or_path, const char *bos, const char *eos,
                           tr_chat_template **out, tr_error *err) {
    tr_chat_style style;
    if (tr_chat_style_from_name(name_or_path, &style)) return make_builtin(style, out, err);
    FILE *probe = fopen(name_or_path, "rb");
    if (probe) {
        fclose(probe);
        char *text = NULL;
        size_t len = 0;
        const tr_status st = read_text_file(name_or_path, &text, &len, err);
        if (st) return st;
        const char *base = strrchr(name_or_path, '/');
        const tr_status s2 = make_jinja(text, len, base ? base + 1 : name_or_path, bos, eos, out, err);
        free(text);
        return s2;
    }
    if (looks_like_jinja(name_or_path))
        return make_jinja(name_or_path, strlen(name_or_path), "jinja", bos, eos, out, err);
    return tr_fail(err, TR_E_ARG,
                   "--chat-template '%.64s': not a built-in format (%s), a template the model "
                   "carries, nor a readable .jinja file (%s)",
                   name_or_path, tr_chat_style_list(), strerror(errno));
}

const char *tr_chat_template_name(const tr_chat_template *t) { return t ? t->name : NULL; }
const char *tr_chat_template_source(const tr_chat_template *t) { return t ? t->source : NULL; }
const char *const *tr_chat_template_stop_strings(const tr_chat_template *t) {
    return t && t->stops ? t->stops : stop_none;
}

void tr_chat_template_free(tr_chat_template *t) {
    if (!t) return;
    tr_jinja_free(t->jinja);
    free(t->name);
    free(t->source);
    free(t->bos);
    free(t->eos);
    free(t);
}

/* ---- applying --------------------------------------------------------------------------------- */

/* "2025-01-15T12:00:00" (or a space for the T, or only the date) */
static tr_status parse_now(const char *s, struct tm *tm, tr_error *err) {
    int y, mo, d, h = 0, mi = 0, sec = 0, n = 0;
    memset(tm, 0, sizeof *tm);
    if (sscanf(s, "%4d-%2d-%2d%n", &y, &mo, &d, &n) != 3) goto bad;
    if (s[n] == 'T' || s[n] == ' ') {
        int m2 = 0;
        if (sscanf(s + n + 1, "%2d:%2d:%2d%n", &h, &mi, &sec, &m2) != 3) goto bad;
        n += 1 + m2;
    }
    if (s[n] || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60 || y < 1) goto bad;
    tm->tm_year = y - 1900;
    tm->tm_mon = mo - 1;
    tm->tm_mday = d;
    tm->tm_hour = h;
    tm->tm_min = mi;
    tm->tm_sec = sec;
    struct tm copy = *tm;
    const time_t t = timegm(&copy); /* fills the weekday and day of the year */
    if (t == (time_t)-1 || copy.tm_mday != d) goto bad;
    tm->tm_wday = copy.tm_wday;
    tm->tm_yday = copy.tm_yday;
    return TR_OK;
bad:
    return tr_fail(err, TR_E_ARG, "the time '%.40s' is not YYYY-MM-DDTHH:MM:SS", s);
}

typedef struct jsb {
    char *p;
    size_t len, cap;
    bool oom;
} jsb;

static void jsb_put(jsb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void jsb_json_str(jsb *b, const char *s) {
    jsb_put(b, "\"", 1);
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            jsb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            jsb_put(b, esc, 6);
        } else {
            jsb_put(b, s, 1);
        }
    }
    jsb_put(b, "\"", 1);
}

static bool valid_utf8(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        int n;
        unsigned cp;
        if (*p >= 0xc2 && *p <= 0xdf) n = 1, cp = *p & 0x1f;
        else if (*p >= 0xe0 && *p <= 0xef) n = 2, cp = *p & 0x0f;
        else if (*p >= 0xf0 && *p <= 0xf4) n = 3, cp = *p & 0x07;
        else return false;
        for (int k = 1; k <= n; k++) {
            if ((p[k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[k] & 0x3f);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        p += n + 1;
    }
    return true;
}

static tr_status msgs_to_json(const tr_chat_message *msgs, size_t n, char **out, tr_error *err) {
    jsb b = {0};
    jsb_put(&b, "[", 1);
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            free(b.p);
            return tr_fail(err, TR_E_ARG, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
        }
        if (!valid_utf8(msgs[i].role) || !valid_utf8(msgs[i].content)) {
            free(b.p);
            return tr_fail(err, TR_E_ARG, "chat message %zu is not valid UTF-8", i);
        }
        if (i) jsb_put(&b, ",", 1);
        jsb_put(&b, "{\"role\":", 8);
        jsb_json_str(&b, msgs[i].role);
        jsb_put(&b, ",\"content\":", 11);
        jsb_json_str(&b, msgs[i].content);
        jsb_put(&b, "}", 1);
    }
    jsb_put(&b, "]", 1);
    if (b.oom) {
        free(b.p);
        return tr_fail(err, TR_E_NOMEM, "out of memory formatting %zu chat messages", n);
    }
    *out = b.p;
    return TR_OK;
}

/* a built-in format with JSON messages: their role and text content */
static tr_status builtin_json(const tr_chat_template *t, const char *messages_json, bool gen,
                              char **out, tr_error *err) {
    cJSON *root = cJSON_Parse(messages_json);
    if (!root || !cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return tr_fail(err, TR_E_ARG, "messages: a JSON array of {role, content} objects is needed");
    }
    const int n = cJSON_GetArraySize(root);
    tr_chat_message *m = calloc((size_t)n + 1, sizeof *m);
    char **owned = calloc((size_t)n + 1, sizeof *owned);
    tr_status st = m && owned ? TR_OK : tr_fail(err, TR_E_NOMEM, "out of memory");
    for (int i = 0; i < n && !st; i++) {
        const cJSON *msg = cJSON_GetArrayItem(root, i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!cJSON_IsString(role)) {
            st = tr_fail(err, TR_E_ARG, "messages[%d] has no role string", i);
            break;
        }
        m[i].role = role->valuestring;
        if (cJSON_IsString(content)) {
            m[i].content = content->valuestring;
        } else if (cJSON_IsArray(content)) {
            /* content parts: the text parts joined */
            jsb b = {0};
            jsb_put(&b, "", 0);
            const cJSON *part;
            cJSON_ArrayForEach(part, content) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
                if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
                    st = tr_fail(err, TR_E_UNSUPPORTED,
                                 "messages[%d]: the built-in format %s takes only text content parts", i, t->name);
                    break;
                }
                jsb_put(&b, text->valuestring, strlen(text->valuestring));
            }
            if (b.oom) st = tr_fail(err, TR_E_NOMEM, "out of memory");
            owned[i] = b.p;
            m[i].content = b.p ? b.p : "";
        } else if (cJSON_IsNull(content) || !content) {
            m[i].content = "";
        } else {
            st = tr_fail(err, TR_E_ARG, "messages[%d]: content must be a string or content parts", i);
        }
    }
    if (!st) st = tr_chat_format(t->style, (const tr_chat_msg *)m, (size_t)n, gen, out, err);
    for (int i = 0; i < n && owned; i++) free(owned[i]);
    free(owned);
    free(m);
    cJSON_Delete(root);
    return st;
}

tr_status tr_chat_template_apply(const tr_chat_template *t, const tr_chat_message *msgs, size_t n,
                                 const char *messages_json, const char *context_json,
                                 bool add_generation_prompt, const char *now_iso, char **out,
                                 tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_chat_template_apply: out is NULL");
    *out = NULL;
    if (!t) return tr_fail(err, TR_E_ARG, "tr_chat_template_apply: no template");
    if (!messages_json && n > 0 && !msgs) return tr_fail(err, TR_E_ARG, "tr_chat_template_apply: %zu messages at NULL", n);
    if (t->builtin) {
        if (messages_json) return builtin_json(t, messages_json, add_generation_prompt, out, err);
        for (size_t i = 0; i < n; i++)
            if (!msgs[i].role || !msgs[i].content)
                return tr_fail(err, TR_E_ARG, "chat message %zu has no %s", i, msgs[i].role ? "content" : "role");
        return tr_chat_format(t->style, (const tr_chat_msg *)msgs, n, add_generation_prompt, out, err);
    }
    tr_jinja_opts opts = {0};
    if (now_iso) {
        const tr_status st = parse_now(now_iso, &opts.now, err);
        if (st) return st;
        opts.has_now = true;
    }
    char *mjson = NULL;
    if (!messages_json) {
        const tr_status st = msgs_to_json(msgs, n, &mjson, err);
        if (st) return st;
    }
    tr_jinja_var vars[8];
    size_t nv = 0;
    vars[nv++] = (tr_jinja_var){.name = "messages", .kind = TR_JINJA_JSON, .text = messages_json ? messages_json : mjson};
    vars[nv++] = (tr_jinja_var){.name = "tools", .kind = TR_JINJA_NONE};
    vars[nv++] = (tr_jinja_var){.name = "documents", .kind = TR_JINJA_NONE};
    vars[nv++] = (tr_jinja_var){.name = "add_generation_prompt", .kind = TR_JINJA_BOOL, .b = add_generation_prompt};
    if (t->bos) vars[nv++] = (tr_jinja_var){.name = "bos_token", .kind = TR_JINJA_STRING, .text = t->bos};
    if (t->eos) vars[nv++] = (tr_jinja_var){.name = "eos_token", .kind = TR_JINJA_STRING, .text = t->eos};
    if (context_json) vars[nv++] = (tr_jinja_var){.name = "context", .kind = TR_JINJA_JSON_VARS, .text = context_json};
    size_t len;
    const tr_status st = tr_jinja_render(t->jinja, vars, nv, &opts, out, &len, err);
    free(mjson);
    return st;
}
