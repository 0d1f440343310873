"""The deployment lock's file logic: create once, compare-and-swap take-over, release only one's own."""

from __future__ import annotations

import calendar
import errno
import json
import multiprocessing
import os
import stat
import time
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _lock
from ansible_collections.sparkserve.dsv41.plugins.module_utils._lock import (
    ABSENT,
    ACQUIRED,
    ALREADY_HELD,
    HELD_BY_OTHER,
    NOT_HELD,
    RELEASED,
    TAKEN_OVER,
    LockError,
    acquire,
    describe_holder,
    guard_path,
    lock_text,
    parse_lock,
    read_lock,
    release,
    token_of,
)

STARTED = float(calendar.timegm((2026, 12, 3, 4, 10, 0)))


def holder(token: str, **fields) -> dict:
    return {
        "controller": "box",
        "pid": 4242,
        "boot_id": "0f9a3c52-1d4e-4f0b-9d1c-3a7e8e5b2c61",
        "user": "alice",
        "playbook": "site.yml",
        "started": STARTED,
        "token": token,
        **fields,
    }


def listing(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``directory``: mode, mtime and content (what must not change)."""
    return {
        path.name: (path.stat().st_mode, path.stat().st_mtime_ns, path.read_bytes())
        for path in sorted(directory.iterdir())
    }


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    return state / "deployment.lock"


def stored(path: Path) -> dict:
    return json.loads(path.read_text())["holder"]


def test_acquire_on_empty_creates_the_lock_0600_and_nothing_else(lock):
    outcome = acquire(str(lock), holder("a" * 32))
    assert (outcome.status, outcome.changed, outcome.previous_holder) == (ACQUIRED, True, None)
    assert outcome.holder == stored(lock) == holder("a" * 32)
    assert lock.stat().st_mode & 0o777 == 0o600
    assert lock.read_text() == lock_text(holder("a" * 32)) == outcome.after
    assert outcome.before == ""
    # No temporary file left behind; the guard stays, empty.
    assert sorted(path.name for path in lock.parent.iterdir()) == [
        ".deployment.lock.guard",
        "deployment.lock",
    ]
    assert Path(guard_path(str(lock))).read_bytes() == b""


def test_taking_the_lock_stamps_the_guard_and_nothing_else_does(lock):
    guard = Path(guard_path(str(lock)))
    acquire(str(lock), holder("a" * 32))
    os.utime(guard, (1, 1))
    acquire(str(lock), holder("a" * 32))  # already held
    acquire(str(lock), holder("other"))  # held by another run
    release(str(lock), "other")  # not this run's
    release(str(lock), "a" * 32)
    assert guard.stat().st_mtime == 1, "only taking the lock says a run came"
    before = time.time()
    acquire(str(lock), holder("b" * 32))
    assert guard.stat().st_mtime >= before - 1
    os.utime(guard, (1, 1))
    acquire(str(lock), holder("c" * 32), take_over="b" * 32)
    assert guard.stat().st_mtime >= before - 1


def test_acquire_again_by_the_same_run_changes_nothing(lock):
    acquire(str(lock), holder("a" * 32))
    before = listing(lock.parent)
    outcome = acquire(str(lock), holder("a" * 32, started=STARTED + 60))
    assert (outcome.status, outcome.changed) == (ALREADY_HELD, False)
    assert outcome.holder["started"] == STARTED, "the lock keeps its own holder"
    assert listing(lock.parent) == before


def test_a_lock_held_by_another_run_is_left_alone(lock):
    acquire(str(lock), holder("other"))
    before = listing(lock.parent)
    outcome = acquire(str(lock), holder("mine"))
    assert (outcome.status, outcome.changed) == (HELD_BY_OTHER, False)
    assert outcome.previous_holder == outcome.holder == holder("other")
    assert listing(lock.parent) == before


def test_take_over_replaces_only_the_token_it_names(lock):
    acquire(str(lock), holder("stale"))
    before = listing(lock.parent)
    wrong = acquire(str(lock), holder("mine"), take_over="someone-else")
    assert (wrong.status, wrong.changed) == (HELD_BY_OTHER, False)
    assert listing(lock.parent) == before

    outcome = acquire(str(lock), holder("mine"), take_over="stale")
    assert (outcome.status, outcome.changed) == (TAKEN_OVER, True)
    assert outcome.previous_holder == holder("stale")
    assert stored(lock) == outcome.holder == holder("mine")
    assert lock.stat().st_mode & 0o777 == 0o600
    assert (outcome.before, outcome.after) == (lock_text(holder("stale")), lock_text(holder("mine")))


def test_take_over_of_a_lock_that_is_gone_just_takes_it(lock):
    outcome = acquire(str(lock), holder("mine"), take_over="stale")
    assert outcome.status == ACQUIRED
    assert stored(lock) == holder("mine")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "is not JSON"),
        (b"{not json", "is not JSON"),
        (b'["holder"]', 'has no {"holder": {"token": ...}}'),
        (b'{"holder": {"pid": 1}}', 'has no {"holder": {"token": ...}}'),
        (b'{"holder": {"token": ""}}', 'has no {"holder": {"token": ...}}'),
        (b"\xff\xfe", "is not JSON"),
    ],
)
def test_a_file_that_is_no_lock_of_ours_is_held_by_an_unknown_run(lock, content, why):
    lock.write_bytes(content)
    outcome = acquire(str(lock), holder("mine"))
    assert outcome.status == HELD_BY_OTHER
    assert outcome.previous_holder["token"] == ""
    assert outcome.previous_holder["unreadable"].startswith(why)
    assert describe_holder(outcome.previous_holder).startswith(f"an unknown run (the lock file {why}")
    assert lock.read_bytes() == content
    forced = acquire(str(lock), holder("mine"), take_over="")
    assert forced.status == TAKEN_OVER
    assert stored(lock) == holder("mine")


def test_release_removes_only_this_runs_lock(lock):
    acquire(str(lock), holder("other"))
    before = listing(lock.parent)
    outcome = release(str(lock), "mine")
    assert (outcome.status, outcome.changed, outcome.holder) == (NOT_HELD, False, holder("other"))
    assert listing(lock.parent) == before

    outcome = release(str(lock), "other")
    assert (outcome.status, outcome.changed, outcome.holder) == (RELEASED, True, None)
    assert outcome.previous_holder == holder("other")
    assert (outcome.before, outcome.after) == (lock_text(holder("other")), "")
    assert not lock.exists()


def test_release_without_a_lock_or_its_directory_is_nothing_to_do(lock, tmp_path):
    assert (release(str(lock), "mine").status, release(str(lock), "mine").changed) == (ABSENT, False)
    gone = tmp_path / "purged" / "deployment.lock"
    assert release(str(gone), "mine").status == ABSENT
    assert not gone.parent.exists(), "nothing is created to say so"


def test_acquire_creates_a_missing_directory_private(tmp_path):
    lock = tmp_path / "state" / "deeper" / "deployment.lock"
    outcome = acquire(str(lock), holder("mine"))
    assert (outcome.status, outcome.changed) == (ACQUIRED, True)
    assert lock.is_file()
    assert stat.S_IMODE(lock.parent.stat().st_mode) == 0o700


def test_acquire_leaves_an_existing_directory_as_it_is(lock):
    lock.parent.chmod(0o750)
    acquire(str(lock), holder("mine"))
    assert stat.S_IMODE(lock.parent.stat().st_mode) == 0o750


def test_acquire_refuses_a_file_where_the_directory_belongs(tmp_path):
    (tmp_path / "state").write_text("")
    with pytest.raises(LockError, match=r"the deployment lock is not a directory: .*/state$"):
        acquire(str(tmp_path / "state" / "deployment.lock"), holder("mine"))


def test_check_mode_changes_nothing_and_reports_what_would_happen(lock, tmp_path):
    empty = listing(lock.parent)
    would = acquire(str(lock), holder("mine"), check_mode=True)
    assert (would.status, would.changed, would.holder) == (ACQUIRED, True, holder("mine"))
    assert listing(lock.parent) == empty, "no lock, no guard file"

    first_run = tmp_path / "first-run" / "deployment.lock"
    assert acquire(str(first_run), holder("mine"), check_mode=True).status == ACQUIRED
    assert not first_run.parent.exists()

    acquire(str(lock), holder("stale"))
    before = listing(lock.parent)
    assert acquire(str(lock), holder("mine"), check_mode=True).status == HELD_BY_OTHER
    taken = acquire(str(lock), holder("mine"), take_over="stale", check_mode=True)
    assert (taken.status, taken.changed, taken.holder) == (TAKEN_OVER, True, holder("mine"))
    released = release(str(lock), "stale", check_mode=True)
    assert (released.status, released.changed) == (RELEASED, True)
    assert listing(lock.parent) == before


def test_without_hard_links_the_lock_is_created_exclusively(lock, monkeypatch):
    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(_lock.os, "link", no_link)
    assert acquire(str(lock), holder("mine")).status == ACQUIRED
    assert stored(lock) == holder("mine")
    assert lock.stat().st_mode & 0o777 == 0o600
    assert sorted(path.name for path in lock.parent.iterdir()) == [
        ".deployment.lock.guard",
        "deployment.lock",
    ]


def test_a_lock_made_behind_the_guards_back_is_not_overwritten(lock, monkeypatch):
    real_read = _lock.read_lock

    def read_then_someone_creates(path):
        found = real_read(path)
        if not Path(path).exists():
            Path(path).write_text(lock_text(holder("sneaky")))
        return found

    monkeypatch.setattr(_lock, "read_lock", read_then_someone_creates)
    outcome = acquire(str(lock), holder("mine"))
    assert (outcome.status, outcome.holder) == (HELD_BY_OTHER, holder("sneaky"))
    assert stored(lock) == holder("sneaky")


def _race(args: tuple[str, str, str | None, object]) -> str:
    path, token, take_over, barrier = args
    barrier.wait()
    return acquire(path, holder(token), take_over=take_over).status


def race(lock: Path, contenders: int, take_over: str | None) -> list[str]:
    context = multiprocessing.get_context("fork")
    with context.Manager() as manager:
        barrier = manager.Barrier(contenders)
        with context.Pool(contenders) as pool:
            work = [(str(lock), f"run-{index}", take_over, barrier) for index in range(contenders)]
            return pool.map(_race, work)


@pytest.mark.parametrize("round_", range(5))
def test_concurrent_acquires_from_many_processes_leave_exactly_one_holder(lock, round_):
    statuses = race(lock, 8, None)
    assert sorted(statuses) == [ACQUIRED] + [HELD_BY_OTHER] * 7, statuses
    assert stored(lock)["token"] == f"run-{statuses.index(ACQUIRED)}"


@pytest.mark.parametrize("round_", range(5))
def test_concurrent_take_overs_of_one_stale_lock_leave_exactly_one_holder(lock, round_):
    acquire(str(lock), holder("stale"))
    statuses = race(lock, 8, "stale")
    assert sorted(statuses) == [HELD_BY_OTHER] * 7 + [TAKEN_OVER], statuses
    assert stored(lock)["token"] == f"run-{statuses.index(TAKEN_OVER)}"


def test_the_holder_in_words():
    assert describe_holder(holder("t")) == (
        "ansible-playbook site.yml by alice on controller box (pid 4242) since 2026-12-03 04:10:00 UTC"
    )
    assert describe_holder({"token": "t"}) == (
        "ansible-playbook ? by ? on controller ? (pid ?) since an unknown time"
    )


def test_parse_and_read(lock):
    assert read_lock(str(lock)) == (None, "")
    assert parse_lock(lock_text(holder("t"))) == holder("t")
    assert token_of(None) == token_of({"token": 5}) == ""
    lock.write_text(lock_text(holder("t")))
    assert read_lock(str(lock)) == (holder("t"), lock_text(holder("t")))


def test_an_unreadable_lock_is_an_error_with_its_reason(lock):
    lock.mkdir()
    with pytest.raises(LockError, match=r"cannot read the deployment lock .*deployment.lock: Is a directory"):
        acquire(str(lock), holder("mine"))
    assert os.path.isdir(lock)
