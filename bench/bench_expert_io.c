/*
 * Expert cache read bandwidth against dd on the same file, in the same run.
 *
 *   build/bench/bench_expert_io [FILE] [--layers N] [--reps R]
 *
 * FILE (default /tmp/terrace-bench-experts.bin) is created if missing: N layers x 16 experts
 * shaped like Qwen3-30B-A3B Q4_K_M (gate, up: 884,736 B; down: 1,290,240 B in even layers (Q6_K),
 * 884,736 B in odd ones (Q4_K)), at unaligned offsets. Each measurement drops the page cache
 * (needs root; otherwise it says "warm"), creates a cache that holds everything, and requests
 * every layer's experts 0..7 in turn (8 misses per layer, as a cold decode step), timing each layer
 * from acquire to the last expert handed out. The figure is bytes of expert data per second;
 * dd's is `dd if=FILE of=/dev/null bs=4M iflag=direct` over the whole file.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "terrace_seam.h"

#define N_EXPERT 16
#define TOPK     8

static int drop_caches(void) {
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f) return 0;
    const int ok = fputs("1\n", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* dd's own report, "... copied, 1.23 s, 456 MB/s": bytes and seconds */
static double dd_mbps(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "dd if='%s' of=/dev/null bs=4M iflag=direct 2>&1", path);
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[512];
    double bytes = 0, secs = 0;
    while (fgets(line, sizeof line, p)) {
        const char *c = strstr(line, "copied, ");
        unsigned long long b;
        if (c && sscanf(line, "%llu bytes", &b) == 1 && sscanf(c, "copied, %lf s", &secs) == 1)
            bytes = (double)b;
    }
    pclose(p);
    return secs > 0 ? bytes / secs / 1e6 : 0;
}

static const uint64_t Q4 = 884736, Q6 = 1290240;

int main(int argc, char **argv) {
    const char *path = "/tmp/terrace-bench-experts.bin";
    int n_layer = 8, reps = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            n_layer = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            path = argv[i];
    }
    if (n_layer < 1 || n_layer > 64) n_layer = 8;

    uint64_t *offsets = calloc((size_t)n_layer * 3, sizeof *offsets);
    uint64_t *part_bytes = calloc((size_t)n_layer * 3, sizeof *part_bytes);
    uint64_t off = 4096 + 160; /* GGUF data is 32-aligned, not 4096-aligned */
    for (int l = 0; l < n_layer; l++) {
        const uint64_t b[3] = {Q4, Q4, l % 2 ? Q4 : Q6};
        for (int p = 0; p < 3; p++) {
            offsets[l * 3 + p] = off;
            part_bytes[l * 3 + p] = b[p];
            off += N_EXPERT * b[p] + 32 * 7;
        }
    }
    const uint64_t size = off;
    int fd = open(path, O_RDONLY);
    if (fd < 0 || lseek(fd, 0, SEEK_END) != (off_t)size) {
        if (fd >= 0) close(fd);
        printf("writing %s (%.0f MiB)\n", path, (double)size / 1048576);
        const int w = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (w < 0) {
            perror(path);
            return 1;
        }
        char *buf = malloc(1 << 22);
        for (size_t i = 0; i < 1 << 22; i++) buf[i] = (char)(i * 131 + (i >> 12));
        for (uint64_t done = 0; done < size;) {
            const size_t n = size - done < (1u << 22) ? (size_t)(size - done) : 1u << 22;
            if (write(w, buf, n) != (ssize_t)n) {
                perror("write");
                return 1;
            }
            done += n;
        }
        free(buf);
        fsync(w);
        close(w);
        fd = open(path, O_RDONLY);
    }
    uint64_t layer_bytes = 0; /* expert bytes one pass reads */
    for (int i = 0; i < n_layer * 3; i++) layer_bytes += TOPK * part_bytes[i];

    const int cold = drop_caches();
    double dd = 0;
    for (int r = 0; r < reps; r++) {
        const double x = dd_mbps(path);
        if (x > dd) dd = x;
    }
    printf("file %s, %.0f MiB, %d layers x %d experts of %.2f-%.2f MB, top-%d; page cache %s\n",
           path, (double)size / 1048576, n_layer, N_EXPERT, (2 * Q4 + Q4) / 1e6,
           (2 * Q4 + Q6) / 1e6, TOPK,
           cold ? "dropped before each run" : "NOT dropped (not root): warm");
    printf("dd bs=4M iflag=direct: %.0f MB/s (best of %d)\n\n", dd, reps);
    printf("%-9s %7s %9s %10s %8s %10s %9s\n", "mode", "threads", "chunk", "MB/s", "vs dd",
           "ms/layer", "reads");

    const struct {
        bool buffered;
        int threads;
        uint32_t chunk;
    } cfg[] = {
        {false, 1, 0},         {false, 2, 0},       {false, 4, 0},       {false, 8, 0},
        {false, 4, 256 << 10}, {false, 4, 1 << 20}, {false, 8, 1 << 20}, {false, 4, 4 << 20},
        {true, 4, 0},          {true, 8, 0},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof *cfg; i++) {
        double best = 0, best_layer = 0;
        uint64_t reads = 0;
        for (int r = 0; r < reps; r++) {
            drop_caches();
            tr_seam_expert_pass ps = {.fd = fd,
                                      .path = path,
                                      .n_layer = n_layer,
                                      .n_expert = N_EXPERT,
                                      .topk = TOPK,
                                      .n_parts = 3,
                                      .offset = offsets,
                                      .bytes = part_bytes,
                                      .io_threads = cfg[i].threads,
                                      .buffered = cfg[i].buffered,
                                      .read_chunk = cfg[i].chunk};
            tr_error err;
            if (tr_seam_expert_read_pass(&ps, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            if (cfg[i].buffered == ps.direct_io) fprintf(stderr, "unexpected I/O mode\n");
            const double mbps = (double)layer_bytes / ps.seconds / 1e6;
            if (mbps > best) {
                best = mbps;
                best_layer = ps.seconds / n_layer * 1e3;
                reads = ps.reads;
            }
        }
        char chunk[32];
        snprintf(chunk, sizeof chunk, "%u KiB", (cfg[i].chunk ? cfg[i].chunk : 512u << 10) >> 10);
        printf("%-9s %7d %9s %10.0f %7.0f%% %10.2f %9llu\n",
               cfg[i].buffered ? "buffered" : "direct", cfg[i].threads, chunk, best,
               dd > 0 ? 100 * best / dd : 0, best_layer, (unsigned long long)reads);
    }
    close(fd);
    free(offsets);
    free(part_bytes);
    return 0;
}
