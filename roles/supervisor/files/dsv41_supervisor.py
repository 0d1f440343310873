"""Supervisor of the DeepSeek-V4.1-Flash rank group (vLLM tensor parallel over DGX Sparks).

A multi-node vLLM group is all or nothing: when a headless rank dies (crash, memory-guard kill,
node reboot) rank 0 cannot re-admit a new one, and a rank that docker restarts alone either
fails its rendezvous or hangs. Worse, the API lies: ``/health`` stays 200 while the engine is
deadlocked, so nothing outside the engine notices. This service, on the head, watches every rank
through ``dsv41_rankctl.py`` (locally for rank 0, through a forced-command SSH key for the
workers) and the API's honest signals, and restarts the whole group in order when it must: stop
the head, stop the workers, start the workers, start the head.

A hang is told by progress and confirmed by a probe. Progress is any work the engine shows in
``/metrics``: token counters, its step histogram, or the KV cache usage (a long chunked prefill
moves nothing else). The metrics freeze with the engine (vLLM publishes them after a step), so a
frozen rank may show 0 requests running: no progress for ``hang_seconds``, busy or not, and an idle
engine every ``probe_interval``, send the probe (a one-token completion both ranks must serve); a
probe that fails while the engine made no progress either is a hang. A probe that timed out while
the KV cache kept filling queued behind a long prefill: busy, not hung. A killed worker makes the
head answer one HTTP 500 and exit: a failed probe, then a lost rank, either way a restart.

Around that: a memory-guard kill stops the whole group and waits for memory before starting it
again (a lone survivor only wastes memory); a node whose fabric link is down (rankctl reads the
interface's operstate and carrier) stops the whole group too, until every link is up again (no
rank works without it, and that is no failed attempt); a node that does not answer at all (a
reboot, its power or network gone) stops the group likewise until it answers again, since a restart
that cannot reach it would only spend the attempts; failed starts back off, doubling, and
after ``max_attempts`` in a row the supervisor gives up and says why, until a deployment run takes
the lock (or the service restarts). A start that turned healthy but failed again (hang, lost
rank) before it stayed healthy and answering for ``Settings.recovery`` is a failed start too, so a
group that fails the same way after every restart is given up on, not restarted for ever. While a
deployment run holds ``<state_dir>/deployment.lock`` it acts on nothing; on its first look after
it starts it adopts a group that is already serving instead of restarting it. Every decision is
logged with its reason (stdout for journald, and a size-rotated ``supervisor.log``), and
``supervisor-state.json`` says where it stands, rewritten atomically every tick.

Stdlib only, Python 3.10+, runs as root under systemd. The decisions are pure functions of an
observation, the remembered state and the time; the loop takes its clock, sleep, command runner
and HTTP client as parameters, so the unit tests run without docker, root, ssh or a network.
Durations are on the monotonic clock, so a clock step neither stretches nor cuts a hang, a
start-up or a backoff; epoch seconds only where other clocks meet: the lock file's age, a kill
record against its rank's Docker start, the state file's times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from http.client import HTTPException
from pathlib import Path

import dsv41_node as shared  # installed beside this program
from dsv41_node import RotatingLog, Runner, StopRequested, detail, run_command
from dsv41_supervisor_rules import (  # installed beside this program
    FRESH,
    HTTP_BODY_LIMIT,
    PROBE_PROMPT,
    Action,
    Cause,
    Decision,
    HttpResult,
    LockStatus,
    Memory,
    Metrics,
    Observation,
    Probe,
    ProbeResult,
    RankStatus,
    State,
    Step,
    StepsOutcome,
    baseline_from,
    classify_probe,
    decide,
    failed_attempt,
    format_time,
    lock_status,
    node_wait_reason,
    parse_action_result,
    parse_metrics,
    parse_rank_status,
    restart_plan,
    should_probe,
    state_document,
    stop_plan,
    track,
    unreachable_nodes,
)
from dsv41_supervisor_settings import (  # installed beside this program
    LOG_NAME,
    STATE_NAME,
    ConfigError,
    NodeConfig,
    Settings,
    load_config_file,
)

# urlopen's shape (method, URL, headers, body, timeout): the tests fake the engine with one.
Http = Callable[[str, str, Mapping[str, str], "bytes | None", float], HttpResult]

# Measured on the real-engine lab (2026-12-06): a head rank killed (`docker kill`) cut the probe's
# connection, and its status read at once still said running; a failed probe is a fault, rare, so
# a second's wait before the ranks are read again costs nothing.
PROBE_SETTLE_SECONDS = 1.0

# The metrics need prometheus_client (python3-prometheus-client); supervising never does.
try:
    import dsv41_supervisor_metrics as supervisor_metrics  # installed beside this program
except ImportError as missing:
    supervisor_metrics = None
    METRICS_UNAVAILABLE: str | None = f"{missing}; install python3-prometheus-client"
else:
    METRICS_UNAVAILABLE = None


# --------------------------------------------------------------------------------------------
# Side effects: log, files, rankctl, HTTP
# --------------------------------------------------------------------------------------------

# No proxy: the API is on this host, and a proxy from the environment must never see the key.
# The key as the api_key module generates or accepts one: URL-safe characters only.
API_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_request(
    method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: float
) -> HttpResult:
    request = urllib.request.Request(url, data=body, headers=dict(headers), method=method)  # noqa: S310 - http(s) checked in load_settings
    try:
        with _OPENER.open(request, timeout=timeout) as reply:
            return HttpResult(reply.status, reply.read(HTTP_BODY_LIMIT).decode("utf-8", "replace"), "")
    except urllib.error.HTTPError as exc:
        try:
            text = exc.read(4096).decode("utf-8", "replace")
        except (OSError, HTTPException):
            text = ""
        return HttpResult(exc.code, text, f"HTTP {exc.code}")
    except urllib.error.URLError as exc:
        return HttpResult(None, "", str(exc.reason))
    except (OSError, HTTPException) as exc:  # timeouts while reading, resets, bad status lines
        return HttpResult(None, "", f"{type(exc).__name__}: {exc}".rstrip(": "))


def read_api_key(path: Path) -> str:
    """The key, read at each use (site.yml may rotate it); ValueError when there is none or the file
    holds no key as site.yml writes one: a header of anything else fails in http.client with the
    text in its message, which would crash the loop and print the key in the journal."""
    key = shared.read_text(path).strip()  # never a root-only file a link names, sent as a header
    if not key:
        raise ValueError(f"{path} is empty")
    if not API_KEY_RE.fullmatch(key):
        raise ValueError(f"{path} holds no key of A-Z a-z 0-9 - _ alone (an edited file?)")
    return key


def read_lock_mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


class Supervisor:
    """The loop's state and its side effects; every decision comes from decide()."""

    def __init__(
        self,
        settings: Settings,
        log: RotatingLog,
        *,
        run: Runner,
        http: Http,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        wall: Callable[[], float] = time.time,
        metrics: supervisor_metrics.SupervisorMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.log = log
        self.run = run
        self.http = http
        self.clock = clock  # monotonic: every duration (a clock step must not stretch or cut one)
        self.wall = wall  # epoch seconds: the lock file's age and the state file's times
        self.sleep = sleep
        self.metrics = metrics
        self.memory = Memory(since=clock())
        self.last_obs: Observation | None = None
        self._state_error: str | None = None

    # -- looking ----------------------------------------------------------------------------

    def rank_status(self, node: NodeConfig) -> RankStatus:
        result = self.run([*node.rankctl, "status"], self.settings.rankctl_timeout)
        return parse_rank_status(node, result)

    def collect_ranks(self) -> tuple[RankStatus, ...]:
        return tuple(self.rank_status(node) for node in self.settings.nodes)

    def get_health(self) -> tuple[int | None, str]:
        reply = self.http("GET", f"{self.settings.api_url}/health", {}, None, self.settings.http_timeout)
        return reply.status, detail(reply.error)

    def get_metrics(self) -> Metrics:
        reply = self.http("GET", f"{self.settings.api_url}/metrics", {}, None, self.settings.http_timeout)
        return parse_metrics(reply.body) if reply.status == 200 else Metrics()

    def probe(self) -> ProbeResult:
        s = self.settings
        try:
            key = read_api_key(s.api_key_file)
        except (OSError, ValueError) as exc:
            return ProbeResult(
                self.clock(),
                Probe.INCONCLUSIVE,
                detail(f"no probe: cannot read the key: {exc}"),
            )
        payload = {
            "model": s.model,
            "messages": [{"role": "user", "content": PROBE_PROMPT}],
            "max_tokens": 1,
            "temperature": 0,
        }
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        reply = self.http(
            "POST", f"{s.api_url}/v1/chat/completions", headers, json.dumps(payload).encode(), s.probe_timeout
        )
        outcome, said = classify_probe(reply)
        return ProbeResult(self.clock(), outcome, said.replace(key, "<key>"))

    def observe(self, now: float) -> Observation:
        s = self.settings
        # The guard first: a run that takes the lock between the two reads is then seen holding it.
        taken = read_lock_mtime(s.lock_guard_path)
        mtime = read_lock_mtime(s.lock_path)
        lock = lock_status(mtime, self.wall(), s.pause_max)
        ranks = self.collect_ranks()
        health, health_detail = self.get_health()
        metrics = self.get_metrics()
        probe = after = None
        if lock is not LockStatus.HELD and should_probe(self.memory, health, metrics, now, s):
            probe = self.probe()
            if probe.outcome is Probe.FAILED:
                # Read again: progress while the probe waited (the KV cache filling during a long
                # prefill) means it queued behind real work, not that the engine is stuck; and a
                # rank lost meanwhile (a killed worker makes the head answer 500 and exit) is a
                # lost rank, not a hang. A killed engine cuts the probe's connection before Docker
                # says its container exited: the ranks are read after a moment.
                self.sleep(PROBE_SETTLE_SECONDS)
                after = self.get_metrics()
                ranks = self.collect_ranks()
        return Observation(ranks, health, health_detail, metrics, probe, lock, mtime, taken, after)

    # -- acting -----------------------------------------------------------------------------

    def run_steps(self, steps: Sequence[Step]) -> StepsOutcome:
        """Run the steps in order, each logged; stop at the first failure (a worker that cannot be
        stopped cannot be started either), and before any step once a deployment run holds the lock:
        the run takes the group over, and two sequences of stops and starts would break each other's
        rendezvous."""
        starts_began = None
        for index, step in enumerate(steps, 1):
            lock = lock_status(read_lock_mtime(self.settings.lock_path), self.wall(), self.settings.pause_max)
            if lock is LockStatus.HELD:
                yielded = (
                    f"a deployment run took {self.settings.lock_path} before step {index}/{len(steps)}"
                    f" ({step.describe()}): it takes the group over"
                )
                self.log.write("yield", yielded)
                return StepsOutcome(False, "", starts_began, yielded)
            if step.verb == "start" and starts_began is None:
                starts_began = self.clock()
            result = self.run([*step.node.rankctl, step.verb], self.settings.rankctl_action_timeout)
            ok, detail = parse_action_result(result)
            self.log.write(
                "step", f"{index}/{len(steps)} {step.describe()}: {'ok' if ok else 'FAILED'} ({detail})"
            )
            if not ok:
                return StepsOutcome(False, f"{step.describe()} failed: {detail}", starts_began, "")
        return StepsOutcome(True, "", starts_began, "")

    def yield_to_run(self, memory: Memory, reason: str, last_action: tuple[float, str, str]) -> Memory:
        """Paused mid-sequence: after the run, the group is looked at afresh (and adopted), as after
        any pause; no failed attempt is counted."""
        paused = Decision(Action.NONE, State.PAUSED, reason, 0)
        self.log_decision(paused)
        return dataclasses.replace(self.pause(memory, paused, self.clock()), last_action=last_action)

    def restart_group(self, decision: Decision, memory: Memory) -> Memory:
        self.write_state(dataclasses.replace(memory, state=State.RESTARTING, reason=decision.reason))
        if self.metrics is not None:
            self.metrics.set_state(State.RESTARTING.value)
        ok, failure, starts_began, yielded = self.run_steps(restart_plan(self.settings, kill=decision.kill))
        now = self.clock()
        last_action = (now, Action.RESTART.value, decision.reason)
        if yielded:
            return self.yield_to_run(memory, yielded, last_action)
        if self.metrics is not None:  # a backoff's or a wait's end restarts for the fault that began it
            cause = decision.cause or memory.cause
            self.metrics.restarted(cause.value if cause is not None else "unknown")
        if not ok:
            # A node that stopped answering mid-restart (a reboot) is waited for, not counted.
            gone = unreachable_nodes(self.collect_ranks())
            failed = (
                Decision(Action.NONE, State.NODE_WAIT, node_wait_reason(gone), decision.attempts)
                if gone
                else failed_attempt(
                    decision.attempts,
                    f"group restart: {failure}",
                    now,
                    self.settings,
                    cause=Cause.RESTART_FAILED,
                    kill=decision.kill,
                )
            )
            self.log_decision(failed)
            if self.metrics is not None and failed.cause is not None:
                self.metrics.fault(failed.cause.value)
            # needs_adoption off: a first look that failed to start the group must back off too.
            return dataclasses.replace(
                self.enter(memory, failed, now), needs_adoption=False, last_action=last_action
            )
        # The reference for "restarted alone" and "rebooted": the ranks as this start left them.
        ranks = self.collect_ranks()
        self.last_obs = self.last_obs._replace(ranks=ranks) if self.last_obs else None
        return dataclasses.replace(
            self.enter(memory, decision, now),
            needs_adoption=False,
            group_started=starts_began if starts_began is not None else now,
            baseline=baseline_from(ranks),
            last_metrics=FRESH,  # a new head process counts from zero
            last_progress=now,
            last_answered=None,
            api_up=None,
            recovered=False,  # on trial until it has stayed healthy and answering for a while
            health_bad_since=None,
            last_probe=None,
            last_action=last_action,
        )

    def stop_group(self, decision: Decision, memory: Memory) -> Memory:
        ok, failure, _starts_began, yielded = self.run_steps(stop_plan(self.settings))
        now = self.clock()
        if yielded:
            return self.yield_to_run(memory, yielded, (now, Action.STOP.value, decision.reason))
        if not ok:  # the restart after the wait stops again; say so now
            self.log.write("error", f"stopping the group: {failure}")
        # needs_adoption off: a stopped group is not adopted; the wait decides when it starts.
        return dataclasses.replace(
            self.enter(memory, decision, now),
            needs_adoption=False,
            last_action=(now, Action.STOP.value, decision.reason),
        )

    @classmethod
    def pause(cls, memory: Memory, decision: Decision, now: float) -> Memory:
        """The memory while a deployment run holds the lock: whatever the run does, the group is
        looked at afresh afterwards, as after a service start."""
        return dataclasses.replace(
            cls.enter(memory, decision, now), needs_adoption=True, group_started=None, baseline={}
        )

    @staticmethod
    def enter(memory: Memory, decision: Decision, now: float) -> Memory:
        """The memory once a decision's state holds."""
        changed = decision.state is not memory.state
        return dataclasses.replace(
            memory,
            state=decision.state,
            reason=decision.reason,
            since=now if changed else memory.since,
            attempts=decision.attempts,
            backoff_until=decision.backoff_until,
            recovered=memory.recovered if decision.recovered is None else decision.recovered,
            kill_on_restart=decision.kill,
            cause=decision.cause if decision.cause is not None else memory.cause,
        )

    def log_decision(self, decision: Decision) -> None:
        self.log.write(
            "decision", f"{decision.state.value} action={decision.action.value}: {decision.reason}"
        )

    def apply(self, decision: Decision, memory: Memory, obs: Observation, now: float) -> Memory:
        if (
            decision.action is not Action.NONE
            or decision.state is not memory.state
            or decision.reason != memory.reason
        ):
            self.log_decision(decision)
        if decision.cause is not None and self.metrics is not None:
            self.metrics.fault(decision.cause.value)
        if decision.action is Action.RESTART:
            return self.restart_group(decision, memory)
        if decision.action is Action.STOP:
            return self.stop_group(decision, memory)
        if decision.action is Action.ADOPT:
            return dataclasses.replace(
                self.enter(memory, decision, now),
                needs_adoption=False,
                group_started=now,
                baseline=baseline_from(obs.ranks),
                last_progress=now,
                api_up=now if obs.health == 200 else None,
                # Nothing says it was failing before this look (a service start or a deployment run).
                recovered=True,
                last_action=(now, Action.ADOPT.value, decision.reason),
            )
        if decision.state is State.PAUSED:
            return self.pause(memory, decision, now)
        return self.enter(memory, decision, now)

    def step(self) -> None:
        """One tick: look, decide, act, record."""
        s = self.settings
        obs = self.observe(self.clock())
        self.last_obs = obs
        now = self.clock()
        memory = track(self.memory, obs, now)
        if obs.lock is LockStatus.STALE and memory.stale_lock_warned != obs.lock_mtime:
            assert obs.lock_mtime is not None
            self.log.write(
                "warning",
                f"ignoring {s.lock_path}: older than pause_max_minutes ({s.pause_max / 60:g})"
                f" (since {format_time(obs.lock_mtime)}); a deployment run left it behind?",
            )
            memory = dataclasses.replace(memory, stale_lock_warned=obs.lock_mtime)
        decision = decide(obs, memory, now, s)
        self.memory = self.apply(decision, memory, obs, now)
        self.write_state(self.memory)
        if self.metrics is not None:
            ranks = [(r.node, r.rank, r.running) for r in (self.last_obs or obs).ranks]
            self.metrics.observe(self.memory.state.value, ranks, self.memory.attempts)

    def write_state(self, memory: Memory) -> None:
        doc = state_document(
            memory, self.last_obs, self.clock(), os.getpid(), self.settings.hang, wall_now=self.wall()
        )
        try:
            shared.write_atomically(self.settings.state_dir / STATE_NAME, json.dumps(doc, indent=1) + "\n")
        except OSError as exc:
            message = f"cannot write {self.settings.state_dir / STATE_NAME}: {exc}"
            if message != self._state_error:  # once per distinct problem, not every tick
                self.log.write("error", message)
            self._state_error = message
        else:
            self._state_error = None

    def stopped(self, signum: int) -> None:
        """The service is stopping: say so in the state file; the ranks are left as they are."""
        reason = f"supervisor stopped by {signal.Signals(signum).name}; ranks left as they are"
        self.memory = dataclasses.replace(self.memory, state=State.STOPPED, reason=reason, since=self.clock())
        self.write_state(self.memory)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsv41_supervisor",
        description="Watch the dsv41 rank group and restart it, in order, when it must.",
    )
    parser.add_argument(
        "--config", required=True, help="JSON config file (keys and defaults: CONFIG_DEFAULTS)"
    )
    parser.add_argument("--once", action="store_true", help="one tick, then exit (tests and diagnostics)")
    return parser


