/*
 * Tokenizers for GGUF models, reproducing llama.cpp's `llama_tokenize` / `llama_token_to_piece` /
 * `llama_detokenize` token for token.
 *
 * Supported `tokenizer.ggml.model` values: "llama" (SentencePiece-style, SPM), "gpt2" (byte-level
 * BPE with a pre-tokenizer regex list chosen by `tokenizer.ggml.pre`) and "gemma4" (BPE over raw
 * UTF-8 with SPM-style spaces). Everything else ("bert", "t5", "rwkv", ...) is refused at load
 * with TR_E_UNSUPPORTED and a message naming the value.
 *
 * A tr_tokenizer copies what it needs out of the GGUF metadata: the tr_gguf may be closed after
 * tr_tokenizer_load returns. A loaded tokenizer is immutable; every function below that takes a
 * `const tr_tokenizer *` may be called from several threads at once (each call allocates its own
 * scratch memory; tokenizing is not on the per-token decode path).
 *
 * Token ids are int32_t as in llama.cpp; -1 means "none".
 */
#ifndef TR_TEXT_TOKENIZER_H
#define TR_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "terrace.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_tokenizer tr_tokenizer;

typedef enum tr_tok_kind {
    TR_TOK_SPM = 1, /* tokenizer.ggml.model = "llama" */
    TR_TOK_BPE = 2, /* "gpt2" (byte-level) and "gemma4" (raw UTF-8) */
} tr_tok_kind;

/* GGUF `tokenizer.ggml.token_type` values */
enum {
    TR_TOKEN_TYPE_UNDEFINED = 0,
    TR_TOKEN_TYPE_NORMAL = 1,
    TR_TOKEN_TYPE_UNKNOWN = 2,
    TR_TOKEN_TYPE_CONTROL = 3,
    TR_TOKEN_TYPE_USER_DEFINED = 4,
    TR_TOKEN_TYPE_UNUSED = 5,
    TR_TOKEN_TYPE_BYTE = 6,
};

/* Token attribute bits, the same values as llama.cpp's llama_token_attr. They start from the
 * token_type and are then adjusted the way llama.cpp does (end-of-generation texts become CONTROL,
 * gpt-oss's <|channel|> etc. become USER_DEFINED, Phi-3 specials get RSTRIP, ...). */
enum {
    TR_TOKEN_ATTR_UNDEFINED = 0,
    TR_TOKEN_ATTR_UNKNOWN = 1u << 0,
    TR_TOKEN_ATTR_UNUSED = 1u << 1,
    TR_TOKEN_ATTR_NORMAL = 1u << 2,
    TR_TOKEN_ATTR_CONTROL = 1u << 3,
    TR_TOKEN_ATTR_USER_DEFINED = 1u << 4,
    TR_TOKEN_ATTR_BYTE = 1u << 5,
    TR_TOKEN_ATTR_NORMALIZED = 1u << 6,
    TR_TOKEN_ATTR_LSTRIP = 1u << 7,
    TR_TOKEN_ATTR_RSTRIP = 1u << 8,
    TR_TOKEN_ATTR_SINGLE_WORD = 1u << 9,
};

/* Special token roles (tr_token_special). */
typedef enum tr_special {
    TR_SPECIAL_BOS,
    TR_SPECIAL_EOS,
    TR_SPECIAL_EOT,
    TR_SPECIAL_EOM,
    TR_SPECIAL_UNK,
    TR_SPECIAL_SEP,
    TR_SPECIAL_PAD,
    TR_SPECIAL_MASK,
    TR_SPECIAL_NL, /* the newline token llama.cpp derives ("<0x0A>" in SPM, tokenize("\n") in BPE)
                    */
    TR_SPECIAL_FIM_PRE,
    TR_SPECIAL_FIM_SUF,
    TR_SPECIAL_FIM_MID,
    TR_SPECIAL_FIM_PAD,
    TR_SPECIAL_FIM_REP,
    TR_SPECIAL_FIM_SEP,
    TR_SPECIAL_COUNT
} tr_special;

/*
 * Read `tokenizer.ggml.*` and build a tokenizer with llama.cpp's defaults and fix-ups.
 * Errors: TR_E_UNSUPPORTED for an unknown or unsupported model or pre-tokenizer (the message names
 * the value and lists the supported ones; a missing or empty `pre` means "default", as in
 * llama.cpp); TR_E_FORMAT for corrupt metadata (missing tokens, wrong key types, scores or
 * token_type arrays shorter than the vocabulary, token types outside the enum below, duplicate
 * token texts, add_bos set without a BOS id, a byte-level BPE vocabulary without any of its 256
 * byte tokens). Documented leniencies, all as llama.cpp and each reported by
 * tr_tokenizer_warning: special ids out of range are ignored (the default stays, or none);
 * merges without a space are ignored. Merges naming strings that are not tokens are kept (they
 * can only produce text that falls back to bytes); empty token texts become "[EMPTY_<id>]".
 */
tr_status tr_tokenizer_load(const tr_gguf *g, tr_tokenizer **out, tr_error *err);
void tr_tokenizer_free(tr_tokenizer *t);
/* What loading accepted but changes what the file asked for, naming the key, or NULL: special
 * ids outside the vocabulary (ignored, the default kept), merges without a separating space
 * (ignored). Meant to be shown once, when the model is loaded. */
