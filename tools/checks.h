/*
 * What the user asked for, checked against what the command, the KV policy and the model use:
 * a flag that would be ignored is an error naming it and what it needs (exit 2), never a silent
 * no-op. And the inputs and outputs of the commands: prompt files read with a bound, output
 * streams whose write errors are errors.
 */
#ifndef TR_TOOLS_CHECKS_H
#define TR_TOOLS_CHECKS_H

#include <stdbool.h>
#include <stddef.h>

#include "common.h"

/* flags the command or the KV policy does not use (called by gen_parse; prints why) */
bool gen_check_flags(const gen_opts *o, const char *cmd);
/* flags the loaded model does not use: expert flags on a dense model, expert-cache flags with
 * --experts mmap (prints why) */
bool gen_check_model_flags(const gen_opts *o, tr_model *m);

/* the most bytes of text a context of n_ctx tokens can hold with this vocabulary: no token covers
 * more input bytes than its text is long */
size_t text_bound(const tr_tokenizer *t, size_t n_tokens);
/* reads a prompt or text file of at most max bytes into a malloc'd NUL-terminated buffer; a
 * larger file, a directory or a read error is an error naming it (printed); FIFOs and devices
 * are read up to the bound. `why` says where the bound comes from, for the message. */
char *read_file_max(const char *path, size_t max, const char *why, size_t *len);

/* a warning when the session's context is longer than the model was trained for */
void warn_context(const loaded *l, const tr_session *s);

/* stdout for generated text: writes and flushes, false (errno set) when the stream failed */
bool out_write(const char *s, size_t n);
/* closes what the run wrote besides stdout (the route trace); false with a message on error */
bool close_outputs(loaded *l);

#endif
