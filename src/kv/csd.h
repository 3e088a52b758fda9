/*
 * The storage agent (terrace-storaged): HillInfer's "computational storage" for the cold pool,
 * as a separate process next to the storage. This header is the contract between the runtime
 * (src/kv/kv_csd.c) and the agent (src/agent/storaged.c): one shared-memory region, created by
 * the runtime (memfd), holding a control block, the request ring, the data areas and the
 * compute working set itself, so rows the agent reads land where the attention reads them.
 *
 * Per decode step and layer (tiered scoring of the tokens whose pages are on storage, group A;
 * the host scores the rest, group B: the open page, the sinks and the window):
 *   SCORE   host -> agent: the layer, the position range [a, b), the query heads quantized as
 *           the host would score them (Q8_0 rows) and the score scale. The agent reads each
 *           page's key copy (verified against the page trailer) in chunks of `chunk` tokens,
 *           scores them per query head and keeps the scores; it returns per head the max and
 *           the sum of exp(score - max) over its tokens (n_head x 12 bytes).
 *   FINISH  host -> agent: per head the factor c = exp(max_A - M) / Z that turns the agent's
 *           exponentials into each head's share of the attention over all visible keys. The
 *           agent streams one (position, score) entry per token, chunk by chunk, publishing
 *           how many are ready after each chunk; the host merges them as they arrive.
 *   ROWS    host -> agent: runs of selected positions with their record hashes, in up to
 *           TR_CSD_PARTS parts (slot ranges); the agent reads them into its own staging area
 *           (runs of a part a few records apart as one read, the records between them read but
 *           never sent), verifies them and copies them into the working-set slots, and
 *           publishes the parts in order as each is complete (rows_parts), so the host attends
 *           over a part while the later ones are still read.
 * The host and the agent compute the scores with the same functions on the same bytes, so the
 * agent selects exactly what host scoring selects (test_kv_agent checks it).
 *
 * The agent reads a ROWS request's rows on a thread of its own, so that it scores the next
 * layer's SCORE and FINISH (--kv-spec selects it ahead) while the rows are read: requests can
 * complete out of order, each marked done in its ring slot.
 *
 * Synchronisation: a process-shared robust mutex and two condition variables (CLOCK_MONOTONIC).
 * The host waits in slices of 50 ms and checks the agent between them: an agent that dies
 * mid-step fails the step with a clear error within a second. The agent dies with the runtime.
 *
 * Two ways to start it:
 *   - by the runtime (the default): a child process, given the region at descriptor 3 and the
 *     segment files at 4, 5, ... ; the host watches its exit status, it has PR_SET_PDEATHSIG.
 *   - by the user, for a disk shared by several sessions: `terrace-storaged --listen SOCKET`
 *     waits on a Unix socket; a runtime given --csd-socket connects and passes the same
 *     descriptors over it (SCM_RIGHTS: a tr_csd_hello, then the descriptors in batches of at
 *     most TR_CSD_FD_BATCH), and the agent forks a process that serves that session exactly as
 *     a child would. The connection stays open as the liveness signal both ways: each side
 *     notices the other's end when it closes. Only descriptors cross the socket; the data path
 *     is the shared region, as before.
 */
#ifndef TR_KV_CSD_H
#define TR_KV_CSD_H

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#define TR_CSD_MAGIC   0x31445343564b5254ull /* "TRKVCSD1" */
#define TR_CSD_VERSION 8
#define TR_CSD_AREAS   2 /* row requests in flight: the two halves of a chunked working set (a
                           * pipelined selection goes to the agent as one request) */
#define TR_CSD_RING    8
#define TR_CSD_PARTS   4 /* a row request's parts, published as each is in (the host attends
                          * over a part while the later ones are still read) */
#define TR_CSD_MSG     1024
#define TR_CSD_JOIN_MAX (512u << 10) /* the longest joined read (256 KiB and up run at the disk's
                                      * best rate, bench/results/kv.md) */
/* the descriptors the agent finds: the shared region, then one segment file per layer */
#define TR_CSD_FD_SHM   3
#define TR_CSD_FD_LAYER 4

/* the user-started agent's handshake */
#define TR_CSD_HELLO_MAGIC 0x4f4c4c4548564b54ull /* "TKVHELLO" */
#define TR_CSD_FD_BATCH    200 /* descriptors per message (the kernel takes at most 253) */
typedef struct tr_csd_hello {
    uint64_t magic;
    uint32_t version; /* TR_CSD_VERSION */
    int32_t host_pid; /* for the agent's messages */
    int32_t n_fd;     /* the region, then one segment file per layer */
} tr_csd_hello;

/* whether the other end of a user-started agent's connection has gone: neither side ever writes
 * to it after the handshake, so readable means closed */
static inline bool tr_csd_sock_closed(int fd) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 0) <= 0) return false;
    char b;
    const ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) ||
           (pf.revents & (POLLHUP | POLLERR));
}

enum { TR_CSD_OP_SCORE = 1, TR_CSD_OP_FINISH, TR_CSD_OP_ROWS, TR_CSD_OP_QUIT };

