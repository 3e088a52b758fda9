/*
 * APP: how the scoring of the tokens on storage is split between the host and the storage agent.
 * beta = tokens the host scores / tokens the agent scores among them (the host takes the newest,
 * as many as its key copy holds), chosen every step so that both scorings take the same time:
 * beta = f_c / f_s from their measured rates (running averages, started by one measurement of
 * each path on the first layer's own data). Without the agent, a fixed beta (the research knob)
 * splits host scoring into the same two groups, so that it reproduces the agent's scores exactly.
 */
#ifndef TR_KV_KV_APP_H
#define TR_KV_KV_APP_H

#include <stdbool.h>
#include <stdint.h>

#include "terrace.h"

/* tokens: smaller parts do not update the measured scoring rates (per-call costs dominate them) */
#define TR_KV_APP_MIN_PART 1024
/* layers scored: a side whose part is kept below TR_KV_APP_MIN_PART gets that many tokens once
 * in this many, so that its rate is measured again, and that measurement weighs half (else the
 * split that starved it would keep the rate it had then for good: beta stuck at 9-36 from the
 * start-up measurement on, bench/results/kv.md) */
#define TR_KV_APP_EXPLORE 16

typedef struct tr_kv_app {
    const tr_kv_research *given; /* fixed beta and rates (0: measured) */
    double tc, ts;   /* ns per token scored: host, agent (0: not measured yet) */
    double bc, bs;   /* bytes per ns of rows: hot-pool copies, agent reads */
    double ac, as;   /* selected fraction of the host's / agent's part */
    double beta, beta_split; /* the last beta, and the split once the host's share is capped */
    bool probed;     /* the start-up measurement is done */
    double beta_first; /* the split of the first layer scored with the agent */
    uint32_t explore;  /* layers scored with a split (TR_KV_APP_EXPLORE) */
    int8_t exploring;  /* this layer's split feeds the starved side: 1 host, 2 agent */
} tr_kv_app;

/* the rates the caller gave are set here and never measured */
void tr_kv_app_init(tr_kv_app *A, const tr_kv_research *given);
/* beta for the next step: the fixed one, or equal time on both paths (see kv_app.c for why the
 * row terms of HillInfer's balance drop out here) */
double tr_kv_app_beta(const tr_kv_app *A);
/* of n_a candidates on storage (n_b more the host scores anyway), how many the host scores
 * instead of the agent: beta's share, a starved side fed once in TR_KV_APP_EXPLORE layers */
int32_t tr_kv_app_host_part(tr_kv_app *A, bool agent, int32_t n_a, int32_t n_b);
/* the split that was used: n_c went to the host, n_a stayed with the agent */
void tr_kv_app_note_split(tr_kv_app *A, int32_t n_c, int32_t n_a);
/* one step's measured scoring rates (ns per token; a part too small is not a sample) */
void tr_kv_app_note_scoring(tr_kv_app *A, double host_ns_per_token, int32_t host_n,
                            double agent_ns_per_token, int32_t agent_n);
/* row rates: hot-pool copies (the store's hook) and the agent's reads */
void tr_kv_app_note_hot(void *A, uint64_t bytes, uint64_t ns);
void tr_kv_app_note_agent_rows(tr_kv_app *A, uint64_t bytes, uint64_t ns);
/* how selective each part was (BKP skews it: the hot part holds more winners) */
void tr_kv_app_note_selected(tr_kv_app *A, int32_t k_a, int32_t n_a, int32_t k_c, int32_t n_c);

/* the running averages of the measured rates: the first sample, then 0.9 old + 0.1 new, a sample
 * taken as at most twice and at least half the average, so that one step slowed by something
 * else (a burst of reads on the same cores) moves the average by at most a tenth */
static inline void tr_kv_app_avg(double *avg, double sample) {
    if (*avg > 0) {
        if (sample > 2.0 * *avg) sample = 2.0 * *avg;
        if (sample < 0.5 * *avg) sample = 0.5 * *avg;
    }
    *avg = *avg > 0 ? 0.9 * *avg + 0.1 * sample : sample;
}

#endif
