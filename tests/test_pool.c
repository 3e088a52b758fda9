/*
 * Thread pool: every part (ith) of a task runs exactly once, results are visible to the caller
 * after tr_pool_run returns, dynamic chunk claiming covers every item exactly once, and the pool
 * survives idle periods (workers go to sleep and wake up again). With more threads than cores
 * (8 on the 2-core test machine), back-to-back runs of different tasks: a worker that wakes late
 * must not run a part of a later run with an earlier run's task or context. The I/O pool: a worker
 * takes urgent jobs before jobs queued earlier by plain submit, first to last within each kind.
 * Also run under TSan.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "core/io.h"
#include "core/pool.h"
#include "testutil.h"

typedef struct {
    atomic_int calls;
    atomic_int mask;
    int64_t n;
    unsigned char *hits; /* one slot per item, written by exactly one thread */
    atomic_int_fast64_t next;
    int64_t chunk;
    int64_t partial[64];
} job;

static void count_task(void *ctx, int ith, int nth) {
    job *j = ctx;
    atomic_fetch_add(&j->calls, 1);
    atomic_fetch_or(&j->mask, 1 << ith);
    (void)nth;
}

static void static_split_task(void *ctx, int ith, int nth) {
    job *j = ctx;
    int64_t b, e, sum = 0;
    tr_split_range(j->n, ith, nth, &b, &e);
    for (int64_t i = b; i < e; i++) {
        j->hits[i]++;
        sum += i;
    }
    j->partial[ith] = sum;
}

static void dynamic_task(void *ctx, int ith, int nth) {
    job *j = ctx;
    (void)ith;
    (void)nth;
    int64_t b, e;
    while (tr_claim(&j->next, j->n, j->chunk, &b, &e))
        for (int64_t i = b; i < e; i++) j->hits[i]++;
}

/* I/O pool order: one worker is held inside the first job's completion until the main thread
 * has queued plain and urgent jobs behind it; then the completions must come urgent first */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool hold, held;
    uint32_t order[8];
    int n;
} io_order;

static void io_order_done(void *ctx, tr_io_job *j) {
    io_order *o = ctx;
    pthread_mutex_lock(&o->mu);
    o->order[o->n++] = j->owner;
    if (j->owner == 0) {
        o->held = true;
        pthread_cond_broadcast(&o->cv);
        while (o->hold) pthread_cond_wait(&o->cv, &o->mu);
    }
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

static void test_io_urgent(const char *path) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    TU_CHECK(fd >= 0, "open %s", path);
    if (fd < 0) return;
    io_order o = {.hold = true};
    pthread_mutex_init(&o.mu, NULL);
    pthread_cond_init(&o.cv, NULL);
    tr_io_pool *io = NULL;
    tr_error err;
    TU_CHECK(tr_io_pool_create(1, io_order_done, &o, &io, &err) == TR_OK, "%s", err.msg);
    static unsigned char buf[5][64];
    tr_io_job jobs[5];
    for (uint32_t i = 0; i < 5; i++)
        jobs[i] = (tr_io_job){.fd = fd, .offset = 64 * i, .len = 64, .need = 64, .dst = buf[i],
                              .owner = i};
    jobs[1].next = &jobs[2];
    jobs[3].next = &jobs[4];
    tr_io_pool_submit(io, &jobs[0], &jobs[0]);
    pthread_mutex_lock(&o.mu);
    while (!o.held) pthread_cond_wait(&o.cv, &o.mu);
    pthread_mutex_unlock(&o.mu);
    tr_io_pool_submit(io, &jobs[1], &jobs[2]);        /* plain: 1, 2 */
    tr_io_pool_submit_urgent(io, &jobs[3], &jobs[4]); /* urgent: 3, 4 */
    pthread_mutex_lock(&o.mu);
    o.hold = false;
    pthread_cond_broadcast(&o.cv);
    while (o.n < 5) pthread_cond_wait(&o.cv, &o.mu);
    pthread_mutex_unlock(&o.mu);
    static const uint32_t want[5] = {0, 3, 4, 1, 2};
    for (int i = 0; i < 5; i++)
        TU_CHECK(o.order[i] == want[i], "I/O completion %d: job %u, expected %u", i, o.order[i],
                 want[i]);
    for (int i = 0; i < 5; i++) TU_CHECK(jobs[i].got == 64 && jobs[i].err == 0, "job %d read", i);
    tr_io_pool_free(io);
    pthread_cond_destroy(&o.cv);
    pthread_mutex_destroy(&o.mu);
    close(fd);
}

