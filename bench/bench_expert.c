/*
 * A GimmeMoE-shaped expert: y = down(silu(gate·x) * (up·x)) with gate and up 2048 -> 768 and
 * down 768 -> 2048, the shape of the INT8 expert kernel GimmeMoE reports (3.82x NEON + SDOT over
 * scalar), timed with every kernel family this build and CPU run (scalar and, on x86, avx2 /
 * avx512; on Arm neon / dotprod / i8mm), on one thread, so the figures compare kernels, not
 * thread scheduling.
 *
 * Weights: INT8 is Q8_0 here (int8 codes with one f16 scale per 32: terrace's INT8 format), and
 * Q4_K, each as slices of one stacked *_exps-like tensor of E experts (a repetition takes expert
 * rep % E, as routed tokens would, so consecutive repetitions do not just re-read one expert from
 * cache). Tokens: 1 (decode: three matrix-vector products) and 8 (a prefill slice routed to one
 * expert: the matrix-matrix path, where i8mm's SMMLA applies).
 *
 * usage: bench_expert [--reps 200] [--experts 8] [--types Q8_0,Q4_K] [--tokens 1,8]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/pool.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/matmul.h"

enum { D_MODEL = 2048, D_FF = 768 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* random code bytes with small finite f16 scales at the type's scale fields */
static void fill(tr_type t, uint8_t *p, size_t bytes, uint64_t seed) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        const uint64_t r = rng_next(&seed);
        memcpy(p + i, &r, 8);
    }
    const size_t bb = tr_type_block_bytes(t);
    const uint16_t d = tr_f32_to_f16(0.01f), dmin = tr_f32_to_f16(0.002f);
    for (size_t b = 0; b + bb <= bytes; b += bb) {
        memcpy(p + b, &d, 2); /* Q8_0 and Q4_K start with d */
        if (t == TR_TYPE_Q4_K) memcpy(p + b + 2, &dmin, 2);
    }
}

typedef struct {
    tr_type t;
    int E;
    size_t rb_in, rb_ff;   /* row bytes of gate/up (K = 2048) and of down (K = 768) */
    uint8_t *gate, *up, *down; /* E experts each */
} experts;

static tr_mat slice(const experts *x, int which, int e) {
    const bool dn = which == 2;
    const size_t rb = dn ? x->rb_ff : x->rb_in;
    const int64_t rows = dn ? D_MODEL : D_FF;
    const uint8_t *base = which == 0 ? x->gate : which == 1 ? x->up : x->down;
    return (tr_mat){.type = x->t, .n_in = dn ? D_FF : D_MODEL, .n_out = rows,
                    .data = base + (size_t)e * rb * (size_t)rows, .row_bytes = rb};
}

