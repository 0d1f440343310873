"""The supervisor's rules: what it reads from the ranks, the API and the lock (parsing), and what it
decides from one observation, its memory and the time (deciding). Pure functions, no side effects:
dsv41_supervisor.py observes and acts.

Installed beside dsv41_supervisor.py. Stdlib only.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import dsv41_node as shared  # installed beside this program
from dsv41_node import CommandResult, detail, format_gib
from dsv41_supervisor_settings import MIB, NodeConfig, Settings

UNREACHABLE = "unreachable"  # the rank state of a node whose rankctl gave no status
DOCKER_SILENT = "unknown"  # rankctl's rank state when the node's docker did not answer
# Docker's RFC 3339 times carry nanoseconds, which datetime cannot hold.
DOCKER_TIME_RE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)")

PROBE_PROMPT = "Say OK."
HTTP_BODY_LIMIT = 8 * MIB  # /metrics with every histogram is a few hundred KiB

METRIC_RUNNING = "vllm:num_requests_running"
METRIC_WAITING = "vllm:num_requests_waiting"
METRIC_GENERATED = "vllm:generation_tokens_total"
METRIC_PROMPT = "vllm:prompt_tokens_total"
METRIC_KV_USAGE = "vllm:kv_cache_usage_perc"
METRIC_REQUESTS_DONE = "vllm:request_success_total"
# vllm:iteration_tokens_total is a histogram (one observation per engine step): its count and sum.
METRIC_ITERATIONS = "vllm:iteration_tokens_total_count"
METRIC_ITERATION_TOKENS = "vllm:iteration_tokens_total_sum"


class State(enum.Enum):
    """Where the group stands, as the state file and the log say it."""

    HEALTHY = "healthy"
    STARTING = "starting"  # started (or adopted) and not yet serving
    RESTARTING = "restarting"  # only while the restart steps run
    MEMORY_WAIT = "memory_wait"  # stopped after a memory-guard kill, waiting for memory
    FABRIC_WAIT = "fabric_wait"  # stopped because a node's fabric link is down, waiting for it
    NODE_WAIT = "node_wait"  # stopped because a node does not answer (rebooting, down), waiting for it
    BACKOFF = "backoff"  # an attempt failed; the next restart waits
    GAVE_UP = "gave_up"  # max_attempts failed in a row; acts on nothing until a deployment run or a restart
    PAUSED = "paused"  # a deployment run holds the lock
    STOPPED = "stopped"  # the supervisor is not running (written on exit) or has not looked yet


class Cause(enum.Enum):
    """Why the supervisor stopped or restarted the group: the bounded label of its fault and
    restart metrics (the reason in the log says the rest)."""

    NOT_RUNNING = "not_running"  # the first look found no rank running
    RANK_LOST = "rank_lost"
    RANK_RESTARTED_ALONE = "rank_restarted_alone"
    NODE_REBOOTED = "node_rebooted"
    NODE_UNREACHABLE = "node_unreachable"
    HANG = "hang"
    API_UNHEALTHY = "api_unhealthy"
    STARTUP_TIMEOUT = "startup_timeout"
    RESTART_FAILED = "restart_failed"
    MEMORY_GUARD = "memory_guard"
    FABRIC_DOWN = "fabric_down"


class Action(enum.Enum):
    NONE = "none"
    ADOPT = "adopt"  # take the running group as the reference, without touching it
    RESTART = "restart"  # stop head, stop workers, start workers, start head
    STOP = "stop"  # stop head, stop workers (memory, fabric)


class Probe(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    INCONCLUSIVE = "inconclusive"  # 401 or no key: the API answered without asking the engine


class LockStatus(enum.Enum):
    NONE = "none"
    HELD = "held"
    STALE = "stale"


class HttpResult(NamedTuple):
    """status None: no HTTP answer at all (refused, timed out); error says why."""

    status: int | None
    body: str
    error: str


class Fabric(NamedTuple):
    """A node's fabric link as rankctl read it from sysfs; up: operstate "up" and carrier 1."""

    ifname: str
    operstate: str
    carrier: int | None
    up: bool


class RankStatus(NamedTuple):
    """One node's rank as rankctl reported it; state "unreachable" when rankctl gave no status,
    "unknown" when the node's docker did not (both: nothing is known of the rank, see unreachable).
    fabric None: the node said nothing of its fabric (none configured, or no status at all)."""

    node: str
    rank: int
    state: str
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    restart_count: int = 0
    oom_killed: bool = False
    boot_id: str | None = None
    mem_available: int | None = None
    memguard_last_kill: float | None = None
    detail: str = ""
    fabric: Fabric | None = None

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def unreachable(self) -> bool:
        """Nothing is known of the rank: a docker slow to answer (20 s, under heavy I/O) is judged
        as a node that gave no status, never as a lost rank, which would restart a serving group."""
        return self.state in (UNREACHABLE, DOCKER_SILENT)


class Metrics(NamedTuple):
    """Sums over label sets; None when the API gave no /metrics or lacks the metric."""

    running: float | None = None
    waiting: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    iterations: float | None = None  # engine steps (the iteration_tokens histogram's count)
    iteration_tokens: float | None = None  # tokens those steps scheduled (its sum)
    kv_usage: float | None = None  # 0..1 of the KV cache in use (the only series a prefill moves)
    requests_done: float | None = None  # finished requests, every finished_reason


