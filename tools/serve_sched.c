/*
 * The scheduler of terrace serve: continuous batching over --parallel slots.
 *
 * A step is one tr_batch_eval: one token for every slot that is generating and, in the room left
 * in the batch, chunks of the prompts of slots being prefilled, oldest first. A prompt is cut at
 * every multiple of --prefill-chunk of its positions (and at its end), whatever else the step
 * holds: tr_batch_eval computes a chunk as its session alone would, and the kernels it uses
 * depend on the chunk's length (the gemm from gemm_min_m rows on), so a prompt's chunks must not
 * depend on the others. A chunk that does not fit the room left waits for the next step; the batch
 * always holds the oldest one next to every other slot's decode row. Jobs join between
 * steps: a queued job takes the free slot whose cached tokens share the longest prefix with its
 * prompt (its conversation so far), that prefix is kept in the session's KV and only the rest is
 * evaluated. A job leaves when it ends, when its client goes away (cancel, seen at the next step)
 * or when the server drains.
 *
 * Every row of a step computes what its session alone would (tr_batch_eval), so a greedy answer
 * does not depend on what else is being served.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

typedef enum slot_state { SLOT_IDLE, SLOT_PREFILL, SLOT_GEN } slot_state;

struct slot {
    tr_session *sess;
    tr_sampler *smp;
    int32_t *held;  /* [n_ctx] the tokens in the session's KV, for prefix reuse */
    int32_t n_held; /* == tr_session_n_past(sess) */
    uint8_t *start; /* [n_ctx] 1 where one evaluation of the held tokens began (a chunk, a decode
                       row): a prefix kept up to such a position leaves the rest to be computed
                       in the chunks it was computed in before */
    job *j;
    slot_state st;
    int32_t n_fed;  /* prompt tokens in the session (reused + prefilled) */
    int32_t n_kept; /* of them, reused from the slot's previous conversation */
    int32_t next;   /* SLOT_GEN: the sampled token the next step evaluates */
    uint64_t used;  /* the step it was last given a job, for least-recently-used choice */
    uint64_t admitted; /* admission order, for prefilling oldest first */
    double tok_s;   /* decode rate of the current request (exponential average) */
    double t_last;  /* time of its last token */
};

job *job_new(void) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    pthread_cond_init(&j->cv, NULL);
    j->refs = 1;
    j->slot = -1;
    j->max_tokens = -1;
    j->cache_prompt = true;
    return j;
}

static void job_free(job *j) {
    pthread_cond_destroy(&j->cv);
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    free(j->text);
    free(j);
}

void job_release_locked(server *s, job *j) {
    (void)s;
    if (j->state != JOB_DONE) j->cancel = true;
    if (--j->refs == 0) job_free(j);
}

void job_release(server *s, job *j) {
    pthread_mutex_lock(&s->mu);
    job_release_locked(s, j);
    pthread_mutex_unlock(&s->mu);
}

void job_view_locked(const job *j, job_view *v) {
    v->finish = j->finish;
    v->n_prompt = j->n_prompt;
    v->n_gen = j->n_gen;
    v->n_reused = j->n_reused;
    v->prefill_steps = j->prefill_steps;
    v->beside_tokens = j->beside_tokens;
    v->t_submit = j->t_submit;
    v->t_start = j->t_start;
    v->t_first = j->t_first;
    v->t_end = j->t_end;
    v->prefill_ms = j->prefill_ms;
    v->decode_ms = j->decode_ms;
    memcpy(v->error, j->error, sizeof v->error);
}

int slots_busy_locked(const server *s) {
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) n += s->slots[i].st != SLOT_IDLE;
    return n;
}

void slot_figures_locked(const server *s, int i, int *state, int32_t *n_gen, double *tok_s) {
    const slot *sl = &s->slots[i];
    *state = (int)sl->st;
    /* the job pointer is the scheduler's, but a job is only freed under mu after it left */
    *n_gen = sl->j ? sl->j->n_gen : 0;
    *tok_s = sl->st == SLOT_GEN ? sl->tok_s : 0.0;
}

