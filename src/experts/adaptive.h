/*
 * The adaptive expert-cache policies (used by policy.c only; the contract is policy.h's):
 *
 *   knn       evicts the resident expert least likely to be used at its layer's next visit, as
 *             predicted by the routing that followed the most similar moments of the past
 *   adaptive  set dueling: the candidate rules knn, layered, lfu and lru each run a shadow cache
 *             of the same budget on metadata only (which experts would be resident; no data is
 *             moved); the real cache evicts by the rule whose shadow had the most decode hits
 *             lately (a challenger must lead by more than the score's noise to take over)
 *
 * Why a neighbour predictor. A router's choice is a function of the hidden state, and the hidden
 * state of a token shows in the experts every layer chose for it: the routing of the last
 * n_layer layer steps is a fingerprint of where the model is. Past moments with a similar
 * fingerprint tend to be followed by similar routing (a phrase coming back, a style or a topic
 * held), which no recency or frequency count sees. The fingerprint of "now" is token t's choices
 * on the layers already computed plus token t-1's on the rest; it is compared with the same
 * window ending 1 to HIST tokens earlier (experts chosen by both, layer by layer), and the
 * neighbours' next choices, weighted by that overlap cubed, vote for each expert's use at its
 * layer's next visit (and, at half the weight per token, at the few visits after it). Experts no
 * neighbour chose are ordered by their LRFU value.
 *
 * Why dueling. No rule wins everywhere: routing whose popular experts stay popular favours LFU,
 * routing whose popular set keeps moving favours LRU, the shared Qwen3 trace favours layered and
 * knn, the synthetic models knn. The shadows measure each rule on the routing this model
 * produces, online, so no rule and no constant is chosen for a model in advance.
 *
 * Cost: the fingerprint is one bitmask per (token, layer); updating the similarity of every lag
 * is two popcounts per lag per layer step; a prediction (only at steps that evict) takes the
 * NEIGH most similar lags and adds their choices: NEIGH x HORIZON x n_layer x top-k. Victims come from one
 * scan of the evictable items per layer step. The shadows are ordinary policies (knn's scans like
 * the real cache, with the same predictor), fed each step's lookups when the next step begins,
 * on a sample of at most 8 layers. A cache whose layers fall into several size classes (one policy
 * each) runs one duel for all of them (tr_policy_params.duel), so the predictor and the shadows
 * cost the same whatever the number of classes. All memory is sized at creation.
 */
#ifndef TR_EXPERTS_ADAPTIVE_H
#define TR_EXPERTS_ADAPTIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "experts/policy.h"

/* the routing-neighbour predictor */
typedef struct tr_adapt tr_adapt;

tr_adapt *tr_adapt_create(int32_t n_layer, int32_t n_expert, int32_t n_expert_used);
void tr_adapt_free(tr_adapt *a);
/* a layer step: records the fingerprint (info may be NULL) */
void tr_adapt_route(tr_adapt *a, int32_t layer, const tr_policy_route_info *info);
/* [n_layer * n_expert] the neighbours' vote for each key's use at its layer's next visit, for
 * the current layer step (all 0 inside a multi-row batch or before any history) */
const float *tr_adapt_predict(tr_adapt *a);
/* the same, only the rows of the layers with need[l] > 0 (the others hold what they held): a
 * shadow asks for its sampled layers. Rows already made at this step are kept, so the real
 * cache and a shadow asking at one step share them. */
const float *tr_adapt_predict_layers(tr_adapt *a, const uint64_t *need);

/* set dueling */
typedef struct tr_duel tr_duel;

tr_status tr_duel_create(const tr_policy_params *pp, tr_duel **out, tr_error *err);
void tr_duel_free(tr_duel *d);
/* a layer step of the real cache: the previous step's lookups reach the shadows, the leader is
 * chosen again at a token boundary, and the shadows see this step's route */
void tr_duel_route(tr_duel *d, int32_t layer, const tr_policy_route_info *info);
/* one lookup of the real cache */
void tr_duel_access(tr_duel *d, int32_t layer, int32_t expert);
/* feeds the shadows the current decode step's lookups now rather than at the next route (the
 * expert cache calls it when its thread has to wait for a read anyway); false when there was
 * nothing to feed. Only a decode step, whose lookups all come in one acquire: the shadows then
 * see the same steps, and the leader and the predictor, which do not move before the next
 * route, are not affected. */
bool tr_duel_feed_now(tr_duel *d);
int tr_duel_lead(const tr_duel *d); /* a rule (tr_policy_rule_name) */
const float *tr_duel_predict(tr_duel *d);
void tr_duel_lead_steps(const tr_duel *d, uint64_t *out); /* [TR_POLICY_N_RULES] */

/* the next victim of a knn or adaptive policy among p->ev (UINT32_MAX when empty) */
uint32_t tr_adapt_victim(tr_policy *p, int32_t staging, uint64_t incoming);

#endif
