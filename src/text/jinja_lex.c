/*
 * The template lexer: jinja2's tokeniter with trim_blocks and lstrip_blocks, rule for rule.
 *
 * - Line ends are normalised to \n first and one trailing newline is dropped
 *   (keep_trailing_newline=False).
 * - Text before {%, {# or {{ is cut at the tag. A '-' after the opening delimiter strips all
 *   whitespace before it; otherwise, for {% and {# (not {{) and without '+', whitespace between
 *   the last newline and the tag is dropped (lstrip_blocks) when that is all the line holds, or
 *   when the text starts the template or follows a newline the previous token ended with.
 * - %} and #} eat one following newline (trim_blocks); -%}, -}} and -#} eat all whitespace;
 *   +%} keeps it.
 * - Inside a tag, the end delimiter counts only while no bracket is open.
 * - String literals are unescaped like Python's unicode-escape codec applied after
 *   backslashreplace, which is what jinja2 does (including its quirk for a backslash before a
 *   non-ASCII character).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

typedef struct lexer {
    jz *z;
    jmp_buf fail; /* a lexing error: becomes an ERROR token */
    const char *s;
    size_t n, pos;
    int line;
    bool line_starting;
    char stack[256]; /* open brackets */
    int depth;
    jtok *toks;
    size_t ntoks, cap;
} lexer;

static void push(lexer *L, jt_kind kind, int line, jstr *s) {
    if (L->ntoks == L->cap) {
        const size_t cap = L->cap ? L->cap * 2 : 256;
        L->toks = jz_grow(L->z, L->toks, L->cap * sizeof(jtok), cap * sizeof(jtok));
        L->cap = cap;
    }
    jtok *t = &L->toks[L->ntoks++];
    t->kind = (uint8_t)kind;
    t->line = line;
    t->s = s;
}

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Python's \s at s[i]: the length of one whitespace character there, or 0 */
static size_t ws_len(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    const unsigned char c = (unsigned char)s[i];
    if (c < 0x80) return ju_isspace(c) ? 1 : 0;
    size_t j = i;
    const uint32_t cp = ju_next(s, n, &j);
    return ju_isspace(cp) ? j - i : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while ((k = ws_len(s, n, i))) i += k;
    return i;
}

/* text[0..n) with trailing whitespace removed: the length kept */
static size_t rstrip_len(const char *s, size_t n) {
    size_t keep = 0, i = 0;
    while (i < n) {
        const size_t k = ws_len(s, n, i);
        if (k) {
            i += k;
        } else {
            size_t j = i;
            ju_next(s, n, &j);
            i = j;
            keep = i;
        }
    }
    return keep;
}

static _Noreturn void lex_fail(lexer *L, int line, const char *msg) {
    L->z->line = line;
    snprintf(L->z->kind, sizeof L->z->kind, "TemplateSyntaxError");
    snprintf(L->z->msg, sizeof L->z->msg, "%s", msg);
    longjmp(L->fail, 1);
}

static _Noreturn void lex_failf(lexer *L, int line, const char *fmt, ...) TR_PRINTF(3, 4);
static _Noreturn void lex_failf(lexer *L, int line, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lex_fail(L, line, msg);
}

static _Noreturn void unexpected_char(lexer *L) {
    jbuf b = {0};
    size_t j = L->pos;
    ju_next(L->s, L->n, &j);
    jv_write_str_repr(L->z, &b, L->s + L->pos, j - L->pos);
    lex_failf(L, L->line, "unexpected char %s at %zu", b.p, ju_count(L->s, L->pos));
}

/* ---- string literals -------------------------------------------------------------------------- */

