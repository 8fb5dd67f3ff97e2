"""The `calve` command: `up` runs everything; `api`, `writer`, `committer` run one role."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable

from service.cli import admin as admin_cli
from service.core.config import Settings, get_settings
from service.core.exceptions import StartupError

log = logging.getLogger("calve")


def _logging() -> None:
    logging.basicConfig(level=os.environ.get("CALVE_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _require(settings: Settings, *names: str) -> None:
    missing = [f"CALVE_{n.upper()}" for n in names if not getattr(settings, n)]
    if missing:
        raise StartupError(f"{', '.join(missing)} must be set to run this role alone (or use `calve up`)")


def run_api(settings: Settings) -> None:
    from service.api.main import create_app
    from service.api.server import DrainingServer
    from service.core.db import migrate

    _require(settings, "redis_url")
    migrate(settings.resolved_database_url())  # a no-op when up to date
    DrainingServer(create_app(settings), settings).run()


def _catalog_and_redis(settings: Settings):  # noqa: ANN202
    from prometheus_client import start_http_server

    from service.core.connections import redis_client
    from service.iceberg.catalog import open_catalog

    _require(settings, "redis_url")
    # Under `calve up` the api serves every role's metrics; a role run alone serves its own.
    if settings.metrics_port and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        start_http_server(settings.metrics_port, addr=settings.host)
    return redis_client(settings), open_catalog(settings)


def run_writer(settings: Settings) -> None:
    from service.writer.loop import Writer

    _require(settings, "spark_remote")
    client, catalog = _catalog_and_redis(settings)
    Writer(settings, client, catalog).run(_stop_event())


def run_committer(settings: Settings) -> None:
    from service.committer.loop import Committer

    client, catalog = _catalog_and_redis(settings)
    Committer(settings, client, catalog).run(_stop_event())


def prepare_metadata(settings: Settings) -> None:
    """Migrate the metadata DB and create the first tenant and token."""
    from sqlmodel import Session

    from service.core.db import get_engine, migrate
    from service.tenancy.tenants import BOOTSTRAP_TOKEN_FILE, bootstrap

    migrate(settings.resolved_database_url())
    with Session(get_engine(settings.resolved_database_url())) as session:
        token = bootstrap(session, settings.data_path, settings.bootstrap_token)
    if token:
        print(f"\nCreated tenant 'demo'. Its admin token (shown once, also in {settings.data_path / BOOTSTRAP_TOKEN_FILE}):\n\n    {token}\n", flush=True)


def start_spark(settings: Settings, logs) -> tuple[list, Callable]:  # noqa: ANN001 - logs: Path
    """The embedded Spark Connect server (in local mode, or on a standalone cluster of
    `settings.spark_workers` workers); sets `settings.spark_remote`. Returns the cluster's
    processes (last to stop first) and how to start the Connect server (again, on the same port)."""
    from service.cli import processes

    work_dir = settings.data_path / "spark"
    port = settings.spark_port or processes.free_port()
    cluster_processes = []
    connect: dict = {"java_options": settings.spark_java_options}
    if settings.spark_workers:
        print(f"starting a Spark standalone cluster: a master and {settings.spark_workers} workers "
              f"({settings.spark_worker_cores} cores, {settings.spark_worker_memory} each; logs: {logs / 'spark-*.log'})", flush=True)
        cluster = processes.start_spark_cluster(settings.spark_workers, settings.spark_worker_cores, settings.spark_worker_memory, work_dir, logs)
        cluster_processes = cluster.processes[::-1]
        ui_port = settings.spark_ui_port or processes.free_port()
        connect |= {"master": cluster.master_url, "executor_memory": settings.spark_worker_memory, "ui_port": ui_port}
        print(f"Spark master UI: {cluster.master_ui}   Spark Connect application UI: http://127.0.0.1:{ui_port}", flush=True)
    print(f"starting Spark Connect on 127.0.0.1:{port} (log: {logs / 'spark-connect.log'}); this takes ~20 s", flush=True)
    settings.spark_remote = f"sc://127.0.0.1:{port}"
    return cluster_processes, lambda: processes.start_spark_connect(port, settings.spark_driver_memory, work_dir, logs / "spark-connect.log", **connect)


def run_up(settings: Settings, writers: int = 2, committers: int = 1) -> None:
    from service.cli import processes
    from service.cli.supervisor import Supervisor

    data = settings.data_path
    logs = data / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stop = _stop_event()
    cluster: list = []  # a Spark standalone cluster's processes: started once, stopped last but one
    listener = None  # with several api processes, the listening socket they share
    supervisor = Supervisor()  # redis-server, Spark Connect and the roles: started again when they exit
    env = dict(os.environ, CALVE_DATA_DIR=str(data))
    metrics_dir = data / "metrics"
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir()
    # Every process's metrics, this one's (restarts) too, are merged by the api's /metrics.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    try:
        if not settings.redis_url:
            port = processes.free_port()
            print(f"starting redis-server on 127.0.0.1:{port} (AOF in {data / 'redis'})", flush=True)
            supervisor.start("redis", lambda: processes.start_redis(data, port, logs / "redis.log"))
            settings.redis_url = f"redis://127.0.0.1:{port}/0"
        if settings.spark_remote and settings.spark_workers:
            log.warning("CALVE_SPARK_REMOTE is set: Spark jobs run where %s runs them; --spark-workers is ignored", settings.spark_remote)
        if not settings.spark_remote:
            cluster, start_connect = start_spark(settings, logs)
            supervisor.start("spark", start_connect)
        env.update(CALVE_REDIS_URL=settings.redis_url, CALVE_SPARK_REMOTE=settings.spark_remote)

        prepare_metadata(settings)
        admin_cli.write_runtime(settings)
        # Each role is its own process, named by its command line (`service.cli writer`).
        commands = {"api": "api"} if settings.api_processes == 1 else {f"api-{i}": "api" for i in range(1, settings.api_processes + 1)}
        commands.update({f"writer-{i}": "writer" for i in range(1, writers + 1)})
        commands.update({f"committer-{i}": "committer" for i in range(1, committers + 1)})
        fds: tuple[int, ...] = ()
        if settings.api_processes > 1:  # one listening socket, bound here, that each api process accepts on
            listener = processes.listening_socket(settings.host, settings.port)
            fds = (listener.fileno(),)
            env["CALVE_API_SOCKET_FD"] = str(listener.fileno())
        for name, role in commands.items():
            supervisor.start(name, lambda role=role: processes.spawn([sys.executable, "-m", "service.cli", role], env=env,
                                                                     pass_fds=fds if role == "api" else ()))
        api = next(process for name, process in supervisor.processes() if name.startswith("api"))
        processes.wait_for_port(settings.port, 60, api, "api", None, answers=bool(fds))
        print(f"Calve is up: http://{settings.host}:{settings.port}  (Ctrl-C stops everything)", flush=True)
        while not stop.wait(1.0):
            supervisor.check()
    finally:
        print("stopping Calve...", flush=True)
        (data / admin_cli.RUNTIME_FILE).unlink(missing_ok=True)
        # In the order work flows: the api stops taking requests, writers finish their batches,
        # committers commit them, then the servers they all use go.
        started = supervisor.processes() + [("spark", process) for process in cluster]
        for prefix in ("api", "writer", "committer", "spark", "redis"):
            for name, process in started:
                if name.startswith(prefix):
                    processes.stop(process, settings.shutdown_grace_s if prefix not in ("spark", "redis") else 15)
            if prefix == "api" and listener is not None:
                listener.close()  # no more connections queue for an api that is gone


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="calve", description="HTTP ingestion into Apache Iceberg")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run every role on embedded defaults (Redis, Spark Connect, SQLite catalog)")
    up.add_argument("--writers", type=int, default=2, help="writer processes (default 2: one Spark job's set-up overlaps another's work)")
    up.add_argument("--committers", type=int, default=1, help="committer processes (tables are led by one at a time)")
    up.add_argument("--spark-workers", type=int, default=None, metavar="N",
                    help="run Spark jobs on a standalone cluster of N workers started here (default 0: in the Spark Connect server's JVM)")
    commands.add_parser("api", help="run the HTTP api")
    commands.add_parser("writer", help="run a writer (needs CALVE_REDIS_URL, CALVE_SPARK_REMOTE)")
    commands.add_parser("committer", help="run a committer (needs CALVE_REDIS_URL)")
    commands.add_parser("migrate", help="apply metadata DB migrations and create the first tenant")
    admin_cli.add_commands(commands)
    args = parser.parse_args(argv)
    _logging()
    settings = get_settings()
    settings.data_path.mkdir(parents=True, exist_ok=True)
    try:
        if args.command in ("tenant", "token"):
            admin_cli.run(settings, args)
        elif args.command == "up":
            if args.writers < 1 or args.committers < 1:
                parser.error("--writers and --committers need at least 1")
            if args.spark_workers is not None:
                if args.spark_workers < 0:
                    parser.error("--spark-workers needs 0 or more")
                settings.spark_workers = args.spark_workers
            run_up(settings, writers=args.writers, committers=args.committers)
        else:
            {"api": run_api, "writer": run_writer, "committer": run_committer, "migrate": prepare_metadata}[args.command](settings)
    except StartupError as exc:
        print(f"calve: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
