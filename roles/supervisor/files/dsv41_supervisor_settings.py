"""The supervisor's settings: every key of its JSON config with its default, checked once at start
(a bad config exits 2 naming the key), in bytes and seconds.

Installed beside dsv41_supervisor.py. Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv41_node import format_gib  # installed beside this program

GIB = 1024**3
MIB = 1024**2
LOCK_NAME = "deployment.lock"
STATE_NAME = "supervisor-state.json"
LOG_NAME = "supervisor.log"

# Every key the config may have, with its default; None marks the required ones.
CONFIG_DEFAULTS: dict[str, Any] = {
    "state_dir": None,
    "api_key_file": None,
    "model": None,
    "nodes": None,
    "log_max_bytes": 10 * MIB,
    "log_backups": 3,
    "interval_seconds": 5,
    "hang_seconds": 60,
    "probe_interval_seconds": 60,
    "probe_timeout_seconds": 30,
    "startup_timeout_seconds": 1200,
    "backoff_initial_seconds": 10,
    "backoff_max_seconds": 300,
    "max_attempts": 5,
    "memguard_floor_gib": 1,
    "memory_margin_gib": 4,
    "api_url": "http://127.0.0.1:8000",
    "pause_max_minutes": 120,
    # Above rank control's own limits (docker inspect 20 s; then start 120 s, or stop 60 s), so that
    # it, not the supervisor, says what timed out.
    "rankctl_timeout_seconds": 30,  # one status call, ssh included
    "rankctl_action_timeout_seconds": 180,  # one start or stop
    "http_timeout_seconds": 10,  # /health and /metrics
    # The Prometheus endpoint (the API gateway serves it under the key); port 0: none.
    "metrics_address": "127.0.0.1",
    "metrics_port": 0,
}


class ConfigError(ValueError):
    """The config file cannot be used; the message lists every problem."""


@dataclass(frozen=True)
class NodeConfig:
    name: str
    rank: int
    rankctl: tuple[str, ...]  # the verb is appended (for ssh: becomes SSH_ORIGINAL_COMMAND)


@dataclass(frozen=True)
class Settings:
    """Validated config, in seconds and bytes; nodes sorted by rank (rank 0, the head, first)."""

    state_dir: Path
    api_key_file: Path
    model: str
    nodes: tuple[NodeConfig, ...]
    log_max_bytes: int
    log_backups: int
    interval: float
    hang: float
    probe_interval: float
    probe_timeout: float
    startup_timeout: float
    backoff_initial: float
    backoff_max: float
    max_attempts: int
    memguard_floor_gib: float
    memory_margin_gib: float
    api_url: str
    pause_max: float
    rankctl_timeout: float
    rankctl_action_timeout: float
    http_timeout: float
    metrics_address: str
    metrics_port: int

    @property
    def memory_needed(self) -> int:
        return int((self.memguard_floor_gib + self.memory_margin_gib) * GIB)

    @property
    def recovery(self) -> float:
        """How long a restarted group must stay healthy, and answer, before its failed attempts are
        forgiven: one hang window or probe interval, a probe's timeout and a tick. A hang is confirmed
        at most hang + a tick + probe_timeout after the last progress, so a group that hangs again
        right after each restart is caught before it counts as recovered."""
        return max(self.hang, self.probe_interval) + self.probe_timeout + self.interval

    @property
    def head(self) -> NodeConfig:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[NodeConfig, ...]:
        return self.nodes[1:]

    @property
    def lock_path(self) -> Path:
        return self.state_dir / LOCK_NAME

    @property
    def lock_guard_path(self) -> Path:
        """The lock's guard file, which stays: its mtime is when a deployment run last took the lock."""
        return self.state_dir / f".{LOCK_NAME}.guard"

    def describe(self) -> str:
        """The start line: every setting but the key, so a log read later says how it was configured."""
        nodes = " ".join(f"{n.rank}:{n.name}" for n in self.nodes)
        return (
            f"pid={os.getpid()} nodes=[{nodes}] api={self.api_url} model={self.model}"
            f" interval={self.interval:g}s hang={self.hang:g}s probe_every={self.probe_interval:g}s"
            f" probe_timeout={self.probe_timeout:g}s startup_timeout={self.startup_timeout:g}s"
            f" backoff={self.backoff_initial:g}..{self.backoff_max:g}s max_attempts={self.max_attempts}"
            f" recovered_after={self.recovery:g}s"
            f" memory_needed={format_gib(self.memory_needed)} pause_max={self.pause_max:g}s"
            f" state_dir={self.state_dir} key_file={self.api_key_file}"
            f" metrics={f'{self.metrics_address}:{self.metrics_port}' if self.metrics_port else 'off'}"
        )


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def _number(doc: Mapping[str, Any], key: str, problems: list[str], *, minimum: float, strict: bool) -> float:
    value = doc[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= minimum if strict else value < minimum):
        problems.append(f"{key} must be a finite number {'>' if strict else '>='} {minimum:g}, got {value!r}")
        return float(CONFIG_DEFAULTS[key] or 1)
    return float(value)


