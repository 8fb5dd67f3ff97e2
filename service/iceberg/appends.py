"""Appending the Parquet files Spark wrote to a table, in one append snapshot per commit."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow.parquet as pq
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.typedef import Record

from service.core.keys import SUMMARY_REGISTERED
from service.iceberg import private
from service.iceberg.registration import committed_data_file, partition_values
from spark_jobs.contract import BUCKETS_METADATA

# The committer reads a registered file's footer again: the api refused larger ones already.
MAX_FOOTER_BYTES = 64 * 1024 * 1024


def append_files(
    transaction: Transaction, files: list[str], snapshot_properties: dict[str, str],
    registered: dict[str, dict | None] | None = None, live: Callable[[], set[str]] | None = None,
) -> None:
    """Append Parquet files (written by Spark, so without field ids) in one append snapshot, with
    the `registered` files written elsewhere.

    pyiceberg's `add_files` derives each file's partition from its column statistics, which works
    for order-preserving transforms only. For bucket partitions the writer made every file hold
    one bucket; its value is computed here from the file's own values (and checked to be one).
    Registered files (path -> the api's description) are committed by registration.py; one the table already lists
    (`live`: the paths of its data files, asked only when there are registered files) is skipped,
    so a file notified again after its deduplication key expired is still not added twice.
    """
    spec = transaction.table_metadata.spec()
    if registered:
        present = live() if live is not None else set()
        fresh = {path: description for path, description in registered.items() if path not in present}
        ensure_name_mapping(transaction)
        io, metadata = private.table_io(transaction), transaction.table_metadata
        own = [data_file(transaction, path) for path in files]
        # Each registered file is asked its size (or read again, if the table changed since the api
        # checked it): a few at once, as an object store answers each in tens of ms.
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="registered") as pool:
            others = list(pool.map(lambda item: committed_data_file(metadata, io, *item, MAX_FOOTER_BYTES), fresh.items()))
        _append_data_files(transaction, own + others, {**snapshot_properties, SUMMARY_REGISTERED: str(len(fresh))})
        return
    if all(field.transform.preserves_order for field in spec.fields):
        # The watermark already excludes files the table has; scanning every manifest for
        # duplicates would make each commit slower than the last.
        transaction.add_files(files, snapshot_properties=snapshot_properties, check_duplicate_files=False)
        return
    ensure_name_mapping(transaction)
    _append_data_files(transaction, [data_file(transaction, path) for path in files], snapshot_properties)


def _append_data_files(transaction: Transaction, data_files: list[DataFile], snapshot_properties: dict[str, str]) -> None:
    producer = transaction.update_snapshot(snapshot_properties=snapshot_properties)
    # As add_files does: a merge append when the table merges manifests (Calve's tables do).
    merging = transaction.table_metadata.properties.get(TableProperties.MANIFEST_MERGE_ENABLED, "false") == "true"
    with (producer.merge_append() if merging else producer.fast_append()) as append:
        for written in data_files:
            append.append_data_file(written)


def ensure_name_mapping(transaction: Transaction) -> None:
    """Spark writes Parquet without field ids: readers find columns by the table's name mapping."""
    if transaction.table_metadata.name_mapping() is None:
        transaction.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING: transaction.table_metadata.schema().name_mapping.model_dump_json()})


def data_file(transaction: Transaction, path: str) -> DataFile:
    """The table's DataFile for a Parquet file: statistics from its footer, partition from its
    statistics (order-preserving transforms), or for a bucket from the file's metadata
    (BUCKETS_METADATA, where its task wrote it for the table's transform and source column as they
    are now) or its values."""
    metadata = transaction.table_metadata
    schema = metadata.schema()
    input_file = private.table_io(transaction).new_input(path)
    with input_file.open() as stream:
        parquet_metadata = pq.read_metadata(stream)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    values = []
    described = _described_buckets(parquet_metadata.metadata)
    for field in metadata.spec().fields:
        if field.transform.preserves_order:
            values.append(private.partition_value(statistics, field, schema))
        elif (key := (schema.find_column_name(field.source_id), str(field.transform))) in described:
            values.append(described[key])
        else:
            values.append(_partition_from_values(transaction, path, field, schema))
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*values),
        file_size_in_bytes=len(input_file),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def _described_buckets(footer_metadata: dict[bytes, bytes] | None) -> dict[tuple[str, str], int | None]:
    """(source column, transform) -> bucket, as a file's BUCKETS_METADATA names them (none if it has none)."""
    text = (footer_metadata or {}).get(BUCKETS_METADATA.encode())
    if text is None:
        return {}
    return {(source, transform): value for source, transform, value in json.loads(text)}


def _partition_from_values(transaction: Transaction, path: str, field, schema):  # noqa: ANN001, ANN202
    source = schema.find_field(field.source_id)
    found = partition_values(private.table_io(transaction), path, source.name, field.transform.transform(source.field_type)) - {None}
    if len(found) > 1:
        raise ValueError(f"{path} holds {len(found)} values of partition {field.name}; the writer must write one per file")
    return found.pop() if found else None
