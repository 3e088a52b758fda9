/*
 * The attributes of values (dict and list methods, loop and macro attributes, cycler / joiner),
 * jinja2's globals (range, dict, namespace, cycler, joiner) and Hugging Face's (raise_exception,
 * strftime_now), the sandbox's rule that methods which mutate (list.append, dict.update, ...)
 * are unsafe, and Python's argument binding for builtins. str methods are in jinja_str.c.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

/* ---- argument binding ------------------------------------------------------------------------- */

void jb_bind(jrender *r, const char *fn, const char *const *params, size_t np, size_t nreq,
             size_t self_n, const jlist *args, const jdict *kw, jv *out, bool *given) {
    jz *z = &r->z;
    for (size_t i = 0; i < np; i++) given[i] = false, out[i] = JV_UNDEF_V;
    if (args->n > np) {
        const size_t tot = np + self_n, req = nreq + self_n, got = args->n + self_n;
        if (req == tot)
            jz_fail(z, "TypeError", "%s() takes %zu positional argument%s but %zu were given", fn, tot,
                    tot == 1 ? "" : "s", got);
        jz_fail(z, "TypeError", "%s() takes from %zu to %zu positional arguments but %zu were given", fn,
                req, tot, got);
    }
    for (size_t i = 0; i < args->n; i++) out[i] = args->v[i], given[i] = true;
    for (size_t k = 0; k < kw->n; k++) {
        const jstr *name = kw->keys[k].s;
        size_t i = 0;
        while (i < np && !js_eqc(name, params[i])) i++;
        if (i == np) jz_fail(z, "TypeError", "%s() got an unexpected keyword argument '%s'", fn, name->p);
        if (given[i]) jz_fail(z, "TypeError", "%s() got multiple values for argument '%s'", fn, name->p);
        out[i] = kw->vals[k];
        given[i] = true;
    }
    for (size_t i = 0; i < nreq; i++)
        if (!given[i]) jz_fail(z, "TypeError", "%s() missing 1 required positional argument: '%s'", fn, params[i]);
}

void jb_no_kwargs(jrender *r, const char *fn, const jdict *kw) {
    if (kw->n) jz_fail(&r->z, "TypeError", "%s() takes no keyword arguments", fn);
}

void jb_nargs(jrender *r, const char *fn, const jlist *args, size_t lo, size_t hi) {
    if (args->n < lo || args->n > hi) {
        if (lo == hi)
            jz_fail(&r->z, "TypeError", "%s() takes exactly %s (%zu given)", fn,
                    lo == 0 ? "no arguments" : lo == 1 ? "one argument" : "two arguments", args->n);
        jz_fail(&r->z, "TypeError", "%s expected %s%zu argument%s, got %zu", fn, args->n < lo ? "at least " : "at most ",
                args->n < lo ? lo : hi, (args->n < lo ? lo : hi) == 1 ? "" : "s", args->n);
    }
}

jstr *jb_want_str(jrender *r, jv v, const char *what) {
    if (v.k == JV_STR) return v.s;
    if (v.k == JV_UNDEF) jv_fail_undefined(&r->z, v);
    jz_fail(&r->z, "TypeError", "%s", what);
}

int64_t jb_want_int(jrender *r, jv v, const char *what) {
    if (v.k == JV_INT) return v.i;
    if (v.k == JV_BOOL) return v.b;
    if (v.k == JV_UNDEF) jv_fail_undefined(&r->z, v);
    jz_fail(&r->z, "TypeError", "'%s' object cannot be interpreted as an integer%s", jv_type_name(v), what);
}

/* ---- method and global ids -------------------------------------------------------------------- */



static const char *const k_globals[G_COUNT_] = {
    "range", "dict", "namespace", "cycler", "joiner", "lipsum", "raise_exception", "strftime_now",
};

int jb_global_id(const char *name) {
    for (int i = 0; i < G_COUNT_; i++)
        if (!strcmp(name, k_globals[i])) return i;
    return -1;
}

static jv mkfunc(jrender *r, int id, const char *name, jv self) {
    jfunc *f = jz_alloc(&r->z, sizeof *f);
    f->id = id;
    f->name = name;
    f->self = self;
    return (jv){.k = JV_FUNC, .fn = f};
}

