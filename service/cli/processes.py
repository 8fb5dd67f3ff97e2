"""Starting and stopping the embedded servers and role processes, with no orphans left behind."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pyspark
from tenacity import RetryError, retry, retry_if_result, stop_after_delay, wait_fixed

from service.core.exceptions import StartupError

PR_SET_PDEATHSIG = 1
SPARK_CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM if the process that started it dies, even by SIGKILL.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(args: list[str], *, env: dict[str, str] | None = None, log: Path | None = None, cwd: Path | None = None) -> subprocess.Popen:
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


def wait_for_port(port: int, timeout_s: float, process: subprocess.Popen, what: str, log: Path | None) -> None:
    hint = f"; see {log}" if log else ""

    # Polled until it listens, it exits (no point waiting longer), or the time is up.
    @retry(retry=retry_if_result(lambda listening: not listening), stop=stop_after_delay(timeout_s), wait=wait_fixed(0.25))
    def listening() -> bool:
        if process.poll() is not None:
            raise StartupError(f"{what} exited with code {process.returncode} while starting{hint}")
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", port)) == 0

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
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--protected-mode", "yes", "--daemonize", "no",
        ],
        log=log,
    )
    wait_for_port(port, 30, process, "redis-server", log)
    return process


def spark_home() -> Path:
    return Path(pyspark.__file__).parent


def start_spark_connect(port: int, driver_memory: str, work_dir: Path, log: Path) -> subprocess.Popen:
    """A Spark Connect server from the pyspark package's own scripts, bound to 127.0.0.1."""
    _which("java", "Calve needs Java 17: `apt-get install openjdk-17-jre-headless`")
    home = spark_home()
    work_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(work_dir), SPARK_PID_DIR=str(work_dir))
    # spark-submit execs the JVM in this very process, so it dies with its parent.
    process = spawn(
        [
            str(home / "bin" / "spark-submit"), "--class", SPARK_CONNECT_CLASS, "--name", "calve-spark-connect",
            "--master", "local[*]", "--driver-memory", driver_memory,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS",
            "--conf", "spark.sql.shuffle.partitions=4",
            "--conf", "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs=false",
            "--conf", "spark.hadoop.parquet.enable.summary-metadata=false",
            "--conf", f"spark.local.dir={work_dir / 'tmp'}",
            "--conf", "spark.connect.grpc.maxInboundMessageSize=268435456",
        ],
        env=env,
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
