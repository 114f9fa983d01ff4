#!/usr/bin/env bash
# specdeck's container image, built from Debian's packages and PyPI alone, run with podman.
#
#   bash scripts/container.sh build [--flavour cpu|native|cuda] [--cuda-arch 86] [--with-weights PRESET] [--tag NAME]
#   bash scripts/container.sh run [--image IMAGE] [--models DIR] [--config FILE] [--keys FILE]
#                                 [--port N] [--name NAME] [--detach] [-- SPECDECK-ARGS...]
#   bash scripts/container.sh lock              write deploy/container/*.lock from today's mirrors
#   bash scripts/container.sh manifest IMAGE    its files, Debian packages and Python packages
#   bash scripts/container.sh compare IMAGE-A IMAGE-B    the same files and versions? (exit 1 if not)
#   bash scripts/container.sh podman-flags IMAGE    what podman needs on this machine to run a container
#   bash scripts/container.sh smoke [--image IMAGE] [--preset coder-1.5b]    run it with the preset on a
#                                               volume, answer /v1/chat/completions, stop it (exit 0), timed
#
# build: the two base root file systems (build: compilers; runtime: Python and libgomp) come from
# mmdebstrap with every Debian package at its locked version (deploy/container/debian-*.lock; the
# result is checked against the lock), imported into podman. On the build base install.sh
# --locked installs the Python packages of deploy/container/requirements.lock by version and
# SHA-256 and compiles llama-cpp-python from its hash-pinned sdist (flavour cpu: the portable AVX2
# build; native: this CPU's; cuda: NVIDIA's toolkit from PyPI, requirements-cuda.lock, for
# --cuda-arch). The runtime image gets /opt/specdeck, a non-root user, OCI labels (also in
# /usr/share/specdeck/image.json), /health as its health check and `specdeck` as its entrypoint.
# --with-weights PRESET: the preset's files, pulled and verified here, go in /opt/specdeck/models
# with a config naming and pinning them (an image for an air-gapped machine).
#
# Needs: podman, buildah's and mmdebstrap's Debian packages (apt-get install podman mmdebstrap
# runc); root, or a user podman and mmdebstrap run for. Nothing is pulled from a registry.
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCKS="$HERE/deploy/container"
CACHE="${SPECDECK_CONTAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specdeck/container}"
SUITE="bookworm"
MIRRORS=("deb http://deb.debian.org/debian $SUITE main"
         "deb http://deb.debian.org/debian $SUITE-updates main"
         "deb http://deb.debian.org/debian-security $SUITE-security main")
RUNTIME_PKGS="python3,ca-certificates,libgomp1"
BUILD_PKGS="$RUNTIME_PKGS,python3-venv,gcc,g++,cmake,ninja-build,make"
# llama-cpp-python 0.3.36's build-system.requires, and specdeck's own (pyproject.toml)
BUILD_REQUIREMENTS=("scikit-build-core[pyproject]>=0.9.2" "setuptools>=77")

# The machine's CA bundle is mounted into the steps that reach PyPI (a proxy that intercepts TLS
# signs with a CA only this machine trusts); it is never copied into an image.
HOST_CA="${SPECDECK_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"
ca_mount() { [ -f "$HOST_CA" ] && printf '%s\n' -v "$HOST_CA:/etc/ssl/host-ca.crt:ro" -e PIP_CERT=/etc/ssl/host-ca.crt || true; }

