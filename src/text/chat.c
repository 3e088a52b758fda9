/*
 * Chat template detection and native formatting (see chat.h). Detection follows llama.cpp's
 * llm_chat_detect_template rule for rule and in the same order: the order matters (Phi-4 contains
 * <|im_start|> but is not chatml; Llama 4's <|header_start|> must not be read as anything else),
 * so every family llama.cpp knows is recognised here, and those terrace does not format are
 * reported by their llama.cpp name instead of being formatted as a near miss.
 * Formatting is not on the per-token path; it allocates one growing buffer per call.
 */
#include "text/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* ---- names ----------------------------------------------------------------------------------- */

static const char *const style_names[TR_CHAT_STYLE_COUNT] = {
    [TR_CHAT_CHATML] = "chatml",
    [TR_CHAT_LLAMA3] = "llama3",
    [TR_CHAT_GEMMA] = "gemma",
    [TR_CHAT_MISTRAL_V1] = "mistral-v1",
    [TR_CHAT_MISTRAL_V3] = "mistral-v3",
    [TR_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [TR_CHAT_MISTRAL_V7] = "mistral-v7",
    [TR_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [TR_CHAT_LLAMA2] = "llama2",
    [TR_CHAT_LLAMA2_SYS] = "llama2-sys",
    [TR_CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [TR_CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
};

#define STYLE_LIST                                                                                 \
    "chatml, llama3, gemma, mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7, "               \
    "mistral-v7-tekken, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip"

/* llama.cpp's --chat-template names that terrace does not format (for messages only). llama.cpp
 * also tries the template text as a name first, so these count as "recognised". */
static const char *const other_llama_names[] = {
    "phi3",         "phi4",      "falcon3",     "zephyr",         "monarch",       "orion",
    "openchat",     "vicuna",    "vicuna-orca", "deepseek",       "deepseek2",     "deepseek3",
    "deepseek-ocr", "command-r", "chatglm3",    "chatglm4",       "glmedge",       "minicpm",
    "exaone3",      "exaone4",   "exaone-moe",  "rwkv-world",     "granite",       "granite-4.0",
    "gigachat",     "megrez",    "yandex",      "bailing",        "bailing-think", "bailing2",
    "llama4",       "smolvlm",   "hunyuan-moe", "gpt-oss",        "hunyuan-dense", "hunyuan-ocr",
    "kimi-k2",      "seed_oss",  "grok-2",      "pangu-embedded", "solar-open",    "talkie",
};

const char *tr_chat_style_name(tr_chat_style style) {
    return (unsigned)style < TR_CHAT_STYLE_COUNT ? style_names[style] : "?";
}

const char *tr_chat_style_list(void) { return STYLE_LIST; }

bool tr_chat_style_from_name(const char *name, tr_chat_style *out) {
    if (!name) return false;
    for (int i = 0; i < TR_CHAT_STYLE_COUNT; i++) {
        if (strcmp(name, style_names[i]) == 0) {
            if (out) *out = (tr_chat_style)i;
            return true;
        }
    }
    return false;
}

/* ---- detection ------------------------------------------------------------------------------- */

static bool has(const char *t, const char *needle) { return strstr(t, needle) != NULL; }

/*
 * llama.cpp's family name for a template text, or NULL if llama.cpp would not recognise it
 * either. Rules and order as llm_chat_detect_template (src/llama-chat.cpp, 2025/26).
 */
static const char *llama_family(const char *t) {
    for (int i = 0; i < TR_CHAT_STYLE_COUNT; i++)
        if (strcmp(t, style_names[i]) == 0) return style_names[i];
    for (size_t i = 0; i < sizeof other_llama_names / sizeof other_llama_names[0]; i++)
        if (strcmp(t, other_llama_names[i]) == 0) return other_llama_names[i];

    if (has(t, "<|im_start|>")) {
        if (has(t, "<|im_sep|>")) return "phi4";
        if (has(t, "<end_of_utterance>")) return "smolvlm"; /* <|im_start|> as BOS only */
        return "chatml";
    }
    if (strncmp(t, "mistral", 7) == 0 || has(t, "[INST]")) {
        if (has(t, "[SYSTEM_PROMPT]")) return "mistral-v7";
        /* Mistral's official v1 template, or v3 / v3-tekken (which carry tool markers) */
        if (has(t, "' [INST] ' + system_message") || has(t, "[AVAILABLE_TOOLS]")) {
            if (has(t, " [INST]")) return "mistral-v1";
            if (has(t, "\"[INST]\"")) return "mistral-v3-tekken";
            return "mistral-v3";
        }
        /* Llama 2 and the older Mistral templates */
        if (has(t, "content.strip()")) return "llama2-sys-strip";
        if (has(t, "bos_token + '[INST]")) return "llama2-sys-bos";
        if (has(t, "<<SYS>>")) return "llama2-sys";
        return "llama2";
    }
    if (has(t, "<|assistant|>") && has(t, "<|end|>")) {
        if (has(t, "|>{{ message['content'] }}<|end|>") || has(t, "|>{{ m.content }}<|end|>"))
            return "talkie";
        return "phi3";
    }
    if (has(t, "[gMASK]<sop>")) return "chatglm4";
    if (has(t, "<|assistant|>") && has(t, "<|user|>")) {
        if (has(t, "<|tool_declare|>")) return "exaone-moe";
        return has(t, "</s>") ? "falcon3" : "glmedge";
    }
    if (has(t, "<|{{ item['role'] }}|>") && has(t, "<|begin_of_image|>")) return "glmedge";
    if (has(t, "<|user|>") && has(t, "<|endoftext|>")) return "zephyr";
    if (has(t, "bos_token + message['role']")) return "monarch";
    if (has(t, "<start_of_turn>")) return "gemma";
    if (has(t, "'\\n\\nAssistant: ' + eos_token")) return "orion";
    if (has(t, "GPT4 Correct ")) return "openchat";
    if (has(t, "USER: ") && has(t, "ASSISTANT: "))
        return has(t, "SYSTEM: ") ? "vicuna-orca" : "vicuna";
    if (has(t, "### Instruction:") && has(t, "<|EOT|>")) return "deepseek";
    if (has(t, "<|START_OF_TURN_TOKEN|>") && has(t, "<|USER_TOKEN|>")) return "command-r";
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) return "llama3";
    if (has(t, "[gMASK]sop")) return "chatglm3";
    if (has(t, "<用户>")) return "minicpm";
    if (has(t, "'Assistant: ' + message['content'] + eos_token")) return "deepseek2";
    if (has(t, "<｜Assistant｜>") && has(t, "<｜User｜>") && has(t, "<｜end▁of▁sentence｜>"))
        return "deepseek3";
    if (has(t, "[|system|]") && has(t, "[|assistant|]") && has(t, "[|endofturn|]"))
        return has(t, "[|tool|]") ? "exaone4" : "exaone3";
    if (has(t, "rwkv-world") || has(t, "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"))
        return "rwkv-world";
    if (has(t, "<|start_of_role|>"))
        return has(t, "<tool_call>") || has(t, "<tools>") ? "granite-4.0" : "granite";
    if (has(t, "message['role'] + additional_special_tokens[0] + message['content'] + "
               "additional_special_tokens[1]"))
        return "gigachat";
    if (has(t, "<|role_start|>")) return "megrez";
    if (has(t, " Ассистент:")) return "yandex";
    if (has(t, "<role>ASSISTANT</role>") && has(t, "'HUMAN'")) return "bailing";
    if (has(t, "<role>ASSISTANT</role>") && has(t, "\"HUMAN\"") && has(t, "<think>"))
        return "bailing-think";
    if (has(t, "<role>ASSISTANT</role>") && has(t, "<role>HUMAN</role>") && has(t, "<|role_end|>"))
        return "bailing2";
    if (has(t, "<|header_start|>") && has(t, "<|header_end|>")) return "llama4";
    if (has(t, "<|endofuserprompt|>")) return "dots1";
    if (has(t, "<|extra_0|>") && has(t, "<|extra_4|>")) return "hunyuan-moe";
    if (has(t, "<|start|>") && has(t, "<|channel|>")) return "gpt-oss";
    if (has(t, "<｜hy_Assistant｜>") && has(t, "<｜hy_begin▁of▁sentence｜>")) return "hunyuan-ocr";
    if (has(t, "<｜hy_Assistant｜>") && has(t, "<｜hy_place▁holder▁no▁3｜>"))
        return "hunyuan-dense";
    if (has(t, "<|im_assistant|>assistant<|im_middle|>")) return "kimi-k2";
    if (has(t, "<seed:bos>")) return "seed_oss";
    if (has(t, "'Assistant: '  + message['content'] + '<|separator|>")) return "grok-2";
    if (has(t, "[unused9]系统：[unused10]")) return "pangu-embedded";
    if (has(t, "<|begin|>") && has(t, "<|end|>") && has(t, "<|content|>")) return "solar-open";
    return NULL;
}

const char *tr_chat_family(const char *template_text) {
    return template_text ? llama_family(template_text) : NULL;
}

/* the first characters of a template for a message, cut at the first newline */
static int snippet_len(const char *t) {
    int n = 0;
    while (n < 48 && t[n] && t[n] != '\n') n++;
    return n;
}
static const char *snippet_more(const char *t) { return t[snippet_len(t)] ? "..." : ""; }

tr_status tr_chat_detect(const char *template_text, const char *override_name, tr_chat_style *out,
                         tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_chat_detect: out is NULL");
    if (override_name && override_name[0]) {
        if (tr_chat_style_from_name(override_name, out)) return TR_OK;
        /* as llama.cpp: a --chat-template value that is not a name is a template text */
        const char *fam = llama_family(override_name);
        if (fam && tr_chat_style_from_name(fam, out)) return TR_OK;
        if (fam)
            return tr_fail(err, TR_E_UNSUPPORTED,
                           "--chat-template '%.*s%s' is llama.cpp's '%s' style, which terrace "
                           "does not format; built-in names: " STYLE_LIST,
                           snippet_len(override_name), override_name, snippet_more(override_name),
                           fam);
        return tr_fail(err, TR_E_UNSUPPORTED,
                       "--chat-template '%.*s%s' is not a built-in name nor a template terrace "
                       "recognises; built-in names: " STYLE_LIST,
                       snippet_len(override_name), override_name, snippet_more(override_name));
    }
    if (!template_text || !template_text[0])
        return tr_fail(err, TR_E_UNSUPPORTED,
                       "the model has no chat template (tokenizer.chat_template); choose one with "
                       "--chat-template NAME, one of: " STYLE_LIST);
    const char *fam = llama_family(template_text);
    if (fam && tr_chat_style_from_name(fam, out)) return TR_OK;
    if (fam)
        return tr_fail(err, TR_E_UNSUPPORTED,
                       "the model's chat template is llama.cpp's '%s' style, which terrace does "
                       "not format; pass --chat-template NAME to use one of: " STYLE_LIST,
                       fam);
    return tr_fail(err, TR_E_UNSUPPORTED,
                   "unrecognised chat template (starting \"%.*s%s\"); pass --chat-template NAME "
                   "to use one of: " STYLE_LIST,
                   snippet_len(template_text), template_text, snippet_more(template_text));
}

/* ---- formatting ------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (n > SIZE_MAX - b->len - 1) {
        b->oom = true;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap = cap > SIZE_MAX / 2 ? b->len + n + 1 : cap * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* llama.cpp's trim(): C-locale isspace (space, \t \n \v \f \r) at both ends, bytewise; written
 * out so the result does not depend on the process locale */
static bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static void sb_put_trimmed(sbuf *b, const char *s) {
    size_t n = strlen(s), i = 0;
    while (i < n && is_space(s[i])) i++;
    while (n > i && is_space(s[n - 1])) n--;
    sb_put(b, s + i, n - i);
}

static void fmt_chatml(sbuf *b, const tr_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|im_start|>");
        sb_puts(b, m[i].role);
        sb_puts(b, "\n");
        sb_puts(b, m[i].content);
        sb_puts(b, "<|im_end|>\n");
    }
    if (gen) sb_puts(b, "<|im_start|>assistant\n");
}

static void fmt_llama3(sbuf *b, const tr_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|start_header_id|>");
        sb_puts(b, m[i].role);
        sb_puts(b, "<|end_header_id|>\n\n");
        sb_put_trimmed(b, m[i].content);
        sb_puts(b, "<|eot_id|>");
    }
    if (gen) sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma has no system role: system texts are trimmed, concatenated, and put at the head of the
 * next non-model turn. A system text with no later user turn is dropped, as in llama.cpp. */
static void fmt_gemma(sbuf *b, sbuf *sys, const tr_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system") == 0) {
            sb_put_trimmed(sys, m[i].content);
            continue;
        }
        const bool model = strcmp(m[i].role, "assistant") == 0 || strcmp(m[i].role, "model") == 0;
        sb_puts(b, "<start_of_turn>");
        sb_puts(b, model ? "model" : m[i].role);
        sb_puts(b, "\n");
        if (sys->len > 0 && !model) {
            sb_put(b, sys->p, sys->len);
            sb_puts(b, "\n\n");
            sys->len = 0;
        }
        sb_put_trimmed(b, m[i].content);
        sb_puts(b, "<end_of_turn>\n");
    }
    if (gen) sb_puts(b, "<start_of_turn>model\n");
}

