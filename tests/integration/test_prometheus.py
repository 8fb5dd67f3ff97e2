"""The operator's view through a real Prometheus (Debian's `prometheus` package; `make test`
installs it): the alert rules load and evaluate, /metrics passes `promtool check metrics`, and
every query of the Grafana dashboard returns data from a Prometheus scraping a live Calve."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from sqlmodel import Session

from deploy.grafana import panels
from service.cli import processes
from service.core.db import get_engine
from service.tenancy.tenants import issue_token
from tests.conftest import Stack, wait_until

pytestmark = pytest.mark.spark

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: `make test` installs Debian's prometheus package (apt-get install prometheus)")
    return path


def test_the_alert_rules_pass_promtool_and_the_dashboard_file_is_current() -> None:
    checked = subprocess.run([binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (DEPLOY / "grafana" / "calve.json").read_text() == panels.render(), "run: python -m deploy.grafana.panels"


def test_prometheus_scrapes_calve_evaluates_the_rules_and_every_panel_has_data(stack: Stack, tmp_path: Path) -> None:
    prometheus = binary("prometheus")
    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, operator = issue_token(session, None, label="prometheus")
    token_file = tmp_path / "token"
    token_file.write_text(operator)
    port = processes.free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{
            "job_name": "calve",
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
            "static_configs": [{"targets": [f"127.0.0.1:{stack.port}"]}],
        }],
    }))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115
    server = subprocess.Popen([
        prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        processes.wait_for_port(port, 60, server, "prometheus", tmp_path / "prometheus.log")

        def target_up() -> bool:
            targets = httpx.get(f"{api}/targets", timeout=5).json()["data"]["activeTargets"]
            return bool(targets) and targets[0]["health"] == "up"

        wait_until(target_up, timeout_s=30, what="Prometheus scraping Calve with the operator token")

        # Traffic while Prometheus watches: commits, a DLQ event, a refusal, a 401, upkeep by hand.
        with stack.client() as http:
            assert http.post("/v1/pipelines", json={
                "name": "strict", "source": {"http": {"path": "/strict"}},
                "sinks": [{"table": "strict", "auto_create": True, "schema": {"columns": [
                    {"name": "id", "type": "string", "required": True}, {"name": "n", "type": "int"}]}}],
            }).status_code == 201
            for i in range(6):
                body = b"\n".join(orjson.dumps({"id": f"{i}-{n}", "msg": "x"}) for n in range(50))
                assert http.post("/logs?wait=true&timeout=90", content=body, headers={"Content-Type": "application/x-ndjson"}).status_code == 200
            assert http.post("/strict?wait=true&timeout=90", json=[{"id": "ok"}, {"other": 1}]).json()["dlq_events"] == 1
            # Written, not whole: a field no column takes (dropped), text in the int column (NULL).
            written = http.post("/strict?wait=true&timeout=90", json=[{"id": "d", "other": 1}, {"id": "n", "n": "slow"}]).json()
            assert (written["tables"]["strict"]["dropped_fields"], written["tables"]["strict"]["nulled_fields"]) == (["other"], ["n"])
            assert http.post("/logs", content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 400
            assert http.post("/v1/tables/logs/maintenance", json={"tasks": ["expire"], "wait_s": 20}).status_code == 200
        with stack.client("calve_not-a-token") as http:
            assert http.post("/logs", json={"id": "x"}).status_code == 401
        with stack.client() as http:
            for i in range(4):
                assert http.post("/logs?wait=true&timeout=90", json={"id": f"late-{i}"}).status_code == 200

        scraped = httpx.get(f"{stack.url}/metrics", headers={"Authorization": f"Bearer {operator}"}, timeout=10).text
        linted = subprocess.run([binary("promtool"), "check", "metrics"], input=scraped, capture_output=True, text=True, timeout=60)
        assert "error" not in (linted.stdout + linted.stderr).lower(), linted.stdout + linted.stderr
        assert 'calve_role_alive{role="writer"} 1.0' in scraped and 'calve_role_alive{role="committer"} 1.0' in scraped
        assert 'calve_writer_spark_reachable{writer=' in scraped
        assert 'calve_table_leader{committer=' in scraped and 'table="logs"' in scraped

        def query(expr: str) -> list[dict]:
            answer = httpx.get(f"{api}/query", params={"query": expr}, timeout=10).json()
            assert answer["status"] == "success", (expr, answer)
            return answer["data"]["result"]

        def every_panel_has_data() -> list[str]:
            empty = []
            for title, _unit, targets in panels.PANELS:
                for legend, expr in targets:
                    expr = expr.replace("$tenant", ".*").replace("$table", ".*")
                    values = [float(sample["value"][1]) for sample in query(expr)]
                    if not any(math.isfinite(v) for v in values):
                        empty.append(f"{title} / {legend}: {expr} -> {values}")
            return empty

        wait_until(lambda: not every_panel_has_data(), timeout_s=30, what="data in every dashboard panel")
        # The panel of events written not whole has data of its own, not only its `or vector(0)`.
        (not_whole,) = [targets for title, _unit, targets in panels.PANELS if "dropped" in title]
        wait_until(lambda: all(query(expr.removesuffix(" or vector(0)").replace("$tenant", ".*")) for _legend, expr in not_whole),
                   timeout_s=30, what="events with fields dropped and values NULLed in Prometheus")

        rules = httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
        evaluated = [rule for group in rules for rule in group["rules"]]
        assert len(evaluated) == len(yaml.safe_load(RULES.read_text())["groups"][0]["rules"])
        assert all(rule["health"] == "ok" for rule in evaluated), [(r["name"], r.get("lastError")) for r in evaluated]
        firing = [alert["labels"]["alertname"] for alert in httpx.get(f"{api}/alerts", timeout=10).json()["data"]["alerts"]]
        assert "CalveNoWriterAlive" not in firing and "CalveNoCommitterAlive" not in firing
    finally:
        server.terminate()
        server.wait(30)


def test_a_process_not_heard_from_is_not_counted_alive_and_is_forgotten_later(redis_client) -> None:  # noqa: ANN001
    """A killed process says nothing: its last heartbeat ages out of calve_role_alive."""
    import time

    from service.core import keys
    from service.core.metrics import render
    from service.protocol import heartbeats

    redis_client.flushall()
    heartbeats.Heartbeats(redis_client, "writer", "w1").beat(**{heartbeats.SPARK_REACHABLE: False})
    heartbeats.Heartbeats(redis_client, "committer", "c1").beat(leads=0)
    now = time.time()
    assert sorted(b.field for b in heartbeats.alive(redis_client, now)) == ["committer/c1", "writer/w1"]
    assert [b.field for b in heartbeats.alive(redis_client, now + heartbeats.STALE_S + 1)] == []
    assert redis_client.hlen(keys.HEARTBEATS) == 2, "stale, not yet forgotten"
    heartbeats.alive(redis_client, now + heartbeats.FORGET_S + 1)
    assert redis_client.hlen(keys.HEARTBEATS) == 0
    heartbeats.Heartbeats(redis_client, "writer", "w2").beat(**{heartbeats.SPARK_REACHABLE: False})
    text = render(redis_client).decode()
    assert 'calve_role_alive{role="writer"} 1.0' in text and 'calve_role_alive{role="committer"} 0.0' in text
    assert 'calve_writer_spark_reachable{writer="w2"} 0.0' in text
    stopped = heartbeats.Heartbeats(redis_client, "writer", "w2")
    stopped.stop()
    assert heartbeats.alive(redis_client) == []
