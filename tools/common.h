/*
 * What run, chat, bench and perplexity share: llama.cpp-style flags, loading a model with its
 * tokenizer (with a progress bar on a terminal), timing and memory figures.
 */
#ifndef TR_TOOLS_COMMON_H
#define TR_TOOLS_COMMON_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "cli.h"

typedef struct gen_opts {
    const char *model;
    const char *prompt;       /* -p */
    const char *prompt_file;  /* -f */
    const char *system;       /* -sys (chat) */
    const char *chat_template;
    int32_t n_predict;        /* -n; -1 = until end of generation or context */
    int32_t n_ctx, n_batch, n_threads;
    bool no_mmap, ignore_eos, no_display_prompt, escape, verbose;
    bool dry_run; /* run --dry-run: print the memory plan and exit */
    bool reasoning_none; /* chat --reasoning-format none */
    tr_sampler_params sampling;
    const char *stop[16];
    int n_stop;
    /* bench / perplexity */
    int32_t n_prompt_bench, n_gen_bench, reps;
    int32_t n_chunks; /* perplexity --chunks */
    bool json;
    const char *telemetry;   /* --telemetry FILE */
    const char *route_trace; /* --route-trace FILE */
    bool experts_mmap;
    bool probe_load; /* load_model: a load only to measure the model; the caller checks the flags */
    unsigned long long expert_cache, mem_budget; /* 0 = auto */
    uint64_t sessions_bytes; /* load_model: every session the caller will create (0: one of -c, -b) */
    const char *expert_policy;
    int expert_prefetch, io_threads;
    bool expert_lookahead;
    tr_kv_params kv;      /* the --kv-* and --csd* flags */
    bool jinja;           /* --jinja: run formats -p as a chat turn with the chat template */
    /* which flags the command line gave (bit = the flag's index), so that a flag given with its
     * default value is still checked against the command, policy and model it applies to */
    uint64_t given[2];
} gen_opts;

/* parses argv into o (defaults first); on a bad flag prints why and returns false */
bool gen_parse(int argc, char **argv, gen_opts *o, const char *cmd, void (*usage)(FILE *));
/* the flag list shared by the commands, for their --help */
void gen_print_common_flags(FILE *f);

typedef struct loaded {
    tr_model *model;
    const tr_tokenizer *tok; /* the model's */
    double load_ms;
    bool usage_error; /* load_model failed on flags the model does not use (exit 2) */
} loaded;

/* loads the model (its tokenizer with it); prints the error itself and returns false on failure,
 * also for a file without a vocabulary */
bool load_model(const gen_opts *o, loaded *out);
void unload_model(loaded *l);

/* tokenizes text into a malloc'd array; NULL with the reason in err on failure */
int32_t *tokenize_into(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                       bool parse_special, size_t *n, tr_error *err);
/* the same, printing the error */
int32_t *tokenize_alloc(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                        bool parse_special, size_t *n);
/* reads a whole file (at most 1 GiB; checks.h has the bounded form) into a malloc'd
 * NUL-terminated buffer; prints why not and returns NULL */
char *read_file(const char *path, size_t *len);

/* the KV cache's summary lines (nothing for the full policy), each line starting with prefix */
/* whether the command line gave the flag NAME (any of its spellings, e.g. "--kv-alpha") */
bool gen_given(const gen_opts *o, const char *name);
void print_kv_stats(FILE *f, const tr_session *s, const char *prefix);
/* what --kv-policy auto chose: always when it spilled to a cold pool, with -v when it is full */
void print_kv_note(const tr_session *s, bool verbose);
/* the memory plan, two lines */
void print_plan(FILE *f, const tr_mem_plan *pl, const char *prefix);
/* session parameters from -c, -b and the --kv-* flags */
tr_session_params session_params(const gen_opts *o);

/* Ctrl-C: after cli_catch_interrupt, SIGINT sets cli_interrupted instead of killing the process
 * (without SA_RESTART, so a blocking read returns EINTR); cli_abort_on_interrupt is the sessions'
 * abort callback, which stops an evaluation between chunks. */
extern volatile sig_atomic_t cli_interrupted;
void cli_catch_interrupt(void);
bool cli_abort_on_interrupt(void *user);
#define CLI_EXIT_INTERRUPT 130 /* as llama.cpp's tools */

double now_ms(void);
double peak_rss_mib(void);
/* the storage agent's peak RSS (its VmHWM: its own pages and those of the shared region it
 * touched), 0 without one or once it is gone */
double agent_peak_rss_mib(const tr_kv_stats *kv);
/* this process's plan without its margin, in MiB: the total less the margin and the storage
 * agent's own memory (its process, not this one's RSS) */
double plan_host_mib(const tr_mem_plan *pl);
double current_rss_mib(void);

/* progress bar on stderr when it is a terminal (done <= total); `final` ends the line */
void progress_bar(const char *what, uint64_t done, uint64_t total);

/* writes one token's text to stdout (through the stop-string filter of the caller) */
int piece_of(const tr_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif
