/*
 * The KV cache's door for the rest of the library (the session and the forward pass): the
 * interface in include/terrace_seam.h (the cache on its own, as the KV tests and bench_kv drive it
 * too) and the parameters and statistics in include/terrace.h. One instance per session.
 *
 * Policies (--kv-policy), each owning its state behind one interface (kv_core.h):
 *   full     all KV in DRAM, exact attention — the accuracy reference, llama.cpp's numerics;
 *            kv_full.c, whose attention function is the forward pass's attention
 *   offload  KV beyond the hot budget in the cold pool on storage; exact attention that reads all
 *            of it every step (the naive SSD-offload baseline)
 *   h2o      accumulated-attention eviction with a recent window (permanent)
 *   quest    16-token pages with per-channel min/max key bounds; the pages with the highest bound
 *   tiered   every token scored by q.k against an INT8 (or INT4) copy of the keys with per-channel
 *            scales (on the host, or next to storage in the storage agent), the top alpha by
 *            attention mass summed over heads plus sinks and a recent window, gathered from the
 *            hot or the cold pool into the working set and attended
 * The four that pool their KV share the storage layer (kv_store.h: hot pool, cold pool of
 * checksummed pages, working set) and the attention over a gathered list (kv_pooled.h).
 *
 * Selection (h2o, quest, tiered at alpha < 1), per query row at position p over the visible keys
 * (p - swa < key <= p): the sinks (key < n_sink) and the window (key > p - n_window) always, plus
 * ceil(alpha * visible) of the others. Every query row is treated as a decode step at its
 * position (teacher-forced perplexity measures what decoding sees); policies that attend every key
 * (offload, and any policy at alpha 1) share one gather among the rows of a call.
 *
 * Threading: tr_kv_attend parallelises on the pool it is given; every other call is made by one
 * thread at a time (the model lock serialises forward passes). The cold pool reads through its
 * own I/O worker threads, created once at create.
 */
#ifndef TR_KV_KV_H
#define TR_KV_KV_H

#include "terrace.h"
#include "terrace_seam.h"

#endif
