/* CPU feature detection and the choice of kernel family, done once. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/blocks.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/types.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TR_X86 1
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#define TR_ARM 1
/* the kernel's AT_HWCAP / AT_HWCAP2 bits (asm/hwcap.h), spelled out for C libraries without them */
#define TR_HWCAP_ASIMD   (1ul << 1)
#define TR_HWCAP_ASIMDDP (1ul << 20)
#define TR_HWCAP2_I8MM   (1ul << 13)
#endif

typedef struct {
    bool avx2;    /* AVX2 + FMA + F16C, OS saves YMM */
    bool avx512;  /* AVX-512 F/BW/VL/DQ + VNNI, OS saves ZMM */
    bool neon;    /* AArch64 Advanced SIMD (always there; the kernel still says so) */
    bool dotprod; /* SDOT/UDOT */
    bool i8mm;    /* SMMLA */
} cpu_features;

#if TR_X86
static uint64_t xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}
#endif

static cpu_features detect(void) {
    cpu_features f = {0};
#if TR_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
               f16c = c & (1u << 29);
    if (!osxsave || !avx) return f;
    const uint64_t xcr0 = xgetbv0();
    const bool ymm_ok = (xcr0 & 0x6) == 0x6;
    const bool zmm_ok = (xcr0 & 0xE6) == 0xE6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    const bool avx2 = b & (1u << 5);
    const bool avx512f = b & (1u << 16), avx512dq = b & (1u << 17), avx512bw = b & (1u << 30),
               avx512vl = b & (1u << 31), vnni = c & (1u << 11);
    f.avx2 = ymm_ok && avx2 && fma && f16c;
    f.avx512 = f.avx2 && zmm_ok && avx512f && avx512dq && avx512bw && avx512vl && vnni;
#endif
#if TR_ARM
    /* the kernel reports what it lets user space run (the instructions trap otherwise) */
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f.neon = hw & TR_HWCAP_ASIMD;
    f.dotprod = f.neon && (hw & TR_HWCAP_ASIMDDP);
    f.i8mm = f.dotprod && (hw2 & TR_HWCAP2_I8MM);
#endif
    return f;
}

void tr_vec_dot_nc_generic(tr_vec_dot_fn dot, int64_t n, int nc, float *restrict s,
                           size_t s_stride, const void *restrict w, const void *restrict a,
                           size_t a_stride) {
    for (int j = 0; j < nc; j++)
        dot(n, s + (size_t)j * s_stride, w, (const char *)a + (size_t)j * a_stride);
}

/* in order of preference within an architecture (only one architecture's families exist) */
enum { FAM_SCALAR, FAM_AVX2, FAM_AVX512, FAM_NEON, FAM_DOTPROD, FAM_I8MM, FAM_COUNT };
static tr_kernels g_fam[FAM_COUNT];
static bool g_have[FAM_COUNT];
static int g_best;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void fill_scalar(tr_kernels *k) {
    memset(k, 0, sizeof *k);
    k->isa = "scalar";
    for (int t = 0; t < TR_TYPE_COUNT; t++) {
        const tr_type_traits *tt = tr_traits((tr_type)t);
        k->vec_dot[t] = tt->vec_dot_ref;
        k->from_float[t] = tt->from_float_ref;
    }
}

static void init_once(void) {
    const cpu_features f = detect();
    fill_scalar(&g_fam[FAM_SCALAR]);
    g_have[FAM_SCALAR] = true;
#if TR_X86
    if (f.avx2) {
        fill_scalar(&g_fam[FAM_AVX2]);
        g_fam[FAM_AVX2].isa = "avx2";
        tr_kernels_fill_avx2(&g_fam[FAM_AVX2]);
        g_have[FAM_AVX2] = true;
    }
    if (f.avx512) {
        fill_scalar(&g_fam[FAM_AVX512]);
        g_fam[FAM_AVX512].isa = "avx512";
        tr_kernels_fill_avx2(&g_fam[FAM_AVX512]); /* entries AVX-512 does not cover */
        tr_kernels_fill_avx512(&g_fam[FAM_AVX512]);
        g_have[FAM_AVX512] = true;
    }
#elif TR_ARM
    if (f.neon) {
        fill_scalar(&g_fam[FAM_NEON]);
        g_fam[FAM_NEON].isa = "neon";
        tr_kernels_fill_neon(&g_fam[FAM_NEON]);
        g_have[FAM_NEON] = true;
    }
    if (f.dotprod) {
        fill_scalar(&g_fam[FAM_DOTPROD]);
        g_fam[FAM_DOTPROD].isa = "dotprod";
        tr_kernels_fill_dotprod(&g_fam[FAM_DOTPROD]);
        g_have[FAM_DOTPROD] = true;
    }
    if (f.i8mm) {
        fill_scalar(&g_fam[FAM_I8MM]);
        g_fam[FAM_I8MM].isa = "i8mm";
        tr_kernels_fill_dotprod(&g_fam[FAM_I8MM]); /* matrix-vector: SDOT */
        tr_kernels_fill_i8mm(&g_fam[FAM_I8MM]);
        g_have[FAM_I8MM] = true;
    }
#else
    (void)f;
#endif
    g_best = FAM_SCALAR;
    for (int i = 0; i < FAM_COUNT; i++)
        if (g_have[i]) g_best = i;
    /* TERRACE_ISA can only lower the choice: a family the CPU lacks would crash */
    const char *env = getenv("TERRACE_ISA");
    if (env) {
        for (int i = 0; i < FAM_COUNT; i++)
            if (g_have[i] && i < g_best && strcmp(env, g_fam[i].isa) == 0) g_best = i;
    }
}

