/*
 * Matvec bandwidth per weight type: y = W·x with W far larger than the last-level cache, through
 * tr_matmul on the persistent pool, reported as weight bytes per second next to the plain read
 * bandwidth of the same buffer with the same thread count (a vectorized sum over the same pages,
 * split across the pool the same way). A memory-bound kernel reaches a high fraction of it.
 *
 * usage: bench_kernels [--types Q4_K,Q8_0,...] [--gib 1.5] [--reps 5] [--threads 1,2]
 *                      [--k 4096] [--isa avx512|avx2|i8mm|dotprod|neon|scalar]
 *
 * Per type the matrix (gib GiB, K columns) is created once with random valid blocks, measured,
 * and freed before the next one, so at most one matrix is resident. Each thread count gets one
 * warm-up pass of each measurement, then `reps` passes alternating matvec and read (so drift in a
 * shared VM hits both alike); the medians are reported.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "terrace_seam.h"

#define MAX_THREADS 8

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* --------------------------------------------------------------------------- read bandwidth */

/* Sum of 64-bit words: the cheapest loop that touches every cache line, four independent
 * accumulators so the adds never limit it. The widest ISA the CPU has, chosen at run time (the
 * bench is built without ISA flags). */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const char *p, size_t n) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(p + i));
        s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(p + i + 64));
        s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(p + i + 128));
        s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(p + i + 192));
    }
    s0 = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
    return (uint64_t)_mm512_reduce_add_epi64(s0);
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const char *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, s0);
    return t[0] + t[1] + t[2] + t[3];
}
#endif

#if defined(__aarch64__)
static uint64_t sum_neon(const char *p, size_t n) {
    uint64x2_t s0 = vdupq_n_u64(0), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        s0 = vaddq_u64(s0, vreinterpretq_u64_u8(vld1q_u8((const uint8_t *)p + i)));
        s1 = vaddq_u64(s1, vreinterpretq_u64_u8(vld1q_u8((const uint8_t *)p + i + 16)));
        s2 = vaddq_u64(s2, vreinterpretq_u64_u8(vld1q_u8((const uint8_t *)p + i + 32)));
        s3 = vaddq_u64(s3, vreinterpretq_u64_u8(vld1q_u8((const uint8_t *)p + i + 48)));
    }
    return vaddvq_u64(vaddq_u64(vaddq_u64(s0, s1), vaddq_u64(s2, s3)));
}
#endif

static uint64_t sum_plain(const char *p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        s0 += w[0], s1 += w[1], s2 += w[2], s3 += w[3];
    }
    return s0 + s1 + s2 + s3;
}

typedef uint64_t (*sum_fn)(const char *p, size_t n);

static sum_fn pick_sum(const char **name) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return *name = "avx512", sum_avx512;
    if (__builtin_cpu_supports("avx2")) return *name = "avx2", sum_avx2;
#endif
#if defined(__aarch64__)
    return *name = "neon", sum_neon;
#endif
    *name = "scalar";
    return sum_plain;
}

typedef struct {
    sum_fn fn;
    const char *buf;
    size_t bytes, chunk;
    atomic_size_t next;
    _Atomic uint64_t sink; /* keeps the sums alive */
} read_job;

/* Same work split as tr_matmul: dynamic chunks, about 8 per thread. */
static void read_task(void *ctx, int ith, int nth) {
    (void)ith;
    (void)nth;
    read_job *j = ctx;
    uint64_t s = 0;
    for (;;) {
        const size_t b = atomic_fetch_add_explicit(&j->next, j->chunk, memory_order_relaxed);
        if (b >= j->bytes) break;
        const size_t e = b + j->chunk < j->bytes ? b + j->chunk : j->bytes;
        s += j->fn(j->buf + b, e - b);
    }
    atomic_fetch_add(&j->sink, s);
}

static double read_pass(tr_pool *pool, sum_fn fn, const char *buf, size_t bytes) {
    read_job j = {.fn = fn, .buf = buf, .bytes = bytes};
    j.chunk = (bytes / ((size_t)tr_pool_size(pool) * 8) + 4095) & ~(size_t)4095;
    atomic_init(&j.next, 0);
    atomic_init(&j.sink, 0);
    const double t0 = now_s();
    tr_seam_pool_run(pool, read_task, &j);
    return now_s() - t0;
}

/* ---------------------------------------------------------------------------- random weights */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_unit(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * (1.0 / 4503599627370496.0) - 1.0);
}

/* offsets of the f16 scale fields of a block (-1: none) */
static void scale_fields(tr_type t, int *d, int *m) {
    *d = *m = -1;
    switch (t) {
    case TR_TYPE_Q4_0:
    case TR_TYPE_Q5_0:
    case TR_TYPE_Q8_0:
    case TR_TYPE_IQ4_NL:
    case TR_TYPE_IQ4_XS: *d = 0; break;
    case TR_TYPE_Q4_1:
    case TR_TYPE_Q5_1:
    case TR_TYPE_Q4_K:
    case TR_TYPE_Q5_K: *d = 0, *m = 2; break;
    case TR_TYPE_Q2_K: *d = 80, *m = 82; break;
    case TR_TYPE_Q3_K: *d = 108; break;
    case TR_TYPE_Q6_K: *d = 208; break;
    default: break;
    }
}

