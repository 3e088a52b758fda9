/*
 * terrace serve -m MODEL [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY] ...
 *
 * Loads the model once, plans memory for every slot (one budget for the weights, the expert cache
 * and each slot's KV cache), creates the slots, starts the scheduler and the HTTP server, and
 * waits for SIGTERM or SIGINT: then it stops accepting connections, ends every answer in flight
 * at the next step with its final chunk, waits for the answers to be sent, and exits 0.
 */
#include <libgen.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checks.h"
#include "serve.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: terrace serve -m MODEL.gguf [--host 127.0.0.1] [--port 8080] [--parallel N] "
            "[--api-key KEY] [options]\n\n"
            "An OpenAI-compatible server (POST /v1/chat/completions, /v1/completions, GET "
            "/v1/models), Ollama's\n/api/chat, /api/generate, /api/tags, GET /health, /metrics "
            "(Prometheus), /telemetry (SSE) and a\nlive page at GET /. --parallel slots are "
            "decoded together in one batch each step.\n\n"
            "server options:\n"
            "  --host HOST                  address to listen on (default 127.0.0.1: this "
            "machine only)\n"
            "  --port N                     port (default 8080; 0: any free port, printed)\n"
            "  -np,--parallel N             slots: requests generated together (default 4)\n"
            "  --api-key KEY                require Authorization: Bearer KEY on every route "
            "but /health\n"
            "                               (default: $TERRACE_API_KEY if set, else none)\n"
            "  --body-limit SIZE            largest request body (default 1M; larger: 413)\n"
            "  --queue N                    requests waiting for a slot before 503 (default "
            "64)\n"
            "  --prefill-chunk N            prompt tokens per chunk, one chunk per step beside "
            "the generating slots (default 128)\n"
            "  -a,--alias NAME              the model's id in the API (default: the file name)\n"
            "  --timeout S                  close connections idle for S seconds (default 600)\n"
            "\n-c is the context of each slot; -n, --temp, --top-k, ... are the defaults of "
            "requests that\ndo not give them. Run options:\n");
    gen_print_common_flags(f);
}

/* ---------------------------------------------------------------------------------------------- */
/* flags: the server's own, the rest through the run flags                                         */

static bool parse_flags(int argc, char **argv, serve_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->n_slots = 4;
    c->body_limit = 1 << 20;
    c->queue_max = 64;
    c->prefill_chunk = 128;
    c->timeout_s = 600;
    c->api_key = getenv("TERRACE_API_KEY");
    if (c->api_key && !*c->api_key) c->api_key = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return false;
    int nrest = 0;
    rest[nrest++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            serve_usage(stdout);
            exit(0);
        }
        static const char *const own[] = {"--host", "--port", "-np", "--parallel", "--api-key",
                                          "--body-limit", "--queue", "--prefill-chunk", "-a",
                                          "--alias", "--timeout"};
        bool mine = false;
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++) mine = mine || !strcmp(a, own[k]);
        if (!mine) {
            rest[nrest++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            cli_error("serve: option %s needs a value", a);
            free(rest);
            return false;
        }
        const char *v = argv[++i];
        long n;
        unsigned long long sz;
        bool ok = true;
        if (!strcmp(a, "--host")) c->host = v;
        else if (!strcmp(a, "--port")) ok = cli_parse_int(a, v, 0, 65535, &n) && (c->port = (int)n, 1);
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel"))
            ok = cli_parse_int(a, v, 1, 256, &n) && (c->n_slots = (int)n, 1);
        else if (!strcmp(a, "--api-key")) {
            if (!*v) {
                cli_error("serve: --api-key is empty");
                ok = false;
            }
            c->api_key = v;
        } else if (!strcmp(a, "--body-limit")) {
            ok = cli_parse_size(a, v, &sz);
            if (ok && (sz < 1024 || sz > (1ull << 30))) {
                cli_error("serve: --body-limit must be between 1K and 1G, got '%s'", v);
                ok = false;
            }
            c->body_limit = (size_t)sz;
        } else if (!strcmp(a, "--queue")) ok = cli_parse_int(a, v, 1, 1 << 16, &n) && (c->queue_max = (int)n, 1);
        else if (!strcmp(a, "--prefill-chunk"))
            ok = cli_parse_int(a, v, 1, 1 << 16, &n) && (c->prefill_chunk = (int32_t)n, 1);
        else if (!strcmp(a, "-a") || !strcmp(a, "--alias")) c->alias = v;
        else if (!strcmp(a, "--timeout")) ok = cli_parse_int(a, v, 1, 86400, &n) && (c->timeout_s = (int)n, 1);
        if (!ok) {
            free(rest);
            return false;
        }
    }
    const bool ok = gen_parse(nrest, rest, &c->gen, "serve", serve_usage);
    free(rest);
    if (!ok) return false;
    const gen_opts *o = &c->gen;
    const char *wrong = o->prompt ? "-p" : o->prompt_file ? "-f" : o->system ? "-sys"
                        : o->telemetry ? "--telemetry" : o->json ? "--json"
                        : o->no_display_prompt ? "--no-display-prompt" : NULL;
    if (wrong) {
        cli_error("serve: %s does not apply to the server (prompts come with requests; live "
                  "figures are at /metrics and /telemetry)", wrong);
        return false;
    }
    if (c->gen.n_batch <= 0) c->gen.n_batch = 512;
    return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* memory                                                                                          */

