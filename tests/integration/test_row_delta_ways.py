"""Merge-on-read row changes the one-task way (spark_jobs/row_delta_job.py) and the Spark jobs'
way (spark_jobs/changes_job.py) give the same answer: counts per receipt, new rows, and the
positions deleted, for random changes against data files some of whose rows earlier delete files
already deleted. Against a real Spark Connect server."""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.iceberg.files import list_data_files
from spark_jobs.changes_job import apply_changes
from spark_jobs.columns import OP, RECEIPT, SEQ
from spark_jobs.files import POSITION_DELETE_ARROW
from spark_jobs.row_delta_job import apply_in_one_task
from spark_jobs.session import tasks_at_most
from spark_jobs.targets import Target

pytestmark = pytest.mark.spark
# The random changes' seeds per case: make test tries 2 of each, make test-long (differential) all 6.
SEEDS = 6 if os.environ.get("CALVE_TEST_EXAMPLES", "") == "all" else 2

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("n", pa.int64())])
CHANGE_SCHEMA = SCHEMA.append(pa.field(OP, pa.string())).append(pa.field(SEQ, pa.int64())).append(pa.field(RECEIPT, pa.string()))


def table_files(rng: random.Random, where: Path) -> list[tuple[str, list[str]]]:
    """Three data files over keys 0..39 (a key may be in two of them, as an append pipeline can
    leave it), some rows already deleted by a delete file: (data file, its delete files)."""
    candidates = []
    for index in range(3):
        keys = rng.sample(range(40), rng.randint(5, 20))
        path = where / f"data-{index}.parquet"
        pq.write_table(pa.table({"id": keys, "name": [f"old{k}" for k in keys], "n": [0] * len(keys)}, SCHEMA), path)
        deletes = []
        gone = sorted(rng.sample(range(len(keys)), rng.randint(0, len(keys) // 2)))
        if gone:
            delete = where / f"deletes-{index}.parquet"
            pq.write_table(pa.table({"file_path": [path.as_uri()] * len(gone), "pos": gone}, POSITION_DELETE_ARROW), delete)
            deletes.append(delete.as_uri())
        candidates.append((path.as_uri(), deletes))
    return candidates


def change_entries(rng: random.Random, where: Path) -> list[list[str]]:
    """One to three entries of one or two change files each: random inserts, updates and deletes
    of keys 0..49 (some absent from the table), a key often changed several times."""
    entries = []
    for entry in range(rng.randint(1, 3)):
        paths = []
        for part in range(rng.randint(1, 2)):
            events = []
            for seq in range(rng.randint(1, 25)):
                op = rng.choice("IUD")
                key = rng.randrange(50)
                events.append({"id": key, "name": None if op == "D" else f"e{entry}-{part}-{seq}", "n": seq, OP: op, SEQ: part * 1000 + seq,
                               RECEIPT: f"r{entry}-{part}"})
            path = where / f"changes-{entry}-{part}.parquet"
            pq.write_table(pa.Table.from_pylist(events, CHANGE_SCHEMA), path)
            paths.append(path.as_uri())
        entries.append(paths)
    return entries


def positions(path: str) -> list[int]:
    return pq.read_table(path.removeprefix("file://")).column("pos").to_pylist()


def answer(applied, directory: str, candidates: list[tuple[str, list[str]]]) -> tuple:  # noqa: ANN001 - an Applied
    """What a way answered, in a form both ways share: counts, the new rows, the positions newly
    deleted. A delete file that replaces its data file's earlier ones (the one-task way's) must
    hold their positions too, and replace exactly the ones the data file had."""
    rows = Counter(tuple(sorted(row.items())) for path in list_data_files(directory) for row in pq.read_table(path.removeprefix("file://")).to_pylist())
    deleted = Counter()
    earlier = dict(candidates)
    for path, data_file, count, size, *replaced in applied.deletes:
        table = pq.read_table(path.removeprefix("file://"))
        assert set(table.column("file_path").to_pylist()) == {data_file} and table.num_rows == count and size > 0
        assert table.column("pos").to_pylist() == sorted(table.column("pos").to_pylist()), "positions in order"
        before = set()
        if replaced:
            assert sorted(replaced[0]) == sorted(earlier[data_file]), "the data file's earlier delete files, all replaced"
            before = {pos for delete in replaced[0] for pos in positions(delete)}
            assert before <= set(table.column("pos").to_pylist()), "their positions kept"
        deleted.update((data_file, pos) for pos in table.column("pos").to_pylist() if pos not in before)
    return applied.counts, applied.rows_written, rows, deleted


@pytest.mark.differential
@pytest.mark.parametrize(("upsert", "partition"), [(False, []), (True, []), (True, [("name", "truncate[2]")])])
def test_random_changes_give_the_same_answer_in_one_task_and_as_spark_jobs(
    fresh_spark, tmp_path: Path, upsert: bool, partition: list[tuple[str, str]],  # noqa: ANN001
) -> None:
    for seed in range(SEEDS):
        rng = random.Random(seed * 2 + upsert)
        where = tmp_path / f"{upsert}-{seed}"
        where.mkdir()
        candidates, entries = table_files(rng, where), change_entries(rng, where)
        answers = []
        for way in ("one-task", "spark-jobs"):
            directory = (where / way).as_uri()
            target = Target(name="people", schema=SCHEMA, required=frozenset({"id"}), partition=partition, directory=directory)
            if way == "one-task":
                applied = apply_in_one_task(fresh_spark, entries, candidates, target, ["id"], upsert)
            else:
                applied = apply_changes(fresh_spark, entries, candidates, target, ["id"], upsert, merge_on_read=True)
            answers.append(answer(applied, directory, candidates))
        assert answers[0] == answers[1], f"seed {seed}"
        assert answers[0][3], f"seed {seed}: some row was deleted"
        if partition:  # one partition value (the name's first two characters) per file of new rows
            for path in list_data_files((where / "one-task").as_uri()):
                assert len({name[:2] for name in pq.read_table(path.removeprefix("file://")).column("name").to_pylist()}) == 1, path


def test_changes_too_large_for_one_task_give_the_same_answer_run_at_most_tasks_at_once(fresh_spark, tmp_path: Path) -> None:  # noqa: ANN001
    """A run of changes the Spark jobs apply, bounded to one task at a time (tasks_at_most: a
    writer's compact_tasks, so that it leaves the writers' ingest a core), gives the unbounded
    run's answer. (That the bound holds: test_compaction's test of tasks_at_most.)"""
    rng = random.Random(7)
    candidates, entries = table_files(rng, tmp_path), change_entries(rng, tmp_path)
    answers = []
    for tasks in (None, 1):
        directory = (tmp_path / f"tasks-{tasks}").as_uri()
        target = Target(name="people", schema=SCHEMA, required=frozenset({"id"}), partition=[("name", "truncate[2]")], directory=directory)
        with tasks_at_most(fresh_spark, tasks):
            applied = apply_changes(fresh_spark, entries, candidates, target, ["id"], True, merge_on_read=True)
        answers.append(answer(applied, directory, candidates))
    assert answers[0] == answers[1] and answers[0][3]
