/*
 * HTTP for terrace serve, on libmicrohttpd (Debian's libmicrohttpd-dev): a small, well-kept C
 * library that parses HTTP/1.1 (chunked bodies, keep-alive, pipelining, header limits) so we do
 * not. One thread per connection: a request thread may block on its job, which is what a
 * streaming answer does, and watch its own socket for the client going away. libh2o would add
 * HTTP/2 and an event loop we do not need for a handful of streams per model; libevent's evhttp
 * has no per-connection threads, so every wait would become a callback chain.
 *
 * Safe by default: the address is 127.0.0.1 unless --host says otherwise; with --api-key every
 * route but /health needs "Authorization: Bearer KEY" (or HTTP Basic with the key as password,
 * which is how a browser opening the live page sends it); bodies over --body-limit get 413 before
 * they are read; every error is OpenAI's error object (Ollama's {"error": ...} on the /api routes).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

typedef enum handler { H_CHAT, H_COMPLETION, H_OCHAT, H_OGENERATE, H_MODELS, H_TAGS, H_VERSION,
                       H_HEALTH, H_METRICS, H_TELEMETRY, H_PAGE } handler;

static const struct route {
    const char *path;
    const char *method;
    handler h;
    int stat; /* ROUTE_* of the counters */
} k_routes[] = {
    {"/v1/chat/completions", "POST", H_CHAT, ROUTE_CHAT},
    {"/chat/completions", "POST", H_CHAT, ROUTE_CHAT},
    {"/v1/completions", "POST", H_COMPLETION, ROUTE_COMPLETIONS},
    {"/completions", "POST", H_COMPLETION, ROUTE_COMPLETIONS},
    {"/v1/models", "GET", H_MODELS, ROUTE_MODELS},
    {"/models", "GET", H_MODELS, ROUTE_MODELS},
    {"/api/chat", "POST", H_OCHAT, ROUTE_OLLAMA_CHAT},
    {"/api/generate", "POST", H_OGENERATE, ROUTE_OLLAMA_GENERATE},
    {"/api/tags", "GET", H_TAGS, ROUTE_OLLAMA_TAGS},
    {"/api/version", "GET", H_VERSION, ROUTE_OLLAMA_VERSION},
    {"/health", "GET", H_HEALTH, ROUTE_HEALTH},
    {"/metrics", "GET", H_METRICS, ROUTE_METRICS},
    {"/telemetry", "GET", H_TELEMETRY, ROUTE_TELEMETRY},
    {"/", "GET", H_PAGE, ROUTE_PAGE},
};

typedef struct conn_req {
    const struct route *rt; /* NULL: unknown path */
    bool answered;          /* a response was queued before the body was read */
    bool too_big;
    sbuf body;
} conn_req;

static bool ollama_route(const struct route *rt) {
    return rt && (rt->h == H_OCHAT || rt->h == H_OGENERATE || rt->h == H_TAGS);
}

static enum MHD_Result send_buf(server *s, struct MHD_Connection *c, const struct route *rt,
                                int status, const char *type, const char *body, size_t n) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (status == 401) {
        /* a browser asks for the key (as a password) on the page; API clients send Bearer */
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                rt && rt->h == H_PAGE ? "Basic realm=\"terrace\"" : "Bearer");
    }
    if (status == 405 && rt) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, rt->method);
    const enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    stats_count_request(s, rt ? rt->stat : ROUTE_OTHER, status);
    return r;
}

static enum MHD_Result send_sbuf(server *s, struct MHD_Connection *c, const struct route *rt,
                                 int status, const char *type, sbuf *b) {
    if (b->oom) {
        sb_free(b);
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        return send_buf(s, c, rt, 500, "application/json", oom, sizeof oom - 1);
    }
    const enum MHD_Result r = send_buf(s, c, rt, status, type, b->p ? b->p : "", b->len);
    sb_free(b);
    return r;
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *c, const struct route *rt,
                                  const api_error *e) {
    sbuf b = {0};
    if (ollama_route(rt)) {
        /* Ollama's shape: {"error": "message"} */
        sb_str(&b, "{\"error\":\"");
        for (const char *p = e->msg; *p; p++) {
            if (*p == '"' || *p == '\\') sb_printf(&b, "\\%c", *p);
            else if ((unsigned char)*p < 0x20) sb_printf(&b, "\\u%04x", *p);
            else sb_add(&b, p, 1);
        }
        sb_str(&b, "\"}");
    } else {
        api_error_json(e, &b);
    }
    return send_sbuf(s, c, rt, e->status, "application/json", &b);
}

