"""Starting and stopping the embedded servers and role processes, with no orphans left behind."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pyspark
from tenacity import RetryError, retry, retry_if_result, stop_after_delay, wait_fixed

from service.core.exceptions import StartupError

PR_SET_PDEATHSIG = 1
SPARK_CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SPARK_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
SPARK_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening_socket(host: str, port: int) -> socket.socket:
    """The api's listening socket, bound once (an address in use fails here, as a lone api's
    would) and inheritable: `calve up`'s api processes all accept on it."""
    family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds its own
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if the process that started it dies, even by SIGKILL.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(args: list[str], *, env: dict[str, str] | None = None, log: Path | None = None, cwd: Path | None = None,
          pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    out = open(log, "ab") if log else None  # noqa: SIM115 - kept open for the child's lifetime
    # util-linux's setpriv sets the parent-death signal and execs: no Python runs in the forked
    # child. A preexec_fn does, which is unsafe in a process with threads: in the test process,
    # whose Spark Connect client has gRPC threads, a restarted redis-server hung before its exec.
    setpriv = shutil.which("setpriv")
    try:
        return subprocess.Popen(
            [setpriv, "--pdeathsig", "TERM", "--", *args] if setpriv else args,
            env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out else None,
            stdin=subprocess.DEVNULL, preexec_fn=None if setpriv else _die_with_parent,
            # Its own process group: a terminal's Ctrl-C (sent to the whole foreground group) reaches
            # only the supervisor, which stops the children in order (Redis and Spark last), not all at once.
            process_group=0, pass_fds=pass_fds,
        )
    finally:
        if out:
            out.close()


def stop(process: subprocess.Popen, grace_s: float) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for_port(port: int, timeout_s: float, process: subprocess.Popen, what: str, log: Path | None, *, answers: bool = False) -> None:
    """Wait until `process` listens on `port`; with `answers`, until GET /healthz there answers
    200 (a socket bound beforehand listens before any process serves it)."""
    hint = f"; see {log}" if log else ""

    # Polled until it listens, it exits (no point waiting longer), or the time is up.
    @retry(retry=retry_if_result(lambda listening: not listening), stop=stop_after_delay(timeout_s), wait=wait_fixed(0.25))
    def listening() -> bool:
        if process.poll() is not None:
            raise StartupError(f"{what} exited with code {process.returncode} while starting{hint}")
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                return False
            if not answers:
                return True
            try:
                sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                return sock.recv(12).startswith(b"HTTP/1.1 200")
            except OSError:  # not served yet (a timeout), or reset
                return False

    try:
        listening()
    except RetryError:
        stop(process, 5)
        raise StartupError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:.0f}s{hint}") from None


def start_redis(data_dir: Path, port: int, log: Path) -> subprocess.Popen:
    binary = _which("redis-server", "install it with `apt-get install redis-server` (make run does this)")
    directory = data_dir / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    process = spawn(
        [
            binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory),
            # Every body passes through the AOF while the data set stays small (bodies in flight,
            # receipts): at the default 64 MB the AOF was rewritten every ~2.3 s under make bench
            # (watched), each a fork writing the whole data set again. At 512 MB, make bench plain:
            # the rewrites' CPU 0.32 against 2.44 s a run, Redis's own per event ~15% lower.
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--auto-aof-rewrite-min-size", "512mb",
            "--protected-mode", "yes", "--daemonize", "no",
        ],
        log=log,
    )
    wait_for_port(port, 30, process, "redis-server", log)
    return process


def spark_home() -> Path:
    return Path(pyspark.__file__).parent


def _spark_env(work_dir: Path, **extra: str) -> dict[str, str]:
    # SPARK_LOCAL_IP binds every Spark socket, web UIs included, to the loopback interface.
    # PYSPARK_PYTHON: the Python workers that run jobs' Python code (an object store's Parquet,
    # spark_jobs/files.py) use this interpreter, which has pyarrow, not whatever `python3` is first
    # on the PATH; an operator's own value wins.
    env = {"PYSPARK_PYTHON": sys.executable, **os.environ}
    return dict(env, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(work_dir), SPARK_PID_DIR=str(work_dir), **extra)


@dataclass
class SparkCluster:
    """A Spark standalone master and its workers, each a JVM of its own (`calve up --spark-workers N`)."""

    master_url: str
    master_ui: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def stop(self, grace_s: float = 15) -> None:
        for process in reversed(self.processes):  # workers first: the master outlives its workers
            stop(process, grace_s)


