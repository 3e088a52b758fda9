/*
 * jinja2's lazy generators (select, reject, selectattr, rejectattr, map, unique, items, batch,
 * slice, and |reverse's iterators: single pass, truthy even when empty, no length) and its tests
 * (defined, string, mapping, odd, sameas, eq ...).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

enum {
    TS_ODD, TS_EVEN, TS_DIVISIBLEBY, TS_DEFINED, TS_UNDEFINED, TS_FILTER, TS_TEST, TS_NONE,
    TS_BOOLEAN, TS_FALSE, TS_TRUE, TS_INTEGER, TS_FLOAT, TS_LOWER, TS_UPPER, TS_STRING,
    TS_MAPPING, TS_NUMBER, TS_SEQUENCE, TS_ITERABLE, TS_CALLABLE, TS_SAMEAS, TS_ESCAPED, TS_IN,
    TS_EQ1, TS_EQ, TS_EQUALTO, TS_NE1, TS_NE, TS_GT1, TS_GT, TS_GREATERTHAN, TS_GE, TS_GE1,
    TS_LT1, TS_LT, TS_LESSTHAN, TS_LE1, TS_LE, TS_COUNT_
};

static const char *const k_tests[TS_COUNT_] = {
    "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean",
    "false", "true", "integer", "float", "lower", "upper", "string", "mapping", "number",
    "sequence", "iterable", "callable", "sameas", "escaped", "in", "==", "eq", "equalto", "!=",
    "ne", ">", "gt", "greaterthan", "ge", ">=", "<", "lt", "lessthan", "<=", "le",
};

int jb_test_id(const char *name) {
    for (int i = 0; i < TS_COUNT_; i++)
        if (!strcmp(name, k_tests[i])) return i;
    return -1;
}

/* ---- generators ------------------------------------------------------------------------------- */

jgen *jg_new(jrender *r, int kind, jv src) {
    jgen *g = jz_alloc(&r->z, sizeof *g);
    g->kind = (uint8_t)kind;
    g->r = r;
    g->src = src;
    g->type_name = "generator";
    return g;
}

jv jv_of_gen(jgen *g) { return (jv){.k = JV_GEN, .g = g}; }

const char *jg_type_name(const jgen *g) { return g->type_name; }

/* the next item of the generator's source */
static bool src_next(jz *z, jgen *g, jv *out) {
    if (g->src.k == JV_GEN) return jg_next(z, g->src.g, out);
    if (!g->items) g->items = jv_iter_list(z, g->src);
    if (g->pos >= g->items->n) return false;
    *out = g->items->v[g->pos++];
    return true;
}

jlist *jb_attr_parts(jrender *r, jv attribute) {
    /* _prepare_attribute_parts: "a.b.0" -> ['a', 'b', 0]; None -> [] */
    jz *z = &r->z;
    jlist *parts = jl_new(z, 0);
    if (attribute.k == JV_NONE || attribute.k == JV_UNDEF) return parts;
    if (attribute.k != JV_STR) {
        jl_push(z, parts, attribute);
        return parts;
    }
    const jstr *s = attribute.s;
    size_t start = 0;
    for (size_t i = 0; i <= s->len; i++) {
        if (i < s->len && s->p[i] != '.') continue;
        const char *p = s->p + start;
        const size_t n = i - start;
        bool digits = n > 0;
        for (size_t k = 0; k < n; k++) digits &= p[k] >= '0' && p[k] <= '9';
        if (digits && n < 18) jl_push(z, parts, jv_int(strtoll(p, NULL, 10)));
        else jl_push(z, parts, jv_str(z, p, n));
        start = i + 1;
    }
    return parts;
}

jv jb_attr_path(jrender *r, jv item, const jlist *parts, const jv *dflt) {
    for (size_t i = 0; i < parts->n; i++) {
        item = jr_getitem(r, item, parts->v[i]);
        if (dflt && item.k == JV_UNDEF) item = *dflt;
    }
    return item;
}

jv jb_ignore_case(jrender *r, jv v) { return v.k == JV_STR ? jv_of_str(js_lower(&r->z, v.s)) : v; }

