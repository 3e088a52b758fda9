/*
 * The runtime's client of the storage agent (kv_csd.h; the protocol in csd.h).
 *
 * Every wait on the agent — for the shared lock, a ring slot, a request, a part of the rows, its
 * start — runs in slices of 50 ms, between which it checks that the agent is still there (our
 * child's exit status, or the connection of a user-started one), and gives up at a deadline
 * (--csd-timeout, 30 s by default): an agent that has been stopped (SIGSTOP) or is wedged fails
 * the step with a message naming it, instead of a wait forever. The agent counts as gone after
 * that; the session's later steps fail at once with the same message.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "kv/csd.h"
#include "kv/kv_csd.h"

extern char **environ;

#define CSD_SLICE_NS (50ull * 1000 * 1000) /* waits check the agent this often */
#define CSD_TIMEOUT_S 30.0                 /* the default deadline of a wait */
#define CSD_QUIT_NS (2ull * 1000 * 1000 * 1000) /* what the end of a session waits for the agent */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int32_t tr_kv_csd_chunk(int32_t csd_chunk) {
    return csd_chunk ? (csd_chunk + TR_KV_PAGE - 1) / TR_KV_PAGE * TR_KV_PAGE : 1024;
}

uint64_t tr_kv_csd_region_bytes(const tr_kv_shape *s, uint64_t ws_cap, uint64_t q8row,
                                uint64_t rec) {
    uint64_t o = align_up(sizeof(tr_csd_ctl), 64);
    o += align_up((uint64_t)s->n_head * q8row, 64);
    o += align_up((uint64_t)s->n_head * 12, 64) + align_up((uint64_t)s->n_head * 4, 64);
    o += align_up((uint64_t)s->n_ctx * sizeof(tr_csd_entry), 64);
    o += TR_CSD_AREAS * (align_up(ws_cap * sizeof(tr_csd_run), 64) + align_up(ws_cap * 8, 64));
    o = align_up(o, 4096) + ws_cap * rec;
    return align_up(o, 4096);
}

/* ---- liveness and deadlines ------------------------------------------------------------------- */

static tr_status dead(tr_kv_csd *C, tr_error *err) { return tr_fail(err, TR_E_IO, "%s", C->dead); }

