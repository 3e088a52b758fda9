/*
 * libFuzzer target for the template engine: an input is a template, optionally followed by a NUL
 * byte and the conversation as JSON (else a fixed one is used). It is parsed and rendered twice
 * with small step and memory limits; a failure must say why, a success must give the same valid
 * UTF-8 both times, and the output then goes through the reasoning splitter in pieces of a size
 * the input chooses, where the pieces must add up to what the splitter reports in total.
 *
 * build/run: make fuzz-jinja FUZZ_SECONDS=600   (corpus in fuzz/corpus-jinja)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char k_messages[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>x</think>Hello\", \"tool_calls\": [{\"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}, {\"role\": \"tool\", \"content\": \"{}\"}]";

static void split(const char *src, const char *text, size_t len, size_t piece, tr_reasoning_format fmt) {
    tr_error err;
    tr_reasoning *r = NULL;
    if (tr_reasoning_create_for(src, text, fmt, &r, &err)) abort();
    size_t got_r = 0, got_a = 0;
    tr_reasoning_delta d;
    for (size_t i = 0; i < len; i += piece) {
        const size_t n = len - i < piece ? len - i : piece;
        if (tr_reasoning_feed(r, text + i, n, &d, &err)) abort();
        got_r += d.reasoning_len;
        got_a += d.answer_len;
    }
    if (tr_reasoning_finish(r, &d, &err)) abort();
    got_r += d.reasoning_len;
    got_a += d.answer_len;
    size_t tot_r, tot_a;
    tr_reasoning_text(r, &tot_r);
    tr_reasoning_answer(r, &tot_a);
    if (got_r != tot_r || got_a != tot_a || tot_r + tot_a > len) abort();
    if (fmt == TR_REASONING_NONE && tot_a != len) abort();
    tr_reasoning_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    const size_t tlen = nul ? (size_t)(nul - data) : size;
    char *src = malloc(tlen + 1);
    if (!src) abort();
    memcpy(src, data, tlen);
    src[tlen] = '\0';
    char *msgs = NULL;
    if (nul) {
        const size_t mlen = size - tlen - 1;
        msgs = malloc(mlen + 1);
        if (!msgs) abort();
        memcpy(msgs, nul + 1, mlen);
        msgs[mlen] = '\0';
        if (strlen(msgs) != mlen) msgs[0] = '\0'; /* a second NUL: no messages */
    }
    tr_error err;
    err.msg[0] = '\0';
    tr_jinja *t = NULL;
    if (tr_jinja_parse(src, tlen, &t, &err)) {
        if (t || !err.msg[0]) abort();
        free(src);
        free(msgs);
        return 0;
    }
    tr_jinja_var vars[] = {
        {.name = "messages", .kind = TR_JINJA_JSON, .text = msgs && msgs[0] ? msgs : k_messages},
        {.name = "add_generation_prompt", .kind = TR_JINJA_BOOL, .b = tlen & 1},
        {.name = "bos_token", .kind = TR_JINJA_STRING, .text = "<s>"},
        {.name = "eos_token", .kind = TR_JINJA_STRING, .text = "</s>"},
        {.name = "tools", .kind = TR_JINJA_NONE},
    };
    tr_jinja_opts o = {.has_now = true, .max_steps = 200000, .max_bytes = (size_t)64 << 20};
    o.now.tm_year = 125;
    o.now.tm_mday = 15;
    char *out = NULL, *out2 = NULL;
    size_t len = 0, len2 = 0;
    const tr_status s1 = tr_jinja_render(t, vars, 5, &o, &out, &len, &err);
    if (s1 && (out || !err.msg[0])) abort();
    const tr_status s2 = tr_jinja_render(t, vars, 5, &o, &out2, &len2, &err);
    if (s1 != s2) abort();
    if (!s1) {
        if (len != len2 || memcmp(out, out2, len) || strlen(out) != len || !ju_valid(out, len)) abort();
        const size_t piece = 1 + (tlen % 7);
        split(src, out, len, piece, TR_REASONING_AUTO);
        split(src, out, len, piece, TR_REASONING_NONE);
    }
    free(out);
    free(out2);
    tr_jinja_free(t);
    free(src);
    free(msgs);
    return 0;
}