typedef struct tr_csd_req {
    int32_t op, layer;
    int32_t a, b;   /* SCORE/FINISH: positions [a, b) */
    int32_t n_runs; /* ROWS */
    int32_t which;  /* ROWS: run/hash area 0 .. TR_CSD_AREAS-1 */
    int32_t n_parts;                 /* ROWS: 1 .. TR_CSD_PARTS */
    int32_t part_end[TR_CSD_PARTS];  /* ROWS: part p holds the runs whose slot is below
                                        part_end[p] (and not below part_end[p - 1]) */
    int32_t read_gap;                /* ROWS: runs of a part at most this many records' bytes
                                        apart are read as one (0: each run on its own) */
    float scale;    /* SCORE */
    int32_t inval_from; /* SCORE: pages of the layer from this one on were rewritten (a truncate
                           or a restore): the agent's copies of them are stale; -1 none */
    int32_t status; /* filled by the agent: 0 ok, else a tr_status */
    char msg[TR_CSD_MSG];
    uint64_t done;  /* the agent: this request's number once it is complete (a row request
                       completes on its own thread, so a later request can complete first) */
} tr_csd_req;

typedef struct tr_csd_run {
    int32_t pos, n, slot; /* n records from pos into working-set slots slot.. */
    int32_t hash0;        /* index of the first record's hash in the hash area */
} tr_csd_run;

typedef struct tr_csd_ctl {
    uint64_t magic;
    uint32_t version;
    /* geometry, written by the host */
    int32_t n_layer, n_ctx, n_head, n_head_kv, hdk_pad, chunk, qtype, direct;
    int32_t ws_cap, page_tokens;
    uint64_t rec, qrow, q8row, page_bytes, page_qoff, page_toff, data_off;
    /* throttles (0: none): storage reads, scoring rate, link to the host */
    double gbps, gflops, link_gbps;
    /* areas: offsets from the start of the region */
    uint64_t off_q8;            /* [n_head][q8row] */
    uint64_t off_stats;         /* SCORE result: float max[n_head], then double sum[n_head] */
    uint64_t off_c;             /* FINISH input: float c[n_head] */
    uint64_t off_scores;        /* FINISH output: tr_csd_entry[n_ctx] */
    uint64_t off_runs[TR_CSD_AREAS];   /* ROWS: tr_csd_run[ws_cap] */
    uint64_t off_hashes[TR_CSD_AREAS]; /* ROWS: uint64_t[ws_cap] */
    uint64_t off_ws;            /* the compute working set: ws_cap records */
    uint64_t total;
    pthread_mutex_t mu;
    pthread_cond_t to_agent, to_host;
    tr_csd_req ring[TR_CSD_RING];
    uint64_t posted, taken, completed; /* request counts (under mu); completed: every request up
                                          to it is complete (the ring's free slots) */
    _Atomic int64_t produced;          /* FINISH: entries ready */
    _Atomic int32_t rows_parts[TR_CSD_AREAS]; /* ROWS: parts complete (reset by the host) */
    _Atomic int32_t rows_reads[TR_CSD_AREAS]; /* ROWS: the storage reads of the area's last
                                                 request (runs joined across gaps count one) */
    _Atomic int32_t ready;             /* the agent is up */
    _Atomic int32_t agent_pid;         /* the process serving this region */
    /* counters, written by the agent */
    _Atomic uint64_t bytes_scores, bytes_rows, bytes_storage, busy_ns, mem_bytes;
    _Atomic uint64_t score_ns, rows_ns; /* the agent's time in scoring and in row requests */
} tr_csd_ctl;

typedef struct tr_csd_entry {
    uint32_t pos;
    float score;
} tr_csd_entry;

/* The agent's own memory for a region of this geometry, outside the shared region: one layer's
 * per-head scores, one chunk's aggregated scores, its copy of the key copies, one layer's pages
 * as read (each page's part after its records, at a 4 KiB stride) and a staging area as large as
 * the working set (2 MiB pages) with a bounce buffer as large for each row area. The agent
 * allocates and reports it with this function and the host's memory plan counts it, so the two
 * cannot drift apart. */
static inline uint64_t tr_csd_agent_bytes(int32_t n_layer, int32_t n_ctx, int32_t n_head,
                                          int32_t n_head_kv, int32_t page_tokens, int32_t chunk,
                                          int32_t ws_cap, uint64_t rec, uint64_t qrow,
                                          uint64_t page_bytes, uint64_t page_qoff) {
    const uint64_t n_pages = ((uint64_t)n_ctx + (uint64_t)page_tokens - 1) / (uint64_t)page_tokens;
    const uint64_t pstride = (page_bytes - page_qoff + 4095) / 4096 * 4096;
    const uint64_t stage = ((uint64_t)ws_cap * rec + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    return (uint64_t)n_head * (uint64_t)n_ctx * 4 + (uint64_t)chunk * 4 +
           (uint64_t)n_layer * (uint64_t)n_head_kv * (uint64_t)n_ctx * qrow + n_pages * pstride +
           (1 + TR_CSD_AREAS) * stage;
}

#endif