# The series of each field, summed over their label sets (engines, models, finish reasons).
METRIC_FIELDS = {
    METRIC_RUNNING: "running",
    METRIC_WAITING: "waiting",
    METRIC_GENERATED: "generation_tokens",
    METRIC_PROMPT: "prompt_tokens",
    METRIC_ITERATIONS: "iterations",
    METRIC_ITERATION_TOKENS: "iteration_tokens",
    METRIC_KV_USAGE: "kv_usage",
    METRIC_REQUESTS_DONE: "requests_done",
}
# Progress is any of these moving, up or down. vLLM publishes its metrics after each engine step;
# during a long chunked prefill the token counters and the iteration histogram stay flat until the
# prompt is done (measured on vLLM 0.32) and only the KV cache usage moves, rising chunk by chunk;
# decoding moves the token counters; a finished request frees KV cache.
PROGRESS_FIELDS = (
    "generation_tokens",
    "prompt_tokens",
    "iterations",
    "iteration_tokens",
    "kv_usage",
    "requests_done",
)
# These grow only once the engine has answered something: a token out, a prompt done, a request
# finished. A group that moved them since its start has served a request.
ANSWER_FIELDS = ("generation_tokens", "prompt_tokens", "requests_done")
# What a head process that has just started publishes: every counter at zero, nothing in the KV
# cache. The reference after a restart, so requests answered before the first look still count.
FRESH = Metrics(*(0.0 for _field in Metrics._fields))


class ProbeResult(NamedTuple):
    time: float
    outcome: Probe
    detail: str


class Observation(NamedTuple):
    """Everything one tick saw."""

    ranks: tuple[RankStatus, ...]
    health: int | None
    health_detail: str
    metrics: Metrics  # read before the probe
    probe: ProbeResult | None  # None: no probe this tick
    lock: LockStatus = LockStatus.NONE
    lock_mtime: float | None = None
    lock_taken: float | None = None  # when a deployment run last took the lock (None: never)
    metrics_after: Metrics | None = None  # read again after a failed probe (None: not read)


class Baseline(NamedTuple):
    """What a rank looked like when the supervisor last started or adopted the group."""

    started_at: str | None
    boot_id: str | None


@dataclass(frozen=True)
class Memory:
    """The supervisor's remembered state, replaced (never mutated) every tick."""

    state: State = State.STOPPED
    reason: str = "not looked yet"
    since: float = 0.0
    attempts: int = 0  # failed attempts in a row
    backoff_until: float | None = None
    needs_adoption: bool = True  # the first look after the service (or a pause) started
    group_started: float | None = None
    baseline: Mapping[str, Baseline] = field(default_factory=dict)
    last_metrics: Metrics | None = None  # the last /metrics with progress series, measured from
    last_progress: float | None = None  # when the engine last did any work (or answered the probe)
    last_answered: float | None = None  # when it last answered: answer counters grew, or the probe answered
    api_up: float | None = None  # when /health first said 200 since the group was started or adopted
    # False from a restart until the group has stayed healthy and answering for Settings.recovery:
    # until then a new failure is one more failed attempt, so a group that fails the same way soon
    # after every restart is given up on instead of restarted for ever.
    recovered: bool = True
    health_bad_since: float | None = None
    last_probe: ProbeResult | None = None
    last_action: tuple[float, str, str] | None = None
    stale_lock_warned: float | None = None  # mtime of the stale lock already warned about
    # The lock guard's mtime as last seen before giving up: a run that took the lock since changes it.
    lock_taken_seen: float | None = None
    kill_on_restart: bool = False  # the restart after this backoff kills the ranks (a hang's)
    unreachable_since: float | None = None  # since when some node has given no status (None: all answer)
    cause: Cause | None = None  # of the last fault: the cause of the restart that ends its wait or backoff


class Decision(NamedTuple):
    action: Action
    state: State  # the state once the action has succeeded
    reason: str
    attempts: int
    backoff_until: float | None = None
    recovered: bool | None = None  # None: as it was
    # Kill the ranks instead of stopping them (the restart now, or the one after the backoff): a
    # hung engine cannot shut down, and each rank's stop would wait out docker's grace period
    # (measured on vLLM 0.32: 30 s for each rank of a frozen pair).
    kill: bool = False
    cause: Cause | None = None  # set where a fault is detected (counted once), None where a state goes on


class Fault(NamedTuple):
    cause: Cause
    reason: str


class Step(NamedTuple):
    verb: str
    node: NodeConfig

    def describe(self) -> str:
        return f"{self.verb} rank {self.node.rank} on {self.node.name}"


class StepsOutcome(NamedTuple):
    ok: bool
    failure: str  # why a step failed ("" when none did)
    starts_began: float | None  # when the first start ran
    yielded: str  # why the steps stopped for a deployment run ("" when they did not)


# --------------------------------------------------------------------------------------------
# Pure functions: parsing
# --------------------------------------------------------------------------------------------


def format_time(when: float) -> str:
    """Local ISO-8601 with offset, to the second: the unit of every reason that names a time.
    A time no calendar holds (a record the deployment user could write) is told as it is."""
    try:
        return datetime.datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{when:g} (epoch seconds)"


def _sample(line: str) -> tuple[str, float] | None:
    """Name and value of one Prometheus text sample line; None for anything else.

    Label values are quoted and may hold spaces, braces or escaped quotes, so the label set is
    skipped by scanning for its closing brace outside quotes rather than by splitting.
    """
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name, index, quoted = line[:brace], brace + 1, False
        while index < len(line):
            ch = line[index]
            if ch == "\\" and quoted:
                index += 1
            elif ch == '"':
                quoted = not quoted
            elif ch == "}" and not quoted:
                break
            index += 1
        else:
            return None  # no closing brace: a truncated line
        rest = line[index + 1 :]
    else:
        name, _sep, rest = line.partition(" ")
    fields = rest.split()
    if not name or not fields:
        return None
    try:
        return name, float(fields[0])  # float() reads NaN, +Inf and 1.5e+06 as Prometheus writes them
    except ValueError:
        return None