/* one expert FFN for M tokens (the scratch is sized for the larger of the two input widths) */
static void ffn(tr_pool *pool, const tr_kernels *k, const experts *x, int e, const float *in,
                int M, float *g, float *u, float *out, void *scratch) {
    const tr_mat G = slice(x, 0, e), U = slice(x, 1, e), Dn = slice(x, 2, e);
    tr_matmul(pool, k, &G, in, M, g, scratch);
    tr_matmul(pool, k, &U, in, M, u, scratch);
    for (int i = 0; i < M * D_FF; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    tr_matmul(pool, k, &Dn, g, M, out, scratch);
}

static bool emulated_host(void) {
#if defined(__aarch64__)
    /* qemu-user passes the host's /proc/cpuinfo through: an x86 vendor_id seen from aarch64 */
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[256];
    bool emu = false;
    while (!emu && fgets(line, sizeof line, f)) emu = strncmp(line, "vendor_id", 9) == 0;
    fclose(f);
    return emu;
#else
    return false;
#endif
}

int main(int argc, char **argv) {
    int reps = 200, E = 8;
    char types_s[128] = "Q8_0,Q4_K", tokens_s[64] = "1,8";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--experts")) E = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--types")) snprintf(types_s, sizeof types_s, "%s", argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) snprintf(tokens_s, sizeof tokens_s, "%s", argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_expert [--reps R] [--experts E] [--types Q8_0,Q4_K] "
                            "[--tokens 1,8]\n");
            return 2;
        }
    }
    if (argc % 2 == 0 || reps < 1 || E < 1) {
        fprintf(stderr, "bench_expert: every flag takes a value; --reps and --experts >= 1\n");
        return 2;
    }
    static const char *const fam_names[] = {"scalar", "avx2", "avx512", "neon", "dotprod", "i8mm"};
    const tr_kernels *fams[6];
    int nf = 0;
    for (int i = 0; i < 6; i++)
        if ((fams[nf] = tr_kernels_by_name(fam_names[i]))) nf++;
    tr_pool *pool;
    tr_error err;
    if (tr_pool_create(1, &pool, &err) != TR_OK) {
        fprintf(stderr, "bench_expert: %s\n", err.msg);
        return 1;
    }
    const bool emu = emulated_host();
    printf("# bench_expert: a %d -> %d -> %d expert FFN, %d repetitions over %d expert slices, "
           "1 thread\n\n", D_MODEL, D_FF, D_MODEL, reps, E);
    if (emu)
        printf("**EMULATED**: an aarch64 build on an x86 host under qemu-user: these times show "
               "that every family runs, not how fast it is (emulated SDOT/SMMLA cost what the "
               "emulator's helpers cost). Real figures need Arm hardware.\n\n");
    printf("| weights | tokens |");
    for (int f = 0; f < nf; f++) printf(" %s ms |", fams[f]->isa);
    for (int f = 1; f < nf; f++) printf(" %s vs scalar |", fams[f]->isa);
    printf(" largest difference from scalar (of max output) |\n|---|---:|");
    for (int f = 0; f < 2 * nf - 1; f++) printf("---:|");
    printf("---:|\n");

    char *tsave = NULL;
    for (char *tn = strtok_r(types_s, ",", &tsave); tn; tn = strtok_r(NULL, ",", &tsave)) {
        tr_type t;
        if (!strcmp(tn, "Q8_0")) t = TR_TYPE_Q8_0;
        else if (!strcmp(tn, "Q4_K")) t = TR_TYPE_Q4_K;
        else {
            fprintf(stderr, "bench_expert: type %s: Q8_0 or Q4_K\n", tn);
            return 2;
        }
        experts x = {.t = t, .E = E, .rb_in = tr_type_row_bytes(t, D_MODEL),
                     .rb_ff = tr_type_row_bytes(t, D_FF)};
        const size_t in_bytes = x.rb_in * D_FF * (size_t)E, dn_bytes = x.rb_ff * D_MODEL * (size_t)E;
        x.gate = malloc(in_bytes), x.up = malloc(in_bytes), x.down = malloc(dn_bytes);
        fill(t, x.gate, in_bytes, 1), fill(t, x.up, in_bytes, 2), fill(t, x.down, dn_bytes, 3);
        char tok_copy[64];
        snprintf(tok_copy, sizeof tok_copy, "%s", tokens_s);
        char *msave = NULL;
        for (char *ms = strtok_r(tok_copy, ",", &msave); ms; ms = strtok_r(NULL, ",", &msave)) {
            const int M = atoi(ms);
            if (M < 1 || M > 512) {
                fprintf(stderr, "bench_expert: --tokens: 1..512\n");
                return 2;
            }
            float *in = malloc(sizeof(float) * (size_t)M * D_MODEL);
            float *g = malloc(sizeof(float) * (size_t)M * D_FF), *u = malloc(sizeof(float) * (size_t)M * D_FF);
            float *out = malloc(sizeof(float) * (size_t)M * D_MODEL * (size_t)nf);
            const size_t ss = tr_matmul_scratch_size(t, D_MODEL, M);
            void *scratch = malloc(ss);
            uint64_t seed = 7;
            for (int i = 0; i < M * D_MODEL; i++)
                in[i] = (float)((double)(rng_next(&seed) >> 11) / 9007199254740992.0 - 0.5);
            double ms_f[6];
            for (int f = 0; f < nf; f++) {
                float *o = out + (size_t)f * M * D_MODEL;
                ffn(pool, fams[f], &x, 0, in, M, g, u, o, scratch); /* warm-up, and expert 0 */
                const double t0 = now_s();
                for (int r = 0; r < reps; r++)
                    ffn(pool, fams[f], &x, r % E, in, M, g, u, o + 0 * (size_t)0, scratch);
                ms_f[f] = (now_s() - t0) * 1e3 / reps;
                ffn(pool, fams[f], &x, 0, in, M, g, u, o, scratch); /* expert 0 for the check */
            }
            double dmax = 0, omax = 0;
            for (int f = 1; f < nf; f++)
                for (int i = 0; i < M * D_MODEL; i++) {
                    const double d = fabs((double)out[(size_t)f * M * D_MODEL + i] - out[i]);
                    dmax = d > dmax ? d : dmax;
                    omax = fabs(out[i]) > omax ? fabs(out[i]) : omax;
                }
            printf("| %s | %d |", t == TR_TYPE_Q8_0 ? "INT8 (Q8_0)" : "Q4_K", M);
            for (int f = 0; f < nf; f++) printf(" %.3f |", ms_f[f]);
            for (int f = 1; f < nf; f++) printf(" %.2fx |", ms_f[0] / ms_f[f]);
            printf(" %.1e |\n", omax > 0 ? dmax / omax : 0.0);
            fflush(stdout);
            free(in), free(g), free(u), free(out), free(scratch);
        }
        free(x.gate), free(x.up), free(x.down);
    }
    tr_pool_free(pool);
    return 0;
}
