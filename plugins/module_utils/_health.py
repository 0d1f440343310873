# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Whether the deployment is healthy, and why not: the verdict of ``status.yml``.

Internal to sparkserve.dsv41; not a public API. Stdlib only, pure. Its inputs are what the nodes
report: each rank's ``dsv41_rankctl.py status`` (the real container state), each node's memory
guard, the API's ``/health`` and ``/metrics`` on the head, and the supervisor's state file.
"""

from __future__ import annotations

import time
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._release import describe

GIB = 1024**3
# A supervisor that has not written its state for this many of its intervals is not running.
STALE_INTERVALS = 6
# Supervisor states in which the group serves (paused: a deployment run holds the lock).
SERVING_STATES = frozenset({"healthy", "paused"})


def _when(epoch: Any) -> str:
    if not isinstance(epoch, (int, float)):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _count(value: Any) -> str:
    """A Prometheus number as an operator reads it: ``3.0`` -> ``3``; unknown -> ``?``."""
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) and not value.is_integer() else str(int(value))
    return "?"


def rank_problem(node: dict[str, Any]) -> str | None:
    """Why one node's rank is not serving, from its rankctl status (None: running)."""
    status = node.get("status")
    name = f"{node['name']} (rank {node['rank']})"
    if not isinstance(status, dict):
        return f"{name}: cannot be asked ({node.get('error') or 'no answer'})"
    state = status.get("state")
    if state == "running":
        return None
    if state == "missing":
        return f"{name}: container {status.get('container')} does not exist"
    if state == "exited":
        oom = ", OOM-killed" if status.get("oom_killed") else ""
        return (
            f"{name}: container {status.get('container')} exited with code {status.get('exit_code')}"
            f"{oom} at {status.get('finished_at')}"
        )
    return f"{name}: container {status.get('container')} is {state}"


def supervisor_written(supervisor: dict[str, Any] | None, interval: float, now: float) -> float | None:
    """When a running supervisor wrote its state (None: no state, or older than STALE_INTERVALS)."""
    updated = supervisor.get("updated") if isinstance(supervisor, dict) else None
    if isinstance(updated, (int, float)) and now - updated <= STALE_INTERVALS * interval:
        return updated
    return None


def supervisor_problem(
    supervisor: dict[str, Any] | None, enabled: bool, interval: float, now: float
) -> str | None:
    """Why the supervisor is not keeping the group (None when it is, or is switched off)."""
    if not enabled:
        return None
    if not isinstance(supervisor, dict):
        return "supervisor: no state written (is dsv41-supervisor running on the head?)"
    if supervisor_written(supervisor, interval, now) is None:
        return f"supervisor: not running (its state was last written {_when(supervisor.get('updated'))})"
    state = supervisor.get("state")
    if state in SERVING_STATES:
        return None
    return f"supervisor: {state} - {supervisor.get('reason') or 'no reason given'}"


def api_problems(api: dict[str, Any], supervisor_as_of: float | None) -> list[str]:
    """Why the API is not serving: ``/health`` not 200, or the supervisor's verdict that it stalls
    (``stalled``: requests running and no new token for its hang threshold), read only while its
    state is current (``supervisor_as_of`` is None when it is not, which says nothing about now).
    A frozen engine whose metrics read 0 running is found by the supervisor's probe, not here."""
    problems = []
    health = api.get("health")
    if health != 200:
        problems.append(f"API: /health answered {health}" if health else "API: no answer on /health")
    stalled = api.get("stalled")
    if supervisor_as_of is not None and isinstance(stalled, str) and stalled:
        problems.append(f"API: hung - {stalled}")
    return problems