/* true if the agent has gone (its end recorded in C->dead) */
static bool agent_gone(tr_kv_csd *C) {
    if (C->dead[0]) return true;
    if (C->sock >= 0) {
        if (!tr_csd_sock_closed(C->sock)) return false;
        snprintf(C->dead, sizeof C->dead,
                 "KV storage agent (terrace-storaged, %s) has gone (its connection closed): the "
                 "cold pool is unavailable",
                 C->where);
        return true;
    }
    if (C->pid <= 0) return false;
    int ws = 0;
    const pid_t r = waitpid(C->pid, &ws, WNOHANG);
    if (r == 0) return false;
    if (r == C->pid && WIFSIGNALED(ws))
        snprintf(C->dead, sizeof C->dead,
                 "KV storage agent (terrace-storaged, pid %d) was killed by signal %d (%s): the "
                 "cold pool is unavailable",
                 (int)C->pid, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    else
        snprintf(C->dead, sizeof C->dead,
                 "KV storage agent (terrace-storaged, pid %d) exited (status %d): the cold pool "
                 "is unavailable",
                 (int)C->pid, r == C->pid ? WEXITSTATUS(ws) : -1);
    C->pid = 0;
    return true;
}

/* when a wait that began at t0 must give up */
typedef struct deadline {
    uint64_t t0, limit;
    const char *what; /* what it waited for, for the message */
} deadline;

static deadline deadline_of(const tr_kv_csd *C, const char *what) {
    return (deadline){tr_now_ns(), C->timeout_ns, what};
}

/* past the deadline: the agent counts as gone from now on */
static bool expired(tr_kv_csd *C, const deadline *d) {
    if (tr_now_ns() - d->t0 <= d->limit) return false;
    if (!C->dead[0])
        snprintf(C->dead, sizeof C->dead,
                 "KV storage agent (terrace-storaged, %s) did not answer within %.1f s (waiting "
                 "for %s): it is stopped or wedged; the cold pool is unavailable (--csd-timeout "
                 "sets the limit)",
                 C->where, (double)d->limit / 1e9, d->what);
    return true;
}

static void abs_time_on(clockid_t clk, struct timespec *ts, uint64_t ns_ahead) {
    clock_gettime(clk, ts);
    const uint64_t t = (uint64_t)ts->tv_nsec + ns_ahead;
    ts->tv_sec += (time_t)(t / 1000000000ull);
    ts->tv_nsec = (long)(t % 1000000000ull);
}

/* the conditions wait on the monotonic clock (set where the control block is made) */
static void abs_time(struct timespec *ts, uint64_t ns_ahead) {
    abs_time_on(CLOCK_MONOTONIC, ts, ns_ahead);
}

static tr_status lock_until(tr_kv_csd *C, const deadline *d, tr_error *err) {
    if (C->dead[0]) return dead(C, err);
    for (;;) {
        struct timespec ts;
        /* a slice on the wall clock (pthread_mutex_timedlock's; the deadline itself is
         * monotonic), which the thread sanitizer also understands */
        abs_time_on(CLOCK_REALTIME, &ts, CSD_SLICE_NS);
        const int r = pthread_mutex_timedlock(&C->ctl->mu, &ts);
        if (r == 0) return TR_OK;
        if (r == EOWNERDEAD) { /* the agent died holding it */
            pthread_mutex_consistent(&C->ctl->mu);
            pthread_mutex_unlock(&C->ctl->mu);
            if (!agent_gone(C))
                snprintf(C->dead, sizeof C->dead,
                         "KV storage agent (%s) died holding the shared lock", C->where);
            return dead(C, err);
        }
        if (r != ETIMEDOUT) return tr_fail(err, TR_E_IO, "KV storage agent: lock: %s", strerror(r));
        if (agent_gone(C) || expired(C, d)) return dead(C, err);
    }
}

/* one slice of waiting on to_host, under the lock; an error (the lock released) if the agent
 * has gone or the deadline has passed */
static tr_status wait_slice(tr_kv_csd *C, const deadline *d, tr_error *err) {
    struct timespec ts;
    abs_time(&ts, CSD_SLICE_NS);
    const int r = pthread_cond_timedwait(&C->ctl->to_host, &C->ctl->mu, &ts);
    if (r == EOWNERDEAD) {
        pthread_mutex_consistent(&C->ctl->mu);
        pthread_mutex_unlock(&C->ctl->mu);
        agent_gone(C);
        return dead(C, err);
    }
    if (r == ETIMEDOUT && (agent_gone(C) || expired(C, d))) {
        pthread_mutex_unlock(&C->ctl->mu);
        return dead(C, err);
    }
    return TR_OK;
}

/* request seq is complete (under the lock) */
static bool req_done(const tr_csd_ctl *c, uint64_t seq) {
    return c->completed >= seq || c->ring[(seq - 1) % TR_CSD_RING].done == seq;
}

static tr_status post_until(tr_kv_csd *C, const tr_csd_req *req, uint64_t *seq,
                            const deadline *d, tr_error *err) {
    tr_csd_ctl *c = C->ctl;
    tr_status st = lock_until(C, d, err);
    if (st) return st;
    while (c->posted - c->completed >= TR_CSD_RING)
        if ((st = wait_slice(C, d, err))) return st;
    tr_csd_req *r = &c->ring[c->posted % TR_CSD_RING];
    *r = *req;
    r->status = 0;
    r->msg[0] = 0;
    r->done = 0;
    *seq = ++c->posted;
    pthread_cond_broadcast(&c->to_agent);
    pthread_mutex_unlock(&c->mu);
    return TR_OK;
}

static tr_status post(tr_kv_csd *C, const tr_csd_req *req, uint64_t *seq, tr_error *err) {
    const deadline d = deadline_of(C, "a free request slot");
    return post_until(C, req, seq, &d, err);
}

static tr_status wait_done(tr_kv_csd *C, uint64_t seq, const char *what, tr_error *err) {
    tr_csd_ctl *c = C->ctl;
    const deadline d = deadline_of(C, what);
    tr_status st = lock_until(C, &d, err);
    if (st) return st;
    while (!req_done(c, seq))
        if ((st = wait_slice(C, &d, err))) return st;
    const tr_csd_req *r = &c->ring[(seq - 1) % TR_CSD_RING];
    if (r->status) {
        char msg[TR_CSD_MSG];
        memcpy(msg, r->msg, sizeof msg);
        msg[sizeof msg - 1] = 0;
        pthread_mutex_unlock(&c->mu);
        char path[4200];
        tr_kv_seg_path(C->st, r->layer, path, sizeof path);
        return tr_fail(err, (tr_status)r->status, "KV storage agent: %s (%s)", msg, path);
    }
    pthread_mutex_unlock(&c->mu);
    return TR_OK;
}

/* ---- start / stop ----------------------------------------------------------------------------- */

tr_status tr_kv_csd_init(tr_kv_csd *C, tr_kv_store *st, tr_kv_keys *K, tr_kv_app *app,
                         const tr_kv_shape *s, const tr_kv_params *p, uint64_t *total,
                         tr_error *err) {
    memset(C, 0, sizeof *C);
    C->st = st;
    C->K = K;
    C->app = app;
    C->shape = s;
    C->params = p;
    C->fd = -1; /* before anything can fail: free closes them */
    C->sock = -1;
    C->chunk = tr_kv_csd_chunk(p->csd_chunk);
    C->read_gap = 1;
    C->timeout_ns = (uint64_t)((p->csd_timeout > 0 ? p->csd_timeout : CSD_TIMEOUT_S) * 1e9);
    const size_t nh = (size_t)s->n_head;
    C->m = tr_kv_alloc(nh * 4, 0, total);
    C->c = tr_kv_alloc(nh * 8, 0, total);
    C->z = tr_kv_alloc(nh * 8, 0, total);
    C->inval = tr_kv_alloc((size_t)s->n_layer * 4, 0, total);
    if (!C->m || !C->c || !C->z || !C->inval)
        return tr_fail(err, TR_E_NOMEM, "KV storage agent: out of memory");
    for (int32_t l = 0; l < s->n_layer; l++) C->inval[l] = INT32_MAX;
    return TR_OK;
}

static bool find_agent(const tr_kv_csd *C, char *out, size_t cap) {
    const char *p = C->params->csd_bin;
    if (!p || !*p) p = getenv("TERRACE_STORAGED");
    if (p && *p) {
        snprintf(out, cap, "%s", p);
        return access(out, X_OK) == 0;
    }
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(out, cap, "terrace-storaged");
        return false;
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(out, cap, "%s/terrace-storaged", exe);
    if (access(out, X_OK) == 0) return true;
    /* a test or benchmark binary one level below the build directory */
    snprintf(out, cap, "%s/../terrace-storaged", exe);
    if (access(out, X_OK) == 0) return true;
    /* an application linked with an installed libterrace.so: PREFIX/lib -> PREFIX/bin */
    Dl_info info;
    if (dladdr((void *)find_agent, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
        char lib[PATH_MAX];
        snprintf(lib, sizeof lib, "%s", info.dli_fname);
        *strrchr(lib, '/') = 0;
        snprintf(out, cap, "%s/../bin/terrace-storaged", lib);
        if (access(out, X_OK) == 0) return true;
    }
    return false;
}

/* the runtime's own agent: a child given the region and the segment files at fixed descriptor
 * numbers (through copies above that range first: a source descriptor inside it would be
 * overwritten by an earlier dup2 of the sequence) */
static tr_status spawn_agent(tr_kv_csd *C, char *bin, tr_error *err) {
    const tr_kv_shape *s = C->shape;
    const int n_fd = s->n_layer + 1, hi = TR_CSD_FD_LAYER + s->n_layer + 16;
    int *tmp = malloc(sizeof(int) * (size_t)n_fd);
    if (!tmp) return tr_fail(err, TR_E_NOMEM, "KV storage agent: out of memory");
    bool ok = true;
    for (int i = 0; i < n_fd; i++) {
        tmp[i] = fcntl(i ? C->st->layers[i - 1].fd : C->fd, F_DUPFD_CLOEXEC, hi);
        ok = ok && tmp[i] >= 0;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    for (int i = 0; i < n_fd && ok; i++)
        posix_spawn_file_actions_adddup2(&fa, tmp[i], i ? TR_CSD_FD_LAYER + i - 1 : TR_CSD_FD_SHM);
    char ppid[32];
    snprintf(ppid, sizeof ppid, "%d", (int)getpid());
    char *argv[] = {bin, "--host-pid", ppid, NULL};
    pid_t pid = 0;
    const int r = ok ? posix_spawn(&pid, bin, &fa, NULL, argv, environ) : errno;
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < n_fd; i++)
        if (tmp[i] >= 0) close(tmp[i]);
    free(tmp);
    if (r) return tr_fail(err, TR_E_IO, "KV storage agent: cannot start %s: %s", bin, strerror(r));
    C->pid = pid;
    snprintf(C->where, sizeof C->where, "pid %d", (int)pid);
    return TR_OK;
}

/* a user-started agent (terrace-storaged --listen): the same descriptors, passed over its socket */
static tr_status connect_agent(tr_kv_csd *C, const char *path, tr_error *err) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path)
        return tr_fail(err, TR_E_ARG, "--csd-socket %s: a socket path has at most %zu bytes", path,
                       sizeof a.sun_path - 1);
    memcpy(a.sun_path, path, strlen(path) + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return tr_fail(err, TR_E_IO, "KV storage agent: socket: %s", strerror(errno));
    if (connect(fd, (const struct sockaddr *)&a, sizeof a)) {
        const int e = errno;
        close(fd);
        return tr_fail(err, TR_E_IO,
                       "KV storage agent: cannot connect to %s: %s (start it with "
                       "`terrace-storaged --listen %s`)",
                       path, strerror(e), path);
    }
    C->sock = fd;
    snprintf(C->where, sizeof C->where, "at %.140s", path);
    /* the handshake too has the deadline: an agent that accepts and never reads cannot hold the
     * runtime */
    const struct timeval tv = {.tv_sec = (time_t)(C->timeout_ns / 1000000000ull),
                               .tv_usec = (suseconds_t)(C->timeout_ns % 1000000000ull / 1000)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const int n_fd = C->shape->n_layer + 1;
    const tr_csd_hello h = {.magic = TR_CSD_HELLO_MAGIC,
                            .version = TR_CSD_VERSION,
                            .host_pid = (int32_t)getpid(),
                            .n_fd = n_fd};
    for (int i0 = 0; i0 < n_fd; i0 += TR_CSD_FD_BATCH) {
        const int n = n_fd - i0 < TR_CSD_FD_BATCH ? n_fd - i0 : TR_CSD_FD_BATCH;
        int fds[TR_CSD_FD_BATCH];
        for (int i = 0; i < n; i++) fds[i] = i0 + i ? C->st->layers[i0 + i - 1].fd : C->fd;
        union {
            char buf[CMSG_SPACE(sizeof(int) * TR_CSD_FD_BATCH)];
            struct cmsghdr align;
        } cb;
        memset(&cb, 0, sizeof cb);
        char more = 1; /* the batches after the first carry one byte */
        struct iovec iov = {.iov_base = i0 ? (void *)&more : (void *)&h,
                            .iov_len = i0 ? 1 : sizeof h};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = cb.buf,
                           .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)n);
        if (sendmsg(fd, &m, MSG_NOSIGNAL) != (ssize_t)iov.iov_len)
            return tr_fail(err, TR_E_IO, "KV storage agent at %s: sending the cold pool: %s", path,
                           strerror(errno));
    }
    return TR_OK;
}

