"""Unit tests for roles/supervisor/files/dsv41_supervisor.py, the rank group's supervisor on the head.

The program is a standalone script installed by the supervisor role, not a package module, so it
is imported from its path. The nodes' rankctl is replaced by a fake cluster (a callable that
answers status/start/stop per node and records the calls), the API by a fake HTTP callable, and
time by a fake clock that only moves when the loop sleeps, so every rule runs in milliseconds
without docker, ssh, root or a network.
"""

from __future__ import annotations

import dataclasses
import datetime
import http.server
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._health import deployment_health
from ansible_collections.sparkserve.dsv41.plugins.module_utils._lock import acquire, guard_path, release
from node_programs import load_program, program_path

REPO_ROOT = Path(__file__).resolve().parents[3]
PROGRAM = program_path("supervisor", "dsv41_supervisor")
RANKCTL = REPO_ROOT / "roles" / "supervisor" / "files" / "dsv41_rankctl.py"
FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures" / "supervisor"


sup = load_program("supervisor", "dsv41_supervisor")
import dsv41_node as shared  # noqa: E402 - beside the program, as installed
import dsv41_supervisor_metrics as supervisor_metrics  # noqa: E402 - beside the program, as installed
import dsv41_supervisor_rules as rules  # noqa: E402 - beside the program, as installed
import dsv41_supervisor_settings as supervisor_settings  # noqa: E402 - beside the program, as installed

GIB = 1024**3
T0 = 1_764_579_600.0  # 2025-12-01T09:00:00Z
KEY = "sk-dsv41-0123456789abcdef-secret"
MODEL = "deepseek-v4.1-flash"
HEAD_ARGV = ["/usr/bin/python3", "/usr/local/lib/sparkserve-dsv41/dsv41_rankctl.py", "--config"]
NAMES = ["spark-a", "spark-b", "spark-c"]
IPS = {"spark-b": "198.18.0.11", "spark-c": "198.18.0.12"}
# A two-node group restart, in order: the head stopped, the worker stopped, started, the head started.
GROUP_RESTART = [("spark-a", "stop"), ("spark-b", "stop"), ("spark-b", "start"), ("spark-a", "start")]
IFNAME = "enp1s0f1np1"
ABSENT = object()  # a status without the "fabric" key (a rankctl from before it)


def rankctl_argv(name: str) -> list[str]:
    """The head runs rankctl locally; a worker through ssh, whose forced command picks the program."""
    if name == "spark-a":
        return [*HEAD_ARGV, "/etc/sparkserve-dsv41/rankctl.json"]
    return [
        "ssh",
        "-i",
        "/root/.ssh/dsv41_rankctl",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        f"spark@{IPS[name]}",
    ]


def config_doc(state_dir: Path, key_file: Path, nodes: int = 2, **overrides: Any) -> dict[str, Any]:
    return {
        "state_dir": str(state_dir),
        "api_key_file": str(key_file),
        "model": MODEL,
        "log_max_bytes": 1_000_000,
        "log_backups": 2,
        "nodes": [{"name": n, "rank": r, "rankctl": rankctl_argv(n)} for r, n in enumerate(NAMES[:nodes])],
        **overrides,
    }


def iso(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


# --------------------------------------------------------------------------------------------
# Fakes
# --------------------------------------------------------------------------------------------


class FakeClock:
    """Time that only moves when the loop sleeps (or a test says so): ``now`` is the monotonic
    clock, the wall clock is ``now`` plus the steps it was set by (none unless a test steps it)."""

    def __init__(self) -> None:
        self.now = T0
        self.wall_step = 0.0

    def time(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + self.wall_step

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeApi:
    """The head's API: /health, /metrics (two engines' label sets) and the chat endpoint.

    The counters are what vLLM publishes; a test moves them to play traffic, leaves them to play a
    frozen engine (the metrics freeze with it), and ``prefill_step`` plays a long prefill: the KV
    cache usage rises at every /metrics read while the token counters stay flat. A new head process
    (the head's start) counts from zero.
    """

    def __init__(self) -> None:
        self.health: int | None = 200
        self.health_after_start: int | None = 200
        self.metrics_up = True
        self.running = 0
        self.waiting = 0
        self.tokens = 1000
        self.prompt_tokens = 3000
        self.kv = 0.0
        self.done = 100
        self.prefill_step = 0.0  # KV usage added at every /metrics read (a prefill under way)
        self.probe_status: int | None = 200
        self.probe_body = '{"choices": [{"message": {"content": "OK"}}]}'
        self.answers_per_start: int | None = None  # probes a new head answers before it hangs
        self.answers_left: int | None = None
        self.on_probe: Any = None  # called as a probe arrives (what the engine does meanwhile)
        self.probes: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, float]] = []

    def new_process(self) -> None:
        self.tokens = self.prompt_tokens = self.done = self.running = self.waiting = 0
        self.kv = 0.0
        self.answers_left = self.answers_per_start

    def metrics_text(self) -> str:
        # Split across two label sets so only a parser that sums them gets the totals right.
        half_running, half_tokens = self.running // 2, self.tokens // 2
        labels = [
            'engine="0",model_name="deepseek-v4.1-flash"',
            'engine="1",model_name="deepseek-v4.1-flash"',
        ]
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches."]
        lines += ["# TYPE vllm:num_requests_running gauge"]
        lines += [f"vllm:num_requests_running{{{labels[0]}}} {float(half_running)}"]
        lines += [f"vllm:num_requests_running{{{labels[1]}}} {float(self.running - half_running)}"]
        lines += [f"vllm:num_requests_waiting{{{labels[0]}}} {float(self.waiting)}"]
        lines += [f"vllm:generation_tokens_total{{{labels[0]}}} {float(half_tokens)}"]
        lines += [f"vllm:generation_tokens_total{{{labels[1]}}} {float(self.tokens - half_tokens)}"]
        lines += [f"vllm:prompt_tokens_total{{{labels[0]}}} {float(self.prompt_tokens)}"]
        lines += [f"vllm:kv_cache_usage_perc{{{labels[0]}}} {self.kv!r}"]
        lines += [f'vllm:request_success_total{{{labels[0]},finished_reason="stop"}} {float(self.done)}']
        return "\n".join(lines) + "\n"

    def __call__(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: float
    ) -> Any:
        path = url.split("8000", 1)[1]
        self.requests.append((method, path, timeout))
        if self.health is None:
            return sup.HttpResult(None, "", "[Errno 111] Connection refused")
        if path == "/health":
            return sup.HttpResult(self.health, "", "" if self.health == 200 else f"HTTP {self.health}")
        if path == "/metrics":
            if not self.metrics_up:
                return sup.HttpResult(500, "", "")
            self.kv += self.prefill_step
            return sup.HttpResult(200, self.metrics_text(), "")
        assert (method, path) == ("POST", "/v1/chat/completions")
        return self.probe(headers, body, timeout)

    def probe(self, headers: Mapping[str, str], body: bytes | None, timeout: float) -> Any:
        self.probes.append({"headers": dict(headers), "body": json.loads(body or b""), "timeout": timeout})
        if self.on_probe is not None:
            self.on_probe()
        if self.answers_left is not None:
            if self.answers_left == 0:
                return sup.HttpResult(None, "", "timed out")
            self.answers_left -= 1
        if self.probe_status is None:
            return sup.HttpResult(None, "", "timed out")
        if self.probe_status == 200:
            self.tokens += 1
            self.prompt_tokens += 12
            self.done += 1
        return sup.HttpResult(self.probe_status, self.probe_body, "")


class FakeNode:
    def __init__(self, name: str, rank: int, clock: FakeClock) -> None:
        self.name, self.rank, self.clock = name, rank, clock
        self.state = "running"
        self.exit_code: int | None = None
        self.started_at: str | None = iso(T0 - 3600 + rank)
        self.finished_at: str | None = None
        self.restart_count = 0
        self.oom_killed = False
        self.boot_id = f"boot-{name}-1"
        self.mem_available: int | None = 100 * GIB
        self.memguard_last_kill: float | None = None
        self.unreachable = False
        self.vanish_on: str | None = None  # the verb at which the node stops answering (a reboot)
        self.vanish_after_start = False  # the node drops off once its rank has started (a crash)
        self.fail: set[str] = set()
        self.fabric: Any = ABSENT

    def link(self, operstate: str, carrier: int | None) -> None:
        """The fabric link as rankctl reads it from sysfs."""
        self.fabric = {
            "ifname": IFNAME,
            "operstate": operstate,
            "carrier": carrier,
            "up": operstate == "up" and carrier == 1,
        }

    def status(self) -> dict[str, Any]:
        doc = {
            "node": self.name,
            "container": f"dsv41-r{self.rank}",
            "state": self.state,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "restart_count": self.restart_count,
            "oom_killed": self.oom_killed,
            "boot_id": self.boot_id,
            "mem_available_bytes": self.mem_available,
            "memguard_last_kill": self.memguard_last_kill,
            "time": self.clock.wall(),
        }
        if self.fabric is not ABSENT:
            doc["fabric"] = self.fabric
        return doc

    def die(self, code: int = 137, *, oom: bool = False) -> None:
        self.state, self.exit_code, self.oom_killed = "exited", code, oom
        self.finished_at = iso(self.clock.wall())

    def restart_alone(self) -> None:
        """What docker's restart policy does: same container, new StartedAt."""
        self.restart_count += 1
        self.started_at = iso(self.clock.wall() + 0.5)


class FakeCluster:
    """Every node's rankctl: picks the node from the argv, answers the appended verb, records it."""

    def __init__(self, clock: FakeClock, api: FakeApi, nodes: int = 2) -> None:
        self.clock, self.api = clock, api
        self.nodes = {n: FakeNode(n, r, clock) for r, n in enumerate(NAMES[:nodes])}
        self.calls: list[tuple[str, str, float, float]] = []  # node, verb, timeout, time
        self.starts = 0

    def node_of(self, argv: Sequence[str]) -> FakeNode:
        if list(argv[: len(HEAD_ARGV)]) == HEAD_ARGV:
            return self.nodes["spark-a"]
        return next(n for n in self.nodes.values() if argv[-2] == f"spark@{IPS.get(n.name)}")

    def __call__(self, argv: Sequence[str], timeout: float) -> Any:
        node, verb = self.node_of(argv), argv[-1]
        self.calls.append((node.name, verb, timeout, self.clock.now))
        if node.vanish_on == verb:
            node.unreachable = True
        if node.unreachable:
            return shared.CommandResult(
                255, "", f"ssh: connect to host {IPS.get(node.name)} port 22: No route to host\n"
            )
        if verb == "status":
            return shared.CommandResult(0, json.dumps(node.status()) + "\n", "")
        if verb in node.fail:
            doc = {
                "verb": verb,
                "ok": False,
                "detail": f"docker {verb} dsv41-r{node.rank} failed (rc=1): boom",
            }
            return shared.CommandResult(1, json.dumps(doc) + "\n", "")
        if verb == "start":
            self.starts += 1
            node.state, node.exit_code, node.finished_at = "running", None, None
            node.started_at = iso(self.clock.wall() + self.starts / 1000)
            node.unreachable = node.vanish_after_start
            if node.rank == 0:
                self.api.health = self.api.health_after_start
                self.api.new_process()
        else:
            assert verb in ("stop", "kill")
            if node.state == "running":
                node.state, node.exit_code, node.finished_at = "exited", 0, iso(self.clock.wall())
            if node.rank == 0:
                self.api.health = None
        return shared.CommandResult(0, json.dumps({"verb": verb, "ok": True, "detail": "done"}) + "\n", "")

    def actions(self) -> list[tuple[str, str]]:
        return [(node, verb) for node, verb, _, _ in self.calls if verb != "status"]

    def head_stop_times(self) -> list[float]:
        return [when for node, verb, _, when in self.calls if node == "spark-a" and verb in ("stop", "kill")]


class Harness:
    def __init__(self, tmp_path: Path, nodes: int = 2, **overrides: Any) -> None:
        self.clock = FakeClock()
        self.state_dir = tmp_path / "state"
        self.state_dir.mkdir(exist_ok=True)
        self.key_file = tmp_path / "api_key"
        self.key_file.write_text(KEY + "\n")
        self.settings = supervisor_settings.load_settings(
            config_doc(self.state_dir, self.key_file, nodes, **overrides)
        )
        self.api = FakeApi()
        self.cluster = FakeCluster(self.clock, self.api, nodes)
        self.log_path = self.state_dir / "supervisor.log"
        log = sup.RotatingLog(
            self.log_path, self.settings.log_max_bytes, self.settings.log_backups, self.clock.time, echo=False
        )
        self.sup = sup.Supervisor(
            self.settings,
            log,
            run=self.cluster,
            http=self.api,
            clock=self.clock.time,
            sleep=self.sleep,
            wall=self.clock.wall,
        )
        self.settles: list[float] = []
        self.on_settle: Any = None  # called as the supervisor waits inside a tick (what happens meanwhile)

    def sleep(self, seconds: float) -> None:
        """The supervisor's own waits inside a tick, kept out of the fake clock (the loop's sleep is
        the test's, and the cases' timings are the loop's)."""
        self.settles.append(seconds)
        if self.on_settle is not None:
            self.on_settle()

    @property
    def head(self) -> FakeNode:
        return self.cluster.nodes["spark-a"]

    @property
    def worker(self) -> FakeNode:
        return self.cluster.nodes["spark-b"]

    def tick(self, count: int = 1) -> None:
        shared.run_loop(
            self.sup.step,
            interval=self.settings.interval,
            sleep=self.clock.sleep,
            clock=self.clock.time,
            iterations=count,
        )

    def until(self, predicate, limit: int = 1000) -> int:
        """Tick until predicate() holds; returns the ticks it took."""
        for ticks in range(1, limit + 1):
            self.tick()
            if predicate():
                return ticks
        raise AssertionError("condition never met")

    def state(self) -> dict[str, Any]:
        return json.loads((self.state_dir / "supervisor-state.json").read_text())

    def log_lines(self, event: str | None = None) -> list[str]:
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        return [line for line in lines if event is None or line.split(" ", 2)[1] == event]

    def adopt_healthy(self) -> None:
        self.tick()
        assert self.sup.memory.state is sup.State.HEALTHY, self.log_lines()
        assert self.cluster.actions() == []


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    doc = config_doc(Path("/home/spark/.dsv41-two-sparks"), Path("/home/spark/.dsv41-two-sparks/api_key"))
    del doc["log_max_bytes"], doc["log_backups"]
    s = supervisor_settings.load_settings(doc)
    assert (s.interval, s.hang, s.probe_interval, s.probe_timeout, s.startup_timeout) == (5, 60, 60, 30, 1200)
    assert (s.backoff_initial, s.backoff_max, s.max_attempts) == (10, 300, 5)
    assert s.memory_needed == 5 * GIB
    assert (s.api_url, s.pause_max) == ("http://127.0.0.1:8000", 120 * 60)
    assert (s.log_max_bytes, s.log_backups) == (10 * 1024**2, 3)
    assert [n.name for n in s.nodes] == ["spark-a", "spark-b"] and s.head.rank == 0
    assert s.lock_path == Path("/home/spark/.dsv41-two-sparks/deployment.lock")
    assert KEY not in s.describe() and "key_file=" in s.describe()


def test_nodes_are_ordered_by_rank(tmp_path: Path) -> None:
    doc = config_doc(Path("/s"), Path("/k"), nodes=3)
    doc["nodes"].reverse()
    assert [n.rank for n in supervisor_settings.load_settings(doc).nodes] == [0, 1, 2]


def _bad(**changes: Any) -> dict[str, Any]:
    doc = config_doc(Path("/s"), Path("/k"))
    for key, value in changes.items():
        if value is None:
            del doc[key]
        else:
            doc[key] = value
    return doc


