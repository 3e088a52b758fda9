#!/usr/bin/env bash
# Installs the peer we compare with: llama.cpp, built from the source distribution of PyPI's
# llama-cpp-python into .venv-peer (never vendored, nothing fetched from elsewhere).
#
# Build flags: the CPU features of this machine, spelled out instead of -march=native, because a
# native build on a CPU that advertises AMX compiles ggml's AMX kernels, and those crash here
# (SIGSEGV in ggml_backend_amx_mul_mat: the VM does not grant the AMX tile state). Everything else
# (AVX2, AVX-512 incl. VNNI/BF16, weight repacking, OpenMP) is as a native build has it.
#
# Knobs: PEER_VENV=DIR installs into another venv (default .venv-peer); PEER_CMAKE_ARGS="..."
# replaces the flags above, e.g. an AVX2-only peer on an AVX-512 machine (the AVX2 code paths of
# both sides, compared on one CPU):
#   PEER_VENV=.venv-peer-avx2 PEER_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
#     -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF" scripts/peer.sh
# The flags a venv was built with are kept in DIR/.terrace-peer-flags; other flags rebuild it.
#
# The server extras (llama-cpp-python[server]: FastAPI, uvicorn, ...; `python -m llama_cpp.server`,
# the peer of terrace serve) are added with pip on top of the built library, which pip then leaves
# as it is: the version is already satisfied, so nothing is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
V=${PEER_VENV:-.venv-peer}
server_extras() {
    "$V"/bin/python3 -c "import llama_cpp.server.app" 2>/dev/null && return 0
    echo "peer: adding the server extras of llama-cpp-python $VERSION (no rebuild)"
    "$V"/bin/pip install -q --disable-pip-version-check "llama-cpp-python[server]==$VERSION"
}
flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
if grep -q avx512f /proc/cpuinfo; then
    flags="$flags -DGGML_AVX512=ON"
    grep -q avx512_vnni /proc/cpuinfo && flags="$flags -DGGML_AVX512_VNNI=ON"
    grep -q avx512_bf16 /proc/cpuinfo && flags="$flags -DGGML_AVX512_BF16=ON"
    grep -q avx512vbmi /proc/cpuinfo && flags="$flags -DGGML_AVX512_VBMI=ON"
fi
grep -q avx_vnni /proc/cpuinfo && flags="$flags -DGGML_AVX_VNNI=ON"
# the tag of the default build stays "v2" (venvs built before the knobs keep counting as current)
tag=v2
[ -n "${PEER_CMAKE_ARGS:-}" ] && flags=$PEER_CMAKE_ARGS && tag="flags: $flags"
if "$V"/bin/python3 -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null \
   && [ -f "$V"/.terrace-peer-flags ] && [ "$(cat "$V"/.terrace-peer-flags)" = "$tag" ]; then
    server_extras
    exit 0
fi
echo "peer: building llama-cpp-python $VERSION from source into $V ($flags); this takes several minutes"
[ -x "$V"/bin/python3 ] || python3 -m venv "$V"
CMAKE_ARGS="$flags" "$V"/bin/pip install -q --disable-pip-version-check --no-cache-dir \
    --force-reinstall --no-binary llama-cpp-python "llama-cpp-python==$VERSION" numpy gguf
echo "$tag" > "$V"/.terrace-peer-flags
server_extras
