/* Shared pieces of the terrace CLI: commands, messages, formatting. Only the CLI prints/exits. */
#ifndef TR_TOOLS_CLI_H
#define TR_TOOLS_CLI_H

#include <stdio.h>

#include "terrace.h"

#define CLI_EXIT_ERROR 1 /* the input or the run failed */
#define CLI_EXIT_USAGE 2 /* wrong flags or arguments */

typedef int (*cli_command_fn)(int argc, char **argv);

int cmd_inspect(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_template(int argc, char **argv);

/* "terrace: error: <msg>" on stderr, control characters in msg escaped */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "terrace: warning: <msg>" on stderr, the same way */
void cli_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* human-readable byte count: "1.50 GiB", "912 B" */
const char *cli_bytes(unsigned long long n, char *buf, size_t cap);
/* writes s[0..len) with control characters (C0, DEL, C1) and invalid UTF-8 escaped (for
 * terminals) */
void cli_print_escaped(FILE *f, const char *s, size_t len, size_t max_chars);
/* the same into a malloc'd string (NULL when out of memory); caller frees */
char *cli_escape(const char *s, size_t len, size_t max_chars);
/* a copy of s[0..len) that is valid UTF-8 (invalid bytes become U+FFFD); caller frees */
char *cli_utf8_sanitize(const char *s, size_t len);
/* parse a non-negative integer flag value; false with a message on junk */
int cli_parse_int(const char *flag, const char *v, long lo, long hi, long *out);
/* parse a byte size: "1073741824", "512M", "2G", "1.5GiB" */
int cli_parse_size(const char *flag, const char *v, unsigned long long *out);

#endif