def _node(name: str, rank: Any, argv: Any = ("x",)) -> dict[str, Any]:
    return {"name": name, "rank": rank, "rankctl": list(argv) if isinstance(argv, tuple) else argv}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        pytest.param([], "must be a JSON object", id="not-object"),
        pytest.param(_bad(model=None), "missing required key 'model'", id="no-model"),
        pytest.param(_bad(nodes=None), "missing required key 'nodes'", id="no-nodes"),
        pytest.param(_bad(intervall=5), "unknown key 'intervall'", id="typo"),
        pytest.param(_bad(state_dir="~/.dsv41-two-sparks"), "state_dir must be an absolute path", id="tilde"),
        pytest.param(
            _bad(api_key_file="api_key"), "api_key_file must be an absolute path", id="relative-key"
        ),
        pytest.param(_bad(model=""), "model must be", id="empty-model"),
        pytest.param(_bad(api_url="127.0.0.1:8000"), "api_url must be", id="no-scheme"),
        pytest.param(_bad(interval_seconds=0), "interval_seconds must be a finite number > 0", id="interval"),
        pytest.param(_bad(hang_seconds=-1), "hang_seconds must be", id="hang"),
        pytest.param(_bad(probe_timeout_seconds="30"), "probe_timeout_seconds must be", id="string"),
        pytest.param(_bad(startup_timeout_seconds=True), "startup_timeout_seconds must be", id="bool"),
        pytest.param(
            _bad(memory_margin_gib=-1), "memory_margin_gib must be a finite number >= 0", id="margin"
        ),
        pytest.param(_bad(max_attempts=0), "max_attempts must be an integer >= 1", id="attempts"),
        pytest.param(_bad(max_attempts=2.5), "max_attempts must be an integer", id="attempts-float"),
        pytest.param(_bad(log_backups=-1), "log_backups must be an integer >= 0", id="backups"),
        pytest.param(
            _bad(backoff_initial_seconds=60, backoff_max_seconds=30),
            "backoff_max_seconds must be >=",
            id="backoff",
        ),
        pytest.param(_bad(nodes=[]), "nodes must be a non-empty list", id="no-nodes-listed"),
        pytest.param(_bad(nodes=[_node("a", 1)]), "node ranks must be 0..0", id="no-head"),
        pytest.param(_bad(nodes=[_node("a", 0), _node("b", 0)]), "each once", id="duplicate-rank"),
        pytest.param(_bad(nodes=[_node("a", 0), _node("b", 2)]), "node ranks must be 0..1", id="gap"),
        pytest.param(_bad(nodes=[_node("a", 0), _node("a", 1)]), "names must be unique", id="dup-name"),
        pytest.param(_bad(nodes=[_node("a", 0, "ssh a")]), "rankctl must be a non-empty argv list", id="str"),
        pytest.param(
            _bad(nodes=[_node("a", 0, [])]), "rankctl must be a non-empty argv list", id="empty-argv"
        ),
        pytest.param(_bad(nodes=[_node("a", "0")]), "rank must be an integer", id="rank-str"),
        pytest.param(
            _bad(nodes=[{"name": "a", "rank": 0}]), "exactly name, rank and rankctl", id="no-rankctl"
        ),
    ],
)
def test_bad_config_is_refused_clearly(doc: Any, message: str) -> None:
    with pytest.raises(sup.ConfigError, match=message):
        supervisor_settings.load_settings(doc)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(sup.ConfigError) as raised:
        supervisor_settings.load_settings(_bad(interval_seconds=0, max_attempts=0, state_dir="rel"))
    assert all(k in str(raised.value) for k in ("interval_seconds", "max_attempts", "state_dir"))


# --------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------


def test_parse_metrics_of_real_vllm_text_sums_label_sets() -> None:
    text = (FIXTURES / "metrics_vllm_two_engines.txt").read_text()
    # _created series, _by_reason gauges and histograms are other metrics and must not count.
    assert sup.parse_metrics(text) == sup.Metrics(
        running=3.0,
        waiting=1.0,
        generation_tokens=200000.0,
        prompt_tokens=2236529.0,
        kv_usage=0.0372 + 0.0186,
        requests_done=432.0,
    )


def test_parse_metrics_reads_the_iteration_histogram_count_and_sum() -> None:
    text = (
        "# TYPE vllm:iteration_tokens_total histogram\n"
        'vllm:iteration_tokens_total_bucket{engine="0",le="256.0",model_name="m"} 40.0\n'
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="m"} 44.0\n'
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 44.0\n'
        'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 11161.0\n'
        'vllm:iteration_tokens_total_created{engine="0",model_name="m"} 1.7645762219874e+09\n'
    )
    assert sup.parse_metrics(text) == sup.Metrics(iterations=44.0, iteration_tokens=11161.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", sup.Metrics(None, None, None), id="empty"),
        pytest.param(
            "# HELP x\nprocess_cpu_seconds_total 3.2\n", sup.Metrics(None, None, None), id="none-of-ours"
        ),
        pytest.param(
            "vllm:num_requests_running 2\nvllm:generation_tokens_total 1.5e+06 1764579600000\n",
            sup.Metrics(2.0, None, 1_500_000.0),
            id="no-labels-and-timestamp",
        ),
        pytest.param(
            'vllm:num_requests_running{model_name="a b } c",engine="0"} 1.0\n'
            'vllm:num_requests_running{model_name="say \\"hi\\" {x}",engine="1"} 2.0\n',
            sup.Metrics(3.0, None, None),
            id="spaces-braces-escaped-quotes-in-labels",
        ),
        pytest.param(
            'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_running{engine="1 2\n',
            sup.Metrics(1.0, None, None),
            id="truncated-line-ignored",
        ),
        pytest.param(
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 9\nvllm:num_requests_waiting{} 0\n',
            sup.Metrics(None, 0.0, None),
            id="similar-names-not-summed",
        ),
        pytest.param("vllm:num_requests_running{} NaN\n", None, id="nan"),
    ],
)
def test_parse_metrics_edge_cases(text: str, expected: Any) -> None:
    got = sup.parse_metrics(text)
    if expected is None:
        assert got.running != got.running  # NaN passes through; `running > 0` is then False
    else:
        assert got == expected


NODE_B = sup.NodeConfig("spark-b", 1, tuple(rankctl_argv("spark-b")))


def test_parse_rank_status_of_a_rankctl_document() -> None:
    doc = {
        "node": "spark-b",
        "container": "dsv41-r1",
        "state": "exited",
        "exit_code": 137,
        "started_at": "2026-12-01T08:03:17.482613054Z",
        "finished_at": "2026-12-01T09:14:02.530981177Z",
        "restart_count": 0,
        "oom_killed": True,
        "boot_id": "b1",
        "mem_available_bytes": 3 * GIB,
        "memguard_last_kill": 1764580442.5,
        "time": T0,
    }
    status = sup.parse_rank_status(NODE_B, shared.CommandResult(0, json.dumps(doc) + "\n", ""))
    assert status == sup.RankStatus(
        "spark-b",
        1,
        "exited",
        137,
        "2026-12-01T08:03:17.482613054Z",
        "2026-12-01T09:14:02.530981177Z",
        0,
        True,
        "b1",
        3 * GIB,
        1764580442.5,
        "",
    )


@pytest.mark.parametrize(
    ("result", "state", "detail"),
    [
        pytest.param(
            shared.CommandResult(255, "", "ssh: connect to host 198.18.0.11 port 22: No route to host\n"),
            "unreachable",
            "rc=255: ssh: connect to host 198.18.0.11 port 22: No route to host",
            id="ssh-fails",
        ),
        pytest.param(
            shared.CommandResult(124, "", "timed out after 20s"), "unreachable", "timed out", id="timeout"
        ),
        pytest.param(
            shared.CommandResult(0, "Welcome to DGX OS\n", ""), "unreachable", "Welcome", id="garbage"
        ),
        pytest.param(
            shared.CommandResult(2, "", "dsv41_rankctl: refused 'status; x'\n"),
            "unreachable",
            "refused",
            id="refused",
        ),
        pytest.param(
            shared.CommandResult(
                1, '{"state": "unknown", "error": "Cannot connect to the Docker daemon"}\n', ""
            ),
            "unknown",
            "Cannot connect",
            id="docker-down-document",
        ),
    ],
)
def test_parse_rank_status_failures(result: Any, state: str, detail: str) -> None:
    status = sup.parse_rank_status(NODE_B, result)
    assert (status.node, status.rank, status.state) == ("spark-b", 1, state)
    assert detail in status.detail
    assert not status.running


@pytest.mark.parametrize(
    ("fabric", "expected"),
    [
        pytest.param(ABSENT, None, id="absent"),
        pytest.param(None, None, id="null"),
        pytest.param(
            {"ifname": IFNAME, "operstate": "up", "carrier": 1, "up": True},
            rules.Fabric(IFNAME, "up", 1, True),
            id="up",
        ),
        pytest.param(
            {"ifname": IFNAME, "operstate": "down", "carrier": None, "up": False},
            rules.Fabric(IFNAME, "down", None, False),
            id="administratively-down",
        ),
        pytest.param(
            {"ifname": IFNAME, "operstate": "missing", "carrier": None, "up": False},
            rules.Fabric(IFNAME, "missing", None, False),
            id="missing",
        ),
        pytest.param(
            {"ifname": IFNAME, "operstate": "up", "carrier": True, "up": "yes"},
            rules.Fabric(IFNAME, "up", None, False),
            id="only-true-is-up",
        ),
        pytest.param(
            {"ifname": "enp1\nforged line", "operstate": "down\x1b[2J", "carrier": 0, "up": False},
            rules.Fabric("enp1 forged line", "down [2J", 0, False),
            id="one-line-for-the-log",
        ),
        pytest.param(
            {"ifname": IFNAME, "up": False}, rules.Fabric(IFNAME, "unknown", None, False), id="sparse"
        ),
        pytest.param({"operstate": "down", "up": False}, None, id="no-ifname"),
        pytest.param("down", None, id="not-an-object"),
    ],
)
def test_parse_rank_status_fabric(fabric: Any, expected: Any) -> None:
    doc: dict[str, Any] = {"state": "running", "started_at": "2026-12-01T08:03:17Z", "boot_id": "b1"}
    if fabric is not ABSENT:
        doc["fabric"] = fabric
    status = sup.parse_rank_status(NODE_B, shared.CommandResult(0, json.dumps(doc) + "\n", ""))
    assert status.fabric == expected
    assert rules.rank_summary(status)["fabric"] == (None if expected is None else expected._asdict())


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        pytest.param(("up", 1), rules.Fabric(IFNAME, "up", 1, True), id="up"),
        pytest.param(("down", None), rules.Fabric(IFNAME, "down", None, False), id="administratively-down"),
        pytest.param(
            ("lowerlayerdown", 0), rules.Fabric(IFNAME, "lowerlayerdown", 0, False), id="lowerlayerdown"
        ),
        pytest.param((None, None), rules.Fabric(IFNAME, "missing", None, False), id="missing"),
    ],
)
def test_the_fabric_rankctl_reports_is_the_fabric_the_supervisor_reads(link: tuple, expected: Any) -> None:
    """The contract between the two programs, with rankctl's own functions writing the document."""
    rankctl = load_program("supervisor", "dsv41_rankctl", "dsv41_rankctl_contract")
    doc = rankctl.status_document(
        node="spark-b",
        container="dsv41-r1",
        facts=rankctl.MISSING,
        boot_id="b1",
        mem_available=GIB,
        memguard_last_kill=None,
        now=T0,
        fabric=rankctl.fabric_status(IFNAME, *link),
    )
    status = sup.parse_rank_status(NODE_B, shared.CommandResult(0, json.dumps(doc) + "\n", ""))
    assert status.fabric == expected


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(
            shared.CommandResult(0, '{"verb": "stop", "ok": true, "detail": "d"}\n', ""), (True, "d"), id="ok"
        ),
        pytest.param(
            shared.CommandResult(1, '{"verb": "start", "ok": false, "detail": "no"}\n', ""),
            (False, "no"),
            id="not-ok",
        ),
        pytest.param(
            shared.CommandResult(124, "", "timed out after 120s"),
            (False, "rc=124: timed out after 120s"),
            id="t",
        ),
        pytest.param(shared.CommandResult(0, "", ""), (False, "rc=0: no output"), id="silent"),
    ],
)
def test_parse_action_result(result: Any, expected: tuple[bool, str]) -> None:
    assert sup.parse_action_result(result) == expected


@pytest.mark.parametrize(
    ("reply", "outcome", "detail"),
    [
        pytest.param(sup.HttpResult(200, "{}", ""), sup.Probe.OK, "answered", id="200"),
        pytest.param(
            sup.HttpResult(401, "", "HTTP 401"),
            sup.Probe.INCONCLUSIVE,
            "HTTP 401: the key file does not match the server's key",
            id="401",
        ),
        pytest.param(sup.HttpResult(None, "", "timed out"), sup.Probe.FAILED, "timed out", id="timeout"),
        pytest.param(
            sup.HttpResult(500, '{"error": "EngineCore died"}', "HTTP 500"),
            sup.Probe.FAILED,
            'HTTP 500: {"error": "EngineCore died"}',
            id="500",
        ),
        pytest.param(sup.HttpResult(404, "", "HTTP 404"), sup.Probe.FAILED, "HTTP 404", id="404"),
    ],
)
def test_classify_probe(reply: Any, outcome: Any, detail: str) -> None:
    assert sup.classify_probe(reply) == (outcome, detail)


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        pytest.param(None, sup.LockStatus.NONE, id="no-lock"),
        pytest.param(0, sup.LockStatus.HELD, id="fresh"),
        pytest.param(119 * 60, sup.LockStatus.HELD, id="young"),
        pytest.param(120 * 60, sup.LockStatus.STALE, id="at-max"),
        pytest.param(-30, sup.LockStatus.HELD, id="clock-skew"),
    ],
)
def test_lock_status(age: float | None, expected: Any) -> None:
    assert sup.lock_status(None if age is None else T0 - age, T0, 120 * 60) is expected


# --------------------------------------------------------------------------------------------
# The pure decision
# --------------------------------------------------------------------------------------------

SETTINGS = supervisor_settings.load_settings(
    config_doc(Path("/state"), Path("/state/api_key"), nodes=2, startup_timeout_seconds=600)
)
NOW = T0 + 10_000
STARTED = {"spark-a": "2025-12-01T08:59:59.1Z", "spark-b": "2025-12-01T08:59:59.2Z"}  # just before T0
BOOTS = {"spark-a": "boot-a", "spark-b": "boot-b"}
BASELINE = {n: rules.Baseline(STARTED[n], BOOTS[n]) for n in STARTED}


def rank(name: str = "spark-b", state: str = "running", **fields: Any) -> Any:
    base = {"started_at": STARTED[name], "boot_id": BOOTS[name], "mem_available": 100 * GIB}
    return sup.RankStatus(name, NAMES.index(name), state, **{**base, **fields})


def obs(*ranks: Any, health: int | None = 200, metrics: Any = None, probe: Any = None, **kw: Any) -> Any:
    ranks = ranks or (rank("spark-a"), rank("spark-b"))
    metrics = metrics or sup.Metrics(0.0, 0.0, 5000.0)
    return sup.Observation(tuple(ranks), health, "" if health else "Connection refused", metrics, probe, **kw)


def mem(state: Any = sup.State.HEALTHY, **fields: Any) -> Any:
    base = {
        "reason": "group healthy",
        "since": T0,
        "needs_adoption": False,
        "group_started": T0,
        "baseline": BASELINE,
        "last_progress": NOW,
        "last_metrics": sup.Metrics(0.0, 0.0, 5000.0),
    }
    return sup.Memory(state=state, **{**base, **fields})


EXITED = rank("spark-b", "exited", exit_code=137, oom_killed=True, finished_at="2026-12-01T09:14:02.5Z")
UNREACHABLE = sup.RankStatus(
    "spark-b", 1, "unreachable", detail="rc=255: ssh: connect to host: No route to host"
)
DOCKER_SILENT = rank("spark-b", "unknown", started_at=None, detail="docker inspect timed out after 20s")
PROBE_TIMEOUT = sup.ProbeResult(NOW, sup.Probe.FAILED, "timed out")
PROBE_401 = sup.ProbeResult(
    NOW, sup.Probe.INCONCLUSIVE, "HTTP 401: the key file does not match the server's key"
)
PROBE_OK = sup.ProbeResult(NOW, sup.Probe.OK, "answered")
ENGINE_DEAD = (
    '{"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause."}}'
)
PROBE_500 = sup.ProbeResult(NOW, sup.Probe.FAILED, f"HTTP 500: {ENGINE_DEAD}"[:160])
# /metrics read again after a probe that timed out behind a prefill: the KV cache kept filling.
PREFILL = sup.Metrics(1.0, 0.0, 5000.0, kv_usage=0.3)


