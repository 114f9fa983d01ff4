"""Past one machine: `specdeck kube`'s manifests validated offline against the Kubernetes schemas
(kubernetes-validate --strict), their memory figures against the plan, bad settings as one line;
the gauges inference-aware routers read; probes that mean what Kubernetes means and a drain on
SIGTERM that loses nothing (on the Qwen pair)."""

from __future__ import annotations

import base64
import json
import math
import signal
import threading
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml
from conftest import run_cli
from support.live import Serve, free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent
K8S = "1.37.0"
IMAGE = "registry.example/specdeck@sha256:" + "ab" * 32
CORE = {"ConfigMap", "Secret", "PersistentVolumeClaim", "Deployment", "Service", "PodDisruptionBudget"}
CUSTOM = {("ServiceMonitor", "monitoring.coreos.com/v1"), ("PrometheusRule", "monitoring.coreos.com/v1"),
          ("ScaledObject", "keda.sh/v1alpha1"), ("InferencePool", "inference.networking.k8s.io/v1")}


@pytest.fixture
def keys(tmp_path):
    k = tmp_path / "keys"
    k.write_text("alice sk-alice-1\n")
    k.chmod(0o600)
    return k


@pytest.fixture(scope="module")
def home(real_pair, tmp_path_factory):
    """A specdeck home holding the pulled pair (its models and records), for --offline planning."""
    d = tmp_path_factory.mktemp("kube-home")
    cache = real_pair.target.parents[2]  # .../models/<sha256>/file.gguf
    for name in ("models", "verified.json"):
        if (cache / name).exists():
            (d / name).symlink_to(cache / name)
    return {"SPECDECK_HOME": str(d)}


def kube(*args: str, env: dict | None = None):
    return run_cli("kube", *args, env=env)


def test_manifests_validate_against_the_kubernetes_schemas_and_the_plan(home, keys, tmp_path):
    r = kube("coder-1.5b", "--image", IMAGE, "--api-key-file", str(keys), "--ram", "8GiB", "--offline",
             "-o", str(tmp_path / "out"), env=home)
    assert r.returncode == 0, r.stdout + r.stderr
    objs = [yaml.safe_load(f.read_text()) for f in sorted((tmp_path / "out").glob("*.yaml"))]
    kinds = {o["kind"] for o in objs}
    assert CORE <= kinds and {k for k, _ in CUSTOM} <= kinds, kinds
    for o in objs:
        if o["kind"] in CORE:
            kubernetes_validate.validate(o, K8S, strict=True)  # raises on any error, unknown fields included
        else:
            assert (o["kind"], o["apiVersion"]) in CUSTOM, o["kind"]
    dep = next(o for o in objs if o["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert dep["spec"]["strategy"]["type"] == "Recreate" and c["image"] == IMAGE
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] and "nvidia.com/gpu" not in c["resources"]["limits"]  # the CPU pair
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["weights"]["readOnly"] is True and not mounts["state"].get("readOnly")
    assert pod["initContainers"][0]["args"] == ["pull", "coder-1.5b"]
    assert c["startupProbe"]["httpGet"]["path"] == "/health/ready" and c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    # a drain as long as a request may last, after the preStop pause
    assert pod["terminationGracePeriodSeconds"] > 600 + int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    # the memory figures are the plan's (a CPU plan: every row is host memory), and the pod plans the same
    plan = json.loads(run_cli("plan", "coder-1.5b", "--ram", "8GiB", "--json", "--offline", env=home).stdout)
    host = sum(t["bytes"] for t in plan["terms"])
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == f"{math.ceil(host / 2**20)}Mi"
    assert c["args"][-4:] == ["--ctx", str(plan["ctx"]), "--parallel", str(plan["parallel"])]
    # Prometheus holds specdeck's own alert rules; llm-d's picker is taught its gauges
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]
    epp = yaml.safe_load(next(o for o in objs if o["metadata"]["name"] == "specdeck-epp-config")["data"]["epp-config.yaml"])
    engine = next(p for p in epp["plugins"] if p["type"] == "core-metrics-extractor")["parameters"]["engineConfigs"][0]
    assert engine["queuedRequestsSpec"].startswith("specdeck_queue_depth") and engine["kvUsageSpec"].startswith(
        "specdeck_kv_cache_usage_ratio")
    assert dep["spec"]["template"]["metadata"]["labels"]["llm-d.ai/engine-type"] == engine["name"]
    secret = next(o for o in objs if o["kind"] == "Secret")
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    token = data["metrics-token"]
    assert f"prometheus {token}" in data["keys"] and "alice sk-alice-1" in data["keys"]
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["key"] == "metrics-token"


