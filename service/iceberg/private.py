"""Every call Calve makes into pyiceberg's private API, each with the public API that would replace it.

pyiceberg 0.12 has no public way to build a DataFile for a bucket-partitioned table from a file's
values (`add_files` refuses non-linear transforms), so appends.py builds them itself with these.
"""

from __future__ import annotations

from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import DataFileStatistics
from pyiceberg.partitioning import PartitionField
from pyiceberg.schema import Schema
from pyiceberg.table import Transaction


def table_io(transaction: Transaction) -> FileIO:
    """The FileIO of the transaction's table. Public replacement: a `Transaction.io` property
    (today only `Table.io` is public, and a transaction keeps its table private)."""
    return transaction._table.io  # noqa: SLF001


def partition_value(statistics: DataFileStatistics, field: PartitionField, schema: Schema) -> Any:  # noqa: ANN401
    """A file's value of an order-preserving partition field, from its column statistics: what
    `add_files` does per file. Public replacement: `add_files` accepting every transform, or a
    public `DataFileStatistics.partition`."""
    return statistics._partition_value(field, schema)  # noqa: SLF001
