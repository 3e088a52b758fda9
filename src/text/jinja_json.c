/*
 * JSON for the template engine, as Python's json module does it: json.loads keeps ints and
 * floats apart, the key order, and the last value of a duplicate key (at the first key's place);
 * json.dumps is Hugging Face's tojson (ensure_ascii, indent, separators, sort_keys).
 *
 * cJSON is not used: it keeps numbers as doubles, and Python prints 1 and 1.0 differently, so
 * int and float must stay apart from the input to the output.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

/* ---- json.loads ------------------------------------------------------------------------------- */

typedef struct jparse_json {
    jz *z;
    const char *s;
    size_t n, i;
    const char *what;
    int depth;
} jpj;

static _Noreturn void json_fail(jpj *p, const char *why) {
    p->z->line = 0;
    p->z->status = TR_E_ARG;
    snprintf(p->z->kind, sizeof p->z->kind, "JSONDecodeError");
    snprintf(p->z->msg, sizeof p->z->msg, "%s: %s at byte %zu", p->what, why, p->i);
    p->z->err_line = 0;
    longjmp(p->z->jb, 1);
}

static void json_ws(jpj *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static bool json_lit(jpj *p, const char *lit) {
    const size_t n = strlen(lit);
    if (p->n - p->i >= n && !memcmp(p->s + p->i, lit, n)) {
        p->i += n;
        return true;
    }
    return false;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static uint32_t json_u4(jpj *p) {
    if (p->n - p->i < 4) json_fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        const int h = hexval(p->s[p->i + k]);
        if (h < 0) json_fail(p, "invalid \\uXXXX escape");
        v = v * 16 + (uint32_t)h;
    }
    p->i += 4;
    return v;
}

static jv json_string(jpj *p) {
    jz *z = p->z;
    p->i++; /* the opening quote */
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    for (;;) {
        if (p->i >= p->n) json_fail(p, "unterminated string");
        const unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) json_fail(p, "invalid control character in a string");
        if (c != '\\') {
            size_t j = p->i + 1;
            while (j < p->n && p->s[j] != '"' && p->s[j] != '\\' && (unsigned char)p->s[j] >= 0x20) j++;
            jb_put(z, &b, p->s + p->i, j - p->i);
            p->i = j;
            continue;
        }
        if (++p->i >= p->n) json_fail(p, "unterminated string");
        const char e = p->s[p->i++];
        switch (e) {
        case '"': jb_putc(z, &b, '"'); break;
        case '\\': jb_putc(z, &b, '\\'); break;
        case '/': jb_putc(z, &b, '/'); break;
        case 'b': jb_putc(z, &b, '\b'); break;
        case 'f': jb_putc(z, &b, '\f'); break;
        case 'n': jb_putc(z, &b, '\n'); break;
        case 'r': jb_putc(z, &b, '\r'); break;
        case 't': jb_putc(z, &b, '\t'); break;
        case 'u': {
            uint32_t u = json_u4(p);
            if (u >= 0xd800 && u <= 0xdbff && p->n - p->i >= 6 && p->s[p->i] == '\\' &&
                p->s[p->i + 1] == 'u') {
                const size_t save = p->i;
                p->i += 2;
                const uint32_t lo = json_u4(p);
                if (lo >= 0xdc00 && lo <= 0xdfff) u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                else p->i = save;
            }
            if (u >= 0xd800 && u <= 0xdfff)
                json_fail(p, "a lone surrogate \\u escape (not representable in UTF-8)");
            jb_put_cp(z, &b, u);
            break;
        }
        default: json_fail(p, "invalid \\escape");
        }
    }
    if (!ju_valid(b.p, b.len)) json_fail(p, "invalid UTF-8 in a string");
    return jv_str(z, b.p, b.len);
}

static jv json_number(jpj *p) {
    const size_t start = p->i;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') json_fail(p, "invalid value");
    if (p->s[p->i] == '0') p->i++;
    else
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    bool is_float = false;
    if (p->i + 1 < p->n && p->s[p->i] == '.' && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9') {
        is_float = true;
        p->i++;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        size_t j = p->i + 1;
        if (j < p->n && (p->s[j] == '+' || p->s[j] == '-')) j++;
        if (j < p->n && p->s[j] >= '0' && p->s[j] <= '9') {
            is_float = true;
            while (j < p->n && p->s[j] >= '0' && p->s[j] <= '9') j++;
            p->i = j;
        }
    }
    char tmp[512];
    const size_t len = p->i - start;
    if (len >= sizeof tmp) json_fail(p, "number too long");
    memcpy(tmp, p->s + start, len);
    tmp[len] = '\0';
    if (is_float) return jv_float(strtod(tmp, NULL));
    char *end;
    errno = 0;
    const long long v = strtoll(tmp, &end, 10);
    if (errno) {
        p->z->line = 0;
        jz_unsupported(p->z, "%s: the integer %s does not fit 64 bits", p->what, tmp);
    }
    return jv_int(v);
}

