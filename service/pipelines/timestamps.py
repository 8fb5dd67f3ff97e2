"""Times that shippers send as nanoseconds since 1970, in the ISO 8601 form the conversion reads."""

from __future__ import annotations

from datetime import datetime, timezone
from functools import lru_cache


def iso_from_unix_nanos(nanos: int) -> str:
    """UTC with microseconds (Iceberg's precision): 1764000000123456789 -> 2025-11-24T16:00:00.123456Z.
    ValueError for a time no calendar holds."""
    seconds, micros = divmod(nanos // 1000, 1_000_000)
    try:
        return f"{_second(seconds)}.{micros:06d}Z"
    except (OverflowError, ValueError, OSError):
        raise ValueError(f"time {nanos} ns since 1970 is out of range") from None


@lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    """A second since 1970 as UTC's date and time to the second: a shipper's batch holds few of them."""
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
