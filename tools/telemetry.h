#ifndef TR_TOOLS_TELEMETRY_H
#define TR_TOOLS_TELEMETRY_H

#include "common.h"

#define TELEM_WINDOW 256

typedef struct gen_sink_info {
    const char *extra; /* more "key": value pairs for the JSON line, or NULL */
} gen_sink_info;

typedef struct telem {
    tr_model *model;
    tr_session *sess; /* for the KV figures; may be NULL */
    FILE *f;
    const char *path;
    bool status, shown;
    int rows; /* terminal rows when the bottom line is reserved for the status */
    double t0, last_status;
    double times[TELEM_WINDOW];
    int n_times;
} telem;

/* path may be NULL (status line only, when stderr is a terminal) */
bool telem_open(telem *t, const char *path, tr_model *m);
/* after each generated token: JSON line + status line (at most 4 updates a second); false, with
 * the error printed, when the telemetry file cannot be written (a full disk) */
bool telem_token(telem *t, int32_t index, int32_t token, double ttft_ms, const gen_sink_info *info);
/* false, with the error printed, when the file's last lines could not be written */
bool telem_close(telem *t);

#endif
