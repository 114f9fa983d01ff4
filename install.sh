#!/usr/bin/env bash
# specdeck installer: a virtual environment with specdeck and llama-cpp-python in it.
#
#   bash install.sh            install (CUDA build of llama-cpp-python where an NVIDIA GPU and
#                              the CUDA toolkit are present, CPU build otherwise)
#   bash install.sh --test     also install the test extras
#   options: --cpu | --cuda    force the llama-cpp-python build
#            --venv DIR        where the environment goes (default: .venv next to this script)
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
    --pull) PULL=1; if [ $# -gt 1 ] && [ "${2#-}" = "$2" ]; then shift; PRESET="$1"; fi ;;
    --service) SERVICE=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
  shift
done
[ -z "$DRY_RUN" ] || [ -n "$SERVICE" ] || die "--dry-run goes with --service"

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
