"""Prometheus metrics of every role.

Under `calve up` the roles are separate processes sharing PROMETHEUS_MULTIPROC_DIR, and the api's
`/metrics` merges them. Stream backlog is read from Redis at scrape time, so it is right whichever
process serves it.
"""

from __future__ import annotations

import os
import re
import time

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import REGISTRY, Collector

from service.core import keys
from service.protocol import heartbeats
from service.protocol.stream_ids import text

EVENTS_RECEIVED = Counter("calve_events_received", "Events accepted into Redis", ["tenant", "pipeline"])
BYTES_RECEIVED = Counter("calve_bytes_received", "Request body bytes accepted (decompressed)", ["tenant", "pipeline"])
FILES_REGISTERED = Counter(
    "calve_registered_files", "Files written elsewhere, by what registering them did: accepted, duplicate, refused (with the reason)",
    ["tenant", "table", "outcome", "reason"],
)
REQUESTS_REJECTED = Counter("calve_requests_rejected", "Ingest requests refused", ["tenant", "reason"])
EVENTS_WRITTEN = Counter("calve_events_written", "Events written to data files by Spark", ["tenant", "table"])
EVENTS_WITH_DROPPED_FIELDS = Counter(
    "calve_events_with_dropped_fields", "Events written without some of their fields: no column of the table takes them", ["tenant", "pipeline"]
)
EVENTS_WITH_NULLED_VALUES = Counter(
    "calve_events_with_nulled_values", "Events written with NULL for a value that could not be converted to its optional column's type",
    ["tenant", "pipeline"],
)
PROCESS_RESTARTS = Counter(
    "calve_process_restarts", "Processes `calve up` started again after they exited (api, writer, committer, redis, spark)", ["process"],
)
COLUMNS_REFUSED = Counter(
    "calve_columns_refused", "New fields a table did not take as columns: it holds max_table_columns fields already "
    "(they go to the sink's extra_fields column, or are named as dropped in the answers)", ["tenant", "table"],
)
BATCHES_SUPERSEDED = Counter(
    "calve_batches_superseded", "Batches a writer wrote but another writer had reclaimed and settled (files discarded)", ["tenant", "pipeline"]
)
DIRECT_BATCHES = Counter(
    "calve_direct_batches", "Batches whose pipeline and table allow the short way, by outcome: written (by pyarrow in Spark's "
    "tasks), partial (it wrote some requests, the full Spark job those with a value it cannot take), refused (the full Spark job "
    "wrote the batch), failed (it could not run: off for 5 minutes)",
    ["tenant", "pipeline", "outcome"],
)
DIRECT_BODIES = Counter(
    "calve_direct_bodies", "Batches the short way ran, by where its Spark tasks got the requests' bodies: redis (they read them "
    "there themselves) or shipped (with the job, through Spark's JVM: CALVE_SPARK_READS_REDIS=false, or Redis unreachable from them)",
    ["tenant", "pipeline", "way"],
)
INGEST_WAYS = Counter(
    "calve_ingest_requests", "POSTs to a pipeline's path or a shipper's endpoint by the way the api took them: known (its token and "
    "pipeline in the api's caches: answered without FastAPI's routing, service/api/fast_ingest.py) or routed (looked up on the way)", ["way"],
)
SPARK_JOB_SECONDS = Histogram(
    "calve_spark_job_duration_seconds", "Duration of one writer Spark job", ["tenant", "pipeline"],
    buckets=(0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
)
EVENTS_COMMITTED = Counter("calve_events_committed", "Events committed to Iceberg", ["tenant", "table"])
COMMIT_SECONDS = Histogram(
    "calve_commit_duration_seconds", "Duration of one Iceberg commit", ["tenant", "table"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16),
)
FILES_PER_COMMIT = Histogram(
    "calve_files_per_commit", "Data files in one Iceberg commit", ["tenant", "table"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
UPKEEP_RUNS = Counter("calve_upkeep_runs", "Runs of a table upkeep task", ["task", "outcome"])
UPKEEP_SECONDS = Histogram(
    "calve_upkeep_duration_seconds", "Duration of one table upkeep task", ["task"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 64),
)
SNAPSHOTS_EXPIRED = Counter("calve_snapshots_expired", "Snapshots expired by upkeep", ["tenant", "table"])
UPKEEP_FILES_DELETED = Counter(
    "calve_upkeep_files_deleted", "Files (data, manifests, manifest lists) deleted because only expired snapshots referenced them", ["tenant", "table"]
)
COMPACTION_FILES = Counter(
    "calve_compaction_files", "Data files a committed compaction removed (small) and added (merged)", ["tenant", "table", "direction"]
)
COMPACTION_BYTES = Counter("calve_compaction_bytes", "Bytes of the small files committed compactions replaced", ["tenant", "table"])
COMPACTIONS_DROPPED = Counter(
    "calve_compactions_dropped", "Compactions not committed (their files changed meanwhile, or the rewrite failed)", ["tenant", "table"]
)
CHANGES_REAPPLIED = Counter(
    "calve_changes_reapplied", "Row changes applied again because the table moved while they were applied", ["tenant", "table"]
)
DEAD_COMMIT_ENTRIES = Counter(
    "calve_dead_commit_entries", "Commit-stream entries parked because a commit of them can never succeed", ["tenant", "table"]
)
COMMIT_FAILURES = Counter("calve_commit_failures", "Commit attempts that failed", ["tenant", "table", "reason"])
ACCEPT_TO_COMMIT_SECONDS = Histogram(
    "calve_accept_to_commit_seconds", "From a request's acceptance to the commit of its last table (what wait=true waits)",
    ["tenant"], buckets=(0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128),
)
AUTH_FAILURES = Counter("calve_auth_failures", "Requests refused with 401", ["reason"])  # no tenant: the token names none


def reason_label(reason: str) -> str:
    """Rejection reasons in one spelling: snake_case (BadRequestBody -> bad_request_body)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", reason).lower()


class BacklogCollector(Collector):
    """Entries waiting in Redis: input not yet written, files not yet committed."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def collect(self):  # noqa: ANN201 - prometheus_client's protocol
        waiting = GaugeMetricFamily(
            "calve_stream_backlog", "Entries waiting in a Redis stream", labels=["tenant", "stream", "name"]
        )
        oldest = GaugeMetricFamily(
            "calve_oldest_waiting_seconds",
            "Age of the oldest entry waiting in a Redis stream: input (accepted, not written) or commit (written, not committed)",
            labels=["tenant", "stream", "name"],
        )
        events = GaugeMetricFamily("calve_backlog_events", "Events accepted and not yet committed (what the backlog cap counts)", labels=["tenant"])
        roles = GaugeMetricFamily(
            "calve_role_alive", f"Processes of a role heard from within the last {heartbeats.STALE_S:.0f} s", labels=["role"]
        )
        spark = GaugeMetricFamily(
            "calve_writer_spark_reachable", "1 when a live writer's last Spark job reached Spark Connect, 0 while it waits out an outage",
            labels=["writer"],
        )
        leaders = GaugeMetricFamily("calve_table_leader", "1 for the committer that holds a table's lease", labels=["tenant", "table", "committer"])
        now_ms = time.time() * 1000
        try:
            tenants = set()
            for member in self._client.smembers(keys.INPUT_STREAMS):
                tenant, pipeline = keys.split_member(text(member))
                tenants.add(tenant)
                stream = keys.input_stream_key(tenant, pipeline)
                waiting.add_metric([tenant, "input", pipeline], _input_backlog(self._client, stream))
                oldest.add_metric([tenant, "input", pipeline], _oldest_age_s(self._client, stream, now_ms))
            for member in self._client.smembers(keys.TABLES):
                tenant, table = keys.split_member(text(member))
                stream = keys.commit_stream_key(tenant, table)
                waiting.add_metric([tenant, "commit", table], self._client.xlen(stream))
                oldest.add_metric([tenant, "commit", table], _oldest_age_s(self._client, stream, now_ms))
                leader = self._client.get(keys.lease_key(tenant, table))
                if leader is not None:
                    leaders.add_metric([tenant, table, text(leader)], 1.0)
            counts = {"writer": 0, "committer": 0}  # an api is alive when it answers the scrape (Prometheus's `up`)
            for beat in heartbeats.alive(self._client):
                counts[beat.role] = counts.get(beat.role, 0) + 1
                if beat.role == "writer":
                    spark.add_metric([beat.name], 1.0 if beat.facts.get(heartbeats.SPARK_REACHABLE, True) else 0.0)
            for role, count in sorted(counts.items()):
                roles.add_metric([role], float(count))
            for tenant in sorted(tenants):
                events.add_metric([tenant], float(self._client.get(keys.backlog_key(tenant)) or 0))
        except redis.RedisError:
            return
        yield waiting
        yield oldest
        yield events
        yield roles
        yield spark
        yield leaders


def _oldest_age_s(client: redis.Redis, stream: str, now_ms: float) -> float:
    """Seconds since the first entry still in the stream was added (0 when it is empty): its id
    is the time Redis added it."""
    first = client.xrange(stream, count=1)
    return max(0.0, (now_ms - int(text(first[0][0]).split("-")[0])) / 1000) if first else 0.0


def _input_backlog(client: redis.Redis, stream: str) -> float:
    """Entries not yet delivered to a writer plus entries delivered but not yet acknowledged."""
    for group in client.xinfo_groups(stream):
        if text(group["name"]) == keys.WRITER_GROUP:
            lag = group.get("lag")
            return float((lag or 0) + group.get("pending", 0))
    return float(client.xlen(stream))


def _registry() -> CollectorRegistry:
    """Every role's metrics under `calve up` (one multiprocess directory), else this process's."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return registry


# What a tenant's overview reads: sample name -> (key in the answer, the label that splits it).
TENANT_TOTALS = {
    "calve_events_received_total": ("received", "pipeline"),
    "calve_events_committed_total": ("committed", "table"),
    "calve_commit_failures_total": ("commit_failures", "table"),
    "calve_requests_rejected_total": ("refused", "reason"),
    "calve_accept_to_commit_seconds_sum": ("wait_seconds_sum", None),
    "calve_accept_to_commit_seconds_count": ("wait_count", None),
    "calve_accept_to_commit_seconds_bucket": ("wait_buckets", "le"),  # cumulative, per upper bound
}


def tenant_totals(tenant: str) -> dict:
    """One tenant's counters since the processes started, for the console's live overview (the
    browser turns two of them into rates): events received per pipeline, committed per table, commit
    failures per table, refusals per reason, and the wait=true latency sum, count and histogram
    buckets (cumulative counts by upper bound, as Prometheus keeps them: quantiles between samples)."""
    return every_tenant_totals().get(tenant) or _no_totals()


def every_tenant_totals() -> dict[str, dict]:
    """tenant_totals of every tenant that has any, read in one pass over the metrics."""
    every: dict[str, dict] = {}
    for family in _registry().collect():
        for sample in family.samples:
            wanted = TENANT_TOTALS.get(sample.name)
            tenant = sample.labels.get("tenant")
            if wanted is None or tenant is None:
                continue
            totals = every.setdefault(tenant, _no_totals())
            key, label = wanted
            if label is None:
                totals[key] += sample.value
            else:
                split = totals[key]
                split[sample.labels[label]] = split.get(sample.labels[label], 0.0) + sample.value
    return every


def _no_totals() -> dict:
    return {key: ({} if label else 0.0) for key, label in TENANT_TOTALS.values()}


def render(client: redis.Redis) -> bytes:
    registry = _registry()
    backlog = BacklogCollector(client)
    registry.register(backlog)
    try:
        return generate_latest(registry)
    finally:
        registry.unregister(backlog)