static void fmt_mistral_v7(sbuf *b, const tr_chat_msg *m, size_t n, bool tekken) {
    const char *sp = tekken ? "" : " ";
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system") == 0) {
            sb_puts(b, "[SYSTEM_PROMPT]");
            sb_puts(b, sp);
            sb_puts(b, m[i].content);
            sb_puts(b, "[/SYSTEM_PROMPT]");
        } else if (strcmp(m[i].role, "user") == 0) {
            sb_puts(b, "[INST]");
            sb_puts(b, sp);
            sb_puts(b, m[i].content);
            sb_puts(b, "[/INST]");
        } else {
            sb_puts(b, sp);
            sb_puts(b, m[i].content);
            sb_puts(b, "</s>");
        }
    }
}

static void fmt_mistral_v1_v3(sbuf *b, const tr_chat_msg *m, size_t n, tr_chat_style st) {
    const char *lead = st == TR_CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = st == TR_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    const bool trim_assistant = st == TR_CHAT_MISTRAL_V3;
    bool inside = false;
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            sb_puts(b, lead);
            sb_puts(b, "[INST]");
            sb_puts(b, trail);
            inside = true;
        }
        if (strcmp(m[i].role, "system") == 0) {
            sb_puts(b, m[i].content);
            sb_puts(b, "\n\n");
        } else if (strcmp(m[i].role, "user") == 0) {
            sb_puts(b, m[i].content);
            sb_puts(b, lead);
            sb_puts(b, "[/INST]");
        } else {
            sb_puts(b, trail);
            if (trim_assistant)
                sb_put_trimmed(b, m[i].content);
            else
                sb_puts(b, m[i].content);
            sb_puts(b, "</s>");
            inside = false;
        }
    }
}

