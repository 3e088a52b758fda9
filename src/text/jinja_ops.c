/*
 * Python's operators for the template engine (+ - * / // % ** with Python's int/float rules and
 * its TypeError texts, str % args, `in`), and the sandbox's attribute, item and slice access:
 * x.name tries Python's attribute first (dict.items, str.upper ...) and then the item, x[k] the
 * other way round; mutating methods are unsafe; a slice is Python's own (errors and all).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

/* ---- arithmetic (Python's) -------------------------------------------------------------------- */

static _Noreturn void overflow(jrender *r) {
    jz_unsupported(&r->z, "integer arithmetic beyond 64 bits (Python's integers are unbounded)");
}

static _Noreturn void bad_operands(jrender *r, const char *op, jv a, jv b) {
    if (a.k == JV_UNDEF) jv_fail_undefined(&r->z, a);
    if (b.k == JV_UNDEF) jv_fail_undefined(&r->z, b);
    jz_fail(&r->z, "TypeError", "unsupported operand type(s) for %s: '%s' and '%s'", op,
            jv_type_name(a), jv_type_name(b));
}

static int64_t as_int(jv v) { return v.k == JV_BOOL ? (int64_t)v.b : v.i; }
static double as_float(jv v) { return v.k == JV_FLOAT ? v.f : (double)as_int(v); }

static jv concat_seq(jrender *r, jv a, jv b) {
    jlist *l = jl_new(&r->z, a.l->n + b.l->n);
    if (a.l->n) memcpy(l->v, a.l->v, a.l->n * sizeof(jv));
    if (b.l->n) memcpy(l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
    l->n = a.l->n + b.l->n;
    return (jv){.k = a.k, .l = l};
}

static jv repeat(jrender *r, jv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.k == JV_STR) {
        if (times && seq.s->len > (256u << 20) / (uint64_t)times) jz_oom(&r->z);
        jbuf b = {0};
        jb_put(&r->z, &b, "", 0);
        for (int64_t i = 0; i < times; i++) jb_put(&r->z, &b, seq.s->p, seq.s->len);
        return jv_str(&r->z, b.p, b.len);
    }
    if (times && seq.l->n > (16u << 20) / (uint64_t)times) jz_oom(&r->z);
    jlist *l = jl_new(&r->z, seq.l->n * (size_t)times);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++) l->v[l->n++] = seq.l->v[k];
    return (jv){.k = seq.k, .l = l};
}

static bool plain_seq(jv v) { return jv_is_seq(v) && v.l->view == JL_PLAIN; }

static jv py_add(jrender *r, jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.k == JV_FLOAT || b.k == JV_FLOAT) return jv_float(as_float(a) + as_float(b));
        int64_t s;
        if (__builtin_add_overflow(as_int(a), as_int(b), &s)) overflow(r);
        return jv_int(s);
    }
    if (a.k == JV_UNDEF) jv_fail_undefined(&r->z, a);
    if (b.k == JV_UNDEF) jv_fail_undefined(&r->z, b);
    if (a.k == JV_STR) {
        if (b.k != JV_STR)
            jz_fail(&r->z, "TypeError", "can only concatenate str (not \"%s\") to str", jv_type_name(b));
        jbuf o = {0};
        jb_put(&r->z, &o, a.s->p, a.s->len);
        jb_put(&r->z, &o, b.s->p, b.s->len);
        jstr *s = jz_alloc(&r->z, sizeof(jstr) + o.len + 1);
        s->len = o.len;
        s->ncp = a.s->ncp + b.s->ncp;
        memcpy(s->p, o.p, o.len);
        return jv_of_str(s);
    }
    if (plain_seq(a)) {
        if (b.k != a.k || !plain_seq(b))
            jz_fail(&r->z, "TypeError", "can only concatenate %s (not \"%s\") to %s", jv_type_name(a),
                    jv_type_name(b), jv_type_name(a));
        return concat_seq(r, a, b);
    }
    bad_operands(r, "+", a, b);
}

