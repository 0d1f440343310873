"""Memory guard for DeepSeek-V4.1-Flash serving nodes (NVIDIA DGX Spark / GB10).

A GB10 shares one 128 GB LPDDR pool between CPU and GPU. When MemAvailable reaches 0 the host
does not OOM-kill its way out: it wedges and needs a power cycle. This guard samples
MemAvailable every ``--interval`` seconds and, once it drops under ``--floor-gib``, kills the
running vLLM rank containers (names starting with ``--container-prefix``) through the docker CLI,
so the node survives and the rank services can restart them.

It also writes a low-memory trace (the top RSS processes) while MemAvailable is under
``--trace-below-gib``, rate-limited by ``--trace-every``, so an operator can see what ate the
memory after the fact. Everything goes to one size-rotated log file: the role must not depend on
logrotate being installed.

Stdlib only, Python 3.10+, runs as root under systemd. The decision logic is made of pure
functions and the loop takes its clock, sleep, meminfo reader and command runner as parameters,
so the unit tests run without docker, root or real memory pressure.
"""

from __future__ import annotations

import argparse
import enum
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import dsv41_node as shared  # installed beside this program
from dsv41_node import (
    CommandResult,
    RotatingLog,
    Runner,
    StopRequested,
    format_gib,
    parse_meminfo,
    run_command,
)

# The metrics need prometheus_client (python3-prometheus-client); guarding never does.
try:
    import dsv41_memguard_metrics as guard_metrics  # installed beside this program
except ImportError as missing:
    guard_metrics = None
    METRICS_UNAVAILABLE: str | None = f"{missing}; install python3-prometheus-client"
else:
    METRICS_UNAVAILABLE = None

GIB = 1024**3
MIB = 1024**2
KIB = 1024

DEFAULT_STATE_DIR = "~/.dsv41-two-sparks"  # the collection's deployment_state_dir default
KILL_RECORD = "memguard-last-kill"  # in the state directory: the time of the last kill, for the supervisor
METRICS_BIND_RETRY_SECONDS = 30.0  # the fabric address may come up after the guard (at boot)
CMDLINE_MAX_CHARS = 200  # keeps a trace line readable; the head of argv identifies the process
# Docker container names are [a-zA-Z0-9][a-zA-Z0-9_.-]*; restricting the prefix to that set keeps
# it harmless inside the `name=^<prefix>` regex filter and unable to look like a CLI option.
CONTAINER_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class Action(enum.Enum):
    """What the guard should do after one MemAvailable sample."""

    NONE = "none"  # at or above the floor
    KILL = "kill"  # under the floor and no kill within the cooldown
    COOLDOWN = "cooldown"  # under the floor, but a kill just happened: give it time to free memory


class ProcessRss(NamedTuple):
    """One process of the low-memory trace."""

    pid: int
    rss_bytes: int
    comm: str
    cmdline: str


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------


def decide(
    mem_available: int, floor: int, last_kill_time: float | None, now: float, cooldown: float
) -> Action:
    """Decide from one sample (bytes) and monotonic times (seconds).

    The cooldown stops a second kill while the first one is still releasing memory (unmapping
    ~100 GB of weights and KV cache takes seconds); once it has elapsed, memory still under the
    floor means something else holds it (e.g. a restarted rank), so the guard kills again.
    """
    if mem_available >= floor:
        return Action.NONE
    if last_kill_time is not None and now - last_kill_time < cooldown:
        return Action.COOLDOWN
    return Action.KILL


def should_trace(
    mem_available: int, trace_below: int, last_trace_time: float | None, now: float, every: float
) -> bool:
    """True when memory is low and no trace was written in the last ``every`` seconds."""
    if mem_available >= trace_below:
        return False
    return last_trace_time is None or now - last_trace_time >= every


