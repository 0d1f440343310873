"""The one way the rank supervisor acts on a node's DeepSeek-V4.1-Flash rank container.

A multi-node vLLM rank group is all or nothing: when one rank dies, the supervisor on the head
restarts every rank in order. To do that it needs, on every node, a status it can trust and a
start, a stop and a kill, and nothing more. This program is that narrow door. It needs docker (root, or
a user in the docker group) and knows one container name, from its config file, so the
supervisor's SSH key can be pinned to it on a worker as a forced command:

    restrict,command="/usr/bin/python3 /usr/local/lib/sparkserve-dsv41/dsv41_rankctl.py --config ..." ssh-...

(Through ``sudo -n``, sudoers must keep SSH_ORIGINAL_COMMAND: its env_reset drops it.)

The verb (``status``, ``start``, ``stop`` or ``kill``) comes from the command line or, when that
has none, from ``SSH_ORIGINAL_COMMAND`` (the command the supervisor asked ssh to run). Anything
other than exactly one of the verbs is refused with exit 2: this program must never become a way to
run arbitrary commands, so it never hands the verb to a shell or to docker as anything but a
fixed argv.

``status`` prints one JSON object: the container's docker state (``missing`` when it does not
exist), its exit code, start and finish times, restart count and OOM flag, the node's boot id
(a reboot changes it), MemAvailable, the time of the memory guard's last kill, and the state of
the fabric link the ranks talk over (``fabric_ifname`` in the config: its sysfs operstate and
carrier; null when none is configured). ``stop`` gives vLLM docker's grace period to exit;
``kill`` gives none (a hung rank cannot exit). ``start``, ``stop`` and ``kill`` print one JSON line
``{"verb", "ok", "detail"}``. Exit 0 on success, 1 on failure.

Stdlib only, Python 3.10+. The docker output parsing is made of pure functions and the verbs
take their command runner, clock and host name as parameters, so the unit tests run without
docker, root or a network.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import dsv41_node as shared  # installed beside this program
from dsv41_node import CommandResult, Runner, parse_meminfo, run_command

VERBS = ("status", "start", "stop", "kill")
EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2
KIB = 1024

STOP_GRACE_SECONDS = 30  # what `docker stop --time` gives vLLM to exit before SIGKILL
INSPECT_TIMEOUT = 20.0
START_TIMEOUT = 120.0  # creating the GPU and RDMA devices of a privileged container takes seconds
STOP_TIMEOUT = STOP_GRACE_SECONDS + 30.0  # the grace period plus docker's own work

# Docker writes Go's zero time for "never": a container that was created but never started, or
# that is running and has never finished.
DOCKER_ZERO_TIME = "0001-01-01T00:00:00Z"
# Docker says "No such container" with --type container and "No such object" without, in both
# the CLI's and the daemon's wording ("Error: ..." / "Error response from daemon: ...").
NO_SUCH_CONTAINER_RE = re.compile(r"no such (container|object)", re.IGNORECASE)
# `docker kill` of a container that exited meanwhile (Docker 20.10, measured):
# "Error response from daemon: Cannot kill container: NAME: Container ID is not running".
NOT_RUNNING_RE = re.compile(r"is not running", re.IGNORECASE)
# Docker container names; checking the config against it keeps the name unable to pass as an option.
CONTAINER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Linux netdev names (the kernel's dev_valid_name): 1-15 characters, no '/', ':' or whitespace, and
# not "." or "..". Checking the config against it keeps the name inside the sysfs directory.
IFNAME_RE = re.compile(r"[^/:\s]{1,15}")
# What the status says of a fabric interface that sysfs does not list.
FABRIC_MISSING = "missing"
# Only these states hold a process that `docker stop` has to end.
STOPPABLE_STATES = frozenset({"running", "restarting", "paused"})
# The exit code means something only once the process has exited at least once.
EXITED_STATES = frozenset({"exited", "dead", "restarting"})

CONFIG_KEYS = {"container", "state_dir", "docker", "meminfo", "boot_id", "fabric_ifname", "sysfs_net"}
KILL_RECORD_NAME = "memguard-last-kill"


class Refused(Exception):
    """A verb or config this program will not act on; main() turns it into exit 2."""


class DockerError(Exception):
    """Docker gave no answer this program understands (daemon down, unexpected output)."""


class ContainerFacts(NamedTuple):
    """What the supervisor needs from `docker inspect`, with docker's "never" mapped to None."""

    state: str
    exit_code: int | None
    started_at: str | None
    finished_at: str | None
    restart_count: int
    oom_killed: bool


MISSING = ContainerFacts("missing", None, None, None, 0, False)


