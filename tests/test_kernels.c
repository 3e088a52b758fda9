/*
 * Every fast kernel family this CPU runs ("avx2", "avx512"; on Arm "neon", "dotprod", "i8mm")
 * against the scalar reference: vec_dot, vec_dot_nc, vec_dot_side (nc = 1..8, every column with
 * the bits it gets alone, the wide tables' kernel and the AVX2 family's with the same bits) and
 * vec_dot_2r (two weight rows, nc = 1..4) for every supported weight type over random
 * rows with ragged lengths, the activation side tables (exact), the fast activation quantizers
 * (must be bit-identical), tr_matmul on 1, 2 and 3 threads against a naive loop over the
 * reference dot, and its per-row path with 1..17 activation rows giving each row the bits it gets
 * alone.
 *
 * Tolerance. The integer parts of the quantized dot products are exact in both implementations,
 * so they can only differ by float rounding: of the block-scale products, of int->float
 * conversions, and of the summation (the reference sums block terms in double, the fast kernels
 * in f32 vector lanes plus a horizontal reduction). With u = 2^-24, a sum of terms t_k evaluated
 * in any order along a chain of at most L additions errs by at most L·u·Σ|t_k| (Higham, recursive
 * summation; γ_L ≈ L·u for L·u << 1), and forming each term costs at most 2 more roundings (scale
 * product, int->float); the reference adds at most 3 roundings per term and one final rounding
 * to f32. Hence
 *     |fast - ref| <= (L + 5)·u·T + u·|ref|
 * where T bounds Σ|t_k|. T is computed per element from the dequantized data as Σ W_i·|a_i|,
 * with W_i the magnitude a kernel carries for weight i: |w_i| in general; |d·sc·q_i| + |dmin·m|
 * for the types with a min (the two parts are summed separately and may cancel); and for the
 * types whose kernels multiply unsigned codes and subtract the offset through activation code
 * sums (Q6_K: q + 32, Q3_K: q + 4; with side tables also Q4_0: q + 8, Q5_0: q + 16, MXFP4:
 * value + 12), 3·offset·|d·sc_i| (covers the unsigned code plus the offset part). L is
 * the longest accumulation chain: 2 per block (scale term and min term) plus 16 for the final
 * reductions; ceil(n/8) + 16 for the float types (at least 8 lanes per vector).
 *
 * The check must be able to fail: results of simulated kernel bugs (wrong decode, wrong scale,
 * lost tail, and on one-block rows a single code step) must be flagged; see check_detects_errors.
 */
#include <stdbool.h>

#include "testutil.h"

#include "core/pool.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/matmul.h"

static const tr_type k_types[] = {
    TR_TYPE_F32,  TR_TYPE_F16,  TR_TYPE_BF16,   TR_TYPE_Q4_0,   TR_TYPE_Q4_1, TR_TYPE_Q5_0,
    TR_TYPE_Q5_1, TR_TYPE_Q8_0, TR_TYPE_IQ4_NL, TR_TYPE_MXFP4,  TR_TYPE_Q2_K, TR_TYPE_Q3_K,
    TR_TYPE_Q4_K, TR_TYPE_Q5_K, TR_TYPE_Q6_K,   TR_TYPE_IQ4_XS,
};
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])

static const double k_u = 1.0 / 16777216.0; /* 2^-24, f32 unit roundoff */

static bool is_float_type(tr_type t) {
    return t == TR_TYPE_F32 || t == TR_TYPE_F16 || t == TR_TYPE_BF16;
}

/* ----------------------------------------------------------------------------- random data */

static uint16_t rand_half(tu_rng *r, float scale) { return tr_f32_to_f16(tu_uniform(r) * scale); }

static void put_half(uint8_t *p, uint16_t h) { memcpy(p, &h, 2); }

/* offsets of the f16 scale fields inside one block (-1: none) */
typedef struct {
    int d, m;
} half_fields;

static half_fields fields_of(tr_type t) {
    switch (t) {
    case TR_TYPE_Q4_0:
    case TR_TYPE_Q5_0:
    case TR_TYPE_Q8_0:
    case TR_TYPE_IQ4_NL:
    case TR_TYPE_IQ4_XS: return (half_fields){0, -1};
    case TR_TYPE_Q4_1:
    case TR_TYPE_Q5_1:
    case TR_TYPE_Q4_K:
    case TR_TYPE_Q5_K: return (half_fields){0, 2};
    case TR_TYPE_Q2_K: return (half_fields){80, 82};
    case TR_TYPE_Q3_K: return (half_fields){108, -1};
    case TR_TYPE_Q6_K: return (half_fields){208, -1};
    default: return (half_fields){-1, -1};
    }
}

/* A weight row: random code bytes (every bit pattern is a valid code) with sane finite scales. */
static void fill_weights(tu_rng *r, tr_type t, void *row, int64_t n) {
    uint8_t *p = row;
    if (t == TR_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) {
            const float v = tu_normal(r);
            memcpy(p + 4 * i, &v, 4);
        }
        return;
    }
    if (t == TR_TYPE_F16 || t == TR_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            const float v = tu_normal(r);
            put_half(p + 2 * i, t == TR_TYPE_F16 ? tr_f32_to_f16(v) : tr_f32_to_bf16(v));
        }
        return;
    }
    const size_t bytes = tr_type_row_bytes(t, n);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)tu_next(r);
    const int64_t nb = n / tr_type_block_elems(t);
    const size_t bb = tr_type_block_bytes(t);
    const half_fields f = fields_of(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + (size_t)b * bb;
        if (t == TR_TYPE_MXFP4) blk[0] = (uint8_t)(118 + tu_next(r) % 16); /* 2^-10 .. 2^5 */
        if (f.d >= 0) put_half(blk + f.d, rand_half(r, 0.05f));
        if (f.m >= 0) put_half(blk + f.m, rand_half(r, 0.05f));
    }
}

/* Activations: normal values with a random per-row scale, some rows with an outlier. */
static void fill_acts(tu_rng *r, float *x, int64_t n) {
    const float scale = 0.01f + 4.0f * fabsf(tu_uniform(r));
    for (int64_t i = 0; i < n; i++) x[i] = tu_normal(r) * scale;
    if (tu_next(r) % 4 == 0) x[tu_next(r) % (uint64_t)n] *= 50.0f;
}

/* --------------------------------------------------------------------------------- tolerance */

static void dequant_act(tr_type vt, const void *aq, float *y, int64_t n) {
    switch (vt) {
    case TR_TYPE_Q8_0: tr_dequant_q8_0(aq, y, n); break;
    case TR_TYPE_Q8_1: tr_dequant_q8_1(aq, y, n); break;
    case TR_TYPE_Q8_K: tr_dequant_q8_k(aq, y, n); break;
    default: tr_traits(vt)->to_float(aq, y, n); break;
    }
}

/* byte range [lo, hi) of a block that holds only code bits */
static void code_bytes(tr_type t, int *lo, int *hi) {
    switch (t) {
    case TR_TYPE_Q4_0:
    case TR_TYPE_IQ4_NL: *lo = 2, *hi = 18; return;
    case TR_TYPE_Q4_1: *lo = 4, *hi = 20; return;
    case TR_TYPE_Q5_0: *lo = 2, *hi = 22; return;
    case TR_TYPE_Q5_1: *lo = 4, *hi = 24; return;
    case TR_TYPE_Q8_0: *lo = 2, *hi = 34; return;
    case TR_TYPE_MXFP4: *lo = 1, *hi = 17; return;
    case TR_TYPE_Q2_K: *lo = 16, *hi = 80; return;
    case TR_TYPE_Q3_K: *lo = 0, *hi = 96; return;
    case TR_TYPE_Q4_K:
    case TR_TYPE_Q5_K: *lo = 16, *hi = (int)tr_type_block_bytes(t); return;
    case TR_TYPE_Q6_K: *lo = 0, *hi = 192; return;
    case TR_TYPE_IQ4_XS: *lo = 8, *hi = 136; return;
    default: *lo = *hi = 0; return;
    }
}