typedef struct mem_plan {
    uint64_t budget;      /* everything below must fit in it */
    uint64_t weights;     /* resident weights */
    bool weights_mapped;  /* the file's own pages: the kernel can drop and re-read them */
    bool expert_cache;    /* routed experts in terrace's cache */
    uint64_t experts;     /* the cache's budget (TR_EXPERT_CACHE_MIN: the smallest legal one) */
    uint64_t per_slot;    /* one slot's session: KV cache (or a KV policy's DRAM) + scratch */
    int n_slots;
    uint64_t headroom;    /* the process and the kernel's own pages */
    uint64_t total;
} mem_plan;

/*
 * The server's one memory budget: weights + expert cache + every slot's session + headroom must
 * fit in --mem-budget (default: the memory cgroup's limit, else MemAvailable). With the expert
 * cache on auto the library sizes it as `terrace run` does (tr_expert_plan: the cap minus what is
 * in use once the dense weights are read, every slot's session, the cache's bookkeeping and a
 * margin; load_auto below). With a size given, or without an expert cache, the plan here checks
 * the fixed part: one that does not fit is refused with the number of slots that would; mapped
 * weights are the kernel's to evict, so over the budget they only warn. Requests are then
 * admitted by slot: every slot's KV is allocated up front, and a request that finds none free
 * waits in the queue.
 */
static bool plan_memory(mem_plan *p, char *why, size_t cap) {
    char b1[32], b2[32], b3[32], b4[32];
    p->headroom = p->budget / 8 + (96u << 20);
    const uint64_t sessions = (uint64_t)p->n_slots * p->per_slot;
    const uint64_t fixed = (p->weights_mapped ? 0 : p->weights) + sessions + p->headroom;
    const uint64_t experts = p->experts == TR_EXPERT_CACHE_MIN ? 0 : p->experts;
    p->total = p->weights + experts + sessions + p->headroom;
    const uint64_t must = fixed + experts;
    if (must > p->budget) {
        const uint64_t other = must - sessions;
        const uint64_t fit = p->budget > other ? (p->budget - other) / p->per_slot : 0;
        snprintf(why, cap, "%d slots of %s each (KV cache + scratch) do not fit the memory budget "
                 "%s next to %s of weights and expert cache and %s headroom: %llu slots would; "
                 "lower --parallel or -c, or raise --mem-budget",
                 p->n_slots, cli_bytes(p->per_slot, b1, sizeof b1),
                 cli_bytes(p->budget, b2, sizeof b2),
                 cli_bytes(other - p->headroom, b3, sizeof b3), cli_bytes(p->headroom, b4, sizeof b4),
                 (unsigned long long)fit);
        return false;
    }
    return true;
}

/* The expert cache on auto: loaded with every slot's session in the plan's session part. A cap
 * that leaves the cache less than its smallest legal budget is refused, naming the slots that
 * would leave it that much. */
