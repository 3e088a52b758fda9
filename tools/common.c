#include "common.h"
#include "checks.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------- */
/* flags: llama.cpp spellings (-m -p -f -n -c -b -t -s --temp --top-k ...)                        */

enum {
    F_MODEL, F_PROMPT, F_FILE, F_NPRED, F_CTX, F_BATCH, F_THREADS, F_SEED, F_TEMP, F_TOPK, F_TOPP,
    F_MINP, F_REPPEN, F_REPLAST, F_PRESPEN, F_FREQPEN, F_NOMMAP, F_IGNEOS, F_NODISP, F_ESCAPE,
    F_STOP, F_SYS, F_TEMPLATE, F_JINJA, F_VERBOSE, F_JSON, F_REPS, F_HELP, F_TELEMETRY, F_EXPERTS,
    F_ECACHE, F_MEMBUDGET, F_EPOLICY, F_EPREFETCH, F_ELOOKAHEAD, F_ROUTETRACE, F_IOTHREADS, F_KVPOLICY,
    F_KVALPHA, F_KVSINK, F_KVWINDOW, F_KVBITS, F_KVTAIL, F_KVTAILMIN, F_KVHOT, F_KVCOLD, F_KVKEEP, F_KVBKP, F_KVSPEC, F_KVPRESEL, F_DRYRUN, F_CSD, F_CSDSOCKET, F_CSDCHUNK, F_CSDGBPS, F_CSDGFLOPS, F_CSDLINK, F_CSDTIMEOUT, F_KVBETA, F_KVHOSTKEYS, F_KVAPPRATES, F_CHUNKS,
    F_REASONING,
    F_COUNT
};
_Static_assert(F_COUNT <= 128, "gen_opts.given holds 128 flags");

typedef struct flag {
    const char *names; /* comma-separated spellings */
    int id;
    bool arg;
    const char *help;
} flag;

