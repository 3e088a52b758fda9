/*
 * Batched decode products per weight type: y = W·X for M = 1..9 activation rows (the decode rows
 * of a server step) through tr_matmul's per-row kernels on one thread, reported as CPU time per
 * call and per column, and each M's time per column against M = 1's: how much a column costs
 * when it shares the weight rows with M - 1 others. The shapes default to SmolLM2-135M's FFN
 * (576 -> 1536); --n 49152 --types Q8_0 is its tied output head.
 *
 * usage: bench_decode_nc [--types Q4_1,Q8_0] [--ms 1,2,4,8] [--n 1536] [--k 576] [--reps 200]
 *                        [--isa avx2|avx512|scalar]
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

/* random codes, then a small finite f16 in the block's first two 16-bit words (d and, for Q4_1 /
 * Q5_1, m): the 32-element block types this benchmark is for all start that way */
static void fill(tr_type t, uint8_t *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)next();
    const size_t bb = tr_type_block_bytes(t);
    const uint16_t h = tr_seam_f32_to_f16(0.01f);
    for (size_t b = 0; b + bb <= bytes; b += bb) {
        memcpy(p + b, &h, 2);
        memcpy(p + b + 2, &h, 2);
    }
}

int main(int argc, char **argv) {
    const char *types = "Q4_1,Q8_0", *ms = "1,2,3,4,5,6,7,8,9";
    int64_t N = 1536, K = 576;
    int reps = 200;
    const char *isa = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--types")) types = v, i++;
        else if (!strcmp(argv[i], "--ms")) ms = v, i++;
        else if (!strcmp(argv[i], "--n")) N = atoll(v), i++;
        else if (!strcmp(argv[i], "--k")) K = atoll(v), i++;
        else if (!strcmp(argv[i], "--reps")) reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--isa")) isa = v, i++;
        else {
            fprintf(stderr, "usage: bench_decode_nc [--types T,...] [--ms 1,2,...] [--n N] [--k K] "
                            "[--reps R] [--isa avx2|avx512|scalar]\n");
            return 2;
        }
    }
    const tr_kernels *k = tr_seam_kernels(isa);
    if (!k) {
        fprintf(stderr, "bench_decode_nc: kernel family %s is not available here\n", isa);
        return 1;
    }
    printf("bench_decode_nc: %s, one thread, N=%lld K=%lld, best of %d, CPU time\n",
           tr_seam_kernels_isa(k), (long long)N, (long long)K, reps);
    printf("| type | M | us per call | us per column | per column / M=1's |\n|---|---:|---:|---:|---:|\n");
    char list[256];
    snprintf(list, sizeof list, "%s", types);
    for (char *name = strtok(list, ","); name; name = strtok(NULL, ",")) {
        tr_type t = TR_TYPE_COUNT;
        for (int i = 0; i < TR_TYPE_COUNT; i++)
            if (tr_type_known((uint32_t)i) && !strcmp(tr_type_name((tr_type)i), name))
                t = (tr_type)i;
        if (t == TR_TYPE_COUNT || !tr_type_supported(t) || K % tr_type_block_elems(t)) {
            fprintf(stderr, "bench_decode_nc: skipping %s\n", name);
            continue;
        }
        const int64_t maxm = 64;
        const size_t rb = tr_type_row_bytes(t, K);
        uint8_t *w = malloc(rb * (size_t)N);
        float *x = malloc(sizeof(float) * (size_t)(maxm * K));
        float *y = malloc(sizeof(float) * (size_t)(maxm * N));
        void *scratch = malloc(tr_seam_matmul_scratch(t, K, maxm));
        fill(t, w, rb * (size_t)N);
        for (int64_t i = 0; i < maxm * K; i++) x[i] = (float)((int)(next() % 2001) - 1000) / 500.0f;
        double one = 0;
        /* strtok is in use for the types: walk the M list by hand */
        for (const char *p = ms; *p;) {
            const int64_t M = atoll(p);
            while (*p && *p != ',') p++;
            if (*p) p++;
            if (M < 1 || M > maxm) continue;
            tr_seam_matmul(NULL, k, false, t, w, rb, K, N, x, M, y, scratch); /* warm-up */
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const double t0 = cpu_s();
                tr_seam_matmul(NULL, k, false, t, w, rb, K, N, x, M, y, scratch);
                const double dt = cpu_s() - t0;
                if (dt < best) best = dt;
            }
            if (M == 1) one = best;
            printf("| %s | %lld | %.1f | %.2f | %s%.2f |\n", name, (long long)M, best * 1e6,
                   best * 1e6 / (double)M, one > 0 ? "" : "-", one > 0 ? best / (double)M / one : 0.0);
            fflush(stdout);
        }
        free(w);
        free(x);
        free(y);
        free(scratch);
    }
    return 0;
}
