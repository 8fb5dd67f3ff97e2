"""The definition model's limits and its expression allowlist, in-process (no servers)."""

from __future__ import annotations

import time

import pytest

from service.core.exceptions import DefinitionInvalid
from service.pipelines.expressions import MAX_EXPRESSION_DEPTH, check_expression
from service.pipelines.spec import MAX_PROCESSORS, parse_definition

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


ROW_CHANGE_CASES = [
    ({"operation": "op", "auto_create": True}, "sinks[0].identifier_columns", "required with operation"),
    ({"identifier_columns": ["id"]}, "sinks[0].identifier_columns", "only meaningful with operation"),
    ({"write_mode": "merge-on-read"}, "sinks[0].write_mode", "only meaningful with operation"),
    ({"mode": "upsert", "identifier_columns": ["id", "id"]}, "sinks[0].identifier_columns", "named twice"),
    ({"operation": "raise_error('x')", "identifier_columns": ["id"]}, "sinks[0].operation", "raise_error() is not allowed"),
    ({"operation": "op", "identifier_columns": ["id"], "schema": {"columns": [{"name": "id", "type": "long"}]}},
     "sinks[0].identifier_columns", "must be required"),
    ({"operation": "op", "identifier_columns": ["x"], "schema": {"columns": [{"name": "id", "type": "long", "required": True}]}},
     "sinks[0].identifier_columns", "no column 'x'"),
    ({"mode": "upsert", "identifier_columns": ["v"], "schema": {"columns": [{"name": "v", "type": "double", "required": True}]}},
     "sinks[0].identifier_columns", "other than float and double"),
    ({"mode": "merge"}, "sinks[0].mode", "'append' or 'upsert'"),
]


@pytest.mark.parametrize(("sink", "where", "message"), ROW_CHANGE_CASES)
def test_row_change_settings_are_checked_field_by_field(sink: dict, where: str, message: str) -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition({"name": "p", "source": {"http": {"path": "/p"}}, "sinks": [{"table": "t", **sink}]})
    (error,) = caught.value.detail()
    assert error["field"] == where and message in error["error"], error


def test_row_change_settings_that_fit_are_accepted() -> None:
    sink = parse_definition({"name": "p", "source": {"http": {"path": "/p"}}, "sinks": [{
        "table": "t", "operation": "lower(op)", "identifier_columns": ["id"], "auto_create": True,
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}]},
    }]}).sinks[0]
    assert sink.row_changes and sink.mode == "append"
    existing = parse_definition({"name": "p", "source": {"http": {"path": "/p"}}, "sinks": [{"table": "t", "mode": "upsert"}]}).sinks[0]
    assert existing.row_changes and existing.identifier_columns is None, "an existing table's identifier fields serve"


EXTRA_FIELDS_CASES = [
    ({"extra_fields": "1st"}, "sinks[0].extra_fields", "invalid column name"),
    ({"extra_fields": "_calve_rest"}, "sinks[0].extra_fields", "Calve's own"),
    ({"extra_fields": "rest", "schema": {"columns": [{"name": "rest", "type": "string"}]}}, "sinks[0].extra_fields", "declares column 'rest' as string"),
    ({"extra_fields": "rest", "schema": {"columns": [{"name": "rest", "type": "map<string,string>", "required": True}]}},
     "sinks[0].extra_fields", "(required)"),
    ({"extra_fields": "id", "mode": "upsert", "identifier_columns": ["id"], "schema": {"columns": [{"name": "id", "type": "long", "required": True}]}},
     "sinks[0].extra_fields", "identifies rows"),
]


@pytest.mark.parametrize(("sink", "where", "message"), EXTRA_FIELDS_CASES)
def test_an_extra_fields_column_must_be_free_to_be_an_optional_string_map(sink: dict, where: str, message: str) -> None:
    with pytest.raises(DefinitionInvalid) as caught:
        parse_definition({"name": "p", "source": {"http": {"path": "/p"}}, "sinks": [{"table": "t", "auto_create": True, **sink}]})
    (error,) = caught.value.detail()
    assert error["field"] == where and message in error["error"], error


def test_an_extra_fields_column_may_be_declared_or_left_to_the_writer() -> None:
    declared = {"columns": [{"name": "id", "type": "long"}, {"name": "rest", "type": "map<string, string>"}]}
    for schema in (declared, None):
        sink = parse_definition({"name": "p", "source": {"http": {"path": "/p"}}, "sinks": [
            {"table": "t", "auto_create": True, "extra_fields": "rest", **({"schema": schema} if schema else {})}]}).sinks[0]
        assert sink.extra_fields == "rest"
