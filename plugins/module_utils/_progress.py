# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The progress of the collection's background jobs, and the one way to wait for them.

Internal to sparkserve.dsv41; not a public API. Stdlib only (with ``_file_helpers``), no Ansible
import: the modules on the nodes (``checkpoint_shards``, ``checkpoint_download``,
``checkpoint_copy``, ``job_wait``) and the bench program on the controller use it.

A long job (``async``, ``poll: 0``) writes one JSON document to its progress file, replaced
atomically, at most every :data:`PROGRESS_INTERVAL` seconds unless forced::

    {"what": "download", "phase": "downloading", "unit": "bytes", "done": 1073741824,
     "total": 4294967296, "started": 1767225600.0, "updated": 1767225660.5,
     "detail": "250.0 GiB of 462.0 GiB already there"}

``what``
    what the job is; ``phase`` what it does now, ``done`` or ``failed`` at the end;
``unit``
    what ``done`` and ``total`` count: ``bytes``, or a plural noun (``measurements``);
``done``, ``total``
    the work of this job so far and in all (``total`` is null while unknown). Work found done
    when the job started (files already downloaded) is not counted, so ``done`` over the time
    since ``started`` is the job's rate;
``started``, ``updated``
    seconds since the epoch;
``detail``
    one short human text: the file at hand, the last measurement.

The ``job_wait`` action (``plugins/action/job_wait.py``) runs the ``job_wait`` module once per poll:
it polls the job's Ansible results file with :func:`wait_for_job` and the action shows its
:func:`progress_line`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    dump_json,
    load_json_object,
    read_text,
    write_atomically,
)

PROGRESS_INTERVAL = 2.0
# How often a wait looks at the job's results file (a small local file): a quick job costs no more.
JOB_CHECK_INTERVAL = 0.2
FIELDS = ("what", "phase", "unit", "done", "total", "started", "updated", "detail")
# The fields a writer's update may set; the others are the writer's own.
_SETTABLE = frozenset({"phase", "done", "total", "detail"})
# The last lines of an error that a failure message carries.
ERROR_CHARS = 2000


# --------------------------------------------------------------------------- the document


def new_document(
    what: str, unit: str = "bytes", total: float | None = None, now: float | None = None
) -> dict:
    """A document of a job that starts now: phase ``starting``, nothing done."""
    now = round(time.time() if now is None else now, 3)
    return {
        "what": what,
        "phase": "starting",
        "unit": unit,
        "done": 0,
        "total": total,
        "started": now,
        "updated": now,
        "detail": None,
    }


def read_progress(path: str | None) -> dict[str, Any] | None:
    """The progress document in ``path``; ``None`` when there is none (yet) or it is unreadable.

    Progress is a courtesy: a missing or damaged file only costs the numbers of one line.
    """
    if not path:
        return None
    try:
        text = read_text(path, lenient=True)
        return None if text is None else load_json_object(path, text)
    except (OSError, FileContentError):
        return None


class ProgressWriter:
    """Keeps a job's progress document and writes it to ``path`` (``None``: keeps it only).

    Thread-safe: worker threads may :meth:`update` it at once. Writes at most every ``interval``
    seconds (``force`` always writes); a failed write is ignored, progress never fails a job.
    """

    def __init__(
        self,
        path: str | None,
        what: str,
        unit: str = "bytes",
        total: float | None = None,
        *,
        clock: Callable[[], float] = time.time,
        interval: float = PROGRESS_INTERVAL,
    ) -> None:
        self.path = path
        self.clock = clock
        self.interval = interval
        self.lock = threading.Lock()
        self.document = new_document(what, unit, total, now=clock())
        self.last_write: float | None = None

    def update(self, *, advance: float = 0, force: bool = False, **fields: Any) -> bool:
        """Set ``fields`` (``phase``, ``done``, ``total``, ``detail``), add ``advance`` to ``done``,
        and write the document when it is due. True when it was written."""
        unknown = set(fields) - _SETTABLE
        if unknown:
            raise TypeError(f"not a progress field: {', '.join(sorted(unknown))}")
        with self.lock:
            self.document.update(fields)
            if advance:
                self.document["done"] += advance
            now = self.clock()
            due = self.last_write is None or now - self.last_write >= self.interval
            if self.path is None or not (force or due):
                return False
            self.last_write = now
            self.document["updated"] = round(now, 3)
            data = dump_json(self.document).encode()
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            write_atomically(None, self.path, data, 0o644)
        except OSError:
            return False
        return True

    def finish(self, failed: bool = False, **fields: Any) -> bool:
        """The last write: phase ``done`` (or ``failed``)."""
        return self.update(force=True, phase="failed" if failed else "done", **fields)


# --------------------------------------------------------------------------- one line of it


def human_bytes(count: float | None) -> str:
    """``1536`` -> ``1.5 KiB``: binary units, one decimal (bytes without)."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def human_seconds(seconds: float) -> str:
    """``61`` -> ``1m01s``, ``7322`` -> ``2h02m``."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: float) -> str:
    return f"{value:g}"