static void reader_start(void *ctx, int which, int32_t layer, const int32_t *sel, int32_t n,
                         int32_t slot0, int np, const int32_t *bnd);
static tr_status reader_wait_part(void *ctx, int which, int part, tr_error *err);
static tr_status reader_wait(void *ctx, int which, tr_error *err);

tr_status tr_kv_csd_start(tr_kv_csd *C, tr_error *err) {
    const tr_kv_shape *s = C->shape;
    tr_kv_store *S = C->st;
    const tr_kv_keys *K = C->K;
    const char *sock = C->params->csd_socket && *C->params->csd_socket ? C->params->csd_socket
                                                                       : NULL;
    char bin[PATH_MAX + 64];
    if (!sock && !find_agent(C, bin, sizeof bin))
        return tr_fail(err, TR_E_ARG,
                       "KV storage agent: %s is not an executable (build it with make, or name it "
                       "with --csd-bin or TERRACE_STORAGED)",
                       bin);
    const uint64_t ws_cap = (uint64_t)S->ws_cap;
    const uint64_t total = tr_kv_csd_region_bytes(s, ws_cap, K->q8row, S->rec);
    C->fd = memfd_create("terrace-kv-csd", MFD_CLOEXEC);
    if (C->fd < 0)
        return tr_fail(err, TR_E_IO, "KV storage agent: memfd_create: %s", strerror(errno));
    if (ftruncate(C->fd, (off_t)total))
        return tr_fail(err, TR_E_NOMEM, "KV storage agent: shared region of %llu bytes: %s",
                       (unsigned long long)total, strerror(errno));
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, C->fd, 0);
    if (m == MAP_FAILED)
        return tr_fail(err, TR_E_NOMEM, "KV storage agent: mapping %llu bytes: %s",
                       (unsigned long long)total, strerror(errno));
    C->ctl = m;
    C->bytes = total;
    tr_csd_ctl *c = C->ctl;
    memset(c, 0, sizeof *c);
    c->magic = TR_CSD_MAGIC;
    c->version = TR_CSD_VERSION;
    c->n_layer = s->n_layer;
    c->n_ctx = s->n_ctx;
    c->n_head = s->n_head;
    c->n_head_kv = s->n_head_kv;
    c->hdk_pad = K->hdk_pad;
    c->chunk = C->chunk;
    c->qtype = (int32_t)K->qtype;
    c->direct = S->direct;
    c->ws_cap = S->ws_cap;
    c->page_tokens = TR_KV_PAGE;
    c->rec = S->rec;
    c->qrow = K->qrow;
    c->q8row = K->q8row;
    c->page_bytes = S->page_bytes;
    c->page_qoff = S->page_qoff;
    c->page_toff = S->page_toff;
    c->data_off = S->data_off;
    c->gbps = C->params->research.csd_gbps;
    c->gflops = C->params->research.csd_gflops;
    c->link_gbps = C->params->research.csd_link_gbps;
    uint64_t o = align_up(sizeof(tr_csd_ctl), 64);
    c->off_q8 = o;
    o += align_up((uint64_t)s->n_head * K->q8row, 64);
    c->off_stats = o;
    o += align_up((uint64_t)s->n_head * 12, 64);
    c->off_c = o;
    o += align_up((uint64_t)s->n_head * 4, 64);
    c->off_scores = o;
    o += align_up((uint64_t)s->n_ctx * sizeof(tr_csd_entry), 64);
    for (int w = 0; w < TR_CSD_AREAS; w++) {
        c->off_runs[w] = o;
        o += align_up(ws_cap * sizeof(tr_csd_run), 64);
        c->off_hashes[w] = o;
        o += align_up(ws_cap * 8, 64);
    }
    c->off_ws = align_up(o, 4096);
    c->total = total;

    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&c->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->to_agent, &ca);
    pthread_cond_init(&c->to_host, &ca);
    pthread_condattr_destroy(&ca);
    /* the working set lives in the region, so rows the agent reads land where attention reads */
    S->ws = (uint8_t *)m + c->off_ws;
    S->reader = (tr_kv_reader){.ctx = C,
                               .start = reader_start,
                               .wait_part = reader_wait_part,
                               .wait = reader_wait};

    tr_status st = sock ? connect_agent(C, sock, err) : spawn_agent(C, bin, err);
    if (st) return st;
    const deadline d = deadline_of(C, "its start");
    while (!atomic_load(&c->ready)) {
        if (agent_gone(C) || expired(C, &d)) return dead(C, err);
        usleep(1000);
    }
    if (sock) /* its messages name the process serving us */
        snprintf(C->where, sizeof C->where, "pid %d at %.140s", (int)atomic_load(&c->agent_pid),
                 sock);
    return TR_OK;
}