/* W_i of the header comment, for one weight row */
static void carried_weights(tr_type t, const void *w, int64_t n, float *W) {
    const tr_type_traits *tt = tr_traits(t);
    tt->to_float(w, W, n);
    for (int64_t i = 0; i < n; i++) W[i] = fabsf(W[i]);
    const half_fields f = fields_of(t);
    const size_t bytes = tr_type_row_bytes(t, n);
    const int64_t nb = n / tt->blck;
    uint8_t *copy = malloc(bytes);
    float *tmp = malloc((size_t)n * sizeof(float));
    if (f.m >= 0) {
        /* d-part and min-part separately: zero the other scale and dequantize */
        memcpy(copy, w, bytes);
        for (int64_t b = 0; b < nb; b++) put_half(copy + (size_t)b * tt->bytes + f.m, 0);
        tt->to_float(copy, W, n);
        memcpy(copy, w, bytes);
        for (int64_t b = 0; b < nb; b++) put_half(copy + (size_t)b * tt->bytes + f.d, 0);
        tt->to_float(copy, tmp, n);
        for (int64_t i = 0; i < n; i++) W[i] = fabsf(W[i]) + fabsf(tmp[i]);
    } else if (t == TR_TYPE_Q6_K || t == TR_TYPE_Q3_K || t == TR_TYPE_Q4_0 || t == TR_TYPE_Q5_0 ||
               t == TR_TYPE_MXFP4) {
        /* a probe code whose value is -offset (code 0; MXFP4: nibble 7 = +12) on every element
         * dequantizes to offset·|d·sc|, hence W_i = 3·|probe_i| */
        int lo, hi;
        code_bytes(t, &lo, &hi);
        memcpy(copy, w, bytes);
        for (int64_t b = 0; b < nb; b++)
            memset(copy + (size_t)b * tt->bytes + lo, t == TR_TYPE_MXFP4 ? 0x77 : 0,
                   (size_t)(hi - lo));
        tt->to_float(copy, tmp, n);
        for (int64_t i = 0; i < n; i++) W[i] = 3.0f * fabsf(tmp[i]);
    }
    free(copy);
    free(tmp);
}

/* T = Σ W_i·|a_i| (double) */
static double magnitude(tr_type t, const void *w, const void *aq, int64_t n) {
    float *W = malloc((size_t)n * sizeof(float));
    float *A = malloc((size_t)n * sizeof(float));
    carried_weights(t, w, n, W);
    dequant_act(tr_traits(t)->vec_dot_type, aq, A, n);
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m += (double)W[i] * fabs((double)A[i]);
    free(W);
    free(A);
    return m;
}

static double tolerance(tr_type t, int64_t n, double mag, float ref) {
    const int64_t blck = tr_type_block_elems(t);
    const double L =
        is_float_type(t) ? (double)((n + 7) / 8) + 16.0 : 2.0 * (double)(n / blck) + 16.0;
    return (L + 5.0) * k_u * mag + k_u * fabs((double)ref);
}

/* The gemm kernels (kernels.h) keep one f32 accumulator per output across the row: for the
 * float types a chain of n FMAs, for the quantized ones two terms per sub-block (the scaled
 * integer dot and the min term; the K-quants sum a super-block's scaled dots first, one more
 * rounding each), so L = n, or 2·n/sub, plus the final adds of K chunks. */
static double tolerance_gemm(tr_type t, int64_t n, double mag, float ref) {
    const double L = is_float_type(t) ? (double)n + 16.0
                                      : 2.0 * (double)(n / tr_gemm_traits_of(t)->sub) + 16.0;
    return (L + 5.0) * k_u * mag + k_u * fabs((double)ref);
}

/* ------------------------------------------------------------------------------- statistics */

typedef struct {
    double max_rel;   /* max |fast - ref| / T */
    double max_ratio; /* max |fast - ref| / tolerance */
    long checks;
} stat;

/* every family any build has; those this build or CPU lacks are skipped */
static const char *const k_fam_names[] = {"scalar", "avx2", "avx512", "neon", "dotprod", "i8mm"};
#define N_FAMS (int)(sizeof k_fam_names / sizeof k_fam_names[0])

static stat g_stat[N_FAMS][N_TYPES]; /* [family][type] */

static bool within(stat *st, float fast, float ref, double tol, double mag) {
    const double diff = fabs((double)fast - (double)ref);
    if (st) {
        const double rel = mag > 0 ? diff / mag : diff;
        if (rel > st->max_rel) st->max_rel = rel;
        const double ratio = tol > 0 ? diff / tol : (diff > 0 ? INFINITY : 0);
        if (ratio > st->max_ratio) st->max_ratio = ratio;
        st->checks++;
    }
    return isfinite(fast) && diff <= tol;
}

/* ------------------------------------------------------------------------------ dot products */

/* buffers with an offset from malloc's alignment, so no kernel may rely on aligned rows, and no
 * slack at the end, so AddressSanitizer sees any read past a row */
static void *alloc_off(size_t bytes, size_t off) { return (char *)malloc(bytes + off) + off; }
static void free_off(void *p, size_t off) { free((char *)p - off); }

/* activation rows (terrace's own buffers) keep their element alignment */
static size_t row_offset(tr_type t) {
    if (t == TR_TYPE_F32 || t == TR_TYPE_Q8_K) return 4;
    if (t == TR_TYPE_MXFP4) return 1;
    return 2;
}
/* weight rows come from the file, where general.alignment = 1 allows any byte (unaligned.h):
 * an odd address, so UBSan sees any load that assumes more */
#define WEIGHT_OFFSET 1

/* activation rows check_dots makes: enough for vec_dot_nc and vec_dot_side */
#define N_ACT (TR_SIDE_MAX_NC > TR_MAX_NC ? TR_SIDE_MAX_NC : TR_MAX_NC)

/* side tables of N_ACT activation rows, per_block floats per block, `sstride` floats apart; built
 * in two block ranges (as tr_matmul's threads do for few rows) */
static float *side_tables(tr_act_side_fn fill, const char *a, size_t astride, int64_t nb,
                          size_t sstride) {
    float *side = malloc(sizeof(float) * sstride * N_ACT);
    for (size_t i = 0; i < sstride * N_ACT; i++) side[i] = 0.0f;
    for (int j = 0; j < N_ACT; j++) {
        float *sd = side + (size_t)j * sstride;
        fill(a + (size_t)j * astride, nb, 0, nb / 2, sd);
        fill(a + (size_t)j * astride, nb, nb / 2, nb, sd);
    }
    return side;
}

/* The matmul path with activation side tables: the tables must hold exactly the block scales and
 * the code sums (Q8_0) or stored s (Q8_1); vec_dot_side must match the reference for nc = 1..
 * TR_SIDE_MAX_NC, and give every column the bits it gets alone (nc = 1): a request batched with
 * others gets the answer it gets alone. The wide tables' kernel (vec_dot_side_wide) must give
 * those same bits, and so must the AVX2 family's kernel for the AVX-512 family's. */