static const flag k_flags[] = {
    {"-m,--model", F_MODEL, true, "FILE   GGUF model (any shard of a split model)"},
    {"-p,--prompt", F_PROMPT, true, "TEXT   prompt (bench: prompt length in tokens)"},
    {"-f,--file", F_FILE, true, "FILE   read the prompt (perplexity: the text) from a file"},
    {"-n,--n-predict,--predict", F_NPRED, true,
     "N      tokens to generate (-1: until end of generation; bench: tokens to decode)"},
    {"-c,--ctx-size", F_CTX, true, "N      context length (default: min(training, 4096))"},
    {"-b,--batch-size", F_BATCH, true, "N      prompt tokens computed together (default 512)"},
    {"-t,--threads", F_THREADS, true, "N      threads (default: physical cores)"},
    {"-s,--seed", F_SEED, true, "N      sampling seed (default: random)"},
    {"--temp", F_TEMP, true, "T      temperature (0: greedy; default 0.8)"},
    {"--top-k", F_TOPK, true, "K      top-k (0: off; default 40)"},
    {"--top-p", F_TOPP, true, "P      top-p (1: off; default 0.95)"},
    {"--min-p", F_MINP, true, "P      min-p (0: off; default 0.05)"},
    {"--repeat-penalty", F_REPPEN, true, "R   repetition penalty (1: off; default 1.0)"},
    {"--repeat-last-n", F_REPLAST, true, "N    tokens the penalties look back on (default 64)"},
    {"--presence-penalty", F_PRESPEN, true, "P presence penalty (default 0)"},
    {"--frequency-penalty", F_FREQPEN, true, "P frequency penalty (default 0)"},
    {"--no-mmap", F_NOMMAP, false, "        read the weights into memory instead of mapping them"},
    {"--ignore-eos", F_IGNEOS, false, "     do not stop at end-of-generation tokens"},
    {"--no-display-prompt", F_NODISP, false, "do not echo the prompt"},
    {"-e,--escape", F_ESCAPE, false, "    process \\n, \\t, \\\\ ... in the prompt"},
    {"--stop,-r,--reverse-prompt", F_STOP, true, "TEXT stop when the output contains TEXT (repeatable)"},
    {"-sys,--system-prompt", F_SYS, true, "TEXT system prompt (chat)"},
    {"--chat-template", F_TEMPLATE, true, "NAME|FILE  the chat template instead of the model's: a built-in format (chatml, llama3, gemma, mistral-v7 ...), a template the file names, or a .jinja file"},
    {"--reasoning-format", F_REASONING, true, "FMT chat, serve: auto (default) keeps a reply's reasoning (<think>, harmony's analysis) apart from the answer (serve: reasoning_content); none gives the reply as it is"},
    {"-v,--verbose", F_VERBOSE, false, "     print the prompt's tokens and more detail"},
    {"--json", F_JSON, false, "        machine-readable output (bench)"},
    {"--repetitions", F_REPS, true, "N  repetitions (bench; default 3)"},
    {"--telemetry", F_TELEMETRY, true, "FILE JSON lines per token (tok/s, RSS, hit rate, I/O ...)"},
    {"--experts", F_EXPERTS, true, "cache|mmap  MoE: expert cache (default) or plain mmap"},
    {"--expert-cache", F_ECACHE, true, "SIZE|auto|min  MoE: expert cache budget (e.g. 2G)"},
    {"--mem-budget", F_MEMBUDGET, true, "SIZE  the memory budget: weights, expert cache, KV, scratch (auto: cgroup limit or MemAvailable); run --dry-run prints the plan"},
    {"--expert-policy", F_EPOLICY, true, "NAME  MoE: eviction policy (auto, lru, lfu, ...)"},
    {"--expert-prefetch", F_EPREFETCH, true, "N|auto MoE: read N predicted experts of the next layer ahead (auto: top-k ranks that paid off, if experts spill)"},
    {"--expert-lookahead", F_ELOOKAHEAD, true, "on|off MoE: keep the next layer's predicted experts from eviction"},
    {"--io-threads", F_IOTHREADS, true, "N   MoE: expert I/O workers (default 4)"},
    {"--route-trace", F_ROUTETRACE, true, "FILE MoE: write the routing trace (CSV)"},
    {"--kv-policy", F_KVPOLICY, true, "NAME   KV cache: auto (default: full while the KV fits the memory budget, else tiered with a cold pool), full, offload, h2o, quest, tiered"},
    {"--kv-alpha", F_KVALPHA, true, "A       KV: fraction of the context attended per step (default 0.2)"},
    {"--kv-sink", F_KVSINK, true, "N        KV: first tokens always attended (default 4)"},
    {"--kv-window", F_KVWINDOW, true, "N      KV: recent tokens always attended (default 64)"},
    {"--kv-score-bits", F_KVBITS, true, "B  KV: 8 or 4, precision of the scoring key copy"},
    {"--kv-tail", F_KVTAIL, true, "B  KV tiered: add the unselected tokens' estimated share from a B-bit value copy (4 or 8; 0 off, the default)"},
    {"--kv-tail-min", F_KVTAILMIN, true, "F KV tail: sum an unselected token when its share of a head reaches F x the uniform share (default 1; 0: every one)"},
    {"--kv-hot", F_KVHOT, true, "SIZE      KV: hot pool (DRAM) budget (default: every token hot)"},
    {"--kv-cold", F_KVCOLD, true, "DIR      KV: cold pool directory on local storage (auto: $XDG_CACHE_HOME/terrace or ~/.cache/terrace)"},
    {"--kv-keep", F_KVKEEP, false, "        KV: keep the cold pool's files"},
    {"--kv-bkp", F_KVBKP, true, "MODE      KV tiered: placement between the pools: off (default), on, naive"},
    {"--kv-spec", F_KVSPEC, false, "       KV tiered: select each layer's tokens with a query speculated from the previous layer's input, overlapping its scoring and reads with that layer's"},
    {"--dry-run", F_DRYRUN, false, "        run: print the memory plan (weights, expert cache, KV, scratch: what goes where and what spills) and exit"},
    {"--kv-prefill-select", F_KVPRESEL, false, "KV quest/tiered: select per row in prefill too, as in decode (default: prefill attends exactly, each cold page read once per chunk; perplexity always selects)"},
    {"--csd", F_CSD, false, "            KV tiered: score the cold pool in the storage agent (terrace-storaged)"},
    {"--csd-socket", F_CSDSOCKET, true, "PATH KV tiered: use the agent listening on PATH (terrace-storaged --listen PATH) instead of starting one; implies --csd"},
    {"--csd-chunk", F_CSDCHUNK, true, "N     storage agent: tokens per score block (default 1024)"},
    {"--csd-timeout", F_CSDTIMEOUT, true, "S   storage agent: the longest wait for it before the step fails (default 30 s)"},
    {"--csd-gbps", F_CSDGBPS, true, "R      storage agent: throttle its storage reads to R GB/s"},
    {"--csd-gflops", F_CSDGFLOPS, true, "R    storage agent: throttle its scoring to R GFLOP/s"},
    {"--csd-link-gbps", F_CSDLINK, true, "R storage agent: throttle its link to the host to R GB/s"},
    {"--kv-beta", F_KVBETA, true, "B        storage agent: host/agent share of the scoring (default: from measured rates)"},
    {"--kv-host-keys", F_KVHOSTKEYS, true, "N  storage agent: the host keeps scoring keys for N recent positions per layer, its share's limit (default: all)"},
    {"--kv-app-rates", F_KVAPPRATES, true, "FC,FS,BC,BS storage agent: APP's rates instead of measured ones: host and agent scoring (M tokens/s: beta = FC/FS), hot-pool copies and agent rows (GB/s, reported); 0 = measure that one"},
    {"--chunks", F_CHUNKS, true, "N       perplexity: at most N chunks (default: all)"},
    {"--jinja", F_JINJA, false, "       the chat template (llama.cpp's switch; chat always uses it, run formats -p as a user turn)"},
    {"-h,--help", F_HELP, false, "     this text"},
};

