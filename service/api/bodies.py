"""Reading request bodies within a size limit."""

from __future__ import annotations

from fastapi import Request

from service.exceptions import BodyTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused as soon as it passes `limit` bytes (never buffered beyond it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes; split it into smaller requests")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise BodyTooLarge(f"body exceeds the limit of {limit} bytes; split it into smaller requests")
    return bytes(data)
