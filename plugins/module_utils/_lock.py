# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The deployment lock: one file on the head naming the ansible-playbook run that is deploying.

The file (``<state dir>/deployment.lock``, mode 0600) holds ``{"holder": {"controller", "pid",
"boot_id", "user", "playbook", "started", "token"}}``; the token identifies the run. While it
exists a second run stops, and the head's supervisor leaves the ranks alone.

- It appears complete or not at all: it is written to a temporary file and hard-linked to its name,
  which fails when the name exists (``O_EXCL`` on a filesystem without hard links), so it is never
  created twice and a reader never sees half of it.
- Every change (create, take over, remove) is made under an exclusive ``flock`` of a guard file
  beside it (``.deployment.lock.guard``, empty and kept; its mtime is when a run last took the
  lock, which the head's supervisor reads): reading the lock, comparing its token and
  changing it is one step, so a take-over replaces the lock only while it still holds the token the
  caller judged stale (compare-and-swap), and a release removes only the caller's own lock.
- Whether a holder is stale is not decided here: that needs the controller (its processes, its boot
  id), so the ``deployment_lock`` action decides and asks for a take-over by token.

Internal to sparkserve.dsv41; not a public API. Stdlib only: it runs on the head.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

LOCK_MODE = 0o600
# How long a module waits for another module run to finish changing the lock (microseconds of work).
GUARD_TIMEOUT_SECONDS = 10.0
GUARD_POLL_SECONDS = 0.05
# os.link fails with these where the filesystem has no hard links.
NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}

# What acquire() and release() did (or, in check mode, would do).
ACQUIRED = "acquired"  # there was no lock; now this run holds it
ALREADY_HELD = "already_held"  # this run held it already
TAKEN_OVER = "taken_over"  # the stale holder named by take_over was replaced by this run
HELD_BY_OTHER = "held_by_other"  # another run holds it; nothing changed
RELEASED = "released"  # this run's lock was removed
NOT_HELD = "not_held"  # another run holds it (it was taken over): left alone
ABSENT = "absent"  # there is no lock to release


class LockError(Exception):
    """The lock cannot be read or changed; the message says why, for the user."""


@dataclass(frozen=True)
class LockOutcome:
    """What a lock operation found and did: the holders before and after and the file's texts ("" absent)."""

    status: str
    changed: bool
    previous_holder: dict[str, Any] | None
    holder: dict[str, Any] | None
    before: str
    after: str


# --------------------------------------------------------------------------- the document


def token_of(holder: dict[str, Any] | None) -> str:
    """The token of ``holder``; "" for no holder or an unreadable lock."""
    if not holder:
        return ""
    token = holder.get("token")
    return token if isinstance(token, str) else ""


def lock_text(holder: dict[str, Any]) -> str:
    """The lock file's content for ``holder``."""
    return json.dumps({"holder": holder}, indent=2, sort_keys=True) + "\n"


def parse_lock(text: str) -> dict[str, Any]:
    """The holder in a lock file's ``text``.

    A file that is not a lock this collection wrote gives ``{"token": "", "unreadable": <why>}``:
    it is held by an unknown run, which only a forced take-over (token "") replaces.
    """
    try:
        document = json.loads(text)
    except ValueError as err:
        return {"token": "", "unreadable": f"is not JSON ({err})"}
    holder = document.get("holder") if isinstance(document, dict) else None
    if not isinstance(holder, dict) or not token_of(holder):
        return {"token": "", "unreadable": 'has no {"holder": {"token": ...}}'}
    return holder


