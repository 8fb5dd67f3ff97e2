"""Rows bound for a table in the table's types (coerce.py converts each column), with the reason
for those that must go to the DLQ instead, and the event's fields no column takes: kept in the
sink's extra_fields map, or named as dropped."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.coerce import coerce, exact_type, shadow_type
from spark_jobs.columns import DROPPED, EVENT, INTERNAL, NULLED, OP, OP_VALUE, REASON, RECEIPT, SEQ, TABLE, any_of, by_name
from spark_jobs.targets import Target

NO_NAMES = "array<string>"


def convert(rows: DataFrame, target: Target, consumed: list[str], parsed_with_table_schema: bool,
            processed: frozenset[str] = frozenset(), produced: frozenset[str] = frozenset()) -> DataFrame:
    """Rows in the table's types, with a REASON for those that must go to the DLQ instead, the
    fields no column takes (DROPPED) and the optional columns whose value the event had but
    could not be converted, so NULL in the row (NULLED). `consumed`: fields the sink's operation reads (no
    column's); `parsed_with_table_schema`: the events' other fields were never parsed (columns
    the parse lacks are then read from the events' text, but for `processed`: fields the
    definition's processors dropped or renamed). Parsed with the batch's inferred types instead,
    map columns the processors left alone (not `processed`, not `produced`: given a value) and the
    parse did not read as maps are read from the events' text again, as the table's type:
    inference makes an object a struct (no field for a key "", none at all for objects without
    keys) and a column holding an object in one event and anything else in another text (no
    event's map could be read from it)."""
    target_fields = from_arrow_schema(target.schema).fields
    if parsed_with_table_schema:
        present = set(rows.columns)
        rows = _read_late(rows, [f for f in target_fields if f.name not in present and f.name != target.extra_fields and f.name not in processed])
    else:
        parsed = {f.name: f.dataType for f in rows.schema.fields}
        rows = _read_late(rows, [f for f in target_fields if holds_maps(f.dataType) and f.name != target.extra_fields
                                 and f.name not in processed | produced and parsed.get(f.name) != shadow_type(f.dataType)])
    source_types = {f.name: f.dataType for f in rows.schema.fields}
    exact = [f for f in target_fields if f.name in source_types and f.name not in processed | produced and exact_type(f.dataType) is not None]
    rows = _with_exact_decimals(rows, exact)
    keys = set(target.changes.keys) if target.changes is not None else set()
    # A delete needs only the row's key: the table's other required fields may be absent.
    not_delete = F.col(OP) != F.lit("D") if keys else F.lit(True)
    columns, reasons, present, nulled = [], [], [], []
    for column in target_fields:
        if column.name == target.extra_fields:
            kept = extra_fields(rows, target, consumed, parsed_with_table_schema)
            columns.append(kept.alias(column.name))
            present.append(kept.isNotNull())
            continue
        if column.name in source_types:
            converted = coerce(by_name(column.name), source_types[column.name], column.dataType,
                               F.col(EXACT).getField(column.name) if column in exact else None)
            present.append(by_name(column.name).isNotNull())
        else:
            converted = coerce(F.lit(None), T.NullType(), column.dataType)
        columns.append(converted.value.alias(column.name))
        missing = by_name(column.name).isNull() if column.name in source_types else F.lit(True)
        unconvertible = F.lit(f"field {column.name!r} cannot be converted to {column.dataType.simpleString()}")
        if column.name in keys:
            reasons.append(F.when(missing, F.lit(f"missing identifier field {column.name!r}")))
            reasons.append(F.when(~converted.ok, unconvertible))
        elif column.name in target.required:
            reasons.append(F.when(not_delete & missing, F.lit(f"missing required field {column.name!r}")))
            reasons.append(F.when(not_delete & ~converted.ok, unconvertible))
        elif column.name in source_types:
            nulled.append(F.when(~converted.ok, F.lit(column.name)))
    matches_nothing = ~any_of(present)
    reasons.insert(0, F.when(matches_nothing, F.lit(f"no field of the event matches a column of table {target.name!r}")))
    extra = [SEQ]
    if keys:
        reasons.insert(0, F.when(F.col(OP).isNull(), F.concat(
            F.lit("operation "), F.coalesce(F.concat(F.lit("'"), F.col(OP_VALUE), F.lit("'")), F.lit("null")),
            F.lit(" is not insert, update or delete"),
        )))
        extra.append(OP)
    dropped = F.array().cast(NO_NAMES) if target.extra_fields else dropped_fields(rows, target, consumed, parsed_with_table_schema)
    unconverted = F.filter(F.array(*nulled), lambda name: name.isNotNull()) if nulled else F.array().cast(NO_NAMES)
    return rows.select(RECEIPT, EVENT, TABLE, *extra, *columns, F.coalesce(*reasons).alias(REASON), dropped.alias(DROPPED),
                       unconverted.alias(NULLED))


def _read_late(rows: DataFrame, columns: list[T.StructField]) -> DataFrame:
    """The rows with these of the table's columns read from the events' text by one more parse,
    in the types the parse with the table's schema gives them (scalars as text: coerce converts
    them), in place of what the rows had."""
    if not columns:
        return rows
    late = F.from_json(F.col(EVENT), T.StructType([T.StructField(f.name, shadow_type(f.dataType), True) for f in columns]))
    return rows.withColumn(LATE, late).withColumns({f.name: F.col(LATE).getField(f.name) for f in columns}).drop(LATE)


def _with_exact_decimals(rows: DataFrame, columns: list[T.StructField]) -> DataFrame:
    """The rows with these columns' decimals parsed once more from the events' text, exactly
    (coerce's `exact`), in EXACT: one parse for all of them, so that a table of many decimal
    columns costs one parse more, not one per column. An event with a value beyond 38 digits
    (beyond any decimal column) may leave its other decimals to their text's conversion."""
    if not columns:
        return rows
    return rows.withColumn(EXACT, F.from_json(F.col(EVENT), T.StructType([T.StructField(f.name, exact_type(f.dataType), True) for f in columns])))


EXACT = f"{INTERNAL}exact"


def holds_maps(data_type: T.DataType) -> bool:
    """A map, or a list of them: nothing whose extra fields are looked for (a struct's are)."""
    if isinstance(data_type, T.ArrayType):
        return holds_maps(data_type.elementType)
    return isinstance(data_type, T.MapType)


LATE = f"{INTERNAL}late"


def dropped_fields(rows: DataFrame, target: Target, consumed: list[str], parsed_with_table_schema: bool) -> Column:
    """The names of the event's fields that no column of the table takes (and no operation
    reads), top-level ones and those inside objects a struct column lacks (`user.email`): what
    writing the row loses, said in the receipt instead of silently."""
    taken = [*target.schema.names, *consumed]
    if parsed_with_table_schema:
        # Parsed with the table's own fields, the others were never read: look at the keys.
        parts = [_other_keys(path, names) for path, names in [(ROOT, taken), *_struct_paths(target)]]
    else:
        entries = [(name, value) for name, value, _type in [*_unparsed_columns(rows, taken), *_missing_fields(rows, target)]]
        parts = [F.filter(F.array(*[F.when(value.isNotNull(), F.lit(name)) for name, value in entries]), lambda n: n.isNotNull())] if entries else []
    if not parts:
        return F.array().cast(NO_NAMES)
    return parts[0] if len(parts) == 1 else F.concat(*parts)  # a name twice is counted once (PipelineJob._counts)


def extra_fields(rows: DataFrame, target: Target, consumed: list[str], parsed_with_table_schema: bool) -> Column:
    """The event's fields that no other column of the table takes (and no operation reads),
    non-null ones, as a map of their JSON text (strings as they are); NULL when none. Fields inside
    an object that its struct column lacks are there under their dotted path (`user.email`)."""
    taken = [n for n in target.schema.names if n != target.extra_fields] + [n for n in consumed if n not in target.schema.names]
    if parsed_with_table_schema:
        # Parsed with the table's own fields, the others were never read: parse them as text.
        maps = [_unread_fields(path, names) for path, names in [(ROOT, taken), *_struct_paths(target)]]
    else:
        maps = [_entries_map(entries) for entries in (_unparsed_columns(rows, taken), _missing_fields(rows, target)) if entries]
    if not maps:
        return F.lit(None).cast(TEXT_MAP)
    if len(maps) == 1:
        kept = maps[0]
    else:
        # A top-level field spelled like a nested path (`"user.email": ...`) keeps its own value:
        # the first entry of a key wins (a map with a key twice would fail the whole batch).
        # One fold over the entries: a lambda that read `entries` again would compute them again.
        entries = F.concat(*[F.map_entries(F.coalesce(m, F.create_map().cast(TEXT_MAP))) for m in maps])
        kept = F.map_from_entries(F.aggregate(
            entries, F.array().cast(ENTRIES),
            lambda firsts, entry: F.when(F.exists(firsts, lambda first: first["key"] == entry["key"]), firsts).otherwise(
                F.concat(firsts, F.array(entry))),
        ))
    return F.when(F.size(kept) > 0, kept)


ROOT: tuple[str, ...] = ()
TEXT_MAP = "map<string,string>"
ENTRIES = "array<struct<key:string,value:string>>"


def _json_at(path: tuple[str, ...]) -> Column:
    """The JSON text of the event's value at `path` (the whole event at the root)."""
    if not path:
        return F.col(EVENT)
    return F.get_json_object(F.col(EVENT), "$" + "".join(f"['{name}']" for name in path))


def _other_keys(path: tuple[str, ...], taken: list[str]) -> Column:
    """The keys of the event's object at `path` other than `taken`, as dotted paths below the
    root (an empty array where the value is no object)."""
    names = F.array(*[F.lit(n) for n in taken]).cast(NO_NAMES)
    others = F.array_except(F.coalesce(F.json_object_keys(_json_at(path)), F.array().cast(NO_NAMES)), names)
    return F.transform(others, lambda k: F.concat(F.lit(".".join(path) + "."), k)) if path else others


def _unread_fields(path: tuple[str, ...], taken: list[str]) -> Column:
    """The non-null fields of the event's object at `path` other than `taken`, as a map of their
    JSON text (strings as they are) keyed by their dotted path below the root; NULL for events
    that have none (listing the keys costs less than the map, so the map is built only then)."""
    text = _json_at(path)
    names = F.array(*[F.lit(n) for n in taken]).cast(NO_NAMES)
    others = F.array_except(F.coalesce(F.json_object_keys(text), F.array().cast(NO_NAMES)), names)
    fields = F.map_filter(F.from_json(text, T.MapType(T.StringType(), T.StringType())), lambda k, v: v.isNotNull() & ~F.array_contains(names, k))
    if path:
        prefix = ".".join(path) + "."
        fields = F.transform_keys(fields, lambda k, _v: F.concat(F.lit(prefix), k))
    return F.when(F.size(others) > 0, fields)


def _entries_map(entries: list[tuple[str, Column, T.DataType]]) -> Column:
    """A map of (name, value as text) of the non-null values."""
    structs = F.array(*[F.struct(F.lit(name).alias("key"), as_text(value, data_type).alias("value")) for name, value, data_type in entries])
    return F.map_from_entries(F.filter(structs, lambda entry: entry["value"].isNotNull()))


def _unparsed_columns(rows: DataFrame, taken: list[str]) -> list[tuple[str, Column, T.DataType]]:
    """The batch's top-level fields (parsed with its own types) that no column takes."""
    return [(f.name, by_name(f.name), f.dataType) for f in rows.schema.fields if not f.name.startswith(INTERNAL) and f.name not in taken]


def _struct_paths(target: Target) -> list[tuple[tuple[str, ...], list[str]]]:
    """Every struct of the table's columns, at any depth through structs (a list's or map's
    elements are not followed), as (path, its field names). Paths a JSONPath cannot quote are left out."""
    def below(data_type: T.DataType, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], list[str]]]:
        if not isinstance(data_type, T.StructType):
            return []
        found = [(path, data_type.fieldNames())]
        for field in data_type.fields:
            found += below(field.dataType, (*path, field.name))
        return found

    columns = [f for f in from_arrow_schema(target.schema).fields if f.name != target.extra_fields]
    return [(path, names) for column in columns for path, names in below(column.dataType, (column.name,)) if all("'" not in n for n in path)]


