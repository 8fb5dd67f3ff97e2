"""Reading and writing a job's Parquet, on whatever storage the table lives in.

Spark's own reader and writer reach the file systems its Hadoop libraries know: local files
(file://) and HDFS. An object store (s3://, gs://, abfs://) would need Hadoop's connector for it in
every Spark JVM (hadoop-aws and the AWS SDK for S3), which the pyspark package does not carry. For
those, the executors read and write Parquet themselves with pyarrow, through `mapInArrow`: the
caller passes the pyarrow file system (built from the catalog's FileIO properties, credentials
and endpoint included; it pickles), and the executors need only pyarrow, which every PySpark
installation with Arrow support has. This module is shipped to them by value, so they need
nothing of Calve installed.

Either way a table's files are one per partition value (or per `max_records` rows), with the
table's column names; their partition comes from their statistics when they are committed.
"""

from __future__ import annotations

import sys
import types
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from spark_jobs.contract import POSITION_DELETE_ARROW
from spark_jobs.task_code import bound

# Executors unpickle the functions below by value: they need not have this package.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

WRITTEN = T.StructType([T.StructField("path", T.StringType()), T.StructField("rows", T.LongType())])
WRITTEN_ARROW = pa.schema([pa.field("path", pa.string()), pa.field("rows", pa.int64())])
# What writing position delete files (contract.POSITION_DELETE_ARROW) reports: a file's name, the
# data file, rows, bytes.
DELETES_WRITTEN_ARROW = pa.schema([
    pa.field("path", pa.string()), pa.field("data_file", pa.string()), pa.field("rows", pa.int64()), pa.field("bytes", pa.int64()),
])
DELETES_WRITTEN = from_arrow_schema(DELETES_WRITTEN_ARROW)


def write_parquet(
    frame: DataFrame, directory: str, filesystem: object | None = None, *, schema: pa.Schema | None = None,
    max_records: int | None = None, partition_by: list[str] | tuple[str, ...] = (),
) -> None:
    """Write `frame` as zstd Parquet files under `directory` (which must not exist yet).

    partition_by: columns whose values split the files (one file per value in each task), left
    out of the files. max_records: rows per file at most. filesystem: a pyarrow FileSystem for
    `directory` when Spark cannot reach it itself (None: Spark's own writer). schema: the files'
    Arrow schema (nullability included), for the pyarrow writer; Spark's otherwise.
    """
    if filesystem is None:
        writer = frame.write.mode("error").option("compression", "zstd")
        if max_records:
            writer = writer.option("maxRecordsPerFile", str(max_records))
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.parquet(directory)
        return
    if partition_by:
        frame = frame.sortWithinPartitions(*partition_by)  # each value's rows together: one file open at a time
    columns = [name for name in frame.columns if name not in partition_by]
    if schema is None:
        schema = to_arrow_schema(frame.select(*columns).schema)
    write = _arrow_writer(_path(directory), filesystem, schema, list(partition_by), max_records)
    frame.mapInArrow(write, WRITTEN).collect()


def read_parquet(
    spark: SparkSession, paths: list[str], schema: pa.Schema, filesystem: object | None = None, *,
    file_column: str | None = None, position_column: str | None = None,
) -> DataFrame:
    """The rows of Parquet files `paths`, in `schema` (a column a file lacks reads as null).

    file_column: each row's file, spelled as in `paths`. position_column: its row's place in that
    file (from 0). filesystem: as for `write_parquet`.
    """
    if filesystem is None:
        frame = spark.read.schema(from_arrow_schema(schema)).parquet(*paths)
        extra = {}
        if file_column:
            # Spark spells a local file file:/x however it was named: map its spelling back.
            named = F.create_map(*[F.lit(item) for path in paths for item in (_normal(path), path)])
            extra[file_column] = named[F.concat(F.lit("/"), F.regexp_replace(F.col("_metadata.file_path"), "^(file:)?/*", ""))]
        if position_column:
            extra[position_column] = F.col("_metadata.row_index")
        return frame.withColumns(extra) if extra else frame
    output = schema
    if file_column:
        output = output.append(pa.field(file_column, pa.string()))
    if position_column:
        output = output.append(pa.field(position_column, pa.int64()))
    files = spark.createDataFrame([(path,) for path in paths], "path string")
    files = files.repartition(max(1, min(len(paths), int(spark.conf.get("spark.sql.shuffle.partitions", "200")))))
    read = _arrow_reader(filesystem, schema, output, file_column, position_column)
    return files.mapInArrow(read, from_arrow_schema(output))


