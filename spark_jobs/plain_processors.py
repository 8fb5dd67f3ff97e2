"""The processors the short way (direct_append.py) applies itself: `where` and `set` whose
expressions are comparisons, AND/OR/NOT, IS [NOT] NULL and IN over the table's own columns of
plain types (strings, integers, doubles, booleans), a map of strings' values by key (`labels.job`,
`labels['job']`: NULL where the map lacks it; the Spark job parses such columns as maps) and
literals, evaluated by pyarrow's compute
functions with SQL's three-valued logic, as Spark evaluates them in the Spark job
(processors.py), `drop` of fields the table lacks (no other processor can read them: the
short way leaves them out of the rows, and a request with a field the table lacks that no drop
names, or one that a drop names in other letter case, which Spark's drop takes too (it ignores letter case), is refused),
`drop` of the table's own nullable columns (a "null" step: the Spark job drops the field and
writes the column it then lacks as NULL; a drop that no later step reads, sets or renames onto,
where Spark would read a field no event has),
and `rename` of a field the table lacks to a column of the table (`_renamable`: the short way
parses the old name as the column and renames it after the parse; a request with the new name
too, or either in other letter case, is refused: Spark would hold two columns of one name).
Functions: lower, upper, length and trim (ltrim, rtrim) of text, concat (and `||`) of text,
coalesce (nvl, ifnull), CASE (both forms) and IF over values of one kind, text, integers or
booleans (NULLs aside). Arithmetic: +, -, *, / and % of integers and doubles, div of integers,
and unary minus (`_arithmetic`). Casts (`_cast`): integers and booleans to text, text and doubles
to integers, integers and text to doubles, text and integers to booleans. Anything else (other functions, decimal literals in arithmetic,
other casts, time columns, values Spark would widen, a field the table lacks, a drop of a required
column or one read after it, a rename of a column of the table) leaves the batch to the Spark job,
as before: `plan` answers None.

Why these agree with Spark: the short way takes a request only when each of its values already
is of its column's type, and the Spark job's conversion reads every scalar through its text
(coerce.py), so a value ends the same whichever type Spark inferred for the batch. What could
still differ, and is refused or ruled out:
- Spark may infer a double column as bigint (every value of the batch integral) and then compares
  it with a decimal literal exactly; pyarrow compares doubles. They agree unless an integer lies
  between the literal and its nearest double (`_exact_enough`), or a value is at or beyond 2**53
  (the request is refused: `GUARDED`).
- Spark's string literals take backslash escapes and adjacent literals concatenate: an expression
  with a backslash or such literals is not planned.
- Column names: Spark resolves them ignoring case; a plan names the table's columns exactly, and
  an event with a field the table lacks is refused by the short way.
- Maps of strings: the Spark job parses the map columns its processors leave alone as maps
  (pipeline_job._with_table_maps; convert.py reads them again where the batch may go to more
  than one table), written in key order as the short way writes them. A plan reads a map only
  by a string key, as a string: never the map itself.
- Arithmetic: the Spark job's integers are 64 bits (a JSON integer is inferred as bigint) but for
  integer literals and length(), which are 32 (an int with an int wraps at 32 bits there); a
  double column whose values in the batch are all integral is a bigint there, exact where the
  short way's doubles round; `/` is a double's division, NULL (as `%` and `div`) for a divisor
  of 0 (ANSI off); `div` a bigint's; a
  decimal literal makes decimal arithmetic, rounded to scales of Spark's own (not planned). The
  short way computes with checked 64-bit integers and doubles and refuses a request (the Spark
  job's then) where an answer may differ: an integer overflow, a result of two 32-bit operands
  outside 32 bits, a result at or beyond 2**53, infinite, or a double's -0.0 (a bigint's 0 there).
- Casts: Spark (ANSI off) reads text as an integer after trimming it, with a sign or a fraction
  (truncated), and makes anything else or an overflow NULL; the short way casts text of digits
  alone (a minus at most) and refuses a request with other text or an overflow. A double becomes
  an integer truncated (a bigint there when the batch's values are all integral: the same), and
  one beyond the integer's range, which Spark saturates or wraps, refuses it. A double's text is
  not planned: an integral batch's is a bigint's there ("3", not "3.0"). Text to a double: Spark
  reads it with Java's Double.parseDouble (whitespace around it, `1d`, `Infinity`, hex floats);
  the short way casts a decimal number with an exponent of at most three digits (both read it
  correctly rounded) and refuses a request with other text or an infinite result. Text to a
  boolean: Spark trims and lower-cases it and knows t, true, y, yes, 1 and f, false, n, no, 0
  (anything else NULL); the short way takes those words in ASCII letters of either case with
  nothing around them, and refuses a request with other text. An integer is true when not 0.
One difference is the Spark job's own: it infers types over the whole batch, so a request with
text where another request has numbers makes the column text for every request of the batch, and
Spark (ANSI off) converts that text to the literal's type to compare: 0.5 against an integer is
read as 0. The short way gives each request it takes the answer it gets in a batch of requests of
the table's types (the request with the text goes to the Spark job either way).

A plan is plain tuples (pickled into Spark's tasks, which need no sqlglot):
("col", name) | ("lit", value, kind) | ("cmp", function, a, b) | ("and", a, b) | ("or", a, b)
| ("not", a) | ("isnull", a) | ("in", a, values, kind) | ("key", map column, key) | ("text", pyarrow function, a)
| ("concat", [a, ...]) | ("coalesce", [a, ...], kind) | ("case", [(test, value), ...], default, kind)
| ("arith", pyarrow function, a, b or None, kind, 32 bits or not) | ("cast", into, a, from kind); steps ("where", node), ("set", {column: node})
("drop", [name, ...]) and ("rename", {old: new}) (`dropped` and `renamed` read them; `apply` has
nothing left to do for them); ("null", [column, ...]) (a drop of the table's own columns).
"""

