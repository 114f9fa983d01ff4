#!/usr/bin/env bash
# specdeck installer: a virtual environment with specdeck and llama-cpp-python in it.
#
#   bash install.sh            install (CUDA build of llama-cpp-python where nvidia-smi sees a GPU,
#                              with the CUDA toolkit from PyPI if no nvcc is installed; CPU build
#                              otherwise). The build must pass a smoke decode before this says done:
#                              a CPU that advertises AMX llama.cpp cannot run (asked first, the CPU
#                              and the compiler: app/build/amx.py)
#                              builds without AMX; one that dies by a signal (SIGILL) is rebuilt
#                              without AMX, then as a portable AVX2 build (see app/build/ladder.py)
#   bash install.sh --test     also install the test extras, Debian's promtool and nginx, and Chromium (as root) for the tests
#   options: --cpu | --cuda    force the llama-cpp-python build
#            --rebuild         forget cached wheels and remembered failures for this CPU
#            --venv DIR        where the environment goes (default: .venv next to this script)
#            --portable        build llama-cpp-python for any x86-64 with AVX2 (not this CPU's native build)
#            --locked          install the Python packages of deploy/container/requirements*.lock only,
#                              each by version and SHA-256 (pip --require-hashes; the container image's build)
#            --pull [PRESET]   then pull, check and plan the preset (default: the one for this machine)
#            --service         then install systemd/specdeck.service (needs root): a 'specdeck' system
#                              user, /etc/specdeck/specdeck.env, models pulled into /var/cache/specdeck
#                              as that user, checked, planned, and the service enabled and started
#            --dry-run         with --service: print what it would do, change nothing
#
# Idempotent: a second run only installs what changed. Fails loudly, naming the step.
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="$HERE/.venv"
EXTRAS=""
BUILD="auto"
PULL=""
PRESET=""
SERVICE=""
DRY_RUN=""
LLAMA_VERSION="0.3.36"
REBUILD=""
PORTABLE=""
LOCKED=""
LOCKS="$HERE/deploy/container"
# The CUDA toolkit taken from PyPI where a GPU has a driver but no nvcc: NVIDIA's cuda-toolkit
# packages, pinned. CUDA 13, because the cu12 wheels (nvidia-cuda-nvcc-cu12) hold ptxas but no nvcc;
# CUDA 13 code needs a driver that supports CUDA 13 (R580 or newer).
CUDA_PYPI_LINE="13.4"
CUDA_PYPI_MAJOR="13"
CUDA_PYPI_PINS="cuda-toolkit[nvcc,cudart,cublas,cccl,crt,nvvm]==13.4.3"
NVML_PIN="nvidia-ml-py==13.615.71"  # reads the card's compute capability (pynvml)
STEP="start"

say()  { printf '\033[1m==> %s\033[0m\n' "$*"; }
die()  { printf 'install.sh: error: %s\n' "$*" >&2; exit 1; }
trap 'printf "install.sh: failed during: %s (exit %s)\n" "$STEP" "$?" >&2' ERR

while [ $# -gt 0 ]; do
  case "$1" in
    --test) EXTRAS="[test]" ;;
    --cpu) BUILD="cpu" ;;
    --cuda) BUILD="cuda" ;;
    --rebuild) REBUILD="--rebuild" ;;
    --portable) PORTABLE="--portable" ;;
    --locked) LOCKED="--locked" ;;
    --venv) shift; [ $# -gt 0 ] || die "--venv needs a directory"; VENV="$1" ;;
    --pull) PULL=1; if [ $# -gt 1 ] && [ "${2#-}" = "$2" ]; then shift; PRESET="$1"; fi ;;
    --service) SERVICE=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[ -z "$DRY_RUN" ] || [ -n "$SERVICE" ] || die "--dry-run goes with --service"
[ -z "$LOCKED" ] || [ -z "$EXTRAS" ] || die "--locked installs what the image runs: no test extras (--test)"