static void check_side(const tr_kernels *fast, int fam, int ti, int64_t n, const void *w,
                       const char *a, size_t astride, const float *refv, const double *mag) {
    const tr_type t = k_types[ti];
    const tr_type vt = tr_traits(t)->vec_dot_type;
    const int64_t nb = n / TR_QK32;
    TU_CHECK(fast->act_side[vt] != NULL, "%s %s has vec_dot_side but no act_side", fast->isa,
             tr_type_name(t));
    if (!fast->act_side[vt]) return;
    const size_t sstride = 2 * (size_t)nb + 3; /* rows a little apart */
    float *side = side_tables(fast->act_side[vt], a, astride, nb, sstride);
    const size_t bb = tr_type_block_bytes(vt);
    for (int j = 0; j < N_ACT; j++) {
        const char *row = a + (size_t)j * astride;
        const float *sd = side + (size_t)j * sstride;
        for (int64_t b = 0; b < nb; b++) {
            const char *blk = row + (size_t)b * bb;
            uint16_t d, s2;
            memcpy(&d, blk, 2);
            memcpy(&s2, blk + 2, 2);
            float want = tr_f16_to_f32(s2); /* Q8_1: the stored s */
            if (vt == TR_TYPE_Q8_0) {
                int sum = 0;
                for (int i = 0; i < 32; i++) sum += (int8_t)blk[2 + i];
                want = (float)sum;
            }
            TU_CHECK(sd[b] == tr_f16_to_f32(d) && sd[nb + b] == want,
                     "%s act_side %s block %lld: %g %g, want %g %g", fast->isa, tr_type_name(vt),
                     (long long)b, sd[b], sd[nb + b], tr_f16_to_f32(d), want);
        }
    }
    stat *st = &g_stat[fam][ti];
    const size_t ss = 3;
    float alone[N_ACT]; /* each column with nc = 1 */
    for (int j = 0; j < N_ACT; j++)
        fast->vec_dot_side[t](n, 1, &alone[j], ss, w, a + (size_t)j * astride, astride,
                              side + (size_t)j * sstride, sstride);
    /* one activation row against several weight rows (vec_dot_side_rows): w, w with its blocks in
     * reverse order, w again, a block apart more than their size; each row must get the bits
     * vec_dot_side gives it alone, and nothing past the rows may be written */
    if (fast->vec_dot_side_rows[t]) {
        const size_t bw = tr_type_block_bytes(t), wbytes = tr_type_row_bytes(t, n);
        const size_t wstride = wbytes + bw;
        uint8_t *rows = alloc_off(3 * wstride, row_offset(t));
        for (int r = 0; r < 3; r++) memcpy(rows + (size_t)r * wstride, w, wbytes);
        for (int64_t b = 0; b < nb; b++)
            memcpy(rows + wstride + (size_t)b * bw, (const uint8_t *)w + (size_t)(nb - 1 - b) * bw,
                   bw);
        for (int j = 0; j < N_ACT; j++) {
            float got[4] = {NAN, NAN, NAN, NAN}, want[3];
            const float *sd = side + (size_t)j * sstride;
            fast->vec_dot_side_rows[t](n, 3, got, rows, wstride, a + (size_t)j * astride, sd);
            for (int r = 0; r < 3; r++) {
                fast->vec_dot_side[t](n, 1, &want[r], 1, rows + (size_t)r * wstride,
                                      a + (size_t)j * astride, astride, sd, sstride);
                TU_CHECK(!memcmp(&got[r], &want[r], sizeof(float)),
                         "%s %s vec_dot_side_rows n=%lld col %d row %d: %.9g, not the bits of "
                         "vec_dot_side (%.9g)", fast->isa, tr_type_name(t), (long long)n, j, r,
                         got[r], want[r]);
            }
            TU_CHECK(isnan(got[3]), "%s %s vec_dot_side_rows wrote past its rows", fast->isa,
                     tr_type_name(t));
        }
        free_off(rows, row_offset(t));
    }
    /* the kernels to check: the family's, its wide one, the AVX2 family's for AVX-512 */
    const tr_kernels *avx2 = strcmp(fast->isa, "avx512") ? NULL : tr_kernels_by_name("avx2");
    const char *const what[3] = {"vec_dot_side", "vec_dot_side_wide", "avx2 vec_dot_side"};
    for (int kind = 0; kind < 3; kind++) {
        tr_vec_dot_side_fn fn = kind == 0 ? fast->vec_dot_side[t]
                                : kind == 1 ? fast->vec_dot_side_wide[t]
                                : avx2 ? avx2->vec_dot_side[t] : NULL;
        if (!fn) continue;
        const float *tab = side;
        size_t tstride = sstride;
        float *wide = NULL;
        if (kind == 1) {
            TU_CHECK(fast->act_side_wide[vt] && fast->act_side_wide_floats >= 2 &&
                         fast->act_side_wide_floats <= TR_SIDE_WIDE_FLOATS_MAX,
                     "%s %s has vec_dot_side_wide but no act_side_wide", fast->isa,
                     tr_type_name(t));
            if (!fast->act_side_wide[vt]) continue;
            tstride = (size_t)fast->act_side_wide_floats * (size_t)nb + 5;
            wide = side_tables(fast->act_side_wide[vt], a, astride, nb, tstride);
            tab = wide;
            /* it starts as the narrow table */
            for (int j = 0; j < N_ACT; j++)
                TU_CHECK(!memcmp(wide + (size_t)j * tstride, side + (size_t)j * sstride,
                                 sizeof(float) * 2 * (size_t)nb),
                         "%s act_side_wide %s row %d: its scales and second values differ from "
                         "act_side's", fast->isa, tr_type_name(vt), j);
        }
        for (int nc = 1; nc <= TR_SIDE_MAX_NC; nc++) {
            float s[3 * TR_SIDE_MAX_NC];
            for (int i = 0; i < 3 * TR_SIDE_MAX_NC; i++) s[i] = NAN;
            fn(n, nc, s, ss, w, a, astride, tab, tstride);
            for (int j = 0; j < nc; j++) {
                const double tol = tolerance(t, n, mag[j], refv[j]);
                TU_CHECK(within(st, s[j * ss], refv[j], tol, mag[j]),
                         "%s %s %s n=%lld nc=%d col %d: %.9g vs ref %.9g (tol %.3g)", fast->isa,
                         tr_type_name(t), what[kind], (long long)n, nc, j, s[j * ss], refv[j],
                         tol);
                TU_CHECK(!memcmp(&s[j * ss], &alone[j], sizeof(float)),
                         "%s %s %s n=%lld nc=%d col %d: %.9g, not the bits of vec_dot_side with "
                         "nc = 1 (%.9g)", fast->isa, tr_type_name(t), what[kind], (long long)n,
                         nc, j, s[j * ss], alone[j]);
            }
            for (int i = 0; i < 3 * TR_SIDE_MAX_NC; i++)
                if (i % ss != 0 || i / ss >= (size_t)nc)
                    TU_CHECK(isnan(s[i]), "%s %s %s nc=%d wrote outside its outputs (%d)",
                             fast->isa, tr_type_name(t), what[kind], nc, i);
        }
        free(wide);
    }
    free(side);
}

/* Two weight rows at once (vec_dot_2r): row 0 is w, row 1 a new random row a little after it
 * (w_stride differs from the row size), against nc = 1..4 activation rows; s[r + j * s_stride]
 * must match the reference for both rows and nothing else may be written. */
static void check_2r(const tr_kernels *ref, const tr_kernels *fast, int fam, int ti, int64_t n,
                     const void *w, const char *a, size_t astride, const float *refv,
                     const double *mag, tu_rng *r) {
    const tr_type t = k_types[ti];
    const size_t wbytes = tr_type_row_bytes(t, n), wstride = wbytes + 2 * tr_type_block_bytes(t);
    const size_t woff = row_offset(t);
    uint8_t *w2 = alloc_off(wstride + wbytes, woff); /* row 1 ends the buffer */
    memcpy(w2, w, wbytes);
    memset(w2 + wbytes, 0xA5, wstride - wbytes);
    fill_weights(r, t, w2 + wstride, n);
    float ref1[TR_MAX_NC];
    double mag1[TR_MAX_NC];
    for (int j = 0; j < TR_MAX_NC; j++) {
        ref->vec_dot[t](n, &ref1[j], w2 + wstride, a + (size_t)j * astride);
        mag1[j] = magnitude(t, w2 + wstride, a + (size_t)j * astride, n);
    }
    stat *st = &g_stat[fam][ti];
    for (int nc = 1; nc <= TR_MAX_NC; nc++) {
        const size_t ss = 5; /* output stride: columns of a matmul, the two rows adjacent */
        float s[5 * TR_MAX_NC];
        for (int i = 0; i < 5 * TR_MAX_NC; i++) s[i] = NAN;
        fast->vec_dot_2r[t](n, nc, s, ss, w2, wstride, a, astride);
        for (int j = 0; j < nc; j++)
            for (int row = 0; row < 2; row++) {
                const float want = row ? ref1[j] : refv[j];
                const double m = row ? mag1[j] : mag[j];
                const double tol = tolerance(t, n, m, want);
                TU_CHECK(within(st, s[row + j * ss], want, tol, m),
                         "%s %s vec_dot_2r n=%lld nc=%d row %d col %d: %.9g vs ref %.9g (tol %.3g)",
                         fast->isa, tr_type_name(t), (long long)n, nc, row, j, s[row + j * ss],
                         want, tol);
            }
        for (int i = 0; i < 5 * TR_MAX_NC; i++)
            if (i % ss > 1 || i / ss >= (size_t)nc)
                TU_CHECK(isnan(s[i]), "%s %s vec_dot_2r nc=%d wrote outside its outputs (%d)",
                         fast->isa, tr_type_name(t), nc, i);
    }
    free_off(w2, woff);
}