@dataclass(frozen=True)
class Config:
    """The validated config file. meminfo, boot_id and sysfs_net exist so tests can point them
    elsewhere; fabric_ifname None: no fabric to report."""

    container: str
    state_dir: Path
    docker: str = "docker"
    meminfo: Path = Path("/proc/meminfo")
    boot_id: Path = Path("/proc/sys/kernel/random/boot_id")
    fabric_ifname: str | None = None
    sysfs_net: Path = Path("/sys/class/net")

    @property
    def kill_record(self) -> Path:
        return self.state_dir / KILL_RECORD_NAME


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------


def choose_verb(argument: str | None, ssh_original_command: str | None) -> str:
    """The verb to run: the command-line one, else SSH_ORIGINAL_COMMAND, else a refusal.

    Exact match only, no trimming or splitting: ``"status; rm -rf /"`` or ``"status extra"`` are
    not a status request with garbage to ignore, they are something this program does not do.
    """
    if argument is not None:
        verb, source = argument, "the command line"
    elif ssh_original_command is not None:
        verb, source = ssh_original_command, "SSH_ORIGINAL_COMMAND"
    else:
        raise Refused(f"no verb: give one of {', '.join(VERBS)} (or set SSH_ORIGINAL_COMMAND)")
    if verb not in VERBS:
        shown = "".join(ch if ch.isprintable() else "?" for ch in verb)[:200]
        raise Refused(f"refused {shown!r} from {source}: only {', '.join(VERBS)} are allowed")
    return verb


def load_config(text: str) -> Config:
    """Parse and validate the config JSON; Refused names every problem found."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Refused(f"config is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise Refused("config must be a JSON object")
    problems = [f"unknown key {key!r}" for key in sorted(set(doc) - CONFIG_KEYS)]
    container = doc.get("container")
    if not isinstance(container, str) or not CONTAINER_NAME_RE.fullmatch(container):
        problems.append(f"container must be a docker container name, got {container!r}")
    state_dir = doc.get("state_dir")
    # Root's home is not the deployment user's: a relative or ~ path would silently look elsewhere.
    if not isinstance(state_dir, str) or not state_dir.startswith("/"):
        problems.append(f"state_dir must be an absolute path, got {state_dir!r}")
    for key in ("docker", "meminfo", "boot_id", "sysfs_net"):
        if key in doc and (not isinstance(doc[key], str) or not doc[key]):
            problems.append(f"{key} must be a non-empty string, got {doc[key]!r}")
    fabric_ifname = doc.get("fabric_ifname")
    if fabric_ifname is not None and not valid_ifname(fabric_ifname):
        problems.append(f"fabric_ifname must be a network interface name, got {fabric_ifname!r}")
    if problems:
        raise Refused("bad config: " + "; ".join(problems))
    defaults = Config(container="x", state_dir=Path("/"))
    return Config(
        container=container,
        state_dir=Path(state_dir),
        docker=doc.get("docker", defaults.docker),
        meminfo=Path(doc["meminfo"]) if "meminfo" in doc else defaults.meminfo,
        boot_id=Path(doc["boot_id"]) if "boot_id" in doc else defaults.boot_id,
        fabric_ifname=fabric_ifname,
        sysfs_net=Path(doc["sysfs_net"]) if "sysfs_net" in doc else defaults.sysfs_net,
    )


def valid_ifname(name: Any) -> bool:
    """Whether ``name`` is a name Linux accepts for a network interface."""
    return isinstance(name, str) and bool(IFNAME_RE.fullmatch(name)) and name not in (".", "..")


def _docker_time(value: Any) -> str | None:
    """Docker's RFC 3339 time as given, or None for its zero time ("never") or no value."""
    if not isinstance(value, str) or not value or value == DOCKER_ZERO_TIME:
        return None
    return value


def parse_inspect(result: CommandResult) -> ContainerFacts:
    """Facts from `docker inspect --type container <name>`; MISSING when there is no such container.

    Raises DockerError for anything else that is not one container's JSON: a daemon that does not
    answer is not a missing container, and reporting it as one would make the supervisor restart a
    group that may be serving fine.
    """
    if result.returncode != 0:
        if NO_SUCH_CONTAINER_RE.search(result.stderr):
            return MISSING
        detail = (result.stderr.strip() or result.stdout.strip() or "(no output)").splitlines()[0]
        raise DockerError(f"docker inspect failed (rc={result.returncode}): {detail}")
    try:
        doc = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise DockerError(f"docker inspect printed no JSON: {exc}") from exc
    if not isinstance(doc, list) or len(doc) != 1 or not isinstance(doc[0], dict):
        raise DockerError("docker inspect did not print exactly one container")
    container = doc[0]
    state = container.get("State")
    if not isinstance(state, dict) or not isinstance(state.get("Status"), str):
        raise DockerError("docker inspect output has no State.Status")
    status = state["Status"].lower()
    exit_code = state.get("ExitCode")
    restart_count = container.get("RestartCount", 0)
    return ContainerFacts(
        state=status,
        exit_code=exit_code if status in EXITED_STATES and isinstance(exit_code, int) else None,
        started_at=_docker_time(state.get("StartedAt")),
        finished_at=_docker_time(state.get("FinishedAt")),
        restart_count=restart_count if isinstance(restart_count, int) else 0,
        oom_killed=state.get("OOMKilled") is True,
    )


