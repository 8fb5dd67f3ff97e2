"""Role processes for the tests, forked from a process that has already imported Calve's libraries.

`python -m service.cli <role>` spends 3 to 4 CPU-seconds importing pyiceberg, pyarrow, pandas,
SQLAlchemy, FastAPI and pyspark's Connect client before it does anything, and `make test` starts
a few hundred role processes on 2 cores. This server (`python -m tests.forkserver`) imports those
third-party libraries once. Each role is then a fork of it that sets its own environment, working
directory and log, and runs `service.cli` as `__main__`, exactly what `calve <role>` runs: Calve's
own modules are imported in the role, after its environment is in place (some read it at import:
the fault points). What stays out of the preload and why:
- prometheus_client chooses its value class (one file per process, or in memory) from
  PROMETHEUS_MULTIPROC_DIR when it is imported;
- polars starts its thread pool when it is imported, and a fork has no threads but the one that
  forked, so polars would wait forever in the role.

The role is forked twice and its middle parent exits, so it becomes a child of the test process,
which has made itself a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`): the test process waits
for the role and reads its exit status as it would with subprocess.Popen (tests.harness.ForkServer).

Protocol, one line each way: the test process writes a request as JSON ({"role", "env", "cwd",
"log"}); the server answers with the role's pid once the role is the test process's child.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys

PRELOAD = (
    "pyiceberg.catalog",
    "pyiceberg.catalog.sql",
    "pyiceberg.io.pyarrow",
    "pyiceberg.table",
    "pyarrow.compute",
    "pyarrow.dataset",
    "pyarrow.parquet",
    "pandas",
    "sqlglot",
    "sqlmodel",
    "alembic.command",
    "fastapi",
    "uvicorn",
    "pydantic_settings",
    "redis",
    "redis.asyncio",
    "redis.cluster",
    "httpx",
    "tenacity",
    "pyspark.sql.connect.session",
)
NOT_PRELOADED = ("prometheus_client", "polars", "service", "spark_jobs")


def serve() -> dict:
    """Answer requests until stdin closes; in a forked role, return its request."""
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = sorted({name.split(".")[0] for name in sys.modules} & set(NOT_PRELOADED))
    if leaked:
        raise SystemExit(f"the preload imported {leaked}, which must be imported in each role")
    os.write(1, b"ready\n")
    for line in sys.stdin.buffer:
        request = json.loads(line)
        read_end, write_end = os.pipe()
        middle = os.fork()
        if middle == 0:
            role = os.fork()
            if role == 0:
                os.close(read_end)
                os.close(write_end)
                return request
            os.write(write_end, f"{role}\n".encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as answer:
            role = answer.readline()
        os.waitpid(middle, 0)  # the role has a new parent once its middle one is gone
        os.write(1, role)
    raise SystemExit(0)


def become(request: dict) -> None:
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["calve", request["role"]]
    runpy.run_module("service.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    become(serve())
