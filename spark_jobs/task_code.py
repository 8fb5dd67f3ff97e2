"""A task's code pickled once per process, its arguments with each job.

Spark Connect pickles a `mapInArrow` function into every plan it sends (cloudpickle), and
spark_jobs' modules are pickled by value (Spark's workers need nothing of Calve): for each
function it reaches, cloudpickle walks the whole of `sys.modules` looking for submodules it may
use. The short way's task reaches dozens: under `make bench`'s otlp load, that walk was about a
third of a writer's CPU, once per job, to pickle the same code again (README, "The short way").

`bound(function, *arguments)` is `functools.partial(function, *arguments)` but for pickling:
the function is pickled the first time (as Spark Connect would have) and those bytes are reused
by every later job, which pickles only its arguments (schemas, paths, tuples of plain data; no
function and no instance of a spark_jobs class, each of which would be pickled by value again).
A Spark worker unpickles the same function it always did.

The bytes hold the module globals the function reached as they were when it was first pickled:
whatever a job needs to vary travels as an argument, never as a global the writer changes (today
the globals reached are constants, and caches that only a worker's tasks fill).
"""

from __future__ import annotations

import functools
import pickle
import threading
from collections.abc import Callable

from pyspark import cloudpickle

_lock = threading.Lock()
_code: dict[Callable, _PickledOnce] = {}


class _PickledOnce:
    """A function that pickles as the bytes cloudpickle made of it the first time."""

    __slots__ = ("function", "pickled")

    def __init__(self, function: Callable) -> None:
        self.function = function
        self.pickled: bytes | None = None

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204 - whatever the function takes and gives
        return self.function(*args, **kwargs)

    def __reduce__(self) -> tuple:
        if self.pickled is None:
            self.pickled = cloudpickle.dumps(self.function)
        return pickle.loads, (self.pickled,)


def bound(function: Callable, *arguments: object) -> functools.partial:
    """`function` with its first arguments bound, for a Spark task; its code pickled once per process."""
    with _lock:
        code = _code.get(function)
        if code is None:
            code = _code[function] = _PickledOnce(function)
    return functools.partial(code, *arguments)
