/*
 * terrace inspect FILE.gguf [--json]
 *
 * One data model, two renderings: the whole report is built as a JSON document first, and the
 * text view is printed from that document, so `--json` and the text always say the same thing.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define ARRAY_FULL_MAX 64 /* arrays up to this length are shown whole, longer ones summarised */
#define ARRAY_HEAD 8

/* ---------------------------------------------------------------------------------------------- */
/* metadata values -> JSON                                                                        */

static cJSON *json_str(const char *s, size_t len) {
    char *clean = cli_utf8_sanitize(s, len);
    cJSON *j = cJSON_CreateString(clean ? clean : "");
    free(clean);
    return j;
}

/* Numbers are emitted as raw JSON text: cJSON would print integers above ~1e15 (offsets and
 * sizes of big files) and doubles through "%.15g", losing digits. */
static cJSON *json_raw_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static cJSON *json_raw_fmt(const char *fmt, ...) {
    char b[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    return cJSON_CreateRaw(b);
}

static cJSON *json_i64(int64_t v) { return json_raw_fmt("%" PRId64, v); }
static cJSON *json_u64(uint64_t v) { return json_raw_fmt("%" PRIu64, v); }

/* f32 values print with 9 significant digits (enough to round-trip a float), f64 with 17 */
static cJSON *json_float(double v, bool is_f32) {
    if (isnan(v)) return cJSON_CreateString("nan");
    if (isinf(v)) return cJSON_CreateString(v > 0 ? "inf" : "-inf");
    return is_f32 ? json_raw_fmt("%.9g", v) : json_raw_fmt("%.17g", v);
}

static double jval(const cJSON *v) {
    if (cJSON_IsRaw(v) || cJSON_IsString(v)) return strtod(v->valuestring, NULL);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}
static double jnum(const cJSON *o, const char *k) { return jval(cJSON_GetObjectItem(o, k)); }

static cJSON *json_elem(const tr_gguf *g, int64_t i, tr_gguf_vtype t, uint64_t j) {
    if (t == TR_GGUF_STRING) {
        tr_str s = tr_gguf_arr_str(g, i, j);
        return json_str(s.ptr, (size_t)s.len);
    }
    const uint8_t *d = tr_gguf_arr_data(g, i);
    switch (t) {
    case TR_GGUF_U8: return json_u64(d[j]);
    case TR_GGUF_I8: return json_i64((int8_t)d[j]);
    case TR_GGUF_BOOL: return cJSON_CreateBool(d[j] != 0);
    case TR_GGUF_U16: { uint16_t v; memcpy(&v, d + 2 * j, 2); return json_u64(v); }
    case TR_GGUF_I16: { int16_t v; memcpy(&v, d + 2 * j, 2); return json_i64(v); }
    case TR_GGUF_U32: { uint32_t v; memcpy(&v, d + 4 * j, 4); return json_u64(v); }
    case TR_GGUF_I32: { int32_t v; memcpy(&v, d + 4 * j, 4); return json_i64(v); }
    case TR_GGUF_F32: { float v; memcpy(&v, d + 4 * j, 4); return json_float(v, true); }
    case TR_GGUF_U64: { uint64_t v; memcpy(&v, d + 8 * j, 8); return json_u64(v); }
    case TR_GGUF_I64: { int64_t v; memcpy(&v, d + 8 * j, 8); return json_i64(v); }
    case TR_GGUF_F64: { double v; memcpy(&v, d + 8 * j, 8); return json_float(v, false); }
    default: return cJSON_CreateNull();
    }
}

static cJSON *json_value(const tr_gguf *g, int64_t i) {
    const tr_gguf_vtype t = tr_gguf_kv_type(g, i);
    int64_t iv;
    double fv;
    switch (t) {
    case TR_GGUF_STRING: {
        tr_str s = tr_gguf_get_str(g, i);
        return json_str(s.ptr, (size_t)s.len);
    }
    case TR_GGUF_BOOL: tr_gguf_get_int(g, i, &iv); return cJSON_CreateBool(iv != 0);
    case TR_GGUF_F32:
    case TR_GGUF_F64: tr_gguf_get_float(g, i, &fv); return json_float(fv, t == TR_GGUF_F32);
    case TR_GGUF_U64: {
        uint64_t u = 0;
        tr_gguf_get_u64(g, i, &u);
        return json_u64(u);
    }
    case TR_GGUF_ARRAY: {
        const tr_gguf_vtype et = tr_gguf_arr_type(g, i);
        const uint64_t n = tr_gguf_arr_len(g, i);
        if (n <= ARRAY_FULL_MAX) {
            cJSON *a = cJSON_CreateArray();
            for (uint64_t j = 0; j < n; j++) cJSON_AddItemToArray(a, json_elem(g, i, et, j));
            return a;
        }
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "array_of", tr_gguf_vtype_name(et));
        cJSON_AddItemToObject(o, "length", json_u64(n));
        cJSON *h = cJSON_AddArrayToObject(o, "head");
        for (uint64_t j = 0; j < ARRAY_HEAD; j++) cJSON_AddItemToArray(h, json_elem(g, i, et, j));
        return o;
    }
    default: tr_gguf_get_int(g, i, &iv); return json_i64(iv);
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* report sections                                                                                */

static bool has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static void add_tokenizer(cJSON *doc, const tr_gguf *g) {
    if (tr_gguf_find_key(g, "tokenizer.ggml.model") < 0) return;
    cJSON *tk = cJSON_AddObjectToObject(doc, "tokenizer");
    tr_str s;
    if (tr_gguf_kv_str(g, "tokenizer.ggml.model", &s))
        cJSON_AddItemToObject(tk, "model", json_str(s.ptr, (size_t)s.len));
    if (tr_gguf_kv_str(g, "tokenizer.ggml.pre", &s))
        cJSON_AddItemToObject(tk, "pre", json_str(s.ptr, (size_t)s.len));
    const int64_t tokens = tr_gguf_find_key(g, "tokenizer.ggml.tokens");
    const uint64_t n_vocab = tr_gguf_arr_type(g, tokens) == TR_GGUF_STRING
                                 ? tr_gguf_arr_len(g, tokens) : 0;
    cJSON_AddItemToObject(tk, "vocab_size", json_u64(n_vocab));
    const int64_t merges = tr_gguf_find_key(g, "tokenizer.ggml.merges");
    if (merges >= 0) cJSON_AddItemToObject(tk, "merges", json_u64(tr_gguf_arr_len(g, merges)));
    cJSON_AddBoolToObject(tk, "scores", tr_gguf_find_key(g, "tokenizer.ggml.scores") >= 0);

    /* token types: counts per kind (GGUF-FACTS §5.1) */
    const int64_t types = tr_gguf_find_key(g, "tokenizer.ggml.token_type");
    if (types >= 0 && (tr_gguf_arr_type(g, types) == TR_GGUF_I32 ||
                       tr_gguf_arr_type(g, types) == TR_GGUF_U32)) {
        static const char *names[] = {"undefined", "normal", "unknown", "control",
                                      "user_defined", "unused", "byte"};
        uint64_t count[8] = {0};
        const uint64_t n = tr_gguf_arr_len(g, types);
        const uint8_t *d = tr_gguf_arr_data(g, types);
        for (uint64_t j = 0; j < n; j++) {
            int32_t v;
            memcpy(&v, d + 4 * j, 4);
            count[(v >= 0 && v <= 6) ? v : 7]++;
        }
        cJSON *tt = cJSON_AddObjectToObject(tk, "token_types");
        for (int k = 0; k < 7; k++)
            if (count[k]) cJSON_AddItemToObject(tt, names[k], json_u64(count[k]));
        if (count[7]) cJSON_AddItemToObject(tt, "invalid", json_u64(count[7]));
    }

    static const struct {
        const char *key, *name;
    } specials[] = {
        {"tokenizer.ggml.bos_token_id", "bos"},     {"tokenizer.ggml.eos_token_id", "eos"},
        {"tokenizer.ggml.eot_token_id", "eot"},     {"tokenizer.ggml.eom_token_id", "eom"},
        {"tokenizer.ggml.unknown_token_id", "unk"}, {"tokenizer.ggml.seperator_token_id", "sep"},
        {"tokenizer.ggml.padding_token_id", "pad"}, {"tokenizer.ggml.cls_token_id", "cls"},
        {"tokenizer.ggml.mask_token_id", "mask"},   {"tokenizer.ggml.fim_pre_token_id", "fim_pre"},
        {"tokenizer.ggml.fim_suf_token_id", "fim_suf"},
        {"tokenizer.ggml.fim_mid_token_id", "fim_mid"},
    };
    cJSON *sp = cJSON_AddObjectToObject(tk, "special");
    for (size_t k = 0; k < sizeof specials / sizeof specials[0]; k++) {
        int64_t id;
        if (!tr_gguf_kv_int(g, specials[k].key, &id)) continue;
        cJSON *o = cJSON_AddObjectToObject(sp, specials[k].name);
        cJSON_AddItemToObject(o, "id", json_i64(id));
        if (id >= 0 && (uint64_t)id < n_vocab) {
            tr_str t = tr_gguf_arr_str(g, tokens, (uint64_t)id);
            cJSON_AddItemToObject(o, "text", json_str(t.ptr, (size_t)t.len));
        } else {
            cJSON_AddStringToObject(o, "text", "(out of range: ignored)");
        }
    }
    static const char *flags[] = {"add_bos_token", "add_eos_token", "add_space_prefix",
                                  "remove_extra_whitespaces"};
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
        char key[96];
        snprintf(key, sizeof key, "tokenizer.ggml.%s", flags[k]);
        int64_t v;
        if (tr_gguf_kv_int(g, key, &v)) cJSON_AddBoolToObject(tk, flags[k], v != 0);
    }
    if (tr_gguf_kv_str(g, "tokenizer.chat_template", &s))
        cJSON_AddItemToObject(tk, "chat_template_bytes", json_u64(s.len));
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void add_metadata(cJSON *doc, const tr_gguf *g, const char *arch) {
    /* hyperparameters are the "<arch>." keys (prefix stripped); the rest, minus the tokenizer
     * arrays summarised above, goes under "metadata"; both sorted by key */
    const int64_t n = tr_gguf_n_kv(g);
    const char **keys = malloc((size_t)(n ? n : 1) * sizeof *keys);
    if (!keys) return;
    for (int64_t i = 0; i < n; i++) keys[i] = tr_gguf_key(g, i);
    qsort(keys, (size_t)n, sizeof *keys, cmp_str);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s.", arch ? arch : "");
    cJSON *hp = cJSON_AddObjectToObject(doc, "hyperparameters");
    cJSON *md = cJSON_AddObjectToObject(doc, "metadata");
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = tr_gguf_find_key(g, keys[k]);
        cJSON *v = json_value(g, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", tr_gguf_vtype_name(tr_gguf_kv_type(g, i)));
        cJSON_AddItemToObject(o, "value", v);
        if (arch && has_prefix(keys[k], prefix))
            cJSON_AddItemToObject(hp, keys[k] + strlen(prefix), o);
        else
            cJSON_AddItemToObject(md, keys[k], o);
    }
    free(keys);
}

/* routed-expert tensors: 3-D `*_exps.weight` ([in, out, n_expert]) and 2-D `*_exps.bias` */
static bool is_expert_tensor(const tr_tensor_info *t) {
    const char *p = strstr(t->name, "_exps.");
    if (!p) return false;
    return (t->n_dims == 3 && !strcmp(p, "_exps.weight")) ||
           (t->n_dims == 2 && !strcmp(p, "_exps.bias"));
}

static void add_tensors(cJSON *doc, const tr_gguf *g) {
    const int64_t n = tr_gguf_n_tensors(g);
    cJSON *arr = cJSON_AddArrayToObject(doc, "tensors");
    uint64_t by_type_bytes[TR_TYPE_COUNT] = {0}, by_type_n[TR_TYPE_COUNT] = {0},
             by_type_params[TR_TYPE_COUNT] = {0};
    uint64_t total = 0, params = 0;
    cJSON *experts = NULL;
    int64_t max_layer = -1;
    for (int64_t i = 0; i < n; i++) {
        const tr_tensor_info *t = tr_gguf_tensor(g, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "name", json_str(t->name, strlen(t->name)));
        cJSON_AddStringToObject(o, "type", tr_type_name(t->type));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        uint64_t elems = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            cJSON_AddItemToArray(shape, json_i64(t->ne[d]));
            elems *= (uint64_t)t->ne[d];
        }
        cJSON_AddItemToObject(o, "offset", json_u64(t->file_offset));
        cJSON_AddItemToObject(o, "bytes", json_u64(t->nbytes));
        if (tr_gguf_n_shards(g) > 1) cJSON_AddNumberToObject(o, "shard", t->shard);
        cJSON_AddItemToArray(arr, o);
        by_type_bytes[t->type] += t->nbytes;
        by_type_n[t->type]++;
        by_type_params[t->type] += elems;
        total += t->nbytes;
        params += elems;
        if (is_expert_tensor(t)) {
            if (!experts) experts = cJSON_CreateArray();
            const int64_t n_exp = t->ne[t->n_dims - 1];
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToObject(e, "name", json_str(t->name, strlen(t->name)));
            cJSON_AddStringToObject(e, "type", tr_type_name(t->type));
            cJSON_AddItemToObject(e, "experts", json_i64(n_exp));
            cJSON_AddItemToObject(e, "bytes_per_expert",
                                  json_u64(n_exp > 0 ? t->nbytes / (uint64_t)n_exp : 0));
            int layer = -1;
            if (sscanf(t->name, "blk.%d.", &layer) == 1) {
                cJSON_AddNumberToObject(e, "layer", layer);
                if (layer > max_layer) max_layer = layer;
            }
            cJSON_AddItemToArray(experts, e);
        }
    }
    cJSON_AddItemToObject(doc, "total_bytes", json_u64(total));
    cJSON_AddItemToObject(doc, "n_params", json_u64(params));
    cJSON *tot = cJSON_AddArrayToObject(doc, "totals_by_type");
    for (int ty = 0; ty < TR_TYPE_COUNT; ty++) {
        if (!by_type_n[ty]) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", tr_type_name((tr_type)ty));
        cJSON_AddItemToObject(o, "tensors", json_u64(by_type_n[ty]));
        cJSON_AddItemToObject(o, "bytes", json_u64(by_type_bytes[ty]));
        cJSON_AddItemToObject(o, "params", json_u64(by_type_params[ty]));
        cJSON_AddBoolToObject(o, "supported", tr_type_supported((tr_type)ty));
        cJSON_AddItemToArray(tot, o);
    }
    if (!experts) return;
    /* per layer: bytes of one expert across its gate/up/down (+bias) slices, and the bytes one
     * token touches in all MoE layers with top-k routing — the unit the expert cache is sized in */
    cJSON *ex = cJSON_AddObjectToObject(doc, "experts");
    cJSON_AddItemToObject(ex, "tensors", experts);
    uint64_t per_token = 0, all_experts = 0;
    int64_t used = 0;
    const char *arch = cJSON_GetStringValue(cJSON_GetObjectItem(doc, "architecture"));
    if (arch) {
        char key[160];
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        tr_gguf_kv_int(g, key, &used);
    }
    cJSON *layers = cJSON_AddArrayToObject(ex, "layers");
    for (int64_t l = 0; l <= max_layer; l++) {
        uint64_t bytes = 0;
        int64_t n_exp = 0;
        cJSON *e;
        cJSON_ArrayForEach(e, experts) {
            cJSON *jl = cJSON_GetObjectItem(e, "layer");
            if (!jl || (int64_t)jval(jl) != l) continue;
            bytes += (uint64_t)jnum(e, "bytes_per_expert");
            n_exp = (int64_t)jnum(e, "experts");
        }
        if (!bytes) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", (double)l);
        cJSON_AddItemToObject(o, "experts", json_i64(n_exp));
        cJSON_AddItemToObject(o, "bytes_per_expert", json_u64(bytes));
        cJSON_AddItemToArray(layers, o);
        per_token += bytes * (uint64_t)(used > 0 ? used : 0);
        all_experts += bytes * (uint64_t)n_exp;
    }
    cJSON_AddItemToObject(ex, "expert_used_count", json_i64(used));
    cJSON_AddItemToObject(ex, "token_working_set_bytes", json_u64(per_token));
    cJSON_AddItemToObject(ex, "all_experts_bytes", json_u64(all_experts));
}

static cJSON *build_report(const tr_gguf *g, const char *path) {
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddItemToObject(doc, "file", json_str(path, strlen(path)));
    cJSON_AddNumberToObject(doc, "gguf_version", tr_gguf_version(g));
    cJSON_AddNumberToObject(doc, "alignment", tr_gguf_alignment(g));
    cJSON *shards = cJSON_AddArrayToObject(doc, "shards");
    for (uint32_t i = 0; i < tr_gguf_n_shards(g); i++) {
        cJSON *o = cJSON_CreateObject();
        const char *p = tr_gguf_shard_path(g, i);
        cJSON_AddItemToObject(o, "path", json_str(p, strlen(p)));
        cJSON_AddItemToObject(o, "size", json_u64(tr_gguf_shard_size(g, i)));
        cJSON_AddItemToObject(o, "data_offset", json_u64(tr_gguf_data_offset(g, i)));
        cJSON_AddItemToArray(shards, o);
    }
    cJSON_AddItemToObject(doc, "n_kv", json_i64(tr_gguf_n_kv(g)));
    cJSON_AddItemToObject(doc, "n_tensors", json_i64(tr_gguf_n_tensors(g)));
    tr_str s;
    char *arch = NULL;
    if (tr_gguf_kv_str(g, "general.architecture", &s)) {
        cJSON_AddItemToObject(doc, "architecture", json_str(s.ptr, (size_t)s.len));
        arch = cli_utf8_sanitize(s.ptr, (size_t)s.len);
    }
    if (tr_gguf_kv_str(g, "general.name", &s))
        cJSON_AddItemToObject(doc, "name", json_str(s.ptr, (size_t)s.len));
    int64_t ft;
    if (tr_gguf_kv_int(g, "general.file_type", &ft)) {
        cJSON *o = cJSON_AddObjectToObject(doc, "file_type");
        cJSON_AddItemToObject(o, "id", json_i64(ft));
        cJSON_AddStringToObject(o, "name", tr_file_type_name(ft));
    }
    add_tensors(doc, g);
    add_tokenizer(doc, g);
    add_metadata(doc, g, arch);
    free(arch);
    return doc;
}

/* ---------------------------------------------------------------------------------------------- */
/* text rendering of the report                                                                   */

/* Strings from the file (key and tensor names, the architecture, tokenizer names) go to a
 * terminal: control characters are shown escaped, never sent (see cli_print_escaped). A few
 * rotating buffers, so several can appear in one printf. */
static const char *esc(const char *s) {
    static char bufs[4][512];
    static int next;
    char *b = bufs[next++ % 4];
    char *e = cli_escape(s, strlen(s), 200);
    snprintf(b, sizeof bufs[0], "%s", e ? e : "?");
    free(e);
    return b;
}

static const char *jstr(const cJSON *o, const char *k) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(o, k));
    return s ? esc(s) : "";
}