static enum MHD_Result send_fail(server *s, struct MHD_Connection *c, const struct route *rt,
                                 int status, const char *type, const char *code, const char *msg) {
    api_error e = {.status = status, .type = type, .code = code};
    snprintf(e.msg, sizeof e.msg, "%s", msg);
    return send_error(s, c, rt, &e);
}

/* ---------------------------------------------------------------------------------------------- */
/* auth                                                                                            */

static bool same_secret(const char *a, size_t na, const char *b) {
    const size_t nb = strlen(b);
    unsigned diff = (unsigned)(na ^ nb);
    for (size_t i = 0; i < na && i < nb; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0 && na == nb;
}

static size_t b64_decode(const char *in, char *out, size_t cap) {
    size_t n = 0;
    unsigned acc = 0;
    int bits = 0;
    for (const char *p = in; *p && *p != '='; p++) {
        const char *tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const char *q = strchr(tbl, *p);
        if (!q || !*p) return 0;
        acc = (acc << 6) | (unsigned)(q - tbl);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (n + 1 >= cap) return 0;
            out[n++] = (char)((acc >> bits) & 0xFF);
        }
    }
    out[n] = '\0';
    return n;
}

static bool authorized(const server *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h) return false;
    if (!strncasecmp(h, "Bearer ", 7)) {
        const char *k = h + 7;
        while (*k == ' ') k++;
        return same_secret(k, strlen(k), s->cfg.api_key);
    }
    if (!strncasecmp(h, "Basic ", 6)) {
        char dec[512];
        const size_t n = b64_decode(h + 6, dec, sizeof dec);
        const char *colon = n ? memchr(dec, ':', n) : NULL;
        return colon && same_secret(colon + 1, n - (size_t)(colon + 1 - dec), s->cfg.api_key);
    }
    return false;
}

