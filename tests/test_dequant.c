/*
 * Dequantization against an independent reference: tests/py/gen_dequant.py writes, per type,
 * quantized blocks and the f32 values the PyPI gguf package (numpy) dequantizes them to. terrace
 * must agree bit for bit. Also checks the f32 -> F16/BF16 conversions against numpy's.
 *
 * usage: test_dequant REF.gguf
 */
#include <stdlib.h>
#include <string.h>

#include "terrace.h"
#include "tensor/types.h"
#include "testutil.h"

/* an F32 tensor copied out of the mapping: with general.alignment = 1 its data may sit at an
 * odd byte, where it cannot be read as floats in place (the caller frees) */
static float *tensor_f32(tr_gguf *g, const char *name, int64_t *n) {
    const int64_t i = tr_gguf_find_tensor(g, name);
    if (i < 0) return NULL;
    const tr_tensor_info *t = tr_gguf_tensor(g, i);
    if (t->type != TR_TYPE_F32) return NULL;
    *n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *f = malloc((size_t)t->nbytes);
    if (f) memcpy(f, tr_gguf_tensor_data(g, i), (size_t)t->nbytes);
    return f;
}

/* bitwise comparison; prints the first mismatch */
static int64_t compare_bits(const char *what, const float *got, const float *want, int64_t n) {
    int64_t bad = 0;
    for (int64_t k = 0; k < n; k++) {
        uint32_t a, b;
        memcpy(&a, &got[k], 4);
        memcpy(&b, &want[k], 4);
        if (a != b) {
            if (!bad)
                fprintf(stderr, "%s: first mismatch at element %lld: got %.9g (0x%08x), want %.9g "
                                "(0x%08x)\n",
                        what, (long long)k, got[k], a, want[k], b);
            bad++;
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s REF.gguf\n", argv[0]);
        return 2;
    }
    tr_error err = {0};
    tr_gguf *g = NULL;
    if (tr_gguf_open(argv[1], &g, &err) || tr_gguf_map(g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static const tr_type types[] = {TR_TYPE_F16,  TR_TYPE_BF16, TR_TYPE_Q4_0, TR_TYPE_Q4_1,
                                    TR_TYPE_Q5_0, TR_TYPE_Q5_1, TR_TYPE_Q8_0, TR_TYPE_Q2_K,
                                    TR_TYPE_Q3_K, TR_TYPE_Q4_K, TR_TYPE_Q5_K, TR_TYPE_Q6_K,
                                    TR_TYPE_IQ4_NL, TR_TYPE_IQ4_XS, TR_TYPE_MXFP4};
    int n_types = 0;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const tr_type ty = types[k];
        char qname[64], rname[64];
        snprintf(qname, sizeof qname, "q.%s", tr_type_name(ty));
        snprintf(rname, sizeof rname, "ref.%s", tr_type_name(ty));
        const int64_t qi = tr_gguf_find_tensor(g, qname);
        int64_t n = 0;
        float *ref = tensor_f32(g, rname, &n);
        TU_CHECK(qi >= 0 && ref, "reference file lacks %s/%s", qname, rname);
        if (qi < 0 || !ref) {
            free(ref);
            continue;
        }
        const tr_tensor_info *t = tr_gguf_tensor(g, qi);
        TU_CHECK(t->type == ty, "%s has type %s", qname, tr_type_name(t->type));
        float *out = malloc((size_t)n * sizeof *out);
        TU_CHECK(tr_dequantize(ty, tr_gguf_tensor_data(g, qi), out, n, &err) == TR_OK, "%s",
                 err.msg);
        const int64_t bad = compare_bits(qname, out, ref, n);
        TU_CHECK(bad == 0, "%s: %lld of %lld values differ from gguf.quants", tr_type_name(ty),
                 (long long)bad, (long long)n);
        printf("  dequant %-7s %7lld values  %s\n", tr_type_name(ty), (long long)n,
               bad ? "MISMATCH" : "bit-exact");
        free(out);
        free(ref);
        n_types++;
    }
    TU_CHECK(n_types == (int)(sizeof types / sizeof types[0]), "only %d types checked", n_types);

    /* f32 -> bf16 / f16 conversions against numpy (activation formats) */
    static const struct {
        tr_type ty;
        const char *src, *want;
    } conv[] = {{TR_TYPE_BF16, "src.BF16", "q.BF16"}, {TR_TYPE_F16, "src.F16", "conv.F16"}};
    for (size_t k = 0; k < 2; k++) {
        int64_t n = 0;
        float *src = tensor_f32(g, conv[k].src, &n);
        const int64_t wi = tr_gguf_find_tensor(g, conv[k].want);
        TU_CHECK(src && wi >= 0, "missing %s", conv[k].src);
        if (!src || wi < 0) {
            free(src);
            continue;
        }
        uint16_t *out = malloc((size_t)n * 2);
        tr_traits(conv[k].ty)->from_float_ref(src, out, n);
        const int diff = memcmp(out, tr_gguf_tensor_data(g, wi), (size_t)n * 2);
        TU_CHECK(diff == 0, "f32 -> %s conversion differs from numpy", tr_type_name(conv[k].ty));
        printf("  convert f32 -> %-5s %7lld values  %s\n", tr_type_name(conv[k].ty),
               (long long)n, diff ? "MISMATCH" : "bit-exact");
        free(out);
        free(src);
    }
    /* an unsupported type is an error, not garbage */
    float dummy[256];
    uint8_t blk[66] = {0};
    TU_CHECK(tr_dequantize(TR_TYPE_IQ2_XXS, blk, dummy, 256, &err) == TR_E_UNSUPPORTED,
             "IQ2_XXS should be unsupported");
    TU_CHECK(strstr(err.msg, "IQ2_XXS") != NULL, "message should name the type: %s", err.msg);
    tr_gguf_close(g);
    return tu_result("test_dequant");
}
