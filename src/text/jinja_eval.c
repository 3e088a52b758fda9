/*
 * The template interpreter: walks the AST with jinja2's scoping and Python's operators.
 *
 * Scopes follow the code jinja2 generates: the template body is one frame; every loop iteration,
 * macro call, {% with %}, {% filter %}, {% set %}...{% endset %} and call-block body gets a new
 * frame whose reads fall through to the enclosing one (so a {% set %} inside a loop is gone in the
 * next iteration and after the loop; namespace() attributes are how templates carry state out).
 * A macro's frame falls through to the frame it was defined in, as it is when the macro runs
 * (Python closures). Names found in no frame are the render variables, then the globals.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

enum { X_NORMAL = 0, X_BREAK, X_CONTINUE };

static int exec_body(jrender *r, jframe *f, const jnodes *body, jbuf *out);
static jv eval(jrender *r, jframe *f, const jnode *n);

static void step(jrender *r, const jnode *n) {
    r->z.line = n->line;
    if (++r->z.steps > r->z.step_limit)
        jz_fail(&r->z, "ResourceLimit", "the template ran more than %" PRIu64 " evaluation steps",
                r->z.step_limit);
}

/* ---- frames ----------------------------------------------------------------------------------- */

/* what a "missing" name holds in its frame (see jscope) */
static jundef k_missing;

static void frame_set(jrender *r, jframe *f, int sym, jv v);

static void frame_enter(jrender *r, jframe *f, const jscope *sc) {
    for (size_t i = 0; sc && i < sc->n; i++) frame_set(r, f, sc->missing[i], (jv){.k = JV_UNDEF, .u = &k_missing});
}

static jframe *frame_new(jrender *r, jframe *parent, const jscope *sc) {
    jframe *f = jz_alloc(&r->z, sizeof *f);
    f->parent = parent;
    frame_enter(r, f, sc);
    return f;
}

static void frame_set(jrender *r, jframe *f, int sym, jv v) {
    for (size_t i = 0; i < f->n; i++) {
        if (f->syms[i] == sym) {
            f->vals[i] = v;
            return;
        }
    }
    if (f->n == f->cap) {
        const size_t cap = f->cap ? f->cap * 2 : 4;
        f->syms = jz_grow(&r->z, f->syms, f->cap * sizeof *f->syms, cap * sizeof *f->syms);
        f->vals = jz_grow(&r->z, f->vals, f->cap * sizeof *f->vals, cap * sizeof *f->vals);
        f->cap = cap;
    }
    f->syms[f->n] = sym;
    f->vals[f->n] = v;
    f->n++;
}

static jv lookup(jrender *r, const jframe *f, int sym) {
    for (; f; f = f->parent)
        for (size_t i = 0; i < f->n; i++)
            if (f->syms[i] == sym) {
                if (f->vals[i].k == JV_UNDEF && f->vals[i].u == &k_missing)
                    return jv_undef_named(&r->z, r->t->syms[sym].name->p);
                return f->vals[i];
            }
    if (r->root_ok[sym]) return r->root[sym];
    return jv_undef_named(&r->z, r->t->syms[sym].name->p);
}

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

