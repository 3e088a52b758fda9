/*
 * Python's str, dict and list methods as templates call them (message.content.split('</think>'),
 * tool.items(), ...), jinja2's globals (range, dict, namespace, cycler, joiner) and Hugging
 * Face's (raise_exception, strftime_now), the attributes of loop / macro objects, and the
 * sandbox's rule that methods which mutate (list.append, dict.update, ...) are unsafe.
 *
 * Strings are indexed by code point, as Python does; case mappings and whitespace come from the
 * Unicode tables of jinja_unicode.c.
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

static void no_kwargs(jrender *r, const char *fn, const jdict *kw) {
    if (kw->n) jz_fail(&r->z, "TypeError", "%s() takes no keyword arguments", fn);
}

static void nargs(jrender *r, const char *fn, const jlist *args, size_t lo, size_t hi) {
    if (args->n < lo || args->n > hi) {
        if (lo == hi)
            jz_fail(&r->z, "TypeError", "%s() takes exactly %s (%zu given)", fn,
                    lo == 0 ? "no arguments" : lo == 1 ? "one argument" : "two arguments", args->n);
        jz_fail(&r->z, "TypeError", "%s expected %s%zu argument%s, got %zu", fn, args->n < lo ? "at least " : "at most ",
                args->n < lo ? lo : hi, (args->n < lo ? lo : hi) == 1 ? "" : "s", args->n);
    }
}

static jstr *want_str(jrender *r, jv v, const char *what) {
    if (v.k == JV_STR) return v.s;
    if (v.k == JV_UNDEF) jv_fail_undefined(&r->z, v);
    jz_fail(&r->z, "TypeError", "%s", what);
}

static int64_t want_int(jrender *r, jv v, const char *what) {
    if (v.k == JV_INT) return v.i;
    if (v.k == JV_BOOL) return v.b;
    if (v.k == JV_UNDEF) jv_fail_undefined(&r->z, v);
    jz_fail(&r->z, "TypeError", "'%s' object cannot be interpreted as an integer%s", jv_type_name(v), what);
}

/* ---- string helpers --------------------------------------------------------------------------- */

uint32_t *js_cps(jz *z, const jstr *s, size_t *n) {
    uint32_t *cp = jz_alloc(z, (s->ncp + 1) * sizeof *cp);
    size_t i = 0, k = 0;
    while (i < s->len) cp[k++] = ju_next(s->p, s->len, &i);
    *n = k;
    return cp;
}

jstr *js_from_cps(jz *z, const uint32_t *cp, size_t n) {
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    for (size_t i = 0; i < n; i++) jb_put_cp(z, &b, cp[i]);
    return js_new(z, b.p, b.len);
}

jstr *jb_soft_str(jrender *r, jv v) { return jv_to_str(&r->z, v); }

static bool in_set(uint32_t c, const uint32_t *set, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (set[i] == c) return true;
    return false;
}

jstr *js_strip(jz *z, const jstr *s, const jstr *chars, bool left, bool right) {
    size_t n, nc = 0;
    uint32_t *cp = js_cps(z, s, &n);
    uint32_t *set = chars ? js_cps(z, chars, &nc) : NULL;
    size_t a = 0, b = n;
    if (left)
        while (a < b && (set ? in_set(cp[a], set, nc) : ju_isspace(cp[a]))) a++;
    if (right)
        while (b > a && (set ? in_set(cp[b - 1], set, nc) : ju_isspace(cp[b - 1]))) b--;
    if (a == 0 && b == n) return (jstr *)s;
    const size_t oa = js_offset(s, a), ob = js_offset(s, b);
    return js_new(z, s->p + oa, ob - oa);
}

/* CPython's handle_capital_sigma: Σ lowers to ς at the end of a word */
static uint32_t lower_sigma(const uint32_t *cp, size_t n, size_t i) {
    size_t j = i;
    uint32_t c = 0;
    bool final = false;
    while (j > 0) {
        c = cp[--j];
        if (!ju_case_ignorable(c)) {
            final = ju_iscased(c);
            break;
        }
    }
    if (final && i + 1 < n) {
        size_t k = i + 1;
        while (k < n && ju_case_ignorable(cp[k])) k++;
        final = k == n || !ju_iscased(cp[k]);
    }
    return final ? 0x3c2 : 0x3c3;
}