bool sched_submit(server *s, job *j, char *why, size_t cap) {
    pthread_mutex_lock(&s->mu);
    bool ok = false;
    if (s->draining) {
        snprintf(why, cap, "the server is shutting down");
    } else if (s->q_len >= s->cfg.queue_max) {
        snprintf(why, cap, "the server is busy: all %d slots are generating and %d requests are "
                 "waiting (the queue's limit, --queue)", s->n_slots, s->q_len);
    } else {
        j->t_submit = now_ms();
        j->state = JOB_QUEUED;
        j->refs++;
        s->queue[(s->q_head + s->q_len) % s->cfg.queue_max] = j;
        s->q_len++;
        pthread_cond_signal(&s->sched_cv);
        ok = true;
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* ---------------------------------------------------------------------------------------------- */
/* text: pieces -> valid UTF-8 -> what may be shown (stop strings), under mu                       */

static bool text_reserve(job *j, size_t more) {
    if (j->len + more + 1 <= j->cap) return true;
    size_t cap = j->cap ? j->cap * 2 : 1024;
    while (cap < j->len + more + 1) cap *= 2;
    char *t = realloc(j->text, cap);
    if (!t) return false;
    j->text = t;
    j->cap = cap;
    return true;
}

/* appends a token's bytes; returns true if a stop string ended the text */
static bool text_add(job *j, const char *piece, size_t n, bool final) {
    char buf[600];
    size_t m = 0;
    if (j->n_raw + n > sizeof buf) n = sizeof buf - j->n_raw; /* pieces are short */
    memcpy(buf, j->raw, j->n_raw);
    memcpy(buf + j->n_raw, piece, n);
    m = j->n_raw + n;
    const size_t whole = final ? m : cli_utf8_complete(buf, m);
    if (!text_reserve(j, whole * 3)) {
        snprintf(j->error, sizeof j->error, "out of memory for the answer's text");
        return true;
    }
    j->len += cli_utf8_clean_into(j->text + j->len, buf, whole);
    j->text[j->len] = '\0';
    j->n_raw = m - whole;
    memmove(j->raw, buf + whole, j->n_raw);
    bool stopped;
    const size_t end = cli_stop_scan(j->text, j->len, j->visible, (const char *const *)j->stop,
                                     j->n_stop, final, &stopped);
    if (stopped) { /* what follows the stop string, held bytes included, is dropped */
        j->len = end;
        j->text[end] = '\0';
        j->n_raw = 0;
    }
    if (end > j->visible) j->visible = end;
    return stopped;
}

/* ---------------------------------------------------------------------------------------------- */

static void finish_locked(server *s, slot *sl, finish_reason why) {
    job *j = sl->j;
    text_add(j, "", 0, true); /* what was held back (a partial stop string, a cut character) */
    j->visible = j->len;
    j->finish = why;
    j->t_end = now_ms();
    j->state = JOB_DONE;
    s->st.finished[why]++;
    pthread_cond_broadcast(&j->cv);
    job_release_locked(s, j);
    tr_sampler_free(sl->smp);
    sl->smp = NULL;
    sl->j = NULL;
    sl->st = SLOT_IDLE;
    pthread_cond_broadcast(&s->drain_cv);
}

static int32_t common_prefix(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* queued jobs into free slots (the one holding the longest prefix of the prompt, else the least
 * recently used); under mu */
static void admit_locked(server *s, uint64_t step) {
    while (s->q_len > 0) {
        job *j = s->queue[s->q_head];
        if (j->cancel || s->draining) {
            s->q_head = (s->q_head + 1) % s->cfg.queue_max;
            s->q_len--;
            j->finish = j->cancel ? FINISH_CANCELLED : FINISH_REFUSED;
            j->state = JOB_DONE;
            j->t_end = now_ms();
            s->st.finished[j->finish]++;
            pthread_cond_broadcast(&j->cv);
            job_release_locked(s, j);
            continue;
        }
        int best = -1;
        int32_t best_lcp = -1;
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->st != SLOT_IDLE) continue;
            const int32_t lcp = common_prefix(sl->held, sl->n_held, j->prompt, j->n_prompt);
            if (lcp > best_lcp || (lcp == best_lcp && sl->used < s->slots[best].used)) {
                best = i;
                best_lcp = lcp;
            }
        }
        if (best < 0) return;
        slot *sl = &s->slots[best];
        tr_error err = {0};
        tr_sampler_params sp = j->sampling;
        if (sp.repeat_last_n < 0) sp.repeat_last_n = s->n_ctx;
        if (tr_sampler_create(&sp, s->n_vocab, &sl->smp, &err)) {
            /* validated when parsed; only memory can fail here */
            s->q_head = (s->q_head + 1) % s->cfg.queue_max;
            s->q_len--;
            snprintf(j->error, sizeof j->error, "%.250s", err.msg);
            j->finish = FINISH_ERROR;
            j->state = JOB_DONE;
            s->st.finished[FINISH_ERROR]++;
            pthread_cond_broadcast(&j->cv);
            job_release_locked(s, j);
            continue;
        }
        s->q_head = (s->q_head + 1) % s->cfg.queue_max;
        s->q_len--;
        /* keep the common prefix; at least the prompt's last token is evaluated, for its logits;
         * none with cache_prompt false (the answer then depends on the request alone, not on
         * what the slot held: a reused row was computed as part of another request) */
        int32_t keep = j->cache_prompt ? best_lcp : 0;
        if (keep >= j->n_prompt) keep = j->n_prompt - 1;
        /* from where an evaluation began: a request repeated gets its chunks again (the kernels
         * depend on a chunk's length), so the same answer */
        while (keep > 0 && !sl->start[keep]) keep--;
        tr_session_truncate(sl->sess, keep, &err);
        sl->n_held = keep;
        sl->n_fed = sl->n_kept = keep;
        for (int32_t i = 0; i < j->n_prompt; i++) tr_sampler_accept(sl->smp, j->prompt[i]);
        sl->j = j;
        sl->st = SLOT_PREFILL;
        sl->used = step;
        sl->admitted = ++s->n_admitted;
        sl->tok_s = 0;
        j->slot = best;
        j->n_reused = keep;
        j->state = JOB_RUNNING;
        j->t_start = now_ms();
        s->st.prompt_tokens += (uint64_t)j->n_prompt;
        s->st.prompt_tokens_reused += (uint64_t)keep;
        pthread_cond_broadcast(&j->cv);
    }
}

/* what a sampled token does to its job; under mu */
static void take_token(server *s, slot *sl, int32_t tok, double now) {
    job *j = sl->j;
    if (j->n_gen == 0) {
        j->t_first = now;
        stats_ttft_locked(s, now - j->t_submit);
    } else if (sl->t_last > 0) {
        const double dt = now - sl->t_last;
        const double rate = dt > 0 ? 1e3 / dt : 0;
        sl->tok_s = sl->tok_s > 0 ? 0.8 * sl->tok_s + 0.2 * rate : rate;
    }
    sl->t_last = now;
    if (!j->ignore_eos && tr_token_is_eog(s->ld.tok, tok)) {
        finish_locked(s, sl, FINISH_STOP);
        return;
    }
    tr_sampler_accept(sl->smp, tok);
    j->n_gen++;
    s->st.gen_tokens++;
    char piece[512];
    const int n = piece_of(s->ld.tok, tok, piece, sizeof piece);
    if (text_add(j, piece, (size_t)n, false)) {
        finish_locked(s, sl, j->error[0] ? FINISH_ERROR : FINISH_STOP);
        return;
    }
    if (j->max_tokens >= 0 && j->n_gen >= j->max_tokens) {
        finish_locked(s, sl, FINISH_LENGTH);
        return;
    }
    if (sl->n_held >= s->n_ctx) { /* the token cannot be evaluated: the context is full */
        finish_locked(s, sl, FINISH_LENGTH);
        return;
    }
    sl->next = tok;
    sl->st = SLOT_GEN;
    pthread_cond_broadcast(&j->cv);
}

static int by_admission(const void *a, const void *b) {
    const slot *x = *(slot *const *)a, *y = *(slot *const *)b;
    return x->admitted < y->admitted ? -1 : x->admitted > y->admitted;
}

/* the next chunk of a prefilling slot's prompt: to the next multiple of the chunk size, or to
 * the prompt's end */
static int32_t chunk_of(const server *s, const slot *sl) {
    const int32_t take = (sl->n_fed / s->chunk + 1) * s->chunk - sl->n_fed;
    return take < sl->j->n_prompt - sl->n_fed ? take : sl->j->n_prompt - sl->n_fed;
}

/* the prompt still to prefill is its first chunk and its last */
static bool one_chunk(const server *s, const slot *sl) {
    return sl->n_fed == sl->n_kept && chunk_of(s, sl) == sl->j->n_prompt - sl->n_fed;
}

/* steps of one-chunk prompts alone in a row before the decode rows get one (sched_main) */
#define FIRST_RUN_MAX 2

static void *sched_main(void *arg) {
    server *s = arg;
    const int32_t n_batch = tr_session_n_ctx(s->slots[0].sess) < s->cfg.gen.n_batch
                                ? tr_session_n_ctx(s->slots[0].sess)
                                : s->cfg.gen.n_batch;
    slot **pre = calloc((size_t)s->n_slots, sizeof *pre);
    int32_t *sampled = calloc((size_t)s->n_slots, sizeof *sampled);
    uint64_t step = 0;
    int first_run = 0; /* the steps before held only one-chunk prompts, this many in a row */
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        admit_locked(s, step);
        /* cancelled and (when draining) every running job leaves before the step */
        for (int i = 0; i < s->n_slots; i++) {
            slot *sl = &s->slots[i];
            if (sl->st == SLOT_IDLE) continue;
            if (sl->j->cancel) finish_locked(s, sl, FINISH_CANCELLED);
            else if (s->draining) finish_locked(s, sl, FINISH_SHUTDOWN);
        }
        if (!slots_busy_locked(s)) {
            if (s->q_len == 0) pthread_cond_wait(&s->sched_cv, &s->mu);
            continue;
        }
        /* the step: generating slots first (one row each), then prompt chunks, oldest first.
         * A prompt that is one chunk gets a step of its own, without the decode rows, unless
         * the FIRST_RUN_MAX steps before were such steps: the request's first token then waits
         * for its chunk alone instead of the chunk and every other slot's decode row, and the
         * others lose little time (the two steps cost about what the step with both does) while
         * at least one step in FIRST_RUN_MAX + 1 still decodes them, so a burst of prompts never
         * stalls them. Two in a row: a prompt that arrives while another's first step runs does
         * not also wait for a whole decode step. A longer prompt's chunks all go beside the
         * decode rows. */
        int n = 0, rows = 0, n_pre = 0, n_dec = 0, n_gen = 0;
        for (int i = 0; i < s->n_slots; i++) {
            if (s->slots[i].st == SLOT_GEN) n_gen++;
            else if (s->slots[i].st == SLOT_PREFILL) pre[n_pre++] = &s->slots[i];
        }
        qsort(pre, (size_t)n_pre, sizeof *pre, by_admission);
        bool first_only = false;
        if (n_gen > 0 && first_run < FIRST_RUN_MAX)
            for (int k = 0; k < n_pre && !first_only; k++)
                first_only = one_chunk(s, pre[k]);
        first_run = first_only ? first_run + 1 : 0;
        for (int i = 0; i < s->n_slots && !first_only; i++) {
            slot *sl = &s->slots[i];
            if (sl->st != SLOT_GEN) continue;
            s->b_sess[n] = sl->sess;
            s->b_ntok[n] = 1;
            s->b_want[n] = true;
            s->b_slot[n] = i;
            s->b_tok[rows++] = sl->next;
            n++;
            n_dec++;
        }
        int32_t room = n_batch - rows;
        for (int k = 0; k < n_pre && room > 0; k++) {
            slot *sl = pre[k];
            const job *j = sl->j;
            const int32_t take = chunk_of(s, sl);
            if (first_only && !one_chunk(s, sl)) continue;
            if (take > room) continue;
            s->b_sess[n] = sl->sess;
            s->b_ntok[n] = take;
            s->b_want[n] = sl->n_fed + take == j->n_prompt;
            s->b_slot[n] = (int)(sl - s->slots);
            memcpy(s->b_tok + rows, j->prompt + sl->n_fed, (size_t)take * sizeof(int32_t));
            rows += take;
            room -= take;
            n++;
        }
        pthread_mutex_unlock(&s->mu);

        tr_error err = {0};
        const double t0 = now_ms();
        const tr_status st = tr_batch_eval(s->b_sess, s->b_ntok, n, s->b_tok, s->b_want,
                                           s->b_logits, &err);
        const double t1 = now_ms(), dt = t1 - t0;
        /* sample outside the lock: the samplers are the slots' own */
        if (st == TR_OK)
            for (int b = 0, w = 0; b < n; b++)
                if (s->b_want[b]) {
                    slot *sl = &s->slots[s->b_slot[b]];
                    sampled[b] = tr_sampler_sample(sl->smp, s->b_logits + (size_t)w * s->n_vocab);
                    w++;
                }
        /* the scheduler's own calls into the model and sessions, copied for the readers */
        tr_model_stats ms;
        tr_model_get_stats(s->ld.model, &ms);
        uint64_t hot = 0, cold = 0, tokens = 0;
        for (int i = 0; i < s->n_slots; i++) {
            tr_kv_stats kv;
            tr_session_get_kv_stats(s->slots[i].sess, &kv);
            hot += kv.hot_bytes;
            cold += kv.cold_bytes;
            tokens += (uint64_t)(kv.tokens > 0 ? kv.tokens : 0);
        }

        pthread_mutex_lock(&s->mu);
        step++;
        s->st.model = ms;
        s->st.kv_hot_bytes = hot;
        s->st.kv_cold_bytes = cold;
        s->st.kv_tokens = tokens;
        for (int b = 0, off = 0; b < n; off += s->b_ntok[b], b++) {
            slot *sl = &s->slots[s->b_slot[b]];
            job *j = sl->j;
            if (st != TR_OK) {
                snprintf(j->error, sizeof j->error, "%.250s", err.msg);
                tr_error e2;
                tr_session_truncate(sl->sess, sl->n_held, &e2);
                finish_locked(s, sl, FINISH_ERROR);
                continue;
            }
            memcpy(sl->held + sl->n_held, s->b_tok + off, (size_t)s->b_ntok[b] * sizeof(int32_t));
            memset(sl->start + sl->n_held, 0, (size_t)s->b_ntok[b]);
            sl->start[sl->n_held] = 1;
            sl->n_held += s->b_ntok[b];
            if (sl->st == SLOT_GEN) {
                j->decode_ms += dt;
                take_token(s, sl, sampled[b], t1);
            } else {
                sl->n_fed += s->b_ntok[b];
                j->prefill_ms += dt;
                j->prefill_steps++;
                j->beside_tokens += n_dec; /* every decode row is another slot's */
                if (sl->n_fed == j->n_prompt) {
                    if (j->max_tokens == 0) finish_locked(s, sl, FINISH_LENGTH);
                    else take_token(s, sl, sampled[b], t1);
                }
            }
        }
        stats_after_step(s, dt, rows, n_dec);
    }
    pthread_mutex_unlock(&s->mu);
    free(pre);
    free(sampled);
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */

tr_status sched_init(server *s, tr_error *err) {
    s->n_slots = s->cfg.n_slots;
    s->slots = calloc((size_t)s->n_slots, sizeof *s->slots);
    s->queue = calloc((size_t)s->cfg.queue_max, sizeof *s->queue);
    const tr_session_params sp = session_params(&s->cfg.gen);
    if (!s->slots || !s->queue) goto oom;
    for (int i = 0; i < s->n_slots; i++) {
        tr_status st = tr_session_create(s->ld.model, &sp, &s->slots[i].sess, err);
        if (st) return st;
    }
    s->n_ctx = tr_session_n_ctx(s->slots[0].sess);
    s->n_vocab = tr_model_n_vocab(s->ld.model);
    int32_t n_batch = s->cfg.gen.n_batch;
    if (n_batch > s->n_ctx) n_batch = s->n_ctx;
    s->cfg.gen.n_batch = n_batch;
    if (s->n_slots > n_batch) {
        err->status = TR_E_ARG;
        snprintf(err->msg, sizeof err->msg, "--parallel %d exceeds the batch size -b %d: every "
                 "generating slot takes a row of each step", s->n_slots, n_batch);
        return TR_E_ARG;
    }
    /* the prompt chunk: room for it next to every other slot's decode row */
    s->chunk = s->cfg.prefill_chunk < n_batch - (s->n_slots - 1) ? s->cfg.prefill_chunk
                                                                 : n_batch - (s->n_slots - 1);
    for (int i = 0; i < s->n_slots; i++)
        if (!(s->slots[i].held = malloc(sizeof(int32_t) * (size_t)s->n_ctx)) ||
            !(s->slots[i].start = calloc((size_t)s->n_ctx, 1)))
            goto oom;
    const size_t n = (size_t)s->n_slots;
    s->b_sess = calloc(n, sizeof *s->b_sess);
    s->b_ntok = calloc(n, sizeof *s->b_ntok);
    s->b_slot = calloc(n, sizeof *s->b_slot);
    s->b_want = calloc(n, sizeof *s->b_want);
    s->b_tok = calloc((size_t)n_batch, sizeof *s->b_tok);
    s->b_logits = malloc(n * (size_t)s->n_vocab * sizeof(float));
    if (!s->b_sess || !s->b_ntok || !s->b_slot || !s->b_want || !s->b_tok || !s->b_logits)
        goto oom;
    return TR_OK;
oom:
    err->status = TR_E_NOMEM;
    snprintf(err->msg, sizeof err->msg, "out of memory creating the slots");
    return TR_E_NOMEM;
}

bool sched_start(server *s) {
    s->sched_started = pthread_create(&s->sched, NULL, sched_main, s) == 0;
    return s->sched_started;
}

void sched_stop(server *s) {
    if (!s->sched_started) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->sched_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->sched, NULL);
    s->sched_started = false;
}

void sched_free(server *s) {
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->j) job_release_locked(s, sl->j);
        tr_sampler_free(sl->smp);
        tr_session_free(sl->sess);
        free(sl->held);
        free(sl->start);
    }
    for (int k = 0; s->queue && k < s->q_len; k++)
        job_release_locked(s, s->queue[(s->q_head + k) % s->cfg.queue_max]);
    free(s->slots);
    free(s->queue);
    free(s->b_sess);
    free(s->b_ntok);
    free(s->b_slot);
    free(s->b_want);
    free(s->b_tok);
    free(s->b_logits);
    s->slots = NULL;
    s->queue = NULL;
}
