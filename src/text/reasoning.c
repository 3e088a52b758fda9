/*
 * The reasoning splitter (tr_reasoning_*): separates a streamed reply into reasoning and answer.
 *
 * Two formats, chosen from the template:
 * - harmony (gpt-oss): the reply is a sequence of messages
 *     <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>
 *   Text on the analysis channel is reasoning; final and commentary (tool calls and their
 *   preambles) are answer. Headers and markers are dropped.
 * - think tags (Qwen3, DeepSeek-R1 and every other template): <think>...</think> before any other
 *   text of the reply is reasoning; the prompt's end says whether the reply starts inside it
 *   (DeepSeek-R1's template ends the prompt with "<think>\n"). Whitespace at the edges of the
 *   reasoning and before the answer is dropped, as llama.cpp's --reasoning-format does.
 * Everything else is answer. The text is scanned as it arrives; a tail that may be the start of a
 * marker is held back until the next piece decides it, or until tr_reasoning_finish.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "text/chat.h"

typedef struct rbuf {
    char *p;
    size_t len, cap;
} rbuf;

enum {
    S_PASS,      /* everything is answer */
    S_START,     /* think tags: only whitespace so far; a <think> may come */
    S_THINK,     /* inside <think> */
    S_AFTER,     /* after </think>: whitespace before the answer is dropped */
    S_H_HEADER,  /* harmony: a message header, up to <|message|> */
    S_H_BODY,    /* harmony: a message body */
};

struct tr_reasoning {
    tr_reasoning_format fmt;
    bool harmony;
    int state;
    bool think_started; /* S_THINK: reasoning text seen (leading whitespace is dropped) */
    bool h_reasoning;   /* S_H_BODY: the channel is analysis */
    bool h_role;        /* S_H_HEADER: a role word may come first (after <|start|>) */
    size_t h_skip;      /* S_H_HEADER: bytes of the header that came from the prompt */
    bool failed;        /* out of memory once: every later call fails */
    rbuf pending;       /* text not decided yet */
    rbuf ws;            /* S_THINK: trailing whitespace held until more reasoning follows */
    rbuf header;        /* S_H_HEADER */
    rbuf all_reasoning, all_answer;
    rbuf d_reasoning, d_answer; /* this call's delta */
};

