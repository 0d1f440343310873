# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The fabric acceptance verdict, as pure functions behind ``fabric_acceptance``.

The node program ``dsv41_fabric_check.py`` (role rank) times all_reduce and all_gather between
every node and prints the bus bandwidth per size. Here every node's output is read, the figure
that decides is taken (the lower of the two collectives' bus bandwidth at the largest size: the
size where the link, not the latency, sets the time), and it is judged against the threshold and
the last good result kept on the head:

- ``fail``: a node's test failed, a collective gave wrong values, or the figure is below the
  threshold;
- ``warn``: the figure passes the threshold but is more than ``warn_drop_percent`` below the last
  good one (a cable reseated, a half of the port lost, a firmware update);
- ``pass`` otherwise. A pass becomes the last good result.

Internal to sparkserve.dsv41; not a public API.
"""

from __future__ import annotations

import json
from typing import Any

RECORD_VERSION = 1
VERDICTS = ("pass", "warn", "fail")


class AcceptanceError(Exception):
    """A node's output that cannot be read as the test's report."""


def parse_node_output(host: str, run: Any) -> dict[str, Any]:
    """One node's run (what ``command`` registered: ``rc``, ``stdout``, ``stderr``): ``{"host",
    "ok", "error"}`` plus, from rank 0, the ``report``.

    The program prints one JSON object on its last stdout line (the report on rank 0, nothing on
    the others when they pass, ``{"error": ...}`` on any rank that fails). A node whose run was
    skipped or never happened has no ``rc``.
    """
    if not isinstance(run, dict) or not isinstance(run.get("rc"), int):
        return {"host": host, "ok": False, "error": "the test did not run on this node"}
    rc, stdout, stderr = run["rc"], str(run.get("stdout") or ""), str(run.get("stderr") or "")
    last = next((line for line in reversed(stdout.splitlines()) if line.strip()), "")
    parsed: dict[str, Any] = {}
    if last:
        try:
            parsed = json.loads(last)
        except ValueError:
            parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    if rc != 0 or "error" in parsed:
        error = parsed.get("error") or _tail(stderr) or _tail(stdout) or f"exit status {rc}"
        return {"host": host, "ok": False, "error": error}
    if parsed and not isinstance(parsed.get("results"), list):
        raise AcceptanceError(f"{host}: the test printed JSON without results: {last[:200]}")
    return {"host": host, "ok": True, "error": None, "report": parsed or None}


def _tail(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[:1500]


def deciding_figure(report: dict[str, Any]) -> dict[str, Any]:
    """The lowest bus bandwidth among the collectives at their largest size."""
    largest: dict[str, dict[str, Any]] = {}
    for row in report["results"]:
        current = largest.get(row["collective"])
        if current is None or row["bytes"] > current["bytes"]:
            largest[row["collective"]] = row
    if not largest:
        raise AcceptanceError("the test's report has no results")
    return min(largest.values(), key=lambda row: row["busbw_gbps"])


def table(report: dict[str, Any]) -> list[str]:
    """nccl-tests' columns, one line per collective and size."""
    header = ("collective", "size (B)", "time (us)", "algbw GB/s", "busbw GB/s", "wrong")
    lines = ["{:<11} {:>12} {:>11} {:>10} {:>10} {:>6}".format(*header)]
    lines.extend(
        f"{row['collective']:<11} {row['bytes']:>12} {row['time_us']:>11.1f} {row['algbw_gbps']:>10.3f} "
        f"{row['busbw_gbps']:>10.3f} {row['wrong']:>6}"
        for row in report["results"]
    )
    return lines


def judge(
    nodes: list[dict[str, Any]],
    *,
    link: str,
    min_busbw_gbps: float,
    warn_drop_percent: float,
    last_good: dict[str, Any] | None,
) -> dict[str, Any]:
    """The verdict on every node's parsed output (``parse_node_output``)."""
    failed = [node for node in nodes if not node["ok"]]
    if failed:
        reasons = "; ".join(f"{node['host']}: {node['error']}" for node in failed)
        return {"verdict": "fail", "figure": None, "msg": f"The fabric test failed on {link}: {reasons}"}
    reports = [node["report"] for node in nodes if node.get("report")]
    if len(reports) != 1:
        raise AcceptanceError(f"expected one report (from rank 0), got {len(reports)}")
    report = reports[0]
    figure = deciding_figure(report)
    measured = (
        f"{figure['collective']} of {_size(figure['bytes'])} at {figure['busbw_gbps']:.3f} GB/s bus "
        f"bandwidth ({report['backend']}, {report['world_size']} ranks)"
    )
    wrong = sum(row["wrong"] for row in report["results"])
    if wrong:
        return {
            "verdict": "fail",
            "figure": figure,
            "msg": f"The fabric test on {link} gave {wrong} wrong values: a collective corrupts data.",
        }
    if figure["busbw_gbps"] < min_busbw_gbps:
        return {
            "verdict": "fail",
            "figure": figure,
            "msg": (
                f"The fabric {link} is too slow: {measured}, below the threshold of {min_busbw_gbps:g} GB/s "
                "(rank_fabric_check_min_busbw_gbps). Check that both halves of the cabled port are ACTIVE "
                "and in NCCL_IB_HCA, the MTU on both ends, and the cable."
            ),
        }
    if last_good and last_good.get("figure"):
        before = last_good["figure"]["busbw_gbps"]
        floor = before * (1 - warn_drop_percent / 100)
        if figure["busbw_gbps"] < floor:
            drop = 100 * (1 - figure["busbw_gbps"] / before)
            return {
                "verdict": "warn",
                "figure": figure,
                "msg": (
                    f"The fabric {link} passes ({measured}) but is {drop:.0f} % slower than its last good "
                    f"result, {before:.3f} GB/s on {last_good.get('time', 'an earlier run')} "
                    f"(rank_fabric_check_warn_drop_percent: {warn_drop_percent:g})."
                ),
            }
    return {"verdict": "pass", "figure": figure, "msg": f"The fabric {link} passes: {measured}."}


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def read_record(text: str | None) -> dict[str, Any]:
    """The head's record (``{}`` when there is none or it is unreadable: the check runs again)."""
    if not text:
        return {}
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) and record.get("version") == RECORD_VERSION else {}


def updated_record(
    record: dict[str, Any],
    *,
    result: dict[str, Any],
    report: dict[str, Any] | None,
    fingerprint: str,
    time: str,
) -> dict[str, Any]:
    """The record after this run: the last result always, the last good one on a pass."""
    entry = {
        "time": time,
        "verdict": result["verdict"],
        "msg": result["msg"],
        "figure": result["figure"],
        "fingerprint": fingerprint,
        "report": report,
    }
    new = {"version": RECORD_VERSION, "last": entry, "last_good": record.get("last_good")}
    if result["verdict"] == "pass":
        new["last_good"] = entry
    return new


def accepted(record: dict[str, Any], fingerprint: str) -> bool:
    """Whether the last result was for these settings and did not fail: no need to test again."""
    last = record.get("last") or {}
    return last.get("fingerprint") == fingerprint and last.get("verdict") in ("pass", "warn")
