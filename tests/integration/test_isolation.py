"""One tenant's legal input never stalls the others: a table takes fields up to its column limit
(the rest go where unknown fields go), wide batches are parsed only as wide as that, and Spark
plans stay shallow however many columns a table has. Real Redis, Spark Connect and Iceberg."""

from __future__ import annotations

import orjson
import pytest
from pyspark.sql import functions as F

from spark_jobs.columns import any_of
from spark_jobs.schemas import field_count
from spark_jobs.session import spark_session
from tests.conftest import Stack
from tests.integration.test_pipelines import create, send

pytestmark = pytest.mark.spark

LIMIT = 40


def evolving(name: str, **sink: object) -> dict:
    return {"name": name, "source": {"http": {"path": f"/{name}"}},
            "sinks": [{"table": name, "auto_create": True, "schema_evolution": True, **sink}]}


def test_a_table_takes_fields_up_to_its_column_limit_and_the_rest_go_where_unknown_fields_go(stack_factory) -> None:  # noqa: ANN001
    stack: Stack = stack_factory(CALVE_MAX_TABLE_COLUMNS=str(LIMIT))
    create(stack, evolving("kept", extra_fields="_more"))
    create(stack, evolving("named"))
    # A table first made of two fields that sort last: later wide batches are parsed with their
    # first fields only, and these two must still reach their columns.
    assert send(stack, "/kept", [{"zz": "first", "zy": 1}])["dlq_events"] == 0
    wide = {f"a{i:03}": i for i in range(100)} | {"user": {f"f{i:02}": i for i in range(30)}, "zz": "wide", "zy": 2}
    kept = send(stack, "/kept", [wide])
    named = send(stack, "/named", [wide])
    assert kept["dlq_events"] == named["dlq_events"] == 0, (kept, named)

    table = stack.catalog().load_table(("demo", "kept"))
    assert field_count(table.schema().as_arrow()) <= LIMIT + 3, "the limit, and the extra_fields map (3 ids) added even then"
    rows = {row["zz"]: row for row in stack.rows("kept")}
    row = rows["wide"]
    assert row["zy"] == 2, "a column outside the narrowed parse is still read"
    columns = set(table.schema().column_names)
    extras = dict(row["_more"])
    for name, value in wide.items():
        if name == "user":
            continue
        assert (row[name] if name in columns else orjson.loads(extras[name])) == value, name
    assert orjson.loads(extras["user"]) == wide["user"] or "user" in columns, "nothing of the event is lost"

    named_table = stack.catalog().load_table(("demo", "named"))
    assert field_count(named_table.schema().as_arrow()) <= LIMIT
    left_out = sorted(set(wide) - set(named_table.schema().column_names))
    assert left_out and named["tables"]["named"]["dropped_fields"] == left_out[:20], "named in the answer, never lost in silence"


def test_a_struct_wider_than_the_limit_keeps_the_fields_that_fit(stack_factory) -> None:  # noqa: ANN001
    stack: Stack = stack_factory(CALVE_MAX_TABLE_COLUMNS=str(LIMIT))
    create(stack, evolving("nested", extra_fields="_more"))
    event = {"id": 1, "user": {f"f{i:02}": i for i in range(60)}}
    assert send(stack, "/nested", [event])["dlq_events"] == 0
    table = stack.catalog().load_table(("demo", "nested"))
    assert field_count(table.schema().as_arrow()) <= LIMIT + 3
    (row,) = stack.rows("nested")
    user_columns = list(row["user"])
    assert 0 < len(user_columns) < 60
    extras = dict(row["_more"])
    for name, value in event["user"].items():
        assert row["user"][name] == value if name in user_columns else orjson.loads(extras[f"user.{name}"]) == value, name


def test_an_expression_over_thousands_of_columns_stays_shallow(spark_remote: str) -> None:
    """A left-deep `a | b | c ...` over 5,000 columns failed pyspark's recursive plan walk
    (RecursionError): one table of 5,000 columns stopped its writer."""
    spark = spark_session(spark_remote)
    flags = [F.lit(i == 4999) for i in range(5000)]
    assert spark.range(1).select(any_of(flags).alias("any")).first()["any"] is True
    assert spark.range(1).select(any_of(flags[:4999]).alias("any")).first()["any"] is False