jv jb_global(jrender *r, int id) { return mkfunc(r, id, k_globals[id], JV_NONE_V); }

static const struct {
    const char *name;
    int id;
} k_str_methods[] = {
    {"capitalize", S_CAPITALIZE}, {"casefold", S_CASEFOLD}, {"center", S_CENTER}, {"count", S_COUNT},
    {"encode", UNSUPPORTED_METHOD}, {"endswith", S_ENDSWITH}, {"expandtabs", UNSUPPORTED_METHOD},
    {"find", S_FIND}, {"format", S_FORMAT}, {"format_map", UNSUPPORTED_METHOD}, {"index", S_INDEX},
    {"isalnum", S_ISALNUM}, {"isalpha", S_ISALPHA}, {"isascii", S_ISASCII}, {"isdecimal", S_ISDECIMAL},
    {"isdigit", S_ISDIGIT}, {"isidentifier", S_ISIDENTIFIER}, {"islower", S_ISLOWER},
    {"isnumeric", S_ISNUMERIC}, {"isprintable", S_ISPRINTABLE}, {"isspace", S_ISSPACE},
    {"istitle", S_ISTITLE}, {"isupper", S_ISUPPER}, {"join", S_JOIN}, {"ljust", S_LJUST},
    {"lower", S_LOWER}, {"lstrip", S_LSTRIP}, {"maketrans", UNSUPPORTED_METHOD},
    {"partition", S_PARTITION}, {"removeprefix", S_REMOVEPREFIX}, {"removesuffix", S_REMOVESUFFIX},
    {"replace", S_REPLACE}, {"rfind", S_RFIND}, {"rindex", S_RINDEX}, {"rjust", S_RJUST},
    {"rpartition", S_RPARTITION}, {"rsplit", S_RSPLIT}, {"rstrip", S_RSTRIP}, {"split", S_SPLIT},
    {"splitlines", S_SPLITLINES}, {"startswith", S_STARTSWITH}, {"strip", S_STRIP},
    {"swapcase", S_SWAPCASE}, {"title", S_TITLE}, {"translate", UNSUPPORTED_METHOD},
    {"upper", S_UPPER}, {"zfill", S_ZFILL},
};

static int str_method(const char *name) {
    for (size_t i = 0; i < sizeof k_str_methods / sizeof k_str_methods[0]; i++)
        if (!strcmp(name, k_str_methods[i].name)) return k_str_methods[i].id;
    return -1;
}

static bool name_in(const char *name, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(name, *list)) return true;
    return false;
}

static const char *const k_int_attrs[] = {"as_integer_ratio", "bit_count", "bit_length", "conjugate",
                                          "denominator", "from_bytes", "imag", "numerator", "real",
                                          "to_bytes", "is_integer", "fromhex", "hex", NULL};
static const char *const k_gen_attrs[] = {"close", "gi_code", "gi_frame", "gi_running", "gi_yieldfrom",
                                          "gi_suspended", "send", "throw", NULL};

static jv security(jrender *r, jv obj, const jstr *name) {
    jbuf b = {0};
    jb_printf(&r->z, &b, "access to attribute '%s' of '%s' object is unsafe.", name->p, jv_type_name(obj));
    jv u = jv_undef_hint(&r->z, b.p);
    u.u->security = true;
    return u;
}