static void fmt_llama2(sbuf *b, const tr_chat_msg *m, size_t n, tr_chat_style st) {
    const bool sys_tags = st != TR_CHAT_LLAMA2;
    const bool bos_inside = st == TR_CHAT_LLAMA2_SYS_BOS;
    const bool strip = st == TR_CHAT_LLAMA2_SYS_STRIP;
    bool inside = true; /* the first [INST] is written up front; BOS is the tokenizer's */
    sb_puts(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            sb_puts(b, bos_inside ? "<s>[INST] " : "[INST] ");
            inside = true;
        }
        const bool sys = strcmp(m[i].role, "system") == 0;
        if (sys && sys_tags) sb_puts(b, "<<SYS>>\n");
        if (strip)
            sb_put_trimmed(b, m[i].content);
        else
            sb_puts(b, m[i].content);
        if (sys) {
            /* without <<SYS>> support the system text still goes first, on its own line */
            sb_puts(b, sys_tags ? "\n<</SYS>>\n\n" : "\n");
        } else if (strcmp(m[i].role, "user") == 0) {
            sb_puts(b, " [/INST]");
        } else {
            sb_puts(b, "</s>");
            inside = false;
        }
    }
}

tr_status tr_chat_format(tr_chat_style style, const tr_chat_msg *msgs, size_t n,
                         bool add_generation_prompt, char **out, tr_error *err) {
    if (!out) return tr_fail(err, TR_E_ARG, "tr_chat_format: out is NULL");
    *out = NULL;
    if ((unsigned)style >= TR_CHAT_STYLE_COUNT)
        return tr_fail(err, TR_E_ARG, "tr_chat_format: unknown style %d", (int)style);
    if (n > 0 && !msgs) return tr_fail(err, TR_E_ARG, "tr_chat_format: %zu messages at NULL", n);
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return tr_fail(err, TR_E_ARG, "chat message %zu has no %s", i,
                           msgs[i].role ? "content" : "role");
    }

    sbuf b = {0}, sys = {0};
    sb_put(&b, "", 0); /* an empty conversation still yields "" rather than NULL */
    switch (style) {
    case TR_CHAT_CHATML: fmt_chatml(&b, msgs, n, add_generation_prompt); break;
    case TR_CHAT_LLAMA3: fmt_llama3(&b, msgs, n, add_generation_prompt); break;
    case TR_CHAT_GEMMA: fmt_gemma(&b, &sys, msgs, n, add_generation_prompt); break;
    case TR_CHAT_MISTRAL_V7: fmt_mistral_v7(&b, msgs, n, false); break;
    case TR_CHAT_MISTRAL_V7_TEKKEN: fmt_mistral_v7(&b, msgs, n, true); break;
    case TR_CHAT_MISTRAL_V1:
    case TR_CHAT_MISTRAL_V3:
    case TR_CHAT_MISTRAL_V3_TEKKEN: fmt_mistral_v1_v3(&b, msgs, n, style); break;
    case TR_CHAT_LLAMA2:
    case TR_CHAT_LLAMA2_SYS:
    case TR_CHAT_LLAMA2_SYS_BOS:
    case TR_CHAT_LLAMA2_SYS_STRIP: fmt_llama2(&b, msgs, n, style); break;
    case TR_CHAT_STYLE_COUNT: break;
    }
    const bool oom = b.oom || sys.oom;
    free(sys.p);
    if (oom) {
        free(b.p);
        return tr_fail(err, TR_E_NOMEM, "formatting %zu chat messages: out of memory", n);
    }
    *out = b.p;
    return TR_OK;
}

