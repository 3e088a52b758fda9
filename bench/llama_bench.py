#!/usr/bin/env python3
"""llama.cpp's side of bench/bench_dense.sh: the measurement `terrace bench` makes, on llama.cpp's
low-level API (through llama-cpp-python in .venv-peer) with llama.cpp's own defaults —
llama_context_default_params (flash attention auto) and llama_model_default_params (extra buffer
types, i.e. weight repacking, on; mmap) — the way llama-bench runs it, not through the Llama
class, which turns flash attention off unless asked.

Tests: ppN (N random tokens evaluated in batches of -b), tgN (N tokens decoded one at a time),
each at a context already filled to a depth (@dD). The depth is filled once; before each run the
cache is cut back to it (llama_memory_seq_rm), which leaves it as llama-bench's refill does. Each
test runs once untimed (warm-up), then REPS times. The context holds the deepest test.

usage: llama_bench.py MODEL TESTS REPS THREADS [BATCH]     TESTS: e.g. pp512,tg128,pp512@d4096
       -> one JSON line: {"pp512": {"avg_ts", "stddev_ts", "samples_ts"}, ..., "peak_rss_mib"}
"""
import ctypes
import json
import resource
import statistics
import sys
import time

import llama_cpp as L


def parse(test):
    name, _, depth = test.partition("@d")
    kind, n = name[:2], int(name[2:])
    assert kind in ("pp", "tg"), test
    return kind, n, int(depth or 0)


def main():
    model, tests, reps, threads = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    batch = int(sys.argv[5]) if len(sys.argv) > 5 else 512
    L.llama_backend_init()
    specs = [parse(t) for t in tests]
    n_ctx = max(d + n for _, n, d in specs) + 8
    mp = L.llama_model_default_params()
    t0 = time.perf_counter()
    m = L.llama_model_load_from_file(model.encode(), mp)
    if not m:
        sys.exit(f"llama_bench.py: cannot load {model}")
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = batch
    cp.n_ubatch = batch
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(m, cp)
    load_ms = (time.perf_counter() - t0) * 1e3
    mem = L.llama_get_memory(ctx)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
    x, toks = 0x9E3779B97F4A7C15, []
    for _ in range(2 * n_ctx):
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        toks.append(x % n_vocab)
    arr = (L.llama_token * len(toks))(*toks)

    def decode(start, n):
        """tokens toks[start:start+n] at the next positions, in batches of `batch`"""
        done = 0
        while done < n:
            k = min(batch, n - done)
            b = L.llama_batch_get_one(ctypes.cast(ctypes.byref(arr, 4 * (start + done)),
                                                  ctypes.POINTER(L.llama_token)), k)
            if L.llama_decode(ctx, b) != 0:
                sys.exit("llama_bench.py: llama_decode failed")
            done += k
        L.llama_synchronize(ctx)

    def run(kind, n, depth):
        L.llama_memory_seq_rm(mem, -1, depth, -1)
        t = time.perf_counter()
        if kind == "pp":
            decode(n_ctx, n)
        else:
            for i in range(n):
                decode(n_ctx + i, 1)
        return n / (time.perf_counter() - t)

    res = {}
    filled = -1
    for test, (kind, n, depth) in sorted(zip(tests, specs), key=lambda s: s[1][2]):
        if depth != filled:  # fill the context to this depth once, untimed
            L.llama_memory_clear(mem, True)
            if depth:
                decode(0, depth)
            filled = depth
        run(kind, n, depth)  # warm-up
        tps = [run(kind, n, depth) for _ in range(reps)]
        res[test] = {"avg_ts": statistics.mean(tps),
                     "stddev_ts": statistics.stdev(tps) if reps > 1 else 0.0, "samples_ts": tps}
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["load_ms"] = load_ms
    res["flash_attn_type"] = int(cp.flash_attn_type)
    print(json.dumps(res))
    L.llama_free(ctx)
    L.llama_model_free(m)


if __name__ == "__main__":
    main()