from __future__ import annotations

import math
import re
import sys
from decimal import Decimal, InvalidOperation

import pyarrow as pa
import sqlglot
from pyspark import cloudpickle
from sqlglot import exp

from spark_jobs.definition import Processor

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # `apply` runs in Spark's tasks, which need no sqlglot

COMPARISONS = {exp.EQ: "equal", exp.NEQ: "not_equal", exp.GT: "greater", exp.GTE: "greater_equal", exp.LT: "less", exp.LTE: "less_equal"}
NUMERIC = ("int", "double", "number")
# Beyond this a double holds no longer every integer: Spark's bigint and pyarrow's double disagree.
EXACT_INTEGERS = 2**53
_INTEGER = re.compile(r"^[0-9]+$")
_DECIMAL = re.compile(r"^([0-9]+\.[0-9]*|\.[0-9]+)$")
_DOUBLE = re.compile(r"^([0-9]+\.?[0-9]*|\.[0-9]+)[eE][+-]?[0-9]+$")
ARROW = {"string": pa.string(), "int": pa.int64(), "double": pa.float64(), "number": pa.float64(), "bool": pa.bool_()}
# Functions of text, by pyarrow's name: Spark's lower and upper follow Java's case rules, which
# agree with utf8proc's on ASCII only (`apply` refuses a request with other text there); its
# length counts code points, as utf8_length does; its trims remove spaces, not other whitespace.
TEXT_FUNCTIONS = {exp.Lower: "utf8_lower", exp.Upper: "utf8_upper", exp.Length: "utf8_length"}
TRIMS = {"BOTH": "utf8_trim", "LEADING": "utf8_ltrim", "TRAILING": "utf8_rtrim"}
# Arithmetic, by pyarrow's name (the checked ones raise on an integer overflow): Spark's `/` is a
# double's division whatever its operands (but decimals, not planned).
ARITHMETIC = {exp.Add: "add_checked", exp.Sub: "subtract_checked", exp.Mul: "multiply_checked", exp.Div: "divide",
              exp.Mod: "remainder_checked", exp.IntDiv: "divide_checked"}
# Those NULL for a divisor of 0 in Spark (ANSI off). `%` is Java's (the dividend's sign; a
# double's fmod, exact), as pyarrow's remainder; `div` of integers truncates, as pyarrow's divide of them.
DIVISIONS = ("divide", "remainder_checked", "divide_checked")
INT32 = 2**31
# Casts by Spark's type, into: the kinds each may come from (identities aside).
CASTS = {
    exp.DataType.Type.TEXT: ("string", ("int", "bool")), exp.DataType.Type.INT: ("int32", ("string", "double", "int", "bool")),
    exp.DataType.Type.BIGINT: ("int64", ("string", "double", "int", "bool")), exp.DataType.Type.DOUBLE: ("double", ("int", "string")),
    exp.DataType.Type.BOOLEAN: ("bool", ("string", "int")),
}
CAST_KINDS = {"string": "string", "int32": "int", "int64": "int", "double": "double", "bool": "bool"}
_DIGITS = r"^-?[0-9]+$"
# Text Spark (Java's Double.parseDouble) and pyarrow read as the same double: a decimal number,
# an exponent of at most three digits (a finite result is checked after).
_DECIMAL_TEXT = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]{1,3})?$"
# Text Spark reads as a boolean (its StringUtils, after trimming and lower-casing, which the short
# way leaves to it: ASCII letters of either case only, nothing around them).
TRUE_TEXTS, FALSE_TEXTS = ("t", "true", "y", "yes", "1"), ("f", "false", "n", "no", "0")
BOOLEAN_TEXT = "^(" + "|".join("".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in word) for word in TRUE_TEXTS + FALSE_TEXTS) + ")$"