def _read_vmrss(status_text: str) -> int | None:
    """VmRSS in bytes from /proc/<pid>/status, None for kernel threads (they have no VmRSS)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) * KIB
            return None
    return None


def top_rss(proc_root: Path, limit: int = 10) -> list[ProcessRss]:
    """The ``limit`` processes with the largest resident set, largest first.

    Reads /proc/<pid>/status, comm and cmdline directly (no psutil: stdlib only). Processes
    that exit or cannot be read while we scan are skipped, since a trace is best effort.
    """
    found: list[ProcessRss] = []
    try:
        entries = list(os.scandir(proc_root))
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        pid_dir = Path(entry.path)
        try:
            rss = _read_vmrss((pid_dir / "status").read_text(errors="replace"))
            if rss is None:
                continue
            comm = (pid_dir / "comm").read_text(errors="replace").rstrip("\n")
            raw_cmdline = (pid_dir / "cmdline").read_bytes()
        except OSError:  # exited meanwhile, or a permission quirk
            continue
        cmdline = " ".join(part.decode(errors="replace") for part in raw_cmdline.split(b"\0") if part)
        found.append(ProcessRss(int(entry.name), rss, comm, cmdline))
    found.sort(key=lambda p: (-p.rss_bytes, p.pid))
    return found[:limit]


def format_trace(mem_available: int, processes: Sequence[ProcessRss]) -> list[str]:
    """Messages of one trace event: a header, then one message per process."""
    messages = [f"MemAvailable={format_gib(mem_available)}; top {len(processes)} processes by RSS"]
    for rank, proc in enumerate(processes, 1):
        messages.append(
            f"#{rank} rss={proc.rss_bytes / MIB:.0f} MiB pid={proc.pid} comm={shared.one_line(proc.comm)}"
            f" cmdline={shared.one_line(proc.cmdline, CMDLINE_MAX_CHARS)}"
        )
    return messages


def matching_containers(ps_output: str, prefix: str) -> list[str]:
    """Names from `docker ps --format {{.Names}}` output that really start with ``prefix``.

    Docker's name filter is a regex matched anywhere in the name; checking the prefix again
    here means a surprise in that filter can never widen what gets killed.
    """
    names = (line.strip() for line in ps_output.splitlines())
    return [name for name in names if name.startswith(prefix)]


# --------------------------------------------------------------------------------------------
# Side effects: log, docker, loop
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Validated command-line settings, in bytes and seconds."""

    meminfo: Path
    proc_root: Path
    log: Path
    interval: float
    floor: int
    cooldown: float
    container_prefix: str
    docker: str
    docker_timeout: float
    trace_below: int
    trace_every: float
    trace_top: int
    log_max_bytes: int
    log_backups: int
    kill_record: Path | None = None
    metrics_address: str = ""
    metrics_port: int = 0  # 0: no metrics endpoint
    sysfs_root: Path = Path("/sys")

    def describe(self) -> str:
        """The start line: every setting, so a log read later says how the guard was configured."""
        return (
            f"pid={os.getpid()} floor={format_gib(self.floor)} interval={self.interval:g}s"
            f" cooldown={self.cooldown:g}s prefix={self.container_prefix} docker={self.docker}"
            f" docker_timeout={self.docker_timeout:g}s trace_below={format_gib(self.trace_below)}"
            f" trace_every={self.trace_every:g}s trace_top={self.trace_top} meminfo={self.meminfo}"
            f" proc_root={self.proc_root} log={self.log} log_max_bytes={self.log_max_bytes}"
            f" log_backups={self.log_backups} kill_record={self.kill_record}"
            f" metrics={f'{self.metrics_address}:{self.metrics_port}' if self.metrics_port else 'off'}"
            f" sysfs_root={self.sysfs_root}"
        )


