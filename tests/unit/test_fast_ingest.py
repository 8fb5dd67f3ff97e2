"""The query an ingest POST may have to be answered without FastAPI's routing (service/api/fast_ingest.py)."""

from __future__ import annotations

import pytest

from service.api.fast_ingest import _query


@pytest.mark.parametrize(("raw", "taken"), [
    (b"", (False, None)),
    (b"wait=true", (True, None)),
    (b"wait=false&timeout=30", (False, 30.0)),
    (b"timeout=0.25&wait=true", (True, 0.25)),
    (b"timeout=86400", (False, 86400.0)),
])
def test_wait_and_timeout_in_their_plain_spellings_are_read(raw: bytes, taken: tuple) -> None:
    assert _query(raw) == taken


@pytest.mark.parametrize("raw", [
    b"wait=1", b"wait=True", b"wait=", b"wait=true&wait=false", b"timeout=0", b"timeout=86401", b"timeout=-1", b"timeout=1e3",
    b"timeout=nan", b"wait=true&by=route", b"wait", b"%ff=1", b"wait=true&&timeout=1",
])
def test_any_other_query_is_left_to_the_route(raw: bytes) -> None:
    # The route reads these (FastAPI's own parsing, or a 422 saying what is wrong).
    assert _query(raw) is None