say()  { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die()  { printf 'container.sh: error: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "no $1 here: apt-get install ${2:-$1} (Debian 12 has podman 4.3, buildah 1.28, mmdebstrap 1.3)"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
sha() { sha256sum "$1" | cut -c1-64; }

# -- podman on this machine --------------------------------------------------------------------
# Debian 12's podman on these VMs: crun cannot set the default rlimits and refuses the hybrid
# cgroup layout; runc with cgroupfs runs once the open-file and process limits are ones the
# machine allows. Learnt by trying, said once, applied to every podman call here.
PODMAN_GLOBAL=()
PODMAN_RUN=()
PODMAN_PROBED=""
podman_flags() {  # $1: an image to try `true` in (once per run of this script)
  [ -z "$PODMAN_PROBED" ] || return 0
  local out reason=()
  for _ in 1 2 3 4 5; do
    if out="$(podman "${PODMAN_GLOBAL[@]}" run --rm "${PODMAN_RUN[@]}" --network none --entrypoint true "$1" 2>&1)"; then
      if [ ! -S /run/systemd/private ] && [[ " ${PODMAN_RUN[*]} " != *" --health-interval "* ]]; then
        PODMAN_RUN+=(--health-interval disable); reason+=("no systemd to time the health check: podman healthcheck run checks it")
      fi
      [ ${#reason[@]} -eq 0 ] || say "podman here needs: ${PODMAN_GLOBAL[*]} run ${PODMAN_RUN[*]} ($(IFS=';'; echo "${reason[*]}" | sed 's/;/; /g'))"
      PODMAN_PROBED=1
      return 0
    fi
    case "$out" in
      *"rlimit"*|*RLIMIT*)  # first the machine's own open-file limit and 4,096 processes, then 1,024 of each
        local n p; n="$(ulimit -Hn)"; p="$(ulimit -Hu)"
        [ "$n" != unlimited ] || n=1048576; [ "$p" != unlimited ] && [ "$p" -lt 4096 ] || p=4096
        if [[ " ${PODMAN_RUN[*]} " == *" nofile=1024:1024 "* ]]; then break
        elif [[ " ${PODMAN_RUN[*]} " == *" --ulimit "* ]]; then n=1024; p=1024; PODMAN_RUN=("${PODMAN_RUN[@]:0:${#PODMAN_RUN[@]}-4}"); fi
        PODMAN_RUN+=(--ulimit "nofile=$n:$n" --ulimit "nproc=$p:$p"); reason+=("the default rlimits are refused: nofile $n, nproc $p")
        ;;
      *"cgroups in hybrid mode"*|*"systemd"*|*"cgroup"*)
        [[ " ${PODMAN_GLOBAL[*]} " != *"cgroupfs"* ]] || break
        PODMAN_GLOBAL+=(--cgroup-manager=cgroupfs); reason+=("no systemd cgroup manager")
        ;;
      *crun*)
        [[ " ${PODMAN_RUN[*]} " != *" --runtime "* ]] && command -v runc >/dev/null 2>&1 || break
        PODMAN_RUN+=(--runtime runc); reason+=("crun refuses, runc runs")
        ;;
      *) break ;;
    esac
  done
  die "podman cannot run a container here: $(printf '%s' "$out" | tail -n 1)"
}

# -- the locks ---------------------------------------------------------------------------------
lock_hash() { sha "$LOCKS/$1" | cut -c1-12; }

mmdebstrap_tar() {  # $1: package list (comma-separated), $2: output tar
  SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$HERE" log -1 --format=%ct)}" \
    mmdebstrap --quiet --variant=apt --format=tar --include="$1" "$SUITE" "$2" "${MIRRORS[@]}" \
    || die "mmdebstrap failed (a Debian mirror unreachable, or a locked version no longer on it: bash scripts/container.sh lock)"
}

packages_of() {  # $1: image -> "package=version" lines, sorted
  podman "${PODMAN_GLOBAL[@]}" run --rm "${PODMAN_RUN[@]}" --network none --entrypoint dpkg-query "$1" \
    -W -f '${Package}=${Version}\n' | LC_ALL=C sort
}

