/*
 * Route trace reader and writer (format in trace.h). The reader is strict: a trace that decides
 * what an expert policy is worth must not be half-read, so every field is checked and the first
 * problem is reported with its line instead of being skipped.
 */
#include "experts/trace.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define TRACE_MAGIC   "# route_trace v"
#define TRACE_VERSION "# route_trace v1"
#define TRACE_COLUMNS "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes"
#define MAX_DIM       65536 /* n_layer, n_expert: far above any model, below overflow */
#define MAX_KEYS      (1u << 28)
#define MAX_BYTES     (1ull << 48) /* one expert's or layer's bytes */
#define MAX_FILE      (1ull << 36) /* 64 GiB of text: refuse rather than try to hold it */

struct tr_trace {
    tr_trace_info info;
    char *model, *arch;
    uint64_t *expert_bytes, *dense_bytes;
    tr_trace_row *rows;
    size_t n_rows, cap_rows;
};

void tr_trace_free(tr_trace *t) {
    if (!t) return;
    free(t->model);
    free(t->arch);
    free(t->expert_bytes);
    free(t->dense_bytes);
    free(t->rows);
    free(t);
}

const tr_trace_info *tr_trace_get_info(const tr_trace *t) { return &t->info; }

const tr_trace_row *tr_trace_rows(const tr_trace *t, size_t *n_rows) {
    *n_rows = t->n_rows;
    return t->rows;
}

/* ---------------------------------------------------------------------------------------------- */
/* Field parsing                                                                                  */

typedef struct span {
    const char *p;
    size_t n;
} span;

static bool span_eq(span s, const char *lit) {
    size_t n = strlen(lit);
    return s.n == n && !memcmp(s.p, lit, n);
}

static bool span_starts(span s, const char *lit) {
    size_t n = strlen(lit);
    return s.n >= n && !memcmp(s.p, lit, n);
}

/* decimal digits only, no sign, no spaces, no overflow, <= max */
static bool parse_u64(span s, uint64_t max, uint64_t *out) {
    if (s.n == 0 || s.n > 20) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < s.n; i++) {
        unsigned d = (unsigned)(unsigned char)s.p[i] - '0';
        if (d > 9) return false;
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    if (v > max) return false;
    *out = v;
    return true;
}

static bool parse_float(span s, float *out) {
    char buf[64];
    if (s.n == 0 || s.n >= sizeof buf) return false;
    memcpy(buf, s.p, s.n);
    buf[s.n] = 0;
    /* strtof accepts leading spaces, "inf", "nan" and hex: the format has none of them */
    for (size_t i = 0; i < s.n; i++)
        if (!strchr("0123456789.eE+-", buf[i])) return false;
    char *end;
    errno = 0;
    float v = strtof(buf, &end);
    if (*end || !isfinite(v)) return false;
    *out = v;
    return true;
}

static char *span_dup(span s) {
    char *d = malloc(s.n + 1);
    if (d) {
        memcpy(d, s.p, s.n);
        d[s.n] = 0;
    }
    return d;
}

