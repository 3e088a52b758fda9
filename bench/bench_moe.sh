#!/usr/bin/env bash
# A MoE model bigger than memory: a synthetic qwen3moe Q4_K_M model of >= 1 GiB (18 layers, 64
# experts, top-8, expert FFN 512, hidden 1024; random weights, quantized by llama.cpp) run inside
# a memory cgroup capped at half the file size (page cache counted), caches dropped before each
# run, 64 generated tokens:
#   terrace's default (--expert-cache auto, adaptive policy, --expert-prefetch auto: the next
#   layer's predicted top-k read ahead at the ranks whose reads were used at least half the time)
#   and the same without read-ahead and with the whole predicted top-k read ahead, with the router
#   lookahead, LRU at the same budget, the previous default (the old auto budget and policy
#   layered, given explicitly), the default of another build (PREV=path/to/terrace, e.g. the
#   previous commit's), terrace --experts mmap, llama.cpp (mmap, repacking off)
# and, in the same run, the physical limit of the capped run: terrace uncapped with every expert
# cached (the compute side), the disk's rate for expert-sized O_DIRECT reads at terrace's queue
# depth (bench/disk_rate.py), the bytes each capped run missed per token, and dd's rate.
# REPS (default 3) rounds of the main capped runs, interleaved. Needs root (cgroup v1 memory
# controller, drop_caches). Results: bench/results/moe.md.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
NGEN=${NGEN:-64}
REPS=${REPS:-3}
OUT=${OUT:-bench/results/moe.md}
CG=/sys/fs/cgroup/memory/terrace-bench
RAW=build/bench/moe-runs.jsonl
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
# run a command inside the capped cgroup, its peak usage reset first
capped() {
    echo 0 > "$CG/memory.max_usage_in_bytes" 2>/dev/null || true
    bash -c 'echo $$ > '"$CG"'/cgroup.procs; exec "$@"' _ "$@"
}

prompt="Once upon a time"
rm -f "$RAW"

# 1. the storage: dd's sequential direct reads, and expert-sized O_DIRECT reads at the queue depth
#    terrace uses (--io-threads default 4, 512 KiB chunks) and at 1
drop
dd_out=$(dd if="$model" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1)
dd_gbs=$(echo "$dd_out" | awk '{for (i=1;i<=NF;i++) if ($i ~ /[GM]B\/s/) {v=$(i-1); u=$i}} END {if (u=="MB/s") v=v/1000; print v}')
drop
disk4=$(.venv/bin/python3 bench/disk_rate.py "$model" --threads 4 --json)
drop
disk1=$(.venv/bin/python3 bench/disk_rate.py "$model" --threads 1 --json)

# 2. the previous default's budget: the cap less the dense weights, a default session, an eighth
#    of the cap and 96 MiB (what `auto` chose before it measured the headroom)
plan0=$(./build/terrace run -m "$model" -p "x" -n 1 --temp 0 --mem-budget "$cap" --expert-policy lru 2>&1 >/dev/null | grep "expert cache auto" || true)
old_budget=$(python3 - "$plan0" "$cap" <<'PY'
import re, sys
line, cap = sys.argv[1], int(sys.argv[2])
dense = float(re.search(r"dense weights (\d+) MiB", line).group(1))
sess = float(re.search(r"session (\d+) MiB", line).group(1))
mib = 1 << 20
print(int(cap - dense * mib - sess * mib - cap / 8 - 96 * mib))
PY
)