static jv binop(jrender *r, jop op, jv a, jv b) {
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
        if (hay.l->view == JL_KEYS || hay.l->view == JL_ITEMS) jv_check_hashable(z, needle);
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

/* ---- calls ------------------------------------------------------------------------------------ */

static jv call_macro(jrender *r, const jmacro *m, jlist *args, jdict *kw);
static jv call_loop(jrender *r, jloop *loop, jlist *args, jdict *kw);

jv jr_call(jrender *r, jv fn, jlist *args, jdict *kw) {
    switch ((jv_kind)fn.k) {
    case JV_UNDEF: jv_fail_undefined(&r->z, fn);
    case JV_MACRO: return call_macro(r, fn.m, args, kw);
    case JV_FUNC: return jb_call(r, fn.fn, args, kw);
    case JV_LOOP: return call_loop(r, fn.loop, args, kw);
    case JV_JOINER:
        if (args->n || kw->n) jz_fail(&r->z, "TypeError", "Joiner.__call__() takes 1 positional argument but %zu were given", args->n + 1);
        if (!fn.o->used) {
            fn.o->used = true;
            return jv_of_str(&js_empty);
        }
        return jv_of_str(fn.o->sep);
    default: jz_fail(&r->z, "TypeError", "'%s' object is not callable", jv_type_name(fn));
    }
}

static void eval_args(jrender *r, jframe *f, const jargs *a, jlist **pos, jdict **kw) {
    jz *z = &r->z;
    *pos = jl_new(z, a->pos.n);
    *kw = jd_new(z, a->nkw);
    for (size_t i = 0; i < a->pos.n; i++) jl_push(z, *pos, eval(r, f, a->pos.v[i]));
    for (size_t i = 0; i < a->nkw; i++) jd_set(z, *kw, jv_of_str(a->kw[i].name), eval(r, f, a->kw[i].value));
    if (a->star) {
        const jv s = eval(r, f, a->star);
        const jlist *l = jv_iter_list(z, s);
        for (size_t i = 0; i < l->n; i++) jl_push(z, *pos, l->v[i]);
    }
    if (a->dstar) {
        const jv d = eval(r, f, a->dstar);
        if (d.k != JV_DICT) jz_fail(z, "TypeError", "argument after ** must be a mapping, not %s", jv_type_name(d));
        for (size_t i = 0; i < d.d->n; i++) {
            if (d.d->keys[i].k != JV_STR) jz_fail(z, "TypeError", "keywords must be strings");
            jd_set(z, *kw, d.d->keys[i], d.d->vals[i]);
        }
    }
}

static jv kw_pop(jrender *r, jdict *kw, jstr *name, bool *found) {
    for (size_t i = 0; i < kw->n; i++) {
        if (kw->keys[i].k == JV_STR && js_eq(kw->keys[i].s, name)) {
            const jv v = kw->vals[i];
            memmove(kw->keys + i, kw->keys + i + 1, (kw->n - i - 1) * sizeof(jv));
            memmove(kw->vals + i, kw->vals + i + 1, (kw->n - i - 1) * sizeof(jv));
            kw->n--;
            *found = true;
            return v;
        }
    }
    (void)r;
    *found = false;
    return JV_UNDEF_V;
}

static jv call_macro(jrender *r, const jmacro *m, jlist *args, jdict *kw) {
    jz *z = &r->z;
    const jnode *mn = m->node;
    const size_t np = mn->macro.nparams;
    const char *mname = mn->macro.name->p;
    if (++z->depth > 100) jz_fail(z, "RecursionError", "maximum recursion depth exceeded (macro calls nested more than 100 deep)");
    jframe *f = frame_new(r, m->closure, &m->scope_node->sc);
    jv *vals = jz_alloc(z, (np + 1) * sizeof(jv));
    bool *given = jz_alloc(z, np + 1);
    size_t npos = args->n < np ? args->n : np;
    for (size_t i = 0; i < npos; i++) {
        vals[i] = args->v[i];
        given[i] = true;
    }
    bool found_caller = false, explicit_caller = false;
    int caller_sym = -1;
    for (size_t i = 0; i < r->t->nsyms; i++)
        if (js_eqc(r->t->syms[i].name, "caller")) caller_sym = (int)i;
    for (size_t i = 0; i < np; i++) explicit_caller |= mn->macro.params[i] == caller_sym;
    if (npos != np) {
        for (size_t i = npos; i < np; i++) {
            bool found;
            const jv v = kw_pop(r, kw, r->t->syms[mn->macro.params[i]].name, &found);
            if (found) vals[i] = v, given[i] = true;
            if (mn->macro.params[i] == caller_sym) found_caller = true;
        }
    } else {
        found_caller = explicit_caller;
    }
    jv caller = JV_UNDEF_V;
    const bool wants_caller = mn->macro.uses_caller && !found_caller;
    if (wants_caller) {
        bool found;
        caller = kw_pop(r, kw, js_cstr(z, "caller"), &found);
        if (!found || caller.k == JV_NONE) caller = jv_undef_hint(z, "No caller defined");
    }
    if (mn->macro.uses_kwargs) {
        /* kwargs: what is left */
    } else if (kw->n) {
        if (jd_getc(kw, "caller", NULL))
            jz_fail(z, "TypeError", "macro '%s' was invoked with two values for the special caller argument. This is most likely a bug.", mname);
        jbuf b = {0};
        jv_write_repr(z, &b, kw->keys[0]);
        jz_fail(z, "TypeError", "macro '%s' takes no keyword argument %s", mname, b.p);
    }
    if (!mn->macro.uses_varargs && args->n > np)
        jz_fail(z, "TypeError", "macro '%s' takes not more than %zu argument(s)", mname, np);
    /* bind in order; defaults are evaluated in the macro's frame at call time */
    const size_t first_default = np - mn->macro.ndefaults;
    for (size_t i = 0; i < np; i++) {
        jv v = vals[i];
        if (!given[i]) {
            if (i >= first_default) {
                v = eval(r, f, mn->macro.defaults[i - first_default]);
            } else {
                jbuf b = {0};
                jb_printf(z, &b, "parameter '%s' was not provided", r->t->syms[mn->macro.params[i]].name->p);
                v = jv_undef_hint(z, b.p);
            }
        }
        frame_set(r, f, mn->macro.params[i], v);
    }
    for (size_t i = 0; i < r->t->nsyms; i++) {
        const jstr *s = r->t->syms[i].name;
        if (mn->macro.uses_varargs && js_eqc(s, "varargs")) {
            jlist *rest = jl_new(z, 0);
            for (size_t k = np; k < args->n; k++) jl_push(z, rest, args->v[k]);
            frame_set(r, f, (int)i, jv_of_tuple(rest));
        }
        if (mn->macro.uses_kwargs && js_eqc(s, "kwargs")) frame_set(r, f, (int)i, jv_of_dict(kw));
        if (wants_caller && js_eqc(s, "caller")) frame_set(r, f, (int)i, caller);
    }
    jbuf out = {0};
    jb_put(z, &out, "", 0);
    exec_body(r, f, &mn->macro.body, &out);
    z->depth--;
    return jv_str(z, out.p, out.len);
}

/* ---- expressions ------------------------------------------------------------------------------ */

static bool compare(jrender *r, jop op, jv a, jv b) {
    switch (op) {
    case JOP_EQ: return jv_eq(&r->z, a, b);
    case JOP_NE: return !jv_eq(&r->z, a, b);
    case JOP_LT: return jv_lt(&r->z, a, b, "<");
    case JOP_LE: return jv_lt(&r->z, a, b, "<=");
    case JOP_GT: return jv_lt(&r->z, a, b, ">");
    case JOP_GE: return jv_lt(&r->z, a, b, ">=");
    case JOP_IN: return contains(r, a, b);
    case JOP_NOTIN: return !contains(r, a, b);
    default: return false;
    }
}

static jv apply_filters(jrender *r, jframe *f, const jnode *n, jv innermost) {
    /* a filter chain whose innermost object is `innermost` (filter blocks, set blocks) */
    jv v = n->filter.obj ? apply_filters(r, f, n->filter.obj, innermost) : innermost;
    jlist *pos;
    jdict *kw;
    eval_args(r, f, &n->filter.args, &pos, &kw);
    r->z.line = n->line;
    if (n->filter.id < 0) jz_fail(&r->z, "TemplateRuntimeError", "No filter named '%s' found.", n->filter.name->p);
    return jb_filter(r, n->filter.id, n->filter.name->p, v, pos, kw);
}

static bool filter_foldable(const jnode *n);

/* folding: what jinja2's as_const cannot evaluate */
static _Noreturn void impossible(jrender *r) { jz_fail(&r->z, "Impossible", "not a constant"); }

static jv eval(jrender *r, jframe *f, const jnode *n) {
    jz *z = &r->z;
    step(r, n);
    if (r->folding) {
        if (n->kind == JN_NAME || n->kind == JN_NSREF || n->kind == JN_CALL) impossible(r);
        if ((n->kind == JN_FILTER || n->kind == JN_TEST) && !filter_foldable(n)) impossible(r);
    }
    switch ((jn_kind)n->kind) {
    case JN_CONST: return n->value;
    case JN_NAME: return lookup(r, f, n->name.sym);
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l = jl_new(z, n->items.n);
        for (size_t i = 0; i < n->items.n; i++) l->v[l->n++] = eval(r, f, n->items.v[i]);
        return n->kind == JN_LIST ? jv_of_list(l) : jv_of_tuple(l);
    }
    case JN_DICT: {
        jdict *d = jd_new(z, n->dict.keys.n);
        for (size_t i = 0; i < n->dict.keys.n; i++) {
            const jv k = eval(r, f, n->dict.keys.v[i]);
            const jv v = eval(r, f, n->dict.vals.v[i]);
            r->z.line = n->line;
            jd_set(z, d, k, v);
        }
        return jv_of_dict(d);
    }
    case JN_GETATTR: {
        const jv obj = eval(r, f, n->getattr.obj);
        r->z.line = n->line;
        return jr_getattr(r, obj, n->getattr.attr);
    }
    case JN_GETITEM: {
        const jv obj = eval(r, f, n->getitem.obj);
        const jnode *a = n->getitem.arg;
        if (a->kind == JN_SLICE) {
            const jv st = a->slice.start ? eval(r, f, a->slice.start) : JV_NONE_V;
            const jv sp = a->slice.stop ? eval(r, f, a->slice.stop) : JV_NONE_V;
            const jv sc = a->slice.step ? eval(r, f, a->slice.step) : JV_NONE_V;
            r->z.line = n->line;
            return jr_slice(r, obj, st, sp, sc);
        }
        const jv key = eval(r, f, a);
        r->z.line = n->line;
        return jr_getitem(r, obj, key);
    }
    case JN_SLICE: jz_fail(z, "TemplateSyntaxError", "a slice outside a subscript");
    case JN_CALL: {
        const jv fn = eval(r, f, n->call.fn);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &n->call.args, &pos, &kw);
        r->z.line = n->line;
        return jr_call(r, fn, pos, kw);
    }
    case JN_FILTER: {
        const jv v = eval(r, f, n->filter.obj);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &n->filter.args, &pos, &kw);
        r->z.line = n->line;
        /* jinja2 calls a stub that raises, once the arguments are evaluated */
        if (n->filter.id < 0) jz_fail(z, "TemplateRuntimeError", "No filter named '%s' found.", n->filter.name->p);
        return jb_filter(r, n->filter.id, n->filter.name->p, v, pos, kw);
    }
    case JN_TEST: {
        const jv v = eval(r, f, n->filter.obj);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &n->filter.args, &pos, &kw);
        r->z.line = n->line;
        if (n->filter.id < 0) jz_fail(z, "TemplateRuntimeError", "No test named '%s' found.", n->filter.name->p);
        return jv_bool(jb_test(r, n->filter.id, n->filter.name->p, v, pos, kw));
    }
    case JN_NOT: return jv_bool(!jv_truthy(z, eval(r, f, n->bin.a)));
    case JN_NEG:
    case JN_POS: {
        const jv v = eval(r, f, n->bin.a);
        r->z.line = n->line;
        if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
        if (!jv_is_num(v))
            jz_fail(z, "TypeError", "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+', jv_type_name(v));
        if (n->kind == JN_POS) return v.k == JV_BOOL ? jv_int(v.b) : v;
        if (v.k == JV_FLOAT) return jv_float(-v.f);
        if (as_int(v) == INT64_MIN) overflow(r);
        return jv_int(-as_int(v));
    }
    case JN_BINOP: {
        const jv a = eval(r, f, n->bin.a);
        const jv b = eval(r, f, n->bin.b);
        r->z.line = n->line;
        return binop(r, (jop)n->op, a, b);
    }
    case JN_CONCAT: {
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        for (size_t i = 0; i < n->items.n; i++) jv_write_str(z, &b, eval(r, f, n->items.v[i]));
        return jv_str(z, b.p, b.len);
    }
    case JN_AND: {
        const jv a = eval(r, f, n->bin.a);
        return jv_truthy(z, a) ? eval(r, f, n->bin.b) : a;
    }
    case JN_OR: {
        const jv a = eval(r, f, n->bin.a);
        return jv_truthy(z, a) ? a : eval(r, f, n->bin.b);
    }
    case JN_COMPARE: {
        jv left = eval(r, f, n->cmp.first);
        for (size_t i = 0; i < n->cmp.n; i++) {
            const jv right = eval(r, f, n->cmp.rest[i]);
            r->z.line = n->line;
            if (!compare(r, n->cmp.ops[i], left, right)) return jv_bool(false);
            left = right;
        }
        return jv_bool(true);
    }
    case JN_CONDEXPR:
        if (jv_truthy(z, eval(r, f, n->cond.cond))) return eval(r, f, n->cond.a);
        if (n->cond.b) return eval(r, f, n->cond.b);
        if (r->folding) impossible(r);
        {
            jbuf b = {0};
            jb_printf(z, &b, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
            return jv_undef_hint(z, b.p);
        }
    default: break;
    }
    jz_fail(z, "RuntimeError", "not an expression (node %d)", n->kind);
}