static jv json_value(jpj *p) {
    json_ws(p);
    if (p->i >= p->n) json_fail(p, "expected a value");
    const char c = p->s[p->i];
    if (c == '"') return json_string(p);
    if (c == '{' || c == '[') {
        if (++p->depth > 512) json_fail(p, "nested too deeply");
        p->i++;
        jv r;
        if (c == '[') {
            jlist *l = jl_new(p->z, 0);
            json_ws(p);
            if (p->i < p->n && p->s[p->i] == ']') p->i++;
            else
                for (;;) {
                    jl_push(p->z, l, json_value(p));
                    json_ws(p);
                    if (p->i < p->n && p->s[p->i] == ',') {
                        p->i++;
                        continue;
                    }
                    if (p->i < p->n && p->s[p->i] == ']') {
                        p->i++;
                        break;
                    }
                    json_fail(p, "expected ',' or ']'");
                }
            r = jv_of_list(l);
        } else {
            jdict *d = jd_new(p->z, 0);
            json_ws(p);
            if (p->i < p->n && p->s[p->i] == '}') p->i++;
            else
                for (;;) {
                    json_ws(p);
                    if (p->i >= p->n || p->s[p->i] != '"') json_fail(p, "expected a property name in double quotes");
                    const jv k = json_string(p);
                    json_ws(p);
                    if (p->i >= p->n || p->s[p->i] != ':') json_fail(p, "expected ':'");
                    p->i++;
                    jd_set(p->z, d, k, json_value(p));
                    json_ws(p);
                    if (p->i < p->n && p->s[p->i] == ',') {
                        p->i++;
                        continue;
                    }
                    if (p->i < p->n && p->s[p->i] == '}') {
                        p->i++;
                        break;
                    }
                    json_fail(p, "expected ',' or '}'");
                }
            r = jv_of_dict(d);
        }
        p->depth--;
        return r;
    }
    if (json_lit(p, "true")) return jv_bool(true);
    if (json_lit(p, "false")) return jv_bool(false);
    if (json_lit(p, "null")) return JV_NONE_V;
    if (json_lit(p, "NaN")) return jv_float(NAN);
    if (json_lit(p, "Infinity")) return jv_float(INFINITY);
    if (json_lit(p, "-Infinity")) return jv_float(-INFINITY);
    return json_number(p);
}

jv jv_from_json(jz *z, const char *text, size_t len, const char *what) {
    jpj p = {z, text, len, 0, what, 0};
    const jv v = json_value(&p);
    json_ws(&p);
    if (p.i != p.n) json_fail(&p, "extra data after the value");
    return v;
}

/* ---- json.dumps ------------------------------------------------------------------------------- */

