"""The embedded Spark Connect server `calve up` starts (service/cli/main.py start_spark), as it runs."""

from __future__ import annotations

from pathlib import Path

from service.cli import processes
from service.cli.main import start_spark
from service.core.config import Settings


def _threads(pid: int) -> set[str]:
    return {(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()}


def test_the_embedded_spark_jvm_collects_garbage_with_the_parallel_collector(tmp_path: Path) -> None:
    """CALVE_SPARK_JAVA_OPTIONS (default: the parallel collector) reaches the Connect server's JVM:
    without it, a machine of two cores or more runs G1, whose concurrent threads (named `G1 ...`)
    spent more of the short way's CPU (README, "The Spark JVM's collector")."""
    settings = Settings(data_dir=tmp_path, spark_driver_memory="1g")
    assert "-XX:+UseParallelGC" in settings.spark_java_options.split()
    _cluster, start_connect = start_spark(settings, tmp_path)
    server = start_connect()
    try:
        threads = _threads(server.pid)  # spark-submit execs the JVM in the process it started
        assert b"-XX:+UseParallelGC" in Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        assert any(name.startswith("GC Thread") for name in threads), sorted(threads)
        assert not [name for name in threads if name.startswith("G1 ")], sorted(threads)
    finally:
        processes.stop(server, 15)