# 3. capped runs
run_terrace() { # label, extra flags...
    local label=$1
    shift
    drop
    local tel=build/bench/moe-$label.jsonl
    rm -f "$tel"
    capped "${BIN:-./build/terrace}" run -m "$model" -p "$prompt" -n "$NGEN" --temp 0 --ignore-eos -t "$THREADS" -c 256 \
        --no-display-prompt --telemetry "$tel" "$@" >/dev/null 2>build/bench/moe-$label.err || {
        echo "bench: terrace $label failed:" >&2; tail -5 build/bench/moe-$label.err >&2; return 1; }
    local cg_peak
    cg_peak=$(cat "$CG/memory.max_usage_in_bytes" 2>/dev/null || echo 0)
    python3 - "$tel" build/bench/moe-$label.err "$label" "$cg_peak" >> "$RAW" <<'PY'
import json, sys, re
rows = [json.loads(l) for l in open(sys.argv[1])]
err = open(sys.argv[2]).read()
m = re.search(r"generated\s+(\d+) tokens\s+([\d.]+) ms\s+([\d.]+) tok/s", err)
pf = re.search(r"prefetch\s+(\d+) predictions, ([\d.]+)% right; (\d+) reads issued, (\d+) used", err)
plan = re.search(r"expert cache auto: (.*)", err)
last = rows[-1]
# steady state: from the 9th token on (the first ones fill the cache and touch its tables)
a, b = rows[min(8, len(rows) - 2)], last
n_ss = b["token"] - a["token"]
dec_ms = (b["t_ms"] - a["t_ms"]) / n_ss
print(json.dumps({
    "label": sys.argv[3], "tok_s": float(m.group(3)), "majflt": last["majflt"],
    "bytes_read": last["bytes_read"], "hit_rate": last["hit_rate"],
    "io_wait_ms": last["io_wait_ms"], "io_busy_ms": last["io_busy_ms"], "wall_ms": last["t_ms"],
    "read_gbs": last["bytes_read"] / max(1e-9, last["io_busy_ms"] / 1e3) / 1e9,
    "rss_mb": max(r["rss_mb"] for r in rows), "cg_peak_mb": int(sys.argv[4]) / 2**20,
    "budget_mb": last["budget_bytes"] / 2**20,
    "missed_per_tok": (b["bytes_read"] - a["bytes_read"]) / n_ss,
    # every decode step's bytes read and the span they took, for the limit token by token
    "step_bytes": [rows[i]["bytes_read"] - rows[i - 1]["bytes_read"] for i in range(1, len(rows))],
    "span_ms": last["t_ms"] - rows[0]["t_ms"],
    "dec_ms_per_tok": dec_ms,
    "ss_wait_ms": (b["io_wait_ms"] - a["io_wait_ms"]) / n_ss,
    "policy_us_per_tok": 1e3 * (b["policy_ms"] - a["policy_ms"]) / n_ss,
    "hidden_us_per_tok": 1e3 * (b.get("policy_hidden_ms", 0) - a.get("policy_hidden_ms", 0)) / n_ss,
    "protected_evictions": last["protected_evictions"],
    "pf_acc": float(pf.group(2)) if pf else None, "pf_issued": int(pf.group(3)) if pf else 0,
    "pf_used": int(pf.group(4)) if pf else 0, "pf_wasted_mb": last["prefetch_wasted_bytes"] / 2**20,
    "plan": plan.group(1) if plan else None}))
PY
}
PREV=${PREV:-}
for r in $(seq "$REPS"); do
    run_terrace "adaptive-$r" --expert-lookahead off
    run_terrace "noprefetch-$r" --expert-prefetch 0 --expert-lookahead off
    run_terrace "topk-$r" --expert-prefetch 8 --expert-lookahead off # the model's whole top-k
    run_terrace "lookahead-$r" --expert-lookahead on
    run_terrace "lru-$r" --expert-policy lru --expert-lookahead off
    run_terrace "previous-$r" --expert-cache "$old_budget" --expert-policy layered --expert-prefetch 0 \
        --expert-lookahead off
    if [ -n "$PREV" ]; then BIN=$PREV run_terrace "prevbuild-$r" --expert-lookahead off; fi
done
# the plan counts mapped weights whole: a budget above the file lets the kernel page them under the cap
run_terrace mmap --experts mmap --mem-budget $((size * 2))

# 4. llama.cpp: mmap, weight repacking off (use_extra_bufts = false), inside the same cgroup
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

# 5. uncapped: a budget that holds every expert vs the dense path (warm page cache, 5 runs each)
full=$(./build/terrace bench -m "$model" -p 0 -n "$NGEN" -r 5 -t "$THREADS" --expert-cache 4G --json)
dense=$(./build/terrace bench -m "$model" -p 0 -n "$NGEN" -r 5 -t "$THREADS" --experts mmap --json)

python3 - "$model" "$size" "$cap" "$dd_gbs" "$RAW" "$llama" "$full" "$dense" "$THREADS" "$NGEN" \
    "$disk4" "$disk1" "$old_budget" "$(git rev-parse --short HEAD)" \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$(grep -o -m1 'avx512f' /proc/cpuinfo || echo avx2)" > "$OUT" <<'PY'
import json, os, sys, datetime, statistics as S
(model, size, cap, dd, raw, ll, full, dense, threads, ngen, disk4, disk1, old_budget, commit,
 cpu, isa) = sys.argv[1:17]
size, cap, dd, old_budget = int(size), int(cap), float(dd), int(old_budget)
ll, full, dense = json.loads(ll), json.loads(full)[0], json.loads(dense)[0]
d4, d1 = json.loads(disk4), json.loads(disk1)
runs = [json.loads(l) for l in open(raw)]
mib = 1 << 20
def group(name):
    return [r for r in runs if r["label"] == name or r["label"].startswith(name + "-")]