@pytest.mark.parametrize(
    ("observation", "memory", "action", "state", "reason"),
    [
        pytest.param(obs(), mem(), "none", "healthy", "group healthy", id="healthy"),
        pytest.param(
            obs(rank("spark-a"), EXITED),
            mem(),
            "restart",
            "starting",
            "lost rank 1 on spark-b: exited, exit code 137, OOM killed, finished 2026-12-01T09:14:02.5Z",
            id="lost-exited-137-oom",
        ),
        pytest.param(
            obs(rank("spark-a"), rank("spark-b", "missing", started_at=None)),
            mem(),
            "restart",
            "starting",
            "lost rank 1 on spark-b: missing",
            id="lost-missing",
        ),
        pytest.param(
            obs(
                rank("spark-a"),
                rank("spark-b", "restarting", exit_code=1, finished_at="2026-12-01T09:20:58Z"),
            ),
            mem(),
            "restart",
            "starting",
            "lost rank 1 on spark-b: restarting, exit code 1, finished 2026-12-01T09:20:58Z",
            id="lost-restarting",
        ),
        pytest.param(
            obs(rank("spark-a"), UNREACHABLE),
            mem(unreachable_since=NOW - 60),
            "stop",
            "node_wait",
            "node not answering: spark-b (rc=255: ssh: connect to host: No route to host): waiting for it",
            id="unreachable-for-hang-seconds-node-waited-for",
        ),
        pytest.param(
            obs(rank("spark-a"), UNREACHABLE),
            mem(unreachable_since=NOW - 55),
            "none",
            "healthy",
            "group healthy",
            id="unreachable-less-than-hang-seconds-while-the-api-answers-left-serving",
        ),
        pytest.param(
            obs(rank("spark-a"), UNREACHABLE, health=500),
            mem(unreachable_since=NOW),
            "stop",
            "node_wait",
            "node not answering: spark-b (rc=255: ssh: connect to host: No route to host): waiting for it",
            id="unreachable-and-the-api-failing-node-waited-for-at-once",
        ),
        pytest.param(
            obs(rank("spark-a"), UNREACHABLE, health=None),
            mem(sup.State.STARTING, group_started=NOW - 30, unreachable_since=NOW - 55),
            "none",
            "starting",
            "",
            id="unreachable-less-than-hang-seconds-while-starting-left-starting",
        ),
        pytest.param(
            obs(rank("spark-a"), UNREACHABLE, health=None),
            mem(sup.State.STARTING, group_started=NOW - 90, unreachable_since=NOW - 60),
            "stop",
            "node_wait",
            "node not answering: spark-b (rc=255: ssh: connect to host: No route to host): waiting for it",
            id="unreachable-for-hang-seconds-while-starting-node-waited-for",
        ),
        pytest.param(
            obs(rank("spark-a"), DOCKER_SILENT),
            mem(unreachable_since=NOW - 55),
            "none",
            "healthy",
            "group healthy",
            id="docker-silent-less-than-hang-seconds-while-the-api-answers-left-serving",
        ),
        pytest.param(
            obs(rank("spark-a"), DOCKER_SILENT),
            mem(unreachable_since=NOW - 60),
            "stop",
            "node_wait",
            "node not answering: spark-b (docker inspect timed out after 20s): waiting for it",
            id="docker-silent-for-hang-seconds-node-waited-for",
        ),
        pytest.param(
            obs(rank("spark-a", "exited", exit_code=1, finished_at="2026-12-01T09:30:00Z"), rank("spark-b")),
            mem(),
            "restart",
            "starting",
            "lost rank 0 on spark-a: exited, exit code 1, finished 2026-12-01T09:30:00Z",
            id="lost-head",
        ),
        pytest.param(
            obs(rank("spark-a"), rank("spark-b", started_at="2026-12-01T09:40:00.3Z", restart_count=1)),
            mem(),
            "restart",
            "starting",
            "rank 1 on spark-b restarted alone: started 2026-12-01T09:40:00.3Z, the group started it at"
            " 2025-12-01T08:59:59.2Z (docker restart count 1)",
            id="restarted-alone",
        ),
        pytest.param(
            obs(rank("spark-a"), rank("spark-b", boot_id="boot-b2", started_at="2026-12-01T09:41:00Z")),
            mem(),
            "restart",
            "starting",
            "node spark-b rebooted: boot_id boot-b -> boot-b2",
            id="rebooted",
        ),
        pytest.param(
            obs(metrics=sup.Metrics(2.0, 0.0, 5000.0), probe=PROBE_TIMEOUT),
            mem(last_progress=NOW - 60),
            "restart",
            "starting",
            "hang: 2 requests running, no new tokens for 60 s (no prompt token or KV cache change either),"
            " and the probe failed: timed out",
            id="hang-at-hang-seconds-confirmed-by-the-probe",
        ),
        pytest.param(
            obs(metrics=sup.Metrics(2.0, 0.0, 5000.0)),
            mem(last_progress=NOW - 60),
            "none",
            "healthy",
            "group healthy",
            id="no-progress-alone-waits-for-the-probe",
        ),
        pytest.param(
            obs(
                metrics=sup.Metrics(1.0, 0.0, 5000.0, kv_usage=0.2),
                probe=PROBE_TIMEOUT,
                metrics_after=PREFILL,
            ),
            mem(last_progress=NOW - 60),
            "none",
            "healthy",
            "group healthy: the probe failed (timed out) while the engine made progress: busy",
            id="probe-queued-behind-a-long-prefill-is-no-hang",
        ),
        pytest.param(
            obs(metrics=sup.Metrics(0.0, 0.0, 5000.0), probe=PROBE_500),
            mem(),
            "restart",
            "starting",
            'hang: the probe failed: HTTP 500: {"error": {"message": "EngineCore encountered an issue.',
            id="killed-worker-head-answers-500",
        ),
        pytest.param(
            obs(metrics=sup.Metrics(2.0, 0.0, 5000.0)),
            mem(last_progress=NOW - 59),
            "none",
            "healthy",
            "group healthy",
            id="no-hang-just-before",
        ),
        pytest.param(
            obs(metrics=sup.Metrics(0.0, 3.0, 5000.0), probe=PROBE_TIMEOUT),
            mem(),
            "restart",
            "starting",
            "hang: the probe failed: timed out; no engine progress for 0 s (/metrics: 0 running, 3 waiting:"
            " frozen metrics read like an idle engine)",
            id="probe-timed-out",
        ),
        pytest.param(
            obs(probe=PROBE_401), mem(), "none", "healthy", "group healthy", id="probe-401-is-no-failure"
        ),
        pytest.param(
            obs(health=503),
            mem(health_bad_since=NOW - 60),
            "restart",
            "starting",
            "API /health 503 for 60 s",
            id="health-bad-for-hang-seconds",
        ),
        pytest.param(
            obs(health=503), mem(health_bad_since=NOW - 5), "none", "healthy", "group", id="health-blip"
        ),
        pytest.param(
            obs(rank("spark-a"), rank("spark-b", memguard_last_kill=T0 + 1)),
            mem(),
            "stop",
            "memory_wait",
            "memory guard on spark-b killed at",
            id="memguard-kill-after-start",
        ),
        pytest.param(
            obs(rank("spark-a"), rank("spark-b", memguard_last_kill=T0 - 1)),
            mem(),
            "none",
            "healthy",
            "group healthy",
            id="memguard-kill-before-start",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED),
            mem(sup.State.GAVE_UP, reason="gave up after 5 failed attempts in a row; last: x", attempts=5),
            "none",
            "gave_up",
            "gave up after 5",
            id="gave-up-acts-on-nothing",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED, lock_taken=T0 - 1),
            mem(
                sup.State.GAVE_UP,
                reason="gave up after 5 failed attempts in a row; last: x",
                attempts=5,
                lock_taken_seen=T0 - 1,
            ),
            "none",
            "gave_up",
            "gave up after 5",
            id="gave-up-ignores-the-run-it-saw-before-giving-up",
        ),
        pytest.param(
            obs(lock_taken=T0 + 60),
            mem(
                sup.State.GAVE_UP,
                reason="gave up after 5 failed attempts in a row; last: x",
                attempts=5,
                lock_taken_seen=T0 - 1,
            ),
            "adopt",
            "healthy",
            "a deployment run took the lock since it gave up: adopted the running group (rank 0",
            id="gave-up-adopts-what-a-later-run-started",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED, lock_taken=T0 + 60),
            mem(
                sup.State.GAVE_UP,
                reason="gave up after 5 failed attempts in a row; last: x",
                attempts=5,
                lock_taken_seen=None,
            ),
            "restart",
            "starting",
            "a deployment run took the lock since it gave up: lost rank 1 on spark-b",
            id="gave-up-restarts-after-a-later-run",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED, lock=sup.LockStatus.HELD, lock_mtime=NOW - 60),
            mem(),
            "none",
            "paused",
            "paused: /state/deployment.lock held (since",
            id="paused",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED, lock=sup.LockStatus.STALE, lock_mtime=NOW - 3 * 3600),
            mem(),
            "restart",
            "starting",
            "lost rank 1",
            id="stale-lock-ignored",
        ),
    ],
)
def test_decide(observation: Any, memory: Any, action: str, state: str, reason: str) -> None:
    decision = sup.decide(observation, memory, NOW, SETTINGS)
    assert (decision.action.value, decision.state.value) == (action, state)
    assert decision.reason.startswith(reason), decision.reason


@pytest.mark.parametrize(
    ("observation", "action", "state", "reason"),
    [
        pytest.param(
            obs(), "adopt", "healthy", "adopted the running group (rank 0 on spark-a started", id="serving"
        ),
        pytest.param(obs(health=None), "adopt", "starting", "adopted the running group", id="api-not-ready"),
        pytest.param(
            obs(rank("spark-a", "exited"), rank("spark-b", "missing")),
            "restart",
            "starting",
            "no rank running (rank 0 on spark-a exited, rank 1 on spark-b missing): starting the group",
            id="nothing-running",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED), "restart", "starting", "lost rank 1 on spark-b", id="half-running"
        ),
        pytest.param(
            obs(rank("spark-a"), UNREACHABLE),
            "adopt",
            "healthy",
            "adopted the running group (rank 0 on spark-a started 2025-12-01T08:59:59.1Z,"
            " rank 1 on spark-b gave no status)",
            id="a-node-silent-while-the-api-answers",
        ),
        pytest.param(
            obs(rank("spark-a"), UNREACHABLE, health=500),
            "stop",
            "node_wait",
            "node not answering: spark-b",
            id="a-node-silent-and-the-api-failing",
        ),
    ],
)
def test_first_look_adopts_or_starts(observation: Any, action: str, state: str, reason: str) -> None:
    silent = any(rank.unreachable for rank in observation.ranks)
    memory = sup.track(sup.Memory(since=NOW), observation, NOW) if silent else sup.Memory(since=NOW)
    decision = sup.decide(observation, memory, NOW, SETTINGS)
    assert (decision.action.value, decision.state.value, decision.attempts) == (action, state, 0)
    assert decision.reason.startswith(reason), decision.reason


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        pytest.param("2026-12-01T08:00:00.123456789Z", 1796112000.123456, id="docker-nanoseconds"),
        pytest.param("2026-12-01T08:00:00Z", 1796112000.0, id="whole-seconds"),
        pytest.param("2026-12-01T09:00:00.5+01:00", 1796112000.5, id="offset"),
        pytest.param(None, None, id="never-started"),
        pytest.param("yesterday", None, id="not-a-time"),
        pytest.param("2026-12-01T08:00:00.1Z trailing", None, id="trailing-text"),
    ],
)
def test_docker_epoch(text: str | None, epoch: float | None) -> None:
    assert rules.docker_epoch(text) == (None if epoch is None else pytest.approx(epoch, abs=1e-6))


B_STARTED = rules.docker_epoch(STARTED["spark-b"])
GAVE_UP = {
    "reason": "gave up after 5 failed attempts in a row; last: x",
    "attempts": 5,
    "lock_taken_seen": T0,
}


@pytest.mark.parametrize(
    ("kill", "expected"),
    [
        pytest.param(
            B_STARTED + 5,
            ("stop", "memory_wait", 1, "memory guard on spark-b killed at"),
            id="killed-since-the-rank-started",
        ),
        pytest.param(B_STARTED - 5, ("restart", "starting", 0, "lost rank 1 on spark-b"), id="an-older-kill"),
    ],
)
@pytest.mark.parametrize(
    "memory",
    [
        pytest.param(sup.Memory(since=NOW), id="first-look"),
        pytest.param(mem(sup.State.GAVE_UP, **GAVE_UP), id="a-run-after-giving-up"),
    ],
)
def test_first_look_judges_a_memory_guard_kill_against_the_rank_start(
    kill: float, expected: tuple, memory: Any
) -> None:
    killed = rank("spark-b", "exited", exit_code=137, memguard_last_kill=kill)
    decision = sup.decide(obs(rank("spark-a"), killed, lock_taken=T0 + 60), memory, NOW, SETTINGS)
    action, state, attempts, reason = expected
    assert (decision.action.value, decision.state.value, decision.attempts) == (action, state, attempts)
    assert reason in decision.reason, decision.reason


@pytest.mark.parametrize(
    "baseline",
    [
        pytest.param({"spark-a": BASELINE["spark-a"]}, id="no-entry-for-the-rank"),
        pytest.param(
            {**BASELINE, "spark-b": rules.Baseline(None, BOOTS["spark-b"])}, id="entry-without-a-start"
        ),
    ],
)
def test_a_kill_with_no_recorded_start_is_judged_against_the_ranks_current_one(baseline: dict) -> None:
    killed = rank("spark-b", "exited", exit_code=137, memguard_last_kill=B_STARTED + 5)
    decision = sup.decide(obs(rank("spark-a"), killed), mem(baseline=baseline), NOW, SETTINGS)
    assert (decision.action.value, decision.state.value) == ("stop", "memory_wait"), decision.reason


@pytest.mark.parametrize(
    ("group_started", "kill", "worker", "expected"),
    [
        pytest.param(
            T0 + 60,
            B_STARTED + 30,
            {"state": "exited", "exit_code": 137},
            ("stop", "memory_wait", "memory guard on spark-b killed at"),
            id="worker-clock-behind-the-head",
        ),
        pytest.param(
            T0 - 60,
            B_STARTED - 30,
            {},
            ("none", "healthy", "group healthy"),  # from starting: it answers
            id="worker-clock-ahead-of-the-head",
        ),
        pytest.param(
            T0,
            B_STARTED + 30,
            {"started_at": iso(B_STARTED + 31), "restart_count": 1},
            ("stop", "memory_wait", "memory guard on spark-b killed at"),
            id="restarted-alone-after-the-kill",
        ),
    ],
)
@pytest.mark.parametrize("state", [sup.State.STARTING, sup.State.HEALTHY])
def test_a_memory_guard_kill_is_judged_on_the_killed_ranks_own_clock(
    state: Any, group_started: float, kill: float, worker: dict, expected: tuple
) -> None:
    """The group's start is the head's clock, the kill record the worker's: only the worker's own
    start of its rank (recorded when the group started it) tells which came first."""
    observation = obs(rank("spark-a"), rank("spark-b", memguard_last_kill=kill, **worker))
    memory = mem(state, group_started=group_started, api_up=T0, last_answered=NOW, last_probe=PROBE_OK)
    decision = sup.decide(observation, memory, NOW, SETTINGS)
    assert (decision.action.value, decision.state.value) == expected[:2], decision.reason
    assert expected[2] in decision.reason, decision.reason


