#!/usr/bin/env bash
# A MoE model bigger than memory: a synthetic qwen3moe Q4_K_M model of >= 1 GiB (18 layers, 64
# experts, top-8, expert FFN 512, hidden 1024; random weights, quantized by llama.cpp) run inside
# a memory cgroup capped at half the file size (page cache counted), caches dropped before each
# run, 64 generated tokens:
#   terrace with the expert cache | terrace --experts mmap | llama.cpp (mmap, repacking off)
# plus, in the same run, what `dd iflag=direct` reads from the same file, and terrace uncapped
# with a budget that holds every expert next to its dense path (--experts mmap, warm).
# Needs root (cgroup v1 memory controller, drop_caches). Results: bench/results/moe.md.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
NGEN=${NGEN:-64}
OUT=bench/results/moe.md
CG=/sys/fs/cgroup/memory/terrace-bench
mkdir -p bench/results build/bench

model=build/bench/qwen3moe-1g-Q4_K_M.gguf
if [ ! -f "$model" ]; then
    echo "bench: writing the synthetic qwen3moe model (F16, then Q4_K_M by llama.cpp)" >&2
    .venv/bin/python3 tests/py/synth.py qwen3moe-1g F16 build/bench/qwen3moe-1g-F16.gguf
    .venv-peer/bin/python3 tests/py/llama_ref.py quantize build/bench/qwen3moe-1g-F16.gguf "$model" 15
    rm -f build/bench/qwen3moe-1g-F16.gguf
fi
size=$(stat -c %s "$model")
cap=$((size / 2))

if [ ! -d /sys/fs/cgroup/memory ] || ! mkdir -p "$CG" 2>/dev/null; then
    echo "bench: needs the cgroup v1 memory controller at /sys/fs/cgroup/memory (and root)" >&2
    exit 1
fi
echo "$cap" > "$CG/memory.limit_in_bytes"
echo 0 > "$CG/memory.swappiness" 2>/dev/null || true

drop() { sync; echo 1 > /proc/sys/vm/drop_caches; }
# run a command inside the capped cgroup
capped() { bash -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' _ "$@"; }

prompt="Once upon a time"
toks=$(python3 -c "print(','.join(str((i * 37 + 11) % 1000) for i in range(16)))")

# 1. dd: the storage's direct-read bandwidth on this file
drop
dd_out=$(dd if="$model" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1)
dd_gbs=$(echo "$dd_out" | awk '{for (i=1;i<=NF;i++) if ($i ~ /[GM]B\/s/) {v=$(i-1); u=$i}} END {if (u=="MB/s") v=v/1000; print v}')

# 2. terrace, expert cache (budget: auto = the cgroup limit minus dense weights and headroom)
run_terrace() { # label, extra flags...
    local label=$1
    shift
    drop
    local tel=build/bench/moe-$label.jsonl
    rm -f "$tel"
    capped ./build/terrace run -m "$model" -p "$prompt" -n "$NGEN" --temp 0 --ignore-eos -t "$THREADS" -c 256 \
        --no-display-prompt --telemetry "$tel" "$@" >/dev/null 2>build/bench/moe-$label.err || {
        echo "bench: terrace $label failed:" >&2; tail -5 build/bench/moe-$label.err >&2; return 1; }
    python3 - "$tel" build/bench/moe-$label.err <<'PY'
import json, sys, re
rows = [json.loads(l) for l in open(sys.argv[1])]
err = open(sys.argv[2]).read()
m = re.search(r"generated\s+(\d+) tokens\s+([\d.]+) ms\s+([\d.]+) tok/s", err)
last = rows[-1]
dec_ms = float(m.group(2))
pf = re.search(r"prefetch\s+(\d+) predictions, ([\d.]+)% right; (\d+) reads issued, (\d+) used", err)
print(json.dumps({"tok_s": float(m.group(3)), "majflt": last["majflt"], "bytes_read": last["bytes_read"],
                  "pf_acc": float(pf.group(2)) if pf else None, "pf_issued": int(pf.group(3)) if pf else 0,
                  "pf_used": int(pf.group(4)) if pf else 0,
                  "pf_wasted_mb": last["prefetch_wasted_bytes"] / 2**20,
                  "hit_rate": last["hit_rate"], "io_wait_ms": last["io_wait_ms"],
                  "read_gbs": last["bytes_read"] / max(1e-9, last["io_busy_ms"] / 1e3) / 1e9,
                  "io_busy_ms": last["io_busy_ms"], "wall_ms": last["t_ms"],
                  "rss_mb": max(r["rss_mb"] for r in rows)}))
PY
}
cache=$(run_terrace cache)
lru=$(run_terrace lru --expert-policy lru)
prefetch=$(run_terrace prefetch --expert-prefetch 8)
mmapr=$(run_terrace mmap --experts mmap)

# 3. llama.cpp: mmap, weight repacking off (use_extra_bufts = false), inside the same cgroup
drop
llama=$(capped .venv-peer/bin/python3 - "$model" "$NGEN" "$THREADS" <<'PY'
import json, resource, sys, time
import llama_cpp
import llama_cpp.llama_cpp as lc
orig = lc.llama_model_default_params
def no_repack():
    p = orig()
    p.use_extra_bufts = False
    return p
lc.llama_model_default_params = no_repack
llama_cpp.llama_model_default_params = no_repack
model, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(model_path=model, n_ctx=256, n_threads=threads, n_threads_batch=threads,
                      use_mmap=True, verbose=False)
toks = llm.tokenize(b"Once upon a time", add_bos=True)
llm.eval(toks)
t0 = time.perf_counter()
for i in range(n):
    llm.eval([(i * 37 + 11) % 1000])
dt = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"tok_s": n / dt, "majflt": ru.ru_majflt, "rss_mb": ru.ru_maxrss / 1024}))
PY
)

