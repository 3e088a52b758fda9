/*
 * Mapped files that shrink under the process. Reading a page of a shared file mapping that lies
 * past the file's end raises SIGBUS, which kills the process without a word: that is what a model
 * file truncated (or rewritten shorter) while terrace runs would do, on any thread that touches
 * the weights — the caller's or a pool worker's.
 *
 * A guard turns that into an error. Every read-only mapping of a model file is registered here;
 * the first registration installs a SIGBUS handler (process-wide, chaining to the one it
 * replaces for faults elsewhere). A fault inside a registered mapping replaces the mapping from
 * the faulting page to its end with zero pages and records the fault; the faulting load is
 * restarted and reads zeros, on whichever thread it was, so no thread is interrupted mid-task
 * and no lock is left held. Whoever computed with those zeros then asks the guard and fails the
 * request naming the file, so the zeros never reach an output (the forward pass checks once per
 * call; see tr_gguf_check_mapping).
 */
#ifndef TR_CORE_MAPGUARD_H
#define TR_CORE_MAPGUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tr_mapguard tr_mapguard;

/* guard [base, base + len) (a read-only mapping); NULL if the guard could not be set up, in
 * which case the mapping works as before, unguarded */
tr_mapguard *tr_mapguard_add(void *base, size_t len);
/* stop guarding (before the mapping is unmapped); the entry is reused by a later add */
void tr_mapguard_remove(tr_mapguard *g);
/* true once a read of the mapping faulted; *offset: the first faulting byte's offset in it */
bool tr_mapguard_faulted(const tr_mapguard *g, uint64_t *offset);

#endif