/* next space-separated "key=value" token of *rest; false at the end */
static bool next_kv(span *rest, span *key, span *val) {
    while (rest->n && rest->p[0] == ' ') rest->p++, rest->n--;
    if (!rest->n) return false;
    const char *sp = memchr(rest->p, ' ', rest->n);
    span tok = {rest->p, sp ? (size_t)(sp - rest->p) : rest->n};
    rest->p += tok.n;
    rest->n -= tok.n;
    const char *eq = memchr(tok.p, '=', tok.n);
    if (!eq) {
        *key = tok;
        *val = (span){tok.p + tok.n, 0};
        return true;
    }
    *key = (span){tok.p, (size_t)(eq - tok.p)};
    *val = (span){eq + 1, tok.n - key->n - 1};
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* Header lines                                                                                   */

#define FAIL(...) tr_fail(err, TR_E_FORMAT, __VA_ARGS__)

static tr_status parse_model_line(tr_trace *t, span line, const char *name, size_t ln,
                                  tr_error *err) {
    /* the model path may hold spaces, so it runs up to the last " arch=" */
    span rest = {line.p + 8, line.n - 8}; /* after "# model=" */
    const char *arch = NULL;
    for (size_t i = 0; i + 6 <= rest.n; i++)
        if (!memcmp(rest.p + i, " arch=", 6)) arch = rest.p + i;
    if (!arch) return FAIL("route trace %s:%zu: model line has no ' arch='", name, ln);
    span model = {rest.p, (size_t)(arch - rest.p)};
    rest = (span){arch + 1, line.n - (size_t)(arch + 1 - line.p)};
    uint64_t n_layer = 0, n_expert = 0, n_used = 0;
    span key, val, arch_v = {0, 0};
    while (next_kv(&rest, &key, &val)) {
        uint64_t *dst = span_eq(key, "n_layer")         ? &n_layer
                        : span_eq(key, "n_expert")      ? &n_expert
                        : span_eq(key, "n_expert_used") ? &n_used
                                                        : NULL;
        if (span_eq(key, "arch"))
            arch_v = val;
        else if (dst && !parse_u64(val, MAX_DIM, dst))
            return FAIL("route trace %s:%zu: %.*s=%.*s is not a count in 1..%d", name, ln,
                        (int)key.n, key.p, (int)(val.n > 32 ? 32 : val.n), val.p, MAX_DIM);
        /* other keys: later versions may add some; they do not change the meaning of these */
    }
    if (!n_layer || !n_expert || !n_used)
        return FAIL("route trace %s:%zu: model line needs n_layer, n_expert and n_expert_used "
                    "(all > 0)",
                    name, ln);
    if (n_used > n_expert)
        return FAIL("route trace %s:%zu: n_expert_used=%llu is more than n_expert=%llu", name, ln,
                    (unsigned long long)n_used, (unsigned long long)n_expert);
    if (n_layer * n_expert > MAX_KEYS)
        return FAIL("route trace %s:%zu: %llu layers x %llu experts is too many", name, ln,
                    (unsigned long long)n_layer, (unsigned long long)n_expert);
    if (!arch_v.n) return FAIL("route trace %s:%zu: empty arch", name, ln);
    t->model = span_dup(model);
    t->arch = span_dup(arch_v);
    t->expert_bytes = calloc(n_layer, sizeof *t->expert_bytes);
    t->dense_bytes = calloc(n_layer, sizeof *t->dense_bytes);
    if (!t->model || !t->arch || !t->expert_bytes || !t->dense_bytes)
        return tr_fail(err, TR_E_NOMEM, "route trace %s: out of memory", name);
    t->info.n_layer = (int32_t)n_layer;
    t->info.n_expert = (int32_t)n_expert;
    t->info.n_expert_used = (int32_t)n_used;
    return TR_OK;
}

static tr_status parse_layer_line(tr_trace *t, span line, const char *name, size_t ln,
                                  tr_error *err) {
    if (!t->model) return FAIL("route trace %s:%zu: layer line before the model line", name, ln);
    span rest = {line.p + 2, line.n - 2}, key, val;
    uint64_t layer = 0, eb = 0, db = 0;
    bool has_layer = false, has_eb = false, has_db = false;
    while (next_kv(&rest, &key, &val)) {
        bool ok = true;
        if (span_eq(key, "layer"))
            ok = has_layer = parse_u64(val, MAX_DIM, &layer);
        else if (span_eq(key, "expert_bytes"))
            ok = has_eb = parse_u64(val, MAX_BYTES, &eb);
        else if (span_eq(key, "dense_bytes"))
            ok = has_db = parse_u64(val, MAX_BYTES, &db);
        if (!ok)
            return FAIL("route trace %s:%zu: bad value %.*s=%.*s", name, ln, (int)key.n, key.p,
                        (int)(val.n > 32 ? 32 : val.n), val.p);
    }
    if (!has_layer || !has_eb || !has_db)
        return FAIL("route trace %s:%zu: layer line needs layer=, expert_bytes= and dense_bytes=",
                    name, ln);
    if (layer >= (uint64_t)t->info.n_layer)
        return FAIL("route trace %s:%zu: layer %llu is outside 0..%d", name, ln,
                    (unsigned long long)layer, t->info.n_layer - 1);
    /* 0 would make the layer's experts free: a replay would report ~100% hits for it */
    if (eb == 0)
        return FAIL("route trace %s:%zu: layer %llu has expert_bytes=0", name, ln,
                    (unsigned long long)layer);
    if (t->expert_bytes[layer])
        return FAIL("route trace %s:%zu: layer %llu is described twice", name, ln,
                    (unsigned long long)layer);
    t->expert_bytes[layer] = eb;
    t->dense_bytes[layer] = db;
    return TR_OK;
}

static tr_status parse_row(tr_trace *t, span line, const char *name, size_t ln, tr_error *err) {
    static const char *const col[9] = {"turn",   "phase",  "step",      "layer",       "slot",
                                       "expert", "weight", "residency", "expert_bytes"};
    span f[9];
    size_t nf = 0;
    const char *p = line.p, *end = line.p + line.n;
    for (;;) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        if (nf == 9) return FAIL("route trace %s:%zu: more than 9 fields", name, ln);
        f[nf++] = (span){p, c ? (size_t)(c - p) : (size_t)(end - p)};
        if (!c) break;
        p = c + 1;
    }
    if (nf != 9)
        return FAIL("route trace %s:%zu: %zu fields, expected 9 (%s)", name, ln, nf, TRACE_COLUMNS);
    const tr_trace_info *in = &t->info;
    const uint64_t max[9] = {INT32_MAX,
                             1,
                             INT32_MAX,
                             (uint64_t)in->n_layer - 1,
                             (uint64_t)in->n_expert_used - 1,
                             (uint64_t)in->n_expert - 1,
                             0,
                             1,
                             MAX_BYTES};
    uint64_t v[9] = {0};
    tr_trace_row r = {0};
    for (int i = 0; i < 9; i++) {
        bool ok = i == 6 ? parse_float(f[i], &r.weight) : parse_u64(f[i], max[i], &v[i]);
        if (!ok) {
            if (i == 6)
                return FAIL("route trace %s:%zu: weight '%.*s' is not a finite number", name, ln,
                            (int)(f[i].n > 32 ? 32 : f[i].n), f[i].p);
            return FAIL("route trace %s:%zu: %s '%.*s' is not an integer in 0..%llu", name, ln,
                        col[i], (int)(f[i].n > 32 ? 32 : f[i].n), f[i].p,
                        (unsigned long long)max[i]);
        }
    }
    r.turn = (int32_t)v[0];
    r.phase = (uint8_t)v[1];
    r.step = (int32_t)v[2];
    r.layer = (int32_t)v[3];
    r.slot = (int32_t)v[4];
    r.expert = (int32_t)v[5];
    r.residency = (uint8_t)v[7];
    r.expert_bytes = v[8];
    if (!t->expert_bytes[r.layer])
        return FAIL("route trace %s:%zu: layer %d has no '# layer=' header line (its expert size "
                    "is unknown)",
                    name, ln, r.layer);
    if (t->n_rows == t->cap_rows) {
        size_t cap = t->cap_rows ? t->cap_rows * 2 : 4096;
        tr_trace_row *nr = realloc(t->rows, cap * sizeof *nr);
        if (!nr)
            return tr_fail(err, TR_E_NOMEM, "route trace %s: out of memory at line %zu", name, ln);
        t->rows = nr;
        t->cap_rows = cap;
    }
    t->rows[t->n_rows++] = r;
    return TR_OK;
}

