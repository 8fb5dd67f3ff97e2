"""Change feed cursors: the texts the API hands out read back as the same positions."""

from __future__ import annotations

import pytest

from service.core.exceptions import BadCursor
from service.feeds.cursors import Cursor


@pytest.mark.parametrize("cursor", [
    Cursor.origin(), Cursor.after(5), Cursor.after(2**63 - 1), Cursor.within(7, 0), Cursor.within(7, 123), Cursor.loading(9, 2, 40),
])
def test_a_cursor_reads_back_as_itself(cursor: Cursor) -> None:
    assert Cursor.parse(cursor.text()) == cursor


def test_the_forms_are_readable() -> None:
    assert Cursor.after(5).text() == "snap:5"
    assert Cursor.within(5, 3).text() == "snap:5:3"
    assert Cursor.loading(5).text() == "load:5:0:0"


@pytest.mark.parametrize("text", ["", "snap:", "snap:x", "snap:1:2:3", "load:1:2", "origin:1", "snap:-1", "snap:1 ", "SNAP:1", "snap:" + "9" * 20])
def test_anything_else_is_refused_naming_what_a_cursor_is(text: str) -> None:
    with pytest.raises(BadCursor, match="is not a cursor"):
        Cursor.parse(text)
