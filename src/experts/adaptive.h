/*
 * The adaptive expert-cache policies (used by policy.c only; the contract is policy.h's):
 *
 *   knn       evicts the resident expert least likely to be used at its layer's next visit, as
 *             predicted by the routing that followed the most similar moments of the past
 *   adaptive  set dueling: candidate rules (knn, layered, lfu, lru) each run a shadow cache of
 *             the same budget on metadata only (which keys would be resident; no data moved);
 *             the real cache evicts by the rule whose shadow had the most decode hits lately
 *
 * Why a neighbour predictor. A router's choice is a function of the hidden state, and the hidden
 * state of a token is reflected in the experts every layer chose for it: the routing of the last
 * n_layer layer steps is a fingerprint of where the model is. Past moments with a similar
 * fingerprint tend to be followed by similar routing (a phrase coming back, a style held), which
 * no recency or frequency count sees. The fingerprint of "now" is token t's choices on the layers
 * already computed plus token t-1's on the rest; it is compared with the same window ending one
 * to H tokens earlier (overlap of the chosen experts, layer by layer), and the neighbours' next
 * choices, weighted by overlap^3, give each expert its probability of use at its layer's next
 * visit. Ties (experts no neighbour used) fall back to the LRFU value.
 *
 * Why dueling. No rule wins everywhere: a trace whose expert popularity is stable favours LFU,
 * one whose popular set keeps moving favours LRU, the shared Qwen3 trace favours layered and
 * knn. The shadows measure each rule on the routing this model actually produces, online, so no
 * rule or constant is chosen for a model in advance.
 *
 * Cost: the fingerprint is one bitmask per (token, layer); updating the similarity of every lag
 * is two popcounts per lag per layer step; a prediction (only at steps that evict) takes the 32
 * most similar lags and adds their masks: 32 x n_layer x top-k. Victims are found by a scan of
 * the evictable items. All memory is sized at creation.
 */
#ifndef TR_EXPERTS_ADAPTIVE_H
#define TR_EXPERTS_ADAPTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "experts/policy.h"

typedef struct tr_adapt tr_adapt;

/* duel: run the shadows and follow the best rule (adaptive); false: the knn rule alone.
 * NULL when out of memory. p must be fully initialised except p->ad. */
tr_adapt *tr_adapt_create(const tr_policy *p, bool duel);
void tr_adapt_free(tr_adapt *a);

/* a layer step: records the fingerprint (info may be NULL), marks the step's experts */
void tr_adapt_route(tr_adapt *a, const tr_policy *p, int32_t layer,
                    const tr_policy_route_info *info);
/* one access of key k, after p's shared counters were updated: the shadows see it */
void tr_adapt_access(tr_adapt *a, const tr_policy *p, uint32_t k);
/* the real cache's next victim among p->ev (UINT32_MAX when empty) */
uint32_t tr_adapt_victim(tr_adapt *a, const tr_policy *p, int32_t staging, uint64_t incoming);
/* decode layer steps each rule led, [TR_POLICY_N_RULES] */
void tr_adapt_lead_steps(const tr_adapt *a, uint64_t *out);

#endif