static int hexd(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static jstr *unescape(lexer *L, const char *raw, size_t n, int line) {
    jz *z = L->z;
    /* step 1: backslashreplace, non-ASCII characters become \xhh / \uhhhh / \Uhhhhhhhh */
    jbuf a = {0};
    jb_put(z, &a, "", 0);
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)raw[i] < 0x80) {
            jb_putc(z, &a, raw[i++]);
            continue;
        }
        const uint32_t c = ju_next(raw, n, &i);
        if (c <= 0xff) jb_printf(z, &a, "\\x%02x", c);
        else if (c <= 0xffff) jb_printf(z, &a, "\\u%04x", c);
        else jb_printf(z, &a, "\\U%08x", c);
    }
    /* step 2: the unicode-escape codec */
    jbuf b = {0};
    jb_put(z, &b, "", 0);
    const char *s = a.p;
    const size_t m = a.len;
    i = 0;
    while (i < m) {
        if (s[i] != '\\') {
            jb_putc(z, &b, s[i++]);
            continue;
        }
        if (i + 1 >= m) lex_fail(L, line, "\\ at end of string");
        const char e = s[i + 1];
        i += 2;
        switch (e) {
        case '\n': break;
        case '\\': jb_putc(z, &b, '\\'); break;
        case '\'': jb_putc(z, &b, '\''); break;
        case '"': jb_putc(z, &b, '"'); break;
        case 'a': jb_putc(z, &b, '\a'); break;
        case 'b': jb_putc(z, &b, '\b'); break;
        case 'f': jb_putc(z, &b, '\f'); break;
        case 'n': jb_putc(z, &b, '\n'); break;
        case 'r': jb_putc(z, &b, '\r'); break;
        case 't': jb_putc(z, &b, '\t'); break;
        case 'v': jb_putc(z, &b, '\v'); break;
        case 'x':
        case 'u':
        case 'U': {
            const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                const int h = i + (size_t)k < m ? hexd(s[i + (size_t)k]) : -1;
                if (h < 0)
                    lex_fail(L, line,
                             e == 'x' ? "truncated \\xXX escape"
                                      : e == 'u' ? "truncated \\uXXXX escape" : "truncated \\UXXXXXXXX escape");
                v = v * 16 + (uint32_t)h;
            }
            i += (size_t)digits;
            if (v > 0x10ffff) lex_fail(L, line, "illegal Unicode character");
            if (v >= 0xd800 && v <= 0xdfff) {
                z->line = line;
                jz_unsupported(z, "a string literal with a lone surrogate \\u%04x (not representable in UTF-8)", v);
            }
            jb_put_cp(z, &b, v);
            break;
        }
        case 'N':
            z->line = line;
            jz_unsupported(z, "\\N{...} escapes in string literals");
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < m && s[i] >= '0' && s[i] <= '7'; k++) v = v * 8 + (uint32_t)(s[i++] - '0');
                jb_put_cp(z, &b, v);
            } else {
                jb_putc(z, &b, '\\');
                jb_putc(z, &b, e);
            }
        }
    }
    return js_new(z, b.p, b.len);
}

/* ---- numbers ---------------------------------------------------------------------------------- */

