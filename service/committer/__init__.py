"""The committer role: per table, one leader (Redis lease and fence) turns written files into
Iceberg snapshots, publishes receipts, and keeps the table healthy (upkeep)."""