bool jg_next(jz *z, jgen *g, jv *out) {
    jrender *r = g->r;
    if (g->done) return false;
    if (!g->started) {
        g->started = true;
        /* the generator bodies of select/map start with `if value:` */
        if ((g->kind == JG_SELECT || g->kind == JG_MAP) && !jv_truthy(z, g->src)) {
            g->done = true;
            return false;
        }
        if (g->kind == JG_ITEMS) {
            if (g->src.k == JV_UNDEF) {
                g->done = true;
                return false;
            }
            if (g->src.k != JV_DICT) jz_fail(z, "TypeError", "Can only get item pairs from a mapping.");
        }
        if (g->kind == JG_SELECT && !g->by_attr && g->truth_only == false && g->test_id < 0 && g->test_name)
            jz_fail(z, "TemplateRuntimeError", "No test named '%s'.", g->test_name);
        if (g->kind == JG_SLICE) {
            g->items = jv_iter_list(z, g->src);
            const int64_t len = (int64_t)g->items->n;
            g->per_slice = len / g->count;
            g->with_extra = len % g->count;
        }
    }
    jv x;
    switch (g->kind) {
    case JG_SELECT:
        while (src_next(z, g, &x)) {
            const jv v = g->by_attr ? jb_attr_path(r, x, g->attr_parts, NULL) : x;
            bool keep;
            if (g->truth_only) keep = jv_truthy(z, v);
            else keep = jb_test(r, g->test_id, g->test_name, v, g->args, g->kw);
            if (keep != g->reject) {
                *out = x;
                return true;
            }
        }
        break;
    case JG_MAP:
        if (src_next(z, g, &x)) {
            if (g->map_attr) *out = jb_attr_path(r, x, g->attr_parts, g->has_dflt ? &g->dflt : NULL);
            else *out = jb_filter(r, g->filter_id, g->filter_name, x, g->args, g->kw);
            return true;
        }
        break;
    case JG_UNIQUE:
        while (src_next(z, g, &x)) {
            jv key = jb_attr_path(r, x, g->attr_parts, NULL);
            if (!g->case_sensitive) key = jb_ignore_case(r, key);
            jv_check_hashable(z, key);
            bool seen = false;
            for (size_t i = 0; i < g->seen->n && !seen; i++) seen = jv_eq(z, g->seen->v[i], key);
            if (!seen) {
                jl_push(z, g->seen, key);
                *out = x;
                return true;
            }
        }
        break;
    case JG_ITEMS:
        if (g->pos < g->src.d->n) {
            *out = jv_tuple2(z, g->src.d->keys[g->pos], g->src.d->vals[g->pos]);
            g->pos++;
            return true;
        }
        break;
    case JG_REVERSE:
        if (!g->items) {
            g->items = jv_iter_list(z, g->src);
            g->pos = g->items->n;
        }
        if (g->pos > 0) {
            *out = g->items->v[--g->pos];
            return true;
        }
        break;
    case JG_BATCH: {
        jlist *tmp = jl_new(z, (size_t)(g->count < 64 ? g->count : 64));
        while ((int64_t)tmp->n < g->count && src_next(z, g, &x)) jl_push(z, tmp, x);
        if (tmp->n == 0) break;
        if ((int64_t)tmp->n < g->count && g->has_fill)
            while ((int64_t)tmp->n < g->count) jl_push(z, tmp, g->fill);
        *out = jv_of_list(tmp);
        return true;
    }
    case JG_SLICE:
        if (g->slice_no < g->count) {
            const int64_t k = g->slice_no;
            const int64_t start = g->offset + k * g->per_slice;
            if (k < g->with_extra) g->offset++;
            const int64_t end = g->offset + (k + 1) * g->per_slice;
            jlist *tmp = jl_new(z, 0);
            for (int64_t i = start; i < end && i < (int64_t)g->items->n; i++) jl_push(z, tmp, g->items->v[i]);
            if (g->has_fill && k >= g->with_extra) jl_push(z, tmp, g->fill);
            g->slice_no++;
            *out = jv_of_list(tmp);
            return true;
        }
        break;
    default: break;
    }
    g->done = true;
    return false;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static bool is_number(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }

bool jb_test(jrender *r, int id, const char *name, jv v, jlist *args, jdict *kw) {
    jz *z = &r->z;
    if (id < 0) jz_fail(z, "TemplateRuntimeError", "No test named '%s'.", name);
    jv a[2];
    bool g[2];
    static const char *const ONE[] = {"other"};
    switch (id) {
    case TS_DEFINED: jb_bind(r, "test_defined", NULL, 0, 0, 1, args, kw, a, g); return v.k != JV_UNDEF;
    case TS_UNDEFINED: jb_bind(r, "test_undefined", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_UNDEF;
    case TS_NONE: jb_bind(r, "test_none", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_NONE;
    case TS_BOOLEAN: jb_bind(r, "test_boolean", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_BOOL;
    case TS_FALSE: jb_bind(r, "test_false", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_BOOL && !v.b;
    case TS_TRUE: jb_bind(r, "test_true", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_BOOL && v.b;
    case TS_INTEGER: jb_bind(r, "test_integer", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_INT;
    case TS_FLOAT: jb_bind(r, "test_float", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_FLOAT;
    case TS_NUMBER: jb_bind(r, "test_number", NULL, 0, 0, 1, args, kw, a, g); return is_number(v);
    case TS_STRING: jb_bind(r, "test_string", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_STR;
    case TS_MAPPING: jb_bind(r, "test_mapping", NULL, 0, 0, 1, args, kw, a, g); return v.k == JV_DICT;
    case TS_SEQUENCE:
        jb_bind(r, "test_sequence", NULL, 0, 0, 1, args, kw, a, g);
        return v.k == JV_STR || v.k == JV_DICT || v.k == JV_UNDEF ||
               (jv_is_seq(v) && (v.l->view == JL_PLAIN || v.l->view == JL_RANGE));
    case TS_ITERABLE:
        jb_bind(r, "test_iterable", NULL, 0, 0, 1, args, kw, a, g);
        return v.k == JV_STR || jv_is_seq(v) || v.k == JV_DICT || v.k == JV_GEN || v.k == JV_UNDEF || v.k == JV_LOOP;
    case TS_CALLABLE:
        if (args->n || kw->n)
            jz_fail(z, "TypeError", kw->n ? "callable() takes no keyword arguments"
                                          : "callable() takes exactly one argument (%zu given)", args->n + 1);
        return v.k == JV_FUNC || v.k == JV_MACRO || v.k == JV_LOOP || v.k == JV_JOINER || v.k == JV_UNDEF;
    case TS_ESCAPED: jb_bind(r, "test_escaped", NULL, 0, 0, 1, args, kw, a, g); return false;
    case TS_LOWER: jb_bind(r, "test_lower", NULL, 0, 0, 1, args, kw, a, g); return js_islower(jb_soft_str(r, v));
    case TS_UPPER: jb_bind(r, "test_upper", NULL, 0, 0, 1, args, kw, a, g); return js_isupper(jb_soft_str(r, v));
    case TS_ODD:
    case TS_EVEN: {
        jb_bind(r, id == TS_ODD ? "test_odd" : "test_even", NULL, 0, 0, 1, args, kw, a, g);
        const jv m = jb_mod(r, v, jv_int(2));
        return jv_eq(z, m, jv_int(id == TS_ODD ? 1 : 0));
    }
    case TS_DIVISIBLEBY: {
        static const char *const P[] = {"num"};
        jb_bind(r, "test_divisibleby", P, 1, 1, 1, args, kw, a, g);
        return jv_eq(z, jb_mod(r, v, a[0]), jv_int(0));
    }
    case TS_FILTER:
    case TS_TEST:
        /* pass_environment: the environment counts as a positional argument */
        jb_bind(r, id == TS_FILTER ? "test_filter" : "test_test", NULL, 0, 0, 2, args, kw, a, g);
        jv_check_hashable(z, v); /* `value in environment.filters` hashes it */
        if (v.k != JV_STR) return false;
        return id == TS_FILTER ? jb_filter_id(v.s->p) >= 0 : jb_test_id(v.s->p) >= 0;
    case TS_SAMEAS: {
        jb_bind(r, "test_sameas", ONE, 1, 1, 1, args, kw, a, g);
        const jv o = a[0];
        if (v.k == JV_NONE || o.k == JV_NONE) return v.k == o.k;
        if (v.k == JV_BOOL || o.k == JV_BOOL) return v.k == o.k && v.b == o.b;
        if (v.k == JV_UNDEF || o.k == JV_UNDEF) return v.k == o.k && v.u == o.u;
        if (v.k == JV_INT && o.k == JV_INT && v.i >= -5 && v.i <= 256) return v.i == o.i;
        if (v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_STR || o.k == JV_INT || o.k == JV_FLOAT || o.k == JV_STR) {
            if (v.k != o.k) return false;
            jz_unsupported(z, "`is sameas` on numbers or strings (Python's object identity)");
        }
        return v.k == o.k && v.p == o.p;
    }
    case TS_IN: {
        static const char *const P[] = {"seq"};
        jb_bind(r, "test_in", P, 1, 1, 1, args, kw, a, g);
        return jb_in(r, v, a[0]);
    }
    case TS_EQ1: case TS_EQ: case TS_EQUALTO:
        jb_bind(r, "eq", ONE, 1, 1, 1, args, kw, a, g);
        return jv_eq(z, v, a[0]);
    case TS_NE1: case TS_NE:
        jb_bind(r, "ne", ONE, 1, 1, 1, args, kw, a, g);
        return !jv_eq(z, v, a[0]);
    case TS_GT1: case TS_GT: case TS_GREATERTHAN:
        jb_bind(r, "gt", ONE, 1, 1, 1, args, kw, a, g);
        return jv_lt(z, v, a[0], ">");
    case TS_GE: case TS_GE1:
        jb_bind(r, "ge", ONE, 1, 1, 1, args, kw, a, g);
        return jv_lt(z, v, a[0], ">=");
    case TS_LT1: case TS_LT: case TS_LESSTHAN:
        jb_bind(r, "lt", ONE, 1, 1, 1, args, kw, a, g);
        return jv_lt(z, v, a[0], "<");
    case TS_LE1: case TS_LE:
        jb_bind(r, "le", ONE, 1, 1, 1, args, kw, a, g);
        return jv_lt(z, v, a[0], "<=");
    default: break;
    }
    jz_unsupported(z, "the '%s' test", name);
}
