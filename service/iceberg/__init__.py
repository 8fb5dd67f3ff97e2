"""Calve's Iceberg layer: opening the catalog (catalog.py), the committer's watermark
(watermark.py), the one way a conflicting commit is retried (conflicts.py), schema evolution
(schema.py), appending Spark's files (appends.py), rewrites (rewrites.py), upkeep (upkeep.py,
compaction.py), the change feed's rows (changelog.py), and every call into pyiceberg's private
API (private.py).

Who may change a table, and why that is safe:
- Only the table's leader (the committer holding its Redis lease, committer/leases.py) makes
  snapshots that add data: appends of the files writers hand over through the commit stream, and
  the DLQ deletes that a replay's batch carries with them. Writers and the api prepare files and
  hand them over; they never commit data to a table.
- Two other changes come from elsewhere, and neither adds or moves data: a writer creates a table
  and adds optional columns (schema evolution: a metadata-only commit that several writers may
  race to make; the loser reloads and finds the column there), and the api's DLQ purge deletes
  DLQ rows by id (a delete that is safe to repeat on any later state of the table).
- Every commit is compare-and-swap on the table's metadata location, so no change is lost to a
  concurrent one: the loser reloads and tries again (conflicts.py). For the leader's appends that retry is
  Calve's own, never pyiceberg's (commit.retry.num-retries=0): after a reload the leader keeps
  only the commit-stream entries after the table's watermark (the last entry id it holds, kept in
  the snapshot summary), so a stale leader's commit, or its own earlier one whose acknowledgement
  was lost, is never applied twice. The fence in the summary shows which leader made each commit.
"""
