/*
 * Route traces: which experts each layer's router picked, token by token, in the CSV format of
 * BigMoeOnEdge's --route-trace (../shared/testdata/routes/), so traces recorded by terrace and by
 * that project replay through the same `terrace replay`.
 *
 *     # route_trace v1
 *     # model=PATH arch=ARCH n_layer=N n_expert=E n_expert_used=K
 *     # layer=L expert_bytes=B dense_bytes=D          one line per layer with routed experts
 *     turn,phase,step,layer,slot,expert,weight,residency,expert_bytes
 *     0,0,0,0,0,49,0.221297,0,3059712
 *
 * Columns: turn; phase 0 prefill / 1 decode; step = token position; layer; slot = rank of the
 * expert in the router's top-k (0 = highest weight); expert id; router weight (%g); residency 1
 * when the expert was already in the cache; expert_bytes = bytes read for this row (0 on a hit or
 * when an earlier row of the same batch loaded it). Other '#' lines are comments.
 */
#ifndef TR_EXPERTS_TRACE_H
#define TR_EXPERTS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "terrace.h"

typedef struct tr_trace_info {
    const char *model; /* path of the model file (no newline) */
    const char *arch;  /* GGUF architecture (no whitespace) */
    int32_t n_layer, n_expert, n_expert_used;
    /* [n_layer]: bytes of one expert of each layer (0: no routed experts, no header line) and
     * of the layer's dense weights */
    const uint64_t *expert_bytes;
    const uint64_t *dense_bytes;
} tr_trace_info;

typedef struct tr_trace_row {
    int32_t turn, step, layer, slot, expert;
    uint8_t phase;     /* 0 prefill, 1 decode */
    uint8_t residency; /* 1: already resident */
    float weight;
    uint64_t expert_bytes;
} tr_trace_row;

/* ---------------------------------------------------------------------------------------------- */
/* Reading                                                                                        */

typedef struct tr_trace tr_trace;

/* Reads and validates a whole trace. Errors name the file and line: TR_E_IO when it cannot be
 * read, TR_E_FORMAT for anything malformed (wrong version, missing or repeated header lines,
 * wrong column line, bad numbers, ids out of range, a row for a layer without a header line). */
tr_status tr_trace_read(const char *path, tr_trace **out, tr_error *err);
/* the same from memory (`name` for messages); text need not be NUL-terminated */
tr_status tr_trace_parse(const char *text, size_t len, const char *name, tr_trace **out,
                         tr_error *err);
void tr_trace_free(tr_trace *t);

/* valid while the trace lives */
const tr_trace_info *tr_trace_get_info(const tr_trace *t);
const tr_trace_row *tr_trace_rows(const tr_trace *t, size_t *n_rows);

/* ---------------------------------------------------------------------------------------------- */
/* Writing                                                                                        */

typedef struct tr_trace_writer tr_trace_writer;

/* Creates (truncates) path and writes the header. The info arrays are read here only. */
tr_status tr_trace_writer_open(const char *path, const tr_trace_info *info, tr_trace_writer **out,
                               tr_error *err);
/* Appends one row; validated against the header (TR_E_ARG) so a reader will accept the file.
 * Buffered: no allocation, one formatted line per call. */
tr_status tr_trace_write_row(tr_trace_writer *w, const tr_trace_row *row, tr_error *err);
/* Flushes and closes; always frees w. TR_E_IO when a write failed (disk full). */
tr_status tr_trace_writer_close(tr_trace_writer *w, tr_error *err);

#endif
