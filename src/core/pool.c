
#include "core/pool.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#elif defined(__aarch64__)
static inline void cpu_relax(void) { __asm__ volatile("yield"); }
#else
static inline void cpu_relax(void) {}
#endif

/* ~100 µs of spinning before a worker sleeps: long enough to bridge the gap between the matmuls
 * of one token, short enough that an idle pool goes quiet almost at once. */
#define SPIN_ITERS 20000

typedef struct worker {
    tr_pool *pool;
    int ith;
    pthread_t thread;
} worker;

struct tr_pool {
    int n;
    worker *workers; /* n - 1 of them; the caller is thread 0 */
    _Atomic unsigned gen;
    _Atomic int pending;
    _Atomic int sleeping;
    _Atomic bool stop;
    tr_pool_fn fn;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *worker_main(void *arg) {
    worker *w = arg;
    tr_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleeping, 1);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleeping, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        p->fn(p->ctx, w->ith, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
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
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* publishes fn/ctx (seq_cst) */
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        if (++spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
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
        w->ith = i;
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