static bool put(rbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

static void emit(tr_reasoning *r, bool reasoning, const char *s, size_t n) {
    if (!n) return;
    if (reasoning) {
        if (!put(&r->d_reasoning, s, n) || !put(&r->all_reasoning, s, n)) r->failed = true;
    } else {
        if (!put(&r->d_answer, s, n) || !put(&r->all_answer, s, n)) r->failed = true;
    }
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* the earliest of the markers in s[0..n): its index in `marks` and offset, or -1 */
static int find_marker(const char *s, size_t n, const char *const *marks, size_t *at) {
    int best = -1;
    size_t best_at = n;
    for (int k = 0; marks[k]; k++) {
        const char *hit = memmem(s, n, marks[k], strlen(marks[k]));
        if (hit && (size_t)(hit - s) < best_at) {
            best_at = (size_t)(hit - s);
            best = k;
        }
    }
    *at = best_at;
    return best;
}

/* length of the longest tail of s[0..n) that is a proper prefix of a marker */
static size_t partial_tail(const char *s, size_t n, const char *const *marks) {
    size_t best = 0;
    for (int k = 0; marks[k]; k++) {
        const size_t m = strlen(marks[k]);
        for (size_t l = m - 1; l > best; l--)
            if (l <= n && !memcmp(s + n - l, marks[k], l)) {
                best = l;
                break;
            }
    }
    return best;
}

static const char *const THINK_CLOSE[] = {"</think>", NULL};
static const char *const H_HEADER_END[] = {"<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|start|>", NULL};
static const char *const H_BODY_END[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>", NULL};

/* the channel named in a harmony header ("assistant<|channel|>analysis", " to=x<|channel|>commentary json") */
static bool header_is_analysis(const rbuf *h) {
    const char *c = h->p ? memmem(h->p, h->len, "<|channel|>", 11) : NULL;
    if (!c) return false;
    c += 11;
    const size_t left = h->len - (size_t)(c - h->p);
    return left >= 8 && !memcmp(c, "analysis", 8) && (left == 8 || c[8] == ' ' || c[8] == '<');
}

/* a reasoning piece: leading whitespace dropped, trailing whitespace held until more follows */
static void think_text(tr_reasoning *r, const char *s, size_t n) {
    size_t i = 0;
    if (!r->think_started) {
        while (i < n && is_ws(s[i])) i++;
        if (i == n) return;
        r->think_started = true;
    }
    size_t end = n;
    while (end > i && is_ws(s[end - 1])) end--;
    if (end > i) {
        emit(r, true, r->ws.p, r->ws.len);
        r->ws.len = 0;
        emit(r, true, s + i, end - i);
    }
    if (!put(&r->ws, s + end, n - end)) r->failed = true;
}

/* consumes what it can decide of r->pending */
static void scan(tr_reasoning *r, bool final) {
    for (;;) {
        const char *s = r->pending.p ? r->pending.p : "";
        const size_t n = r->pending.len;
        size_t used = 0, at;
        int k;
        switch (r->state) {
        case S_PASS:
            emit(r, false, s, n);
            used = n;
            break;
        case S_START: {
            size_t i = 0;
            while (i < n && is_ws(s[i])) i++;
            if (i == n) {
                if (final) used = n; /* only whitespace: nothing to show */
                break;
            }
            const size_t left = n - i;
            if (left >= 7 && !memcmp(s + i, "<think>", 7)) {
                r->state = S_THINK;
                r->think_started = false;
                used = i + 7;
            } else if (!final && left < 7 && !memcmp(s + i, "<think>", left)) {
                used = 0; /* maybe <think>: wait */
            } else {
                r->state = S_PASS;
                used = i; /* leading whitespace of a plain reply is dropped */
            }
            break;
        }
        case S_THINK:
            k = find_marker(s, n, THINK_CLOSE, &at);
            if (k >= 0) {
                think_text(r, s, at);
                r->ws.len = 0;
                r->state = S_AFTER;
                used = at + 8;
            } else {
                const size_t keep = final ? 0 : partial_tail(s, n, THINK_CLOSE);
                think_text(r, s, n - keep);
                used = n - keep;
            }
            break;
        case S_AFTER: {
            size_t i = 0;
            while (i < n && is_ws(s[i])) i++;
            used = i;
            if (i < n) r->state = S_PASS;
            break;
        }
        case S_H_HEADER:
            k = find_marker(s, n, H_HEADER_END, &at);
            if (k < 0) {
                const size_t keep = final ? 0 : partial_tail(s, n, H_HEADER_END);
                if (!put(&r->header, s, n - keep)) r->failed = true;
                used = n - keep;
                /* a header goes on with <|channel|>, " to=..." or <|constrain|>, or begins with
                 * a role after <|start|>; anything else is plain text after all */
                const char *h = r->header.p ? r->header.p + r->h_skip : "";
                const size_t hn = r->header.len - r->h_skip;
                const bool plain = hn > 0 && !r->h_role && h[0] != '<' && h[0] != ' ';
                if (final || plain || hn > 512) {
                    emit(r, false, h, hn);
                    r->header.len = r->h_skip = 0;
                    r->state = S_PASS;
                }
                break;
            }
            if (!put(&r->header, s, at)) r->failed = true;
            used = at + strlen(H_HEADER_END[k]);
            if (k == 0) {
                r->h_reasoning = header_is_analysis(&r->header);
                r->state = S_H_BODY;
            }
            r->h_role = k == 4; /* after <|start|> comes a role */
            r->header.len = r->h_skip = 0;
            break;
        case S_H_BODY:
            k = find_marker(s, n, H_BODY_END, &at);
            if (k < 0) {
                const size_t keep = final ? 0 : partial_tail(s, n, H_BODY_END);
                emit(r, r->h_reasoning, s, n - keep);
                used = n - keep;
                break;
            }
            emit(r, r->h_reasoning, s, at);
            used = at + strlen(H_BODY_END[k]);
            r->state = S_H_HEADER;
            r->h_role = k == 3;
            r->header.len = r->h_skip = 0;
            break;
        }
        if (used == 0) return;
        memmove(r->pending.p, r->pending.p + used, n - used);
        r->pending.len = n - used;
        r->pending.p[r->pending.len] = '\0';
        if (r->pending.len == 0 && r->state != S_START && r->state != S_AFTER) return;
    }
}

static void deltas(tr_reasoning *r, tr_reasoning_delta *out) {
    if (!out) return;
    out->reasoning = r->d_reasoning.p ? r->d_reasoning.p : "";
    out->reasoning_len = r->d_reasoning.len;
    out->answer = r->d_answer.p ? r->d_answer.p : "";
    out->answer_len = r->d_answer.len;
}

/* the last occurrence of needle in s, or NULL (one pass: prompts can be megabytes) */
static const char *last_of(const char *s, const char *needle) {
    if (!s) return NULL;
    const size_t n = strlen(s), m = strlen(needle);
    for (size_t i = n >= m ? n - m + 1 : 0; i-- > 0;)
        if (s[i] == needle[0] && !memcmp(s + i, needle, m)) return s + i;
    return NULL;
}

/* the state a reply starts in, from the end of its prompt */
static void start_state(tr_reasoning *r, const char *prompt) {
    r->pending.len = r->ws.len = r->header.len = 0;
    r->all_reasoning.len = r->all_answer.len = 0;
    if (r->all_reasoning.p) r->all_reasoning.p[0] = '\0';
    if (r->all_answer.p) r->all_answer.p[0] = '\0';
    r->think_started = false;
    r->h_reasoning = false;
    r->h_role = false;
    r->h_skip = 0;
    if (r->fmt == TR_REASONING_NONE) {
        r->state = S_PASS;
        return;
    }
    if (r->harmony) {
        /* the reply continues the prompt's last message: <|start|>assistant... */
        r->state = S_H_HEADER;
        const char *last = last_of(prompt, "<|start|>");
        if (last) {
            const char *tail = last + 9;
            const char *msg = strstr(tail, "<|message|>");
            if (msg) {
                if (!put(&r->header, tail, (size_t)(msg - tail))) r->failed = true;
                r->h_reasoning = header_is_analysis(&r->header);
                r->header.len = 0;
                r->state = S_H_BODY;
            } else {
                if (!put(&r->header, tail, strlen(tail))) r->failed = true;
                r->h_skip = r->header.len;
                r->h_role = r->header.len == 0;
            }
        }
        return;
    }
    r->state = S_START;
    const char *open = last_of(prompt, "<think>"), *close = last_of(prompt, "</think>");
    if (open && (!close || close < open)) {
        r->state = S_THINK;
        /* text already in the prompt after <think> counts as started reasoning */
        for (const char *p = open + 7; *p; p++)
            if (!is_ws(*p)) r->think_started = true;
    }
}

tr_status tr_reasoning_create_for(const char *src, const char *prompt, tr_reasoning_format fmt,
                                  tr_reasoning **out, tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_reasoning_create: out is NULL");
    *out = NULL;
    if (fmt != TR_REASONING_AUTO && fmt != TR_REASONING_NONE)
        return tr_fail(err, TR_E_ARG, "tr_reasoning_create: unknown format %d", (int)fmt);
    tr_reasoning *r = calloc(1, sizeof *r);
    if (!r) return tr_fail(err, TR_E_NOMEM, "out of memory");
    r->fmt = fmt;
    r->harmony = src && strstr(src, "<|channel|>") && strstr(src, "<|start|>");
    start_state(r, prompt);
    if (r->failed) {
        tr_reasoning_free(r);
        return tr_fail(err, TR_E_NOMEM, "out of memory");
    }
    *out = r;
    return TR_OK;
}

tr_status tr_reasoning_reset(tr_reasoning *r, const char *prompt, tr_error *err) {
    if (!r) return tr_fail(err, TR_E_ARG, "tr_reasoning_reset: no splitter");
    r->failed = false;
    start_state(r, prompt);
    return r->failed ? tr_fail(err, TR_E_NOMEM, "out of memory") : TR_OK;
}

tr_status tr_reasoning_feed(tr_reasoning *r, const char *text, size_t len, tr_reasoning_delta *out,
                            tr_error *err) {
    if (!r || (len && !text)) return tr_fail(err, TR_E_ARG, "tr_reasoning_feed: bad arguments");
    r->d_reasoning.len = r->d_answer.len = 0;
    if (!r->failed && !put(&r->pending, text ? text : "", len)) r->failed = true;
    if (!r->failed) scan(r, false);
    if (r->failed) return tr_fail(err, TR_E_NOMEM, "out of memory separating reasoning");
    deltas(r, out);
    return TR_OK;
}

tr_status tr_reasoning_finish(tr_reasoning *r, tr_reasoning_delta *out, tr_error *err) {
    if (!r) return tr_fail(err, TR_E_ARG, "tr_reasoning_finish: no splitter");
    r->d_reasoning.len = r->d_answer.len = 0;
    if (!r->failed) scan(r, true);
    if (r->failed) return tr_fail(err, TR_E_NOMEM, "out of memory separating reasoning");
    deltas(r, out);
    return TR_OK;
}

const char *tr_reasoning_text(const tr_reasoning *r, size_t *len) {
    if (len) *len = r && r->all_reasoning.p ? r->all_reasoning.len : 0;
    return r && r->all_reasoning.p ? r->all_reasoning.p : "";
}

const char *tr_reasoning_answer(const tr_reasoning *r, size_t *len) {
    if (len) *len = r && r->all_answer.p ? r->all_answer.len : 0;
    return r && r->all_answer.p ? r->all_answer.p : "";
}

void tr_reasoning_free(tr_reasoning *r) {
    if (!r) return;
    free(r->pending.p);
    free(r->ws.p);
    free(r->header.p);
    free(r->all_reasoning.p);
    free(r->all_answer.p);
    free(r->d_reasoning.p);
    free(r->d_answer.p);
    free(r);
}
