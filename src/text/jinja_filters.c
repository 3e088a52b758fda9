/*
 * jinja2's builtin filters with its semantics (filters.py) and Hugging Face's tojson in place of
 * jinja2's (json.dumps with ensure_ascii=False, indent, separators, sort_keys: no HTML
 * escaping). select, map, unique ... return the lazy generators of jinja_gen.c.
 *
 * Filters jinja2 has that only make sense with HTML escaping or randomness (escape, safe,
 * forceescape, urlize, random ...) fail as unsupported when a template runs them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

/* ---- ids -------------------------------------------------------------------------------------- */

enum {
    FL_ABS, FL_ATTR, FL_BATCH, FL_CAPITALIZE, FL_CENTER, FL_COUNT, FL_D, FL_DEFAULT, FL_DICTSORT,
    FL_E, FL_ESCAPE, FL_FILESIZEFORMAT, FL_FIRST, FL_FLOAT, FL_FORCEESCAPE, FL_FORMAT, FL_GROUPBY,
    FL_INDENT, FL_INT, FL_JOIN, FL_LAST, FL_LENGTH, FL_LIST, FL_LOWER, FL_ITEMS, FL_MAP, FL_MIN,
    FL_MAX, FL_PPRINT, FL_RANDOM, FL_REJECT, FL_REJECTATTR, FL_REPLACE, FL_REVERSE, FL_ROUND,
    FL_SAFE, FL_SELECT, FL_SELECTATTR, FL_SLICE, FL_SORT, FL_STRING, FL_STRIPTAGS, FL_SUM,
    FL_TITLE, FL_TRIM, FL_TRUNCATE, FL_UNIQUE, FL_UPPER, FL_URLENCODE, FL_URLIZE, FL_WORDCOUNT,
    FL_WORDWRAP, FL_XMLATTR, FL_TOJSON, FL_COUNT_
};

static const char *const k_filters[FL_COUNT_] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent",
    "int", "join", "last", "length", "list", "lower", "items", "map", "min", "max", "pprint",
    "random", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "trim", "truncate",
    "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", "tojson",
};

int jb_filter_id(const char *name) {
    for (int i = 0; i < FL_COUNT_; i++)
        if (!strcmp(name, k_filters[i])) return i;
    return -1;
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static const char *fname(int id) { return id >= 0 && id < FL_COUNT_ ? k_filters[id] : "?"; }

/* bind a filter's arguments after its value */
static void bind(jrender *r, const char *fn, const char *const *params, size_t np, size_t nreq,
                 const jlist *args, const jdict *kw, jv *out, bool *given) {
    jb_bind(r, fn, params, np, nreq, 1, args, kw, out, given);
}

static bool arg_true(jrender *r, const jv *a, const bool *g, size_t i) { return g[i] && jv_truthy(&r->z, a[i]); }

static int64_t arg_int(jrender *r, jv v, const char *what) {
    if (v.k == JV_INT) return v.i;
    if (v.k == JV_BOOL) return v.b;
    if (v.k == JV_UNDEF) jv_fail_undefined(&r->z, v);
    jz_fail(&r->z, "TypeError", "'%s' object cannot be interpreted as an integer%s", jv_type_name(v), what);
}

static int64_t py_len(jrender *r, jv v) {
    switch ((jv_kind)v.k) {
    case JV_STR: return (int64_t)v.s->ncp;
    case JV_LIST: case JV_TUPLE: return (int64_t)v.l->n;
    case JV_DICT: return (int64_t)v.d->n;
    case JV_UNDEF: return 0;
    case JV_LOOP:
        jr_loop_have(r, v.loop, SIZE_MAX - 1);
        return (int64_t)v.loop->items->n;
    default: jz_fail(&r->z, "TypeError", "object of type '%s' has no len()", jv_type_name(v));
    }
}

static void swap_range(jv *a, size_t lo, size_t hi) {
    for (; lo + 1 < hi; lo++, hi--) {
        const jv t = a[lo];
        a[lo] = a[hi - 1];
        a[hi - 1] = t;
    }
}

/* Python's list.sort for fewer than 64 items, comparison for comparison (count_run, then
 * binary insertion), so that an unorderable pair fails with the same message */
static void timsort_small(jrender *r, jv *items, jv *keys, size_t n) {
    jz *z = &r->z;
    if (n < 2) return;
    size_t run = 2;
    if (jv_lt(z, keys[1], keys[0], "<")) {
        while (run < n && jv_lt(z, keys[run], keys[run - 1], "<")) run++;
        swap_range(keys, 0, run);
        swap_range(items, 0, run);
    } else {
        while (run < n && !jv_lt(z, keys[run], keys[run - 1], "<")) run++;
    }
    for (size_t start = run; start < n; start++) {
        const jv pk = keys[start], pi = items[start];
        size_t l = 0, h = start;
        do {
            const size_t p = l + ((h - l) >> 1);
            if (jv_lt(z, pk, keys[p], "<")) h = p;
            else l = p + 1;
        } while (l < h);
        memmove(keys + l + 1, keys + l, (start - l) * sizeof(jv));
        memmove(items + l + 1, items + l, (start - l) * sizeof(jv));
        keys[l] = pk;
        items[l] = pi;
    }
}

/* a stable sort of keys (with their items) using < only, like Python's sort; reverse as Python
 * does it (reverse, sort, reverse), which keeps equal items in their order */
static void sort_by(jrender *r, jv *items, jv *keys, size_t n, bool reverse) {
    jz *z = &r->z;
    if (n < 64) {
        if (reverse) {
            swap_range(items, 0, n);
            swap_range(keys, 0, n);
        }
        timsort_small(r, items, keys, n);
        if (reverse) {
            swap_range(items, 0, n);
            swap_range(keys, 0, n);
        }
        return;
    }
    jv *ti = jz_alloc(z, (n + 1) * sizeof(jv)), *tk = jz_alloc(z, (n + 1) * sizeof(jv));
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            const size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                /* take from the right only when it must come first */
                const bool right = reverse ? jv_lt(z, keys[a], keys[b], "<") : jv_lt(z, keys[b], keys[a], "<");
                if (right) ti[k] = items[b], tk[k++] = keys[b++];
                else ti[k] = items[a], tk[k++] = keys[a++];
            }
            while (a < mid) ti[k] = items[a], tk[k++] = keys[a++];
            while (b < hi) ti[k] = items[b], tk[k++] = keys[b++];
        }
        memcpy(items, ti, n * sizeof(jv));
        memcpy(keys, tk, n * sizeof(jv));
    }
}

