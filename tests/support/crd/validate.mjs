// Validates custom resources against their CRD schemas (kubernetes-models' validators, generated from
// the projects' own CRDs): reads a JSON array of objects on stdin, prints one line per object, and
// exits 1 if any is invalid or has no schema here.
const KINDS = {
  "monitoring.coreos.com/v1/ServiceMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "monitoring.coreos.com/v1/PrometheusRule": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
  "keda.sh/v1alpha1/ScaledObject": "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject",
};
let input = "";
for await (const chunk of process.stdin) input += chunk;
let bad = 0;
for (const obj of JSON.parse(input)) {
  const key = obj.apiVersion + "/" + obj.kind;
  if (!KINDS[key]) { console.log("no schema " + key); bad++; continue; }
  const Kind = (await import(KINDS[key]))[obj.kind];
  try { new Kind(obj).validate(); console.log("valid " + key); }
  catch (e) { console.log("invalid " + key + ": " + String(e.message).split("\n").slice(0, 6).join(" | ")); bad++; }
}
process.exit(bad ? 1 : 0);
