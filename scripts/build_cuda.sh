#!/usr/bin/env bash
# Compile llama-cpp-python with CUDA on a machine without a GPU, with the CUDA toolkit from PyPI,
# and check what came out: the CUDA backend is in the library, it links cuBLAS, and it holds code
# for the asked architectures. Long (the CUDA kernels for two architectures on two cores): a
# script whose figures go to docs/BENCHMARKS.md, not a CI step.
#
#   bash scripts/build_cuda.sh [--arch "86;89"] [--out DIR] [--jobs N]
#
# Default: sm_86 and sm_89 (RTX 3090 / 4090), out ~/.cache/specdeck/cuda-build (outside the work
# tree, so it survives a fresh checkout). The CPU part is the portable AVX2 build (the card's host
# is not this machine); without a driver here, GGML_CUDA_NO_VMM=ON (the VMM pool needs libcuda at
# link time). The sdist is unpacked once and CMake's build folder is kept (scikit-build-core's
# build-dir), so a run that is stopped resumes where it was: the two architectures take about two
# hours on two cores. On a machine with the GPU, install.sh builds for the card it finds instead,
# and its smoke decode runs on the GPU.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ARCH="86;89"
OUT="${XDG_CACHE_HOME:-$HOME/.cache}/specdeck/cuda-build"
JOBS="$(nproc)"
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) shift; ARCH="$1" ;;
    --out) shift; OUT="$1" ;;
    --jobs) shift; JOBS="$1" ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "build_cuda.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck disable=SC1091
source <(sed -n 's/^\(CUDA_PYPI_[A-Z]*\)=\(.*\)$/\1=\2/p; s/^\(LLAMA_VERSION\)=\(.*\)$/\1=\2/p' "$HERE/install.sh")
mkdir -p "$OUT"
[ -x "$OUT/venv/bin/python" ] || python3 -m venv "$OUT/venv"
VPY="$OUT/venv/bin/python"
echo "==> CUDA toolkit from PyPI: $CUDA_PYPI_PINS"
"$VPY" -m pip install --quiet --upgrade pip
"$VPY" -m pip install --quiet $CUDA_PYPI_PINS "nvidia-cuda-cuobjdump==13.4.92.*" "scikit-build-core==1.1.2"
SRC="$OUT/src/llama_cpp_python-$LLAMA_VERSION"
if [ ! -f "$SRC/pyproject.toml" ]; then
  mkdir -p "$OUT/src"
  "$VPY" -m pip download --quiet --no-deps --no-binary :all: -d "$OUT/src" "llama-cpp-python==$LLAMA_VERSION"
  tar -xzf "$OUT/src/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$OUT/src"
fi
NVCC="$(bash "$HERE/scripts/cuda_toolkit_root.sh" "$VPY")"
ROOT="$(dirname "$(dirname "$NVCC")")"
echo "==> $("$NVCC" --version | tail -n 1)"
NO_VMM="-DGGML_CUDA_NO_VMM=OFF"
[ -e "$ROOT/lib/stubs/libcuda.so" ] || NO_VMM="-DGGML_CUDA_NO_VMM=ON"
export CUDACXX="$NVCC" CUDA_HOME="$ROOT" CUDAToolkit_ROOT="$ROOT" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH $NO_VMM -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF"
done_before=0
[ -f "$OUT/build/.ninja_log" ] && done_before=$(( $(wc -l < "$OUT/build/.ninja_log") - 1 ))
echo "==> compiling llama-cpp-python $LLAMA_VERSION: CMAKE_ARGS=$CMAKE_ARGS (log: $OUT/build.log; $done_before steps done before)"
rm -rf "$OUT/wheel"
start=$(date +%s)
FORCE_CMAKE=1 "$VPY" -m pip wheel --no-deps --no-cache-dir --no-build-isolation -C build-dir="$OUT/build" \
  -w "$OUT/wheel" "$SRC" >> "$OUT/build.log" 2>&1 \
  || { tail -n 30 "$OUT/build.log"; echo "build_cuda.sh: the build failed (log: $OUT/build.log)" >&2; exit 1; }
secs=$(( $(date +%s) - start ))
WHL="$(ls "$OUT"/wheel/llama_cpp_python-*.whl)"
rm -rf "$OUT/unpacked" && mkdir -p "$OUT/unpacked" && (cd "$OUT/unpacked" && "$VPY" -m zipfile -e "$WHL" .)
LIB="$(find "$OUT/unpacked" -name 'libggml-cuda.so*' | head -n 1)"
[ -n "$LIB" ] || { echo "build_cuda.sh: no libggml-cuda.so in $WHL" >&2; exit 1; }
needed="$(readelf -d "$LIB" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')"
symbols="$(nm -D --defined-only "$LIB" | grep -c ' ggml_backend_cuda_' || true)"
elves="$(PATH="$ROOT/bin:$PATH" cuobjdump --list-elf "$LIB" 2>/dev/null | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')"
echo "==> built in ${secs} s: $WHL ($(du -h "$WHL" | cut -f1))"
echo "    $LIB"
echo "    NEEDED: $needed"
echo "    ggml_backend_cuda_* symbols: $symbols; device code for: $elves"
ok=1
case " $needed " in *" libcublas.so."*) ;; *) echo "build_cuda.sh: libggml-cuda does not link cuBLAS" >&2; ok=0 ;; esac
case " $needed " in *" libcudart.so."*) ;; *) echo "build_cuda.sh: libggml-cuda does not link the CUDA runtime" >&2; ok=0 ;; esac
[ "$symbols" -gt 0 ] || { echo "build_cuda.sh: no CUDA backend symbols" >&2; ok=0; }
for a in ${ARCH//;/ }; do
  case " $elves " in *" sm_$a "*) ;; *) echo "build_cuda.sh: no device code for sm_$a" >&2; ok=0 ;; esac
done
printf '{"seconds": %s, "wheel": "%s", "needed": "%s", "cuda_symbols": %s, "device_code": "%s", "ok": %s}\n' \
  "$secs" "$WHL" "$needed" "$symbols" "$elves" "$([ $ok = 1 ] && echo true || echo false)" > "$OUT/result.json"
[ $ok = 1 ] && echo "==> ok: the CUDA build links cuBLAS and holds the CUDA backend for sm_${ARCH//;/, sm_}" || exit 1