def _integer(doc: Mapping[str, Any], key: str, problems: list[str], *, minimum: int) -> int:
    value = doc[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        problems.append(f"{key} must be an integer >= {minimum}, got {value!r}")
        return int(CONFIG_DEFAULTS[key] or 1)
    return value


def _nodes(value: Any, problems: list[str]) -> tuple[NodeConfig, ...]:
    if not isinstance(value, list) or not value:
        problems.append("nodes must be a non-empty list of {name, rank, rankctl}")
        return ()
    nodes = []
    for index, entry in enumerate(value):
        where = f"nodes[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "rank", "rankctl"}:
            problems.append(f"{where} must be an object with exactly name, rank and rankctl")
            continue
        name, rank, argv = entry["name"], entry["rank"], entry["rankctl"]
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name must be a non-empty string")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            problems.append(f"{where}.rank must be an integer >= 0")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            problems.append(f"{where}.rankctl must be a non-empty argv list of non-empty strings")
        else:
            nodes.append(NodeConfig(str(name), rank, tuple(argv)))
    if len(nodes) == len(value):
        ranks = sorted(n.rank for n in nodes)
        if ranks != list(range(len(nodes))):
            problems.append(
                f"node ranks must be 0..{len(nodes) - 1}, each once (rank 0 the head), got {ranks}"
            )
        if len({n.name for n in nodes}) != len(nodes):
            problems.append("node names must be unique")
    return tuple(sorted(nodes, key=lambda n: n.rank))


def load_settings(doc: Any) -> Settings:
    """Validate the config document; ConfigError lists every problem, not just the first."""
    if not isinstance(doc, dict):
        raise ConfigError("the config must be a JSON object")
    problems = [f"unknown key {key!r}" for key in sorted(set(doc) - set(CONFIG_DEFAULTS))]
    problems += [
        f"missing required key {k!r}" for k, v in CONFIG_DEFAULTS.items() if v is None and k not in doc
    ]
    if problems:
        raise ConfigError("; ".join(problems))
    full = {**CONFIG_DEFAULTS, **doc}
    for key in ("state_dir", "api_key_file"):
        # Root's ~ is not the deployment user's: insist on the path the role resolved.
        if not isinstance(full[key], str) or not full[key].startswith("/"):
            problems.append(f"{key} must be an absolute path, got {full[key]!r}")
    if not isinstance(full["model"], str) or not full["model"]:
        problems.append("model must be the served model name (a non-empty string)")
    api_url = full["api_url"]
    if not isinstance(api_url, str) or not api_url.startswith(("http://", "https://")):
        problems.append(f"api_url must be an http:// or https:// URL, got {api_url!r}")
    seconds = {
        key: _number(full, key, problems, minimum=0, strict=True)
        for key in (
            "interval_seconds",
            "hang_seconds",
            "probe_interval_seconds",
            "probe_timeout_seconds",
            "startup_timeout_seconds",
            "backoff_initial_seconds",
            "backoff_max_seconds",
            "pause_max_minutes",
            "memguard_floor_gib",
            "rankctl_timeout_seconds",
            "rankctl_action_timeout_seconds",
            "http_timeout_seconds",
        )
    }
    margin = _number(full, "memory_margin_gib", problems, minimum=0, strict=False)
    if seconds["backoff_max_seconds"] < seconds["backoff_initial_seconds"]:
        problems.append("backoff_max_seconds must be >= backoff_initial_seconds")
    max_attempts = _integer(full, "max_attempts", problems, minimum=1)
    log_max_bytes = _integer(full, "log_max_bytes", problems, minimum=1)
    log_backups = _integer(full, "log_backups", problems, minimum=0)
    nodes = _nodes(full["nodes"], problems)
    metrics_port = _integer(full, "metrics_port", problems, minimum=0)
    if metrics_port > 65535:
        problems.append(f"metrics_port must be a TCP port (0: none), got {metrics_port}")
    if not isinstance(full["metrics_address"], str) or not full["metrics_address"]:
        problems.append(f"metrics_address must be an address to listen on, got {full['metrics_address']!r}")
    if problems:
        raise ConfigError("; ".join(problems))
    return Settings(
        state_dir=Path(full["state_dir"]),
        api_key_file=Path(full["api_key_file"]),
        model=full["model"],
        nodes=nodes,
        log_max_bytes=log_max_bytes,
        log_backups=log_backups,
        interval=seconds["interval_seconds"],
        hang=seconds["hang_seconds"],
        probe_interval=seconds["probe_interval_seconds"],
        probe_timeout=seconds["probe_timeout_seconds"],
        startup_timeout=seconds["startup_timeout_seconds"],
        backoff_initial=seconds["backoff_initial_seconds"],
        backoff_max=seconds["backoff_max_seconds"],
        max_attempts=max_attempts,
        memguard_floor_gib=seconds["memguard_floor_gib"],
        memory_margin_gib=margin,
        api_url=api_url.rstrip("/"),
        pause_max=seconds["pause_max_minutes"] * 60,
        rankctl_timeout=seconds["rankctl_timeout_seconds"],
        rankctl_action_timeout=seconds["rankctl_action_timeout_seconds"],
        http_timeout=seconds["http_timeout_seconds"],
        metrics_address=full["metrics_address"],
        metrics_port=metrics_port,
    )


def load_config_file(path: str) -> Settings:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not JSON: {exc}") from exc
    return load_settings(doc)