void tr_kv_csd_stop(tr_kv_csd *C) {
    /* the process serving this session ends (a user-started agent's listener stays): our child
     * when it exits, a user-started one when it closes the connection; up to 2 s */
    if ((C->pid > 0 || C->sock >= 0) && C->ctl && !C->dead[0]) {
        tr_csd_req q = {.op = TR_CSD_OP_QUIT};
        uint64_t seq;
        const deadline d = {tr_now_ns(), CSD_QUIT_NS, "the end of the session"};
        if (!post_until(C, &q, &seq, &d, NULL)) {
            const uint64_t t0 = tr_now_ns();
            int ws;
            while (tr_now_ns() - t0 <= CSD_QUIT_NS) {
                if (C->pid > 0 ? waitpid(C->pid, &ws, WNOHANG) != 0
                               : tr_csd_sock_closed(C->sock)) {
                    C->pid = 0;
                    break;
                }
                usleep(1000);
            }
        }
    }
    if (C->sock >= 0) { /* one still serving notices the close within a second */
        close(C->sock);
        C->sock = -1;
    }
    if (C->pid > 0) { /* not answering (stopped, wedged): it goes */
        int ws;
        kill(C->pid, SIGKILL);
        waitpid(C->pid, &ws, 0);
        C->pid = 0;
    }
    if (C->ctl) {
        munmap(C->ctl, C->bytes);
        C->ctl = NULL;
        if (C->st) {
            C->st->ws = NULL;
            C->st->reader = (tr_kv_reader){0};
        }
    }
    if (C->fd >= 0) close(C->fd);
    C->fd = -1;
}