static void check_dots(const tr_kernels *ref, const tr_kernels *fast, int fam, int ti, int64_t n,
                       tu_rng *r) {
    const tr_type t = k_types[ti];
    const tr_type vt = tr_traits(t)->vec_dot_type;
    const size_t wbytes = tr_type_row_bytes(t, n);
    /* activation rows a little apart so a_stride differs from the row size */
    const size_t abytes = tr_type_row_bytes(vt, n);
    const size_t astride = abytes + (vt == TR_TYPE_Q8_K || vt == TR_TYPE_F32 ? 4 : 2) * 3;
    const size_t woff = WEIGHT_OFFSET, aoff = row_offset(vt);
    void *w = alloc_off(wbytes, woff);
    char *a = alloc_off(astride * (N_ACT - 1) + abytes, aoff); /* last row ends the buffer */
    float *x = malloc((size_t)n * sizeof(float));
    fill_weights(r, t, w, n);
    float refv[N_ACT];
    double mag[N_ACT];
    for (int j = 0; j < N_ACT; j++) {
        fill_acts(r, x, n);
        ref->from_float[vt](x, a + (size_t)j * astride, n);
        ref->vec_dot[t](n, &refv[j], w, a + (size_t)j * astride);
        mag[j] = magnitude(t, w, a + (size_t)j * astride, n);
    }
    stat *st = &g_stat[fam][ti];
    for (int j = 0; j < TR_MAX_NC; j++) {
        float s = NAN;
        fast->vec_dot[t](n, &s, w, a + (size_t)j * astride);
        const double tol = tolerance(t, n, mag[j], refv[j]);
        TU_CHECK(within(st, s, refv[j], tol, mag[j]),
                 "%s %s vec_dot n=%lld col %d: %.9g vs ref %.9g (tol %.3g)", fast->isa,
                 tr_type_name(t), (long long)n, j, s, refv[j], tol);
    }
    if (fast->vec_dot_nc[t]) {
        /* a family that takes more columns (nc_max) promises each column the bits it gets
         * alone */
        const int max_nc = fast->nc_max[t] > 0 ? fast->nc_max[t] : TR_MAX_NC;
        TU_CHECK(max_nc <= N_ACT, "%s %s nc_max %d", fast->isa, tr_type_name(t), max_nc);
        float alone[N_ACT];
        for (int j = 0; j < N_ACT; j++)
            fast->vec_dot_nc[t](n, 1, &alone[j], 1, w, a + (size_t)j * astride, astride);
        for (int nc = 1; nc <= max_nc && nc <= N_ACT; nc++) {
            const size_t ss = 3; /* output stride, as for M rows of a matmul */
            float s[3 * N_ACT];
            for (int i = 0; i < 3 * N_ACT; i++) s[i] = NAN;
            fast->vec_dot_nc[t](n, nc, s, ss, w, a, astride);
            for (int j = 0; j < nc; j++) {
                const double tol = tolerance(t, n, mag[j], refv[j]);
                TU_CHECK(within(st, s[j * ss], refv[j], tol, mag[j]),
                         "%s %s vec_dot_nc n=%lld nc=%d col %d: %.9g vs ref %.9g (tol %.3g)",
                         fast->isa, tr_type_name(t), (long long)n, nc, j, s[j * ss], refv[j], tol);
                if (fast->nc_max[t] > 0)
                    TU_CHECK(!memcmp(&s[j * ss], &alone[j], sizeof(float)),
                             "%s %s vec_dot_nc n=%lld nc=%d col %d: %.9g, not its bits alone "
                             "(%.9g)", fast->isa, tr_type_name(t), (long long)n, nc, j,
                             s[j * ss], alone[j]);
            }
            for (int i = 0; i < 3 * N_ACT; i++)
                if (i % ss != 0 || i / ss >= (size_t)nc)
                    TU_CHECK(isnan(s[i]), "%s %s vec_dot_nc nc=%d wrote outside its outputs (%d)",
                             fast->isa, tr_type_name(t), nc, i);
        }
    }
    if (fast->vec_dot_side[t]) check_side(fast, fam, ti, n, w, a, astride, refv, mag);
    if (fast->vec_dot_2r[t]) check_2r(ref, fast, fam, ti, n, w, a, astride, refv, mag, r);
    free_off(w, woff);
    free_off(a, aoff);
    free(x);
}

/* dot_rows (the KV scoring kernel): rows picked by index from a table whose rows sit row_bytes
 * apart (more than a row: the agent's page layout), repeated and out of order, against the
 * reference vec_dot of each row; the table ends the buffer so a read past the last row shows */
static void check_dot_rows(const tr_kernels *ref, const tr_kernels *fast, int fam, int ti,
                           int64_t n, tu_rng *r) {
    const tr_type t = k_types[ti];
    const size_t rb = tr_type_row_bytes(t, n), abytes = tr_type_row_bytes(TR_TYPE_Q8_0, n);
    enum { ROWS = 23, PICKS = 41 };
    for (int gap = 0; gap < 2; gap++) {
        const size_t stride = rb + (size_t)gap * 3 * rb;
        const size_t tbytes = stride * (ROWS - 1) + rb;
        uint8_t *tab = alloc_off(tbytes, 2);
        char *a = alloc_off(abytes, 2);
        float *x = malloc((size_t)n * sizeof(float));
        for (int i = 0; i < ROWS; i++) fill_weights(r, t, tab + (size_t)i * stride, n);
        fill_acts(r, x, n);
        ref->from_float[TR_TYPE_Q8_0](x, a, n);
        int32_t idx[PICKS];
        float out[PICKS + 1];
        for (int i = 0; i < PICKS; i++) idx[i] = (int32_t)(tu_next(r) % ROWS);
        idx[0] = ROWS - 1;
        out[PICKS] = -1.0f;
        tr_dot_rows(fast, t, n, PICKS, out, tab, stride, idx, a);
        TU_CHECK(out[PICKS] == -1.0f, "%s %s dot_rows wrote past its outputs", fast->isa,
                 tr_type_name(t));
        stat *st = &g_stat[fam][ti];
        for (int i = 0; i < PICKS; i++) {
            const uint8_t *w = tab + (size_t)idx[i] * stride;
            float want;
            ref->vec_dot[t](n, &want, w, a);
            const double mag = magnitude(t, w, a, n), tol = tolerance(t, n, mag, want);
            TU_CHECK(within(st, out[i], want, tol, mag),
                     "%s %s dot_rows n=%lld row %d (stride %zu): %.9g vs ref %.9g (tol %.3g)",
                     fast->isa, tr_type_name(t), (long long)n, idx[i], stride, out[i], want, tol);
        }
        free_off(tab, 2);
        free_off(a, 2);
        free(x);
    }
}

/* axpy_rows (the family's and the scalar reference) against a sum in double over the rows decoded
 * here: 1, 3 and 9 weight vectors (the AVX-512 kernel pairs rows up to 4 and takes 8 at a time),
 * 150 rows picked by index (repeats allowed; tiles of 64 and a ragged one), outputs at a stride
 * wider than a row, whose gaps must stay untouched */
static void check_axpy_rows(const tr_kernels *fast, int ti, int64_t n, tu_rng *r) {
    const tr_type t = k_types[ti];
    const size_t rb = tr_type_row_bytes(t, n);
    enum { ROWS = 19, PICKS = 150, NW = 9 };
    uint8_t *tab = malloc(rb * ROWS);
    for (int i = 0; i < ROWS; i++) fill_weights(r, t, tab + (size_t)i * rb, n);
    int32_t idx[PICKS];
    for (int i = 0; i < PICKS; i++) idx[i] = (int32_t)(tu_next(r) % ROWS);
    for (int nw = 1; nw <= NW; nw += nw == 1 ? 2 : 6) {
        const size_t os = (size_t)n + 5;
        float w[NW * PICKS],
            *out[2] = {malloc(sizeof(float) * os * NW), malloc(sizeof(float) * os * NW)};
        for (int i = 0; i < NW * PICKS; i++) w[i] = (float)(tu_next(r) % 2001) / 1000.0f - 1.0f;
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < os * NW; i++) out[k][i] = 0.25f;
        tr_axpy_rows(fast, t, n, PICKS, nw, out[0], os, w, PICKS, tab, rb, idx);
        tr_axpy_rows_ref(t, n, PICKS, nw, out[1], os, w, PICKS, tab, rb, idx);
        for (int h = 0; h < nw; h++)
            for (int64_t e = 0; e < n; e++) {
                double want = 0.25, mag = 0.25;
                for (int i = 0; i < PICKS; i++) {
                    const uint8_t *row = tab + (size_t)idx[i] * rb;
                    double x;
                    if (t == TR_TYPE_Q8_0) {
                        const tr_blk_q8_0 *b = (const tr_blk_q8_0 *)row + e / 32;
                        x = (double)tr_f16_to_f32(b->d) * b->qs[e % 32];
                    } else {
                        const tr_blk_q4_0 *b = (const tr_blk_q4_0 *)row + e / 32;
                        const int j = (int)(e % 32);
                        const int q = j < 16 ? (b->qs[j] & 15) : (b->qs[j - 16] >> 4);
                        x = (double)tr_f16_to_f32(b->d) * (q - 8);
                    }
                    want += (double)w[h * PICKS + i] * x;
                    mag += fabs((double)w[h * PICKS + i] * x);
                }
                for (int k = 0; k < 2; k++) {
                    const float got = out[k][(size_t)h * os + (size_t)e];
                    TU_CHECK(fabs(got - want) <= 1e-5 * mag,
                             "%s %s axpy_rows n=%lld nw=%d "
                             "[%d][%lld]: %.9g vs %.9g",
                             k ? "reference" : fast->isa, tr_type_name(t), (long long)n, nw, h,
                             (long long)e, got, want);
                }
            }
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < NW; h++)
                for (size_t e = (size_t)n; e < os; e++)
                    TU_CHECK(out[k][(size_t)h * os + e] == 0.25f, "%s axpy_rows wrote past a row",
                             k ? "reference" : fast->isa);
        free(out[0]);
        free(out[1]);
    }
    free(tab);
}

/* axpy_f16 (the attention's weighted sum of F16 value rows): the family's bits against the
 * reference's (a multiply then an add in float, both), with ragged lengths around the 8-wide step,
 * values over the whole F16 range (subnormals included), and the output past n untouched */
