/*
 * The table entries one Arm kernel file fills: every weight type's vec_dot / vec_dot_nc, the
 * activation quantizers, the KV cache's scoring and value kernels. kernels_neon.c and
 * kernels_dotprod.c include this after the kernel headers, so each family's table points at its
 * own compiled copies (the byte dot products are SDOT in the dotprod one).
 *
 * No vec_dot_side: the activation side tables exist on x86 to avoid the sign trick (an unsigned
 * by signed byte multiply) and a per-block f16 conversion; SDOT and SMULL multiply signed by
 * signed bytes and FCVT converts a scale in one instruction, so there is nothing for them to save.
 */
#ifndef TR_TENSOR_ARM_FILL_H
#define TR_TENSOR_ARM_FILL_H

#if defined(__aarch64__)

static void arm_fill(tr_kernels *k) {
#define SET(T, fn)                                                                                 \
    do {                                                                                           \
        k->vec_dot[TR_TYPE_##T] = fn;                                                              \
        k->vec_dot_nc[TR_TYPE_##T] = fn##_nc;                                                      \
    } while (0)
    SET(F32, arm_dot_f32);
    SET(F16, arm_dot_f16);
    SET(BF16, arm_dot_bf16);
    SET(Q4_0, arm_dot_q4_0);
    SET(Q4_1, arm_dot_q4_1);
    SET(Q5_0, arm_dot_q5_0);
    SET(Q5_1, arm_dot_q5_1);
    SET(Q8_0, arm_dot_q8_0);
    SET(IQ4_NL, arm_dot_iq4_nl);
    SET(MXFP4, arm_dot_mxfp4);
    SET(Q2_K, arm_dot_q2_k);
    SET(Q3_K, arm_dot_q3_k);
    SET(Q4_K, arm_dot_q4_k);
    SET(Q5_K, arm_dot_q5_k);
    SET(Q6_K, arm_dot_q6_k);
    SET(IQ4_XS, arm_dot_iq4_xs);
#undef SET
    k->from_float[TR_TYPE_Q8_0] = arm_quant_q8_0;
    k->from_float[TR_TYPE_Q8_1] = arm_quant_q8_1;
    k->from_float[TR_TYPE_Q8_K] = arm_quant_q8_k;
    k->from_float[TR_TYPE_F16] = arm_quant_f16;
    k->from_float[TR_TYPE_BF16] = arm_quant_bf16;
    k->dot_rows[TR_TYPE_Q4_0] = arm_dot_rows_q4_0;
    k->dot_rows[TR_TYPE_Q8_0] = arm_dot_rows_q8_0;
    k->axpy_rows[TR_TYPE_Q4_0] = arm_axpy_rows_q4_0;
    k->axpy_rows[TR_TYPE_Q8_0] = arm_axpy_rows_q8_0;
    k->axpy_f16 = arm_axpy_f16;
}

#endif
#endif
