/*
 * The "dotprod" kernel family (FEAT_DotProd: SDOT/UDOT, Armv8.2 onwards, e.g. Cortex-A55/A76,
 * Neoverse N1): the arm_*.h kernels compiled with +dotprod, where every 16-byte dot product is one
 * SDOT into four int32 lanes. Built with -march=armv8.2-a+dotprod (Makefile); chosen only when
 * AT_HWCAP has HWCAP_ASIMDDP.
 *
 * The float types (F32, F16, BF16) and the quantizers compile to the same instructions as in the
 * neon family: SDOT multiplies bytes and they have none.
 */
#include "tensor/kernels.h"

#if defined(__aarch64__)

#include <math.h>

#include "tensor/arm/arm_float.h"
#include "tensor/arm/arm_misc.h"
#include "tensor/arm/arm_qdot.h"

#include "tensor/arm/arm_fill.h"

#if !defined(__ARM_FEATURE_DOTPROD)
#error "kernels_dotprod.c must be compiled with +dotprod (see the Makefile's FLAGS_ lines)"
#endif

void tr_kernels_fill_dotprod(tr_kernels *k) { arm_fill(k); }

#else
typedef int tr_kernels_dotprod_unused; /* ISO C forbids an empty translation unit */
#endif
