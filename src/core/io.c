#include "core/io.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"

struct tr_io_pool {
    int n;
    pthread_t *threads;
    tr_io_done_fn done;
    void *ctx;
    pthread_mutex_t mu; /* guards the queue and stop */
    pthread_cond_t cv;  /* work queued or stop */
    tr_io_job *head, *tail; /* queued jobs, taken first to last */
    tr_io_job *uhead, *utail; /* urgent jobs (tr_io_pool_submit_urgent): taken before any other */
    bool stop;
    atomic_uint_fast64_t n_reads; /* reads started, for fault injection */
    uint64_t eio_at, short_at;    /* set before any job is submitted */
};

/* fault: 0 none, 1 EIO, 2 short (the read stops halfway, as at an end of file) */
static void io_read(tr_io_job *j, int fault) {
    const uint64_t t0 = tr_now_ns();
    j->got = 0;
    j->err = 0;
    if (fault == 1) {
        j->err = EIO;
        j->ns = tr_now_ns() - t0;
        return;
    }
    const uint64_t want = fault == 2 ? (j->need / 2 / TR_IO_ALIGN) * TR_IO_ALIGN : j->len;
    while (j->got < want) {
        const ssize_t r = pread(j->fd, (char *)j->dst + j->got, (size_t)(want - j->got),
                                (off_t)(j->offset + j->got));
        if (r < 0) {
            if (errno == EINTR) continue;
            j->err = errno;
            break;
        }
        if (r == 0) break; /* end of file: a short read if got < need */
        j->got += (uint64_t)r;
        /* O_DIRECT continues only at aligned positions; an unaligned count means end of file */
        if (j->direct && j->got % TR_IO_ALIGN) break;
    }
    j->ns = tr_now_ns() - t0;
}

void tr_io_read(tr_io_job *job) { io_read(job, 0); }

static void *io_worker(void *arg) {
    tr_io_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->uhead && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        tr_io_job *j;
        if (p->uhead) {
            j = p->uhead;
            p->uhead = j->next;
            if (!p->uhead) p->utail = NULL;
        } else {
            j = p->head;
            p->head = j->next;
            if (!p->head) p->tail = NULL;
        }
        pthread_mutex_unlock(&p->mu);

        const uint64_t nr = atomic_fetch_add(&p->n_reads, 1) + 1;
        const int fault = nr == p->eio_at ? 1 : nr == p->short_at ? 2 : 0;
        io_read(j, fault);
        p->done(p->ctx, j);
    }
}

tr_status tr_io_pool_create(int n_threads, tr_io_done_fn done, void *ctx, tr_io_pool **out,
                            tr_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 256)
        return tr_fail(err, TR_E_ARG, "I/O pool: %d threads (1..256)", n_threads);
    tr_io_pool *p = calloc(1, sizeof *p);
    if (!p) return tr_fail(err, TR_E_NOMEM, "I/O pool: out of memory");
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return tr_fail(err, TR_E_NOMEM, "I/O pool: out of memory");
    }
    p->done = done;
    p->ctx = ctx;
    atomic_init(&p->n_reads, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 0; i < n_threads; i++) {
        const int rc = pthread_create(&p->threads[i], NULL, io_worker, p);
        if (rc) {
            p->n = i;
            tr_io_pool_free(p);
            return tr_fail(err, TR_E_NOMEM, "I/O pool: cannot start thread %d of %d (error %d)",
                           i + 1, n_threads, rc);
        }
    }
    p->n = n_threads;
    *out = p;
    return TR_OK;
}

void tr_io_pool_free(tr_io_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

static void submit(tr_io_pool *p, tr_io_job **head, tr_io_job **tail, tr_io_job *first,
                   tr_io_job *last) {
    if (!first) return;
    last->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (*tail)
        (*tail)->next = first;
    else
        *head = first;
    *tail = last;
    /* one wake-up per job up to the pool size; broadcast when the chain is long */
    if (first == last)
        pthread_cond_signal(&p->cv);
    else
        pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void tr_io_pool_submit(tr_io_pool *p, tr_io_job *first, tr_io_job *last) {
    submit(p, &p->head, &p->tail, first, last);
}

void tr_io_pool_submit_urgent(tr_io_pool *p, tr_io_job *first, tr_io_job *last) {
    submit(p, &p->uhead, &p->utail, first, last);
}

void tr_io_pool_set_faults(tr_io_pool *p, uint64_t eio_at, uint64_t short_at) {
    pthread_mutex_lock(&p->mu);
    p->eio_at = eio_at;
    p->short_at = short_at;
    pthread_mutex_unlock(&p->mu);
}