/* ---- assignment ------------------------------------------------------------------------------- */

static void assign(jrender *r, jframe *f, const jnode *target, jv v) {
    jz *z = &r->z;
    if (target->kind == JN_NAME) {
        frame_set(r, f, target->name.sym, v);
        return;
    }
    if (target->kind == JN_NSREF) {
        const jv ns = lookup(r, f, target->nsref.sym);
        if (ns.k != JV_NS) jz_fail(z, "TemplateRuntimeError", "cannot assign attribute on non-namespace object");
        jd_set(z, ns.d, jv_of_str(target->nsref.attr), v);
        return;
    }
    /* tuple unpacking */
    if (v.k == JV_UNDEF) jv_fail_undefined(z, v);
    if (v.k != JV_STR && !jv_is_seq(v) && v.k != JV_DICT && v.k != JV_GEN)
        jz_fail(z, "TypeError", "cannot unpack non-iterable %s object", jv_type_name(v));
    const jlist *l = jv_iter_list(z, v);
    const size_t want = target->items.n;
    if (l->n < want) jz_fail(z, "ValueError", "not enough values to unpack (expected %zu, got %zu)", want, l->n);
    if (l->n > want) jz_fail(z, "ValueError", "too many values to unpack (expected %zu)", want);
    for (size_t i = 0; i < want; i++) assign(r, f, target->items.v[i], l->v[i]);
}