tr_status tr_trace_parse(const char *text, size_t len, const char *name, tr_trace **out,
                         tr_error *err) {
    *out = NULL;
    if (!name) name = "(memory)";
    tr_trace *t = calloc(1, sizeof *t);
    if (!t) return tr_fail(err, TR_E_NOMEM, "route trace %s: out of memory", name);
    enum { WANT_VERSION, HEADER, ROWS } state = WANT_VERSION;
    tr_status s = TR_OK;
    size_t ln = 0;
    const char *p = text, *end = text + len;
    while (p < end && !s) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        span line = {p, nl ? (size_t)(nl - p) : (size_t)(end - p)};
        p = nl ? nl + 1 : end;
        ln++;
        if (line.n && line.p[line.n - 1] == '\r') line.n--;
        if (memchr(line.p, 0, line.n)) {
            s = FAIL("route trace %s:%zu: NUL byte (not a text file)", name, ln);
            break;
        }
        if (state == WANT_VERSION) {
            if (span_eq(line, TRACE_VERSION))
                state = HEADER;
            else if (span_starts(line, TRACE_MAGIC))
                s = tr_fail(err, TR_E_UNSUPPORTED,
                            "route trace %s:%zu: '%.*s': only v1 is "
                            "supported",
                            name, ln, (int)(line.n > 40 ? 40 : line.n), line.p);
            else
                s = FAIL("route trace %s:%zu: not a route trace (the first line must be '%s')",
                         name, ln, TRACE_VERSION);
            continue;
        }
        if (line.n == 0) continue;
        bool model_line = span_starts(line, "# model="), layer_line = span_starts(line, "# layer=");
        if (state == HEADER) {
            if (model_line) {
                s = t->model ? FAIL("route trace %s:%zu: second model line", name, ln)
                             : parse_model_line(t, line, name, ln, err);
            } else if (layer_line) {
                s = parse_layer_line(t, line, name, ln, err);
            } else if (line.p[0] != '#') {
                if (!span_eq(line, TRACE_COLUMNS))
                    s = FAIL("route trace %s:%zu: expected the column line '%s'", name, ln,
                             TRACE_COLUMNS);
                else if (!t->model)
                    s = FAIL("route trace %s:%zu: column line before the '# model=' line", name,
                             ln);
                state = ROWS;
            }
            continue;
        }
        if (model_line || layer_line)
            s = FAIL("route trace %s:%zu: header line after the column line", name, ln);
        else if (line.p[0] != '#')
            s = parse_row(t, line, name, ln, err);
    }
    if (!s && state != ROWS)
        s = FAIL("route trace %s: ends before the column line '%s'", name, TRACE_COLUMNS);
    if (s) {
        tr_trace_free(t);
        return s;
    }
    t->info.model = t->model;
    t->info.arch = t->arch;
    t->info.expert_bytes = t->expert_bytes;
    t->info.dense_bytes = t->dense_bytes;
    *out = t;
    return TR_OK;
}

