/* GGUF reader internals shared by the reader and tools that need raw access. */
#ifndef TR_GGUF_INTERNAL_H
#define TR_GGUF_INTERNAL_H

#include "terrace.h"

typedef struct tr_gguf_kv {
    const char *key;      /* NUL-terminated, in the arena */
    uint64_t file_offset; /* where the record starts (for messages) */
    tr_gguf_vtype type;
    union {
        uint64_t u;
        int64_t i;
        double f;
    } v;
    tr_str str;
    tr_gguf_vtype arr_type;
    uint64_t arr_len;
    void *arr_data;   /* numeric arrays */
    tr_str *arr_strs; /* string arrays */
} tr_gguf_kv;

typedef struct tr_gguf_tinfo {
    tr_tensor_info info;
    uint64_t rel_offset;  /* offset relative to the shard's data section, as stored */
    uint64_t info_offset; /* byte offset of the tensor-info record (for messages) */
} tr_gguf_tinfo;

typedef struct tr_gguf_shard {
    char *path;
    int fd;
    uint64_t size;
    uint32_t index;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_start;
    int64_t n_tensors;
    int64_t split_no, split_count, split_tensors; /* -1 when absent */
    void *map;
    struct tr_mapguard *guard; /* SIGBUS guard of map (core/mapguard.h), NULL if none */
} tr_gguf_shard;

typedef struct tr_index {
    int64_t *slots;
    uint64_t mask;
} tr_index;

struct arena_chunk;

struct tr_gguf {
    uint32_t version, alignment;
    tr_gguf_shard *shards;
    uint32_t n_shards;
    tr_gguf_kv *kvs;
    int64_t n_kv;
    tr_gguf_tinfo *tensors;
    int64_t n_tensors;
    tr_index key_index, tensor_index;
    struct arena_chunk *arena;
};

/* pread exactly len bytes at `at`; short reads and errors become messages naming path/offset */
tr_status tr_pread_full(int fd, const char *path, void *dst, uint64_t len, uint64_t at,
                        tr_error *err);

#endif