static void put_lower(jz *z, jbuf *b, const uint32_t *cp, size_t n, size_t i) {
    if (cp[i] == 0x3a3) {
        jb_put_cp(z, b, lower_sigma(cp, n, i));
        return;
    }
    uint32_t m[3];
    const int k = ju_lower(cp[i], m);
    for (int j = 0; j < k; j++) jb_put_cp(z, b, m[j]);
}

static void put_map(jz *z, jbuf *b, int (*f)(uint32_t, uint32_t *), uint32_t c) {
    uint32_t m[3];
    const int k = f(c, m);
    for (int j = 0; j < k; j++) jb_put_cp(z, b, m[j]);
}

jstr *js_lower(jz *z, const jstr *s) {
    if (s->ncp == s->len) {
        char *p = jz_strndup(z, s->p, s->len);
        for (size_t i = 0; i < s->len; i++)
            if (p[i] >= 'A' && p[i] <= 'Z') p[i] = (char)(p[i] + 32);
        return js_new(z, p, s->len);
    }
    size_t n;
    const uint32_t *cp = js_cps(z, s, &n);
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    for (size_t i = 0; i < n; i++) put_lower(z, &b, cp, n, i);
    return js_new(z, b.p, b.len);
}

jstr *js_upper(jz *z, const jstr *s) {
    size_t n;
    const uint32_t *cp = js_cps(z, s, &n);
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    for (size_t i = 0; i < n; i++) put_map(z, &b, ju_upper, cp[i]);
    return js_new(z, b.p, b.len);
}

jstr *js_capitalize(jz *z, const jstr *s) {
    size_t n;
    const uint32_t *cp = js_cps(z, s, &n);
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (i == 0) put_map(z, &b, ju_title, cp[0]);
        else put_lower(z, &b, cp, n, i);
    }
    return js_new(z, b.p, b.len);
}

static jstr *js_title(jz *z, const jstr *s) {
    size_t n;
    const uint32_t *cp = js_cps(z, s, &n);
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    bool prev_cased = false;
    for (size_t i = 0; i < n; i++) {
        if (prev_cased) put_lower(z, &b, cp, n, i);
        else put_map(z, &b, ju_title, cp[i]);
        prev_cased = ju_iscased(cp[i]);
    }
    return js_new(z, b.p, b.len);
}

static jstr *js_swapcase(jz *z, const jstr *s) {
    size_t n;
    const uint32_t *cp = js_cps(z, s, &n);
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (ju_isupper(cp[i])) put_lower(z, &b, cp, n, i);
        else if (ju_islower(cp[i])) put_map(z, &b, ju_upper, cp[i]);
        else jb_put_cp(z, &b, cp[i]);
    }
    return js_new(z, b.p, b.len);
}

/* str.islower / isupper: some cased character, and none of the other case */
bool js_islower(const jstr *s) {
    bool cased = false;
    size_t i = 0;
    while (i < s->len) {
        const uint32_t c = ju_next(s->p, s->len, &i);
        if (ju_isupper(c) || (ju_iscased(c) && !ju_islower(c))) return false;
        if (ju_islower(c)) cased = true;
    }
    return cased;
}
bool js_isupper(const jstr *s) {
    bool cased = false;
    size_t i = 0;
    while (i < s->len) {
        const uint32_t c = ju_next(s->p, s->len, &i);
        if (ju_islower(c) || (ju_iscased(c) && !ju_isupper(c))) return false;
        if (ju_isupper(c)) cased = true;
    }
    return cased;
}

static bool js_istitle(const jstr *s) {
    bool cased = false, prev_cased = false;
    size_t i = 0;
    while (i < s->len) {
        const uint32_t c = ju_next(s->p, s->len, &i);
        const bool up = ju_isupper(c) || (ju_iscased(c) && !ju_islower(c));
        if (up) {
            if (prev_cased) return false;
            prev_cased = cased = true;
        } else if (ju_islower(c)) {
            if (!prev_cased) return false;
            prev_cased = cased = true;
        } else {
            prev_cased = false;
        }
    }
    return cased;
}

