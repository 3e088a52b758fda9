/*
 * BKP: placement between the hot and the cold pool (tiered with a cold pool, --kv-bkp on|naive).
 * It reads the hit counts the selection leaves on the tokens, decays them once per decode step of
 * a layer, promotes cold tokens the selection keeps choosing from the working set (where the
 * gather has just put their verified records) and demotes the hot tokens chosen least.
 * Placement never changes which tokens are selected, only where their rows are read from.
 */
#ifndef TR_KV_KV_BKP_H
#define TR_KV_KV_BKP_H

#include "kv/kv_store.h"

/* a token moving both ways within this many steps of its layer is a ping-pong move */
#define TR_KV_PINGPONG_W 64

typedef struct tr_kv_bkp_state {
    tr_kv_store *st;
    tr_kv_bkp mode;
    int32_t n_sink, n_window;
    uint32_t *moved;  /* [n_layer][n_ctx] (step << 1 | 1 promoted / 0 demoted) of the last move,
                         0 never moved */
    uint32_t *step;   /* [n_layer] decode steps (selective rows) of the layer, from 1 */
    int32_t *att_hi;  /* [n_layer] the highest position a row has attended from, -1 none */
    /* scratch: [hot_slots] victims (position, key, order); [ws_cap] promotion candidates */
    int32_t *vpos;
    float *vkey;
    int32_t *vidx;
    int32_t *cand;
    uint64_t pingpong; /* moves reversing one made within TR_KV_PINGPONG_W steps */
} tr_kv_bkp_state;

tr_status tr_kv_bkp_init(tr_kv_bkp_state *B, tr_kv_store *st, const tr_kv_params *p,
                         uint64_t *total, tr_error *err);
void tr_kv_bkp_free(tr_kv_bkp_state *B);
/* a free hot slot for an append (the store's make_room hook): demote by the policy */
bool tr_kv_bkp_make_room(void *B, int32_t layer);
/* one decode step of a layer begins at row pos: step count, hit decay */
void tr_kv_bkp_step(tr_kv_bkp_state *B, int32_t layer, int32_t pos);
/* after the gather of list entries [c0, c1) (in working-set slots slot0 + i - c0): promote the
 * cold ones the policy wants hot, copying their verified records from the working set */
void tr_kv_bkp_promote(void *B, int32_t layer, const int32_t *T, int32_t c0, int32_t c1,
                       const uint8_t *skip, int32_t slot0);
/* positions >= n of a layer dropped */
void tr_kv_bkp_dropped(tr_kv_bkp_state *B, int32_t layer, int32_t n);

#endif
