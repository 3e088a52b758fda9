/* avx512 kernels (placeholder until the SIMD kernels land). */
#include "tensor/kernels.h"

#if defined(__x86_64__)
void tr_kernels_fill_avx512(tr_kernels *k) { (void)k; }
#else
typedef int tr_kernels_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
