"""sparkserve.dsv41.deployment_lock run in-process: take, keep, refuse, take over, give back, check mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._lock import lock_text
from ansible_collections.sparkserve.dsv41.plugins.modules import deployment_lock
from dir_snapshot import snapshot


def holder(token: str, **fields) -> dict:
    return {
        "controller": "box",
        "pid": 4242,
        "boot_id": "0f9a3c52-1d4e-4f0b-9d1c-3a7e8e5b2c61",
        "user": "alice",
        "playbook": "site.yml",
        "started": 1796271000.0,
        "token": token,
        **fields,
    }


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    state = tmp_path / ".dsv41-two-sparks"
    state.mkdir(mode=0o700)
    return state / "deployment.lock"


def take(run_module, lock: Path, token: str, check_mode: bool = False, diff: bool = False, **args):
    return run_module(
        deployment_lock,
        {"path": str(lock), "holder": holder(token), **args},
        check_mode=check_mode,
        diff=diff,
    )


def test_takes_the_lock_and_keeps_it(run_module, lock):
    first = take(run_module, lock, "mine", diff=True)
    assert not first.failed, first
    assert (first["changed"], first["status"], first["lock_file"]) == (True, "acquired", str(lock))
    assert first["holder"] == holder("mine") == json.loads(lock.read_text())["holder"]
    assert first["previous_holder"] is None
    assert first["msg"] == f"took the deployment lock {lock}"
    assert first["diff"] == {
        "before_header": f"{lock} (absent)",
        "after_header": str(lock),
        "before": "",
        "after": lock_text(holder("mine")),
    }
    assert lock.stat().st_mode & 0o777 == 0o600

    before = snapshot(lock.parent)
    second = take(run_module, lock, "mine", diff=True)
    assert (second["changed"], second["status"]) == (False, "already_held")
    assert "diff" not in second
    assert snapshot(lock.parent) == before


def untouched(lock: Path) -> tuple[int, bytes]:
    """The lock's mtime and content (the guard file beside it appears with the first change made under it)."""
    return lock.stat().st_mtime_ns, lock.read_bytes()


def test_fails_naming_the_holder_when_another_run_holds_it(run_module, lock):
    lock.write_text(lock_text(holder("other")))
    before = untouched(lock)
    for check_mode in (False, True):
        result = take(run_module, lock, "mine", check_mode=check_mode)
        assert result.failed
        assert result["status"] == "held_by_other"
        assert result["previous_holder"] == result["holder"] == holder("other")
        assert result["msg"] == (
            f"the deployment lock {lock} is held by ansible-playbook site.yml by alice on controller box "
            "(pid 4242) since 2026-12-03 04:10:00 UTC"
        )
    assert untouched(lock) == before


def test_takes_over_only_the_token_it_names(run_module, lock):
    lock.write_text(lock_text(holder("stale")))
    refused = take(run_module, lock, "mine", take_over="newer")
    assert refused.failed
    assert refused["status"] == "held_by_other"

    result = take(run_module, lock, "mine", take_over="stale", diff=True)
    assert not result.failed, result
    assert (result["changed"], result["status"]) == (True, "taken_over")
    assert result["previous_holder"] == holder("stale")
    assert result["holder"] == holder("mine") == json.loads(lock.read_text())["holder"]
    assert result["msg"].startswith(
        f"took the deployment lock {lock} over from ansible-playbook site.yml by alice"
    )
    assert (result["diff"]["before"], result["diff"]["after"]) == (
        lock_text(holder("stale")),
        lock_text(holder("mine")),
    )


def test_gives_back_only_its_own_lock(run_module, lock):
    lock.write_text(lock_text(holder("other")))
    before = untouched(lock)
    left = take(run_module, lock, "mine", state="released")
    assert not left.failed
    assert (left["changed"], left["status"], left["holder"]) == (False, "not_held", holder("other"))
    assert left["msg"].startswith(f"left the deployment lock {lock} alone: it is held by ansible-playbook")
    assert untouched(lock) == before

    released = take(run_module, lock, "other", state="released", diff=True)
    assert (released["changed"], released["status"], released["holder"]) == (True, "released", None)
    assert released["diff"]["after_header"] == f"{lock} (absent)"
    assert not lock.exists()

    again = take(run_module, lock, "other", state="released")
    assert (again["changed"], again["status"], again["msg"]) == (
        False,
        "absent",
        f"there is no deployment lock {lock} to give back",
    )


def test_check_mode_changes_nothing(run_module, lock):
    before = snapshot(lock.parent)
    would = take(run_module, lock, "mine", check_mode=True)
    assert (would["changed"], would["status"], would["holder"]) == (True, "acquired", holder("mine"))
    assert snapshot(lock.parent) == before

    take(run_module, lock, "mine")
    before = snapshot(lock.parent)
    gone = take(run_module, lock, "mine", state="released", check_mode=True)
    assert (gone["changed"], gone["status"]) == (True, "released")
    assert snapshot(lock.parent) == before


def test_a_first_run_in_check_mode_needs_no_state_directory(run_module, tmp_path):
    lock = tmp_path / "not-yet" / "deployment.lock"
    result = take(run_module, lock, "mine", check_mode=True)
    assert (result["changed"], result["status"]) == (True, "acquired")
    assert not lock.parent.exists()


def test_creates_the_state_directory_when_taking_the_lock(run_module, tmp_path):
    lock = tmp_path / "not-yet" / "deployment.lock"
    result = take(run_module, lock, "mine")
    assert (result["changed"], result["status"]) == (True, "acquired")
    assert lock.is_file()
    assert oct(lock.parent.stat().st_mode & 0o777) == "0o700"


def test_expands_the_users_home_in_the_path(run_module, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    result = take(run_module, "~/.state/deployment.lock", "mine")
    assert result["lock_file"] == str(tmp_path / ".state" / "deployment.lock")
    assert (tmp_path / ".state" / "deployment.lock").is_file()


@pytest.mark.parametrize("given", [None, {}, {"controller": "box"}, {"token": ""}])
def test_needs_the_holder_the_action_fills(run_module, lock, given):
    result = run_module(deployment_lock, {"path": str(lock), "holder": given})
    assert result.failed
    assert result["msg"] == (
        "holder with a token is missing: run the task sparkserve.dsv41.deployment_lock, whose action fills it"
    )
    assert not lock.exists()