def parse_metrics(text: str) -> Metrics:
    """The series the supervisor watches (METRIC_FIELDS), each summed over its label sets."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        sample = _sample(line)
        key = METRIC_FIELDS.get(sample[0]) if sample else None
        if sample and key:
            sums[key] = sums.get(key, 0.0) + sample[1]
    return Metrics(**sums)


def _known_pairs(before: Metrics | None, after: Metrics | None, fields: Sequence[str]) -> list[tuple]:
    """The (before, after) values of ``fields`` that both readings have, finite: a series one of
    them lacks says nothing, and NaN (never equal to itself) must not read as movement."""
    if before is None or after is None:
        return []
    pairs = [(getattr(before, name), getattr(after, name)) for name in fields]
    return [
        (a, b) for a, b in pairs if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
    ]


def moved(before: Metrics | None, after: Metrics | None) -> bool:
    """Whether the engine did any work between two readings (PROGRESS_FIELDS: any change)."""
    return any(a != b for a, b in _known_pairs(before, after, PROGRESS_FIELDS))


def answered_between(before: Metrics | None, after: Metrics | None) -> bool:
    """Whether the engine answered something between two readings (ANSWER_FIELDS grew)."""
    return any(b > a for a, b in _known_pairs(before, after, ANSWER_FIELDS))


def has_progress_series(metrics: Metrics | None) -> bool:
    return bool(_known_pairs(metrics, metrics, PROGRESS_FIELDS))


def _optional(value: Any, kind: type) -> Any:
    if isinstance(value, bool) and kind is not bool:
        return None
    if kind is float and isinstance(value, int):
        return float(value)
    return value if isinstance(value, kind) else None


def parse_fabric(value: Any) -> Fabric | None:
    """The status's fabric entry; None (no fabric information) when absent, null or malformed."""
    if not isinstance(value, dict) or not isinstance(value.get("ifname"), str) or not value["ifname"]:
        return None
    operstate = value.get("operstate")
    return Fabric(
        ifname=shared.one_line(value["ifname"], 40),
        operstate=shared.one_line(operstate, 40) if isinstance(operstate, str) and operstate else "unknown",
        carrier=_optional(value.get("carrier"), int),
        up=value.get("up") is True,
    )


def parse_rank_status(node: NodeConfig, result: CommandResult) -> RankStatus:
    """A node's status from its rankctl output; "unreachable" when there is no status document.

    rankctl exits 1 with a document (state "unknown") when docker does not answer: that document
    still carries the node's memory and boot id, so it is used whatever the exit code.
    """
    doc = None
    try:
        doc = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("state"), str):
        why = result.stderr.strip() or result.stdout.strip() or "no output"
        return RankStatus(
            node.name,
            node.rank,
            UNREACHABLE,
            detail=detail(f"rc={result.returncode}: {why}"),
        )
    return RankStatus(
        node=node.name,
        rank=node.rank,
        state=doc["state"],
        exit_code=_optional(doc.get("exit_code"), int),
        started_at=_optional(doc.get("started_at"), str),
        finished_at=_optional(doc.get("finished_at"), str),
        restart_count=_optional(doc.get("restart_count"), int) or 0,
        oom_killed=doc.get("oom_killed") is True,
        boot_id=_optional(doc.get("boot_id"), str),
        mem_available=_optional(doc.get("mem_available_bytes"), int),
        memguard_last_kill=_optional(doc.get("memguard_last_kill"), float),
        detail=detail(str(doc.get("error", ""))),
        fabric=parse_fabric(doc.get("fabric")),
    )


def parse_action_result(result: CommandResult) -> tuple[bool, str]:
    """Whether a rankctl start/stop succeeded, and its detail."""
    doc = None
    try:
        doc = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("ok"), bool):
        return (doc["ok"] and result.returncode == 0), detail(str(doc.get("detail", "")))
    why = result.stderr.strip() or result.stdout.strip() or "no output"
    return False, detail(f"rc={result.returncode}: {why}")


def classify_probe(result: HttpResult) -> tuple[Probe, str]:
    """200 answers; 401 means the key file and the server disagree, which says nothing about the
    engine (the API server refuses before the engine sees it); anything else failed."""
    if result.status == 200:
        return Probe.OK, "answered"
    if result.status == 401:
        return Probe.INCONCLUSIVE, "HTTP 401: the key file does not match the server's key"
    if result.status is None:
        return Probe.FAILED, detail(result.error or "no answer")
    body = shared.one_line(result.body, 160)
    return Probe.FAILED, f"HTTP {result.status}" + (f": {body}" if body else "")


def lock_status(mtime: float | None, now: float, pause_max: float) -> LockStatus:
    """A lock younger than pause_max pauses; an older one was left behind by a run that died."""
    if mtime is None:
        return LockStatus.NONE
    return LockStatus.HELD if now - mtime < pause_max else LockStatus.STALE


# --------------------------------------------------------------------------------------------
# Pure functions: deciding
# --------------------------------------------------------------------------------------------


def backoff_delay(attempts: int, settings: Settings) -> float:
    """Seconds before the next restart after ``attempts`` failed attempts in a row (>= 1)."""
    return min(settings.backoff_initial * 2 ** max(0, attempts - 1), settings.backoff_max)


def should_probe(
    memory: Memory, health: int | None, metrics: Metrics, now: float, settings: Settings
) -> bool:
    """Whether this tick sends the probe, a one-token completion that every rank must serve.

    - Starting: every tick once /health is 200, until the group has answered (it turns healthy).
    - Healthy, no progress for hang_seconds: whatever num_requests_running says. vLLM publishes its
      metrics after an engine step, so a rank frozen mid-step freezes them at their last values:
      running may read 0 (a request that came after the freeze is not counted) or a stale 2 while
      nothing moves; only a request through the engine tells. Once per stall, then at the probe
      interval: an answer is progress, a failure decides, and an inconclusive probe (401) would
      only say the same again.
    - Healthy and idle (nothing running, or no metrics): every probe_interval, which also finds a
      frozen engine that no request has met yet.
    - Busy and progressing: never; the progress proves the engine, and a probe would only queue
      behind the work.
    """
    if health != 200 or memory.needs_adoption:
        return False
    if memory.state is State.STARTING:
        return True
    if memory.state is not State.HEALTHY:
        return False
    last = memory.last_probe.time if memory.last_probe is not None else None
    due = last is None or now - last >= settings.probe_interval
    progress = now if moved(memory.last_metrics, metrics) else memory.last_progress
    if progress is not None and now - progress >= settings.hang:
        return due or last < progress + settings.hang  # not probed yet in this stall
    return due and not metrics.running  # None (no metrics) probes: the probe is then the only signal