/* ---- statements ------------------------------------------------------------------------------- */

/* a fresh scope for the next loop iteration: the last one's storage unless a macro kept it */
static jframe *iteration_frame(jrender *r, jframe *f, jframe *last, const jscope *sc) {
    if (!last || last->captured) return frame_new(r, f, sc);
    last->n = 0;
    frame_enter(r, last, sc);
    return last;
}

/* one more item from the loop's source through its `if`; false at the end */
static bool loop_pull(jrender *r, jloop *l) {
    jz *z = &r->z;
    const jnode *n = l->node;
    while (!l->src_done) {
        jv x;
        if (l->src.k == JV_GEN) {
            if (!jg_next(z, l->src.g, &x)) break;
        } else {
            if (l->src_pos >= l->src_list->n) break;
            x = l->src_list->v[l->src_pos++];
        }
        if (n->for_.filter) {
            step(r, n);
            l->test_frame = iteration_frame(r, l->frame, l->test_frame, NULL);
            assign(r, l->test_frame, n->for_.target, x);
            if (!jv_truthy(z, eval(r, l->test_frame, n->for_.filter))) continue;
        }
        jl_push(z, l->items, x);
        return true;
    }
    l->src_done = true;
    return false;
}

bool jr_loop_have(jrender *r, jloop *l, size_t k) {
    while (l->items->n <= k)
        if (!loop_pull(r, l)) return false;
    return true;
}

static int exec_for(jrender *r, jframe *f, const jnode *n, jv iterable, int depth0, jbuf *out) {
    jz *z = &r->z;
    int loop_sym = -1;
    for (size_t i = 0; i < r->t->nsyms; i++)
        if (js_eqc(r->t->syms[i].name, "loop")) loop_sym = (int)i;
    jloop *loop = jz_alloc(z, sizeof *loop);
    loop->depth0 = depth0;
    loop->node = n;
    loop->frame = f;
    loop->src = iterable;
    if (iterable.k == JV_GEN) {
        loop->items = jl_new(z, 0);
    } else {
        loop->src_list = jv_iter_list(z, iterable);
        if (n->for_.filter) {
            loop->items = jl_new(z, 0);
        } else {
            loop->items = (jlist *)loop->src_list;
            loop->src_done = true;
        }
    }
    jframe *it = NULL;
    /* jinja2 marks an iteration at the end of its body, so the else runs unless some iteration
     * got there (one ended by break or continue does not count) */
    bool completed = false;
    for (size_t i = 0; jr_loop_have(r, loop, i); i++) {
        step(r, n); /* an empty body must not make a loop free */
        loop->index0 = i;
        it = iteration_frame(r, f, it, &n->sc);
        r->z.line = n->line;
        assign(r, it, n->for_.target, loop->items->v[i]);
        if (loop_sym >= 0) frame_set(r, it, loop_sym, (jv){.k = JV_LOOP, .loop = loop});
        const int x = exec_body(r, it, &n->for_.body, out);
        if (x == X_NORMAL) completed = true;
        if (x == X_BREAK) break;
    }
    if (!completed && n->for_.else_.n) exec_body(r, frame_new(r, f, &n->sc_else), &n->for_.else_, out);
    return X_NORMAL;
}