class NotPlain(ValueError):
    """An expression outside what this module evaluates."""


def kind_of(data_type: pa.DataType) -> str | None:
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_int32(data_type) or pa.types.is_int64(data_type):
        return "int"
    if pa.types.is_float64(data_type):
        return "double"
    return "bool" if pa.types.is_boolean(data_type) else None


def plan(processors: list[Processor], schema: pa.Schema, extra_fields: str | None,
         required: frozenset[str] = frozenset()) -> tuple[list[tuple], list[str]] | None:
    """(the steps, the numeric columns whose values must stay below 2**53) for `processors` over a
    table of `schema` whose `required` columns take no NULL, or None when one is outside what this
    module evaluates."""
    kinds = {f.name: kind for f in schema if f.name != extra_fields and (kind := kind_of(f.type))}
    kinds.update({f.name: "map" for f in schema if f.name != extra_fields and is_text_map(f.type)})  # read by key only
    steps: list[tuple] = []
    guarded: set[str] = set()
    try:
        for processor in processors:
            if processor.where is not None:
                node, kind = _compile(_parse(processor.where), kinds, guarded)
                if kind != "bool":
                    return None  # Spark casts the value to boolean: not here
                steps.append(("where", node))
            elif processor.set is not None:
                assigned = {}
                for name, expression in processor.set.items():
                    if name not in kinds:
                        return None  # a field the table lacks: extra_fields or dropped, the Spark job's
                    node, kind = _compile(_parse(expression), kinds, guarded)
                    assigned[name] = _assignable(node, kind, kinds[name], schema, name)
                steps.append(("set", assigned))
            elif processor.drop is not None:
                columns = {name.casefold() for name in schema.names}
                own = [name for name in processor.drop if name in schema.names]
                if any(name not in own and name.casefold() in columns for name in processor.drop):
                    return None  # Spark drops a column of the table by any letter case: its NULLs are the Spark job's
                if any(name == extra_fields or name in required or not schema.field(name).nullable for name in own):
                    return None  # the extras map is no field of the events; a required column's NULLs go to the DLQ there
                if own:
                    steps.append(("null", own))
                if lacking := [name for name in processor.drop if name not in own]:
                    steps.append(("drop", lacking))
            elif not _renamable(processor.rename, schema, extra_fields, steps):
                return None
            else:
                steps.append(("rename", dict(processor.rename)))
    except NotPlain:
        return None
    names = {name.casefold() for old, new in renamed(steps).items() for name in (old, new)}
    if any(name.casefold() in names for name in dropped(steps) | nulled(steps)):
        return None  # a drop of a field a rename reads or gives: the order of the two is the Spark job's
    for index, step in enumerate(steps):
        if step[0] == "null" and set(step[1]) & set().union(*(_read(later) for later in steps[index + 1:])):
            return None  # a column read or set after its drop: the Spark job's (a field no event has there)
    return steps, sorted(guarded)


def _renamable(rename: dict[str, str], schema: pa.Schema, extra_fields: str | None, before: list[tuple]) -> bool:
    """Whether the short way reads `rename` as the Spark job does: each old name a top-level field
    the table lacks (in any letter case: Spark's rename resolves names ignoring it) and no other
    rename's, read at the parse as its new name's column (`renamed`); each new name a column of the
    table the parse reads as it is (no map, no decimal: the Spark job reads a renamed column
    through its inferred type, not as the table's map or a JSON number's digits), that no step
    before reads or sets, nor another rename gives (Spark would then hold two columns of one name)."""
    columns = {name.casefold() for name in schema.names}
    taken = {name.casefold() for old, new in renamed(before).items() for name in (old, new)}
    touched = set().union(*(_read(step) for step in before))
    news = list(rename.values())
    for old, new in rename.items():
        if old.casefold() in columns or old.casefold() in taken:
            return False
        if new not in schema.names or new == extra_fields or new in touched or new.casefold() in taken or news.count(new) > 1:
            return False
        if is_text_map(schema.field(new).type) or _holds_decimals(schema.field(new).type):
            return False
    return True


def _holds_decimals(data_type: pa.DataType) -> bool:
    if pa.types.is_decimal(data_type):
        return True
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_map(data_type):
        return _holds_decimals(data_type.value_type) or pa.types.is_map(data_type) and _holds_decimals(data_type.key_type)
    return pa.types.is_struct(data_type) and any(_holds_decimals(child.type) for child in data_type)


def _read(node: object) -> set[str]:
    """The columns a step (or a node of one) reads or sets."""
    if not isinstance(node, (tuple, list, dict)):
        return set()
    if isinstance(node, dict):  # a set's {column: node}
        return set(node).union(*(_read(value) for value in node.values()))
    if isinstance(node, tuple) and node and node[0] in ("col", "key"):
        return {node[1]}
    return set().union(*(_read(part) for part in node))