static void check_axpy_f16(const tr_kernels *fast, tu_rng *r) {
    static const int64_t ns[] = {1, 7, 8, 9, 64, 127, 128, 131};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int64_t n = ns[k];
        uint16_t v[140];
        float out[2][144];
        for (int64_t d = 0; d < n; d++) {
            uint16_t h;
            do h = (uint16_t)tu_next(r);
            while ((h & 0x7c00) == 0x7c00); /* finite values only */
            v[d] = h;
        }
        for (int i = 0; i < 144; i++) out[0][i] = out[1][i] = (float)(tu_next(r) % 2001) / 100.0f - 10.0f;
        const float p = (float)(tu_next(r) % 1000 + 1) / 1000.0f;
        tr_axpy_f16_of(fast)(n, out[0], v, p);
        tr_axpy_f16_ref(n, out[1], v, p);
        TU_CHECK(!memcmp(out[0], out[1], sizeof out[0]), "%s axpy_f16 n=%lld differs from the "
                 "reference (or wrote past n)", fast->isa, (long long)n);
    }
}

/* attn_f16 (the attention kernel) against tr_attn_f16_ref: 1..16 query vectors with ragged key
 * ranges (a causal diagonal, a sliding window, ranges that start and end inside a key block, a
 * single key), with and without sinks, keys sitting among other heads' (k_pos > hd_k), values as
 * rows and transposed, head dimensions that are and are not multiples of the vector tiles.
 * Tolerance: the scores differ from the reference's by float summation order, which can move a
 * probability across one F16 rounding step: at most 2^-10 of it (a normal F16), or 2^-24 (a
 * subnormal one); the output then moves by at most 2^-10 · Σ p·|v| + 2^-24 · Σ |v| over the keys,
 * plus the f32 sums' rounding. */
static void check_attn(const tr_kernels *fast, tu_rng *r, double *worst) {
    static const int hds[][2] = {{64, 64}, {128, 128}, {256, 256}, {80, 80}, {40, 72}, {8, 8}};
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
        const int hdk = hds[h][0], hdv = hds[h][1];
        for (int rep = 0; rep < 6; rep++) {
            const int nkv = 3, kvh = rep % nkv; /* the head used, among 3 */
            const int32_t n_ctx = rep < 3 ? 200 + 61 * rep : 700;
            const bool vt = rep % 2 == 1;
            uint16_t *K = malloc(2 * (size_t)n_ctx * nkv * hdk);
            uint16_t *V = malloc(2 * (size_t)n_ctx * nkv * hdv);
            for (size_t i = 0; i < (size_t)n_ctx * nkv * hdk; i++) K[i] = tr_f32_to_f16(tu_normal(r));
            for (size_t i = 0; i < (size_t)n_ctx * nkv * hdv; i++) V[i] = tr_f32_to_f16(tu_normal(r));
            tr_attn_kv kv = {.k = K + (size_t)kvh * hdk, .k_pos = (size_t)nkv * hdk,
                             .hd_k = hdk, .hd_v = hdv, .scale = 1.0f / sqrtf((float)hdk)};
            if (vt) { /* [head][dim][position] */
                kv.v = V + (size_t)kvh * hdv * n_ctx;
                kv.v_pos = 1;
                kv.v_dim = (size_t)n_ctx;
            } else {
                kv.v = V + (size_t)kvh * hdv;
                kv.v_pos = (size_t)nkv * hdv;
                kv.v_dim = 1;
            }
            const int n_q = 1 + (int)(tu_next(r) % TR_ATTN_MAX_Q);
            float *q = malloc(sizeof(float) * (size_t)n_q * hdk);
            float *out[2] = {malloc(sizeof(float) * (size_t)n_q * hdv),
                             malloc(sizeof(float) * (size_t)n_q * hdv)};
            for (int i = 0; i < n_q * hdk; i++) q[i] = tu_normal(r) * (rep == 5 ? 6.0f : 2.0f);
            tr_attn_q qs[2][TR_ATTN_MAX_Q];
            float qmax[2][TR_ATTN_MAX_Q];
            double qsum[2][TR_ATTN_MAX_Q];
            const int32_t pos0 = (int32_t)(tu_next(r) % (uint64_t)(n_ctx - n_q));
            const int32_t swa = rep == 4 ? 37 : 0;
            for (int i = 0; i < n_q; i++) {
                const int32_t pos = rep == 3 ? (int32_t)(tu_next(r) % (uint64_t)n_ctx) : pos0 + i;
                int32_t lo = swa && pos >= swa ? pos - swa + 1 : 0;
                if (rep == 2 && i == 0) lo = pos; /* one key */
                const float sink = rep % 3 == 2 ? tu_normal(r) : -INFINITY;
                for (int k = 0; k < 2; k++)
                    qs[k][i] = (tr_attn_q){q + (size_t)i * hdk, out[k] + (size_t)i * hdv, lo, pos,
                                           sink, &qmax[k][i], &qsum[k][i]};
            }
            float *scratch = malloc(sizeof(float) * tr_attn_scratch_floats(n_ctx, hdk, hdv));
            tr_attn_f16_of(fast)(n_q, qs[0], &kv, scratch);
            tr_attn_f16_ref(n_q, qs[1], &kv, scratch);
            for (int i = 0; i < n_q; i++) {
                /* Σ p·|v| per output, from the reference's own probabilities (recomputed) */
                const tr_attn_q *a = &qs[1][i];
                const int32_t n = a->hi - a->lo + 1;
                double *sc = malloc(sizeof(double) * (size_t)n), mx = a->sink, sum = 0;
                for (int32_t t = 0; t < n; t++) {
                    double d = 0;
                    for (int e = 0; e < hdk; e++)
                        d += (double)tr_f16_to_f32(tr_f32_to_f16(a->q[e])) *
                             tr_f16_to_f32(kv.k[(size_t)(a->lo + t) * kv.k_pos + e]);
                    sc[t] = d * kv.scale;
                    if (sc[t] > mx) mx = sc[t];
                }
                for (int32_t t = 0; t < n; t++) sum += exp(sc[t] - mx);
                if (a->sink != -INFINITY) sum += exp(a->sink - mx);
                /* the max and denominator a caller merges partial calls with: both kernels
                 * report their own, close to the double recomputation (the scores' f32 sums,
                 * exp's few ulp) */
                for (int k = 0; k < 2; k++) {
                    const double em = fabs((double)qmax[k][i] - mx), es = fabs(qsum[k][i] - sum);
                    TU_CHECK(em <= 1e-5 * (1.0 + fabs(mx)) * (double)(hdk + 8) &&
                                 es <= 1e-5 * sum * (double)(hdk + 8),
                             "%s attn hd %d/%d query %d (%s): max %.9g sum %.9g vs %.9g %.9g",
                             fast->isa, hdk, hdv, i, k ? "ref" : "fast", qmax[k][i], qsum[k][i],
                             mx, sum);
                }
                for (int d = 0; d < hdv; d++) {
                    double T = 0, A = 0;
                    for (int32_t t = 0; t < n; t++) {
                        const double av = fabs(
                            tr_f16_to_f32(kv.v[(size_t)(a->lo + t) * kv.v_pos + (size_t)d * kv.v_dim]));
                        T += exp(sc[t] - mx) / sum * av;
                        A += av;
                    }
                    const double tol =
                        ((1.0 / 1024.0 + (double)(n + hdk + 16) * k_u) * T + k_u * A) * 1.01 + 1e-30;
                    const double diff = fabs((double)out[0][i * hdv + d] - (double)out[1][i * hdv + d]);
                    if (diff / tol > *worst) *worst = diff / tol;
                    TU_CHECK(diff <= tol, "%s attn hd %d/%d n_q %d query %d [%d..%d] dim %d: %.9g vs "
                             "ref %.9g (tol %.3g)", fast->isa, hdk, hdv, n_q, i, a->lo, a->hi, d,
                             out[0][i * hdv + d], out[1][i * hdv + d], tol);
                }
                free(sc);
            }
            free(scratch);
            free(q);
            free(out[0]);
            free(out[1]);
            free(K);
            free(V);
        }
    }
}

/* rmsnorm, swiglu, geglu against their references: ragged lengths around the vector widths.
 * rmsnorm only reorders its double sum (outputs within 2 f32 ulp); geglu must be bit-identical
 * (same lookups, exact conversions) on values across the table's range and its ±10 cut-offs;
 * swiglu differs by its exp (2 ulp), so within 8 ulp of |silu(x)·u|. */