static jv call_loop(jrender *r, jloop *loop, jlist *args, jdict *kw) {
    jz *z = &r->z;
    if (!loop->node->for_.recursive)
        jz_fail(z, "TypeError", "The loop must have the 'recursive' marker to be called recursively.");
    if (args->n != 1 || kw->n) jz_fail(z, "TypeError", "loop() takes exactly one argument");
    if (++z->depth > 100) jz_fail(z, "RecursionError", "maximum recursion depth exceeded (recursive loop calls)");
    jbuf out = {0};
    jb_put(z, &out, "", 0);
    exec_for(r, loop->frame, loop->node, args->v[0], loop->depth0 + 1, &out);
    z->depth--;
    return jv_str(z, out.p, out.len);
}

static int exec(jrender *r, jframe *f, const jnode *n, jbuf *out) {
    jz *z = &r->z;
    step(r, n);
    switch ((jn_kind)n->kind) {
    case JN_DATA: jb_put(z, out, n->text->p, n->text->len); return X_NORMAL;
    case JN_OUTPUT:
        for (size_t i = 0; i < n->items.n; i++) {
            const jv v = eval(r, f, n->items.v[i]);
            r->z.line = n->line;
            jv_write_str(z, out, v);
        }
        return X_NORMAL;
    case JN_IF:
        if (jv_truthy(z, eval(r, f, n->if_.test))) return exec_body(r, f, &n->if_.body, out);
        return exec_body(r, f, &n->if_.else_, out);
    case JN_FOR: return exec_for(r, f, n, eval(r, f, n->for_.iter), 0, out);
    case JN_SET: {
        const jv v = eval(r, f, n->set.value);
        r->z.line = n->line;
        assign(r, f, n->set.target, v);
        return X_NORMAL;
    }
    case JN_SETBLOCK: {
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        exec_body(r, frame_new(r, f, &n->sc), &n->setblock.body, &b);
        jv v = jv_str(z, b.p, b.len);
        if (n->setblock.filter) v = apply_filters(r, f, n->setblock.filter, v);
        r->z.line = n->line;
        assign(r, f, n->setblock.target, v);
        return X_NORMAL;
    }
    case JN_MACRO: {
        jmacro *m = jz_alloc(z, sizeof *m);
        m->node = n;
        m->scope_node = n;
        m->closure = f;
        for (jframe *g = f; g; g = g->parent) g->captured = true;
        frame_set(r, f, n->macro.sym, (jv){.k = JV_MACRO, .m = m});
        return X_NORMAL;
    }
    case JN_CALLBLOCK: {
        jmacro *caller = jz_alloc(z, sizeof *caller);
        caller->node = n->callblock.macro;
        caller->scope_node = n;
        caller->closure = f;
        for (jframe *g = f; g; g = g->parent) g->captured = true;
        const jnode *call = n->callblock.call;
        const jv fn = eval(r, f, call->call.fn);
        jlist *pos;
        jdict *kw;
        eval_args(r, f, &call->call.args, &pos, &kw);
        jd_set(z, kw, jv_cstr(z, "caller"), (jv){.k = JV_MACRO, .m = caller});
        r->z.line = n->line;
        jv_write_str(z, out, jr_call(r, fn, pos, kw));
        return X_NORMAL;
    }
    case JN_FILTERBLOCK: {
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        jframe *inner = frame_new(r, f, &n->sc);
        exec_body(r, inner, &n->filterblock.body, &b);
        const jv v = apply_filters(r, inner, n->filterblock.filter, jv_str(z, b.p, b.len));
        jv_write_str(z, out, v);
        return X_NORMAL;
    }
    case JN_WITH: {
        jframe *inner = frame_new(r, f, &n->sc);
        for (size_t i = 0; i < n->with.n; i++) {
            const jv v = eval(r, f, n->with.values[i]);
            assign(r, inner, n->with.targets[i], v);
        }
        return exec_body(r, inner, &n->with.body, out);
    }
    case JN_BREAK: return X_BREAK;
    case JN_CONTINUE: return X_CONTINUE;
    case JN_SCOPE: exec_body(r, frame_new(r, f, &n->sc), &n->scope.body, out); return X_NORMAL;
    case JN_UNSUPPORTED_STMT: jz_unsupported(z, "%s", n->unsupported.what->p);
    default: break;
    }
    jz_fail(z, "RuntimeError", "not a statement (node %d)", n->kind);
}

static int exec_body(jrender *r, jframe *f, const jnodes *body, jbuf *out) {
    for (size_t i = 0; i < body->n; i++) {
        const int x = exec(r, f, body->v[i], out);
        if (x != X_NORMAL) return x;
    }
    return X_NORMAL;
}

/* ---- constant folding ------------------------------------------------------------------------- */