jstr *js_replace(jz *z, const jstr *s, const jstr *old, const jstr *new_, int64_t count) {
    if (count < 0) count = INT64_MAX;
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    if (old->len == 0) {
        /* Python inserts `new` before every character and at the end */
        size_t i = 0;
        int64_t done = 0;
        while (i <= s->len) {
            if (done < count) {
                jb_put(z, &b, new_->p, new_->len);
                done++;
            }
            if (i == s->len) break;
            const size_t start = i;
            ju_next(s->p, s->len, &i);
            jb_put(z, &b, s->p + start, i - start);
        }
        return js_new(z, b.p, b.len);
    }
    size_t i = 0;
    int64_t done = 0;
    while (i < s->len) {
        const char *hit = done < count ? memmem(s->p + i, s->len - i, old->p, old->len) : NULL;
        if (!hit) {
            jb_put(z, &b, s->p + i, s->len - i);
            break;
        }
        jb_put(z, &b, s->p + i, (size_t)(hit - (s->p + i)));
        jb_put(z, &b, new_->p, new_->len);
        i = (size_t)(hit - s->p) + old->len;
        done++;
    }
    return js_new(z, b.p, b.len);
}

static bool line_break(uint32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
}

jlist *js_splitlines(jz *z, const jstr *s, bool keepends) {
    jlist *l = jl_new(z, 0);
    size_t i = 0, start = 0;
    while (i < s->len) {
        const size_t at = i;
        const uint32_t c = ju_next(s->p, s->len, &i);
        if (!line_break(c)) continue;
        if (c == '\r' && i < s->len && s->p[i] == '\n') i++;
        jl_push(z, l, jv_str(z, s->p + start, (keepends ? i : at) - start));
        start = i;
    }
    if (start < s->len) jl_push(z, l, jv_str(z, s->p + start, s->len - start));
    return l;
}

/* Python's start/end arguments of find, count, startswith ...: a code point range */
static void sub_range(jrender *r, const jstr *s, const jlist *args, size_t first, size_t *a, size_t *b) {
    const int64_t n = (int64_t)s->ncp;
    int64_t lo = 0, hi = n;
    if (args->n > first && args->v[first].k != JV_NONE) lo = want_int(r, args->v[first], "");
    if (args->n > first + 1 && args->v[first + 1].k != JV_NONE) hi = want_int(r, args->v[first + 1], "");
    if (lo < 0) lo = lo + n < 0 ? 0 : lo + n;
    if (hi < 0) hi = hi + n < 0 ? 0 : hi + n;
    if (hi > n) hi = n;
    *a = (size_t)lo;
    *b = (size_t)(hi < lo ? lo : hi);
    if (lo > n) *a = *b = (size_t)n + 1; /* an empty range past the end: nothing matches */
}

static int64_t cp_index(const jstr *s, size_t byte_off) { return (int64_t)ju_count(s->p, byte_off); }

static int64_t str_find(jrender *r, const jstr *s, const jlist *args, bool reverse) {
    const jstr *sub = want_str(r, args->v[0], "must be str");
    size_t a, b;
    sub_range(r, s, args, 1, &a, &b);
    if (a > s->ncp) return -1;
    const size_t oa = js_offset(s, a), ob = js_offset(s, b);
    if (sub->len > ob - oa) return -1;
    if (!reverse) {
        const char *hit = sub->len ? memmem(s->p + oa, ob - oa, sub->p, sub->len) : s->p + oa;
        return hit ? cp_index(s, (size_t)(hit - s->p)) : -1;
    }
    for (size_t k = ob - sub->len + 1; k-- > oa;)
        if (!sub->len || !memcmp(s->p + k, sub->p, sub->len)) return cp_index(s, k);
    return -1;
}

static bool affix_match(const jstr *s, size_t oa, size_t ob, const jstr *x, bool suffix) {
    if (x->len > ob - oa) return false;
    return !memcmp(suffix ? s->p + ob - x->len : s->p + oa, x->p, x->len);
}

static bool str_affix(jrender *r, const jstr *s, const jlist *args, bool suffix, const char *fn) {
    size_t a, b;
    sub_range(r, s, args, 1, &a, &b);
    if (a > s->ncp) return false;
    const size_t oa = js_offset(s, a), ob = js_offset(s, b);
    const jv x = args->v[0];
    if (x.k == JV_TUPLE) {
        for (size_t i = 0; i < x.l->n; i++) {
            const jstr *e = want_str(r, x.l->v[i], "tuple for startswith must only contain str");
            if (affix_match(s, oa, ob, e, suffix)) return true;
        }
        return false;
    }
    if (x.k != JV_STR)
        jz_fail(&r->z, "TypeError", "%s first arg must be str or a tuple of str, not %s", fn, jv_type_name(x));
    return affix_match(s, oa, ob, x.s, suffix);
}

