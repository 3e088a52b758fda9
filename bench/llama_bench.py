#!/usr/bin/env python3
"""llama.cpp's side of bench/bench_dense.sh, through llama-cpp-python (.venv-peer): the same
measurement as `terrace bench` — pp: N random tokens evaluated at once from an empty context;
tg: N tokens decoded one at a time from an empty context; each repeated after a warm-up — with
llama.cpp's default settings (flash attention auto, weight repacking on, mmap).

usage: llama_bench.py MODEL N_PROMPT N_GEN REPS THREADS   -> one JSON line
"""
import json
import resource
import statistics
import sys
import time

import llama_cpp

model, n_prompt, n_gen, reps, threads = sys.argv[1], *map(int, sys.argv[2:6])
t0 = time.perf_counter()
llm = llama_cpp.Llama(model_path=model, n_ctx=max(n_prompt, n_gen) + 8, n_batch=512, n_ubatch=512,
                      n_threads=threads, n_threads_batch=threads, verbose=False, seed=0)
load_ms = (time.perf_counter() - t0) * 1e3
n_vocab = llm.n_vocab()
x, toks = 0x9E3779B97F4A7C15, []
for _ in range(max(n_prompt, n_gen)):
    x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 7
    x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
    toks.append(x % n_vocab)
llm.eval(toks[:1])  # warm-up, as llama-bench
res = {}
for test, n in (("pp", n_prompt), ("tg", n_gen)):
    if n <= 0:
        continue
    tps = []
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        if test == "pp":
            llm.eval(toks[:n])
        else:
            for t in toks[:n]:
                llm.eval([t])
        tps.append(n / (time.perf_counter() - t0))
    res[f"{test}{n}"] = {"avg_ts": statistics.mean(tps),
                         "stddev_ts": statistics.stdev(tps) if reps > 1 else 0.0}
res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
res["load_ms"] = load_ms
print(json.dumps(res))
