#!/usr/bin/env bash
# `make demo`: the main job on the default model. Until the forward pass lands (the next issue),
# that is `terrace inspect` on a small synthetic model generated here.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build/demo
.venv/bin/python3 scripts/gen_tiny_model.py build/demo/tiny-qwen3moe.gguf
./build/terrace inspect build/demo/tiny-qwen3moe.gguf
