/* Internal error helpers: fill a caller's tr_error with a formatted message. */
#ifndef TR_CORE_ERROR_H
#define TR_CORE_ERROR_H

#include "terrace.h"

#if defined(__GNUC__)
#define TR_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TR_PRINTF(a, b)
#endif

/* Sets err (if non-NULL) and returns status, so callers can `return tr_fail(err, ...)`. */
tr_status tr_fail(tr_error *err, tr_status status, const char *fmt, ...) TR_PRINTF(3, 4);
/* Prefix an existing message with context ("loading model: " + old message). */
void tr_error_prefix(tr_error *err, const char *fmt, ...) TR_PRINTF(2, 3);

#endif