@pytest.mark.parametrize(
    ("observation", "memory", "expected"),
    [
        pytest.param(
            obs(probe=PROBE_OK),
            mem(sup.State.STARTING, attempts=2, last_probe=PROBE_OK),
            ("none", "healthy", 2, "group healthy: every rank running, /health 200, probe answered"),
            id="serving-keeps-the-attempts-until-it-recovered",
        ),
        pytest.param(
            obs(probe=PROBE_TIMEOUT),
            mem(sup.State.STARTING, group_started=NOW - 30, last_answered=NOW - 5, last_probe=PROBE_TIMEOUT),
            ("none", "healthy", 0, "group healthy: every rank running, /health 200, requests answered since"),
            id="clients-answered-though-the-probe-did-not",
        ),
        pytest.param(
            obs(probe=PROBE_TIMEOUT),
            mem(
                sup.State.STARTING,
                group_started=NOW - 300,
                api_up=NOW - 60,
                last_progress=NOW - 200,
                last_probe=PROBE_TIMEOUT,
            ),
            ("none", "backoff", 1, "attempt 1 of 5 failed: while starting: hang: the API has been up for"),
            id="hang-once-the-api-is-up-for-hang-seconds",
        ),
        pytest.param(
            obs(probe=PROBE_TIMEOUT),
            mem(
                sup.State.STARTING,
                reason="lost rank 1",
                group_started=NOW - 300,
                api_up=NOW - 59,
                last_progress=NOW - 200,
                last_probe=PROBE_TIMEOUT,
            ),
            ("none", "starting", 0, "lost rank 1"),
            id="api-up-for-less-than-hang-seconds",
        ),
        pytest.param(
            obs(probe=PROBE_TIMEOUT, metrics=sup.Metrics(1.0, 0.0, 0.0, kv_usage=0.2), metrics_after=PREFILL),
            mem(
                sup.State.STARTING,
                reason="lost rank 1",
                group_started=NOW - 300,
                api_up=NOW - 100,
                last_progress=NOW - 100,
                last_probe=PROBE_TIMEOUT,
            ),
            ("none", "starting", 0, "lost rank 1"),
            id="probe-behind-a-long-prefill-while-starting",
        ),
        pytest.param(
            obs(probe=PROBE_401),
            mem(sup.State.STARTING, last_probe=PROBE_401),
            (
                "none",
                "healthy",
                0,
                "group healthy: every rank running, /health 200, probe answered (probe incon",
            ),
            id="401-health-alone-counts",
        ),
        pytest.param(
            obs(health=503),
            mem(sup.State.STARTING, reason="lost rank 1", group_started=NOW - 599),
            ("none", "starting", 0, "lost rank 1"),
            id="still-starting",
        ),
        pytest.param(
            obs(probe=PROBE_TIMEOUT),
            mem(sup.State.STARTING, reason="lost rank 1", group_started=NOW - 30, last_probe=PROBE_TIMEOUT),
            ("none", "starting", 0, "lost rank 1"),
            id="failed-probe-while-starting-waits",
        ),
        pytest.param(
            obs(health=503),
            mem(sup.State.STARTING, group_started=NOW - 600),
            ("none", "backoff", 1, "attempt 1 of 5 failed: startup: not healthy within 600 s (/health 503)"),
            id="startup-timeout",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED, health=None),
            mem(sup.State.STARTING, group_started=NOW - 60, attempts=1),
            ("none", "backoff", 2, "attempt 2 of 5 failed: while starting: lost rank 1 on spark-b: exited"),
            id="rank-dies-while-starting",
        ),
        pytest.param(
            obs(health=None),
            mem(sup.State.STARTING, group_started=NOW - 600, attempts=4),
            ("none", "gave_up", 5, "gave up after 5 failed attempts in a row; last: startup: not healthy"),
            id="fifth-failure-gives-up",
        ),
        pytest.param(
            obs(probe=PROBE_OK),
            mem(
                sup.State.STARTING,
                group_started=NOW - 30,
                last_probe=sup.ProbeResult(NOW - 31, sup.Probe.OK, "answered"),
            ),
            ("none", "starting", 0, "group healthy"),
            id="a-probe-from-before-the-start-does-not-count",
        ),
    ],
)
def test_decide_while_starting(observation: Any, memory: Any, expected: tuple) -> None:
    decision = sup.decide(observation, memory, NOW, SETTINGS)
    action, state, attempts, reason = expected
    assert (decision.action.value, decision.state.value, decision.attempts) == (action, state, attempts)
    assert decision.reason.startswith(reason), decision.reason


@pytest.mark.parametrize(
    ("memory", "action"),
    [
        pytest.param(mem(sup.State.BACKOFF, backoff_until=NOW + 1, attempts=1), "none", id="waiting"),
        pytest.param(mem(sup.State.BACKOFF, backoff_until=NOW, attempts=1), "restart", id="over"),
    ],
)
def test_decide_backoff(memory: Any, action: str) -> None:
    decision = sup.decide(obs(rank("spark-a"), EXITED), memory, NOW, SETTINGS)
    assert decision.action.value == action and decision.attempts == 1


FLOOR_PLUS_MARGIN = 5 * GIB


@pytest.mark.parametrize(
    ("head_mem", "worker_mem", "action"),
    [
        pytest.param(100 * GIB, 3 * GIB, "none", id="worker-short"),
        pytest.param(100 * GIB, FLOOR_PLUS_MARGIN - 1, "none", id="one-byte-short"),
        pytest.param(2 * GIB, 100 * GIB, "none", id="head-short"),
        pytest.param(100 * GIB, None, "none", id="worker-did-not-say"),
        pytest.param(FLOOR_PLUS_MARGIN, FLOOR_PLUS_MARGIN, "restart", id="exactly-floor-plus-margin"),
        pytest.param(100 * GIB, 90 * GIB, "restart", id="plenty"),
    ],
)
def test_memory_wait_holds_until_every_node_has_floor_plus_margin(head_mem, worker_mem, action: str) -> None:
    observation = obs(
        rank("spark-a", "exited", mem_available=head_mem),
        rank("spark-b", "exited", mem_available=worker_mem, memguard_last_kill=T0 + 5),
    )
    decision = sup.decide(
        observation, mem(sup.State.MEMORY_WAIT, reason="waiting", attempts=1), NOW, SETTINGS
    )
    assert decision.action.value == action
    assert decision.state.value == ("memory_wait" if action == "none" else "starting")


@pytest.mark.parametrize(
    ("attempts", "delay"), [(1, 10), (2, 20), (3, 40), (4, 80), (5, 160), (6, 300), (12, 300)]
)
def test_backoff_doubles_up_to_the_maximum(attempts: int, delay: float) -> None:
    assert rules.backoff_delay(attempts, SETTINGS) == delay


def test_memguard_kill_at_the_last_attempt_stops_and_gives_up() -> None:
    observation = obs(rank("spark-a"), rank("spark-b", memguard_last_kill=T0 + 1))
    decision = sup.decide(observation, mem(attempts=4), NOW, SETTINGS)
    assert (decision.action, decision.state, decision.attempts) == (sup.Action.STOP, sup.State.GAVE_UP, 5)


@pytest.mark.parametrize("when", [1e300, 1e17, float(2**62)], ids=["1e300", "year-3e9", "2^62"])
def test_a_kill_time_no_calendar_holds_is_told_as_it_is_not_fatal(when: float) -> None:
    """The kill record lies in the deployment user's directory: any number it holds must not stop
    the supervisor's loop."""
    observation = obs(rank("spark-a"), rank("spark-b", memguard_last_kill=when))
    decision = sup.decide(observation, mem(attempts=1), NOW, SETTINGS)
    assert decision.action is sup.Action.STOP
    assert f"killed at {when:g} (epoch seconds)" in decision.reason


LINK_UP = rules.Fabric(IFNAME, "up", 1, True)
LINK_DOWN = rules.Fabric(IFNAME, "down", 0, False)
LINK_ADMIN_DOWN = rules.Fabric(IFNAME, "down", None, False)  # carrier unreadable (EINVAL)
LINK_LOWER = rules.Fabric(IFNAME, "lowerlayerdown", 0, False)
LINK_MISSING = rules.Fabric(IFNAME, "missing", None, False)
LINK_NO_CARRIER = rules.Fabric(IFNAME, "up", 0, False)
B_DOWN = f"fabric {IFNAME} on spark-b is down: waiting for the link"
BOTH_UP = (rank("spark-a", fabric=LINK_UP), rank("spark-b", fabric=LINK_UP))
FABRIC_BACK = (
    f"fabric back: every node's link is up (spark-a {IFNAME}, spark-b {IFNAME}): restarting the group"
)


def b_link(link: Any, state: str = "running", **fields: Any) -> Any:
    return rank("spark-b", state, fabric=link, **fields)


@pytest.mark.parametrize(
    ("observation", "memory", "expected"),
    [
        # A link goes down: stop the group once and wait, whatever the group was doing.
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN)),
            mem(),
            ("stop", "fabric_wait", 0, B_DOWN),
            id="healthy-worker-link-down",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_ADMIN_DOWN)),
            mem(),
            ("stop", "fabric_wait", 0, B_DOWN),
            id="administratively-down",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_DOWN), rank("spark-b", fabric=LINK_UP)),
            mem(),
            ("stop", "fabric_wait", 0, f"fabric {IFNAME} on spark-a is down: waiting for the link"),
            id="head-link-down",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_DOWN), b_link(LINK_LOWER)),
            mem(),
            (
                "stop",
                "fabric_wait",
                0,
                f"fabric {IFNAME} on spark-a is down, fabric {IFNAME} on spark-b is lowerlayerdown:"
                " waiting for the link",
            ),
            id="every-node-down-is-named",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_MISSING)),
            mem(),
            ("stop", "fabric_wait", 0, f"fabric {IFNAME} on spark-b is missing: waiting for the link"),
            id="interface-missing",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_NO_CARRIER)),
            mem(),
            (
                "stop",
                "fabric_wait",
                0,
                f"fabric {IFNAME} on spark-b is up without carrier: waiting for the link",
            ),
            id="up-without-carrier",
        ),
        pytest.param(
            obs(rank("spark-a"), b_link(LINK_DOWN)),
            mem(),
            ("stop", "fabric_wait", 0, B_DOWN),
            id="other-node-says-nothing",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN, "exited", exit_code=1)),
            mem(),
            ("stop", "fabric_wait", 0, B_DOWN),
            id="before-the-lost-rank",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN), metrics=sup.Metrics(2.0, 0.0, 5000.0)),
            mem(last_progress=NOW - 600),
            ("stop", "fabric_wait", 0, B_DOWN),
            id="before-the-hang",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN, memguard_last_kill=T0 + 1)),
            mem(),
            ("stop", "fabric_wait", 0, B_DOWN),
            id="before-the-memory-guard",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN), health=None),
            mem(sup.State.STARTING, group_started=NOW - 60, attempts=2),
            ("stop", "fabric_wait", 2, B_DOWN),
            id="while-starting-no-failed-attempt",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN, "exited")),
            mem(sup.State.BACKOFF, backoff_until=NOW + 100, attempts=3),
            ("stop", "fabric_wait", 3, B_DOWN),
            id="during-backoff",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN)),
            sup.Memory(since=NOW),
            ("stop", "fabric_wait", 0, B_DOWN),
            id="first-look-does-not-adopt",
        ),
        # The wait.
        pytest.param(
            obs(rank("spark-a", "exited", fabric=LINK_UP), b_link(LINK_DOWN, "exited"), health=None),
            mem(sup.State.FABRIC_WAIT, reason=B_DOWN, attempts=1),
            ("none", "fabric_wait", 1, B_DOWN),
            id="still-down",
        ),
        pytest.param(
            obs(rank("spark-a", "exited", fabric=LINK_UP), b_link(LINK_LOWER, "exited"), health=None),
            mem(sup.State.FABRIC_WAIT, reason=B_DOWN),
            ("none", "fabric_wait", 0, f"fabric {IFNAME} on spark-b is lowerlayerdown: waiting for the link"),
            id="still-down-says-how",
        ),
        pytest.param(
            obs(rank("spark-a", "exited", fabric=LINK_UP), UNREACHABLE, health=None),
            mem(sup.State.FABRIC_WAIT, reason=B_DOWN),
            ("none", "fabric_wait", 0, B_DOWN),
            id="unreachable-keeps-waiting",
        ),
        pytest.param(
            obs(rank("spark-a", "exited", fabric=LINK_DOWN), UNREACHABLE, health=None),
            mem(sup.State.FABRIC_WAIT, reason=B_DOWN),
            ("none", "fabric_wait", 0, f"fabric {IFNAME} on spark-a is down: waiting for the link"),
            id="unreachable-and-another-down",
        ),
        pytest.param(
            obs(rank("spark-a", "exited", fabric=LINK_UP), b_link(LINK_UP, "exited"), health=None),
            mem(sup.State.FABRIC_WAIT, reason=B_DOWN, attempts=1),
            ("restart", "starting", 1, FABRIC_BACK),
            id="back-up-restarts",
        ),
        pytest.param(
            obs(rank("spark-a", "exited", fabric=LINK_UP), rank("spark-b", "exited"), health=None),
            mem(sup.State.FABRIC_WAIT, reason=B_DOWN),
            (
                "restart",
                "starting",
                0,
                f"fabric back: every node's link is up (spark-a {IFNAME}): restarting the group",
            ),
            id="back-a-node-says-nothing",
        ),
        # Where the fabric rule does not act.
        pytest.param(
            obs(
                rank("spark-a", "exited", fabric=LINK_UP), b_link(LINK_DOWN, "exited", memguard_last_kill=T0)
            ),
            mem(sup.State.MEMORY_WAIT, reason="memory guard on spark-b killed", attempts=1),
            ("none", "fabric_wait", 1, B_DOWN),
            id="memory-back-then-waits-for-the-link",
        ),
        pytest.param(
            obs(rank("spark-a", "exited", fabric=LINK_UP), b_link(LINK_DOWN, "exited", mem_available=GIB)),
            mem(sup.State.MEMORY_WAIT, reason="memory guard on spark-b killed", attempts=1),
            ("none", "memory_wait", 1, "memory guard on spark-b killed"),
            id="memory-short-keeps-memory-wait",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN)),
            mem(sup.State.GAVE_UP, reason="gave up after 5 failed attempts in a row; last: x", attempts=5),
            ("none", "gave_up", 5, "gave up after 5"),
            id="gave-up-acts-on-nothing",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_DOWN), lock=sup.LockStatus.HELD, lock_mtime=NOW),
            mem(),
            ("none", "paused", 0, "paused: /state/deployment.lock held"),
            id="paused",
        ),
        # Every link up, or no fabric information: the rules as before.
        pytest.param(obs(*BOTH_UP), mem(), ("none", "healthy", 0, "group healthy"), id="all-up-healthy"),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), b_link(LINK_UP, "exited", exit_code=1)),
            mem(),
            ("restart", "starting", 0, "lost rank 1 on spark-b: exited, exit code 1"),
            id="all-up-lost-rank",
        ),
        pytest.param(
            obs(rank("spark-a", fabric=LINK_UP), UNREACHABLE),
            mem(),
            ("stop", "node_wait", 0, "node not answering: spark-b"),
            id="unreachable-outside-the-fabric-wait-is-a-node-wait",
        ),
    ],
)
def test_decide_fabric(observation: Any, memory: Any, expected: tuple) -> None:
    decision = sup.decide(observation, memory, NOW, SETTINGS)
    action, state, attempts, reason = expected
    assert (decision.action.value, decision.state.value, decision.attempts) == (action, state, attempts)
    assert decision.reason.startswith(reason), decision.reason
    if state == "fabric_wait":
        assert decision.reason == reason and decision.backoff_until is None


@pytest.mark.parametrize(
    ("observation", "memory", "expected"),
    [
        pytest.param(obs(), mem(), ("none", "healthy"), id="healthy"),
        pytest.param(obs(rank("spark-a"), EXITED), mem(), ("restart", "starting"), id="lost-rank"),
        pytest.param(obs(rank("spark-a"), UNREACHABLE), mem(), ("stop", "node_wait"), id="unreachable"),
        pytest.param(
            obs(metrics=sup.Metrics(2.0, 0.0, 5000.0), probe=PROBE_TIMEOUT),
            mem(last_progress=NOW - 60),
            ("restart", "starting"),
            id="hang",
        ),
        pytest.param(
            obs(health=None),
            mem(sup.State.STARTING, group_started=NOW - 600),
            ("none", "backoff"),
            id="startup-timeout",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED), sup.Memory(since=NOW), ("restart", "starting"), id="first-look"
        ),
        pytest.param(
            obs(rank("spark-a"), rank("spark-b", memguard_last_kill=T0 + 1)),
            mem(),
            ("stop", "memory_wait"),
            id="memguard-kill",
        ),
    ],
)
def test_without_fabric_information_the_decisions_are_unchanged(
    observation: Any, memory: Any, expected: tuple[str, str]
) -> None:
    """No node says anything of its fabric (null, or a rankctl without it): the decision is the one
    taken with every link up, so no fabric rule applies."""

    def with_fabric(fabric: Any) -> Any:
        ranks = (r._replace(fabric=fabric) for r in observation.ranks)
        return obs(*ranks, health=observation.health, metrics=observation.metrics, probe=observation.probe)

    decision = sup.decide(with_fabric(None), memory, NOW, SETTINGS)
    assert (decision.action.value, decision.state.value) == expected, decision.reason
    assert decision == sup.decide(with_fabric(LINK_UP), memory, NOW, SETTINGS)


def test_restart_and_stop_plans_order() -> None:
    settings = supervisor_settings.load_settings(config_doc(Path("/s"), Path("/k"), nodes=3))
    assert [(s.verb, s.node.name) for s in sup.restart_plan(settings)] == [
        ("stop", "spark-a"),
        ("stop", "spark-b"),
        ("stop", "spark-c"),
        ("start", "spark-b"),
        ("start", "spark-c"),
        ("start", "spark-a"),
    ]
    assert [(s.verb, s.node.name) for s in sup.stop_plan(settings)] == [
        ("stop", "spark-a"),
        ("stop", "spark-b"),
        ("stop", "spark-c"),
    ]