# -- the service (after the installation below, or alone with --dry-run) ----------------------
SVC_USER="specdeck"
UNIT_DST="/etc/systemd/system/specdeck.service"
ENV_DST="/etc/specdeck/specdeck.env"
CACHE="/var/cache/specdeck"
act() {  # run a command, or only show it with --dry-run
  if [ -n "$DRY_RUN" ]; then printf '  would run: %s\n' "$*"; else printf '  + %s\n' "$*"; "$@"; fi
}
as_service_user() {
  act runuser -u "$SVC_USER" -- env SPECDECK_HOME="$CACHE" HF_HOME="$CACHE/hf" SPECDECK_CONFIG_DIR=/etc/specdeck "$@"
}
install_service() {
  STEP="install the systemd service"
  say "systemd service${DRY_RUN:+ (dry run: nothing is changed)}"
  if [ "$(id -u)" -ne 0 ] && [ -z "$DRY_RUN" ]; then
    die "--service needs root (it adds a system user, /etc/specdeck and a unit): run  sudo bash install.sh --service  (or add --dry-run to see what it would do)"
  fi
  case "$VENV/" in /root/*|/home/*|/run/user/*)
    msg="the service cannot read $VENV (ProtectHome=yes hides /home and /root): install with --venv /opt/specdeck/venv from a checkout outside /home and /root"
    if [ -n "$DRY_RUN" ]; then printf '  warning: %s\n' "$msg"; else die "$msg"; fi ;;
  esac
  case "$HERE/" in /root/*|/home/*)
    msg="specdeck is installed in editable mode from $HERE, which the service cannot read (ProtectHome=yes): put the checkout under /opt"
    if [ -n "$DRY_RUN" ]; then printf '  warning: %s\n' "$msg"; else die "$msg"; fi ;;
  esac
  command -v systemctl >/dev/null 2>&1 || [ -n "$DRY_RUN" ] || die "no systemctl: this machine does not run systemd"
  local unit; unit="$(mktemp -d)/specdeck.service"
  sed -e "s#@VENV@#$VENV#g" -e "s#@USER@#$SVC_USER#g" "$HERE/systemd/specdeck.service" > "$unit"
  if command -v systemd-analyze >/dev/null 2>&1; then
    if [ -x "$VENV/bin/specdeck" ]; then
      systemd-analyze verify "$unit" || die "systemd-analyze verify rejected the unit ($unit)"
      say "systemd-analyze verify: ok ($unit)"
    else
      printf '  systemd-analyze verify skipped: %s is not installed yet\n' "$VENV/bin/specdeck"
    fi
  fi
  if ! id "$SVC_USER" >/dev/null 2>&1; then
    act useradd --system --home-dir "$CACHE" --no-create-home --shell /usr/sbin/nologin "$SVC_USER"
  fi
  if getent group video >/dev/null 2>&1; then act usermod -a -G video "$SVC_USER"; fi
  act install -d -m 0750 -o root -g "$SVC_USER" /etc/specdeck
  act install -d -m 0750 -o "$SVC_USER" -g "$SVC_USER" "$CACHE"
  if [ -e "$ENV_DST" ]; then printf '  keeping %s\n' "$ENV_DST"
  else act install -m 0640 -o root -g "$SVC_USER" "$HERE/systemd/specdeck.env" "$ENV_DST"; fi
  act install -m 0644 "$unit" "$UNIT_DST"
  as_service_user "$VENV/bin/specdeck" pull $PRESET
  as_service_user "$VENV/bin/specdeck" check $PRESET
  as_service_user "$VENV/bin/specdeck" plan $PRESET
  act systemctl daemon-reload
  act systemctl enable --now specdeck.service
  say "service: systemctl status specdeck · journalctl -u specdeck -f · $VENV/bin/specdeck dash (settings and API key: $ENV_DST)"
}
if [ -n "$DRY_RUN" ]; then
  install_service
  exit 0
fi

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
if [ -z "$LOCKED" ]; then "$VPY" -m pip install --quiet --upgrade pip; fi  # locked: the venv's own pip
locked_install() {  # $1: a lock file of deploy/container; every package by version and hash
  [ -f "$1" ] || die "no lock file $1 (bash scripts/container.sh lock writes them)"
  "$VPY" -m pip install --quiet --no-cache-dir --require-hashes --only-binary :all: -r "$1"
}
if [ -n "$LOCKED" ]; then
  STEP="install the locked Python packages (deploy/container/requirements.lock)"
  locked_install "$LOCKS/requirements.lock"
fi

STEP="choose the llama-cpp-python build"
has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
find_nvcc() {
  if command -v nvcc >/dev/null 2>&1; then command -v nvcc; return 0; fi
  if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"; return 0; fi
  return 1
}
if [ "$BUILD" = "auto" ]; then
  if has_gpu; then BUILD="cuda"; else BUILD="cpu"; fi
fi
CUDA_ARCH="${CUDA_ARCH:-}"
if [ "$BUILD" = "cuda" ]; then
  has_gpu || [ -n "$CUDA_ARCH" ] || die "--cuda asked for, but nvidia-smi sees no GPU (set CUDA_ARCH, e.g. CUDA_ARCH=86, to build for a card that is not here)"
  if NVCC="$(find_nvcc)"; then
    say "CUDA toolkit: $NVCC ($("$NVCC" --version | tail -n 1))"
  else
    STEP="install the CUDA toolkit from PyPI"
    drv_cuda="$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\)\..*/\1/p' | head -n 1)"
    if [ -n "$drv_cuda" ] && [ "$drv_cuda" -lt "$CUDA_PYPI_MAJOR" ]; then
      die "no nvcc here, and the driver supports CUDA $drv_cuda only: PyPI's complete toolkit is CUDA $CUDA_PYPI_LINE (needs driver R580+). Update the NVIDIA driver, or install a CUDA $drv_cuda toolkit (e.g. apt-get install nvidia-cuda-toolkit) and run install.sh again"
    fi
    say "no nvcc on this machine: taking the CUDA $CUDA_PYPI_LINE toolkit from PyPI into the venv"
    if [ -n "$LOCKED" ]; then locked_install "$LOCKS/requirements-cuda.lock"; else "$VPY" -m pip install --quiet $CUDA_PYPI_PINS; fi
    NVCC="$(bash "$HERE/scripts/cuda_toolkit_root.sh" "$VPY")"
    say "CUDA toolkit: $NVCC (PyPI: $CUDA_PYPI_PINS)"
  fi
  export CUDACXX="$NVCC" CUDA_HOME="$(dirname "$(dirname "$NVCC")")" CUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")"
  if [ -z "$CUDA_ARCH" ]; then  # the card's compute capability from NVML (pynvml), else nvidia-smi
    [ -n "$LOCKED" ] || "$VPY" -m pip install --quiet "$NVML_PIN"
    CUDA_ARCH="$("$VPY" -c 'import pynvml; pynvml.nvmlInit(); print("%d%d" % pynvml.nvmlDeviceGetCudaComputeCapability(pynvml.nvmlDeviceGetHandleByIndex(0)))' 2>/dev/null || true)"
    [ -n "$CUDA_ARCH" ] || CUDA_ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')"
    [ -n "$CUDA_ARCH" ] || die "could not read the GPU's compute capability with pynvml or nvidia-smi (set CUDA_ARCH, e.g. CUDA_ARCH=86)"
  fi
  say "llama-cpp-python: CUDA build for sm_$CUDA_ARCH (GPU: $(nvidia-smi -L 2>/dev/null | head -n 1 || echo 'none here'))"
else
  say "llama-cpp-python: CPU build"
fi

STEP="install numpy and gguf (the smoke decode writes its test model with them)"
[ -n "$LOCKED" ] || "$VPY" -m pip install --quiet "numpy>=1.26" "gguf==0.19.0"

STEP="build llama-cpp-python $LLAMA_VERSION ($BUILD) and prove it decodes on this machine"
GPU_SMOKE=""
has_gpu || GPU_SMOKE="--no-gpu-smoke"
PYTHONPATH="$HERE" "$VPY" -m app.build.ladder --python "$VPY" --kind "$BUILD" \
  ${CUDA_ARCH:+--cuda-arch "$CUDA_ARCH"} $GPU_SMOKE $REBUILD $PORTABLE $LOCKED

STEP="install specdeck"
say "installing specdeck$EXTRAS into $VENV"
if [ -n "$LOCKED" ]; then  # its dependencies are the lock's, installed above; pip check proves the set whole
  "$VPY" -m pip install --quiet --no-deps --no-build-isolation -e "$HERE$EXTRAS"
  "$VPY" -m pip check >/dev/null || die "the locked packages do not satisfy specdeck: $("$VPY" -m pip check | head -n 3 | tr '\n' ' ')"
else
  "$VPY" -m pip install --quiet -e "$HERE$EXTRAS"
fi
if [ -n "$EXTRAS" ]; then
  STEP="fetch llama.cpp's chat templates (test data for the chat-format tests)"
  if TEMPLATES="$(bash "$HERE/scripts/templates.sh" "$VPY")"; then
    say "chat templates: $TEMPLATES"
  else
    printf '  warning: %s\n' "no chat templates (see the line above): the chat-format tests fetch them when they run"
  fi
  STEP="install the CRD schemas the Kubernetes tests validate against (npm, pinned by tests/support/crd/package-lock.json)"
  if command -v npm >/dev/null 2>&1 && npm ci --silent --no-audit --no-fund --prefix "$HERE/tests/support/crd" >/dev/null 2>&1; then
    say "CRD schemas: prometheus-operator and KEDA (kubernetes-models) in tests/support/crd"
  else
    printf '  warning: %s\n' "no CRD schemas (npm ci in tests/support/crd failed): their test skips (and fails under CI=true)"
  fi
  STEP="install Chromium (the page's browser tests drive it with Playwright)"
  if CHROMIUM="$(bash "$HERE/scripts/chromium.sh")"; then
    say "chromium: $CHROMIUM ($("$CHROMIUM" --version 2>/dev/null | sed -n 1p))"
  else
    printf '  warning: %s\n' "no chromium (see the line above): the browser tests skip (and fail under CI=true)"
  fi
  for tool in promtool nginx; do  # Debian's, for tests/test_prometheus_rules.py and tests/test_nginx.py
    STEP="fetch $tool (the tests run the real one)"
    if TOOL="$(bash "$HERE/scripts/$tool.sh")"; then
      say "$tool: $TOOL ($("$TOOL" $([ "$tool" = nginx ] && echo -v || echo --version) 2>&1 | sed -n 1p))"
    else
      printf '  warning: %s\n' "no $tool (see the line above): its tests fail until bash scripts/$tool.sh gets one"
    fi
  done
fi

STEP="check the installation"
installed_build() {
  "$VPY" - <<'PY' 2>/dev/null || echo none
import json, sys, llama_cpp
from pathlib import Path
rec = json.loads((Path(sys.prefix) / "specdeck-build.json").read_text())
print(("cuda" if llama_cpp.llama_supports_gpu_offload() else "cpu") + " " + llama_cpp.__version__ + " " + rec["rung"])
PY
}
"$VENV/bin/specdeck" --version >/dev/null
say "done: $(installed_build) · run $VENV/bin/specdeck doctor, then $VENV/bin/specdeck --help"

if [ -n "$PULL" ] && [ -z "$SERVICE" ]; then
  STEP="pull, check and plan ${PRESET:-the default preset}"
  "$VENV/bin/specdeck" pull $PRESET
  "$VENV/bin/specdeck" check $PRESET
  "$VENV/bin/specdeck" plan $PRESET
  say "ready: $VENV/bin/specdeck up $PRESET"
fi
if [ -n "$SERVICE" ]; then
  install_service
fi
