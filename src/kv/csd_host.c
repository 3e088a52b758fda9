/*
 * The runtime's side of the storage agent (see csd.h for the protocol): the shared region, the
 * agent's start and end, requests with waits that notice the agent's death, the split scoring
 * (the agent scores group A while the host scores group B) and the rows.
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
#include "kv/kv_internal.h"

extern char **environ;

#define CSD_SLICE_NS (50ull * 1000 * 1000) /* waits check the agent this often */
#define CSD_START_NS (10ull * 1000 * 1000 * 1000)

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* a scoring rate's sample: a part given to a starved side (TR_KV_APP_EXPLORE) weighs half */
static void app_sample(double *avg, double sample, bool explored) {
    if (explored)
        *avg = 0.5 * *avg + 0.5 * sample;
    else
        tr_kv_app_avg(avg, sample);
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

/* ---- liveness --------------------------------------------------------------------------------- */

static tr_status dead(tr_kv *kv, tr_error *err) {
    return tr_fail(err, TR_E_IO, "%s", kv->csd_dead);
}

/* true if the agent has gone (its exit recorded in kv->csd_dead) */
static bool agent_gone(tr_kv *kv) {
    if (kv->csd_dead[0]) return true;
    if (kv->csd_sock >= 0) {
        if (!tr_csd_sock_closed(kv->csd_sock)) return false;
        snprintf(kv->csd_dead, sizeof kv->csd_dead,
                 "KV storage agent (terrace-storaged, %s) has gone (its connection closed): the "
                 "cold pool is unavailable",
                 kv->csd_where);
        return true;
    }
    if (kv->csd_pid <= 0) return false;
    int ws = 0;
    const pid_t r = waitpid(kv->csd_pid, &ws, WNOHANG);
    if (r == 0) return false;
    if (r == kv->csd_pid && WIFSIGNALED(ws))
        snprintf(kv->csd_dead, sizeof kv->csd_dead,
                 "KV storage agent (terrace-storaged, pid %d) was killed by signal %d (%s): the "
                 "cold pool is unavailable",
                 (int)kv->csd_pid, WTERMSIG(ws), strsignal(WTERMSIG(ws)));
    else
        snprintf(kv->csd_dead, sizeof kv->csd_dead,
                 "KV storage agent (terrace-storaged, pid %d) exited (status %d): the cold pool "
                 "is unavailable",
                 (int)kv->csd_pid, r == kv->csd_pid ? WEXITSTATUS(ws) : -1);
    kv->csd_pid = 0;
    return true;
}

static tr_status lock(tr_kv *kv, tr_error *err) {
    if (kv->csd_dead[0]) return dead(kv, err);
    const int r = pthread_mutex_lock(&kv->csd_ctl->mu);
    if (r == EOWNERDEAD) { /* the agent died holding it */
        pthread_mutex_consistent(&kv->csd_ctl->mu);
        pthread_mutex_unlock(&kv->csd_ctl->mu);
        if (!agent_gone(kv))
            snprintf(kv->csd_dead, sizeof kv->csd_dead,
                     "KV storage agent (%s) died holding the shared lock", kv->csd_where);
        return dead(kv, err);
    }
    if (r) return tr_fail(err, TR_E_IO, "KV storage agent: lock: %s", strerror(r));
    return TR_OK;
}

/* one slice of waiting on to_host, under the lock; an error (the lock released) if the agent
 * has gone */
static tr_status wait_slice(tr_kv *kv, tr_error *err) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const uint64_t t = (uint64_t)ts.tv_nsec + CSD_SLICE_NS;
    ts.tv_sec += (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    const int r = pthread_cond_timedwait(&kv->csd_ctl->to_host, &kv->csd_ctl->mu, &ts);
    if (r == EOWNERDEAD) {
        pthread_mutex_consistent(&kv->csd_ctl->mu);
        pthread_mutex_unlock(&kv->csd_ctl->mu);
        agent_gone(kv);
        return dead(kv, err);
    }
    if (r == ETIMEDOUT && agent_gone(kv)) {
        pthread_mutex_unlock(&kv->csd_ctl->mu);
        return dead(kv, err);
    }
    return TR_OK;
}

/* request seq is complete (under the lock) */
static bool req_done(const tr_csd_ctl *c, uint64_t seq) {
    return c->completed >= seq || c->ring[(seq - 1) % TR_CSD_RING].done == seq;
}

static tr_status post(tr_kv *kv, const tr_csd_req *req, uint64_t *seq, tr_error *err) {
    tr_csd_ctl *c = kv->csd_ctl;
    tr_status st = lock(kv, err);
    if (st) return st;
    while (c->posted - c->completed >= TR_CSD_RING)
        if ((st = wait_slice(kv, err))) return st;
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

static tr_status wait_done(tr_kv *kv, uint64_t seq, tr_error *err) {
    tr_csd_ctl *c = kv->csd_ctl;
    tr_status st = lock(kv, err);
    if (st) return st;
    while (!req_done(c, seq))
        if ((st = wait_slice(kv, err))) return st;
    const tr_csd_req *r = &c->ring[(seq - 1) % TR_CSD_RING];
    if (r->status) {
        char msg[TR_CSD_MSG];
        memcpy(msg, r->msg, sizeof msg);
        msg[sizeof msg - 1] = 0;
        pthread_mutex_unlock(&c->mu);
        char path[4200];
        tr_kv_seg_path(kv, r->layer, path, sizeof path);
        return tr_fail(err, (tr_status)r->status, "KV storage agent: %s (%s)", msg, path);
    }
    pthread_mutex_unlock(&c->mu);
    return TR_OK;
}

/* ---- start / stop ----------------------------------------------------------------------------- */

static bool find_agent(const tr_kv *kv, char *out, size_t cap) {
    const char *p = kv->params.csd_bin;
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
 * numbers */
static tr_status spawn_agent(tr_kv *kv, char *bin, tr_error *err) {
    const tr_kv_shape *s = &kv->shape;
    /* it finds the region and the segment files at fixed descriptor numbers */
    /* (through copies above that range first: a source descriptor inside it would be
     * overwritten by an earlier dup2 of the sequence) */
    const int n_fd = s->n_layer + 1, hi = TR_CSD_FD_LAYER + s->n_layer + 16;
    int *tmp = malloc(sizeof(int) * (size_t)n_fd);
    if (!tmp) return tr_fail(err, TR_E_NOMEM, "KV storage agent: out of memory");
    bool ok = true;
    for (int i = 0; i < n_fd; i++) {
        tmp[i] = fcntl(i ? kv->layers[i - 1].fd : kv->csd_fd, F_DUPFD_CLOEXEC, hi);
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
    kv->csd_pid = pid;
    snprintf(kv->csd_where, sizeof kv->csd_where, "pid %d", (int)pid);
    return TR_OK;
}

/* a user-started agent (terrace-storaged --listen): the same descriptors, passed over its socket */
static tr_status connect_agent(tr_kv *kv, const char *path, tr_error *err) {
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
    kv->csd_sock = fd;
    snprintf(kv->csd_where, sizeof kv->csd_where, "at %.140s", path);
    const int n_fd = kv->shape.n_layer + 1;
    const tr_csd_hello h = {.magic = TR_CSD_HELLO_MAGIC,
                            .version = TR_CSD_VERSION,
                            .host_pid = (int32_t)getpid(),
                            .n_fd = n_fd};
    for (int i0 = 0; i0 < n_fd; i0 += TR_CSD_FD_BATCH) {
        const int n = n_fd - i0 < TR_CSD_FD_BATCH ? n_fd - i0 : TR_CSD_FD_BATCH;
        int fds[TR_CSD_FD_BATCH];
        for (int i = 0; i < n; i++) fds[i] = i0 + i ? kv->layers[i0 + i - 1].fd : kv->csd_fd;
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

tr_status tr_kv_csd_start(tr_kv *kv, tr_error *err) {
    const tr_kv_shape *s = &kv->shape;
    const char *sock = kv->params.csd_socket && *kv->params.csd_socket ? kv->params.csd_socket
                                                                       : NULL;
    char bin[PATH_MAX + 64];
    if (!sock && !find_agent(kv, bin, sizeof bin))
        return tr_fail(err, TR_E_ARG,
                       "KV storage agent: %s is not an executable (build it with make, or name it "
                       "with --csd-bin or TERRACE_STORAGED)",
                       bin);
    const uint64_t ws_cap = (uint64_t)kv->ws_cap;
    const uint64_t total = tr_kv_csd_region_bytes(s, ws_cap, kv->q8row, kv->rec);
    kv->csd_fd = memfd_create("terrace-kv-csd", MFD_CLOEXEC);
    if (kv->csd_fd < 0)
        return tr_fail(err, TR_E_IO, "KV storage agent: memfd_create: %s", strerror(errno));
    if (ftruncate(kv->csd_fd, (off_t)total))
        return tr_fail(err, TR_E_NOMEM, "KV storage agent: shared region of %llu bytes: %s",
                       (unsigned long long)total, strerror(errno));
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, kv->csd_fd, 0);
    if (m == MAP_FAILED)
        return tr_fail(err, TR_E_NOMEM, "KV storage agent: mapping %llu bytes: %s",
                       (unsigned long long)total, strerror(errno));
    kv->csd_ctl = m;
    kv->csd_bytes = total;
    tr_csd_ctl *c = kv->csd_ctl;
    memset(c, 0, sizeof *c);
    c->magic = TR_CSD_MAGIC;
    c->version = TR_CSD_VERSION;
    c->n_layer = s->n_layer;
    c->n_ctx = s->n_ctx;
    c->n_head = s->n_head;
    c->n_head_kv = s->n_head_kv;
    c->hdk_pad = kv->hdk_pad;
    c->chunk = kv->csd_chunk;
    c->qtype = (int32_t)kv->qtype;
    c->direct = kv->direct;
    c->ws_cap = kv->ws_cap;
    c->page_tokens = TR_KV_PAGE;
    c->rec = kv->rec;
    c->qrow = kv->qrow;
    c->q8row = kv->q8row;
    c->page_bytes = kv->page_bytes;
    c->page_qoff = kv->page_qoff;
    c->page_toff = kv->page_toff;
    c->data_off = kv->data_off;
    c->gbps = kv->params.csd_gbps;
    c->gflops = kv->params.csd_gflops;
    c->link_gbps = kv->params.csd_link_gbps;
    uint64_t o = align_up(sizeof(tr_csd_ctl), 64);
    c->off_q8 = o;
    o += align_up((uint64_t)s->n_head * kv->q8row, 64);
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
    kv->ws = (uint8_t *)m + c->off_ws;

    tr_status st = sock ? connect_agent(kv, sock, err) : spawn_agent(kv, bin, err);
    if (st) return st;
    const uint64_t t0 = tr_now_ns();
    while (!atomic_load(&c->ready)) {
        if (agent_gone(kv)) return dead(kv, err);
        if (tr_now_ns() - t0 > CSD_START_NS)
            return tr_fail(err, TR_E_IO, "KV storage agent (%s) did not start in 10 s",
                           kv->csd_where);
        usleep(1000);
    }
    if (sock) /* its messages name the process serving us */
        snprintf(kv->csd_where, sizeof kv->csd_where, "pid %d at %.140s",
                 (int)atomic_load(&c->agent_pid), sock);
    return TR_OK;
}

void tr_kv_csd_stop(tr_kv *kv) {
    /* the process serving this session ends (a user-started agent's listener stays): our child
     * when it exits, a user-started one when it closes the connection; up to 2 s */
    if ((kv->csd_pid > 0 || kv->csd_sock >= 0) && kv->csd_ctl && !kv->csd_dead[0]) {
        tr_csd_req q = {.op = TR_CSD_OP_QUIT};
        uint64_t seq;
        if (!post(kv, &q, &seq, NULL)) {
            const uint64_t t0 = tr_now_ns();
            int ws;
            while (tr_now_ns() - t0 <= 2000000000ull) {
                if (kv->csd_pid > 0 ? waitpid(kv->csd_pid, &ws, WNOHANG) != 0
                                    : tr_csd_sock_closed(kv->csd_sock)) {
                    kv->csd_pid = 0;
                    break;
                }
                usleep(1000);
            }
        }
    }
    if (kv->csd_sock >= 0) { /* one still serving notices the close within a second */
        close(kv->csd_sock);
        kv->csd_sock = -1;
    }
    if (kv->csd_pid > 0) { /* not answering */
        int ws;
        kill(kv->csd_pid, SIGKILL);
        waitpid(kv->csd_pid, &ws, 0);
        kv->csd_pid = 0;
    }
    if (kv->csd_ctl) {
        munmap(kv->csd_ctl, kv->csd_bytes);
        kv->csd_ctl = NULL;
        kv->ws = NULL;
    }
    if (kv->csd_fd >= 0) close(kv->csd_fd);
    kv->csd_fd = -1;
}

pid_t tr_kv_csd_pid(const tr_kv *kv) {
    if (kv->csd_pid > 0) return kv->csd_pid;
    return kv->csd_ctl ? (pid_t)atomic_load(&kv->csd_ctl->agent_pid) : 0;
}

void tr_kv_csd_counters(const tr_kv *kv, uint64_t *scores, uint64_t *rows, uint64_t *storage,
                        uint64_t *busy_ns, uint64_t *mem) {
    const tr_csd_ctl *c = kv->csd_ctl;
    *scores = c ? atomic_load(&c->bytes_scores) : 0;
    *rows = c ? atomic_load(&c->bytes_rows) : 0;
    *storage = c ? atomic_load(&c->bytes_storage) : 0;
    *busy_ns = c ? atomic_load(&c->busy_ns) : 0;
    *mem = c ? atomic_load(&c->mem_bytes) : 0;
}

/* ---- scoring ---------------------------------------------------------------------------------- */

/* a SCORE of positions [a, b) of the layer (the query already in the region), telling the agent
 * which of its copies of the layer's key pages went stale since its last request */
static tr_status post_score(tr_kv *kv, int32_t layer, int32_t a, int32_t b, float scale,
                            uint64_t *seq, tr_error *err) {
    tr_kv_layer *L = &kv->layers[layer];
    const tr_csd_req r = {.op = TR_CSD_OP_SCORE,
                          .layer = layer,
                          .a = a,
                          .b = b,
                          .scale = scale,
                          .inval_from = L->csd_inval == INT32_MAX ? -1 : L->csd_inval};
    const tr_status st = post(kv, &r, seq, err);
    if (!st) L->csd_inval = INT32_MAX;
    return st;
}

tr_status tr_kv_csd_score(tr_kv *kv, tr_pool *pool, int32_t layer, const float *q, float scale,
                          const int32_t *cand, int32_t n, int32_t n_a, float *out, tr_error *err) {
    tr_csd_ctl *c = kv->csd_ctl;
    uint8_t *base = (uint8_t *)c;
    const int32_t nh = kv->shape.n_head;
    const int32_t a = cand[0], b = cand[0] + n_a;
    if (cand[n_a - 1] != b - 1)
        return tr_fail(err, TR_E_INTERNAL, "KV storage agent: layer %d: candidates not a range",
                       layer);
    tr_kv_prepare_query(kv, layer, q);
    memcpy(base + c->off_q8, kv->q8, (size_t)nh * kv->q8row);
    const uint64_t agent0 = atomic_load(&c->score_ns);
    uint64_t seq;
    tr_status st = post_score(kv, layer, a, b, scale, &seq, err);
    if (st) return st;
    /* group B on the host while the agent scores group A */
    const size_t stride = (size_t)n;
    const uint64_t h0 = tr_now_ns();
    tr_kv_score_heads(kv, pool, layer, cand, n_a, n, stride, scale);
    float *m_b = kv->csd_m, *c_a = kv->csd_c, *c_b = kv->csd_c + nh;
    double *z_b = kv->csd_z;
    for (int32_t h = 0; h < nh; h++)
        tr_kv_group_stats(kv->hs + (size_t)h * stride + n_a, n - n_a, &m_b[h], &z_b[h]);
    uint64_t host_ns = tr_now_ns() - h0;
    if ((st = wait_done(kv, seq, err))) return st;
    const float *m_a = (const float *)(base + c->off_stats);
    const double *z_a = (const double *)(base + c->off_stats + (uint64_t)nh * 4);
    tr_kv_group_merge(nh, m_a, z_a, m_b, z_b, c_a, c_b);
    memcpy(base + c->off_c, c_a, (size_t)nh * 4);
    atomic_store(&c->produced, 0);
    const tr_csd_req fin = {.op = TR_CSD_OP_FINISH, .layer = layer, .a = a, .b = b};
    if ((st = post(kv, &fin, &seq, err))) return st;
    const uint64_t h1 = tr_now_ns();
    tr_kv_group_score(kv->hs, stride, nh, c_b, 1, n_a, n, out);
    host_ns += tr_now_ns() - h1;
    /* merge the agent's blocks as they arrive */
    const tr_csd_entry *e = (const tr_csd_entry *)(base + c->off_scores);
    int64_t got = 0;
    if ((st = lock(kv, err))) return st;
    for (;;) {
        const int64_t p = atomic_load(&c->produced);
        if (p > got) {
            pthread_mutex_unlock(&c->mu);
            for (int64_t i = got; i < p; i++) out[e[i].pos - (uint32_t)a] = e[i].score;
            got = p;
            if ((st = lock(kv, err))) return st;
            continue;
        }
        if (got >= n_a || req_done(c, seq)) break;
        if ((st = wait_slice(kv, err))) return st;
    }
    pthread_mutex_unlock(&c->mu);
    if ((st = wait_done(kv, seq, err))) return st;
    if (got < n_a)
        return tr_fail(err, TR_E_INTERNAL, "KV storage agent: layer %d: %lld of %d scores",
                       layer, (long long)got, n_a);
    /* APP: this step's scoring rates, from parts big enough that the per-call costs (waking
     * threads, the request round trip) do not dominate */
    const double tc = (double)host_ns / (double)(n - n_a);
    const double ts = (double)(atomic_load(&c->score_ns) - agent0) / (double)n_a;
    const tr_kv_params *p = &kv->params;
    if (!(p->app_f_c > 0) && (n - n_a >= TR_KV_APP_MIN_PART || kv->app_tc <= 0))
        app_sample(&kv->app_tc, tc, kv->app_exploring == 1);
    if (!(p->app_f_s > 0) && (n_a >= TR_KV_APP_MIN_PART || kv->app_ts <= 0))
        app_sample(&kv->app_ts, ts, kv->app_exploring == 2);
    kv->app_exploring = 0;
    return TR_OK;
}

void tr_kv_app_init(tr_kv *kv) {
    const tr_kv_params *p = &kv->params;
    if (p->app_f_c > 0) kv->app_tc = 1e9 / p->app_f_c; /* ns per token */
    if (p->app_f_s > 0) kv->app_ts = 1e9 / p->app_f_s;
    if (p->app_b_c > 0) kv->app_bc = p->app_b_c / 1e9; /* bytes per ns */
    if (p->app_b_s > 0) kv->app_bs = p->app_b_s / 1e9;
}

void tr_kv_app_note_rows(tr_kv *kv, uint64_t hot_bytes, uint64_t hot_ns, uint64_t agent_bytes,
                         uint64_t agent_ns) {
    const tr_kv_params *p = &kv->params;
    if (!(p->app_b_c > 0) && hot_bytes && hot_ns)
        tr_kv_app_avg(&kv->app_bc, (double)hot_bytes / (double)hot_ns);
    if (!(p->app_b_s > 0) && agent_bytes && agent_ns)
        tr_kv_app_avg(&kv->app_bs, (double)agent_bytes / (double)agent_ns);
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
tr_status tr_kv_app_probe(tr_kv *kv, tr_pool *pool, int32_t layer, const float *q, float scale,
                          const int32_t *cand, int32_t n_a, tr_error *err) {
    kv->app_probed = true;
    const tr_kv_params *p = &kv->params;
    const int32_t m = n_a < APP_PROBE_TOKENS ? n_a : APP_PROBE_TOKENS;
    if (m < 1 || cand[m - 1] != cand[0] + m - 1) return TR_OK; /* not a range: steps measure */
    tr_csd_ctl *c = kv->csd_ctl;
    tr_kv_layer *L = &kv->layers[layer];
    tr_status st;
    if (!(p->app_f_s > 0)) {
        tr_kv_prepare_query(kv, layer, q);
        memcpy((uint8_t *)c + c->off_q8, kv->q8, (size_t)kv->shape.n_head * kv->q8row);
        uint64_t s0 = 0;
        for (int pass = 0; pass < 2; pass++) {
            uint64_t seq;
            s0 = atomic_load(&c->score_ns);
            if ((st = post_score(kv, layer, cand[0], cand[0] + m, scale, &seq, err)) ||
                (st = wait_done(kv, seq, err)))
                return st;
        }
        kv->app_ts = (double)(atomic_load(&c->score_ns) - s0) / m;
    }
    /* the host's part: the newest of the tokens, as a split gives it, within its key copy */
    const int32_t mc = tr_kv_hk_held(kv, &kv->layers[layer], cand, n_a, m);
    if (!(p->app_f_c > 0) && mc > 0) { /* as the host scores its part in tr_kv_csd_score */
        const int32_t *hc = cand + n_a - mc;
        const uint64_t t0 = tr_now_ns();
        tr_kv_score_heads(kv, pool, layer, hc, 0, mc, (size_t)mc, scale);
        for (int32_t h = 0; h < kv->shape.n_head; h++) {
            float mx;
            double z;
            tr_kv_group_stats(kv->hs + (size_t)h * (size_t)mc, mc, &mx, &z);
        }
        kv->app_tc = (double)(tr_now_ns() - t0) / mc;
    }
    if (!(p->app_b_c > 0)) { /* hot records into the working set, as a gather copies them */
        int32_t nc = 0;
        const uint64_t t0 = tr_now_ns();
        for (int32_t t = 0; t < L->len && nc < APP_PROBE_ROWS && nc < kv->ws_cap; t++)
            if (L->tok[t].where == TR_KV_TOK_HOT) {
                memcpy(kv->ws + (size_t)nc * kv->rec, L->hot + (size_t)L->tok[t].slot * kv->rec,
                       kv->rec);
                nc++;
            }
        const uint64_t ns = tr_now_ns() - t0;
        if (nc && ns) kv->app_bc = (double)nc * (double)kv->rec / (double)ns;
    }
    if (!(p->app_b_s > 0)) { /* the agent's rows: cold records read into the working set */
        int32_t nr = m < APP_PROBE_ROWS ? m : APP_PROBE_ROWS;
        if (nr > kv->ws_cap) nr = kv->ws_cap;
        tr_kv_csd_rows_start(kv, 0, layer, cand, nr, 0, 1, NULL);
        if ((st = tr_kv_csd_rows_wait(kv, 0, err))) return st; /* sets app_bs */
    }
    return TR_OK;
}

/* DESIGN.md's balance, n_c/f_c + a_c n_c rec/B_c = n_s/f_s + a_s n_s rec/B_s, is HillInfer's,
 * where a side's share of the tokens is also where their rows live: rows selected from the host's
 * share cross B_c, the others B_s. Here the split moves the scoring only. A selected token's row
 * comes from where BKP placed it (the hot pool's copy, or the agent's reads) whoever scored it,
 * so at every split both sides move the same rows: the row terms (and with them the selected
 * fractions a_c, a_s that correct for BKP's skew) are the same on both sides and drop out. What
 * is left is the two scorings running side by side, equal when n_c / n_s = f_c / f_s. The
 * equation with its row terms chose beta 1.73-2.04 on the 16K bench, where the step was fastest
 * at 2.5 and the scoring from 3 to 6; this balance chose 2.5-2.9 (bench/results/kv.md). */
double tr_kv_app_beta(const tr_kv *kv) {
    if (kv->params.beta >= 0.0f) return kv->params.beta;
    if (!(kv->app_tc > 0 && kv->app_ts > 0)) return 1.0; /* nothing measured yet: an even split */
    return kv->app_ts / kv->app_tc;
}

/* ---- rows ------------------------------------------------------------------------------------- */

void tr_kv_csd_rows_start(tr_kv *kv, int which, int32_t layer, const int32_t *sel, int32_t n,
                          int32_t slot0, int np, const int32_t *bnd) {
    tr_kv_gather *G = &kv->gath[which];
    tr_csd_ctl *c = kv->csd_ctl;
    const tr_kv_layer *L = &kv->layers[layer];
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
                    .read_gap = kv->csd_gap};
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
    G->bytes = (uint64_t)nh * kv->rec;
    G->csd_rows_ns0 = atomic_load(&c->rows_ns);
    G->csd_seq = 0;
    G->failed = false;
    if (!nr) return;
    r.n_runs = nr;
    atomic_store(&c->rows_parts[which], 0); /* the area's last request has completed */
    tr_error e = {0};
    if (post(kv, &r, &G->csd_seq, &e)) {
        G->failed = true;
        snprintf(G->err_msg, sizeof G->err_msg, "%s", e.msg);
    }
}

tr_status tr_kv_csd_rows_wait_part(tr_kv *kv, int which, int part, tr_error *err) {
    tr_kv_gather *G = &kv->gath[which];
    if (!G->n_jobs) return TR_OK;
    if (G->failed) return tr_fail(err, TR_E_IO, "%s", G->err_msg);
    tr_csd_ctl *c = kv->csd_ctl;
    const uint64_t t0 = tr_now_ns();
    tr_status st = lock(kv, err);
    if (st) return st;
    while (atomic_load(&c->rows_parts[which]) <= part && !req_done(c, G->csd_seq))
        if ((st = wait_slice(kv, err))) return st;
    const bool in = atomic_load(&c->rows_parts[which]) > part;
    pthread_mutex_unlock(&c->mu);
    kv->io_ns += tr_now_ns() - t0;
    /* completed without it: the request failed, and its status says why */
    return in ? TR_OK : wait_done(kv, G->csd_seq, err);
}

tr_status tr_kv_csd_rows_wait(tr_kv *kv, int which, tr_error *err) {
    tr_kv_gather *G = &kv->gath[which];
    if (!G->n_jobs) return TR_OK;
    const uint64_t t0 = tr_now_ns();
    tr_status st = TR_OK;
    if (G->failed)
        st = tr_fail(err, TR_E_IO, "%s", G->err_msg);
    else
        st = wait_done(kv, G->csd_seq, err);
    kv->io_ns += tr_now_ns() - t0;
    if (!st) {
        kv->bytes_read += G->bytes;
        kv->read_ops += (uint64_t)atomic_load(&kv->csd_ctl->rows_reads[which]);
        tr_kv_app_note_rows(kv, 0, 0, G->bytes, atomic_load(&kv->csd_ctl->rows_ns) - G->csd_rows_ns0);
    }
    G->n_jobs = 0;
    return st;
}