/* ---------------------------------------------------------------------------------------------- */
/* waiting on a job while watching the client                                                      */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* the client closed its end (or reset the connection) */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void deadline_in(struct timespec *ts, long ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

typedef enum wait_for { W_ADMITTED, W_TEXT, W_DONE } wait_for;

/* waits under mu (held on entry and return) until the job is admitted / has text past `sent` /
 * ended; false if the client went away first (the job is then marked cancelled) */
static bool wait_job_locked(server *s, job *j, int fd, wait_for w, size_t sent) {
    for (;;) {
        const bool ready = j->state == JOB_DONE || (w == W_ADMITTED && j->state != JOB_QUEUED) ||
                           (w == W_TEXT && j->visible > sent);
        if (ready) return true;
        struct timespec ts;
        deadline_in(&ts, 50);
        if (pthread_cond_timedwait(&j->cv, &s->mu, &ts) == ETIMEDOUT && peer_gone(fd)) {
            j->cancel = true;
            pthread_cond_signal(&s->sched_cv);
            return false;
        }
    }
}

/* ---------------------------------------------------------------------------------------------- */
/* streams: answers (SSE / NDJSON) and the telemetry feed                                          */

typedef struct stream {
    server *s;
    api_req r;
    int fd;
    sbuf out;
    size_t off;
    bool ended;
    bool telemetry;
    int ticks;
} stream;

static void stream_fill(stream *st) {
    server *s = st->s;
    job *j = st->r.j;
    pthread_mutex_lock(&s->mu);
    if (!wait_job_locked(s, j, st->fd, W_TEXT, st->r.sent)) {
        pthread_mutex_unlock(&s->mu);
        st->ended = true;
        st->off = st->out.len = 0;
        st->fd = -2; /* gone */
        return;
    }
    const size_t from = st->r.sent, to = j->visible;
    char *delta = NULL;
    if (to > from && (delta = malloc(to - from))) memcpy(delta, j->text + from, to - from);
    job_view v;
    const bool done = j->state == JOB_DONE && to == j->len;
    if (done) job_view_locked(j, &v);
    pthread_mutex_unlock(&s->mu);
    st->out.len = 0;
    st->off = 0;
    api_stream_chunk(s, &st->r, delta ? delta : "", delta ? to - from : 0, done ? &v : NULL,
                     &st->out);
    free(delta);
    st->r.sent = to;
    if (done) st->ended = true;
}

static void telemetry_fill(stream *st) {
    server *s = st->s;
    if (st->ticks++ > 0) {
        pthread_mutex_lock(&s->mu);
        struct timespec ts;
        deadline_in(&ts, 500);
        while (!s->draining && pthread_cond_timedwait(&s->drain_cv, &s->mu, &ts) != ETIMEDOUT) {
        }
        const bool draining = s->draining;
        pthread_mutex_unlock(&s->mu);
        if (draining || peer_gone(st->fd)) {
            st->ended = true;
            st->out.len = st->off = 0;
            return;
        }
    }
    st->out.len = st->off = 0;
    sb_str(&st->out, "data: ");
    stats_json(s, &st->out);
    sb_str(&st->out, "\n\n");
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    for (;;) {
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (st->off < st->out.len) {
            size_t n = st->out.len - st->off;
            if (n > max) n = max;
            memcpy(buf, st->out.p + st->off, n);
            st->off += n;
            return (ssize_t)n;
        }
        if (st->ended) return st->fd == -2 ? MHD_CONTENT_READER_END_WITH_ERROR
                                           : MHD_CONTENT_READER_END_OF_STREAM;
        if (st->telemetry) telemetry_fill(st);
        else stream_fill(st);
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    if (st->r.j) job_release(st->s, st->r.j);
    api_req_free(&st->r);
    sb_free(&st->out);
    free(st);
}

static enum MHD_Result send_stream(server *s, struct MHD_Connection *c, const struct route *rt,
                                   stream *st, const char *type) {
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    const enum MHD_Result r = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    stats_count_request(s, rt->stat, 200);
    return r;
}

/* ---------------------------------------------------------------------------------------------- */

static enum MHD_Result generate(server *s, struct MHD_Connection *c, const struct route *rt,
                                const conn_req *q) {
    static const api_kind kinds[] = {[H_CHAT] = API_CHAT, [H_COMPLETION] = API_COMPLETION,
                                     [H_OCHAT] = API_OLLAMA_CHAT,
                                     [H_OGENERATE] = API_OLLAMA_GENERATE};
    stream *st = calloc(1, sizeof *st);
    if (!st) return send_fail(s, c, rt, 500, "server_error", NULL, "out of memory");
    st->s = s;
    st->fd = conn_fd(c);
    api_error e = {0};
    if (!api_parse(s, kinds[rt->h], q->body.p ? q->body.p : "", q->body.len, &st->r, &e)) {
        if (st->r.j) job_release(s, st->r.j);
        st->r.j = NULL;
        api_req_free(&st->r);
        free(st);
        return send_error(s, c, rt, &e);
    }
    job *j = st->r.j;
    char why[256];
    if (!sched_submit(s, j, why, sizeof why)) {
        job_release(s, j);
        st->r.j = NULL;
        api_req_free(&st->r);
        free(st);
        return send_fail(s, c, rt, 503, "unavailable_error", NULL, why);
    }
    /* a stream starts once the job holds a slot, so that a refusal can still be a status */
    pthread_mutex_lock(&s->mu);
    const bool alive = wait_job_locked(s, j, st->fd, st->r.stream ? W_ADMITTED : W_DONE, 0);
    const bool refused = j->state == JOB_DONE && j->finish == FINISH_REFUSED;
    job_view v;
    job_view_locked(j, &v);
    char *text = NULL;
    size_t n = 0;
    if (alive && !st->r.stream && (text = malloc(j->len + 1))) {
        memcpy(text, j->text ? j->text : "", j->len);
        n = j->len;
    }
    pthread_mutex_unlock(&s->mu);
    if (!alive) { /* the client went away: nothing to answer */
        stream_free(st);
        return MHD_NO;
    }
    if (refused) {
        stream_free(st);
        return send_fail(s, c, rt, 503, "unavailable_error", NULL, "the server is shutting down");
    }
    if (st->r.stream) return send_stream(s, c, rt, st, api_stream_content_type(st->r.kind));
    sbuf b = {0};
    if (text || n == 0) api_response(s, &st->r, text ? text : "", n, &v, &b);
    else b.oom = true;
    free(text);
    stream_free(st);
    const int status = v.finish == FINISH_ERROR ? 500 : v.finish == FINISH_REFUSED ? 503 : 200;
    return send_sbuf(s, c, rt, status, "application/json", &b);
}

static enum MHD_Result dispatch(server *s, struct MHD_Connection *c, const struct route *rt,
                                conn_req *q) {
    sbuf b = {0};
    switch (rt->h) {
    case H_CHAT:
    case H_COMPLETION:
    case H_OCHAT:
    case H_OGENERATE: return generate(s, c, rt, q);
    case H_MODELS:
        api_models(s, false, &b);
        return send_sbuf(s, c, rt, 200, "application/json", &b);
    case H_TAGS:
        api_models(s, true, &b);
        return send_sbuf(s, c, rt, 200, "application/json", &b);
    case H_VERSION:
        sb_str(&b, "{\"version\":\"" TR_VERSION_STRING "\"}");
        return send_sbuf(s, c, rt, 200, "application/json", &b);
    case H_HEALTH:
        sb_str(&b, "{\"status\":\"ok\"}");
        return send_sbuf(s, c, rt, 200, "application/json", &b);
    case H_METRICS:
        stats_prometheus(s, &b);
        return send_sbuf(s, c, rt, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
    case H_PAGE:
        return send_buf(s, c, rt, 200, "text/html; charset=utf-8", serve_page_html,
                        serve_page_len);
    case H_TELEMETRY: {
        stream *st = calloc(1, sizeof *st);
        if (!st) return send_fail(s, c, rt, 500, "server_error", NULL, "out of memory");
        st->s = s;
        st->fd = conn_fd(c);
        st->telemetry = true;
        return send_stream(s, c, rt, st, "text/event-stream");
    }
    }
    return MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
    (void)version;
    server *s = cls;
    conn_req *q = *con_cls;
    if (!q) {
        if (!(q = calloc(1, sizeof *q))) return MHD_NO;
        *con_cls = q;
        pthread_mutex_lock(&s->mu);
        s->active_requests++;
        pthread_mutex_unlock(&s->mu);
        const struct route *path = NULL;
        for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
            if (!strcmp(url, k_routes[i].path)) path = &k_routes[i];
        q->rt = path;
        /* everything that can be refused from the headers is refused before the body is read */
        q->answered = true;
        if (!path) {
            char msg[400];
            snprintf(msg, sizeof msg, "no route %.200s (see GET /v1/models, POST "
                     "/v1/chat/completions, /v1/completions, /api/chat, /api/generate)", url);
            return send_fail(s, c, NULL, 404, "not_found_error", NULL, msg);
        }
        if (path->h != H_HEALTH && !authorized(s, c))
            return send_fail(s, c, path, 401, "authentication_error", "invalid_api_key",
                             "a valid API key is required: Authorization: Bearer KEY");
        if (strcmp(method, path->method) && !(path->h == H_HEALTH && !strcmp(method, "HEAD"))) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s needs %s, not %.16s", path->path, path->method, method);
            return send_fail(s, c, path, 405, "invalid_request_error", NULL, msg);
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.body_limit) {
            char msg[128];
            snprintf(msg, sizeof msg, "the body is %.20s bytes; the limit is %zu (--body-limit)",
                     cl, s->cfg.body_limit);
            return send_fail(s, c, path, 413, "invalid_request_error", "request_too_large", msg);
        }
        pthread_mutex_lock(&s->mu);
        const bool draining = s->draining;
        pthread_mutex_unlock(&s->mu);
        if (draining && path->h != H_HEALTH)
            return send_fail(s, c, path, 503, "unavailable_error", NULL,
                             "the server is shutting down");
        q->answered = false;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!q->answered && !q->too_big) {
            if (q->body.len + *upload_size > s->cfg.body_limit) q->too_big = true;
            else sb_add(&q->body, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (q->answered) return MHD_YES;
    q->answered = true;
    if (q->too_big || q->body.oom) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body exceeds the limit of %zu bytes (--body-limit)",
                 s->cfg.body_limit);
        return send_fail(s, c, q->rt, 413, "invalid_request_error", "request_too_large", msg);
    }
    return dispatch(s, c, q->rt, q);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    (void)c;
    (void)why;
    server *s = cls;
    conn_req *q = *con_cls;
    if (!q) return;
    sb_free(&q->body);
    free(q);
    *con_cls = NULL;
    pthread_mutex_lock(&s->mu);
    s->active_requests--;
    pthread_cond_broadcast(&s->drain_cv);
    pthread_mutex_unlock(&s->mu);
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (getenv("TERRACE_HTTP_LOG")) vfprintf(stderr, fmt, ap);
}

bool http_start(server *s, char *why, size_t cap) {
    char port[16];
    snprintf(port, sizeof port, "%d", s->cfg.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    const int g = getaddrinfo(s->cfg.host, port, &hints, &ai);
    if (g || !ai) {
        snprintf(why, cap, "--host %s: %s", s->cfg.host, gai_strerror(g));
        return false;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)s->cfg.port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)s->cfg.timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)256,
        MHD_OPTION_EXTERNAL_LOGGER, on_log, s, MHD_OPTION_END);
    const int e = errno;
    freeaddrinfo(ai);
    if (!s->mhd) {
        snprintf(why, cap, "cannot listen on %s:%d: %s", s->cfg.host, s->cfg.port,
                 e ? strerror(e) : "libmicrohttpd refused to start");
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    if (di && di->port) s->cfg.port = di->port;
    return true;
}

void http_quiesce(server *s) {
    const MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_stop(server *s) {
    if (s->mhd) MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}