def read_live_parquet(
    spark: SparkSession, files: list[tuple[str, list[str]]], schema: pa.Schema, filesystem: object | None = None, *,
    file_column: str, position_column: str,
) -> DataFrame:
    """The rows of data files still in the table: each (data file, its position delete files)
    read as `read_parquet` does, less the rows those delete files name (Iceberg v2 position
    deletes: file_path and pos columns, the data file spelled as the table's metadata spells it)."""
    rows = read_parquet(spark, [path for path, _deletes in files], schema, filesystem, file_column=file_column, position_column=position_column)
    delete_paths = sorted({path for _data, deletes in files for path in deletes})
    if not delete_paths:
        return rows
    deleted = read_parquet(spark, delete_paths, POSITION_DELETE_ARROW, filesystem)
    deleted = deleted.select(F.col("file_path").alias(file_column), F.col("pos").alias(position_column))
    return rows.join(deleted, [file_column, position_column], "left_anti")


def write_position_deletes(
    frame: DataFrame, file_column: str, position_column: str, directory: str, filesystem: object | None = None,
) -> list[tuple[str, str, int, int]]:
    """Iceberg position delete files under `directory` for the rows `frame` names (a data file's
    path, as the table's metadata spells it, and a row's place in it), as `write_delete_files`
    writes them, each data file's in one task."""
    frame = frame.select(F.col(file_column).alias("file_path"), F.col(position_column).alias("pos"))
    frame = frame.repartition("file_path").sortWithinPartitions("file_path", "pos")
    return [tuple(row) for row in frame.mapInArrow(bound(_write_deletes, directory, filesystem), DELETES_WRITTEN).collect()]


