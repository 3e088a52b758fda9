#ifndef TR_TOOLS_GENERATE_H
#define TR_TOOLS_GENERATE_H

#include <signal.h>

#include "common.h"
#include "telemetry.h"

typedef struct gen_state {
    /* generated text and how much of it was handed to the sink */
    char *text;
    size_t len, cap, printed;
    bool (*sink)(void *user, const char *s, size_t n); /* false: the output failed (errno) */
    void *sink_user;
    int sink_errno; /* set when the sink failed: generation stops with an error */
    /* figures for the summary */
    int32_t n_prompt, n_gen, n_decoded, last_token;
    double prefill_ms, ttft_ms, decode_ms;
    const char *stopped_by;
    telem *tm; /* telemetry (JSON lines, status line), or NULL */
    /* the generated ids, in order (for a context shift, which re-evaluates them) */
    int32_t *ids;
    size_t n_ids, cap_ids;
    /* chat: stop between tokens once *interrupt is set (Ctrl-C; the session's abort callback
     * stops an eval in progress); stopped_by is then "interrupted" and `interrupted` true */
    const volatile sig_atomic_t *interrupt;
    bool interrupted;
    /* chat: called when the context is full after a token was sampled and before it is
     * evaluated; returns true if it made room and evaluated everything up to that token (logits
     * then follow it), false to stop with "context full" */
    bool (*on_full)(void *user, struct gen_state *g, float *logits);
    void *full_user;
} gen_state;

/* evaluates a prompt in chunks (progress bar when long); logits of its last token into logits.
 * false on an error (printed) or an interrupt (g->interrupted, not printed) */
bool gen_prefill(gen_state *g, tr_session *s, const int32_t *toks, size_t n, float *logits);
/* samples from `logits` on, streaming text to g->sink, until a stop condition */
bool gen_run(gen_state *g, const gen_opts *o, const loaded *ld, tr_session *s, tr_sampler *smp,
             float *logits);
void gen_summary(const gen_state *g, const loaded *ld, const tr_session *s);

#endif