def mean(rs, k):
    return S.mean(r[k] for r in rs)
def rng(rs, k, f="{:.2f}"):
    v = [r[k] for r in rs]
    return f.format(S.mean(v)) + (f" ({f.format(min(v))}–{f.format(max(v))})" if len(v) > 1 else "")
unc = full["avg_ts"]
disk = d4["gbs"] * 1e9
# the limit token by token: each decode step takes at least the uncapped step time and at least
# its own bytes read at the disk's rate (the first steps after the prompt read far more than the
# steady state: a mean of the steady state's misses would put the limit too high)
def limit(rs):
    return S.mean(len(r["step_bytes"]) / sum(max(1.0 / unc, b / disk) for b in r["step_bytes"])
                  for r in rs)
def of_limit(rs):
    return S.mean(sum(max(1.0 / unc, b / disk) for b in r["step_bytes"]) / (r["span_ms"] / 1e3)
                  for r in rs)
print("# MoE bigger than memory: terrace expert cache vs mmap vs llama.cpp\n")
print(f"{datetime.date.today()}, commit {commit}, {cpu} ({'AVX-512' if isa == 'avx512f' else 'AVX2'}), "
      f"{threads} threads, `bench/bench_moe.sh` (REPS={len(group('adaptive'))}). Model: `{model}` "
      f"({size / mib:.0f} MiB; synthetic qwen3moe, 18 layers, 64 experts, top-8, expert FFN 512, "
      f"hidden 1024, Q4_K_M by llama.cpp). Memory cgroup limit {cap / mib:.0f} MiB (half the file; "
      f"page cache counted), caches dropped before each run, {ngen} tokens decoded after a short "
      f"prompt, greedy. Capped rows give the mean (and range) of their rounds.\n")
