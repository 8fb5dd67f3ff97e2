"""GET /v1/receipts/{id}."""

from __future__ import annotations

import re

from fastapi import APIRouter, HTTPException, status

from service.api.deps import ReadPrincipal, RedisDep, SettingsDep
from service.api.errors import AUTH_ERRORS, error_responses
from service.core.keys import receipt_key
from service.protocol.receipts import parse_receipt

router = APIRouter(prefix="/v1/receipts", tags=["receipts"], responses=error_responses(*AUTH_ERRORS))
_RECEIPT_ID = re.compile(r"^[0-9a-f]{32}$")


@router.get("/{receipt_id}", responses=error_responses(404, 422))
async def read_receipt(receipt_id: str, principal: ReadPrincipal, client: RedisDep, settings: SettingsDep) -> dict:
    receipt = None
    if _RECEIPT_ID.fullmatch(receipt_id):
        receipt = parse_receipt(receipt_id, await client.hgetall(receipt_key(principal.tenant, receipt_id)))
    if receipt is None:
        days = settings.receipt_ttl_s / 86400
        kept = f"{days:g} day{'' if days == 1 else 's'}" if days >= 1 else f"{settings.receipt_ttl_s} s"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no receipt {receipt_id[:64]!r} (receipts are kept {kept})")
    return receipt.public()
