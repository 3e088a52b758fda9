/*
 * Tensor data may sit at any byte address: GGUF allows general.alignment = 1, so a tensor (and
 * every block and row in it) can start at an odd offset of the mapped file, and the expert cache
 * and --no-mmap copies keep the file's offsets. C forbids reading a uint16_t, float or block
 * struct through a pointer that is not aligned for it (undefined behaviour: UBSan reports it,
 * strict-alignment CPUs fault), so every kernel and dequantizer follows one rule:
 *
 *   - block structs (blocks.h) are declared with TR_BLOCK, which gives them alignment 1: their
 *     fields can be read through a block pointer at any address, and the compiler emits the
 *     loads that are legal there (on x86 and AArch64 the same instructions as before);
 *   - a scalar that is not a block field (the elements of an F32/F16/BF16 row) is read with
 *     tr_load_f32 / tr_load_u16 below, never through a cast `(const float *)p` or
 *     `(const uint16_t *)p`;
 *   - vectors are read with the unaligned load intrinsics (_mm256_loadu_*, vld1q_*), which
 *     have no alignment requirement.
 *
 * Buffers terrace allocates itself (activations, the KV cache, scratch) are aligned and may keep
 * typed pointers; the rule is for weight data, which comes from the file.
 */
#ifndef TR_TENSOR_UNALIGNED_H
#define TR_TENSOR_UNALIGNED_H

#include <stdint.h>
#include <string.h>

/* alignment 1 for a struct, so it may overlay file bytes anywhere */
#define TR_BLOCK __attribute__((packed))

static inline uint16_t tr_load_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t tr_load_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float tr_load_f32(const void *p) {
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

#endif