static void print_value(const cJSON *v) {
    if (cJSON_IsString(v)) {
        putchar('"');
        cli_print_escaped(stdout, v->valuestring, strlen(v->valuestring), 120);
        putchar('"');
        return;
    }
    if (cJSON_IsObject(v) && cJSON_GetObjectItem(v, "array_of")) {
        printf("[%s x %.0f: ", jstr(v, "array_of"), jnum(v, "length"));
        const cJSON *e;
        int k = 0;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(v, "head")) {
            if (k++) fputs(", ", stdout);
            print_value(e);
        }
        fputs(", ...]", stdout);
        return;
    }
    if (cJSON_IsArray(v)) {
        putchar('[');
        const cJSON *e;
        int k = 0;
        cJSON_ArrayForEach(e, v) {
            if (k++) fputs(", ", stdout);
            print_value(e);
        }
        putchar(']');
        return;
    }
    if (cJSON_IsRaw(v)) {
        fputs(v->valuestring, stdout);
        return;
    }
    char *txt = cJSON_PrintUnformatted(v);
    fputs(txt ? txt : "?", stdout);
    free(txt);
}

static void print_kv_section(const cJSON *sec) {
    const cJSON *e;
    cJSON_ArrayForEach(e, sec) {
        printf("  %-44s %-7s ", esc(e->string), jstr(e, "type"));
        print_value(cJSON_GetObjectItem(e, "value"));
        putchar('\n');
    }
}

