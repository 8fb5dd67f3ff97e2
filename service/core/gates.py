"""One load per key at a time, for the api's caches of what the metadata DB holds."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator


class LoadGates:
    """When a cached entry expires under load, every request in flight misses it at once: without
    a gate each would ask the DB (an api's share of its CPU at 300 requests/s, measured: ~2.5%
    in pipeline lookups). The first to miss a key loads it; the others wait on its gate, then
    find its answer cached. Safe across the threadpool's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[Hashable, threading.Lock] = {}

    @contextlib.contextmanager
    def one_at_a_time(self, key: Hashable) -> Iterator[None]:
        with self._lock:
            gate = self._gates.setdefault(key, threading.Lock())
        try:
            with gate:
                yield
        finally:
            with self._lock:
                if self._gates.get(key) is gate:  # (a waiter after it finds another's gate, or none)
                    del self._gates[key]