static bool load_auto(server *s, const mem_plan *p) {
    gen_opts real = s->cfg.gen;
    real.expert_cache = 0;
    real.sessions_bytes = (uint64_t)p->n_slots * p->per_slot;
    if (!load_model(&real, &s->ld)) return false;
    tr_expert_budget_plan ep;
    tr_model_expert_plan(s->ld.model, &ep);
    char b[7][32];
    if (ep.raised_to_min) {
        const uint64_t other = ep.in_use_bytes + ep.bookkeeping_bytes + ep.margin_bytes +
                               ep.budget_bytes;
        const uint64_t fit = ep.cap_bytes > other ? (ep.cap_bytes - other) / p->per_slot : 0;
        cli_error("serve: %d slots of %s each (KV cache + scratch) leave the expert cache less "
                  "than its smallest budget (%s) under the %s of %s (in use after loading %s, "
                  "margin %s): %llu slots would fit; lower --parallel or -c, or raise "
                  "--mem-budget",
                  p->n_slots, cli_bytes(p->per_slot, b[0], 32), cli_bytes(ep.budget_bytes, b[1], 32),
                  ep.source, cli_bytes(ep.cap_bytes, b[2], 32), cli_bytes(ep.in_use_bytes, b[3], 32),
                  cli_bytes(ep.margin_bytes, b[4], 32), (unsigned long long)fit);
        return false;
    }
    fprintf(stderr, "terrace: memory       %s %s: in use after loading %s (dense weights %s) + "
                    "expert cache %s (auto) + %d slots x %s (KV + scratch) + cache bookkeeping "
                    "%s + margin %s\n",
            ep.source, cli_bytes(ep.cap_bytes, b[0], 32), cli_bytes(ep.in_use_bytes, b[1], 32),
            cli_bytes(ep.dense_bytes, b[2], 32), cli_bytes(ep.budget_bytes, b[3], 32), p->n_slots,
            cli_bytes(p->per_slot, b[4], 32), cli_bytes(ep.bookkeeping_bytes, b[5], 32),
            cli_bytes(ep.margin_bytes, b[6], 32));
    return true;
}

static bool load_planned(server *s) {
    gen_opts *o = &s->cfg.gen;
    const bool want_cache = !o->experts_mmap;
    /* a first load with every weight mapped (nothing read) tells what the model needs */
    gen_opts probe = *o;
    probe.experts_mmap = true;
    probe.no_mmap = false;
    probe.route_trace = NULL;
    probe.probe_load = true;
    if (!load_model(&probe, &s->ld)) return false;
    if (!gen_check_model_flags(o, s->ld.model)) {
        s->ld.usage_error = true;
        return false;
    }
    tr_model_stats ms;
    tr_model_get_stats(s->ld.model, &ms);
    mem_plan p = {.budget = o->mem_budget ? o->mem_budget : tr_mem_available(),
                  .n_slots = s->cfg.n_slots};
    /* --kv-policy auto sizes one session's KV against what the weights leave of the budget (and
     * the probe load maps every expert); the server plans its slots next to the expert cache
     * itself (below), so auto is full here: every slot's KV in DRAM, within that plan, and a
     * budget too small for it is refused naming the slots that fit (--kv-policy tiered spills) */
    if (o->kv.policy == TR_KV_AUTO) o->kv.policy = TR_KV_FULL;
    tr_session_params sp = session_params(o);
    if (sp.n_batch <= 0) sp.n_batch = o->n_batch;
    tr_error err = {0};
    if (tr_session_estimate(s->ld.model, &sp, &p.per_slot, &err)) {
        cli_error("%s", err.msg);
        return false;
    }
    p.expert_cache = ms.moe && want_cache;
    if (p.expert_cache && o->expert_cache == 0) {
        unload_model(&s->ld);
        return load_auto(s, &p);
    }
    p.weights = p.expert_cache ? ms.dense_bytes : tr_model_weight_bytes(s->ld.model);
    p.weights_mapped = !o->no_mmap && !p.expert_cache;
    p.experts = p.expert_cache ? o->expert_cache : 0;
    char why[1024];
    if (!plan_memory(&p, why, sizeof why)) {
        cli_error("serve: %s", why);
        return false;
    }
    if (p.expert_cache || o->no_mmap || o->route_trace) {
        unload_model(&s->ld);
        if (!load_model(o, &s->ld)) return false;
        tr_model_get_stats(s->ld.model, &ms);
        if (p.expert_cache) p.experts = ms.expert_budget_bytes;
    }
    char b[5][32];
    fprintf(stderr, "terrace: memory       budget %s: weights %s%s + expert cache %s + %d slots x "
                    "%s (KV + scratch) + headroom %s\n",
            cli_bytes(p.budget, b[0], 32), cli_bytes(p.weights, b[1], 32),
            p.weights_mapped ? " (mapped)" : "", cli_bytes(p.expert_cache ? p.experts : 0, b[2], 32),
            p.n_slots, cli_bytes(p.per_slot, b[3], 32), cli_bytes(p.headroom, b[4], 32));
    if (p.weights_mapped && p.total > p.budget)
        fprintf(stderr, "terrace: warning: the mapped weights do not fit the budget next to the "
                        "slots: the kernel will re-read them from the file as it evicts them\n");
    return true;
}