static void json_str(jz *z, jbuf *b, const char *s, size_t len, bool ascii) {
    jb_putc(z, b, '"');
    size_t i = 0;
    while (i < len) {
        const size_t start = i;
        const uint32_t c = ju_next(s, len, &i);
        switch (c) {
        case '"': jb_puts(z, b, "\\\""); continue;
        case '\\': jb_puts(z, b, "\\\\"); continue;
        case '\n': jb_puts(z, b, "\\n"); continue;
        case '\r': jb_puts(z, b, "\\r"); continue;
        case '\t': jb_puts(z, b, "\\t"); continue;
        case '\b': jb_puts(z, b, "\\b"); continue;
        case '\f': jb_puts(z, b, "\\f"); continue;
        default: break;
        }
        if (c < 0x20 || (ascii && c > 0x7e)) {
            if (c > 0xffff) {
                const uint32_t v = c - 0x10000;
                jb_printf(z, b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            } else {
                jb_printf(z, b, "\\u%04x", c);
            }
        } else {
            jb_put(z, b, s + start, i - start);
        }
    }
    jb_putc(z, b, '"');
}

static void json_float(jz *z, jbuf *b, double f) {
    if (isnan(f)) jb_puts(z, b, "NaN");
    else if (isinf(f)) jb_puts(z, b, f < 0 ? "-Infinity" : "Infinity");
    else jv_write_float(b, z, f);
}

static void json_newline(jz *z, jbuf *b, const jjson_opts *o, int level) {
    jb_putc(z, b, '\n');
    for (int i = 0; i < level; i++) jb_put(z, b, o->indent->p, o->indent->len);
}

/* indices of d's items in key order (sorted() of the items: keys compared with <) */
static size_t *sorted_keys(jz *z, const jdict *d) {
    size_t *ix = jz_alloc(z, (d->n + 1) * sizeof *ix), *tmp = jz_alloc(z, (d->n + 1) * sizeof *tmp);
    for (size_t i = 0; i < d->n; i++) ix[i] = i;
    /* stable merge sort, comparing with < only, as Python's sort */
    for (size_t w = 1; w < d->n; w *= 2) {
        for (size_t lo = 0; lo < d->n; lo += 2 * w) {
            size_t mid = lo + w < d->n ? lo + w : d->n, hi = lo + 2 * w < d->n ? lo + 2 * w : d->n;
            size_t a = lo, c = mid, k = lo;
            while (a < mid && c < hi)
                tmp[k++] = jv_lt(z, d->keys[ix[c]], d->keys[ix[a]], "<") ? ix[c++] : ix[a++];
            while (a < mid) tmp[k++] = ix[a++];
            while (c < hi) tmp[k++] = ix[c++];
        }
        memcpy(ix, tmp, d->n * sizeof *ix);
    }
    return ix;
}

static void json_any(jz *z, jbuf *b, jv v, const jjson_opts *o, int level) {
    if (++z->depth > z->depth_limit)
        jz_fail(z, "RecursionError", "maximum recursion depth exceeded while encoding a JSON object");
    const char *item_sep = o->item_sep ? o->item_sep->p : o->has_indent ? "," : ", ";
    const size_t item_sep_len = o->item_sep ? o->item_sep->len : strlen(item_sep);
    const char *key_sep = o->key_sep ? o->key_sep->p : ": ";
    const size_t key_sep_len = o->key_sep ? o->key_sep->len : 2;
    switch ((jv_kind)v.k) {
    case JV_STR: json_str(z, b, v.s->p, v.s->len, o->ensure_ascii); break;
    case JV_NONE: jb_puts(z, b, "null"); break;
    case JV_BOOL: jb_puts(z, b, v.b ? "true" : "false"); break;
    case JV_INT: jb_printf(z, b, "%" PRId64, v.i); break;
    case JV_FLOAT: json_float(z, b, v.f); break;
    case JV_LIST:
    case JV_TUPLE:
        if (v.k == JV_LIST && v.l->view != JL_PLAIN)
            jz_fail(z, "TypeError", "Object of type %s is not JSON serializable", jv_type_name(v));
        if (v.l->n == 0) {
            jb_puts(z, b, "[]");
            break;
        }
        jb_putc(z, b, '[');
        if (o->has_indent) json_newline(z, b, o, level + 1);
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) {
                jb_put(z, b, item_sep, item_sep_len);
                if (o->has_indent) json_newline(z, b, o, level + 1);
            }
            json_any(z, b, v.l->v[i], o, level + 1);
        }
        if (o->has_indent) json_newline(z, b, o, level);
        jb_putc(z, b, ']');
        break;
    case JV_DICT: {
        const jdict *d = v.d;
        if (d->n == 0) {
            jb_puts(z, b, "{}");
            break;
        }
        const size_t *ix = o->sort_keys ? sorted_keys(z, d) : NULL;
        jb_putc(z, b, '{');
        if (o->has_indent) json_newline(z, b, o, level + 1);
        for (size_t n = 0; n < d->n; n++) {
            const size_t i = ix ? ix[n] : n;
            if (n) {
                jb_put(z, b, item_sep, item_sep_len);
                if (o->has_indent) json_newline(z, b, o, level + 1);
            }
            const jv k = d->keys[i];
            switch ((jv_kind)k.k) {
            case JV_STR: json_str(z, b, k.s->p, k.s->len, o->ensure_ascii); break;
            case JV_FLOAT: jb_putc(z, b, '"'); json_float(z, b, k.f); jb_putc(z, b, '"'); break;
            case JV_BOOL: jb_puts(z, b, k.b ? "\"true\"" : "\"false\""); break;
            case JV_NONE: jb_puts(z, b, "\"null\""); break;
            case JV_INT: jb_printf(z, b, "\"%" PRId64 "\"", k.i); break;
            default:
                jz_fail(z, "TypeError", "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
            }
            jb_put(z, b, key_sep, key_sep_len);
            json_any(z, b, d->vals[i], o, level + 1);
        }
        if (o->has_indent) json_newline(z, b, o, level);
        jb_putc(z, b, '}');
        break;
    }
    default: jz_fail(z, "TypeError", "Object of type %s is not JSON serializable", jv_type_name(v));
    }
    z->depth--;
}

void jv_write_json(jz *z, jbuf *b, jv v, const jjson_opts *o) { json_any(z, b, v, o, 0); }

