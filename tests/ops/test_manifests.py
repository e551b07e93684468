"""The Kubernetes examples, offline: every core object validates against the API's schemas
(kubernetes-validate, strict), the custom resources use only their published fields, every PET_*
variable is an elastic-run option, the podFailurePolicy is the exit-code table, the grace period
outlasts the shutdown timeout, and the scrape config's relabelling finds an agent's endpoint."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from launcher.cli.run import elastic_run
from launcher.errors import EXIT_CODES

K8S = Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
VERSION = "1.30"
DOCS = [(path.name, doc) for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
CUSTOM = {"PyTorchJob", "PodMonitor"}
# kubeflow.org/v1 PyTorchJob (training-operator's published CRD) and monitoring.coreos.com/v1 PodMonitor: the fields
ELASTIC_POLICY = {
    "minReplicas",
    "maxReplicas",
    "rdzvBackend",
    "rdzvPort",
    "rdzvHost",
    "rdzvId",
    "rdzvConf",
    "standalone",
    "nProcPerNode",
    "maxRestarts",
    "metrics",
}
REPLICA_SPEC = {"replicas", "template", "restartPolicy"}
POD_MONITOR_ENDPOINT = {
    "port",
    "targetPort",
    "path",
    "scheme",
    "params",
    "interval",
    "scrapeTimeout",
    "honorLabels",
    "relabelings",
    "metricRelabelings",
    "tlsConfig",
    "bearerTokenSecret",
    "basicAuth",
    "followRedirects",
}


def _pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}), "spec": template["spec"]}


def _containers(doc: dict) -> list[dict]:
    if doc["kind"] == "Job":
        return doc["spec"]["template"]["spec"]["containers"]
    if doc["kind"] == "PyTorchJob":
        return [
            c for spec in doc["spec"]["pytorchReplicaSpecs"].values() for c in spec["template"]["spec"]["containers"]
        ]
    return []


def _templates(doc: dict) -> list[dict]:
    if doc["kind"] == "Job":
        return [doc["spec"]["template"]]
    if doc["kind"] == "PyTorchJob":
        return [spec["template"] for spec in doc["spec"]["pytorchReplicaSpecs"].values()]
    return []


@pytest.mark.parametrize(
    "name,doc",
    [d for d in DOCS if d[1]["kind"] not in CUSTOM],
    ids=[f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in DOCS if d["kind"] not in CUSTOM],
)
def test_core_objects_validate_against_the_kubernetes_schemas(name, doc):
    kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_pytorchjob_uses_only_published_fields_and_its_pods_validate():
    job = next(d for _, d in DOCS if d["kind"] == "PyTorchJob")
    assert job["apiVersion"] == "kubeflow.org/v1"
    assert set(job["spec"]) <= {"elasticPolicy", "pytorchReplicaSpecs", "runPolicy", "nprocPerNode"}
    assert set(job["spec"]["elasticPolicy"]) <= ELASTIC_POLICY
    assert job["spec"]["elasticPolicy"]["rdzvBackend"] in ("c10d", "etcd", "etcd-v2")
    for role, spec in job["spec"]["pytorchReplicaSpecs"].items():
        assert role in ("Master", "Worker") and set(spec) <= REPLICA_SPEC
        assert spec["restartPolicy"] == "ExitCode"  # retries 128-255, fails 1-127: the table's split
        kubernetes_validate.validate(_pod(spec["template"]), VERSION, strict=True)


def test_the_pod_monitor_uses_only_published_fields():
    monitor = next(d for _, d in DOCS if d["kind"] == "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {
        "selector",
        "podMetricsEndpoints",
        "namespaceSelector",
        "jobLabel",
        "podTargetLabels",
    }
    assert all(set(e) <= POD_MONITOR_ENDPOINT for e in monitor["spec"]["podMetricsEndpoints"])
    pods = [t for _, d in DOCS for t in _templates(d)]
    assert all(monitor["spec"]["selector"]["matchLabels"].items() <= t["metadata"]["labels"].items() for t in pods)


def test_every_pet_variable_is_an_elastic_run_option():
    known = {p.envvar for p in elastic_run.params if p.envvar}
    used = {
        e["name"] for _, d in DOCS for c in _containers(d) for e in c.get("env", []) if e["name"].startswith("PET_")
    }
    assert used and used <= known, used - known


def test_the_pod_failure_policy_is_the_exit_code_table():
    job = next(d for _, d in DOCS if d["kind"] == "Job")
    rules = job["spec"]["podFailurePolicy"]["rules"]
    fail = {code for r in rules if r["action"] == "FailJob" for code in r.get("onExitCodes", {}).get("values", [])}
    assert fail == {int(row.code) for row in EXIT_CODES if not row.retry and row.code != "0"}
    assert any(r["action"] == "Ignore" and r.get("onPodConditions") for r in rules)  # preemption is not a failure
    assert all(row.retry for row in EXIT_CODES if row.code.isdigit() and int(row.code) >= 128)


def test_the_grace_period_outlasts_the_shutdown_timeout():
    for template, container in [(t, c) for _, d in DOCS for t in _templates(d) for c in t["spec"]["containers"]]:
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert template["spec"]["terminationGracePeriodSeconds"] >= float(env["PET_SHUTDOWN_TIMEOUT"]) + 10
        probes = {container["livenessProbe"]["httpGet"]["path"], container["readinessProbe"]["httpGet"]["path"]}
        assert (
            probes == {"/healthz", "/readyz"}
            and env["PET_HTTP_PORT"] == template["metadata"]["annotations"]["prometheus.io/port"]
        )


def _relabel(rules: list[dict], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's relabelling (keep and replace), with its anchored regexes."""
    for rule in rules:
        value = ";".join(labels.get(s, "") for s in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action", "replace") == "keep":
            if not match:
                return None
        elif match:
            replacement = re.sub(r"\$(\d+)", r"\\\1", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
    return labels


def test_the_scrape_config_finds_an_agents_endpoint_from_its_annotations():
    config = yaml.safe_load((K8S / "prometheus-scrape.yml").read_text())
    rules = config["scrape_configs"][0]["relabel_configs"]
    pod = {
        "__address__": "10.1.2.3:8080",
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
        "__meta_kubernetes_pod_annotation_prometheus_io_port": "9400",
        "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
        "__meta_kubernetes_pod_name": "train-0",
    }
    target = _relabel(rules, dict(pod))
    assert target is not None and target["__address__"] == "10.1.2.3:9400" and target["__metrics_path__"] == "/metrics"
    assert _relabel(rules, {**pod, "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "false"}) is None
