"""The short way for merge-on-read row changes: one Spark task does what changes_job.py does in
several Spark jobs, with pyarrow.

For a run of change entries of modest size (at most MAX_EVENTS events and MAX_CANDIDATES
candidate files) into a table whose partition transforms direct_append.py groups itself, one
task (`mapInArrow` over a one-row frame) reads the change files, reads only the identifier
columns of the candidate files with their position deletes applied, folds each key's events in
order exactly as changes_job.py does (`fold`), and writes the keys' new rows (one file per
partition value) and one position delete file per data file holding a row of a changed key. That
file also holds the positions of the data file's earlier delete files that name it alone, and
replaces them (the answer names them; the commit removes them): a data file keeps at most one
such delete file, as Iceberg v3 keeps one deletion vector per data file, so a reader opens one
delete file per data file however many changes it saw.
changes_job.py's own jobs each cost a Spark job's overhead and a trip of the rows through the
JVM; here the whole run is one task in one Python worker.

Whatever it cannot do, it does not start (`fits`); a failure leaves files behind only under
the two directories it was given, which the caller removes before running changes_job.py.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from spark_jobs.changes_job import EFFECTS, Applied
from spark_jobs.columns import OP, RECEIPT, SEQ
from spark_jobs.direct_append import _groups_by, write_partitioned
from spark_jobs.files import cache_ahead, cached_read, conform, freeze_once, locate, write_delete_files
from spark_jobs.targets import Target
from spark_jobs.task_code import bound

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MAX_EVENTS = 200_000  # change events in one run: more go to changes_job.py (its fold is distributed)
MAX_CANDIDATES = 5_000  # candidate files read by the one task
ANSWER = T.StructType([T.StructField("answer", T.StringType())])
ANSWER_ARROW = pa.schema([pa.field("answer", pa.string())])


def fits(events: int, candidates: int, target: Target) -> bool:
    """Whether this way takes the run (otherwise changes_job.py does)."""
    types = {field.name: field.type for field in target.schema}
    return (
        events <= MAX_EVENTS and candidates <= MAX_CANDIDATES
        and all(source in types and _groups_by(transform, types[source]) for source, transform in target.partition)
    )


def apply_in_one_task(
    spark: SparkSession, entries: list[list[str]], candidates: list[tuple[str, list[str]]], target: Target, keys: list[str], upsert: bool,
) -> Applied:
    """Merge-on-read changes as changes_job.apply_changes(merge_on_read=True) applies them: new
    rows under target.directory, position delete files under `<directory>-deletes`."""
    task = _task(entries, candidates, target, keys, upsert)
    started = time.perf_counter()
    (row,) = spark.range(0, 1, 1, 1).mapInArrow(task, ANSWER).collect()  # one partition: one task
    answer = json.loads(row.answer)
    seconds = answer["seconds"]
    seconds["spark"] = round(time.perf_counter() - started - sum(seconds.values()), 3)  # the job's own, around the task
    return Applied([], answer["counts"], answer["written"], [tuple(d) for d in answer["deletes"]], seconds)


def fold(ops: list[str], key_rows: list[tuple], exists: set[tuple], upsert: bool) -> tuple[list[str], dict[tuple, int]]:
    """Each event's effect (inserted, updated, deleted, noop), events in order, and for each key
    whose last state is a row, the index of the event that is that row. An insert sets the row,
    a delete clears it, an update replaces a row that exists (upsert: sets it either way)."""
    state: dict[tuple, bool] = {}
    last: dict[tuple, int] = {}
    effects = []
    for index, (op, key) in enumerate(zip(ops, key_rows)):
        before = state.get(key, key in exists)
        if op == "I":
            effects.append("updated" if before else "inserted")
            after = True
        elif op == "U":
            effects.append("updated" if before else ("inserted" if upsert else "noop"))
            after = before or upsert
        else:
            effects.append("deleted" if before else "noop")
            after = False
        state[key] = after
        last[key] = index
    return effects, {key: index for key, index in last.items() if state[key]}


def _task(entries: list[list[str]], candidates: list[tuple[str, list[str]]], target: Target, keys: list[str], upsert: bool,
          ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The run's task: `_run` with its arguments, its code pickled once per process (task_code.py)."""
    return bound(_run, entries, candidates, target.directory, target.filesystem, target.schema, list(target.partition), keys, upsert)


