"""`calve up`'s watch over what it started: a process that exits (a role, redis-server, the Spark
Connect server) is started again, after a pause that doubles while it keeps dying (1 s up to
RESTART_MAX_S), with an ERROR log line and calve_process_restarts_total counting each restart."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from service.core.exceptions import StartupError

log = logging.getLogger("calve")

RESTART_MAX_S = 60.0
STEADY_S = 60.0  # a process that ran this long before it died starts again after the first pause


@dataclass
class Child:
    name: str
    start: Callable[[], subprocess.Popen]
    process: subprocess.Popen | None = None
    started_at: float = field(default_factory=time.monotonic)
    failures: int = 0  # deaths (or failed starts) in a row, each within STEADY_S of its start
    restart_at: float | None = None  # when a dead one starts again


class Supervisor:
    def __init__(self) -> None:
        self.children: list[Child] = []

    def start(self, name: str, start: Callable[[], subprocess.Popen], process: subprocess.Popen | None = None) -> subprocess.Popen:
        """Start a process (or watch `process`, started already) and start it again when it exits."""
        child = Child(name, start, process or start())
        self.children.append(child)
        return child.process

    def processes(self) -> list[tuple[str, subprocess.Popen]]:
        return [(child.name, child.process) for child in self.children if child.process is not None]

    def check(self) -> None:
        """Notice deaths and start what is due again (the slow ones, Spark's ~20 s, block meanwhile)."""
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is None:
                if child.process is None or child.process.poll() is None:
                    continue
                child.failures = 1 if now - child.started_at >= STEADY_S else child.failures + 1
                child.restart_at = now + self._pause(child)
                log.error("%s exited with code %s; starting it again in %.0f s", child.name, child.process.returncode, child.restart_at - now)
                child.process = None
            elif now >= child.restart_at:
                self._restart(child)

    def _restart(self, child: Child) -> None:
        from service.core.metrics import PROCESS_RESTARTS

        PROCESS_RESTARTS.labels(child.name.split("-")[0]).inc()
        child.started_at = time.monotonic()
        try:
            child.process = child.start()
        except (StartupError, OSError) as exc:
            child.failures += 1
            child.restart_at = time.monotonic() + self._pause(child)
            log.error("%s did not start again (%s); trying again in %.0f s", child.name, exc, child.restart_at - time.monotonic())
            return
        child.restart_at = None
        log.warning("%s started again (restart after %d failure%s in a row)", child.name, child.failures, "s" if child.failures != 1 else "")

    @staticmethod
    def _pause(child: Child) -> float:
        return min(RESTART_MAX_S, 2.0 ** (child.failures - 1))