@pytest.mark.parametrize(
    ("state", "health", "running", "last_probe_age", "expected"),
    [
        pytest.param(sup.State.HEALTHY, 200, 0.0, None, True, id="idle-never-probed"),
        pytest.param(sup.State.HEALTHY, 200, 0.0, 59, False, id="idle-probed-recently"),
        pytest.param(sup.State.HEALTHY, 200, 0.0, 60, True, id="idle-interval-passed"),
        pytest.param(sup.State.HEALTHY, 200, 1.0, None, False, id="busy"),
        pytest.param(sup.State.HEALTHY, 200, None, None, True, id="no-metrics"),
        pytest.param(sup.State.HEALTHY, 503, 0.0, None, False, id="health-down"),
        pytest.param(sup.State.STARTING, 200, 0.0, 1, True, id="starting-every-tick"),
        pytest.param(sup.State.STARTING, None, 0.0, None, False, id="starting-no-api"),
        pytest.param(sup.State.BACKOFF, 200, 0.0, None, False, id="backoff"),
        pytest.param(sup.State.MEMORY_WAIT, 200, 0.0, None, False, id="memory-wait"),
    ],
)
def test_should_probe(state, health, running, last_probe_age, expected: bool) -> None:
    last = None if last_probe_age is None else sup.ProbeResult(NOW - last_probe_age, sup.Probe.OK, "answered")
    memory = mem(state, last_probe=last)
    assert sup.should_probe(memory, health, sup.Metrics(running, 0.0, 1.0), NOW, SETTINGS) is expected


def test_track_progress() -> None:
    base = sup.Metrics(1.0, 0.0, 100.0, prompt_tokens=50.0, kv_usage=0.10, requests_done=3.0)
    memory = mem(last_metrics=base, last_progress=NOW - 50, last_answered=NOW - 50)

    def seen(metrics: Any, **kw: Any) -> Any:
        return sup.track(memory, obs(metrics=metrics, **kw), NOW)

    grew = seen(base._replace(generation_tokens=101.0))
    assert (grew.last_metrics.generation_tokens, grew.last_progress, grew.last_answered) == (101.0, NOW, NOW)
    stuck = seen(base)
    assert (stuck.last_progress, stuck.last_answered) == (NOW - 50, NOW - 50)
    # A long prefill: only the KV cache moves; that is progress, not an answer.
    prefill = seen(base._replace(kv_usage=0.12))
    assert (prefill.last_progress, prefill.last_answered) == (NOW, NOW - 50)
    freed = seen(base._replace(kv_usage=0.05))  # down counts too: a request finished
    assert freed.last_progress == NOW
    steps = seen(base._replace(iterations=7.0))  # a series the last look lacked says nothing
    assert steps.last_progress == NOW - 50
    # Idle is no progress any more: frozen metrics read exactly like idle ones.
    idle = seen(base._replace(running=0.0))
    assert idle.last_progress == NOW - 50
    blind = seen(sup.Metrics())
    assert (blind.last_progress, blind.last_metrics) == (NOW - 50, base)  # no metrics: nothing learnt
    nan = seen(base._replace(kv_usage=float("nan")))
    assert (
        sup.track(nan, obs(metrics=base._replace(kv_usage=float("nan"))), NOW + 5).last_progress == NOW - 50
    )
    # Across a failed probe: the metrics read after it moved, so the engine worked meanwhile.
    during = seen(base, probe=PROBE_TIMEOUT, metrics_after=base._replace(kv_usage=0.2))
    assert (during.last_progress, during.last_metrics.kv_usage) == (NOW, 0.2)
    answered = seen(base, probe=PROBE_OK)
    assert (answered.last_progress, answered.last_answered) == (NOW, NOW)
    # After a restart the reference is a fresh process: requests served before the first look count.
    fresh = sup.track(mem(last_metrics=sup.FRESH), obs(metrics=sup.Metrics(1.0, 0.0, 40.0)), NOW)
    assert fresh.last_answered == NOW
    unhealthy = sup.track(memory, obs(health=503), NOW)
    assert sup.track(unhealthy, obs(health=503), NOW + 5).health_bad_since == NOW
    assert sup.track(unhealthy, obs(), NOW + 5).health_bad_since is None
    assert unhealthy.api_up is None and sup.track(unhealthy, obs(), NOW + 5).api_up == NOW + 5


@pytest.mark.parametrize(
    ("running", "stalled_for", "last_probe_age", "moved_now", "expected"),
    [
        pytest.param(2.0, 60, None, False, True, id="busy-no-progress-for-hang-seconds"),
        pytest.param(2.0, 59, None, False, False, id="busy-progressing"),
        pytest.param(0.0, 60, 5, False, True, id="frozen-at-0-running-probed-before-the-stall"),
        pytest.param(2.0, 70, 5, False, False, id="already-probed-in-this-stall"),
        pytest.param(2.0, 130, 60, False, True, id="probed-in-this-stall-but-interval-passed"),
        pytest.param(2.0, 60, None, True, False, id="this-look-moved"),
    ],
)
def test_should_probe_after_no_progress_whatever_runs(
    running: float, stalled_for: float, last_probe_age: float | None, moved_now: bool, expected: bool
) -> None:
    last = (
        None if last_probe_age is None else sup.ProbeResult(NOW - last_probe_age, sup.Probe.INCONCLUSIVE, "")
    )
    reference = sup.Metrics(running, 0.0, 1.0, kv_usage=0.1)
    memory = mem(last_probe=last, last_progress=NOW - stalled_for, last_metrics=reference)
    metrics = reference._replace(kv_usage=0.2) if moved_now else reference
    assert sup.should_probe(memory, 200, metrics, NOW, SETTINGS) is expected


RECOVERY = SETTINGS.recovery  # max(60, 60) + 30 + 5


@pytest.mark.parametrize(
    ("observation", "memory", "expected"),
    [
        pytest.param(
            obs(probe=PROBE_TIMEOUT),
            mem(recovered=True),
            ("restart", "starting", 0, "hang: the probe failed: timed out"),
            id="hang-of-a-recovered-group-restarts-at-once",
        ),
        pytest.param(
            obs(probe=PROBE_TIMEOUT),
            mem(recovered=False, since=NOW - 60, attempts=1),
            (
                "none",
                "backoff",
                2,
                "attempt 2 of 5 failed: hang: the probe failed: timed out; no engine progress for 0 s"
                " (/metrics: 0 running, 0 waiting: frozen metrics read like an idle engine);"
                " healthy for 60 s only (recovered takes 95 s); next restart in 20 s",
            ),
            id="hang-before-it-recovered-is-a-failed-attempt",
        ),
        pytest.param(
            obs(rank("spark-a"), EXITED),
            mem(recovered=False, since=NOW - 30, attempts=4),
            ("none", "gave_up", 5, "gave up after 5 failed attempts in a row; last: lost rank 1 on spark-b"),
            id="lost-rank-before-it-recovered-gives-up-at-max-attempts",
        ),
        pytest.param(
            obs(probe=PROBE_OK),
            mem(recovered=False, since=NOW - RECOVERY, attempts=3, last_answered=NOW),
            (
                "none",
                "healthy",
                0,
                "group recovered: healthy and answering for 95 s; failed attempts reset (were 3)",
            ),
            id="recovered-after-the-window",
        ),
        pytest.param(
            obs(),
            mem(recovered=False, since=NOW - RECOVERY + 1, attempts=3, last_answered=NOW),
            ("none", "healthy", 3, "group healthy"),
            id="not-yet",
        ),
        pytest.param(
            obs(),
            mem(recovered=False, since=NOW - RECOVERY, attempts=3, last_answered=NOW - RECOVERY),
            ("none", "healthy", 3, "group healthy"),
            id="not-without-an-answer-since-it-turned-healthy",
        ),
    ],
)
def test_failed_attempts_count_until_the_group_recovered(
    observation: Any, memory: Any, expected: tuple
) -> None:
    decision = sup.decide(observation, memory, NOW, SETTINGS)
    action, state, attempts, reason = expected
    assert (decision.action.value, decision.state.value, decision.attempts) == (action, state, attempts)
    assert decision.reason.startswith(reason), decision.reason
    assert decision.recovered is (True if reason.startswith("group recovered") else None)


# --------------------------------------------------------------------------------------------
# The loop with a fake cluster, API and clock
# --------------------------------------------------------------------------------------------


def test_first_tick_adopts_a_serving_group_without_restarting(h: Harness) -> None:
    started = {n.name: n.started_at for n in h.cluster.nodes.values()}
    h.tick(20)
    assert h.cluster.actions() == []
    assert {n.name: n.started_at for n in h.cluster.nodes.values()} == started
    (decision,) = h.log_lines("decision")
    assert "healthy action=adopt: adopted the running group (rank 0 on spark-a started" in decision
    state = h.state()
    assert (state["state"], state["attempts"], state["last_action"]["action"]) == ("healthy", 0, "adopt")
    assert len(h.api.probes) == 2  # the second tick, then probe_interval (60 s) later: 12 ticks apart


def test_first_tick_with_no_rank_running_starts_the_group_in_order(tmp_path: Path) -> None:
    h = Harness(tmp_path, nodes=3)
    for node in h.cluster.nodes.values():
        node.die(0)
    h.api.health = None
    h.tick()
    assert h.cluster.actions() == [
        ("spark-a", "stop"),
        ("spark-b", "stop"),
        ("spark-c", "stop"),
        ("spark-b", "start"),
        ("spark-c", "start"),
        ("spark-a", "start"),
    ]
    assert h.sup.memory.state is sup.State.STARTING
    assert "no rank running" in h.log_lines("decision")[0]
    steps = [line.split(" ", 2)[2] for line in h.log_lines("step")]
    assert steps[0] == "1/6 stop rank 0 on spark-a: ok (done)"
    assert steps[-1] == "6/6 start rank 0 on spark-a: ok (done)"
    h.tick()  # /health 200 now, the probe answers
    assert h.sup.memory.state is sup.State.HEALTHY
    assert h.log_lines("decision")[-1].endswith("probe answered")


def test_lost_worker_restarts_the_group_head_stop_workers_stop_workers_start_head_start(h: Harness) -> None:
    h.adopt_healthy()
    h.tick(3)
    h.worker.die(137, oom=True)
    h.tick()
    assert h.cluster.actions() == GROUP_RESTART
    decision = h.log_lines("decision")[-1]
    assert (
        "starting action=restart: lost rank 1 on spark-b: exited, exit code 137, OOM killed, finished"
        in decision
    )
    state = h.state()
    assert state["last_action"]["action"] == "restart"
    assert state["last_action"]["reason"].startswith("lost rank 1 on spark-b")
    # The ranks as the restart left them are the new reference: no second restart follows.
    h.tick(5)
    assert len(h.cluster.actions()) == 4
    assert h.sup.memory.state is sup.State.HEALTHY


def test_status_and_actions_use_their_own_timeouts_above_rank_controls(h: Harness) -> None:
    """Rank control's limits fire first, so that it says what timed out (a hung docker inspect, a
    slow start) rather than the supervisor killing it blind."""
    rankctl = load_program("supervisor", "dsv41_rankctl")
    h.adopt_healthy()
    h.worker.die(1)
    h.tick()
    timeouts = {verb: timeout for _, verb, timeout, _ in h.cluster.calls}
    assert timeouts == {"status": 30, "stop": 180, "start": 180}
    assert timeouts["status"] > rankctl.INSPECT_TIMEOUT
    for verb, limit in (("start", rankctl.START_TIMEOUT), ("stop", rankctl.STOP_TIMEOUT)):
        assert timeouts[verb] > rankctl.INSPECT_TIMEOUT + limit, verb


@pytest.mark.parametrize("how", ["restart-alone", "reboot", "missing"])
def test_other_rank_losses_restart_the_group(h: Harness, how: str) -> None:
    h.adopt_healthy()
    if how == "restart-alone":
        h.worker.restart_alone()
    elif how == "reboot":
        h.worker.boot_id = "boot-spark-b-2"
        h.worker.restart_alone()
    else:
        h.worker.state, h.worker.started_at = "missing", None
    h.tick()
    expected = {
        "restart-alone": "rank 1 on spark-b restarted alone",
        "reboot": "node spark-b rebooted: boot_id boot-spark-b-1 -> boot-spark-b-2",
        "missing": "lost rank 1 on spark-b: missing",
    }[how]
    assert expected in h.log_lines("decision")[1]  # [0] is the adoption
    assert h.cluster.actions()[0] == ("spark-a", "stop")


def come_back_from_a_reboot(node: FakeNode) -> None:
    """What a rebooted node shows: it answers, with a new boot id and its rank exited (the rank
    containers have no restart policy: the supervisor starts them)."""
    node.unreachable, node.vanish_on = False, None
    node.boot_id = f"{node.boot_id}-rebooted"
    node.state, node.exit_code = "exited", 255


def test_a_node_that_stops_answering_is_waited_for_however_long_then_the_group_restarts(h: Harness) -> None:
    """A reboot of a worker: no failed attempt is spent on a node a restart cannot reach, so a
    reboot longer than the backoffs (Sparks take minutes) never makes the supervisor give up."""
    h.adopt_healthy()
    h.worker.unreachable = True
    # The API still answers: the group serves on for hang_seconds (60 s) of silence, then stops.
    ticks = h.until(lambda: h.cluster.actions() != [])
    assert ticks == 60 // 5 + 1, h.log_lines()
    assert h.cluster.actions() == [("spark-a", "stop"), ("spark-b", "stop")]  # the worker's stop fails
    state = h.state()
    assert (state["state"], state["attempts"]) == ("node_wait", 0)
    assert state["reason"] == (
        f"node not answering: spark-b (rc=255: ssh: connect to host {IPS['spark-b']} port 22:"
        " No route to host): waiting for it to answer"
    )
    h.tick(200)  # 1,000 s: longer than every backoff of max_attempts (10+20+40+80+160 s)
    assert len(h.cluster.actions()) == 2 and h.state()["state"] == "node_wait"
    come_back_from_a_reboot(h.worker)
    h.tick()
    assert h.cluster.actions()[2:] == GROUP_RESTART
    assert h.log_lines("decision")[-1].endswith(
        "decision starting action=restart: every node answers again (spark-a, spark-b): restarting the group"
    )
    assert h.state()["attempts"] == 0


def test_a_node_that_misses_a_status_while_the_api_answers_is_left_serving(h: Harness) -> None:
    """One status that timed out (a node busy, an SSH connection dropped) stops nothing."""
    h.adopt_healthy()
    h.worker.unreachable = True
    h.tick(11)  # 55 s: under hang_seconds
    h.worker.unreachable = False
    h.tick(20)
    assert h.cluster.actions() == []
    assert (h.sup.memory.state, h.sup.memory.unreachable_since) == (sup.State.HEALTHY, None)
    h.worker.unreachable = True  # silent again: the grace starts anew, from this tick
    h.tick(12)
    assert h.cluster.actions() == []
    h.tick()
    assert h.cluster.actions() == [("spark-a", "stop"), ("spark-b", "stop")]


def test_a_node_lost_during_a_restart_is_waited_for_not_counted(h: Harness) -> None:
    """The worker's rank died, and the node goes down (a reboot) as the restart reaches it."""
    h.adopt_healthy()
    h.worker.die(1)
    h.worker.vanish_on = "stop"
    h.tick()
    state = h.state()
    assert (state["state"], state["attempts"]) == ("node_wait", 0), h.log_lines()
    assert state["reason"].startswith("node not answering: spark-b (rc=255: ssh: connect to host")
    h.tick(100)
    come_back_from_a_reboot(h.worker)
    h.until(lambda: h.sup.memory.state is sup.State.STARTING)
    assert h.cluster.actions()[-2:] == [("spark-b", "start"), ("spark-a", "start")]


def test_a_node_that_drops_off_whenever_its_rank_starts_is_given_up_on(h: Harness) -> None:
    """Losing the node before the group recovered is a failed start: not restarted for ever."""
    h.adopt_healthy()
    h.worker.vanish_after_start = True
    h.worker.die(1)
    for _ in range(300):
        h.tick()
        if h.sup.memory.state is sup.State.NODE_WAIT:
            h.worker.unreachable = False  # it comes back, and drops off again at the next start
        if h.sup.memory.state is sup.State.GAVE_UP:
            break
    state = h.state()
    assert (state["state"], state["attempts"]) == ("gave_up", 5), h.log_lines("decision")
    assert state["reason"].startswith(
        "gave up after 5 failed attempts in a row; last: node not answering: spark-b"
    )
    assert h.cluster.starts == 2 * 5  # the start after the loss, then one per failed attempt


def test_a_node_that_stops_answering_after_the_supervisor_gave_up_changes_nothing(h: Harness) -> None:
    h.adopt_healthy()
    h.worker.fail.add("start")
    h.worker.die(1)
    h.tick(60)
    assert h.state()["state"] == "gave_up"
    before = len(h.cluster.actions())
    h.worker.unreachable = True
    h.tick(20)
    assert h.state()["state"] == "gave_up" and len(h.cluster.actions()) == before