def test_custom_resources_validate_against_their_crd_schemas(home, keys):
    """ServiceMonitor and PrometheusRule against prometheus-operator's CRDs, ScaledObject against
    KEDA's (kubernetes-models' validators, generated from those CRDs; node, tests/support/crd)."""
    import os
    import shutil
    import subprocess

    crd = ROOT / "tests" / "support" / "crd"
    if shutil.which("node") is None or not (crd / "node_modules").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("no CRD schemas: install.sh --test runs npm ci in tests/support/crd")
        pytest.skip("no CRD schemas here: npm ci --prefix tests/support/crd")
    r = kube("coder-1.5b", "--image", IMAGE, "--api-key-file", str(keys), "--ram", "8GiB", "--offline", env=home)
    custom = [o for o in yaml.safe_load_all(r.stdout) if o and o["kind"] in ("ServiceMonitor", "PrometheusRule", "ScaledObject")]
    assert len(custom) == 3, r.stderr
    ok = subprocess.run(["node", str(crd / "validate.mjs")], input=json.dumps(custom), capture_output=True, text=True, cwd=crd)
    assert ok.returncode == 0 and ok.stdout.count("valid ") == 3, ok.stdout + ok.stderr
    custom[2]["spec"]["minReplicaCount"] = "one"  # the validator can fail
    bad = subprocess.run(["node", str(crd / "validate.mjs")], input=json.dumps(custom), capture_output=True, text=True, cwd=crd)
    assert bad.returncode == 1 and "minReplicaCount must be integer" in bad.stdout


def test_the_inference_pool_validates_against_the_inference_extensions_crd(home, keys):
    """The InferencePool against the openAPIV3Schema of the Gateway API Inference Extension's own CRD
    (tests/support/crd/inferencepool-crd.yaml, pinned with its commit and licence: no package on
    PyPI or npm carries it), with jsonschema; its CEL rules (x-kubernetes-validations) are the API
    server's and are not run here."""
    import jsonschema

    crd = yaml.safe_load((ROOT / "tests" / "support" / "crd" / "inferencepool-crd.yaml").read_text())
    r = kube("coder-1.5b", "--image", IMAGE, "--api-key-file", str(keys), "--ram", "8GiB", "--offline", env=home)
    pool = next(o for o in yaml.safe_load_all(r.stdout) if o and o["kind"] == "InferencePool")
    group, version = pool["apiVersion"].split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == "InferencePool"
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    jsonschema.validate(pool, schema)
    deployment = next(o for o in yaml.safe_load_all(r.stdout) if o and o["kind"] == "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()  # it selects specdeck's pods
    bad = {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": "eight thousand"}]}}  # the schema can fail
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'integer'"):
        jsonschema.validate(bad, schema)


def test_several_models_and_a_card_preset(home, keys):
    r = kube("--model", "chat=coder-1.5b", "--model", "small=gemma3-270m-q4_k_m", "--image", IMAGE,
             "--api-key-file", str(keys), "--ram", "8GiB", "--offline", env=home)
    assert r.returncode == 0, r.stderr
    objs = {o["kind"] + "/" + o["metadata"]["name"]: o for o in yaml.safe_load_all(r.stdout) if o}
    pod = objs["Deployment/specdeck"]["spec"]["template"]["spec"]
    assert [c["args"] for c in pod["initContainers"]] == [["pull", "coder-1.5b"], ["pull", "gemma3-270m-q4_k_m"]]
    assert pod["containers"][0]["args"] == ["serve", "--config", "/etc/specdeck/config/config.toml"]
    config = objs["ConfigMap/specdeck-config"]["data"]["config.toml"]
    assert '[models.chat]\nmodel = "coder-1.5b"' in config and '[models.small]\nmodel = "gemma3-270m-q4_k_m"' in config
    # a card preset planned for a 24 GiB card (its headers from the catalogue's own file sizes need the hub: skipped
    # offline); the one-line error says what to give
    r = kube("qwen3.6-27b-mtp", "--image", IMAGE, "--api-key-file", str(keys), "--offline", env=home)
    assert r.returncode != 0 and r.stderr.count("\n") <= 3 and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args,says", [
    (["--image", "specdeck:latest"], "--image must name the image by digest"),
    (["--image", IMAGE, "--no-key"], "kube needs --api-key-file"),
    (["--image", IMAGE, "--replicas", "0"], "need 1 <= replicas <= max"),
    (["--image", IMAGE, "--name", "Bad_Name"], "--name 'Bad_Name'"),
])
def test_a_bad_setting_is_one_clear_line(home, keys, tmp_path, args, says):
    key_args = [] if "--no-key" in args else ["--api-key-file", str(keys)]
    r = kube("coder-1.5b", *[a for a in args if a != "--no-key"], *key_args, "--ram", "8GiB", "--offline", env=home)
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_file_of_this_machine_cannot_be_pulled_in_the_pod(home, keys, real_pair):
    r = kube("--target", str(real_pair.target), "--image", IMAGE, "--api-key-file", str(keys), "--ram", "8GiB", env=home)
    assert r.returncode != 0 and "must be catalogue models or presets" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_litellm_routes_one_name_over_several_hosts():
    r = kube("--litellm", "http://10.0.0.1:8000", "http://10.0.0.2:8000/")
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert [m["litellm_params"]["api_base"] for m in cfg["model_list"]] == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    assert {m["model_name"] for m in cfg["model_list"]} == {"specdeck"} and cfg["router_settings"]["num_retries"] >= 1


