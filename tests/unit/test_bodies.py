"""The body guard, in-process on a tiny ASGI app: what it bounds and what it must leave alone."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fastapi import HTTPException

from service.api import bodies
from service.api.bodies import INLINE_PARSE_BYTES, SHARED_INLINE_BYTES, BodyGuard, Neighbours, in_parsing_thread, parsed_off_loop


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


def test_a_small_body_is_parsed_on_the_event_loop_and_large_ones_one_at_a_time_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread per small body cost the loop more than parsing it (each held the GIL in turn with
    the loop); a large one must not hold the loop, and two large ones never parse at once."""
    monkeypatch.setattr(bodies, "neighbours", Neighbours())  # demo alone
    running, overlaps = [0], []

    def parse(_body: bytes) -> int:
        running[0] += 1
        overlaps.append(running[0])
        time.sleep(0.05)
        running[0] -= 1
        return threading.get_ident()

    async def main() -> tuple[int, int, list[int]]:
        loop_thread = threading.get_ident()
        small = b"x" * INLINE_PARSE_BYTES
        large = b"x" * (INLINE_PARSE_BYTES + 1)
        on_small = await parsed_off_loop("demo", len(small), parse, small)
        on_large = await asyncio.gather(*(parsed_off_loop("demo", len(large), parse, large) for _ in range(3)))
        return loop_thread, on_small, on_large

    loop_thread, on_small, on_large = asyncio.run(main())
    assert on_small == loop_thread
    assert all(thread != loop_thread for thread in on_large)
    assert max(overlaps) == 1


def test_while_another_tenant_sends_a_body_over_the_shared_limit_is_parsed_in_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant alone has its bodies up to INLINE_PARSE_BYTES parsed on the loop (cheapest); while
    another tenant has sent within the window, its bodies over SHARED_INLINE_BYTES go to the
    parsing thread (a flood of them on the loop queued the other's small POSTs: 3 -> 69 ms p50),
    smaller ones stay; once the other has been quiet for the window, the loop again."""
    now = [100.0]
    monkeypatch.setattr(bodies, "neighbours", Neighbours(window_s=1.0, clock=lambda: now[0]))
    large, small = b"x" * (SHARED_INLINE_BYTES + 1), b"x" * SHARED_INLINE_BYTES

    async def where(tenant: str, body: bytes) -> str:
        thread = await parsed_off_loop(tenant, len(body), lambda _body: threading.get_ident(), body)
        return "loop" if thread == threading.get_ident() else "thread"

    async def main() -> list[str]:
        seen = [await where("demo", large)]  # alone
        seen.append(await where("alpha", small))  # (its own: small)
        seen += [await where("demo", large), await where("demo", small)]  # alpha sent 0 s ago
        now[0] += 0.9
        seen.append(await where("demo", large))  # 0.9 s ago
        now[0] += 0.2
        seen.append(await where("demo", large))  # 1.1 s ago: alone again
        seen.append(await where("alpha", large))  # demo sent just now: alpha's large body is the thread's too
        return seen

    assert asyncio.run(main()) == ["loop", "loop", "thread", "loop", "thread", "loop", "thread"]


def test_a_shippers_limit_holds_alone_and_with_company_and_its_tenant_is_company_for_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipper's body (accept_converted) has one limit whatever the company: over it, the thread
    even for a tenant alone; up to it, the loop even while another sends. Its tenant is company
    for another tenant's plain bodies all the same."""
    monkeypatch.setattr(bodies, "neighbours", Neighbours(window_s=1.0, clock=lambda: 100.0))

    async def where(tenant: str, size: int, **limits: int) -> str:
        thread = await parsed_off_loop(tenant, size, threading.get_ident, **limits)
        return "loop" if thread == threading.get_ident() else "thread"

    async def main() -> list[str]:
        shipper = {"alone_upto": 8191, "shared_upto": 8191}
        seen = [await where("demo", 8192, **shipper), await where("demo", 8191, **shipper)]  # alone
        seen.append(await where("alpha", SHARED_INLINE_BYTES + 1))  # a plain body: demo's exports are company
        seen.append(await where("demo", 8191, **shipper))  # with company
        return seen

    assert asyncio.run(main()) == ["thread", "loop", "thread", "loop"]


def test_neighbours_tell_a_tenant_whether_another_sent_within_the_window() -> None:
    now = [0.0]
    company = Neighbours(window_s=1.0, clock=lambda: now[0])
    assert [company.note("a"), company.note("a")] == [False, False]
    now[0] = 0.5
    assert company.note("b") and company.note("a") and company.note("b")
    now[0] = 1.4
    assert company.note("b")  # a sent at 0.5
    now[0] = 1.6
    assert not company.note("b") and not company.note("b")  # a quiet for 1.1 s
    assert company.note("c") and company.note("b")


def test_the_parsing_thread_takes_the_tenants_in_turn_so_a_flood_waits_behind_itself() -> None:
    """A tenant with many large bodies queued must not hold another tenant's one behind all of
    them: the other's runs next, and the flood's pieces alternate with whoever else waits. One at
    a time still, in a thread."""
    order, running, overlaps = [], [0], []

    def parse(name: str) -> str:
        running[0] += 1
        overlaps.append(running[0])
        time.sleep(0.01)
        order.append(name)
        running[0] -= 1
        return name

    async def main() -> list[str]:
        flood = [asyncio.create_task(in_parsing_thread("flood", parse, f"f{i}")) for i in range(6)]
        await asyncio.sleep(0)  # f0 holds the thread, f1..f5 wait
        others = [asyncio.create_task(in_parsing_thread("calm", parse, "c0")), asyncio.create_task(in_parsing_thread("third", parse, "t0"))]
        cancelled = asyncio.create_task(in_parsing_thread("gone", parse, "never"))
        await asyncio.sleep(0)
        cancelled.cancel()  # a waiter whose request went away leaves the queue, and the turns go on
        return await asyncio.gather(*flood, *others)

    assert asyncio.run(main()) == [*(f"f{i}" for i in range(6)), "c0", "t0"]
    assert order == ["f0", "c0", "t0", "f1", "f2", "f3", "f4", "f5"]
    assert max(overlaps) == 1