static jv to_list(jrender *r, jv v) {
    if (v.k == JV_LIST && v.l->view == JL_PLAIN) {
        jlist *l = jl_new(&r->z, v.l->n);
        if (v.l->n) memcpy(l->v, v.l->v, v.l->n * sizeof(jv));
        l->n = v.l->n;
        return jv_of_list(l);
    }
    const jlist *src = jv_iter_list(&r->z, v);
    jlist *l = jl_new(&r->z, src->n);
    if (src->n) memcpy(l->v, src->v, src->n * sizeof(jv));
    l->n = src->n;
    return jv_of_list(l);
}

/* Python's int(str, base): optional sign and whitespace, underscores between digits */
static bool parse_int_str(const jstr *s, int base, int64_t *out) {
    const char *p = s->p, *e = s->p + s->len;
    while (p < e && ju_isspace((unsigned char)*p)) p++;
    while (e > p && ju_isspace((unsigned char)e[-1])) e--;
    bool neg = false;
    if (p < e && (*p == '+' || *p == '-')) neg = *p++ == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (e - p >= 2 && p[0] == '0' && ((p[1] | 32) == 'x' || (p[1] | 32) == 'o' || (p[1] | 32) == 'b')) {
            const int b = (p[1] | 32) == 'x' ? 16 : (p[1] | 32) == 'o' ? 8 : 2;
            if (base && base != b) return false;
            base = b;
            p += 2;
            if (p < e && *p == '_') p++;
        } else if (base == 0) {
            base = 10;
        }
    }
    if (p >= e) return false;
    int64_t v = 0;
    bool last_us = true;
    for (; p < e; p++) {
        if (*p == '_') {
            if (last_us) return false;
            last_us = true;
            continue;
        }
        int d;
        if (*p >= '0' && *p <= '9') d = *p - '0';
        else if ((*p | 32) >= 'a' && (*p | 32) <= 'z') d = (*p | 32) - 'a' + 10;
        else return false;
        if (d >= base) return false;
        if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
        last_us = false;
    }
    if (last_us) return false;
    *out = neg ? -v : v;
    return true;
}