static bool isdig(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at s[i]: end index, or i when no match */
static size_t digits_us(const char *s, size_t n, size_t i) {
    size_t j = i;
    if (j >= n || !isdig(s[j])) return i;
    for (;;) {
        while (j < n && isdig(s[j])) j++;
        if (j + 1 < n && s[j] == '_' && isdig(s[j + 1])) {
            j++;
            continue;
        }
        return j;
    }
}

/* float_re at pos: end, or 0 */
static size_t match_float(const lexer *L) {
    const char *s = L->s;
    const size_t n = L->n, p = L->pos;
    if (p > 0 && s[p - 1] == '.') return 0;
    size_t j = digits_us(s, n, p);
    if (j == p) return 0;
    size_t frac = j;
    if (j < n && s[j] == '.') {
        const size_t k = digits_us(s, n, j + 1);
        if (k > j + 1) frac = k;
    }
    /* exponent (with an optional fraction before it) */
    if (frac < n && (s[frac] == 'e' || s[frac] == 'E')) {
        size_t k = frac + 1;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        const size_t e = digits_us(s, n, k);
        if (e > k) return e;
    }
    return frac > j ? frac : 0;
}

/* integer_re at pos: end, or 0 */
static size_t match_int(const lexer *L) {
    const char *s = L->s;
    const size_t n = L->n, p = L->pos;
    if (p >= n || !isdig(s[p])) return 0;
    if (s[p] == '0' && p + 1 < n && strchr("bBoOxX", s[p + 1]) && s[p + 1]) {
        const char kind = (char)(s[p + 1] | 32);
        size_t j = p + 2;
        bool any = false;
        for (;;) {
            size_t k = j;
            if (k < n && s[k] == '_') k++;
            if (k >= n) break;
            const char c = s[k];
            const bool ok = kind == 'b' ? (c == '0' || c == '1')
                          : kind == 'o' ? (c >= '0' && c <= '7')
                                        : hexd(c) >= 0;
            if (!ok) break;
            j = k + 1;
            any = true;
        }
        if (any) return j;
    }
    size_t j = p + 1;
    if (s[p] == '0') {
        for (;;) {
            size_t k = j;
            if (k < n && s[k] == '_') k++;
            if (k < n && s[k] == '0') j = k + 1;
            else break;
        }
        return j;
    }
    for (;;) {
        size_t k = j;
        if (k < n && s[k] == '_') k++;
        if (k < n && isdig(s[k])) j = k + 1;
        else break;
    }
    return j;
}

static void number_token(lexer *L, size_t end, bool is_float) {
    char tmp[128];
    size_t k = 0;
    for (size_t i = L->pos; i < end; i++) {
        if (L->s[i] == '_') continue;
        if (k + 1 >= sizeof tmp) {
            L->z->line = L->line;
            jz_unsupported(L->z, "a number literal longer than %zu digits", sizeof tmp - 1);
        }
        tmp[k++] = L->s[i];
    }
    tmp[k] = '\0';
    push(L, is_float ? JT_FLOAT : JT_INT, L->line, NULL);
    jtok *t = &L->toks[L->ntoks - 1];
    errno = 0;
    if (is_float) {
        t->f = strtod(tmp, NULL);
    } else {
        int base = 10;
        const char *digits = tmp;
        if (tmp[0] == '0' && (tmp[1] | 32) == 'x') base = 16, digits = tmp + 2;
        else if (tmp[0] == '0' && (tmp[1] | 32) == 'o') base = 8, digits = tmp + 2;
        else if (tmp[0] == '0' && (tmp[1] | 32) == 'b') base = 2, digits = tmp + 2;
        const unsigned long long v = strtoull(digits, NULL, base);
        if (errno || v > INT64_MAX) {
            L->z->line = L->line;
            jz_unsupported(L->z, "the integer literal %s (beyond 64 bits)", tmp);
        }
        t->i = (int64_t)v;
    }
    L->pos = end;
}

/* ---- operators -------------------------------------------------------------------------------- */

static const struct {
    const char *s;
    jt_kind k;
} k_ops[] = {
    {"//", JT_FLOORDIV}, {"**", JT_POW}, {"==", JT_EQ}, {"!=", JT_NE}, {">=", JT_GTEQ},
    {"<=", JT_LTEQ}, {"+", JT_ADD}, {"-", JT_SUB}, {"/", JT_DIV}, {"*", JT_MUL}, {"%", JT_MOD},
    {"~", JT_TILDE}, {"[", JT_LBRACKET}, {"]", JT_RBRACKET}, {"(", JT_LPAREN}, {")", JT_RPAREN},
    {"{", JT_LBRACE}, {"}", JT_RBRACE}, {">", JT_GT}, {"<", JT_LT}, {"=", JT_ASSIGN},
    {".", JT_DOT}, {":", JT_COLON}, {"|", JT_PIPE}, {",", JT_COMMA}, {";", JT_SEMICOLON},
};

const char *jt_describe(const jtok *t) {
    switch ((jt_kind)t->kind) {
    case JT_NAME: return t->s->p;
    case JT_EOF: return "end of template";
    case JT_DATA: return "template data / text";
    case JT_VAR_BEGIN: return "begin of print statement";
    case JT_VAR_END: return "end of print statement";
    case JT_BLOCK_BEGIN: return "begin of statement block";
    case JT_BLOCK_END: return "end of statement block";
    case JT_STRING: return "string";
    case JT_INT: return "integer";
    case JT_FLOAT: return "float";
    default:
        for (size_t i = 0; i < sizeof k_ops / sizeof k_ops[0]; i++)
            if (k_ops[i].k == t->kind) return k_ops[i].s;
        return "?";
    }
}

/* ---- the states ------------------------------------------------------------------------------- */

static bool at(const lexer *L, size_t i, const char *lit) {
    const size_t n = strlen(lit);
    return L->n - i >= n && !memcmp(L->s + i, lit, n);
}

/* whitespace-only from s[a] to s[b) (and at least one character) */
static bool all_ws(const char *s, size_t a, size_t b) {
    if (a >= b) return false;
    while (a < b) {
        const size_t k = ws_len(s, b, a);
        if (!k) return false;
        a += k;
    }
    return true;
}

/* emits the text before a tag with the strip/lstrip rules; `sign` is '-', '+' or 0 */
static void emit_text(lexer *L, size_t start, size_t end, char sign, bool is_var) {
    size_t keep = end - start;
    int stripped_nl = 0;
    const char *text = L->s + start;
    if (sign == '-') {
        keep = rstrip_len(text, end - start);
        stripped_nl = count_nl(text + keep, end - start - keep);
    } else if (sign != '+' && !is_var) {
        size_t l_pos = end - start;
        while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
        if ((l_pos > 0 || L->line_starting) && all_ws(text, l_pos, end - start)) keep = l_pos;
    }
    if (keep) push(L, JT_DATA, L->line, js_new(L->z, text, keep));
    L->line += count_nl(text, keep) + stripped_nl;
}

/* a block end at pos: %}, -%}\s*, +%} (trim_blocks: %} eats one \n); returns its end or 0 */
static size_t block_end_at(const lexer *L, size_t p, const char *delim) {
    if (at(L, p, "+") && at(L, p + 1, delim)) return p + 3;
    if (at(L, p, "-") && at(L, p + 1, delim)) return skip_ws(L->s, L->n, p + 3);
    if (at(L, p, delim)) return p + 2 + (p + 2 < L->n && L->s[p + 2] == '\n');
    return 0;
}

static void lex_comment(lexer *L) {
    size_t p = L->pos, end = 0;
    for (; p < L->n; p++) {
        if ((end = block_end_at(L, p, "#}"))) break;
    }
    if (!end) lex_fail(L, L->line, "Missing end of comment tag");
    L->line += count_nl(L->s + L->pos, end - L->pos);
    L->line_starting = L->s[end - 1] == '\n';
    L->pos = end;
}

static void lex_raw(lexer *L) {
    /* (.*?)({%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)) */
    for (size_t p = L->pos; p + 1 < L->n; p++) {
        if (!at(L, p, "{%")) continue;
        size_t q = p + 2;
        char sign = 0;
        if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) sign = L->s[q++];
        q = skip_ws(L->s, L->n, q);
        if (!at(L, q, "endraw")) continue;
        q = skip_ws(L->s, L->n, q + 6);
        const size_t end = block_end_at(L, q, "%}");
        if (!end) continue;
        emit_text(L, L->pos, p, sign, false);
        L->line += count_nl(L->s + p, end - p);
        L->line_starting = L->s[end - 1] == '\n';
        L->pos = end;
        return;
    }
    lex_fail(L, L->line, "Missing end of raw directive");
}