def parse_kill_record(text: str) -> float:
    """The epoch seconds the memory guard wrote; ValueError when it is not one finite number."""
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(f"not a finite time: {text.strip()!r}")
    return value


def parse_carrier(text: str) -> int:
    """The link's carrier from sysfs (1 up, 0 down); ValueError when it is not one integer."""
    return int(text.strip())


def fabric_status(ifname: str, operstate: str | None, carrier: int | None) -> dict[str, Any]:
    """The status's "fabric" entry; operstate None: sysfs does not list the interface.

    Up means operstate "up" and carrier 1: the kernel updates operstate a moment after the carrier
    changes (linkwatch), so for that moment the two disagree.
    """
    if operstate is None:
        return {"ifname": ifname, "operstate": FABRIC_MISSING, "carrier": None, "up": False}
    return {
        "ifname": ifname,
        "operstate": operstate,
        "carrier": carrier,
        "up": operstate == "up" and carrier == 1,
    }


def status_document(
    *,
    node: str,
    container: str,
    facts: ContainerFacts | None,
    boot_id: str | None,
    mem_available: int | None,
    memguard_last_kill: float | None,
    now: float,
    error: str | None = None,
    fabric: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The status JSON. facts None (docker did not answer) reports state "unknown" and the error;
    fabric None: no fabric interface is configured."""
    doc: dict[str, Any] = {
        "node": node,
        "container": container,
        "state": facts.state if facts else "unknown",
        "exit_code": facts.exit_code if facts else None,
        "started_at": facts.started_at if facts else None,
        "finished_at": facts.finished_at if facts else None,
        "restart_count": facts.restart_count if facts else 0,
        "oom_killed": facts.oom_killed if facts else False,
        "boot_id": boot_id,
        "mem_available_bytes": mem_available,
        "memguard_last_kill": memguard_last_kill,
        "fabric": fabric,
        "time": now,
    }
    if error is not None:
        doc["error"] = error
    return doc


def docker_failure(what: str, result: CommandResult) -> str:
    said = shared.detail(result.stderr or result.stdout or "(no output)")
    return f"{what} failed (rc={result.returncode}): {said}"


# --------------------------------------------------------------------------------------------
# Side effects: files, docker, verbs
# --------------------------------------------------------------------------------------------


def read_boot_id(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip() or None
    except OSError:
        return None


def read_mem_available(path: Path) -> int | None:
    try:
        return parse_meminfo(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return None


def read_kill_record(path: Path) -> float | None:
    """The memory guard's last kill, None when it never killed. A record that cannot be parsed
    still says a kill happened, so its mtime stands in for the time rather than hiding it."""
    try:
        text = shared.read_text(path)  # run as root on the head: never through a planted link
    except OSError:  # absent (the guard never killed here), unreadable, or a link
        return None
    try:
        return parse_kill_record(text)
    except ValueError:
        try:
            return path.stat().st_mtime
        except OSError:
            return None


def read_fabric(sysfs_net: Path, ifname: str) -> dict[str, Any]:
    """The status's fabric entry from ``<sysfs_net>/<ifname>/{operstate,carrier}``."""
    device = sysfs_net / ifname
    try:
        operstate = (device / "operstate").read_text(encoding="ascii", errors="replace").strip() or "unknown"
    except OSError:
        if not device.exists():  # no such interface: renamed, or its driver is gone
            return fabric_status(ifname, None, None)
        operstate = "unknown"  # listed, but its state cannot be read
    carrier: int | None
    try:
        carrier = parse_carrier((device / "carrier").read_text(encoding="ascii", errors="replace"))
    except (OSError, ValueError):  # the kernel answers EINVAL while the link is administratively down
        carrier = None
    return fabric_status(ifname, operstate, carrier)


def inspect(config: Config, run: Runner) -> ContainerFacts:
    """The container's facts; DockerError when docker does not give them."""
    result = run([config.docker, "inspect", "--type", "container", config.container], INSPECT_TIMEOUT)
    return parse_inspect(result)


def do_status(config: Config, run: Runner, *, hostname: str, clock: Callable[[], float]) -> tuple[int, dict]:
    """Exit code and status document; exit 1 (state "unknown") when docker did not answer."""
    facts: ContainerFacts | None
    error = None
    try:
        facts = inspect(config, run)
    except DockerError as exc:
        facts, error = None, str(exc)
    doc = status_document(
        node=hostname,
        container=config.container,
        facts=facts,
        boot_id=read_boot_id(config.boot_id),
        mem_available=read_mem_available(config.meminfo),
        memguard_last_kill=read_kill_record(config.kill_record),
        now=clock(),
        error=error,
        fabric=None if config.fabric_ifname is None else read_fabric(config.sysfs_net, config.fabric_ifname),
    )
    return (EXIT_OK if facts is not None else EXIT_FAILED), doc


def do_start(config: Config, run: Runner) -> tuple[bool, str]:
    """Start the container; already running is success, a missing one a failure (site.yml creates it)."""
    try:
        facts = inspect(config, run)
    except DockerError as exc:
        return False, str(exc)
    if facts.state == "running":
        return True, f"{config.container} already running"
    if facts.state == MISSING.state:
        return False, f"container {config.container} does not exist (site.yml creates it)"
    result = run([config.docker, "start", config.container], START_TIMEOUT)
    if result.returncode != 0:
        return False, docker_failure(f"docker start {config.container}", result)
    return True, f"started {config.container} (was {facts.state})"


def _halt(config: Config, run: Runner, verb: str, argv: list[str]) -> tuple[bool, str]:
    """Stop or kill the container; missing or not running is success (the goal is "not running")."""
    try:
        facts = inspect(config, run)
    except DockerError as exc:
        return False, str(exc)
    if facts.state == MISSING.state:
        return True, f"container {config.container} does not exist"
    if facts.state not in STOPPABLE_STATES:
        return True, f"{config.container} already {facts.state}"
    result = run(argv, STOP_TIMEOUT)
    if result.returncode != 0:
        # Removed, or exited, between inspect and now: not running either way.
        if NO_SUCH_CONTAINER_RE.search(result.stderr) or NOT_RUNNING_RE.search(result.stderr):
            gone = "does not exist" if NO_SUCH_CONTAINER_RE.search(result.stderr) else "already exited"
            return True, f"container {config.container} {gone}"
        return False, docker_failure(f"docker {verb} {config.container}", result)
    return True, f"{'killed' if verb == 'kill' else 'stopped'} {config.container} (was {facts.state})"


def do_stop(config: Config, run: Runner) -> tuple[bool, str]:
    """Stop the container, giving vLLM docker's grace period to exit."""
    return _halt(
        config, run, "stop", [config.docker, "stop", "--time", str(STOP_GRACE_SECONDS), config.container]
    )


def do_kill(config: Config, run: Runner) -> tuple[bool, str]:
    """Kill the container (SIGKILL, no grace period): for a hung rank, which cannot shut down
    (docker kills a paused container too: measured)."""
    return _halt(config, run, "kill", [config.docker, "kill", config.container])


ACTIONS = {"start": do_start, "stop": do_stop, "kill": do_kill}


def run_verb(
    verb: str, config: Config, run: Runner, *, hostname: str, clock: Callable[[], float]
) -> tuple[int, dict]:
    """Exit code and the JSON document to print for one verb."""
    if verb == "status":
        return do_status(config, run, hostname=hostname, clock=clock)
    ok, detail = ACTIONS[verb](config, run)
    return (EXIT_OK if ok else EXIT_FAILED), {"verb": verb, "ok": ok, "detail": detail}


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsv41_rankctl",
        description="Status, start, stop or kill this node's dsv41 rank container (and nothing else).",
    )
    parser.add_argument(
        "--config", required=True, help="JSON config: container, state_dir, docker, fabric_ifname"
    )
    parser.add_argument(
        "verb", nargs="?", default=None, help="status, start, stop or kill (default: $SSH_ORIGINAL_COMMAND)"
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    run: Runner = run_command,
    hostname: Callable[[], str] = socket.gethostname,
    clock: Callable[[], float] = time.time,
) -> int:
    """0 done, 1 failed (docker), 2 refused (verb, usage or config)."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)  # usage errors exit 2 too
    try:
        # The verb first: a refused request must not even read the config.
        verb = choose_verb(args.verb, env.get("SSH_ORIGINAL_COMMAND"))
        try:
            text = Path(args.config).read_text(encoding="utf-8")
        except OSError as exc:
            raise Refused(f"cannot read config {args.config}: {exc}") from exc
        config = load_config(text)
    except Refused as exc:
        sys.stderr.write(f"dsv41_rankctl: {exc}\n")
        return EXIT_REFUSED
    code, doc = run_verb(verb, config, run, hostname=hostname(), clock=clock)
    sys.stdout.write(json.dumps(doc) + "\n")
    if code != EXIT_OK:
        sys.stderr.write(f"dsv41_rankctl: {doc.get('error') or doc.get('detail')}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