void tr_dot_rows(const tr_kernels *k, tr_type t, int64_t n_el, int64_t n, float *restrict out,
                 const void *restrict rows, size_t row_bytes, const int32_t *restrict idx,
                 const void *restrict a) {
    if (k->dot_rows[t]) {
        k->dot_rows[t](n_el, n, out, rows, row_bytes, idx, a);
        return;
    }
    const tr_vec_dot_fn dot = k->vec_dot[t];
    for (int64_t i = 0; i < n; i++)
        dot(n_el, &out[i], (const uint8_t *)rows + (size_t)idx[i] * row_bytes, a);
}

void tr_axpy_rows_ref(tr_type t, int64_t n_el, int64_t n, int nw, float *restrict out,
                      size_t out_stride, const float *restrict w, size_t w_stride,
                      const void *restrict rows, size_t row_bytes, const int32_t *restrict idx) {
    const int64_t nb = n_el / TR_QK32;
    float x[TR_QK32];
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = (const uint8_t *)rows + (size_t)idx[i] * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            if (t == TR_TYPE_Q8_0)
                tr_dequant_q8_0((const tr_blk_q8_0 *)row + b, x, TR_QK32);
            else
                tr_dequant_q4_0((const tr_blk_q4_0 *)row + b, x, TR_QK32);
            for (int h = 0; h < nw; h++) {
                const float wi = w[(size_t)h * w_stride + (size_t)i];
                float *o = out + (size_t)h * out_stride + (size_t)b * TR_QK32;
                for (int j = 0; j < TR_QK32; j++) o[j] += wi * x[j];
            }
        }
    }
}

void tr_axpy_rows(const tr_kernels *k, tr_type t, int64_t n_el, int64_t n, int nw,
                  float *restrict out, size_t out_stride, const float *restrict w, size_t w_stride,
                  const void *restrict rows, size_t row_bytes, const int32_t *restrict idx) {
    if (k->axpy_rows[t])
        k->axpy_rows[t](n_el, n, nw, out, out_stride, w, w_stride, rows, row_bytes, idx);
    else
        tr_axpy_rows_ref(t, n_el, n, nw, out, out_stride, w, w_stride, rows, row_bytes, idx);
}

void tr_axpy_f16_ref(int64_t n, float *restrict out, const uint16_t *restrict v, float p) {
    for (int64_t d = 0; d < n; d++) out[d] += p * tr_f16_to_f32(v[d]);
}

tr_attn_fn tr_attn_f16_of(const tr_kernels *k) {
    return k->attn_f16 ? k->attn_f16 : tr_attn_f16_ref;
}

tr_axpy_f16_fn tr_axpy_f16_of(const tr_kernels *k) {
    return k->axpy_f16 ? k->axpy_f16 : tr_axpy_f16_ref;
}

/* ------------------------------------------------------------------ gemm activation layout */

static const tr_gemm_traits k_gemm_traits[TR_TYPE_COUNT] = {
    [TR_TYPE_F32] = {1, 0, false},     [TR_TYPE_F16] = {1, 0, false},
    [TR_TYPE_BF16] = {1, 0, false},    [TR_TYPE_Q4_0] = {32, 8, false},
    [TR_TYPE_Q4_1] = {32, 0, true},    [TR_TYPE_Q5_0] = {32, 16, false},
    [TR_TYPE_Q5_1] = {32, 0, true},    [TR_TYPE_Q8_0] = {32, 128, false},
    [TR_TYPE_IQ4_NL] = {32, 128, false}, [TR_TYPE_MXFP4] = {32, 12, false},
    [TR_TYPE_Q2_K] = {16, 0, true},    [TR_TYPE_Q3_K] = {16, 4, false},
    [TR_TYPE_Q4_K] = {32, 0, true},    [TR_TYPE_Q5_K] = {32, 0, true},
    [TR_TYPE_Q6_K] = {16, 32, false},  [TR_TYPE_IQ4_XS] = {32, 128, false},
};