static jv py_sub(jrender *r, jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.k == JV_FLOAT || b.k == JV_FLOAT) return jv_float(as_float(a) - as_float(b));
        int64_t s;
        if (__builtin_sub_overflow(as_int(a), as_int(b), &s)) overflow(r);
        return jv_int(s);
    }
    bad_operands(r, "-", a, b);
}

static jv py_mul(jrender *r, jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.k == JV_FLOAT || b.k == JV_FLOAT) return jv_float(as_float(a) * as_float(b));
        int64_t s;
        if (__builtin_mul_overflow(as_int(a), as_int(b), &s)) overflow(r);
        return jv_int(s);
    }
    if (a.k == JV_UNDEF) jv_fail_undefined(&r->z, a);
    if (b.k == JV_UNDEF) jv_fail_undefined(&r->z, b);
    const bool sa = a.k == JV_STR || plain_seq(a), sb = b.k == JV_STR || plain_seq(b);
    if (sa || sb) {
        const jv seq = sa ? a : b, times = sa ? b : a;
        if (times.k == JV_INT || times.k == JV_BOOL) return repeat(r, seq, as_int(times));
        jz_fail(&r->z, "TypeError", "can't multiply sequence by non-int of type '%s'", jv_type_name(times));
    }
    bad_operands(r, "*", a, b);
}

static jv py_truediv(jrender *r, jv a, jv b) {
    if (!jv_is_num(a) || !jv_is_num(b)) bad_operands(r, "/", a, b);
    const double y = as_float(b);
    if (y == 0)
        jz_fail(&r->z, "ZeroDivisionError", "%s",
                a.k == JV_FLOAT || b.k == JV_FLOAT ? "float division by zero" : "division by zero");
    return jv_float(as_float(a) / y);
}

/* Python's float divmod */
static void fdivmod(double vx, double wx, double *fdiv, double *fmod_) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod != 0) {
        if ((wx < 0) != (mod < 0)) {
            mod += wx;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, wx);
    }
    double floordiv;
    if (div != 0) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, vx / wx);
    }
    *fdiv = floordiv;
    *fmod_ = mod;
}

static jv py_floordiv(jrender *r, jv a, jv b, bool want_mod) {
    if (!jv_is_num(a) || !jv_is_num(b)) bad_operands(r, want_mod ? "%" : "//", a, b);
    if (a.k == JV_FLOAT || b.k == JV_FLOAT) {
        const double y = as_float(b);
        if (y == 0)
            jz_fail(&r->z, "ZeroDivisionError", "%s", want_mod ? "float modulo" : "float floor division by zero");
        double d, m;
        fdivmod(as_float(a), y, &d, &m);
        return jv_float(want_mod ? m : d);
    }
    const int64_t x = as_int(a), y = as_int(b);
    if (y == 0)
        jz_fail(&r->z, "ZeroDivisionError", "%s",
                want_mod ? "integer modulo by zero" : "integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) {
        if (want_mod) return jv_int(0);
        overflow(r);
    }
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
        m += y;
        q -= 1;
    }
    return jv_int(want_mod ? m : q);
}

static jv py_pow(jrender *r, jv a, jv b) {
    if (!jv_is_num(a) || !jv_is_num(b)) bad_operands(r, "** or pow()", a, b);
    if (a.k != JV_FLOAT && b.k != JV_FLOAT) {
        int64_t base = as_int(a), e = as_int(b);
        if (e < 0) {
            if (base == 0) jz_fail(&r->z, "ZeroDivisionError", "0.0 cannot be raised to a negative power");
            return jv_float(pow((double)base, (double)e));
        }
        int64_t res = 1;
        while (e > 0) {
            if (e & 1)
                if (__builtin_mul_overflow(res, base, &res)) overflow(r);
            e >>= 1;
            if (e && __builtin_mul_overflow(base, base, &base)) overflow(r);
        }
        return jv_int(res);
    }
    const double x = as_float(a), y = as_float(b);
    if (x == 0 && y < 0) jz_fail(&r->z, "ZeroDivisionError", "0.0 cannot be raised to a negative power");
    if (x < 0 && y != floor(y)) jz_unsupported(&r->z, "a negative number raised to a fractional power (a complex number)");
    return jv_float(pow(x, y));
}

