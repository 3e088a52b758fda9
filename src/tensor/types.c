/* The per-type table (ggml's type_traits pattern) and the public type queries. */
#include "core/error.h"
#include "tensor/types.h"

#define BLK(t, n, b) [TR_TYPE_##t] = {.name = #t, .blck = (n), .bytes = (b)}

/* Every type id ggml has defined, sized so the reader can skip tensors it cannot compute. The
 * supported ones carry kernels; the others (IQ1/IQ2/IQ3 lattices, ternary, NVFP4, ...) are
 * reported as unsupported when a model needs them. */
static const tr_type_traits k_traits[TR_TYPE_COUNT] = {
    [TR_TYPE_F32] = {.name = "F32", .blck = 1, .bytes = 4, .vec_dot_type = TR_TYPE_F32,
                     .to_float = tr_dequant_f32, .from_float_ref = tr_quant_f32,
                     .vec_dot_ref = tr_vec_dot_f32_ref},
    [TR_TYPE_F16] = {.name = "F16", .blck = 1, .bytes = 2, .vec_dot_type = TR_TYPE_F16,
                     .to_float = tr_dequant_f16, .from_float_ref = tr_quant_f16,
                     .vec_dot_ref = tr_vec_dot_f16_ref},
    [TR_TYPE_BF16] = {.name = "BF16", .blck = 1, .bytes = 2, .vec_dot_type = TR_TYPE_BF16,
                      .to_float = tr_dequant_bf16, .from_float_ref = tr_quant_bf16,
                      .vec_dot_ref = tr_vec_dot_bf16_ref},
    [TR_TYPE_Q4_0] = {.name = "Q4_0", .blck = 32, .bytes = 18, .vec_dot_type = TR_TYPE_Q8_0,
                      .to_float = tr_dequant_q4_0, .vec_dot_ref = tr_vec_dot_q4_0_ref},
    [TR_TYPE_Q4_1] = {.name = "Q4_1", .blck = 32, .bytes = 20, .vec_dot_type = TR_TYPE_Q8_1,
                      .to_float = tr_dequant_q4_1, .vec_dot_ref = tr_vec_dot_q4_1_ref},
    [TR_TYPE_Q5_0] = {.name = "Q5_0", .blck = 32, .bytes = 22, .vec_dot_type = TR_TYPE_Q8_0,
                      .to_float = tr_dequant_q5_0, .vec_dot_ref = tr_vec_dot_q5_0_ref},
    [TR_TYPE_Q5_1] = {.name = "Q5_1", .blck = 32, .bytes = 24, .vec_dot_type = TR_TYPE_Q8_1,
                      .to_float = tr_dequant_q5_1, .vec_dot_ref = tr_vec_dot_q5_1_ref},
    [TR_TYPE_Q8_0] = {.name = "Q8_0", .blck = 32, .bytes = 34, .vec_dot_type = TR_TYPE_Q8_0,
                      .to_float = tr_dequant_q8_0, .from_float_ref = tr_quant_q8_0,
                      .vec_dot_ref = tr_vec_dot_q8_0_ref},
    [TR_TYPE_Q8_1] = {.name = "Q8_1", .blck = 32, .bytes = 36, .vec_dot_type = TR_TYPE_Q8_1,
                      .from_float_ref = tr_quant_q8_1},
    [TR_TYPE_Q2_K] = {.name = "Q2_K", .blck = 256, .bytes = 84, .vec_dot_type = TR_TYPE_Q8_K,
                      .to_float = tr_dequant_q2_k, .vec_dot_ref = tr_vec_dot_q2_k_ref},
    [TR_TYPE_Q3_K] = {.name = "Q3_K", .blck = 256, .bytes = 110, .vec_dot_type = TR_TYPE_Q8_K,
                      .to_float = tr_dequant_q3_k, .vec_dot_ref = tr_vec_dot_q3_k_ref},
    [TR_TYPE_Q4_K] = {.name = "Q4_K", .blck = 256, .bytes = 144, .vec_dot_type = TR_TYPE_Q8_K,
                      .to_float = tr_dequant_q4_k, .vec_dot_ref = tr_vec_dot_q4_k_ref},
    [TR_TYPE_Q5_K] = {.name = "Q5_K", .blck = 256, .bytes = 176, .vec_dot_type = TR_TYPE_Q8_K,
                      .to_float = tr_dequant_q5_k, .vec_dot_ref = tr_vec_dot_q5_k_ref},
    [TR_TYPE_Q6_K] = {.name = "Q6_K", .blck = 256, .bytes = 210, .vec_dot_type = TR_TYPE_Q8_K,
                      .to_float = tr_dequant_q6_k, .vec_dot_ref = tr_vec_dot_q6_k_ref},
    [TR_TYPE_Q8_K] = {.name = "Q8_K", .blck = 256, .bytes = 292, .vec_dot_type = TR_TYPE_Q8_K,
                      .from_float_ref = tr_quant_q8_k},
    [TR_TYPE_IQ4_NL] = {.name = "IQ4_NL", .blck = 32, .bytes = 18, .vec_dot_type = TR_TYPE_Q8_0,
                        .to_float = tr_dequant_iq4_nl, .vec_dot_ref = tr_vec_dot_iq4_nl_ref},
    [TR_TYPE_IQ4_XS] = {.name = "IQ4_XS", .blck = 256, .bytes = 136,
                        .vec_dot_type = TR_TYPE_Q8_K, .to_float = tr_dequant_iq4_xs,
                        .vec_dot_ref = tr_vec_dot_iq4_xs_ref},
    [TR_TYPE_MXFP4] = {.name = "MXFP4", .blck = 32, .bytes = 17, .vec_dot_type = TR_TYPE_Q8_0,
                       .to_float = tr_dequant_mxfp4, .vec_dot_ref = tr_vec_dot_mxfp4_ref},
    BLK(IQ2_XXS, 256, 66),
    BLK(IQ2_XS, 256, 74),
    BLK(IQ3_XXS, 256, 98),
    BLK(IQ1_S, 256, 50),
    BLK(IQ3_S, 256, 110),
    BLK(IQ2_S, 256, 82),
    BLK(I8, 1, 1),
    BLK(I16, 1, 2),
    BLK(I32, 1, 4),
    BLK(I64, 1, 8),
    BLK(F64, 1, 8),
    BLK(IQ1_M, 256, 56),
    BLK(TQ1_0, 256, 54),
    BLK(TQ2_0, 256, 66),
    BLK(NVFP4, 64, 36),
    BLK(Q1_0, 128, 18),
    BLK(Q2_0, 64, 18),
};