tr_status tr_trace_read(const char *path, tr_trace **out, tr_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return tr_fail(err, TR_E_IO, "route trace %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    tr_status s = TR_OK;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            if (ncap > MAX_FILE) {
                s = tr_fail(err, TR_E_FORMAT, "route trace %s: larger than %llu bytes", path,
                            (unsigned long long)MAX_FILE);
                break;
            }
            char *nb = realloc(buf, ncap);
            if (!nb) {
                s = tr_fail(err, TR_E_NOMEM, "route trace %s: out of memory", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) s = tr_fail(err, TR_E_IO, "route trace %s: read error", path);
            break;
        }
    }
    fclose(f);
    if (!s) s = tr_trace_parse(buf, len, path, out, err);
    free(buf);
    return s;
}

/* ---------------------------------------------------------------------------------------------- */
/* Writing                                                                                        */

struct tr_trace_writer {
    FILE *f;
    char *buf; /* stdio buffer, owned so that no write allocates */
    char *path;
    int32_t n_layer, n_expert, n_expert_used;
    uint64_t *expert_bytes;
    bool failed;
};

static void writer_free(tr_trace_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w->buf);
    free(w->path);
    free(w->expert_bytes);
    free(w);
}

tr_status tr_trace_writer_open(const char *path, const tr_trace_info *in, tr_trace_writer **out,
                               tr_error *err) {
    *out = NULL;
    if (!in || !in->model || !in->arch || !in->expert_bytes)
        return tr_fail(err, TR_E_ARG, "route trace writer: missing header info");
    if (in->n_layer <= 0 || in->n_layer > MAX_DIM || in->n_expert <= 0 || in->n_expert > MAX_DIM ||
        in->n_expert_used <= 0 || in->n_expert_used > in->n_expert ||
        (uint64_t)in->n_layer * (uint64_t)in->n_expert > MAX_KEYS)
        return tr_fail(err, TR_E_ARG,
                       "route trace writer: bad shape n_layer=%d n_expert=%d "
                       "n_expert_used=%d",
                       in->n_layer, in->n_expert, in->n_expert_used);
    if (strpbrk(in->model, "\r\n"))
        return tr_fail(err, TR_E_ARG, "route trace writer: model path has a line break");
    if (!in->arch[0] || strpbrk(in->arch, " \t\r\n"))
        return tr_fail(err, TR_E_ARG, "route trace writer: arch '%s' is empty or has spaces",
                       in->arch);
    if (strstr(in->arch, "="))
        return tr_fail(err, TR_E_ARG, "route trace writer: arch '%s' has '='", in->arch);
    for (int32_t l = 0; l < in->n_layer; l++)
        if (in->expert_bytes[l] > MAX_BYTES || (in->dense_bytes && in->dense_bytes[l] > MAX_BYTES))
            return tr_fail(err, TR_E_ARG, "route trace writer: layer %d sizes out of range", l);

    tr_trace_writer *w = calloc(1, sizeof *w);
    if (!w) return tr_fail(err, TR_E_NOMEM, "route trace writer: out of memory");
    w->n_layer = in->n_layer;
    w->n_expert = in->n_expert;
    w->n_expert_used = in->n_expert_used;
    w->path = strdup(path);
    w->expert_bytes = malloc((size_t)in->n_layer * sizeof *w->expert_bytes);
    w->buf = malloc(1 << 16);
    if (!w->path || !w->expert_bytes || !w->buf) {
        writer_free(w);
        return tr_fail(err, TR_E_NOMEM, "route trace writer: out of memory");
    }
    memcpy(w->expert_bytes, in->expert_bytes, (size_t)in->n_layer * sizeof *w->expert_bytes);
    w->f = fopen(path, "wb");
    if (!w->f) {
        tr_status s = tr_fail(err, TR_E_IO, "route trace %s: %s", path, strerror(errno));
        writer_free(w);
        return s;
    }
    setvbuf(w->f, w->buf, _IOFBF, 1 << 16);
    int r =
        fprintf(w->f, "%s\n# model=%s arch=%s n_layer=%d n_expert=%d n_expert_used=%d\n",
                TRACE_VERSION, in->model, in->arch, in->n_layer, in->n_expert, in->n_expert_used);
    for (int32_t l = 0; l < in->n_layer && r >= 0; l++)
        if (in->expert_bytes[l])
            r = fprintf(w->f, "# layer=%d expert_bytes=%llu dense_bytes=%llu\n", l,
                        (unsigned long long)in->expert_bytes[l],
                        (unsigned long long)(in->dense_bytes ? in->dense_bytes[l] : 0));
    if (r >= 0) r = fprintf(w->f, "%s\n", TRACE_COLUMNS);
    if (r < 0) {
        tr_status s =
            tr_fail(err, TR_E_IO, "route trace %s: write failed: %s", path, strerror(errno));
        writer_free(w);
        return s;
    }
    *out = w;
    return TR_OK;
}

