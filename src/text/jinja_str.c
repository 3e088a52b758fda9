/*
 * Python's str methods as templates call them (message.content.split('</think>'),
 * name.startswith(...), '{} {}'.format(...)): indexed by code point, with Python's whitespace,
 * case mappings (final sigma, ß -> SS) and argument rules.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

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
    if (args->n > first && args->v[first].k != JV_NONE) lo = jb_want_int(r, args->v[first], "");
    if (args->n > first + 1 && args->v[first + 1].k != JV_NONE) hi = jb_want_int(r, args->v[first + 1], "");
    if (lo < 0) lo = lo + n < 0 ? 0 : lo + n;
    if (hi < 0) hi = hi + n < 0 ? 0 : hi + n;
    if (hi > n) hi = n;
    *a = (size_t)lo;
    *b = (size_t)(hi < lo ? lo : hi);
    if (lo > n) *a = *b = (size_t)n + 1; /* an empty range past the end: nothing matches */
}

static int64_t cp_index(const jstr *s, size_t byte_off) { return (int64_t)ju_count(s->p, byte_off); }

static int64_t str_find(jrender *r, const jstr *s, const jlist *args, bool reverse) {
    const jstr *sub = jb_want_str(r, args->v[0], "must be str");
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
            const jstr *e = jb_want_str(r, x.l->v[i], "tuple for startswith must only contain str");
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
    int64_t maxsplit = g[1] ? jb_want_int(r, a[1], "") : -1;
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
    const jstr *sep = jb_want_str(r, a[0], "must be str or None");
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
    jb_nargs(r, fn, args, 1, 2);
    const int64_t width = jb_want_int(r, args->v[0], "");
    uint32_t fill = ' ';
    if (args->n > 1) {
        const jstr *f = jb_want_str(r, args->v[1], "The fill character must be a unicode character");
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

static jv partition(jrender *r, const jstr *s, jv sepv, bool right) {
    jz *z = &r->z;
    const jstr *sep = jb_want_str(r, sepv, "must be str");
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

jv jb_call_str(jrender *r, jfunc *fn, jlist *args, jdict *kw) {
    jz *z = &r->z;
    const jstr *s = fn->self.s;
    const char *name = fn->name;
    if (fn->id != S_SPLIT && fn->id != S_RSPLIT && fn->id != S_FORMAT && fn->id != S_SPLITLINES)
        jb_no_kwargs(r, name, kw);
    switch (fn->id) {
    case S_CAPITALIZE: jb_nargs(r, name, args, 0, 0); return jv_of_str(js_capitalize(z, s));
    case S_LOWER: jb_nargs(r, name, args, 0, 0); return jv_of_str(js_lower(z, s));
    case S_UPPER: jb_nargs(r, name, args, 0, 0); return jv_of_str(js_upper(z, s));
    case S_TITLE: jb_nargs(r, name, args, 0, 0); return jv_of_str(js_title(z, s));
    case S_SWAPCASE: jb_nargs(r, name, args, 0, 0); return jv_of_str(js_swapcase(z, s));
    case S_CASEFOLD:
        jb_nargs(r, name, args, 0, 0);
        if (s->ncp != s->len) jz_unsupported(z, "str.casefold() of non-ASCII text");
        return jv_of_str(js_lower(z, s));
    case S_STRIP:
    case S_LSTRIP:
    case S_RSTRIP: {
        jb_nargs(r, name, args, 0, 1);
        const jstr *chars = NULL;
        if (args->n && args->v[0].k != JV_NONE) chars = jb_want_str(r, args->v[0], "strip arg must be None or str");
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
    case S_STARTSWITH: jb_nargs(r, name, args, 1, 3); return jv_bool(str_affix(r, s, args, false, "startswith"));
    case S_ENDSWITH: jb_nargs(r, name, args, 1, 3); return jv_bool(str_affix(r, s, args, true, "endswith"));
    case S_FIND:
    case S_RFIND:
    case S_INDEX:
    case S_RINDEX: {
        jb_nargs(r, name, args, 1, 3);
        const int64_t i = str_find(r, s, args, fn->id == S_RFIND || fn->id == S_RINDEX);
        if (i < 0 && (fn->id == S_INDEX || fn->id == S_RINDEX)) jz_fail(z, "ValueError", "substring not found");
        return jv_int(i);
    }
    case S_COUNT: {
        jb_nargs(r, name, args, 1, 3);
        const jstr *sub = jb_want_str(r, args->v[0], "must be str");
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
        jb_nargs(r, name, args, 2, 3);
        const jstr *old = jb_want_str(r, args->v[0], "replace() argument 1 must be str");
        const jstr *nw = jb_want_str(r, args->v[1], "replace() argument 2 must be str");
        const int64_t count = args->n > 2 ? jb_want_int(r, args->v[2], "") : -1;
        return jv_of_str(js_replace(z, s, old, nw, count));
    }
    case S_JOIN: {
        jb_nargs(r, name, args, 1, 1);
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
        jb_nargs(r, name, args, 1, 1);
        const int64_t width = jb_want_int(r, args->v[0], "");
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
    case S_PARTITION: jb_nargs(r, name, args, 1, 1); return partition(r, s, args->v[0], false);
    case S_RPARTITION: jb_nargs(r, name, args, 1, 1); return partition(r, s, args->v[0], true);
    case S_REMOVEPREFIX:
    case S_REMOVESUFFIX: {
        jb_nargs(r, name, args, 1, 1);
        const jstr *x = jb_want_str(r, args->v[0], "must be str");
        const bool suffix = fn->id == S_REMOVESUFFIX;
        if (!affix_match(s, 0, s->len, x, suffix) || !x->len) return jv_of_str((jstr *)s);
        return suffix ? jv_str(z, s->p, s->len - x->len) : jv_str(z, s->p + x->len, s->len - x->len);
    }
    case S_FORMAT: return str_format_method(r, s, args, kw);
    case S_ISALNUM: jb_nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, is_alnum));
    case S_ISALPHA: jb_nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isalpha));
    case S_ISASCII: jb_nargs(r, name, args, 0, 0); return jv_bool(s->ncp == s->len);
    case S_ISDECIMAL: jb_nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isdecimal));
    case S_ISDIGIT: jb_nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isdigit));
    case S_ISNUMERIC: jb_nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isnumeric));
    case S_ISSPACE: jb_nargs(r, name, args, 0, 0); return jv_bool(all_cps(s, ju_isspace));
    case S_ISPRINTABLE:
        jb_nargs(r, name, args, 0, 0);
        return jv_bool(s->len == 0 || all_cps(s, ju_isprintable));
    case S_ISLOWER: jb_nargs(r, name, args, 0, 0); return jv_bool(js_islower(s));
    case S_ISUPPER: jb_nargs(r, name, args, 0, 0); return jv_bool(js_isupper(s));
    case S_ISTITLE: jb_nargs(r, name, args, 0, 0); return jv_bool(js_istitle(s));
    case S_ISIDENTIFIER: {
        jb_nargs(r, name, args, 0, 0);
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