def renamed(steps: list[tuple]) -> dict[str, str]:
    """The plan's renames, {old name: new name} (the short way parses each old name as its new)."""
    return {old: new for step in steps if step[0] == "rename" for old, new in step[1].items()}


def dropped(steps: list[tuple]) -> frozenset[str]:
    """The fields the plan's drops name that the table lacks (the parse leaves them out)."""
    return frozenset(name for step in steps if step[0] == "drop" for name in step[1])


def nulled(steps: list[tuple]) -> frozenset[str]:
    """The columns of the table the plan's drops name (NULL from their drop on)."""
    return frozenset(name for step in steps if step[0] == "null" for name in step[1])


def _parse(expression: str) -> exp.Expression:
    if "\\" in expression:
        raise NotPlain("a backslash: Spark's string escapes")
    try:
        return sqlglot.parse_one(expression, read="spark")
    except sqlglot.errors.ParseError as exc:
        raise NotPlain(str(exc)) from None


def _assignable(node: tuple, kind: str, column: str, schema: pa.Schema, name: str) -> tuple:
    """A set's value for column `name` (of kind `column`): the Spark job converts it through its
    text, so a literal of the column's kind (an integer or a decimal for a double column; an
    integer within an int column's range), a column of the same type, or a boolean expression for
    a boolean column; anything else (which the Spark job may convert, or send to the DLQ) is not
    planned."""
    if kind == "null":
        return node
    if node[0] == "col":
        if schema.field(node[1]).type != schema.field(name).type:
            raise NotPlain("another column's type")
        return node
    if node[0] == "lit" and column == "double" and kind in NUMERIC:
        return ("lit", float(node[1]), "double")
    if kind != column:
        raise NotPlain("a value of another type")
    if node[0] == "lit" and column == "int" and pa.types.is_int32(schema.field(name).type) and not -(2**31) <= node[1] < 2**31:
        raise NotPlain("out of the column's range")
    return node


def _compile(node: exp.Expression, kinds: dict[str, str], guarded: set[str]) -> tuple[tuple, str]:
    if isinstance(node, exp.Paren):
        return _compile(node.this, kinds, guarded)
    if isinstance(node, exp.Column) and node.table and not node.args.get("db") and kinds.get(node.table) == "map":
        return ("key", node.table, node.name), "string"  # labels.job: the map's value of key "job", NULL without
    if isinstance(node, exp.Bracket) and isinstance(node.this, exp.Column) and not node.this.table and kinds.get(node.this.name) == "map":
        if len(node.expressions) != 1 or not isinstance(key := node.expressions[0], exp.Literal) or not key.is_string:
            raise NotPlain("a map read by other than a string")
        return ("key", node.this.name, str(key.this)), "string"  # labels['job']
    if isinstance(node, exp.Column):
        if node.table or node.name not in kinds or kinds[node.name] == "map":
            raise NotPlain(f"not a plain column of the table: {node.sql()}")
        return ("col", node.name), kinds[node.name]
    if isinstance(node, exp.Boolean):
        return ("lit", bool(node.this), "bool"), "bool"
    if isinstance(node, exp.Null):
        return ("lit", None, "null"), "null"
    if isinstance(node, exp.Literal) or isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        return _literal(node)
    if type(node) in ARITHMETIC or type(node) is exp.Neg:
        return _arithmetic(node, kinds, guarded)
    if type(node) in (exp.Cast, exp.TryCast):  # Spark's dialect reads CAST as TryCast: NULL where it cannot (ANSI off)
        return _cast(node, kinds, guarded)
    if type(node) in COMPARISONS:
        (a, ka), (b, kb) = _compile(node.this, kinds, guarded), _compile(node.expression, kinds, guarded)
        _comparable(a, ka, b, kb, guarded)
        return ("cmp", COMPARISONS[type(node)], a, b), "bool"
    if isinstance(node, (exp.And, exp.Or)):
        (a, ka), (b, kb) = _compile(node.this, kinds, guarded), _compile(node.expression, kinds, guarded)
        if ka not in ("bool", "null") or kb not in ("bool", "null"):
            raise NotPlain("AND/OR of other than booleans")
        return ("and" if isinstance(node, exp.And) else "or", a, b), "bool"
    if isinstance(node, exp.Not):
        if isinstance(node.this, exp.Is):
            return ("not", _compile(node.this, kinds, guarded)[0]), "bool"
        a, ka = _compile(node.this, kinds, guarded)
        if ka != "bool":
            raise NotPlain("NOT of other than a boolean")
        return ("not", a), "bool"
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        a, _ka = _compile(node.this, kinds, guarded)
        return ("isnull", a), "bool"
    if isinstance(node, exp.In) and not node.args.get("query") and not node.args.get("unnest") and not node.args.get("field"):
        a, ka = _compile(node.this, kinds, guarded)
        if a[0] not in ("col", "key"):
            raise NotPlain("IN of other than a column")
        values = [_compile(item, kinds, guarded) for item in node.expressions]
        for value, kind in values:
            if value[0] != "lit" or kind == "null":
                raise NotPlain("IN with other than literals")
            _comparable(a, ka, value, kind, guarded)
        common = "double" if ka == "double" or any(kind == "number" for _v, kind in values) else ka
        return ("in", a, [value[1] for value, _kind in values], common), "bool"
    if type(node) in TEXT_FUNCTIONS or isinstance(node, exp.Trim):
        return _text_function(node, kinds, guarded)
    if type(node) in (exp.Concat, exp.DPipe):  # not concat_ws (a subclass): it joins with a separator and skips NULLs
        parts = [_compile(part, kinds, guarded) for part in (node.expressions if isinstance(node, exp.Concat) else [node.this, node.expression])]
        if not parts or any(kind != "string" for _part, kind in parts):
            raise NotPlain("concat of other than text")
        return ("concat", [part for part, _kind in parts]), "string"
    if type(node) is exp.Coalesce:
        parts = [_compile(part, kinds, guarded) for part in [node.this, *node.expressions]]
        kind = _common([kind for _part, kind in parts])
        return ("coalesce", [part for part, _kind in parts], kind), kind
    if type(node) in (exp.Case, exp.If):
        return _case(node, kinds, guarded)
    raise NotPlain(f"{node.key} is not evaluated by the short way")


