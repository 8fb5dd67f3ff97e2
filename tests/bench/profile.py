"""Where a benchmark's cores go: CPU seconds per role of a running `calve up`, and the Spark and
commit time its metrics recorded, between two samples.

Roles are told by command line: `service.cli api|writer|committer|up`, the Spark Connect JVM
(java), redis-server, and the benchmark's own process (the load generator, which shares the
machine). A process that starts or ends between the samples counts from its first sample or up
to its last one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx
import psutil

ROLE_ORDER = ("api", "writer", "committer", "spark", "spark python", "spark executors", "spark cluster", "redis", "supervisor", "load generator")
METRIC = re.compile(r"^(calve_(?:spark_job_duration|commit_duration|accept_to_commit)_seconds)_(sum|count)\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)
COMMITTED = re.compile(r"^calve_events_committed_total\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)
RECEIVED = re.compile(r"^calve_events_received_total\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)
# What compactions committed (the small files they merged, and their bytes): a shape's window holds
# its table's compaction or not, which moves its CPU per event (the Spark time is the writer's jobs').
COMPACTED_FILES = re.compile(r'^calve_compaction_files_total\{[^}]*direction="([a-z]+)"[^}]*\} ([0-9.e+-]+)$', re.MULTILINE)
COMPACTED_BYTES = re.compile(r"^calve_compaction_bytes_total\{[^}]*\} ([0-9.e+-]+)$", re.MULTILINE)
WAYS = re.compile(r'^calve_ingest_requests_total\{[^}]*way="([a-z]+)"[^}]*\} ([0-9.e+-]+)$', re.MULTILINE)
DIRECT = re.compile(r'^calve_direct_batches_total\{[^}]*outcome="([a-z]+)"[^}]*\} ([0-9.e+-]+)$', re.MULTILINE)


def role_of(process: psutil.Process) -> str | None:
    try:
        command = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    for role in ("api", "writer", "committer"):
        if f"service.cli {role}" in command:
            return role
    if "service.cli up" in command:
        return "supervisor"
    if "pyspark.daemon" in command or "pyspark.worker" in command:
        return "spark python"  # Spark's Python workers (mapInArrow's tasks): as much CPU as the JVM
    if "java" in command and "SparkConnect" in command:
        return "spark"
    if "java" in command and ("deploy.master.Master" in command or "deploy.worker.Worker" in command):
        return "spark cluster"  # CALVE_SPARK_WORKERS: the standalone master and workers
    if "java" in command and "CoarseGrainedExecutorBackend" in command:
        return "spark executors"
    if "redis-server" in command:
        return "redis"
    return None


@dataclass
class Sample:
    cpu: dict[int, tuple[str, float]] = field(default_factory=dict)  # pid -> (role, user + system seconds)
    rss: dict[str, int] = field(default_factory=dict)  # role -> resident bytes, its processes together
    metrics: dict[tuple[str, str], float] = field(default_factory=dict)  # (metric, sum|count) -> value, summed over labels
    committed: float = 0.0  # events committed, every table
    received: float = 0.0  # events accepted into Redis, every pipeline
    direct: dict[str, float] = field(default_factory=dict)  # the short way's batches by outcome (written, partial, refused, failed)
    compacted: dict[str, float] = field(default_factory=dict)  # files removed, files added and bytes removed by committed compactions
    ways: dict[str, float] = field(default_factory=dict)  # ingest requests by way: known (fast_ingest.py) or routed
    jit: dict[tuple[int, int], float] = field(default_factory=dict)  # (pid, thread id) -> CPU seconds of a Spark JVM's JIT compiler thread

    @property
    def backlog(self) -> float:
        """Events accepted and not yet committed (or sent to the DLQ: they count as neither)."""
        return self.received - self.committed


def sample(stack_pid: int, port: int, token: str) -> Sample:
    taken = Sample()
    root = psutil.Process(stack_pid)
    me = psutil.Process()
    for process in [root, *root.children(recursive=True), me]:
        role = "load generator" if process.pid == me.pid else role_of(process)
        if role is None:
            continue
        try:
            times = process.cpu_times()
            taken.rss[role] = taken.rss.get(role, 0) + process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        # Threads count; children a role waited for (spark-submit's exec'd JVM is itself) too.
        taken.cpu[process.pid] = (role, times.user + times.system + times.children_user + times.children_system)
        if role in ("spark", "spark executors"):
            taken.jit.update(compiler_threads(process))
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    for name, kind, value in METRIC.findall(text):
        taken.metrics[(name, kind)] = taken.metrics.get((name, kind), 0.0) + float(value)
    taken.committed = sum(float(value) for value in COMMITTED.findall(text))
    taken.received = sum(float(value) for value in RECEIVED.findall(text))
    for direction, value in COMPACTED_FILES.findall(text):
        taken.compacted[f"files_{direction}"] = taken.compacted.get(f"files_{direction}", 0.0) + float(value)
    taken.compacted["bytes_removed"] = sum(float(value) for value in COMPACTED_BYTES.findall(text))
    for outcome, value in DIRECT.findall(text):
        taken.direct[outcome] = taken.direct.get(outcome, 0.0) + float(value)
    for way, value in WAYS.findall(text):
        taken.ways[way] = taken.ways.get(way, 0.0) + float(value)
    return taken


def compiler_threads(process: psutil.Process) -> dict[tuple[int, int], float]:
    """The CPU seconds of each of a JVM's JIT compiler threads (`C1/C2 CompilerThread`, by their
    names in /proc): a JVM compiles Spark's code for minutes after it starts, so a window soon
    after the start holds warm-up that a long-running server no longer pays."""
    found = {}
    try:
        for thread in process.threads():
            try:
                with open(f"/proc/{process.pid}/task/{thread.id}/comm") as comm:
                    if "CompilerThre" in comm.read():
                        found[(process.pid, thread.id)] = thread.user_time + thread.system_time
            except OSError:  # the thread ended
                continue
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return found


def committed_between(start: Sample, end: Sample) -> tuple[int, float | None]:
    """(events committed between the samples, their mean time from acceptance to commit, seconds)."""
    count = end.metrics.get(("calve_accept_to_commit_seconds", "count"), 0.0) - start.metrics.get(("calve_accept_to_commit_seconds", "count"), 0.0)
    total = end.metrics.get(("calve_accept_to_commit_seconds", "sum"), 0.0) - start.metrics.get(("calve_accept_to_commit_seconds", "sum"), 0.0)
    return round(end.committed - start.committed), (total / count if count else None)


def breakdown(start: Sample, end: Sample, events: int) -> dict:
    """CPU seconds per role (and per 100,000 committed events), and mean Spark job and commit times."""
    cpu: dict[str, float] = {}
    for pid, (role, seconds) in end.cpu.items():
        cpu[role] = cpu.get(role, 0.0) + seconds - start.cpu.get(pid, (role, 0.0))[1]
    per_100k = {role: round(seconds * 100_000 / events, 3) if events else None for role, seconds in cpu.items()}
    timings = {}
    for name, short in (("calve_spark_job_duration_seconds", "spark_job"), ("calve_commit_duration_seconds", "commit")):
        count = end.metrics.get((name, "count"), 0.0) - start.metrics.get((name, "count"), 0.0)
        total = end.metrics.get((name, "sum"), 0.0) - start.metrics.get((name, "sum"), 0.0)
        timings[short] = {"count": int(count), "mean_s": round(total / count, 3) if count else None,
                          "events_each": round(events / count) if count else None}
    order = {role: index for index, role in enumerate(ROLE_ORDER)}
    stack = sum(seconds for role, seconds in cpu.items() if role != "load generator")
    # Of the Spark JVMs' CPU, their JIT compiler threads' (a compiler thread that ended in the window is left out).
    jit = sum(seconds - start.jit.get(thread, 0.0) for thread, seconds in end.jit.items())
    return {
        "spark_jit_s": round(jit, 2),
        "spark_jit_s_per_100k": round(jit * 100_000 / events, 3) if events else None,
        # Every process of the stack (the load generator is not Calve's).
        "cpu_s_per_100k_all_roles": round(stack * 100_000 / events, 3) if events else None,
        "cpu_s": {role: round(cpu[role], 2) for role in sorted(cpu, key=order.get)},
        "cpu_s_per_100k_events": {role: per_100k[role] for role in sorted(per_100k, key=order.get)},
        "timings": timings,
        # Batches the short way ran, by outcome: refused or partial ones went (wholly or in part) to the full Spark job.
        "short_way": {outcome: round(count - start.direct.get(outcome, 0.0)) for outcome, count in sorted(end.direct.items())
                      if count > start.direct.get(outcome, 0.0)},
        # Compactions committed in the window (their Spark jobs' CPU is in the window's too).
        "compacted": {name: round(count - start.compacted.get(name, 0.0)) for name, count in sorted(end.compacted.items())},
        # Ingest requests by way: answered by fast_ingest.py (known) or by FastAPI's route (routed: a token or pipeline not cached).
        "ingest_ways": {way: round(count - start.ways.get(way, 0.0)) for way, count in sorted(end.ways.items())},
        # Resident memory per role as the window opened and as it closed (MiB): the api's should stay flat.
        "rss_mib": {role: [round(start.rss.get(role, 0) / 2**20), round(end.rss.get(role, 0) / 2**20)]
                    for role in sorted(end.rss, key=order.get)},
    }


def table(profile: dict) -> str:
    lines = ["  role             CPU s   per 100k events"]
    for role, seconds in profile["cpu_s"].items():
        rss = profile.get("rss_mib", {}).get(role)
        memory = f"   RSS {rss[0]} -> {rss[1]} MiB" if rss else ""
        lines.append(f"  {role:<15} {seconds:6.1f}   {profile['cpu_s_per_100k_events'][role]}{memory}")
    if profile.get("spark_jit_s"):
        lines.append(f"  of spark's: its JIT compiling Spark's code {profile['spark_jit_s']:.1f} CPU-s ({profile['spark_jit_s_per_100k']} per 100k events; "
                     "warm-up, fading over the JVM's first minutes)")
    lines.append(f"  all but the load generator: {profile['cpu_s_per_100k_all_roles']} CPU-s per 100k events")
    for name, timing in profile["timings"].items():
        lines.append(f"  {name}: {timing['count']} in the window, {timing['mean_s']} s each, ~{timing['events_each']} events each")
    if profile.get("short_way"):
        lines.append("  short way's batches: " + ", ".join(f"{count} {outcome}" for outcome, count in profile["short_way"].items()))
    compacted = profile.get("compacted") or {}
    if compacted.get("files_removed"):
        lines.append(f"  compactions: {compacted['files_removed']} small files ({compacted.get('bytes_removed', 0) / 2**20:.1f} MiB) merged into "
                     f"{compacted.get('files_added', 0)} in the window")
    else:
        lines.append("  compactions: none committed in the window")
    ways = profile.get("ingest_ways") or {}
    if sum(ways.values()):
        lines.append(f"  ingest requests: {ways.get('known', 0)} answered the known way, {ways.get('routed', 0)} routed "
                     f"({ways.get('routed', 0) / sum(ways.values()):.1%})")
    return "\n".join(lines)