def track(memory: Memory, obs: Observation, now: float) -> Memory:
    """Carry the progress, answer, health and probe history forward with this tick's observation.

    Progress is any work the engine did (see PROGRESS_FIELDS), between the last look and this one,
    or while a failed probe waited (metrics_after); a probe that answered is progress too. Idle is
    no progress: frozen metrics read exactly like idle ones, so being idle must not hide a freeze
    (should_probe probes an idle engine instead). Without metrics nothing is known: the reference
    and the last progress stay where they were, and a hang that hid behind a failing /metrics is
    still seen.
    """
    before, after = obs.metrics, obs.metrics_after
    reference = memory.last_metrics
    probe_ok = obs.probe is not None and obs.probe.outcome is Probe.OK
    progressed = probe_ok or moved(reference, before) or moved(before, after)
    answered = probe_ok or answered_between(reference, before) or answered_between(before, after)
    for reading in (before, after):
        if has_progress_series(reading):
            reference = reading
    health_bad_since = memory.health_bad_since if memory.health_bad_since is not None else now
    if obs.health == 200:
        health_bad_since = None
    # A node that gave no status when the group was started or adopted: its first answer since.
    missing = [r for r in obs.ranks if not r.unreachable and r.node not in memory.baseline]
    baseline = memory.baseline
    if missing and memory.group_started is not None and memory.state in (State.STARTING, State.HEALTHY):
        baseline = {**memory.baseline, **baseline_from(missing)}
    return dataclasses.replace(
        memory,
        baseline=baseline,
        last_metrics=reference,
        last_progress=now if progressed or memory.last_progress is None else memory.last_progress,
        last_answered=now if answered else memory.last_answered,
        api_up=memory.api_up if memory.api_up is not None or obs.health != 200 else now,
        health_bad_since=health_bad_since,
        last_probe=obs.probe or memory.last_probe,
        unreachable_since=(
            (memory.unreachable_since if memory.unreachable_since is not None else now)
            if any(rank.unreachable for rank in obs.ranks)
            else None
        ),
        # Frozen once it gave up: what a later run is told apart by (no clocks compared).
        lock_taken_seen=memory.lock_taken_seen if memory.state is State.GAVE_UP else obs.lock_taken,
    )


def probe_hung(obs: Observation) -> bool:
    """This tick's probe failed and the engine did nothing while it waited. A probe that failed
    while the engine progressed (the KV cache filling during a long prefill) queued behind real
    work: busy, not hung. Metrics not read again after it count as no progress: a failed probe
    with /metrics gone too is an API that is gone."""
    probe = obs.probe
    return probe is not None and probe.outcome is Probe.FAILED and not moved(obs.metrics, obs.metrics_after)


def _metrics_words(metrics: Metrics) -> str:
    if metrics.running is None:
        return "no /metrics"
    waiting = f", {metrics.waiting:g} waiting" if metrics.waiting is not None else ""
    return f"/metrics: {metrics.running:g} running{waiting}"


def hang_reason(obs: Observation, memory: Memory, now: float) -> str:
    """Why a failed probe is a hang, with what the metrics said (the shape tells which hang)."""
    assert obs.probe is not None
    stalled = now - memory.last_progress if memory.last_progress is not None else 0.0
    running = obs.metrics.running
    if running is not None and running > 0:
        return (
            f"hang: {running:g} requests running, no new tokens for {stalled:g} s (no prompt token or"
            f" KV cache change either), and the probe failed: {obs.probe.detail}"
        )
    return (
        f"hang: the probe failed: {obs.probe.detail}; no engine progress for {stalled:g} s"
        f" ({_metrics_words(obs.metrics)}: frozen metrics read like an idle engine)"
    )


def stall(running: float | None, last_progress: float | None, now: float, hang: float) -> str | None:
    """Requests running and no engine progress for ``hang`` seconds: the stall status.yml names
    while the probe has not confirmed a hang yet, or while a run pauses the supervisor (it keeps
    looking). None when there is none, or nothing says so."""
    if running is None or running <= 0 or last_progress is None or hang <= 0 or now - last_progress < hang:
        return None
    requests = f"{running:g}" if not float(running).is_integer() else str(int(running))
    return (
        f"{requests} request(s) running, no new tokens for {now - last_progress:.0f} s"
        f" (hang threshold {hang:g} s)"
    )


def _exit_words(rank: RankStatus) -> str:
    parts = [rank.state]
    if rank.exit_code is not None:
        parts.append(f"exit code {rank.exit_code}")
    if rank.oom_killed:
        parts.append("OOM killed")
    if rank.finished_at:
        parts.append(f"finished {rank.finished_at}")
    if rank.detail:
        parts.append(rank.detail)
    return ", ".join(parts)


def lost_rank_reason(rank: RankStatus) -> str:
    return f"lost rank {rank.rank} on {rank.node}: {_exit_words(rank)}"