static const flag *find_flag(const char *a) {
    for (size_t i = 0; i < sizeof k_flags / sizeof k_flags[0]; i++) {
        const char *p = k_flags[i].names;
        const size_t la = strlen(a);
        while (*p) {
            const char *e = strchr(p, ',');
            const size_t n = e ? (size_t)(e - p) : strlen(p);
            if (n == la && !strncmp(p, a, n)) return &k_flags[i];
            p += n + (e ? 1 : 0);
        }
    }
    return NULL;
}

bool gen_given(const gen_opts *o, const char *name) {
    const flag *f = find_flag(name);
    return f && (o->given[f->id / 64] >> (f->id % 64) & 1);
}

void gen_print_common_flags(FILE *f) {
    for (size_t i = 0; i < sizeof k_flags / sizeof k_flags[0]; i++)
        fprintf(f, "  %-28s %s\n", k_flags[i].names, k_flags[i].help);
}

static bool parse_float(const char *name, const char *v, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) {
        cli_error("%s expects a number in [%g, %g], got '%s'", name, lo, hi, v);
        return false;
    }
    *out = (float)x;
    return true;
}

static void unescape(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p != '\\' || !p[1]) {
            *o++ = *p;
            continue;
        }
        switch (*++p) {
        case 'n': *o++ = '\n'; break;
        case 't': *o++ = '\t'; break;
        case 'r': *o++ = '\r'; break;
        case '\\': *o++ = '\\'; break;
        case '"': *o++ = '"'; break;
        case '\'': *o++ = '\''; break;
        default: *o++ = '\\'; *o++ = *p; break;
        }
    }
    *o = '\0';
}

