"""The api's HTTP server: uvicorn, with limits on slow or oversized request heads and a drain on
shutdown."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import orjson
import uvicorn
from fastapi import FastAPI

# Private API: uvicorn has no public hook for a header deadline or a header size limit with its
# httptools parser (only h11's `h11_max_incomplete_event_size`, at half the throughput). This is
# the one module that subclasses it; a uvicorn option for either would replace the subclass.
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.core.config import Settings

LINGER_S = 2.0  # after refusing a head, how long what the client still sends is read and dropped


def _answer(transport: asyncio.Transport, status: str, message: str) -> None:
    body = orjson.dumps({"detail": message})
    transport.write(
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n".encode() + body
    )


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with two limits a public server needs and uvicorn lacks:
    a request's head (request line and headers) must arrive within `header_timeout_s` (408
    otherwise: a client trickling headers holds a connection for nothing), and may not exceed
    `max_header_bytes` (431). The body's own deadline is the app's (`read_body`)."""

    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - uvicorn's signature
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._awaiting_head = True
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering after a refusal: read and dropped
        if self._awaiting_head:
            self._arm_head_timer()
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes and not self._head_ends_within_limit(data):
                self._refuse("431 Request Header Fields Too Large", f"the request line and headers exceed {self.max_header_bytes} bytes")
                return
        super().data_received(data)

    def _head_ends_within_limit(self, data: bytes) -> bool:
        """Whether the head ends inside `data` (the chunk just counted) within the limit: the
        chunk may carry the end of the head and then body bytes, which are not the head's."""
        end = data.find(b"\r\n\r\n")
        return end >= 0 and self._head_bytes - len(data) + end + 4 <= self.max_header_bytes

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_head = True
        self._head_bytes = 0
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # Until the next request begins, uvicorn's keep-alive timeout watches the idle connection.
        super().on_response_complete()
        self._awaiting_head = True
        self._head_bytes = 0

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head and not self.transport.is_closing():
            if self._head_bytes:
                self._refuse("408 Request Timeout", f"the request's headers took over {self.header_timeout_s:g} s")
            else:
                self.transport.close()  # an idle connection: nothing to answer

    def _refuse(self, status: str, message: str) -> None:
        """Answer, half-close, and read (and drop) what the client still sends for a moment before
        closing: closing with unread data resets the connection, and the client would never see
        the answer (nginx's lingering close)."""
        self._disarm_head_timer()
        self._refused = True
        _answer(self.transport, status, message)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def guarded_protocol(settings: Settings) -> type[GuardedHttpProtocol]:
    return type(
        "CalveHttpProtocol", (GuardedHttpProtocol,),
        {"header_timeout_s": settings.header_timeout_s, "max_header_bytes": settings.max_header_bytes},
    )


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM/SIGINT: refuse new ingest requests (503) and report not ready, let the
    requests in flight finish (a wait=true request holds its answer until its commit), then stop.
    A second signal stops at once."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        # Keep-alive longer than a typical load balancer's idle timeout (60 s), so the server is
        # not the side that closes a connection a client is about to reuse.
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level="warning", access_log=False, timeout_keep_alive=75,
            http=guarded_protocol(settings),
        )
        super().__init__(config)
        self.app = app
        self.grace_s = settings.shutdown_grace_s
        self.socket_fd = settings.api_socket_fd

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve; on the listening socket `calve up` passed down when it runs several api
        processes (each accepts connections on it in turn), else on one of its own."""
        if sockets is None and self.socket_fd is not None:
            sockets = [socket.socket(fileno=self.socket_fd)]
        super().run(sockets=sockets)

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
