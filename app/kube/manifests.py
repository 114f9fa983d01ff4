"""Kubernetes objects for one replica per GPU, from what a start serves and its plans (`Replica`).

Each function returns plain dicts (one object each); `objects(r)` is the whole set in the order
`kubectl apply` wants them. Nothing here reads the machine: the command (app/commands/kube.py)
resolves the models and plans them as `serve` does, then hands over a `Replica`.

What follows the vLLM production-stack chart: a Deployment with startup, readiness and liveness
probes, a PVC for the weights, `nvidia.com/gpu: 1`, a PodDisruptionBudget, a ServiceMonitor, an
autoscaler on the queue gauge (KEDA). Where specdeck differs: the weights are pulled and verified by
an init container running the image's own `specdeck pull` (SHA-256 against the catalogue), the
weights volume is read-only to the server, the root file system is read-only, and the drain on
SIGTERM keeps answering until the requests in flight finish (the grace fits --request-timeout).
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from importlib import resources

import yaml

PORT = 8000
UID = 10001  # the image's `specdeck` user (deploy/container/Containerfile)
WEIGHTS, STATE, CONFIG_DIR = "/weights", "/var/lib/specdeck", "/etc/specdeck"
# the ConfigMap and the Secret as folders (no subPath: their updates reach the pod, and podman kube play mounts them)
CONFIG_FILE, KEY_FILE = f"{CONFIG_DIR}/config/config.toml", f"{CONFIG_DIR}/secret/keys"
PRE_STOP = 5  # seconds: endpoints controllers and load balancers take the pod out meanwhile
DRAIN_MARGIN = 30  # seconds past the drain for the wind-down and the exit
LOAD_BYTES_PER_S = 100 * 2**20  # a cautious disk read speed, for the startup probe's patience
CALIBRATE_S = 120  # loading past the reads: contexts, warm-up, the speculation costs measured
ENGINE = "specdeck"  # llm-d's `llm-d.ai/engine-type` label value and engineConfigs name
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class Served:
    """One model a replica serves: its name, the selection `specdeck pull` / `serve` take, its plan."""

    name: str
    selection: list[str]  # e.g. ["qwen3.6-27b-mtp"] or ["--target", "X", "--draft", "Y"]
    plan: dict  # Plan.to_json()
    file_bytes: int  # the model files' sizes together (the weights volume, the startup probe)
    plan_flags: list[str] = field(default_factory=list)  # the plan's choices, so the pod plans the same


@dataclass(frozen=True)
class Replica:
    name: str
    namespace: str
    image: str  # REPOSITORY@sha256:DIGEST
    models: list[Served]
    keys: str  # the key file's text (`name key` lines)
    metrics_token: str  # the Prometheus scraper's key, added to the keys as `prometheus`
    serve: dict  # ServeSettings' values for the [serve] table (what differs from the defaults)
    request_timeout: float
    replicas: int = 1
    max_replicas: int = 4
    queue_per_replica: int = 2  # KEDA scales out past this many waiting requests per replica
    prometheus: str = "http://prometheus-operated.monitoring.svc:9090"
    storage_class: str | None = None
    several: bool = False  # several models: [models.NAME] sections in the config

    @property
    def gpu(self) -> bool:
        return any(m.plan["device"] == "cuda" for m in self.models)

    @property
    def labels(self) -> dict:
        return {"app.kubernetes.io/name": "specdeck", "app.kubernetes.io/instance": self.name}

    @property
    def pod_labels(self) -> dict:
        return {**self.labels, "llm-d.ai/engine-type": ENGINE}


# -- figures from the plans -------------------------------------------------------------------

def host_bytes(plan: dict) -> int:
    """The host memory a plan holds: every row on a CPU plan, the host rows on a card's."""
    return sum(t["bytes"] for t in plan["terms"] if plan["device"] == "cpu" or t["where"] == "host")


