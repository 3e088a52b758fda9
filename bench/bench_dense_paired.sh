#!/usr/bin/env bash
# Two terrace builds on the same models, prompt and threads, alternated in one run: pp512 and
# tg128 (`terrace bench`, 3 repetitions each) for ROUNDS rounds of this build and REF, then
# llama.cpp once per model for scale. A speed check of a change against the build before it.
# usage: bench/bench_dense_paired.sh REF_TERRACE [OUT.md]   (default OUT: bench/results/dense-paired.md)
set -euo pipefail
cd "$(dirname "$0")/.."
REF=${1:?usage: bench/bench_dense_paired.sh REF_TERRACE [OUT.md]}
OUT=${2:-bench/results/dense-paired.md}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
ROWS=$(mktemp)
trap 'rm -f "$ROWS"' EXIT
for m in "$(bash scripts/get_model.sh smollm2)" "$(bash scripts/get_model.sh gemma3)"; do
    n=$(basename "$m" .gguf)
    for r in $(seq 1 "$ROUNDS"); do
        for w in this ref; do
            b=build/terrace
            [ $w = ref ] && b=$REF
            echo "{\"model\": \"$n\", \"build\": \"$w\", \"res\": $($b bench -m "$m" -p 512 -n 128 -r 3 -t "$THREADS" --json)}" >> "$ROWS"
        done
    done
    echo "{\"model\": \"$n\", \"build\": \"llama.cpp\", \"res\": $(.venv-peer/bin/python3 bench/llama_bench.py "$m" 512 128 3 "$THREADS")}" >> "$ROWS"
done
python3 - "$ROWS" "$OUT" "$REF" "$ROUNDS" "$THREADS" \
    "$(git rev-parse --short HEAD)$(git diff --quiet -- src tools include || echo ' (with changes)')" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" <<'PY'
import datetime, json, re, statistics as st, sys
rows_path, out, ref, rounds, threads, commit, cpu = sys.argv[1:8]
txt, dec, i, rows = open(rows_path).read(), json.JSONDecoder(), 0, []
while (m := re.compile(r"\S").search(txt, i)):
    o, i = dec.raw_decode(txt, m.start())
    rows.append(o)
res = {}
for r in rows:
    rs = r["res"] if isinstance(r["res"], list) else \
        [dict(test=k, **v) for k, v in r["res"].items() if isinstance(v, dict)]
    for t in rs:
        res.setdefault((r["model"], t["test"]), {}).setdefault(r["build"], []).append(t["avg_ts"])
f = lambda v: f"{st.mean(v):.1f} ({min(v):.1f}–{max(v):.1f})"
L = ["# Dense models: this build against another build\n",
     f"{datetime.date.today()}, commit {commit}, `bench/bench_dense_paired.sh {ref}` (ROUNDS={rounds}), "
     f"{cpu}, {threads} threads. Each round runs `terrace bench -p 512 -n 128 -r 3` of this build, "
     "then of the other; a cell is the mean of the rounds' means (lowest–highest round). "
     "llama.cpp (llama-cpp-python, bench/llama_bench.py) ran once per model after the rounds.\n",
     "| model | test | this build t/s | other build t/s | this / other | llama.cpp t/s | this / llama.cpp |",
     "|---|---|---:|---:|---:|---:|---:|"]
for (m, t), d in res.items():
    a, b, p = d["this"], d["ref"], d.get("llama.cpp", [float("nan")])[0]
    L.append(f"| {m} | {t} | {f(a)} | {f(b)} | {st.mean(a) / st.mean(b):.3f} | {p:.1f} | "
             f"{st.mean(a) / p:.2f}x |")
open(out, "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
