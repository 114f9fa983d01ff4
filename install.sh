#!/usr/bin/env bash
# specdeck installer: a virtual environment with specdeck and llama-cpp-python in it.
#
#   bash install.sh            install (CUDA build of llama-cpp-python where an NVIDIA GPU and
#                              the CUDA toolkit are present, CPU build otherwise)
#   bash install.sh --test     also install the test extras
#   options: --cpu | --cuda    force the llama-cpp-python build
#            --venv DIR        where the environment goes (default: .venv next to this script)
#
# Idempotent: a second run only installs what changed. Fails loudly, naming the step.
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
EXTRAS=""
BUILD="auto"
LLAMA_VERSION="0.3.36"
STEP="start"

say()  { printf '\033[1m==> %s\033[0m\n' "$*"; }
die()  { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }
trap 'printf "install.sh: failed during: %s (exit %s)\n" "$STEP" "$?" >&2' ERR

while [ $# -gt 0 ]; do
  case "$1" in
    --test) EXTRAS="[test]" ;;
    --cpu) BUILD="cpu" ;;
    --cuda) BUILD="cuda" ;;
    --venv) shift; [ $# -gt 0 ] || die "--venv needs a directory"; VENV="$1" ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done

STEP="find Python 3.11+"
PY=""
for cand in python3.13 python3.12 python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PY="$(command -v "$cand")"; break
  fi
done
[ -n "$PY" ] || die "Python 3.11 or newer is needed (python3 --version says: $(python3 --version 2>&1 || echo none))"
say "Python: $PY ($("$PY" --version 2>&1))"

STEP="create the virtual environment"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PY" -m venv "$VENV" || die "could not create $VENV (on Debian/Ubuntu: apt-get install python3-venv)"
else
  say "virtual environment $VENV exists"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install --quiet --upgrade pip

STEP="choose the llama-cpp-python build"
has_cuda() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || return 1
  command -v nvcc >/dev/null 2>&1 || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || return 1
}
if [ "$BUILD" = "auto" ]; then
  if has_cuda; then BUILD="cuda"; else BUILD="cpu"; fi
fi
if [ "$BUILD" = "cuda" ]; then
  has_cuda || die "--cuda asked for, but no working nvidia-smi and nvcc (CUDA toolkit) were found"
  say "llama-cpp-python: CUDA build (GPU: $(nvidia-smi -L | head -n 1))"
else
  say "llama-cpp-python: CPU build$(command -v nvidia-smi >/dev/null 2>&1 && echo ' (a GPU is present but no CUDA toolkit: install nvcc for a CUDA build)')"
fi

STEP="install llama-cpp-python $LLAMA_VERSION ($BUILD)"
installed_build() {
  "$VPY" - <<'PY' 2>/dev/null || echo none
import llama_cpp
print(("cuda" if llama_cpp.llama_supports_gpu_offload() else "cpu") + " " + llama_cpp.__version__)
PY
}
if [ "$(installed_build)" = "$BUILD $LLAMA_VERSION" ]; then
  say "llama-cpp-python $LLAMA_VERSION ($BUILD) already installed"
else
  if [ "$BUILD" = "cuda" ]; then
    say "compiling llama-cpp-python with CUDA (10-30 minutes)"
    CMAKE_ARGS="-DGGML_CUDA=on ${CMAKE_ARGS:-}" FORCE_CMAKE=1 \
      "$VPY" -m pip install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$LLAMA_VERSION"
  else
    say "installing llama-cpp-python (compiles from source the first time, ~6 minutes on 2 cores; pip caches the wheel)"
    "$VPY" -m pip install "llama-cpp-python==$LLAMA_VERSION"
  fi
fi

STEP="install specdeck"
say "installing specdeck$EXTRAS into $VENV"
"$VPY" -m pip install --quiet -e "$HERE$EXTRAS"

STEP="check the installation"
"$VENV/bin/specdeck" --version >/dev/null
say "done: $(installed_build) · run $VENV/bin/specdeck --help"