def memory(r: Replica) -> str:
    """The pod's memory request and limit: its models' host rows together, in MiB (rounded up)."""
    return f"{math.ceil(sum(host_bytes(m.plan) for m in r.models) / 2**20)}Mi"


def weights_size(r: Replica) -> str:
    """The weights volume: the files, plus a tenth for a partial download beside them."""
    return f"{math.ceil(sum(m.file_bytes for m in r.models) * 1.1 / 2**30) + 1}Gi"


def startup_failures(r: Replica, period: int) -> int:
    """Probes a start may fail before Kubernetes restarts it: the load the plans expect, twice."""
    seconds = sum(m.file_bytes for m in r.models) / LOAD_BYTES_PER_S + CALIBRATE_S * len(r.models)
    return math.ceil(2 * seconds / period) + 3


def grace(r: Replica) -> int:
    """terminationGracePeriodSeconds: the preStop pause, a drain as long as a request may last, the exit."""
    return PRE_STOP + math.ceil(r.request_timeout) + DRAIN_MARGIN


# -- the objects ------------------------------------------------------------------------------

def meta(r: Replica, name: str, labels: dict | None = None) -> dict:
    return {"name": name, "namespace": r.namespace, "labels": labels or r.labels}


def config_toml(r: Replica) -> str:
    """The server's config: the [serve] table (listening everywhere in the pod, the key file, a drain
    as long as a request), and each model's section where several are served."""
    serve = {**r.serve, "host": "0.0.0.0", "port": PORT, "api_key_file": KEY_FILE,
             "shutdown_grace": r.request_timeout, "request_timeout": r.request_timeout}
    lines = ["# specdeck's config for Kubernetes (specdeck kube)", "[serve]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in sorted(serve.items())]
    if r.several:
        for m in r.models:
            lines += ["", f"[models.{m.name}]"] + section_lines(m)
    return "\n".join(lines) + "\n"


def section_lines(m: Served) -> list[str]:
    """A model's [models.NAME] keys: its selection (`model`, `draft`, ...) and the plan's choices."""
    keys, sel = {}, list(m.selection)
    if sel and not sel[0].startswith("--"):
        keys["model"] = sel.pop(0)
    while sel:
        flag = sel.pop(0)
        key = {"--target": "model"}.get(flag, flag[2:].replace("-", "_"))
        keys[key] = True if flag == "--no-mmproj" else sel.pop(0)
    for flag, value in zip(m.plan_flags[::2], m.plan_flags[1::2], strict=True):
        keys[flag[2:].replace("-", "_")] = int(value)
    return [f"{k} = {toml_value(v)}" for k, v in keys.items()]


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_map(r: Replica) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(r, f"{r.name}-config"),
            "data": {"config.toml": config_toml(r)}}


def secret(r: Replica) -> dict:
    keys = r.keys.rstrip("\n") + f"\nprometheus {r.metrics_token}\n"
    data = {"keys": keys, "metrics-token": r.metrics_token}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta(r, f"{r.name}-keys"), "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def weights_claim(r: Replica) -> dict:
    spec = {"accessModes": ["ReadWriteOnce" if r.replicas == 1 and r.max_replicas == 1 else "ReadWriteMany"],
            "resources": {"requests": {"storage": weights_size(r)}}}
    if r.storage_class:
        spec["storageClassName"] = r.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(r, f"{r.name}-weights"), "spec": spec}


def security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def env(r: Replica, home: str) -> list[dict]:
    return [{"name": "SPECDECK_HOME", "value": home}, {"name": "HF_HOME", "value": f"{WEIGHTS}/hf"},
            {"name": "SPECDECK_STATE_DIR", "value": f"{STATE}/state"}, {"name": "SPECDECK_CONFIG_DIR", "value": CONFIG_DIR}]


def probe(path: str, period: int, failures: int, timeout: int = 5) -> dict:
    return {"httpGet": {"path": path, "port": PORT}, "periodSeconds": period, "timeoutSeconds": timeout,
            "failureThreshold": failures}


