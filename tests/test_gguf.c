/*
 * GGUF data access: for every tensor of FILE, the bytes read with tr_gguf_read (pread) equal the
 * mapped bytes, reads outside a tensor are refused, and tensors named "tok.f32"/"vec.f32" (written
 * by tests/py/test_gguf_reader.py as arange) hold the values written.
 *
 * usage: test_gguf FILE.gguf
 */
#include <stdlib.h>
#include <string.h>

#include "terrace.h"
#include "testutil.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE.gguf\n", argv[0]);
        return 2;
    }
    tr_error err = {0};
    tr_gguf *g = NULL;
    if (tr_gguf_open(argv[1], &g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    TU_CHECK(tr_gguf_tensor_data(g, 0) == NULL || tr_gguf_n_tensors(g) == 0,
             "data must not be mapped before tr_gguf_map");
    TU_CHECK(tr_gguf_map(g, &err) == TR_OK, "%s", err.msg);
    TU_CHECK(tr_gguf_map(g, &err) == TR_OK, "second map must be a no-op: %s", err.msg);
    for (int64_t i = 0; i < tr_gguf_n_tensors(g); i++) {
        const tr_tensor_info *t = tr_gguf_tensor(g, i);
        TU_CHECK(tr_gguf_find_tensor(g, t->name) == i, "find_tensor(%s)", t->name);
        TU_CHECK(t->file_offset % tr_gguf_alignment(g) == 0, "%s misaligned", t->name);
        unsigned char *buf = malloc(t->nbytes + 1);
        TU_CHECK(tr_gguf_read(g, i, 0, buf, t->nbytes, &err) == TR_OK, "%s", err.msg);
        TU_CHECK(memcmp(buf, tr_gguf_tensor_data(g, i), t->nbytes) == 0, "%s: pread != map",
                 t->name);
        if (t->nbytes > 3) { /* a slice at an offset, as the expert cache reads */
            TU_CHECK(tr_gguf_read(g, i, 1, buf, t->nbytes - 2, &err) == TR_OK, "%s", err.msg);
            TU_CHECK(memcmp(buf, (const char *)tr_gguf_tensor_data(g, i) + 1, t->nbytes - 2) == 0,
                     "%s: slice", t->name);
        }
        TU_CHECK(tr_gguf_read(g, i, 1, buf, t->nbytes, &err) == TR_E_ARG,
                 "%s: a read past the tensor's end must be refused", t->name);
        TU_CHECK(strstr(err.msg, t->name) != NULL, "message names the tensor: %s", err.msg);
        if (!strcmp(t->name, "tok.f32") || !strcmp(t->name, "vec.f32")) {
            const float *f = tr_gguf_tensor_data(g, i);
            for (uint64_t k = 0; k < t->nbytes / 4; k++)
                TU_CHECK(f[k] == (float)k, "%s[%llu] = %g", t->name, (unsigned long long)k, f[k]);
        }
        free(buf);
    }
    TU_CHECK(tr_gguf_find_tensor(g, "no.such.tensor") == -1, "missing tensor lookup");
    TU_CHECK(tr_gguf_find_key(g, "no.such.key") == -1, "missing key lookup");
    TU_CHECK(tr_gguf_read(g, tr_gguf_n_tensors(g), 0, NULL, 0, &err) == TR_E_ARG, "bad index");
    tr_gguf_close(g);

    /* unreadable inputs give messages, not crashes */
    TU_CHECK(tr_gguf_open("/nonexistent/model.gguf", &g, &err) == TR_E_IO && g == NULL,
             "missing file");
    TU_CHECK(strstr(err.msg, "/nonexistent/model.gguf") != NULL, "names the path: %s", err.msg);
    TU_CHECK(tr_gguf_open("/", &g, &err) == TR_E_IO, "a directory");
    TU_CHECK(tr_gguf_open("", &g, &err) == TR_E_ARG, "empty path");
    return tu_result("test_gguf");
}