def _write_deletes(directory: str, filesystem, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:  # noqa: ANN001
    freeze_once()
    written = write_delete_files(batches, directory, filesystem)
    yield pa.RecordBatch.from_pylist([dict(zip(DELETES_WRITTEN_ARROW.names, file)) for file in written], schema=DELETES_WRITTEN_ARROW)


def write_delete_files(batches: Iterable[pa.RecordBatch], directory: str, filesystem: object | None) -> list[tuple[str, str, int, int]]:
    """Position delete files under `directory` for `batches` (file_path, pos; sorted by both):
    one file per data file, its positions in order, so a reader's bounds on file_path skip it for
    every other file. Returns each file's (path as `directory` spells it, the data file it
    applies to, rows, bytes)."""
    store, root = locate(filesystem, directory)
    return [
        (f"{directory}/{path.rsplit('/', 1)[1]}", key[0], rows, store.get_file_info(path).size)
        for path, rows, key in write_runs(batches, root, store, POSITION_DELETE_ARROW, ["file_path"], prefix="deletes")
    ]


def locate(filesystem, location: str) -> tuple:  # noqa: ANN001
    """(the pyarrow FileSystem, the path in it) of `location`: through `filesystem` when the
    caller gave one (an object store), otherwise as its URI says (a local or HDFS path Spark
    reaches itself)."""
    if filesystem is not None:
        return filesystem, _path(location)
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(location)


def delete_directory(directory: str, filesystem) -> None:  # noqa: ANN001 - a pyarrow FileSystem or None (local)
    """A job's own directory and its files (never handed off), as far as it can: orphan removal
    takes what is left."""
    from pyarrow import fs as pafs

    try:
        (filesystem or pafs.LocalFileSystem()).delete_dir(_path(directory))
    except (OSError, FileNotFoundError):
        pass


def _normal(path: str) -> str:
    return "/" + path.removeprefix("file:").lstrip("/")


def _path(location: str) -> str:
    """A location as a pyarrow FileSystem names it: without the scheme (bucket/key for S3)."""
    return location.split("://", 1)[1] if "://" in location else location


def freeze_once() -> None:
    """In a Spark Python worker (and the api, once started): move what its imports made out of the
    garbage collector's sight. PySpark's daemon runs gc.collect() after every task of a reused
    worker, which walks every object not frozen. Its first tasks import more than the first freeze saw (pandas, redis,
    asyncio: ~540 modules, ~58,000 objects, measured here), and the walk cost 23-79 ms a task under
    `make bench`, about 40% of the workers' busy time. So whenever a task finds modules imported
    since the last freeze, what is alive is collected and frozen again. That keeps the closures of
    those few tasks for good: a bounded cost, for imports stop after the first tasks. The api's
    ~250,000 objects of its imports cost each of its full collections ~130 ms, its event loop
    stopped meanwhile (ten in 24 s of `make bench-api`, 5% of its CPU); frozen, ~15 ms."""
    import gc

    if getattr(gc, "calve_frozen_at", None) != len(sys.modules):
        gc.collect()
        gc.freeze()
        gc.calve_frozen_at = len(sys.modules)


WORKER_CACHE_BYTES = 256 * 1024 * 1024  # what one Spark Python worker keeps of files it read (cached_read)


def cached_read(key: tuple, read: Callable[[], pa.Table]) -> pa.Table:
    """`read()`, kept by a Spark Python worker for the tasks it runs after this one (PySpark
    reuses its workers) under `key`, which must name content that never changes: a data or delete
    file's path (Iceberg never rewrites one in place) and what was read of it. Least recently
    used first out, beyond WORKER_CACHE_BYTES. The cache lives on a module of its own in
    sys.modules: this module comes by value with each task, its globals anew each time."""
    state = _worker_cache()
    table = state.tables.get(key)
    if table is not None:
        state.tables.move_to_end(key)
        return table
    table = read()
    state.tables[key] = table
    state.bytes += table.nbytes
    while state.bytes > WORKER_CACHE_BYTES and len(state.tables) > 1:
        _key, dropped = state.tables.popitem(last=False)
        state.bytes -= dropped.nbytes
    return table


def cache_ahead(reads: dict[tuple, Callable[[], pa.Table]], threads: int = 8) -> None:
    """Read what `reads` names that this worker does not keep yet, on `threads` threads, and keep
    it (cached_read then finds it). A run whose task lands on a worker that has not seen the
    table's recent files reads them all: one by one, that took up to 0.7 s of a run."""
    state = _worker_cache()
    missing = [key for key in reads if key not in state.tables]
    if len(missing) < 2:
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(missing))) as pool:  # pyarrow reads without the interpreter lock
        tables = list(pool.map(lambda key: reads[key](), missing))
    for key, table in zip(missing, tables, strict=True):
        cached_read(key, lambda table=table: table)