def pull_container(r: Replica, m: Served) -> dict:
    """Pulls and verifies the model's files into the weights volume; what is there and verified
    (its record on the volume) is not fetched or hashed again."""
    return {"name": f"pull-{m.name}", "image": r.image, "args": ["pull", *m.selection], "env": env(r, WEIGHTS),
            "securityContext": security(),
            "volumeMounts": [{"name": "weights", "mountPath": WEIGHTS}, {"name": "state", "mountPath": STATE},
                             {"name": "tmp", "mountPath": "/tmp"}],
            "resources": {"requests": {"memory": "512Mi", "cpu": "500m"}, "limits": {"memory": "2Gi"}}}


def server_args(r: Replica) -> list[str]:
    args = ["serve", "--config", CONFIG_FILE]
    if not r.several:
        args += [*r.models[0].selection, *r.models[0].plan_flags]
    return args


def server_container(r: Replica) -> dict:
    mem = memory(r)
    resources = {"requests": {"memory": mem, "cpu": "2"}, "limits": {"memory": mem}}
    if r.gpu:
        resources["requests"]["nvidia.com/gpu"] = 1
        resources["limits"]["nvidia.com/gpu"] = 1
    return {"name": "specdeck", "image": r.image, "args": server_args(r), "env": env(r, WEIGHTS),
            "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
            "resources": resources, "securityContext": security(),
            "startupProbe": probe("/health/ready", 10, startup_failures(r, 10)),
            "readinessProbe": probe("/health/ready", 5, 2),
            "livenessProbe": probe("/health/live", 10, 6),
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP)]}}},
            "volumeMounts": [{"name": "weights", "mountPath": WEIGHTS, "readOnly": True},
                             {"name": "state", "mountPath": STATE},
                             {"name": "config", "mountPath": CONFIG_FILE.rsplit("/", 1)[0], "readOnly": True},
                             {"name": "keys", "mountPath": KEY_FILE.rsplit("/", 1)[0], "readOnly": True},
                             {"name": "tmp", "mountPath": "/tmp"}]}


def deployment(r: Replica) -> dict:
    pod = {"securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                               "seccompProfile": {"type": "RuntimeDefault"}},
           "terminationGracePeriodSeconds": grace(r), "enableServiceLinks": False,
           "initContainers": [pull_container(r, m) for m in r.models],
           "containers": [server_container(r)],
           "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": f"{r.name}-weights"}},
                       {"name": "state", "emptyDir": {}},
                       {"name": "config", "configMap": {"name": f"{r.name}-config"}},
                       {"name": "keys", "secret": {"secretName": f"{r.name}-keys", "defaultMode": 0o400, "optional": False}},
                       {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}]}
    if r.gpu:
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(r, r.name),
            "spec": {"replicas": r.replicas, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": r.labels},
                     "template": {"metadata": {"labels": r.pod_labels}, "spec": pod}}}


def service(r: Replica) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(r, r.name),
            "spec": {"selector": r.labels, "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]}}


def disruption_budget(r: Replica) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(r, r.name),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": r.labels}}}


def service_monitor(r: Replica) -> dict:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": meta(r, r.name),
            "spec": {"selector": {"matchLabels": r.labels},
                     "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s",
                                    "authorization": {"type": "Bearer",
                                                      "credentials": {"name": f"{r.name}-keys", "key": "metrics-token"}}}]}}


def prometheus_rule(r: Replica) -> dict:
    rules = yaml.safe_load(resources.files("app.kube").joinpath("alerts.yml").read_text(encoding="utf-8"))
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": meta(r, r.name),
            "spec": {"groups": rules["groups"]}}


def queue_query(r: Replica) -> str:
    return f'sum(specdeck_queue_depth{{namespace="{r.namespace}",service="{r.name}"}})'


