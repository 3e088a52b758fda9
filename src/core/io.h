/*
 * The I/O worker pool, apart from the compute pool: persistent threads (created once, joined at
 * free) that run read jobs (fd, offset, len, dst) with pread and report each finished job through
 * a callback. The expert cache, the KV cache's cold pool and the storage agent each run one. No
 * allocation per job: the caller owns every tr_io_job (the expert cache keeps a fixed array of
 * them per arena slot, the KV cache one per gather) and must not touch one between submit and its
 * completion callback.
 *
 * Fault injection (tests): the N-th read (counted from 1 over the pool's lifetime) fails with EIO
 * or comes back short, as a failing disk or a file truncated under us would.
 */
#ifndef TR_CORE_IO_H
#define TR_CORE_IO_H

#include <stdbool.h>
#include <stdint.h>

#include "terrace.h"

/* alignment of O_DIRECT offsets, lengths and buffers (covers 512-byte and 4K-sector devices) */
#define TR_IO_ALIGN 4096u

typedef struct tr_io_job {
    struct tr_io_job *next; /* queue link; the pool's while queued */
    int fd;
    bool direct;     /* fd is O_DIRECT: offset, len and dst are TR_IO_ALIGN-aligned */
    uint64_t offset; /* file offset */
    uint64_t len;    /* bytes asked for */
    uint64_t need;   /* bytes that must arrive; < len only when an aligned O_DIRECT read
                        runs past the bytes we need (the file may end in between) */
    void *dst;
    uint32_t owner, sub; /* the submitter's tags (arena slot, part), passed back untouched */
    /* results, valid in the completion callback */
    uint64_t got; /* bytes read */
    int err;      /* errno of a failed read, 0 otherwise (short: err 0, got < need) */
    uint64_t ns;  /* time spent in pread (tr_now_ns, core/clock.h) */
} tr_io_job;

typedef struct tr_io_pool tr_io_pool;

/* Runs on a worker thread after each job; owns nothing of the job after it returns. */
typedef void (*tr_io_done_fn)(void *ctx, tr_io_job *job);

tr_status tr_io_pool_create(int n_threads, tr_io_done_fn done, void *ctx, tr_io_pool **out,
                            tr_error *err);
/* Queued jobs that no worker has started are dropped (never completed); running ones finish. */
void tr_io_pool_free(tr_io_pool *p);

/* Queue a chain of jobs linked through next (NULL-terminated); returns at once. */
void tr_io_pool_submit(tr_io_pool *p, tr_io_job *first, tr_io_job *last);
/* The same for jobs someone waits on now: a worker takes every urgent job before any job queued
 * by tr_io_pool_submit (speculative reads never delay a demand read that comes after them);
 * first to last among urgent jobs. */
void tr_io_pool_submit_urgent(tr_io_pool *p, tr_io_job *first, tr_io_job *last);

/* 0 = off. Read numbers count from 1 over the pool's lifetime. */
void tr_io_pool_set_faults(tr_io_pool *p, uint64_t eio_at, uint64_t short_at);

/* Reads [offset, offset + len) into dst, retrying partial reads, as the workers do; for callers
 * that read outside the pool (probes). Sets job->got, job->err, job->ns. */
void tr_io_read(tr_io_job *job);

#endif