bool jb_attr(jrender *r, jv obj, const jstr *name, jv *out) {
    jz *z = &r->z;
    const char *n = name->p;
    switch ((jv_kind)obj.k) {
    case JV_STR: {
        const int id = str_method(n);
        if (id < 0) return false;
        *out = mkfunc(r, id, n, obj);
        return true;
    }
    case JV_DICT: {
        static const char *const unsafe[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
        if (name_in(n, unsafe)) {
            *out = security(r, obj, name);
            return true;
        }
        const int id = !strcmp(n, "get") ? D_GET : !strcmp(n, "items") ? D_ITEMS : !strcmp(n, "keys") ? D_KEYS
                     : !strcmp(n, "values") ? D_VALUES : !strcmp(n, "copy") ? D_COPY
                     : !strcmp(n, "fromkeys") ? UNSUPPORTED_METHOD : -1;
        if (id < 0) return false;
        *out = mkfunc(r, id, n, obj);
        return true;
    }
    case JV_LIST:
    case JV_TUPLE: {
        const uint8_t view = obj.l->view;
        if (view == JL_KEYS || view == JL_ITEMS || view == JL_VALUES) {
            if (!strcmp(n, "mapping") || (view != JL_VALUES && !strcmp(n, "isdisjoint"))) {
                *out = mkfunc(r, UNSUPPORTED_METHOD, n, obj);
                return true;
            }
            return false;
        }
        if (view == JL_RANGE) {
            if (!strcmp(n, "start")) *out = jv_int(obj.l->r_start);
            else if (!strcmp(n, "stop")) *out = jv_int(obj.l->r_stop);
            else if (!strcmp(n, "step")) *out = jv_int(obj.l->r_step);
            else if (!strcmp(n, "count")) *out = mkfunc(r, L_COUNT, n, obj);
            else if (!strcmp(n, "index")) *out = mkfunc(r, L_INDEX, n, obj);
            else return false;
            return true;
        }
        if (obj.k == JV_LIST) {
            static const char *const unsafe[] = {"append", "clear", "extend", "insert", "pop",
                                                 "remove", "reverse", "sort", NULL};
            if (name_in(n, unsafe)) {
                *out = security(r, obj, name);
                return true;
            }
            if (!strcmp(n, "copy")) {
                *out = mkfunc(r, L_COPY, n, obj);
                return true;
            }
        }
        if (!strcmp(n, "count")) *out = mkfunc(r, L_COUNT, n, obj);
        else if (!strcmp(n, "index")) *out = mkfunc(r, L_INDEX, n, obj);
        else return false;
        return true;
    }
    case JV_NS: return jd_getc(obj.d, n, out) && name->len == strlen(n);
    case JV_LOOP: {
        jloop *l = obj.loop;
        const size_t i = l->index0;
        const bool wants_len = !strcmp(n, "revindex") || !strcmp(n, "revindex0") || !strcmp(n, "length");
        if (wants_len) jr_loop_have(r, l, SIZE_MAX - 1);
        const size_t len = l->items->n;
        if (!strcmp(n, "index")) *out = jv_int((int64_t)i + 1);
        else if (!strcmp(n, "index0")) *out = jv_int((int64_t)i);
        else if (!strcmp(n, "revindex")) *out = jv_int((int64_t)(len - i));
        else if (!strcmp(n, "revindex0")) *out = jv_int((int64_t)(len - i - 1));
        else if (!strcmp(n, "first")) *out = jv_bool(i == 0);
        else if (!strcmp(n, "last")) *out = jv_bool(!jr_loop_have(r, l, i + 1));
        else if (!strcmp(n, "length")) *out = jv_int((int64_t)len);
        else if (!strcmp(n, "depth")) *out = jv_int(l->depth0 + 1);
        else if (!strcmp(n, "depth0")) *out = jv_int(l->depth0);
        else if (!strcmp(n, "previtem"))
            *out = i == 0 ? jv_undef_hint(z, "there is no previous item") : l->items->v[i - 1];
        else if (!strcmp(n, "nextitem"))
            *out = !jr_loop_have(r, l, i + 1) ? jv_undef_hint(z, "there is no next item") : l->items->v[i + 1];
        else if (!strcmp(n, "cycle")) *out = mkfunc(r, O_LOOP_CYCLE, n, obj);
        else if (!strcmp(n, "changed")) *out = mkfunc(r, O_LOOP_CHANGED, n, obj);
        else return false;
        return true;
    }
    case JV_MACRO: {
        const jnode *m = obj.m->node;
        if (!strcmp(n, "name")) *out = jv_of_str(m->macro.name);
        else if (!strcmp(n, "catch_kwargs")) *out = jv_bool(m->macro.uses_kwargs);
        else if (!strcmp(n, "catch_varargs")) *out = jv_bool(m->macro.uses_varargs);
        else if (!strcmp(n, "caller")) *out = jv_bool(m->macro.uses_caller);
        else if (!strcmp(n, "arguments")) {
            jlist *l = jl_new(z, m->macro.nparams);
            for (size_t i = 0; i < m->macro.nparams; i++)
                jl_push(z, l, jv_of_str(JR(z)->t->syms[m->macro.params[i]].name));
            *out = jv_of_tuple(l);
        } else return false;
        return true;
    }
    case JV_CYCLER: {
        if (!strcmp(n, "next")) *out = mkfunc(r, O_CYCLER_NEXT, n, obj);
        else if (!strcmp(n, "reset")) *out = mkfunc(r, O_CYCLER_RESET, n, obj);
        else if (!strcmp(n, "current")) *out = obj.o->items->v[obj.o->pos];
        else if (!strcmp(n, "items")) *out = jv_of_tuple(obj.o->items);
        else return false;
        return true;
    }
    case JV_JOINER:
        if (!strcmp(n, "sep")) {
            *out = jv_of_str(obj.o->sep);
            return true;
        }
        return false;
    case JV_INT:
    case JV_BOOL:
    case JV_FLOAT:
        if (name_in(n, k_int_attrs)) jz_unsupported(z, "the attribute '%s' of numbers", n);
        return false;
    case JV_GEN:
        if (name_in(n, k_gen_attrs)) jz_unsupported(z, "the attribute '%s' of generators", n);
        return false;
    default: return false;
    }
}

/* ---- strftime_now ----------------------------------------------------------------------------- */

static void format_time(jrender *r, const jstr *fmt, const struct tm *tm, jbuf *b) {
    static const char *const days[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};
    static const char *const months[] = {"January", "February", "March", "April", "May", "June", "July",
                                         "August", "September", "October", "November", "December"};
    jz *z = &r->z;
    for (size_t i = 0; i < fmt->len; i++) {
        const char c = fmt->p[i];
        if (c != '%' || i + 1 >= fmt->len) {
            jb_putc(z, b, c);
            continue;
        }
        const char d = fmt->p[++i];
        switch (d) {
        case 'a': jb_put(z, b, days[tm->tm_wday], 3); break;
        case 'A': jb_puts(z, b, days[tm->tm_wday]); break;
        case 'b': case 'h': jb_put(z, b, months[tm->tm_mon], 3); break;
        case 'B': jb_puts(z, b, months[tm->tm_mon]); break;
        case 'd': jb_printf(z, b, "%02d", tm->tm_mday); break;
        case 'e': jb_printf(z, b, "%2d", tm->tm_mday); break;
        case 'm': jb_printf(z, b, "%02d", tm->tm_mon + 1); break;
        case 'Y': jb_printf(z, b, "%d", tm->tm_year + 1900); break;
        case 'y': jb_printf(z, b, "%02d", (tm->tm_year + 1900) % 100); break;
        case 'H': jb_printf(z, b, "%02d", tm->tm_hour); break;
        case 'I': jb_printf(z, b, "%02d", tm->tm_hour % 12 ? tm->tm_hour % 12 : 12); break;
        case 'M': jb_printf(z, b, "%02d", tm->tm_min); break;
        case 'S': jb_printf(z, b, "%02d", tm->tm_sec); break;
        case 'p': jb_puts(z, b, tm->tm_hour < 12 ? "AM" : "PM"); break;
        case 'j': jb_printf(z, b, "%03d", tm->tm_yday + 1); break;
        case 'f': jb_puts(z, b, "000000"); break;
        case 'z': case 'Z': break; /* datetime.now() is naive: no zone */
        case 'F': jb_printf(z, b, "%d-%02d-%02d", tm->tm_year + 1900, tm->tm_mon + 1, tm->tm_mday); break;
        case 'T': jb_printf(z, b, "%02d:%02d:%02d", tm->tm_hour, tm->tm_min, tm->tm_sec); break;
        case 'D': jb_printf(z, b, "%02d/%02d/%02d", tm->tm_mon + 1, tm->tm_mday, (tm->tm_year + 1900) % 100); break;
        case 'R': jb_printf(z, b, "%02d:%02d", tm->tm_hour, tm->tm_min); break;
        case 'u': jb_printf(z, b, "%d", tm->tm_wday ? tm->tm_wday : 7); break;
        case 'w': jb_printf(z, b, "%d", tm->tm_wday); break;
        case 'n': jb_putc(z, b, '\n'); break;
        case 't': jb_putc(z, b, '\t'); break;
        case '%': jb_putc(z, b, '%'); break;
        default: jz_unsupported(z, "the strftime directive %%%c", d);
        }
    }
}

/* ---- calls ------------------------------------------------------------------------------------ */

static jv call_global(jrender *r, int id, jlist *args, jdict *kw) {
    jz *z = &r->z;
    switch (id) {
    case G_RANGE: {
        jb_no_kwargs(r, "range", kw);
        if (args->n < 1 || args->n > 3)
            jz_fail(z, "TypeError", "range expected at %s 3 arguments, got %zu", args->n < 1 ? "least 1" : "most", args->n);
        int64_t a = 0, b, st = 1;
        if (args->n == 1) b = jb_want_int(r, args->v[0], "");
        else {
            a = jb_want_int(r, args->v[0], "");
            b = jb_want_int(r, args->v[1], "");
            if (args->n == 3) st = jb_want_int(r, args->v[2], "");
        }
        if (st == 0) jz_fail(z, "ValueError", "range() arg 3 must not be zero");
        int64_t count = 0;
        if (st > 0 && b > a) count = (b - a + st - 1) / st;
        else if (st < 0 && b < a) count = (a - b - st - 1) / -st;
        if (count > 100000)
            jz_fail(z, "OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        jlist *l = jl_new(z, (size_t)count);
        for (int64_t i = 0; i < count; i++) l->v[l->n++] = jv_int(a + i * st);
        l->view = JL_RANGE;
        l->r_start = a;
        l->r_stop = b;
        l->r_step = st;
        return jv_of_list(l);
    }
    case G_DICT:
    case G_NAMESPACE: {
        jdict *d = jd_new(z, kw->n);
        if (args->n > 1)
            jz_fail(z, "TypeError", "%s expected at most 1 argument, got %zu", id == G_DICT ? "dict" : "Namespace", args->n);
        if (args->n == 1) {
            const jv src = args->v[0];
            if (src.k == JV_DICT || src.k == JV_NS) {
                for (size_t i = 0; i < src.d->n; i++) jd_set(z, d, src.d->keys[i], src.d->vals[i]);
            } else {
                const jlist *l = jv_iter_list(z, src);
                for (size_t i = 0; i < l->n; i++) {
                    const jlist *pair = jv_iter_list(z, l->v[i]);
                    if (pair->n != 2)
                        jz_fail(z, "ValueError", "dictionary update sequence element #%zu has length %zu; 2 is required", i, pair->n);
                    jd_set(z, d, pair->v[0], pair->v[1]);
                }
            }
        }
        for (size_t i = 0; i < kw->n; i++) jd_set(z, d, kw->keys[i], kw->vals[i]);
        return (jv){.k = id == G_DICT ? JV_DICT : JV_NS, .d = d};
    }
    case G_CYCLER: {
        jb_no_kwargs(r, "Cycler", kw);
        if (args->n == 0) jz_fail(z, "RuntimeError", "at least one item has to be provided");
        jobj *o = jz_alloc(z, sizeof *o);
        o->items = jl_new(z, args->n);
        for (size_t i = 0; i < args->n; i++) jl_push(z, o->items, args->v[i]);
        return (jv){.k = JV_CYCLER, .o = o};
    }
    case G_JOINER: {
        static const char *const P[] = {"sep"};
        jv a[1];
        bool g[1];
        jb_bind(r, "Joiner", P, 1, 0, 0, args, kw, a, g);
        jobj *o = jz_alloc(z, sizeof *o);
        o->sep = g[0] ? jb_soft_str(r, a[0]) : js_cstr(z, ", ");
        return (jv){.k = JV_JOINER, .o = o};
    }
    case G_LIPSUM: jz_unsupported(z, "lipsum() (random text)");
    case G_RAISE: {
        static const char *const P[] = {"message"};
        jv a[1];
        bool g[1];
        jb_bind(r, "raise_exception", P, 1, 1, 0, args, kw, a, g);
        jz_fail(z, "TemplateError", "%s", jb_soft_str(r, a[0])->p);
    }
    case G_STRFTIME: {
        static const char *const P[] = {"format"};
        jv a[1];
        bool g[1];
        jb_bind(r, "strftime_now", P, 1, 1, 0, args, kw, a, g);
        const jstr *fmt = jb_want_str(r, a[0], "strftime() argument 1 must be str");
        struct tm tm;
        if (r->has_now) {
            tm = r->now;
        } else {
            const time_t now = time(NULL);
            localtime_r(&now, &tm);
        }
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        format_time(r, fmt, &tm, &b);
        return jv_str(z, b.p, b.len);
    }
    default: break;
    }
    jz_fail(z, "RuntimeError", "unknown global %d", id);
}

jv jb_call(jrender *r, jfunc *fn, jlist *args, jdict *kw) {
    jz *z = &r->z;
    if (fn->id < G_COUNT_) return call_global(r, fn->id, args, kw);
    if (fn->id == UNSUPPORTED_METHOD) jz_unsupported(z, "the method %s.%s()", jv_type_name(fn->self), fn->name);
    if (fn->id >= S_CAPITALIZE && fn->id <= S_ZFILL) return jb_call_str(r, fn, args, kw);
    const jv self = fn->self;
    switch (fn->id) {
    case D_GET: {
        jb_no_kwargs(r, "get", kw);
        jb_nargs(r, "get", args, 1, 2);
        jv out;
        if (jd_get(z, self.d, args->v[0], &out)) return out;
        return args->n > 1 ? args->v[1] : JV_NONE_V;
    }
    case D_ITEMS:
    case D_KEYS:
    case D_VALUES: {
        jb_no_kwargs(r, fn->name, kw);
        jb_nargs(r, fn->name, args, 0, 0);
        jlist *l = jl_new(z, self.d->n);
        for (size_t i = 0; i < self.d->n; i++)
            l->v[l->n++] = fn->id == D_KEYS ? self.d->keys[i] : fn->id == D_VALUES ? self.d->vals[i]
                         : jv_tuple2(z, self.d->keys[i], self.d->vals[i]);
        l->view = fn->id == D_KEYS ? JL_KEYS : fn->id == D_VALUES ? JL_VALUES : JL_ITEMS;
        return jv_of_list(l);
    }
    case D_COPY: {
        jb_nargs(r, "copy", args, 0, 0);
        jdict *d = jd_new(z, self.d->n);
        for (size_t i = 0; i < self.d->n; i++) jd_set(z, d, self.d->keys[i], self.d->vals[i]);
        return jv_of_dict(d);
    }
    case L_COPY: {
        jb_nargs(r, "copy", args, 0, 0);
        jlist *l = jl_new(z, self.l->n);
        for (size_t i = 0; i < self.l->n; i++) jl_push(z, l, self.l->v[i]);
        return jv_of_list(l);
    }
    case L_COUNT: {
        jb_no_kwargs(r, "count", kw);
        jb_nargs(r, "count", args, 1, 1);
        int64_t c = 0;
        for (size_t i = 0; i < self.l->n; i++) c += jv_eq(z, self.l->v[i], args->v[0]);
        return jv_int(c);
    }
    case L_INDEX: {
        jb_no_kwargs(r, "index", kw);
        jb_nargs(r, "index", args, 1, 3);
        for (size_t i = 0; i < self.l->n; i++)
            if (jv_eq(z, self.l->v[i], args->v[0])) return jv_int((int64_t)i);
        jbuf b = {0};
        jv_write_repr(z, &b, args->v[0]);
        if (self.k == JV_TUPLE) jz_fail(z, "ValueError", "tuple.index(x): x not in tuple");
        jz_fail(z, "ValueError", "%s is not in list", b.p);
    }
    case O_LOOP_CYCLE: {
        jb_no_kwargs(r, "cycle", kw);
        if (!args->n) jz_fail(z, "TypeError", "no items for cycling given");
        return args->v[self.loop->index0 % args->n];
    }
    case O_LOOP_CHANGED: {
        jloop *l = self.loop;
        const jv now = jv_of_tuple(args);
        if (!l->has_changed || !jv_eq(z, l->last_changed, now)) {
            l->has_changed = true;
            l->last_changed = now;
            return jv_bool(true);
        }
        return jv_bool(false);
    }
    case O_CYCLER_NEXT: {
        jobj *o = self.o;
        const jv v = o->items->v[o->pos];
        o->pos = (o->pos + 1) % o->items->n;
        return v;
    }
    case O_CYCLER_RESET: self.o->pos = 0; return JV_NONE_V;
    default: break;
    }
    jz_unsupported(z, "calling %s", fn->name);
}