def _run(entries: list[list[str]], candidates: list[tuple[str, list[str]]], directory: str, filesystem, schema: pa.Schema,  # noqa: ANN001
         partition: list[tuple[str, str]], keys: list[str], upsert: bool, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for _batch in batches:
        pass  # the one row, read to the end: a worker that leaves its input unread is not reused
    freeze_once()
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[phase] = round(now - clock, 3)
        clock = now

    def read(path: str, columns: list[str] | None = None) -> pa.Table:
        store, where = locate(filesystem, path)
        return pq.read_table(where, columns=columns, filesystem=store)

    # The change events, in commit order (entries), then their place in the batch.
    tables = []
    for order, paths in enumerate(entries):
        for path in paths:
            table = read(path)
            tables.append(table.append_column("_order", pa.array([order] * table.num_rows, pa.int64())))
    changes = pa.concat_tables(tables, promote_options="permissive").sort_by([("_order", "ascending"), (SEQ, "ascending")])
    key_schema = pa.schema([schema.field(key) for key in keys])
    changed = pa.Table.from_batches([conform(b, key_schema) for b in changes.select(keys).to_batches()], key_schema)
    changed = changed.group_by(keys).aggregate([])
    lap("changes")

    # Rows of the candidates still live whose key changed: where they are, and their keys.
    # What is read of a data or delete file is kept by the worker for the next runs (the same
    # candidates come back run after run until compaction). A delete file is read once (another
    # engine's may apply to every file of a partition).
    def identifiers(path: str) -> pa.Table:
        data = read(path, keys)
        data = pa.table([data.column(k).cast(schema.field(k).type) for k in keys], names=keys)
        return data.append_column("pos", pa.array(range(data.num_rows), pa.int64())).combine_chunks()

    def positions_deleted(path: str) -> pa.Table:
        gone = read(path, ["file_path", "pos"])
        return pa.table([gone.column("file_path").cast(pa.string()), gone.column("pos").cast(pa.int64())], names=["file_path", "pos"])

    def positions_of(delete: str, path: str) -> pa.Table:
        """The positions of data file `path` that `delete` deletes (a file's part of a delete
        file kept by the worker, as the delete file is)."""
        def of() -> pa.Table:
            gone = cached_read(("deletes", delete), lambda: positions_deleted(delete))
            return gone.filter(pc.equal(gone.column("file_path"), path)).select(["pos"]).combine_chunks()

        return cached_read(("positions", delete, path), of)

    def named_alone(delete: str, path: str) -> pa.Table | None:
        """The delete file's positions, when it names data file `path` alone (Calve's own do;
        another engine's may name every file of a partition)."""
        gone = cached_read(("deletes", delete), lambda: positions_deleted(delete))
        return gone if gone.num_rows and positions_of(delete, path).num_rows == gone.num_rows else None

    def still_deleted(path: str, deletes: list[str]) -> pa.Array:
        """The positions of data file `path` that its delete files delete."""
        chunks = [chunk for delete in deletes for chunk in positions_of(delete, path).column("pos").chunks]
        return pa.concat_arrays(chunks) if chunks else pa.array([], pa.int64())

    # Each candidate's rows of a changed key, less those its delete files already took out:
    # per file, its positions looked up among that file's deleted positions (a join over
    # every hit file's deletes at once, on path and position, took up to 0.36 s a run).
    cache_ahead({
        **{("keys", path, str(key_schema)): (lambda path=path: identifiers(path)) for path, _deletes in candidates},
        **{("deletes", delete): (lambda delete=delete: positions_deleted(delete)) for _path, deletes in candidates for delete in deletes},
    })
    hits = []
    single = pa.concat_arrays(changed.column(keys[0]).chunks) if len(keys) == 1 and changed.num_rows else None
    for path, deletes in candidates:
        rows = cached_read(("keys", path, str(key_schema)), lambda path=path: identifiers(path))
        if single is not None:  # one identifier column: a set lookup, cheaper than a join
            found = rows.filter(pc.is_in(rows.column(keys[0]), value_set=single))
        else:
            found = rows.join(changed, keys, join_type="left semi")
        if found.num_rows and deletes:
            found = found.filter(pc.invert(pc.is_in(found.column("pos"), value_set=still_deleted(path, deletes))))
        if found.num_rows:
            hits.append(found.append_column("file_path", pa.array([path] * found.num_rows, pa.string())))
    lap("candidates")
    exists = set()
    for found in hits:
        exists.update(zip(*[found.column(k).to_pylist() for k in keys]))

    key_rows = list(zip(*[changes.column(k).to_pylist() for k in keys]))
    effects, rows = fold(changes.column(OP).to_pylist(), key_rows, exists, upsert)
    counts: dict[str, dict[str, int]] = {}
    for receipt, effect in zip(changes.column(RECEIPT).to_pylist(), effects):
        counted = counts.setdefault(receipt, dict.fromkeys(EFFECTS, 0))
        counted[effect] += 1

    lap("fold")
    new_rows = changes.take(sorted(rows.values()))
    new_rows = pa.Table.from_batches([conform(b, schema) for b in new_rows.to_batches()], schema)
    if new_rows.num_rows:
        store, root = locate(filesystem, directory)
        write_partitioned(new_rows, root, store, schema, partition)
    deleted = []
    if hits:
        # Each data file hit: one delete file of its new and its earlier positions, replacing
        # the earlier delete files that name it alone (they delete rows disjoint from the new).
        new = pa.concat_tables([found.select(["file_path", "pos"]) for found in hits])
        still_hit = set(new.column("file_path").unique().to_pylist())  # less those whose rows were all deleted before
        replaced: dict[str, list[str]] = {}
        earlier = []
        for path, deletes in candidates:
            if path in still_hit:
                for delete in deletes:
                    if (gone := named_alone(delete, path)) is not None:
                        replaced.setdefault(path, []).append(delete)
                        earlier.append(gone)
        positions = pa.concat_tables([new, *earlier])
        if earlier:  # once each, should two earlier delete files name one row
            positions = positions.group_by(["file_path", "pos"]).aggregate([])
        positions = positions.sort_by([("file_path", "ascending"), ("pos", "ascending")]).combine_chunks()
        deleted = [[*written, replaced.get(written[1], [])]
                   for written in write_delete_files(positions.to_batches(), f"{directory}-deletes", filesystem)]
        for path, data, *_rest in deleted:  # the next run that hits `data` finds its positions here, unread
            mine = cached_read(("deletes", path), lambda data=data: positions.filter(pc.equal(positions.column("file_path"), data)))
            cached_read(("positions", path, data), lambda mine=mine: mine.select(["pos"]).combine_chunks())
    lap("write")
    answer = {"counts": counts, "written": new_rows.num_rows, "deletes": deleted, "seconds": seconds}
    yield pa.RecordBatch.from_pylist([{"answer": json.dumps(answer)}], schema=ANSWER_ARROW)
