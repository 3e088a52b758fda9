/*
 * The "neon" kernel family: ARMv8.0 Advanced SIMD, which every AArch64 CPU has. Byte dot
 * products are widening multiplies (SMULL/SMLAL2) with a pairwise add-accumulate into int32
 * (SADALP): 3 instructions per 16 bytes where SDOT needs one. Every weight type, the activation
 * quantizers and the KV cache's kernels; the code is in the arm_*.h headers, which
 * kernels_dotprod.c compiles again with SDOT.
 */
#include "tensor/kernels.h"

#if defined(__aarch64__)

#include <math.h>

#include "tensor/arm/arm_float.h"
#include "tensor/arm/arm_misc.h"
#include "tensor/arm/arm_qdot.h"

#include "tensor/arm/arm_fill.h"

void tr_kernels_fill_neon(tr_kernels *k) { arm_fill(k); }

#else
typedef int tr_kernels_neon_unused; /* ISO C forbids an empty translation unit */
#endif