def start_spark_cluster(workers: int, cores: int, memory: str, work_dir: Path, logs: Path) -> SparkCluster:
    """A standalone master and `workers` workers from the pyspark package's own `spark-class`, all
    on 127.0.0.1, each worker offering `cores` cores and `memory` to executors. The master's REST
    submission server (unauthenticated) stays off: applications come through Spark Connect only."""
    _which("java", "Calve needs Java 17: `apt-get install openjdk-17-jre-headless`")
    spark_class = str(spark_home() / "bin" / "spark-class")
    work_dir.mkdir(parents=True, exist_ok=True)
    port, ui_port = free_port(), free_port()
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}")
    try:
        master = spawn(
            [spark_class, SPARK_MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
            env=_spark_env(work_dir, SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"), log=logs / "spark-master.log", cwd=work_dir,
        )
        cluster.processes.append(master)
        wait_for_port(port, 120, master, "Spark master", logs / "spark-master.log")
        for n in range(1, workers + 1):
            directory = work_dir / f"worker-{n}"
            directory.mkdir(exist_ok=True)
            cluster.processes.append(spawn(
                [
                    spark_class, SPARK_WORKER_CLASS, "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                    "--webui-port", str(free_port()), "--work-dir", str(directory), cluster.master_url,
                ],
                env=_spark_env(directory, SPARK_LOCAL_DIRS=str(directory / "tmp")), log=logs / f"spark-worker-{n}.log", cwd=directory,
            ))
        _wait_for_workers(cluster, workers, 120, logs)
    except BaseException:
        cluster.stop(5)
        raise
    return cluster


def _wait_for_workers(cluster: SparkCluster, workers: int, timeout_s: float, logs: Path) -> None:
    # The Connect server asks for executors once, when it starts: every worker must be there first.
    deadline = time.monotonic() + timeout_s
    alive = 0
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                raise StartupError(f"a Spark master or worker exited with code {process.returncode} while starting; see {logs}/spark-*.log")
        try:
            alive = httpx.get(f"{cluster.master_ui}/json/", timeout=2).json().get("aliveworkers", 0)
        except (httpx.HTTPError, ValueError):
            alive = 0
        if alive >= workers:
            return
        time.sleep(0.5)
    raise StartupError(f"{alive} of {workers} Spark workers registered with the master within {timeout_s:.0f}s; see {logs}/spark-worker-*.log")


def start_spark_connect(
    port: int, driver_memory: str, work_dir: Path, log: Path, *, master: str = "local[*]", executor_memory: str | None = None,
    ui_port: int = 0, java_options: str = "",
) -> subprocess.Popen:
    """A Spark Connect server from the pyspark package's own scripts, bound to 127.0.0.1; its driver
    runs the jobs itself (`local[*]`) or on a cluster's executors (`spark://host:port`). With a
    `ui_port` it serves Spark's web UI and REST API (/api/v1) there."""
    _which("java", "Calve needs Java 17: `apt-get install openjdk-17-jre-headless`")
    home = spark_home()
    work_dir.mkdir(parents=True, exist_ok=True)
    cluster = [
        "--conf", f"spark.executor.memory={executor_memory}",
    ] if executor_memory else []
    ui = ["--conf", f"spark.ui.port={ui_port}"] if ui_port else ["--conf", "spark.ui.enabled=false"]
    # java_options: for the driver, and for a cluster's executors too (their own JVMs). A driver
    # out of memory exits (instead of limping on, failing every job) and `calve up` starts it again.
    driver = ["--driver-java-options", f"-XX:+ExitOnOutOfMemoryError {java_options}".strip()]
    if java_options and not master.startswith("local"):
        driver += ["--conf", f"spark.executor.extraJavaOptions={java_options}"]
    # spark-submit execs the JVM in this very process, so it dies with its parent.
    process = spawn(
        [
            str(home / "bin" / "spark-submit"), "--class", SPARK_CONNECT_CLASS, "--name", "calve-spark-connect",
            "--master", master, "--driver-memory", driver_memory,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1",
            *ui, *cluster, *driver,
            "--conf", "spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS",
            "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs=false",
            "--conf", "spark.hadoop.parquet.enable.summary-metadata=false",
            "--conf", f"spark.local.dir={work_dir / 'tmp'}",
            "--conf", "spark.connect.grpc.maxInboundMessageSize=268435456",
        ],
        env=_spark_env(work_dir),
        log=log,
        cwd=work_dir,
    )
    wait_for_port(port, 180, process, "Spark Connect server", log)
    return process


def _which(binary: str, hint: str) -> str:
    from shutil import which

    found = which(binary)
    if not found:
        raise StartupError(f"{binary} not found: {hint}")
    return found
