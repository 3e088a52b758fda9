/*
 * UTF-8 decoding and Python's Unicode predicates and case mappings for the template engine.
 * The tables are generated from the Python the tests compare with (scripts/gen_unicode_tables.py),
 * so str.isspace(), isprintable() (repr's escaping), upper() ... agree with it code point for
 * code point.
 */
#include <stdlib.h>

#include "text/jinja_internal.h"

typedef struct ju_map {
    uint32_t cp;
    uint32_t m[3];
} ju_map;

#include "text/jinja_unicode_tables.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

bool ju_isspace(uint32_t c) {
    if (c < 128) return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f);
    return in_ranges(ut_space, N_OF(ut_space), c);
}
bool ju_isprintable(uint32_t c) {
    if (c < 128) return c >= 0x20 && c < 0x7f;
    return !in_ranges(ut_nonprint, N_OF(ut_nonprint), c);
}
bool ju_isalpha(uint32_t c) {
    if (c < 128) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return in_ranges(ut_alpha, N_OF(ut_alpha), c);
}
bool ju_isdecimal(uint32_t c) {
    if (c < 128) return c >= '0' && c <= '9';
    return in_ranges(ut_decimal, N_OF(ut_decimal), c);
}
bool ju_isdigit(uint32_t c) {
    if (c < 128) return c >= '0' && c <= '9';
    return in_ranges(ut_digit, N_OF(ut_digit), c);
}
bool ju_isnumeric(uint32_t c) {
    if (c < 128) return c >= '0' && c <= '9';
    return in_ranges(ut_numeric, N_OF(ut_numeric), c);
}
bool ju_islower(uint32_t c) {
    if (c < 128) return c >= 'a' && c <= 'z';
    return in_ranges(ut_lower, N_OF(ut_lower), c);
}
bool ju_isupper(uint32_t c) {
    if (c < 128) return c >= 'A' && c <= 'Z';
    return in_ranges(ut_upper, N_OF(ut_upper), c);
}
bool ju_iscased(uint32_t c) {
    if (c < 128) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return in_ranges(ut_cased, N_OF(ut_cased), c);
}
bool ju_case_ignorable(uint32_t c) { return in_ranges(ut_case_ignorable, N_OF(ut_case_ignorable), c); }

static int map_one(const ju_map *t, size_t n, uint32_t c, uint32_t out[3]) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (c < t[mid].cp) hi = mid;
        else if (c > t[mid].cp) lo = mid + 1;
        else {
            out[0] = t[mid].m[0];
            out[1] = t[mid].m[1];
            out[2] = t[mid].m[2];
            return out[2] ? 3 : out[1] ? 2 : 1;
        }
    }
    out[0] = c;
    return 1;
}

int ju_upper(uint32_t c, uint32_t out[3]) {
    if (c < 128) {
        out[0] = c >= 'a' && c <= 'z' ? c - 32 : c;
        return 1;
    }
    return map_one(ut_map_upper, N_OF(ut_map_upper), c, out);
}
int ju_lower(uint32_t c, uint32_t out[3]) {
    if (c < 128) {
        out[0] = c >= 'A' && c <= 'Z' ? c + 32 : c;
        return 1;
    }
    return map_one(ut_map_lower, N_OF(ut_map_lower), c, out);
}
int ju_title(uint32_t c, uint32_t out[3]) {
    if (c < 128) return ju_upper(c, out);
    return map_one(ut_map_title, N_OF(ut_map_title), c, out);
}

uint32_t ju_next(const char *s, size_t len, size_t *i) {
    const unsigned char *p = (const unsigned char *)s + *i;
    const size_t left = len - *i;
    const unsigned c = p[0];
    if (c < 0x80 || left < 2) {
        *i += 1;
        return c;
    }
    if (c < 0xe0) {
        *i += 2;
        return ((c & 0x1fu) << 6) | (p[1] & 0x3fu);
    }
    if (c < 0xf0 || left < 4) {
        *i += left < 3 ? left : 3;
        return left < 3 ? 0xfffd : ((c & 0x0fu) << 12) | ((p[1] & 0x3fu) << 6) | (p[2] & 0x3fu);
    }
    *i += 4;
    return ((c & 0x07u) << 18) | ((p[1] & 0x3fu) << 12) | ((p[2] & 0x3fu) << 6) | (p[3] & 0x3fu);
}

size_t ju_count(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

bool ju_valid(const char *s, size_t len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        const unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07, min = 0x10000;
        else return false;
        if (len - i < n) return false;
        for (size_t k = 1; k < n; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += n;
    }
    return true;
}