tr_status tr_trace_write_row(tr_trace_writer *w, const tr_trace_row *r, tr_error *err) {
    if (r->layer < 0 || r->layer >= w->n_layer || !w->expert_bytes[r->layer])
        return tr_fail(err, TR_E_ARG,
                       "route trace writer: layer %d has no routed experts in the "
                       "header",
                       r->layer);
    if (r->expert < 0 || r->expert >= w->n_expert || r->slot < 0 || r->slot >= w->n_expert_used ||
        r->turn < 0 || r->step < 0 || r->phase > 1 || r->residency > 1 || !isfinite(r->weight) ||
        r->expert_bytes > MAX_BYTES)
        return tr_fail(err, TR_E_ARG,
                       "route trace writer: bad row (turn %d, phase %d, step %d, "
                       "layer %d, slot %d, expert %d)",
                       r->turn, r->phase, r->step, r->layer, r->slot, r->expert);
    if (fprintf(w->f, "%d,%d,%d,%d,%d,%d,%g,%d,%llu\n", r->turn, r->phase, r->step, r->layer,
                r->slot, r->expert, (double)r->weight, r->residency,
                (unsigned long long)r->expert_bytes) < 0) {
        w->failed = true;
        return tr_fail(err, TR_E_IO, "route trace %s: write failed: %s", w->path, strerror(errno));
    }
    return TR_OK;
}

tr_status tr_trace_writer_close(tr_trace_writer *w, tr_error *err) {
    if (!w) return TR_OK;
    tr_status s = TR_OK;
    bool bad = w->failed || fflush(w->f) != 0 || ferror(w->f);
    int e = errno;
    bad |= fclose(w->f) != 0;
    w->f = NULL;
    if (bad) s = tr_fail(err, TR_E_IO, "route trace %s: write failed: %s", w->path, strerror(e));
    writer_free(w);
    return s;
}
