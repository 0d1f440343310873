# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The deployment record: what serves now, what served before, and whether a run switches.

Internal to sparkserve.dsv41; not a public API. Stdlib only, pure (the ``deployment_release``
module reads and writes the file).

The record (``<state dir>/deployments.json`` on the head) is
``{"version": 1, "current": D, "previous": D, "last_failed": F}`` where a deployment ``D`` is
``{image, revision, recipe, time, smoke, downtime_seconds}`` and a failed switch ``F`` is
``{image, revision, recipe, time, reason}``; ``recipe`` is the name of the model recipe the
deployment served (``deployment_recipe_spec.name``). A run *switches* when the image, the
checkpoint revision or the recipe it deploys differs from ``current``; the smoke checks then gate
it, and a failure rolls back to ``current`` (which stays ``current``). A switch that passes makes
the old ``current`` the new ``previous``: the deployment to roll back to on demand.

A deployment runs with its recipe's serving arguments and model directory, and a run has only its
own recipe's: a rollback to a deployment of another recipe would start its image and revision with
the wrong ones, a deployment that never existed. So a rollback on demand to a ``previous`` of
another recipe is refused (:func:`plan` raises, naming the run that goes back), and a switch away
from a ``current`` of another recipe does not roll back by itself when it fails (the plan's
``no_rollback`` says why, and what to run to go back).

