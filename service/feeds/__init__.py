"""The change feed: cursors into a table's history, pages of changes read from them, and the
consumers that keep a cursor between reads (stored in the metadata DB, honoured by snapshot
expiry). The rows themselves are read by service/iceberg/changelog.py."""
