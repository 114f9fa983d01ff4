#!/usr/bin/env bash
# `specdeck kube`'s Deployment run on this machine by Debian's `podman kube play`, with its ConfigMap,
# Secret and weights volume: the init container finds the preset's files on the volume and verifies
# them, the pod becomes ready, answers a chat request, and a stream in flight finishes whole while
# the pod is stopped (its drain), the server exiting 0. Timed; the lines go to docs/BENCHMARKS.md.
#
#   bash scripts/kube_play.sh [--image localhost/specdeck:cpu] [--preset coder-1.5b]
#
# Needs: podman (Debian's), the image (bash scripts/container.sh build), the preset pulled here
# (.venv/bin/specdeck pull PRESET): its files are copied onto the volume, as a cluster's weights
# volume would hold them after a first pull. podman kube play runs Pod, Deployment, ConfigMap,
# Secret and PVC (a named volume) and ignores the rest (Service, PDB, the custom resources).
set -Eeuo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VPY="$HERE/.venv/bin/python"
IMAGE="localhost/specdeck:cpu"
PRESET="coder-1.5b"
NAME="specdeck"
say() { printf '==> %s\n' "$*"; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
die() { printf 'kube_play.sh: error: %s\n' "$*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --image) shift; IMAGE="${1:-}" ;;
    --preset) shift; PRESET="${1:-}" ;;
    *) die "unknown option '$1' (--image IMAGE, --preset PRESET)" ;;
  esac
  shift
done
command -v podman >/dev/null || die "no podman here (apt-get install podman runc)"
podman image exists "$IMAGE" || die "no image $IMAGE: bash scripts/container.sh build"
[ -x "$VPY" ] || die "no $VPY: bash install.sh"

# what podman needs on these VMs (docs/OPERATIONS.md, the container image): cgroupfs, runc, rlimits
G=(--cgroup-manager=cgroupfs --runtime runc)
WORK="$(mktemp -d)"
export CONTAINERS_CONF="$WORK/containers.conf"
printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n' > "$CONTAINERS_CONF"
cleanup() {
  [ -f "$WORK/play.yaml" ] && podman "${G[@]}" kube down "$WORK/play.yaml" >/dev/null 2>&1 || true
  podman volume rm -f "$NAME-weights" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
[ -n "${KEEP:-}" ] || trap cleanup EXIT

digest="$(podman image inspect --format '{{.Digest}}' "$IMAGE")"
ref="${IMAGE%:*}@$digest"
key="sk-play-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf 'tester %s\n' "$key" > "$WORK/keys"; chmod 0600 "$WORK/keys"

say "specdeck kube $PRESET (planned for 8 GiB, context 2,048, 2 slots)"
(cd "$HERE" && "$VPY" -m app.cli kube "$PRESET" --image "$ref" --api-key-file "$WORK/keys" --ram 8GiB --ctx 2048 \
   --parallel 2 --offline -o "$WORK/k8s") >/dev/null
# podman 4.3 removes an init container without waiting for it to end (later podman waits): the
# Deployment's init containers run first as a pod of their own, the same containers and volumes
"$VPY" - "$WORK/k8s/deployment-$NAME.yaml" "$WORK/init.yaml" <<'PY'
import sys, yaml
dep_path, init_path = sys.argv[1:]
dep = yaml.safe_load(open(dep_path))
spec = dep["spec"]["template"]["spec"]
init = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": dep["metadata"]["name"] + "-init"},
        "spec": {"restartPolicy": "Never", "securityContext": spec["securityContext"],
                 "containers": spec.pop("initContainers"), "volumes": spec["volumes"]}}
open(init_path, "w").write(yaml.safe_dump(init, sort_keys=False))
open(dep_path, "w").write(yaml.safe_dump(dep, sort_keys=False))
PY
# podman 4.3 writes a Secret volume's files still base64-encoded (Kubernetes decodes them): here the
# keys go in a ConfigMap of the same name and both pods mount that instead (the Secret is still
# played with the Deployment; the init pod runs before it, so it must not name the Secret)
"$VPY" - "$WORK/k8s/secret-$NAME-keys.yaml" "$WORK/k8s/configmap-$NAME-keys.yaml" "$WORK/k8s/deployment-$NAME.yaml" \
  "$WORK/init.yaml" <<'PY'
import base64, sys, yaml
secret_path, out, *pods = sys.argv[1:]
s = yaml.safe_load(open(secret_path))
cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": s["metadata"],
      "data": {k: base64.b64decode(v).decode() for k, v in s["data"].items()}}
open(out, "w").write(yaml.safe_dump(cm, sort_keys=False))
for path in pods:
    obj = yaml.safe_load(open(path))
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    for v in spec["volumes"]:
        if "secret" in v:
            v.pop("secret")
            v["configMap"] = {"name": s["metadata"]["name"]}
    open(path, "w").write(yaml.safe_dump(obj, sort_keys=False))
PY
for kind in configmap-"$NAME"-config secret-"$NAME"-keys configmap-"$NAME"-keys deployment-"$NAME"; do
  printf -- '---\n'; cat "$WORK/k8s/$kind.yaml"
done > "$WORK/play.yaml"
{ printf -- '---\n'; cat "$WORK/k8s/configmap-$NAME-config.yaml"; printf -- '---\n'; cat "$WORK/k8s/configmap-$NAME-keys.yaml"
  printf -- '---\n'; cat "$WORK/init.yaml"; } > "$WORK/init-play.yaml"

