#!/usr/bin/env bash
# Build llama.cpp's llama-server from the sources vendored in the llama-cpp-python 0.3.36 sdist,
# into a cache (default ~/.cache/specdeck/llama.cpp), for `specdeck bench`'s anchors.
# About 20 minutes on 2 cores; nothing built is committed. Idempotent.
set -Eeuo pipefail
VERSION=0.3.36
CACHE="${SPECDECK_LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specdeck/llama.cpp}"
PY="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
[ -x "$PY" ] || PY=python3
BIN="$CACHE/build/bin/llama-server"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$CACHE"
if [ ! -d "$CACHE/src/CMakeLists.txt" ] && [ ! -f "$CACHE/src/CMakeLists.txt" ]; then
  tmp="$(mktemp -d)"
  "$PY" -m pip download --no-deps --no-binary :all: -q -d "$tmp" "llama-cpp-python==$VERSION"
  tar -xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$tmp"
  rm -rf "$CACHE/src"
  mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$CACHE/src"
  rm -rf "$tmp"
fi
# A CPU that advertises AMX may not run it (a VM): the native build then dies with SIGILL at the
# first decode, as llama-cpp-python's does (install.sh builds it the same way).
flags=()
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  nox="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  flags=(-DCMAKE_C_FLAGS="$nox" -DCMAKE_CXX_FLAGS="$nox")
fi
cmake -S "$CACHE/src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  "${flags[@]}" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >/dev/null
cmake --build "$CACHE/build" --target llama-server -j "$(nproc)" >/dev/null
echo "$BIN"
