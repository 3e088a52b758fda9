#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *tr_status_name(tr_status s) {
    switch (s) {
    case TR_OK: return "ok";
    case TR_E_ARG: return "invalid argument";
    case TR_E_IO: return "I/O error";
    case TR_E_FORMAT: return "bad file format";
    case TR_E_UNSUPPORTED: return "unsupported";
    case TR_E_NOMEM: return "out of memory";
    case TR_E_BUDGET: return "budget too small";
    case TR_E_INTERNAL: return "internal error";
    case TR_E_ABORTED: return "aborted";
    }
    return "unknown status";
}

tr_status tr_fail(tr_error *err, tr_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void tr_error_prefix(tr_error *err, const char *fmt, ...) {
    if (!err) return;
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n < sizeof err->msg) {
        /* the old message is cut at the buffer's end if the two do not fit together */
        const size_t room = sizeof err->msg - (size_t)n - 1;
        const size_t len = strnlen(old, sizeof old);
        const size_t take = len < room ? len : room;
        memcpy(err->msg + n, old, take);
        err->msg[(size_t)n + take] = '\0';
    }
}