def deployment_health(
    nodes: list[dict[str, Any]],
    api: dict[str, Any],
    supervisor: dict[str, Any] | None,
    *,
    supervisor_enabled: bool = True,
    supervisor_interval: float = 5,
    deployments: dict[str, Any] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The verdict: ``{healthy, problems, nodes, api, supervisor}``.

    ``nodes``: ``{name, rank, status (rankctl's JSON, or None), error, guard (systemctl is-active)}``
    in rank order; ``api``: ``{health (HTTP code or None), running, waiting,
    generation_tokens_total, stalled}`` (the last from the supervisor's state: without it a
    stalled API is not reported); ``supervisor``: its state file's content, or None;
    ``deployments``: the deployment record (shown, not judged), or None.
    """
    now = time.time() if now is None else now
    problems = [problem for node in nodes if (problem := rank_problem(node))]
    problems += [
        f"{node['name']}: memory guard is {node.get('guard') or 'unknown'}"
        for node in nodes
        if node.get("guard") != "active"
    ]
    kills = [
        (node["name"], node["status"]["memguard_last_kill"])
        for node in nodes
        if isinstance(node.get("status"), dict) and node["status"].get("memguard_last_kill")
    ]
    # A stall as the supervisor judged it, and only while it keeps looking.
    written = supervisor_written(supervisor, supervisor_interval, now) if supervisor_enabled else None
    problems += api_problems(api, written)
    if problem := supervisor_problem(supervisor, supervisor_enabled, supervisor_interval, now):
        problems.append(problem)
    return {
        "healthy": not problems,
        "problems": problems,
        "nodes": nodes,
        "api": api,
        "supervisor": supervisor,
        "memguard_kills": [{"node": name, "time": when} for name, when in kills],
        "deployments": deployments,
        "host_stack_changes": host_stack_changes(nodes, deployments),
    }


HOST_STACK_ITEMS = ("kernel", "driver", "nic_firmware")


def _stack_text(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{device} {version}" for device, version in sorted(value.items())) or "none"
    return str(value) if value is not None else "none"


def host_stack_changes(nodes: list[dict[str, Any]], deployments: dict[str, Any] | None) -> list[str]:
    """What differs between the nodes' kernel, driver and NIC firmware, and what changed on each
    node since the deployment that serves was recorded (shown, not judged: preflight stops on
    known-bad versions)."""
    stacks = {node["name"]: node["host_stack"] for node in nodes if isinstance(node.get("host_stack"), dict)}
    lines = []
    for item in HOST_STACK_ITEMS:
        seen = {name: _stack_text(stack.get(item)) for name, stack in stacks.items()}
        if len(set(seen.values())) > 1:
            lines.append(
                f"{item} differs between nodes: " + "; ".join(f"{name} {text}" for name, text in seen.items())
            )
    current = (deployments or {}).get("current") or {}
    recorded = current.get("host_stack") or {}
    for name, stack in stacks.items():
        then = recorded.get(name)
        if not isinstance(then, dict):
            continue
        for item in HOST_STACK_ITEMS:
            if item in then and _stack_text(then[item]) != _stack_text(stack.get(item)):
                lines.append(
                    f"{name}: {item} {_stack_text(then[item])} -> {_stack_text(stack.get(item))} since the "
                    f"deployment of {_when(current.get('time'))}"
                )
    return lines


def _rank_cell(status: dict[str, Any]) -> str:
    state = status.get("state", "unreachable")
    if state == "running":
        return f"running since {status.get('started_at')}"
    if state == "exited":
        return f"exited ({status.get('exit_code')}) at {status.get('finished_at')}"
    return state


def health_table(report: dict[str, Any]) -> str:
    """The verdict as a few lines of text for an operator: one row per rank, then the API, the
    supervisor and the verdict."""
    row = "{:<12} {:<10} {:<46} {:<8} {:<12} {}"
    lines = [row.format("node", "container", "rank", "guard", "MemAvailable", "API")]
    health = report["api"].get("health")
    for node in report["nodes"]:
        status = node.get("status") if isinstance(node.get("status"), dict) else {}
        memory = status.get("mem_available_bytes")
        api = "-"
        if node["rank"] == 0:
            api = "healthy" if health == 200 else f"not healthy ({health or 'no answer'})"
        lines.append(
            row.format(
                node["name"],
                status.get("container", "?"),
                _rank_cell(status),
                node.get("guard") or "unknown",
                f"{memory / GIB:.1f} GiB" if isinstance(memory, (int, float)) else "?",
                api,
            )
        )
    api = report["api"]
    lines.append(
        f"API: {_count(api.get('running'))} running, {_count(api.get('waiting'))} waiting, "
        f"{_count(api.get('generation_tokens_total'))} tokens generated"
    )
    lines += [
        f"memory guard killed the ranks on {kill['node']} at {_when(kill['time'])}"
        for kill in report["memguard_kills"]
    ]
    deployments = report.get("deployments")
    if isinstance(deployments, dict):
        lines.append(f"deployment: {describe(deployments.get('current'))}")
        lines.append(f"previous: {describe(deployments.get('previous'))}")
        if deployments.get("last_failed"):
            lines.append(f"last failed switch: {describe(deployments['last_failed'])}")
    lines += [f"host stack: {change}" for change in report.get("host_stack_changes", [])]
    versions = ((report.get("deployments") or {}).get("current") or {}).get("image_versions") or {}
    if versions:
        named = ", ".join(
            f"{name} {versions[name] or 'none'}" for name in ("torch", "cuda", "nccl") if name in versions
        )
        lines.append(f"image: {named} (as the fabric test read them in the serving image)")
    supervisor = report["supervisor"]
    if isinstance(supervisor, dict):
        last = supervisor.get("last_action") or {}
        lines.append(
            f"supervisor: {supervisor.get('state')} since {_when(supervisor.get('since'))}"
            f" ({supervisor.get('reason') or '-'}); attempts {supervisor.get('attempts', 0)}; last action: "
            + (
                f"{last.get('action')} at {_when(last.get('time'))} ({last.get('reason')})"
                if last
                else "none"
            )
        )
    else:
        lines.append("supervisor: no state")
    lines.append("healthy" if report["healthy"] else "DEGRADED: " + "; ".join(report["problems"]))
    return "\n".join(lines)