static void check_elementwise(const tr_kernels *fast, tu_rng *r) {
    static const int64_t ns[] = {1, 7, 8, 15, 16, 17, 33, 576, 1000, 2048};
    uint16_t *table = malloc(sizeof(uint16_t) * ((1 << 16) + 2));
    for (int i = 0; i < (1 << 16) + 2; i++) table[i] = tr_f32_to_f16(tu_normal(r) * 3.0f);
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int64_t n = ns[k];
        float *x = malloc(sizeof(float) * (size_t)n), *w = malloc(sizeof(float) * (size_t)n);
        float *y[2] = {malloc(sizeof(float) * (size_t)n), malloc(sizeof(float) * (size_t)n)};
        float *u = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++) {
            x[i] = tu_normal(r) * (i % 5 == 0 ? 30.0f : 2.0f);
            w[i] = tu_normal(r);
            u[i] = tu_normal(r);
        }
        if (fast->rmsnorm)
            for (int wi = 0; wi < 2; wi++) {
                fast->rmsnorm(y[0], x, wi ? w : NULL, n, 1e-6f);
                tr_rmsnorm_ref(y[1], x, wi ? w : NULL, n, 1e-6f);
                for (int64_t i = 0; i < n; i++)
                    TU_CHECK(fabsf(y[0][i] - y[1][i]) <= 2.4e-7f * fabsf(y[1][i]),
                             "%s rmsnorm n=%lld [%lld]: %.9g vs %.9g", fast->isa, (long long)n,
                             (long long)i, y[0][i], y[1][i]);
            }
        if (fast->swiglu) {
            memcpy(y[0], x, sizeof(float) * (size_t)n);
            memcpy(y[1], x, sizeof(float) * (size_t)n);
            fast->swiglu(y[0], u, n);
            tr_swiglu_ref(y[1], u, n);
            for (int64_t i = 0; i < n; i++)
                TU_CHECK(fabsf(y[0][i] - y[1][i]) <= 4.8e-7f * fabsf(y[1][i]) + 1e-37f,
                         "%s swiglu n=%lld [%lld] (x %g): %.9g vs %.9g", fast->isa, (long long)n,
                         (long long)i, x[i], y[0][i], y[1][i]);
        }
        if (fast->f16_round) {
            /* the F16 gemm's activations: bit for bit the reference's, across the F16 range
             * (subnormals, exact ties, overflow to inf, NaNs with payloads) */
            static const uint32_t special[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7F800000u,
                                               0x477FF000u, 0x477FF001u, 0x33800000u, 0x33000000u,
                                               0x33000001u, 0x387FC000u, 0x00000001u, 0x80000000u,
                                               0x7F812345u, 0xFFFFFFFFu};
            for (int64_t i = 0; i < n; i++) {
                float v = x[i] * (i % 3 == 0 ? 1e-6f : i % 3 == 1 ? 3e3f : 1.0f);
                if (i % 11 == 5) {
                    const uint32_t b = special[(size_t)(i / 11) % (sizeof special / sizeof special[0])];
                    memcpy(&v, &b, 4);
                } else if (i % 11 == 7) { /* a tie halfway between two F16 values */
                    uint32_t b = tr_f32_to_bits(v);
                    b = (b & ~0x1FFFu) | 0x1000u;
                    v = tr_bits_to_f32(b);
                }
                w[i] = v;
            }
            fast->f16_round(y[0], w, n);
            tr_f16_round_ref(y[1], w, n);
            TU_CHECK(!memcmp(y[0], y[1], sizeof(float) * (size_t)n),
                     "%s f16_round n=%lld differs from the reference", fast->isa, (long long)n);
        }
        if (fast->geglu) {
            for (int64_t i = 0; i < n; i++)
                if (i % 7 == 3) x[i] = i % 2 ? 10.0f : -10.0f; /* the cut-offs themselves */
            memcpy(y[0], x, sizeof(float) * (size_t)n);
            memcpy(y[1], x, sizeof(float) * (size_t)n);
            fast->geglu(y[0], u, n, table);
            tr_geglu_ref(y[1], u, n, table);
            TU_CHECK(!memcmp(y[0], y[1], sizeof(float) * (size_t)n),
                     "%s geglu n=%lld differs from the reference", fast->isa, (long long)n);
        }
        free(x);
        free(w);
        free(u);
        free(y[0]);
        free(y[1]);
    }
    free(table);
}

/* A NaN that enters attention (a query element: weights with a NaN scale) or SwiGLU (a gate)
 * must come out as NaN, as from the references, so the forward pass's finiteness checks see
 * corrupt weights instead of a plausible answer (a vector exp whose clamps drop NaN did that). */
static void check_nan(const tr_kernels *fast, tu_rng *r) {
    const int hd = 64, n_ctx = 100;
    uint16_t *K = malloc(2 * (size_t)n_ctx * hd), *V = malloc(2 * (size_t)n_ctx * hd);
    for (int i = 0; i < n_ctx * hd; i++) {
        K[i] = tr_f32_to_f16(tu_normal(r));
        V[i] = tr_f32_to_f16(tu_normal(r));
    }
    const tr_attn_kv kv = {.k = K, .k_pos = (size_t)hd, .v = V, .v_pos = (size_t)hd, .v_dim = 1,
                           .hd_k = hd, .hd_v = hd, .scale = 0.125f};
    float q[4][64], out[4][64];
    tr_attn_q qs[4];
    for (int i = 0; i < 4; i++) {
        for (int d = 0; d < hd; d++) q[i][d] = tu_normal(r);
        qs[i] = (tr_attn_q){q[i], out[i], 0, n_ctx - 4 + i, -INFINITY, NULL, NULL};
    }
    q[2][5] = NAN;
    float *scratch = malloc(sizeof(float) * tr_attn_scratch_floats(n_ctx, hd, hd));
    tr_attn_f16_of(fast)(4, qs, &kv, scratch);
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < hd; d++)
            TU_CHECK(i == 2 ? isnan(out[i][d]) : isfinite(out[i][d]),
                     "%s attn with a NaN in query 2: query %d dim %d gives %g", fast->isa, i, d,
                     out[i][d]);
    if (fast->swiglu) {
        float g[40], u[40];
        for (int i = 0; i < 40; i++) g[i] = tu_normal(r), u[i] = tu_normal(r);
        g[3] = g[17] = g[38] = NAN; /* in a vector and in the tail */
        fast->swiglu(g, u, 40);
        for (int i = 0; i < 40; i++)
            TU_CHECK((i == 3 || i == 17 || i == 38) ? isnan(g[i]) : isfinite(g[i]),
                     "%s swiglu with NaN gates: [%d] gives %g", fast->isa, i, g[i]);
    }
    free(scratch);
    free(K);
    free(V);
}

/* Negative control: results of simulated kernel bugs must fail the check. The bugs are made on
 * the reference (so they are exactly what a broken kernel would return for these inputs):
 *   decode - every code byte of the last block XOR 0x11 (two nibbles / bit fields off by one
 *            step); float types: the last 8 elements with the sign flipped
 *   scale  - the last block's scale doubled or halved (f16 exponent bit, E8M0 LSB)
 *   tail   - the last block (float types: the last 7 elements) left out
 *   step   - one-block rows only: one code byte XOR 0x11 (one step on two elements)
 * A single simulated bug can be invisible by chance (a block's signed sum near zero, a random
 * sub-block scale of 0, two steps that cancel), so each is tried on 8 random rows and must be
 * flagged on at least 6. */
enum { BUG_DECODE, BUG_SCALE, BUG_TAIL, BUG_STEP, BUG_COUNT };

/* 1: flagged, 0: passed the check, -1: bug kind not applicable */
static int detects_error(const tr_kernels *ref, int ti, int64_t n, int bug, tu_rng *r) {
    const tr_type t = k_types[ti];
    const tr_type vt = tr_traits(t)->vec_dot_type;
    const bool flt = is_float_type(t);
    const int64_t blck = tr_type_block_elems(t);
    if (bug == BUG_SCALE && flt) return -1;
    if (bug == BUG_STEP && (flt || n != blck)) return -1;
    const size_t wbytes = tr_type_row_bytes(t, n), bb = tr_type_block_bytes(t);
    uint8_t *w = malloc(wbytes);
    uint8_t *wbad = malloc(wbytes);
    void *a = malloc(tr_type_row_bytes(vt, n));
    float *x = malloc((size_t)n * sizeof(float));
    fill_weights(r, t, w, n);
    if (!flt) {
        /* the bugged block gets a full-size scale: a block whose random scale is near zero
         * contributes nothing measurable, so no check could see its bugs */
        uint8_t *blk = w + wbytes - bb;
        const half_fields f = fields_of(t);
        if (t == TR_TYPE_MXFP4) blk[0] = 133;
        if (f.d >= 0) put_half(blk + f.d, tr_f32_to_f16(tu_uniform(r) < 0 ? -0.05f : 0.05f));
        if (f.m >= 0) put_half(blk + f.m, tr_f32_to_f16(0.05f));
    }
    fill_acts(r, x, n);
    ref->from_float[vt](x, a, n);
    memcpy(wbad, w, wbytes);
    int64_t nbad = n;
    uint8_t *last = wbad + wbytes - bb; /* flt: bb is the element size */
    int lo, hi;
    code_bytes(t, &lo, &hi);
    switch (bug) {
    case BUG_DECODE:
        if (flt)
            for (int64_t i = n < 8 ? 0 : n - 8; i < n; i++) wbad[(size_t)i * bb + bb - 1] ^= 0x80;
        else
            for (int i = lo; i < hi; i++) last[i] ^= 0x11;
        break;
    case BUG_SCALE:
        if (t == TR_TYPE_MXFP4)
            last[0] ^= 1;
        else
            last[fields_of(t).d + 1] ^= 0x04;
        break;
    case BUG_TAIL: nbad = flt ? (n > 7 ? n - 7 : 0) : n - blck; break;
    default: last[(lo + hi) / 2] ^= 0x11; break;
    }
    float good, bad = 0.0f;
    ref->vec_dot[t](n, &good, w, a);
    if (nbad > 0) ref->vec_dot[t](nbad, &bad, wbad, a);
    const double mag = magnitude(t, w, a, n);
    const double tol = tolerance(t, n, mag, good);
    free(w);
    free(wbad);
    free(a);
    free(x);
    return !within(NULL, bad, good, tol, mag);
}