/* inside {{ }} or {% %}: tokens until the end delimiter */
static void lex_tag(lexer *L, bool is_var) {
    const char *delim = is_var ? "}}" : "%}";
    for (;;) {
        if (L->pos >= L->n) return; /* jinja2 stops quietly; the parser reports the missing end */
        if (L->depth == 0) {
            size_t end = 0;
            if (is_var) {
                if (at(L, L->pos, "-}}")) end = skip_ws(L->s, L->n, L->pos + 3);
                else if (at(L, L->pos, "}}")) end = L->pos + 2;
            } else {
                end = block_end_at(L, L->pos, "%}");
            }
            if (end) {
                push(L, is_var ? JT_VAR_END : JT_BLOCK_END, L->line, NULL);
                L->line += count_nl(L->s + L->pos, end - L->pos);
                L->line_starting = L->s[end - 1] == '\n';
                L->pos = end;
                return;
            }
        }
        (void)delim;
        const size_t w = skip_ws(L->s, L->n, L->pos);
        if (w > L->pos) {
            L->line += count_nl(L->s + L->pos, w - L->pos);
            L->line_starting = L->s[w - 1] == '\n';
            L->pos = w;
            continue;
        }
        L->line_starting = false;
        const char c = L->s[L->pos];
        size_t e;
        if ((e = match_float(L))) {
            number_token(L, e, true);
            continue;
        }
        if ((e = match_int(L))) {
            number_token(L, e, false);
            continue;
        }
        if ((c | 32) >= 'a' && (c | 32) <= 'z') goto name;
        if (c == '_') goto name;
        if ((unsigned char)c >= 0x80) {
            size_t j = L->pos;
            const uint32_t cp = ju_next(L->s, L->n, &j);
            if (ju_isalpha(cp)) {
                L->z->line = L->line;
                jz_unsupported(L->z, "non-ASCII names");
            }
            unexpected_char(L);
        }
        if (c == '\'' || c == '"') {
            size_t j = L->pos + 1;
            while (j < L->n && L->s[j] != c) j += L->s[j] == '\\' ? 2 : 1;
            if (j >= L->n) unexpected_char(L);
            const int line = L->line;
            push(L, JT_STRING, line, unescape(L, L->s + L->pos + 1, j - L->pos - 1, line));
            L->line += count_nl(L->s + L->pos, j + 1 - L->pos);
            L->pos = j + 1;
            continue;
        }
        for (size_t k = 0; k < sizeof k_ops / sizeof k_ops[0]; k++) {
            if (!at(L, L->pos, k_ops[k].s)) continue;
            const jt_kind op = k_ops[k].k;
            if (op == JT_LPAREN || op == JT_LBRACKET || op == JT_LBRACE) {
                if (L->depth == (int)sizeof L->stack) {
                    L->z->line = L->line;
                    jz_unsupported(L->z, "brackets nested more than %zu deep", sizeof L->stack);
                }
                L->stack[L->depth++] = op == JT_LPAREN ? ')' : op == JT_LBRACKET ? ']' : '}';
            } else if (op == JT_RPAREN || op == JT_RBRACKET || op == JT_RBRACE) {
                if (L->depth == 0) lex_failf(L, L->line, "unexpected '%c'", c);
                const char want = L->stack[--L->depth];
                if (want != c) lex_failf(L, L->line, "unexpected '%c', expected '%c'", c, want);
            }
            push(L, op, L->line, NULL);
            L->pos += strlen(k_ops[k].s);
            goto next;
        }
        unexpected_char(L);
    name: {
        size_t j = L->pos;
        while (j < L->n && (((L->s[j] | 32) >= 'a' && (L->s[j] | 32) <= 'z') || isdig(L->s[j]) ||
                            L->s[j] == '_'))
            j++;
        if (j < L->n && (unsigned char)L->s[j] >= 0x80) {
            size_t q = j;
            const uint32_t cp = ju_next(L->s, L->n, &q);
            if (ju_isalpha(cp) || ju_isdigit(cp)) {
                L->z->line = L->line;
                jz_unsupported(L->z, "non-ASCII names");
            }
        }
        push(L, JT_NAME, L->line, js_new(L->z, L->s + L->pos, j - L->pos));
        L->pos = j;
    }
    next:;
    }
}

