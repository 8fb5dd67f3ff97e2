"""Reading request bodies within a size limit and a deadline, for every route.

Two layers: `BodyGuard`, an ASGI middleware, bounds every request's body (the largest any route
takes) and the time it may take to arrive; `read_body` applies a route's own, smaller limit. A
body refused for its size is drained (a bounded amount, for a bounded time) before the answer, as
nginx's lingering close does: a client still sending when the server closes gets a connection
reset instead of the 413.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import TypeVar

import anyio
import orjson
from fastapi import HTTPException, Request
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.exceptions import BodyTooLarge

LINGER_BYTES = 64 * 1024 * 1024  # drained at most, after a refused body
LINGER_S = 5.0
# A body up to this size is parsed on the event loop (a request of 1,000 small events: ~2 ms), a
# larger one in the api's parsing thread. A thread per body cost the loop more than the parsing:
# every request in a thread holds the interpreter (the GIL) in turn with the loop, so under 150
# producers a request waited ~0.2 s for the loop between each of its steps (measured in
# `make bench`: 0.23 s from its head to its events parsed, 0.2 s more to be buffered).
INLINE_PARSE_BYTES = 512 * 1024
# ... but while another tenant has sent in the last SHARED_WINDOW_S, a body over SHARED_INLINE_BYTES
# takes its tenant's turn in the parsing thread: a flood of 1,000-event bodies parsed on the loop
# queued another tenant's one-event POSTs behind it (their p50 3 -> 69 ms in the api; 5 ms so).
# Not always: the thread costs such a body ~30% more of the api's CPU (the GIL shared with the loop).
SHARED_INLINE_BYTES = 64 * 1024
SHARED_WINDOW_S = 1.0

_T = TypeVar("_T")


class FairTurns:
    """One holder at a time, the waiters served tenant by tenant in turn: each tenant's waiters
    first come first served, and the tenants round-robin, so a tenant's flood of work waits behind
    itself, not in front of the others (a tenant's next piece waits for at most one piece of each
    other tenant with work queued)."""

    def __init__(self) -> None:
        self.limiter = anyio.CapacityLimiter(1)  # its thread takes none of the pool's tokens
        self.held = False
        self.holder: str | None = None  # whose turn it is
        self.waiting: dict[str, collections.deque[asyncio.Future[None]]] = {}  # in turn order

    async def acquire(self, tenant: str) -> None:
        if not self.held and not self.waiting:
            self.held, self.holder = True, tenant
            return
        turn = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(tenant, collections.deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # handed the turn as it was cancelled: pass it on
                self.release()
            else:
                queue = self.waiting.get(tenant)
                if queue is not None and turn in queue:
                    queue.remove(turn)
                    if not queue:
                        del self.waiting[tenant]
            raise

    def release(self) -> None:
        """Hand the turn to the first waiter of the next tenant in turn (who then goes last)."""
        if self.holder in self.waiting:  # the tenant whose turn ends goes after the others
            self.waiting[self.holder] = self.waiting.pop(self.holder)
        while self.waiting:
            tenant = next(iter(self.waiting))
            queue = self.waiting.pop(tenant)
            turn = queue.popleft()
            if queue:
                self.waiting[tenant] = queue
            if not turn.done():
                self.holder = tenant
                turn.set_result(None)
                return
        self.held, self.holder = False, None

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        await self.acquire(tenant)
        try:
            yield
        finally:
            self.release()


class Neighbours:
    """Whether a tenant has company: another tenant sent work in the last `window_s` seconds. O(1)
    a request: the last tenant to send, when, and when any other last did."""

    def __init__(self, window_s: float = SHARED_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.latest: str | None = None
        self.latest_at = self.other_at = float("-inf")

    def note(self, tenant: str) -> bool:
        """Note that `tenant` sends now; whether another tenant sent within the window."""
        now = self.clock()
        if tenant != self.latest:
            self.other_at, self.latest = self.latest_at, tenant
        self.latest_at = now
        return now - self.other_at < self.window_s


_turns: FairTurns | None = None
neighbours = Neighbours()


async def parsed_off_loop(tenant: str, size: int, parse: Callable[..., _T], *args: object,
                          alone_upto: int = INLINE_PARSE_BYTES, shared_upto: int = SHARED_INLINE_BYTES) -> _T:
    """`parse(*args)`, the CPU work of reading a body of `size` bytes: on the event loop when the
    body is small (up to `alone_upto` bytes; while other tenants send, up to `shared_upto`), else
    in the api's parsing thread (in_parsing_thread), so that however many large bodies arrive at
    once, the loop shares the interpreter with one of them only. The limits are a plain body's
    (NDJSON, JSON, `_bulk`); a shipper's body costs more per byte and has its own (accept_converted)."""
    shared = neighbours.note(tenant)
    if size <= shared_upto or (size <= alone_upto and not shared):
        return parse(*args)
    return await in_parsing_thread(tenant, parse, *args)


