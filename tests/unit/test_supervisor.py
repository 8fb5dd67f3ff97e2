"""`calve up` starts what died again: a killed redis-server comes back on its port with its data,
after a pause that doubles while a process keeps failing. Real processes, killed for real."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from service.cli import processes
from service.cli.supervisor import Supervisor
from service.core.exceptions import StartupError
from service.core.metrics import PROCESS_RESTARTS
from tests.harness import wait_until


def restarts(name: str) -> float:
    return PROCESS_RESTARTS.labels(name)._value.get()


def test_a_killed_redis_server_is_started_again_on_its_port_with_its_data(tmp_path: Path) -> None:
    port = processes.free_port()
    supervisor = Supervisor()
    first = supervisor.start("redis", lambda: processes.start_redis(tmp_path, port, tmp_path / "redis.log"))
    try:
        client = redis.Redis(port=port)
        client.set("kept", "yes")
        client.bgrewriteaof()
        wait_until(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0, what="AOF rewritten")
        before = restarts("redis")
        first.send_signal(signal.SIGKILL)
        first.wait()
        supervisor.check()  # notices the death: starts it again after a pause
        assert supervisor.processes() == []
        wait_until(lambda: supervisor.check() or supervisor.processes(), timeout_s=30, what="redis-server started again")
        (_name, second), = supervisor.processes()
        assert second.pid != first.pid
        assert redis.Redis(port=port).get("kept") == b"yes", "the same port and the same data (its AOF)"
        assert restarts("redis") == before + 1
    finally:
        for _name, process in supervisor.processes():
            processes.stop(process, 5)


def test_a_process_that_keeps_failing_is_tried_again_less_and_less_often() -> None:
    starts: list[float] = []

    def start() -> subprocess.Popen:
        starts.append(time.monotonic())
        if len(starts) in (2, 3):
            raise StartupError("did not listen")
        return subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once

    supervisor = Supervisor()
    supervisor.start("writer-1", start)
    wait_until(lambda: supervisor.check() or len(starts) >= 4, timeout_s=30, interval_s=0.05, what="four starts")
    pauses = [b - a for a, b in zip(starts, starts[1:])]
    # Dead after 1 s pause; failed to start: 2 s; failed again: 4 s (each at least, never less).
    # The first pause also holds the time a loaded machine takes to start a Python that exits
    # (CI once saw 1.55 s): each pause may be a little longer, never shorter.
    assert all(want <= pause < want + 1.5 for pause, want in zip(pauses, [1, 2, 4], strict=True)), pauses
