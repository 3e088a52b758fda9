/*
 * Block layouts of the quantized tensor types (GGUF-FACTS §2), byte-for-byte as stored in GGUF
 * files, each pinned with a static assertion so a layout change cannot slip in unnoticed. Every
 * block struct has alignment 1 (TR_BLOCK): tensor data may start at any byte (unaligned.h).
 */
#ifndef TR_TENSOR_BLOCKS_H
#define TR_TENSOR_BLOCKS_H

#include <assert.h>
#include <stdint.h>

#include "tensor/unaligned.h"

typedef uint16_t tr_half; /* IEEE binary16 bits */
typedef uint16_t tr_bf16; /* bfloat16 bits */

#define TR_QK32 32
#define TR_QK_K 256
#define TR_K_SCALE_SIZE 12

typedef struct TR_BLOCK { tr_half d; uint8_t qs[16]; } tr_blk_q4_0;
typedef struct TR_BLOCK { tr_half d; tr_half m; uint8_t qs[16]; } tr_blk_q4_1;
typedef struct TR_BLOCK { tr_half d; uint8_t qh[4]; uint8_t qs[16]; } tr_blk_q5_0;
typedef struct TR_BLOCK { tr_half d; tr_half m; uint8_t qh[4]; uint8_t qs[16]; } tr_blk_q5_1;
typedef struct TR_BLOCK { tr_half d; int8_t qs[32]; } tr_blk_q8_0;
typedef struct TR_BLOCK { tr_half d; tr_half s; int8_t qs[32]; } tr_blk_q8_1; /* s = d * sum(qs) */
typedef struct TR_BLOCK { tr_half d; uint8_t qs[16]; } tr_blk_iq4_nl;
typedef struct TR_BLOCK { uint8_t e; uint8_t qs[16]; } tr_blk_mxfp4; /* e: E8M0 exponent (halved table) */

typedef struct TR_BLOCK { uint8_t scales[16]; uint8_t qs[64]; tr_half d; tr_half dmin; } tr_blk_q2_k;
typedef struct TR_BLOCK { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; tr_half d; } tr_blk_q3_k;
typedef struct TR_BLOCK { tr_half d; tr_half dmin; uint8_t scales[12]; uint8_t qs[128]; } tr_blk_q4_k;
typedef struct TR_BLOCK {
    tr_half d;
    tr_half dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} tr_blk_q5_k;
typedef struct TR_BLOCK { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; tr_half d; } tr_blk_q6_k;
typedef struct TR_BLOCK { float d; int8_t qs[256]; int16_t bsums[16]; } tr_blk_q8_k;
typedef struct TR_BLOCK {
    tr_half d;
    uint16_t scales_h;
    uint8_t scales_l[4];
    uint8_t qs[128];
} tr_blk_iq4_xs;

static_assert(sizeof(tr_blk_q4_0) == 18, "Q4_0 block");
static_assert(sizeof(tr_blk_q4_1) == 20, "Q4_1 block");
static_assert(sizeof(tr_blk_q5_0) == 22, "Q5_0 block");
static_assert(sizeof(tr_blk_q5_1) == 24, "Q5_1 block");
static_assert(sizeof(tr_blk_q8_0) == 34, "Q8_0 block");
static_assert(sizeof(tr_blk_q8_1) == 36, "Q8_1 block");
static_assert(sizeof(tr_blk_iq4_nl) == 18, "IQ4_NL block");
static_assert(sizeof(tr_blk_mxfp4) == 17, "MXFP4 block");
static_assert(sizeof(tr_blk_q2_k) == 84, "Q2_K block");
static_assert(sizeof(tr_blk_q3_k) == 110, "Q3_K block");
static_assert(sizeof(tr_blk_q4_k) == 144, "Q4_K block");
static_assert(sizeof(tr_blk_q5_k) == 176, "Q5_K block");
static_assert(sizeof(tr_blk_q6_k) == 210, "Q6_K block");
static_assert(sizeof(tr_blk_q8_k) == 292, "Q8_K block");
static_assert(sizeof(tr_blk_iq4_xs) == 136, "IQ4_XS block");
/* one per layout family is enough: TR_BLOCK is on every struct above */
static_assert(_Alignof(tr_blk_q4_0) == 1 && _Alignof(tr_blk_q4_k) == 1 && _Alignof(tr_blk_q8_k) == 1,
              "block structs must have alignment 1 (unaligned.h)");

/* Non-linear 4-bit code books (GGUF-FACTS §2.2). */
extern const int8_t tr_kvalues_iq4nl[16];
extern const int8_t tr_kvalues_mxfp4[16]; /* E2M1 values doubled */

#endif