def group_fault(obs: Observation, memory: Memory) -> Fault | None:
    """Why the group cannot go on as it is: a rank not running, a node back from a reboot, or a
    rank that restarted alone (docker's restart policy) since the group was started or adopted.
    A node that gave no status is the node rule's (see serving_through_silence), not a fault here."""
    answering = [rank for rank in obs.ranks if not rank.unreachable]
    for rank in answering:
        if not rank.running:
            return Fault(Cause.RANK_LOST, lost_rank_reason(rank))
    for rank in answering:
        recorded = memory.baseline.get(rank.node)
        if recorded and recorded.boot_id and rank.boot_id and rank.boot_id != recorded.boot_id:
            reason = f"node {rank.node} rebooted: boot_id {recorded.boot_id} -> {rank.boot_id}"
            return Fault(Cause.NODE_REBOOTED, reason)
    for rank in answering:
        recorded = memory.baseline.get(rank.node)
        if recorded is not None and rank.started_at != recorded.started_at:
            reason = (
                f"rank {rank.rank} on {rank.node} restarted alone: started {rank.started_at},"
                f" the group started it at {recorded.started_at} (docker restart count {rank.restart_count})"
            )
            return Fault(Cause.RANK_RESTARTED_ALONE, reason)
    return None


def docker_epoch(value: str | None) -> float | None:
    """Epoch seconds of a docker time (its fraction cut to microseconds); None for none or another text."""
    match = DOCKER_TIME_RE.fullmatch(value or "")
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    moment = datetime.datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    return moment.timestamp() + float(fraction or 0)


def memguard_kill(obs: Observation, baseline: Mapping[str, Baseline]) -> RankStatus | None:
    """A rank its node's memory guard killed since the group started it: the kill is newer than
    the rank's Docker start as the group's start or adoption recorded it (its current start where
    none is recorded, as at a first look). Both times come from the rank's own node's clock."""
    for rank in obs.ranks:
        recorded = baseline.get(rank.node)
        started = docker_epoch(recorded.started_at if recorded and recorded.started_at else rank.started_at)
        if rank.memguard_last_kill is not None and started is not None and rank.memguard_last_kill > started:
            return rank
    return None


def memory_short(obs: Observation, needed: int) -> list[RankStatus]:
    """Nodes without ``needed`` bytes available; a node that did not say counts as short."""
    return [r for r in obs.ranks if r.mem_available is None or r.mem_available < needed]


def fabric_down(obs: Observation) -> list[tuple[str, Fabric]]:
    """The nodes whose fabric link is not up, with it, in rank order. A node that says nothing of
    its fabric (none configured, an older rankctl, unreachable) is not among them."""
    return [(r.node, r.fabric) for r in obs.ranks if r.fabric is not None and not r.fabric.up]


def fabric_wait_reason(down: Sequence[tuple[str, Fabric]]) -> str:
    """Every link that is down, as its node said; operstate "up" without carrier 1 is the moment
    before the kernel's linkwatch catches up with a carrier lost."""
    links = []
    for node, fabric in down:
        words = fabric.operstate if fabric.operstate != "up" else "up without carrier"
        links.append(f"fabric {fabric.ifname} on {node} is {words}")
    return f"{', '.join(links)}: waiting for the link"


def _gave_up(action: Action, attempts: int, fault: Fault) -> Decision:
    """max_attempts failed attempts in a row: the supervisor stops trying and says why."""
    return Decision(
        action,
        State.GAVE_UP,
        f"gave up after {attempts} failed attempts in a row; last: {fault.reason}",
        attempts,
        cause=fault.cause,
    )


def failed_attempt(
    attempts: int, reason: str, now: float, settings: Settings, *, cause: Cause, kill: bool = False
) -> Decision:
    """One more failed attempt: back off (``kill``: the restart after it kills the ranks), or give
    up after max_attempts in a row."""
    attempts += 1
    if attempts >= settings.max_attempts:
        return _gave_up(Action.NONE, attempts, Fault(cause, reason))
    delay = backoff_delay(attempts, settings)
    return Decision(
        Action.NONE,
        State.BACKOFF,
        f"attempt {attempts} of {settings.max_attempts} failed: {reason}; next restart in {delay:g} s",
        attempts,
        now + delay,
        kill=kill,
        cause=cause,
    )


def _health_words(obs: Observation) -> str:
    return f"/health {obs.health}" if obs.health is not None else f"/health no answer ({obs.health_detail})"


def _adopt(obs: Observation, settings: Settings) -> Decision:
    """The first look (service start or end of a pause): leave a running group alone, also while a
    node of a group whose API answers gives no status (the node rule waits for it as for a healthy
    group). A rank the memory guard killed meanwhile (a run's start that the guard cut short) stops
    the group, as after a start: restarting it now would only be killed again."""
    killed = memguard_kill(obs, {})  # nothing recorded yet: each rank's own start
    if killed is not None:
        return _memory_stop(killed, 0, settings)
    running = [r for r in obs.ranks if r.running or (r.unreachable and obs.health == 200)]
    if len(running) == len(obs.ranks):
        ranks = ", ".join(
            f"rank {r.rank} on {r.node} " + (f"started {r.started_at}" if r.running else "gave no status")
            for r in obs.ranks
        )
        if obs.health == 200:
            return Decision(Action.ADOPT, State.HEALTHY, f"adopted the running group ({ranks})", 0)
        return Decision(
            Action.ADOPT,
            State.STARTING,
            f"adopted the running group ({ranks}) while the API is not ready ({_health_words(obs)})",
            0,
        )
    if not running:
        states = ", ".join(f"rank {r.rank} on {r.node} {r.state}" for r in obs.ranks)
        reason = f"no rank running ({states}): starting the group"
        return Decision(Action.RESTART, State.STARTING, reason, 0, cause=Cause.NOT_RUNNING)
    lost = next(r for r in obs.ranks if not r.running)
    return Decision(Action.RESTART, State.STARTING, lost_rank_reason(lost), 0, cause=Cause.RANK_LOST)


def _failed_stop(attempts: int, fault: Fault, wait: State, settings: Settings) -> Decision:
    """Stop the group after one more failed attempt, then ``wait``; or give up at max_attempts."""
    attempts += 1
    if attempts >= settings.max_attempts:
        return _gave_up(Action.STOP, attempts, fault)
    return Decision(Action.STOP, wait, fault.reason, attempts, cause=fault.cause)


