"""One load per key at a time, and entries looked up again before they expire, for the api's
caches of what the metadata DB holds."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator

from cachetools import TTLCache


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


class RefreshAhead:
    """Which of a cache's entries are due to be looked up again while they still serve: those
    past half their time (`ttl_s`), one lookup per key at a time. An entry that expires sends
    the requests that miss it to the DB (the api's routed way, every request in flight then
    waiting on the one lookup); looked up in time, it never expires while in use. Not
    thread-safe: its cache calls it under its own lock."""

    def __init__(self, ttl_s: float, maxsize: int) -> None:
        self._fresh: TTLCache = TTLCache(maxsize=maxsize, ttl=ttl_s / 2)
        self._running: set[Hashable] = set()
        self.generation = 0  # moved on by clear(): a lookup begun before it does not store its answer

    def keep(self, cache: TTLCache, key: Hashable, value: object, since: int) -> None:
        """`value` kept in `cache` for `key`, its time begun again, unless a clear() came after
        the lookup that read it began (`since`: the generation then): the DB may have been read
        before the change that clear() announced. Under the cache's lock."""
        if since == self.generation:
            cache[key] = value
            self._fresh[key] = True

    def due(self, key: Hashable) -> bool:
        """True once for a key past half its time, until its lookup is done()."""
        if key in self._fresh or key in self._running:
            return False
        self._running.add(key)
        return True

    def done(self, key: Hashable) -> None:
        self._running.discard(key)

    def forget(self, key: Hashable) -> None:
        self._fresh.pop(key, None)

    def clear(self) -> None:
        self._fresh.clear()
        self.generation += 1