static jv str_split(jrender *r, const jstr *s, const jlist *args, const jdict *kw, bool right) {
    jz *z = &r->z;
    static const char *const P[] = {"sep", "maxsplit"};
    jv a[2];
    bool g[2];
    jb_bind(r, right ? "rsplit" : "split", P, 2, 0, 0, args, kw, a, g);
    int64_t maxsplit = g[1] ? want_int(r, a[1], "") : -1;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    jlist *out = jl_new(z, 0);
    if (!g[0] || a[0].k == JV_NONE) {
        size_t n;
        const uint32_t *cp = js_cps(z, s, &n);
        if (!right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                while (i < n && ju_isspace(cp[i])) i++;
                if (i >= n) break;
                if (done == maxsplit) {
                    size_t e = n;
                    while (e > i && ju_isspace(cp[e - 1])) e--;
                    jl_push(z, out, jv_of_str(js_from_cps(z, cp + i, e - i)));
                    break;
                }
                size_t j = i;
                while (j < n && !ju_isspace(cp[j])) j++;
                jl_push(z, out, jv_of_str(js_from_cps(z, cp + i, j - i)));
                done++;
                i = j;
            }
        } else {
            jlist *rev = jl_new(z, 0);
            size_t i = n;
            int64_t done = 0;
            for (;;) {
                while (i > 0 && ju_isspace(cp[i - 1])) i--;
                if (i == 0) break;
                if (done == maxsplit) {
                    size_t b = 0;
                    while (b < i && ju_isspace(cp[b])) b++;
                    jl_push(z, rev, jv_of_str(js_from_cps(z, cp + b, i - b)));
                    break;
                }
                size_t j = i;
                while (j > 0 && !ju_isspace(cp[j - 1])) j--;
                jl_push(z, rev, jv_of_str(js_from_cps(z, cp + j, i - j)));
                done++;
                i = j;
            }
            for (size_t k = rev->n; k-- > 0;) jl_push(z, out, rev->v[k]);
        }
        return jv_of_list(out);
    }
    const jstr *sep = want_str(r, a[0], "must be str or None");
    if (sep->len == 0) jz_fail(z, "ValueError", "empty separator");
    if (!right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = done < maxsplit ? memmem(s->p + i, s->len - i, sep->p, sep->len) : NULL;
            if (!hit) {
                jl_push(z, out, jv_str(z, s->p + i, s->len - i));
                break;
            }
            jl_push(z, out, jv_str(z, s->p + i, (size_t)(hit - s->p) - i));
            i = (size_t)(hit - s->p) + sep->len;
            done++;
        }
        return jv_of_list(out);
    }
    jlist *rev = jl_new(z, 0);
    size_t end = s->len;
    int64_t done = 0;
    for (;;) {
        size_t k = SIZE_MAX;
        if (done < maxsplit && end >= sep->len)
            for (size_t p = end - sep->len + 1; p-- > 0;)
                if (!memcmp(s->p + p, sep->p, sep->len)) {
                    k = p;
                    break;
                }
        if (k == SIZE_MAX) {
            jl_push(z, rev, jv_str(z, s->p, end));
            break;
        }
        jl_push(z, rev, jv_str(z, s->p + k + sep->len, end - k - sep->len));
        end = k;
        done++;
    }
    for (size_t k = rev->n; k-- > 0;) jl_push(z, out, rev->v[k]);
    return jv_of_list(out);
}

static jv str_pad(jrender *r, const jstr *s, const jlist *args, int mode, const char *fn) {
    jz *z = &r->z;
    nargs(r, fn, args, 1, 2);
    const int64_t width = want_int(r, args->v[0], "");
    uint32_t fill = ' ';
    if (args->n > 1) {
        const jstr *f = want_str(r, args->v[1], "The fill character must be a unicode character");
        if (f->ncp != 1) jz_fail(z, "TypeError", "The fill character must be exactly one character long");
        size_t i = 0;
        fill = ju_next(f->p, f->len, &i);
    }
    if (width <= (int64_t)s->ncp) return jv_of_str((jstr *)s);
    if (width > (64 << 20)) jz_oom(z);
    const size_t marg = (size_t)width - s->ncp;
    size_t left = mode == 0 ? marg / 2 + (marg & (size_t)width & 1) : mode < 0 ? 0 : marg;
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    for (size_t i = 0; i < left; i++) jb_put_cp(z, &b, fill);
    jb_put(z, &b, s->p, s->len);
    for (size_t i = left; i < marg; i++) jb_put_cp(z, &b, fill);
    return jv_str(z, b.p, b.len);
}