/*
 * jinja2 folds expressions made of constants at compile time and keeps the result when its
 * repr is safe (None, bools, numbers, strings, and lists, tuples, dicts of those); a printed
 * expression is folded whatever its value, as str() of it. The difference this makes is the
 * folding's subscript: it goes through the sandbox's getitem, so a slice of a number folds to an
 * Undefined (printing as '') where the same slice at run time raises TypeError.
 */
static bool filter_foldable(const jnode *n) {
    static const char *const context_filters[] = {"map", "select", "reject", "selectattr", "rejectattr", "random", NULL};
    if (n->filter.id < 0 || !n->filter.obj || n->filter.args.star || n->filter.args.dstar) return false;
    if (n->kind == JN_FILTER)
        for (const char *const *c = context_filters; *c; c++)
            if (js_eqc(n->filter.name, *c)) return false;
    return true;
}

/* the expressions jinja2's as_const knows (names, calls and context filters fail inside) */
static bool foldable(const jnode *n) {
    switch ((jn_kind)n->kind) {
    case JN_LIST: case JN_TUPLE: case JN_CONCAT: case JN_DICT: case JN_GETATTR: case JN_GETITEM:
    case JN_FILTER: case JN_TEST: case JN_NOT: case JN_NEG: case JN_POS: case JN_BINOP: case JN_AND:
    case JN_OR: case JN_COMPARE: case JN_CONDEXPR:
        return true;
    default: return false;
    }
}

/* a cheap test first: no constant subtree without short circuits has names or calls */
static bool maybe_const(const jnode *n) {
    if (!n) return true;
    switch ((jn_kind)n->kind) {
    case JN_CONST: return true;
    case JN_NAME: case JN_NSREF: case JN_CALL: return false;
    case JN_AND: case JN_OR: return maybe_const(n->bin.a);
    case JN_CONDEXPR: return maybe_const(n->cond.cond);
    case JN_LIST: case JN_TUPLE: case JN_CONCAT:
        for (size_t i = 0; i < n->items.n; i++)
            if (!maybe_const(n->items.v[i])) return false;
        return true;
    case JN_DICT:
        for (size_t i = 0; i < n->dict.keys.n; i++)
            if (!maybe_const(n->dict.keys.v[i]) || !maybe_const(n->dict.vals.v[i])) return false;
        return true;
    case JN_GETATTR: return maybe_const(n->getattr.obj);
    case JN_GETITEM: return maybe_const(n->getitem.obj) && maybe_const(n->getitem.arg);
    case JN_SLICE: return maybe_const(n->slice.start) && maybe_const(n->slice.stop) && maybe_const(n->slice.step);
    case JN_FILTER: case JN_TEST:
        if (!filter_foldable(n) || !maybe_const(n->filter.obj)) return false;
        for (size_t i = 0; i < n->filter.args.pos.n; i++)
            if (!maybe_const(n->filter.args.pos.v[i])) return false;
        for (size_t i = 0; i < n->filter.args.nkw; i++)
            if (!maybe_const(n->filter.args.kw[i].value)) return false;
        return true;
    case JN_NOT: case JN_NEG: case JN_POS: return maybe_const(n->bin.a);
    case JN_BINOP: return maybe_const(n->bin.a) && maybe_const(n->bin.b);
    case JN_COMPARE:
        if (!maybe_const(n->cmp.first)) return false;
        for (size_t i = 0; i < n->cmp.n; i++)
            if (!maybe_const(n->cmp.rest[i])) return false;
        return true;
    default: return false;
    }
}

static bool safe_repr(jv v) {
    switch ((jv_kind)v.k) {
    case JV_NONE: case JV_BOOL: case JV_INT: case JV_FLOAT: case JV_STR: return true;
    case JV_LIST:
        if (v.l->view == JL_RANGE) return true;
        if (v.l->view != JL_PLAIN) return false;
        /* fall through */
    case JV_TUPLE:
        for (size_t i = 0; i < v.l->n; i++)
            if (!safe_repr(v.l->v[i])) return false;
        return true;
    case JV_DICT:
        for (size_t i = 0; i < v.d->n; i++)
            if (!safe_repr(v.d->keys[i]) || !safe_repr(v.d->vals[i])) return false;
        return true;
    default: return false;
    }
}

/* a copy of a safe value in the template's arena */
static jv copy_value(jz *z, jv v) {
    switch ((jv_kind)v.k) {
    case JV_STR: return jv_of_str(js_new(z, v.s->p, v.s->len));
    case JV_LIST:
    case JV_TUPLE: {
        jlist *l = jl_new(z, v.l->n);
        for (size_t i = 0; i < v.l->n; i++) l->v[l->n++] = copy_value(z, v.l->v[i]);
        l->view = v.l->view;
        l->r_start = v.l->r_start;
        l->r_stop = v.l->r_stop;
        l->r_step = v.l->r_step;
        return (jv){.k = v.k, .l = l};
    }
    case JV_DICT: {
        jdict *d = jd_new(z, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) {
            d->keys[i] = copy_value(z, v.d->keys[i]);
            d->vals[i] = copy_value(z, v.d->vals[i]);
        }
        d->n = v.d->n;
        return jv_of_dict(d);
    }
    default: return v;
    }
}