def _memory_stop(rank: RankStatus, attempts: int, settings: Settings) -> Decision:
    assert rank.memguard_last_kill is not None
    reason = (
        f"memory guard on {rank.node} killed at {format_time(rank.memguard_last_kill)}: stopping the group,"
        f" then waiting for {format_gib(settings.memory_needed)} available on every node"
    )
    return _failed_stop(attempts, Fault(Cause.MEMORY_GUARD, reason), State.MEMORY_WAIT, settings)


def _fabric_stop(down: Sequence[tuple[str, Fabric]], memory: Memory) -> Decision:
    """No rank can work without its fabric and a restart would only fail: stop the group and wait
    for the links. Not a failed attempt: nothing the supervisor did or can do went wrong."""
    reason = fabric_wait_reason(down)
    return Decision(Action.STOP, State.FABRIC_WAIT, reason, memory.attempts, cause=Cause.FABRIC_DOWN)


def unreachable_nodes(ranks: Sequence[RankStatus]) -> list[RankStatus]:
    return [r for r in ranks if r.unreachable]


def node_wait_reason(gone: Sequence[RankStatus]) -> str:
    nodes = ", ".join(f"{r.node} ({r.detail or 'no status'})" for r in gone)
    return f"node not answering: {nodes}: waiting for it to answer"


def serving_through_silence(obs: Observation, memory: Memory, now: float, settings: Settings) -> bool:
    """A node has given no status for less than hang_seconds while the group serves (healthy, or
    seen at a first look, with an API that answers) or starts: one status that timed out (a node
    busy with I/O, a dropped SSH connection) must stop neither. A node that is really gone takes its
    rank with it, and the API fails within that bound (measured on vLLM 0.32: the head answers HTTP
    500 once, then exits); a start has its own bounds."""
    if memory.unreachable_since is None or now - memory.unreachable_since >= settings.hang:
        return False
    if memory.needs_adoption or memory.state is State.HEALTHY:
        return obs.health == 200
    return memory.state is State.STARTING


def _node_stop(gone: Sequence[RankStatus], memory: Memory, settings: Settings) -> Decision:
    """A node that does not answer (rebooting, powered off, its network down) cannot be restarted
    from here, and a restart that cannot reach it would only count failed attempts until the
    supervisor gave up, minutes before the node came back: stop the group and wait for the node.
    The wait is no failed attempt; losing the node before the group recovered from its last start
    is one (a node that drops off whenever its rank starts is given up on, not restarted for ever)."""
    fault = Fault(Cause.NODE_UNREACHABLE, node_wait_reason(gone))
    if memory.state is State.STARTING or (memory.state is State.HEALTHY and not memory.recovered):
        return _failed_stop(memory.attempts, fault, State.NODE_WAIT, settings)
    return Decision(Action.STOP, State.NODE_WAIT, fault.reason, memory.attempts, cause=fault.cause)


def _decide_starting(obs: Observation, memory: Memory, now: float, settings: Settings) -> Decision:
    """A group started (or adopted while its API was not ready) turns healthy once the API has
    answered a request since the start: its own probe, or any client's (the answer counters grew).
    The failed attempts are kept until it has recovered (see _decide_healthy)."""
    fault = group_fault(obs, memory)
    if fault:
        return failed_attempt(
            memory.attempts, f"while starting: {fault.reason}", now, settings, cause=fault.cause
        )
    started = memory.group_started if memory.group_started is not None else memory.since
    probe = memory.last_probe
    probed = probe is not None and probe.time >= started
    served = memory.last_answered is not None and memory.last_answered >= started
    if obs.health == 200 and (served or (probed and probe.outcome is not Probe.FAILED)):
        if probed and probe.outcome is Probe.OK:
            how = "probe answered"
        elif served:
            how = "requests answered since the start"
        else:
            how = f"probe answered (probe inconclusive: {probe.detail}; /health alone counts)"
        reason = f"group healthy: every rank running, /health 200, {how}"
        return Decision(Action.NONE, State.HEALTHY, reason, memory.attempts)
    # The API is up and the engine answers nothing: a hang right after a start is one as any other,
    # caught within hang_seconds of the API coming up rather than at the start-up timeout.
    if memory.api_up is not None and probe_hung(obs):
        quiet_since = max(memory.api_up, memory.last_progress or memory.api_up)
        if now - quiet_since >= settings.hang:
            reason = (
                f"while starting: hang: the API has been up for {now - memory.api_up:g} s and has"
                f" answered nothing; no engine progress for {now - quiet_since:g} s, and the probe"
                f" failed: {obs.probe.detail}"
            )
            return failed_attempt(memory.attempts, reason, now, settings, cause=Cause.HANG, kill=True)
    if now - started >= settings.startup_timeout:
        last = f"; last probe: {probe.detail}" if probed else ""
        return failed_attempt(
            memory.attempts,
            f"startup: not healthy within {settings.startup_timeout:g} s ({_health_words(obs)}{last})",
            now,
            settings,
            cause=Cause.STARTUP_TIMEOUT,
        )
    return Decision(Action.NONE, State.STARTING, memory.reason, memory.attempts)


