"""A snapshot's changes computed on Spark: a feed reader (api or committer) asks, a writer answers.

A snapshot that removed and added more rows than CALVE_FEED_SPARK_ROWS is diffed by a Spark job
(spark_jobs/diff_job.py) instead of in the reader's process: the reader pushes a DiffRequest on
the FEED_DIFFS list and waits on the snapshot's feed_diff_key hash, where the writer puts a
DiffResult: the Parquet files holding the snapshot's changes in the feed's order, or an error (the
reader then computes them itself). The result is kept for FEED_DIFF_TTL_S; its files live under
the table's data location and go with orphan removal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

REQUEST, RESULT = "request", "result"
FEED_DIFF_TTL_S = 6 * 3600


@dataclass(frozen=True)
class DiffRequest:
    tenant: str
    table: str
    snapshot_id: int
    schema_id: int
    request: str

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: bytes | str) -> DiffRequest:
        return cls(**orjson.loads(raw))


@dataclass(frozen=True)
class DiffResult:
    request: str
    files: list[str] = field(default_factory=list)
    rows: int = 0
    error: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: bytes | str) -> DiffResult:
        return cls(**orjson.loads(raw))