/* printf-style str % args, the common conversions */
static jv str_format(jrender *r, jstr *fmt, jv args) {
    jz *z = &r->z;
    jlist *list = NULL;
    jdict *map = NULL;
    /* Python treats a right side with __getitem__ (dict, list, Undefined, range) that is not a
     * tuple or str as a mapping: then unused arguments are no error */
    const bool mapping_like = args.k == JV_DICT || args.k == JV_UNDEF ||
                              (args.k == JV_LIST && (args.l->view == JL_PLAIN || args.l->view == JL_RANGE));
    if (args.k == JV_TUPLE) list = args.l;
    else if (args.k == JV_DICT) map = args.d;
    size_t ai = 0;
    bool single_used = false;
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    const char *s = fmt->p;
    const size_t n = fmt->len;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            jb_putc(z, &b, s[i]);
            continue;
        }
        if (++i >= n) jz_fail(z, "ValueError", "incomplete format");
        jv arg = JV_NONE_V;
        if (s[i] == '(') {
            const size_t start = ++i;
            while (i < n && s[i] != ')') i++;
            if (i >= n) jz_fail(z, "ValueError", "incomplete format key");
            const jv key = jv_str(z, s + start, i - start);
            if (args.k == JV_UNDEF) jv_fail_undefined(z, args);
            if (!map) {
                if (args.k == JV_LIST) jz_fail(z, "TypeError", "list indices must be integers or slices, not str");
                jz_fail(z, "TypeError", "format requires a mapping");
            }
            if (!jd_get(z, map, key, &arg)) {
                jbuf k = {0};
                jv_write_repr(z, &k, key);
                jz_fail(z, "KeyError", "%s", k.p);
            }
            i++;
        }
        char flags[8] = {0};
        int nf = 0;
        while (i < n && strchr("-+ 0#", s[i]) && nf < 7) flags[nf++] = s[i++];
        int width = -1, prec = -1;
        if (i < n && s[i] >= '0' && s[i] <= '9') {
            width = 0;
            while (i < n && s[i] >= '0' && s[i] <= '9') width = width * 10 + (s[i++] - '0');
        }
        if (i < n && s[i] == '.') {
            prec = 0;
            i++;
            while (i < n && s[i] >= '0' && s[i] <= '9') prec = prec * 10 + (s[i++] - '0');
        }
        if (i >= n) jz_fail(z, "ValueError", "incomplete format");
        const char conv = s[i];
        if (conv == '%') {
            jb_putc(z, &b, '%');
            continue;
        }
        if (s[i - 1] != ')' || !map) {
            if (map) {
                arg = args;
            } else if (list) {
                if (ai >= list->n) jz_fail(z, "TypeError", "not enough arguments for format string");
                arg = list->v[ai++];
            } else {
                if (single_used) jz_fail(z, "TypeError", "not enough arguments for format string");
                arg = args;
                single_used = true;
            }
        }
        jbuf piece = {0};
        jb_put(z, &piece, "", 0);
        if (conv == 's' || conv == 'r') {
            if (conv == 's') jv_write_str(z, &piece, arg);
            else jv_write_repr(z, &piece, arg);
            if (prec >= 0) {
                jstr *ps = js_new(z, piece.p, piece.len);
                if ((size_t)prec < ps->ncp) piece.len = js_offset(ps, (size_t)prec);
            }
        } else if (strchr("dif", conv) && jv_is_num(arg)) {
            char num[400];
            if (conv == 'f') {
                const double d = as_float(arg);
                if (!isfinite(d)) snprintf(num, sizeof num, "%s", isnan(d) ? "nan" : d < 0 ? "-inf" : "inf");
                else snprintf(num, sizeof num, "%.*f", prec < 0 ? 6 : prec > 300 ? 300 : prec, d);
            } else {
                snprintf(num, sizeof num, "%" PRId64, arg.k == JV_FLOAT ? (int64_t)arg.f : as_int(arg));
            }
            const bool neg = num[0] == '-';
            const char *digits = num + neg;
            const char *sign = neg ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
            jb_puts(z, &piece, sign);
            if (strchr(flags, '0') && !strchr(flags, '-'))
                for (int k = (int)(strlen(sign) + strlen(digits)); k < width; k++) jb_putc(z, &piece, '0');
            jb_puts(z, &piece, digits);
        } else if (strchr("dif", conv)) {
            jz_fail(z, "TypeError", "%%%c format: a real number is required, not %s", conv, jv_type_name(arg));
        } else {
            jz_unsupported(z, "the %%%c conversion of the %% operator", conv);
        }
        const size_t len = ju_count(piece.p, piece.len);
        const bool left = strchr(flags, '-') != NULL;
        if (!left)
            for (int k = (int)len; k < width; k++) jb_putc(z, &b, ' ');
        jb_put(z, &b, piece.p, piece.len);
        if (left)
            for (int k = (int)len; k < width; k++) jb_putc(z, &b, ' ');
    }
    if ((list && ai < list->n) || (!list && !mapping_like && !single_used))
        jz_fail(z, "TypeError", "not all arguments converted during string formatting");
    return jv_str(z, b.p, b.len);
}