def read_lock(path: str) -> tuple[dict[str, Any] | None, str]:
    """``(holder, text)`` of the lock at ``path``; ``(None, "")`` when there is none."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None, ""
    except OSError as err:
        raise LockError(f"cannot read the deployment lock {path}: {err.strerror}") from err
    text = data.decode("utf-8", errors="replace")
    return parse_lock(text), text


def describe_holder(holder: dict[str, Any]) -> str:
    """The holder in words: ``ansible-playbook site.yml by alice on controller box (pid 4242) since <t>``."""
    if holder.get("unreadable"):
        return f"an unknown run (the lock file {holder['unreadable']})"
    started = holder.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if isinstance(started, (int, float)) and not isinstance(started, bool)
        else "an unknown time"
    )
    return (
        f"ansible-playbook {holder.get('playbook') or '?'} by {holder.get('user') or '?'} on controller "
        f"{holder.get('controller') or '?'} (pid {holder.get('pid', '?')}) since {when}"
    )


# --------------------------------------------------------------------------- acquire and release


def acquire(
    path: str, holder: dict[str, Any], *, take_over: str | None = None, check_mode: bool = False
) -> LockOutcome:
    """Take the lock at ``path`` for ``holder`` (its ``token`` identifies the run).

    Free: created. Held by ``holder``'s token: left as it is. Held by the token ``take_over``:
    replaced (compare-and-swap: only while it still holds that token). Held by anyone else:
    nothing changes and the status is ``held_by_other``. Check mode reads and changes nothing.
    """
    text = lock_text(holder)
    if check_mode:
        return _plan_acquire(*read_lock(path), holder, text, take_over)
    _ensure_directory(path)
    with _guarded(path):
        outcome = _plan_acquire(*read_lock(path), holder, text, take_over)
        if outcome.status == ACQUIRED:
            try:
                _create(path, text)
            except FileExistsError:
                # Created by something that does not take the guard (a hand-made lock): it is held.
                return _plan_acquire(*read_lock(path), holder, text, None)
        elif outcome.status == TAKEN_OVER:
            _replace(path, text)
        if outcome.changed:
            # The guard stays when the lock goes: its mtime tells the supervisor that a run came,
            # however short (a supervisor that gave up waits for one).
            os.utime(guard_path(path))
    return outcome


def _plan_acquire(
    current: dict[str, Any] | None, before: str, holder: dict[str, Any], text: str, take_over: str | None
) -> LockOutcome:
    if current is None:
        return LockOutcome(ACQUIRED, True, None, holder, "", text)
    if token_of(current) == token_of(holder):
        return LockOutcome(ALREADY_HELD, False, current, current, before, before)
    if take_over is not None and token_of(current) == take_over:
        return LockOutcome(TAKEN_OVER, True, current, holder, before, text)
    return LockOutcome(HELD_BY_OTHER, False, current, current, before, before)


def release(path: str, token: str, *, check_mode: bool = False) -> LockOutcome:
    """Remove the lock at ``path`` when it holds ``token``; another run's lock is left alone."""
    if check_mode or not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        # A missing directory (the state was purged) holds no lock; reading it says so.
        return _plan_release(*read_lock(path), token)
    with _guarded(path):
        outcome = _plan_release(*read_lock(path), token)
        if outcome.status == RELEASED:
            os.unlink(path)
    return outcome


def _plan_release(current: dict[str, Any] | None, before: str, token: str) -> LockOutcome:
    if current is None:
        return LockOutcome(ABSENT, False, None, None, "", "")
    if token_of(current) == token:
        return LockOutcome(RELEASED, True, current, None, before, "")
    return LockOutcome(NOT_HELD, False, current, current, before, before)


# --------------------------------------------------------------------------- the file


def guard_path(path: str) -> str:
    """The guard file whose ``flock`` serialises changes to the lock at ``path``."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.guard")


def _ensure_directory(path: str) -> None:
    """Create the lock's directory (0700, private like the state it holds) when it is missing."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(directory):
        return
    try:
        os.makedirs(directory, mode=0o700)
    except FileExistsError:
        if not os.path.isdir(directory):
            raise LockError(f"the directory of the deployment lock is not a directory: {directory}") from None
        return
    except OSError as err:
        raise LockError(
            f"cannot create the directory of the deployment lock {directory}: {err.strerror}"
        ) from err
    # makedirs' mode passes through the umask; the state directory is 0700 whatever it is.
    os.chmod(directory, 0o700)


@contextmanager
def _guarded(path: str) -> Iterator[None]:
    """Hold the exclusive ``flock`` of the guard file while the block runs."""
    guard = guard_path(path)
    try:
        fd = os.open(guard, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_MODE)
    except OSError as err:
        raise LockError(f"cannot open the lock's guard file {guard}: {err.strerror}") from err
    try:
        deadline = time.monotonic() + GUARD_TIMEOUT_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockError(
                        f"another run kept {guard} locked for {GUARD_TIMEOUT_SECONDS:g} seconds; try again"
                    ) from None
                time.sleep(GUARD_POLL_SECONDS)
            except OSError as err:
                raise LockError(f"cannot lock {guard} (flock): {err.strerror}") from err
        yield
    finally:
        os.close(fd)  # releases the flock


def _write_temporary(path: str, text: str) -> str:
    """A complete, synced copy of ``text`` beside ``path`` (mode 0600); the caller moves or removes it."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        os.unlink(tmp_path)
        raise
    return tmp_path


def _create(path: str, text: str) -> None:
    """Create the lock with ``text``; ``FileExistsError`` when there is one (it is never replaced here)."""
    tmp_path = _write_temporary(path, text)
    try:
        os.link(tmp_path, path)
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno not in NO_HARD_LINKS:
            raise
        _create_exclusive(path, text)
    finally:
        os.unlink(tmp_path)


def _create_exclusive(path: str, text: str) -> None:
    """``O_EXCL`` creation, where the filesystem has no hard links."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, LOCK_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _replace(path: str, text: str) -> None:
    """Replace the lock with ``text`` in one rename: a reader sees the old holder or the new one."""
    tmp_path = _write_temporary(path, text)
    try:
        os.replace(tmp_path, path)
    except OSError:
        os.unlink(tmp_path)
        raise
