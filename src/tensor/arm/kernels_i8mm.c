/*
 * The "i8mm" kernel family (FEAT_I8MM: SMMLA, Armv8.6, e.g. Cortex-A510/A710/X2, Neoverse V1/N2):
 * the dotprod family plus, for every quantized weight type, the two-row kernels (vec_dot_2r) of
 * the matrix-matrix path, where SMMLA multiplies 8 bytes of two weight rows by 8 bytes of two
 * activation rows at once (arm_qdot.h). A matrix-vector product has one activation row, so it
 * keeps the dotprod kernels: SMMLA would waste half of every instruction there. Built with
 * -march=armv8.2-a+dotprod+i8mm (Makefile); chosen only when AT_HWCAP2 has HWCAP2_I8MM.
 */
#include "tensor/kernels.h"

#if defined(__aarch64__)

#include "tensor/arm/arm_qdot.h"

#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "kernels_i8mm.c must be compiled with +i8mm (see the Makefile's FLAGS_ lines)"
#endif

void tr_kernels_fill_i8mm(tr_kernels *k) {
    k->vec_dot_2r[TR_TYPE_Q4_0] = arm_dot2_q4_0;
    k->vec_dot_2r[TR_TYPE_Q4_1] = arm_dot2_q4_1;
    k->vec_dot_2r[TR_TYPE_Q5_0] = arm_dot2_q5_0;
    k->vec_dot_2r[TR_TYPE_Q5_1] = arm_dot2_q5_1;
    k->vec_dot_2r[TR_TYPE_Q8_0] = arm_dot2_q8_0;
    k->vec_dot_2r[TR_TYPE_IQ4_NL] = arm_dot2_iq4_nl;
    k->vec_dot_2r[TR_TYPE_MXFP4] = arm_dot2_mxfp4;
    k->vec_dot_2r[TR_TYPE_Q2_K] = arm_dot2_q2_k;
    k->vec_dot_2r[TR_TYPE_Q3_K] = arm_dot2_q3_k;
    k->vec_dot_2r[TR_TYPE_Q4_K] = arm_dot2_q4_k;
    k->vec_dot_2r[TR_TYPE_Q5_K] = arm_dot2_q5_k;
    k->vec_dot_2r[TR_TYPE_Q6_K] = arm_dot2_q6_k;
    k->vec_dot_2r[TR_TYPE_IQ4_XS] = arm_dot2_iq4_xs;
    /* the two-row kernels sum in another order than one row: a prompt's chunk of 16 rows or
     * more takes them, the decode rows of a batch (the per-row path) do not, so each of those
     * keeps the bits it gets alone (test_kernels' column check) */
    k->gemm_min_m = 16;
}

#else
typedef int tr_kernels_i8mm_unused; /* ISO C forbids an empty translation unit */
#endif