/* str.format through the sandbox's formatter: {} {0} {name}, !r !s, and no format specs */
static jv str_format_method(jrender *r, const jstr *s, const jlist *args, const jdict *kw) {
    jz *z = &r->z;
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    size_t auto_ix = 0;
    for (size_t i = 0; i < s->len; i++) {
        const char c = s->p[i];
        if (c == '}') {
            if (i + 1 < s->len && s->p[i + 1] == '}') {
                jb_putc(z, &b, '}');
                i++;
                continue;
            }
            jz_fail(z, "ValueError", "Single '}' encountered in format string");
        }
        if (c != '{') {
            jb_putc(z, &b, c);
            continue;
        }
        if (i + 1 < s->len && s->p[i + 1] == '{') {
            jb_putc(z, &b, '{');
            i++;
            continue;
        }
        const size_t start = i + 1;
        size_t j = start;
        while (j < s->len && s->p[j] != '}' && s->p[j] != '!' && s->p[j] != ':' && s->p[j] != '{') j++;
        if (j >= s->len) jz_fail(z, "ValueError", "expected '}' before end of string");
        const jstr *field = js_new(z, s->p + start, j - start);
        char conv = 0;
        if (s->p[j] == '!') {
            if (j + 2 >= s->len) jz_fail(z, "ValueError", "expected '}' before end of string");
            conv = s->p[j + 1];
            j += 2;
        }
        if (s->p[j] != '}') jz_unsupported(z, "str.format with format specs or nested fields");
        jv v;
        if (field->len == 0) {
            if (auto_ix >= args->n) jz_fail(z, "IndexError", "Replacement index %zu out of range for positional args tuple", auto_ix);
            v = args->v[auto_ix++];
        } else if (field->p[0] >= '0' && field->p[0] <= '9') {
            char *end;
            const unsigned long ix = strtoul(field->p, &end, 10);
            if (*end) jz_unsupported(z, "str.format fields with attribute or index access");
            if (ix >= args->n) jz_fail(z, "IndexError", "Replacement index %lu out of range for positional args tuple", ix);
            v = args->v[ix];
        } else {
            for (size_t k = 0; k < field->len; k++)
                if (field->p[k] == '.' || field->p[k] == '[')
                    jz_unsupported(z, "str.format fields with attribute or index access");
            if (!jd_getc(kw, field->p, &v)) jz_fail(z, "KeyError", "'%s'", field->p);
        }
        if (conv == 'r') jv_write_repr(z, &b, v);
        else if (conv == 's' || conv == 0) jv_write_str(z, &b, v);
        else jz_fail(z, "ValueError", "Unknown conversion specifier %c", conv);
        i = j;
    }
    return jv_str(z, b.p, b.len);
}

/* ---- method and global ids -------------------------------------------------------------------- */