void tr_kv_csd_free(tr_kv_csd *C) {
    tr_kv_csd_stop(C);
    free(C->m);
    free(C->c);
    free(C->z);
    free(C->inval);
}

pid_t tr_kv_csd_pid(const tr_kv_csd *C) {
    if (C->pid > 0) return C->pid;
    return C->ctl ? (pid_t)atomic_load(&C->ctl->agent_pid) : 0;
}

void tr_kv_csd_stats(const tr_kv_csd *C, tr_kv_stats *o) {
    const tr_csd_ctl *c = C->ctl;
    if (!c) return;
    o->csd_score_bytes = atomic_load(&c->bytes_scores);
    o->csd_row_bytes = atomic_load(&c->bytes_rows);
    o->csd_storage_bytes = atomic_load(&c->bytes_storage);
    o->csd_busy_ns = atomic_load(&c->busy_ns);
    o->csd_mem_bytes = atomic_load(&c->mem_bytes);
    o->csd_pid = (int32_t)tr_kv_csd_pid(C);
}

void tr_kv_csd_invalidate(tr_kv_csd *C, int32_t layer, int32_t page) {
    if (C->inval[layer] > page) C->inval[layer] = page;
}

/* ---- scoring ---------------------------------------------------------------------------------- */

/* a SCORE of positions [a, b) of the layer (the query already in the region), telling the agent
 * which of its copies of the layer's key pages went stale since its last request */
