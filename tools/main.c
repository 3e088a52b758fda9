/* terrace CLI entry point: dispatches to a command. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const struct {
    const char *name;
    cli_command_fn fn;
    const char *help;
} k_commands[] = {
    {"run", cmd_run, "generate text from a prompt, with a speed and memory summary"},
    {"chat", cmd_chat, "interactive chat with the model's chat template"},
    {"bench", cmd_bench, "prompt processing and generation speed, like llama-bench"},
    {"perplexity", cmd_perplexity, "perplexity of a text file, llama.cpp's method"},
    {"template", cmd_template, "render a chat template for a conversation (as Hugging Face does)"},
    {"inspect", cmd_inspect, "show a GGUF file: architecture, hyperparameters, tokenizer, tensors"},
    {"logits", cmd_logits, "evaluate token ids, dump every position's logits (for parity checks)"},
    {"replay", cmd_replay, "replay a route trace through expert-cache policies (hit % per budget)"},
};

static void usage(FILE *f) {
    fprintf(f, "terrace %s — run GGUF language models bigger than memory\n\n"
               "usage: terrace <command> [options]\n\ncommands:\n",
            TR_VERSION_STRING);
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-12s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(f, "\n'terrace <command> --help' shows the options of a command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("terrace %s (kernels: %s)\n", TR_VERSION_STRING, tr_cpu_isa());
        return 0;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (!strcmp(cmd, k_commands[i].name)) {
            int rc = k_commands[i].fn(argc - 1, argv + 1);
            /* what a command printed is only written once stdout is flushed and closed: a full
             * disk or a closed pipe is an error, not a success with lost output */
            errno = 0;
            const bool bad = fflush(stdout) != 0 || ferror(stdout);
            const int e = errno;
            if ((fclose(stdout) != 0 || bad) && rc == 0) {
                cli_error("%s: cannot write to standard output: %s", cmd,
                          strerror(e ? e : errno ? errno : EIO));
                rc = CLI_EXIT_ERROR;
            }
            return rc;
        }
    cli_error("unknown command '%s'", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
