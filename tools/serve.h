/*
 * terrace serve: an OpenAI- and Ollama-compatible HTTP server with continuous batching.
 *
 * Threads and ownership:
 *   - libmicrohttpd runs one thread per connection (serve_http.c). A request thread parses and
 *     validates the body, renders the chat template, tokenizes (serve_api.c), and submits a job;
 *     then it waits on the job, sending what the job has produced (SSE or NDJSON chunks, or one
 *     JSON document at the end), and watches its socket so that a client that goes away cancels
 *     its job.
 *   - One scheduler thread (serve_sched.c) owns the model, the slots (one session each) and the
 *     samplers: it admits queued jobs into free slots between steps and runs every step as one
 *     tr_batch_eval over all slots (one token for each generating slot, a prompt chunk for a
 *     prefilling one).
 *   - server.mu guards the queue, every job's shared fields and the stats; the forward pass runs
 *     without it.
 * A job is referenced by its request thread and, once submitted, by the scheduler; the last of the
 * two to let go frees it.
 */
#ifndef TR_TOOLS_SERVE_H
#define TR_TOOLS_SERVE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"

#define SERVE_MAX_STOP 16

/* ---------------------------------------------------------------------------------------------- */
/* a growable byte buffer (responses, chunks)                                                      */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom; /* an append failed: the content is incomplete */
} sbuf;

