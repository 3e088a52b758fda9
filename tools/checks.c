#include "checks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* flags the command does not use                                                                 */

enum { C_RUN = 1u << 0, C_CHAT = 1u << 1, C_BENCH = 1u << 2, C_PPL = 1u << 3 };

static unsigned command_bit(const char *cmd) {
    return !strcmp(cmd, "run") ? C_RUN : !strcmp(cmd, "chat") ? C_CHAT
         : !strcmp(cmd, "bench") ? C_BENCH : !strcmp(cmd, "perplexity") ? C_PPL : 0;
}

static bool check_commands(const gen_opts *o, const char *cmd) {
    const unsigned bit = command_bit(cmd);
    const struct {
        const char *flag;
        bool given;
        unsigned commands;
        const char *what;
    } rows[] = {
        {"-sys", o->system != NULL, C_CHAT | C_RUN, "the system prompt of a chat template"},
        {"--chat-template", o->chat_template != NULL, C_CHAT | C_RUN, "the chat template"},
        {"--jinja", o->jinja, C_CHAT | C_RUN, "the chat template"},
        {"--reasoning-format", o->reasoning_none, C_CHAT, "how a reply's reasoning is shown"},
        {"--telemetry", o->telemetry != NULL, C_RUN | C_CHAT, "per generated token"},
        {"--chunks", o->n_chunks > 0, C_PPL, "the chunks scored"},
        {"--json", o->json, C_BENCH, "bench's report"},
        {"--no-display-prompt", o->no_display_prompt, C_RUN, "the echoed prompt"},
        {"--ignore-eos", o->ignore_eos, C_RUN | C_CHAT, "generation"},
        {"--dry-run", o->dry_run, C_RUN, "the memory plan printed instead of running"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!rows[i].given || !bit || (rows[i].commands & bit)) continue;
        char uses[64] = "";
        static const char *const names[] = {"run", "chat", "bench", "perplexity"};
        for (int c = 0, k = 0; c < 4; c++)
            if (rows[i].commands & (1u << c))
                snprintf(uses + strlen(uses), sizeof uses - strlen(uses), "%sterrace %s",
                         k++ ? " and " : "", names[c]);
        cli_error("%s: %s sets %s, which %s does not use (it applies to %s)", cmd, rows[i].flag,
                  rows[i].what, cmd, uses);
        return false;
    }
    /* run formats the prompt with the template only when asked to */
    if (bit == C_RUN && o->system && !o->jinja && !o->chat_template) {
        cli_error("run: -sys sets the system prompt of a chat template, which run uses only with "
                  "--jinja or --chat-template");
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* KV flags: which policy uses which (a policy added to the CLI gets a bit and its rows)            */

enum { KV_FULL = 1u << 0, KV_OFFLOAD = 1u << 1, KV_H2O = 1u << 2, KV_QUEST = 1u << 3,
       KV_TIERED = 1u << 4, KV_AUTO = 1u << 5 };
static const struct {
    const char *name;
    unsigned bit;
} k_policies[] = {
    {"full", KV_FULL}, {"offload", KV_OFFLOAD}, {"h2o", KV_H2O}, {"quest", KV_QUEST},
    {"tiered", KV_TIERED}, {"auto", KV_AUTO},
};
/* auto becomes tiered when the KV does not fit, so it takes every flag tiered takes */
#define KV_TIER (KV_TIERED | KV_AUTO)
#define KV_POOLS (KV_OFFLOAD | KV_H2O | KV_QUEST | KV_TIER) /* hot pool, cold pool on storage */
#define KV_SELECT (KV_H2O | KV_QUEST | KV_TIER)             /* attend over a selection */

/* "h2o, quest or tiered" */
static void policy_list(unsigned mask, char *buf, size_t cap) {
    size_t n = 0;
    int total = 0, k = 0;
    for (size_t i = 0; i < sizeof k_policies / sizeof k_policies[0]; i++) total += !!(mask & k_policies[i].bit);
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof k_policies / sizeof k_policies[0] && n < cap; i++) {
        if (!(mask & k_policies[i].bit)) continue;
        k++;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", k == 1 ? "" : k == total ? " or " : ", ",
                              k_policies[i].name);
    }
}

