#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* "terrace: <what>: <message>\n" with the message's control characters escaped: messages quote
 * strings from files (architecture names, token texts, tensor names), which must not reach the
 * terminal as escape sequences */
static void report(const char *what, const char *fmt, va_list ap) {
    char small[2048];
    va_list copy;
    va_copy(copy, ap);
    const int n = vsnprintf(small, sizeof small, fmt, copy);
    va_end(copy);
    char *msg = small;
    if (n >= (int)sizeof small && (msg = malloc((size_t)n + 1)) != NULL)
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
    if (!msg) msg = small; /* out of memory: the cut message */
    fprintf(stderr, "terrace: %s: ", what);
    cli_print_escaped(stderr, msg, strlen(msg), 0);
    fputc('\n', stderr);
    if (msg != small) free(msg);
}

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report("error", fmt, ap);
    va_end(ap);
}

void cli_warning(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report("warning", fmt, ap);
    va_end(ap);
}

const char *cli_bytes(unsigned long long n, char *buf, size_t cap) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%llu B", n);
    else snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

/* length of the valid UTF-8 sequence at s (1..4), or 0 if invalid */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

void cli_print_escaped(FILE *f, const char *s, size_t len, size_t max_chars) {
    const unsigned char *p = (const unsigned char *)s;
    size_t shown = 0;
    for (size_t i = 0; i < len;) {
        if (max_chars && shown >= max_chars) {
            fputs("...", f);
            return;
        }
        const size_t k = utf8_seq(p + i, len - i);
        if (k == 0) {
            fprintf(f, "\\x%02x", p[i]);
            i++;
        } else if (k == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0) {
            /* U+0080..U+009F: C1 controls, which some terminals obey (U+009B is CSI) */
            fprintf(f, "\\u%04x", p[i + 1]);
            i += 2;
        } else if (k == 1 && (p[i] < 0x20 || p[i] == 0x7f)) {
            if (p[i] == '\n') fputs("\\n", f);
            else if (p[i] == '\t') fputs("\\t", f);
            else if (p[i] == '\r') fputs("\\r", f);
            else fprintf(f, "\\x%02x", p[i]);
            i++;
        } else {
            fwrite(p + i, 1, k, f);
            i += k;
        }
        shown++;
    }
}

char *cli_utf8_sanitize(const char *s, size_t len) {
    /* worst case every byte becomes the 3-byte U+FFFD */
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        const size_t k = utf8_seq(p + i, len - i);
        if (k == 0 || (k == 1 && p[i] == 0)) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        }
    }
    out[o] = '\0';
    return out;
}

int cli_parse_int(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end != '\0' || x < lo || x > hi) {
        cli_error("%s expects an integer in %ld..%ld, got '%s'", flag, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int cli_parse_size(const char *flag, const char *v, unsigned long long *out) {
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    double mul = 1.0;
    if (end != v) {
        switch (*end) {
        case 'k': case 'K': mul = 1024.0; end++; break;
        case 'm': case 'M': mul = 1024.0 * 1024.0; end++; break;
        case 'g': case 'G': mul = 1024.0 * 1024.0 * 1024.0; end++; break;
        case 't': case 'T': mul = 1024.0 * 1024.0 * 1024.0 * 1024.0; end++; break;
        default: break;
        }
        if ((*end == 'i' || *end == 'I') && mul > 1.0) end++;
        if ((*end == 'b' || *end == 'B')) end++;
    }
    if (errno || end == v || *end || !(x >= 0) || x * mul > 1.8e19) {
        cli_error("%s expects a size like 512M, 2G or 1073741824, got '%s'", flag, v);
        return 0;
    }
    *out = (unsigned long long)(x * mul);
    return 1;
}

char *cli_escape(const char *s, size_t len, size_t max_chars) {
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (!f) return NULL;
    cli_print_escaped(f, s, len, max_chars);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