BASE_IMAGE=""
base_image() {  # $1: build|runtime -> BASE_IMAGE, built from its lock if not there yet
  local role="$1" lock="$LOCKS/debian-$1.lock" name
  [ -f "$lock" ] || die "no $lock (bash scripts/container.sh lock writes it)"
  name="localhost/specdeck-base:$role-$(lock_hash "debian-$role.lock")"
  if ! podman image exists "$name"; then
    mkdir -p "$CACHE"
    local tar="$CACHE/base-$role.tar" pkgs
    pkgs="$(grep -v '^#' "$lock" | paste -sd, -)"
    say "base ($role): mmdebstrap $SUITE with $(grep -vc '^#' "$lock") packages at their locked versions"
    mmdebstrap_tar "$pkgs" "$tar"
    podman import --quiet "$tar" "$name" >/dev/null
    rm -f "$tar"
    podman_flags "$name"
    if ! diff <(grep -v '^#' "$lock" | LC_ALL=C sort) <(packages_of "$name") >"$CACHE/base-$role.diff"; then
      podman rmi "$name" >/dev/null
      die "the $role base differs from $lock (see $CACHE/base-$role.diff): the mirror has moved on; bash scripts/container.sh lock"
    fi
  fi
  BASE_IMAGE="$name"
}

lock_debian() {  # $1: role, $2: its packages
  local tar="$CACHE/lock-$1.tar" name="localhost/specdeck-lock:$1"
  mkdir -p "$CACHE"
  say "locking Debian ($1): mmdebstrap $SUITE with $2"
  mmdebstrap_tar "$2" "$tar"
  podman import --quiet "$tar" "$name" >/dev/null && rm -f "$tar"
  podman_flags "$name"
  { echo "# Debian $SUITE packages of specdeck's $1 base image (bash scripts/container.sh lock, $(date -u +%F))"
    echo "# sources: ${MIRRORS[*]}; asked for: $2"
    packages_of "$name"; } > "$LOCKS/debian-$1.lock"
  say "wrote $LOCKS/debian-$1.lock ($(grep -vc '^#' "$LOCKS/debian-$1.lock") packages)"
}

lock_python() {  # $1: lock file name, $2...: requirements; resolved by the build base's own pip
  local out="$LOCKS/$1" work; shift
  work="$(mktemp -d)"; printf '%s\n' "$@" > "$work/in.txt"
  say "locking Python ($(basename "$out")): $*"
  mapfile -t ca < <(ca_mount)
  podman "${PODMAN_GLOBAL[@]}" run --rm "${PODMAN_RUN[@]}" --network host "${ca[@]}" -v "$work:/lock:Z" --entrypoint sh \
    "localhost/specdeck-lock:build" -c 'python3 -m venv /tmp/v && /tmp/v/bin/pip install --quiet --dry-run --ignore-installed \
       --only-binary :all: --report /lock/report.json -r /lock/in.txt' || die "pip could not resolve $*"
  python3 - "$work/report.json" "$out" "$*" <<'PY'
import json, sys
report, out, asked = sys.argv[1:]
lines = [f"# by version and SHA-256 for pip --require-hashes (bash scripts/container.sh lock); asked for: {asked}"]
for item in sorted(json.load(open(report))["install"], key=lambda i: i["metadata"]["name"].lower()):
    meta, hashes = item["metadata"], item["download_info"]["archive_info"]["hashes"]
    lines.append(f"{meta['name']}=={meta['version']} --hash=sha256:{hashes['sha256']}")
open(out, "w").write("\n".join(lines) + "\n")
PY
  rm -rf "$work"
  say "wrote $out ($(grep -vc '^#' "$out") packages)"
}

install_sh_value() { sed -n "s/^$1=\"\([^\"]*\)\".*/\1/p" "$HERE/install.sh"; }  # install.sh's own pins

runtime_requirements() {  # pyproject's dependencies but llama-cpp-python (the ladder compiles it)
  python3 -c 'import tomllib, sys
for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    if not d.startswith("llama-cpp-python"): print(d)' "$HERE/pyproject.toml"
}

