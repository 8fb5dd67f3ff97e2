"""An OTLP export buffered as its rows' columns (spark_jobs/otlp_rows.py) against the same export
buffered as the per-record way's NDJSON lines: a short-way task (direct_append._appender, without
Spark) writes the same rows from either, alone or mixed in one task, into the built-in otel_logs
table partitioned by day; and where the table does not take the columns as they are, the task
reads their lines as it reads any."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.api import otlp_columns
from service.pipelines.otel import OTEL_LOGS_SCHEMA
from service.pipelines.table_schema import TableSchema
from spark_jobs import otlp_rows
from spark_jobs.columns import LINE_SLOTS
from spark_jobs.direct_append import _appender, parse_schema
from tests.unit.test_otlp_json import RECEIVED_NS, by_records, exporter_documents

TABLE = TableSchema.model_validate(OTEL_LOGS_SCHEMA).iceberg_schema().as_arrow()
PARTITION = [("timestamp", "day")]
_runs = itertools.count()


def written(base: Path, bodies: list[bytes], table: pa.Schema = TABLE) -> tuple[list[dict], dict, list[int]]:
    """(the rows one task writes for `bodies`, in a stable order; its counts; the requests it left out)."""
    directory = base / f"run{next(_runs)}"
    parsing = parse_schema(table, None, PARTITION)
    append = _appender(str(directory), pafs.LocalFileSystem(), parsing, table, frozenset({"timestamp"}), None, PARTITION, by_request=True)
    batch = pa.record_batch({"receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
                             "seq": pa.array([i * LINE_SLOTS for i in range(len(bodies))], pa.int64())})
    answers = [row for out in append(iter([batch])) for row in out.to_pylist()]
    rows = [row for answer in answers if answer["path"] for row in pq.read_table(answer["path"]).to_pylist()]
    rejected = orjson.loads(answers[-1]["rejected"]) if answers[-1]["rejected"] else []
    return sorted(rows, key=lambda row: orjson.dumps(row, default=str)), orjson.loads(answers[-1]["counts"]), rejected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(exporter_documents, min_size=1, max_size=3), st.data())
def test_a_task_writes_the_same_rows_from_an_exports_columns_as_from_its_lines(tmp_path: Path, documents: list[dict], data: st.DataObject) -> None:
    texts = [orjson.dumps(document) for document in documents]
    columns = [otlp_columns.json_body(text, RECEIVED_NS, 10_000) for text in texts]
    lines = [by_records(text) for text in texts]
    if any(parsed is None for parsed in columns + lines):
        return  # left to the per-record way (a null, a time past 9999): buffered as lines
    assert all(otlp_rows.is_rows(parsed.ndjson) for parsed in columns)
    # Each request as columns or as lines, at random: the task's rows must not depend on which.
    mixed = [column.ndjson if data.draw(st.booleans()) else line.ndjson for column, line in zip(columns, lines)]
    assert written(tmp_path, mixed) == written(tmp_path, [parsed.ndjson for parsed in lines])
    assert written(tmp_path, [parsed.ndjson for parsed in columns]) == written(tmp_path, [parsed.ndjson for parsed in lines])


def test_columns_a_table_does_not_take_as_they_are_are_read_as_their_lines(tmp_path: Path) -> None:
    """A table without one of the columns (no extra_fields map): the export's lines name a field it
    lacks, and the request is left to the Spark job, as its lines would be; a table whose column
    changed type reads the lines too."""
    export = orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": "1764000000123456789", "body": {"stringValue": "hi"}, "eventName": "login",
         "attributes": [{"key": "b", "value": {"stringValue": "2"}}, {"key": "a", "value": {"intValue": "1"}}]},
    ]}]}]})
    columns, lines = otlp_columns.json_body(export, RECEIVED_NS, 10).ndjson, by_records(export).ndjson
    narrower = pa.schema([field for field in TABLE if field.name != "event_name"])
    assert written(tmp_path, [columns], narrower) == written(tmp_path, [lines], narrower) == ([], {}, [0])
    rows, counts, rejected = written(tmp_path, [columns])
    assert counts == {"r0": 1} and not rejected
    assert rows[0]["attributes"] == [("a", "1"), ("b", "2")] and rows[0]["event_name"] == "login"
    assert otlp_rows.as_lines(columns).decode() == (
        '{"timestamp":"2025-11-24T16:00:00.123456Z","body":"hi","attributes":{"a":"1","b":"2"},"resource_attributes":{},'
        '"event_name":"login"}'
    )
    assert otlp_rows.as_lines(lines) == lines


def test_an_exports_columns_are_never_taken_for_a_body_with_events_set_aside() -> None:
    """The api marks an event it set aside with a line starting "!"; an export's columns are
    binary, and may hold those bytes (here in a record's text, stored as it is): read as a body
    with events set aside, every batch holding one went to the Spark job."""
    from spark_jobs.events import has_set_aside

    export = orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"timeUnixNano": "1764000000123456789", "body": {"stringValue": "first\n!second"}}]}]}]})
    columns = otlp_columns.json_body(export, RECEIVED_NS, 10).ndjson
    assert b"\n!" in columns and not has_set_aside(columns)
    assert has_set_aside(b'{"a":1}\n!{"reason":"too deep","event":"[[[["}')