enum {
    G_RANGE = 0, G_DICT, G_NAMESPACE, G_CYCLER, G_JOINER, G_LIPSUM, G_RAISE, G_STRFTIME, G_COUNT_,
    /* str */
    S_CAPITALIZE = 100, S_CASEFOLD, S_CENTER, S_COUNT, S_ENDSWITH, S_FIND, S_FORMAT, S_INDEX,
    S_ISALNUM, S_ISALPHA, S_ISASCII, S_ISDECIMAL, S_ISDIGIT, S_ISIDENTIFIER, S_ISLOWER,
    S_ISNUMERIC, S_ISPRINTABLE, S_ISSPACE, S_ISTITLE, S_ISUPPER, S_JOIN, S_LJUST, S_LOWER,
    S_LSTRIP, S_PARTITION, S_REMOVEPREFIX, S_REMOVESUFFIX, S_REPLACE, S_RFIND, S_RINDEX,
    S_RJUST, S_RPARTITION, S_RSPLIT, S_RSTRIP, S_SPLIT, S_SPLITLINES, S_STARTSWITH, S_STRIP,
    S_SWAPCASE, S_TITLE, S_UPPER, S_ZFILL,
    /* dict, list, tuple, range */
    D_GET = 200, D_ITEMS, D_KEYS, D_VALUES, D_COPY,
    L_COUNT, L_INDEX, L_COPY,
    /* jinja2 objects */
    O_LOOP_CYCLE = 300, O_LOOP_CHANGED, O_CYCLER_NEXT, O_CYCLER_RESET,
    UNSUPPORTED_METHOD = 999,
};

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
        no_kwargs(r, "range", kw);
        if (args->n < 1 || args->n > 3)
            jz_fail(z, "TypeError", "range expected at %s 3 arguments, got %zu", args->n < 1 ? "least 1" : "most", args->n);
        int64_t a = 0, b, st = 1;
        if (args->n == 1) b = want_int(r, args->v[0], "");
        else {
            a = want_int(r, args->v[0], "");
            b = want_int(r, args->v[1], "");
            if (args->n == 3) st = want_int(r, args->v[2], "");
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
        no_kwargs(r, "Cycler", kw);
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
        const jstr *fmt = want_str(r, a[0], "strftime() argument 1 must be str");
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

static jv partition(jrender *r, const jstr *s, jv sepv, bool right) {
    jz *z = &r->z;
    const jstr *sep = want_str(r, sepv, "must be str");
    if (!sep->len) jz_fail(z, "ValueError", "empty separator");
    const char *hit = NULL;
    if (!right) hit = memmem(s->p, s->len, sep->p, sep->len);
    else if (s->len >= sep->len)
        for (size_t p = s->len - sep->len + 1; p-- > 0 && !hit;)
            if (!memcmp(s->p + p, sep->p, sep->len)) hit = s->p + p;
    jlist *l = jl_new(z, 3);
    if (!hit) {
        l->v[0] = right ? jv_of_str(&js_empty) : jv_of_str((jstr *)s);
        l->v[1] = jv_of_str(&js_empty);
        l->v[2] = right ? jv_of_str((jstr *)s) : jv_of_str(&js_empty);
    } else {
        const size_t at = (size_t)(hit - s->p);
        l->v[0] = jv_str(z, s->p, at);
        l->v[1] = jv_of_str((jstr *)sep);
        l->v[2] = jv_str(z, s->p + at + sep->len, s->len - at - sep->len);
    }
    l->n = 3;
    return jv_of_tuple(l);
}

static bool all_cps(const jstr *s, bool (*pred)(uint32_t)) {
    if (s->len == 0) return false;
    size_t i = 0;
    while (i < s->len)
        if (!pred(ju_next(s->p, s->len, &i))) return false;
    return true;
}
static bool is_alnum(uint32_t c) { return ju_isalpha(c) || ju_isdecimal(c) || ju_isdigit(c) || ju_isnumeric(c); }
static bool is_ascii(uint32_t c) { return c < 128; }

static jv call_str(jrender *r, jfunc *fn, jlist *args, jdict *kw) {
    jz *z = &r->z;
    const jstr *s = fn->self.s;
    const char *name = fn->name;
    if (fn->id != S_SPLIT && fn->id != S_RSPLIT && fn->id != S_FORMAT && fn->id != S_SPLITLINES)
        no_kwargs(r, name, kw);
    switch (fn->id) {
    case S_CAPITALIZE: nargs(r, name, args, 0, 0); return jv_of_str(js_capitalize(z, s));
    case S_LOWER: nargs(r, name, args, 0, 0); return jv_of_str(js_lower(z, s));
    case S_UPPER: nargs(r, name, args, 0, 0); return jv_of_str(js_upper(z, s));
    case S_TITLE: nargs(r, name, args, 0, 0); return jv_of_str(js_title(z, s));
    case S_SWAPCASE: nargs(r, name, args, 0, 0); return jv_of_str(js_swapcase(z, s));
    case S_CASEFOLD:
        nargs(r, name, args, 0, 0);
        if (s->ncp != s->len) jz_unsupported(z, "str.casefold() of non-ASCII text");
        return jv_of_str(js_lower(z, s));
    case S_STRIP:
    case S_LSTRIP:
    case S_RSTRIP: {
        nargs(r, name, args, 0, 1);
        const jstr *chars = NULL;
        if (args->n && args->v[0].k != JV_NONE) chars = want_str(r, args->v[0], "strip arg must be None or str");
        return jv_of_str(js_strip(z, s, chars, fn->id != S_RSTRIP, fn->id != S_LSTRIP));
    }
    case S_SPLIT: return str_split(r, s, args, kw, false);
    case S_RSPLIT: return str_split(r, s, args, kw, true);
    case S_SPLITLINES: {
        static const char *const P[] = {"keepends"};
        jv a[1];
        bool g[1];
        jb_bind(r, "splitlines", P, 1, 0, 0, args, kw, a, g);
        return jv_of_list(js_splitlines(z, s, g[0] && jv_truthy(z, a[0])));
    }
    case S_STARTSWITH: nargs(r, name, args, 1, 3); return jv_bool(str_affix(r, s, args, false, "startswith"));
    case S_ENDSWITH: nargs(r, name, args, 1, 3); return jv_bool(str_affix(r, s, args, true, "endswith"));
    case S_FIND:
    case S_RFIND:
    case S_INDEX:
    case S_RINDEX: {
        nargs(r, name, args, 1, 3);
        const int64_t i = str_find(r, s, args, fn->id == S_RFIND || fn->id == S_RINDEX);
        if (i < 0 && (fn->id == S_INDEX || fn->id == S_RINDEX)) jz_fail(z, "ValueError", "substring not found");
        return jv_int(i);
    }
    case S_COUNT: {
        nargs(r, name, args, 1, 3);
        const jstr *sub = want_str(r, args->v[0], "must be str");
        size_t a, b;
        sub_range(r, s, args, 1, &a, &b);
        if (a > s->ncp) return jv_int(0);
        const size_t oa = js_offset(s, a), ob = js_offset(s, b);
        if (!sub->len) return jv_int((int64_t)(b - a + 1));
        int64_t c = 0;
        for (size_t i = oa; i + sub->len <= ob;) {
            const char *hit = memmem(s->p + i, ob - i, sub->p, sub->len);
            if (!hit) break;
            c++;
            i = (size_t)(hit - s->p) + sub->len;
        }
        return jv_int(c);
    }
    case S_REPLACE: {
        nargs(r, name, args, 2, 3);
        const jstr *old = want_str(r, args->v[0], "replace() argument 1 must be str");
        const jstr *nw = want_str(r, args->v[1], "replace() argument 2 must be str");
        const int64_t count = args->n > 2 ? want_int(r, args->v[2], "") : -1;
        return jv_of_str(js_replace(z, s, old, nw, count));
    }
    case S_JOIN: {
        nargs(r, name, args, 1, 1);
        const jlist *l = jv_iter_list(z, args->v[0]);
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].k != JV_STR)
                jz_fail(z, "TypeError", "sequence item %zu: expected str instance, %s found", i, jv_type_name(l->v[i]));
            if (i) jb_put(z, &b, s->p, s->len);
            jb_put(z, &b, l->v[i].s->p, l->v[i].s->len);
        }
        return jv_str(z, b.p, b.len);
    }
    case S_CENTER: return str_pad(r, s, args, 0, name);
    case S_LJUST: return str_pad(r, s, args, -1, name);
    case S_RJUST: return str_pad(r, s, args, 1, name);
    case S_ZFILL: {
        nargs(r, name, args, 1, 1);
        const int64_t width = want_int(r, args->v[0], "");
        if (width <= (int64_t)s->ncp) return jv_of_str((jstr *)s);
        if (width > (64 << 20)) jz_oom(z);
        jbuf b = {0};
        jb_put(z, &b, "", 0);
        size_t start = 0;
        if (s->len && (s->p[0] == '+' || s->p[0] == '-')) jb_putc(z, &b, s->p[start++]);
        for (int64_t i = (int64_t)s->ncp; i < width; i++) jb_putc(z, &b, '0');
        jb_put(z, &b, s->p + start, s->len - start);
        return jv_str(z, b.p, b.len);
    }
    case S_PARTITION: nargs(r, name, args, 1, 1); return partition(r, s, args->v[0], false);
    case S_RPARTITION: nargs(r, name, args, 1, 1); return partition(r, s, args->v[0], true);
    case S_REMOVEPREFIX:
    case S_REMOVESUFFIX: {
        nargs(r, name, args, 1, 1);
        const jstr *x = want_str(r, args->v[0], "must be str");
        const bool suffix = fn->id == S_REMOVESUFFIX;
        if (!affix_match(s, 0, s->len, x, suffix) || !x->len) return jv_of_str((jstr *)s);
        return suffix ? jv_str(z, s->p, s->len - x->len) : jv_str(z, s->p + x->len, s->len - x->len);
    }
    case S_FORMAT: return str_format_method(r, s, args, kw);
    case S_ISALNUM: nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, is_alnum));
    case S_ISALPHA: nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isalpha));
    case S_ISASCII: nargs(r, name, args, 0, 0); return jv_bool(s->ncp == s->len);
    case S_ISDECIMAL: nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isdecimal));
    case S_ISDIGIT: nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isdigit));
    case S_ISNUMERIC: nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isnumeric));
    case S_ISSPACE: nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isspace));
    case S_ISPRINTABLE:
        nargs(r, name, args, 0, 0);
        return jv_bool(s->len == 0 || all_cps(s, ju_isprintable));
    case S_ISLOWER: nargs(r, name, args, 0, 0); return jv_bool(js_islower(s));
    case S_ISUPPER: nargs(r, name, args, 0, 0); return jv_bool(js_isupper(s));
    case S_ISTITLE: nargs(r, name, args, 0, 0); return jv_bool(js_istitle(s));
    case S_ISIDENTIFIER: {
        nargs(r, name, args, 0, 0);
        if (!all_cps(s, is_ascii)) jz_unsupported(z, "str.isidentifier() of non-ASCII text");
        bool ok = s->len > 0 && !(s->p[0] >= '0' && s->p[0] <= '9');
        for (size_t i = 0; i < s->len && ok; i++) {
            const char c = s->p[i];
            ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        }
        return jv_bool(ok);
    }
    default: break;
    }
    jz_unsupported(z, "the method str.%s()", name);
}

