/*
 * Model metadata for applications: name, a one-line description, parameter count, and any key's
 * value rendered as text (what llama.cpp's llama_model_meta_* calls give). Everything is read from
 * the open GGUF on demand; nothing here is on a hot path.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"

const char *tr_version(void) { return TR_VERSION_STRING; }

const char *tr_model_name(const tr_model *m) { return m->name; }

uint64_t tr_model_n_params(const tr_model *m) {
    uint64_t n = 0;
    for (int64_t i = 0; i < tr_gguf_n_tensors(m->gguf); i++) {
        const tr_tensor_info *t = tr_gguf_tensor(m->gguf, i);
        uint64_t e = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) e *= (uint64_t)t->ne[d];
        n += e;
    }
    return n;
}

const char *tr_file_type_name(int64_t ft) {
    /* llama.cpp's llama_ftype names (LLAMA_FTYPE_MOSTLY_*); 1024 is its "guessed" flag */
    static const struct {
        int id;
        const char *name;
    } k[] = {{0, "ALL_F32"},  {1, "F16"},      {2, "Q4_0"},     {3, "Q4_1"},    {7, "Q8_0"},
             {8, "Q5_0"},     {9, "Q5_1"},     {10, "Q2_K"},    {11, "Q3_K_S"}, {12, "Q3_K_M"},
             {13, "Q3_K_L"},  {14, "Q4_K_S"},  {15, "Q4_K_M"},  {16, "Q5_K_S"}, {17, "Q5_K_M"},
             {18, "Q6_K"},    {19, "IQ2_XXS"}, {20, "IQ2_XS"},  {21, "Q2_K_S"}, {22, "IQ3_XS"},
             {23, "IQ3_XXS"}, {24, "IQ1_S"},   {25, "IQ4_NL"},  {26, "IQ3_S"},  {27, "IQ3_M"},
             {28, "IQ2_S"},   {29, "IQ2_M"},   {30, "IQ4_XS"},  {31, "IQ1_M"},  {32, "BF16"},
             {36, "TQ1_0"},   {37, "TQ2_0"},   {38, "MXFP4_MOE"}};
    const int64_t base = ft & ~(int64_t)1024;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].id == base) return k[i].name;
    return "unknown";
}

/* snprintf into a growing text that keeps counting past the buffer's end */
typedef struct tr_out {
    char *buf;
    size_t cap, len;
} tr_out;

static void out_fmt(tr_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_fmt(tr_out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const size_t room = o->len < o->cap ? o->cap - o->len : 0;
    const int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static void out_bytes(tr_out *o, const char *s, size_t n) {
    if (o->len < o->cap) {
        const size_t room = o->cap - o->len - 1; /* keep one byte for the NUL */
        memcpy(o->buf + o->len, s, n < room ? n : room);
    }
    o->len += n;
    if (o->cap) o->buf[o->len < o->cap ? o->len : o->cap - 1] = '\0';
}

/* a string as a JSON string literal (control characters escaped; bytes >= 0x80 kept) */
static void out_quoted(tr_out *o, tr_str s) {
    out_bytes(o, "\"", 1);
    for (uint64_t i = 0; i < s.len; i++) {
        const unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\') {
            const char e[2] = {'\\', (char)c};
            out_bytes(o, e, 2);
        } else if (c == '\n') {
            out_bytes(o, "\\n", 2);
        } else if (c == '\t') {
            out_bytes(o, "\\t", 2);
        } else if (c == '\r') {
            out_bytes(o, "\\r", 2);
        } else if (c < 0x20) {
            out_fmt(o, "\\u%04x", c);
        } else {
            out_bytes(o, (const char *)&c, 1);
        }
    }
    out_bytes(o, "\"", 1);
}

/* one numeric value of type t at p (little-endian, as GGUF stores it) */
static void out_number(tr_out *o, tr_gguf_vtype t, const unsigned char *p) {
    switch (t) {
    case TR_GGUF_U8: out_fmt(o, "%u", (unsigned)p[0]); break;
    case TR_GGUF_I8: out_fmt(o, "%d", (int)(int8_t)p[0]); break;
    case TR_GGUF_BOOL: out_fmt(o, "%s", p[0] ? "true" : "false"); break;
    case TR_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); out_fmt(o, "%u", (unsigned)v); break; }
    case TR_GGUF_I16: { int16_t v; memcpy(&v, p, 2); out_fmt(o, "%d", (int)v); break; }
    case TR_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); out_fmt(o, "%" PRIu32, v); break; }
    case TR_GGUF_I32: { int32_t v; memcpy(&v, p, 4); out_fmt(o, "%" PRId32, v); break; }
    case TR_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); out_fmt(o, "%" PRIu64, v); break; }
    case TR_GGUF_I64: { int64_t v; memcpy(&v, p, 8); out_fmt(o, "%" PRId64, v); break; }
    case TR_GGUF_F32: { float v; memcpy(&v, p, 4); out_fmt(o, "%.9g", (double)v); break; }
    case TR_GGUF_F64: { double v; memcpy(&v, p, 8); out_fmt(o, "%.17g", v); break; }
    default: out_fmt(o, "?"); break;
    }
}

