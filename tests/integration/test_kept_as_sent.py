"""Data kept as sent: what a producer sends is stored as it was, or named where it is not."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest

pytestmark = pytest.mark.spark


def test_long_integers_and_long_field_names_are_kept_or_named(stack) -> None:  # noqa: ANN001
    """An integer beyond 64 bits keeps every digit in `_extra` (orjson used to make it a float:
    9.999999999999999E22); a field whose name is too long to be a column goes to the DLQ with
    the reason while the event's other fields are written (the whole event used to go there, as
    'no field of the event matches a column')."""
    long_name = "k" * 1_000_000
    with stack.client() as http:
        assert http.post("/logs?wait=true", json={"id": "a", "msg": "creates the table"}).status_code == 200
        big = http.post("/logs?wait=true", content=b'{"id":"big","x":99999999999999999999999,"y":[18446744073709551616]}',
                        headers={"Content-Type": "application/json"})
        assert big.status_code == 200 and big.json()["dlq_events"] == 0, big.text
        named = http.post("/logs?wait=true", content=orjson.dumps({"id": "long", "msg": "kept", long_name: 1}),
                          headers={"Content-Type": "application/json"})
        assert named.status_code == 200, named.text
        assert (named.json()["tables"]["logs"]["rows"], named.json()["dlq_events"]) == (1, 1)
    rows = {row["id"]: row for row in stack.rows()}
    assert dict(rows["big"]["_extra"]) == {"x": "99999999999999999999999", "y": "[18446744073709551616]"}
    assert rows["long"]["msg"] == "kept" and rows["long"]["_extra"] is None
    [dead] = stack.rows("_calve_dlq")
    assert dead["receipt"] == named.json()["receipt"]
    assert "longer than 1,024 characters" in dead["reason"] and "(1,000,000 characters)" in dead["reason"]
    assert orjson.loads(dead["event"]) == {long_name: 1}


def test_the_openapi_example_row_filter_answers_on_the_built_in_logs_table(stack) -> None:  # noqa: ANN001
    """The document's example names columns (level, status) the built-in table has only if its
    events brought them: it was a 422 for whoever tried it. A column the table lacks is NULL in
    every row, and the answer names it."""
    with stack.client() as http:
        assert http.post("/logs?wait=true", json=[{"id": 1}, {"id": 2, "other": "x"}]).status_code == 200
        parameter = next(p for p in http.get("/openapi.json").json()["paths"]["/v1/tables/{name}/rows"]["get"]["parameters"]
                         if p["name"] == "filter")
        assert parameter["schema"]["examples"]
        for example in parameter["schema"]["examples"]:
            answer = http.get("/v1/tables/logs/rows", params={"filter": example})
            assert answer.status_code == 200, answer.text
            assert answer.json()["rows"] == [] and answer.json()["missing_columns"] == ["level", "status"]


def test_a_decimal_sent_as_a_json_number_keeps_every_digit_through_the_api(stack) -> None:  # noqa: ANN001
    """A balance of 22 digits into a decimal(38,6) column, in a line written with spaces (so the
    api encodes it again): the row holds every digit, as the README's conversion rules say (orjson's
    double made it 1234567890123456.000000), the short way and the Spark job alike."""
    ledger = {"name": "ledger", "source": {"http": {"path": "/ledger"}}, "sinks": [{"table": "ledger", "auto_create": True, "schema": {
        "columns": [{"name": "id", "type": "string", "required": True}, {"name": "balance", "type": "decimal(38,6)"}]}}]}
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=ledger).status_code == 201
        for body in (b'{"id": "a", "balance": 1234567890123456.123456}\n{"id": "b", "balance": -0.1234567890123456789}',
                     b'[{"id": "c", "balance": 98765432109876543210.654321, "unknown": 1}]'):  # a field the table lacks: the Spark job
            answer = http.post("/ledger?wait=true", content=body, headers={"Content-Type": "application/json" if body[:1] == b"[" else "application/x-ndjson"})
            assert answer.status_code == 200 and answer.json()["dlq_events"] == 0, answer.text
    balances = {row["id"]: row["balance"] for row in stack.rows("ledger")}
    assert balances == {"a": Decimal("1234567890123456.123456"), "b": Decimal("-0.123457"), "c": Decimal("98765432109876543210.654321")}
