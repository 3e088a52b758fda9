/*
 * Prefill matrix products per weight type: y = W·X for M activation rows (a prompt's batch)
 * through tr_matmul on one thread, the family's gemm kernels against its per-row kernels
 * (vec_dot_nc, the path they replace), reported as multiply-adds per second of the thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID: a benchmark that shares the machine is slowed by time-sharing
 * far less than its wall clock is) and per cycle at the given clock.
 *
 * usage: bench_gemm [--types Q4_0,Q4_K,...] [--m 512] [--n 2048] [--k 2048] [--reps 3]
 *                   [--isa avx2|avx512] [--ghz 3.18] [--no-ref]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "terrace_seam.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}

/* random codes with small, finite f16 scales in every 16-bit field a block's scales may be in:
 * the bytes of every block are random, then each of its f16-aligned words that is a scale in
 * some layout is overwritten; values do not matter for speed, only that they are finite */
static void fill(tr_type t, uint8_t *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)next();
    if (t == TR_TYPE_F32) {
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            const float v = (float)((int)(next() % 2001) - 1000) / 1000.0f;
            memcpy(p + i, &v, 4);
        }
        return;
    }
    if (t == TR_TYPE_F16 || t == TR_TYPE_BF16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            const float v = (float)((int)(next() % 2001) - 1000) / 1000.0f;
            const uint16_t h = t == TR_TYPE_F16 ? tr_seam_f32_to_f16(v) : tr_seam_f32_to_bf16(v);
            memcpy(p + i, &h, 2);
        }
        return;
    }
    const size_t bb = tr_type_block_bytes(t);
    const uint16_t h = tr_seam_f32_to_f16(0.01f);
    for (size_t b = 0; b + bb <= bytes; b += bb) {
        if (t == TR_TYPE_MXFP4) p[b] = 120;
        /* d (and m/dmin) lead most layouts; Q2_K, Q3_K, Q6_K keep d at the end */
        memcpy(p + b, &h, 2);
        if (t != TR_TYPE_IQ4_XS) memcpy(p + b + 2, &h, 2);
        if (t == TR_TYPE_Q2_K || t == TR_TYPE_Q3_K || t == TR_TYPE_Q6_K) {
            memcpy(p + b + bb - 2, &h, 2);
            if (t == TR_TYPE_Q2_K) memcpy(p + b + bb - 4, &h, 2);
        }
    }
}

typedef struct mat {
    tr_type t;
    const void *w;
    size_t rb;
    int64_t n_in, n_out;
} mat;

static double run(const tr_kernels *k, bool gemm, const mat *W, const float *x, int64_t M,
                  float *y, void *scratch, int reps) {
    tr_seam_matmul(NULL, k, gemm, W->t, W->w, W->rb, W->n_in, W->n_out, x, M, y, scratch); /* warm-up */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = cpu_s();
        tr_seam_matmul(NULL, k, gemm, W->t, W->w, W->rb, W->n_in, W->n_out, x, M, y, scratch);
        const double t = cpu_s() - t0;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    const char *types = "Q4_0,Q4_1,Q5_0,Q8_0,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS,F16,F32";
    int64_t M = 512, N = 2048, K = 2048;
    int reps = 3;
    double ghz = 3.18;
    bool ref = true;
    const char *isa = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--types")) types = v, i++;
        else if (!strcmp(argv[i], "--m")) M = atoll(v), i++;
        else if (!strcmp(argv[i], "--n")) N = atoll(v), i++;
        else if (!strcmp(argv[i], "--k")) K = atoll(v), i++;
        else if (!strcmp(argv[i], "--reps")) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--ghz")) ghz = atof(v), i++;
        else if (!strcmp(argv[i], "--isa")) isa = v, i++;
        else if (!strcmp(argv[i], "--no-ref")) ref = false;
        else {
            fprintf(stderr, "usage: bench_gemm [--types T,...] [--m M] [--n N] [--k K] [--reps R] "
                            "[--isa avx2|avx512] [--ghz G] [--no-ref]\n");
            return 2;
        }
    }
    const tr_kernels *k = tr_seam_kernels(isa);
    if (!k) {
        fprintf(stderr, "bench_gemm: kernel family %s is not available here\n", isa);
        return 1;
    }
    printf("bench_gemm: %s, one thread, M=%lld N=%lld K=%lld, best of %d, CPU time\n", tr_seam_kernels_isa(k),
           (long long)M, (long long)N, (long long)K, reps);
    printf("| type | gemm GMAC/s | MAC/cycle @%.2f GHz | per-row GMAC/s | gemm / per-row |\n", ghz);
    printf("|---|---:|---:|---:|---:|\n");
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        tr_type t = TR_TYPE_COUNT;
        for (int i = 0; i < TR_TYPE_COUNT; i++)
            if (tr_type_known((uint32_t)i) && !strcmp(tr_type_name((tr_type)i), name))
                t = (tr_type)i;
        if (t == TR_TYPE_COUNT || !tr_type_supported(t) || K % tr_type_block_elems(t)) {
            fprintf(stderr, "bench_gemm: skipping %s\n", name);
            continue;
        }
        const size_t rb = tr_type_row_bytes(t, K);
        uint8_t *w = malloc(rb * (size_t)N);
        float *x = malloc(sizeof(float) * (size_t)(M * K));
        float *y = malloc(sizeof(float) * (size_t)(M * N));
        void *scratch = malloc(tr_seam_matmul_scratch(t, K, M));
        fill(t, w, rb * (size_t)N);
        for (int64_t i = 0; i < M * K; i++) x[i] = (float)((int)(next() % 2001) - 1000) / 500.0f;
        const mat W = {.t = t, .w = w, .rb = rb, .n_in = K, .n_out = N};
        const double macs = (double)M * (double)N * (double)K;
        const double tg = run(k, true, &W, x, M, y, scratch, reps);
        const double tr = ref ? run(k, false, &W, x, M, y, scratch, reps) : 0;
        printf("| %s | %.1f | %.1f | %s%.1f | %.2fx |\n", name, macs / tg * 1e-9,
               macs / tg / (ghz * 1e9), ref ? "" : "-", ref ? macs / tr * 1e-9 : 0.0,
               ref ? tr / tg : 0.0);
        fflush(stdout);
        free(w);
        free(x);
        free(y);
        free(scratch);
    }
    return 0;
}