static const tr_type_traits k_unknown = {.name = "?"};

const tr_type_traits *tr_traits(tr_type t) {
    if ((unsigned)t >= TR_TYPE_COUNT || k_traits[t].blck == 0) return &k_unknown;
    return &k_traits[t];
}

bool tr_type_known(uint32_t id) {
    return id < TR_TYPE_COUNT && k_traits[id].blck != 0;
}

bool tr_type_supported(tr_type t) {
    return tr_traits(t)->to_float != NULL && tr_traits(t)->vec_dot_ref != NULL;
}

const char *tr_type_name(tr_type t) { return tr_traits(t)->name; }
int64_t tr_type_block_elems(tr_type t) { return tr_traits(t)->blck; }
size_t tr_type_block_bytes(tr_type t) { return tr_traits(t)->bytes; }

size_t tr_type_row_bytes(tr_type t, int64_t n) {
    const tr_type_traits *tt = tr_traits(t);
    if (tt->blck == 0) return 0;
    return (size_t)(n / tt->blck) * tt->bytes;
}

tr_status tr_dequantize(tr_type t, const void *src, float *dst, int64_t n, tr_error *err) {
    const tr_type_traits *tt = tr_traits(t);
    if (!tt->to_float)
        return tr_fail(err, TR_E_UNSUPPORTED, "cannot dequantize tensor type %s (id %d)",
                       tt->name, (int)t);
    if (n < 0 || n % tt->blck != 0)
        return tr_fail(err, TR_E_ARG, "%lld elements is not a multiple of the %s block size %lld",
                       (long long)n, tt->name, (long long)tt->blck);
    tt->to_float(src, dst, n);
    return TR_OK;
}
