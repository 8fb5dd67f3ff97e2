"""Calve: multi-tenant HTTP ingestion into Apache Iceberg."""