def _worker_cache() -> types.ModuleType:
    state = sys.modules.get("calve_worker_cache")
    if state is None:
        state = sys.modules["calve_worker_cache"] = types.ModuleType("calve_worker_cache")
        state.tables, state.bytes = OrderedDict(), 0
    return state


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` in `schema`: its columns in that order and those types, missing ones null."""
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        column = batch.column(index) if index >= 0 else pa.nulls(batch.num_rows, field.type)
        columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def runs(batch: pa.RecordBatch, keys: list[str]) -> Iterator[tuple[tuple, pa.RecordBatch]]:
    """Consecutive rows of `batch` with the same values of `keys`, with those values."""
    if not keys:
        yield (), batch
        return
    import pyarrow.compute as pc

    if batch.num_rows == 0:
        return
    changed = None
    for key in keys:
        codes = pc.dictionary_encode(batch.column(key), null_encoding="encode").indices
        differs = pc.not_equal(codes.slice(1), codes.slice(0, len(codes) - 1))
        changed = differs if changed is None else pc.or_(changed, differs)
    starts = [0, *(i + 1 for i in pc.indices_nonzero(changed).to_pylist()), batch.num_rows]
    for start, end in zip(starts, starts[1:]):
        part = batch.slice(start, end - start)
        yield tuple(part.column(key)[0].as_py() for key in keys), part


PARQUET_PER_JSON_BYTE = 0.25  # zstd Parquet of JSON-shaped events: roughly a quarter of the JSON


def rows_per_file(target_bytes: int | None, rows: int, json_bytes: int) -> int | None:
    """Rows per data file so that a file comes out near `target_bytes`, estimated from the JSON
    size of the batch's rows (the Parquet size is only known once written). None: no target."""
    if not target_bytes or not rows or not json_bytes:
        return None
    row_bytes = max(1.0, json_bytes / rows * PARQUET_PER_JSON_BYTE)
    return max(1, int(target_bytes / row_bytes))


# A column's dictionary stops growing at this size and the rest of its values are written plain: a
# dictionary pays for a column of a few values (a level, a service, a status), not for one of a
# value per row (a time, a message), which pyarrow's default limit (1 MiB) hashed into one anyway.
# make bench's plain rows, 37,000 to a file (a short-way task's), one process: 0.31 against 0.40 ms
# per 1,000 rows written, 0.71 against 0.93 MB; 10,000: 0.37 against 0.45 ms, 201 against 243 KB.
# Compaction (compact_job.py) writes the merged files with the default.
DICTIONARY_PAGE_BYTES = 16 << 10


def write_runs(batches: Iterable[pa.RecordBatch], directory: str, filesystem, schema: pa.Schema, keys: list[str],  # noqa: ANN001
               max_records: int | None = None, prefix: str = "part",
               described: Callable[[tuple], dict[str, str]] | None = None) -> list[tuple[str, int, tuple]]:
    """Write `batches` as zstd Parquet files in `schema` (other columns left out) under
    `directory` (as `filesystem` names it): a file per run of consecutive rows with the same
    `keys` values (rows sorted by them: one file per value), `max_records` rows per file at most.
    described: a file's key-value metadata from its keys' values. Returns each file's (path, rows,
    keys' values). Makes `directory` on a local file system."""
    import pyarrow.parquet as pq
    from pyarrow.fs import LocalFileSystem

    task = uuid.uuid4().hex
    written: list[tuple[str, int, tuple]] = []
    current: dict = {}

    def close() -> None:
        if current:
            current["writer"].close()
            written.append((current["path"], current["rows"], current["key"]))
            current.clear()

    for batch in batches:
        for key, part in runs(batch, keys):
            data = conform(part, schema)
            while data.num_rows:
                if not current or current["key"] != key or (max_records and current["rows"] >= max_records):
                    close()
                    if not written and isinstance(filesystem, LocalFileSystem):  # an object store has no directories to make
                        filesystem.create_dir(directory, recursive=True)
                    path = f"{directory}/{prefix}-{task}-{len(written):05d}.zstd.parquet"
                    file_schema = schema.with_metadata({**(schema.metadata or {}), **described(key)}) if described else schema
                    current.update(key=key, path=path, rows=0, writer=pq.ParquetWriter(
                        path, file_schema, filesystem=filesystem, compression="zstd", dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES))
                take = data.num_rows if not max_records else min(data.num_rows, max_records - current["rows"])
                current["writer"].write_batch(data.slice(0, take))
                current["rows"] += take
                data = data.slice(take)
    close()
    return written


def _arrow_writer(directory: str, filesystem, schema: pa.Schema, keys: list[str],  # noqa: ANN001
                  max_records: int | None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    return bound(_write, directory, filesystem, schema, keys, max_records)


def _write(directory: str, filesystem, schema: pa.Schema, keys: list[str], max_records: int | None,  # noqa: ANN001
           batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    freeze_once()
    written = write_runs(batches, directory, filesystem, schema, keys, max_records)
    yield pa.RecordBatch.from_pylist([{"path": path, "rows": rows} for path, rows, _key in written], schema=WRITTEN_ARROW)


def _arrow_reader(filesystem, schema: pa.Schema, output: pa.Schema, file_column: str | None,  # noqa: ANN001
                  position_column: str | None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    return bound(_read, filesystem, schema, output, file_column, position_column)


def _read(filesystem, schema: pa.Schema, output: pa.Schema, file_column: str | None, position_column: str | None,  # noqa: ANN001
          batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq

    for listing in batches:
        for path in listing.column(0).to_pylist():
            position = 0
            with filesystem.open_input_file(_path(path)) as stream:
                for batch in pq.ParquetFile(stream).iter_batches():
                    data = conform(batch, schema)
                    extra = []
                    if file_column:
                        extra.append(pa.array([path] * batch.num_rows, pa.string()))
                    if position_column:
                        extra.append(pa.array(range(position, position + batch.num_rows), pa.int64()))
                    position += batch.num_rows
                    yield pa.RecordBatch.from_arrays([*data.columns, *extra], schema=output)