bool gen_parse(int argc, char **argv, gen_opts *o, const char *cmd, void (*usage)(FILE *)) {
    memset(o, 0, sizeof *o);
    o->n_predict = -1;
    o->sampling = tr_sampler_default_params();
    o->kv = tr_kv_default_params();
    o->n_prompt_bench = 512;
    o->n_gen_bench = 128;
    o->reps = 3;
    o->expert_prefetch = TR_EXPERT_PREFETCH_AUTO;
    const bool bench = !strcmp(cmd, "bench");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const flag *f = find_flag(a);
        if (!f) {
            cli_error("%s: unknown option '%s' (see terrace %s --help)", cmd, a, cmd);
            return false;
        }
        const char *v = NULL;
        if (f->arg) {
            if (i + 1 >= argc) {
                cli_error("%s: option %s needs a value", cmd, a);
                return false;
            }
            v = argv[++i];
        }
        o->given[f->id / 64] |= 1ull << (f->id % 64);
        long n;
        switch (f->id) {
        case F_MODEL: o->model = v; break;
        case F_PROMPT:
            if (bench) {
                if (!cli_parse_int(a, v, 0, 1 << 20, &n)) return false;
                o->n_prompt_bench = (int32_t)n;
            } else {
                o->prompt = v;
            }
            break;
        case F_FILE: o->prompt_file = v; break;
        case F_NPRED:
            if (!cli_parse_int(a, v, bench ? 0 : -1, 1 << 24, &n)) return false;
            if (bench) o->n_gen_bench = (int32_t)n;
            else o->n_predict = (int32_t)n;
            break;
        case F_CTX: if (!cli_parse_int(a, v, 1, 1 << 24, &n)) return false; o->n_ctx = (int32_t)n; break;
        case F_BATCH: if (!cli_parse_int(a, v, 1, 1 << 16, &n)) return false; o->n_batch = (int32_t)n; break;
        case F_THREADS: if (!cli_parse_int(a, v, 1, 1024, &n)) return false; o->n_threads = (int32_t)n; break;
        case F_SEED: {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') {
                cli_error("%s expects a non-negative integer, got '%s'", a, v);
                return false;
            }
            o->sampling.seed = s;
            break;
        }
        case F_TEMP: if (!parse_float(a, v, -1e9, 1e9, &o->sampling.temp)) return false; break;
        case F_TOPK: if (!cli_parse_int(a, v, -1, INT32_MAX, &n)) return false; o->sampling.top_k = (int32_t)n; break;
        case F_TOPP: if (!parse_float(a, v, -1e9, 1e9, &o->sampling.top_p)) return false; break;
        case F_MINP: if (!parse_float(a, v, -1e9, 1e9, &o->sampling.min_p)) return false; break;
        case F_REPPEN: if (!parse_float(a, v, -1e9, 1e9, &o->sampling.repeat_penalty)) return false; break;
        case F_REPLAST: if (!cli_parse_int(a, v, -1, 1 << 24, &n)) return false; o->sampling.repeat_last_n = (int32_t)n; break;
        case F_PRESPEN: if (!parse_float(a, v, -1e9, 1e9, &o->sampling.presence_penalty)) return false; break;
        case F_FREQPEN: if (!parse_float(a, v, -1e9, 1e9, &o->sampling.frequency_penalty)) return false; break;
        case F_NOMMAP: o->no_mmap = true; break;
        case F_IGNEOS: o->ignore_eos = true; break;
        case F_NODISP: o->no_display_prompt = true; break;
        case F_ESCAPE: o->escape = true; break;
        case F_STOP:
            if (bench) { /* llama-bench's -r is the repetition count */
                if (!cli_parse_int(a, v, 1, 1000, &n)) return false;
                o->reps = (int32_t)n;
                break;
            }
            if (o->n_stop == (int)(sizeof o->stop / sizeof o->stop[0])) {
                cli_error("at most %d stop strings", o->n_stop);
                return false;
            }
            if (!*v) {
                cli_error("%s: empty stop string", a);
                return false;
            }
            o->stop[o->n_stop++] = v;
            break;
        case F_SYS: o->system = v; break;
        case F_TEMPLATE: o->chat_template = v; break;
        case F_REASONING:
            /* llama.cpp's names; its "deepseek" is what auto does here */
            if (!strcmp(v, "none")) o->reasoning_none = true;
            else if (!strcmp(v, "auto") || !strcmp(v, "deepseek")) o->reasoning_none = false;
            else {
                cli_error("--reasoning-format expects auto or none, got '%s'", v);
                return false;
            }
            break;
        case F_VERBOSE: o->verbose = true; break;
        case F_JSON: o->json = true; break;
        case F_REPS: if (!cli_parse_int(a, v, 1, 1000, &n)) return false; o->reps = (int32_t)n; break;
        case F_TELEMETRY: o->telemetry = v; break;
        case F_EXPERTS:
            if (!strcmp(v, "cache")) o->experts_mmap = false;
            else if (!strcmp(v, "mmap")) o->experts_mmap = true;
            else {
                cli_error("--experts expects cache or mmap, got '%s'", v);
                return false;
            }
            break;
        case F_ECACHE: {
            unsigned long long b = 0;
            if (!strcmp(v, "min")) b = TR_EXPERT_CACHE_MIN;
            else if (strcmp(v, "auto") && !cli_parse_size(a, v, &b)) return false;
            else if (strcmp(v, "auto") && b == 0) { /* 0 is the library's "auto": say it */
                cli_error("--expert-cache 0 holds no expert: give a size, min (the smallest legal "
                          "budget) or auto");
                return false;
            }
            o->expert_cache = b;
            break;
        }
        case F_MEMBUDGET: {
            unsigned long long b = 0;
            if (strcmp(v, "auto") && !cli_parse_size(a, v, &b)) return false;
            o->mem_budget = b;
            break;
        }
        case F_EPOLICY: o->expert_policy = v; break;
        case F_EPREFETCH:
            if (!strcmp(v, "auto")) {
                o->expert_prefetch = TR_EXPERT_PREFETCH_AUTO;
                break;
            }
            if (!cli_parse_int(a, v, 0, 64, &n)) return false;
            o->expert_prefetch = (int)n;
            break;
        case F_ELOOKAHEAD:
            if (strcmp(v, "on") && strcmp(v, "off")) {
                cli_error("%s expects on or off, got '%s'", a, v);
                return false;
            }
            o->expert_lookahead = !strcmp(v, "on");
            break;
        case F_IOTHREADS: if (!cli_parse_int(a, v, 1, 64, &n)) return false; o->io_threads = (int)n; break;
        case F_ROUTETRACE: o->route_trace = v; break;
        case F_KVPOLICY: {
            tr_error e = {0};
            if (tr_kv_policy_parse(v, &o->kv.policy, &e)) {
                cli_error("--kv-policy: %s", e.msg);
                return false;
            }
            break;
        }
        case F_KVALPHA: if (!parse_float(a, v, 1e-6, 1.0, &o->kv.alpha)) return false; break;
        case F_KVSINK: if (!cli_parse_int(a, v, 0, 1 << 20, &n)) return false; o->kv.n_sink = (int32_t)n; break;
        case F_KVWINDOW: if (!cli_parse_int(a, v, 0, 1 << 24, &n)) return false; o->kv.n_window = (int32_t)n; break;
        case F_KVBITS:
            if (!cli_parse_int(a, v, 4, 8, &n) || (n != 4 && n != 8)) {
                cli_error("--kv-score-bits expects 8 or 4, got '%s'", v);
                return false;
            }
            o->kv.score_bits = (int)n;
            break;
        case F_KVTAIL:
            if (!cli_parse_int(a, v, 0, 8, &n) || (n != 0 && n != 4 && n != 8)) {
                cli_error("--kv-tail expects 0, 4 or 8, got '%s'", v);
                return false;
            }
            o->kv.tail_bits = (int)n;
            break;
        case F_KVTAILMIN: if (!parse_float(a, v, 0.0, 1e6, &o->kv.tail_min)) return false; break;
        case F_KVHOT: {
            unsigned long long b = 0;
            if (!cli_parse_size(a, v, &b)) return false;
            o->kv.hot_bytes = b;
            break;
        }
        case F_KVCOLD: o->kv.cold_dir = v; break;
        case F_KVKEEP: o->kv.keep = true; break;
        case F_CSD: o->kv.csd = true; break;
        case F_KVSPEC: o->kv.spec = true; break;
        case F_KVPRESEL: o->kv.prefill_select = true; break;
        case F_DRYRUN: o->dry_run = true; break;
        case F_CSDSOCKET:
            o->kv.csd = true;
            o->kv.csd_socket = v;
            break;
        case F_KVBETA: if (!parse_float(a, v, 0.0, 1e6, &o->kv.research.beta)) return false; break;
        case F_KVHOSTKEYS: if (!cli_parse_int(a, v, 1, 1 << 24, &n)) return false; o->kv.host_keys = (int32_t)n; break;
        case F_KVAPPRATES: {
            double r[4];
            char *end = NULL;
            const char *p = v;
            int k = 0;
            for (; k < 4; k++) {
                errno = 0;
                r[k] = strtod(p, &end);
                if (errno || end == p || !(r[k] >= 0 && r[k] <= 1e6)) break;
                p = end;
                if (k < 3) {
                    if (*p != ',') break;
                    p++;
                }
            }
            if (k < 4 || *end) {
                cli_error("%s expects four numbers >= 0 separated by commas (host and agent "
                          "scoring in M tokens/s, hot-pool copies and agent rows in GB/s), got '%s'",
                          a, v);
                return false;
            }
            o->kv.research.app_f_c = r[0] * 1e6;
            o->kv.research.app_f_s = r[1] * 1e6;
            o->kv.research.app_b_c = r[2] * 1e9;
            o->kv.research.app_b_s = r[3] * 1e9;
            break;
        }
        case F_CSDCHUNK: if (!cli_parse_int(a, v, 16, 1 << 20, &n)) return false; o->kv.csd_chunk = (int32_t)n; break;
        case F_CSDGBPS: case F_CSDGFLOPS: case F_CSDLINK: {
            float r;
            if (!parse_float(a, v, 1e-6, 1e6, &r)) return false;
            if (f->id == F_CSDGBPS) o->kv.research.csd_gbps = r;
            else if (f->id == F_CSDGFLOPS) o->kv.research.csd_gflops = r;
            else o->kv.research.csd_link_gbps = r;
            break;
        }
        case F_CSDTIMEOUT: {
            float r;
            if (!parse_float(a, v, 0.001, 1e6, &r)) return false;
            o->kv.csd_timeout = r;
            break;
        }
        case F_KVBKP: {
            tr_error e = {0};
            if (tr_kv_bkp_parse(v, &o->kv.bkp, &e)) {
                cli_error("--kv-bkp expects off, on or naive, got '%s'", v);
                return false;
            }
            break;
        }
        case F_CHUNKS: if (!cli_parse_int(a, v, 1, 1 << 20, &n)) return false; o->n_chunks = (int32_t)n; break;
        case F_JINJA: o->jinja = true; break;
        case F_HELP: usage(stdout); exit(0);
        }
    }
    if (!o->model) {
        cli_error("%s: no model given (-m FILE.gguf)", cmd);
        usage(stderr);
        return false;
    }
    if (o->prompt && o->escape) {
        char *copy = strdup(o->prompt);
        if (!copy) return false;
        unescape(copy);
        o->prompt = copy; /* lives until exit */
    }
    return gen_check_flags(o, cmd);
}