def test_failed_attempts_back_off_doubling_then_give_up(h: Harness) -> None:
    h.adopt_healthy()
    h.worker.fail.add("start")
    h.worker.die(1)
    h.tick(60)
    stops = h.cluster.head_stop_times()
    assert len(stops) == 5  # the restart after the loss, then one per backoff
    assert [b - a for a, b in itertools.pairwise(stops)] == [10, 20, 40, 80]
    state = h.state()
    assert (state["state"], state["attempts"]) == ("gave_up", 5)
    assert state["reason"].startswith("gave up after 5 failed attempts in a row; last: group restart:")
    assert "start rank 1 on spark-b failed: docker start dsv41-r1 failed (rc=1): boom" in state["reason"]
    # gave_up acts on nothing, however long it waits.
    before = len(h.cluster.actions())
    h.tick(200)
    assert len(h.cluster.actions()) == before
    backoffs = [line for line in h.log_lines("decision") if " decision backoff action=none: " in line]
    assert [line.split("next restart in ")[1] for line in backoffs] == ["10 s", "20 s", "40 s", "80 s"]


# NTP may step the wall clock after boot: durations are monotonic, the state file's times the wall clock's.
@pytest.mark.parametrize(
    "step", [0.0, -3600.0, 3600.0], ids=["no-clock-step", "wall-clock-back-an-hour", "wall-clock-on-an-hour"]
)
def test_startup_timeout_counts_as_a_failed_attempt_whatever_the_wall_clock_does(
    tmp_path: Path, step: float
) -> None:
    h = Harness(tmp_path, startup_timeout_seconds=30, max_attempts=2)
    h.adopt_healthy()
    h.api.health_after_start = 503
    h.head.die(1)
    h.tick()
    assert h.sup.memory.state is sup.State.STARTING
    h.clock.wall_step = step
    ticks = h.until(lambda: h.sup.memory.state is not sup.State.STARTING)
    assert ticks == 6  # 30 s at 5 s a tick
    state = h.state()
    assert state["reason"] == (
        "attempt 1 of 2 failed: startup: not healthy within 30 s (/health 503); next restart in 10 s"
    )
    decided = h.clock.wall() - h.settings.interval  # the loop has slept since
    assert state["updated"] == pytest.approx(decided, abs=0.01)
    assert state["backoff_until"] == pytest.approx(decided + 10, abs=0.01)
    h.until(lambda: h.sup.memory.state is sup.State.GAVE_UP)
    assert len(h.cluster.head_stop_times()) == 2


def test_a_wall_clock_step_leaves_the_lock_age_on_the_wall_clock(h: Harness) -> None:
    """The lock's age is the wall clock's (its mtime is): a run's fresh lock pauses the supervisor
    whatever the monotonic clock says."""
    h.adopt_healthy()
    h.clock.wall_step = -3 * 3600.0  # beyond pause_max (2 h): on the monotonic clock the lock is stale
    lock = h.state_dir / "deployment.lock"
    lock.write_text("site.yml\n")
    os.utime(lock, (h.clock.wall(), h.clock.wall()))
    h.tick()
    assert h.sup.memory.state is sup.State.PAUSED


def test_a_healthy_group_resets_the_attempts(h: Harness) -> None:
    h.adopt_healthy()
    h.worker.fail.add("start")
    h.worker.die(1)
    h.tick()
    assert h.sup.memory.attempts == 1
    h.worker.fail.clear()
    h.until(lambda: h.sup.memory.state is sup.State.HEALTHY)
    healthy_at = h.clock.now
    # Healthy is not recovered yet: the attempts stay until it has served for Settings.recovery.
    assert (h.state()["attempts"], h.state()["recovered"]) == (1, False)
    h.until(lambda: h.state()["attempts"] == 0)
    assert h.clock.now - healthy_at == h.settings.recovery == 95
    assert h.state()["recovered"] is True
    assert (
        "group recovered: healthy and answering for 95 s; failed attempts reset (were 1)"
        in (h.log_lines("decision")[-1])
    )


def test_memory_guard_kill_stops_the_group_and_waits_for_memory(h: Harness) -> None:
    h.adopt_healthy()
    h.clock.now += 100
    h.worker.memguard_last_kill = h.clock.now
    h.worker.die(137)
    h.worker.mem_available = 3 * GIB
    h.tick()
    assert h.cluster.actions() == [("spark-a", "stop"), ("spark-b", "stop")]
    assert h.sup.memory.state is sup.State.MEMORY_WAIT
    assert "memory guard on spark-b killed at" in h.state()["reason"]
    h.tick(10)
    h.worker.mem_available = 5 * GIB - 1
    h.head.mem_available = None  # a node that does not say counts as short
    h.tick(10)
    h.head.mem_available = 100 * GIB
    h.tick(10)
    assert len(h.cluster.actions()) == 2 and h.sup.memory.state is sup.State.MEMORY_WAIT
    h.worker.mem_available = 5 * GIB
    h.tick()
    assert h.cluster.actions()[2:] == GROUP_RESTART
    assert "memory back: every node has >= 5.00 GiB available" in h.log_lines("decision")[-1]
    h.tick()
    assert h.sup.memory.state is sup.State.HEALTHY  # the old kill record predates this start


def test_a_memory_guard_kill_before_the_first_look_after_a_run_stops_the_group(h: Harness) -> None:
    """A run starts the ranks and gives the lock back; the guard kills one before the supervisor
    has looked again. Restarting it as a lost rank would only be killed again (CI run 17)."""
    h.adopt_healthy()
    lock = h.state_dir / "deployment.lock"
    lock.write_text("site.yml\n")
    os.utime(lock, (h.clock.now, h.clock.now))
    h.tick(5)
    assert h.sup.memory.state is sup.State.PAUSED
    h.head.started_at, h.worker.started_at = iso(h.clock.now), iso(h.clock.now + 1)  # the run's start
    lock.unlink()
    h.clock.now += 2
    h.worker.memguard_last_kill = h.clock.now
    h.worker.die(137)
    h.worker.mem_available = 3 * GIB
    h.tick()
    assert h.cluster.actions() == [("spark-a", "stop"), ("spark-b", "stop")]
    state = h.state()
    assert (state["state"], state["attempts"]) == ("memory_wait", 1)
    assert "memory guard on spark-b killed at" in state["reason"]


@pytest.mark.parametrize(
    ("link", "words"),
    [
        pytest.param(("down", None), "down", id="administratively-down"),
        pytest.param(("down", 0), "down", id="cable-out"),
        pytest.param(("lowerlayerdown", 0), "lowerlayerdown", id="lowerlayerdown"),
        pytest.param(("missing", None), "missing", id="interface-gone"),
    ],
)
@pytest.mark.parametrize("node", ["spark-a", "spark-b"])
def test_fabric_down_stops_the_group_waits_then_restarts_it(
    h: Harness, node: str, link: tuple, words: str
) -> None:
    for each in h.cluster.nodes.values():
        each.link("up", 1)
    h.adopt_healthy()
    down = h.cluster.nodes[node]
    down.link(*link)
    h.tick()
    reason = f"fabric {IFNAME} on {node} is {words}: waiting for the link"
    assert h.cluster.actions() == [("spark-a", "stop"), ("spark-b", "stop")]
    state = h.state()
    assert (state["state"], state["reason"], state["attempts"]) == ("fabric_wait", reason, 0)
    assert state["last_action"]["action"] == "stop" and state["last_action"]["reason"] == reason
    assert h.log_lines("decision")[-1].endswith(f" decision fabric_wait action=stop: {reason}")
    assert state["ranks"][down.rank]["fabric"] == {
        "ifname": IFNAME,
        "operstate": link[0],
        "carrier": link[1],
        "up": False,
    }
    # Still down: nothing more, and nothing more logged.
    h.tick(30)
    assert len(h.cluster.actions()) == 2 and h.sup.memory.state is sup.State.FABRIC_WAIT
    assert len(h.log_lines("decision")) == 2  # the adoption, the stop
    # The link comes back while the worker cannot be asked: it is not known to be up.
    down.link("up", 1)
    h.worker.unreachable = True
    h.tick(5)
    assert len(h.cluster.actions()) == 2 and h.state()["state"] == "fabric_wait"
    assert h.state()["reason"] == reason
    # Every link up: the usual restart, in order.
    h.worker.unreachable = False
    h.tick()
    assert h.cluster.actions()[2:] == GROUP_RESTART
    assert h.log_lines("decision")[-1].endswith(
        f" decision starting action=restart: fabric back: every node's link is up"
        f" (spark-a {IFNAME}, spark-b {IFNAME}): restarting the group"
    )
    h.tick()
    assert (h.state()["state"], h.state()["attempts"]) == ("healthy", 0)
    assert [r["fabric"]["up"] for r in h.state()["ranks"]] == [True, True]


def test_first_look_with_a_link_down_stops_the_group_and_adopts_nothing(h: Harness) -> None:
    h.head.link("up", 1)
    h.worker.link("down", None)
    h.tick(10)
    assert h.cluster.actions() == [("spark-a", "stop"), ("spark-b", "stop")]
    state = h.state()
    assert (state["state"], state["reason"]) == (
        "fabric_wait",
        f"fabric {IFNAME} on spark-b is down: waiting for the link",
    )
    assert len(h.log_lines("decision")) == 1
    h.worker.link("up", 1)
    h.tick()
    assert h.cluster.actions()[2:] == GROUP_RESTART


def test_fabric_down_while_starting_is_no_failed_attempt(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_attempts=2)
    for each in h.cluster.nodes.values():
        each.link("up", 1)
    h.adopt_healthy()
    h.worker.fail.add("start")
    h.worker.die(1)
    h.tick()
    assert (h.sup.memory.state, h.sup.memory.attempts) == (sup.State.BACKOFF, 1)
    h.worker.link("down", None)
    h.tick(100)  # far past the backoff: no restart, no give-up
    assert h.sup.memory.state is sup.State.FABRIC_WAIT and h.state()["attempts"] == 1
    assert h.cluster.actions()[-2:] == [("spark-a", "stop"), ("spark-b", "stop")]
    assert [a for a in h.cluster.actions() if a[1] == "start"] == [("spark-b", "start")]
    h.worker.fail.clear()
    h.worker.link("up", 1)
    h.until(lambda: h.sup.memory.state is sup.State.HEALTHY)
    h.until(lambda: h.state()["attempts"] == 0)  # once it recovered


@pytest.mark.parametrize("fabric", ["absent", "null"])
def test_without_fabric_information_a_lost_worker_restarts_the_group_as_before(
    h: Harness, fabric: str
) -> None:
    if fabric == "null":
        for each in h.cluster.nodes.values():
            each.fabric = None
    h.adopt_healthy()
    h.worker.die(137)
    h.tick()
    assert h.cluster.actions() == GROUP_RESTART
    assert (
        "starting action=restart: lost rank 1 on spark-b: exited, exit code 137"
        in h.log_lines("decision")[-1]
    )
    assert [r["fabric"] for r in h.state()["ranks"]] == [None, None]


def test_hang_is_detected_at_hang_seconds(h: Harness) -> None:
    h.adopt_healthy()
    h.api.running = 2
    for _ in range(6):  # tokens flowing
        h.api.tokens += 40
        h.tick()
    assert h.api.probes == []  # busy and progressing: the counters prove the engine, no probe
    stuck_at = h.clock.now - h.settings.interval  # the last tick saw the last new tokens
    h.api.probe_status = None  # hung: the probe times out too
    h.until(lambda: h.cluster.actions() != [])
    assert h.cluster.head_stop_times()[0] - stuck_at == 60
    assert (
        "hang: 2 requests running, no new tokens for 60 s (no prompt token or KV cache change either),"
        " and the probe failed: timed out" in h.log_lines("decision")[-1]
    )
    assert len(h.api.probes) == 1  # the one that confirmed it


def test_idle_probe_request_and_failure(h: Harness) -> None:
    h.adopt_healthy()
    h.tick()
    (probe,) = h.api.probes
    assert probe == {
        "headers": {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
            "temperature": 0,
        },
        "timeout": 30,
    }
    h.api.probe_status = None
    h.until(lambda: h.cluster.actions() != [])
    assert len(h.api.probes) == 2
    # Adoption at T0, the first probe on the next tick, the failing one probe_interval later.
    assert h.cluster.head_stop_times()[0] - T0 == 5 + 60
    assert (
        "action=restart: hang: the probe failed: timed out; no engine progress for 55 s (/metrics: 0 running"
        in (h.log_lines("decision")[-1])
    )


# --- the engine's real shapes (vLLM 0.32 CPU build, platform-facts.md) ----------------------


def test_a_long_prefill_is_never_a_hang(h: Harness) -> None:
    """Measured: during a long chunked prefill running is 1 and every token counter stays flat
    until the prompt is done; only the KV cache usage rises. The old rule restarted it at 60 s."""
    h.adopt_healthy()
    h.tick(3)
    probes = len(h.api.probes)
    h.api.running, h.api.prefill_step = 1, 0.002
    h.api.probe_status = None  # a probe would queue behind the prefill and time out
    h.tick(120)  # ten minutes of prefill, ten hang windows
    assert h.cluster.actions() == [] and h.sup.memory.state is sup.State.HEALTHY
    assert len(h.api.probes) == probes  # progressing: no probe either
    h.api.prefill_step, h.api.prompt_tokens = 0.0, h.api.prompt_tokens + 11161  # the prefill ends
    for _ in range(10):
        h.api.tokens += 20
        h.tick()
    assert h.cluster.actions() == [] and h.state()["api"]["kv_cache_usage_perc"] > 0.2


def test_a_probe_that_queued_behind_a_starting_prefill_is_no_hang(h: Harness) -> None:
    """The idle probe goes out just as a long prompt arrives: it queues behind the prefill and
    times out, but the KV cache filled meanwhile (read again after the probe): busy, not hung."""
    h.adopt_healthy()
    h.tick()

    def long_prompt_arrives() -> None:
        h.api.running, h.api.prefill_step, h.api.probe_status = 1, 0.002, None

    h.api.on_probe = long_prompt_arrives
    h.until(lambda: h.api.running == 1)
    h.api.on_probe = None
    assert h.api.probes[-1]  # the probe that timed out
    assert h.sup.memory.last_probe.outcome is sup.Probe.FAILED
    h.tick(60)
    assert h.cluster.actions() == []
    assert "the probe failed (timed out) while the engine made progress: busy" in h.log_lines("decision")[-1]


@pytest.mark.parametrize(
    ("running", "bound"), [(0, 60), (2, 60)], ids=["frozen-at-0-running", "frozen-mid-decode"]
)
def test_a_frozen_rank_whose_metrics_froze_is_caught_by_the_probe(
    h: Harness, running: int, bound: float
) -> None:
    """Measured: a worker frozen (SIGSTOP) leaves the head's /health 200 and its metrics frozen at
    their last values (0 running for a request that came after the freeze)."""
    h.adopt_healthy()
    h.api.running = running
    for _ in range(4):
        h.api.tokens += 10 * running
        h.tick()
    frozen_at = h.clock.now
    h.api.probe_status = None  # nothing through the engine answers; nothing moves any more
    h.until(lambda: h.cluster.actions() != [])
    assert h.cluster.head_stop_times()[0] - frozen_at <= bound + h.settings.interval
    decision = h.log_lines("decision")[-1]
    expected = (
        "hang: 2 requests running, no new tokens for"
        if running
        else "hang: the probe failed: timed out; no engine progress for"
    )
    assert f"starting action=restart: {expected}" in decision, decision


@pytest.mark.parametrize("how", ["500-first", "then-exited"])
def test_a_killed_worker_makes_the_head_answer_500_then_exit_and_the_group_restarts(
    h: Harness, how: str
) -> None:
    """Measured: a killed worker's headless server exits; the head's /health stays 200 until the
    next request, which gets HTTP 500 (EngineCore encountered an issue), and then the head exits."""
    h.adopt_healthy()
    h.tick()
    h.clock.now += 60
    h.api.probe_status, h.api.probe_body = 500, ENGINE_DEAD
    if how == "then-exited":  # the supervisor looks after both containers exited
        h.worker.die(137)
        h.head.die(1)
        h.api.health = None
    h.tick()
    halt = "kill" if how == "500-first" else "stop"  # a probe that failed with no progress: a hang
    assert h.cluster.actions() == [
        ("spark-a", halt),
        ("spark-b", halt),
        ("spark-b", "start"),
        ("spark-a", "start"),
    ]
    expected = (
        'hang: the probe failed: HTTP 500: {"error": {"message": "EngineCore encountered an issue.'
        if how == "500-first"
        else "lost rank 0 on spark-a: exited, exit code 1"
    )
    assert f"starting action=restart: {expected}" in h.log_lines("decision")[-1]
    h.api.probe_status = 200
    h.tick()
    assert h.sup.memory.state is sup.State.HEALTHY