def _text_function(node: exp.Expression, kinds: dict[str, str], guarded: set[str]) -> tuple[tuple, str]:
    """lower, upper, length and trim (of spaces, as Spark's) of text."""
    if isinstance(node, exp.Trim):
        if node.args.get("expression") is not None or node.args.get("collation") is not None:
            raise NotPlain("a trim of other characters than spaces")
        function = TRIMS.get(str(node.args.get("position") or "BOTH").upper())
        if function is None:
            raise NotPlain("a trim of another kind")
    else:
        if any(value is not None for key, value in node.args.items() if key != "this"):
            raise NotPlain(f"{node.key} with more than its text")
        function = TEXT_FUNCTIONS[type(node)]
    argument, kind = _compile(node.this, kinds, guarded)
    if kind != "string":
        raise NotPlain(f"{node.key} of other than text")
    return ("text", function, argument), "int" if function == "utf8_length" else "string"


def _arithmetic(node: exp.Expression, kinds: dict[str, str], guarded: set[str]) -> tuple[tuple, str]:
    """a + b, a - b, a * b, a / b, a % b and -a of integers and doubles, a div b of integers (a
    NULL on one side: NULL). Integer literals only: a decimal one makes Spark's arithmetic decimal."""
    if type(node) is exp.Div and node.args.get("typed"):
        raise NotPlain("an integer division")  # Spark's `/` parses as typed=False, safe=True (NULL for a divisor of 0)
    parts = [_compile(part, kinds, guarded) for part in ([node.this] if type(node) is exp.Neg else [node.this, node.expression])]
    for part, kind in parts:
        if kind not in ("int", "double", "null"):
            raise NotPlain(f"arithmetic of {kind}")
        if part[0] == "col" and kind == "double":
            guarded.add(part[1])  # a bigint in the Spark job when the batch's values are all integral
    known = [kind for _part, kind in parts if kind != "null"]
    if not known:
        raise NotPlain("arithmetic of NULLs")
    if type(node) is exp.IntDiv and "double" in known:
        raise NotPlain("div of doubles")
    kind = "double" if type(node) is exp.Div or "double" in known else "int"
    narrow = kind == "int" and type(node) is not exp.IntDiv and all(_narrow(part) for part, _kind in parts)  # div: a bigint in Spark
    function = "negate_checked" if type(node) is exp.Neg else ARITHMETIC[type(node)]
    return ("arith", function, parts[0][0], parts[1][0] if len(parts) > 1 else None, kind, narrow), kind


def _cast(node: exp.Expression, kinds: dict[str, str], guarded: set[str]) -> tuple[tuple, str]:
    """CAST(a AS t) where the short way reads it as Spark does (the module's docstring)."""
    if any(node.args.get(key) is not None for key in ("format", "action", "default")) or node.to.expressions or node.to.this not in CASTS:
        raise NotPlain(f"a cast to {node.to.sql()}")
    into, sources = CASTS[node.to.this]
    value, kind = _compile(node.this, kinds, guarded)
    if kind == CAST_KINDS[into] and into != "int32":
        return value, kind  # a cast to its own kind (a bigint's to BIGINT)
    if kind not in sources:
        raise NotPlain(f"a cast of {kind} to {node.to.sql()}")
    if value[0] == "col" and kind == "double":
        guarded.add(value[1])
    return ("cast", into, value, kind), CAST_KINDS[into]


