"""The api's HTTP server: uvicorn, with a drain on shutdown."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

from service.core.config import Settings


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM/SIGINT: refuse new ingest requests (503) and report not ready, let the
    requests in flight finish (a wait=true request holds its answer until its commit), then stop.
    A second signal stops at once."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        # Keep-alive longer than a typical load balancer's idle timeout (60 s), so the server is
        # not the side that closes a connection a client is about to reuse.
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level="warning", access_log=False, timeout_keep_alive=75
        )
        super().__init__(config)
        self.app = app
        self.grace_s = settings.shutdown_grace_s

    def handle_exit(self, sig: int, frame) -> None:  # noqa: ANN001 - signal handler signature
        state = self.app.state
        if getattr(state, "draining", False):
            super().handle_exit(sig, frame)
            return
        state.draining = True
        threading.Thread(target=self._drain_then_exit, args=(sig, frame), daemon=True).start()

    def _drain_then_exit(self, sig: int, frame) -> None:  # noqa: ANN001
        deadline = time.monotonic() + self.grace_s
        while getattr(self.app.state, "in_flight", 0) > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        super().handle_exit(sig, frame)