int cmd_serve(int argc, char **argv) {
    server *s = calloc(1, sizeof *s);
    if (!s) return CLI_EXIT_ERROR;
    if (!parse_flags(argc, argv, &s->cfg)) {
        free(s);
        return CLI_EXIT_USAGE;
    }
    /* the signals are taken by sigwait below: every thread (the model's pool, the HTTP
     * connections, the scheduler) starts with them blocked */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = CLI_EXIT_ERROR;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->sched_cv, NULL);
    pthread_cond_init(&s->drain_cv, NULL);
    s->started = now_ms();
    s->created = (long)time(NULL);
    tr_error err = {0};
    if (!load_planned(s)) {
        if (s->ld.usage_error) rc = CLI_EXIT_USAGE;
        goto out;
    }
    {
        char *path = strdup(s->cfg.gen.model);
        snprintf(s->model_file, sizeof s->model_file, "%s", path ? basename(path) : "model");
        free(path);
        snprintf(s->model_id, sizeof s->model_id, "%s", s->cfg.alias ? s->cfg.alias : s->model_file);
        char *dot = s->cfg.alias ? NULL : strstr(s->model_id, ".gguf");
        if (dot && !dot[5]) *dot = '\0';
    }
    char twhy[1024];
    if (!api_template_init(s, twhy, sizeof twhy))
        fprintf(stderr, "terrace: warning: %s; chat requests will be refused\n", twhy);
    if (sched_init(s, &err)) {
        cli_error("%s", err.msg);
        goto out;
    }
    if (!sched_start(s)) {
        cli_error("cannot start the scheduler thread");
        goto out;
    }
    char why[512];
    if (!http_start(s, why, sizeof why)) {
        cli_error("serve: %s", why);
        goto out;
    }
    fprintf(stderr, "terrace: serve        %s (%s, %s), %d slots x %d tokens, batch %d, "
                    "%d threads, kernels %s, chat template %s\n",
            s->model_id, tr_model_arch(s->ld.model),
            cli_bytes(tr_model_weight_bytes(s->ld.model), why, sizeof why), s->n_slots, s->n_ctx,
            s->cfg.gen.n_batch, tr_pool_size(tr_model_pool(s->ld.model)), tr_cpu_isa(),
            api_template_name(s));
    fprintf(stderr, "terrace: listening on http://%s:%d/ (%s)\n", s->cfg.host, s->cfg.port,
            s->cfg.api_key ? "API key required" : "no API key");
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "terrace: %s: draining (no new connections; answers in flight end now)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    http_quiesce(s);
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_cond_broadcast(&s->sched_cv);
    pthread_cond_broadcast(&s->drain_cv);
    /* every answer ends at the scheduler's next step; its thread then sends the final chunk */
    const double t0 = now_ms();
    while (s->active_requests > 0 && now_ms() - t0 < 30000) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->drain_cv, &s->mu, &ts);
    }
    const int left = s->active_requests;
    pthread_mutex_unlock(&s->mu);
    if (left) fprintf(stderr, "terrace: %d requests still open after 30 s; closing them\n", left);
    http_stop(s);
    rc = 0;
    fprintf(stderr, "terrace: stopped\n");
out:
    http_stop(s);
    sched_stop(s);
    sched_free(s);
    api_template_free(s);
    if (s->ld.model) unload_model(&s->ld);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->sched_cv);
    pthread_cond_destroy(&s->drain_cv);
    free(s);
    return rc;
}
