#!/usr/bin/env bash
# The CUDA toolkit from PyPI as a toolkit root CMake and nvcc can use; prints nvcc's path.
#
#   bash scripts/cuda_toolkit_root.sh VENV_PYTHON
#
# The toolkit is NVIDIA's own PyPI packaging, installed beforehand into that venv (install.sh pins
# it): `cuda-toolkit[nvcc,cudart,cublas,cccl,crt,nvvm]`, CUDA 13, all laid out under
# site-packages/nvidia/cu13/{bin,include,lib,nvvm}. (The cu12 wheels, nvidia-cuda-nvcc-cu12 12.4 and
# 12.9, hold ptxas only: no nvcc, cicc or cudafe++, so they cannot compile CUDA C++.)
# What the wheels lack for a build is added here, inside that root only:
#   lib/libcudart.so, libcublas.so, libcublasLt.so   unversioned names the linker looks for
#   lib/stubs/libcuda.so                              the driver's libcuda.so.1, where a driver is installed
set -euo pipefail
PY="${1:?usage: cuda_toolkit_root.sh VENV_PYTHON}"
ROOT="$("$PY" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
[ -x "$ROOT/bin/nvcc" ] || { echo "cuda_toolkit_root.sh: no nvcc under $ROOT (install cuda-toolkit[nvcc,...] first)" >&2; exit 1; }
[ -x "$ROOT/nvvm/bin/cicc" ] || { echo "cuda_toolkit_root.sh: no cicc under $ROOT/nvvm (the nvvm extra is missing)" >&2; exit 1; }
for lib in cudart cublas cublasLt; do
  versioned="$(ls "$ROOT/lib/lib$lib.so."* 2>/dev/null | head -n 1 || true)"
  [ -n "$versioned" ] || { echo "cuda_toolkit_root.sh: no lib$lib.so.* in $ROOT/lib" >&2; exit 1; }
  ln -sf "$(basename "$versioned")" "$ROOT/lib/lib$lib.so"
done
driver="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
if [ -n "$driver" ]; then
  mkdir -p "$ROOT/lib/stubs"
  ln -sf "$driver" "$ROOT/lib/stubs/libcuda.so"
fi
echo "$ROOT/bin/nvcc"