/* ---------------------------------------------------------------------------------------------- */

volatile sig_atomic_t cli_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    cli_interrupted = 1;
}

void cli_catch_interrupt(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

bool cli_abort_on_interrupt(void *user) {
    (void)user;
    return cli_interrupted != 0;
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* a process's VmHWM in MiB, -1 if it cannot be read */
static double vm_hwm_mib(const char *status) {
    FILE *f = fopen(status, "r");
    if (!f) return -1.0;
    char line[128];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) {
            fclose(f);
            return (double)kb / 1024.0;
        }
    fclose(f);
    return -1.0;
}

double agent_peak_rss_mib(const tr_kv_stats *kv) {
    if (kv->csd_pid <= 0) return 0.0;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)kv->csd_pid);
    const double v = vm_hwm_mib(path);
    return v < 0 ? 0.0 : v;
}

double peak_rss_mib(void) {
    /* VmHWM is this process's own high-water mark; getrusage's ru_maxrss also keeps the parent's
     * from before exec (a Python harness's ~80 MiB would hide a small model's peak) */
    const double v = vm_hwm_mib("/proc/self/status");
    if (v >= 0) return v;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

double current_rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long pages = 0, rss = 0;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return (double)rss * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

void progress_bar(const char *what, uint64_t done, uint64_t total) {
    static double last;
    if (!isatty(2) || total == 0) return;
    const double t = now_ms();
    if (done < total && t - last < 100) return; /* ~10 updates a second */
    last = t;
    const int width = 30, fill = (int)((double)width * (double)done / (double)total);
    fprintf(stderr, "\r%-10s [", what);
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %5.1f%%", 100.0 * (double)done / (double)total);
    if (done >= total) fputs("\r\033[K", stderr); /* clear the bar when done */
    fflush(stderr);
}

static void load_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    progress_bar(what, done, total);
}