/* --------------------------------------------------------------------------- quantizers */

static void check_quantizers(const tr_kernels *ref, const tr_kernels *fast, tu_rng *r) {
    const tr_type vts[] = {TR_TYPE_Q8_0, TR_TYPE_Q8_1, TR_TYPE_Q8_K, TR_TYPE_F16, TR_TYPE_BF16};
    for (size_t v = 0; v < sizeof vts / sizeof vts[0]; v++) {
        const tr_type vt = vts[v];
        if (fast->from_float[vt] == ref->from_float[vt]) continue;
        const int64_t blck = tr_type_block_elems(vt);
        long cases = 0;
        for (int rep = 0; rep < 300; rep++) {
            const int64_t n = blck * (1 + (int64_t)(tu_next(r) % (blck == 1    ? 600
                                                                  : blck == 32 ? 40
                                                                               : 6)));
            float *x = malloc((size_t)n * sizeof(float));
            const size_t bytes = tr_type_row_bytes(vt, n);
            uint8_t *q0 = malloc(bytes), *q1 = malloc(bytes);
            /* magnitudes from f16-subnormal d to large, exact zeros, ties in |max|, and values
             * that land on .5 after scaling */
            const bool flt = vt == TR_TYPE_F16 || vt == TR_TYPE_BF16;
            const int kind = rep % (flt ? 7 : 6);
            const float scale = kind == 0 ? 1e-6f : kind == 1 ? 3e3f : 1.0f;
            for (int64_t i = 0; i < n; i++) x[i] = tu_normal(r) * scale;
            if (kind == 2) memset(x, 0, (size_t)(n < 300 ? n : 300) * sizeof(float));
            if (kind == 3)
                for (int64_t i = 0; i + 8 < n; i += 37) x[i + 7] = -x[i];
            if (kind == 4) /* max 127 exactly: x·127/127 puts many values on .5 */
                for (int64_t i = 0; i < n; i++)
                    x[i] = (float)((int)(tu_next(r) % 255) - 127) * 0.5f;
            if (kind == 5 && blck > 3) /* the largest magnitude twice, opposite signs */
                for (int64_t b = 0; b + blck <= n; b += blck) {
                    x[b + 3] = 100.0f;
                    x[b + blck - 1] = -100.0f;
                }
            if (kind == 6) /* the float formats: NaNs with payloads, infinities, overflow,
                            * f32 subnormals, F16 subnormal ties */
                for (int64_t i = 0; i < n; i++) {
                    static const uint32_t bits[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u,
                                                    0x7FBFFFFFu, 0x7F800000u, 0xFF800000u,
                                                    0x477FF000u, 0x477FEFFFu, 0x49742400u,
                                                    0x00000001u, 0x807FFFFFu, 0x33000000u,
                                                    0x33C00000u, 0xB3A00000u, 0x38800000u};
                    const uint32_t b = bits[tu_next(r) % (sizeof bits / sizeof bits[0])];
                    if (tu_next(r) % 3) memcpy(&x[i], &b, 4);
                }
            ref->from_float[vt](x, q0, n);
            fast->from_float[vt](x, q1, n);
            TU_CHECK(memcmp(q0, q1, bytes) == 0,
                     "%s from_float %s differs from the reference (n=%lld case %d)", fast->isa,
                     tr_type_name(vt), (long long)n, kind);
            cases++;
            free(x);
            free(q0);
            free(q1);
        }
        printf("  %-7s from_float %-5s bit-identical to the reference on %ld rows\n", fast->isa,
               tr_type_name(vt), cases);
    }
}

/* ------------------------------------------------------------------------------------ matmul */

/* K 0: the default row length of the type (a few blocks) */
static void check_matmul(const tr_kernels *ref, const tr_kernels *k, tr_pool *pool, int fam, int ti,
                         int64_t N, int64_t M, int64_t Kw, tu_rng *r) {
    const tr_type t = k_types[ti];
    const tr_type vt = tr_traits(t)->vec_dot_type;
    const int64_t blck = tr_type_block_elems(t);
    const int64_t K = Kw ? Kw : is_float_type(t) ? 133 : blck == 32 ? 7 * 32 : 2 * 256;
    const bool gemm = k->gemm[t] && M >= k->gemm_min_m;
    const size_t rb = tr_type_row_bytes(t, K);
    uint8_t *wdata = alloc_off(rb * (size_t)N, WEIGHT_OFFSET);
    for (int64_t i = 0; i < N; i++) fill_weights(r, t, wdata + (size_t)i * rb, K);
    float *x = malloc(sizeof(float) * (size_t)(M * K));
    for (int64_t m = 0; m < M; m++) fill_acts(r, x + m * K, K);
    float *y = malloc(sizeof(float) * (size_t)(M * N));
    for (int64_t i = 0; i < M * N; i++) y[i] = NAN;
    void *scratch = malloc(tr_matmul_scratch_size(t, K, M));
    const tr_mat W = {.type = t, .n_in = K, .n_out = N, .data = wdata, .row_bytes = rb};
    tr_matmul(pool, k, &W, x, M, y, scratch);
    void *aq = malloc(tr_type_row_bytes(vt, K));
    int bad = 0;
    for (int64_t m = 0; m < M; m++) {
        ref->from_float[vt](x + m * K, aq, K);
        for (int64_t i = 0; i < N; i++) {
            float want;
            ref->vec_dot[t](K, &want, wdata + (size_t)i * rb, aq);
            const double mag = magnitude(t, wdata + (size_t)i * rb, aq, K);
            const double tol =
                gemm ? tolerance_gemm(t, K, mag, want) : tolerance(t, K, mag, want);
            if (!within(&g_stat[fam][ti], y[m * N + i], want, tol, mag) && bad++ < 3)
                TU_CHECK(false,
                         "%s %s %s threads=%d M=%lld N=%lld K=%lld y[%lld][%lld] = %.9g, want "
                         "%.9g (tol %.3g)",
                         k->isa, gemm ? "gemm" : "matmul", tr_type_name(t), tr_pool_size(pool),
                         (long long)M, (long long)N, (long long)K, (long long)m, (long long)i,
                         y[m * N + i], want, tol);
        }
    }
    free(aq);
    free(scratch);
    free(y);
    free(x);
    free_off(wdata, WEIGHT_OFFSET);
}

/* The per-row path (tr_matmul_rowwise) for M = 1..17 activation rows: every output must have the
 * bits that row gets in a product of its own (M = 1): a request batched with others gets the
 * answer it gets alone, whatever column groups the rows are split into (up to TR_SIDE_MAX_NC
 * per kernel call, more rows in several calls) and whichever kernel takes them. */
static void check_matmul_columns(const tr_kernels *k, tr_pool *pool, int ti, tu_rng *r) {
    const tr_type t = k_types[ti];
    const int64_t K = tr_type_block_elems(t) == 32 ? 18 * 32 : 3 * 256, N = 37, MMAX = 17;
    const size_t rb = tr_type_row_bytes(t, K);
    uint8_t *wdata = alloc_off(rb * (size_t)N, WEIGHT_OFFSET);
    for (int64_t i = 0; i < N; i++) fill_weights(r, t, wdata + (size_t)i * rb, K);
    float *x = malloc(sizeof(float) * (size_t)(MMAX * K));
    for (int64_t m = 0; m < MMAX; m++) fill_acts(r, x + m * K, K);
    float *alone = malloc(sizeof(float) * (size_t)(MMAX * N));
    float *y = malloc(sizeof(float) * (size_t)(MMAX * N));
    void *scratch = malloc(tr_matmul_scratch_size(t, K, MMAX));
    const tr_mat W = {.type = t, .n_in = K, .n_out = N, .data = wdata, .row_bytes = rb};
    for (int64_t m = 0; m < MMAX; m++) tr_matmul_rowwise(pool, k, &W, x + m * K, 1, alone + m * N, scratch);
    for (int64_t M = 2; M <= MMAX; M++) {
        for (int64_t i = 0; i < M * N; i++) y[i] = NAN;
        tr_matmul_rowwise(pool, k, &W, x, M, y, scratch);
        int bad = 0;
        for (int64_t i = 0; i < M * N; i++)
            if (memcmp(&y[i], &alone[i], sizeof(float)) && bad++ < 3)
                TU_CHECK(false,
                         "%s matmul %s threads=%d M=%lld y[%lld][%lld] = %.9g, not the bits of "
                         "its row alone (%.9g)",
                         k->isa, tr_type_name(t), tr_pool_size(pool), (long long)M,
                         (long long)(i / N), (long long)(i % N), y[i], alone[i]);
    }
    free(scratch);
    free(y);
    free(alone);
    free(x);
    free_off(wdata, WEIGHT_OFFSET);
}

