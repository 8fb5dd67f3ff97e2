"""The Spark side of the change feed: one snapshot's changes, for snapshots too large to diff in
a feed reader's process (service/iceberg/changelog.py does the same in memory for small ones).

The rows of the files the snapshot removed (side 0) and added (side 1), read with the table's
current schema, each with its file's place in path order and its row index in the file; carryover
(a row removed and added unchanged: full-row equality, counted per side) dropped; with identifier
columns, a key on both sides is an update. Written as one Parquet file in the feed's order:
removed rows, then added rows, each by file then row, with CHANGE_COLUMN holding the change type.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from spark_jobs.files import read_parquet, write_parquet

CHANGE_COLUMN = "_change_type"
SIDE, FILE, POS, RANK, REMOVED, ADDED, BOTH = (f"_calve_diff_{name}" for name in ("side", "file", "pos", "rank", "removed", "added", "both"))


def diff_snapshot(
    spark: SparkSession, removed: list[str], added: list[str], schema: pa.Schema, identifier: list[str], directory: str,
    filesystem: object | None = None,
) -> None:
    """filesystem: as for spark_jobs.files, for the table's files and `directory`."""
    columns = schema.names
    path_column = f"{FILE}_path"

    def side(paths: list[str], value: int):  # noqa: ANN202 - a DataFrame
        index = F.create_map(*[item for i, path in enumerate(paths) for item in (F.lit(path), F.lit(i))])
        rows = read_parquet(spark, paths, schema, filesystem, file_column=path_column, position_column=POS)
        return rows.select(*columns, F.lit(value).alias(SIDE), index[F.col(path_column)].alias(FILE), POS)

    rows = side(removed, 0).unionByName(side(added, 1))
    same_row = Window.partitionBy(*columns)
    rows = rows.withColumns({
        RANK: F.row_number().over(Window.partitionBy(*columns, SIDE).orderBy(FILE, POS)),
        REMOVED: F.sum(F.when(F.col(SIDE) == 0, 1).otherwise(0)).over(same_row),
        ADDED: F.sum(F.when(F.col(SIDE) == 1, 1).otherwise(0)).over(same_row),
    })
    kept = rows.where(F.col(RANK) > F.least(F.col(REMOVED), F.col(ADDED)))
    plain = F.when(F.col(SIDE) == 0, F.lit("DELETE")).otherwise(F.lit("INSERT"))
    if identifier:
        same_key = Window.partitionBy(*identifier)
        kept = kept.withColumn(BOTH, (F.min(SIDE).over(same_key) == 0) & (F.max(SIDE).over(same_key) == 1))
        change = F.when(F.col(BOTH), F.when(F.col(SIDE) == 0, F.lit("UPDATE_BEFORE")).otherwise(F.lit("UPDATE_AFTER"))).otherwise(plain)
    else:
        change = plain
    out = kept.select(*columns, change.alias(CHANGE_COLUMN), SIDE, FILE, POS)
    write_parquet(out.repartition(1).sortWithinPartitions(SIDE, FILE, POS).drop(SIDE, FILE, POS), directory, filesystem)
