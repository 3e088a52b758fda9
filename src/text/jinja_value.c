/*
 * The template engine's arena, strings and values with Python's semantics: truthiness, ==, <,
 * str() and repr() (Python's quoting and escaping, float.__repr__'s shortest round trip).
 * JSON is in jinja_json.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

/* ---- arena ------------------------------------------------------------------------------------ */

struct jz_chunk {
    jz_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
};

enum { JZ_CHUNK = 64 * 1024 };

void jz_init(jz *z, size_t byte_limit) {
    memset(z, 0, sizeof *z);
    z->byte_limit = byte_limit;
    z->depth_limit = 200;
    z->step_limit = UINT64_MAX;
}

void jz_free(jz *z) {
    jz_chunk *c = z->chunks;
    while (c) {
        jz_chunk *next = c->next;
        free(c);
        c = next;
    }
    z->chunks = NULL;
}

_Noreturn void jz_oom(jz *z) {
    z->status = TR_E_NOMEM;
    snprintf(z->kind, sizeof z->kind, "MemoryError");
    snprintf(z->msg, sizeof z->msg, "the template needs more than %zu MiB of working memory",
             z->byte_limit >> 20);
    z->err_line = z->line;
    longjmp(z->jb, 1);
}

void *jz_alloc(jz *z, size_t n) {
    n = (n + 15) & ~(size_t)15;
    jz_chunk *c = z->chunks;
    if (!c || c->cap - c->used < n) {
        const size_t cap = n > JZ_CHUNK / 4 ? n : JZ_CHUNK;
        if (z->bytes + cap > z->byte_limit || cap > SIZE_MAX - sizeof *c) jz_oom(z);
        c = malloc(sizeof *c + cap);
        if (!c) jz_oom(z);
        z->bytes += cap;
        c->cap = cap;
        c->used = 0;
        if (cap == n && z->chunks) { /* a big block: keep the current chunk for small ones */
            c->next = z->chunks->next;
            z->chunks->next = c;
        } else {
            c->next = z->chunks;
            z->chunks = c;
        }
    }
    void *p = c->mem + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void *jz_grow(jz *z, void *p, size_t old, size_t n) {
    if (n <= old) return p;
    jz_chunk *c = z->chunks;
    const size_t o16 = (old + 15) & ~(size_t)15, n16 = (n + 15) & ~(size_t)15;
    /* the last block of the current chunk grows in place */
    if (p && c && (unsigned char *)p + o16 == c->mem + c->used && c->cap - c->used >= n16 - o16) {
        memset(c->mem + c->used, 0, n16 - o16);
        c->used += n16 - o16;
        return p;
    }
    void *q = jz_alloc(z, n);
    if (old) memcpy(q, p, old);
    return q;
}

char *jz_strndup(jz *z, const char *s, size_t n) {
    char *p = jz_alloc(z, n + 1);
    memcpy(p, s, n);
    return p;
}

static _Noreturn void fail_v(jz *z, tr_status st, const char *kind, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
static _Noreturn void fail_v(jz *z, tr_status st, const char *kind, const char *fmt, va_list ap) {
    z->status = st;
    snprintf(z->kind, sizeof z->kind, "%s", kind);
    vsnprintf(z->msg, sizeof z->msg, fmt, ap);
    z->err_line = z->line;
    longjmp(z->jb, 1);
}

_Noreturn void jz_fail(jz *z, const char *kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(z, TR_E_FORMAT, kind, fmt, ap);
}

_Noreturn void jz_fail_st(jz *z, tr_status st, const char *kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(z, st, kind, fmt, ap);
}

_Noreturn void jz_unsupported(jz *z, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(z, TR_E_UNSUPPORTED, "unsupported", fmt, ap);
}

/* ---- byte buffers ----------------------------------------------------------------------------- */

void jb_put(jz *z, jbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) jz_oom(z);
            cap *= 2;
        }
        b->p = jz_grow(z, b->p, b->cap, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}
void jb_puts(jz *z, jbuf *b, const char *s) { jb_put(z, b, s, strlen(s)); }
void jb_putc(jz *z, jbuf *b, char c) { jb_put(z, b, &c, 1); }

void jb_printf(jz *z, jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jb_put(z, b, tmp, (size_t)n);
        return;
    }
    char *big = jz_alloc(z, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    jb_put(z, b, big, (size_t)n);
}

void jb_put_cp(jz *z, jbuf *b, uint32_t c) {
    char u[4];
    size_t n;
    if (c < 0x80) u[0] = (char)c, n = 1;
    else if (c < 0x800) u[0] = (char)(0xc0 | (c >> 6)), u[1] = (char)(0x80 | (c & 0x3f)), n = 2;
    else if (c < 0x10000) {
        u[0] = (char)(0xe0 | (c >> 12));
        u[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        u[2] = (char)(0x80 | (c & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | (c >> 18));
        u[1] = (char)(0x80 | ((c >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((c >> 6) & 0x3f));
        u[3] = (char)(0x80 | (c & 0x3f));
        n = 4;
    }
    jb_put(z, b, u, n);
}

/* ---- strings ---------------------------------------------------------------------------------- */

/* with its terminating NUL: code reads p[0] of an empty string (GNU C initialises the flexible
 * array of a static object) */
jstr js_empty = {0, 0, {0}};

jstr *js_new(jz *z, const char *s, size_t len) {
    if (len == 0) return &js_empty;
    if (len > SIZE_MAX - sizeof(jstr) - 1) jz_oom(z);
    jstr *r = jz_alloc(z, sizeof(jstr) + len + 1);
    r->len = len;
    memcpy(r->p, s, len);
    r->ncp = ju_count(s, len);
    return r;
}
jstr *js_cstr(jz *z, const char *s) { return js_new(z, s, strlen(s)); }
jv jv_str(jz *z, const char *s, size_t len) { return jv_of_str(js_new(z, s, len)); }
jv jv_cstr(jz *z, const char *s) { return jv_of_str(js_cstr(z, s)); }
bool js_eq(const jstr *a, const jstr *b) {
    return a->len == b->len && (a->len == 0 || !memcmp(a->p, b->p, a->len));
}
bool js_eqc(const jstr *a, const char *s) {
    const size_t n = strlen(s);
    return a->len == n && (n == 0 || !memcmp(a->p, s, n));
}

size_t js_offset(const jstr *s, size_t ci) {
    if (s->ncp == s->len) return ci;
    size_t off = 0, k = 0;
    while (off < s->len && k < ci) {
        off++;
        while (off < s->len && ((unsigned char)s->p[off] & 0xc0) == 0x80) off++;
        k++;
    }
    return off;
}

/* ---- containers ------------------------------------------------------------------------------- */

jlist *jl_new(jz *z, size_t cap) {
    jlist *l = jz_alloc(z, sizeof *l);
    if (cap) {
        if (cap > SIZE_MAX / sizeof(jv)) jz_oom(z);
        l->v = jz_alloc(z, cap * sizeof(jv));
        l->cap = cap;
    }
    return l;
}

void jl_push(jz *z, jlist *l, jv v) {
    if (l->n == l->cap) {
        const size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof(jv)) jz_oom(z);
        l->v = jz_grow(z, l->v, l->cap * sizeof(jv), cap * sizeof(jv));
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

jv jv_tuple2(jz *z, jv a, jv b) {
    jlist *l = jl_new(z, 2);
    l->v[0] = a;
    l->v[1] = b;
    l->n = 2;
    return jv_of_tuple(l);
}

jdict *jd_new(jz *z, size_t cap) {
    jdict *d = jz_alloc(z, sizeof *d);
    if (cap) {
        if (cap > SIZE_MAX / sizeof(jv)) jz_oom(z);
        d->keys = jz_alloc(z, cap * sizeof(jv));
        d->vals = jz_alloc(z, cap * sizeof(jv));
        d->cap = cap;
    }
    return d;
}

static bool key_eq(jz *z, jv a, jv b) {
    if (a.k == JV_STR && b.k == JV_STR) return js_eq(a.s, b.s);
    if (a.k == JV_STR || b.k == JV_STR) return false;
    return jv_eq(z, a, b);
}

static size_t jd_find(jz *z, const jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(z, d->keys[i], key)) return i;
    return SIZE_MAX;
}

void jd_set(jz *z, jdict *d, jv key, jv val) {
    jv_check_hashable(z, key);
    const size_t i = jd_find(z, d, key);
    if (i != SIZE_MAX) {
        d->vals[i] = val;
        return;
    }
    if (d->n == d->cap) {
        const size_t cap = d->cap ? d->cap * 2 : 4;
        if (cap > SIZE_MAX / sizeof(jv)) jz_oom(z);
        d->keys = jz_grow(z, d->keys, d->cap * sizeof(jv), cap * sizeof(jv));
        d->vals = jz_grow(z, d->vals, d->cap * sizeof(jv), cap * sizeof(jv));
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
}

bool jd_get(jz *z, const jdict *d, jv key, jv *out) {
    jv_check_hashable(z, key);
    const size_t i = jd_find(z, d, key);
    if (i == SIZE_MAX) return false;
    if (out) *out = d->vals[i];
    return true;
}

bool jd_getc(const jdict *d, const char *key, jv *out) {
    for (size_t i = 0; i < d->n; i++) {
        if (d->keys[i].k == JV_STR && js_eqc(d->keys[i].s, key)) {
            if (out) *out = d->vals[i];
            return true;
        }
    }
    return false;
}

jundef *ju_undef(jz *z, const char *hint) {
    jundef *u = jz_alloc(z, sizeof *u);
    u->hint = hint;
    return u;
}

jv jv_undef_hint(jz *z, const char *hint) { return (jv){.k = JV_UNDEF, .u = ju_undef(z, hint)}; }

jv jv_undef_named(jz *z, const char *name) {
    jundef *u = ju_undef(z, NULL);
    u->name = jv_cstr(z, name);
    return (jv){.k = JV_UNDEF, .u = u};
}

jv jv_undef_attr(jz *z, jv obj, jv name) {
    jundef *u = ju_undef(z, NULL);
    u->has_obj = true;
    u->obj = obj;
    u->name = name;
    return (jv){.k = JV_UNDEF, .u = u};
}

/* ---- Python's type names ---------------------------------------------------------------------- */

const char *jv_type_name(jv v) {
    switch ((jv_kind)v.k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        switch (v.l->view) {
        case JL_KEYS: return "dict_keys";
        case JL_VALUES: return "dict_values";
        case JL_ITEMS: return "dict_items";
        case JL_RANGE: return "range";
        default: return "list";
        }
    case JV_TUPLE: return "tuple";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_GEN: return v.g ? jg_type_name(v.g) : "generator";
    case JV_FUNC: return "builtin_function_or_method";
    case JV_MACRO: return "Macro";
    case JV_LOOP: return "LoopContext";
    case JV_CYCLER: return "Cycler";
    case JV_JOINER: return "Joiner";
    }
    return "object";
}

const char *jv_type_repr(jz *z, jv v) {
    if (v.k == JV_NONE) return "None";
    const char *mod = NULL;
    switch ((jv_kind)v.k) {
    case JV_NS: case JV_CYCLER: case JV_JOINER: mod = "jinja2.utils"; break;
    case JV_MACRO: case JV_LOOP: case JV_UNDEF: mod = "jinja2.runtime"; break;
    default: break;
    }
    jbuf b = {0};
    if (mod) jb_printf(z, &b, "%s.%s object", mod, jv_type_name(v));
    else jb_printf(z, &b, "%s object", jv_type_name(v));
    return b.p;
}

/* ---- truth, equality, order ------------------------------------------------------------------- */

bool jv_truthy(jz *z, jv v) {
    (void)z;
    switch ((jv_kind)v.k) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s->len > 0;
    case JV_LIST: case JV_TUPLE: return v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    default: return true;
    }
}

static double num_f(jv v) { return v.k == JV_FLOAT ? v.f : v.k == JV_BOOL ? (double)v.b : (double)v.i; }
static int64_t num_i(jv v) { return v.k == JV_BOOL ? (int64_t)v.b : v.i; }

/* Python compares int and float exactly */
static int num_cmp(jv a, jv b) {
    if (a.k != JV_FLOAT && b.k != JV_FLOAT) {
        const int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y;
    }
    const double x = num_f(a), y = num_f(b);
    if (a.k != JV_FLOAT || b.k != JV_FLOAT) {
        /* one side an integer: compare as integers when the float is integral and in range */
        const double f = a.k == JV_FLOAT ? x : y;
        if (f == floor(f) && f >= -9.2e18 && f <= 9.2e18) {
            const int64_t fi = (int64_t)f, ii = a.k == JV_FLOAT ? num_i(b) : num_i(a);
            const int c = fi < ii ? -1 : fi > ii;
            return a.k == JV_FLOAT ? c : -c;
        }
    }
    return x < y ? -1 : x > y ? 1 : 0; /* NaN: neither */
}

bool jv_eq(jz *z, jv a, jv b) {
    if (a.k == JV_UNDEF || b.k == JV_UNDEF) return a.k == b.k;
    if (jv_is_num(a) && jv_is_num(b)) {
        if ((a.k == JV_FLOAT && isnan(a.f)) || (b.k == JV_FLOAT && isnan(b.f))) return false;
        return num_cmp(a, b) == 0;
    }
    if (a.k != b.k) return false;
    switch ((jv_kind)a.k) {
    case JV_NONE: return true;
    case JV_STR: return js_eq(a.s, b.s);
    case JV_LIST:
    case JV_TUPLE:
        if (a.l == b.l) return true;
        if (a.l->view != b.l->view || a.l->view == JL_VALUES || a.l->n != b.l->n) return false;
        if (a.l->view == JL_KEYS || a.l->view == JL_ITEMS) { /* set-like views */
            for (size_t i = 0; i < a.l->n; i++) {
                bool found = false;
                for (size_t j = 0; j < b.l->n && !found; j++) found = jv_eq(z, a.l->v[i], b.l->v[j]);
                if (!found) return false;
            }
            return true;
        }
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_eq(z, a.l->v[i], b.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.d == b.d) return true;
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv other;
            if (!jd_get(z, b.d, a.d->keys[i], &other) || !jv_eq(z, a.d->vals[i], other))
                return false;
        }
        return true;
    default: return a.p == b.p;
    }
}

_Noreturn void jv_fail_undefined(jz *z, jv v) {
    const jundef *u = v.u;
    if (u && u->security) jz_fail(z, "SecurityError", "%s", u->hint);
    if (u && u->hint) jz_fail(z, "UndefinedError", "%s", u->hint);
    jbuf b = {0};
    if (!u || !u->has_obj) {
        if (u && u->name.k == JV_STR) jv_write_repr(z, &b, u->name);
        else jb_puts(z, &b, "''");
        jz_fail(z, "UndefinedError", "%s is undefined", b.p);
    }
    if (u->name.k == JV_STR) {
        jbuf t = {0};
        const char *tr = jv_type_repr(z, u->obj);
        jv_write_str_repr(z, &t, tr, strlen(tr));
        jv_write_repr(z, &b, u->name);
        jz_fail(z, "UndefinedError", "%s has no attribute %s", t.p, b.p);
    }
    jv_write_repr(z, &b, u->name);
    jz_fail(z, "UndefinedError", "%s has no element %s", jv_type_repr(z, u->obj), b.p);
}

static _Noreturn void fail_order(jz *z, jv a, jv b, const char *op) {
    if (a.k == JV_UNDEF) jv_fail_undefined(z, a);
    if (b.k == JV_UNDEF) jv_fail_undefined(z, b);
    jz_fail(z, "TypeError", "'%s' not supported between instances of '%s' and '%s'", op,
            jv_type_name(a), jv_type_name(b));
}

/* three-way compare of orderable values; fails for other types */
static int order3(jz *z, jv a, jv b, const char *op) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if ((a.k == JV_FLOAT && isnan(a.f)) || (b.k == JV_FLOAT && isnan(b.f))) return 2;
        return num_cmp(a, b);
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        const size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        const int c = n ? memcmp(a.s->p, b.s->p, n) : 0;
        if (c) return c < 0 ? -1 : 1;
        return a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
    }
    if (a.k == JV_LIST && b.k == JV_LIST && (a.l->view == JL_KEYS || a.l->view == JL_ITEMS) &&
        (b.l->view == JL_KEYS || b.l->view == JL_ITEMS)) {
        /* set-like views order by inclusion: -1 a is a proper subset, 1 a proper superset,
         * 0 equal, 2 neither */
        size_t in_b = 0, in_a = 0;
        for (size_t i = 0; i < a.l->n; i++)
            for (size_t j = 0; j < b.l->n; j++)
                if (jv_eq(z, a.l->v[i], b.l->v[j])) {
                    in_b++;
                    break;
                }
        for (size_t j = 0; j < b.l->n; j++)
            for (size_t i = 0; i < a.l->n; i++)
                if (jv_eq(z, a.l->v[i], b.l->v[j])) {
                    in_a++;
                    break;
                }
        const bool sub = in_b == a.l->n, sup = in_a == b.l->n;
        return sub && sup ? 0 : sub ? -1 : sup ? 1 : 3;
    }
    if (a.k == b.k && jv_is_seq(a) && a.l->view == JL_PLAIN && b.l->view == JL_PLAIN) {
        size_t i = 0;
        while (i < a.l->n && i < b.l->n && jv_eq(z, a.l->v[i], b.l->v[i])) i++;
        if (i < a.l->n && i < b.l->n) return order3(z, a.l->v[i], b.l->v[i], op);
        return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
    }
    fail_order(z, a, b, op);
}

bool jv_lt(jz *z, jv a, jv b, const char *op) {
    const int c = order3(z, a, b, op);
    if (c == 2) return false; /* NaN */
    if (c == 3) return false; /* sets neither including the other */
    if (!strcmp(op, "<")) return c < 0;
    if (!strcmp(op, "<=")) return c <= 0;
    if (!strcmp(op, ">")) return c > 0;
    return c >= 0;
}

int jv_cmp(jz *z, jv a, jv b, const char *op) {
    if (jv_lt(z, a, b, op)) return -1;
    return jv_lt(z, b, a, op) ? 1 : 0;
}

void jv_check_hashable(jz *z, jv v) {
    /* range and dict_values hash (the latter by identity); lists, dicts and the set-like
     * dict_keys / dict_items do not */
    if ((v.k == JV_LIST && v.l->view != JL_RANGE && v.l->view != JL_VALUES) || v.k == JV_DICT)
        jz_fail(z, "TypeError", "unhashable type: '%s'", jv_type_name(v));
    if (v.k == JV_TUPLE)
        for (size_t i = 0; i < v.l->n; i++) jv_check_hashable(z, v.l->v[i]);
}

/* ---- str() and repr() ------------------------------------------------------------------------- */

void jv_write_float(jbuf *b, jz *z, double f) {
    if (isnan(f)) {
        jb_puts(z, b, "nan");
        return;
    }
    if (isinf(f)) {
        jb_puts(z, b, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        jb_puts(z, b, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    /* shortest digits that read back as f, then Python's layout (repr: exponent when the decimal
     * point is more than 16 places right of the first digit or 4 left of it) */
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    const bool neg = e[0] == '-';
    const char *p = e + neg;
    char digits[24];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    const int exp10 = atoi(p + 1);
    const int decpt = exp10 + 1;
    if (neg) jb_putc(z, b, '-');
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            jb_puts(z, b, "0.");
            for (int i = 0; i < -decpt; i++) jb_putc(z, b, '0');
            jb_put(z, b, digits, nd);
        } else if ((size_t)decpt >= nd) {
            jb_put(z, b, digits, nd);
            for (size_t i = nd; i < (size_t)decpt; i++) jb_putc(z, b, '0');
            jb_puts(z, b, ".0");
        } else {
            jb_put(z, b, digits, (size_t)decpt);
            jb_putc(z, b, '.');
            jb_put(z, b, digits + decpt, nd - (size_t)decpt);
        }
    } else {
        jb_putc(z, b, digits[0]);
        if (nd > 1) {
            jb_putc(z, b, '.');
            jb_put(z, b, digits + 1, nd - 1);
        }
        jb_printf(z, b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

void jv_write_str_repr(jz *z, jbuf *b, const char *s, size_t len) {
    const bool sq = memchr(s, '\'', len) != NULL, dq = memchr(s, '"', len) != NULL;
    const char quote = sq && !dq ? '"' : '\'';
    jb_putc(z, b, quote);
    size_t i = 0;
    while (i < len) {
        const size_t start = i;
        const uint32_t c = ju_next(s, len, &i);
        if (c == (uint32_t)quote || c == '\\') {
            jb_putc(z, b, '\\');
            jb_putc(z, b, (char)c);
        } else if (c == '\t') jb_puts(z, b, "\\t");
        else if (c == '\n') jb_puts(z, b, "\\n");
        else if (c == '\r') jb_puts(z, b, "\\r");
        else if (c < 0x20 || c == 0x7f) jb_printf(z, b, "\\x%02x", c);
        else if (c < 0x7f || ju_isprintable(c)) jb_put(z, b, s + start, i - start);
        else if (c <= 0xff) jb_printf(z, b, "\\x%02x", c);
        else if (c <= 0xffff) jb_printf(z, b, "\\u%04x", c);
        else jb_printf(z, b, "\\U%08x", c);
    }
    jb_putc(z, b, quote);
}

static void write_seq(jz *z, jbuf *b, const jlist *l, const char *open, const char *close) {
    jb_puts(z, b, open);
    for (size_t i = 0; i < l->n; i++) {
        if (i) jb_puts(z, b, ", ");
        jv_write_repr(z, b, l->v[i]);
    }
    jb_puts(z, b, close);
}

static void write_dict(jz *z, jbuf *b, const jdict *d) {
    jb_putc(z, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jb_puts(z, b, ", ");
        jv_write_repr(z, b, d->keys[i]);
        jb_puts(z, b, ": ");
        jv_write_repr(z, b, d->vals[i]);
    }
    jb_putc(z, b, '}');
}

static void write_common(jz *z, jbuf *b, jv v, bool repr) {
    if (++z->depth > z->depth_limit)
        jz_fail(z, "RecursionError", "maximum recursion depth exceeded while getting the repr of an object");
    switch ((jv_kind)v.k) {
    case JV_UNDEF:
        if (repr) jb_puts(z, b, "Undefined");
        break;
    case JV_NONE: jb_puts(z, b, "None"); break;
    case JV_BOOL: jb_puts(z, b, v.b ? "True" : "False"); break;
    case JV_INT: jb_printf(z, b, "%" PRId64, v.i); break;
    case JV_FLOAT: jv_write_float(b, z, v.f); break;
    case JV_STR:
        if (repr) jv_write_str_repr(z, b, v.s->p, v.s->len);
        else jb_put(z, b, v.s->p, v.s->len);
        break;
    case JV_LIST:
        switch (v.l->view) {
        case JL_KEYS: write_seq(z, b, v.l, "dict_keys([", "])"); break;
        case JL_VALUES: write_seq(z, b, v.l, "dict_values([", "])"); break;
        case JL_ITEMS: write_seq(z, b, v.l, "dict_items([", "])"); break;
        case JL_RANGE:
            if (v.l->r_step == 1) jb_printf(z, b, "range(%" PRId64 ", %" PRId64 ")", v.l->r_start, v.l->r_stop);
            else jb_printf(z, b, "range(%" PRId64 ", %" PRId64 ", %" PRId64 ")", v.l->r_start, v.l->r_stop, v.l->r_step);
            break;
        default: write_seq(z, b, v.l, "[", "]"); break;
        }
        break;
    case JV_TUPLE: write_seq(z, b, v.l, "(", v.l->n == 1 ? ",)" : ")"); break;
    case JV_DICT: write_dict(z, b, v.d); break;
    case JV_NS:
        jb_puts(z, b, "<Namespace ");
        write_dict(z, b, v.d);
        jb_putc(z, b, '>');
        break;
    case JV_MACRO: jz_unsupported(z, "printing a macro object");
    case JV_LOOP: jz_unsupported(z, "printing the loop object");
    case JV_GEN: jz_unsupported(z, "printing a generator (Python prints its memory address); add |list");
    case JV_FUNC: jz_unsupported(z, "printing a function (Python prints its memory address)");
    case JV_CYCLER:
    case JV_JOINER: jz_unsupported(z, "printing a cycler or joiner object");
    }
    z->depth--;
}

void jv_write_str(jz *z, jbuf *b, jv v) { write_common(z, b, v, false); }
void jv_write_repr(jz *z, jbuf *b, jv v) { write_common(z, b, v, true); }

jstr *jv_to_str(jz *z, jv v) {
    if (v.k == JV_STR) return v.s;
    if (v.k == JV_UNDEF) return &js_empty;
    jbuf b = {0};
    jv_write_str(z, &b, v);
    return js_new(z, b.p ? b.p : "", b.len);
}

/* ---- iteration -------------------------------------------------------------------------------- */

jlist *jv_iter_list(jz *z, jv v) {
    switch ((jv_kind)v.k) {
    case JV_LIST:
    case JV_TUPLE: return v.l;
    case JV_UNDEF: return jl_new(z, 0);
    case JV_STR: {
        jlist *l = jl_new(z, v.s->ncp);
        size_t i = 0;
        while (i < v.s->len) {
            const size_t start = i;
            ju_next(v.s->p, v.s->len, &i);
            jl_push(z, l, jv_str(z, v.s->p + start, i - start));
        }
        return l;
    }
    case JV_DICT: {
        jlist *l = jl_new(z, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) jl_push(z, l, v.d->keys[i]);
        return l;
    }
    case JV_GEN: {
        jlist *l = jl_new(z, 0);
        jv x;
        while (jg_next(z, v.g, &x)) jl_push(z, l, x);
        return l;
    }
    case JV_LOOP: jz_unsupported(z, "iterating over the loop object");
    default: jz_fail(z, "TypeError", "'%s' object is not iterable", jv_type_name(v));
    }
}
