"""The body guard, in-process on a tiny ASGI app: what it bounds and what it must leave alone."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import HTTPException

from service.api.bodies import BodyGuard


def run(app, body_messages: list[dict], later: list[dict]) -> list[dict]:  # noqa: ANN001
    """Drive `BodyGuard(app)` with a client that sends `body_messages` at once, then (after 0.3 s
    each) `later`; returns what the app sent."""
    sent: list[dict] = []
    queue = [*body_messages]

    async def receive() -> dict:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(0.3)
        return later.pop(0) if later else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "headers": [(b"content-length", b"2")]}
    asyncio.run(BodyGuard(app, max_bytes=1024, timeout_s=0.2)(scope, receive, send))
    return sent


def test_a_streaming_answer_may_outlast_the_body_deadline_once_the_body_is_in() -> None:
    """After the body, Starlette's streaming answers wait on receive() for the client to leave: that
    wait is not the body arriving, and a feed streamed for longer than the deadline must go on."""

    async def streaming(_scope, receive, send) -> None:  # noqa: ANN001
        assert (await receive())["body"] == b"{}"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        assert (await receive())["type"] == "http.disconnect"  # 0.3 s later: past the 0.2 s deadline
        await send({"type": "http.response.body", "body": b"done"})

    sent = run(streaming, [{"type": "http.request", "body": b"{}", "more_body": False}], [])
    assert sent[-1]["body"] == b"done"


def test_a_body_that_does_not_arrive_in_time_is_refused() -> None:
    async def reader(_scope, receive, send) -> None:  # noqa: ANN001
        while (await receive()).get("more_body"):
            pass

    with pytest.raises(HTTPException) as refused:
        run(reader, [{"type": "http.request", "body": b"{", "more_body": True}], [{"type": "http.request", "body": b"}", "more_body": False}])
    assert refused.value.status_code == 408