/* ---- stop strings ---------------------------------------------------------------------------- */

static const char *const stop_chatml[] = {"<|im_end|>", NULL};
static const char *const stop_llama3[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", NULL};
static const char *const stop_gemma[] = {"<end_of_turn>", NULL};
static const char *const stop_inst[] = {"</s>", NULL};
static const char *const stop_none[] = {NULL};

const char *const *tr_chat_stop_strings(tr_chat_style style) {
    switch (style) {
    case TR_CHAT_CHATML: return stop_chatml;
    case TR_CHAT_LLAMA3: return stop_llama3;
    case TR_CHAT_GEMMA: return stop_gemma;
    case TR_CHAT_MISTRAL_V1:
    case TR_CHAT_MISTRAL_V3:
    case TR_CHAT_MISTRAL_V3_TEKKEN:
    case TR_CHAT_MISTRAL_V7:
    case TR_CHAT_MISTRAL_V7_TEKKEN:
    case TR_CHAT_LLAMA2:
    case TR_CHAT_LLAMA2_SYS:
    case TR_CHAT_LLAMA2_SYS_BOS:
    case TR_CHAT_LLAMA2_SYS_STRIP: return stop_inst;
    case TR_CHAT_STYLE_COUNT: break;
    }
    return stop_none;
}