static tr_status post_score(tr_kv_csd *C, int32_t layer, int32_t a, int32_t b, float scale,
                            uint64_t *seq, tr_error *err) {
    const tr_csd_req r = {.op = TR_CSD_OP_SCORE,
                          .layer = layer,
                          .a = a,
                          .b = b,
                          .scale = scale,
                          .inval_from = C->inval[layer] == INT32_MAX ? -1 : C->inval[layer]};
    const tr_status st = post(C, &r, seq, err);
    if (!st) C->inval[layer] = INT32_MAX;
    return st;
}

tr_status tr_kv_csd_score(tr_kv_csd *C, tr_pool *pool, int32_t layer, const float *q, float scale,
                          const int32_t *cand, int32_t n, int32_t n_a, float *out, tr_error *err) {
    tr_csd_ctl *c = C->ctl;
    tr_kv_keys *K = C->K;
    uint8_t *base = (uint8_t *)c;
    const int32_t nh = C->shape->n_head;
    const int32_t a = cand[0], b = cand[0] + n_a;
    if (cand[n_a - 1] != b - 1)
        return tr_fail(err, TR_E_INTERNAL, "KV storage agent: layer %d: candidates not a range",
                       layer);
    tr_kv_prepare_query(K, layer, q);
    memcpy(base + c->off_q8, K->q8, (size_t)nh * K->q8row);
    const uint64_t agent0 = atomic_load(&c->score_ns);
    uint64_t seq;
    tr_status st = post_score(C, layer, a, b, scale, &seq, err);
    if (st) return st;
    /* group B on the host while the agent scores group A */
    const size_t stride = (size_t)n;
    const uint64_t h0 = tr_now_ns();
    tr_kv_score_heads(K, pool, layer, cand, n_a, n, stride, scale);
    float *m_b = C->m, *c_a = C->c, *c_b = C->c + nh;
    double *z_b = C->z;
    for (int32_t h = 0; h < nh; h++)
        tr_kv_group_stats(K->hs + (size_t)h * stride + n_a, n - n_a, &m_b[h], &z_b[h]);
    uint64_t host_ns = tr_now_ns() - h0;
    if ((st = wait_done(C, seq, "its scores", err))) return st;
    const float *m_a = (const float *)(base + c->off_stats);
    const double *z_a = (const double *)(base + c->off_stats + (uint64_t)nh * 4);
    tr_kv_group_merge(nh, m_a, z_a, m_b, z_b, c_a, c_b);
    memcpy(base + c->off_c, c_a, (size_t)nh * 4);
    atomic_store(&c->produced, 0);
    const tr_csd_req fin = {.op = TR_CSD_OP_FINISH, .layer = layer, .a = a, .b = b};
    if ((st = post(C, &fin, &seq, err))) return st;
    const uint64_t h1 = tr_now_ns();
    tr_kv_group_score(K->hs, stride, nh, c_b, 1, n_a, n, out);
    host_ns += tr_now_ns() - h1;
    /* merge the agent's blocks as they arrive */
    const tr_csd_entry *e = (const tr_csd_entry *)(base + c->off_scores);
    int64_t got = 0;
    const deadline d = deadline_of(C, "its score blocks");
    if ((st = lock_until(C, &d, err))) return st;
    for (;;) {
        const int64_t p = atomic_load(&c->produced);
        if (p > got) {
            pthread_mutex_unlock(&c->mu);
            for (int64_t i = got; i < p; i++) out[e[i].pos - (uint32_t)a] = e[i].score;
            got = p;
            if ((st = lock_until(C, &d, err))) return st;
            continue;
        }
        if (got >= n_a || req_done(c, seq)) break;
        if ((st = wait_slice(C, &d, err))) return st;
    }
    pthread_mutex_unlock(&c->mu);
    if ((st = wait_done(C, seq, "its score blocks", err))) return st;
    if (got < n_a)
        return tr_fail(err, TR_E_INTERNAL, "KV storage agent: layer %d: %lld of %d scores",
                       layer, (long long)got, n_a);
    /* APP: this step's scoring rates */
    tr_kv_app_note_scoring(C->app, (double)host_ns / (double)(n - n_a), n - n_a,
                           (double)(atomic_load(&c->score_ns) - agent0) / (double)n_a, n_a);
    return TR_OK;
}

