"""The definition model's limits and its expression allowlist, in-process (no servers)."""

from __future__ import annotations

import time

import pytest

from service.pipelines.spec import (
    MAX_EXPRESSION_DEPTH,
    MAX_PROCESSORS,
    DefinitionInvalid,
    check_expression,
    parse_definition,
)

ACCEPTED = [
    "kind != 'heartbeat'", "amount / 100.0", "cast(code as int)", "http.status >= 500 OR level = 'error'",
    "x IN (1, 2)", "CASE WHEN (a > 1) THEN 'x' ELSE 'y' END", "upper(concat(a, '-', b))", "transform(arr, x -> x + 1)",
    "date_format(ts, 'yyyy-MM-dd')", "NOT (a = 1)", "cast(amount as decimal(10,2))", "if(a > 1, 'x', 'y')",
    "get_json_object(raw, '$.a')", "x between 1 and 2", "coalesce(a, b) AND (c OR d)", "size(tags) > 0",
]
REFUSED = {
    "user()": "user()", "version()": "version()", "current_database()": "current_database()",
    "raise_error('boom')": "raise_error()", "assert_true(false)": "assert_true()", "`raise_error`('x')": "raise_error()",
    "reflect('java.lang.Runtime', 'getRuntime')": "reflect()", "java_method('a', 'b')": "java_method()",
    "input_file_name()": "input_file_name()", "repeat('x', 1000000000)": "repeat()", "sequence(1, 100000000)": "sequence()",
    "count(*)": "count()", "explode(arr)": "explode()", "RAISE_ERROR('x')": "raise_error()",
}


@pytest.mark.parametrize("expression", ACCEPTED)
def test_expressions_that_read_the_event_are_accepted(expression: str) -> None:
    assert check_expression(expression) == expression


@pytest.mark.parametrize(("expression", "function"), REFUSED.items())
def test_functions_outside_the_allowlist_are_refused_by_name(expression: str, function: str) -> None:
    with pytest.raises(ValueError, match=f"function {function.replace('(', '[(]').replace(')', '[)]')} is not allowed"):
        check_expression(expression)


def test_deeply_nested_expressions_are_refused_before_parsing() -> None:
    check_expression("(" * MAX_EXPRESSION_DEPTH + "1" + ")" * MAX_EXPRESSION_DEPTH)
    with pytest.raises(ValueError, match="nests parentheses"):
        check_expression("(" * 60 + "1" + ")" * 60)
    with pytest.raises(ValueError, match="nests parentheses"):
        check_expression("(" * 1900 + "1" + ")" * 1900)


def test_a_definition_has_a_bounded_number_of_processors_refused_quickly() -> None:
    definition = {"name": "big", "source": {"http": {"path": "/big"}}, "sinks": [{"table": "big", "auto_create": True}],
                  "processors": [{"where": "a > 1"}] * 10_000}
    started = time.monotonic()
    with pytest.raises(DefinitionInvalid) as refused:
        parse_definition(definition)
    assert refused.value.detail()[0]["field"] == "processors"
    assert f"at most {MAX_PROCESSORS}" in refused.value.detail()[0]["error"]
    assert time.monotonic() - started < 1.0, "refused by its length, before each processor is checked"