def scaled_object(r: Replica) -> dict:
    """KEDA scales the Deployment on the requests waiting for a slot (vLLM's stack scales on
    vllm:num_requests_waiting), `queue_per_replica` a replica."""
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": meta(r, r.name),
            "spec": {"scaleTargetRef": {"name": r.name}, "minReplicaCount": r.replicas, "maxReplicaCount": r.max_replicas,
                     "cooldownPeriod": 300, "pollingInterval": 15,
                     "triggers": [{"type": "prometheus",
                                   "metadata": {"serverAddress": r.prometheus, "query": queue_query(r),
                                                "threshold": str(r.queue_per_replica)}}]}}


def metric_spec(name: str, r: Replica) -> str:
    """A gauge as llm-d's picker names it: with its model label where several models are served."""
    return f'{name}{{model="{r.models[0].name}"}}'


def picker_config(r: Replica) -> dict:
    """llm-d's endpoint picker taught specdeck's gauges (EndpointPickerConfig: a config, not a CRD)."""
    text = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig",
            "plugins": [{"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"}, {"type": "prefix-cache-scorer"},
                        {"type": "max-score-picker"}, {"name": "metrics-source", "type": "metrics-data-source"},
                        {"name": "metrics-extractor", "type": "core-metrics-extractor",
                         "parameters": {"engineLabelKey": "llm-d.ai/engine-type", "defaultEngine": ENGINE,
                                        "engineConfigs": [{"name": ENGINE,
                                                           "queuedRequestsSpec": metric_spec("specdeck_queue_depth", r),
                                                           "runningRequestsSpec": metric_spec("specdeck_busy_slots", r),
                                                           "kvUsageSpec": metric_spec("specdeck_kv_cache_usage_ratio", r),
                                                           "cacheInfoSpec": metric_spec("specdeck_cache_config_info", r)}]}}],
            "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "queue-scorer", "weight": 2},
                                                                   {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                                                                   {"pluginRef": "prefix-cache-scorer", "weight": 3},
                                                                   {"pluginRef": "max-score-picker"}]}]}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(r, f"{r.name}-epp-config"),
            "data": {"epp-config.yaml": yaml.dump(text, Dumper=_Dumper, sort_keys=False)}}


def inference_pool(r: Replica) -> dict:
    """The Gateway API Inference Extension's pool of specdeck pods, picked by `{name}-epp` (llm-d's
    endpoint picker run with picker_config)."""
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": meta(r, r.name),
            "spec": {"selector": {"matchLabels": r.labels}, "targetPorts": [{"number": PORT}],
                     "endpointPickerRef": {"name": f"{r.name}-epp", "port": {"number": 9002}}}}


def objects(r: Replica) -> list[dict]:
    return [config_map(r), secret(r), weights_claim(r), deployment(r), service(r), disruption_budget(r),
            service_monitor(r), prometheus_rule(r), scaled_object(r), picker_config(r), inference_pool(r)]


def file_name(obj: dict) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


class _Dumper(yaml.SafeDumper):
    """YAML as people write it: text of several lines as a literal block."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def dump(objs: list[dict]) -> str:
    return "".join("---\n" + yaml.dump(o, Dumper=_Dumper, sort_keys=False) for o in objs)


def litellm_config(hosts: list[str], model: str, key_env: str = "SPECDECK_API_KEY") -> str:
    """LiteLLM's proxy over several specdeck hosts: one model_list entry per host, the same name."""
    entries = [{"model_name": model, "litellm_params": {"model": f"openai/{model}", "api_base": f"{h.rstrip('/')}/v1",
                                                        "api_key": f"os.environ/{key_env}"}} for h in hosts]
    return yaml.safe_dump({"model_list": entries,
                           "router_settings": {"routing_strategy": "least-busy", "num_retries": 2, "allowed_fails": 1,
                                               "cooldown_time": 30}}, sort_keys=False)