void sb_add(sbuf *b, const char *s, size_t n);
void sb_str(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(sbuf *b);

/* ---------------------------------------------------------------------------------------------- */
/* jobs                                                                                            */

typedef enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state;

typedef enum finish_reason {
    FINISH_NONE = 0,
    FINISH_STOP,      /* end of generation or a stop string */
    FINISH_LENGTH,    /* max_tokens or the context */
    FINISH_CANCELLED, /* the client went away */
    FINISH_SHUTDOWN,  /* the server is draining (SIGTERM): the answer is cut */
    FINISH_REFUSED,   /* never admitted: the server was draining */
    FINISH_ERROR,     /* the forward pass failed (job.error says why) */
} finish_reason;

typedef struct job {
    /* the request, fixed once submitted */
    int32_t *prompt;
    int32_t n_prompt;
    tr_sampler_params sampling;
    int32_t max_tokens; /* < 0: until the end of generation or of the context */
    bool ignore_eos;
    bool cache_prompt; /* reuse the slot's common prefix (llama-server's field; default true) */
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    double t_submit; /* now_ms() */
    /* the result, under server.mu */
    pthread_cond_t cv; /* admission, new text, the end */
    job_state state;
    finish_reason finish;
    char *text;     /* valid UTF-8 */
    size_t len, cap;
    size_t visible; /* bytes of text that are final (no stop string can begin in them) */
    int32_t n_gen;  /* tokens generated */
    int32_t n_reused; /* prompt tokens the slot already held */
    int slot;
    double t_start, t_first, t_end; /* admitted, first token, finished (now_ms) */
    double prefill_ms, decode_ms;   /* time of the steps that prefilled / decoded it */
    /* the steps that held a chunk of its prompt, and the tokens the other slots' decode rows
     * generated in them (a long prompt's prefill does not stall the others) */
    int32_t prefill_steps, beside_tokens;
    char error[256];
    bool cancel; /* the client went away: finish at the next step */
    int refs;
    /* the scheduler's own: the bytes of a UTF-8 sequence the next token completes */
    char raw[8];
    size_t n_raw;
} job;

/* ---------------------------------------------------------------------------------------------- */
/* counters: one struct; /metrics and /telemetry both print it (serve_stats.c)                      */

enum { ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_MODELS, ROUTE_OLLAMA_CHAT, ROUTE_OLLAMA_GENERATE,
       ROUTE_OLLAMA_TAGS, ROUTE_OLLAMA_VERSION, ROUTE_HEALTH, ROUTE_METRICS, ROUTE_TELEMETRY,
       ROUTE_PAGE, ROUTE_OTHER, ROUTE_COUNT };
enum { CODE_200, CODE_400, CODE_401, CODE_404, CODE_405, CODE_413, CODE_500, CODE_503,
       CODE_COUNT };
#define TTFT_BUCKETS 10
#define RATE_WINDOW 64

typedef struct serve_stats {
    uint64_t requests[ROUTE_COUNT][CODE_COUNT];
    uint64_t prompt_tokens, prompt_tokens_reused, gen_tokens;
    uint64_t finished[FINISH_ERROR + 1]; /* jobs by how they ended */
    uint64_t steps, step_rows, step_decode_rows;
    double step_ms;                      /* time in steps */
    uint64_t ttft_bucket[TTFT_BUCKETS];  /* cumulative counts at the bounds in serve_stats.c */
    uint64_t ttft_count;
    double ttft_sum_ms;
    /* recent decode rate: (time, generated tokens) after each step, a ring */
    double rate_t[RATE_WINDOW];
    uint64_t rate_n[RATE_WINDOW];
    int rate_pos, rate_len;
    /* taken by the scheduler after each step (its calls; readers see the copy) */
    tr_model_stats model;
    uint64_t kv_hot_bytes, kv_cold_bytes, kv_tokens;
} serve_stats;

/* ---------------------------------------------------------------------------------------------- */
/* the server                                                                                      */

typedef struct serve_config {
    gen_opts gen;         /* the run flags: model, -c -b -t, sampling defaults, --kv-*, ... */
    const char *host;     /* 127.0.0.1 */
    int port;             /* 8080 */
    int n_slots;          /* --parallel */
    const char *api_key;  /* NULL: no key */
    size_t body_limit;    /* bytes */
    int queue_max;        /* requests waiting for a slot before 503 */
    int32_t prefill_chunk; /* prompt tokens per step while other slots generate */
    const char *alias;    /* model id; NULL: the file's base name */
    int timeout_s;        /* idle connection timeout */
} serve_config;

typedef struct slot slot;

typedef struct server {
    serve_config cfg;
    loaded ld;
    char model_id[256];
    char model_file[256]; /* base name of the GGUF */
    tr_chat_template *tmpl; /* the chat template (serve_api.c); NULL: none */
    int32_t n_ctx;        /* per slot */
    int32_t chunk;        /* prompt tokens per chunk (--prefill-chunk, within the batch) */
    int32_t n_vocab;
    double started;       /* now_ms() at start, for uptime */
    long created;         /* time(NULL) at start */

    pthread_mutex_t mu;
    pthread_cond_t sched_cv; /* the scheduler waits here for work */
    pthread_cond_t drain_cv; /* signalled when a request ends (shutdown waits for none) */
    slot *slots;
    int n_slots;
    job **queue;          /* FIFO ring */
    int q_head, q_len;
    int active_requests;  /* HTTP requests in progress */
    bool draining;        /* SIGTERM: no new work, in-flight answers end at the next step */
    bool stop;            /* the scheduler exits */
    serve_stats st;
    uint64_t n_admitted;  /* admissions so far: prompt chunks go to the oldest first */
    pthread_t sched;
    bool sched_started;
    /* per-step arrays of the scheduler, sized once (n_slots + n_batch rows) */
    tr_session **b_sess;
    int32_t *b_ntok, *b_tok, *b_slot;
    bool *b_want;
    float *b_logits; /* [n_slots][n_vocab] */

    struct MHD_Daemon *mhd;
} server;

/* serve_sched.c */
tr_status sched_init(server *s, tr_error *err); /* slots, sessions, buffers; the plan fits */
bool sched_start(server *s);
void sched_stop(server *s);
void sched_free(server *s);
/* queues j (the scheduler takes a reference); false with a message when the queue is full or the
 * server is draining */
bool sched_submit(server *s, job *j, char *why, size_t cap);
job *job_new(void);
/* drops the caller's reference (marking the job cancelled if it has not ended); call with mu
 * held */
void job_release_locked(server *s, job *j);
void job_release(server *s, job *j);
int slots_busy_locked(const server *s);
/* per-slot figures for telemetry, under mu: state (0 idle, 1 prefill, 2 generating), tokens of
 * the current request, its decode rate */
void slot_figures_locked(const server *s, int i, int *state, int32_t *n_gen, double *tok_s);

/* serve_stats.c */
void stats_count_request(server *s, int route, int status);
void stats_after_step(server *s, double step_ms, int rows, int decode_rows); /* under mu */
void stats_ttft_locked(server *s, double ms);
void stats_prometheus(server *s, sbuf *out);
void stats_json(server *s, sbuf *out);
double stats_recent_tok_s_locked(const server *s);

/* serve_api.c: requests -> jobs, jobs -> responses */
typedef enum api_kind { API_CHAT, API_COMPLETION, API_OLLAMA_CHAT, API_OLLAMA_GENERATE } api_kind;

typedef struct api_error {
    int status;       /* HTTP status */
    const char *type; /* OpenAI's error type: invalid_request_error, ... */
    const char *code; /* NULL or a code: model_not_found, context_length_exceeded, ... */
    const char *param;
    char msg[512];
} api_error;

typedef struct api_req {
    api_kind kind;
    bool stream;
    bool include_usage;
    bool echo;
    char *echo_text; /* completions with echo: the prompt */
    job *j;
    char id[40];     /* chatcmpl-..., cmpl-... */
    long created;
    tr_reasoning *rs; /* chat: splits the reply into reasoning and answer; NULL: no split */
    struct cJSON *tools; /* chat: the request's tools (NULL: none); the reply's calls are parsed */
    sbuf held;       /* streaming with tools: answer text held back as a possible tool call */
    size_t emitted;  /* answer bytes already streamed */
    /* streaming state */
    size_t sent;     /* bytes of job text already sent */
    bool role_sent;
} api_req;

/* parses, validates and tokenizes; false with e filled (the caller answers e->status) */
bool api_parse(server *s, api_kind kind, const char *body, size_t len, api_req *r, api_error *e);
void api_req_free(api_req *r);

/* serve_tools.c: the tool calls in a reply's answer text as an OpenAI tool_calls array (Ollama's
 * shape with ollama), NULL if it holds none; *content: the text around them (malloc'd, NULL for
 * none). id_base makes the calls' ids. */
struct cJSON *tools_parse(const char *text, const struct cJSON *tools, const char *id_base,
                          bool ollama, char **content);
/* streaming: the offset in the answer so far (n bytes, `emitted` of them already sent) from which
 * text must be held back because a tool call may start there */
size_t tools_hold_from(const char *text, size_t n, size_t emitted);
void api_error_json(const api_error *e, sbuf *out);
/* a job's figures, copied under mu so that an answer can be written without it */
typedef struct job_view {
    finish_reason finish;
    int32_t n_prompt, n_gen, n_reused, prefill_steps, beside_tokens;
    double t_submit, t_start, t_first, t_end, prefill_ms, decode_ms;
    char error[256];
} job_view;
void job_view_locked(const job *j, job_view *v);

/* the complete answer of a finished job whose text is text[0..n) */
void api_response(server *s, api_req *r, const char *text, size_t n, const job_view *v,
                  sbuf *out);
/* the stream chunk for a piece of text (may be empty), and with `end` (not NULL: the job ended)
 * the final ones ([DONE] for OpenAI) */
void api_stream_chunk(server *s, api_req *r, const char *delta, size_t n, const job_view *end,
                      sbuf *out);
const char *api_stream_content_type(api_kind kind);
void api_models(server *s, bool ollama, sbuf *out);
/* the model's chat template (or --chat-template); false with why when there is none (chat
 * requests are then refused) */
bool api_template_init(server *s, char *why, size_t cap);
const char *api_template_name(const server *s);
void api_template_free(server *s);

/* serve_http.c */
bool http_start(server *s, char *why, size_t cap);
void http_quiesce(server *s);
void http_stop(server *s);

/* serve_page.c: the live page, served from memory */
extern const char serve_page_html[];
extern const unsigned serve_page_len;

double serve_rss_bytes(void);

#endif