def build_metrics(settings: Settings, log: RotatingLog) -> supervisor_metrics.SupervisorMetrics | None:
    """The supervisor's metrics when an endpoint is asked for and the library is there; else None."""
    if not settings.metrics_port:
        return None
    if supervisor_metrics is None:
        log.write("error", f"no metrics endpoint: {METRICS_UNAVAILABLE}")
        return None
    return supervisor_metrics.SupervisorMetrics(
        states=[state.value for state in State],
        causes=[cause.value for cause in Cause],
        acceptance_record=settings.state_dir / supervisor_metrics.ACCEPTANCE_RECORD,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Supervise until SIGTERM/SIGINT (exit 0); exit 2 on a bad config."""
    args = build_parser().parse_args(argv)
    try:
        settings = load_config_file(args.config)
    except ConfigError as exc:
        sys.stderr.write(f"dsv41_supervisor: bad config {args.config}: {exc}\n")
        return 2
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # keep supervising; the log falls back to stdout and stderr
        sys.stderr.write(f"dsv41_supervisor: cannot create {settings.state_dir}: {exc}\n")
    log = RotatingLog(
        settings.state_dir / LOG_NAME,
        settings.log_max_bytes,
        settings.log_backups,
        time.time,
        program="supervisor",
        echo=True,
    )
    metrics = None if args.once else build_metrics(settings, log)
    supervisor = Supervisor(
        settings,
        log,
        run=run_command,
        http=http_request,
        clock=time.monotonic,
        sleep=time.sleep,
        metrics=metrics,
    )
    with shared.stop_on_signals():
        try:
            log.write("start", settings.describe() + (" once" if args.once else ""))
            if metrics is not None:
                try:
                    metrics.serve(settings.metrics_address, settings.metrics_port)
                except OSError as exc:  # supervising matters more than its metrics: say so and go on
                    log.write(
                        "error",
                        f"no metrics endpoint on {settings.metrics_address}:{settings.metrics_port}: {exc}"
                        " (until the supervisor restarts)",
                    )
            if args.once:
                supervisor.step()
            else:
                # Paced by the monotonic clock: a clock step must not stretch or skip a tick.
                shared.run_loop(
                    supervisor.step, interval=settings.interval, sleep=time.sleep, clock=time.monotonic
                )
        except StopRequested as stop:
            log.write("stop", f"{signal.Signals(stop.signum).name} received, exiting; ranks left as they are")
            supervisor.stopped(stop.signum)
    return 0


if __name__ == "__main__":
    sys.exit(main())