static bool is_view(jv v) { return v.k == JV_LIST && (v.l->view == JL_KEYS || v.l->view == JL_ITEMS); }

jv jr_binop(jrender *r, jop op, jv a, jv b) {
    if ((is_view(a) || is_view(b)) && op != JOP_MOD && op != JOP_POW && a.k != JV_UNDEF && b.k != JV_UNDEF)
        jz_unsupported(&r->z, "set operations on dict views (keys(), items())");
    switch (op) {
    case JOP_ADD: return py_add(r, a, b);
    case JOP_SUB: return py_sub(r, a, b);
    case JOP_MUL: return py_mul(r, a, b);
    case JOP_DIV: return py_truediv(r, a, b);
    case JOP_FLOORDIV: return py_floordiv(r, a, b, false);
    case JOP_MOD:
        if (a.k == JV_STR) return str_format(r, a.s, b);
        return py_floordiv(r, a, b, true);
    case JOP_POW: return py_pow(r, a, b);
    default: break;
    }
    jz_fail(&r->z, "RuntimeError", "bad operator");
}

static bool contains(jrender *r, jv needle, jv hay) {
    jz *z = &r->z;
    switch ((jv_kind)hay.k) {
    case JV_STR:
        if (needle.k != JV_STR)
            jz_fail(z, "TypeError", "'in <string>' requires string as left operand, not %s", jv_type_name(needle));
        if (needle.s->len == 0) return true;
        return memmem(hay.s->p, hay.s->len, needle.s->p, needle.s->len) != NULL;
    case JV_LIST:
    case JV_TUPLE:
        if (hay.l->view == JL_ITEMS) {
            /* dict_items holds (key, value) pairs only; the key is looked up, so hashed */
            if (needle.k != JV_TUPLE || needle.l->n != 2) return false;
            jv_check_hashable(z, needle.l->v[0]);
        } else if (hay.l->view == JL_KEYS) {
            jv_check_hashable(z, needle);
        }
        for (size_t i = 0; i < hay.l->n; i++)
            if (jv_eq(z, hay.l->v[i], needle)) return true;
        return false;
    case JV_DICT: return jd_get(z, hay.d, needle, NULL);
    case JV_UNDEF: return false;
    case JV_GEN: {
        jv x;
        while (jg_next(z, hay.g, &x))
            if (jv_eq(z, x, needle)) return true;
        return false;
    }
    default:
        jz_fail(z, "TypeError", "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

/* ---- attribute and item access (the sandbox's getattr / getitem) ------------------------------ */

static jv unsafe_attr(jrender *r, jv obj, const jstr *name) {
    jbuf b = {0};
    jb_printf(&r->z, &b, "access to attribute '%s' of '%s' object is unsafe.", name->p, jv_type_name(obj));
    jv u = jv_undef_hint(&r->z, b.p);
    u.u->security = true;
    return u;
}

jv jr_getattr(jrender *r, jv obj, jstr *name) {
    jz *z = &r->z;
    if (obj.k == JV_UNDEF) jv_fail_undefined(z, obj);
    if (name->len >= 2 && name->p[0] == '_' && name->p[1] == '_') return unsafe_attr(r, obj, name);
    jv out;
    if (jb_attr(r, obj, name, &out)) return out;
    if (obj.k == JV_DICT) {
        if (jd_getc(obj.d, name->p, &out) && name->len == strlen(name->p)) return out;
        if (jd_get(z, obj.d, jv_of_str(name), &out)) return out;
    }
    return jv_undef_attr(z, obj, jv_of_str(name));
}

static bool index_of(jrender *r, jv key, size_t n, size_t *out) {
    (void)r;
    if (key.k != JV_INT && key.k != JV_BOOL) return false;
    int64_t i = as_int(key);
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

jv jr_getitem(jrender *r, jv obj, jv key) {
    jz *z = &r->z;
    if (obj.k == JV_UNDEF) jv_fail_undefined(z, obj);
    if (key.k == JV_UNDEF && (obj.k == JV_DICT || jv_is_seq(obj) || obj.k == JV_STR))
        jv_fail_undefined(z, key); /* hashing or indexing with an Undefined raises */
    size_t i;
    jv out;
    switch ((jv_kind)obj.k) {
    case JV_DICT:
        if (key.k != JV_LIST && key.k != JV_DICT) {
            bool hashable = true;
            if (key.k == JV_TUPLE)
                for (size_t k = 0; k < key.l->n; k++)
                    hashable &= key.l->v[k].k != JV_LIST && key.l->v[k].k != JV_DICT;
            if (hashable && jd_get(z, obj.d, key, &out)) return out;
        }
        break;
    case JV_LIST:
    case JV_TUPLE:
        if (obj.l->view != JL_PLAIN && obj.l->view != JL_RANGE) break; /* views: not subscriptable */
        if (index_of(r, key, obj.l->n, &i)) return obj.l->v[i];
        break;
    case JV_STR:
        if (index_of(r, key, obj.s->ncp, &i)) {
            const size_t a = js_offset(obj.s, i);
            size_t b = a;
            ju_next(obj.s->p, obj.s->len, &b);
            return jv_str(z, obj.s->p + a, b - a);
        }
        break;
    default: break;
    }
    if (key.k == JV_STR && jb_attr(r, obj, key.s, &out)) {
        if (key.s->len >= 2 && key.s->p[0] == '_' && key.s->p[1] == '_') return unsafe_attr(r, obj, key.s);
        return out;
    }
    return jv_undef_attr(z, obj, key);
}

static bool slice_index(jrender *r, jv v, int64_t *out) {
    if (v.k == JV_NONE) return false;
    if (v.k == JV_UNDEF) jv_fail_undefined(&r->z, v);
    if (v.k != JV_INT && v.k != JV_BOOL)
        jz_fail(&r->z, "TypeError", "slice indices must be integers or None or have an __index__ method");
    *out = as_int(v);
    return true;
}

jv jr_slice(jrender *r, jv obj, jv start, jv stop, jv step) {
    jz *z = &r->z;
    if (obj.k == JV_UNDEF) jv_fail_undefined(z, obj);
    /* jinja2 compiles a slice to Python's obj[a:b:c], not the sandbox's getitem: Python's errors */
    size_t len;
    if (obj.k == JV_STR) len = obj.s->ncp;
    else if (jv_is_seq(obj) && (obj.l->view == JL_PLAIN || obj.l->view == JL_RANGE)) len = obj.l->n;
    else if (r->folding) {
        /* jinja2's optimizer folds a constant subscript through the sandbox's getitem, which
         * turns the TypeError into an Undefined */
        jbuf b = {0};
        jb_puts(z, &b, "slice(");
        jv_write_repr(z, &b, start);
        jb_puts(z, &b, ", ");
        jv_write_repr(z, &b, stop);
        jb_puts(z, &b, ", ");
        jv_write_repr(z, &b, step);
        jb_puts(z, &b, ")");
        jbuf m = {0};
        jb_printf(z, &m, "%s has no element %s", jv_type_repr(z, obj), b.p);
        return jv_undef_hint(z, m.p);
    } else if (obj.k == JV_DICT) jz_fail(z, "TypeError", "unhashable type: 'slice'");
    else jz_fail(z, "TypeError", "'%s' object is not subscriptable", obj.k == JV_GEN ? "generator" : jv_type_name(obj));
    int64_t st = 1, a, b;
    if (slice_index(r, step, &st) && st == 0) jz_fail(z, "ValueError", "slice step cannot be zero");
    const int64_t n = (int64_t)len;
    const int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? n : n - 1;
    if (!slice_index(r, start, &a)) a = st < 0 ? upper : lower;
    else if (a < 0) a = a + n < lower ? lower : a + n;
    else if (a > upper) a = upper;
    if (!slice_index(r, stop, &b)) b = st < 0 ? lower : upper;
    else if (b < 0) b = b + n < lower ? lower : b + n;
    else if (b > upper) b = upper;
    if (obj.k == JV_STR) {
        jbuf o = {0};
        jb_put(z, &o, "", 0);
        if (obj.s->ncp == obj.s->len) {
            for (int64_t i = a; st > 0 ? i < b : i > b; i += st) jb_putc(z, &o, obj.s->p[i]);
        } else {
            /* code point offsets once, then pick */
            size_t *off = jz_alloc(z, (len + 1) * sizeof *off);
            size_t k = 0, p = 0;
            while (p < obj.s->len) {
                off[k++] = p;
                ju_next(obj.s->p, obj.s->len, &p);
            }
            off[k] = p;
            for (int64_t i = a; st > 0 ? i < b : i > b; i += st)
                jb_put(z, &o, obj.s->p + off[i], off[i + 1] - off[i]);
        }
        return jv_str(z, o.p, o.len);
    }
    jlist *l = jl_new(z, 0);
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st) jl_push(z, l, obj.l->v[i]);
    if (obj.l->view == JL_RANGE) { /* a slice of a range is a range */
        l->view = JL_RANGE;
        l->r_step = obj.l->r_step * st;
        l->r_start = obj.l->r_start + a * obj.l->r_step;
        l->r_stop = obj.l->r_start + (st > 0 ? (a < b ? a + ((b - a + st - 1) / st) * st : a)
                                             : (a > b ? a - ((a - b - st - 1) / -st) * -st : a)) * obj.l->r_step;
        if (l->n == 0) l->r_stop = l->r_start;
    }
    return (jv){.k = obj.k, .l = l};
}

jv jr_unary(jrender *r, bool neg, jv v) {
    jz *z = &r->z;
    if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
    if (!jv_is_num(v)) jz_fail(z, "TypeError", "bad operand type for unary %c: '%s'", neg ? '-' : '+', jv_type_name(v));
    if (!neg) return v.k == JV_BOOL ? jv_int(v.b) : v;
    if (v.k == JV_FLOAT) return jv_float(-v.f);
    if (as_int(v) == INT64_MIN) overflow(r);
    return jv_int(-as_int(v));
}

/* the operators, for the builtins (sum, the odd/even tests, the in test) */
jv jb_add(jrender *r, jv a, jv b) { return py_add(r, a, b); }
jv jb_mod(jrender *r, jv a, jv b) { return jr_binop(r, JOP_MOD, a, b); }
bool jb_in(jrender *r, jv needle, jv hay) { return contains(r, needle, hay); }
