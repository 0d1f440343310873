# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The deployment record: what serves now, what served before, and whether a run switches.

Internal to sparkserve.dsv41; not a public API. Stdlib only, pure (the ``deployment_release``
module reads and writes the file).

The record (``<state dir>/deployments.json`` on the head) is
``{"version": 1, "current": D, "previous": D, "last_failed": F}`` where a deployment ``D`` is
``{image, revision, time, smoke, downtime_seconds}`` and a failed switch ``F`` is
``{image, revision, time, reason}``. A run *switches* when the image or the checkpoint revision it
deploys differs from ``current``; the smoke checks then gate it, and a failure rolls back to
``current`` (which stays ``current``). A switch that passes makes the old ``current`` the new
``previous``: the deployment to roll back to on demand.
"""

from __future__ import annotations

import json
import time
from typing import Any

RECORD_VERSION = 1
# What a run plans: the first deployment this record sees, nothing to switch, a switch to what
# the inventory asks, a rollback (on demand) to the previous deployment.
ACTIONS = ("first", "none", "switch", "rollback")


class ReleaseError(ValueError):
    """The record cannot be read, or cannot give what was asked (a rollback with no previous)."""


def empty_record() -> dict[str, Any]:
    return {"version": RECORD_VERSION, "current": None, "previous": None, "last_failed": None}


def parse_record(text: str | None, path: str) -> dict[str, Any]:
    """The record in ``text`` (``None``: no file yet, an empty record)."""
    if text is None or not text.strip():
        return empty_record()
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ReleaseError(f"{path} is not JSON ({exc}); move it away to start a new record") from exc
    if not isinstance(document, dict) or document.get("version") != RECORD_VERSION:
        raise ReleaseError(
            f"{path} is not a version {RECORD_VERSION} deployment record; move it away to start a new record"
        )
    record = empty_record()
    for key in ("current", "previous", "last_failed"):
        entry = document.get(key)
        if entry is not None and not (isinstance(entry, dict) and isinstance(entry.get("image"), str)):
            raise ReleaseError(f"{path}: {key} is not a deployment (an object with an image)")
        record[key] = entry
    return record


def record_text(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def same(entry: dict[str, Any] | None, image: str, revision: str) -> bool:
    return entry is not None and entry.get("image") == image and entry.get("revision", "") == revision


def short_image(image: str) -> str:
    """``repo@sha256:0123456789ab`` (the digest's first 12 hex digits, as ``docker images`` shows)."""
    name, _sep, digest = image.partition("@")
    return f"{name}@{digest[:19]}" if digest.startswith("sha256:") else image


def describe(entry: dict[str, Any] | None) -> str:
    """One deployment in words, for a play's output and status.yml."""
    if entry is None:
        return "none recorded"
    words = short_image(entry["image"])
    if entry.get("revision"):
        words += f", revision {entry['revision']}"
    if isinstance(entry.get("time"), (int, float)):
        words += f", since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(entry['time']))}"
    if entry.get("smoke"):
        words += f", smoke {entry['smoke']}"
    if isinstance(entry.get("downtime_seconds"), (int, float)):
        words += f", switched in {entry['downtime_seconds']:.1f} s"
    if entry.get("reason"):
        words += f": {entry['reason']}"
    return words


def plan(
    record: dict[str, Any], image: str, revision: str | None, *, rollback: bool = False
) -> dict[str, Any]:
    """What this run deploys: ``{action, target: {image, revision}, current, previous, msg}``.

    ``revision`` ``None``: the one that serves now (a run that does not fetch the checkpoint).
    """
    current, previous = record["current"], record["previous"]
    if revision is None:
        revision = current.get("revision", "") if current is not None else ""
    if rollback:
        if previous is None:
            raise ReleaseError(
                "no previous deployment is recorded to roll back to (a switch that passed its smoke"
                f" checks records one); the current one is {describe(current)}"
            )
        target = {"image": previous["image"], "revision": previous.get("revision", "")}
        action = "rollback"
        msg = f"rolling back from {describe(current)} to {describe(previous)}"
    else:
        target = {"image": image, "revision": revision}
        if current is None:
            action, msg = "first", f"first recorded deployment: {describe(target)}"
        elif same(current, image, revision):
            action, msg = "none", f"serving {describe(current)}; nothing to switch"
        else:
            action = "switch"
            msg = (
                f"switching from {describe(current)} to {describe(target)}; the smoke checks gate it and a"
                " failure rolls back"
            )
    return {"action": action, "target": target, "current": current, "previous": previous, "msg": msg}


def committed(
    record: dict[str, Any],
    target: dict[str, Any],
    *,
    smoke: str,
    downtime_seconds: float | None,
    now: float,
) -> dict[str, Any]:
    """The record once ``target`` serves and passed its smoke checks. Committing what is current
    already changes nothing (a re-run)."""
    current = record["current"]
    if same(current, target["image"], target.get("revision", "")):
        return record
    entry = {
        "image": target["image"],
        "revision": target.get("revision", ""),
        "time": now,
        "smoke": smoke,
        "downtime_seconds": downtime_seconds,
    }
    return {**record, "current": entry, "previous": current if current is not None else record["previous"]}


def failed(record: dict[str, Any], target: dict[str, Any], *, reason: str, now: float) -> dict[str, Any]:
    """The record once a switch to ``target`` failed (``current`` serves again)."""
    entry = {"image": target["image"], "revision": target.get("revision", ""), "time": now, "reason": reason}
    return {**record, "last_failed": entry}
