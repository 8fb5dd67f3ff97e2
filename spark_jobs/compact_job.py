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

A file written as the task would write it (rewrite_run: the same Parquet schema, codec and
metadata, row groups of a busy writer's size) is not read at all: its row groups are copied
byte for byte, and only the footer is written anew. A busy table's rows are encoded once, by the
writer task that took them, whatever number of compactions merge their files later.
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
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.coerce import declared_not_null
from spark_jobs.columns import by_name
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
            declared_not_null(by_name(field.name), field.dataType).alias(field.name) if field.name in required else by_name(field.name)
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
    from pyarrow import fs as pafs

    freeze_once()
    if isinstance(filesystem, pafs.LocalFileSystem):  # an object store has no directories to make
        filesystem.create_dir(directory, recursive=True)
    for listing in batches:
        for run in listing.column(1).to_pylist():
            path = f"{directory}/part-{uuid.uuid4().hex}.zstd.parquet"
            try:
                layout = rewrite_run(run.split("\n"), schema, filesystem, path, deletes, required)
                rows = sum(count for _source, _start, count, _deleted in layout)
                if rows:
                    with filesystem.open_output_stream(path + layout_suffix) as out:
                        out.write(json.dumps(layout).encode())
            except BaseException:
                _delete(filesystem, path, path + layout_suffix)
                raise
            if not rows:  # every row of the run was deleted: no file for it
                filesystem.delete_file(path)
            yield pa.RecordBatch.from_pylist([{"path": path, "rows": rows}], schema=WRITTEN_ARROW)


def _delete(filesystem, *paths: str) -> None:  # noqa: ANN001
    for path in paths:
        try:
            filesystem.delete_file(path)
        except OSError:
            pass  # never written


# A file's row groups are copied as they are (rewrite_run) only where they hold this many rows on
# average: a file of many tiny row groups (a quiet producer's files, a few events each) would cost
# its readers per row group, and re-encoding so few rows costs little. A busy table's files, whose
# rewriting is most of compaction's cost, hold a writer task's rows each (make bench: ~35,000).
COPIED_ROW_GROUP_ROWS = 16 * 1024
_COPY_BYTES = 8 << 20  # bytes copied at a time: memory stays bounded whatever a file's size
_ZSTD = 6  # Parquet's CompressionCodec: the codec every output is written in (its name says so)


def rewrite_run(sources: list[str], schema: pa.Schema, filesystem, path: str, deletes: dict[str, list[str]],  # noqa: ANN001
                required: list[str]) -> list[list]:
    """Write the rows of `sources`, in order, as one Parquet file at `path` in `schema`, less the
    rows their position delete files (`deletes`, per source) delete; each source's [path, first
    row's place, rows, positions left out] (the copy's layout, folding.py).

    A source written alike (copyable: in the Parquet schema this writes for `schema`, field ids
    included, in zstd, without deletes, page indexes, bloom filters or encryption, its row groups of
    COPIED_ROW_GROUP_ROWS rows or more on average, and with the key-value metadata of the first
    source copied) has its row groups copied byte for byte: nothing is decoded or encoded again,
    at a twenty-fifth of the CPU or less (a compaction task over 30 files of 35,000 of make bench's
    rows, one process: 0.014-0.023 against 0.54-0.62 ms per 1,000 rows). The rows of any other source are read in `schema` (a column added since reads as
    null) and encoded into row groups of up to ROW_GROUP_ROWS, in their place among the copied
    ones. The footer lists every row group where it now is (fastparquet's Thrift codec reads and
    writes footers); its key-value metadata is the copied sources' (a bucket's number: a run is
    one partition's), else what pyarrow writes for `schema`."""
    out = _Spliced(filesystem.open_output_stream(path))
    rewritten = _parquet_schema(schema)
    layout, encoding = [], _Encoding(schema)
    try:
        for source in sources:
            with filesystem.open_input_file(_path(source)) as stream:
                footer = None if source in deletes else _copyable(_footer(stream), rewritten, out.metadata)
                if footer is not None:
                    out.append(encoding.written())  # the rows before it first
                    start = out.rows
                    layout.append([source, start, out.copy(stream, footer), []])
                    continue
                deleted = deleted_positions(source, deletes[source], filesystem) if source in deletes else None
                start, offset = encoding.rows + out.rows, 0
                for batch in _batches(stream):
                    if deleted is not None and len(deleted):
                        place = np.arange(offset, offset + batch.num_rows)
                        offset += batch.num_rows
                        batch = batch.filter(pa.array(~np.isin(place, deleted, assume_unique=True)))
                    data = conform(batch, schema)
                    for name in required:
                        if data.column(name).null_count:
                            raise ValueError(f"required column {name!r} is null in {source}")
                    if encoding.add(data) >= ROW_GROUP_ROWS:
                        out.append(encoding.written())
                layout.append([source, start, encoding.rows + out.rows - start, [] if deleted is None else deleted.tolist()])
        out.append(encoding.written())
        out.close()
    except BaseException:
        out.stream.close()
        raise
    return layout


def _batches(stream) -> Iterator[pa.RecordBatch]:  # noqa: ANN001
    import pyarrow.parquet as pq

    return pq.ParquetFile(stream).iter_batches(batch_size=65536)


class _Encoding:
    """Rows waiting to be encoded (rewrite_run): written as a Parquet file of their own in memory,
    whose row groups are then copied like any source's."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema, self.batches, self.rows = schema, [], 0

    def add(self, batch: pa.RecordBatch) -> int:
        self.batches.append(batch)
        self.rows += batch.num_rows
        return self.rows

    def written(self) -> bytes | None:
        """The rows waiting as a Parquet file (None for none), and none waiting after."""
        import pyarrow.parquet as pq

        if not self.rows:
            return None
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, self.schema, compression="zstd") as writer:
            writer.write_table(pa.Table.from_batches(self.batches, schema=self.schema), row_group_size=ROW_GROUP_ROWS)
        self.batches, self.rows = [], 0
        return sink.getvalue().to_pybytes()


class _Spliced:
    """A Parquet file made of other files' row groups, copied as they are: `copy` a file's,
    `append` an encoded file's, then `close` writes the footer listing them where they now are."""

    def __init__(self, stream) -> None:  # noqa: ANN001
        self.stream = stream
        self.stream.write(b"PAR1")
        self.offset, self.rows, self.groups = 4, 0, []
        self.footer = None  # the first footer copied from: the output's, but for its row groups
        self.metadata = None  # the key-value metadata of the first source copied (None: none copied yet)
        self.encoded_footer = None  # the first encoded file's footer, used where no source was copied

    def copy(self, stream, footer) -> int:  # noqa: ANN001
        """Copy the row groups `footer` lists from `stream` (a source's file); its rows."""
        if self.footer is None:
            self.footer, self.metadata = footer, footer.key_value_metadata
        return self._copied(stream, footer)

    def append(self, data: bytes | None) -> None:
        """Copy the row groups of an encoded Parquet file (`_Encoding.written`; None: none)."""
        if data is None:
            return
        reader = pa.BufferReader(data)
        footer = _footer(reader)
        if self.encoded_footer is None:
            self.encoded_footer = footer
        self._copied(reader, footer)

    def _copied(self, stream, footer) -> int:  # noqa: ANN001
        rows = 0
        for group in footer.row_groups or []:
            firsts = [_first_page(column.meta_data) for column in group.columns]
            start = min(firsts)
            end = max(first + column.meta_data.total_compressed_size for first, column in zip(firsts, group.columns))
            for at in range(start, end, _COPY_BYTES):
                self.stream.write(stream.read_at(min(_COPY_BYTES, end - at), at))
            moved = self.offset - start
            for column in group.columns:
                data = column.meta_data
                data.data_page_offset += moved
                if data.dictionary_page_offset is not None:
                    data.dictionary_page_offset += moved
                if data.index_page_offset is not None:
                    data.index_page_offset += moved
                if column.file_offset:  # (deprecated; 0 where a writer leaves it unset)
                    column.file_offset += moved
            if group.file_offset is not None:
                group.file_offset += moved
            group.ordinal = len(self.groups)
            self.groups.append(group)
            self.offset += end - start
            rows += group.num_rows
        self.rows += rows
        return rows

    def close(self) -> None:
        footer = self.footer or self.encoded_footer
        if footer is not None:  # (no rows at all: the caller deletes the file)
            footer.row_groups, footer.num_rows = self.groups, self.rows
            written = bytes(footer.to_bytes())
            self.stream.write(written + len(written).to_bytes(4, "little") + b"PAR1")
        self.stream.close()


def _parquet_schema(schema: pa.Schema):  # noqa: ANN202 - fastparquet's Thrift objects
    """The Parquet schema (its Thrift elements) pyarrow writes for `schema`."""
    import pyarrow.parquet as pq

    empty = pa.BufferOutputStream()
    pq.ParquetWriter(empty, schema).close()
    return _footer(pa.BufferReader(empty.getvalue())).schema


def _copyable(footer, rewritten, metadata):  # noqa: ANN001, ANN202 - fastparquet's Thrift objects
    """`footer` where its file's row groups can be copied as they are (see rewrite_run), else None.
    `metadata`: the key-value metadata of the sources copied so far (None: none yet)."""
    if footer is None or footer.schema != rewritten or footer.encryption_algorithm is not None:
        return None
    if metadata is not None and footer.key_value_metadata != metadata:
        return None
    groups = footer.row_groups or []
    if not groups or footer.num_rows < COPIED_ROW_GROUP_ROWS * len(groups):
        return None
    if any(column.offset_index_offset is not None or column.column_index_offset is not None or column.crypto_metadata is not None
           or column.meta_data.bloom_filter_offset is not None or not _first_page(column.meta_data) or column.meta_data.codec != _ZSTD
           for group in groups for column in group.columns):
        return None
    return footer


def _first_page(data) -> int | None:  # noqa: ANN001
    """Where a column chunk starts: its dictionary page if it has one, else its first data page;
    None where its offsets are not in order (a writer that set an absent dictionary's to 0)."""
    dictionary, first = data.dictionary_page_offset, data.data_page_offset
    if dictionary is None:
        return first if first > 0 else None
    return dictionary if 0 < dictionary < first else None


def _footer(stream):  # noqa: ANN001, ANN202 - a pyarrow NativeFile; fastparquet's Thrift object
    """A Parquet file's footer (fastparquet's Thrift FileMetaData); None where it is no Parquet file."""
    from fastparquet.cencoding import from_buffer

    size = stream.size()
    tail = stream.read_at(8, size - 8) if size >= 12 else b""
    if tail[4:] != b"PAR1":
        return None
    length = int.from_bytes(tail[:4], "little")
    return from_buffer(stream.read_at(length, size - 8 - length), "FileMetaData")
