"""Settings, read once from the environment (prefix CALVE_)."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CALVE_", extra="ignore")

    data_dir: Path = Path("./data")
    host: str = "127.0.0.1"
    port: int = 8000
    # `calve up` runs this many api processes, accepting on one listening socket it binds (an api
    # process parses and converts bodies in one interpreter: one core at most); see the README.
    api_processes: int = Field(default=2, ge=1)
    api_socket_fd: int | None = None  # set by `calve up`: the inherited listening socket to serve on

    # External services; when unset, `calve up` starts embedded ones under data_dir.
    redis_url: str | None = None
    redis_cluster: bool = False  # redis_url names a node of a Redis Cluster
    spark_remote: str | None = None
    catalog_uri: str | None = None
    warehouse: str | None = None
    database_url: str | None = None
    catalog_type: str | None = None  # pyiceberg's catalog type, when the URI does not say it
    catalog_properties: dict[str, str] = Field(default_factory=dict)  # more catalog properties (JSON)
    catalog_busy_timeout_ms: int = 30_000  # SQLite catalog: how long a commit waits for a lock

    bootstrap_token: str | None = None
    redis_max_connections: int = 64  # per api process
    metrics_port: int = 0  # writer/committer run alone: serve /metrics here (0: off)
    auth_cache_s: float = 5.0
    pipeline_cache_s: float = 2.0  # how long an api or writer keeps a looked-up pipeline

    # Embedded Spark Connect server. With spark_workers > 0, `calve up` also starts a Spark
    # standalone master and that many workers (each offering spark_worker_cores and
    # spark_worker_memory to one executor), and the jobs run on their executors instead of in
    # the Connect server's own JVM.
    spark_driver_memory: str = "4g"
    # The embedded Spark JVMs' options (the Connect server's driver, and a cluster's executors):
    # the parallel collector, whose pauses stop the JVM briefly but which spends less CPU than
    # G1's concurrent threads (the JVM's choice on a machine of two cores or more) on the short
    # way's many small jobs (README, "The Spark JVM's collector").
    spark_java_options: str = "-XX:+UseParallelGC"
    spark_port: int = 0  # 0: pick a free port
    spark_workers: int = Field(default=0, ge=0)
    spark_worker_cores: int = Field(default=1, ge=1)
    spark_worker_memory: str = "2g"
    spark_ui_port: int = 0  # the Connect server's web UI and REST API, in cluster mode (0: pick a free port)
    # The short way's Spark tasks read the requests' bodies from Redis themselves (only entry ids
    # travel with the job, not the bodies through Spark's JVM): at redis_url, or at
    # spark_redis_url where Spark's executors reach Redis by another address. Where they cannot
    # reach it, a batch's try turns this off for 5 minutes (logged) and ships the bodies; false:
    # always ship them (a managed Spark outside Redis's network).
    spark_reads_redis: bool = True
    spark_redis_url: str | None = None

    # Ingest limits.
    max_body_bytes: int = 10 * 1024 * 1024
    max_decompressed_bytes: int = 10 * 1024 * 1024
    max_events_per_request: int = 100_000
    # Per-tenant defaults; a tenant's own values (metadata DB) override them.
    max_events_per_s: int = 200_000
    max_bytes_per_s: int = 64 * 1024 * 1024
    rate_burst_s: float = 2.0
    max_backlog_events: int = 5_000_000
    # A slow client holds a connection and a worker for nothing: the request line and headers
    # must arrive within header_timeout_s (408), the whole body within body_timeout_s (408).
    header_timeout_s: float = Field(default=10.0, gt=0)
    max_header_bytes: int = Field(default=64 * 1024, gt=1024)
    body_timeout_s: float = Field(default=60.0, gt=0)
    wait_timeout_s: float = 30.0
    max_wait_timeout_s: float = 300.0
    # A receipt costs Redis ~330 bytes (a committed one of one table, key and fields: MEMORY
    # USAGE) for as long as it is kept: requests/s x this. At make bench's ~180 requests/s, by that
    # arithmetic, a day is ~5 GB and seven days ~36 GB (README "Configuration"). As long as the idempotency
    # window: a retry inside it is answered with a receipt that can still be read.
    receipt_ttl_s: int = Field(default=24 * 3600, ge=60)
    idempotency_window_s: int = Field(default=24 * 3600, ge=1)

    # Fields a table may hold at any depth (each struct field, list element, map key and value
    # counts, as Iceberg gives each an id), when a writer creates it from events or evolves it;
    # new fields beyond go to the sink's extra_fields column, or are named as dropped. A batch's
    # Spark job costs ~17 ms per column here (a 1,000-column batch ~17 s): see the README.
    max_table_columns: int = Field(default=1000, ge=10)

    # Live pipelines a tenant may have (POST /v1/pipelines answers 422 beyond): each costs every
    # api and writer a lookup and a parsed definition, and GET /v1/pipelines lists them all.
    max_pipelines_per_tenant: int = Field(default=100, ge=1)

    # Writer batching: a batch closes at whichever limit comes first. A busy stream's batch (at
    # least an eighth of writer_batch_fill_events by writer_batch_wait_s) waits on, up to
    # writer_batch_max_wait_s, until it holds writer_batch_fill_events: each Spark job costs its
    # JVM, the writer and the committer ~0.1-0.15 CPU-s whatever it holds (see the README).
    writer_batch_events: int = 200_000
    writer_batch_bytes: int = 48 * 1024 * 1024
    writer_batch_wait_s: float = 0.25
    writer_batch_fill_events: int = Field(default=60_000, ge=0)
    writer_batch_max_wait_s: float = Field(default=0.6, ge=0)
    # The short way's Spark job gets one task per this many bytes of request bodies (at least one,
    # at most one per request, at most what the Spark server's parallelism would give): each task
    # costs the Spark JVM and a Python worker ~40 ms of CPU whatever it holds, and the writers
    # already run one job each at a time, side by side. See the README, "The short way".
    writer_task_bytes: int = Field(default=16 * 1024 * 1024, ge=1024 * 1024)
    writer_claim_idle_s: float = 60.0

    # Committer.
    # A table's handed-off files wait at most commit_interval_s for their commit; while its leader
    # is idle they are committed sooner, at least commit_min_interval_s (and the last commit's
    # duration) after the table's last commit. Equal to commit_interval_s: once per interval.
    commit_interval_s: float = Field(default=1.0, gt=0)
    commit_min_interval_s: float = Field(default=0.2, ge=0)
    commit_max_entries: int = 500
    commit_retries: int = 8
    # A table whose commits fail this many times in a row (not for an unreachable catalog or a
    # conflict) has its pending entries committed one by one; those failing alone are parked.
    commit_max_failures: int = Field(default=5, ge=1)
    lease_s: float = 10.0
    # Table upkeep, by each table's leader every upkeep_interval_s: snapshots older than
    # snapshot_max_age_s, or beyond the newest snapshot_max_count, are expired (never the newest
    # snapshot_min_count), and the files only they referenced deleted.
    upkeep_interval_s: float = Field(default=60.0, gt=0)
    snapshot_max_age_s: float = Field(default=3600.0, gt=0)
    snapshot_max_count: int = Field(default=100, ge=1)
    snapshot_min_count: int = Field(default=5, ge=1)
    # Compaction, planned with the other upkeep: a partition where a reader opens compact_min_files
    # files for its small files (below 3/4 of the target size; each small file and each of its
    # position delete files counted), or small files adding up to the target, is rewritten by a
    # writer's Spark job into files near the target (a table's write.target-file-size-bytes, set
    # from its sink's target_file_size, wins over compact_target_file_bytes); at most
    # compact_max_bytes per request; a small file's position deletes are folded in as it is copied.
    # A request not answered within compact_timeout_s is planned again.
    compact_target_file_bytes: int = Field(default=128 * 1024 * 1024, ge=1024 * 1024)
    compact_min_files: int = Field(default=10, ge=2)
    compact_max_bytes: int = Field(default=1024 * 1024 * 1024, ge=1024 * 1024)
    compact_timeout_s: float = Field(default=900.0, gt=0)
    # A compaction's Spark tasks (each copies a run of files into one output file) run at most
    # compact_tasks at once: Spark runs one application's jobs first come, first served, so a
    # compaction of four outputs on local[*]'s two cores left the ingest jobs none for seconds
    # (make bench: no append committed for 2.8 s; wait=true p99 2.5-3.6 s against 1.0-1.1 s).
    # The same bound holds the stages of a leader's other Spark jobs: a run of changes too large
    # for one task, a feed's diff of a large snapshot (spark_jobs/session.py tasks_at_most).
    compact_tasks: int = Field(default=1, ge=1)
    # A partition no file has been added to for compact_cold_after_s is cold: two of its small
    # files are enough to merge them (by size tier), not compact_min_files.
    compact_cold_after_s: float = Field(default=3600.0, gt=0)
    # Merge-on-read: a data file whose position deletes delete compact_deleted_share of its rows,
    # or that has compact_delete_files delete files, is rewritten with its deletes applied (folded
    # in) at the next upkeep, whatever its size; its delete files go with it.
    compact_deleted_share: float = Field(default=0.3, gt=0, le=1)
    compact_delete_files: int = Field(default=10, ge=1)
    # Row changes wait for a writer to apply them; a request not answered within apply_timeout_s
    # (its writer crashed) is asked again.
    apply_timeout_s: float = Field(default=300.0, gt=0)
    # Snapshots a change feed consumer has not read past are kept by expiry while they are younger
    # than consumer_max_lag_s; after that they go, and the consumer must start again (it lags).
    # Each kept snapshot costs every commit a little (its metadata is rewritten): keep this short.
    consumer_max_lag_s: float = Field(default=3600.0, gt=0)
    # A snapshot that removed and added at least this many rows has its changes computed on Spark
    # by a writer (waited for up to feed_diff_timeout_s), not in the api or committer reading them.
    feed_spark_rows: int = Field(default=1_000_000, ge=1)
    feed_diff_timeout_s: float = Field(default=300.0, gt=0)
    # Every orphan_interval_s, files in a table's data location that nothing references and that
    # are older than orphan_min_age_s are deleted.
    orphan_interval_s: float = Field(default=3600.0, gt=0)
    orphan_min_age_s: float = Field(default=24 * 3600.0, ge=0)
    shutdown_grace_s: float = 30.0
    # Files written elsewhere (POST /v1/tables/{name}/files): at most registration_max_files per
    # call, each footer at most registration_max_footer_bytes; a file's path (and its caller's
    # deduplication key) is remembered for registration_dedup_ttl_s, after which only the table
    # itself stops a second registration (a file it still lists). Tenants register from their
    # table's own data location and from the landing prefixes granted here (JSON: tenant -> URIs).
    registration_max_files: int = Field(default=1000, ge=1)
    # Processes the api checks registered files' footers in (service/api/footers.py), niced.
    registration_processes: int = Field(default=2, ge=1, le=64)
    registration_max_footer_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    registration_dedup_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    landing_prefixes: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("catalog_properties", "landing_prefixes", mode="before")
    @classmethod
    def _properties_json(cls, value: object) -> object:
        # From the environment pydantic-settings parses the JSON; given as a value, it is parsed here.
        return json.loads(value) if isinstance(value, str) else value

    @property
    def data_path(self) -> Path:
        # Every request that opens the catalog asks for it: realpath's lstat calls were ~7% of the
        # api's samples under one-file registrations, so each directory is resolved once.
        return _resolved(self.data_dir, None if self.data_dir.is_absolute() else os.getcwd())

    def resolved_catalog_uri(self) -> str:
        return self.catalog_uri or f"sqlite:///{self.data_path / 'catalog.db'}"

    def resolved_warehouse(self) -> str:
        return self.warehouse or (self.data_path / "warehouse").as_uri()

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_path / 'calve.db'}"


def get_settings() -> Settings:
    return Settings()


@lru_cache(maxsize=64)
def _resolved(path: Path, cwd: str | None) -> Path:
    """`path` resolved (relative to `cwd`, for a relative one: the cache key)."""
    return (Path(cwd) / path if cwd else path).resolve()