int main(int argc, char **argv) {
    tr_error err;
    test_io_urgent(argc > 0 ? argv[0] : "/proc/self/exe");
    TU_CHECK(tr_cpu_physical_cores() >= 1, "physical cores");
    printf("  physical cores: %d\n", tr_cpu_physical_cores());
    static const int sizes[] = {1, 2, 3, 4, 8};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        const int nth = sizes[si];
        tr_pool *p = NULL;
        TU_CHECK(tr_pool_create(nth, &p, &err) == TR_OK, "%s", err.msg);
        TU_CHECK(tr_pool_size(p) == nth, "size %d", tr_pool_size(p));
        for (int rep = 0; rep < 500; rep++) {
            job j = {.n = 0};
            tr_pool_run(p, count_task, &j);
            if (atomic_load(&j.calls) != nth || atomic_load(&j.mask) != (1 << nth) - 1) {
                TU_CHECK(0, "rep %d: %d calls, mask %x with %d threads", rep,
                         atomic_load(&j.calls), atomic_load(&j.mask), nth);
                break;
            }
        }
        for (int64_t n = 0; n < 1000; n += 37) {
            unsigned char hits[1000] = {0};
            job j = {.n = n, .hits = hits};
            tr_pool_run(p, static_split_task, &j);
            int64_t sum = 0;
            for (int t = 0; t < nth; t++) sum += j.partial[t];
            TU_CHECK(sum == n * (n - 1) / 2, "static split sum n=%lld", (long long)n);
            for (int64_t i = 0; i < n; i++) TU_CHECK(hits[i] == 1, "static item %lld", (long long)i);
            for (int64_t chunk = 1; chunk < 50; chunk += 13) {
                memset(hits, 0, sizeof hits);
                job d = {.n = n, .hits = hits, .chunk = chunk};
                atomic_init(&d.next, 0);
                tr_pool_run(p, dynamic_task, &d);
                for (int64_t i = 0; i < n; i++)
                    if (hits[i] != 1) {
                        TU_CHECK(0, "dynamic item %lld hit %d times", (long long)i, hits[i]);
                        break;
                    }
            }
        }
        /* two tasks alternating, each run with its own context */
        for (int rep = 0; rep < 2000; rep++) {
            unsigned char hits[100] = {0};
            job a = {.n = 0}, b = {.n = 100, .hits = hits};
            tr_pool_run(p, count_task, &a);
            tr_pool_run(p, static_split_task, &b);
            int64_t sum = 0;
            for (int t = 0; t < nth; t++) sum += b.partial[t];
            if (atomic_load(&a.calls) != nth || atomic_load(&a.mask) != (1 << nth) - 1 ||
                sum != 4950) {
                TU_CHECK(0, "alternating rep %d, %d threads: %d calls, mask %x, sum %lld", rep,
                         nth, atomic_load(&a.calls), atomic_load(&a.mask), (long long)sum);
                break;
            }
        }
        /* idle long enough for the workers to fall asleep, then use the pool again */
        struct timespec ts = {0, 30 * 1000 * 1000};
        nanosleep(&ts, NULL);
        job j = {.n = 0};
        tr_pool_run(p, count_task, &j);
        TU_CHECK(atomic_load(&j.calls) == nth, "after sleep: %d calls", atomic_load(&j.calls));
        tr_pool_free(p);
    }
    tr_pool *p = NULL;
    TU_CHECK(tr_pool_create(100000, &p, &err) == TR_E_ARG, "absurd thread count accepted");
    TU_CHECK(tr_pool_create(0, &p, &err) == TR_OK && tr_pool_size(p) == tr_cpu_physical_cores(),
             "default thread count = physical cores");
    tr_pool_free(p);
    return tu_result("test_pool");
}