const tr_gemm_traits *tr_gemm_traits_of(tr_type t) {
    static const tr_gemm_traits none = {0, 0, false};
    return (unsigned)t < TR_TYPE_COUNT && k_gemm_traits[t].sub ? &k_gemm_traits[t] : &none;
}

static bool gemm_float(tr_type t) { return tr_gemm_traits_of(t)->sub == 1; }

tr_gemm_act_parts tr_gemm_act_parts_of(tr_type t, int64_t K) {
    const int64_t ab = tr_traits(t)->vec_dot_type == TR_TYPE_Q8_K ? TR_QK_K : TR_QK32;
    const int64_t ns = K / tr_gemm_traits_of(t)->sub;
    tr_gemm_act_parts p;
    p.d = (size_t)K;
    p.corr = p.d + 4 * (size_t)(K / ab);
    p.mf = p.corr + 4 * (size_t)ns;
    return p;
}

size_t tr_gemm_act_bytes(tr_type t, int64_t K) {
    const tr_gemm_traits *g = tr_gemm_traits_of(t);
    if (!g->sub) return 0;
    const size_t bytes =
        gemm_float(t) ? 4 * (size_t)K : tr_gemm_act_parts_of(t, K).mf + 4 * (size_t)(K / g->sub);
    return (bytes + 63) & ~(size_t)63;
}

void tr_f16_round_ref(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = tr_f16_to_f32(tr_f32_to_f16(x[i]));
}

void tr_gemm_act_row(tr_type t, int64_t K, const float *x, const void *aq, void *out) {
    const tr_gemm_traits *g = tr_gemm_traits_of(t);
    if (gemm_float(t)) {
        float *y = out;
        if (t == TR_TYPE_F16) {
            tr_f16_round_ref(y, x, K);
            return;
        }
        for (int64_t i = 0; i < K; i++)
            y[i] = t == TR_TYPE_BF16 ? tr_bf16_to_f32(tr_f32_to_bf16(x[i])) : x[i];
        return;
    }
    const tr_gemm_act_parts p = tr_gemm_act_parts_of(t, K);
    int8_t *codes = out;
    float *d = (float *)((char *)out + p.d), *mf = (float *)((char *)out + p.mf);
    int32_t *corr = (int32_t *)((char *)out + p.corr);
    const int64_t ns = K / g->sub;
    const tr_type vt = tr_traits(t)->vec_dot_type;
    for (int64_t s = 0; s < ns; s++) {
        const int64_t e = s * g->sub; /* first element of the sub-block */
        int sum;
        float dd = 1.0f, second = 0.0f;
        if (vt == TR_TYPE_Q8_K) {
            const tr_blk_q8_k *b = (const tr_blk_q8_k *)aq + e / TR_QK_K;
            const int64_t j = e % TR_QK_K;
            memcpy(codes + e, b->qs + j, (size_t)g->sub);
            sum = b->bsums[j / 16] + (g->sub == 32 ? b->bsums[j / 16 + 1] : 0);
            if (j == 0) d[e / TR_QK_K] = b->d;
            dd = b->d;
        } else {
            /* Q8_0 and Q8_1 blocks both start with d; Q8_1 has s next, then the codes */
            const char *b = (const char *)aq + (size_t)(e / TR_QK32) * tr_traits(vt)->bytes;
            const int8_t *qs = vt == TR_TYPE_Q8_1 ? ((const tr_blk_q8_1 *)b)->qs
                                                  : ((const tr_blk_q8_0 *)b)->qs;
            memcpy(codes + e, qs, TR_QK32);
            uint16_t h[2];
            memcpy(h, b, sizeof h);
            d[e / TR_QK32] = tr_f16_to_f32(h[0]);
            sum = 0;
            for (int i = 0; i < TR_QK32; i++) sum += qs[i];
            if (vt == TR_TYPE_Q8_1) second = tr_f16_to_f32(h[1]);
        }
        corr[s] = -g->off * sum;
        mf[s] = !g->min ? 0.0f : vt == TR_TYPE_Q8_K ? dd * (float)sum : second;
    }
}

void tr_gemm_act_row_k(const tr_kernels *k, tr_type t, int64_t K, const float *x, const void *aq,
                       void *out) {
    if (t == TR_TYPE_F16 && k->f16_round) k->f16_round(out, x, K);
    else tr_gemm_act_row(t, K, x, aq, out);
}

const tr_kernels *tr_kernels_best(void) {
    pthread_once(&g_once, init_once);
    return &g_fam[g_best];
}

const tr_kernels *tr_kernels_by_name(const char *isa) {
    pthread_once(&g_once, init_once);
    for (int i = 0; i < FAM_COUNT; i++)
        if (g_have[i] && strcmp(isa, g_fam[i].isa) == 0) return &g_fam[i];
    return NULL;
}

const char *tr_cpu_isa(void) { return tr_kernels_best()->isa; }