def _narrow(node: tuple) -> bool:
    """Whether the Spark job holds this integer in 32 bits: an integer literal within them, a
    length, or what is made of those alone (a column is a bigint there: inferred from JSON)."""
    if node[0] == "lit":
        return node[2] == "null" or node[2] == "int" and -INT32 <= node[1] < INT32
    if node[0] == "text":
        return node[1] == "utf8_length"
    if node[0] == "coalesce":
        return all(_narrow(part) for part in node[1])
    if node[0] == "case":
        return all(_narrow(value) for _test, value in node[1]) and _narrow(node[2])
    if node[0] == "cast":
        return node[1] == "int32"
    return node[0] == "arith" and node[5]


def _common(kinds: list[str]) -> str:
    """The one kind of a CASE's or a coalesce's values (NULLs aside): text, integers or booleans;
    Spark widens anything else (an integer beside a decimal literal makes a decimal), not here."""
    found = set(kinds) - {"null"}
    if len(found) != 1 or (kind := found.pop()) not in ("string", "int", "bool"):
        raise NotPlain(f"values of kinds {sorted(set(kinds))}")
    return kind


def _case(node: exp.Expression, kinds: dict[str, str], guarded: set[str]) -> tuple[tuple, str]:
    """CASE WHEN c THEN v ... [ELSE d] END, CASE x WHEN v THEN ... (x = v), and IF(c, a, b): the
    first branch whose condition is true (NULL is not), else the default (NULL without one)."""
    if isinstance(node, exp.If):
        if node.args.get("false") is None:
            raise NotPlain("IF without its third argument: Spark refuses it")
        pairs, default = [(node.this, node.args["true"])], node.args["false"]
    else:
        subject = node.this
        pairs = [(exp.EQ(this=subject.copy(), expression=branch.this.copy()) if subject is not None else branch.this, branch.args["true"])
                 for branch in node.args["ifs"]]
        default = node.args.get("default")
    branches = []
    for condition, value in pairs:
        test, kind = _compile(condition, kinds, guarded)
        if kind not in ("bool", "null"):
            raise NotPlain("a CASE condition of other than a boolean")
        branches.append((test, _compile(value, kinds, guarded)))
    otherwise = _compile(default, kinds, guarded) if default is not None else (("lit", None, "null"), "null")
    kind = _common([value_kind for _test, (_value, value_kind) in branches] + [otherwise[1]])
    return ("case", [(test, value) for test, (value, _kind) in branches], otherwise[0], kind), kind


def is_text_map(data_type: pa.DataType) -> bool:
    """A map of strings to strings: the one map type the short way reads (direct_append.text_maps)
    and a plan reads by key."""
    return pa.types.is_map(data_type) and kind_of(data_type.key_type) == kind_of(data_type.item_type) == "string"


def _literal(node: exp.Expression) -> tuple[tuple, str]:
    negative = isinstance(node, exp.Neg)
    literal = node.this if negative else node
    text = str(literal.this)
    if literal.is_string:
        if negative:
            raise NotPlain("a negated string")
        return ("lit", text, "string"), "string"
    if _INTEGER.match(text):
        value = -int(text) if negative else int(text)
        if abs(value) >= EXACT_INTEGERS:
            raise NotPlain("an integer literal beyond 2**53")
        return ("lit", value, "int"), "int"
    if _DECIMAL.match(text) or _DOUBLE.match(text):
        try:
            exact = Decimal(text)
        except InvalidOperation:
            raise NotPlain(f"the number {text}") from None
        value = float(text)
        if not math.isfinite(value) or (_DECIMAL.match(text) and not _exact_enough(exact, value)):
            raise NotPlain(f"the number {text}")
        return ("lit", -value if negative else value, "number"), "number"
    raise NotPlain(f"the literal {text}")


def _exact_enough(exact: Decimal, value: float) -> bool:
    """Whether comparing an integer with the decimal `exact` or with its double `value` always
    gives the same answer: no integer lies between the two, nor on either unless both are it."""
    rounded = Decimal(value)
    if rounded == exact:
        return True
    low, high = min(rounded, exact), max(rounded, exact)
    return math.floor(low) == math.floor(high) and low != math.floor(low) and high != math.floor(high)


def _comparable(a: tuple, ka: str, b: tuple, kb: str, guarded: set[str]) -> None:
    if ka == kb == "string" or ka == kb == "bool":
        return
    if ka in NUMERIC and kb in NUMERIC and not (ka == kb == "number"):
        for node, kind in ((a, ka), (b, kb)):
            if node[0] == "col" and kind in ("int", "double"):
                guarded.add(node[1])
        return
    raise NotPlain(f"{ka} compared with {kb}")