# 4. uncapped: a budget that holds every expert vs the dense path (warm page cache, 3 runs each)
full=$(./build/terrace bench -m "$model" -p 0 -n "$NGEN" -r 5 -t "$THREADS" --expert-cache 4G --json)
dense=$(./build/terrace bench -m "$model" -p 0 -n "$NGEN" -r 5 -t "$THREADS" --experts mmap --json)

python3 - "$model" "$size" "$cap" "$dd_gbs" "$cache" "$mmapr" "$llama" "$full" "$dense" "$THREADS" "$NGEN" "$lru" "$prefetch" > "$OUT" <<'PY'
import json, sys, datetime
model, size, cap, dd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cache, mm, ll = (json.loads(x) for x in sys.argv[5:8])
full, dense = json.loads(sys.argv[8])[0], json.loads(sys.argv[9])[0]
threads, ngen = sys.argv[10], sys.argv[11]
lru, pf = json.loads(sys.argv[12]), json.loads(sys.argv[13])
mib = 1 << 20
print("# MoE bigger than memory: terrace expert cache vs mmap vs llama.cpp\n")
print(f"{datetime.date.today()}, {threads} threads, `bench/bench_moe.sh`. Model: `{model}` "
      f"({size / mib:.0f} MiB; synthetic qwen3moe, 18 layers, 64 experts, top-8, expert FFN 512, "
      f"hidden 1024, Q4_K_M by llama.cpp). Memory cgroup limit {cap / mib:.0f} MiB (half the file; "
      f"page cache counted), caches dropped before each run, {ngen} tokens decoded after a short prompt.\n")
print("| run | tok/s | vs llama.cpp | major faults | expert bytes read | hit rate | peak RSS |")
print("|---|---:|---:|---:|---:|---:|---:|")
print(f"| llama.cpp (mmap, repack off) | {ll['tok_s']:.2f} | 1.00x | {ll['majflt']} | – | – | {ll['rss_mb']:.0f} MiB |")
print(f"| terrace --experts mmap | {mm['tok_s']:.2f} | {mm['tok_s'] / ll['tok_s']:.2f}x | {mm['majflt']} | – | – | {mm['rss_mb']:.0f} MiB |")
print(f"| **terrace expert cache** | **{cache['tok_s']:.2f}** | **{cache['tok_s'] / ll['tok_s']:.2f}x** | "
      f"{cache['majflt']} | {cache['bytes_read'] / mib:.0f} MiB | {100 * cache['hit_rate']:.1f}% | {cache['rss_mb']:.0f} MiB |")
print(f"| terrace expert cache, --expert-policy lru | {lru['tok_s']:.2f} | {lru['tok_s'] / ll['tok_s']:.2f}x | "
      f"{lru['majflt']} | {lru['bytes_read'] / mib:.0f} MiB | {100 * lru['hit_rate']:.1f}% | {lru['rss_mb']:.0f} MiB |")
print(f"| terrace expert cache, --expert-prefetch 8 | {pf['tok_s']:.2f} | {pf['tok_s'] / ll['tok_s']:.2f}x | "
      f"{pf['majflt']} | {pf['bytes_read'] / mib:.0f} MiB | {100 * pf['hit_rate']:.1f}% | {pf['rss_mb']:.0f} MiB |")
print()
print(f"- policy: default (auto = layered) vs LRU in the capped run: {100 * cache['hit_rate']:.1f}% vs "
      f"{100 * lru['hit_rate']:.1f}% hits, {cache['tok_s']:.2f} vs {lru['tok_s']:.2f} tok/s")
if pf["pf_acc"] is not None:
    print(f"- prefetch (next layer's router on this layer's input, 8 experts): {pf['pf_acc']:.1f}% of the "
          f"experts the router then chose had been predicted; {pf['pf_issued']} reads issued, {pf['pf_used']} used, "
          f"{pf['pf_wasted_mb']:.0f} MiB wasted; I/O wait {pf['io_wait_ms']:.0f} ms vs {cache['io_wait_ms']:.0f} ms "
          f"without; {pf['tok_s']:.2f} vs {cache['tok_s']:.2f} tok/s — "
          + ("it pays off" if pf["tok_s"] > cache["tok_s"] * 1.02 else "it does not pay off here, so it stays off by default"))
print(f"- major faults, expert cache vs terrace mmap: {cache['majflt']} vs {mm['majflt']} "
      f"({100 * cache['majflt'] / max(1, mm['majflt']):.1f}%; target <= 10%)")
print(f"- read bandwidth achieved by the expert cache: {cache['read_gbs']:.2f} GB/s (bytes read / time with a "
      f"read in flight: {cache['io_busy_ms']:.0f} of {cache['wall_ms']:.0f} ms) "
      f"vs `dd iflag=direct` on the same file: {dd:.2f} GB/s ({100 * cache['read_gbs'] / dd:.0f}%)")
print(f"- I/O wait: {cache['io_wait_ms']:.0f} ms of the run")
print(f"- uncapped, budget holding every expert: {full['avg_ts']:.2f} ± {full['stddev_ts']:.2f} tok/s vs the "
      f"dense path (--experts mmap, warm) {dense['avg_ts']:.2f} ± {dense['stddev_ts']:.2f} tok/s "
      f"({100 * full['avg_ts'] / dense['avg_ts']:.1f}%; target >= 95%)")
PY
rmdir "$CG" 2>/dev/null || true
cat "$OUT"