/* ------------------------------------------------------------------------------------- main */

/* usage: test_kernels [FAMILY...] — every family this build and CPU run, or only the named ones
 * (each must be available; the emulated suite tests each Arm family at one CPU model) */
int main(int argc, char **argv) {
    tu_rng r = {0x5eed1234u};
    const tr_kernels *ref = tr_kernels_by_name("scalar");
    const char *const *fam_names = k_fam_names;
    const tr_kernels *fams[N_FAMS];
    for (int f = 0; f < N_FAMS; f++) {
        fams[f] = tr_kernels_by_name(fam_names[f]);
        bool named = argc == 1 || f == 0; /* scalar: the reference, also checked by matmul */
        for (int i = 1; i < argc; i++) named |= strcmp(argv[i], fam_names[f]) == 0;
        if (!named) fams[f] = NULL;
    }
    for (int i = 1; i < argc; i++)
        TU_CHECK(tr_kernels_by_name(argv[i]) != NULL,
                 "kernel family %s is not available in this build or on this CPU", argv[i]);
    TU_CHECK(ref != NULL, "no scalar family");
    printf("test_kernels: best family on this CPU: %s\n", tr_kernels_best()->isa);

    /* the check itself must catch simulated kernel bugs */
    static const char *bug_names[] = {"decode", "scale", "tail", "step"};
    int min_hits = 8;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int64_t blck = tr_type_block_elems(k_types[ti]);
        const int64_t ns[] = {is_float_type(k_types[ti]) ? 37 : blck, blck * 3,
                              is_float_type(k_types[ti]) ? 1000 : blck * (blck == 32 ? 156 : 19)};
        for (int i = 0; i < 3; i++)
            for (int bug = 0; bug < BUG_COUNT; bug++) {
                int hits = 0, tried = 0;
                for (int rep = 0; rep < 8; rep++) {
                    const int d = detects_error(ref, ti, ns[i], bug, &r);
                    if (d >= 0) tried++, hits += d;
                }
                if (!tried) continue;
                if (hits < min_hits) min_hits = hits;
                TU_CHECK(hits >= 6,
                         "%s n=%lld: a simulated %s bug passed the check on %d of 8 rows",
                         tr_type_name(k_types[ti]), (long long)ns[i], bug_names[bug], 8 - hits);
            }
    }
    printf("  simulated kernel bugs: each kind flagged on >= %d of 8 random rows\n", min_hits);

    /* row lengths: every tail case of the float loops (16/64-element steps, 8/16-element
     * vectors), and for block types 1, 2, 3 ... blocks, odd counts and a few thousand elements;
     * 32-element blocks: every short last group (1..7 blocks) after whole groups of 8 */
    static const int64_t n_float[] = {1,  2,  3,  5,  7,  8,   9,   15,  16,  17,   31,   32,  33,
                                      47, 63, 64, 65, 79, 127, 128, 129, 255, 1000, 4097, 5000};
    static const int64_t nb_32[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  11,  13,
                                    14, 15, 16, 17, 18, 20, 33, 48, 100, 156};
    static const int64_t nb_256[] = {1, 2, 3, 4, 5, 7, 16, 19};
    for (int f = 1; f < N_FAMS; f++) {
        if (!fams[f]) {
            printf("  %-7s not available on this CPU/build: skipped\n", fam_names[f]);
            continue;
        }
        for (int ti = 0; ti < N_TYPES; ti++) {
            const tr_type t = k_types[ti];
            const int64_t blck = tr_type_block_elems(t);
            const int64_t *ns = is_float_type(t) ? n_float : blck == 32 ? nb_32 : nb_256;
            const int cnt = is_float_type(t) ? (int)(sizeof n_float / sizeof n_float[0])
                            : blck == 32     ? (int)(sizeof nb_32 / sizeof nb_32[0])
                                             : (int)(sizeof nb_256 / sizeof nb_256[0]);
            for (int i = 0; i < cnt; i++)
                for (int rep = 0; rep < 3; rep++)
                    check_dots(ref, fams[f], f, ti, is_float_type(t) ? ns[i] : ns[i] * blck, &r);
        }
        check_quantizers(ref, fams[f], &r);
        /* 1..9 groups of blocks: partial groups and the long-row fallback */
        for (int ti = 0; ti < N_TYPES; ti++)
            if (k_types[ti] == TR_TYPE_Q4_0 || k_types[ti] == TR_TYPE_Q8_0)
                for (int nb = 1; nb <= 40; nb += nb < 10 ? 1 : 7)
                    check_dot_rows(ref, fams[f], f, ti, nb * 32, &r);
        for (int ti = 0; ti < N_TYPES; ti++)
            if (k_types[ti] == TR_TYPE_Q4_0 || k_types[ti] == TR_TYPE_Q8_0)
                for (int nb = 1; nb <= 5; nb++) check_axpy_rows(fams[f], ti, nb * 32, &r);
        for (int rep = 0; rep < 4; rep++) check_axpy_f16(fams[f], &r);
        check_elementwise(fams[f], &r);
        check_nan(fams[f], &r);
        double worst = 0;
        for (int rep = 0; rep < 3; rep++) check_attn(fams[f], &r, &worst);
        printf("  %-6s attn_f16 within %.1f%% of its tolerance of the reference\n", fams[f]->isa,
               100.0 * worst);
    }

    /* matmul: every family (scalar included: it checks the row/column splitting itself) */
    for (int nth = 1; nth <= 3; nth++) {
        tr_pool *pool = NULL;
        tr_error err;
        TU_CHECK(tr_pool_create(nth, &pool, &err) == TR_OK, "pool of %d", nth);
        if (!pool) continue;
        /* (M, N): N not a multiple of the row chunk (N / (8·threads)); N = 300 gives chunks of
         * several row tiles plus a ragged one, and M = 9 two column groups (4 and 5 rows) */
        static const int64_t shapes[][2] = {{1, 61}, {3, 37}, {5, 61}, {8, 37}, {9, 300}};
        for (int f = 0; f < N_FAMS; f++) {
            if (!fams[f]) continue;
            for (int ti = 0; ti < N_TYPES; ti++)
                for (int si = 0; si < 5; si++)
                    check_matmul(ref, fams[f], pool, f, ti, shapes[si][1], shapes[si][0], 0, &r);
        }
        /* gemm (M >= gemm_min_m): every column tail of the micro-tiles (M = 16..31 covers
         * nc = 1..12 after full tiles), row counts that end in a partial panel and a partial
         * thread chunk, and rows longer than one panel's K (4096: two chunks, the last ragged
         * for the 32-element types) */
        static const int64_t gshapes[][3] = {
            {16, 37, 0}, {19, 61, 0}, {27, 300, 0}, {31, 33, 0}, {17, 16, 4096 + 96}};
        for (int f = 0; f < 3; f++) {
            if (!fams[f] || !fams[f]->gemm_min_m || nth == 3) continue;
            for (int ti = 0; ti < N_TYPES; ti++)
                for (int si = 0; si < 5; si++) {
                    const tr_type t = k_types[ti];
                    int64_t K = gshapes[si][2];
                    if (K && tr_type_block_elems(t) == 256) K = 4096 + 512;
                    if (K && is_float_type(t)) K = 1024 + 133;
                    check_matmul(ref, fams[f], pool, f, ti, gshapes[si][1], gshapes[si][0], K, &r);
                }
        }
        /* every row of a batch gets its bits alone (2 threads: a batch's rows split between
         * them by weight rows, as in a server step) */
        for (int f = 0; nth == 2 && f < N_FAMS; f++)
            for (int ti = 0; fams[f] && ti < N_TYPES; ti++)
                if (!is_float_type(k_types[ti])) check_matmul_columns(fams[f], pool, ti, &r);
        tr_pool_free(pool);
    }

    printf("  %-7s %-7s %12s %10s %8s\n", "type", "family", "max rel err", "of tol", "checks");
    for (int f = 0; f < N_FAMS; f++) {
        if (!fams[f]) continue;
        for (int ti = 0; ti < N_TYPES; ti++) {
            const stat *st = &g_stat[f][ti];
            printf("  %-7s %-7s %12.3g %9.1f%% %8ld\n", tr_type_name(k_types[ti]), fam_names[f],
                   st->max_rel, 100.0 * st->max_ratio, st->checks);
        }
    }
    return tu_result("test_kernels");
}