def apply(steps: list[tuple], guarded: list[str], table: pa.Table) -> pa.Table:
    """`table` through the steps. Raises ValueError for a value this module cannot be sure of."""
    import pyarrow.compute as pc

    for name in guarded:
        column = table.column(name)
        if column.null_count < len(column) and pc.max(pc.abs_checked(column.cast(pa.float64()))).as_py() >= EXACT_INTEGERS:
            raise ValueError(f"{name!r}: a number at or beyond 2**53, compared")
    for step in steps:
        if step[0] == "where":
            keep = _evaluate(step[1], table)
            if isinstance(keep, pa.Scalar):
                keep = pa.repeat(keep, table.num_rows)
            table = table.filter(pc.fill_null(keep, False))
        elif step[0] == "set":
            values = {name: _evaluate(node, table) for name, node in step[1].items()}  # all read the rows as they were
            for name, value in values.items():
                data_type = table.schema.field(name).type
                if isinstance(value, pa.Scalar):
                    value = pa.repeat(value.cast(data_type) if value.is_valid else pa.scalar(None, data_type), table.num_rows)
                table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), value.cast(data_type))
        elif step[0] == "null":  # a drop of the table's own columns: NULL from here on, as the Spark job writes a field it lacks
            for name in step[1]:
                field = table.schema.field(name)
                table = table.set_column(table.schema.get_field_index(name), field, pa.nulls(table.num_rows, field.type))
    return table


def _evaluate(node: tuple, table: pa.Table):  # noqa: ANN202 - an array or a scalar
    import pyarrow.compute as pc

    op = node[0]
    if op == "col":
        return table.column(node[1])
    if op == "key":
        return pc.map_lookup(table.column(node[1]), pa.scalar(node[2], pa.string()), "last")
    if op == "lit":
        return pa.scalar(node[1], pa.null() if node[2] == "null" else ARROW[node[2]])
    if op == "cmp":
        a, b = _evaluate(node[2], table), _evaluate(node[3], table)
        if _is_null(a) or _is_null(b):
            return pa.scalar(None, pa.bool_())
        return getattr(pc, node[1])(a, b)
    if op in ("and", "or"):
        a, b = (_as_bool(_evaluate(part, table)) for part in node[1:])
        return (pc.and_kleene if op == "and" else pc.or_kleene)(a, b)
    if op == "not":
        return pc.invert(_as_bool(_evaluate(node[1], table)))
    if op == "isnull":
        value = _evaluate(node[1], table)
        return pa.scalar(not value.is_valid) if isinstance(value, pa.Scalar) else pc.is_null(value)
    if op == "in":
        column = _evaluate(node[1], table)
        wanted = ARROW[node[3]]
        found = pc.is_in(column.cast(wanted), value_set=pa.array(node[2], wanted))
        return pc.if_else(pc.is_valid(column), found, pa.scalar(None, pa.bool_()))
    if op == "text":
        value = _evaluate(node[2], table)
        if _is_null(value):
            return pa.scalar(None, pa.int32() if node[1] == "utf8_length" else pa.string())
        if node[1] in ("utf8_lower", "utf8_upper") and pc.any(pc.invert(pc.string_is_ascii(value))).as_py():
            raise ValueError("lower or upper of text beyond ASCII: Java's case rules are the Spark job's")
        return getattr(pc, node[1])(value, characters=" ") if node[1] in TRIMS.values() else getattr(pc, node[1])(value)
    if op == "concat":
        parts = [_evaluate(part, table) for part in node[1]]
        if any(_is_null(part) for part in parts):
            return pa.scalar(None, pa.string())
        return pc.binary_join_element_wise(*(part.cast(pa.string()) for part in parts), "")
    if op == "coalesce":
        return pc.coalesce(*(_as(_evaluate(part, table), ARROW[node[2]]) for part in node[1]))
    if op == "arith":
        return _arithmetic_value(node, table)
    if op == "cast":
        return _cast_value(node, table)
    if op == "case":
        wanted = ARROW[node[3]]
        tests = [_as(_evaluate(test, table), pa.bool_()) for test, _value in node[1]]
        tests = [pa.repeat(test, table.num_rows) if isinstance(test, pa.Scalar) else test for test in tests]
        values = [_as(_evaluate(value, table), wanted) for _test, value in node[1]]
        conditions = pc.make_struct(*tests, field_names=[str(i) for i in range(len(tests))])
        return pc.case_when(conditions, *values, _as(_evaluate(node[2], table), wanted))
    raise ValueError(f"no such step {op}")


