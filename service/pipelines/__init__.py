"""Pipeline definitions: the model and its checks (spec.py), and the versioned store (store.py)."""