def _decide_healthy(obs: Observation, memory: Memory, now: float, settings: Settings) -> Decision:
    def failure(fault: Fault, *, kill: bool = False) -> Decision:
        if memory.recovered:  # a new problem of a group that had recovered: restart it at once
            return Decision(
                Action.RESTART, State.STARTING, fault.reason, memory.attempts, kill=kill, cause=fault.cause
            )
        # Failed again before it recovered: that start did not work, whatever way it failed. A group
        # that hangs (or loses a rank) soon after every restart is given up on after max_attempts.
        healthy_for = f"healthy for {now - memory.since:g} s only (recovered takes {settings.recovery:g} s)"
        reason = f"{fault.reason}; {healthy_for}"
        return failed_attempt(memory.attempts, reason, now, settings, cause=fault.cause, kill=kill)

    fault = group_fault(obs, memory)
    if fault:
        return failure(fault)
    if probe_hung(obs):
        return failure(Fault(Cause.HANG, hang_reason(obs, memory, now)), kill=True)
    if memory.health_bad_since is not None and now - memory.health_bad_since >= settings.hang:
        reason = f"API {_health_words(obs)} for {now - memory.health_bad_since:g} s"
        return failure(Fault(Cause.API_UNHEALTHY, reason))
    if obs.probe is not None and obs.probe.outcome is Probe.FAILED:
        reason = (
            f"group healthy: the probe failed ({obs.probe.detail}) while the engine made progress:"
            " busy (a long prefill?), not hung"
        )
        return Decision(Action.NONE, State.HEALTHY, reason, memory.attempts)
    if (
        not memory.recovered
        and now - memory.since >= settings.recovery
        and memory.last_answered is not None
        and memory.last_answered > memory.since
    ):
        reason = (
            f"group recovered: healthy and answering for {now - memory.since:g} s;"
            f" failed attempts reset (were {memory.attempts})"
        )
        return Decision(Action.NONE, State.HEALTHY, reason, 0, recovered=True)
    reason = memory.reason if memory.state is State.HEALTHY else "group healthy"
    return Decision(Action.NONE, State.HEALTHY, reason, memory.attempts)


def _decide_paused(obs: Observation, settings: Settings) -> Decision:
    assert obs.lock_mtime is not None
    reason = f"paused: {settings.lock_path} held (since {format_time(obs.lock_mtime)})"
    return Decision(Action.NONE, State.PAUSED, reason, 0)


def _decide_gave_up(obs: Observation, memory: Memory, _now: float, settings: Settings) -> Decision:
    if obs.lock_taken != memory.lock_taken_seen:
        # The operator it waited for: a deployment run, which put the ranks right. However short the
        # run was (between two ticks), the lock's guard says it came. It looks as after a start,
        # with no failed attempt counted.
        down = fabric_down(obs)
        first_look = _fabric_stop(down, memory)._replace(attempts=0) if down else _adopt(obs, settings)
        reason = f"a deployment run took the lock since it gave up: {first_look.reason}"
        return first_look._replace(reason=reason)
    return Decision(Action.NONE, State.GAVE_UP, memory.reason, memory.attempts)


def _decide_backoff(_obs: Observation, memory: Memory, now: float, _settings: Settings) -> Decision:
    if memory.backoff_until is not None and now < memory.backoff_until:
        return Decision(
            Action.NONE,
            State.BACKOFF,
            memory.reason,
            memory.attempts,
            memory.backoff_until,
            kill=memory.kill_on_restart,
        )
    return Decision(
        Action.RESTART,
        State.STARTING,
        f"backoff over; restarting ({memory.reason})",
        memory.attempts,
        kill=memory.kill_on_restart,
    )


def _decide_memory_wait(obs: Observation, memory: Memory, _now: float, settings: Settings) -> Decision:
    if memory_short(obs, settings.memory_needed):
        return Decision(Action.NONE, State.MEMORY_WAIT, memory.reason, memory.attempts)
    down = fabric_down(obs)
    if down:  # the group is stopped already: the start waits for the links too
        return Decision(Action.NONE, State.FABRIC_WAIT, fabric_wait_reason(down), memory.attempts)
    lowest = min(obs.ranks, key=lambda r: r.mem_available or 0)
    reason = (
        f"memory back: every node has >= {format_gib(settings.memory_needed)} available"
        f" (lowest {lowest.node} {format_gib(lowest.mem_available or 0)}): restarting the group"
    )
    return Decision(Action.RESTART, State.STARTING, reason, memory.attempts)


def _decide_node_wait(obs: Observation, memory: Memory, _now: float, _settings: Settings) -> Decision:
    gone = unreachable_nodes(obs.ranks)
    if gone:
        return Decision(Action.NONE, State.NODE_WAIT, node_wait_reason(gone), memory.attempts)
    down = fabric_down(obs)
    if down:  # the group is stopped already: the start waits for the links too
        return Decision(Action.NONE, State.FABRIC_WAIT, fabric_wait_reason(down), memory.attempts)
    nodes = ", ".join(r.node for r in obs.ranks)
    reason = f"every node answers again ({nodes}): restarting the group"
    return Decision(Action.RESTART, State.STARTING, reason, memory.attempts)


def _decide_fabric_wait(obs: Observation, memory: Memory, _now: float, _settings: Settings) -> Decision:
    down = fabric_down(obs)
    if down:
        return Decision(Action.NONE, State.FABRIC_WAIT, fabric_wait_reason(down), memory.attempts)
    if any(r.unreachable for r in obs.ranks):  # it may be reachable only over the fabric: not known up
        return Decision(Action.NONE, State.FABRIC_WAIT, memory.reason, memory.attempts)
    links = ", ".join(f"{r.node} {r.fabric.ifname}" for r in obs.ranks if r.fabric is not None)
    reason = f"fabric back: every node's link is up{f' ({links})' if links else ''}: restarting the group"
    return Decision(Action.RESTART, State.STARTING, reason, memory.attempts)


# States in which the group's health does not matter: the supervisor is waiting for something else.
_WAITING = {
    State.GAVE_UP: _decide_gave_up,
    State.BACKOFF: _decide_backoff,
    State.MEMORY_WAIT: _decide_memory_wait,
    State.FABRIC_WAIT: _decide_fabric_wait,
    State.NODE_WAIT: _decide_node_wait,
}
# States the fabric rule leaves alone: gave_up acts on nothing, and in the waits the group is
# stopped already (a memory wait that ends goes to fabric_wait while a link is down).
_FABRIC_RULE_EXEMPT = frozenset({State.GAVE_UP, State.MEMORY_WAIT, State.FABRIC_WAIT, State.NODE_WAIT})
# States the node rule leaves alone: gave_up acts on nothing; in the waits the group is stopped
# already, and the memory and fabric waits count a node that does not answer as not ready.
_NODE_RULE_EXEMPT = _FABRIC_RULE_EXEMPT