Entries written before the record named recipes have no ``recipe``: they are taken as
:data:`LEGACY_RECIPE`, ``deepseek-v4.1-flash``, the only model the collection served then. (Not
``_recipe.DEFAULT_RECIPE``: that is today's default and may change; what old records served does
not.) A run of that recipe therefore sees no change in them; a run of another recipe sees a switch,
and refuses to roll back to them.
"""

from __future__ import annotations

import json
import time
from typing import Any

RECORD_VERSION = 1
# The recipe of an entry recorded before entries named theirs: the only model served then.
LEGACY_RECIPE = "deepseek-v4.1-flash"
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


def recipe_of(entry: dict[str, Any]) -> str:
    """The recipe ``entry`` served (:data:`LEGACY_RECIPE` for an entry recorded before recipes)."""
    return entry.get("recipe") or LEGACY_RECIPE


def same(entry: dict[str, Any] | None, image: str, revision: str, recipe: str = LEGACY_RECIPE) -> bool:
    return (
        entry is not None
        and entry.get("image") == image
        and entry.get("revision", "") == revision
        and recipe_of(entry) == recipe
    )


def short_image(image: str) -> str:
    """``repo@sha256:0123456789ab`` (the digest's first 12 hex digits, as ``docker images`` shows)."""
    name, _sep, digest = image.partition("@")
    return f"{name}@{digest[:19]}" if digest.startswith("sha256:") else image


def describe(entry: dict[str, Any] | None) -> str:
    """One deployment in words, for a play's output and status.yml."""
    if entry is None:
        return "none recorded"
    words = short_image(entry["image"])
    if entry.get("recipe"):
        words += f", recipe {entry['recipe']}"
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


def go_back_command(entry: dict[str, Any]) -> str:
    """The run that deploys ``entry`` again, with its own recipe, image and checkpoint revision."""
    command = f"ansible-playbook site.yml -e deployment_recipe={recipe_of(entry)}"
    command += f" -e deployment_image={entry['image']}"
    if entry.get("revision"):
        command += f" -e checkpoint_revision={entry['revision']}"
    return command


def plan(
    record: dict[str, Any],
    image: str,
    revision: str | None,
    *,
    recipe: str = LEGACY_RECIPE,
    rollback: bool = False,
) -> dict[str, Any]:
    """What this run deploys: ``{action, target: {image, revision, recipe}, current, previous,
    no_rollback, msg}``.

    ``revision`` ``None``: the one that serves now (a run that does not fetch the checkpoint).
    ``recipe``: the recipe this run serves; its ranks have that recipe's arguments and model
    directory, so they can deploy only a recorded deployment of the same recipe. A rollback on demand
    to a previous deployment of another recipe raises :class:`ReleaseError`, naming the run that goes
    back. ``no_rollback``: ``None``, or (``current`` served another recipe) why a failed switch does
    not roll back by itself, with the command that brings ``current`` back.
    """
    current, previous = record["current"], record["previous"]
    if revision is None:
        if current is not None and recipe_of(current) != recipe and not rollback:
            raise ReleaseError(
                f"this run serves recipe {recipe} and {describe(current)} serves recipe"
                f" {recipe_of(current)}: a change of recipe needs its own checkpoint, which this run does"
                " not fetch (run site.yml without --tags, or with the checkpoint tag)"
            )
        revision = current.get("revision", "") if current is not None else ""
    no_rollback = across = None
    if current is not None and recipe_of(current) != recipe:
        no_rollback = (
            f"No automatic rollback across recipes: {short_image(current['image'])} served recipe"
            f" {recipe_of(current)}, and this run has the serving arguments and model directory of recipe"
            f" {recipe}. To go back to it, run {go_back_command(current)}"
        )
        across = (
            f" does not roll back by itself (the current deployment served recipe {recipe_of(current)},"
            f" this run serves {recipe})"
        )
    if rollback:
        if previous is None:
            raise ReleaseError(
                "no previous deployment is recorded to roll back to (a switch that passed its smoke"
                f" checks records one); the current one is {describe(current)}"
            )
        if recipe_of(previous) != recipe:
            raise ReleaseError(
                f"the previous deployment, {short_image(previous['image'])}, served recipe"
                f" {recipe_of(previous)} and this run serves recipe {recipe}: its ranks would start with"
                f" the serving arguments and model directory of {recipe}. To go back to it, run rollback.yml"
                f" -e deployment_recipe={recipe_of(previous)} (with the inventory settings it was deployed"
                " with)"
            )
        target = {"image": previous["image"], "revision": previous.get("revision", ""), "recipe": recipe}
        action = "rollback"
        msg = f"rolling back from {describe(current)} to {describe(previous)}"
        if across:
            msg += f"; a failure{across}"
    else:
        target = {"image": image, "revision": revision, "recipe": recipe}
        if current is None:
            action, msg = "first", f"first recorded deployment: {describe(target)}"
        elif same(current, image, revision, recipe) and stranded(record) is not None:
            # The ranks run what a failed switch across recipes left: going back is a switch too.
            action = "switch"
            msg = (
                f"the ranks run {describe(stranded(record))}, left by its failed switch; switching back to"
                f" {describe(current)}; the smoke checks gate it"
            )
        elif same(current, image, revision, recipe):
            action, msg = "none", f"serving {describe(current)}; nothing to switch"
        else:
            action = "switch"
            msg = f"switching from {describe(current)} to {describe(target)}; the smoke checks gate it and a"
            msg += f" failure{across or ' rolls back'}"
    return {
        "action": action,
        "target": target,
        "current": current,
        "previous": previous,
        "no_rollback": no_rollback,
        "msg": msg,
    }


def stranded(record: dict[str, Any]) -> dict[str, Any] | None:
    """The failed switch whose ranks still run (it was across recipes, so nothing rolled it back),
    until a deployment passes its smoke checks again; None when the ranks run ``current``."""
    entry = record["last_failed"]
    return entry if entry is not None and entry.get("left_serving") else None


def committed(
    record: dict[str, Any],
    target: dict[str, Any],
    *,
    smoke: str,
    downtime_seconds: float | None,
    now: float,
    host_stack: dict[str, Any] | None = None,
    image_versions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record once ``target`` (``{image, revision, recipe}``) serves and passed its smoke checks,
    with each node's host stack (kernel, driver, NIC firmware) when given: what status.yml compares
    the nodes with later; and the image's torch, CUDA and NCCL versions (as the fabric test read
    them in it) when given. Committing what is current already changes nothing (a re-run)."""
    current = record["current"]
    if stranded(record) is not None:  # the ranks run what passed now, not what the failure left
        record = {
            **record,
            "last_failed": {k: v for k, v in record["last_failed"].items() if k != "left_serving"},
        }
    if same(current, target["image"], target.get("revision", ""), recipe_of(target)):
        return record
    entry = {
        "image": target["image"],
        "revision": target.get("revision", ""),
        "recipe": recipe_of(target),
        "time": now,
        "smoke": smoke,
        "downtime_seconds": downtime_seconds,
    }
    if host_stack:
        entry["host_stack"] = host_stack
    if image_versions:
        entry["image_versions"] = image_versions
    return {**record, "current": entry, "previous": current if current is not None else record["previous"]}


def failed(
    record: dict[str, Any], target: dict[str, Any], *, reason: str, now: float, left_serving: bool = False
) -> dict[str, Any]:
    """The record once a switch to ``target`` failed: ``current`` serves again, unless the switch was
    across recipes (``left_serving``: its ranks still run, see :func:`stranded`)."""
    entry = {
        "image": target["image"],
        "revision": target.get("revision", ""),
        "recipe": recipe_of(target),
        "time": now,
        "reason": reason,
    }
    if left_serving:
        entry["left_serving"] = True
    return {**record, "last_failed": entry}
