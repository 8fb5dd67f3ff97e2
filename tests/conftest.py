"""Fixtures against the real parts.

One redis-server and one Spark Connect server per test session (Spark takes ~20 s to start).
Each test that needs the running system gets its own data directory (catalog, warehouse,
metadata DB), a flushed Redis, and real `calve api|writer|committer` processes (tests/harness.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.harness import (  # noqa: F401 - re-exported for the test modules
    TEST_TOKEN,
    RedisServer,
    SparkServer,
    Stack,
    all_committed,
    assert_exactly_once,
    build_stack,
    make_settings,
    post_batches,
    wait_until,
)

# The files that take longest, longest first (the others follow in collection order). `make test`
# and `make test-long` hand whole files to their two workers (--dist loadfile) in this order
# (--no-loadscope-reorder; xdist's default order puts the files with the most tests first, the slow
# few-test files last): a long file started last keeps the run waiting on one worker. Seconds on a
# 2-core machine whose `make bench` baseline was 430,000-480,000 events/s, in make test (test-long).
LONGEST_FIRST = (
    "tests/integration/test_fast_way.py",  # ~265, estimated: 595 less two thirds of its examples (all of them: 595)
    "tests/chaos/test_chaos_tenants.py",  # (363)
    "tests/chaos/test_chaos.py",  # (338)
    "tests/integration/test_row_changes.py",  # 321
    "tests/integration/test_object_store.py",  # 150 with SeaweedFS's start
    "tests/integration/test_pipelines.py",  # 141
    "tests/integration/test_redis_cluster.py",  # 112
    "tests/api/test_contract.py",  # 105
    "tests/integration/test_spark_cluster.py",  # (99) and its cluster's start
    "tests/api/test_tenancy.py",  # 96
    "tests/integration/test_spine.py",  # 83
    "tests/integration/test_committer.py",  # 74
    "tests/integration/test_postgres_catalog.py",  # 66
    "tests/integration/test_writer.py",  # 62
    "tests/integration/test_compaction.py",  # 55
    "tests/integration/test_row_delta_ways.py",  # 55
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


LOG_TAIL_LINES = 80
LOG_TAIL_BYTES = 64 << 10  # read of each log's end, at most


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A failed test's report carries the end of each log of the stacks it started (the writer's,
    the committer's, the api's): their data directories are gone once the run ends, and a failure
    seen once under `make test`'s load is otherwise left without its story."""
    report = yield
    build = getattr(item, "funcargs", {}).get("stack_factory")
    if report.failed and build is not None:
        for number, stack in enumerate(build.stacks):
            for path in sorted(stack.data_dir.glob("*.log")):
                with open(path, "rb") as log:
                    log.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                    lines = log.read().decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                if lines:
                    report.sections.append((f"stack {number} {path.name} (last {len(lines)} lines)", "\n".join(lines)))
    return report


POSTGRES_ADMIN_URL = os.environ.get("CALVE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def postgres_database(prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL database (its SQLAlchemy URL), dropped afterwards; the test is skipped,
    saying why, when PostgreSQL is not reachable."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL} ({exc}); set CALVE_TEST_POSTGRES")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        from service.core.db import get_engine

        get_engine(f"{base}/{name}").dispose()
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty metadata DB on each backend; PostgreSQL is skipped (saying why) when unreachable."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'metadata.db'}"
        return
    with postgres_database("calve_test") as url:
        yield url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def spark_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkServer | None]:
    """The session's Spark Connect server; None when CALVE_TEST_SPARK_REMOTE points at another one."""
    if os.environ.get("CALVE_TEST_SPARK_REMOTE"):
        yield None
        return
    server = SparkServer(tmp_path_factory.mktemp("spark")).start()
    yield server
    # This process's sessions are closed first: their clients' exit hooks would otherwise ask the
    # stopped server to release them, retrying for minutes after the last test.
    from spark_jobs.session import close_sessions

    close_sessions()
    server.stop()


@pytest.fixture(scope="session")
def spark_remote(spark_server: SparkServer | None) -> str:
    return spark_server.remote if spark_server else os.environ["CALVE_TEST_SPARK_REMOTE"]


@pytest.fixture
def fresh_spark(spark_remote: str):  # noqa: ANN201
    """A Spark session that answers. An earlier test of this process may have left a session to a
    Spark server since restarted: start from a fresh one."""
    from spark_jobs.session import reset_session, spark_session

    def fresh():  # noqa: ANN202
        reset_session(spark_remote)
        try:
            spark = spark_session(spark_remote)
            spark.range(1).collect()
        except Exception:  # noqa: BLE001 - not answering yet: try again
            return None
        return spark

    return wait_until(fresh, timeout_s=60, what="a Spark session that answers")


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def stack_overrides() -> dict[str, str]:
    """Settings every stack of a test gets (a module overrides this: a Redis Cluster, ...)."""
    return {}


@pytest.fixture
def stack_factory(tmp_path: Path, redis_url: str, spark_remote: str, redis_client: redis.Redis, stack_overrides: dict[str, str]) -> Iterator:
    stacks: list[Stack] = []

    def build(roles: tuple[str, ...] = ("api", "writer", "committer"), **overrides: str) -> Stack:
        stack = build_stack(tmp_path, redis_url, spark_remote, redis_client, roles, **(stack_overrides | overrides))
        stacks.append(stack)
        return stack

    build.stacks = stacks  # for a failed test's report (pytest_runtest_makereport)
    yield build
    for stack in stacks:
        stack.stop(signal.SIGKILL)


@pytest.fixture
def stack(stack_factory) -> Stack:  # noqa: ANN001
    return stack_factory()


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator:
    """The api in this process (`TestClient(create_app(settings))`) on the session's Redis, a fresh
    metadata DB and catalog, as tenant demo's admin: for what needs no writer, committer or Spark."""
    from fastapi.testclient import TestClient
    from sqlmodel import Session

    from service.api.main import create_app
    from service.core.db import get_engine, migrate
    from service.tenancy.tenants import bootstrap

    data_dir = tmp_path_factory.mktemp("api")
    settings, _env = make_settings(data_dir, redis_url, "sc://127.0.0.1:1")
    migrate(settings.resolved_database_url())
    with Session(get_engine(settings.resolved_database_url())) as session:
        bootstrap(session, settings.data_path, TEST_TOKEN)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {TEST_TOKEN}"}) as client:
        yield client
