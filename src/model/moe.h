/* Mixture-of-experts FFN (src/model/moe.c). */
#ifndef TR_MODEL_MOE_H
#define TR_MODEL_MOE_H

#include "model/session.h"

/* one row's routing: logits [n_expert] (overwritten) -> k expert ids and weights */
void tr_moe_route(const tr_model *m, float *logits, int32_t *sel, float *w);

/* out[r] = MoE FFN of sc->xn[r] for rows r < rows of layer l */
tr_status tr_moe_ffn(tr_model *m, tr_scratch *sc, int32_t l, int32_t rows, float *out,
                     tr_error *err);

#endif
