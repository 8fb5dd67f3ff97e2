"""Stream entry ids and small helpers shared by the writer and committer."""

from __future__ import annotations


def parse_id(entry_id: str | bytes) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    millis, _, seq = text.partition("-")
    return int(millis), int(seq or 0)


def id_after(entry_id: str, watermark: str) -> bool:
    """True when stream entry `entry_id` comes after `watermark`."""
    return parse_id(entry_id) > parse_id(watermark)


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def next_id(entry_id: str) -> str:
    """The smallest stream entry id after `entry_id` (XTRIM MINID keeps it and what follows)."""
    millis, seq = parse_id(entry_id)
    return f"{millis}-{seq + 1}"
