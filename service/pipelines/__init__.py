"""Pipeline definitions: the model (spec.py) with its expression checks (expressions.py), type
grammar (types.py) and declared table schemas (table_schema.py); the versioned store (store.py);
the built-in pipelines of the shippers' protocols (otel.py, loki.py)."""
