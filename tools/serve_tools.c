/*
 * Tool calls in a chat reply, as llama-server returns them: the reply's text is searched for the
 * call formats the chat templates teach their models, and each call becomes an OpenAI
 * `tool_calls` entry ({"id", "type": "function", "function": {"name", "arguments": "<JSON>"}}):
 *
 *   <tool_call>{"name": ..., "arguments": {...}}</tool_call>    Hermes, Qwen2.5, Qwen3, SmolLM3
 *   [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]        Mistral
 *   <|python_tag|>{"name": ..., "parameters": {...}}            Llama 3.1 (also without the tag)
 *   {"name": ..., "arguments"|"parameters": {...}}              a bare JSON call, only when the
 *                                                              name is one of the request's tools
 *
 * Text before the first call stays the message's content. A reply whose call does not parse is
 * returned as content, whole: the client sees what the model wrote, never a made-up call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"

static const char *const k_openers[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};
enum { N_OPENERS = sizeof k_openers / sizeof k_openers[0] };

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

static bool known_tool(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = f ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return true;
    }
    return false;
}

/* one call object -> an OpenAI tool_calls entry appended to out; false if it is not a call */
static bool add_call(const cJSON *o, const char *id_base, cJSON *out, bool ollama) {
    if (!cJSON_IsObject(o)) return false;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(o, "function"); /* {"function": {...}} */
    if (cJSON_IsObject(fn)) o = fn;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (!cJSON_IsString(name) || !*name->valuestring) return false;
    cJSON *call = cJSON_CreateObject(), *f = NULL;
    if (!call) return false;
    cJSON_AddItemToArray(out, call);
    if (!ollama) {
        char id[64];
        snprintf(id, sizeof id, "call_%.24s%d", id_base, cJSON_GetArraySize(out) - 1);
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
    }
    f = cJSON_AddObjectToObject(call, "function");
    if (!f) return false;
    cJSON_AddStringToObject(f, "name", name->valuestring);
    if (ollama) { /* Ollama: the arguments as an object */
        cJSON *a = cJSON_IsString(args) ? cJSON_Parse(args->valuestring)
                   : args                ? cJSON_Duplicate(args, true)
                                         : cJSON_CreateObject();
        if (!a) a = cJSON_CreateObject();
        cJSON_AddItemToObject(f, "arguments", a);
    } else { /* OpenAI: the arguments as a JSON string */
        char *a = cJSON_IsString(args) ? strdup(args->valuestring)
                  : args               ? cJSON_PrintUnformatted(args)
                                       : strdup("{}");
        if (!a) return false;
        cJSON_AddStringToObject(f, "arguments", a);
        free(a);
    }
    return true;
}

/* a JSON value at p (an object, or an array of objects) -> calls; *end past it */
static bool parse_calls_at(const char *p, const char **end, const char *id_base, cJSON *out,
                           bool ollama) {
    const char *stop = NULL;
    cJSON *v = cJSON_ParseWithOpts(p, &stop, false);
    if (!v) return false;
    bool ok = true;
    if (cJSON_IsArray(v)) {
        const cJSON *x;
        ok = cJSON_GetArraySize(v) > 0;
        cJSON_ArrayForEach(x, v) ok = ok && add_call(x, id_base, out, ollama);
    } else {
        ok = add_call(v, id_base, out, ollama);
    }
    cJSON_Delete(v);
    *end = stop;
    return ok;
}

static size_t hold_from(const char *text, size_t n, size_t emitted) {
    /* a complete opener: hold from it on */
    size_t first = n;
    for (int k = 0; k < N_OPENERS; k++) {
        const char *hit = memmem(text, n, k_openers[k], strlen(k_openers[k]));
        if (hit && (size_t)(hit - text) < first) first = (size_t)(hit - text);
    }
    /* a bare JSON call can only be the whole reply: hold while nothing but space came before */
    const char *p = text;
    while (p < text + n && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    if (emitted == 0 && (p == text + n || *p == '{' || *p == '[')) return 0;
    if (first < n) return first;
    /* the tail that could be the start of an opener */
    for (size_t i = n > 16 ? n - 16 : 0; i < n; i++)
        for (int k = 0; k < N_OPENERS; k++) {
            const size_t lk = strlen(k_openers[k]);
            if (n - i < lk && !memcmp(text + i, k_openers[k], n - i)) return i;
        }
    return n;
}

size_t tools_hold_from(const char *text, size_t n, size_t emitted) {
    const size_t from = hold_from(text, n, emitted);
    /* nothing sent yet: space before a call is not sent ahead of it (the parsed content drops it) */
    if (emitted == 0)
        for (size_t i = 0; i < from; i++)
            if (text[i] != ' ' && text[i] != '\n' && text[i] != '\r' && text[i] != '\t') return from;
    return emitted == 0 ? 0 : from;
}

cJSON *tools_parse(const char *text, const cJSON *tools, const char *id_base, bool ollama,
                   char **content) {
    *content = NULL;
    cJSON *out = cJSON_CreateArray();
    if (!out) return NULL;
    const char *start = NULL;
    int kind = -1;
    for (int k = 0; k < N_OPENERS; k++) {
        const char *hit = strstr(text, k_openers[k]);
        if (hit && (!start || hit < start)) {
            start = hit;
            kind = k;
        }
    }
    const char *p = skip_ws(text), *rest = NULL;
    bool ok = false;
    if (kind < 0 && (*p == '{' || *p == '[')) {
        /* a bare call: the whole reply, naming a tool of the request */
        start = text;
        ok = parse_calls_at(p, &rest, id_base, out, ollama) && !*skip_ws(rest);
        for (int i = 0; ok && i < cJSON_GetArraySize(out); i++) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(out, i), "function");
            ok = known_tool(tools, cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring);
        }
    } else if (kind >= 0) {
        p = start;
        ok = true;
        while (ok && !strncmp(p, k_openers[kind], strlen(k_openers[kind]))) {
            p = skip_ws(p + strlen(k_openers[kind]));
            ok = parse_calls_at(p, &rest, id_base, out, ollama);
            if (!ok) break;
            p = skip_ws(rest);
            if (kind == 0 && !strncmp(p, "</tool_call>", 12)) p = skip_ws(p + 12);
            if (kind == 2) /* Llama 3.1: several calls separated by ';' */
                while (*p == ';') {
                    p = skip_ws(p + 1);
                    if (!(ok = parse_calls_at(p, &rest, id_base, out, ollama))) break;
                    p = skip_ws(rest);
                }
        }
        rest = p;
    }
    if (!ok || cJSON_GetArraySize(out) == 0) {
        cJSON_Delete(out);
        return NULL;
    }
    /* the content: the text before the first call and any after the last */
    size_t head = (size_t)(start - text);
    while (head && (text[head - 1] == ' ' || text[head - 1] == '\n')) head--;
    const char *tail = skip_ws(rest ? rest : "");
    const size_t nt = strlen(tail);
    if (head || nt) {
        char *c = malloc(head + nt + 2);
        if (c) {
            memcpy(c, text, head);
            size_t w = head;
            if (head && nt) c[w++] = '\n';
            memcpy(c + w, tail, nt);
            c[w + nt] = '\0';
        }
        *content = c;
    }
    return out;
}
