"""helm/calve rendered by Helm's own engine (helm-python-sdk: Helm's Go SDK as a library, no
`helm` binary) and linted, and each manifest validated against the Kubernetes schemas
(kubernetes-validate); the Prometheus Operator's kinds, which those schemas lack, by their fields."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

CHART = Path(__file__).parents[2] / "helm" / "calve"
KUBERNETES = "1.33"
OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor"}


def render(values: dict | None = None) -> list[dict]:
    manifests = helm.Chart.load(CHART).render(values or {}, name="ingest", namespace="data", is_install=True)
    return [doc for text in manifests.values() for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict]) -> dict[str, dict[str, dict]]:
    kinds: dict[str, dict[str, dict]] = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return kinds


def container(deployment: dict) -> dict:
    (main,) = deployment["spec"]["template"]["spec"]["containers"]
    return main


ALL_ON = {
    "serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True},
    "secrets": {"awsAccessKeyId": "AKIA", "awsSecretAccessKey": "s3cret", "metricsToken": "calve_op"},
}


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["defaults", "monitoring-and-credentials"])
def test_the_chart_lints_and_every_manifest_is_valid_kubernetes(values: dict) -> None:
    report = helm.lint(CHART, values, strict=True)
    assert not report["errors"] and all(m["severity"] < 2 for m in report["messages"]), report
    docs = render(values)
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"]["selector"]
            continue
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises, naming the field, when invalid
    kinds = by_kind(docs)
    assert set(kinds["Deployment"]) == {"ingest-api", "ingest-writer", "ingest-committer"}
    assert set(kinds["PodDisruptionBudget"]) == set(kinds["Deployment"])
    assert set(kinds["HorizontalPodAutoscaler"]) == {"ingest-api", "ingest-writer"}, "committers lead tables: never autoscaled"
    if values:
        assert set(kinds["ServiceMonitor"]) == {"ingest-api"} and set(kinds["PodMonitor"]) == {"ingest-roles"}
        dashboard = kinds["ConfigMap"]["ingest-dashboard"]
        assert dashboard["data"]["calve.json"] == (Path(__file__).parents[2] / "deploy" / "grafana" / "calve.json").read_text().rstrip("\n")


def test_each_role_is_the_image_command_with_probes_and_time_to_drain() -> None:
    kinds = by_kind(render())
    for role in ("api", "writer", "committer"):
        deployment = kinds["Deployment"][f"ingest-{role}"]
        main = container(deployment)
        assert main["command"] == ["calve", role]
        assert {"configMapRef": {"name": "ingest-calve"}} in main["envFrom"] and {"secretRef": {"name": "ingest-calve"}} in main["envFrom"]
        assert main["readinessProbe"] and main["livenessProbe"] and main["resources"]["requests"]
        assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30 + 15
    api = container(kinds["Deployment"]["ingest-api"])
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz" and api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert kinds["Deployment"]["ingest-api"]["spec"]["template"]["spec"]["initContainers"][0]["command"] == ["calve", "migrate"]
    config = kinds["ConfigMap"]["ingest-calve"]["data"]
    assert config["CALVE_SHUTDOWN_GRACE_S"] == "30" and config["CALVE_HOST"] == "0.0.0.0" and config["CALVE_METRICS_PORT"] == "9400"
    # Credentials only in the Secret, never in the ConfigMap.
    secret = kinds["Secret"]["ingest-calve"]["stringData"]
    assert {"CALVE_REDIS_URL", "CALVE_DATABASE_URL", "CALVE_CATALOG_URI"} <= set(secret) and not set(secret) & set(config)


def test_an_existing_secret_replaces_the_charts_own_and_settings_reach_the_config() -> None:
    kinds = by_kind(render({"secrets": {"existingSecret": "calve-credentials"}, "config": {"CALVE_LEASE_S": "20"},
                            "external": {"redisCluster": True}}))
    assert "Secret" not in kinds
    assert {"secretRef": {"name": "calve-credentials"}} in container(kinds["Deployment"]["ingest-writer"])["envFrom"]
    assert kinds["ConfigMap"]["ingest-calve"]["data"]["CALVE_LEASE_S"] == "20"
    assert kinds["ConfigMap"]["ingest-calve"]["data"]["CALVE_REDIS_CLUSTER"] == "true"


def test_a_missing_credential_fails_the_render_saying_which() -> None:
    with pytest.raises(helm.HelmError, match="secrets.redisUrl is required"):
        render({"secrets": {"redisUrl": ""}})