# -- probes, gauges and the drain, on a live server ------------------------------------------------

def test_probes_gauges_and_a_drain_that_loses_nothing(real_pair, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    s = Serve("--target", str(real_pair.target), "--draft", str(real_pair.draft), "--port", str(port), "--ctx", "2048",
              "--parallel", "2", "--threads", "2", "--shutdown-grace", "120", env={"SPECDECK_HOME": str(tmp_path)})
    try:
        assert s.wait_line("models loaded", stall=300), s.output
        assert httpx.get(url + "/health/live").json() == {"status": "alive"}
        assert httpx.get(url + "/health/ready").status_code == 200
        metrics = httpx.get(url + "/metrics").text
        assert 'specdeck_kv_cache_usage_ratio{model="custom"} 0.0' in metrics
        assert 'specdeck_cache_config_info{block_size="1",model="custom",num_gpu_blocks="2048"} 1.0' in metrics
        body = {"model": "x", "messages": [{"role": "user", "content": "Count from one to fifty in words."}],
                "max_tokens": 160, "temperature": 0, "stream": True}
        chunks: list[dict] = []

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))

        t = threading.Thread(target=stream)
        t.start()
        assert wait_for(lambda: len(chunks) > 3, timeout=120)
        used = float(next(line for line in httpx.get(url + "/metrics").text.splitlines()
                          if line.startswith("specdeck_kv_cache_usage_ratio")).split()[-1])
        assert 0 < used < 1  # the prompt and the answer so far, of 2,048 cells
        s.p.send_signal(signal.SIGTERM)
        ready = wait_for(lambda: (r := httpx.get(url + "/health/ready")).status_code == 503 and r.json(), timeout=5)
        assert ready and ready["status"] == "draining" and ready["in_flight"] >= 1
        assert httpx.get(url + "/health/live").status_code == 200  # alive while draining
        assert httpx.get(url + "/health").json()["status"] == "draining"
        late = httpx.post(url + "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 8}, timeout=120)
        assert late.status_code == 200  # a request the balancer still sent is answered, not lost
        t.join(120)
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
        assert finish in (["length"], ["stop"]), finish  # the stream in flight finished whole (not "abort")
        assert s.p.wait(60) == 0, s.output[-2000:]
        assert "draining" in s.output
    finally:
        s.stop()


def test_a_card_plan_asks_for_one_gpu_and_its_host_rows_only():
    """On a card the pod's memory is the plan's host rows (the weights and caches are the card's)."""
    from app.kube.manifests import Replica, Served, deployment

    plan = {"device": "cuda", "terms": [{"name": "target weights", "bytes": 16 * 2**30, "where": "device"},
                                        {"name": "host buffers", "bytes": 3 * 2**30 + 1, "where": "host"}]}
    r = Replica(name="s", namespace="n", image=IMAGE, models=[Served("m", ["qwen3.6-27b-mtp"], plan, 17 * 2**30)],
                keys="a k\n", metrics_token="t", serve={}, request_timeout=600)
    pod = deployment(r)["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == 1
    assert res["limits"]["memory"] == f"{3 * 1024 + 1}Mi" and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    startup = pod["containers"][0]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2 * 17 * 2**30 / (100 * 2**20)  # 17 GiB read at 100 MiB/s, twice
    kubernetes_validate.validate(deployment(r), K8S, strict=True)
