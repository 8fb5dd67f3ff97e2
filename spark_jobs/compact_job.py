"""The Spark side of compaction: the rows of many small Parquet files of one partition, written
again as a few files near the target size. Rows are copied as they are (read with the table's
current schema, so a column added since reads as null): nothing is added, dropped or changed,
which the committer checks by row count before it commits the result as a `replace` snapshot.

Merge-on-read: a file's position deletes are applied as it is copied (its deleted rows are left
out, and the committer removes its delete files in the same snapshot), so reads stop paying for
them; only this pyarrow way can, so a rewrite with deletes that it cannot do fails instead of
falling back to Spark's reader.

Each output is written by one Spark task that reads its share of the input files and writes them
again with pyarrow in a Python worker (`mapInArrow` over the list of files: no row passes through
the JVM), at a fraction of what Spark's own Parquet reader and writer cost; compaction then stalls
ingest on a small cluster far less. A file written before a column, or a field of a struct, was
added reads it as null (conform). Where pyarrow cannot read a file into the table's schema, the
task fails, its files are deleted, and Spark's reader and writer do the rewrite instead.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.coerce import declared_not_null
from spark_jobs.contract import layout_path
from spark_jobs.files import _path, conform, freeze_once, read_parquet, write_parquet
from spark_jobs.task_code import bound

cloudpickle.register_pickle_by_value(sys.modules[__name__])

log = logging.getLogger(__name__)

WRITTEN = T.StructType([T.StructField("path", T.StringType()), T.StructField("rows", T.LongType())])
WRITTEN_ARROW = pa.schema([pa.field("path", pa.string()), pa.field("rows", pa.int64())])


def rewrite_files(
    spark: SparkSession, paths: list[str], schema: pa.Schema, required: frozenset[str], directory: str, outputs: int,
    filesystem: object | None = None, deletes: dict[str, list[str]] | None = None, tasks: int | None = None,
) -> None:
    """Write the rows of `paths` into `outputs` Parquet files under `directory` (filesystem: as
    for spark_jobs.files; None: local files), less the rows the position delete files `deletes`
    (per path) delete; at most `tasks` Spark tasks at once (None: all outputs')."""
    store = filesystem
    if store is None:
        from pyarrow import fs as pafs

        store = pafs.LocalFileSystem()
    try:
        copy_files(spark, paths, schema, _path(directory), store, outputs, deletes or {}, tasks)
        return
    except Exception as exc:
        if deletes:  # Spark's reader knows nothing of them: it would bring deleted rows back
            raise RuntimeError(f"could not rewrite {len(paths)} files with their deletes applied: {exc}") from exc
        log.warning("compaction: pyarrow could not rewrite %d files (%s: %s); Spark's reader and writer do it",
                    len(paths), exc.__class__.__name__, str(exc)[:300])
        try:
            store.delete_dir(_path(directory))
        except OSError:
            pass  # nothing was written, or orphan removal takes it later
    spark_rewrite(spark, paths, schema, required, directory, outputs, filesystem, tasks)


def spark_rewrite(
    spark: SparkSession, paths: list[str], schema: pa.Schema, required: frozenset[str], directory: str, outputs: int,
    filesystem: object | None = None, tasks: int | None = None,
) -> None:
    """rewrite_files by Spark's reader and writer (no deletes): `outputs` files, written by jobs of
    at most `tasks` tasks one after another (as copy_files), each under a directory of its own
    (`directory` itself when one job does it all)."""
    spark_schema = from_arrow_schema(schema)
    runs = groups(paths, outputs)
    step = tasks or len(runs)
    for start in range(0, len(runs), step):
        wave = runs[start:start + step]
        frame = read_parquet(spark, [path for run in wave for path in run], schema, filesystem)
        frame = frame.select(*[
            declared_not_null(F.col(field.name), field.dataType).alias(field.name) if field.name in required else F.col(field.name)
            for field in spark_schema.fields
        ])
        # coalesce, not repartition: each output task reads whole input files, without a shuffle.
        target = directory if step >= len(runs) else f"{directory}/wave-{start // step}"
        write_parquet(frame.coalesce(len(wave)), target, filesystem, schema=schema)


def groups(paths: list[str], outputs: int) -> list[list[str]]:
    """`paths` in `outputs` runs of about equal length (the planner's files are of about equal size)."""
    outputs = max(1, min(outputs, len(paths)))
    size, extra = divmod(len(paths), outputs)
    runs, start = [], 0
    for index in range(outputs):
        end = start + size + (1 if index < extra else 0)
        runs.append(paths[start:end])
        start = end
    return runs


def copy_files(
    spark: SparkSession, paths: list[str], schema: pa.Schema, directory: str, filesystem, outputs: int,  # noqa: ANN001
    deletes: dict[str, list[str]] | None = None, tasks: int | None = None,
) -> int:
    """One task per output file, each copying its run of `paths` in `schema`, less the rows the
    position delete files `deletes` (per path) delete; the rows written. At most `tasks` of them
    at once: jobs of that many tasks, one after another (Spark gives a job's tasks every free core
    before a later job's: the writers' jobs, submitted meanwhile, would wait for a compaction's)."""
    runs = [(index, "\n".join(run)) for index, run in enumerate(groups(paths, outputs))]
    copier = _copier(directory, filesystem, schema, deletes or {})
    rows = 0
    for start in range(0, len(runs), tasks or len(runs)):
        wave = runs[start:start + (tasks or len(runs))]
        listing = spark.createDataFrame(wave, "index long, paths string").repartition(len(wave), "index")
        rows += sum(row.rows for row in listing.mapInArrow(copier, WRITTEN).collect())
    return rows


ROW_GROUP_ROWS = 512 * 1024  # rows buffered per row group: Spark's writer makes them large too


def deleted_positions(source: str, delete_paths: list[str], filesystem) -> np.ndarray:  # noqa: ANN001
    """The row positions of `source` its position delete files delete, sorted."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    positions = []
    for path in delete_paths:
        with filesystem.open_input_file(_path(path)) as stream:
            deletes = pq.read_table(stream, columns=["file_path", "pos"])
        positions.append(deletes.filter(pc.equal(deletes.column("file_path"), source)).column("pos").to_numpy())
    return np.unique(np.concatenate(positions)) if positions else np.empty(0, np.int64)


def _copier(directory: str, filesystem, schema: pa.Schema, deletes: dict[str, list[str]] | None = None,  # noqa: ANN001
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The compaction's task: `_copy` with its arguments, its code pickled once per process (task_code.py)."""
    layout_suffix = layout_path("")  # a string in the arguments: executors need not have spark_jobs.contract
    required = [field.name for field in schema if not field.nullable]
    return bound(_copy, directory, filesystem, schema, deletes or {}, layout_suffix, required)


def _copy(directory: str, filesystem, schema: pa.Schema, deletes: dict[str, list[str]], layout_suffix: str, required: list[str],  # noqa: ANN001
          batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    freeze_once()
    if isinstance(filesystem, pafs.LocalFileSystem):  # an object store has no directories to make
        filesystem.create_dir(directory, recursive=True)
    for listing in batches:
        for run in listing.column(1).to_pylist():
            path, rows, buffered, layout = f"{directory}/part-{uuid.uuid4().hex}.zstd.parquet", 0, [], []
            try:
                with pq.ParquetWriter(path, schema, filesystem=filesystem, compression="zstd") as writer:
                    for source in run.split("\n"):
                        deleted = deleted_positions(source, deletes[source], filesystem) if source in deletes else None
                        start = rows
                        with filesystem.open_input_file(_path(source)) as stream:
                            offset = 0
                            for batch in pq.ParquetFile(stream).iter_batches(batch_size=65536):
                                if deleted is not None and len(deleted):
                                    place = np.arange(offset, offset + batch.num_rows)
                                    offset += batch.num_rows
                                    batch = batch.filter(pa.array(~np.isin(place, deleted, assume_unique=True)))
                                data = conform(batch, schema)
                                for name in required:
                                    if data.column(name).null_count:
                                        raise ValueError(f"required column {name!r} is null in {source}")
                                buffered.append(data)
                                rows += data.num_rows
                                if sum(b.num_rows for b in buffered) >= ROW_GROUP_ROWS:
                                    writer.write_table(pa.Table.from_batches(buffered, schema=schema), row_group_size=ROW_GROUP_ROWS)
                                    buffered = []
                        layout.append([source, start, rows - start, [] if deleted is None else deleted.tolist()])
                    if buffered:
                        writer.write_table(pa.Table.from_batches(buffered, schema=schema), row_group_size=ROW_GROUP_ROWS)
                if rows:
                    with filesystem.open_output_stream(path + layout_suffix) as out:
                        out.write(json.dumps(layout).encode())
            except BaseException:
                for written in (path, path + layout_suffix):
                    try:
                        filesystem.delete_file(written)
                    except OSError:
                        pass
                raise
            if not rows:  # every row of the run was deleted: no file for it
                filesystem.delete_file(path)
            yield pa.RecordBatch.from_pylist([{"path": path, "rows": rows}], schema=WRITTEN_ARROW)