print("| run | budget MiB | tok/s | vs llama.cpp | hit rate | MiB missed/token | peak RSS MiB | cgroup peak MiB (of the cap) | policy µs/token (of decode) | of it hidden in read waits |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
print(f"| llama.cpp (mmap, repack off) | – | {ll['tok_s']:.2f} | 1.00x | – | – | {ll['rss_mb']:.0f} | – | – | – |")
rows = [("terrace default: auto budget, adaptive, read-ahead of the predicted top-k at the ranks that pay off", "adaptive"),
        ("… --expert-prefetch 0 (no read-ahead)", "noprefetch"),
        ("… --expert-prefetch 8 (the whole predicted top-k read ahead)", "topk"),
        ("… with --expert-lookahead on", "lookahead"),
        ("… --expert-policy lru", "lru"),
        ("the previous default (old auto budget, layered, no read-ahead)", "previous"),
        ("the default of " + os.environ.get("PREV_NAME", "PREV"), "prevbuild"),
        ("terrace --experts mmap", "mmap")]
for title, key in rows:
    rs = group(key)
    if not rs:
        continue
    pol = S.mean(r["policy_us_per_tok"] for r in rs)
    dms = S.mean(r["dec_ms_per_tok"] for r in rs)
    print(f"| {title} | {mean(rs, 'budget_mb'):.0f} | {rng(rs, 'tok_s')} | {mean(rs, 'tok_s') / ll['tok_s']:.1f}x | "
          f"{100 * mean(rs, 'hit_rate'):.1f}% | {mean(rs, 'missed_per_tok') / mib:.1f} | {mean(rs, 'rss_mb'):.0f} | "
          f"{mean(rs, 'cg_peak_mb'):.0f} ({100 * mean(rs, 'cg_peak_mb') * mib / cap:.0f}%) | "
          + (f"{pol:.0f} ({100 * pol / 1e3 / dms:.2f}%) | "
             f"{S.mean(r['hidden_us_per_tok'] for r in rs):.0f}" if key != "mmap" else "– | –")
          + " |")
print()
a, la, lr, pv = group("adaptive"), group("lookahead"), group("lru"), group("previous")
print("## The physical limit of the capped run\n")
print(f"- uncapped, every expert cached (warm): **{unc:.2f} ± {full['stddev_ts']:.2f} tok/s** "
      f"(the dense path through mmap: {dense['avg_ts']:.2f} ± {dense['stddev_ts']:.2f}, "
      f"{100 * unc / dense['avg_ts']:.1f}%)")
print(f"- the disk, expert-sized O_DIRECT reads ({d4['expert_bytes'] / 1024:.0f} KiB experts in ≤ 512 KiB "
      f"reads) at queue depth 4 (terrace's I/O threads): **{d4['gbs']:.2f} GB/s**; at depth 1 "
      f"{d1['gbs']:.2f} GB/s; `dd iflag=direct` sequential {dd:.2f} GB/s")
print("- limit: every decode step takes max(1 / uncapped tok/s, its bytes read / disk rate); limit "
      "tok/s = steps / the sum of those; of the limit = that sum / the steps' measured span:\n")
print("| run | tok/s | limit tok/s | of the limit | of uncapped |")
print("|---|---:|---:|---:|---:|")
np_, pb = group("noprefetch"), group("prevbuild")
for title, rs in (("default (adaptive, read-ahead)", a), ("no read-ahead", np_),
                  ("whole top-k read ahead", group("topk")), ("with lookahead", la),
                  ("lru", lr), ("previous default", pv), ("default of " + os.environ.get("PREV_NAME", "PREV"), pb)):
    if rs:
        lim = limit(rs)
        print(f"| {title} | {mean(rs, 'tok_s'):.2f} | {lim:.2f} | {100 * of_limit(rs):.0f}% | "
              f"{100 * mean(rs, 'tok_s') / unc:.0f}% |")
print()
if a and a[0]["plan"]:
    print(f"- `auto` under the cap: {a[0]['plan']}")
print(f"- the previous default's budget, given explicitly: {old_budget / mib:.0f} MiB (cap − dense weights − "
      f"a default session − cap/8 − 96 MiB)")
if a and pv:
    print(f"- default vs the previous default in the same run: {mean(a, 'tok_s'):.2f} vs {mean(pv, 'tok_s'):.2f} tok/s "
          f"({mean(a, 'tok_s') / mean(pv, 'tok_s'):.2f}x), cgroup peak {mean(a, 'cg_peak_mb'):.0f} vs "
          f"{mean(pv, 'cg_peak_mb'):.0f} MiB")
if a and lr:
    print(f"- adaptive vs LRU at the same budget: {100 * mean(a, 'hit_rate'):.1f}% vs {100 * mean(lr, 'hit_rate'):.1f}% hits, "
          f"{mean(a, 'tok_s'):.2f} vs {mean(lr, 'tok_s'):.2f} tok/s; policy time per token "
          f"{mean(a, 'policy_us_per_tok'):.0f} vs {mean(lr, 'policy_us_per_tok'):.0f} µs "
          f"(decode {mean(a, 'dec_ms_per_tok'):.1f} ms/token; the adaptive policy's own cost is the difference)")
if a and la:
    print(f"- router lookahead (protects the next layer's predicted experts, reads nothing early): "
          f"{100 * mean(la, 'hit_rate'):.1f}% vs {100 * mean(a, 'hit_rate'):.1f}% hits, {mean(la, 'tok_s'):.2f} vs "
          f"{mean(a, 'tok_s'):.2f} tok/s, {mean(la, 'missed_per_tok') / mib:.1f} vs {mean(a, 'missed_per_tok') / mib:.1f} "
          f"MiB missed per token; {mean(la, 'protected_evictions'):.0f} protected experts evicted for want of others")
if a and a[0]["pf_acc"] is not None:
    print(f"- read-ahead (next layer's router on this layer's input; its top-k, read at the ranks that pay off): {a[0]['pf_acc']:.1f}% of the "
          f"experts the router then chose had been predicted; per run {mean(a, 'pf_issued'):.0f} reads issued, "
          f"{mean(a, 'pf_used'):.0f} used, {mean(a, 'pf_wasted_mb'):.0f} MiB wasted")
if a and np_:
    print(f"- with vs without read-ahead: {mean(a, 'tok_s'):.2f} vs {mean(np_, 'tok_s'):.2f} tok/s; the compute "
          f"thread waited for reads {mean(a, 'ss_wait_ms'):.2f} vs {mean(np_, 'ss_wait_ms'):.2f} ms per token "
          f"(steady state, of {mean(a, 'dec_ms_per_tok'):.1f} vs {mean(np_, 'dec_ms_per_tok'):.1f} ms)")
mm = group("mmap")
if mm and a:
    print(f"- major faults, default vs terrace mmap: {mean(a, 'majflt'):.0f} vs {mean(mm, 'majflt'):.0f}")
    print(f"- read bandwidth while reading, default: {mean(a, 'read_gbs'):.2f} GB/s")
PY
rmdir "$CG" 2>/dev/null || true
cat "$OUT"