# the PVC first (podman makes it a named volume), then the files a first pull would have left on it
podman volume rm -f "$NAME-weights" >/dev/null 2>&1 || true
podman "${G[@]}" kube play "$WORK/k8s/persistentvolumeclaim-$NAME-weights.yaml" >/dev/null || die "podman kube play (the PVC) failed"


say "the preset's files onto the weights volume ($NAME-weights)"
vol="$(podman volume inspect --format '{{.Mountpoint}}' "$NAME-weights")"
(cd "$HERE" && "$VPY" - "$PRESET" "$vol") <<'PY'
import os, shutil, sys
from pathlib import Path
sys.path.insert(0, os.getcwd())
from app.commands.common import catalog_of, local_path, make_fetcher, roles_of, selection_of
from app.commands.start_request import Chosen
preset, vol = sys.argv[1], Path(sys.argv[2])
chosen, catalog = Chosen(name=preset), catalog_of(None)
sel = selection_of(chosen, catalog)
fetcher = make_fetcher(offline=True)
for role, ref in roles_of(sel, chosen, True, catalog):
    src = local_path(fetcher, ref)
    dest = vol / "models" / ref.spec.sha256 / ref.spec.file
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
    print(f"  {role}: {ref.spec.file}")
PY
chown -R 10001:10001 "$vol"

t0="$(date +%s.%N)"
podman "${G[@]}" kube play "$WORK/init-play.yaml" >/dev/null || die "podman kube play (the init containers) failed"
for c in $(podman ps -a --format '{{.Names}}' | grep -E "^$NAME-init-pull-"); do
  rc="$(podman wait "$c")"
  say "init container $c: exit $rc; $(podman logs "$c" 2>&1 | tail -n 1)"
  [ "$rc" = 0 ] || die "the init container $c failed"
done
podman "${G[@]}" kube down "$WORK/init-play.yaml" >/dev/null 2>&1 || true
podman "${G[@]}" kube play "$WORK/play.yaml" >/dev/null || die "podman kube play failed"
ctr="$(podman ps --format '{{.Names}}' | grep -E "^$NAME.*-$NAME\$" | head -n 1)"
[ -n "$ctr" ] || die "no server container: $(podman ps -a --format '{{.Names}} {{.Status}}' | tr '\n' ';')"
say "pod up: container $ctr"

inside() { podman exec -i "$ctr" python3 - "$@"; }
ready="$(inside "$key" <<'PY'
import sys, time, urllib.request
for _ in range(600):
    try:
        with urllib.request.urlopen("http://127.0.0.1:8000/health/ready", timeout=5) as r:
            if r.status == 200:
                print("ready"); break
    except OSError:
        time.sleep(1)
PY
)" || true
[ "$ready" = ready ] || { podman logs "$ctr" 2>&1 | tail -n 20; die "the pod never became ready"; }
t1="$(date +%s.%N)"
say "ready $(secs "$t0" "$t1") s after podman kube play"

inside "$key" <<'PY'
import json, sys, urllib.request
req = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions", method="POST",
                             headers={"Authorization": f"Bearer {sys.argv[1]}", "Content-Type": "application/json"},
                             data=json.dumps({"model": "x", "max_tokens": 16, "temperature": 0,
                                              "messages": [{"role": "user", "content": "Say hello."}]}).encode())
with urllib.request.urlopen(req, timeout=300) as r:
    out = json.load(r)
print("==> answered:", json.dumps(out["choices"][0]["message"]["content"])[:80], out["usage"])
PY

say "a stream in flight while the pod is stopped"
inside "$key" > "$WORK/stream.txt" 2>&1 <<'PY' &
import json, sys, urllib.request
req = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions", method="POST",
                             headers={"Authorization": f"Bearer {sys.argv[1]}", "Content-Type": "application/json"},
                             data=json.dumps({"model": "x", "max_tokens": 200, "temperature": 0, "stream": True,
                                              "messages": [{"role": "user", "content": "Count from one to sixty in words."}]}).encode())
n, finish = 0, None
with urllib.request.urlopen(req, timeout=600) as r:
    for line in r:
        if line.startswith(b"data: {"):
            c = json.loads(line[6:])
            n += 1
            if c.get("choices") and c["choices"][0]["finish_reason"]:
                finish = c["choices"][0]["finish_reason"]
        print(n, flush=True)
print("finish", finish, flush=True)
PY
streamer=$!
for _ in $(seq 1 600); do [ "$(tail -n 1 "$WORK/stream.txt" 2>/dev/null || echo 0)" -gt 5 ] 2>/dev/null && break; sleep 0.2; done
t2="$(date +%s.%N)"
pod="$(podman container inspect --format '{{.Pod}}' "$ctr")"
podman "${G[@]}" pod stop -t 700 "$pod" >/dev/null &
stopper=$!
# (podman opens no exec session into a stopping container: readiness while draining is tests/test_kube.py's)
wait "$streamer" || true
wait "$stopper" || true
t3="$(date +%s.%N)"
code="$(podman inspect --format '{{.State.ExitCode}}' "$ctr")"
finish="$(grep '^finish' "$WORK/stream.txt" | cut -d' ' -f2)"
podman logs "$ctr" 2>&1 | grep -E "draining|stopped|exit" | tail -n 3 || true
say "stream in flight: finish_reason $finish after $(grep -c '^[0-9]' "$WORK/stream.txt") chunks; the server exited $code, $(secs "$t2" "$t3") s after the stop"
[ "$finish" = length ] || [ "$finish" = stop ] || die "the stream in flight did not finish whole"
[ "$code" = 0 ] || die "the server exited $code"
podman "${G[@]}" kube down "$WORK/play.yaml" >/dev/null
say "podman kube down: done"