static bool check_kv(const gen_opts *o) {
    const tr_kv_params *k = &o->kv;
    const char *pol = tr_kv_policy_name(k->policy);
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof k_policies / sizeof k_policies[0]; i++)
        if (!strcmp(pol, k_policies[i].name)) bit = k_policies[i].bit;
    const bool csd = k->csd;
    const struct {
        const char *flag;
        unsigned policies;
        const char *needs; /* another flag this one works through, or NULL */
        bool needs_given;
    } rows[] = {
        {"--kv-alpha", KV_SELECT, NULL, true},
        {"--kv-sink", KV_SELECT, NULL, true},
        {"--kv-window", KV_SELECT, NULL, true},
        {"--kv-score-bits", KV_TIER, NULL, true},
        {"--kv-tail", KV_TIER, NULL, true},
        {"--kv-tail-min", KV_TIER, "--kv-tail 4 or 8", k->tail_bits != 0},
        {"--kv-spec", KV_TIER, NULL, true},
        {"--kv-hot", KV_POOLS, NULL, true},
        {"--kv-cold", KV_POOLS, NULL, true},
        /* auto's own cold directory is removed at exit: keeping files needs one given */
        {"--kv-keep", KV_POOLS, "--kv-cold DIR", k->cold_dir != NULL},
        {"--kv-bkp", KV_TIER, "a cold pool (--kv-cold DIR)", k->cold_dir != NULL},
        {"--csd", KV_TIER, "a cold pool (--kv-cold DIR)", k->cold_dir != NULL},
        {"--csd-socket", KV_TIER, "a cold pool (--kv-cold DIR)", k->cold_dir != NULL},
        {"--csd-chunk", KV_TIER, "the storage agent (--csd)", csd},
        {"--csd-timeout", KV_TIER, "the storage agent (--csd)", csd},
        {"--csd-gbps", KV_TIER, "the storage agent (--csd)", csd},
        {"--csd-gflops", KV_TIER, "the storage agent (--csd)", csd},
        {"--csd-link-gbps", KV_TIER, "the storage agent (--csd)", csd},
        {"--kv-beta", KV_TIER, "the storage agent (--csd)", csd},
        {"--kv-host-keys", KV_TIER, "the storage agent (--csd)", csd},
        {"--kv-app-rates", KV_TIER, "the storage agent (--csd)", csd},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!gen_given(o, rows[i].flag)) continue;
        /* an unknown policy name is the library's to report */
        if (bit && !(rows[i].policies & bit)) {
            char uses[96];
            policy_list(rows[i].policies, uses, sizeof uses);
            cli_error("%s applies to --kv-policy %s; the policy is %s", rows[i].flag, uses, pol);
            return false;
        }
        if (rows[i].needs && !rows[i].needs_given) {
            cli_error("%s needs %s", rows[i].flag, rows[i].needs);
            return false;
        }
    }
    return true;
}

bool gen_check_flags(const gen_opts *o, const char *cmd) {
    /* logits is the tests' probe of the KV cache: one flag set evaluated under every policy (a
     * policy must ignore the knobs it does not use, bit for bit), so it takes the KV flags as
     * given; the commands people run refuse a KV flag their policy ignores */
    return check_commands(o, cmd) && (!strcmp(cmd, "logits") || check_kv(o));
}

bool gen_check_model_flags(const gen_opts *o, tr_model *m) {
    tr_model_stats st;
    tr_model_get_stats(m, &st);
    const struct {
        const char *flag;
        bool given;
        bool cache; /* works through the expert cache (not with --experts mmap) */
    } rows[] = {
        {"--experts mmap", o->experts_mmap, false},
        {"--expert-cache", o->expert_cache != 0, true},
        {"--expert-policy", o->expert_policy != NULL, true},
        {"--expert-prefetch", gen_given(o, "--expert-prefetch"), true},
        {"--expert-lookahead", gen_given(o, "--expert-lookahead"), true},
        {"--io-threads", o->io_threads > 0, true},
        {"--route-trace", o->route_trace != NULL, false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!rows[i].given) continue;
        if (!st.moe) {
            cli_error("%s applies to mixture-of-experts models; %s is a dense %s model", rows[i].flag,
                      o->model, tr_model_arch(m));
            return false;
        }
        if (rows[i].cache && o->experts_mmap) {
            cli_error("%s sets up the expert cache, which --experts mmap does not use", rows[i].flag);
            return false;
        }
    }
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* inputs                                                                                         */

size_t text_bound(const tr_tokenizer *t, size_t n_tokens) {
    size_t longest = 1;
    for (int32_t id = 0; id < tr_tokenizer_n_vocab(t); id++) {
        size_t len = 0;
        if (tr_token_text(t, id, &len) && len > longest) longest = len;
    }
    return n_tokens > SIZE_MAX / longest ? SIZE_MAX : n_tokens * longest;
}

char *read_file_max(const char *path, size_t max, const char *why, size_t *len) {
    int fd;
    do fd = open(path, O_RDONLY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        cli_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
        cli_error("cannot read %s: %s", path, S_ISDIR(st.st_mode) ? "is a directory" : strerror(errno));
        close(fd);
        return NULL;
    }
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max) {
        cli_error("%s is %llu bytes, more than the %zu bytes %s", path,
                  (unsigned long long)st.st_size, max, why);
        close(fd);
        return NULL;
    }
    /* a FIFO or a device has no size: read up to the bound and one byte more */
    size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) {
            cli_error("out of memory reading %s", path);
            close(fd);
            return NULL;
        }
        if (n == cap) {
            const size_t grown = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *g = grown > cap ? realloc(buf, grown + 1) : NULL;
            if (!g) {
                free(buf);
                buf = NULL;
                continue;
            }
            buf = g;
            cap = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            cli_error("cannot read %s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n > max) {
            cli_error("%s holds more than the %zu bytes %s", path, max, why);
            free(buf);
            close(fd);
            return NULL;
        }
    }
    close(fd);
    buf[n] = '\0';
    *len = n;
    return buf;
}

void warn_context(const loaded *l, const tr_session *s) {
    const int32_t n = tr_session_n_ctx(s), train = tr_model_n_ctx_train(l->model);
    if (n <= train) return;
    char b[32];
    cli_warning("the context of %d tokens is longer than the %d the model was trained for: past "
                "them its output may degrade; the session takes %s (KV cache and scratch)",
                n, train, cli_bytes(tr_session_bytes(s), b, sizeof b));
}

/* ---------------------------------------------------------------------------------------------- */
/* outputs                                                                                        */

bool out_write(const char *s, size_t n) {
    if (n && fwrite(s, 1, n, stdout) != n) return false;
    return fflush(stdout) == 0;
}

bool close_outputs(loaded *l) {
    tr_error err = {0};
    if (l->model && tr_model_route_trace_close(l->model, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    return true;
}
