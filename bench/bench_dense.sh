#!/usr/bin/env bash
# terrace vs llama.cpp on the same GGUF files, tests and thread count, in one run: prefill of 512
# tokens, decode of 128, and both at a context already holding 4096 tokens (llama-bench's pp512,
# tg128, pp512 @ d4096, tg128 @ d4096), and each process's peak RSS. llama.cpp runs with its own
# defaults (bench/llama_bench.py: flash attention auto, weight repacking on, mmap).
# Models: the default model (SmolLM2-135M-Instruct Q4_1), Gemma 3 270M Q4_K_M, and a synthetic
# ~1.1B-parameter llama-shaped model (random weights) in F16 and quantized by llama.cpp to Q4_0,
# Q4_K_M, Q6_K and Q8_0.
# Results are printed and written to bench/results/dense.md.
#   THREADS (default: all cores), REPS (3), MODELS (a subset of the names below), TESTS
#   (default pp512,tg128,pp512@d4096,tg128@d4096), ISA (terrace's kernel family, e.g. avx2),
#   PEER_VENV (the llama.cpp build to compare with, default .venv-peer; scripts/peer.sh builds
#   others, e.g. an AVX2-only one to set against ISA=avx2), OUT (default bench/results/dense.md).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-3}
TESTS=${TESTS:-pp512,tg128,pp512@d4096,tg128@d4096}
OUT=${OUT:-bench/results/dense.md}
PEER=${PEER_VENV:-.venv-peer}/bin/python3
mkdir -p bench/results build/bench

synth() { # synth FTYPE_NAME FTYPE_ID -> path of the synthetic 1.1B model in that type
    local f=build/bench/llama-1b-$1.gguf
    if [ ! -f "$f" ]; then
        if [ ! -f build/bench/llama-1b-F16.gguf ]; then
            echo "bench: writing the synthetic 1.1B model (F16)" >&2
            .venv/bin/python3 tests/py/synth.py llama-1b F16 build/bench/llama-1b-F16.gguf
        fi
        if [ "$1" != F16 ]; then
            echo "bench: quantizing it to $1 with llama.cpp" >&2
            .venv-peer/bin/python3 tests/py/llama_ref.py quantize build/bench/llama-1b-F16.gguf "$f" "$2" >/dev/null 2>&1
        fi
    fi
    echo "$f"
}
declare -A MODEL_PATH
ALL="smollm2-q4_1 gemma3-q4_k_m llama1b-q4_0 llama1b-q4_k_m llama1b-q6_k llama1b-q8_0 llama1b-f16"
for name in ${MODELS:-$ALL}; do
    case $name in
    smollm2-q4_1) MODEL_PATH[$name]=$(bash scripts/get_model.sh smollm2) ;;
    gemma3-q4_k_m) MODEL_PATH[$name]=$(bash scripts/get_model.sh gemma3) ;;
    llama1b-q4_0) MODEL_PATH[$name]=$(synth Q4_0 2) ;;
    llama1b-q4_k_m) MODEL_PATH[$name]=$(synth Q4_K_M 15) ;;
    llama1b-q6_k) MODEL_PATH[$name]=$(synth Q6_K 18) ;;
    llama1b-q8_0) MODEL_PATH[$name]=$(synth Q8_0 7) ;;
    llama1b-f16) MODEL_PATH[$name]=$(synth F16 1) ;;
    esac
done

# terrace's flags for the tests: -p, -n and -d lists (terrace bench runs every combination, as
# llama-bench does; the rows TESTS names are the ones reported)
tflags() {
    local p="" n="" d="0" t base depth
    for t in ${TESTS//,/ }; do
        base=${t%@d*}
        depth=0
        [[ $t == *@d* ]] && depth=${t#*@d}
        case $base in
        pp*) [[ "$p," == *",${base#pp},"* ]] || p="$p,${base#pp}" ;;
        tg*) [[ "$n," == *",${base#tg},"* ]] || n="$n,${base#tg}" ;;
        esac
        [[ ",$d," == *",$depth,"* ]] || d="$d,$depth"
    done
    p=${p#,}
    n=${n#,}
    echo "-p ${p:-0} -n ${n:-0} -d $d"
}
read -r -a TF <<< "$(tflags)"

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
isa_desc="AVX2"; [[ $flags == *avx512f* ]] && isa_desc="AVX-512"; [[ $flags == *avx512_vnni* ]] && isa_desc="$isa_desc VNNI"
{
    echo "# Dense models: terrace vs llama.cpp"
    echo
    echo "$(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cpu ($isa_desc), $THREADS threads,"
    echo "terrace kernels ${ISA:-$(./build/terrace --version | sed 's/.*kernels: //; s/)//')}, llama.cpp via llama-cpp-python $("$PEER" -c 'import llama_cpp; print(llama_cpp.__version__)') (its defaults: flash attention auto, weight repacking on, mmap),"
    echo "built with $(cat "${PEER_VENV:-.venv-peer}/.terrace-peer-flags" 2>/dev/null || echo '?') (scripts/peer.sh; v2 = this CPU's features), its system info: $("$PEER" -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode().strip())' 2>/dev/null)."
    echo "Command: \`make bench\` (bench/bench_dense.sh; THREADS=$THREADS REPS=$REPS TESTS=$TESTS)."
    echo "ppN = N random tokens evaluated at once; tgN = N tokens decoded one at a time; @dD = at a context already holding D tokens;"
    echo "mean ± sd of $REPS runs after one warm-up; peak RSS of each process over all its tests."
    echo
    echo "| model | test | llama.cpp t/s | terrace t/s | terrace / llama.cpp | peak RSS llama.cpp | peak RSS terrace |"
    echo "|---|---|---:|---:|---:|---:|---:|"
} > "$OUT.tmp"
for name in ${MODELS:-$ALL}; do
    m=${MODEL_PATH[$name]}
    echo "bench: $name ($m)" >&2
    ref=$("$PEER" bench/llama_bench.py "$m" "$TESTS" "$REPS" "$THREADS" 512 2>/dev/null)
    ter=$(TERRACE_ISA=${ISA:-} ./build/terrace bench -m "$m" "${TF[@]}" -r "$REPS" -t "$THREADS" -b 512 -o json)
    python3 - "$name" "$ref" "$ter" "$TESTS" >> "$OUT.tmp" <<'PY'
import json, sys
name, ref, ter, tests = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4].split(",")
rows = {}
for r in ter:
    key = (f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}") + (f"@d{r['n_depth']}" if r["n_depth"] else "")
    rows[key] = r
rss_t = max(r["peak_rss_mib"] for r in ter)
for t in tests:
    a, b = ref[t], rows[t]
    label = t.replace("@d", " @ d")
    print(f"| {name} | {label} | {a['avg_ts']:.2f} ± {a['stddev_ts']:.2f} | {b['avg_ts']:.2f} ± "
          f"{b['stddev_ts']:.2f} | **{b['avg_ts'] / a['avg_ts']:.2f}x** | {ref['peak_rss_mib']:.0f} MiB | "
          f"{rss_t:.0f} MiB |")
PY
done
mv "$OUT.tmp" "$OUT"
cat "$OUT"
