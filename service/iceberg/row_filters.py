"""Row filters as users write them (`level = 'error' and status >= 500`), made into pyiceberg
expressions a table's scan can run.

A column the table lacks is NULL in every row, as Iceberg reads a column for rows written before
it was added: so a filter naming one is no error (an event table's columns come from its events,
and a field may not have arrived yet). NOTs are pushed down to the predicates first, where negating
keeps SQL's three-valued logic (`not a = 1` is `a != 1`, both unknown on NULL); with no NOT left,
a predicate on a missing column is true (`is null`), or false (anything else: unknown and false
both leave the row out, and AND and OR cannot tell them apart).
"""

from __future__ import annotations

from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    IsNull,
    Or,
    UnboundPredicate,
)
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind, rewrite_not
from pyiceberg.schema import Schema
from pyiceberg.types import ListType, MapType


class FilterError(ValueError):
    """The filter cannot run on the table; the message says why."""


def row_filter(schema: Schema, text: str) -> tuple[BooleanExpression, list[str]]:
    """The filter `text` bound to `schema`, and the columns it names that the table lacks.
    Raises pyparsing's ParseException (not a filter), FilterError, or ValueError/TypeError (a
    literal its column's type cannot take)."""
    missing: list[str] = []

    def resolve(expression: BooleanExpression) -> BooleanExpression:
        if isinstance(expression, (And, Or)):
            return type(expression)(resolve(expression.left), resolve(expression.right))
        if not isinstance(expression, UnboundPredicate):
            return expression
        name = expression.term.name
        try:
            field = schema.find_field(name, case_sensitive=True)
        except ValueError:
            if name not in missing:
                missing.append(name)
            return AlwaysTrue() if isinstance(expression, IsNull) else AlwaysFalse()
        if isinstance(field.field_type, (MapType, ListType)):
            raise FilterError(f"column {name!r} is a {field.field_type}: a filter compares values of primitive columns "
                              "(or of struct fields, as user.name)")
        return expression

    expression = resolve(rewrite_not(parse(text)))
    bind(schema, expression, case_sensitive=True)
    return expression, missing