cmd_lock() {
  need podman; need mmdebstrap
  lock_debian runtime "$RUNTIME_PKGS"
  lock_debian build "$BUILD_PKGS"
  mapfile -t reqs < <(runtime_requirements)
  lock_python requirements.lock "${reqs[@]}" "${BUILD_REQUIREMENTS[@]}"
  lock_python requirements-cuda.lock "$(install_sh_value CUDA_PYPI_PINS)" "$(install_sh_value NVML_PIN)"
  podman rmi localhost/specdeck-lock:runtime localhost/specdeck-lock:build >/dev/null || true
}

# -- build -------------------------------------------------------------------------------------
cmd_build() {
  local flavour="cpu" cuda_arch="" weights="" tag=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --flavour) shift; flavour="${1:-}" ;;
      --cuda-arch) shift; cuda_arch="${1:-}" ;;
      --with-weights) shift; weights="${1:-}"; [ -n "$weights" ] || die "--with-weights needs a preset" ;;
      --tag) shift; tag="${1:-}" ;;
      *) die "build: unknown option '$1' (see --help)" ;;
    esac
    shift
  done
  case "$flavour" in cpu|native) ;; cuda) [ -n "$cuda_arch" ] || die "--flavour cuda needs --cuda-arch (e.g. 86 for an RTX 3090, 89 for a 4090)" ;;
    *) die "--flavour is cpu, native or cuda, not '$flavour'" ;; esac
  tag="${tag:-localhost/specdeck:$flavour${weights:+-$weights}}"
  need podman; need mmdebstrap
  local started; started="$(date +%s)"
  local build_base runtime_base
  base_image build; build_base="$BASE_IMAGE"
  base_image runtime; runtime_base="$BASE_IMAGE"
  podman_flags "$runtime_base"

  CTX="$(mktemp -d)"; trap 'rm -rf "$CTX"' EXIT
  local ctx="$CTX"
  mkdir -p "$ctx/src" "$ctx/models"
  git -C "$HERE" archive HEAD | tar -x -C "$ctx/src"
  [ -z "$(git -C "$HERE" status --porcelain --untracked-files=no)" ] \
    || say "warning: uncommitted changes are not in the image (it is built from HEAD, $(git -C "$HERE" rev-parse --short HEAD))"
  cp "$LOCKS/Containerfile" "$ctx/Containerfile"
  local sdist="$CACHE/sdist"; mkdir -p "$sdist"
  python3 -m pip download --quiet --no-deps --no-binary :all: --require-hashes -d "$sdist" \
    -r <(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from app.build.ladder import LLAMA_VERSION as v, LLAMA_SDIST_SHA256 as h
print(f"llama-cpp-python=={v} --hash=sha256:{h}")' "$HERE") >/dev/null 2>&1 \
    || [ -n "$(ls "$sdist"/llama_cpp_python-*.tar.gz 2>/dev/null)" ] || die "could not fetch the llama-cpp-python sdist"
  local weights_args=()
  if [ -n "$weights" ]; then
    stage_weights "$weights" "$ctx"
    weights_args=(--weights "$ctx/models/weights.json")
  fi
  python3 "$HERE/scripts/container_labels.py" --flavour "$flavour" --sdist "$(ls "$sdist"/llama_cpp_python-*.tar.gz | head -n 1)" \
    ${cuda_arch:+--cuda-arch "$cuda_arch"} "${weights_args[@]}" > "$ctx/image.json"
  local labels=() key
  while IFS= read -r key; do labels+=(--label "$key"); done < <(python3 -c 'import json, sys
for k, v in json.load(open(sys.argv[1])).items(): print(f"{k}={v}")' "$ctx/image.json")
  local install_flags="--locked"
  case "$flavour" in cpu) install_flags+=" --portable" ;; cuda) install_flags+=" --cuda --portable" ;; esac

  say "building $tag ($flavour) on $build_base and $runtime_base"
  local ca=(); [ ! -f "$HOST_CA" ] || ca=(-v "$HOST_CA:/etc/ssl/host-ca.crt:ro" --build-arg PIP_CERT=/etc/ssl/host-ca.crt)
  podman "${PODMAN_GLOBAL[@]}" build --isolation chroot --network host --format docker "${labels[@]}" "${ca[@]}" \
    --build-arg BUILD_BASE="$build_base" --build-arg RUNTIME_BASE="$runtime_base" \
    --build-arg INSTALL_FLAGS="$install_flags" --build-arg CUDA_ARCH="$cuda_arch" \
    -t "$tag" -f "$ctx/Containerfile" "$ctx" || die "podman build failed (the lines above say where)"
  local id size digest
  id="$(podman image inspect --format '{{.Id}}' "$tag")"
  digest="$(podman image inspect --format '{{.Digest}}' "$tag")"
  size="$(podman image inspect --format '{{.Size}}' "$tag")"
  say "built $tag in $(( $(date +%s) - started )) s: image $id, digest $digest, $(( size / 1048576 )) MiB"
  say "run it: bash scripts/container.sh run --image $tag --models DIR --config FILE --keys FILE"
}

