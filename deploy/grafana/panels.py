"""The Calve Grafana dashboard, written as data: `python -m deploy.grafana.panels` rewrites
deploy/grafana/calve.json from PANELS (a test checks that the file is up to date, and that every
panel's query returns data from a Prometheus scraping a live Calve).

Variables: $tenant and $table (multi-value, with All). Rare events (refusals, commit failures,
parked entries, fields dropped, values NULLed) add `or vector(0)` so their panels show 0 instead of "No data".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

T = 'tenant=~"$tenant"'
TT = 'tenant=~"$tenant", table=~"$table"'

# (title, unit, [(legend, PromQL), ...])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Events received /s", "ops", [("{{tenant}} {{pipeline}}", f"sum by (tenant, pipeline) (rate(calve_events_received_total{{{T}}}[1m]))")]),
    ("Events committed /s", "ops", [("{{tenant}}.{{table}}", f'sum by (tenant, table) (rate(calve_events_committed_total{{{TT}, table!="_calve_dlq"}}[1m]))')]),
    ("wait=true latency (accept to commit)", "s", [
        (f"p{q}", f"histogram_quantile(0.{q}, sum by (le) (rate(calve_accept_to_commit_seconds_bucket{{{T}}}[5m])))") for q in (50, 90, 99)
    ]),
    ("Backlog (events accepted, not committed)", "short", [("{{tenant}}", f"sum by (tenant) (calve_backlog_events{{{T}}})")]),
    ("Oldest waiting entry", "s", [("{{stream}} {{tenant}}/{{name}}", f"max by (tenant, stream, name) (calve_oldest_waiting_seconds{{{T}}})")]),
    ("Commit duration", "s", [
        ("p50", f"histogram_quantile(0.5, sum by (le) (rate(calve_commit_duration_seconds_bucket{{{TT}}}[5m])))"),
        ("p99", f"histogram_quantile(0.99, sum by (le) (rate(calve_commit_duration_seconds_bucket{{{TT}}}[5m])))"),
    ]),
    ("Data files per commit", "short", [
        ("mean", f"sum(rate(calve_files_per_commit_sum{{{TT}}}[5m])) / sum(rate(calve_files_per_commit_count{{{TT}}}[5m]))"),
    ]),
    ("DLQ events /s", "ops", [("{{tenant}}", f'sum by (tenant) (rate(calve_events_committed_total{{{T}, table="_calve_dlq"}}[1m])) or vector(0)')]),
    # Events written, but not whole: a field no column took, a value its column's type could not hold.
    ("Events written with fields dropped or values NULLed /s", "ops", [
        ("dropped {{tenant}} {{pipeline}}", f"sum by (tenant, pipeline) (rate(calve_events_with_dropped_fields_total{{{T}}}[5m])) or vector(0)"),
        ("NULLed {{tenant}} {{pipeline}}", f"sum by (tenant, pipeline) (rate(calve_events_with_nulled_values_total{{{T}}}[5m])) or vector(0)"),
    ]),
    ("Spark job duration", "s", [
        ("p50", f"histogram_quantile(0.5, sum by (le) (rate(calve_spark_job_duration_seconds_bucket{{{T}}}[5m])))"),
        ("p99", f"histogram_quantile(0.99, sum by (le) (rate(calve_spark_job_duration_seconds_bucket{{{T}}}[5m])))"),
    ]),
    ("Writer batches /s", "ops", [("{{tenant}} {{pipeline}}", f"sum by (tenant, pipeline) (rate(calve_spark_job_duration_seconds_count{{{T}}}[1m]))")]),
    ("Refused requests /s (429, 503, 4xx)", "ops", [
        ("{{reason}}", f"sum by (reason) (rate(calve_requests_rejected_total{{{T}}}[1m])) or vector(0)"),
        ("401 {{reason}}", "sum by (reason) (rate(calve_auth_failures_total[1m])) or vector(0)"),
    ]),
    ("Commit failures and parked entries", "short", [
        ("failures/s {{reason}}", f"sum by (reason) (rate(calve_commit_failures_total{{{TT}}}[5m])) or vector(0)"),
        ("parked (15m)", f"sum(increase(calve_dead_commit_entries_total{{{TT}}}[15m])) or vector(0)"),
    ]),
    ("Upkeep runs /min", "short", [("{{task}} {{outcome}}", "sum by (task, outcome) (rate(calve_upkeep_runs_total[5m])) * 60 or vector(0)")]),
    ("Roles alive", "short", [
        ("{{role}}", "calve_role_alive"),
        ("writers reaching Spark", "sum(calve_writer_spark_reachable)"),
    ]),
]


def dashboard() -> dict:
    panels = []
    for index, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": index + 1,
            "type": "timeseries",
            "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [
                {"refId": chr(ord("A") + n), "expr": expr, "legendFormat": legend,
                 "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                for n, (legend, expr) in enumerate(targets)
            ],
        })

    def variable(name: str, query: str) -> dict:
        return {
            "name": name, "label": name, "type": "query", "query": {"query": query, "refId": name},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2,
            "current": {"text": "All", "value": "$__all"},
        }

    return {
        "title": "Calve",
        "uid": "calve",
        "tags": ["calve", "iceberg"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            variable("tenant", "label_values(calve_events_received_total, tenant)"),
            variable("table", 'label_values(calve_events_committed_total{tenant=~"$tenant"}, table)'),
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    # The chart carries a copy: Helm reads only files inside the chart.
    for target in (Path(__file__).with_name("calve.json"), Path(__file__).parents[2] / "helm" / "calve" / "dashboards" / "calve.json"):
        target.write_text(render())
    print(f"wrote {target}", file=sys.stderr)
