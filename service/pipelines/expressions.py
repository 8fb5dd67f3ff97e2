"""Expressions in pipeline definitions (processors, routes, operations): one Spark SQL expression
over the event's fields, parsed with sqlglot's Spark dialect before it is stored.

They run on a Spark shared by all tenants, so an expression may call only the functions in
ALLOWED_FUNCTIONS: ones that read the event (and the clock) and cannot fail or flood on purpose.
No reflection, files, session or catalog facts (`user()`, `version()`, `current_database()`),
`raise_error`/`assert_true`, generators, aggregates, or functions whose output size an event can
choose (`repeat`, `sequence`, `space`). Expressions are bounded: at most MAX_EXPRESSION_LENGTH
characters, parentheses nested at most MAX_EXPRESSION_DEPTH deep.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Annotated

import sqlglot
from pydantic import Field
from sqlglot import exp
from sqlglot.tokens import TokenType

from spark_jobs.contract import INTERNAL_PREFIX

MAX_EXPRESSION_LENGTH = 4000
MAX_EXPRESSION_DEPTH = 32  # parentheses; also keeps sqlglot's recursive parser far from its limit
# All of a definition's expressions together: checking them costs ~10 ms per 1,000 characters,
# in the api storing the definition (PipelineDefinition checks this on new definitions only).
MAX_DEFINITION_EXPRESSIONS = 20_000
_STORED = ContextVar("calve_stored_definition", default=False)


@contextlib.contextmanager
def stored() -> Iterator[None]:
    """Definitions read back from the metadata DB: their expressions were checked when they were
    stored (by the rules then), so reading one back parses none (a definition of 50 long routes
    took ~2 s to check), and no limit added since makes a stored pipeline unreadable."""
    token = _STORED.set(True)
    try:
        yield
    finally:
        _STORED.reset(token)


def is_stored() -> bool:
    return _STORED.get()
# Spark SQL functions an expression may call: each reads only its arguments (or the clock, or a
# random source) and its output grows at most with its input.
ALLOWED_FUNCTIONS = frozenset("""
    ascii base64 unbase64 bit_length btrim char chr char_length character_length concat concat_ws contains
    decode encode endswith startswith find_in_set format_number format_string printf initcap instr lcase
    lower ucase upper left right length len levenshtein locate position ltrim rtrim trim octet_length
    overlay regexp_count regexp_extract regexp_extract_all regexp_instr regexp_like regexp_replace
    regexp_substr replace reverse soundex split split_part substr substring substring_index translate
    to_binary to_char to_varchar to_number try_to_number url_decode url_encode try_url_decode parse_url
    mask md5 sha sha1 sha2 crc32 hash xxhash64 luhn_check elt like ilike rlike hex unhex bin conv uuid
    abs acos acosh asin asinh atan atan2 atanh bround cbrt ceil ceiling cos cosh cot csc degrees e exp
    expm1 factorial floor greatest least ln log log10 log1p log2 mod pmod negative positive pi pow power
    radians rint round sec shiftleft shiftright shiftrightunsigned sign signum sin sinh sqrt tan tanh
    try_add try_divide try_multiply try_subtract try_mod width_bucket div nanvl isnan rand random randn
    coalesce if ifnull nullif nvl nvl2 isnull isnotnull nullifzero zeroifnull equal_null
    cast try_cast boolean int integer bigint smallint tinyint double float string date timestamp decimal
    binary to_date to_timestamp to_timestamp_ltz to_timestamp_ntz try_to_timestamp to_unix_timestamp
    to_utc_timestamp from_utc_timestamp unix_timestamp from_unixtime timestamp_seconds timestamp_millis
    timestamp_micros unix_seconds unix_millis unix_micros unix_date date_from_unix_date
    add_months current_date current_timestamp now localtimestamp current_timezone date_add dateadd
    date_diff datediff date_format date_part datepart date_sub date_trunc trunc day dayofmonth dayofweek
    dayofyear extract hour minute second month quarter year week weekday weekofyear last_day next_day
    make_date make_timestamp make_interval months_between timestampadd timestampdiff try_make_timestamp
    convert_timezone
    array array_contains array_distinct array_except array_intersect array_join array_max array_min
    array_position array_remove array_union arrays_overlap arrays_zip array_sort sort_array array_compact
    array_append array_prepend array_insert array_size cardinality size element_at try_element_at get
    slice flatten shuffle filter transform exists forall aggregate reduce zip_with map map_concat
    map_contains_key map_entries map_filter map_from_arrays map_from_entries map_keys map_values
    map_zip_with str_to_map transform_keys transform_values named_struct struct get_json_object
    from_json to_json json_array_length json_object_keys schema_of_json typeof bit_count bit_get getbit
""".split())
# SQL words that an opening parenthesis may follow without being a function call.
_KEYWORDS_BEFORE_PAREN = frozenset({
    "and", "or", "not", "in", "when", "then", "else", "case", "is", "between", "like", "rlike", "ilike", "distinct", "interval",
})


def check_expression(text: str) -> str:
    """A single Spark SQL expression over the event's fields, or ValueError saying why not."""
    if _STORED.get():
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError("an expression is needed")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ValueError(f"an expression may have at most {MAX_EXPRESSION_LENGTH} characters")
    try:
        tokens = sqlglot.tokenize(text, read="spark")
    except sqlglot.errors.SqlglotError as exc:
        raise ValueError(f"not a Spark SQL expression: {str(exc).splitlines()[0]}") from None
    _check_calls(tokens)
    try:
        parsed = sqlglot.parse(text, read="spark")
    except sqlglot.errors.SqlglotError as exc:
        raise ValueError(f"not a Spark SQL expression: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    if len(parsed) != 1 or parsed[0] is None:
        raise ValueError("one expression, not several statements")
    tree = parsed[0]
    if isinstance(tree, (exp.Query, exp.DDL, exp.DML, exp.Command)) or tree.find(exp.Query, exp.Table):
        raise ValueError("an expression over the event's fields; queries and tables are not allowed")
    if tree.find(exp.AggFunc, exp.Window):
        raise ValueError("aggregate and window functions work across events; an expression reads one event")
    for column in tree.find_all(exp.Column):
        if column.name.lower().startswith(INTERNAL_PREFIX):
            raise ValueError(f"names starting with {INTERNAL_PREFIX!r} are Calve's own (receipts, routing)")
    return text


def _check_calls(tokens: list) -> None:
    """Every word followed by '(' is an allowed function (checked on the tokens, as written: the
    parsed tree renames many functions), and parentheses nest at most MAX_EXPRESSION_DEPTH deep."""
    depth = 0
    for index, token in enumerate(tokens):
        if token.token_type == TokenType.L_PAREN:
            depth += 1
            if depth > MAX_EXPRESSION_DEPTH:
                raise ValueError(f"the expression nests parentheses more than {MAX_EXPRESSION_DEPTH} deep")
            if index and tokens[index - 1].token_type not in (TokenType.L_PAREN, TokenType.COMMA):
                name = tokens[index - 1].text.lower()
                if name.isidentifier() and name not in _KEYWORDS_BEFORE_PAREN and name not in ALLOWED_FUNCTIONS:
                    raise ValueError(f"function {name}() is not allowed in pipeline expressions "
                                     "(expressions may call only functions that read the event; the README lists them)")
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1


Expression = Annotated[str, Field(min_length=1, max_length=MAX_EXPRESSION_LENGTH)]
