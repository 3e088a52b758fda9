#!/usr/bin/env bash
# terrace vs llama.cpp on the same GGUF files, prompt and thread count, in one run: prefill of
# 512 tokens and decode of 128 tokens (llama-bench's pp512 / tg128), peak RSS of each process.
# Models: the default model (SmolLM2-135M-Instruct Q4_1), Gemma 3 270M Q4_K_M, and a synthetic
# ~1.1B-parameter llama-shaped Q4_K_M model (random weights, quantized by llama.cpp).
# Results are printed and written to bench/results/dense.md.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
NP=${NP:-512}
NG=${NG:-128}
OUT=bench/results/dense.md
mkdir -p bench/results build/bench

big=build/bench/llama-1b-Q4_K_M.gguf
if [ ! -f "$big" ]; then
    echo "bench: writing the synthetic 1.1B model (F16, then Q4_K_M by llama.cpp)" >&2
    .venv/bin/python3 tests/py/synth.py llama-1b F16 build/bench/llama-1b-F16.gguf
    .venv-peer/bin/python3 tests/py/llama_ref.py quantize build/bench/llama-1b-F16.gguf "$big" 15
    rm -f build/bench/llama-1b-F16.gguf
fi
models=("$(bash scripts/get_model.sh smollm2)" "$(bash scripts/get_model.sh gemma3)" "$big")

{
    echo "# Dense models: terrace vs llama.cpp"
    echo
    echo "$(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $THREADS threads,"
    echo "terrace kernels $(./build/terrace --version | sed 's/.*kernels: //; s/)//'), llama.cpp via llama-cpp-python $(.venv-peer/bin/python3 -c 'import llama_cpp; print(llama_cpp.__version__)') (default settings: flash attention auto, repacking on, mmap)."
    echo "pp$NP = $NP random tokens from an empty context; tg$NG = $NG tokens decoded one at a time; mean ± sd of $REPS runs."
    echo
    echo "| model | test | llama.cpp t/s | terrace t/s | terrace / llama.cpp | peak RSS llama.cpp | peak RSS terrace |"
    echo "|---|---|---:|---:|---:|---:|---:|"
} > "$OUT.tmp"
for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    echo "bench: $name" >&2
    ref=$(.venv-peer/bin/python3 bench/llama_bench.py "$m" "$NP" "$NG" "$REPS" "$THREADS")
    ter=$(./build/terrace bench -m "$m" -p "$NP" -n "$NG" -r "$REPS" -t "$THREADS" --json)
    python3 - "$name" "$ref" "$ter" "$NP" "$NG" >> "$OUT.tmp" <<'PY'
import json, sys
name, ref, ter, np_, ng = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
t = {r["test"]: r for r in ter}
for test in (f"pp{np_}", f"tg{ng}"):
    a, b = ref[test], t[test]
    print(f"| {name} | {test} | {a['avg_ts']:.2f} ± {a['stddev_ts']:.2f} | {b['avg_ts']:.2f} ± "
          f"{b['stddev_ts']:.2f} | **{b['avg_ts'] / a['avg_ts']:.2f}x** | {ref['peak_rss_mib']:.0f} MiB | "
          f"{ter[0]['peak_rss_mib']:.0f} MiB |")
PY
done
mv "$OUT.tmp" "$OUT"
cat "$OUT"