class Guard:
    """One node's guard state: when it last killed and last traced (monotonic seconds)."""

    def __init__(
        self,
        settings: Settings,
        log: RotatingLog,
        *,
        read_meminfo: Callable[[], str],
        run: Runner,
        monotonic: Callable[[], float],
        wall: Callable[[], float] = time.time,
        metrics: guard_metrics.GuardMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.log = log
        self.read_meminfo = read_meminfo
        self.run = run
        self.monotonic = monotonic
        self.wall = wall
        self.metrics = metrics
        self.last_kill_time: float | None = None
        self.last_trace_time: float | None = None
        # When to try the metrics endpoint (again); None: serving, or none asked for.
        self.metrics_bind_at: float | None = 0.0 if metrics is not None and settings.metrics_port else None
        self.metrics_error: str | None = None

    def serve_metrics(self, now: float) -> None:
        """Open the metrics endpoint, or try again later: guarding never waits for it."""
        if self.metrics is None or self.metrics_bind_at is None or now < self.metrics_bind_at:
            return
        s = self.settings
        try:
            self.metrics.serve(s.metrics_address, s.metrics_port)
        # Whatever the endpoint's failure, the guard goes on guarding (a bind error is an OSError).
        except Exception as exc:
            self.metrics_bind_at = now + METRICS_BIND_RETRY_SECONDS
            message = f"metrics on {s.metrics_address}:{s.metrics_port}: {exc}; trying again every"
            message += f" {METRICS_BIND_RETRY_SECONDS:g} s"
            if message != self.metrics_error:  # once per distinct problem, not every try
                self.log.write("error", message)
            self.metrics_error = message
            return
        self.metrics_bind_at = None
        self.log.write("metrics", f"serving on {s.metrics_address}:{s.metrics_port}")

    def step(self) -> bool:
        """Sample once and act; False when MemAvailable could not be read."""
        s = self.settings
        now = self.monotonic()
        self.serve_metrics(now)
        try:
            mem_available = parse_meminfo(self.read_meminfo())
        except (OSError, ValueError) as exc:
            self.log.write("error", f"cannot read MemAvailable from {s.meminfo}: {exc}")
            return False
        if self.metrics is not None:
            self.metrics.sampled(mem_available)
        # Kill before tracing: the scan of /proc costs time the host may not have. The trace taken
        # on the way down (under trace_below, well above the floor) already shows the culprits.
        if decide(mem_available, s.floor, self.last_kill_time, now, s.cooldown) is Action.KILL:
            self._kill(mem_available, now)
        if should_trace(mem_available, s.trace_below, self.last_trace_time, now, s.trace_every):
            self.last_trace_time = now
            processes = top_rss(s.proc_root, s.trace_top)
            self.log.write_lines("trace", format_trace(mem_available, processes))
        return True

    def _docker(self, *args: str) -> CommandResult | None:
        """Run the docker CLI; log and return None on failure."""
        argv = [self.settings.docker, *args]
        result = self.run(argv, self.settings.docker_timeout)
        if result.returncode != 0:
            detail = shared.one_line(result.stderr.strip() or result.stdout.strip() or "(no output)")
            self.log.write("error", f"{' '.join(argv)} failed (rc={result.returncode}): {detail}")
            return None
        return result

    def _kill(self, mem_available: int, now: float) -> None:
        """Kill the rank containers. A docker failure leaves the cooldown unarmed: retry next tick."""
        s = self.settings
        under = f"MemAvailable={format_gib(mem_available)} under floor={format_gib(s.floor)}"
        listed = self._docker("ps", "--filter", f"name=^{s.container_prefix}", "--format", "{{.Names}}")
        if listed is None:
            return
        names = matching_containers(listed.stdout, s.container_prefix)
        if not names:
            # Arm the cooldown anyway so a node without ranks does not log this every second.
            self.last_kill_time = now
            self.log.write("kill", f"{under}; no running {s.container_prefix}* containers to kill")
            return
        # Log the intent before the kill: if the host wedges anyway, this line is already written.
        self.log.write("kill", f"{under}; killing containers: {' '.join(names)}")
        outcome = ""
        if self._docker("kill", *names) is None:
            # A rank that exited since the listing (under this same pressure) fails the whole
            # kill; its aim is met once none of them runs, and the supervisor must hear of it.
            if self._still_running(names) != []:
                return
            outcome = " (the kill failed for one that had exited; none runs now)"
        self.last_kill_time = now
        self.log.write("killed", f"containers: {' '.join(names)}{outcome}")
        if self.metrics is not None:
            self.metrics.killed()
        self._record_kill()

    def _still_running(self, names: Sequence[str]) -> list[str] | None:
        """Which of ``names`` still run; None when docker cannot say."""
        s = self.settings
        listed = self._docker("ps", "--filter", f"name=^{s.container_prefix}", "--format", "{{.Names}}")
        if listed is None:
            return None
        return [name for name in matching_containers(listed.stdout, s.container_prefix) if name in names]

    def _record_kill(self) -> None:
        """Leave the time of the kill where the supervisor looks: it must not start the ranks again
        while memory is short. A failed write is logged; the kill itself has happened."""
        path = self.settings.kill_record
        if path is None:
            return
        try:
            shared.write_atomically(path, f"{self.wall():.3f}\n")
        except OSError as exc:
            self.log.write("error", f"cannot record the kill in {path}: {exc}")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsv41_memguard",
        description="Kill the dsv41 rank containers before a shared-memory GB10 node wedges.",
    )
    add = parser.add_argument
    add("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    add("--floor-gib", type=float, default=1.0, help="kill under this MemAvailable (default 1)")
    add("--cooldown", type=float, default=10.0, help="no second kill within these seconds (default 10)")
    add("--container-prefix", default="dsv41-r", help="kill containers named so (default dsv41-r)")
    add("--docker", default="docker", help="docker CLI binary (default: docker from PATH)")
    add("--docker-timeout", type=float, default=15.0, help="seconds per docker call (default 15)")
    add("--trace-below-gib", type=float, default=10.0, help="trace top RSS under this (default 10)")
    add("--trace-every", type=float, default=30.0, help="at most one trace per N seconds (default 30)")
    add("--trace-top", type=int, default=10, help="processes per trace (default 10)")
    add("--state-dir", default=DEFAULT_STATE_DIR, help=f"state directory (default {DEFAULT_STATE_DIR})")
    add("--log", default=None, help="log file (default <state-dir>/memguard.log)")
    add(
        "--kill-record",
        default=None,
        help="file that gets the time of each kill (default <state-dir>/memguard-last-kill)",
    )
    add("--log-max-bytes", type=int, default=10 * MIB, help="rotate past this size (default 10 MiB)")
    add("--log-backups", type=int, default=3, help="rotated files kept (default 3)")
    add("--meminfo", default="/proc/meminfo", help="meminfo file (tests point it elsewhere)")
    add("--proc-root", default="/proc", help="proc tree for the trace (tests point it elsewhere)")
    add(
        "--metrics-address", default="", help="address of the Prometheus endpoint (the node's fabric address)"
    )
    add("--metrics-port", type=int, default=0, help="port of the Prometheus endpoint (default 0: none)")
    add("--sysfs-root", default="/sys", help="sysfs tree the fabric metrics read (tests point it elsewhere)")
    add("--once", action="store_true", help="sample once, act, exit (tests and diagnostics)")
    return parser


def settings_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    """Validate; parser.error() prints usage and the reason and exits 2."""

    def positive(name: str, value: float) -> None:
        if not (math.isfinite(value) and value > 0):
            parser.error(f"{name} must be a finite number > 0, got {value}")

    def non_negative(name: str, value: float) -> None:
        if not (math.isfinite(value) and value >= 0):
            parser.error(f"{name} must be a finite number >= 0, got {value}")

    positive("--floor-gib", args.floor_gib)
    positive("--interval", args.interval)
    positive("--docker-timeout", args.docker_timeout)
    positive("--log-max-bytes", args.log_max_bytes)
    non_negative("--cooldown", args.cooldown)
    non_negative("--trace-below-gib", args.trace_below_gib)
    non_negative("--trace-every", args.trace_every)
    non_negative("--trace-top", args.trace_top)
    non_negative("--log-backups", args.log_backups)
    if not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port must be a TCP port (0: none), got {args.metrics_port}")
    if args.metrics_port and not args.metrics_address:
        parser.error("--metrics-port needs --metrics-address (the node's fabric address)")
    if not CONTAINER_PREFIX_RE.fullmatch(args.container_prefix):
        parser.error(
            f"--container-prefix must match {CONTAINER_PREFIX_RE.pattern} (a docker name prefix),"
            f" got {args.container_prefix!r}"
        )
    state_dir = Path(args.state_dir).expanduser()
    log = Path(args.log).expanduser() if args.log else state_dir / "memguard.log"
    return Settings(
        meminfo=Path(args.meminfo),
        proc_root=Path(args.proc_root),
        log=log,
        interval=args.interval,
        floor=int(args.floor_gib * GIB),
        cooldown=args.cooldown,
        container_prefix=args.container_prefix,
        docker=args.docker,
        docker_timeout=args.docker_timeout,
        trace_below=int(args.trace_below_gib * GIB),
        trace_every=args.trace_every,
        trace_top=args.trace_top,
        log_max_bytes=args.log_max_bytes,
        log_backups=args.log_backups,
        kill_record=Path(args.kill_record).expanduser() if args.kill_record else state_dir / KILL_RECORD,
        metrics_address=args.metrics_address,
        metrics_port=args.metrics_port,
        sysfs_root=Path(args.sysfs_root),
    )


def build_metrics(settings: Settings, log: RotatingLog) -> guard_metrics.GuardMetrics | None:
    """The guard's metrics when an endpoint is asked for and the library is there; else None, said once."""
    if not settings.metrics_port:
        return None
    if guard_metrics is None:
        log.write("error", f"no metrics endpoint: {METRICS_UNAVAILABLE}")
        return None
    return guard_metrics.GuardMetrics(floor=settings.floor, sysfs_root=settings.sysfs_root)


def main(argv: Sequence[str] | None = None) -> int:
    """Guard until SIGTERM/SIGINT (exit 0); with --once, exit 1 if MemAvailable was unreadable."""
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = settings_from_args(parser, args)
    try:
        settings.log.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # keep guarding; RotatingLog falls back to stderr
        sys.stderr.write(f"memguard: cannot create {settings.log.parent}: {exc}\n")
    log = RotatingLog(
        settings.log, settings.log_max_bytes, settings.log_backups, time.time, program="memguard"
    )
    guard = Guard(
        settings,
        log,
        read_meminfo=settings.meminfo.read_text,
        run=run_command,
        monotonic=time.monotonic,
        metrics=None if args.once else build_metrics(settings, log),
    )
    with shared.stop_on_signals():
        try:
            log.write("start", settings.describe() + (" once" if args.once else ""))
            if args.once:
                return 0 if guard.step() else 1
            shared.run_loop(guard.step, interval=settings.interval, sleep=time.sleep, clock=time.monotonic)
        except StopRequested as stop:
            log.write("stop", f"{signal.Signals(stop.signum).name} received, exiting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