void jlex(jz *z, const char *src, size_t len, jtok **toks, size_t *ntoks) {
    /* newline normalisation and the dropped trailing newline */
    char *s = jz_alloc(z, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    lexer L = {.z = z, .s = s, .n = n, .line = 1, .line_starting = true};
    if (setjmp(L.fail)) {
        push(&L, JT_ERROR, z->line, js_cstr(z, z->msg));
        L.toks[L.ntoks - 1].err_kind = "TemplateSyntaxError";
        *toks = L.toks;
        *ntoks = L.ntoks;
        return;
    }
    while (L.pos < L.n) {
        /* the next {{, {% or {# */
        size_t p = L.pos;
        while (p + 1 < L.n && !(s[p] == '{' && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#'))) p++;
        if (p + 1 >= L.n) {
            push(&L, JT_DATA, L.line, js_new(z, s + L.pos, L.n - L.pos));
            L.line += count_nl(s + L.pos, L.n - L.pos);
            L.pos = L.n;
            break;
        }
        const char kind = s[p + 1];
        char sign = 0;
        size_t q = p + 2;
        if (q < L.n && (s[q] == '-' || s[q] == '+')) sign = s[q++];
        /* {% raw %} */
        if (kind == '%') {
            size_t r = skip_ws(s, L.n, q);
            if (at(&L, r, "raw")) {
                r = skip_ws(s, L.n, r + 3);
                size_t end = 0;
                if (at(&L, r, "-%}")) end = skip_ws(s, L.n, r + 3);
                else if (at(&L, r, "%}")) end = r + 2;
                if (end) {
                    emit_text(&L, L.pos, p, sign, false);
                    L.line += count_nl(s + p, end - p);
                    L.line_starting = s[end - 1] == '\n';
                    L.pos = end;
                    lex_raw(&L);
                    continue;
                }
            }
        }
        emit_text(&L, L.pos, p, sign, kind == '{');
        L.line_starting = false;
        L.pos = q;
        if (kind == '#') {
            lex_comment(&L);
            continue;
        }
        push(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, L.line, NULL);
        L.depth = 0;
        lex_tag(&L, kind == '{');
    }
    push(&L, JT_EOF, L.line, NULL);
    *toks = L.toks;
    *ntoks = L.ntoks;
}