/* evaluates a foldable node; false when jinja2's as_const would give up (an exception) */
static bool fold_eval(const tr_jinja *t, const jnode *n, bool printed, jz *keep, jv *out) {
    jrender *r = calloc(1, sizeof *r);
    if (!r) return false;
    jz_init(&r->z, (size_t)16 << 20);
    r->z.step_limit = 100000;
    r->t = t;
    r->folding = true;
    r->root_ok = jz_alloc(&r->z, t->nsyms + 1);
    r->root = jz_alloc(&r->z, (t->nsyms + 1) * sizeof(jv));
    bool ok = false;
    if (!setjmp(r->z.jb)) {
        const jv v = eval(r, NULL, n);
        if (printed) {
            const jstr *s = jv_to_str(&r->z, v);
            *out = jv_of_str(js_new(keep, s->p, s->len));
            ok = true;
        } else if (safe_repr(v)) {
            *out = copy_value(keep, v);
            ok = true;
        }
    }
    jz_free(&r->z);
    free(r);
    return ok;
}

static void fold(tr_jinja *t, jnode *n);

static void fold_list(tr_jinja *t, jnodes *v) {
    for (size_t i = 0; i < v->n; i++) fold(t, v->v[i]);
}

static void fold_args(tr_jinja *t, jargs *a) {
    fold_list(t, &a->pos);
    for (size_t i = 0; i < a->nkw; i++) fold(t, a->kw[i].value);
    if (a->star) fold(t, a->star);
    if (a->dstar) fold(t, a->dstar);
}

static void fold(tr_jinja *t, jnode *n) {
    if (!n) return;
    switch ((jn_kind)n->kind) {
    case JN_OUTPUT:
        fold_list(t, &n->items);
        for (size_t i = 0; i < n->items.n; i++) {
            jnode *c = n->items.v[i];
            jv v;
            if (c->kind != JN_CONST && foldable(c) && maybe_const(c) && fold_eval(t, c, true, &t->z, &v)) {
                c->kind = JN_CONST;
                c->value = v;
            }
        }
        return;
    case JN_LIST: case JN_TUPLE: case JN_CONCAT: fold_list(t, &n->items); break;
    case JN_DICT: fold_list(t, &n->dict.keys); fold_list(t, &n->dict.vals); break;
    case JN_GETATTR: fold(t, n->getattr.obj); break;
    case JN_GETITEM: fold(t, n->getitem.obj); fold(t, n->getitem.arg); break;
    case JN_SLICE: fold(t, n->slice.start); fold(t, n->slice.stop); fold(t, n->slice.step); return;
    case JN_CALL: fold(t, n->call.fn); fold_args(t, &n->call.args); break;
    case JN_FILTER: case JN_TEST: fold(t, n->filter.obj); fold_args(t, &n->filter.args); break;
    case JN_NOT: case JN_NEG: case JN_POS: fold(t, n->bin.a); break;
    case JN_BINOP: case JN_AND: case JN_OR: fold(t, n->bin.a); fold(t, n->bin.b); break;
    case JN_COMPARE:
        fold(t, n->cmp.first);
        for (size_t i = 0; i < n->cmp.n; i++) fold(t, n->cmp.rest[i]);
        break;
    case JN_CONDEXPR: fold(t, n->cond.cond); fold(t, n->cond.a); fold(t, n->cond.b); break;
    case JN_IF: fold(t, n->if_.test); fold_list(t, &n->if_.body); fold_list(t, &n->if_.else_); return;
    case JN_FOR:
        fold(t, n->for_.iter);
        fold(t, n->for_.filter);
        fold_list(t, &n->for_.body);
        fold_list(t, &n->for_.else_);
        return;
    case JN_SET: fold(t, n->set.value); return;
    case JN_SETBLOCK: fold(t, n->setblock.filter); fold_list(t, &n->setblock.body); return;
    case JN_MACRO:
        for (size_t i = 0; i < n->macro.ndefaults; i++) fold(t, n->macro.defaults[i]);
        fold_list(t, &n->macro.body);
        return;
    case JN_CALLBLOCK: fold(t, n->callblock.call); fold(t, n->callblock.macro); return;
    case JN_FILTERBLOCK: fold_list(t, &n->filterblock.body); return;
    case JN_WITH:
        for (size_t i = 0; i < n->with.n; i++) fold(t, n->with.values[i]);
        fold_list(t, &n->with.body);
        return;
    case JN_SCOPE: fold_list(t, &n->scope.body); return;
    default: return;
    }
    jv v;
    if (n->kind != JN_CONST && foldable(n) && maybe_const(n) && fold_eval(t, n, false, &t->z, &v)) {
        n->kind = JN_CONST;
        n->value = v;
    }
}

void jfold(tr_jinja *t) { fold_list(t, &t->body); }

/* ---- entry points ----------------------------------------------------------------------------- */

static void to_error(const jz *z, tr_error *err, const char *where) {
    if (!err) return;
    err->status = z->status;
    if (z->status == TR_E_NOMEM || z->status == TR_E_ARG || z->err_line <= 0)
        snprintf(err->msg, sizeof err->msg, "%s (%s, %s)", z->msg, z->kind, where);
    else
        snprintf(err->msg, sizeof err->msg, "%s (%s, template line %d)", z->msg, z->kind, z->err_line);
}