static size_t vtype_size(tr_gguf_vtype t) {
    switch (t) {
    case TR_GGUF_U8: case TR_GGUF_I8: case TR_GGUF_BOOL: return 1;
    case TR_GGUF_U16: case TR_GGUF_I16: return 2;
    case TR_GGUF_U32: case TR_GGUF_I32: case TR_GGUF_F32: return 4;
    case TR_GGUF_U64: case TR_GGUF_I64: case TR_GGUF_F64: return 8;
    default: return 0;
    }
}

int64_t tr_model_meta_count(const tr_model *m) { return tr_gguf_n_kv(m->gguf); }

const char *tr_model_meta_key(const tr_model *m, int64_t i) {
    if (i < 0 || i >= tr_gguf_n_kv(m->gguf)) return NULL;
    return tr_gguf_key(m->gguf, i);
}

int tr_model_meta_val_at(const tr_model *m, int64_t i, char *buf, size_t cap) {
    const tr_gguf *g = m->gguf;
    if (i < 0 || i >= tr_gguf_n_kv(g)) return -1;
    tr_out o = {buf, buf ? cap : 0, 0};
    if (o.cap) buf[0] = '\0';
    const tr_gguf_vtype t = tr_gguf_kv_type(g, i);
    if (t == TR_GGUF_STRING) {
        const tr_str s = tr_gguf_get_str(g, i);
        out_bytes(&o, s.ptr, (size_t)s.len);
    } else if (t == TR_GGUF_ARRAY) {
        const tr_gguf_vtype et = tr_gguf_arr_type(g, i);
        const uint64_t n = tr_gguf_arr_len(g, i);
        const unsigned char *d = tr_gguf_arr_data(g, i);
        const size_t es = vtype_size(et);
        out_bytes(&o, "[", 1);
        for (uint64_t j = 0; j < n; j++) {
            if (j) out_bytes(&o, ", ", 2);
            if (et == TR_GGUF_STRING) out_quoted(&o, tr_gguf_arr_str(g, i, j));
            else if (es && d) out_number(&o, et, d + j * es);
            else out_bytes(&o, "?", 1); /* nested arrays: GGUF allows them, nothing uses them */
        }
        out_bytes(&o, "]", 1);
    } else {
        /* scalars: the reader keeps them as their bytes; go through the typed getters */
        int64_t iv;
        uint64_t uv;
        double fv;
        if (t == TR_GGUF_BOOL) out_fmt(&o, "%s", tr_gguf_get_int(g, i, &iv) && iv ? "true" : "false");
        else if (t == TR_GGUF_F32 && tr_gguf_get_float(g, i, &fv)) out_fmt(&o, "%.9g", fv);
        else if (t == TR_GGUF_F64 && tr_gguf_get_float(g, i, &fv)) out_fmt(&o, "%.17g", fv);
        else if (t == TR_GGUF_U64 && tr_gguf_get_u64(g, i, &uv)) out_fmt(&o, "%" PRIu64, uv);
        else if (tr_gguf_get_int(g, i, &iv)) out_fmt(&o, "%" PRId64, iv);
        else out_fmt(&o, "?");
    }
    return o.len > (size_t)INT32_MAX ? INT32_MAX : (int)o.len;
}

int tr_model_meta_val(const tr_model *m, const char *key, char *buf, size_t cap) {
    if (!key) return -1;
    return tr_model_meta_val_at(m, tr_gguf_find_key(m->gguf, key), buf, cap);
}

int tr_model_desc(const tr_model *m, char *buf, size_t cap) {
    const uint64_t n = tr_model_n_params(m);
    char size[32];
    if (n >= 1000000000ull) snprintf(size, sizeof size, "%.1fB", (double)n / 1e9);
    else snprintf(size, sizeof size, "%.0fM", (double)n / 1e6);
    int64_t ft;
    const char *type = tr_gguf_kv_int(m->gguf, "general.file_type", &ft) ? tr_file_type_name(ft)
                                                                         : "unknown type";
    return snprintf(buf, buf ? cap : 0, "%s %s %s", m->arch_name, size, type);
}