def test_a_hung_group_is_killed_not_stopped_also_after_a_backoff_and_a_lost_rank_is_stopped(
    h: Harness,
) -> None:
    """Measured on vLLM 0.32: each rank of a frozen pair waited out docker stop's 30 s grace period.
    A hang's restart kills (no grace period), and so does the restart after its backoff; a lost rank's
    restart still stops the survivors gracefully."""
    h.adopt_healthy()
    h.tick()
    h.api.answers_per_start = 1  # every new head answers one probe (healthy), then hangs
    h.api.answers_left = 0  # and the running one hangs now
    h.until(lambda: h.sup.memory.state is sup.State.BACKOFF)
    first_restart = h.cluster.actions()[:4]
    assert first_restart == [
        ("spark-a", "kill"),
        ("spark-b", "kill"),
        ("spark-b", "start"),
        ("spark-a", "start"),
    ]
    assert h.sup.memory.kill_on_restart is True
    h.until(lambda: len(h.cluster.actions()) > 4)
    assert h.cluster.actions()[4:6] == [("spark-a", "kill"), ("spark-b", "kill")]
    h.api.answers_per_start = None  # the engine works again
    h.until(lambda: h.sup.memory.state is sup.State.HEALTHY and h.sup.memory.recovered)
    before = len(h.cluster.actions())
    h.worker.die(1)
    h.tick()
    assert h.cluster.actions()[before : before + 2] == [("spark-a", "stop"), ("spark-b", "stop")]


def test_a_group_that_hangs_soon_after_every_restart_is_given_up_on_and_says_why(h: Harness) -> None:
    """hang -> restart -> healthy briefly -> hang ...: each hang before the group recovered is a
    failed attempt; the old rule kept the attempts at 0 and restarted it for ever."""
    h.adopt_healthy()
    h.tick()
    h.api.answers_per_start = 1  # every new head answers one probe (healthy), then hangs
    h.api.answers_left = 0  # and the running one hangs now
    h.tick(400)  # 2000 s
    state = h.state()
    assert (state["state"], state["attempts"]) == ("gave_up", 5), h.log_lines("decision")
    assert state["reason"].startswith(
        "gave up after 5 failed attempts in a row; last: hang: the probe failed: timed out;"
    )
    assert "healthy for 60 s only (recovered takes 95 s)" in state["reason"]
    assert len(h.cluster.head_stop_times()) == 5  # the first restart, then one per failed attempt
    backoffs = [line for line in h.log_lines("decision") if " decision backoff action=none: " in line]
    assert [line.split("next restart in ")[1] for line in backoffs] == ["10 s", "20 s", "40 s", "80 s"]
    # status.yml says why, from the state file.
    nodes = [
        {"name": n.name, "rank": n.rank, "status": n.status(), "guard": "active"}
        for n in h.cluster.nodes.values()
    ]
    report = deployment_health(nodes, {"health": 200}, state, supervisor_interval=5, now=state["updated"])
    assert not report["healthy"]
    assert f"supervisor: gave_up - {state['reason']}" in report["problems"]


def test_a_hang_right_after_a_restart_is_caught_within_the_hang_bound(h: Harness) -> None:
    """Clients were answered after the restart while the supervisor's own probe timed out (it
    queued behind them): the group counts as started, so the hang that follows is caught at the
    hang bound, not at the start-up timeout (1200 s) as before."""
    h.adopt_healthy()
    h.worker.die(137)
    h.tick()  # the restart
    h.api.probe_status = None  # our probe never gets through
    h.api.running = 2
    for _ in range(3):  # the clients' requests stream
        h.api.tokens += 30
        h.tick()
    assert h.sup.memory.state is sup.State.HEALTHY
    assert "requests answered since the start" in h.state()["reason"]
    stuck_at = h.clock.now - h.settings.interval  # the last look that saw new tokens
    h.until(lambda: h.sup.memory.state is not sup.State.HEALTHY)
    decided_at = h.clock.now - h.settings.interval  # the loop has slept since
    assert decided_at - stuck_at == h.settings.hang
    assert h.state()["reason"].startswith(
        "attempt 1 of 5 failed: hang: 2 requests running, no new tokens for 60 s"
    )


def test_a_hang_while_starting_once_the_api_is_up_is_caught_within_the_hang_bound(h: Harness) -> None:
    """The API came up (/health 200) and nothing gets through the engine: a failed attempt once
    hang_seconds passed, not after the start-up timeout."""
    h.adopt_healthy()
    h.api.health_after_start = 503
    h.worker.die(137)
    h.tick()
    h.tick(10)
    assert h.sup.memory.state is sup.State.STARTING
    h.api.health, h.api.probe_status = 200, None  # the API is up; the engine answers nothing
    up_at = h.clock.now  # the next look sees it
    h.until(lambda: h.sup.memory.state is not sup.State.STARTING)
    decided_at = h.clock.now - h.settings.interval  # the loop has slept since
    assert decided_at - up_at == h.settings.hang
    assert h.state()["reason"].startswith(
        "attempt 1 of 5 failed: while starting: hang: the API has been up for"
    )
    assert "and the probe failed: timed out" in h.state()["reason"]


def test_probe_401_and_unreadable_key_do_not_restart(h: Harness) -> None:
    h.adopt_healthy()
    h.api.probe_status = 401
    h.tick(30)
    h.key_file.unlink()
    h.tick(30)
    assert h.cluster.actions() == []
    assert h.state()["api"]["last_probe"]["outcome"] == "inconclusive"
    assert "cannot read the key" in h.state()["api"]["last_probe"]["detail"]


@pytest.mark.parametrize(
    "edited",
    ["first-key-0123456789\nsecond-key-0123456789\n", "k\u00e9y-0123456789\n", "key with spaces-0123\n"],
    ids=["two-lines", "not-ascii", "inner-spaces"],
)
def test_a_key_file_edited_into_no_key_is_an_inconclusive_probe_and_never_logged(
    h: Harness, edited: str
) -> None:
    """http.client refuses such a header with its text in the error: the loop would crash on every
    probe, restarted by systemd, with the key in the journal."""
    h.adopt_healthy()
    h.key_file.write_text(edited)
    h.clock.now += 60
    h.tick(2)
    assert h.cluster.actions() == []
    probe = h.state()["api"]["last_probe"]
    assert probe["outcome"] == "inconclusive" and "holds no key of A-Z a-z 0-9 - _ alone" in probe["detail"]
    everything = h.log_path.read_text() + (h.state_dir / "supervisor-state.json").read_text()
    assert all(line not in everything for line in edited.splitlines())


def test_a_header_of_no_key_fails_in_http_client_with_its_text() -> None:
    """What read_api_key keeps from the real request (no server needed: the header fails first)."""
    with pytest.raises(ValueError, match="second-key"):
        sup.http_request("GET", "http://127.0.0.1:9/", {"Authorization": "Bearer first\nsecond-key"}, None, 1)


def test_the_key_is_read_at_each_use_and_never_logged(h: Harness) -> None:
    h.adopt_healthy()
    h.tick()
    h.key_file.write_text("rotated-key\n")
    h.api.probe_status = 500
    h.api.probe_body = '{"error": "bad key rotated-key"}'  # even a server echoing the key in use
    h.clock.now += 60
    h.tick(2)
    assert h.api.probes[1]["headers"]["Authorization"] == "Bearer rotated-key"
    everything = h.log_path.read_text() + (h.state_dir / "supervisor-state.json").read_text()
    assert "rotated-key" not in everything and "bad key <key>" in everything
    assert "hang: the probe failed: HTTP 500" in everything


def test_metrics_down_probes_instead(h: Harness) -> None:
    h.adopt_healthy()
    h.api.metrics_up = False
    h.api.running = 2
    h.tick(30)
    assert h.cluster.actions() == []  # no metrics, no hang verdict
    assert len(h.api.probes) >= 2


def test_a_node_silent_at_the_first_look_after_a_run_is_waited_for_while_the_api_answers(h: Harness) -> None:
    """One status lost right after a run gives the lock back stops nothing; the node's first answer
    fills in its reference, so a later restart of its rank alone is still seen."""
    h.adopt_healthy()
    lock = h.state_dir / "deployment.lock"
    lock.write_text("site.yml\n")
    os.utime(lock, (h.clock.now, h.clock.now))
    h.tick(5)
    lock.unlink()
    h.worker.unreachable = True
    h.tick()
    assert h.cluster.actions() == []
    assert "healthy action=adopt" in h.log_lines("decision")[-1]
    assert "rank 1 on spark-b gave no status" in h.log_lines("decision")[-1]
    h.worker.unreachable = False
    h.tick(3)
    assert h.cluster.actions() == [] and h.sup.memory.state is sup.State.HEALTHY
    h.worker.restart_alone()
    h.tick()
    assert h.cluster.actions() == GROUP_RESTART
    assert "rank 1 on spark-b restarted alone" in h.log_lines("decision")[-1]


def test_a_node_silent_for_one_look_after_a_restart_is_no_rank_restarted_alone(h: Harness) -> None:
    h.adopt_healthy()
    h.head.die(137)
    h.worker.vanish_after_start = True  # its status right after the start does not come back
    h.tick()
    assert h.cluster.actions() == GROUP_RESTART
    h.worker.vanish_after_start = h.worker.unreachable = False
    h.tick(3)
    assert h.cluster.actions() == GROUP_RESTART, h.log_lines("decision")
    assert h.sup.memory.state is sup.State.HEALTHY and h.sup.memory.attempts == 0
    assert not any("restarted alone" in line for line in h.log_lines("decision"))
    assert set(h.sup.memory.baseline) == {"spark-a", "spark-b"}


def test_deployment_lock_pauses_then_the_group_is_adopted_again(h: Harness) -> None:
    h.adopt_healthy()
    lock = h.state_dir / "deployment.lock"
    lock.write_text("site.yml\n")
    os.utime(lock, (h.clock.now, h.clock.now))
    h.worker.die(1)  # site.yml restarting the ranks
    h.tick(20)  # 100 s: past probe_interval, with nothing running
    assert h.cluster.actions() == []
    assert h.api.probes == []  # no probe either: the run owns the API meanwhile
    state = h.state()
    assert state["state"] == "paused" and state["reason"].startswith(f"paused: {lock} held (since ")
    assert state["ranks"][1]["state"] == "exited"  # still observed and reported
    h.worker.state = "running"
    h.worker.started_at = iso(h.clock.now)  # site.yml started a new group
    h.head.started_at = iso(h.clock.now + 1)
    lock.unlink()
    h.tick(5)
    assert h.cluster.actions() == []  # adopted, not restarted
    assert "healthy action=adopt" in h.log_lines("decision")[-1]


def test_a_restart_stops_before_its_next_step_once_a_run_takes_the_lock_and_adopts_the_runs_group(
    h: Harness,
) -> None:
    """A run that takes the lock while the supervisor restarts the group takes the group over: two
    sequences of stops and starts would break each other's rendezvous (seen on the lab)."""
    h.adopt_healthy()
    lock = h.state_dir / "deployment.lock"

    def run_then_a_run_takes_the_lock(argv: Sequence[str], timeout: float) -> Any:
        result = h.cluster(argv, timeout)
        if argv[-1] == "stop" and not lock.exists():
            lock.write_text("site.yml\n")
            os.utime(lock, (h.clock.now, h.clock.now))
        return result

    h.sup.run = run_then_a_run_takes_the_lock
    h.worker.die(1)
    h.tick()
    assert h.cluster.actions() == [("spark-a", "stop")], "nothing after the lock was taken"
    assert h.sup.memory.state is sup.State.PAUSED and h.sup.memory.attempts == 0
    assert h.log_lines("yield")[-1].endswith(
        f"a deployment run took {lock} before step 2/4 (stop rank 1 on spark-b): it takes the group over"
    )
    # The run restarts the group and gives the lock back: the supervisor adopts what it left.
    h.worker.state = h.head.state = "running"
    h.worker.started_at = iso(h.clock.now)
    h.head.started_at = iso(h.clock.now + 1)
    h.api.health = 200
    lock.unlink()
    h.tick()
    assert h.cluster.actions() == [("spark-a", "stop")], "adopted, not restarted"
    assert h.sup.memory.state is sup.State.HEALTHY and h.sup.memory.attempts == 0
    assert "healthy action=adopt" in h.log_lines("decision")[-1]


def test_a_supervisor_that_gave_up_looks_again_after_a_run_however_short(h: Harness) -> None:
    h.adopt_healthy()
    h.worker.fail.add("start")
    h.worker.die(1)
    h.until(lambda: h.sup.memory.state is sup.State.GAVE_UP)
    h.tick(10)
    assert h.sup.memory.state is sup.State.GAVE_UP, "nothing but a run makes it look again"
    actions = len(h.cluster.actions())
    # A run that took the lock and gave it back between two ticks, having put the ranks right.
    h.worker.fail.clear()
    h.worker.state = h.head.state = "running"
    h.worker.started_at = iso(h.clock.now)
    h.head.started_at = iso(h.clock.now + 1)
    h.api.health = 200
    lock = h.state_dir / "deployment.lock"
    acquire(str(lock), {"token": "run"})
    release(str(lock), "run")
    assert not lock.exists()
    # The module stamps the guard with the real time (test_lock); here, the harness's clock.
    os.utime(guard_path(str(lock)), (h.clock.now, h.clock.now))
    h.tick()
    assert h.sup.memory.state is sup.State.HEALTHY and h.sup.memory.attempts == 0
    assert len(h.cluster.actions()) == actions, "adopted, not restarted"
    assert "a deployment run took the lock since it gave up: adopted" in h.log_lines("decision")[-1]


def test_the_lock_guard_is_the_one_the_lock_module_keeps() -> None:
    assert SETTINGS.lock_guard_path == Path(guard_path(str(SETTINGS.lock_path)))


def test_a_stale_lock_is_ignored_with_one_warning(h: Harness) -> None:
    h.adopt_healthy()
    lock = h.state_dir / "deployment.lock"
    lock.write_text("")
    stale = h.clock.now - 121 * 60
    os.utime(lock, (stale, stale))
    h.worker.die(1)
    h.tick(10)
    (warning,) = h.log_lines("warning")
    assert f"ignoring {lock}: older than pause_max_minutes (120)" in warning
    assert h.cluster.actions()[:4] == GROUP_RESTART


def test_a_lock_that_outlives_pause_max_stops_pausing(tmp_path: Path) -> None:
    h = Harness(tmp_path, pause_max_minutes=1)
    h.adopt_healthy()
    lock = h.state_dir / "deployment.lock"
    lock.write_text("")
    os.utime(lock, (h.clock.now, h.clock.now))
    h.worker.die(1)
    h.tick(11)  # 55 s: still paused
    assert h.cluster.actions() == []
    h.tick(2)
    assert h.cluster.actions() != [] and len(h.log_lines("warning")) == 1


def test_state_file_format(h: Harness) -> None:
    h.api.running, h.api.waiting, h.api.tokens = 0, 0, 4242
    h.tick()
    state = h.state()
    assert set(state) == {
        "state",
        "reason",
        "since",
        "attempts",
        "recovered",
        "backoff_until",
        "last_action",
        "ranks",
        "api",
        "updated",
        "pid",
    }
    assert state["pid"] == os.getpid() and state["updated"] == T0 and state["since"] == T0
    assert state["last_action"] == {"time": T0, "action": "adopt", "reason": state["reason"]}
    assert [r["node"] for r in state["ranks"]] == ["spark-a", "spark-b"]
    assert set(state["ranks"][1]) == {
        "node",
        "rank",
        "state",
        "exit_code",
        "started_at",
        "finished_at",
        "restart_count",
        "oom_killed",
        "boot_id",
        "mem_available_bytes",
        "memguard_last_kill",
        "detail",
        "fabric",
    }
    assert state["api"] == {
        "health": 200,
        "running": 0.0,
        "waiting": 0.0,
        "generation_tokens_total": 4242.0,
        "prompt_tokens_total": 3000.0,
        "kv_cache_usage_perc": 0.0,
        "last_progress": T0,
        "last_answered": None,
        "hang_seconds": SETTINGS.hang,
        "stalled": None,
        "last_probe": None,
    }
    assert [p.name for p in h.state_dir.iterdir() if p.name.startswith(".")] == []  # no temp file left


