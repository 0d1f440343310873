# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Adoption of a checkpoint already in place (the layout ``download.sh`` leaves: rebuilt shards,
no parts, no record of ours): the shards whose sha256 matches the manifest are recorded as
verified, so the download never fetches their parts; nothing is deleted, a mismatch is reported.

Internal to sparkserve.dsv41; not a public API. Stdlib only, Python 3.10+, no Ansible imports:
the ``checkpoint_shards`` module uses it, with the verification of ``_checkpoint``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._checkpoint import (
    DEFAULT_MANIFEST,
    Action,
    CheckpointError,
    Counters,
    Found,
    ManifestMissing,
    Outcome,
    Record,
    hash_file,
    is_trusted,
    load_state,
    mismatch_message,
    no_progress,
    plan_entry,
    plan_summary,
    read_manifest,
    run_in_pool,
    save_state,
    scan_checkpoint,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter, human_bytes

_ADOPTION_KINDS = {"trust": "trusted", "verify": "would_adopt", "skip": "skipped"}


def plan_adoption(
    manifest: dict[str, str], found: dict[str, Found], records: dict[str, Record]
) -> list[Action]:
    """Decide what adopting a directory prepared by another tool needs; pure, never raises.

    * a whole file whose record vouches for it -> ``trust``;
    * any other whole file -> ``verify`` (hashed, and recorded only when it matches);
    * no whole file (missing, or only its parts) -> ``skip``.

    Nothing is rebuilt, deleted or discarded: parts, stale temporary files, missing entries and
    mismatches are all left to the normal run.
    """
    actions: list[Action] = []
    for name, expected in manifest.items():
        item = found[name]
        if item.size is None:
            kind, size = "skip", 0
        elif is_trusted(records.get(name), item, expected):
            kind, size = "trust", 0
        else:
            kind, size = "verify", item.size
        actions.append(Action(name, item.path, expected, kind, size, parts=item.parts))
    return actions


def describe_adoption(actions: list[Action], model_dir: str, records: dict[str, Record]) -> dict[str, Any]:
    """The adoption report before anything is read: ``trusted``, ``skipped``, ``would_adopt``."""
    files = []
    for action in actions:
        entry = plan_entry(action, model_dir, _ADOPTION_KINDS[action.kind])
        if action.kind == "trust":
            entry["size"], entry["sha256"] = records[action.name].size, action.expected
        elif action.kind == "verify":
            entry["size"] = action.size
        files.append(entry)
    trusted = {a.name: records[a.name] for a in actions if a.kind == "trust"}
    return {**plan_summary(files, trusted), "adopted": [], "mismatched": []}


def _adopt_one(
    action: Action, model_dir: str, progress: ProgressWriter, chunk_size: int | None
) -> tuple[dict[str, Any], Record | None, str | None, str | None]:
    """Hash one whole file: ``(entry, record if it matches, actual sha256 if not, error)``."""
    started = time.monotonic()
    entry = plan_entry(action, model_dir, "adopted")
    counters = Counters()
    record = mismatch = error = None
    try:
        progress.update(phase="verifying", detail=action.name)
        actual = hash_file(action.path, counters, progress, chunk_size)
        info = os.stat(action.path)
        entry["size"] = info.st_size
        if actual == action.expected:
            record = Record(info.st_size, info.st_mtime_ns, actual)
            entry["sha256"] = actual
        else:
            entry["action"], mismatch = "mismatched", actual
    except OSError as exc:
        entry["action"] = "failed"
        error = f"{exc.filename or action.path}: {exc.strerror or exc}"
    entry["bytes_read"] = counters.bytes_read
    entry["seconds"] = round(time.monotonic() - started, 3)
    return entry, record, mismatch, error


def execute_adoption(
    actions: list[Action],
    model_dir: str,
    records: dict[str, Record],
    *,
    workers: int,
    progress: ProgressWriter | None = None,
    chunk_size: int | None = None,
) -> Outcome:
    """Hash the ``verify`` actions of an adoption plan in parallel; read nothing else.

    ``Outcome.records`` holds the trusted and the newly adopted records; a mismatch is not an
    error but an entry of ``report["mismatched"]`` (``{file, expected, actual}``).
    """
    progress = progress or no_progress()
    to_read = [a for a in actions if a.kind == "verify"]
    results = run_in_pool(to_read, workers, lambda a: _adopt_one(a, model_dir, progress, chunk_size))
    files = describe_adoption(actions, model_dir, records)["files"]
    good = {a.name: records[a.name] for a in actions if a.kind == "trust"}
    adopted: list[str] = []
    mismatched: list[dict[str, str]] = []
    errors: list[str] = []
    for index, action in enumerate(actions):
        if action.name not in results:
            continue
        files[index], record, actual, error = results[action.name]
        if record is not None:
            good[action.name] = record
            adopted.append(action.name)
        if actual is not None:
            mismatched.append({"file": action.name, "expected": action.expected, "actual": actual})
        if error is not None:
            errors.append(error)
    progress.finish(failed=bool(errors))
    report = {**plan_summary(files, good), "adopted": adopted, "mismatched": mismatched}
    return Outcome(report, good, errors)


def adopt_checkpoint(
    model_dir: str,
    state_file: str,
    manifest: str = DEFAULT_MANIFEST,
    *,
    check_mode: bool,
    workers: int,
    progress_file: str | None = None,
    chunk_size: int | None = None,
) -> tuple[dict[str, Any], list[str], list[str]]:
    """Record the whole files of a checkpoint another tool prepared: ``(report, warnings, errors)``.

    Only manifest entries present as whole files and not trusted yet are read; those that match
    are added to the state records, the others are reported (``mismatched``, and a warning) and
    their records dropped. Nothing else is written or deleted. Without a manifest (a fresh or
    missing directory) nothing is adopted. ``report["changed"]``: the state file was (in check
    mode: would be) written. Raises :class:`CheckpointError` for an unusable manifest.
    """
    try:
        entries = read_manifest(model_dir, manifest)
    except ManifestMissing:
        report = describe_adoption([], model_dir, {})
        report.update(changed=False, msg=f"no {manifest} in {model_dir} yet; nothing to adopt")
        return report, [], []
    found = scan_checkpoint(model_dir, entries)
    records, warning = load_state(state_file, model_dir)
    warnings = [warning] if warning else []
    actions = plan_adoption(entries, found, records)
    to_read = any(a.kind == "verify" for a in actions)
    if check_mode or not to_read:
        report = describe_adoption(actions, model_dir, records)
        report["changed"] = to_read
        return report, warnings, []
    progress = ProgressWriter(progress_file, "adoption", total=sum(a.size for a in actions))
    outcome = execute_adoption(
        actions, model_dir, records, workers=workers, progress=progress, chunk_size=chunk_size
    )
    report, errors = outcome.report, list(outcome.errors)
    by_name = {a.name: a for a in actions}
    for mismatch in report["mismatched"]:
        warnings.append(
            f"{mismatch_message(by_name[mismatch['file']], mismatch['actual'])} "
            "It was not adopted and nothing was deleted; a run without adopt fails on it until then."
        )
    dropped = {m["file"] for m in report["mismatched"]}
    updated = {name: rec for name, rec in records.items() if name not in dropped}
    updated.update({name: outcome.records[name] for name in report["adopted"]})
    changed = False
    if updated != records:
        try:
            changed = save_state(state_file, updated, model_dir)
        except CheckpointError as exc:
            errors.append(str(exc))
    report["changed"] = changed
    return report, warnings, errors


def adoption_message(report: dict[str, Any]) -> str:
    """One line about an adoption's result (``checkpoint_shards`` with ``adopt``)."""
    text = (
        f"{len(report['adopted'])} shards in place match the manifest and are recorded "
        f"({human_bytes(report['bytes_read'])} read): their parts are not downloaded."
    )
    if report["mismatched"]:
        names = ", ".join(entry["file"] for entry in report["mismatched"])
        text += f" Not recorded because they do not match the manifest (their parts are downloaded): {names}."
    return text