jv jb_call(jrender *r, jfunc *fn, jlist *args, jdict *kw) {
    jz *z = &r->z;
    if (fn->id < G_COUNT_) return call_global(r, fn->id, args, kw);
    if (fn->id == UNSUPPORTED_METHOD) jz_unsupported(z, "the method %s.%s()", jv_type_name(fn->self), fn->name);
    if (fn->id >= S_CAPITALIZE && fn->id <= S_ZFILL) return call_str(r, fn, args, kw);
    const jv self = fn->self;
    switch (fn->id) {
    case D_GET: {
        no_kwargs(r, "get", kw);
        nargs(r, "get", args, 1, 2);
        jv out;
        if (jd_get(z, self.d, args->v[0], &out)) return out;
        return args->n > 1 ? args->v[1] : JV_NONE_V;
    }
    case D_ITEMS:
    case D_KEYS:
    case D_VALUES: {
        no_kwargs(r, fn->name, kw);
        nargs(r, fn->name, args, 0, 0);
        jlist *l = jl_new(z, self.d->n);
        for (size_t i = 0; i < self.d->n; i++)
            l->v[l->n++] = fn->id == D_KEYS ? self.d->keys[i] : fn->id == D_VALUES ? self.d->vals[i]
                         : jv_tuple2(z, self.d->keys[i], self.d->vals[i]);
        l->view = fn->id == D_KEYS ? JL_KEYS : fn->id == D_VALUES ? JL_VALUES : JL_ITEMS;
        return jv_of_list(l);
    }
    case D_COPY: {
        nargs(r, "copy", args, 0, 0);
        jdict *d = jd_new(z, self.d->n);
        for (size_t i = 0; i < self.d->n; i++) jd_set(z, d, self.d->keys[i], self.d->vals[i]);
        return jv_of_dict(d);
    }
    case L_COPY: {
        nargs(r, "copy", args, 0, 0);
        jlist *l = jl_new(z, self.l->n);
        for (size_t i = 0; i < self.l->n; i++) jl_push(z, l, self.l->v[i]);
        return jv_of_list(l);
    }
    case L_COUNT: {
        no_kwargs(r, "count", kw);
        nargs(r, "count", args, 1, 1);
        int64_t c = 0;
        for (size_t i = 0; i < self.l->n; i++) c += jv_eq(z, self.l->v[i], args->v[0]);
        return jv_int(c);
    }
    case L_INDEX: {
        no_kwargs(r, "index", kw);
        nargs(r, "index", args, 1, 3);
        for (size_t i = 0; i < self.l->n; i++)
            if (jv_eq(z, self.l->v[i], args->v[0])) return jv_int((int64_t)i);
        jbuf b = {0};
        jv_write_repr(z, &b, args->v[0]);
        if (self.k == JV_TUPLE) jz_fail(z, "ValueError", "tuple.index(x): x not in tuple");
        jz_fail(z, "ValueError", "%s is not in list", b.p);
    }
    case O_LOOP_CYCLE: {
        no_kwargs(r, "cycle", kw);
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
