/*
 * The SIGBUS guard of mapped model files (mapguard.h).
 *
 * Entries form a singly linked list that only grows: the handler walks it without a lock (a
 * signal handler may not take one), so an entry is never freed, only marked free (base 0) and
 * reused by the next registration. There are as many entries as shards mapped at the same time.
 *
 * The handler calls mmap (a system call, safe to make from a handler on Linux although POSIX does
 * not list it) and sigaction (async-signal-safe).
 */
#include "core/mapguard.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct tr_mapguard {
    _Atomic uintptr_t base; /* 0: a free entry */
    _Atomic size_t len;
    atomic_bool faulted;
    _Atomic uint64_t fault_offset;
    struct tr_mapguard *next; /* set before the entry is published, never changed */
};

static _Atomic(struct tr_mapguard *) g_list;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* registrations (not the handler) */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct sigaction g_prev;
static bool g_installed;
static uintptr_t g_page = 4096;

static void chain(int sig, siginfo_t *si, void *uc) {
    if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction) {
        g_prev.sa_sigaction(sig, si, uc);
        return;
    }
    if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN && g_prev.sa_handler) {
        g_prev.sa_handler(sig);
        return;
    }
    /* default (or ignored, which for a fault would retry forever): restore the default action;
     * the faulting instruction runs again and the process ends with SIGBUS as it would have */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
}

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    const uintptr_t a = (uintptr_t)si->si_addr;
    for (struct tr_mapguard *g = atomic_load(&g_list); g; g = g->next) {
        const uintptr_t base = atomic_load(&g->base);
        const size_t len = atomic_load(&g->len);
        if (!base || a < base || a - base >= len) continue;
        if (!atomic_exchange(&g->faulted, true)) atomic_store(&g->fault_offset, a - base);
        /* zero pages from the faulting one to the end of the mapping: the pages after it lie
         * past the new end of the file too */
        const uintptr_t page = a & ~(g_page - 1);
        void *p = mmap((void *)page, base + len - page, PROT_READ,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != MAP_FAILED) return;
        break;
    }
    chain(sig, si, uc);
}

static void install(void) {
    const long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0) g_page = (uintptr_t)ps;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    g_installed = sigaction(SIGBUS, &sa, &g_prev) == 0;
}

tr_mapguard *tr_mapguard_add(void *base, size_t len) {
    if (!base || !len) return NULL;
    pthread_once(&g_once, install);
    if (!g_installed) return NULL;
    pthread_mutex_lock(&g_lock);
    struct tr_mapguard *g = atomic_load(&g_list);
    while (g && atomic_load(&g->base)) g = g->next;
    if (!g) {
        g = calloc(1, sizeof *g);
        if (!g) {
            pthread_mutex_unlock(&g_lock);
            return NULL;
        }
        g->next = atomic_load(&g_list);
        atomic_store(&g_list, g);
    }
    atomic_store(&g->faulted, false);
    atomic_store(&g->fault_offset, 0);
    atomic_store(&g->len, len);
    atomic_store(&g->base, (uintptr_t)base); /* last: the handler matches the entry from here */
    pthread_mutex_unlock(&g_lock);
    return g;
}

void tr_mapguard_remove(tr_mapguard *g) {
    if (!g) return;
    pthread_mutex_lock(&g_lock);
    atomic_store(&g->base, 0);
    pthread_mutex_unlock(&g_lock);
}

bool tr_mapguard_faulted(const tr_mapguard *g, uint64_t *offset) {
    if (!g || !atomic_load(&((struct tr_mapguard *)g)->faulted)) return false;
    if (offset) *offset = atomic_load(&((struct tr_mapguard *)g)->fault_offset);
    return true;
}