/* The probe's sizes: enough tokens that per-call costs (waking threads, the request round trip)
 * do not dominate, few enough that it costs about one layer's scoring */
#define APP_PROBE_TOKENS 4096
#define APP_PROBE_ROWS   256

/* Without it the first split would be a guess (an even one) and every rate would come from the
 * split steps themselves. Each path is measured alone, on real data of the layer about to be
 * scored: the agent scores its first tokens twice (the first pass loads their key copies from
 * storage into its memory, as a step would, the second is timed), the host scores the same
 * tokens, hot records are copied into the working set, and the agent reads cold records into it
 * (counted as bytes read). The running averages of the steps take over from these values. */
tr_status tr_kv_csd_probe(tr_kv_csd *C, tr_pool *pool, int32_t layer, const float *q,
                          float scale, const int32_t *cand, int32_t n_a, tr_error *err) {
    tr_kv_app *A = C->app;
    tr_kv_keys *K = C->K;
    tr_kv_store *S = C->st;
    A->probed = true;
    const tr_kv_research *p = A->given;
    const int32_t m = n_a < APP_PROBE_TOKENS ? n_a : APP_PROBE_TOKENS;
    if (m < 1 || cand[m - 1] != cand[0] + m - 1) return TR_OK; /* not a range: steps measure */
    tr_csd_ctl *c = C->ctl;
    const tr_kv_slayer *L = &S->layers[layer];
    tr_status st;
    if (!(p->app_f_s > 0)) {
        tr_kv_prepare_query(K, layer, q);
        memcpy((uint8_t *)c + c->off_q8, K->q8, (size_t)C->shape->n_head * K->q8row);
        uint64_t s0 = 0;
        for (int pass = 0; pass < 2; pass++) {
            uint64_t seq;
            s0 = atomic_load(&c->score_ns);
            if ((st = post_score(C, layer, cand[0], cand[0] + m, scale, &seq, err)) ||
                (st = wait_done(C, seq, "its scores", err)))
                return st;
        }
        A->ts = (double)(atomic_load(&c->score_ns) - s0) / m;
    }
    /* the host's part: the newest of the tokens, as a split gives it, within its key copy */
    const int32_t mc = tr_kv_hk_held(K, L->len, cand, n_a, m);
    if (!(p->app_f_c > 0) && mc > 0) { /* as the host scores its part in tr_kv_csd_score */
        const int32_t *hc = cand + n_a - mc;
        const uint64_t t0 = tr_now_ns();
        tr_kv_score_heads(K, pool, layer, hc, 0, mc, (size_t)mc, scale);
        for (int32_t h = 0; h < C->shape->n_head; h++) {
            float mx;
            double z;
            tr_kv_group_stats(K->hs + (size_t)h * (size_t)mc, mc, &mx, &z);
        }
        A->tc = (double)(tr_now_ns() - t0) / mc;
    }
    if (!(p->app_b_c > 0)) { /* hot records into the working set, as a gather copies them */
        int32_t nc = 0;
        const uint64_t t0 = tr_now_ns();
        for (int32_t t = 0; t < L->len && nc < APP_PROBE_ROWS && nc < S->ws_cap; t++)
            if (L->tok[t].where == TR_KV_TOK_HOT) {
                memcpy(S->ws + (size_t)nc * S->rec, L->hot + (size_t)L->tok[t].slot * S->rec,
                       S->rec);
                nc++;
            }
        const uint64_t ns = tr_now_ns() - t0;
        if (nc && ns) A->bc = (double)nc * (double)S->rec / (double)ns;
    }
    if (!(p->app_b_s > 0)) { /* the agent's rows: cold records read into the working set */
        int32_t nr = m < APP_PROBE_ROWS ? m : APP_PROBE_ROWS;
        if (nr > S->ws_cap) nr = S->ws_cap;
        reader_start(C, 0, layer, cand, nr, 0, 1, NULL);
        if ((st = reader_wait(C, 0, err))) return st; /* sets the agent's row rate */
    }
    return TR_OK;
}

/* ---- rows (the store's reader) ---------------------------------------------------------------- */

/* the agent's row request for sel[0..n) into slots slot0..: in np parts, part p the positions
 * sel[bnd[p] .. bnd[p + 1]) (bnd NULL: one part) */
