"""Dead letters: events that cannot be written, each with its reason, as rows of the tenant's DLQ
table (contract.DLQ_SCHEMA). Two writers share the layout: the Spark job's (rows it refused, in
Spark) and the service's (requests no job could write: Spark may be what fails on them)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import reduce

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.coerce import declared_not_null
from spark_jobs.columns import EVENT, RECEIPT, TABLE, by_name
from spark_jobs.contract import DLQ_ID, DLQ_SCHEMA, SET_ASIDE_MARK
from spark_jobs.files import write_parquet
from spark_jobs.targets import Output


@dataclass
class DeadLetters:
    """A job's dead letters, gathered as it goes and written once at its end."""

    pipeline: str
    version: int
    directory: str
    filesystem: object | None = None  # as Target.filesystem, for directory
    frames: list[DataFrame] = field(default_factory=list)

    def add(self, rows: DataFrame, reason: Column) -> None:
        table = F.col(TABLE) if TABLE in rows.columns else F.lit(None).cast("string")
        self.frames.append(rows.select(
            F.expr("uuid()").alias(DLQ_ID),
            F.col(EVENT).alias("event"),
            reason.alias("reason"),
            F.lit(self.pipeline).alias("pipeline"),
            F.lit(self.version).cast("bigint").alias("pipeline_version"),
            table.alias("table"),
            F.col(RECEIPT).alias("receipt"),
            F.current_timestamp().alias("failed_at"),
        ))

    def write(self) -> Output | None:
        """The DLQ file(s) of every dead letter added, and how many per receipt (None: none)."""
        if not self.frames:
            return None
        dead = reduce(DataFrame.unionByName, self.frames).cache()
        try:
            counts = {receipt: count for receipt, count in dead.groupBy("receipt").count().collect()}
            if not counts:
                return None
            spark_types = {f.name: f.dataType for f in from_arrow_schema(DLQ_SCHEMA).fields}
            required = [
                declared_not_null(by_name(f.name), spark_types[f.name]).alias(f.name) if not f.nullable else by_name(f.name)
                for f in DLQ_SCHEMA
            ]
            write_parquet(dead.select(*required), self.directory, self.filesystem, schema=DLQ_SCHEMA)
            return Output(self.directory, counts)
        finally:
            dead.unpersist()


def dead_letter_requests(
    requests: list[tuple[str, bytes]], reason: str, pipeline: str, version: int, location: str, filesystem: object,
) -> dict[str, int]:
    """Every event of these requests ((receipt, body) each) as a dead letter with `reason` (an
    event the api set aside keeps its own), written with pyarrow, without Spark, to one file at
    `location` on `filesystem` (a pyarrow FileSystem). Returns the dead letters per receipt."""
    now = datetime.now(timezone.utc)
    columns: dict[str, list] = {name: [] for name in DLQ_SCHEMA.names}
    rows_by_receipt: dict[str, int] = {}
    mark = SET_ASIDE_MARK.encode()
    for receipt, body in requests:
        for line in body.split(b"\n"):
            if not line:
                continue
            event, why = line.decode(errors="replace"), reason
            if line.startswith(mark):
                wrapped = orjson.loads(line[len(mark):])
                event, why = wrapped["event"], wrapped["reason"]
            row = {DLQ_ID: str(uuid.uuid4()), "event": event, "reason": why, "pipeline": pipeline,
                   "pipeline_version": version, "table": None, "receipt": receipt, "failed_at": now}
            for name, value in row.items():
                columns[name].append(value)
            rows_by_receipt[receipt] = rows_by_receipt.get(receipt, 0) + 1
    filesystem.create_dir(location.rsplit("/", 1)[0])
    pq.write_table(pa.table(columns, schema=DLQ_SCHEMA), location, filesystem=filesystem, compression="zstd")
    return rows_by_receipt