def _decide_group(obs: Observation, memory: Memory, now: float, settings: Settings) -> Decision:
    """A group started or adopted: starting or healthy, unless the memory guard killed."""
    killed = memguard_kill(obs, memory.baseline)
    if killed is not None:  # before any restart: a restart now would be killed again
        return _memory_stop(killed, memory.attempts, settings)
    if memory.state is State.STARTING:
        return _decide_starting(obs, memory, now, settings)
    return _decide_healthy(obs, memory, now, settings)


def decide(obs: Observation, memory: Memory, now: float, settings: Settings) -> Decision:
    """The one decision of a tick, from the observation, the remembered state (already carried
    forward by track()) and the time. Pure: the caller does what it says."""
    if obs.lock is LockStatus.HELD:
        return _decide_paused(obs, settings)
    down = fabric_down(obs)
    if down and memory.state not in _FABRIC_RULE_EXEMPT:  # before adopting or restarting anything
        return _fabric_stop(down, memory)
    gone = unreachable_nodes(obs.ranks)
    if (
        gone
        and memory.state not in _NODE_RULE_EXEMPT
        and not serving_through_silence(obs, memory, now, settings)
    ):
        return _node_stop(gone, memory, settings)
    if memory.needs_adoption:
        return _adopt(obs, settings)
    waiting = _WAITING.get(memory.state)
    if waiting is not None:
        return waiting(obs, memory, now, settings)
    return _decide_group(obs, memory, now, settings)


def restart_plan(settings: Settings, *, kill: bool = False) -> list[Step]:
    """The group restart: stop the head (rank 0) first so it stops serving a group about to break,
    stop every worker, start every worker, then the head, which waits for them at its rendezvous.
    ``kill``: the ranks are killed instead of stopped (a hung group cannot shut down)."""
    workers = list(settings.workers)
    halt = "kill" if kill else "stop"
    return [
        Step(halt, settings.head),
        *(Step(halt, w) for w in workers),
        *(Step("start", w) for w in workers),
        Step("start", settings.head),
    ]


def stop_plan(settings: Settings) -> list[Step]:
    return [Step("stop", settings.head), *(Step("stop", w) for w in settings.workers)]


def baseline_from(ranks: Sequence[RankStatus]) -> dict[str, Baseline]:
    """The reference for "restarted alone" and "rebooted": what each node that answered said (a
    node that gave no status is filled in when it answers, see track)."""
    return {r.node: Baseline(r.started_at, r.boot_id) for r in ranks if not r.unreachable}


def rank_summary(rank: RankStatus) -> dict[str, Any]:
    return {
        "node": rank.node,
        "rank": rank.rank,
        "state": rank.state,
        "exit_code": rank.exit_code,
        "started_at": rank.started_at,
        "finished_at": rank.finished_at,
        "restart_count": rank.restart_count,
        "oom_killed": rank.oom_killed,
        "boot_id": rank.boot_id,
        "mem_available_bytes": rank.mem_available,
        "memguard_last_kill": rank.memguard_last_kill,
        "detail": rank.detail,
        "fabric": None if rank.fabric is None else rank.fabric._asdict(),
    }


def _finite(value: float | None) -> float | None:
    """NaN and infinities are not JSON (status.yml's from_json refuses them)."""
    return value if value is not None and math.isfinite(value) else None


def state_document(
    memory: Memory,
    obs: Observation | None,
    now: float,
    pid: int,
    hang: float,
    *,
    wall_now: float | None = None,
) -> dict[str, Any]:
    """supervisor-state.json; ``api.stalled`` is the stall (requests running, no engine work for
    ``hang`` seconds) as the supervisor judged it at ``now``: status.yml reports it, never judges.
    The memory's times are on the supervisor's monotonic clock; the document's are epoch seconds,
    placed back from ``wall_now`` (the wall clock at ``now``; None: the same clock)."""
    metrics = obs.metrics if obs else Metrics()
    probe = memory.last_probe
    offset = 0.0 if wall_now is None else wall_now - now

    def epoch(moment: float | None) -> float | None:
        return None if moment is None else moment + offset

    return {
        "state": memory.state.value,
        "reason": memory.reason,
        "since": epoch(memory.since),
        "attempts": memory.attempts,
        "recovered": memory.recovered,
        "backoff_until": epoch(memory.backoff_until),
        "last_action": (
            None
            if memory.last_action is None
            else {
                "time": epoch(memory.last_action[0]),
                "action": memory.last_action[1],
                "reason": memory.last_action[2],
            }
        ),
        "ranks": [rank_summary(r) for r in obs.ranks] if obs else [],
        "api": {
            "health": obs.health if obs else None,
            "running": _finite(metrics.running),
            "waiting": _finite(metrics.waiting),
            "generation_tokens_total": _finite(metrics.generation_tokens),
            "prompt_tokens_total": _finite(metrics.prompt_tokens),
            "kv_cache_usage_perc": _finite(metrics.kv_usage),
            "last_progress": epoch(memory.last_progress),
            "last_answered": epoch(memory.last_answered),
            "hang_seconds": hang,
            # The supervisor's verdict, which status.yml reports as it stands.
            "stalled": stall(metrics.running, memory.last_progress, now, hang),
            "last_probe": (
                None
                if probe is None
                else {"time": epoch(probe.time), "outcome": probe.outcome.value, "detail": probe.detail}
            ),
        },
        "updated": epoch(now),
        "pid": pid,
    }
