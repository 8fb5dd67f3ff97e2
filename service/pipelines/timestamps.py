"""Times that shippers send as nanoseconds since 1970, in the ISO 8601 form the conversion reads."""

from __future__ import annotations

from datetime import datetime, timezone


def iso_from_unix_nanos(nanos: int) -> str:
    """UTC with microseconds (Iceberg's precision): 1764000000123456789 -> 2025-11-24T16:00:00.123456Z.
    ValueError for a time no calendar holds."""
    seconds, micros = divmod(nanos // 1000, 1_000_000)
    try:
        moment = datetime.fromtimestamp(seconds, tz=timezone.utc).replace(microsecond=micros)
    except (OverflowError, ValueError, OSError):
        raise ValueError(f"time {nanos} ns since 1970 is out of range") from None
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
