"""Unit tests for roles/memguard/files/dsv41_memguard.py, the per-node memory guard.

The program is a standalone script installed by the memguard role, not a package module, so it is
imported from its path. Docker is replaced by a small executable in tmp_path that records its argv,
/proc by files in tmp_path, and time by a fake clock, so nothing here needs root, docker or memory
pressure, and the whole file runs in a few seconds.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from node_programs import load_program, program_path

REPO_ROOT = Path(__file__).resolve().parents[3]
PROGRAM = program_path("memguard", "dsv41_memguard")


mg = load_program("memguard", "dsv41_memguard")
import dsv41_memguard_metrics as guard_metrics  # noqa: E402 - beside the program, as installed
import dsv41_node as shared  # noqa: E402 - beside the program, as installed

GIB = 1024**3

# /proc/meminfo of the machine these tests were written on (x86_64, 24 GB), verbatim.
MEMINFO_THIS_MACHINE = """\
MemTotal:       24683584 kB
MemFree:        22241308 kB
MemAvailable:   24051308 kB
Buffers:          161212 kB
Cached:          1729960 kB
SwapCached:            0 kB
Active:           946592 kB
Inactive:        1139212 kB
Active(anon):       1140 kB
Inactive(anon):   202988 kB
Active(file):     945452 kB
Inactive(file):   936224 kB
Unevictable:       10132 kB
Mlocked:            8424 kB
SwapTotal:             0 kB
SwapFree:              0 kB
Zswap:                 0 kB
Zswapped:              0 kB
Dirty:            358680 kB
Writeback:             0 kB
AnonPages:        204864 kB
Mapped:           106120 kB
Shmem:              9356 kB
KReclaimable:     242244 kB
Slab:             280116 kB
SReclaimable:     242244 kB
SUnreclaim:        37872 kB
KernelStack:        1872 kB
PageTables:         2688 kB
SecPageTables:         0 kB
NFS_Unstable:          0 kB
Bounce:                0 kB
WritebackTmp:          0 kB
CommitLimit:    12341792 kB
Committed_AS:     540452 kB
VmallocTotal:   34359738367 kB
VmallocUsed:        6132 kB
VmallocChunk:          0 kB
Percpu:             1320 kB
AnonHugePages:         0 kB
ShmemHugePages:        0 kB
ShmemPmdMapped:        0 kB
FileHugePages:      8192 kB
FilePmdMapped:         0 kB
Balloon:               0 kB
HugePages_Total:       0
HugePages_Free:        0
HugePages_Rsvd:        0
HugePages_Surp:        0
Hugepagesize:       2048 kB
Hugetlb:               0 kB
DirectMap4k:       20480 kB
DirectMap2M:     2076672 kB
DirectMap1G:    25165824 kB
"""

# The same shape on a GB10 Spark serving a rank at steady state (~2.3 GiB available of ~119 GiB).
MEMINFO_GB10_SERVING = """\
MemTotal:       124546616 kB
MemFree:          912480 kB
MemAvailable:    2411724 kB
Buffers:            4116 kB
Cached:          3210964 kB
SwapCached:            0 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


def meminfo_with(available_bytes: int) -> str:
    """This machine's meminfo with MemAvailable replaced (kB, as the kernel writes it)."""
    return re.sub(
        r"^MemAvailable:\s+\d+ kB$",
        f"MemAvailable:   {available_bytes // 1024} kB",
        MEMINFO_THIS_MACHINE,
        flags=re.MULTILINE,
    )


# --------------------------------------------------------------------------------------------
# Fakes
# --------------------------------------------------------------------------------------------

FAKE_DOCKER = """\
#!{python}
import json, pathlib, sys, time
here = pathlib.Path(__file__).resolve().parent
with (here / "calls.jsonl").open("a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "ps":
    # Deliberately ignores --filter: the guard must check the prefix itself.
    sys.stdout.write((here / "names.txt").read_text())
elif sys.argv[1] == "kill" and (here / "exited.txt").exists():
    # Ranks that exited between the guard's ps and its kill: docker kills the others, names the
    # ones not running, exits 1 (its words, measured on Docker 20.10); none of them runs afterwards.
    exited = (here / "exited.txt").read_text().split()
    running = (here / "names.txt").read_text().split()
    (here / "names.txt").write_text("".join(n + "\\n" for n in running if n not in sys.argv[2:]))
    for name in sys.argv[2:]:
        if name in exited:
            sys.stderr.write("Error response from daemon: Cannot kill container: " + name
                             + ": Container 5bc6489745d2" + name + " is not running\\n")
        else:
            print(name)
    sys.exit(1 if set(exited) & set(sys.argv[2:]) else 0)
elif sys.argv[1] == "kill":
    rc = int((here / "kill_rc").read_text())
    if rc:
        sys.stderr.write("Error response from daemon: cannot kill\\n")
        sys.exit(rc)
    print("\\n".join(sys.argv[2:]))
elif sys.argv[1] == "hang":
    time.sleep(30)
"""


