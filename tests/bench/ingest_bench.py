"""`make bench`: committed events/s and wait=true latency of the embedded stack, against a baseline.

Starts `calve up` on a fresh data directory, lets concurrent producers POST 1,000-event NDJSON
requests with wait=true for a fixed time, then stops it and measures, on the same events, what
one process does with no HTTP, Redis or Spark: parse with pyarrow, write Parquet, append with
pyiceberg. It also reports where the cores went in the measured window: CPU seconds per role (api,
writers, committer, Spark JVM, redis-server, the load generator itself) and per 100,000 committed
events, and the mean Spark job and commit times from Calve's metrics (tests/bench/profile.py).
The last line of output is one JSON object.

Shapes (BENCH_SHAPES, comma-separated, in this order on one stack; default all of them):
`plain`, every event with exactly the table's fields (the built-in `logs`); `extra`, the same with
2% of events carrying one field the table lacks (kept in its `_extra` map); `dirty`, plain
events but one request in 50 holds an event with text for a number; `strings`, plain events with
every number as text (`"status": "200"`, as grok's captures have them); `traced`, plain events
each with a trace and a span id (two fields the table lacks: into `_extra`); `pods`, plain events
each with the Kubernetes pod that logged it (an object the table lacks, with a map of labels in
it: into `_extra` as JSON text, as a Kubernetes log shipper sends them); `pandas`, plain
events with the integer status written as a double (`200.0`); `loose`, plain events with a number
for the host in one of ten and for the message in one of a hundred (text columns holding numbers
and text alike, as a loosely typed logger sends them); `mixed`, plain events with the status as
text in one of fifty and the message an object in another of fifty; `errors`, plain events and
one in twenty an error whose message carries a stack trace (~1 KB, newlines, tabs and quotes
escaped); `scripts`, plain events with messages in many scripts (accents, CJK, Cyrillic, Arabic,
emoji: UTF-8 as sent); `wide`, plain events each with thirty flat fields the table lacks (named
as Elastic's common schema flattens them, half text, half numbers: into `_extra`); `declared`, the same
fields with `ts` as ISO 8601 text into a declared schema (`ts timestamptz`) partitioned by day(ts);
`processors`, that with two processors (where, set), which the short way evaluates itself;
`nanos`, the declared shape with `ts` in nanoseconds (Go's RFC 3339, trailing zeros trimmed);
`measured`, plain events each with a duration in seconds (a fraction, now and then a whole number)
and a byte count (two fields the table lacks: into `_extra`);
`nested`, the declared shape with the request's facts in an object (`http`, a struct column) and
a list of strings (`tags`); `orders`, the declared shape with a customer and an amount of money
(`decimal(12,2)`), partitioned by day(ts) and bucket[8](user); `ledger`, the orders with a running
balance of 22 digits as a JSON number (`decimal(38,6)`), partitioned by day(ts); `labelled`, the declared shape with a
map of labels (two to four keys in any order) and a `where` processor; `kubernetes`, the declared
shape with `pods`'s object declared as a struct column (its labels a map of strings inside it);
`routed`, the declared shape into two tables, every event into one and those with a status of
500 or more (one in six) into the other as well, by a route; `renamed`, the declared shape
with a shipper's names (`message`, `severity`) that the pipeline renames to the table's; `functions`,
the declared shape through a `set` of functions (lower, trim, coalesce, a CASE into a column of its
own), as a pipeline normalising a shipper's fields has them; `arithmetic`, the declared shape through
a `set` of arithmetic (`latency_ms / 1000` into a column of its own); `redacted`, the declared shape
with a `drop` of one of the table's own columns (`host`, no longer to be kept); `evolving`, `extra`'s
events into a table created from them whose sink evolves its schema (the five fields some events
add become columns); `trimmed`, the declared shape with a logger's name and a trace (three fields
the declared table, without extra_fields, lacks: dropped and named in the receipt); `attributes`,
plain events with two dotted attributes (`http.method`, as OpenTelemetry names them) into a table
whose sink evolves its schema (such names never become columns: dropped and named). The shippers'
protocols, the same facts into their built-in pipelines: `otlp` (OTLP/JSON log records, a resource
per service, three attributes each), `otlp-proto` (the same in protobuf), `loki` (a Loki push in
JSON, a stream per service and level) and `bulk` (Elasticsearch `_bulk` into `logs`). Loki's push
and `_bulk` answer once buffered: their events/s is what the stack's metrics say it committed in
the window, and their latency the metrics' mean from acceptance to commit. Each shape is reported
with its ratio to `plain` of the same run; the first is warmed up BENCH_WARMUP_S, the others
BENCH_SHAPE_WARMUP_S (20), each after the last one's backlog is committed, in 10 s steps and at
least 15 s past the first step that committed anything. Each shape after the first is sent by a
tenant of its own (`bench_<shape>`), so that its tables start empty as the first shape's did (the
built-in `logs` made by one request of plain events first, as plain made it), and each shape's
tables are compacted by hand once its window closes: in one stack, a shape otherwise paid for
compacting what the shapes before it left (in the built-in `logs` most of all, which they
shared). BENCH_TABLES=shared: one tenant for all and no compaction between shapes.
BENCH_QUIET_TENANTS=N: N more tenants, each with a `logs` table made by one request, that send
nothing while the shapes are measured (a busy tenant among quiet ones: what each table costs its
committer and Redis while idle).

Then the open loop: plain events at fixed arrival rates (BENCH_OPEN_RATES, events/s, default
20,000 to 300,000 in steps of 20,000; BENCH_OPEN_STEP_S each, default 30), each request sent on
its schedule whatever the answers before it. The capacity is the highest rate held: p99 at most
2 s and a backlog that grows by at most half a second of arrivals over the step's second half. BENCH_OPEN_RATES= skips it.

Knobs (environment): BENCH_SECONDS (default 60), BENCH_PRODUCERS (150), BENCH_WARMUP_S (60);
BENCH_EVENTS_PER_REQUEST (1000: a producer of small requests is 20, with more producers, say 600;
the baseline is still of 1,000-event bodies);
BENCH_WAREHOUSE=seaweedfs starts SeaweedFS and runs the stack on its REST catalog with the
warehouse in its S3 (the baseline stays on local files). Any CALVE_* setting reaches the stack
(CALVE_SPARK_WORKERS=2: a 2-worker Spark cluster); its tenants' rate limits are lifted unless
CALVE_MAX_EVENTS_PER_S or CALVE_MAX_BYTES_PER_S is set (UNLIMITED).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import httpx
import orjson
import pyarrow.json as pajson
from pyiceberg.catalog.sql import SqlCatalog

from service.cli.processes import free_port
from tests.bench.profile import Sample, breakdown, committed_between, sample, table

BASELINE_EVENTS = 1000
EVENTS_PER_REQUEST = int(os.environ.get("BENCH_EVENTS_PER_REQUEST", str(BASELINE_EVENTS)))
OPEN_LOOP_P99_S = 2.0
TOKEN = "calve_bench-token-0123456789abcdefghijklmnopqrstuv"
LEVELS = ["debug", "info", "info", "info", "warn", "error"]
SERVICES = ["checkout", "search", "auth", "payments", "catalog"]


def make_event(i: int) -> dict:
    return {
        "ts": 1_763_800_000_000 + i,
        "level": random.choice(LEVELS),
        "service": random.choice(SERVICES),
        "host": f"web-{random.randint(1, 40):02d}",
        "status": random.choice([200, 200, 200, 201, 404, 500]),
        "latency_ms": round(random.random() * 250, 3),
        "msg": f"request {i:010d} handled " + "".join(random.choices("abcdefghij", k=20)),
    }


EXTRA_NAMES = ["user_id", "trace_id", "region", "retry", "cache_hit"]


def with_extra_field(event: dict, i: int) -> dict:
    """The event and, for 2% of them, one field the built-in `logs` table lacks."""
    if i % 50 == 7:
        name = EXTRA_NAMES[i % len(EXTRA_NAMES)]
        event[name] = {"user_id": f"u-{i % 9973}", "trace_id": f"{i:032x}", "region": "eu-west-1", "retry": i % 3, "cache_hit": i % 2 == 0}[name]
    return event


def with_bad_value(event: dict, i: int) -> dict:
    """The event; in one request of every 50, one event whose latency_ms is text where the table
    has a number (the full Spark job decides what it becomes)."""
    if i % (50 * EVENTS_PER_REQUEST) == 123:
        event["latency_ms"] = "slow"
    return event


def with_number_texts(event: dict) -> dict:
    """The event with its numbers as text ("200", "12.5"), as grok's captures and loggers that
    write every value as a string send them."""
    event["status"], event["latency_ms"] = str(event["status"]), str(event["latency_ms"])
    return event


def loosely_typed(event: dict, i: int) -> dict:
    """The event as a loosely typed logger sends it: in one event of ten the host as a number (a
    numeric host id, where the table has text), in one of a hundred the message a number with a
    fraction (a measurement logged alone), so one text column holds numbers and text in every
    request, as the Spark job spells them (1000.0 for 1e3)."""
    if i % 10 == 3:
        event["host"] = random.randint(1, 40)
    if i % 100 == 7:
        event["msg"] = round(random.random() * 1000, 2)
    return event


def mixed_up(event: dict, i: int) -> dict:
    """The event as a logger mixed up about two fields sends it: in one event of fifty the status
    as text ("200"), in another of fifty the message an object (an error logged as it is)."""
    if i % 50 == 11:
        event["status"] = str(event["status"])
    if i % 50 == 37:
        event["msg"] = {"error": "timeout", "attempt": i % 3 + 1, "after_ms": round(random.random() * 500, 1)}
    return event


def with_whole_doubles(event: dict) -> dict:
    """The event with its integer status as a double (200.0), as pandas writes an integer column
    that holds a NaN somewhere."""
    event["status"] = float(event["status"])
    return event


def with_trace(event: dict) -> dict:
    """The event with the trace it was logged in (a trace and a span id: fields the built-in
    `logs` table lacks, kept in its `_extra` map), as a traced service's logger adds them."""
    event["trace_id"], event["span_id"] = f"{random.getrandbits(128):032x}", f"{random.getrandbits(64):016x}"
    return event