/* Random code bytes with finite scales; float types get finite random values. */
static void fill_random(tr_type t, char *buf, size_t bytes, uint64_t seed) {
    uint64_t s = seed;
    if (t == TR_TYPE_F32 || t == TR_TYPE_F16 || t == TR_TYPE_BF16) {
        const size_t es = t == TR_TYPE_F32 ? 4 : 2;
        for (size_t i = 0; i + es <= bytes; i += es) {
            const float v = rng_unit(&s);
            if (t == TR_TYPE_F32)
                memcpy(buf + i, &v, 4);
            else {
                const uint16_t h = t == TR_TYPE_F16 ? tr_seam_f32_to_f16(v) : tr_seam_f32_to_bf16(v);
                memcpy(buf + i, &h, 2);
            }
        }
        return;
    }
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        const uint64_t r = rng_next(&s);
        memcpy(buf + i, &r, 8);
    }
    const size_t bb = tr_type_block_bytes(t);
    int d, m;
    scale_fields(t, &d, &m);
    for (size_t b = 0; b + bb <= bytes; b += bb) {
        const uint16_t hd = tr_seam_f32_to_f16(0.01f * rng_unit(&s));
        if (d >= 0) memcpy(buf + b + d, &hd, 2);
        if (m >= 0) memcpy(buf + b + m, &hd, 2);
        if (t == TR_TYPE_MXFP4) buf[b] = (char)(120 + rng_next(&s) % 8);
    }
}

/* ------------------------------------------------------------------------------------ main */

static void usage(void) {
    fprintf(stderr, "usage: bench_kernels [--types T1,T2,..] [--gib G] [--reps R] "
                    "[--threads 1,2] [--k K] [--isa avx512|avx2|i8mm|dotprod|neon|scalar]\n");
}

static bool parse_type(const char *name, tr_type *out) {
    for (int t = 0; t < TR_TYPE_COUNT; t++)
        if (tr_type_known((uint32_t)t) && strcmp(tr_type_name((tr_type)t), name) == 0) {
            *out = (tr_type)t;
            return tr_type_supported((tr_type)t);
        }
    return false;
}

/* The CPU's name (x86 "model name", Arm "CPU implementer"/"CPU part"), and whether this is an
 * aarch64 build under user-mode emulation: qemu-user passes the host's /proc/cpuinfo through, so
 * an aarch64 process that reads an x86 vendor_id runs emulated and its timings mean nothing. */
static bool cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[512];
    bool emulated = false;
    while (fgets(line, sizeof line, f)) {
#if defined(__aarch64__)
        if (strncmp(line, "vendor_id", 9) == 0) emulated = true;
        if (strncmp(line, "CPU part", 8) == 0 && !emulated) {
            const char *p = strchr(line, ':');
            snprintf(out, cap, "aarch64, CPU part %s", p ? p + 2 : "?");
            out[strcspn(out, "\n")] = 0;
            break;
        }
#endif
        if (strncmp(line, "model name", 10) == 0) {
            const char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ') p++;
                snprintf(out, cap, "%s", p);
                out[strcspn(out, "\n")] = 0;
            }
            break;
        }
    }
    fclose(f);
    return emulated;
}