/* Python's float(str) */
static bool parse_float_str(const jstr *s, double *out) {
    const char *p = s->p, *e = s->p + s->len;
    while (p < e && ju_isspace((unsigned char)*p)) p++;
    while (e > p && ju_isspace((unsigned char)e[-1])) e--;
    if (p >= e || e - p > 400) return false;
    char tmp[512];
    size_t k = 0;
    for (const char *q = p; q < e; q++) {
        if (*q == '_') {
            if (q == p || q + 1 >= e || !(q[-1] >= '0' && q[-1] <= '9') || !(q[1] >= '0' && q[1] <= '9')) return false;
            continue;
        }
        tmp[k++] = *q;
    }
    tmp[k] = '\0';
    const char *t = tmp + (tmp[0] == '+' || tmp[0] == '-');
    if (!strcasecmp(t, "inf") || !strcasecmp(t, "infinity") || !strcasecmp(t, "nan")) {
        const double v = (t[0] | 32) == 'n' ? NAN : INFINITY;
        *out = tmp[0] == '-' ? -v : v;
        return true;
    }
    for (const char *q = t; *q; q++)
        if (!((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-')) return false;
    char *end;
    *out = strtod(tmp, &end);
    return end != tmp && *end == '\0';
}

static jv round_float(jrender *r, jv v, int64_t prec, const char *method) {
    jz *z = &r->z;
    if (!jv_is_num(v)) jz_fail(z, "TypeError", "type %s doesn't define __round__ method", jv_type_name(v));
    if (!strcmp(method, "common")) {
        if (v.k != JV_FLOAT) {
            if (prec >= 0) return jv_int(v.k == JV_BOOL ? v.b : v.i);
            jz_unsupported(z, "round() of an integer to negative digits");
        }
        if (!isfinite(v.f)) return v;
        if (prec < 0 || prec > 300) jz_unsupported(z, "round() to %lld digits", (long long)prec);
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, v.f);
        return jv_float(strtod(buf, NULL));
    }
    const double scale = pow(10.0, (double)prec);
    const double x = (v.k == JV_FLOAT ? v.f : (double)(v.k == JV_BOOL ? v.b : v.i)) * scale;
    const double y = !strcmp(method, "ceil") ? ceil(x) : floor(x);
    return jv_float(y / scale);
}

static jv select_gen(jrender *r, jv v, const jlist *args, jdict *kw, bool reject, bool by_attr) {
    jz *z = &r->z;
    jgen *g = jg_new(r, JG_SELECT, v);
    g->reject = reject;
    g->by_attr = by_attr;
    size_t off = 0;
    if (by_attr) {
        if (args->n < 1) jz_fail(z, "FilterArgumentError", "Missing parameter for attribute name");
        g->attr_parts = jb_attr_parts(r, args->v[0]);
        off = 1;
    }
    if (args->n > off) {
        const jv name = args->v[off];
        if (name.k != JV_STR) {
            /* jinja2 looks the name up in its tests: a non-string is never found */
            jbuf b = {0};
            jv_write_repr(z, &b, name);
            g->test_id = -1;
            g->test_name = b.p;
        } else {
            g->test_id = jb_test_id(name.s->p);
            g->test_name = name.s->p;
        }
        jlist *rest = jl_new(z, args->n - off - 1);
        for (size_t i = off + 1; i < args->n; i++) jl_push(z, rest, args->v[i]);
        g->args = rest;
        g->kw = kw;
    } else {
        g->truth_only = true;
    }
    return jv_of_gen(g);
}

static jv map_gen(jrender *r, jv v, const jlist *args, jdict *kw) {
    jz *z = &r->z;
    jgen *g = jg_new(r, JG_MAP, v);
    jv attr;
    if (args->n == 0 && jd_getc(kw, "attribute", &attr)) {
        g->map_attr = true;
        g->attr_parts = jb_attr_parts(r, attr);
        for (size_t i = 0; i < kw->n; i++) {
            const jstr *k = kw->keys[i].s;
            if (js_eqc(k, "attribute")) continue;
            if (js_eqc(k, "default")) {
                g->dflt = kw->vals[i];
                g->has_dflt = kw->vals[i].k != JV_NONE;
                continue;
            }
            jz_fail(z, "FilterArgumentError", "Unexpected keyword argument '%s'", k->p);
        }
        return jv_of_gen(g);
    }
    if (args->n == 0) jz_fail(z, "FilterArgumentError", "map requires a filter argument");
    const jv name = args->v[0];
    g->filter_name = name.k == JV_STR ? name.s->p : "?";
    g->filter_id = name.k == JV_STR ? jb_filter_id(name.s->p) : -1;
    jlist *rest = jl_new(z, args->n - 1);
    for (size_t i = 1; i < args->n; i++) jl_push(z, rest, args->v[i]);
    g->args = rest;
    g->kw = kw;
    return jv_of_gen(g);
}

static jv json_filter(jrender *r, jv v, const jlist *args, const jdict *kw) {
    jz *z = &r->z;
    static const char *const P[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    jv a[4];
    bool g[4];
    bind(r, "tojson", P, 4, 0, args, kw, a, g);
    jjson_opts o = {0};
    o.ensure_ascii = arg_true(r, a, g, 0);
    o.sort_keys = arg_true(r, a, g, 3);
    if (g[1] && a[1].k != JV_NONE) {
        o.has_indent = true;
        if (a[1].k == JV_STR) {
            o.indent = a[1].s;
        } else {
            const int64_t n = arg_int(r, a[1], "");
            if (n > 1024) jz_unsupported(z, "a JSON indent of %lld", (long long)n);
            char *sp = jz_alloc(z, (size_t)(n > 0 ? n : 0) + 1);
            memset(sp, ' ', (size_t)(n > 0 ? n : 0));
            o.indent = js_new(z, sp, (size_t)(n > 0 ? n : 0));
        }
    }
    if (g[2] && a[2].k != JV_NONE) {
        const jlist *sep = jv_iter_list(z, a[2]);
        if (sep->n != 2) jz_fail(z, "ValueError", "too many values to unpack (expected 2)");
        if (sep->v[0].k != JV_STR || sep->v[1].k != JV_STR)
            jz_fail(z, "TypeError", "make_encoder() argument 6 must be str, not %s",
                    jv_type_name(sep->v[0].k != JV_STR ? sep->v[0] : sep->v[1]));
        o.item_sep = sep->v[0].s;
        o.key_sep = sep->v[1].s;
    }
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    jv_write_json(z, &b, v, &o);
    return jv_str(z, b.p, b.len);
}

static jv indent_filter(jrender *r, jv v, const jlist *args, const jdict *kw) {
    jz *z = &r->z;
    static const char *const P[] = {"width", "first", "blank"};
    jv a[3];
    bool g[3];
    bind(r, "do_indent", P, 3, 0, args, kw, a, g);
    /* do_indent appends a newline to its argument as it is: a non-string fails there */
    if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
    if (v.k == JV_LIST && v.l->view == JL_PLAIN) /* list += "\n" extends it; then .splitlines() */
        jz_fail(z, "AttributeError", "'list' object has no attribute 'splitlines'");
    if (v.k == JV_TUPLE) jz_fail(z, "TypeError", "can only concatenate tuple (not \"str\") to tuple");
    if (v.k != JV_STR) jz_fail(z, "TypeError", "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    const jstr *s = v.s;
    jstr *ind;
    if (g[0] && a[0].k == JV_STR) ind = a[0].s;
    else {
        const int64_t w = g[0] ? arg_int(r, a[0], "") : 4;
        const size_t n = w > 0 ? (size_t)w : 0;
        if (n > 4096) jz_unsupported(z, "an indent of %zu", n);
        char *sp = jz_alloc(z, n + 1);
        memset(sp, ' ', n);
        ind = js_new(z, sp, n);
    }
    jbuf t = {0};
    jb_put(z, &t, s->p, s->len);
    jb_putc(z, &t, '\n'); /* the quirk that makes splitlines keep a trailing empty line */
    const jlist *lines = js_splitlines(z, js_new(z, t.p, t.len), false);
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    if (arg_true(r, a, g, 0 + 1)) jb_put(z, &b, ind->p, ind->len);
    for (size_t i = 0; i < lines->n; i++) {
        const jstr *line = lines->v[i].s;
        if (i > 0) {
            jb_putc(z, &b, '\n');
            if (arg_true(r, a, g, 2) || line->len) jb_put(z, &b, ind->p, ind->len);
        }
        jb_put(z, &b, line->p, line->len);
    }
    return jv_str(z, b.p, b.len);
}

static jv title_filter(jrender *r, jv v) {
    /* "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s)) */
    jz *z = &r->z;
    size_t n;
    const uint32_t *cp = js_cps(z, jb_soft_str(r, v), &n);
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    size_t i = 0;
    while (i < n) {
        const bool sep = cp[i] == '-' || cp[i] == '(' || cp[i] == '{' || cp[i] == '[' || cp[i] == '<' || ju_isspace(cp[i]);
        size_t j = i;
        while (j < n && (cp[j] == '-' || cp[j] == '(' || cp[j] == '{' || cp[j] == '[' || cp[j] == '<' ||
                         ju_isspace(cp[j])) == sep)
            j++;
        const jstr *item = js_from_cps(z, cp + i, j - i);
        /* a separator run upper()s its first character and lower()s the rest: no change except
         * for whitespace that has case mappings (none do) */
        const size_t first = js_offset(item, 1);
        const jstr *head = js_upper(z, js_new(z, item->p, first));
        const jstr *tail = js_lower(z, js_new(z, item->p + first, item->len - first));
        jb_put(z, &b, head->p, head->len);
        jb_put(z, &b, tail->p, tail->len);
        i = j;
    }
    return jv_str(z, b.p, b.len);
}

static jv minmax(jrender *r, jv v, const jlist *args, const jdict *kw, bool want_max) {
    jz *z = &r->z;
    static const char *const P[] = {"case_sensitive", "attribute"};
    jv a[2];
    bool g[2];
    bind(r, want_max ? "do_max" : "do_min", P, 2, 0, args, kw, a, g);
    const jlist *l = jv_iter_list(z, v);
    if (l->n == 0) return jv_undef_hint(z, "No aggregated item, sequence was empty.");
    const jlist *parts = jb_attr_parts(r, g[1] ? a[1] : JV_NONE_V);
    const bool cs = arg_true(r, a, g, 0);
    jv best = l->v[0], best_key = jb_attr_path(r, best, parts, NULL);
    if (!cs) best_key = jb_ignore_case(r, best_key);
    for (size_t i = 1; i < l->n; i++) {
        jv k = jb_attr_path(r, l->v[i], parts, NULL);
        if (!cs) k = jb_ignore_case(r, k);
        if (jv_lt(z, k, best_key, want_max ? ">" : "<")) {
            best = l->v[i];
            best_key = k;
        }
    }
    return best;
}

/* ---- filters ---------------------------------------------------------------------------------- */

jv jb_filter(jrender *r, int id, const char *name, jv v, jlist *args, jdict *kw) {
    jz *z = &r->z;
    if (id < 0) jz_fail(z, "TemplateRuntimeError", "No filter named '%s'.", name);
    jv a[6];
    bool g[6];
    switch (id) {
    case FL_ABS:
        bind(r, "abs", NULL, 0, 0, args, kw, a, g);
        if (v.k == JV_INT) {
            if (v.i == INT64_MIN) jz_unsupported(z, "integers beyond 64 bits");
            return jv_int(v.i < 0 ? -v.i : v.i);
        }
        if (v.k == JV_BOOL) return jv_int(v.b);
        if (v.k == JV_FLOAT) return jv_float(fabs(v.f));
        jz_fail(z, "TypeError", "bad operand type for abs(): '%s'", jv_type_name(v));
    case FL_ATTR: {
        static const char *const P[] = {"name"};
        bind(r, "do_attr", P, 1, 1, args, kw, a, g);
        if (a[0].k != JV_STR) jz_fail(z, "TypeError", "attribute name must be string, not '%s'", jv_type_name(a[0]));
        if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
        jv out;
        if (a[0].s->len >= 2 && a[0].s->p[0] == '_' && a[0].s->p[1] == '_') return jr_getattr(r, v, a[0].s);
        if (jb_attr(r, v, a[0].s, &out)) return out;
        return jv_undef_attr(z, v, a[0]);
    }
    case FL_BATCH: {
        static const char *const P[] = {"linecount", "fill_with"};
        bind(r, "do_batch", P, 2, 1, args, kw, a, g);
        jgen *gn = jg_new(r, JG_BATCH, v);
        gn->count = arg_int(r, a[0], "");
        if (gn->count <= 0) jz_unsupported(z, "batch() with a count below 1");
        gn->fill = a[1];
        gn->has_fill = g[1] && a[1].k != JV_NONE;
        return jv_of_gen(gn);
    }
    case FL_CAPITALIZE: bind(r, "do_capitalize", NULL, 0, 0, args, kw, a, g); return jv_of_str(js_capitalize(z, jb_soft_str(r, v)));
    case FL_CENTER: {
        static const char *const P[] = {"width"};
        bind(r, "do_center", P, 1, 0, args, kw, a, g);
        const jstr *s = jb_soft_str(r, v);
        const int64_t width = g[0] ? arg_int(r, a[0], "") : 80;
        if (width <= (int64_t)s->ncp) return jv_of_str((jstr *)s);
        if (width > (64 << 20)) jz_oom(z);
        const size_t marg = (size_t)width - s->ncp, left = marg / 2 + (marg & (size_t)width & 1);
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        for (size_t i = 0; i < left; i++) jb_putc(z, &b, ' ');
        jb_put(z, &b, s->p, s->len);
        for (size_t i = left; i < marg; i++) jb_putc(z, &b, ' ');
        return jv_str(z, b.p, b.len);
    }
    case FL_COUNT:
    case FL_LENGTH:
        bind(r, "len", NULL, 0, 0, args, kw, a, g);
        return jv_int(py_len(r, v));
    case FL_D:
    case FL_DEFAULT: {
        static const char *const P[] = {"default_value", "boolean"};
        bind(r, "do_default", P, 2, 0, args, kw, a, g);
        if (v.k == JV_UNDEF || (arg_true(r, a, g, 1) && !jv_truthy(z, v))) return g[0] ? a[0] : jv_of_str(&js_empty);
        return v;
    }
    case FL_DICTSORT: {
        static const char *const P[] = {"case_sensitive", "by", "reverse"};
        bind(r, "do_dictsort", P, 3, 0, args, kw, a, g);
        int pos = 0;
        if (g[1]) {
            if (a[1].k == JV_STR && js_eqc(a[1].s, "value")) pos = 1;
            else if (!(a[1].k == JV_STR && js_eqc(a[1].s, "key")))
                jz_fail(z, "FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
        }
        if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
        if (v.k != JV_DICT) jz_fail(z, "AttributeError", "'%s' object has no attribute 'items'", jv_type_name(v));
        const size_t n = v.d->n;
        jv *items = jz_alloc(z, (n + 1) * sizeof(jv)), *keys = jz_alloc(z, (n + 1) * sizeof(jv));
        for (size_t i = 0; i < n; i++) {
            items[i] = jv_tuple2(z, v.d->keys[i], v.d->vals[i]);
            keys[i] = pos ? v.d->vals[i] : v.d->keys[i];
            if (!arg_true(r, a, g, 0)) keys[i] = jb_ignore_case(r, keys[i]);
        }
        sort_by(r, items, keys, n, arg_true(r, a, g, 2));
        jlist *l = jl_new(z, n);
        if (n) memcpy(l->v, items, n * sizeof(jv));
        l->n = n;
        return jv_of_list(l);
    }
    case FL_FIRST: {
        bind(r, "sync_do_first", NULL, 0, 0, args, kw, a, g);
        if (v.k == JV_GEN) {
            jv x;
            if (jg_next(z, v.g, &x)) return x;
        } else {
            const jlist *l = jv_iter_list(z, v);
            if (l->n) return l->v[0];
        }
        return jv_undef_hint(z, "No first item, sequence was empty.");
    }
    case FL_LAST: {
        bind(r, "do_last", NULL, 0, 0, args, kw, a, g);
        if (v.k == JV_GEN) jz_fail(z, "TypeError", "'%s' object is not reversible", v.g->type_name);
        if (v.k == JV_LIST && (v.l->view == JL_KEYS || v.l->view == JL_VALUES || v.l->view == JL_ITEMS)) {
            /* views are reversible since Python 3.8 */
        }
        if (!(v.k == JV_UNDEF || v.k == JV_STR || jv_is_seq(v) || v.k == JV_DICT))
            jz_fail(z, "TypeError", "'%s' object is not reversible", jv_type_name(v));
        const jlist *l = jv_iter_list(z, v);
        if (l->n) return l->v[l->n - 1];
        return jv_undef_hint(z, "No last item, sequence was empty.");
    }
    case FL_FLOAT: {
        static const char *const P[] = {"default"};
        bind(r, "do_float", P, 1, 0, args, kw, a, g);
        const jv dflt = g[0] ? a[0] : jv_float(0.0);
        if (v.k == JV_FLOAT) return v;
        if (v.k == JV_INT || v.k == JV_BOOL) return jv_float((double)(v.k == JV_BOOL ? v.b : v.i));
        double d;
        if (v.k == JV_STR && parse_float_str(v.s, &d)) return jv_float(d);
        if (v.k == JV_UNDEF) jv_fail_undefined(z, v); /* float(Undefined) raises */
        return dflt;
    }
    case FL_FORMAT: {
        if (args->n && kw->n) jz_fail(z, "FilterArgumentError", "can't handle positional and keyword arguments at the same time");
        const jv rhs = kw->n ? jv_of_dict(kw) : jv_of_tuple(args);
        return jb_mod(r, jv_of_str(jb_soft_str(r, v)), rhs);
    }
    case FL_INDENT: return indent_filter(r, v, args, kw);
    case FL_INT: {
        static const char *const P[] = {"default", "base"};
        bind(r, "do_int", P, 2, 0, args, kw, a, g);
        const jv dflt = g[0] ? a[0] : jv_int(0);
        const int base = g[1] ? (int)arg_int(r, a[1], "") : 10;
        if (v.k == JV_INT) return v;
        if (v.k == JV_BOOL) return jv_int(v.b);
        if (v.k == JV_FLOAT) {
            if (!isfinite(v.f)) return dflt;
            if (fabs(v.f) >= 9.2e18) jz_unsupported(z, "integers beyond 64 bits");
            return jv_int((int64_t)v.f);
        }
        if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
        if (v.k == JV_STR) {
            int64_t i;
            if (parse_int_str(v.s, base, &i)) return jv_int(i);
            double d;
            if (parse_float_str(v.s, &d) && isfinite(d)) {
                if (fabs(d) >= 9.2e18) jz_unsupported(z, "integers beyond 64 bits");
                return jv_int((int64_t)d);
            }
        }
        return dflt;
    }
    case FL_JOIN: {
        static const char *const P[] = {"d", "attribute"};
        bind(r, "sync_do_join", P, 2, 0, args, kw, a, g);
        const jstr *d = g[0] ? jb_soft_str(r, a[0]) : &js_empty;
        const jlist *l = jv_iter_list(z, v);
        const jlist *parts = g[1] && a[1].k != JV_NONE ? jb_attr_parts(r, a[1]) : NULL;
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i) jb_put(z, &b, d->p, d->len);
            jv_write_str(z, &b, parts ? jb_attr_path(r, l->v[i], parts, NULL) : l->v[i]);
        }
        return jv_str(z, b.p, b.len);
    }
    case FL_LIST: bind(r, "sync_do_list", NULL, 0, 0, args, kw, a, g); return to_list(r, v);
    case FL_LOWER: bind(r, "do_lower", NULL, 0, 0, args, kw, a, g); return jv_of_str(js_lower(z, jb_soft_str(r, v)));
    case FL_UPPER: bind(r, "do_upper", NULL, 0, 0, args, kw, a, g); return jv_of_str(js_upper(z, jb_soft_str(r, v)));
    case FL_ITEMS: bind(r, "do_items", NULL, 0, 0, args, kw, a, g); return jv_of_gen(jg_new(r, JG_ITEMS, v));
    case FL_MAP: return map_gen(r, v, args, kw);
    case FL_MIN: return minmax(r, v, args, kw, false);
    case FL_MAX: return minmax(r, v, args, kw, true);
    case FL_SELECT: return select_gen(r, v, args, kw, false, false);
    case FL_REJECT: return select_gen(r, v, args, kw, true, false);
    case FL_SELECTATTR: return select_gen(r, v, args, kw, false, true);
    case FL_REJECTATTR: return select_gen(r, v, args, kw, true, true);
    case FL_REPLACE: {
        static const char *const P[] = {"old", "new", "count"};
        bind(r, "do_replace", P, 3, 2, args, kw, a, g);
        const int64_t count = g[2] && a[2].k != JV_NONE ? arg_int(r, a[2], "") : -1;
        return jv_of_str(js_replace(z, jb_soft_str(r, v), jb_soft_str(r, a[0]), jb_soft_str(r, a[1]), count));
    }
    case FL_REVERSE: {
        bind(r, "do_reverse", NULL, 0, 0, args, kw, a, g);
        if (v.k == JV_STR) return jr_slice(r, v, JV_NONE_V, JV_NONE_V, jv_int(-1));
        if (v.k == JV_GEN) {
            const jlist *l = jv_iter_list(z, v);
            jlist *out = jl_new(z, l->n);
            for (size_t i = l->n; i-- > 0;) jl_push(z, out, l->v[i]);
            return jv_of_list(out);
        }
        if (jv_is_seq(v) || v.k == JV_DICT || v.k == JV_UNDEF) {
            jgen *gn = jg_new(r, JG_REVERSE, v);
            gn->type_name = v.k == JV_TUPLE ? "reversed" : v.k == JV_DICT ? "dict_reversekeyiterator"
                          : v.k == JV_LIST && v.l->view == JL_RANGE ? "range_iterator"
                          : v.k == JV_UNDEF ? "reversed" : "list_reverseiterator";
            return jv_of_gen(gn);
        }
        jz_fail(z, "FilterArgumentError", "argument must be iterable");
    }
    case FL_ROUND: {
        static const char *const P[] = {"precision", "method"};
        bind(r, "do_round", P, 2, 0, args, kw, a, g);
        const char *method = g[1] && a[1].k == JV_STR ? a[1].s->p : "common";
        if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
            jz_fail(z, "FilterArgumentError", "method must be common, ceil or floor");
        const int64_t prec = g[0] ? arg_int(r, a[0], "") : 0;
        if (!strcmp(method, "common") && v.k != JV_FLOAT && jv_is_num(v)) return jv_int(v.k == JV_BOOL ? v.b : v.i);
        return round_float(r, v, prec, method);
    }
    case FL_SLICE: {
        static const char *const P[] = {"slices", "fill_with"};
        bind(r, "sync_do_slice", P, 2, 1, args, kw, a, g);
        jgen *gn = jg_new(r, JG_SLICE, v);
        gn->count = arg_int(r, a[0], "");
        if (gn->count <= 0) jz_unsupported(z, "slice() with a count below 1");
        gn->fill = a[1];
        gn->has_fill = g[1] && a[1].k != JV_NONE;
        return jv_of_gen(gn);
    }
    case FL_SORT: {
        static const char *const P[] = {"reverse", "case_sensitive", "attribute"};
        bind(r, "do_sort", P, 3, 0, args, kw, a, g);
        const jlist *l = jv_iter_list(z, v);
        const size_t n = l->n;
        jv *items = jz_alloc(z, (n + 1) * sizeof(jv)), *keys = jz_alloc(z, (n + 1) * sizeof(jv));
        /* make_multi_attrgetter: a list of keys per item, one per comma-separated attribute */
        jlist *attrs = jl_new(z, 0);
        if (g[2] && a[2].k == JV_STR) {
            const jstr *s = a[2].s;
            size_t start = 0;
            for (size_t i = 0; i <= s->len; i++)
                if (i == s->len || s->p[i] == ',') {
                    jl_push(z, attrs, jv_of_list(jb_attr_parts(r, jv_str(z, s->p + start, i - start))));
                    start = i + 1;
                }
        } else {
            jl_push(z, attrs, jv_of_list(jb_attr_parts(r, g[2] ? a[2] : JV_NONE_V)));
        }
        for (size_t i = 0; i < n; i++) {
            items[i] = l->v[i];
            jlist *k = jl_new(z, attrs->n);
            for (size_t j = 0; j < attrs->n; j++) {
                jv x = jb_attr_path(r, l->v[i], attrs->v[j].l, NULL);
                if (!arg_true(r, a, g, 1)) x = jb_ignore_case(r, x);
                jl_push(z, k, x);
            }
            keys[i] = jv_of_list(k);
        }
        sort_by(r, items, keys, n, arg_true(r, a, g, 0));
        jlist *out = jl_new(z, n);
        if (n) memcpy(out->v, items, n * sizeof(jv));
        out->n = n;
        return jv_of_list(out);
    }
    case FL_STRING: bind(r, "soft_str", NULL, 0, 0, args, kw, a, g); return jv_of_str(jb_soft_str(r, v));
    case FL_SUM: {
        static const char *const P[] = {"attribute", "start"};
        bind(r, "sync_do_sum", P, 2, 0, args, kw, a, g);
        const jlist *l = jv_iter_list(z, v);
        const jlist *parts = g[0] && a[0].k != JV_NONE ? jb_attr_parts(r, a[0]) : NULL;
        jv acc = g[1] ? a[1] : jv_int(0);
        if (acc.k == JV_STR) jz_fail(z, "TypeError", "sum() can't sum strings [use ''.join(seq) instead]");
        for (size_t i = 0; i < l->n; i++) acc = jb_add(r, acc, parts ? jb_attr_path(r, l->v[i], parts, NULL) : l->v[i]);
        return acc;
    }
    case FL_TITLE: bind(r, "do_title", NULL, 0, 0, args, kw, a, g); return title_filter(r, v);
    case FL_TRIM: {
        static const char *const P[] = {"chars"};
        bind(r, "do_trim", P, 1, 0, args, kw, a, g);
        const jstr *chars = NULL;
        if (g[0] && a[0].k != JV_NONE) {
            if (a[0].k != JV_STR) jz_fail(z, "TypeError", "strip arg must be None or str");
            chars = a[0].s;
        }
        return jv_of_str(js_strip(z, jb_soft_str(r, v), chars, true, true));
    }
    case FL_TRUNCATE: {
        static const char *const P[] = {"length", "killwords", "end", "leeway"};
        bind(r, "do_truncate", P, 4, 0, args, kw, a, g);
        const jstr *s = v.k == JV_STR ? v.s : NULL;
        if (!s) jz_unsupported(z, "truncate of a %s", jv_type_name(v));
        const int64_t length = g[0] ? arg_int(r, a[0], "") : 255;
        const jstr *end = g[2] ? jb_soft_str(r, a[2]) : js_cstr(z, "...");
        const int64_t leeway = g[3] && a[3].k != JV_NONE ? arg_int(r, a[3], "") : 5;
        if (length < (int64_t)end->ncp) jz_fail(z, "AssertionError", "expected length >= %zu, got %lld", end->ncp, (long long)length);
        if (leeway < 0) jz_fail(z, "AssertionError", "expected leeway >= 0, got %lld", (long long)leeway);
        if ((int64_t)s->ncp <= length + leeway) return v;
        const size_t keep = js_offset(s, (size_t)(length - (int64_t)end->ncp));
        size_t cut = keep;
        if (!arg_true(r, a, g, 1)) {
            /* s[:length - len(end)].rsplit(" ", 1)[0] */
            size_t k = keep;
            while (k > 0 && s->p[k - 1] != ' ') k--;
            if (k > 0) cut = k - 1;
        }
        jbuf b = {0};
        jb_put(z, &b, s->p, cut);
        jb_put(z, &b, end->p, end->len);
        return jv_str(z, b.p, b.len);
    }
    case FL_UNIQUE: {
        static const char *const P[] = {"case_sensitive", "attribute"};
        bind(r, "sync_do_unique", P, 2, 0, args, kw, a, g);
        jgen *gn = jg_new(r, JG_UNIQUE, v);
        gn->case_sensitive = arg_true(r, a, g, 0);
        gn->attr_parts = jb_attr_parts(r, g[1] ? a[1] : JV_NONE_V);
        gn->seen = jl_new(z, 0);
        return jv_of_gen(gn);
    }
    case FL_WORDCOUNT: {
        bind(r, "do_wordcount", NULL, 0, 0, args, kw, a, g);
        const jstr *s = jb_soft_str(r, v);
        int64_t n = 0;
        bool in_word = false;
        size_t i = 0;
        while (i < s->len) {
            const uint32_t c = ju_next(s->p, s->len, &i);
            const bool w = c == '_' || ju_isalpha(c) || ju_isdecimal(c) || ju_isdigit(c) || ju_isnumeric(c);
            if (w && !in_word) n++;
            in_word = w;
        }
        return jv_int(n);
    }
    case FL_TOJSON: return json_filter(r, v, args, kw);
    case FL_E:
    case FL_ESCAPE:
    case FL_FORCEESCAPE:
    case FL_SAFE:
        jz_unsupported(z, "the '%s' filter (HTML markup strings)", fname(id));
    default: jz_unsupported(z, "the '%s' filter", fname(id));
    }
}