stage_weights() {  # $1: preset, $2: build context: the preset's verified files and a config pinning them
  local py="$HERE/.venv/bin/python"
  [ -x "$py" ] || die "--with-weights pulls with this checkout's specdeck: bash install.sh first"
  say "weights: pulling and verifying $1 here"
  "$HERE/.venv/bin/specdeck" pull "$1" >&2 && "$HERE/.venv/bin/specdeck" check "$1" >&2 || die "the $1 files could not be pulled and verified"
  "$py" "$HERE/scripts/container_weights.py" "$1" "$2/models" >/dev/null || die "could not stage the $1 files"
}

# -- run ---------------------------------------------------------------------------------------
cmd_run() {
  local image="localhost/specdeck:cpu" models="" config="" keys="" port=8000 name="specdeck" detach=() extra=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --image) shift; image="${1:-}" ;;
      --models) shift; [ -d "${1:-}" ] || die "--models needs a folder (not '${1:-}')"; models="$(cd "$1" && pwd)" ;;
      --config) shift; [ -f "${1:-}" ] || die "--config needs a file (not '${1:-}')"; config="$(realpath "$1")" ;;
      --keys) shift; [ -f "${1:-}" ] || die "--keys needs a key file (not '${1:-}')"; keys="$(realpath "$1")" ;;
      --port) shift; port="${1:-}" ;;
      --name) shift; name="${1:-}" ;;
      --detach) detach=(--detach) ;;
      --) shift; extra=("$@"); break ;;
      *) die "run: unknown option '$1' (see --help)" ;;
    esac
    shift
  done
  need podman
  podman image exists "$image" || die "no image $image here: bash scripts/container.sh build"
  podman_flags "$image"
  local digest mounts=()
  digest="$(podman image inspect --format '{{.Digest}}' "$image")"
  [ -z "$models" ] || mounts+=(-v "$models:/models:ro")
  [ -z "$config" ] || mounts+=(-v "$config:/etc/specdeck/config.toml:ro")
  if [ -n "$keys" ]; then  # a podman secret, readable by the image's user only: never in argv or the environment
    podman secret rm "$name-keys" >/dev/null 2>&1 || true
    podman secret create "$name-keys" "$keys" >/dev/null || die "podman secret create $name-keys failed"
    # at /etc/specdeck/keys: podman 4.3 cannot mount one under /run/secrets of a read-only root
    mounts+=(--secret "$name-keys,type=mount,target=/etc/specdeck/keys,uid=10001,gid=10001,mode=0400"
             -e SPECDECK_API_KEY_FILE=/etc/specdeck/keys)
  fi
  # detached: kept after it stops (podman inspect shows its exit code); else removed
  local keep=(--rm); [ ${#detach[@]} -eq 0 ] || keep=(--replace)
  local cmd=(podman "${PODMAN_GLOBAL[@]}" run "${keep[@]}" --name "$name" "${detach[@]}" --read-only "${PODMAN_RUN[@]}"
             -p "127.0.0.1:$port:8000" -v specdeck-data:/var/lib/specdeck "${mounts[@]}"
             -e "SPECDECK_IMAGE=${image%%:*}@$digest" "$image" "${extra[@]}")
  say "${cmd[*]}"
  exec "${cmd[@]}"
}

# -- seen working: build, run with a preset on a volume, answer, stop -----------------------------
cmd_smoke() {  # [--image IMAGE] [--preset coder-1.5b] [--port 18080]: the whole path, timed
  local image="localhost/specdeck:cpu" preset="coder-1.5b" port=18080 t0 t1 t2
  while [ $# -gt 0 ]; do
    case "$1" in
      --image) shift; image="${1:-}" ;; --preset) shift; preset="${1:-}" ;; --port) shift; port="${1:-}" ;;
      *) die "smoke: unknown option '$1'" ;;
    esac
    shift
  done
  need podman; need curl
  podman image exists "$image" || die "no image $image here: bash scripts/container.sh build"
  local work; work="$(mktemp -d)"; chmod 0755 "$work"
  SMOKE_WORK="$work"; trap 'podman rm -f specdeck-smoke >/dev/null 2>&1; rm -rf "$SMOKE_WORK"' EXIT
  local baked inputs=()
  baked="$(podman image inspect --format '{{index .Labels "io.specdeck.weights.preset"}}' "$image")"
  if [ -n "$baked" ] && [ "$baked" != "<no value>" ]; then  # the image's own files and config: no volume
    preset="$baked"; say "$image carries $baked: served from its own files and config"
  else
    "$HERE/.venv/bin/specdeck" pull "$preset" >/dev/null || die "specdeck pull $preset failed"
    "$HERE/.venv/bin/python" "$HERE/scripts/container_weights.py" "$preset" "$work/models" /models >/dev/null
    { echo '[serve]'; echo 'shutdown_grace = 2'; echo; sed 's/^# .*//' "$work/models/config.toml"; } > "$work/config.toml"
    rm "$work/models/config.toml" "$work/models/weights.json"
    inputs=(--models "$work/models" --config "$work/config.toml")
  fi
  local key; key="sk-smoke-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  printf 'smoke %s\n' "$key" > "$work/keys"; chmod 0600 "$work/keys"
  t0="$(date +%s.%N)"
  bash "$0" run --image "$image" --name specdeck-smoke --detach --port "$port" "${inputs[@]}" \
    --keys "$work/keys" >/dev/null || die "podman run failed"
  for _ in $(seq 600); do
    curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    [ "$(podman inspect --format '{{.State.Running}}' specdeck-smoke 2>/dev/null)" = true ] \
      || { podman logs specdeck-smoke 2>&1 | tail -n 20; die "the container stopped before it was healthy"; }
    sleep 0.5
  done
  t1="$(date +%s.%N)"
  podman healthcheck run specdeck-smoke >/dev/null && say "health check (the image's HEALTHCHECK): healthy"
  curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"model": "'"$preset"'", "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}], "max_tokens": 64, "temperature": 0}' \
    > "$work/answer.json" || { podman logs specdeck-smoke 2>&1 | tail -n 20; die "/v1/chat/completions failed"; }
  t2="$(date +%s.%N)"
  python3 -c 'import json, sys; a = json.load(open(sys.argv[1])); print("answer:", a["choices"][0]["message"]["content"][:160].replace("\n", " ")); print("usage:", a["usage"])' "$work/answer.json"
  local code; code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")"
  say "without the key: /v1/models answers $code"
  podman exec specdeck-smoke specdeck doctor --offline 2>/dev/null | grep -E "container|build" | head -n 3 || true
  podman exec specdeck-smoke specdeck config history 2>/dev/null | tail -n 3 || true
  local t3 stopped; t3="$(date +%s.%N)"
  podman stop --time 30 specdeck-smoke >/dev/null
  stopped="$(date +%s.%N)"
  local exit_code; exit_code="$(podman inspect --format '{{.State.ExitCode}}' specdeck-smoke)"
  podman logs specdeck-smoke 2>&1 | tail -n 4
  local size; size="$(podman image inspect --format '{{.Size}}' "$image")"
  say "$image ($(( size / 1048576 )) MiB): healthy $(secs "$t0" "$t1") s after podman run; \
first answer $(secs "$t1" "$t2") s; stopped in $(secs "$t3" "$stopped") s with exit $exit_code"
  [ "$exit_code" = 0 ] || die "the container exited $exit_code after SIGTERM"
  if [ ${#inputs[@]} -gt 0 ]; then  # a pin that differs refuses the start, naming the file
    sed -i '/^\[pins\]/,$ s/= "[0-9a-f]\{64\}"/= "'"$(printf '0%.0s' $(seq 64))"'"/' "$work/config.toml"
    local refused
    refused="$(bash "$0" run --image "$image" --name specdeck-smoke-pin --port "$port" "${inputs[@]}" --keys "$work/keys" 2>&1 \
      | grep -i 'error' | grep -v 'level=' | head -n 1)" || true
    [[ "$refused" == *"is not the one the config pins"* ]] || die "a wrong pin did not refuse the start: ${refused:-it started}"
    say "a wrong pin: $refused"
  fi
}

# -- what is in an image -------------------------------------------------------------------------
cmd_manifest() {
  [ -n "${1:-}" ] || die "usage: container.sh manifest IMAGE"
  local image="$1"
  need podman
  podman_flags "$image" 2>/dev/null
  podman "${PODMAN_GLOBAL[@]}" run --rm "${PODMAN_RUN[@]}" --network none --user 0 --entrypoint sh "$image" -c '
    echo "# files"; find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp \) -prune -o -print | LC_ALL=C sort
    echo "# debian"; dpkg-query -W -f "\${Package}=\${Version}\n" | LC_ALL=C sort
    echo "# python"; /opt/specdeck/venv/bin/python -m pip list --format freeze --disable-pip-version-check | LC_ALL=C sort'
}