int main(int argc, char **argv) {
    static const tr_type default_types[] = {
        TR_TYPE_F32,  TR_TYPE_F16,  TR_TYPE_BF16,   TR_TYPE_Q8_0,   TR_TYPE_Q4_0, TR_TYPE_Q4_1,
        TR_TYPE_Q5_0, TR_TYPE_Q5_1, TR_TYPE_IQ4_NL, TR_TYPE_MXFP4,  TR_TYPE_Q2_K, TR_TYPE_Q3_K,
        TR_TYPE_Q4_K, TR_TYPE_Q5_K, TR_TYPE_Q6_K,   TR_TYPE_IQ4_XS,
    };
    tr_type types[TR_TYPE_COUNT];
    int n_types = 0;
    double gib = 1.5;
    int reps = 5, n_thr = 0, thr[MAX_THREADS];
    int64_t K = 4096;
    const char *isa = NULL;
    for (int i = 1; i < argc; i += 2) { /* every flag takes a value */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(argv[i], "--types")) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%s", v);
            for (char *tok = strtok(tmp, ","); tok && n_types < TR_TYPE_COUNT;
                 tok = strtok(NULL, ",")) {
                if (!parse_type(tok, &types[n_types])) {
                    fprintf(stderr, "bench_kernels: unknown or unsupported type %s\n", tok);
                    return 2;
                }
                n_types++;
            }
        } else if (!strcmp(argv[i], "--gib")) {
            gib = atof(v);
        } else if (!strcmp(argv[i], "--reps")) {
            reps = atoi(v);
        } else if (!strcmp(argv[i], "--k")) {
            K = atoll(v);
        } else if (!strcmp(argv[i], "--isa")) {
            isa = v;
        } else if (!strcmp(argv[i], "--threads")) {
            char tmp[128];
            snprintf(tmp, sizeof tmp, "%s", v);
            for (char *tok = strtok(tmp, ","); tok && n_thr < MAX_THREADS; tok = strtok(NULL, ","))
                thr[n_thr++] = atoi(tok);
        } else {
            usage();
            return 2;
        }
    }
    if (!n_types) {
        n_types = (int)(sizeof default_types / sizeof default_types[0]);
        memcpy(types, default_types, sizeof default_types);
    }
    if (!n_thr) thr[0] = 1, thr[1] = 2, n_thr = 2;
    if (gib <= 0 || reps < 1 || K < 256 || K % 256) {
        fprintf(stderr, "bench_kernels: need --gib > 0, --reps >= 1, --k a multiple of 256\n");
        return 2;
    }
    const tr_kernels *kern = tr_seam_kernels(isa);
    if (!kern) {
        fprintf(stderr, "bench_kernels: kernel family %s is not available here\n", isa);
        return 2;
    }
    tr_pool *pools[MAX_THREADS];
    for (int i = 0; i < n_thr; i++) {
        tr_error err;
        if (thr[i] < 1 || tr_pool_create(thr[i], &pools[i], &err) != TR_OK) {
            fprintf(stderr, "bench_kernels: cannot create a pool of %d threads\n", thr[i]);
            return 1;
        }
    }
    const char *read_isa;
    const sum_fn sum = pick_sum(&read_isa);

    char cpu[256], date[64];
    const bool emulated = cpu_model(cpu, sizeof cpu);
    const time_t tnow = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M", localtime(&tnow));
    printf("# bench_kernels %s\n\n", date);
    if (emulated)
        printf("**EMULATED**: an aarch64 build on an x86 host (%s) under qemu-user: the figures "
               "below show that the benchmark runs, not how fast anything is.\n\n", cpu);
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    char l3s[32] = "L3 size unknown"; /* glibc reports none on most Arm systems */
    if (l3 > 0) snprintf(l3s, sizeof l3s, "%ld MiB L3", l3 >> 20);
    printf("CPU: %s, %s; kernel family: %s; read loop: %s; matrix %.2f GiB per type, "
           "K = %lld, median of %d after a warm-up\n\n",
           cpu, l3s, tr_seam_kernels_isa(kern), read_isa, gib, (long long)K, reps);
    if (l3 > 0 && gib * 1073741824.0 < 3.0 * (double)l3)
        printf(
            "(note: the matrix is less than 3x the L3 size; the figures include cache hits)\n\n");
    printf("| type | weight bytes |");
    for (int i = 0; i < n_thr; i++)
        printf(" matvec GB/s %dT | read GB/s %dT | %% of read %dT |", thr[i], thr[i], thr[i]);
    printf("\n|---|---:|");
    for (int i = 0; i < n_thr; i++) printf("---:|---:|---:|");
    printf("\n");
    fflush(stdout);

    float *x = malloc(sizeof(float) * (size_t)K);
    uint64_t seed = 42;
    for (int64_t i = 0; i < K; i++) x[i] = rng_unit(&seed);
    for (int ti = 0; ti < n_types; ti++) {
        const tr_type t = types[ti];
        const size_t rb = tr_type_row_bytes(t, K);
        const int64_t N = (int64_t)(gib * 1073741824.0 / (double)rb);
        const size_t bytes = rb * (size_t)N;
        /* anonymous mapping with transparent huge pages: the same pages serve both loops */
        char *W = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (W == MAP_FAILED) {
            fprintf(stderr, "bench_kernels: cannot map %zu bytes\n", bytes);
            return 1;
        }
        madvise(W, bytes, MADV_HUGEPAGE);
        fill_random(t, W, bytes, 1000 + (uint64_t)t);
        float *y = malloc(sizeof(float) * (size_t)N);
        void *scratch = malloc(tr_seam_matvec_scratch(t, K));
        printf("| %s | %.2f GiB |", tr_type_name(t), (double)bytes / 1073741824.0);
        for (int i = 0; i < n_thr; i++) {
            double tm[64], tr[64];
            const int R = reps < 64 ? reps : 64;
            tr_seam_matvec(pools[i], kern, t, W, rb, K, N, x, y, scratch); /* warm-up */
            read_pass(pools[i], sum, W, bytes);
            for (int r = 0; r < R; r++) {
                const double t0 = now_s();
                tr_seam_matvec(pools[i], kern, t, W, rb, K, N, x, y, scratch);
                tm[r] = now_s() - t0;
                tr[r] = read_pass(pools[i], sum, W, bytes);
            }
            const double gm = (double)bytes / median(tm, R) / 1e9;
            const double gr = (double)bytes / median(tr, R) / 1e9;
            printf(" %.1f | %.1f | %.0f%% |", gm, gr, 100.0 * gm / gr);
            fflush(stdout);
        }
        printf("\n");
        free(scratch);
        free(y);
        munmap(W, bytes);
    }
    free(x);
    for (int i = 0; i < n_thr; i++) tr_pool_free(pools[i]);
    return 0;
}
