#!/usr/bin/env bash
# Installs what building and testing terrace needs, only where it is missing:
# Debian packages (compilers, libraries) and a Python venv in .venv with the PyPI packages the
# tests use (gguf writes the synthetic models and is the independent dequantization reference;
# jinja2 is the reference renderer of chat templates).
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
have_header() { [ -e "/usr/include/$1" ]; }
have_header cjson/cJSON.h        || need_pkgs+=(libcjson-dev)
have_header pcre2.h              || need_pkgs+=(libpcre2-dev)
have_header liburing.h           || need_pkgs+=(liburing-dev)
have_header xxhash.h             || need_pkgs+=(libxxhash-dev)
command -v clang >/dev/null      || need_pkgs+=(clang)
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 \
    || need_pkgs+=(libclang-rt-14-dev)
command -v aarch64-linux-gnu-gcc >/dev/null || need_pkgs+=(gcc-aarch64-linux-gnu)
# the cross compiler's C library headers are only a recommendation of its package
[ -e /usr/aarch64-linux-gnu/include/stdio.h ] || need_pkgs+=(libc6-dev-arm64-cross)
# the aarch64 build runs its tests under user-mode emulation, linked against the target's
# libraries from Debian's arm64 packages (multiarch: /usr/lib/aarch64-linux-gnu, which also
# brings the target's dynamic loader, so the emulator needs no -L)
command -v qemu-aarch64-static >/dev/null || need_pkgs+=(qemu-user-static)
need_arm64=()
[ -e /usr/lib/aarch64-linux-gnu/libpcre2-8.so ] || need_arm64+=(libpcre2-dev:arm64)
[ -e /usr/lib/aarch64-linux-gnu/libxxhash.so ] || need_arm64+=(libxxhash-dev:arm64)
[ -e /usr/lib/aarch64-linux-gnu/libcjson.so ] || need_arm64+=(libcjson-dev:arm64)
python3 -c 'import venv' 2>/dev/null || need_pkgs+=(python3-venv)
# the install test: pkg-config flags, the man page's lint, the shared library's symbols
command -v pkg-config >/dev/null || need_pkgs+=(pkgconf)
command -v groff >/dev/null      || need_pkgs+=(groff-base)
command -v nm >/dev/null         || need_pkgs+=(binutils)
# the King James text of the real-model perplexity checks (tests/py/parity_real.py)
command -v bible >/dev/null || need_pkgs+=(bible-kjv)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#need_arm64[@]} -gt 0 ]; then
    dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
    need_pkgs+=("${need_arm64[@]}")
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "deps: installing Debian packages: ${need_pkgs[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        "${need_pkgs[@]}" >/dev/null
fi

PY_PKGS=(gguf numpy jinja2)
if [ ! -x .venv/bin/python3 ]; then
    echo "deps: creating Python venv in .venv"
    python3 -m venv .venv
fi
if ! .venv/bin/python3 -c 'import gguf, numpy, jinja2' 2>/dev/null; then
    echo "deps: installing Python packages: ${PY_PKGS[*]}"
    .venv/bin/pip install -q --disable-pip-version-check "${PY_PKGS[@]}"
fi