cmd_compare() {
  [ -n "${2:-}" ] || die "usage: container.sh compare IMAGE-A IMAGE-B"
  local a="$1" b="$2" work
  work="$(mktemp -d)"
  cmd_manifest "$a" > "$work/a" && cmd_manifest "$b" > "$work/b" || die "could not read the images"
  if diff -u "$work/a" "$work/b" > "$work/diff"; then
    say "$a and $b: the same $(grep -c '^/' "$work/a") files, $(sed -n '/^# debian/,/^# python/p' "$work/a" | grep -vc '^#') Debian and $(sed -n '/^# python/,$p' "$work/a" | grep -vc '^#') Python packages at the same versions"
    rm -rf "$work"
  else
    head -n 40 "$work/diff"; rm -rf "$work"
    die "$a and $b differ (above)"
  fi
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  run) shift; cmd_run "$@" ;;
  lock) shift; cmd_lock "$@" ;;
  manifest) shift; cmd_manifest "$@" ;;
  compare) shift; cmd_compare "$@" ;;
  smoke) shift; cmd_smoke "$@" ;;
  podman-flags) shift; need podman; [ -n "${1:-}" ] || die "usage: container.sh podman-flags IMAGE"; podman_flags "$1" ;;
  -h|--help|"") sed -n '2,25p' "$0"; [ -n "${1:-}" ] || exit 2 ;;
  *) die "unknown command '$1' (build, run, smoke, lock, manifest, compare, podman-flags; see --help)" ;;
esac