tr_status tr_jinja_parse(const char *src, size_t len, tr_jinja **out, tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_jinja_parse: out is NULL");
    *out = NULL;
    if (!src) return tr_fail(err, TR_E_ARG, "tr_jinja_parse: no template text");
    if (!ju_valid(src, len)) return tr_fail(err, TR_E_FORMAT, "the template is not valid UTF-8");
    tr_jinja *t = calloc(1, sizeof *t);
    if (!t) return tr_fail(err, TR_E_NOMEM, "out of memory parsing a template");
    jz_init(&t->z, (size_t)64 << 20);
    if (setjmp(t->z.jb)) {
        to_error(&t->z, err, "parsing the template");
        const tr_status st = t->z.status;
        jz_free(&t->z);
        free(t);
        return st;
    }
    jtok *toks;
    size_t ntoks;
    jlex(&t->z, src, len, &toks, &ntoks);
    jparse(t, toks, ntoks);
    jfold(t);
    jcheck(t);
    *out = t;
    return TR_OK;
}

void tr_jinja_free(tr_jinja *t) {
    if (!t) return;
    jz_free(&t->z);
    free(t);
}

static tr_status render(jrender *r, const tr_jinja_var *vars, size_t n_vars, char **out, size_t *out_len) {
    jz *z = &r->z;
    const tr_jinja *t = r->t;
    r->vars = jd_new(z, n_vars);
    for (size_t i = 0; i < n_vars; i++) {
        const tr_jinja_var *v = &vars[i];
        if (v->kind == TR_JINJA_JSON_VARS) {
            if (!v->text) continue;
            const jv obj = jv_from_json(z, v->text, strlen(v->text), v->name ? v->name : "variables");
            if (obj.k != JV_DICT)
                jz_fail_st(z, TR_E_ARG, "ValueError", "%s: a JSON object is needed, not %s",
                           v->name ? v->name : "variables", jv_type_name(obj));
            for (size_t k = 0; k < obj.d->n; k++) jd_set(z, r->vars, obj.d->keys[k], obj.d->vals[k]);
            continue;
        }
        if (!v->name) jz_fail_st(z, TR_E_ARG, "ValueError", "variable %zu has no name", i);
        jv val = JV_NONE_V;
        switch (v->kind) {
        case TR_JINJA_JSON:
            if (!v->text) jz_fail_st(z, TR_E_ARG, "ValueError", "variable '%s' has no JSON text", v->name);
            val = jv_from_json(z, v->text, strlen(v->text), v->name);
            break;
        case TR_JINJA_STRING:
            if (!v->text) jz_fail_st(z, TR_E_ARG, "ValueError", "variable '%s' has no text", v->name);
            if (!ju_valid(v->text, strlen(v->text)))
                jz_fail_st(z, TR_E_ARG, "ValueError", "variable '%s' is not valid UTF-8", v->name);
            val = jv_cstr(z, v->text);
            break;
        case TR_JINJA_BOOL: val = jv_bool(v->b); break;
        case TR_JINJA_NONE: break;
        case TR_JINJA_JSON_VARS: break;
        }
        jd_set(z, r->vars, jv_cstr(z, v->name), val);
    }
    r->root = jz_alloc(z, (t->nsyms + 1) * sizeof(jv));
    r->root_ok = jz_alloc(z, t->nsyms + 1);
    for (size_t i = 0; i < t->nsyms; i++) {
        if (jd_getc(r->vars, t->syms[i].name->p, &r->root[i])) r->root_ok[i] = true;
        else if (t->syms[i].global >= 0) {
            r->root[i] = jb_global(r, t->syms[i].global);
            r->root_ok[i] = true;
        }
    }
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    exec_body(r, frame_new(r, NULL, &t->sc), &t->body, &b);
    char *res = malloc(b.len + 1);
    if (!res) jz_oom(z);
    memcpy(res, b.p, b.len + 1);
    *out = res;
    if (out_len) *out_len = b.len;
    return TR_OK;
}

tr_status tr_jinja_render(const tr_jinja *t, const tr_jinja_var *vars, size_t n_vars,
                          const tr_jinja_opts *opts, char **out, size_t *out_len, tr_error *err) {
    if (!t || !out) return tr_fail(err, TR_E_ARG, "tr_jinja_render: no template or no output");
    if (n_vars && !vars) return tr_fail(err, TR_E_ARG, "tr_jinja_render: %zu variables at NULL", n_vars);
    *out = NULL;
    jrender *r = calloc(1, sizeof *r);
    if (!r) return tr_fail(err, TR_E_NOMEM, "out of memory rendering a template");
    jz_init(&r->z, opts && opts->max_bytes ? opts->max_bytes : (size_t)256 << 20);
    r->z.step_limit = opts && opts->max_steps ? opts->max_steps : 50000000;
    r->t = t;
    if (opts && opts->has_now) {
        r->has_now = true;
        r->now = opts->now;
    }
    tr_status st;
    if (setjmp(r->z.jb)) {
        to_error(&r->z, err, "rendering the template");
        st = r->z.status;
    } else {
        st = render(r, vars, n_vars, out, out_len);
    }
    jz_free(&r->z);
    free(r);
    return st;
}

/* the operators, for the builtins (sum, the odd/even tests, the in test) */
jv jb_add(jrender *r, jv a, jv b) { return py_add(r, a, b); }
jv jb_mod(jrender *r, jv a, jv b) { return binop(r, JOP_MOD, a, b); }
bool jb_in(jrender *r, jv needle, jv hay) { return contains(r, needle, hay); }
