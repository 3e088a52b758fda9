/*
 * Chat templates without Jinja. GGUF files carry the model's Jinja template in
 * `tokenizer.chat_template`; like llama.cpp's built-in path (llm_chat_detect_template /
 * llm_chat_apply_template in src/llama-chat.cpp, used when --jinja is off), terrace recognises the
 * common template families by substrings and formats them natively, producing the same text as
 * llama.cpp for the same messages.
 *
 * Styles (the names are llama.cpp's --chat-template names):
 *   chatml             Qwen2/2.5/3, SmolLM, ...: <|im_start|>role\ncontent<|im_end|>\n;
 *                      generation prompt <|im_start|>assistant\n. Qwen3 thinking templates are
 *                      detected as chatml and formatted in the plain form (no <think> block is
 *                      added or removed).
 *   llama3             <|start_header_id|>role<|end_header_id|>\n\n{trimmed content}<|eot_id|>;
 *                      <|begin_of_text|> is the tokenizer's BOS, not part of the text.
 *   gemma              <start_of_turn>role\n{trimmed content}<end_of_turn>\n, assistant is
 *                      "model", system messages are trimmed and merged into the next user turn
 *                      as "system\n\nuser" (as Gemma's own template does for the first turn);
 *                      generation prompt <start_of_turn>model\n.
 *   mistral-v7         [SYSTEM_PROMPT] s[/SYSTEM_PROMPT][INST] u[/INST] a</s>  (Mistral Large 2411,
 *   mistral-v7-tekken  Small 3.x; -tekken drops the spaces after the markers)
 *   mistral-v3         [INST] s\n\nu[/INST] a</s> (assistant trimmed), Mistral 7B v0.3 / Large 2407
 *   mistral-v3-tekken  [INST]s\n\nu[/INST]a</s>, Mistral Nemo
 *   mistral-v1         " [INST] s\n\nu [/INST] a</s>", Mistral 7B v0.1/v0.2 official template
 *   llama2             [INST] u [/INST]a</s>..., system as "s\n" (Llama 2, older Mistral
 *   llama2-sys          templates); -sys wraps the system in <<SYS>>\n..\n<</SYS>>\n\n,
 *   llama2-sys-bos      -sys-bos also puts <s> before every later [INST], -sys-strip trims
 *   llama2-sys-strip    every message.
 * The [INST] styles end with [/INST] and have no separate generation prompt (the flag is
 * ignored), as in llama.cpp. BOS is never written by the formatter: the tokenizer adds it.
 *
 * Roles are passed through as given ("system", "user", "assistant"; other roles are kept as the
 * style's generic case, as llama.cpp does).
 */
#ifndef TR_TEXT_CHAT_H
#define TR_TEXT_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "terrace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tr_chat_style {
    TR_CHAT_CHATML = 0,
    TR_CHAT_LLAMA3,
    TR_CHAT_GEMMA,
    TR_CHAT_MISTRAL_V1,
    TR_CHAT_MISTRAL_V3,
    TR_CHAT_MISTRAL_V3_TEKKEN,
    TR_CHAT_MISTRAL_V7,
    TR_CHAT_MISTRAL_V7_TEKKEN,
    TR_CHAT_LLAMA2,
    TR_CHAT_LLAMA2_SYS,
    TR_CHAT_LLAMA2_SYS_BOS,
    TR_CHAT_LLAMA2_SYS_STRIP,
    TR_CHAT_STYLE_COUNT
} tr_chat_style;

typedef struct tr_chat_msg {
    const char *role;
    const char *content;
} tr_chat_msg;

/*
 * Choose the style. With an override (--chat-template NAME; NULL or "" for none): a built-in name
 * selects that style; anything else is taken as template text and detected, as llama.cpp does.
 * Otherwise the model's template (tokenizer.chat_template; may be NULL) is detected with
 * llama.cpp's substring rules, in llama.cpp's order, so a template llama.cpp reads as another
 * family (phi4's <|im_start|>...<|im_sep|>, for one) is not mistaken for chatml.
 * Errors: TR_E_UNSUPPORTED when there is no template and no override, or the template is not one
 * of the styles above (the message names the family llama.cpp would have seen, if any, mentions
 * --chat-template and lists the built-in names); TR_E_ARG for a NULL `out`.
 */
tr_status tr_chat_detect(const char *template_text, const char *override_name, tr_chat_style *out,
                         tr_error *err);

/* llama.cpp's family name for a template text ("chatml", "gpt-oss", "deepseek3", "phi3" ...), or
 * NULL when llama.cpp would not recognise it either */
const char *tr_chat_family(const char *template_text);

/* "chatml", "llama3", ...; "?" for a value out of range */
const char *tr_chat_style_name(tr_chat_style style);
/* style by built-in name; false if the name is not one */
bool tr_chat_style_from_name(const char *name, tr_chat_style *out);
/* the built-in names, comma-separated ("chatml, llama3, gemma, ..."), for help texts and errors */
const char *tr_chat_style_list(void);

/*
 * Format messages into the prompt text (without BOS). *out receives a NUL-terminated string
 * allocated with malloc; the caller frees it. TR_E_ARG for a NULL out, msgs == NULL with n > 0, a
 * message with a NULL role or content, or a style out of range; TR_E_NOMEM if allocation fails.
 */
tr_status tr_chat_format(tr_chat_style style, const tr_chat_msg *msgs, size_t n,
                         bool add_generation_prompt, char **out, tr_error *err);

/*
 * Strings that end the assistant's turn in this style, NULL-terminated ("<|im_end|>" for chatml;
 * "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>" for llama3; "<end_of_turn>" for gemma; "</s>" for
 * the [INST] styles). A chat loop can stop on these in the detokenized text even when the
 * tokenizer's end-of-generation set misses the token.
 */
const char *const *tr_chat_stop_strings(tr_chat_style style);

/* tr_reasoning_create for a template given by its Jinja source (NULL for a built-in format) */
tr_status tr_reasoning_create_for(const char *template_source, const char *prompt,
                                  tr_reasoning_format fmt, tr_reasoning **out, tr_error *err);

#ifdef __cplusplus
}
#endif
#endif
