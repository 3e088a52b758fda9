/*
 * libFuzzer target for the GGUF reader: each input is written to an in-memory file and opened
 * with tr_gguf_open; when it parses, every accessor is exercised and every tensor is mapped and
 * read, so out-of-bounds offsets surface under AddressSanitizer.
 *
 * build/run: make fuzz FUZZ_SECONDS=600   (corpus in fuzz/corpus, seeded by tests/py/test_hostile.py)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "terrace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int g_fd = -1;
static char g_path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (g_fd < 0) {
        g_fd = memfd_create("fuzz.gguf", 0);
        if (g_fd < 0) abort();
        snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    }
    if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, data, size, 0) != (ssize_t)size) abort();

    tr_error err;
    tr_gguf *g = NULL;
    if (tr_gguf_open(g_path, &g, &err) != TR_OK) {
        if (g != NULL || err.msg[0] == '\0') abort(); /* failures must say why */
        return 0;
    }
    volatile uint64_t sink = 0;
    for (int64_t i = 0; i < tr_gguf_n_kv(g); i++) {
        const char *key = tr_gguf_key(g, i);
        if (tr_gguf_find_key(g, key) != i) abort();
        int64_t iv;
        double fv;
        sink += tr_gguf_get_int(g, i, &iv) + tr_gguf_get_float(g, i, &fv);
        sink += tr_gguf_get_str(g, i).len;
        const uint64_t n = tr_gguf_arr_len(g, i);
        if (tr_gguf_arr_type(g, i) == TR_GGUF_STRING) {
            for (uint64_t j = 0; j < n; j++) {
                tr_str s = tr_gguf_arr_str(g, i, j);
                if (s.len) sink += (uint8_t)s.ptr[s.len - 1];
            }
        } else if (n) {
            const uint8_t *d = tr_gguf_arr_data(g, i);
            sink += d[0];
        }
    }
    if (tr_gguf_map(g, &err) == TR_OK) {
        for (int64_t i = 0; i < tr_gguf_n_tensors(g); i++) {
            const tr_tensor_info *t = tr_gguf_tensor(g, i);
            if (tr_gguf_find_tensor(g, t->name) != i) abort();
            const uint8_t *p = tr_gguf_tensor_data(g, i);
            if (t->nbytes) sink += p[0] + p[t->nbytes - 1];
            uint8_t buf[64];
            const uint64_t len = t->nbytes < sizeof buf ? t->nbytes : sizeof buf;
            if (tr_gguf_read(g, i, t->nbytes - len, buf, len, &err) != TR_OK) abort();
        }
    }
    (void)sink;
    tr_gguf_close(g);
    return 0;
}