def with_pod(event: dict) -> dict:
    """The event with the pod that logged it, as Kubernetes log shippers (Fluent Bit, Vector)
    add it: an object the built-in `logs` table lacks (kept in its `_extra` map as JSON text)."""
    service = event["service"]
    event["kubernetes"] = {"namespace": "prod", "pod": f"{service}-{random.randint(1, 12):02d}-7d9f", "container": service,
                           "labels": {"app": service, "tier": "web"}}
    return event


def with_iso_time(event: dict) -> dict:
    """The event with its ts as ISO 8601 text (UTC, milliseconds), as most shippers send it."""
    event["ts"] = datetime.fromtimestamp(event["ts"] / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return event


def nested(event: dict) -> dict:
    """The event with its request's facts in an object and a list of tags, as many loggers nest them."""
    event["http"] = {"status": event.pop("status"), "latency_ms": event.pop("latency_ms"), "method": random.choice(["GET", "POST"])}
    event["tags"] = random.sample(["web", "eu", "canary", "v2", "batch"], k=random.randint(0, 3))
    return event


def ordered(event: dict) -> dict:
    """The event as a shop's order: a customer and an amount of money (a JSON number, cents)."""
    event["user"] = f"customer-{random.randrange(5000)}"
    event["amount"] = round(random.randrange(1, 5_000_000) / 100, 2)
    return event


def ledgered(event: dict) -> dict:
    """The order with a running balance of 22 digits (a JSON number, spliced in by _encode: orjson
    writes no Decimal), into a decimal(38,6) column: money as a ledger keeps it."""
    event = ordered(event)
    event["balance"] = f"{random.randrange(10**16)}.{random.randrange(10**6):06d}"
    return event


def labelled(event: dict) -> dict:
    """The event with a map of labels (two to four of a few keys, in any order), as a shipper's pipeline has them."""
    keys = random.sample(["region", "pod", "team", "version"], k=random.randint(2, 4))
    event["labels"] = {key: f"{key}-{random.randrange(20)}" for key in keys}
    return event


def renamed(event: dict) -> dict:
    """The event with a shipper's names for two of the table's columns (renamed by the pipeline)."""
    event["message"], event["severity"] = event.pop("msg"), event.pop("level")
    return event


def measured(event: dict, i: int) -> dict:
    """The event with what a service measured, two fields the built-in `logs` table lacks (into
    its `_extra` map) in every event: a duration in seconds (a fraction, now and then a whole
    number, written 2.0 or 2) and a byte count."""
    event["duration_s"] = round(event["latency_ms"] / 1000, 6) if i % 20 else [2.0, 2][i % 40 // 20]
    event["bytes"] = random.randrange(100_000)
    return event


def with_nano_time(event: dict) -> dict:
    """The event with its ts as ISO 8601 in nanoseconds, as Go's RFC 3339 (trailing zeros trimmed)
    and Docker's logs write it."""
    moment = datetime.fromtimestamp(event["ts"] / 1000, timezone.utc)
    fraction = f"{moment.microsecond:06d}{random.randrange(1000):03d}".rstrip("0")
    event["ts"] = moment.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"
    return event


FRAMES = ["app/handlers/checkout.py", "app/services/payments.py", "lib/http/client.py", "lib/db/pool.py", "app/models/order.py"]
SCRIPTS = ["Zahlung für Bestellung bestätigt", "paiement reçu, commande expédiée", "注文の支払いを確認しました",
           "заказ оплачен и отправлен", "결제가 완료되었습니다", "تم تأكيد الدفع", "pagamento confirmado ✅", "Ödeme alındı 🚚"]


def with_stack_trace(event: dict, i: int) -> dict:
    """The event; one in twenty an error whose message carries its stack trace: a dozen lines,
    ~1 KB, with the newlines, tabs and quotes escaped in the JSON text, as loggers of exceptions
    send them."""
    if i % 20 == 9:
        frames = [f'  File "{random.choice(FRAMES)}", line {random.randrange(1, 900)}, in handle\n\t'
                  f"result = self.call(request, timeout={random.randrange(1, 30)})" for _ in range(6)]
        event["level"], event["status"] = "error", 500
        event["msg"] = "Traceback (most recent call last):\n" + "\n".join(frames) + '\nTimeoutError: "upstream" did not answer'
        event["msg"] = event["msg"].encode().decode("unicode_escape")
    return event


def in_many_scripts(event: dict, i: int) -> dict:
    """The event with its message in the language of the user it served (accents, CJK, Cyrillic,
    Arabic, emoji: UTF-8 as sent, not escaped), as a service with users everywhere logs it."""
    event["msg"] = f"{SCRIPTS[i % len(SCRIPTS)]} #{i:010d}"
    return event


WIDE_FIELDS = [f"{group}.{name}" for group in ("http", "client", "cloud", "user_agent", "process") for name in ("id", "name", "kind", "region", "version", "bytes")]


def widened(event: dict, i: int) -> dict:
    """The event with thirty flat fields the built-in `logs` table lacks (into its `_extra` map),
    named as Elastic's common schema flattens them (`http.bytes`, `cloud.region`), half text and
    half numbers: what a shipper that adds its host's and request's metadata sends."""
    for n, name in enumerate(WIDE_FIELDS):
        event[name] = (i * 31 + n) % 9973 if n % 2 else f"{name.split('.')[0]}-{(i + n) % 17}"
    return event


def with_logger(event: dict) -> dict:
    """The event with the trace it was logged in and its logger's name: fields a declared
    table without extra_fields lacks, dropped and named in the receipt (dropped_fields)."""
    event["logger"] = f"app.{event['service']}"
    return with_trace(event)


def with_attributes(event: dict, i: int) -> dict:
    """The event with two attributes named as OpenTelemetry's conventions spell them, dotted:
    an evolving table never takes such a name as a column (dropped and named in the receipt)."""
    event["http.method"], event["user_agent.original"] = ("GET", "POST")[i % 2], f"curl/8.{i % 7}"
    return event


def with_days(i: int) -> dict:
    """An event with an ISO 8601 ts; 200 requests' events span ~4 days: a few partition values per batch."""
    return with_iso_time(make_event(i * 20))


SHAPES = {"plain": make_event, "extra": lambda i: with_extra_field(make_event(i), i), "dirty": lambda i: with_bad_value(make_event(i), i),
          "strings": lambda i: with_number_texts(make_event(i)), "traced": lambda i: with_trace(make_event(i)),
          "pods": lambda i: with_pod(make_event(i)),
          "pandas": lambda i: with_whole_doubles(make_event(i)), "loose": lambda i: loosely_typed(make_event(i), i),
          "mixed": lambda i: mixed_up(make_event(i), i), "errors": lambda i: with_stack_trace(make_event(i), i),
          "scripts": lambda i: in_many_scripts(make_event(i), i), "wide": lambda i: widened(make_event(i), i),
          "declared": with_days, "processors": with_days, "nested": lambda i: nested(with_days(i)), "orders": lambda i: ordered(with_days(i)),
          "labelled": lambda i: labelled(with_days(i)), "kubernetes": lambda i: with_pod(with_days(i)), "routed": with_days, "ledger": lambda i: ledgered(with_days(i)), "renamed": lambda i: renamed(with_days(i)),
          "functions": with_days, "arithmetic": with_days, "redacted": with_days,
          "evolving": lambda i: with_extra_field(make_event(i), i), "measured": lambda i: measured(make_event(i), i),
          "nanos": lambda i: with_nano_time(make_event(i * 20)),
          "trimmed": lambda i: with_logger(with_days(i)), "attributes": lambda i: with_attributes(make_event(i), i),
          # The shippers' protocols: make_event's facts as OTLP log records (JSON and protobuf),
          # Loki push lines (JSON) and Elasticsearch _bulk documents into the built-in pipelines.
          "otlp": make_event, "otlp-proto": make_event, "loki": make_event, "bulk": make_event}
# The pipeline each shape posts to (none: the built-in `logs`): a declared schema with the time as
# timestamptz and the table partitioned by day(ts); the same with two processors.
DECLARED_COLUMNS = [
    {"name": "ts", "type": "timestamptz", "required": True}, {"name": "level", "type": "string"}, {"name": "service", "type": "string"},
    {"name": "host", "type": "string"}, {"name": "status", "type": "int"}, {"name": "latency_ms", "type": "double"},
    {"name": "msg", "type": "string"},
]
PIPELINES = {
    "declared": {"name": "declared", "source": {"http": {"path": "/declared"}}, "sinks": [{
        "table": "declared", "auto_create": True, "schema": {"columns": DECLARED_COLUMNS, "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "nanos": {"name": "nanos", "source": {"http": {"path": "/nanos"}}, "sinks": [{
        "table": "nanos", "auto_create": True, "schema": {"columns": DECLARED_COLUMNS, "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "nested": {"name": "nested", "source": {"http": {"path": "/nested"}}, "sinks": [{
        "table": "nested", "auto_create": True, "schema": {"columns": [
            *(c for c in DECLARED_COLUMNS if c["name"] not in ("status", "latency_ms")),
            {"name": "http", "type": "struct<status: int, latency_ms: double, method: string>"}, {"name": "tags", "type": "list<string>"},
        ], "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "labelled": {"name": "labelled", "source": {"http": {"path": "/labelled"}}, "processors": [{"where": "level != 'debug'"}], "sinks": [{
        "table": "labelled", "auto_create": True, "schema": {"columns": [*DECLARED_COLUMNS, {"name": "labels", "type": "map<string, string>"}],
                                                             "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "routed": {"name": "routed", "source": {"http": {"path": "/routed"}}, "routes": {"failed": "status >= 500"}, "sinks": [
        {"table": "routed", "auto_create": True, "schema": {"columns": DECLARED_COLUMNS, "partition_spec": [{"column": "ts", "transform": "day"}]}},
        {"table": "routed_failures", "routes": ["failed"], "auto_create": True,
         "schema": {"columns": DECLARED_COLUMNS, "partition_spec": [{"column": "ts", "transform": "day"}]}},
    ]},
    "kubernetes": {"name": "kubernetes", "source": {"http": {"path": "/kubernetes"}}, "sinks": [{
        "table": "kubernetes", "auto_create": True, "schema": {"columns": [
            *DECLARED_COLUMNS,
            {"name": "kubernetes", "type": "struct<namespace: string, pod: string, container: string, labels: map<string, string>>"},
        ], "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "orders": {"name": "orders", "source": {"http": {"path": "/orders"}}, "sinks": [{
        "table": "orders", "auto_create": True, "schema": {"columns": [
            *DECLARED_COLUMNS, {"name": "user", "type": "string"}, {"name": "amount", "type": "decimal(12,2)"},
        ], "partition_spec": [{"column": "ts", "transform": "day"}, {"column": "user", "transform": "bucket[8]"}]},
    }]},
    "ledger": {"name": "ledger", "source": {"http": {"path": "/ledger"}}, "sinks": [{
        "table": "ledger", "auto_create": True, "schema": {"columns": [
            *DECLARED_COLUMNS, {"name": "user", "type": "string"}, {"name": "amount", "type": "decimal(12,2)"},
            {"name": "balance", "type": "decimal(38,6)"},
        ], "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "renamed": {"name": "renamed", "source": {"http": {"path": "/renamed"}}, "processors": [{"rename": {"message": "msg", "severity": "level"}}],
                "sinks": [{"table": "renamed", "auto_create": True, "schema": {"columns": DECLARED_COLUMNS,
                                                                              "partition_spec": [{"column": "ts", "transform": "day"}]}}]},
    "functions": {"name": "functions", "source": {"http": {"path": "/functions"}}, "processors": [
        {"set": {"level": "lower(trim(level))", "service": "coalesce(service, 'unknown')",
                 "class": "CASE WHEN status >= 500 THEN 'server error' WHEN status >= 400 THEN 'client error' ELSE 'ok' END"}},
    ], "sinks": [{"table": "functions", "auto_create": True, "schema": {"columns": [*DECLARED_COLUMNS, {"name": "class", "type": "string"}],
                                                                       "partition_spec": [{"column": "ts", "transform": "day"}]}}]},
    "arithmetic": {"name": "arithmetic", "source": {"http": {"path": "/arithmetic"}}, "processors": [
        {"set": {"latency_s": "latency_ms / 1000"}},
    ], "sinks": [{"table": "arithmetic", "auto_create": True, "schema": {"columns": [*DECLARED_COLUMNS, {"name": "latency_s", "type": "double"}],
                                                                        "partition_spec": [{"column": "ts", "transform": "day"}]}}]},
    "evolving": {"name": "evolving", "source": {"http": {"path": "/evolving"}},
                 "sinks": [{"table": "evolving", "auto_create": True, "schema_evolution": True}]},
    "trimmed": {"name": "trimmed", "source": {"http": {"path": "/trimmed"}}, "sinks": [{
        "table": "trimmed", "auto_create": True, "schema": {"columns": DECLARED_COLUMNS, "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "attributes": {"name": "attributes", "source": {"http": {"path": "/attributes"}},
                   "sinks": [{"table": "attributes", "auto_create": True, "schema_evolution": True}]},
    "redacted": {"name": "redacted", "source": {"http": {"path": "/redacted"}}, "processors": [{"drop": ["host"]}],
                 "sinks": [{"table": "redacted", "auto_create": True, "schema": {"columns": DECLARED_COLUMNS,
                                                                                "partition_spec": [{"column": "ts", "transform": "day"}]}}]},
    "processors": {"name": "processed", "source": {"http": {"path": "/processed"}},
                   "processors": [{"where": "level != 'debug'"}, {"set": {"slow": "latency_ms > 200"}}],
                   "sinks": [{
        "table": "processed", "auto_create": True, "schema": {"columns": [*DECLARED_COLUMNS, {"name": "slow", "type": "boolean"}],
                                         "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
}


SEVERITY = {"debug": 5, "info": 9, "warn": 13, "error": 17}


def _otlp_export(events: list[dict]) -> dict:
    """The events as an OTLP/JSON ExportLogsServiceRequest: a resource per service, the rest of
    each event as its record's time, severity, body and attributes."""
    by_service: dict[str, list[dict]] = {}
    for event in events:
        by_service.setdefault(event["service"], []).append({
            "timeUnixNano": str(event["ts"] * 1_000_000), "severityNumber": SEVERITY[event["level"]], "severityText": event["level"],
            "body": {"stringValue": event["msg"]},
            "attributes": [{"key": "host", "value": {"stringValue": event["host"]}}, {"key": "http.status", "value": {"intValue": str(event["status"])}},
                           {"key": "latency_ms", "value": {"doubleValue": event["latency_ms"]}}],
        })
    return {"resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeLogs": [{"scope": {"name": "bench", "version": "1"}, "logRecords": records}],
    } for service, records in by_service.items()]}


def _encode(shape: str, events: list[dict]) -> bytes:
    """One request's body of `events` in the shape's protocol."""
    if shape == "otlp":
        return orjson.dumps(_otlp_export(events))
    if shape == "otlp-proto":
        from google.protobuf import json_format
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

        return json_format.ParseDict(_otlp_export(events), ExportLogsServiceRequest()).SerializeToString()
    if shape == "loki":  # a stream per service and level, the rest of the event in its line
        streams: dict[tuple[str, str], list[list[str]]] = {}
        for event in events:
            line = f"host={event['host']} status={event['status']} latency_ms={event['latency_ms']} {event['msg']}"
            streams.setdefault((event["service"], event["level"]), []).append([str(event["ts"] * 1_000_000), line])
        return orjson.dumps({"streams": [{"stream": {"service": service, "level": level}, "values": values}
                                         for (service, level), values in streams.items()]})
    if shape == "bulk":
        return b"\n".join(b'{"index":{"_index":"logs"}}\n' + orjson.dumps(event) for event in events) + b"\n"
    if shape == "ledger":
        return b"\n".join(orjson.dumps({k: v for k, v in e.items() if k != "balance"})[:-1] + b',"balance":' + e["balance"].encode() + b"}"
                          for e in events)
    return b"\n".join(orjson.dumps(event) for event in events)


def make_bodies(count: int, shape: str = "plain", per_request: int = EVENTS_PER_REQUEST) -> list[bytes]:
    return [_encode(shape, [SHAPES[shape](b * per_request + i) for i in range(per_request)]) for b in range(count)]


# The protocols' endpoints: (path, Content-Type, whether it can answer once committed). Loki's push
# and _bulk answer once buffered: their events/s is what Calve's metrics say it committed, and
# their latency from acceptance to commit is the metrics' mean (calve_accept_to_commit_seconds).
PROTOCOLS = {
    "otlp": ("/otlp/v1/logs", "application/json", True),
    "otlp-proto": ("/otlp/v1/logs", "application/x-protobuf", True),
    "loki": ("/loki/api/v1/push", "application/json", False),
    "bulk": ("/_bulk", "application/x-ndjson", False),
}


def shape_path(port: int, shape: str, token: str = TOKEN) -> str:
    """The path the shape's events go to, its pipeline created first (by `token`'s tenant) where it has one."""
    if shape in PROTOCOLS:
        return PROTOCOLS[shape][0]
    pipeline = PIPELINES.get(shape)
    if pipeline is None:
        return "/logs"
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/pipelines", json=pipeline, headers={"Authorization": f"Bearer {token}"}, timeout=60)
    if answer.status_code != 201:
        raise SystemExit(f"creating the {shape} pipeline: {answer.status_code} {answer.text}")
    return pipeline["source"]["http"]["path"]


def tenant_of_its_own(port: int, operator: str, shape: str) -> str:
    """A token of a new tenant for `shape` (service defaults for its limits): its tables start
    empty, as the first shape's did, so that no shape pays for compacting another's rows. Where
    the shape goes into the built-in `logs`, one request of plain events makes that table first,
    as plain's did: the table takes its columns from the first events it gets, and a shape's own
    (a trace id, text for a number) would otherwise become its columns and types."""
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/tenants", json={"name": "bench_" + shape.replace("-", "_")},
                        headers={"Authorization": f"Bearer {operator}"}, timeout=60)
    if answer.status_code != 201:
        raise SystemExit(f"creating a tenant for the {shape} shape: {answer.status_code} {answer.text}")
    token = answer.json()["admin_token"]
    if shape not in PIPELINES and (shape not in PROTOCOLS or shape == "bulk"):
        made = httpx.post(f"http://127.0.0.1:{port}/logs?wait=true&timeout=60", content=make_bodies(1)[0], timeout=120,
                          headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"})
        if made.status_code != 200:
            raise SystemExit(f"making the {shape} tenant's logs table: {made.status_code} {made.text}")
    return token


def compact_tables(port: int, token: str) -> None:
    """Compact each of the token's tenant's tables by hand, waiting for each: upkeep's work on a
    shape's rows is then over before the next shape's window opens, not charged to it."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=900) as http:
        for name in http.get("/v1/tables").json()["tables"]:
            answer = compact_by_hand(http, name)
            if answer.status_code != 200:
                say(f"  (compacting {name} by hand answered {answer.status_code}: {answer.text[:200]}; the next shape may pay for it)")


def compact_by_hand(http: httpx.Client, name: str) -> httpx.Response:
    """The answer to compacting table `name` by hand, waited for: a scheduled compaction still
    running answers busy, and it is asked again once that one is over (for up to ~2 minutes)."""
    for _attempt in range(60):
        answer = http.post(f"/v1/tables/{name}/maintenance", json={"tasks": ["compact"], "wait_s": 300})
        if answer.status_code != 200 or answer.json()["tasks"]["compact"].get("outcome") != "busy":
            return answer
        time.sleep(2)
    return answer


def drain(take_sample: Callable[[], Sample], timeout_s: float = 300) -> None:
    """Wait until nothing is committed for 3 s: what was accepted before is committed (or in the DLQ)."""
    deadline = time.monotonic() + timeout_s
    last = take_sample().committed
    while time.monotonic() < deadline:
        time.sleep(3)
        now = take_sample().committed
        if now == last:
            return
        last = now
    say(f"  (still committing an earlier backlog after {timeout_s:.0f}s; measuring anyway)")


def say(message: str) -> None:
    print(message, flush=True)


# The stack is measured, not a tenant's rate limit: at the default (200,000 events/s a tenant) a
# fast machine's `bulk` and `loki`, answered once buffered, ran into it (thousands of requests
# refused with Retry-After, each body parsed before its refusal: `bulk` 1.03x plain so, 1.14x
# without it). Set either to measure with a limit.
UNLIMITED = {"CALVE_MAX_EVENTS_PER_S": str(10**9), "CALVE_MAX_BYTES_PER_S": str(2**40)}


def start_stack(data_dir: Path, port: int) -> subprocess.Popen:
    env = {"CALVE_LOG_LEVEL": "WARNING", **UNLIMITED, **os.environ, "CALVE_DATA_DIR": str(data_dir), "CALVE_PORT": str(port), "CALVE_BOOTSTRAP_TOKEN": TOKEN}
    log = open(data_dir / "calve-up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "up"], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"calve up exited ({proc.returncode}); see {data_dir / 'calve-up.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise SystemExit("calve up did not become ready within 240 s")


@contextlib.contextmanager
def embedded_stack(prefix: str) -> Iterator[tuple[Path, int]]:
    """`calve up` on a fresh data directory: (data directory, api port); stopped and removed on
    leaving (kept, for a look afterwards, with BENCH_KEEP=1)."""
    with contextlib.nullcontext(tempfile.mkdtemp(prefix=prefix)) if os.environ.get("BENCH_KEEP") else tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        port = free_port()
        say(f"starting the embedded stack (data in {data_dir}) ...")
        stack = start_stack(data_dir, port)
        try:
            yield data_dir, port
        finally:
            stack.terminate()
            stack.wait(120)


def stack_catalog(data_dir: Path) -> SqlCatalog:
    """The catalog of an embedded stack's data directory (`calve up`'s SQLite catalog)."""
    return SqlCatalog("calve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=(data_dir / "warehouse").as_uri())


def operator_token(data_dir: Path) -> str:
    """An operator token of the stack's metadata DB: /metrics is theirs to read."""
    from sqlmodel import Session

    from service.core.config import Settings
    from service.core.db import get_engine
    from service.tenancy.tenants import issue_token

    with Session(get_engine(Settings(data_dir=data_dir).resolved_database_url())) as session:
        return issue_token(session, None, label="bench")[1]


async def produce(
    port: int, shape: str, path: str, bodies: list[bytes], seconds: float, producers: int, warmup_s: float, take_sample: Callable[[], Sample],
    token: str = TOKEN,
) -> tuple[int, list[float], int, int, Sample, Sample]:
    """Run producers; returns (events acknowledged in the window: as committed, where the shape's
    answer counts them; latencies, failures, and the stack's CPU and metrics sampled as the window
    opened and closed). A 429 or 503 is waited out for its Retry-After, as shippers do.

    aiohttp rather than httpx: with hundreds of connections httpx's pool costs the load generator
    most of a core, which on this machine is taken from the system under test.
    """
    latencies: list[float] = []
    committed = failures = refusals = 0
    _path, content_type, waits = PROTOCOLS.get(shape, (None, "application/x-ndjson", True))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
    url = f"http://127.0.0.1:{port}{path}" + ("?wait=true&timeout=60" if waits else "")
    counted = shape not in PROTOCOLS  # the answer says how many events were committed
    connector = aiohttp.TCPConnector(limit=producers, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as client:

        async def one(index: int, counted_from: float, until: float) -> None:
            nonlocal committed, failures, refusals
            k = index
            while time.monotonic() < until:
                body = bodies[k % len(bodies)]
                k += producers
                sent = time.monotonic()
                try:
                    async with client.post(url, data=body) as answer:
                        status = answer.status
                        payload = await answer.read()
                        retry_after = answer.headers.get("Retry-After")
                except aiohttp.ClientError:
                    failures += 1
                    continue
                done = time.monotonic()
                if status in (429, 503) and retry_after:
                    refusals += 1
                    await asyncio.sleep(float(retry_after))
                    continue
                if status not in (200, 204):
                    failures += 1
                    continue
                if sent >= counted_from and done <= until:
                    latencies.append(done - sent)
                    committed += orjson.loads(payload)["events"] if counted else EVENTS_PER_REQUEST

        # Warm-up at full load: table creation and the JVM's JIT compilation of the job's hot
        # paths take the first minute; the figures below are for the steady state after it. It
        # lasts warmup_s and at least WARMUP_AFTER_FIRST_S past the first 10 s that committed
        # anything (at most 4 warmup_s): on a slow machine 30 s once committed nothing, and the
        # first shape's window then held the stack's start (0.53x plain first, 1.06x second).
        warm_start = time.monotonic()
        first_commit = None
        while True:
            chunk_start, before = time.monotonic(), committed
            await asyncio.gather(*(one(i, chunk_start, chunk_start + 10) for i in range(producers)))
            now = time.monotonic()
            if first_commit is None and committed > before:
                first_commit = now
            steady = first_commit is not None and now >= first_commit + WARMUP_AFTER_FIRST_S
            if (now >= warm_start + warmup_s and steady) or now >= warm_start + 4 * max(warmup_s, 10):
                break
        warm_s = time.monotonic() - warm_start
        say(f"  warm-up: {warm_s:.0f}s, {committed / warm_s:,.0f} events/s committed, "
            f"p50 {statistics.median(latencies) if latencies else float('nan'):.2f}s (not counted)")
        committed = 0
        latencies.clear()
        opened = await asyncio.to_thread(take_sample)
        start = time.monotonic()
        end = start + seconds
        progress = asyncio.create_task(report_progress(lambda: committed, start, end))
        await asyncio.gather(*(one(i, start, end) for i in range(producers)))
        progress.cancel()
        closed = await asyncio.to_thread(take_sample)
    return committed, latencies, failures, refusals, opened, closed


WARMUP_AFTER_FIRST_S = 15  # warm-up at load after the first commits, whatever BENCH_WARMUP_S says


async def report_progress(count, start: float, end: float) -> None:  # noqa: ANN001
    while True:
        await asyncio.sleep(10)
        elapsed = time.monotonic() - start
        say(f"  {elapsed:5.0f}s / {end - start:.0f}s: {count():,} events committed ({count() / elapsed:,.0f}/s)")


async def open_loop(port: int, bodies: list[bytes], rates: list[int], step_s: float, take_sample: Callable[[], Sample]) -> list[dict]:
    """Plain events at fixed arrival rates, step by step, each request sent on its schedule whatever
    the answers before it (wait=true): a rate is held when the step's requests' p99 is at most
    OPEN_LOOP_P99_S and the backlog (events accepted, not yet committed) at the step's end is not
    above its level halfway by more than half a second of arrivals (a Spark job's batch is about
    that; more means arrivals outrun commits); both over the step's second half,
    the first bringing the backlog to its level for the rate. Stops at the first rate not held."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
    url = f"http://127.0.0.1:{port}/logs?wait=true&timeout=60"
    steps: list[dict] = []
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=aiohttp.ClientTimeout(total=120)) as client:

        async def one(body: bytes) -> float | None:
            sent = time.monotonic()
            try:
                async with client.post(url, data=body) as answer:
                    await answer.read()
                    return time.monotonic() - sent if answer.status == 200 else None
            except aiohttp.ClientError:
                return None

        for rate in rates:
            interval = EVENTS_PER_REQUEST / rate
            start = time.monotonic()
            half = start + step_s / 2  # the first half brings the backlog to its level for this rate
            opened: asyncio.Task | None = None
            sent: list[asyncio.Task] = []
            while (now := time.monotonic()) < start + step_s:
                due = start + len(sent) * interval
                if due > now:
                    await asyncio.sleep(due - now)
                if opened is None and due >= half:
                    opened = asyncio.create_task(asyncio.to_thread(take_sample))
                    counted_from = len(sent)
                sent.append(asyncio.create_task(one(bodies[len(sent) % len(bodies)])))
            closed = await asyncio.to_thread(take_sample)
            opened_sample = await opened
            answers = (await asyncio.gather(*sent))[counted_from:]
            failed = sum(1 for latency in answers if latency is None)
            latencies = sorted(latency for latency in answers if latency is not None)
            p50 = statistics.median(latencies) if latencies else float("nan")
            p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
            growth = closed.backlog - opened_sample.backlog
            held = not failed and p99 <= OPEN_LOOP_P99_S and growth <= rate / 2
            steps.append({"events_per_s": rate, "ack_p50_s": round(p50, 3), "ack_p99_s": round(p99, 3), "failed": failed,
                          "backlog_growth_events": round(growth), "held": held})
            say(f"  open loop {rate:>8,} events/s offered: p50 {p50:.2f}s p99 {p99:.2f}s, backlog {growth:+,.0f} events over the step, "
                f"{failed} failed: {'held' if held else 'NOT held'}")
            if not held:
                break
    return steps


def baseline(bodies: list[bytes], work_dir: Path, batches: int) -> float:
    """Events/s of pyarrow parse + Parquet write + pyiceberg append in one process."""
    catalog = SqlCatalog("bench", uri=f"sqlite:///{work_dir / 'baseline.db'}", warehouse=(work_dir / "wh").as_uri())
    catalog.create_namespace("bench")
    per_batch = 100  # requests per append, like one writer batch
    first = pajson.read_json(io.BytesIO(b"\n".join(bodies[:per_batch])))
    table = catalog.create_table(("bench", "logs"), schema=first.schema)
    events = 0
    started = time.perf_counter()
    for b in range(batches):
        chunk = [bodies[(b * per_batch + i) % len(bodies)] for i in range(per_batch)]
        arrow = pajson.read_json(io.BytesIO(b"\n".join(chunk)), parse_options=pajson.ParseOptions(explicit_schema=first.schema))
        table.append(arrow)
        events += arrow.num_rows
    return events / (time.perf_counter() - started)


def measure(shape: str, port: int, bodies: list[bytes], seconds: float, producers: int, warmup_s: float, take_sample,  # noqa: ANN001
            token: str = TOKEN) -> dict:
    path = shape_path(port, shape, token)
    waits = PROTOCOLS.get(shape, (None, None, True))[2]
    say(f"shape {shape}: {producers} producers, {EVENTS_PER_REQUEST}-event requests of ~{statistics.mean(map(len, bodies)) / EVENTS_PER_REQUEST:.0f} "
        f"bytes an event to {path}{', wait=true' if waits else ' (answered once buffered)'}, {seconds:.0f}s (+{warmup_s:.0f}s warm-up)")
    answered, latencies, failures, refusals, opened, closed = asyncio.run(produce(port, shape, path, bodies, seconds, producers, warmup_s, take_sample, token))
    committed, accept_to_commit = committed_between(opened, closed)
    if shape not in PROTOCOLS:
        committed = answered  # as committed, by the answers within the window
    rate = committed / seconds
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
    said = "wait=true ack" if waits else "answer (once buffered)"
    say(f"calve, {shape}: {rate:,.0f} events/s committed; {said} p50 {p50:.2f}s p99 {p99:.2f}s; mean acceptance to commit "
        f"{accept_to_commit or float('nan'):.2f}s; {failures} failed answers, {refusals} refused with Retry-After")
    profile = breakdown(opened, closed, committed)
    say("where the cores went in the measured window:\n" + table(profile))
    return {"events_per_s": round(rate, 1), "ack_p50_s": round(p50, 3), "ack_p99_s": round(p99, 3), "answers_wait_for_commit": waits,
            "mean_accept_to_commit_s": round(accept_to_commit, 3) if accept_to_commit else None, "failures": failures,
            "refused_with_retry_after": refusals, **profile}


def main() -> None:
    # A benchmark stopped by SIGTERM (kill, a CI timeout) still stops the stack it started.
    signal.signal(signal.SIGTERM, lambda _signal, _frame: sys.exit(143))
    seconds = float(os.environ.get("BENCH_SECONDS", "60"))
    producers = int(os.environ.get("BENCH_PRODUCERS", "150"))
    warmup_s = float(os.environ.get("BENCH_WARMUP_S", "60"))
    shape_warmup_s = float(os.environ.get("BENCH_SHAPE_WARMUP_S", "20"))
    shapes = [name.strip() for name in os.environ.get("BENCH_SHAPES", ",".join(SHAPES)).split(",") if name.strip()]
    unknown = [name for name in shapes if name not in SHAPES]
    if unknown:
        raise SystemExit(f"BENCH_SHAPES: no shape {unknown}; the shapes are {', '.join(SHAPES)}")
    bodies = {shape: make_bodies(200, shape) for shape in shapes}
    results: dict[str, dict] = {}
    rates = [int(rate) for rate in os.environ.get("BENCH_OPEN_RATES", ",".join(str(r) for r in range(20_000, 300_001, 20_000))).split(",") if rate.strip()]
    step_s = float(os.environ.get("BENCH_OPEN_STEP_S", "30"))
    steps: list[dict] = []
    own_tables = os.environ.get("BENCH_TABLES", "own") == "own"
    kept = contextlib.nullcontext(tempfile.mkdtemp(prefix="calve-bench-")) if os.environ.get("BENCH_KEEP") else None
    with kept or tempfile.TemporaryDirectory(prefix="calve-bench-") as tmp:  # BENCH_KEEP=1: its logs kept for a look afterwards
        work = Path(tmp)
        port = free_port()
        say(f"starting the embedded stack (data in {work}) ...")
        data_dir = work / "data"
        data_dir.mkdir()
        seaweed = None
        if os.environ.get("BENCH_WAREHOUSE") == "seaweedfs":
            from tests.harness import SeaweedServer

            (work / "seaweed").mkdir()
            seaweed = SeaweedServer(work / "seaweed").start()
            os.environ.update(seaweed.overrides(seaweed.new_bucket("calve-bench")))
            say(f"warehouse: SeaweedFS's S3 ({seaweed.s3_endpoint}), REST catalog {seaweed.catalog_uri}")
        stack = start_stack(data_dir, port)
        operator = operator_token(data_dir)
        try:
            quiet = int(os.environ.get("BENCH_QUIET_TENANTS", "0"))
            if quiet:
                say(f"making {quiet} quiet tenants, a logs table each ...")
                with concurrent.futures.ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda n: tenant_of_its_own(port, operator, f"quiet_{n}"), range(quiet)))
            take_sample = lambda: sample(stack.pid, port, operator)  # noqa: E731
            for index, shape in enumerate(shapes):
                drain(take_sample)  # the last shape's backlog (answered once buffered) is not this one's
                token = tenant_of_its_own(port, operator, shape) if own_tables and index else TOKEN
                results[shape] = measure(shape, port, bodies[shape], seconds, producers, warmup_s if index == 0 else shape_warmup_s, take_sample, token)
                if own_tables:
                    drain(take_sample)
                    compact_tables(port, token)
            if rates:
                drain(take_sample)
                say(f"open loop: plain events at fixed arrival rates, {step_s:.0f}s a step, wait=true; held: p99 <= {OPEN_LOOP_P99_S}s "
                    "and a flat backlog")
                steps = asyncio.run(open_loop(port, bodies.get("plain") or make_bodies(200), rates, step_s, take_sample))
        finally:
            stack.send_signal(signal.SIGTERM)
            stack.wait(120)
            if seaweed is not None:
                seaweed.stop()
        say("baseline: pyarrow parse + Parquet + pyiceberg append, one process ...")
        # (Always of 1,000-event bodies: the baseline is the machine's speed, not the shape's.)
        base = baseline(bodies.get("plain") if EVENTS_PER_REQUEST == BASELINE_EVENTS else make_bodies(200, per_request=BASELINE_EVENTS), work, batches=20)
        say(f"baseline: {base:,.0f} events/s")
    first = results[shapes[0]]
    reference = results.get("plain", first)["events_per_s"]
    for shape, result in results.items():
        result["vs_plain"] = round(result["events_per_s"] / reference, 3) if reference else None
        say(f"  {shape:<8} {result['events_per_s']:>10,.0f} events/s  {result['vs_plain']:.2f}x plain  p50 {result['ack_p50_s']:.2f}s p99 {result['ack_p99_s']:.2f}s  "
            f"{result['cpu_s_per_100k_all_roles']} CPU-s/100k (all roles)")
    held = [step["events_per_s"] for step in steps if step["held"]]
    capacity = max(held) if held else None
    if rates:
        say(f"  open-loop capacity: {capacity or 0:,} events/s held (p99 <= {OPEN_LOOP_P99_S}s, flat backlog)"
            + (f", {capacity / base:.3f} of the baseline" if capacity and base else ""))
    print(orjson.dumps({
        **first,
        "open_loop": {"capacity_events_per_s": capacity, "steps": steps},
        "baseline_events_per_s": round(base, 1),
        "ratio": round(first["events_per_s"] / base, 3) if base else None,
        "shapes": results,
    }).decode(), flush=True)


if __name__ == "__main__":
    main()