async def in_parsing_thread(tenant: str, parse: Callable[..., _T], *args: object) -> _T:
    """`parse(*args)` in the api's one parsing thread, the tenants' work in turn (FairTurns):
    bodies over INLINE_PARSE_BYTES, pipeline definitions and the shippers' exports share it. One
    thread, not the pool: pyarrow's compute calls let go of the GIL, and many threads taking it
    back in turn doubled the CPU of an OTLP export (make bench-api). In turn, not first come
    first served: a tenant's flood of exports queued in front of another's large body delayed it
    by the whole flood (README, "The api's loop"). Small bodies are parsed on the loop."""
    global _turns  # noqa: PLW0603 - made in the event loop, on first use
    _turns = _turns or FairTurns()
    async with _turns.turn(tenant):
        # Not abandoned when the request is cancelled: the turn passes on once the thread is done.
        return await anyio.to_thread.run_sync(parse, *args, limiter=_turns.limiter)


def _expects_continue(headers: list[tuple[bytes, bytes]]) -> bool:
    # Such a client sends the body only when asked to (by reading it): it reads the answer first.
    return any(name == b"expect" and value.lower() == b"100-continue" for name, value in headers)


async def _drain(receive: Receive, budget: int = LINGER_BYTES, seconds: float = LINGER_S) -> None:
    """Read and discard what the client is still sending, up to `budget` bytes or `seconds`."""
    with contextlib.suppress(TimeoutError, HTTPException):
        async with asyncio.timeout(seconds):
            while budget > 0:
                message = await receive()
                if message["type"] != "http.request":
                    return
                budget -= len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


class BodyGuard:
    """Every request body at most `max_bytes` (413) and arrived within `timeout_s` of the head
    (408): a client trickling a body holds a connection and memory for nothing."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            if not _expects_continue(scope["headers"]):
                await _drain(receive)
            await _refuse(send, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {int(declared)} bytes exceeds the limit of {self.max_bytes} bytes")
            return
        deadline = time.monotonic() + self.timeout_s
        received = 0
        complete = False

        async def guarded_receive() -> Message:
            nonlocal received, complete
            if complete:
                # The body is in: what follows is a streaming answer listening for the client to
                # go (Starlette's disconnect watch), which may rightly take longer than the deadline.
                return await receive()
            try:
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(
                    HTTPStatus.REQUEST_TIMEOUT, f"the request body did not arrive within {self.timeout_s:g} s; send it faster or smaller"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if message.get("more_body", False):
                        await _drain(receive)
                    raise HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds the limit of {self.max_bytes} bytes")
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, guarded_receive, send)


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = orjson.dumps({"detail": detail})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused as soon as it passes `limit` bytes (never buffered beyond it)."""
    declared = request.headers.get("content-length")
    lingering = not _expects_continue(request.scope["headers"])
    if declared is not None and declared.isdigit() and int(declared) > limit:
        if lingering:
            await _drain(request.receive)
        raise BodyTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes; split it into smaller requests")
    data = bytearray()
    more = True
    while more:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        data += message.get("body", b"")
        more = message.get("more_body", False)
        if len(data) > limit:
            if lingering and more:
                await _drain(request.receive)
            raise BodyTooLarge(f"body exceeds the limit of {limit} bytes; split it into smaller requests")
    return bytes(data)