const char *tr_tokenizer_warning(const tr_tokenizer *t);

/*
 * Tokenize `len` bytes of `text` (need not be NUL-terminated or valid UTF-8), as llama_tokenize:
 * add_special adds BOS/EOS as the file asks (add_bos/add_eos); parse_special splits out the text of
 * CONTROL, UNKNOWN and USER_DEFINED tokens as single tokens (without it only USER_DEFINED ones).
 * Writes up to `cap` ids to `out` and the full count to *n_out. If the result does not fit, returns
 * TR_E_ARG with *n_out set to the count needed (out is then unspecified); call again with room.
 * BPE vocabularies see invalid UTF-8 the way llama.cpp does: every byte that does not start a valid
 * sequence becomes U+FFFD. SPM keeps raw bytes (byte-fallback tokens).
 */
tr_status tr_tokenize(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *out, size_t cap, size_t *n_out, tr_error *err);
/* tr_tokenize that also counts the characters of the text the vocabulary cannot represent (no
 * token and no byte token covers them, and SPM has no <unk>): left out, as llama.cpp does, and
 * reported here so that the caller can say so. *first_dropped: the first one's byte, -1 if none.
 * Either pointer may be NULL. */
tr_status tr_tokenize_ex(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                         bool parse_special, int32_t *out, size_t cap, size_t *n_out,
                         size_t *n_dropped, int *first_dropped, tr_error *err);

/*
 * The text of one token, as llama_token_to_piece(lstrip = 0): SPM turns U+2581 into spaces and
 * byte tokens "<0xXX>" into that byte; BPE undoes the GPT-2 byte-to-unicode mapping. CONTROL and
 * UNKNOWN tokens render as their text only if render_special, else as nothing. Returns the number
 * of bytes written (no NUL is added); if the piece needs more than `cap` bytes, returns minus the
 * size needed (buf contents unspecified). An id outside the vocabulary renders as nothing (0).
 */
int tr_token_to_piece(const tr_tokenizer *t, int32_t id, char *buf, size_t cap,
                      bool render_special);

/*
 * Concatenate the pieces of `n` ids into text, as llama_detokenize(remove_special = false,
 * unparse_special = render_special): with add_space_prefix (SPM) one leading space of the first
 * piece is dropped, and vocabularies with llama.cpp's clean_spaces flag (most BPE ones) get its
 * " ," / " 's" clean-up. Writes up to cap bytes and the full size to *n_out (no NUL added);
 * TR_E_ARG if it does not fit (*n_out = size needed) or an id is out of range.
 */
tr_status tr_detokenize(const tr_tokenizer *t, const int32_t *ids, size_t n, bool render_special,
                        char *buf, size_t cap, size_t *n_out, tr_error *err);

/* ---- accessors ------------------------------------------------------------------------------ */

tr_tok_kind tr_tokenizer_kind(const tr_tokenizer *t);
const char *tr_tokenizer_model(const tr_tokenizer *t); /* "llama", "gpt2", "gemma4" */
const char *tr_tokenizer_pre(const tr_tokenizer *t);   /* as in the file; "default" if absent */
int32_t tr_tokenizer_n_vocab(const tr_tokenizer *t);
bool tr_tokenizer_add_bos(const tr_tokenizer *t);
bool tr_tokenizer_add_eos(const tr_tokenizer *t);
bool tr_tokenizer_add_space_prefix(const tr_tokenizer *t);
size_t tr_tokenizer_n_merges(const tr_tokenizer *t);

/* Token text as stored (NUL-terminated; *len, if non-NULL, gets its length, which counts any
 * embedded NULs). NULL for an id out of range. */
const char *tr_token_text(const tr_tokenizer *t, int32_t id, size_t *len);
float tr_token_score(const tr_tokenizer *t, int32_t id);   /* 0 if out of range */
int32_t tr_token_type(const tr_tokenizer *t, int32_t id);  /* GGUF token_type; -1 if out of range */
uint32_t tr_token_attr(const tr_tokenizer *t, int32_t id); /* TR_TOKEN_ATTR_* bits */
/* id of the token whose text is exactly these bytes, or -1 */
int32_t tr_token_find(const tr_tokenizer *t, const char *text, size_t len);

int32_t tr_token_special(const tr_tokenizer *t, tr_special which); /* -1 if none */
int32_t tr_token_bos(const tr_tokenizer *t);
int32_t tr_token_eos(const tr_tokenizer *t);
int32_t tr_token_eot(const tr_tokenizer *t);
int32_t tr_token_eom(const tr_tokenizer *t);
int32_t tr_token_unk(const tr_tokenizer *t);
int32_t tr_token_pad(const tr_tokenizer *t);
/* true if id ends generation (llama.cpp's EOG set: eos, eot, eom, fim pad/rep/sep and tokens whose
 * text is one of llama.cpp's end-of-turn strings) */
bool tr_token_is_eog(const tr_tokenizer *t, int32_t id);
/* the EOG set, ascending; *n gets its size */
const int32_t *tr_tokenizer_eog_ids(const tr_tokenizer *t, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
