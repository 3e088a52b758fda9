/*
 * Token sampling: logits [n_vocab] -> one token id, with llama.cpp's semantics, defaults and flag
 * names (--temp --top-k --top-p --min-p --repeat-penalty --repeat-last-n --presence-penalty
 * --frequency-penalty -s/--seed).
 *
 * The chain is llama.cpp's default order:
 *   penalties -> top-k -> top-p -> min-p -> temperature -> draw
 * so top-p and min-p see the untempered distribution and temperature only reshapes what survived.
 *   - penalties, over the last repeat_last_n accepted tokens (tr_sampler_accept): a token seen
 *     c > 0 times gets logit / repeat_penalty if its logit is positive, logit * repeat_penalty
 *     otherwise, then logit -= c * frequency_penalty + presence_penalty.
 *   - top-k (top_k <= 0: off) keeps the k highest logits; top-p (top_p >= 1: off) keeps the
 *     smallest prefix, by descending probability, whose cumulative probability reaches top_p;
 *     min-p (min_p <= 0: off) keeps tokens with p >= min_p * p_max; each keeps at least one token.
 *     Probabilities are over the tokens still in the set (after top-k, over the k), as llama.cpp
 *     renormalises between filters. The top-p sum is accumulated in double where llama.cpp uses
 *     float, which can move its cut by one token when the sum lands within ~1e-6 of top_p.
 *   - temp <= 0 is greedy: the argmax of the penalised logits (penalties still apply, as in
 *     llama.cpp; the filters cannot change the argmax, so they are skipped).
 * Ties are broken towards the lower token id everywhere (sorting, top-k, greedy), so results are a
 * function of (params, seed, accepted history, logits) only.
 *
 * The draw uses xoshiro256** seeded from `seed` through splitmix64: the same seed gives the same
 * sequence on every platform. (It does not reproduce llama.cpp's mt19937 +
 * std::discrete_distribution draws token for token; those depend on the C++ standard library.)
 *
 * Memory: everything (candidate array and probabilities for n_vocab tokens, the history ring and
 * per-token counts) is allocated by tr_sampler_create; tr_sampler_sample allocates nothing.
 * A sampler is not thread-safe; use one per sequence.
 */
#ifndef TR_TEXT_SAMPLE_H
#define TR_TEXT_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "terrace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* seed value meaning "pick a random seed" (llama.cpp's -s -1; its LLAMA_DEFAULT_SEED 0xFFFFFFFF is
 * read the same way, so `-s -1` means random whether the CLI parses it as 32 or 64 bits) */
#define TR_SAMPLER_SEED_RANDOM UINT64_MAX

typedef struct tr_sampler_params {
    float temp;              /* --temp; <= 0: greedy */
    int32_t top_k;           /* --top-k; <= 0: off */
    float top_p;             /* --top-p, in (0, 1]; 1: off */
    float min_p;             /* --min-p, in [0, 1]; 0: off */
    float repeat_penalty;    /* --repeat-penalty, > 0; 1: off */
    int32_t repeat_last_n;   /* --repeat-last-n, >= 0; 0: no penalties. llama.cpp's -1 ("context
                                size") must be resolved by the caller to n_ctx. */
    float presence_penalty;  /* --presence-penalty; 0: off */
    float frequency_penalty; /* --frequency-penalty; 0: off */
    uint64_t seed;           /* -s/--seed; TR_SAMPLER_SEED_RANDOM (or 0xFFFFFFFF): random */
} tr_sampler_params;

/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.0 (off),
 * repeat_last_n 64, presence/frequency 0 (off), random seed. */
tr_sampler_params tr_sampler_default_params(void);

/* Checks every parameter: TR_E_ARG with a message naming the flag, e.g. "--top-p must be in (0, 1],
 * got 1.5". tr_sampler_create calls it; a CLI may call it early to reject flags before loading. */
tr_status tr_sampler_validate(const tr_sampler_params *p, tr_error *err);

typedef struct tr_sampler tr_sampler;

/* Validates the params and allocates everything the sampler will need for n_vocab tokens. */
tr_status tr_sampler_create(const tr_sampler_params *p, int32_t n_vocab, tr_sampler **out,
                            tr_error *err);
void tr_sampler_free(tr_sampler *s);
/* Forget the accepted history and restart the random sequence from the seed. */
void tr_sampler_reset(tr_sampler *s);
/* Record a token of the sequence (prompt or generated) for the penalties. Ids outside
 * [0, n_vocab) are ignored. */
void tr_sampler_accept(tr_sampler *s, int32_t token);
/* The seed in use (the one drawn at create time if the params asked for a random one), so that a
 * run can be repeated with -s. */
uint64_t tr_sampler_seed(const tr_sampler *s);
const tr_sampler_params *tr_sampler_get_params(const tr_sampler *s);

/* One candidate after the filters: `logit` after penalties and temperature, `p` its probability in
 * the distribution the draw uses. */
typedef struct tr_token_prob {
    int32_t id;
    float logit;
    float p;
} tr_token_prob;

/*
 * Run the chain up to the draw and return the surviving candidates (*n of them, at least 1); the
 * array is the sampler's own and valid until the next call. With top-k on they are in descending
 * order; without it their order is unspecified (top-p then avoids sorting the vocabulary). For
 * greedy (temp <= 0) it is the one argmax token with p = 1. Used by tr_sampler_sample; useful to
 * show probabilities (llama.cpp's --n-probs) or to test.
 * Returns NULL (and *n = 0) for a NULL sampler or logits.
 */
const tr_token_prob *tr_sampler_candidates(tr_sampler *s, const float *logits, size_t *n);

/* Sample one token id from logits [n_vocab] (NaN logits count as -inf). The token is not accepted:
 * call tr_sampler_accept with it (llama.cpp's common_sampler_accept). -1 for NULL arguments. */
int32_t tr_sampler_sample(tr_sampler *s, const float *logits);

#ifdef __cplusplus
}
#endif
#endif
