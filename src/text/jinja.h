/*
 * A Jinja template engine for chat templates, written to render a GGUF's
 * `tokenizer.chat_template` byte for byte as Python's jinja2 renders it in Hugging Face's
 * apply_chat_template environment: ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True) with the loopcontrols extension, the globals raise_exception and
 * strftime_now, and HF's tojson (json.dumps with ensure_ascii=False and its indent / separators /
 * sort_keys arguments).
 *
 * Errors carry jinja2's message (a raise_exception text, "'dict object' has no attribute 'x'",
 * Python's TypeError text ...) followed by the Python exception class and the template line:
 *   "System role not supported (TemplateError, template line 1)"
 * A construct the engine does not implement is an error naming it ("unsupported: ..."), never a
 * different output.
 *
 * Parsed templates are immutable: one may be rendered from several threads at once.
 */
#ifndef TR_TEXT_JINJA_H
#define TR_TEXT_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "terrace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_jinja tr_jinja;

/* TR_E_FORMAT for a template jinja2 rejects too (TemplateSyntaxError / TemplateAssertionError),
 * TR_E_UNSUPPORTED for one it accepts but this engine cannot run, TR_E_NOMEM. The text must be
 * valid UTF-8. */
tr_status tr_jinja_parse(const char *src, size_t len, tr_jinja **out, tr_error *err);
void tr_jinja_free(tr_jinja *t);

/* A template variable: a JSON value (parsed with Python's json.loads semantics), a string, a
 * bool, or None. */
typedef enum tr_jinja_var_kind {
    TR_JINJA_JSON = 0,
    TR_JINJA_STRING,
    TR_JINJA_BOOL,
    TR_JINJA_NONE,
    TR_JINJA_JSON_VARS, /* a JSON object whose members become variables (name unused) */
} tr_jinja_var_kind;

typedef struct tr_jinja_var {
    const char *name;
    tr_jinja_var_kind kind;
    const char *text; /* JSON text or the string (NUL-terminated) */
    bool b;
} tr_jinja_var;

typedef struct tr_jinja_opts {
    bool has_now;       /* strftime_now formats `now` instead of the current local time */
    struct tm now;
    uint64_t max_steps; /* 0: default (50M evaluation steps) */
    size_t max_bytes;   /* 0: default (256 MiB of working memory) */
} tr_jinja_opts;

/*
 * Renders with the given variables (later entries override earlier ones with the same name).
 * *out is malloc'd and NUL-terminated (free()), *out_len its length. Template errors are
 * TR_E_FORMAT (jinja2 raises too: raise_exception, undefined values used, type errors ...),
 * TR_E_UNSUPPORTED, TR_E_ARG (a variable's JSON is malformed), TR_E_NOMEM.
 */
tr_status tr_jinja_render(const tr_jinja *t, const tr_jinja_var *vars, size_t n_vars,
                          const tr_jinja_opts *opts, char **out, size_t *out_len, tr_error *err);

#ifdef __cplusplus
}
#endif
#endif
