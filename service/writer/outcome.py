"""What a batch came to, as the hand-off needs it: the commit-stream entries per table (the DLQ's
among them), and per request the rows each table got, the fields it dropped and the columns where
values that could not be converted were written as NULL."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.protocol.commit_entry import CommitEntry


@dataclass
class ReceiptOutcome:
    """One request's share of a batch."""

    rows_by_table: dict[str, int] = field(default_factory=dict)
    dropped_by_table: dict[str, list[str]] = field(default_factory=dict)  # names of fields no column took
    nulled_by_table: dict[str, list[str]] = field(default_factory=dict)  # columns whose values could not be converted: NULL


@dataclass
class BatchOutcome:
    entries: list[CommitEntry] = field(default_factory=list)
    dropped_events: int = 0  # events written with fields no column took
    nulled_events: int = 0  # events written with values that could not be converted (NULL instead)
    receipts: dict[str, ReceiptOutcome] = field(default_factory=dict)
    full_job: bool = False  # the full Spark job wrote some of it (not all of it the short way)

    def add(self, entry: CommitEntry, dropped_by_receipt: dict[str, tuple[list[str], int]] | None = None,
            nulled_by_receipt: dict[str, tuple[list[str], int]] | None = None) -> None:
        """An entry for one table, the fields its rows dropped and the columns where they hold NULL
        for a value that could not be converted (each receipt -> (names, events))."""
        self.entries.append(entry)
        for receipt, rows in entry.rows_by_receipt.items():
            self.receipt(receipt).rows_by_table[entry.table] = rows
        for receipt, (names, events) in (dropped_by_receipt or {}).items():
            self.receipt(receipt).dropped_by_table[entry.table] = names
            self.dropped_events += events
        for receipt, (names, events) in (nulled_by_receipt or {}).items():
            self.receipt(receipt).nulled_by_table[entry.table] = names
            self.nulled_events += events

    def receipt(self, receipt: str) -> ReceiptOutcome:
        return self.receipts.setdefault(receipt, ReceiptOutcome())

    @property
    def files(self) -> list[str]:
        return [path for entry in self.entries for path in entry.files]
