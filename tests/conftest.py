"""Fixtures against the real parts.

One redis-server and one Spark Connect server per test session (Spark takes ~20 s to start).
Each test that needs the running system gets its own data directory (catalog, warehouse,
metadata DB), a flushed Redis, and real `calve api|writer|committer` processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from sqlmodel import Session

from service import processes
from service.catalog import get_catalog, load_table
from service.core.config import Settings
from service.core.db import get_engine, migrate
from service.tenants import bootstrap

TEST_TOKEN = "calve_test-token-not-a-secret-0123456789abcdef"
POSTGRES_ADMIN_URL = os.environ.get("CALVE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty metadata DB on each backend; PostgreSQL is skipped (saying why) when unreachable."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'metadata.db'}"
        return
    import psycopg

    name = f"calve_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL} ({exc}); set CALVE_TEST_POSTGRES")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    yield f"{base}/{name}"
    from service.core.db import get_engine

    get_engine(f"{base}/{name}").dispose()
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("redis")
    port = processes.free_port()
    server = processes.start_redis(base, port, base / "redis.log")
    yield f"redis://127.0.0.1:{port}/0"
    processes.stop(server, 10)


@pytest.fixture(scope="session")
def spark_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("CALVE_TEST_SPARK_REMOTE"):
        yield os.environ["CALVE_TEST_SPARK_REMOTE"]
        return
    base = tmp_path_factory.mktemp("spark")
    port = processes.free_port()
    server = processes.start_spark_connect(port, "3g", base, base / "spark-connect.log")
    yield f"sc://127.0.0.1:{port}"
    processes.stop(server, 15)


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.flushall()
    client.close()


@dataclass
class Stack:
    """A running Calve (api, writer, committer processes) on the session's Redis and Spark."""

    data_dir: Path
    env: dict[str, str]
    settings: Settings
    redis: redis.Redis
    port: int
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str | None = TEST_TOKEN, port: int | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        base = f"http://127.0.0.1:{port}" if port else self.url
        return httpx.Client(base_url=base, headers=headers, timeout=120)

    def start(
        self, role: str, name: str | None = None, port: int | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        """Start a role process; an api on another `port` is a second replica; `env` adds variables."""
        log = open(self.data_dir / f"{name or role}.log", "ab")  # noqa: SIM115
        env = self.env | ({"CALVE_PORT": str(port)} if port else {}) | (env or {})
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", role], env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[name or role] = proc
        if role == "api":
            processes.wait_for_port(port or self.port, 60, proc, "api", self.data_dir / f"{name or role}.log")
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(30)

    def catalog(self):  # noqa: ANN201
        return get_catalog(self.settings.resolved_catalog_uri(), self.settings.resolved_warehouse())

    def rows(self, table: str = "logs", tenant: str = "demo") -> list[dict]:
        loaded = load_table(self.catalog(), tenant, table)
        return [] if loaded is None else loaded.scan().to_arrow().to_pylist()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


def make_settings(data_dir: Path, redis_url: str, spark_remote: str, **overrides: str) -> tuple[Settings, dict[str, str]]:
    env = {
        "CALVE_DATA_DIR": str(data_dir),
        "CALVE_REDIS_URL": redis_url,
        "CALVE_SPARK_REMOTE": spark_remote,
        "CALVE_PORT": str(processes.free_port()),
        "CALVE_COMMIT_INTERVAL_S": "0.5",
        "CALVE_WRITER_BATCH_WAIT_S": "0.2",
        "CALVE_WRITER_CLAIM_IDLE_S": "5",
        "CALVE_LEASE_S": "3",
        **overrides,
    }
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CALVE_")} | env
    settings = Settings(**{k.removeprefix("CALVE_").lower(): v for k, v in env.items()})
    return settings, full_env


@pytest.fixture
def stack_factory(tmp_path: Path, redis_url: str, spark_remote: str, redis_client: redis.Redis) -> Iterator:
    stacks: list[Stack] = []

    def build(roles: tuple[str, ...] = ("api", "writer", "committer"), **overrides: str) -> Stack:
        settings, env = make_settings(tmp_path, redis_url, spark_remote, **overrides)
        migrate(settings.resolved_database_url())
        with Session(get_engine(settings.resolved_database_url())) as session:
            bootstrap(session, settings.data_path, TEST_TOKEN)
        stack = Stack(tmp_path, env, settings, redis_client, settings.port)
        stacks.append(stack)
        for role in roles:
            stack.start(role)
        return stack

    yield build
    for stack in stacks:
        stack.stop()


@pytest.fixture
def stack(stack_factory) -> Stack:  # noqa: ANN001
    return stack_factory()


def wait_until(predicate, timeout_s: float = 60, interval_s: float = 0.25, what: str = "condition"):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def post_batches(stack: Stack, batches: int, per_batch: int, prefix: str) -> list[str]:
    """POST `batches` NDJSON requests of events with unique ids; returns their receipts."""
    import orjson

    receipts = []
    with stack.client() as http:
        for b in range(batches):
            body = b"\n".join(orjson.dumps({"id": f"{prefix}-{b}-{i}", "b": b}) for i in range(per_batch))
            answer = http.post("/logs", content=body, headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 202, answer.text
            receipts.append(answer.json()["receipt"])
    return receipts


def all_committed(stack: Stack, receipts: list[str]) -> bool:
    with stack.client() as http:
        return all(http.get(f"/v1/receipts/{r}").json()["status"] == "committed" for r in receipts)


def assert_exactly_once(stack: Stack, expected: int) -> None:
    """Every id once, `expected` of them, and no data file committed twice."""
    import collections

    counts = collections.Counter(row["id"] for row in stack.rows())
    duplicated = {k: v for k, v in counts.items() if v > 1}
    assert not duplicated, f"duplicated rows: {list(duplicated.items())[:5]}"
    assert len(counts) == expected
    table = stack.catalog().load_table(("demo", "logs"))
    paths = table.inspect.files().column("file_path").to_pylist()
    assert len(paths) == len(set(paths)), "a data file was committed twice"
