"""Applying row changes, copy-on-write or merge-on-read.

    changes (I/U/D per event, in acceptance order) of one or more commit-stream entries
      + the table's live rows in the candidate files (those whose statistics may hold a changed
        key), less the rows their position delete files already delete
    -> per key, the events folded in order over whether the key exists (its last state wins)
    -> per event: inserted, updated, deleted or a no-op (for its receipt's counts)
    -> new data files: the keys' new rows, and, copy-on-write, the untouched rows of every file
       that held a changed key
    -> copy-on-write: removed files, exactly those that held a changed key (every engine reads
       the result as plain data files);
       merge-on-read: position delete files naming each live row of a changed key, one per data
       file (only the identifier columns of the candidates are read, nothing is rewritten)

The caller (a writer) picks the candidate files from the table's metadata; the table's leader
commits the result as one `overwrite` snapshot if the table is still at the snapshot it was
computed against, and asks again otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.columns import OP, RECEIPT, SEQ
from spark_jobs.files import read_live_parquet, read_parquet, write_position_deletes
from spark_jobs.partitions import write_data_files
from spark_jobs.targets import Target

ORDER = "_calve_order"  # the entry's place among those applied together
FILE = "_calve_file"
POS = "_calve_pos"
EXISTS = "_calve_exists"
EFFECT = "_calve_effect"
EFFECTS = ("inserted", "updated", "deleted", "noop")


@dataclass
class Applied:
    removes: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # receipt -> effect -> events
    rows_written: int = 0
    # merge-on-read: (delete file, the data file it applies to, rows, bytes[, the delete files of
    # that data file it replaces: row_delta_job.py's hold their positions too])
    deletes: list[tuple] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # time by phase, where the way measures it


def change_rows(spark: SparkSession, entries: list[list[str]], schema: pa.Schema, filesystem: object | None = None) -> DataFrame:
    """The change events of `entries` (their files, in commit order) with one global order."""
    change_schema = schema.append(pa.field(OP, pa.string())).append(pa.field(SEQ, pa.int64())).append(pa.field(RECEIPT, pa.string()))
    order = spark.createDataFrame([(path, index) for index, paths in enumerate(entries) for path in paths], [FILE, ORDER])
    frame = read_parquet(spark, [path for paths in entries for path in paths], change_schema, filesystem, file_column=FILE)
    return frame.join(F.broadcast(order), FILE).drop(FILE)


def apply_changes(
    spark: SparkSession, entries: list[list[str]], candidates: list[tuple[str, list[str]]], target: Target, keys: list[str],
    upsert: bool, merge_on_read: bool = False,
) -> Applied:
    """Write the table's new files for these changes under target.directory (merge-on-read: its
    position delete files beside it, under `<directory>-deletes`); what they replace or delete
    and each receipt's counts. candidates: (data file, its position delete files)."""
    changes = change_rows(spark, entries, target.schema, target.filesystem).cache()
    try:
        return _apply(spark, changes, candidates, target, keys, upsert, merge_on_read)
    finally:
        changes.unpersist()


def _apply(
    spark: SparkSession, changes: DataFrame, candidates: list[tuple[str, list[str]]], target: Target, keys: list[str],
    upsert: bool, merge_on_read: bool,
) -> Applied:
    columns = list(target.schema.names)
    changed_keys = changes.select(*keys).distinct()
    removes: list[str] = []
    deletes: list[tuple[str, str, int, int]] = []
    carried = None
    existing = spark.createDataFrame([], T.StructType([changes.schema[key] for key in keys])).withColumn(EXISTS, F.lit(True))
    if candidates:
        # Merge-on-read needs only the keys and where each row is; copy-on-write carries whole rows.
        read = pa.schema([target.schema.field(key) for key in keys]) if merge_on_read else target.schema
        rows = read_live_parquet(spark, candidates, read, target.filesystem, file_column=FILE, position_column=POS)
        hit = rows.join(changed_keys, keys, "left_semi").cache()
        try:
            existing = hit.select(*keys).distinct().withColumn(EXISTS, F.lit(True)).cache()
            if merge_on_read:
                # Every live row of a changed key is deleted; the key's last state, if any, is a new row.
                deletes = write_position_deletes(hit, FILE, POS, f"{target.directory}-deletes", target.filesystem)
            else:
                removes = sorted(row[0] for row in hit.select(FILE).distinct().collect())
            existing.count()
        finally:
            hit.unpersist()
        if removes:
            carried = rows.where(F.col(FILE).isin(removes)).join(changed_keys, keys, "left_anti").select(*columns)

    # Fold each key's events in order: whether the key exists before each event decides its effect.
    ordered = Window.partitionBy(*keys).orderBy(ORDER, SEQ)
    events = changes.join(existing, keys, "left").withColumn(EXISTS, F.coalesce(F.col(EXISTS), F.lit(False)))
    sets = F.when(F.col(OP) == "I", F.lit(True)).when(F.col(OP) == "D", F.lit(False))
    if upsert:
        sets = sets.when(F.col(OP) == "U", F.lit(True))
    before = F.coalesce(F.last(sets, ignorenulls=True).over(ordered.rowsBetween(Window.unboundedPreceding, -1)), F.col(EXISTS))
    events = events.withColumn("_calve_before", before)
    effect = (
        F.when(F.col(OP) == "I", F.when(F.col("_calve_before"), F.lit("updated")).otherwise(F.lit("inserted")))
        .when(F.col(OP) == "U", F.when(F.col("_calve_before"), F.lit("updated")).otherwise(F.lit("inserted" if upsert else "noop")))
        .otherwise(F.when(F.col("_calve_before"), F.lit("deleted")).otherwise(F.lit("noop")))
    )
    after = F.when(F.col(OP) == "D", F.lit(False)).when(F.col(OP) == "I", F.lit(True)).otherwise(F.col("_calve_before") | F.lit(upsert))
    last = F.row_number().over(Window.partitionBy(*keys).orderBy(F.col(ORDER).desc(), F.col(SEQ).desc())) == 1
    events = events.withColumn(EFFECT, effect).withColumn("_calve_after", after).withColumn("_calve_last", last).cache()
    try:
        counts: dict[str, dict[str, int]] = {}
        for receipt, what, n in events.groupBy(RECEIPT, EFFECT).count().collect():
            counts.setdefault(receipt, dict.fromkeys(EFFECTS, 0))[what] = n
        new_rows = events.where(F.col("_calve_last") & F.col("_calve_after")).select(*columns)
        output = new_rows if carried is None else reduce(DataFrame.unionByName, [carried, new_rows])
        output = output.cache()
        try:
            written = output.count()
            if written:
                write_data_files(output, target)
        finally:
            output.unpersist()
    finally:
        events.unpersist()
        existing.unpersist()
    return Applied(removes, counts, written, deletes)