static void reader_start(void *ctx, int which, int32_t layer, const int32_t *sel, int32_t n,
                         int32_t slot0, int np, const int32_t *bnd) {
    tr_kv_csd *C = ctx;
    tr_kv_gather *G = &C->st->gath[which];
    tr_csd_ctl *c = C->ctl;
    const tr_kv_slayer *L = &C->st->layers[layer];
    if (which < 0 || which >= TR_CSD_AREAS) { /* the agent has TR_CSD_AREAS row areas */
        G->n_jobs = 1;
        G->failed = true;
        snprintf(G->err_msg, sizeof G->err_msg, "KV storage agent: row request %d of %d", which,
                 TR_CSD_AREAS);
        return;
    }
    tr_csd_run *runs = (tr_csd_run *)((uint8_t *)c + c->off_runs[which]);
    uint64_t *hashes = (uint64_t *)((uint8_t *)c + c->off_hashes[which]);
    if (!bnd || np < 1 || np > TR_CSD_PARTS) np = 1;
    tr_csd_req r = {.op = TR_CSD_OP_ROWS,
                    .layer = layer,
                    .which = which,
                    .n_parts = np,
                    .read_gap = C->read_gap};
    int32_t nr = 0, nh = 0;
    for (int p = 0; p < np; p++) { /* a run never crosses a part's end */
        const int32_t i0 = np > 1 ? bnd[p] : 0, i1 = np > 1 ? bnd[p + 1] : n;
        for (int32_t i = i0, j; i < i1; i = j) {
            const int32_t pos = sel[i];
            if ((j = tr_kv_cold_run_end(L, sel, i1, i)) == i) {
                j++;
                continue;
            }
            runs[nr++] = (tr_csd_run){.pos = pos, .n = j - i, .slot = slot0 + i, .hash0 = nh};
            for (int32_t t = pos; t < pos + (j - i); t++) hashes[nh++] = L->hash[t];
        }
        r.part_end[p] = slot0 + i1;
    }
    G->n_jobs = nr;
    G->bytes = (uint64_t)nh * C->st->rec;
    G->csd_rows_ns0 = atomic_load(&c->rows_ns);
    G->csd_seq = 0;
    G->failed = false;
    if (!nr) return;
    r.n_runs = nr;
    atomic_store(&c->rows_parts[which], 0); /* the area's last request has completed */
    tr_error e = {0};
    if (post(C, &r, &G->csd_seq, &e)) {
        G->failed = true;
        snprintf(G->err_msg, sizeof G->err_msg, "%s", e.msg);
    }
}

/* part `part` of the request in, or the request's error */
static tr_status reader_wait_part(void *ctx, int which, int part, tr_error *err) {
    tr_kv_csd *C = ctx;
    tr_kv_gather *G = &C->st->gath[which];
    if (!G->n_jobs) return TR_OK;
    if (G->failed) return tr_fail(err, TR_E_IO, "%s", G->err_msg);
    tr_csd_ctl *c = C->ctl;
    const uint64_t t0 = tr_now_ns();
    const deadline d = deadline_of(C, "its rows");
    tr_status st = lock_until(C, &d, err);
    if (st) return st;
    while (atomic_load(&c->rows_parts[which]) <= part && !req_done(c, G->csd_seq))
        if ((st = wait_slice(C, &d, err))) return st;
    const bool in = atomic_load(&c->rows_parts[which]) > part;
    pthread_mutex_unlock(&c->mu);
    C->st->io_ns += tr_now_ns() - t0;
    /* completed without it: the request failed, and its status says why */
    return in ? TR_OK : wait_done(C, G->csd_seq, "its rows", err);
}

static tr_status reader_wait(void *ctx, int which, tr_error *err) {
    tr_kv_csd *C = ctx;
    tr_kv_gather *G = &C->st->gath[which];
    if (!G->n_jobs) return TR_OK;
    const uint64_t t0 = tr_now_ns();
    tr_status st = TR_OK;
    if (G->failed)
        st = tr_fail(err, TR_E_IO, "%s", G->err_msg);
    else
        st = wait_done(C, G->csd_seq, "its rows", err);
    C->st->io_ns += tr_now_ns() - t0;
    if (!st) {
        C->st->bytes_read += G->bytes;
        C->st->read_ops += (uint64_t)atomic_load(&C->ctl->rows_reads[which]);
        tr_kv_app_note_agent_rows(C->app, G->bytes,
                                  atomic_load(&C->ctl->rows_ns) - G->csd_rows_ns0);
    }
    G->n_jobs = 0;
    return st;
}