bool load_model(const gen_opts *o, loaded *out) {
    memset(out, 0, sizeof *out);
    tr_error err = {0};
    tr_model_params mp = tr_model_default_params();
    mp.n_threads = o->n_threads;
    mp.no_mmap = o->no_mmap;
    mp.progress = load_progress;
    mp.experts = o->experts_mmap ? TR_EXPERTS_MMAP : TR_EXPERTS_CACHE;
    mp.expert_cache_bytes = o->expert_cache;
    mp.mem_budget_bytes = o->mem_budget;
    mp.expert_policy = o->expert_policy;
    mp.expert_prefetch = o->expert_prefetch;
    mp.expert_lookahead = o->expert_lookahead;
    mp.io_threads = o->io_threads;
    mp.session_ctx = o->n_ctx;
    mp.session_batch = o->n_batch;
    mp.session_bytes = o->sessions_bytes;
    const double t0 = now_ms();
    if (tr_model_load(o->model, &mp, &out->model, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    if (!o->probe_load && !gen_check_model_flags(o, out->model)) {
        tr_model_free(out->model);
        out->model = NULL;
        out->usage_error = true;
        return false;
    }
    if (!(out->tok = tr_model_tokenizer(out->model))) {
        cli_error("%s: the file has no vocabulary (tokenizer.ggml.model): it cannot turn text "
                  "into tokens", o->model);
        tr_model_free(out->model);
        out->model = NULL;
        return false;
    }
    out->load_ms = now_ms() - t0;
    if (tr_model_warning(out->model)) cli_warning("%s", tr_model_warning(out->model));
    if (tr_tokenizer_warning(out->tok))
        cli_warning("%s: tokenizer: %s", o->model, tr_tokenizer_warning(out->tok));
    tr_expert_budget_plan plan;
    tr_model_expert_plan(out->model, &plan);
    if (plan.automatic) fprintf(stderr, "terrace: expert cache auto: %s\n", plan.how);
    if (o->route_trace && tr_model_route_trace_open(out->model, o->route_trace, &err)) {
        cli_error("%s", err.msg);
        unload_model(out);
        return false;
    }
    return true;
}

void unload_model(loaded *l) {
    tr_error err = {0};
    if (l->model && tr_model_route_trace_close(l->model, &err))
        cli_error("%s", err.msg);
    tr_model_free(l->model);
    memset(l, 0, sizeof *l);
}

int32_t *tokenize_into(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                       bool parse_special, size_t *n, tr_error *err) {
    size_t cap = len + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) {
        snprintf(err->msg, sizeof err->msg, "out of memory tokenizing %zu bytes", len);
        return NULL;
    }
    size_t dropped = 0;
    int first = -1;
    tr_status s = tr_tokenize_ex(t, text, len, add_special, parse_special, ids, cap, n, &dropped,
                                 &first, err);
    if (s == TR_E_ARG && *n > cap) {
        cap = *n;
        int32_t *g = realloc(ids, cap * sizeof *ids);
        if (!g) {
            free(ids);
            snprintf(err->msg, sizeof err->msg, "out of memory tokenizing %zu bytes", len);
            return NULL;
        }
        ids = g;
        s = tr_tokenize(t, text, len, add_special, parse_special, ids, cap, n, err);
    }
    if (s) {
        free(ids);
        return NULL;
    }
    if (dropped)
        cli_warning("%zu character%s of the text (the first: byte 0x%02X) %s no token in this "
                    "model's vocabulary (tokenizer.ggml.tokens) and %s left out",
                    dropped, dropped == 1 ? "" : "s", first, dropped == 1 ? "has" : "have",
                    dropped == 1 ? "is" : "are");
    return ids;
}

int32_t *tokenize_alloc(const tr_tokenizer *t, const char *text, size_t len, bool add_special,
                        bool parse_special, size_t *n) {
    tr_error err = {0};
    int32_t *ids = tokenize_into(t, text, len, add_special, parse_special, n, &err);
    if (!ids) cli_error("tokenizing: %s", err.msg);
    return ids;
}

char *read_file(const char *path, size_t *len) {
    /* a file read whole, where no smaller bound is known: never without one (/dev/zero) */
    return read_file_max(path, (size_t)1 << 30, "a text file read whole may hold", len);
}

int piece_of(const tr_tokenizer *t, int32_t id, char *buf, size_t cap) {
    const int n = tr_token_to_piece(t, id, buf, cap, false);
    return n < 0 ? 0 : n;
}

static const char *mib_str(uint64_t b, char *s, size_t cap) {
    snprintf(s, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
    return s;
}

double plan_host_mib(const tr_mem_plan *pl) {
    const uint64_t other = pl->margin_bytes + pl->kv_agent_bytes;
    return pl->total_bytes > other ? (double)(pl->total_bytes - other) / (1024.0 * 1024.0) : 0.0;
}

void print_plan(FILE *f, const tr_mem_plan *pl, const char *prefix) {
    char a[32], b[32], c[32], d[32], e[32], g[32], h[32], k[32];
    char agent[96] = "", m[32];
    if (pl->kv_agent_bytes) /* its own process: this one's peak RSS does not hold it */
        snprintf(agent, sizeof agent, " + the storage agent's own %s",
                 mib_str(pl->kv_agent_bytes, m, sizeof m));
    fprintf(f, "%splan         budget %s (%s): weights %s + expert cache %s + KV %s (%s)%s + scratch "
               "%s + process %s + margin %s = %s\n",
            prefix, mib_str(pl->cap_bytes, a, sizeof a), pl->cap_source,
            mib_str(pl->weight_bytes, b, sizeof b), mib_str(pl->expert_cache_bytes, c, sizeof c),
            mib_str(pl->kv_bytes, d, sizeof d), tr_kv_policy_name(pl->kv_policy), agent,
            mib_str(pl->scratch_bytes, e, sizeof e), mib_str(pl->process_bytes, k, sizeof k),
            mib_str(pl->margin_bytes, g, sizeof g), mib_str(pl->total_bytes, h, sizeof h));
    fprintf(f, "%splan         KV of %d tokens: hot in DRAM %s (every token hot: %s)%s%s; experts left on "
               "storage %s%s\n",
            prefix, pl->n_ctx, mib_str(pl->kv_hot_bytes, a, sizeof a),
            mib_str(pl->kv_full_bytes, b, sizeof b), pl->kv_cold_bytes ? ", cold pool on storage " : "",
            pl->kv_cold_bytes ? mib_str(pl->kv_cold_bytes, c, sizeof c) : "",
            mib_str(pl->expert_spill_bytes, d, sizeof d),
            pl->total_bytes > pl->cap_bytes ? "; OVER THE BUDGET" : "");
}

void print_kv_note(const tr_session *s, bool verbose) {
    const char *note = tr_session_kv_note(s);
    if (note && *note && (verbose || tr_session_kv_policy(s) != TR_KV_FULL))
        fprintf(stderr, "terrace: %s\n", note);
}

void print_kv_stats(FILE *f, const tr_session *s, const char *prefix) {
    tr_kv_stats kv;
    tr_session_get_kv_stats(s, &kv);
    char buf[4096];
    tr_kv_stats_format(&kv, TR_KV_STATS_TEXT, prefix, buf, sizeof buf);
    fputs(buf, f);
}

tr_session_params session_params(const gen_opts *o) {
    tr_session_params sp = tr_session_default_params();
    sp.kv = o->kv;
    sp.n_ctx = o->n_ctx;
    sp.n_batch = o->n_batch;
    return sp;
}
