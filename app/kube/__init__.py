"""Past one machine: Kubernetes objects for one replica per GPU (manifests.py), made from what a
start serves and its plans by `specdeck kube` (app/commands/kube.py). `alerts.yml` is a link to
deploy/prometheus/alerts.yml (so the wheel carries the rules the PrometheusRule holds)."""