def _missing_fields(rows: DataFrame, target: Target) -> list[tuple[str, Column, T.DataType]]:
    """The fields of the batch's parsed structs (its own types) that their columns' struct types
    lack, at any depth, as (dotted path, value, type)."""
    def missing(source: T.DataType, wanted: T.DataType, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], T.DataType]]:
        if not isinstance(source, T.StructType) or not isinstance(wanted, T.StructType):
            return []
        found = []
        for field in source.fields:
            if field.name not in wanted.fieldNames():
                found.append(((*path, field.name), field.dataType))
            else:
                found += missing(field.dataType, wanted[field.name].dataType, (*path, field.name))
        return found

    source_types = {f.name: f.dataType for f in rows.schema.fields}
    found = [
        (path, data_type) for column in from_arrow_schema(target.schema).fields if column.name in source_types
        for path, data_type in missing(source_types[column.name], column.dataType, (column.name,))
    ]
    return [(".".join(path), _field_at(path), data_type) for path, data_type in found]


def _field_at(path: tuple[str, ...]) -> Column:
    value = by_name(path[0])
    for name in path[1:]:
        value = value.getField(name)
    return value


def as_text(column: Column, data_type: T.DataType) -> Column:
    """A field's value as an extra_fields map keeps it: strings as they are, others as JSON."""
    if isinstance(data_type, T.StringType):
        return column
    if isinstance(data_type, (T.StructType, T.ArrayType, T.MapType)):
        return F.to_json(column)
    return column.cast("string")