def _arithmetic_value(node: tuple, table: pa.Table):  # noqa: ANN202 - an array or a scalar
    """An arithmetic node's values; ValueError where the Spark job's may differ (the module's docstring)."""
    import pyarrow.compute as pc

    _op, function, a_node, b_node, kind, narrow = node
    wanted = ARROW[kind]
    operands = [_evaluate(part, table) for part in (a_node, b_node) if part is not None]
    if any(_is_null(part) for part in operands):
        return pa.scalar(None, wanted)
    operands = [_as(part, wanted) for part in operands]  # a safe cast: an integer beyond 2**53 as a double raises
    if function in DIVISIONS:  # NULL for a divisor of 0, as Spark's (ANSI off)
        dividend, divisor = operands
        zero = pc.equal(divisor, pa.scalar(0, divisor.type))
        if isinstance(zero, pa.Scalar):
            if zero.as_py():
                return pa.scalar(None, wanted)
            value = getattr(pc, function)(dividend, divisor)
        else:
            value = pc.if_else(zero, pa.scalar(None, wanted), getattr(pc, function)(dividend, pc.if_else(zero, pa.scalar(1, divisor.type), divisor)))
    else:
        value = getattr(pc, function)(*operands)
    if isinstance(value, pa.Scalar):
        values = pa.array([value.as_py()], wanted)
    else:
        values = value.drop_null()
    if len(values):
        bound = INT32 if narrow else EXACT_INTEGERS
        if kind == "double" and not pc.all(pc.is_finite(values)).as_py():
            raise ValueError("arithmetic: an infinite result")
        if pc.max(pc.abs(values)).as_py() >= bound:
            raise ValueError(f"arithmetic: a result at or beyond 2**{31 if narrow else 53}")
        if kind == "double" and negative_zero(values):
            raise ValueError("arithmetic: -0.0, which a bigint's 0 is in the Spark job")
    return value


def _cast_value(node: tuple, table: pa.Table):  # noqa: ANN202 - an array or a scalar
    """A cast's values; ValueError where the Spark job's may differ (text other than digits, an
    integer beyond the type's range)."""
    import pyarrow.compute as pc

    _op, into, part, kind = node
    wanted = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "double": pa.float64(), "bool": pa.bool_()}[into]
    value = _evaluate(part, table)
    if _is_null(value):
        return pa.scalar(None, wanted)
    if kind == "string":
        texts = pa.array([value.as_py()], pa.string()) if isinstance(value, pa.Scalar) else value.drop_null()
        spelling, what = {"double": (_DECIMAL_TEXT, "a decimal number"), "bool": (BOOLEAN_TEXT, "Spark's words for true and false")}.get(
            into, (_DIGITS, "digits"))
        if len(texts) and not pc.all(pc.match_substring_regex(texts, spelling)).as_py():
            raise ValueError(f"a cast of text other than {what}: Spark's reading of it is its own")
        if into == "bool":  # pyarrow's cast takes "true", "false", "1" and "0" only
            if isinstance(value, pa.Scalar):
                return pa.scalar(value.as_py().lower() in TRUE_TEXTS)
            return pc.if_else(pc.is_valid(value), pc.is_in(pc.utf8_lower(value), pa.array(TRUE_TEXTS)), pa.scalar(None, pa.bool_()))
        if into == "double":
            doubles = value.cast(wanted)
            if not pc.all(pc.is_finite(doubles.drop_null() if not isinstance(doubles, pa.Scalar) else pa.array([doubles.as_py()]))).as_py():
                raise ValueError("text beyond a double's range")
            return doubles
    elif kind == "double":
        value = pc.trunc(value)
    return value.cast(wanted)  # a safe cast: beyond the type's range (or 2**53 as a double) raises


def negative_zero(values: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a double anywhere in `values` (through structs, lists and maps) is -0.0. pyarrow
    reads a JSON `-0` so; the Spark job, where it infers the batch's types (processors), reads a
    field whose values are all integral as a bigint, whose 0 has no sign."""
    import pyarrow.compute as pc

    if isinstance(values, pa.ChunkedArray):
        return any(negative_zero(chunk) for chunk in values.chunks)
    data_type = values.type
    if pa.types.is_floating(data_type):
        zeros = values.filter(pc.fill_null(pc.equal(values, pa.scalar(0.0, data_type)), False))
        return len(zeros) > 0 and pc.any(pc.less(pc.divide(pa.scalar(1.0, data_type), zeros), 0.0)).as_py()
    if pa.types.is_struct(data_type):
        return any(negative_zero(child) for child in values.flatten())
    if pa.types.is_map(data_type):
        return negative_zero(values.keys) or negative_zero(values.items)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return negative_zero(values.flatten())
    return False


def _as(value, data_type: pa.DataType):  # noqa: ANN001, ANN202 - an array or a scalar, in `data_type`
    if isinstance(value, pa.Scalar) and not value.is_valid:
        return pa.scalar(None, data_type)
    return value.cast(data_type)


def _is_null(value) -> bool:  # noqa: ANN001
    return isinstance(value, pa.Scalar) and not value.is_valid


def _as_bool(value):  # noqa: ANN001, ANN202
    return pa.scalar(None, pa.bool_()) if isinstance(value, pa.Scalar) and value.type == pa.null() else value