static void print_report(const cJSON *doc) {
    char b1[32], b2[32];
    const cJSON *shards = cJSON_GetObjectItem(doc, "shards");
    const int n_shards = cJSON_GetArraySize(shards);
    printf("file          %s", jstr(doc, "file"));
    if (n_shards > 1) printf("  (%d shards)", n_shards);
    putchar('\n');
    const cJSON *sh;
    cJSON_ArrayForEach(sh, shards) {
        printf("  shard       %s  %s, tensor data at byte %.0f\n", jstr(sh, "path"),
               cli_bytes((unsigned long long)jnum(sh, "size"), b1, sizeof b1),
               jnum(sh, "data_offset"));
    }
    printf("format        GGUF v%.0f, alignment %.0f, %.0f metadata keys, %.0f tensors\n",
           jnum(doc, "gguf_version"), jnum(doc, "alignment"), jnum(doc, "n_kv"),
           jnum(doc, "n_tensors"));
    printf("architecture  %s\n", cJSON_GetObjectItem(doc, "architecture")
                                     ? jstr(doc, "architecture") : "(none: no general.architecture)");
    if (cJSON_GetObjectItem(doc, "name")) printf("name          %s\n", jstr(doc, "name"));
    const cJSON *ft = cJSON_GetObjectItem(doc, "file_type");
    if (ft) printf("file type     %s (%.0f)\n", jstr(ft, "name"), jnum(ft, "id"));
    printf("weights       %s in %.0f tensors, %.3f B parameters\n",
           cli_bytes((unsigned long long)jnum(doc, "total_bytes"), b1, sizeof b1),
           jnum(doc, "n_tensors"), jnum(doc, "n_params") / 1e9);

    printf("\nhyperparameters (%s.*)\n", cJSON_GetObjectItem(doc, "architecture")
                                           ? jstr(doc, "architecture") : "?");
    print_kv_section(cJSON_GetObjectItem(doc, "hyperparameters"));

    const cJSON *tk = cJSON_GetObjectItem(doc, "tokenizer");
    if (tk) {
        printf("\ntokenizer\n");
        printf("  model       %s\n", jstr(tk, "model"));
        if (cJSON_GetObjectItem(tk, "pre")) printf("  pre         %s\n", jstr(tk, "pre"));
        printf("  vocabulary  %.0f tokens", jnum(tk, "vocab_size"));
        if (cJSON_GetObjectItem(tk, "merges")) printf(", %.0f merges", jnum(tk, "merges"));
        if (cJSON_IsTrue(cJSON_GetObjectItem(tk, "scores"))) printf(", scores");
        putchar('\n');
        const cJSON *tt = cJSON_GetObjectItem(tk, "token_types");
        if (tt) {
            printf("  types      ");
            const cJSON *e;
            cJSON_ArrayForEach(e, tt) printf(" %s %.0f", e->string, jval(e));
            putchar('\n');
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(tk, "special")) {
            printf("  %-11s %-8.0f '", e->string, jnum(e, "id"));
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(e, "text"));
            if (t) cli_print_escaped(stdout, t, strlen(t), 60);
            printf("'\n");
        }
        static const char *flags[] = {"add_bos_token", "add_eos_token", "add_space_prefix",
                                      "remove_extra_whitespaces"};
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++) {
            const cJSON *f = cJSON_GetObjectItem(tk, flags[k]);
            if (f) printf("  %-24s %s\n", flags[k], cJSON_IsTrue(f) ? "true" : "false");
        }
        if (cJSON_GetObjectItem(tk, "chat_template_bytes"))
            printf("  chat template: %.0f bytes\n", jnum(tk, "chat_template_bytes"));
    }

    printf("\nother metadata\n");
    print_kv_section(cJSON_GetObjectItem(doc, "metadata"));

    printf("\ntensors\n  %-5s %-40s %-7s %-26s %14s %14s\n", "#", "name", "type", "shape",
           "offset", "bytes");
    const cJSON *t;
    int idx = 0;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(doc, "tensors")) {
        char shape[96] = "";
        size_t o = 0;
        const cJSON *d;
        int k = 0;
        cJSON_ArrayForEach(d, cJSON_GetObjectItem(t, "shape")) {
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%.0f", k++ ? " x " : "",
                                  jval(d));
            if (o >= sizeof shape) break;
        }
        printf("  %-5d %-40s %-7s %-26s %14.0f %14.0f\n", idx++, jstr(t, "name"), jstr(t, "type"),
               shape, jnum(t, "offset"), jnum(t, "bytes"));
    }

    printf("\ntotals by type\n");
    const double total = jnum(doc, "total_bytes");
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(doc, "totals_by_type")) {
        printf("  %-8s %6.0f tensors %14s %6.2f%%  %.0f params%s\n", jstr(t, "type"),
               jnum(t, "tensors"), cli_bytes((unsigned long long)jnum(t, "bytes"), b1, sizeof b1),
               total > 0 ? 100.0 * jnum(t, "bytes") / total : 0.0, jnum(t, "params"),
               cJSON_IsTrue(cJSON_GetObjectItem(t, "supported")) ? "" : "  (not supported)");
    }

    const cJSON *ex = cJSON_GetObjectItem(doc, "experts");
    if (ex) {
        printf("\nrouted experts\n  %-40s %-7s %8s %16s\n", "tensor", "type", "experts",
               "bytes/expert");
        cJSON_ArrayForEach(t, cJSON_GetObjectItem(ex, "tensors"))
            printf("  %-40s %-7s %8.0f %16.0f\n", jstr(t, "name"), jstr(t, "type"),
                   jnum(t, "experts"), jnum(t, "bytes_per_expert"));
        const cJSON *layers = cJSON_GetObjectItem(ex, "layers");
        const cJSON *l0 = cJSON_GetArrayItem(layers, 0);
        printf("  %d MoE layers; one expert of layer %.0f = %s (gate+up+down)\n",
               cJSON_GetArraySize(layers), jnum(l0, "layer"),
               cli_bytes((unsigned long long)jnum(l0, "bytes_per_expert"), b1, sizeof b1));
        printf("  all routed experts: %s; one token's working set (all layers x top-%.0f): %s\n",
               cli_bytes((unsigned long long)jnum(ex, "all_experts_bytes"), b1, sizeof b1),
               jnum(ex, "expert_used_count"),
               cli_bytes((unsigned long long)jnum(ex, "token_working_set_bytes"), b2, sizeof b2));
    }
}