def progress_line(doc: dict[str, Any] | None, finished: bool, now: float) -> str:
    """One human line from a progress document (``None``: none written yet).

    ``<what>: <phase>, <done> of <total>, <percent>, <rate>, <detail>, after <time>``, each part
    only when known; ``finished`` (the job's results file says so) wins over the document's phase,
    which a killed job never got to update. A rate is shown for bytes only.
    """
    doc = doc or {}
    what = doc.get("what") or "job"
    phase = "finished" if finished else str(doc.get("phase") or "starting")
    unit = str(doc.get("unit") or "bytes")
    done, total = doc.get("done"), doc.get("total")
    started, updated = doc.get("started"), doc.get("updated")
    parts = []
    if _number(done):
        known_total = _number(total)
        if unit == "bytes":
            parts.append(human_bytes(done) + (f" of {human_bytes(total)}" if known_total else ""))
        else:
            parts.append(
                f"{_count(done)} of {_count(total)} {unit}" if known_total else f"{_count(done)} {unit}"
            )
        if known_total and total > 0:
            parts.append(f"{100.0 * done / total:.1f}%")
        if unit == "bytes" and _number(started) and done > 0:
            span = (updated if _number(updated) else now) - started
            if span > 0:
                parts.append(f"{human_bytes(done / span)}/s")
    if doc.get("detail"):
        parts.append(str(doc["detail"]))
    if _number(started):
        parts.append(f"after {human_seconds(now - started)}")
    return f"{what}: {phase}" + "".join(f", {part}" for part in parts)


# --------------------------------------------------------------------------- waiting for a job


def read_job(results_file: str) -> tuple[dict[str, Any] | None, bool]:
    """The content of an Ansible async job's results file (``None`` while it is not readable JSON)
    and whether the file is there. Other ``OSError``s propagate: another user's job (``become``)."""
    text = read_text(results_file, lenient=True)
    if text is None:
        return None, False
    try:
        return load_json_object(results_file, text), True
    except FileContentError:
        return None, True


def job_error(data: dict[str, Any]) -> str:
    """What went wrong, from a failed job's result: a module's ``msg``, a command's last line of
    ``stderr`` (its own message, after any progress it printed there), else its exit code."""
    msg = str(data.get("msg") or "").strip()
    stderr = str(data.get("stderr") or data.get("module_stderr") or "").strip()
    if stderr and (not msg or msg == "non-zero return code" or msg.startswith("MODULE FAILURE")):
        return stderr.splitlines()[-1][-ERROR_CHARS:]
    if msg:
        return msg[-ERROR_CHARS:]
    return f"exit code {data.get('rc')}"


def job_outcome(data: dict[str, Any] | None) -> dict[str, Any]:
    """``{finished, job_failed, error}`` of an Ansible async job from its results file's content.

    The async wrapper writes ``{"started": true, "finished": false, ...}`` when it starts the job
    and replaces it with the module's result (no ``started``) when the job ends, or with
    ``{"failed": true, "msg": "Timeout exceeded"}`` when it kills the job at its timeout:
    ``finished`` is decided as ``async_status`` decides it.
    """
    if data is None or ("started" in data and not data.get("finished")):
        return {"finished": False, "job_failed": False, "error": ""}
    rc = data.get("rc")
    failed = bool(data.get("failed")) or (_number(rc) and rc != 0)
    return {"finished": True, "job_failed": failed, "error": job_error(data) if failed else ""}


# Keys the async wrapper adds to a job's own result.
_ASYNC_KEYS = frozenset(
    {"ansible_job_id", "results_file", "started", "finished", "invocation", "_ansible_suppress_tmpdir_delete"}
)


def job_result(data: dict[str, Any] | None) -> dict[str, Any]:
    """The job's own result (what its module or command returned), without the async bookkeeping."""
    return {key: value for key, value in (data or {}).items() if key not in _ASYNC_KEYS}


def current_progress(progress_file: str | None, results_file: str, finished: bool) -> dict[str, Any] | None:
    """The job's progress document, unless it is an earlier job's.

    A job writes its first document a moment after it is launched; until then the file may still
    hold the last run's (``done``, 100 %). The results file is written at launch, so a running
    job's document that started before it is stale. (A finished job rewrote its results file.)
    """
    doc = read_progress(progress_file)
    if doc is None or finished:
        return doc
    try:
        launched = os.stat(results_file).st_mtime
    except OSError:
        return doc
    started = doc.get("started")
    return None if _number(started) and started < launched - 1 else doc


def wait_for_job(
    results_file: str,
    progress_file: str | None,
    seconds: float,
    what: str | None = None,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Wait up to ``seconds`` for the job to finish: ``{finished, job_failed, error, line, result}``.

    Returns as soon as the results file says the job is done; ``line`` is the job's progress at
    that moment, labelled ``what`` (else the document's own ``what``), marked when it failed,
    ``result`` the job's own result once it finished (else ``{}``), and ``results_file_found``
    whether the results file was there at the last look.
    """
    deadline = clock() + seconds
    while True:
        data, found = read_job(results_file)
        outcome = job_outcome(data)
        remaining = deadline - clock()
        if outcome["finished"] or remaining <= 0:
            break
        sleep(min(JOB_CHECK_INTERVAL, remaining))
    doc = current_progress(progress_file, results_file, outcome["finished"]) or {}
    if what:
        doc = {**doc, "what": what}
    line = progress_line(doc, outcome["finished"], clock())
    if outcome["job_failed"]:
        line += " (failed)"
    return {
        **outcome,
        "line": line,
        "result": job_result(data) if outcome["finished"] else {},
        "results_file_found": found,
    }