class FakeDocker:
    """An executable `docker` in tmp_path: prints configured names for ps, records every argv."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir()
        self.path = directory / "docker"
        self.path.write_text(FAKE_DOCKER.format(python=sys.executable))
        self.path.chmod(0o755)
        self.calls_file = directory / "calls.jsonl"
        self.set_names(["dsv41-r0", "dsv41-r1", "dsv41-hub", "other-dsv41-r9", "vllm"])
        self.set_kill_rc(0)

    def set_names(self, names: Iterable[str]) -> None:
        (self.path.parent / "names.txt").write_text("".join(f"{name}\n" for name in names))

    def set_kill_rc(self, rc: int) -> None:
        (self.path.parent / "kill_rc").write_text(str(rc))

    def exit_before_the_kill(self, *names: str) -> None:
        """These ranks exit between the guard's ps and its kill (under the same memory pressure)."""
        (self.path.parent / "exited.txt").write_text(" ".join(names))

    def calls(self) -> list[list[str]]:
        if not self.calls_file.exists():
            return []
        return [json.loads(line) for line in self.calls_file.read_text().splitlines()]

    def kills(self) -> list[list[str]]:
        return [call[1:] for call in self.calls() if call[0] == "kill"]


class FakeClock:
    """Monotonic and wall time that only move when the loop sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_760_000_000.0 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def docker(tmp_path: Path) -> FakeDocker:
    return FakeDocker(tmp_path / "bin")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def write_proc(root: Path, pid: int, *, rss_kib: int | None, comm: str, cmdline: bytes) -> None:
    """One /proc/<pid> with the three files top_rss reads; rss_kib None mimics a kernel thread."""
    pid_dir = root / str(pid)
    pid_dir.mkdir(parents=True)
    rss_line = f"VmRSS:\t{rss_kib:>8} kB\n" if rss_kib is not None else ""
    (pid_dir / "status").write_text(f"Name:\t{comm}\nState:\tS (sleeping)\nVmPeak:\t 1 kB\n{rss_line}")
    (pid_dir / "comm").write_text(comm + "\n")
    (pid_dir / "cmdline").write_bytes(cmdline)


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    write_proc(root, 1, rss_kib=12_000, comm="systemd", cmdline=b"/sbin/init\0splash\0")
    write_proc(root, 2, rss_kib=None, comm="kthreadd", cmdline=b"")
    write_proc(root, 4242, rss_kib=90 * 1024 * 1024, comm="pt_main_thread", cmdline=b"python3\0-m\0vllm\0")
    write_proc(root, 777, rss_kib=2 * 1024 * 1024, comm="dockerd", cmdline=b"/usr/bin/dockerd\0-H\0fd://\0")
    write_proc(root, 778, rss_kib=2 * 1024 * 1024, comm="containerd", cmdline=b"/usr/bin/containerd\0")
    (root / "self").mkdir()
    (root / "meminfo").write_text(MEMINFO_THIS_MACHINE)
    return root


class Harness:
    """A Guard wired to fakes: feed it MemAvailable samples, run ticks, read the log."""

    def __init__(self, tmp_path: Path, docker: FakeDocker, clock: FakeClock, proc_root: Path) -> None:
        self.tmp_path = tmp_path
        self.docker = docker
        self.clock = clock
        self.proc_root = proc_root
        self.samples: list[int] = []
        self.log_path = tmp_path / "state" / "memguard.log"
        self.metrics = None  # a GuardMetrics to wire in

    def guard(self, *extra_args: str):
        argv = [
            "--state-dir",
            str(self.tmp_path / "state"),
            "--docker",
            str(self.docker.path),
            "--proc-root",
            str(self.proc_root),
            *extra_args,
        ]
        parser = mg.build_parser()
        settings = mg.settings_from_args(parser, parser.parse_args(argv))
        settings.log.parent.mkdir(parents=True, exist_ok=True)
        log = mg.RotatingLog(settings.log, settings.log_max_bytes, settings.log_backups, self.clock.wall)
        samples = iter(self.samples)
        return mg.Guard(
            settings,
            log,
            read_meminfo=lambda: meminfo_with(next(samples)),
            run=mg.run_command,
            monotonic=self.clock.monotonic,
            wall=self.clock.wall,
            metrics=self.metrics,
        )

    def run(self, available_gib: Iterable[float], *extra_args: str) -> None:
        """One tick per sample, one second apart."""
        self.samples = [int(gib * GIB) for gib in available_gib]
        guard = self.guard(*extra_args)
        shared.run_loop(
            guard.step,
            interval=guard.settings.interval,
            sleep=self.clock.sleep,
            clock=self.clock.monotonic,
            iterations=len(self.samples),
        )

    def log_lines(self, event: str | None = None) -> list[str]:
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        return [line for line in lines if event is None or line.split(" ", 2)[1] == event]


@pytest.fixture
def harness(tmp_path: Path, docker: FakeDocker, clock: FakeClock, proc_root: Path) -> Harness:
    return Harness(tmp_path, docker, clock, proc_root)


# --------------------------------------------------------------------------------------------
# parse_meminfo
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(MEMINFO_THIS_MACHINE, 24_051_308 * 1024, id="this-machine"),
        pytest.param(MEMINFO_GB10_SERVING, 2_411_724 * 1024, id="gb10-serving"),
        pytest.param(meminfo_with(0), 0, id="zero"),
        pytest.param(meminfo_with(GIB - 1024), GIB - 1024, id="just-under-1GiB"),
        pytest.param("MemAvailable:\t123 kB", 123 * 1024, id="tab-no-newline"),
        pytest.param("MemTotal: 9 kB\nMemAvailable: 42\n", 42, id="no-unit-means-bytes"),
        pytest.param("MemAvailableX: 1 kB\nMemAvailable: 7 kB\n", 7 * 1024, id="exact-key-only"),
    ],
)
def test_parse_meminfo(text: str, expected: int) -> None:
    assert mg.parse_meminfo(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("MemTotal: 1 kB\nMemFree: 1 kB\n", "no MemAvailable", id="missing"),
        pytest.param("", "no MemAvailable", id="empty"),
        pytest.param("MemAvailable: lots kB\n", "malformed", id="not-a-number"),
        pytest.param("MemAvailable:\n", "malformed", id="no-value"),
        pytest.param("MemAvailable: -5 kB\n", "malformed", id="negative"),
        pytest.param("MemAvailable: 5 MB\n", "unknown MemAvailable unit", id="unknown-unit"),
    ],
)
def test_parse_meminfo_refuses_to_guess(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mg.parse_meminfo(text)


# --------------------------------------------------------------------------------------------
# decide / should_trace
# --------------------------------------------------------------------------------------------

FLOOR = GIB


@pytest.mark.parametrize(
    ("available", "last_kill", "now", "cooldown", "expected"),
    [
        pytest.param(2 * GIB, None, 100.0, 10.0, mg.Action.NONE, id="above-floor"),
        pytest.param(FLOOR, None, 100.0, 10.0, mg.Action.NONE, id="exactly-at-floor"),
        pytest.param(FLOOR - 1, None, 100.0, 10.0, mg.Action.KILL, id="one-byte-under-never-killed"),
        pytest.param(0, None, 100.0, 10.0, mg.Action.KILL, id="zero"),
        pytest.param(FLOOR - 1, 95.0, 100.0, 10.0, mg.Action.COOLDOWN, id="under-within-cooldown"),
        pytest.param(FLOOR - 1, 90.5, 100.0, 10.0, mg.Action.COOLDOWN, id="just-before-cooldown-end"),
        pytest.param(FLOOR - 1, 90.0, 100.0, 10.0, mg.Action.KILL, id="still-under-at-cooldown-end"),
        pytest.param(FLOOR - 1, 50.0, 100.0, 10.0, mg.Action.KILL, id="under-long-after"),
        pytest.param(5 * GIB, 99.0, 100.0, 10.0, mg.Action.NONE, id="recovered-within-cooldown"),
        pytest.param(FLOOR - 1, 100.0, 100.0, 0.0, mg.Action.KILL, id="no-cooldown"),
    ],
)
def test_decide(available: int, last_kill: float | None, now: float, cooldown: float, expected) -> None:
    assert mg.decide(available, FLOOR, last_kill, now, cooldown) is expected


@pytest.mark.parametrize(
    ("available", "last_trace", "now", "expected"),
    [
        pytest.param(20 * GIB, None, 100.0, False, id="plenty"),
        pytest.param(10 * GIB, None, 100.0, False, id="exactly-at-threshold"),
        pytest.param(9 * GIB, None, 100.0, True, id="low-first-time"),
        pytest.param(9 * GIB, 80.0, 100.0, False, id="low-rate-limited"),
        pytest.param(9 * GIB, 70.0, 100.0, True, id="low-after-every"),
    ],
)
def test_should_trace(available: int, last_trace: float | None, now: float, expected: bool) -> None:
    assert mg.should_trace(available, 10 * GIB, last_trace, now, 30.0) is expected


# --------------------------------------------------------------------------------------------
# top_rss and formatting
# --------------------------------------------------------------------------------------------


def test_top_rss_orders_by_rss_and_skips_kernel_threads(proc_root: Path) -> None:
    top = mg.top_rss(proc_root)
    assert [p.pid for p in top] == [4242, 777, 778, 1]  # equal RSS: lower pid first; kthreadd skipped
    assert top[0] == mg.ProcessRss(4242, 90 * GIB, "pt_main_thread", "python3 -m vllm")
    assert top[-1].cmdline == "/sbin/init splash"


def test_top_rss_limit(proc_root: Path) -> None:
    assert [p.pid for p in mg.top_rss(proc_root, limit=2)] == [4242, 777]
    assert mg.top_rss(proc_root, limit=0) == []


def test_top_rss_skips_processes_that_vanish_mid_scan(proc_root: Path) -> None:
    (proc_root / "4242" / "cmdline").unlink()  # the process exited between status and cmdline
    (proc_root / "31337").mkdir()  # ... or before anything could be read
    assert [p.pid for p in mg.top_rss(proc_root)] == [777, 778, 1]


def test_top_rss_of_missing_proc_root_is_empty(tmp_path: Path) -> None:
    assert mg.top_rss(tmp_path / "nope") == []


def test_format_trace_header_and_one_message_per_process(proc_root: Path) -> None:
    procs = [*mg.top_rss(proc_root, 2), mg.ProcessRss(9, 1024**2, "evil\ncomm", "x" * 500)]
    header, *rows = mg.format_trace(int(7.5 * GIB), procs)
    assert header == "MemAvailable=7.50 GiB; top 3 processes by RSS"
    assert rows[0] == "#1 rss=92160 MiB pid=4242 comm=pt_main_thread cmdline=python3 -m vllm"
    assert rows[1].startswith("#2 rss=2048 MiB pid=777 comm=dockerd")
    assert "comm=evil comm" in rows[2]
    assert rows[2].endswith("...") and len(rows[2].split("cmdline=")[1]) == mg.CMDLINE_MAX_CHARS


def test_matching_containers_checks_the_prefix_itself() -> None:
    output = "dsv41-r0\n  dsv41-r1 \ndsv41-hub\nother-dsv41-r9\n\n"
    assert mg.matching_containers(output, "dsv41-r") == ["dsv41-r0", "dsv41-r1"]
    assert mg.matching_containers("", "dsv41-r") == []


# --------------------------------------------------------------------------------------------
# The loop with a fake docker
# --------------------------------------------------------------------------------------------


def test_under_floor_kills_only_prefix_matching_containers(harness: Harness, docker: FakeDocker) -> None:
    harness.run([0.5])
    assert docker.calls() == [
        ["ps", "--filter", "name=^dsv41-r", "--format", "{{.Names}}"],
        ["kill", "dsv41-r0", "dsv41-r1"],
    ]
    (kill,) = harness.log_lines("kill")
    assert "MemAvailable=0.50 GiB under floor=1.00 GiB" in kill
    assert kill.endswith("killing containers: dsv41-r0 dsv41-r1")
    assert harness.log_lines("killed")[0].endswith("containers: dsv41-r0 dsv41-r1")
    assert harness.log_lines("error") == []


def test_a_kill_is_recorded_for_the_supervisor(
    harness: Harness, docker: FakeDocker, clock: FakeClock
) -> None:
    record = harness.tmp_path / "state" / "memguard-last-kill"
    harness.run([50, 0.5])
    assert float(record.read_text()) == pytest.approx(clock.wall() - 1, abs=1.5), "the time of the kill"
    assert not list(record.parent.glob(".memguard-last-kill*")), "written through a temporary file"


def test_no_kill_no_record_and_a_failed_kill_is_not_recorded(harness: Harness, docker: FakeDocker) -> None:
    record = harness.tmp_path / "state" / "memguard-last-kill"
    harness.run([50, 12])
    assert not record.exists()
    docker.set_kill_rc(1)
    harness.run([0.5])
    assert not record.exists(), "only a kill that happened is recorded"


@pytest.mark.parametrize("exited", [("dsv41-r1",), ("dsv41-r0", "dsv41-r1")], ids=["one", "both"])
def test_a_rank_that_exited_before_the_kill_is_recorded_as_killed(
    harness: Harness, docker: FakeDocker, exited: tuple[str, ...]
) -> None:
    """docker kill fails for a rank no longer running; the kill's aim is met once none runs, and
    without a record the supervisor would restart the group as a lost rank while memory is short."""
    record = harness.tmp_path / "state" / "memguard-last-kill"
    docker.exit_before_the_kill(*exited)
    harness.run([0.5, 0.5])
    assert docker.kills() == [["dsv41-r0", "dsv41-r1"]], "the cooldown is armed: no second kill"
    assert record.exists()
    (error,) = harness.log_lines("error")
    assert "is not running" in error
    assert harness.log_lines("killed")[0].endswith(
        "containers: dsv41-r0 dsv41-r1 (the kill failed for one that had exited; none runs now)"
    )


def test_above_floor_does_nothing(harness: Harness, docker: FakeDocker) -> None:
    harness.run([50, 12, 30])
    assert docker.calls() == []
    assert harness.log_lines() == []  # the start line belongs to main(); nothing else happened


def test_exactly_at_floor_is_not_under_it(harness: Harness, docker: FakeDocker) -> None:
    harness.run([1.0])
    assert docker.calls() == []
    assert {line.split(" ", 2)[1] for line in harness.log_lines()} == {"trace"}  # low, not critical


def test_custom_prefix_and_floor(harness: Harness, docker: FakeDocker) -> None:
    docker.set_names(["dsv41-hub", "vllm"])
    harness.run([1.5], "--floor-gib", "2", "--container-prefix", "dsv41-hub")
    assert docker.calls()[0][2] == "name=^dsv41-hub"
    assert docker.kills() == [["dsv41-hub"]]


def test_cooldown_then_kill_again_while_still_under_floor(harness: Harness, docker: FakeDocker) -> None:
    harness.run([0.5] * 25)  # t = 0..24 s, cooldown 10 s: kills at 0, 10, 20
    assert docker.kills() == [["dsv41-r0", "dsv41-r1"]] * 3
    kill_times = [datetime.datetime.fromisoformat(line.split()[0]) for line in harness.log_lines("kill")]
    assert [(t - kill_times[0]).total_seconds() for t in kill_times] == [0, 10, 20]


def test_recovery_inside_cooldown_means_no_second_kill(harness: Harness, docker: FakeDocker) -> None:
    harness.run([0.5, 0.7, 3, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40])
    assert len(docker.kills()) == 1


def test_failed_kill_logs_error_and_retries_next_tick(harness: Harness, docker: FakeDocker) -> None:
    docker.set_kill_rc(1)
    harness.run([0.5, 0.5])
    assert len(docker.kills()) == 2  # no cooldown armed after a failure
    errors = harness.log_lines("error")
    assert len(errors) == 2
    assert "kill dsv41-r0 dsv41-r1 failed (rc=1): Error response from daemon: cannot kill" in errors[0]


def test_no_matching_containers_is_logged_once_per_cooldown(harness: Harness, docker: FakeDocker) -> None:
    docker.set_names(["dsv41-hub", "grafana"])
    harness.run([0.5] * 5)
    assert docker.kills() == []
    (line,) = harness.log_lines("kill")
    assert line.endswith("no running dsv41-r* containers to kill")


def test_missing_docker_binary_is_logged(harness: Harness, docker: FakeDocker) -> None:
    docker.path.unlink()
    harness.run([0.5])
    (error,) = harness.log_lines("error")
    assert "failed (rc=127)" in error


def test_unreadable_meminfo_is_logged_not_fatal(harness: Harness, docker: FakeDocker) -> None:
    guard = harness.guard()
    guard.read_meminfo = lambda: "MemTotal: 1 kB\n"
    assert guard.step() is False
    assert "no MemAvailable field" in harness.log_lines("error")[0]
    assert docker.calls() == []


def test_trace_under_threshold_is_rate_limited(harness: Harness) -> None:
    harness.run([9.5] * 65)  # t = 0..64 s: traces at 0, 30, 60
    headers = [line for line in harness.log_lines("trace") if "top " in line]
    assert len(headers) == 3
    assert headers[0].endswith("MemAvailable=9.50 GiB; top 4 processes by RSS")
    rows = harness.log_lines("trace")[1:5]
    assert [re.search(r"pid=(\d+)", row)[1] for row in rows] == ["4242", "777", "778", "1"]
    assert "cmdline=python3 -m vllm" in rows[0]


def test_no_trace_above_threshold_and_trace_top_honoured(harness: Harness) -> None:
    harness.run([10, 25])
    assert harness.log_lines("trace") == []
    harness.run([4], "--trace-top", "2", "--trace-below-gib", "5")
    assert len(harness.log_lines("trace")) == 3  # header + 2 processes


def test_kill_is_logged_before_the_trace(harness: Harness) -> None:
    harness.run([0.5])
    events = [line.split(" ", 2)[1] for line in harness.log_lines()]
    assert events[:2] == ["kill", "killed"]
    assert events[2:] and set(events[2:]) == {"trace"}


def test_log_rotates_after_max_bytes(harness: Harness) -> None:
    harness.run([5] * 80, "--trace-every", "0", "--log-max-bytes", "2000", "--log-backups", "3")
    log = harness.log_path
    rotated = sorted(p.name for p in log.parent.iterdir())
    assert rotated == ["memguard.log", "memguard.log.1", "memguard.log.2", "memguard.log.3"]
    for path in log.parent.iterdir():
        assert 0 < path.stat().st_size <= 2000
        assert path.read_text().splitlines()[0].split(" ", 2)[1] == "trace"
    # Newest lines are in the live file, older ones in .1, .2, .3 in that order.
    stamps = [datetime.datetime.fromisoformat(log.with_name(n).read_text().split()[0]) for n in rotated]
    assert stamps[0] > stamps[1] > stamps[2] > stamps[3]


def test_rotation_without_backups_starts_over(tmp_path: Path, clock: FakeClock) -> None:
    log = mg.RotatingLog(tmp_path / "g.log", max_bytes=300, backups=0, clock=clock.wall)
    for index in range(20):
        log.write("error", f"line {index:02d} " + "x" * 40)
    assert [p.name for p in tmp_path.iterdir()] == ["g.log"]
    assert (tmp_path / "g.log").read_text().splitlines()[-1].split()[3] == "19"


def test_log_write_failure_falls_back_to_stderr(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    log = mg.RotatingLog(tmp_path / "missing-dir" / "g.log", 1000, 3, clock.wall)
    log.write("kill", "still reported")
    err = capsys.readouterr().err
    assert "cannot write" in err and "kill still reported" in err


def test_run_command_times_out(docker: FakeDocker) -> None:
    started = time.monotonic()
    result = mg.run_command([str(docker.path), "hang"], 0.5)
    assert result.returncode == 124 and "timed out" in result.stderr
    assert time.monotonic() - started < 5


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--floor-gib", "0"], "--floor-gib must be a finite number > 0", id="floor-zero"),
        pytest.param(["--floor-gib", "-1"], "--floor-gib must be a finite number > 0", id="floor-negative"),
        pytest.param(["--floor-gib", "nan"], "--floor-gib must be a finite number > 0", id="floor-nan"),
        pytest.param(["--interval", "0"], "--interval must be a finite number > 0", id="interval-zero"),
        pytest.param(["--interval", "-0.5"], "--interval must be a finite number > 0", id="interval-neg"),
        pytest.param(["--cooldown", "-1"], "--cooldown must be a finite number >= 0", id="cooldown"),
        pytest.param(["--log-max-bytes", "0"], "--log-max-bytes must be", id="log-max-bytes"),
        pytest.param(["--container-prefix=-rf"], "--container-prefix must match", id="prefix-option"),
        pytest.param(["--container-prefix", "a b"], "--container-prefix must match", id="prefix-space"),
        pytest.param(["--interval", "soon"], "invalid float value", id="not-a-number"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        mg.main(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults() -> None:
    parser = mg.build_parser()
    s = mg.settings_from_args(parser, parser.parse_args([]))
    assert (s.interval, s.floor, s.cooldown, s.container_prefix, s.docker) == (
        1.0,
        GIB,
        10.0,
        "dsv41-r",
        "docker",
    )
    assert (s.trace_below, s.trace_every, s.trace_top) == (10 * GIB, 30.0, 10)
    assert (s.log_max_bytes, s.log_backups) == (10 * 1024**2, 3)
    assert s.log == Path("~/.dsv41-two-sparks/memguard.log").expanduser()
    assert s.meminfo == Path("/proc/meminfo")


def cli(tmp_path: Path, docker: FakeDocker, proc_root: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(PROGRAM),
        "--meminfo",
        str(tmp_path / "meminfo"),
        "--state-dir",
        str(tmp_path / "state"),
        "--docker",
        str(docker.path),
        "--proc-root",
        str(proc_root),
        *extra,
    ]


def test_once_as_a_program(tmp_path: Path, docker: FakeDocker, proc_root: Path) -> None:
    (tmp_path / "meminfo").write_text(meminfo_with(GIB // 4))
    done = subprocess.run(
        cli(tmp_path, docker, proc_root, "--once"), check=False, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert docker.kills() == [["dsv41-r0", "dsv41-r1"]]
    events = [
        line.split(" ", 2)[1] for line in (tmp_path / "state" / "memguard.log").read_text().splitlines()
    ]
    assert events[:3] == ["start", "kill", "killed"]
    start = (tmp_path / "state" / "memguard.log").read_text().splitlines()[0]
    assert "floor=1.00 GiB interval=1s cooldown=10s prefix=dsv41-r" in start and start.endswith(" once")


def test_once_exits_1_when_meminfo_is_unreadable(tmp_path: Path, docker: FakeDocker, proc_root: Path) -> None:
    done = subprocess.run(
        cli(tmp_path, docker, proc_root, "--once"), check=False, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert " error cannot read MemAvailable" in (tmp_path / "state" / "memguard.log").read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_logs_and_exits_0(tmp_path: Path, docker: FakeDocker, proc_root: Path, signum: int) -> None:
    (tmp_path / "meminfo").write_text(meminfo_with(50 * GIB))
    log = tmp_path / "state" / "memguard.log"
    with subprocess.Popen(
        cli(tmp_path, docker, proc_root, "--interval", "0.05"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        deadline = time.monotonic() + 15
        while not (log.exists() and " start " in log.read_text()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "guard never logged its start line"
            time.sleep(0.02)
        time.sleep(0.2)  # let it run a few ticks, so the signal lands in the loop
        os.kill(proc.pid, signum)
        _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    last = log.read_text().splitlines()[-1]
    assert last.endswith(f"stop {signal.Signals(signum).name} received, exiting")
    assert docker.calls() == []


# --------------------------------------------------------------------------------------------
# Metrics (dsv41_memguard_metrics)
# --------------------------------------------------------------------------------------------

SYSFS_GENERATOR = REPO_ROOT / "lab" / "standins" / "sysfs" / "make_rdma_sysfs.py"


def _sample(registry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels or None)


@pytest.fixture
def spark_sysfs(tmp_path: Path) -> Path:
    """The stand-in tree of a Spark with its cabled port's two halves ACTIVE and the other DOWN,
    and netdev statistics as the kernel keeps them."""
    spec = importlib.util.spec_from_file_location("make_rdma_sysfs", SYSFS_GENERATOR)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gen
    spec.loader.exec_module(gen)
    root = tmp_path / "sysfs"
    devices = [
        gen.DeviceSpec(name="rocep1s0f1", netdev="enp1s0f1np1", state="ACTIVE"),
        gen.DeviceSpec(name="roceP2p1s0f1", netdev="enP2p1s0f1np1", state="ACTIVE"),
        gen.DeviceSpec(name="rocep1s0f0", netdev="enp1s0f0np0", state="DOWN"),
    ]
    gen.build_tree(str(root), devices, ipv4_by_netdev={d.netdev: [] for d in devices})
    port = root / "class/infiniband/rocep1s0f1/ports/1/counters"
    (port / "port_rcv_data").write_text("1000\n")
    (port / "port_xmit_data").write_text("250\n")
    (port / "link_downed").write_text("2\n")
    stats = root / "class/net/enp1s0f1np1/statistics"
    stats.mkdir()
    (stats / "rx_bytes").write_text("123456\n")
    (stats / "tx_errors").write_text("3\n")
    return root


def test_fabric_metrics_read_every_port_and_its_netdev_at_each_scrape(spark_sysfs: Path) -> None:
    metrics = guard_metrics.GuardMetrics(floor=GIB, sysfs_root=spark_sysfs)
    registry = metrics.registry
    port = {"device": "rocep1s0f1", "port": "1"}
    assert _sample(registry, "dsv41_fabric_port_active", **port, netdev="enp1s0f1np1") == 1
    assert (
        _sample(registry, "dsv41_fabric_port_active", device="rocep1s0f0", port="1", netdev="enp1s0f0np0")
        == 0
    )
    assert _sample(registry, "dsv41_fabric_port_data_bytes_total", **port, direction="receive") == 4000
    assert _sample(registry, "dsv41_fabric_port_data_bytes_total", **port, direction="transmit") == 1000
    assert _sample(registry, "dsv41_fabric_port_errors_total", **port, counter="link_downed") == 2
    assert _sample(registry, "dsv41_fabric_port_errors_total", **port, counter="port_rcv_errors") == 0
    # symbol_error is not in the tree: no series rather than a made-up 0.
    assert _sample(registry, "dsv41_fabric_port_errors_total", **port, counter="symbol_error") is None
    assert _sample(registry, "dsv41_fabric_netdev_up", netdev="enp1s0f1np1") == 1
    assert _sample(registry, "dsv41_fabric_netdev_up", netdev="enp1s0f0np0") == 0
    netdev = {"netdev": "enp1s0f1np1"}
    assert _sample(registry, "dsv41_fabric_netdev_bytes_total", **netdev, direction="receive") == 123456
    assert _sample(registry, "dsv41_fabric_netdev_errors_total", **netdev, direction="transmit") == 3
    assert _sample(registry, "dsv41_fabric_netdev_bytes_total", **netdev, direction="transmit") is None
    # Read again at the next scrape: a link that went down shows at once.
    (spark_sysfs / "class/infiniband/rocep1s0f1/ports/1/state").write_text("1: DOWN\n")
    (spark_sysfs / "class/net/enp1s0f1np1/carrier").write_text("0\n")
    assert _sample(registry, "dsv41_fabric_port_active", **port, netdev="enp1s0f1np1") == 0
    assert _sample(registry, "dsv41_fabric_netdev_up", netdev="enp1s0f1np1") == 0


def test_fabric_metrics_of_a_node_without_rdma_are_empty(tmp_path: Path) -> None:
    families = guard_metrics.fabric_families(tmp_path / "no-sysfs")
    assert [family.samples for family in families] == [[], [], [], [], [], [], []]


def test_without_prometheus_client_the_guard_guards_and_says_why(
    harness: Harness, docker: FakeDocker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mg, "guard_metrics", None)
    monkeypatch.setattr(mg, "METRICS_UNAVAILABLE", "No module named 'prometheus_client'; install it")
    guard = harness.guard("--metrics-address", "192.168.100.13", "--metrics-port", "9642")
    assert mg.build_metrics(guard.settings, guard.log) is None
    assert harness.log_lines("error")[-1].endswith(
        "no metrics endpoint: No module named 'prometheus_client'; install it"
    )
    harness.run([0.5])
    assert docker.kills() == [["dsv41-r0", "dsv41-r1"]]


def test_no_metrics_object_without_an_endpoint(harness: Harness) -> None:
    guard = harness.guard()
    assert mg.build_metrics(guard.settings, guard.log) is None
    assert harness.log_lines("error") == []


def test_metrics_show_memavailable_the_floor_and_each_kill(harness: Harness, tmp_path: Path) -> None:
    harness.metrics = guard_metrics.GuardMetrics(floor=GIB, sysfs_root=tmp_path / "no-sysfs")
    registry = harness.metrics.registry
    assert _sample(registry, "dsv41_memguard_kills_total") == 0
    harness.run([5, 0.5, 0.5], "--cooldown", "60")
    assert _sample(registry, "dsv41_memguard_mem_available_bytes") == int(0.5 * GIB)
    assert _sample(registry, "dsv41_memguard_floor_bytes") == GIB
    assert _sample(registry, "dsv41_memguard_kills_total") == 1  # the second sample is in the cooldown


class RefusingMetrics:
    """A metrics endpoint whose address is not there yet (the fabric comes up after the guard)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tries = 0

    def sampled(self, _mem_available: int) -> None:
        pass

    def killed(self) -> None:
        pass

    def serve(self, address: str, port: int) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise OSError(99, "Cannot assign requested address")


def test_a_metrics_address_not_there_yet_is_tried_again_and_never_stops_the_guard(
    harness: Harness, docker: FakeDocker
) -> None:
    harness.metrics = RefusingMetrics(failures=2)
    harness.run([0.5] + [5] * 70, "--metrics-address", "192.168.100.13", "--metrics-port", "9642")
    assert docker.kills() == [["dsv41-r0", "dsv41-r1"]]  # guarded from the first sample
    assert harness.metrics.tries == 3  # at 0 s, 30 s, then served at 60 s
    errors = harness.log_lines("error")
    assert len(errors) == 1 and "192.168.100.13:9642: [Errno 99] Cannot assign requested address" in errors[0]
    assert harness.log_lines("metrics")[0].endswith("serving on 192.168.100.13:9642")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-port", "9642"], "--metrics-port needs --metrics-address"),
        (["--metrics-address", "10.0.0.1", "--metrics-port", "70000"], "--metrics-port must be a TCP port"),
    ],
)
def test_metrics_options_are_checked(harness: Harness, capsys, args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        harness.guard(*args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
