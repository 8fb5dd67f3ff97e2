"""The short way for the commonest batch: events that fit their table as they are.

A pipeline with no processors or routes, one static sink into an existing unpartitioned table
that only appends, whose columns are strings, integers, floating point numbers and booleans (and
its extra_fields map): its events need no inference, no expressions and no coercion. For such a
batch each Spark task hands its requests' bodies to pyarrow in a Python worker (`mapInArrow`),
which parses the NDJSON with the table's schema and writes one Parquet file: about a tenth of the
CPU of parsing with Spark's JSON functions and converting column by column.

It is all or nothing. Whatever the Spark job would treat as anything but a plain row (a field the
table lacks, a value of another type, a number out of range, a duplicate key, a missing required
field, an event with no field of the table) makes pyarrow refuse the batch, or is found after the
parse; then the files written are deleted and the caller runs the whole Spark job, which decides
what each event becomes exactly as it always does. So this path changes how fast, never what.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from spark_jobs.files import _path, conform

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Types whose JSON reading pyarrow and the Spark job agree on exactly; anything else: the Spark job.
_PLAIN_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_int64, pa.types.is_int32,
                pa.types.is_float64, pa.types.is_float32, pa.types.is_boolean)

RESULT = T.StructType([T.StructField("path", T.StringType()), T.StructField("counts", T.StringType()), T.StructField("refused", T.StringType())])
RESULT_ARROW = pa.schema([pa.field("path", pa.string()), pa.field("counts", pa.string()), pa.field("refused", pa.string())])


def parse_schema(schema: pa.Schema, extra_fields: str | None) -> pa.Schema | None:
    """The schema pyarrow parses with (the table's, without its extra_fields column, and without
    field metadata); None when a column's type is not one this path reads."""
    fields = [pa.field(f.name, f.type) for f in schema if f.name != extra_fields]
    if not fields or not all(any(check(f.type) for check in _PLAIN_TYPES) for f in fields):
        return None
    return pa.schema(fields)


def append_directly(
    spark: SparkSession, receipts: list[str], bodies: list[bytes], directory: str, filesystem: object | None,
    parsing: pa.Schema, file_schema: pa.Schema, required: frozenset[str],
) -> tuple[dict[str, int] | None, str | None]:
    """Write the bodies' events as Parquet files under `directory`: (rows per receipt, None), or
    (None, why not) with nothing left behind."""
    if filesystem is None:
        from pyarrow import fs as pafs

        filesystem = pafs.LocalFileSystem()
    frame = spark.createDataFrame(pa.table({"receipt": pa.array(receipts, pa.string()), "body": pa.array(bodies, pa.large_binary())}))
    append = _appender(_path(directory), filesystem, parsing, file_schema, required)
    results = frame.mapInArrow(append, RESULT).collect()
    written = [row.path for row in results if row.path]
    refused = next((row.refused for row in results if row.refused), None)
    if refused is not None:
        for path in written:
            try:
                filesystem.delete_file(path)
            except OSError:
                pass  # orphan removal takes it later
        return None, refused
    counts: dict[str, int] = {}
    for row in results:
        for receipt, rows in json.loads(row.counts or "{}").items():
            counts[receipt] = counts.get(receipt, 0) + rows
    return counts, None


def _appender(directory: str, filesystem, parsing: pa.Schema, file_schema: pa.Schema, required: frozenset[str]):  # noqa: ANN001, ANN202
    def append(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import io

        import pyarrow.compute as pc
        import pyarrow.json as pj
        import pyarrow.parquet as pq

        def answer(path: str | None = None, counts: dict | None = None, refused: str | None = None) -> pa.RecordBatch:
            return pa.RecordBatch.from_pylist([{"path": path, "counts": json.dumps(counts or {}), "refused": refused}], schema=RESULT_ARROW)

        options = pj.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="error")
        tables, counts = [], {}
        for batch in batches:
            for receipt, body in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                try:
                    table = pj.read_json(io.BytesIO(body), read_options=pj.ReadOptions(block_size=len(body) + 1), parse_options=options)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    yield answer(refused=str(exc)[:300])
                    return
                events = sum(1 for line in body.split(b"\n") if line.strip())
                if table.num_rows != events:
                    yield answer(refused=f"{events} events read as {table.num_rows} rows")
                    return
                counts[receipt] = counts.get(receipt, 0) + events
                tables.append(table)
        if not tables:
            yield answer()
            return
        data = pa.concat_tables(tables)
        missing = [name for name in required if name in data.column_names and data.column(name).null_count]
        if missing or any(name not in data.column_names for name in required):
            yield answer(refused=f"required column {(missing or sorted(required))[0]!r} has no value in an event")
            return
        present = None
        for column in data.columns:
            valid = pc.is_valid(column)
            present = valid if present is None else pc.or_(present, valid)
        if not pc.all(present).as_py():
            yield answer(refused="an event has no field of the table")
            return
        from pyarrow import fs as pafs

        if isinstance(filesystem, pafs.LocalFileSystem):  # an object store has no directories to make
            filesystem.create_dir(directory, recursive=True)
        path = f"{directory}/part-{uuid.uuid4().hex}.zstd.parquet"
        with pq.ParquetWriter(path, file_schema, filesystem=filesystem, compression="zstd") as writer:
            for chunk in data.combine_chunks().to_batches():
                writer.write_batch(conform(chunk, file_schema))
        yield answer(path=path, counts=counts)

    return append
