"""A table's schema as a pipeline definition declares it: columns (names and types, in the type
grammar of types.py) and the partition spec, and the Iceberg schema and spec they make."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import parse_transform
from pyiceberg.types import BinaryType, DateType, IcebergType, IntegerType, LongType, NestedField, PrimitiveType, StringType, TimestampType, TimestamptzType

from service.pipelines.types import check_writable, parse_type, parse_type_numbered
from spark_jobs.contract import INTERNAL_PREFIX

TIME_TRANSFORMS = ("year", "month", "day", "hour")
MAX_BUCKETS = 2**31 - 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def column_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
        raise ValueError(f"invalid column name {name!r}: letters, digits and '_', not starting with a digit")
    if name.lower().startswith(INTERNAL_PREFIX):
        raise ValueError(f"names starting with {INTERNAL_PREFIX!r} are Calve's own (receipts, routing)")
    return name


class Column(Strict):
    name: str
    type: str
    required: bool = False
    doc: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return column_name(value)

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        check_writable(parse_type(value))
        return value

    def iceberg_type(self) -> IcebergType:
        return parse_type(self.type)


class PartitionFieldSpec(Strict):
    column: str
    transform: str = "identity"

    @field_validator("transform")
    @classmethod
    def _transform(cls, value: str) -> str:
        value = value.strip().lower()
        if value in ("identity", *TIME_TRANSFORMS):
            return value
        match = re.fullmatch(r"(bucket|truncate)\[(\d+)\]", value)
        if match and 0 < int(match.group(2)) <= MAX_BUCKETS:
            return value
        raise ValueError(f"unknown transform {value!r}; use identity, year, month, day, hour, bucket[N] or truncate[N]")


class TableSchema(Strict):
    columns: list[Column] = Field(min_length=1)
    partition_spec: list[PartitionFieldSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> TableSchema:
        names = [column.name for column in self.columns]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"columns named twice: {duplicated}")
        types = {column.name: column.iceberg_type() for column in self.columns}
        for index, field in enumerate(self.partition_spec):
            if field.column not in types:
                raise ValueError(f"partition_spec[{index}]: no column {field.column!r} in the schema")
            column_type = types[field.column]
            if not isinstance(column_type, PrimitiveType):
                raise ValueError(f"partition_spec[{index}]: {field.column!r} is {column_type}; partition on a primitive column")
            if field.transform in TIME_TRANSFORMS and not isinstance(column_type, (DateType, TimestampType, TimestamptzType)):
                raise ValueError(f"partition_spec[{index}]: {field.transform} needs a date or timestamp column, {field.column!r} is {column_type}")
            if field.transform.startswith("truncate") and not isinstance(column_type, (IntegerType, LongType, StringType, BinaryType)):
                raise ValueError(f"partition_spec[{index}]: truncate needs an int, long, string or binary column")
            bucketable = (IntegerType, LongType, DateType, TimestampType, TimestamptzType, StringType, BinaryType)
            if field.transform.startswith("bucket") and not isinstance(column_type, bucketable):
                raise ValueError(f"partition_spec[{index}]: bucket needs an int, long, date, timestamp, string or binary column")
        return self

    def iceberg_schema(self) -> Schema:
        """Top-level ids 1..n, nested ids after them (the catalog assigns its own on creation anyway)."""
        next_id = len(self.columns)
        fields = []
        for index, column in enumerate(self.columns, start=1):
            column_type, next_id = parse_type_numbered(column.type, next_id)
            fields.append(NestedField(index, column.name, column_type, required=column.required, doc=column.doc))
        return Schema(*fields)

    def iceberg_partition_spec(self, schema: Schema) -> PartitionSpec:
        return PartitionSpec(*[
            PartitionField(
                source_id=schema.find_field(field.column).field_id, field_id=1000 + index,
                transform=parse_transform(field.transform), name=f"{field.column}_{field.transform.split('[')[0]}",
            )
            for index, field in enumerate(self.partition_spec)
        ])