/* ---------------------------------------------------------------------------------------------- */

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: terrace inspect [--json] FILE.gguf\n"
               "       terrace inspect -m FILE.gguf --plan [-c N] [run's memory and KV flags]\n"
               "       (FILE may also be given as -m FILE; for split models, any shard)\n\n"
               "  --json     print the report as one JSON document\n"
               "  --plan     print the memory plan of a run with these flags (as run --dry-run):\n"
               "             weights, expert cache, KV in DRAM and on storage, scratch, what spills\n"
               "  -h, --help this text\n");
}

/* inspect --plan: the plan is the one `run --dry-run` prints with the same flags, so it goes
 * through run's parser and checks (one reading of every memory and KV flag) */
static int inspect_plan(int argc, char **argv, int at) {
    char **args = malloc(sizeof(char *) * ((size_t)argc + 2));
    if (!args) {
        cli_error("out of memory");
        return CLI_EXIT_ERROR;
    }
    int n = 0;
    args[n++] = "run";
    for (int i = 1; i < argc; i++)
        if (i != at) args[n++] = argv[i];
    args[n++] = "--dry-run";
    args[n] = NULL;
    const int rc = cmd_run(n, args);
    free(args);
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"model", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--plan")) return inspect_plan(argc, argv, i);
    bool json = false;
    const char *path = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'm': path = optarg; break;
        case 'h': inspect_usage(stdout); return 0;
        default:
            cli_error("inspect: unknown or incomplete option '%s'", argv[optind - 1]);
            inspect_usage(stderr);
            return CLI_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        if (path || optind + 1 < argc) {
            cli_error("inspect: expected one GGUF file");
            inspect_usage(stderr);
            return CLI_EXIT_USAGE;
        }
        path = argv[optind];
    }
    if (!path) {
        cli_error("inspect: no GGUF file given");
        inspect_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    tr_error err = {0};
    tr_gguf *g = NULL;
    if (tr_gguf_open(path, &g, &err) != TR_OK) {
        cli_error("%s", err.msg);
        return CLI_EXIT_ERROR;
    }
    cJSON *doc = build_report(g, path);
    tr_gguf_close(g);
    if (!doc) {
        cli_error("out of memory building the report");
        return CLI_EXIT_ERROR;
    }
    if (json) {
        char *txt = cJSON_Print(doc);
        if (!txt) {
            cJSON_Delete(doc);
            cli_error("out of memory printing the report");
            return CLI_EXIT_ERROR;
        }
        puts(txt);
        free(txt);
    } else {
        print_report(doc);
    }
    cJSON_Delete(doc);
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error("writing the report failed: %s", strerror(errno ? errno : EIO));
        return CLI_EXIT_ERROR;
    }
    return 0;
}