@pytest.mark.parametrize(
    ("running", "quiet", "expected"),
    [
        pytest.param(2, 61, "2 request(s) running, no new tokens for 61 s (hang threshold 60 s)",
                     id="stalled-past-the-threshold"),
        pytest.param(2, 59, None, id="stalled-under-it"),
        pytest.param(0, 600, None, id="idle-is-not-stuck"),
        pytest.param(None, 600, None, id="no-metrics"),
        pytest.param(2, None, None, id="progress-unknown"),
    ],
)  # fmt: skip
def test_a_stall_is_requests_running_without_progress_for_the_hang_threshold(
    running, quiet, expected
) -> None:
    now = 1_800_000_000.0
    last_progress = None if quiet is None else now - quiet
    assert rules.stall(running, last_progress, now, 60) == expected
    assert rules.stall(running, last_progress, now, 0) is None, "no threshold, no stall"


def test_the_state_document_carries_the_stall_for_status_yml() -> None:
    memory = sup.Memory(last_progress=NOW - 90)
    seen = obs(metrics=sup.Metrics(running=1.0))
    doc = sup.state_document(memory, seen, NOW, 1, 60)
    assert doc["api"]["stalled"] == "1 request(s) running, no new tokens for 90 s (hang threshold 60 s)"
    assert sup.state_document(memory, seen, NOW, 1, 120)["api"]["stalled"] is None


def test_state_document_keeps_nan_out_of_json() -> None:
    doc = sup.state_document(
        sup.Memory(), obs(metrics=sup.Metrics(float("nan"), 0.0, float("inf"))), NOW, 1, 60
    )
    assert (doc["api"]["running"], doc["api"]["waiting"], doc["api"]["generation_tokens_total"]) == (
        None,
        0.0,
        None,
    )
    json.dumps(doc, allow_nan=False)


def test_state_is_restarting_while_the_steps_run(h: Harness) -> None:
    h.adopt_healthy()
    seen: list[str] = []
    original = h.cluster.__call__

    def spy(argv: Sequence[str], timeout: float) -> Any:
        if argv[-1] != "status":
            seen.append(h.state()["state"])
        return original(argv, timeout)

    h.sup.run = spy
    h.worker.die(1)
    h.tick()
    assert seen == ["restarting"] * 4
    assert h.state()["state"] == "starting"


def test_log_lines_go_to_stdout_and_rotate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    log = sup.RotatingLog(tmp_path / "supervisor.log", 600, 2, clock.time, echo=True)
    for index in range(40):
        log.write("decision", f"line {index:02d}\nwith a newline " + "x" * 20)
    out = capsys.readouterr().out
    assert out.count("\n") == 40 and "line 39 with a newline" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["supervisor.log", "supervisor.log.1", "supervisor.log.2"]
    assert all(p.stat().st_size <= 600 for p in tmp_path.iterdir())


def test_every_decision_is_logged_once_not_every_tick(h: Harness) -> None:
    h.adopt_healthy()
    h.tick(50)
    assert len(h.log_lines("decision")) == 1


# --------------------------------------------------------------------------------------------
# HTTP against a real local server
# --------------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(2)
        code = 200 if self.path in ("/health", "/slow") else 404
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        ok = self.headers.get("Authorization") == f"Bearer {KEY}" and body["max_tokens"] == 1
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_http_request(server: str, proxy_that_answers_nothing: str) -> None:
    """The head's API, directly: a proxy in the environment never gets the key."""
    assert sup.http_request("GET", f"{server}/health", {}, None, 5) == sup.HttpResult(200, "ok", "")
    missing = sup.http_request("GET", f"{server}/nope", {}, None, 5)
    assert (missing.status, missing.error) == (404, "HTTP 404")
    body = json.dumps({"max_tokens": 1}).encode()
    assert sup.http_request("POST", f"{server}/v1", {"Authorization": f"Bearer {KEY}"}, body, 5).status == 200
    assert sup.http_request("POST", f"{server}/v1", {}, body, 5).status == 401
    slow = sup.http_request("GET", f"{server}/slow", {}, None, 0.3)
    assert slow.status is None and "timed out" in slow.error
    refused = sup.http_request("GET", f"http://127.0.0.1:{_free_port()}/health", {}, None, 5)
    assert refused.status is None and "refused" in refused.error.lower()


def test_supervisor_against_a_real_http_server(tmp_path: Path, server: str) -> None:
    h = Harness(tmp_path, api_url=server)
    h.sup.http = sup.http_request
    h.tick(2)
    assert h.sup.memory.state is sup.State.HEALTHY
    assert h.state()["api"]["last_probe"]["outcome"] == "ok"


# --------------------------------------------------------------------------------------------
# The program
# --------------------------------------------------------------------------------------------

FAKE_RANKCTL = """\
#!{python}
import json, pathlib, sys, time
here = pathlib.Path(__file__).resolve().parent
with (here / "calls.jsonl").open("a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
print(json.dumps({{"node": sys.argv[1], "state": "running", "started_at": "2026-12-01T08:00:00Z",
                  "boot_id": "b", "mem_available_bytes": 1 << 36, "memguard_last_kill": None,
                  "time": time.time()}}))
"""


def program_config(tmp_path: Path, **overrides: Any) -> Path:
    rankctl = tmp_path / "rankctl"
    rankctl.write_text(FAKE_RANKCTL.format(python=sys.executable))
    rankctl.chmod(0o755)
    (tmp_path / "api_key").write_text(KEY)
    doc = config_doc(tmp_path / "state", tmp_path / "api_key", interval_seconds=0.05, **overrides)
    doc["api_url"] = f"http://127.0.0.1:{_free_port()}"  # nothing listens: the API is "starting"
    doc["nodes"] = [{"name": n, "rank": r, "rankctl": [str(rankctl), n]} for r, n in enumerate(NAMES[:2])]
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(doc))
    return path


def rankctl_calls(tmp_path: Path) -> list[list[str]]:
    calls = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def test_once_as_a_program(tmp_path: Path) -> None:
    path = program_config(tmp_path)
    done = subprocess.run(
        [sys.executable, str(PROGRAM), "--config", str(path), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert " start pid=" in done.stdout and "starting action=adopt" in done.stdout
    assert rankctl_calls(tmp_path) == [["spark-a", "status"], ["spark-b", "status"]]
    state = json.loads((tmp_path / "state" / "supervisor-state.json").read_text())
    assert state["state"] == "starting" and state["api"]["health"] is None
    assert KEY not in done.stdout + (tmp_path / "state" / "supervisor.log").read_text()


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "supervisor.json"
    path.write_text(json.dumps(_bad(max_attempts=0)))
    assert sup.main(["--config", str(path)]) == 2
    assert "bad config" in capsys.readouterr().err
    path.write_text("{")
    assert sup.main(["--config", str(path)]) == 2
    assert sup.main(["--config", str(tmp_path / "absent.json")]) == 2


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_and_leaves_the_ranks_alone(tmp_path: Path, signum: int) -> None:
    path = program_config(tmp_path)
    state_file = tmp_path / "state" / "supervisor-state.json"
    with subprocess.Popen(
        [sys.executable, str(PROGRAM), "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        deadline = time.monotonic() + 20
        while not state_file.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the supervisor never wrote its state"
            time.sleep(0.02)
        time.sleep(0.3)  # a few ticks
        os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert f"stop {signal.Signals(signum).name} received, exiting; ranks left as they are" in out
    state = json.loads(state_file.read_text())
    assert state["state"] == "stopped" and signal.Signals(signum).name in state["reason"]
    assert {call[1] for call in rankctl_calls(tmp_path)} == {"status"}


def test_memory_record_dataclass_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        sup.Memory().state = sup.State.HEALTHY  # type: ignore[misc]


# --- metrics (dsv41_supervisor_metrics) --------------------------------------------------------


def with_metrics(h: Harness) -> Any:
    h.sup.metrics = supervisor_metrics.SupervisorMetrics(
        states=[state.value for state in sup.State],
        causes=[cause.value for cause in sup.Cause],
        acceptance_record=h.state_dir / supervisor_metrics.ACCEPTANCE_RECORD,
    )
    return h.sup.metrics.registry


def test_metrics_count_a_lost_rank_and_its_restart_by_cause_and_show_each_rank(h: Harness) -> None:
    registry = with_metrics(h)
    h.adopt_healthy()
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "rank_lost"}) == 0
    assert registry.get_sample_value("dsv41_group_state", {"state": "healthy"}) == 1
    h.worker.die(137)
    h.tick()
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "rank_lost"}) == 1
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "rank_lost"}) == 1
    assert registry.get_sample_value("dsv41_group_state", {"state": "healthy"}) == 0
    assert registry.get_sample_value("dsv41_group_state", {"state": "starting"}) == 1
    h.until(lambda: h.sup.memory.state is sup.State.HEALTHY)
    assert registry.get_sample_value("dsv41_rank_up", {"node": "spark-b", "rank": "1"}) == 1
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "rank_lost"}) == 1
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "hang"}) == 0


def test_a_worker_killed_while_the_probe_waits_is_a_lost_rank_not_a_hang(h: Harness) -> None:
    """Measured on the real engine (CI, 2026-12-06): the idle probe goes out, the worker is killed
    meanwhile, the head answers it 500 and exits. The ranks were read before the probe as running:
    read again after a failed probe, the lost worker names the fault, not a hang."""
    registry = with_metrics(h)
    h.adopt_healthy()
    h.tick()

    def worker_killed() -> None:
        h.worker.die(137)
        h.api.probe_status, h.api.metrics_up = 500, False

    h.api.on_probe = worker_killed
    h.until(lambda: h.sup.memory.state is not sup.State.HEALTHY)
    h.api.on_probe = None
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "rank_lost"}) == 1
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "hang"}) == 0
    assert "action=restart: lost rank 1 on spark-b: exited, exit code 137" in h.log_lines("decision")[-1]


def test_a_head_killed_under_the_probe_is_a_lost_rank_once_docker_says_so(h: Harness) -> None:
    """Measured on the real engine (2026-12-06): `docker kill` of the head's rank cut the probe's
    connection, and the rank's status read at once still said running. The ranks are read again
    after a moment, which Docker needs to say the container exited."""
    registry = with_metrics(h)
    h.adopt_healthy()
    h.tick()

    def engine_killed() -> None:
        h.api.probe_status, h.api.metrics_up = None, False  # the connection is cut, the rank not yet gone

    def docker_says_exited() -> None:
        h.head.die(137)

    h.api.on_probe, h.on_settle = engine_killed, docker_says_exited
    h.until(lambda: h.sup.memory.state is not sup.State.HEALTHY)
    h.api.on_probe = h.on_settle = None
    assert h.settles == [sup.PROBE_SETTLE_SECONDS]
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "rank_lost"}) == 1
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "hang"}) == 0
    assert "action=restart: lost rank 0 on spark-a: exited, exit code 137" in h.log_lines("decision")[-1]


def test_metrics_count_each_hang_and_the_restart_after_each_backoff_for_it(h: Harness) -> None:
    registry = with_metrics(h)
    h.adopt_healthy()
    h.tick()
    h.api.answers_per_start = 1  # every new head answers one probe (healthy), then hangs
    h.api.answers_left = 0
    h.tick(400)
    assert h.sup.memory.state is sup.State.GAVE_UP
    # The first hang restarts at once; four more back off then restart; the fifth gives up.
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "hang"}) == 6
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "hang"}) == 5
    assert len(h.cluster.head_stop_times()) == 5
    assert registry.get_sample_value("dsv41_group_state", {"state": "gave_up"}) == 1
    assert registry.get_sample_value("dsv41_group_failed_attempts") == 5


ACCEPTED = {
    "version": 1,
    "last": {"time": "2026-12-06T10:00:00+00:00", "verdict": "warn", "figure": {"busbw_gbps": 18.5}},
    "last_good": {"time": "2026-12-01T09:00:00+00:00", "verdict": "pass", "figure": {"busbw_gbps": 23.7}},
}


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(
            ACCEPTED,
            {
                ("dsv41_fabric_acceptance_verdict", "warn"): 1,
                ("dsv41_fabric_acceptance_verdict", "pass"): 0,
                ("dsv41_fabric_acceptance_verdict", "fail"): 0,
                ("dsv41_fabric_acceptance_bus_bandwidth_bytes_per_second", None): 18.5e9,
                ("dsv41_fabric_acceptance_last_good_bus_bandwidth_bytes_per_second", None): 23.7e9,
                ("dsv41_fabric_acceptance_timestamp_seconds", None): 1796551200,
            },
            id="warn-after-a-pass",
        ),
        pytest.param(
            {"last": {"time": "not a time", "verdict": "fail", "figure": None}, "last_good": None},
            {
                ("dsv41_fabric_acceptance_verdict", "fail"): 1,
                ("dsv41_fabric_acceptance_verdict", "pass"): 0,
                ("dsv41_fabric_acceptance_verdict", "warn"): 0,
            },
            id="failed-to-run",
        ),
        pytest.param({"version": 1}, {}, id="no-run-yet"),
        pytest.param([], {}, id="not-a-record"),
    ],
)
def test_the_last_fabric_acceptance_result_as_metrics(record: Any, expected: dict) -> None:
    samples = {
        (sample.name, sample.labels.get("verdict")): sample.value
        for family in supervisor_metrics.acceptance_families(record)
        for sample in family.samples
    }
    assert samples == expected


def test_the_acceptance_record_is_read_at_each_scrape_and_never_through_a_link(
    h: Harness, tmp_path: Path
) -> None:
    registry = with_metrics(h)
    name = "dsv41_fabric_acceptance_bus_bandwidth_bytes_per_second"
    assert registry.get_sample_value(name) is None  # no run yet
    (h.state_dir / "fabric-acceptance.json").write_text(json.dumps(ACCEPTED))
    assert registry.get_sample_value(name) == 18.5e9
    (h.state_dir / "fabric-acceptance.json").unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps(ACCEPTED))
    (h.state_dir / "fabric-acceptance.json").symlink_to(tmp_path / "elsewhere.json")
    assert registry.get_sample_value(name) is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"metrics_port": 70000}, "metrics_port must be a TCP port"),
        ({"metrics_port": -1}, "metrics_port must be an integer >= 0"),
        ({"metrics_address": ""}, "metrics_address must be an address"),
    ],
)
def test_metrics_settings_are_checked(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(sup.ConfigError, match=message):
        supervisor_settings.load_settings(config_doc(tmp_path, tmp_path / "key", 2, **overrides))


def test_a_failed_restart_is_a_fault_of_its_own_and_the_restart_after_its_backoff_counts_under_it(
    h: Harness,
) -> None:
    registry = with_metrics(h)
    h.adopt_healthy()
    h.worker.fail = {"start"}  # the restart the lost rank causes fails
    h.worker.die(137)
    h.tick()
    assert h.sup.memory.state is sup.State.BACKOFF, h.log_lines("decision")
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "rank_lost"}) == 1
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "restart_failed"}) == 1
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "rank_lost"}) == 1
    h.worker.fail = set()
    h.until(lambda: h.sup.memory.state is sup.State.HEALTHY)
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "restart_failed"}) == 1


def test_the_state_reads_restarting_while_the_restart_steps_run(h: Harness) -> None:
    registry = with_metrics(h)
    h.adopt_healthy()
    seen = []
    run = h.sup.run

    def watching(argv, timeout):
        seen.append(registry.get_sample_value("dsv41_group_state", {"state": "restarting"}))
        return run(argv, timeout)

    h.sup.run = watching
    h.worker.die(137)
    h.tick()
    assert 1 in seen
    assert registry.get_sample_value("dsv41_group_state", {"state": "restarting"}) == 0


def test_a_restart_that_yields_to_a_deployment_run_is_not_counted(h: Harness) -> None:
    registry = with_metrics(h)
    h.adopt_healthy()
    h.worker.die(137)
    run = h.sup.run

    def lock_taken_at_first_step(argv, timeout):
        if argv[-1] in ("stop", "kill"):
            (h.state_dir / "deployment.lock").write_text("{}")
        return run(argv, timeout)

    h.sup.run = lock_taken_at_first_step
    h.tick()
    assert h.sup.memory.state is sup.State.PAUSED, h.log_lines("decision")
    assert registry.get_sample_value("dsv41_group_restarts_total", {"cause": "rank_lost"}) == 0
    assert registry.get_sample_value("dsv41_group_faults_total", {"cause": "rank_lost"}) == 1


def test_without_prometheus_client_the_supervisor_supervises_and_says_why(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "supervisor_metrics", None)
    monkeypatch.setattr(sup, "METRICS_UNAVAILABLE", "No module named 'prometheus_client'; install it")
    assert sup.build_metrics(dataclasses.replace(h.settings, metrics_port=9641), h.sup.log) is None
    assert h.log_lines("error")[-1].endswith(
        "no metrics endpoint: No module named 'prometheus_client'; install it"
    )
