
#include "core/pool.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax(void) { __asm__ volatile("yield"); }
#else
static inline void cpu_relax(void) {}
#endif

/* Spinning before a thread sleeps, bounded by time rather than by a count of pause
 * instructions (what a pause costs varies by an order of magnitude between CPUs): long enough to
 * bridge the gap between the matmuls of one token, short enough that an idle pool, or one of
 * several processes sharing the cores (a batch of sessions, each with its storage agent), goes
 * quiet at once. */
#define SPIN_NS    100000
#define SPIN_CHECK 64 /* pauses between two looks at the clock */

/* true while a spin that began at *t0 (0: not yet) is within its time */
static bool keep_spinning(int *spins, uint64_t *t0) {
    cpu_relax();
    if (++*spins % SPIN_CHECK) return true;
    const uint64_t t = tr_now_ns();
    if (!*t0) *t0 = t;
    return t - *t0 < SPIN_NS;
}

typedef struct worker {
    tr_pool *pool;
    pthread_t thread;
} worker;

/* A run's n parts (ith = 0 .. n - 1) are claimed, not assigned: the caller and the workers take
 * the next unclaimed part until none is left, and the caller waits only for parts that have
 * begun. A worker that is asleep or not scheduled (more threads than cores) therefore never
 * holds the caller up: the caller runs its part itself. Which thread runs a part changes
 * nothing in the result (parts are independent; none uses thread identity). */
struct tr_pool {
    int n;
    worker *workers; /* n - 1 of them; the caller is the n-th thread */
    /* (run << 32) | next part to claim: a worker that saw an older run cannot claim a part of
     * this one, and reads fn / ctx only after a claim, when they belong to the run it claimed */
    _Atomic uint64_t claim;
    _Atomic int done;     /* parts finished in this run */
    _Atomic int sleeping; /* workers waiting on cv */
    _Atomic bool waiting; /* the caller is waiting on done_cv */
    _Atomic bool stop;
    tr_pool_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* a new run (or stop) */
    pthread_cond_t done_cv; /* the run's last part finished */
};

/* claims and runs parts of the run `run` until none is left */
static void run_parts(tr_pool *p, uint32_t run) {
    for (;;) {
        uint64_t c = atomic_load(&p->claim);
        if ((uint32_t)(c >> 32) != run || (int)(uint32_t)c >= p->n) return;
        if (!atomic_compare_exchange_weak(&p->claim, &c, c + 1)) continue;
        p->fn(p->ctx, (int)(uint32_t)c, p->n);
        /* seq_cst: pairs with the caller's store to waiting before its load of done */
        if (atomic_fetch_add(&p->done, 1) + 1 == p->n && atomic_load(&p->waiting)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    tr_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t r;
        int spins = 0;
        uint64_t t0 = 0;
        while ((r = (uint32_t)(atomic_load(&p->claim) >> 32)) == seen && !atomic_load(&p->stop)) {
            if (keep_spinning(&spins, &t0)) continue;
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while ((uint32_t)(atomic_load(&p->claim) >> 32) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
            t0 = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = r;
        run_parts(p, r);
    }
    return NULL;
}

void tr_pool_run(tr_pool *p, tr_pool_fn fn, void *ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    /* a new run with nothing claimed; publishes fn / ctx (seq_cst) */
    const uint32_t run = (uint32_t)(atomic_load(&p->claim) >> 32) + 1;
    atomic_store(&p->claim, (uint64_t)run << 32);
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_parts(p, run);
    int spins = 0;
    uint64_t t0 = 0;
    while (atomic_load(&p->done) < p->n)
        if (!keep_spinning(&spins, &t0)) {
            pthread_mutex_lock(&p->mu);
            atomic_store(&p->waiting, true);
            while (atomic_load(&p->done) < p->n) pthread_cond_wait(&p->done_cv, &p->mu);
            atomic_store(&p->waiting, false);
            pthread_mutex_unlock(&p->mu);
        }
}

tr_status tr_pool_create(int n_threads, tr_pool **out, tr_error *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = tr_cpu_physical_cores();
    if (n_threads > 1024)
        return tr_fail(err, TR_E_ARG, "thread count %d is out of range (1..1024)", n_threads);
    tr_pool *p = calloc(1, sizeof *p);
    if (!p) return tr_fail(err, TR_E_NOMEM, "out of memory creating the thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (n_threads > 1) {
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->workers) {
            tr_pool_free(p);
            return tr_fail(err, TR_E_NOMEM, "out of memory creating the thread pool");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            p->n = i; /* only the first i-1 workers exist; free joins those */
            tr_pool_free(p);
            return tr_fail(err, TR_E_NOMEM, "cannot create worker thread %d of %d: %s", i,
                           n_threads, strerror(rc));
        }
    }
    *out = p;
    return TR_OK;
}

void tr_pool_free(tr_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->workers[i - 1].thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->workers);
    free(p);
}

int tr_pool_size(const tr_pool *p) { return p->n; }

/* Physical cores: distinct (package, core) pairs among the CPUs this process may run on, so SMT
 * siblings are not counted twice (two threads on one core compete for the same load ports). */
int tr_cpu_physical_cores(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    int allowed = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) allowed = CPU_COUNT(&set);
    if (allowed <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        allowed = n > 0 ? (int)n : 1;
        for (int i = 0; i < allowed && i < CPU_SETSIZE; i++) CPU_SET(i, &set);
    }
    int n_cores = 0;
    long *seen = NULL;
    size_t n_seen = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && cpu < 4096; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128];
        long pkg = 0, core = -1;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%ld", &core) != 1) core = -1;
        fclose(f);
        snprintf(path, sizeof path,
                 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &pkg) != 1) pkg = 0;
            fclose(f);
        }
        if (core < 0) break;
        const long key = pkg * 100000 + core;
        bool dup = false;
        for (size_t i = 0; i < n_seen; i++) dup |= seen[i] == key;
        if (dup) continue;
        long *grown = realloc(seen, (n_seen + 1) * sizeof *seen);
        if (!grown) break;
        seen = grown;
        seen[n_seen++] = key;
        n_cores++;
    }
    free(seen);
    if (n_cores <= 0 || n_cores > allowed) n_cores = allowed;
    return n_cores > 0 ? n_cores : 1;
}
