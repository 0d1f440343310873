"""The controller's half of the deployment lock: who this run is, and whether a holder is gone."""

from __future__ import annotations

import calendar
import importlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = {"controller": "box", "boot_id": "boot-1", "pid": 100, "token": "t"}


@pytest.fixture(scope="module")
def action():
    """The action plugin, imported by the tests that use it rather than at collection: it imports
    ansible's controller, which switches the whole process to controller mode (module warnings go
    to the display), and the module tests collected before it must keep seeing module behaviour."""
    return importlib.import_module("ansible_collections.sparkserve.dsv41.plugins.action.deployment_lock")


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_this_run_names_the_controller_and_its_ansible_playbook_process(action):
    run = action.this_run(1796271000.5)
    assert run["pid"] == os.getppid(), "the worker that runs the action is a child of ansible-playbook"
    assert run["controller"] == socket.gethostname()
    assert run["boot_id"] == Path(action.BOOT_ID_FILE).read_text().strip()
    assert run["started"] == 1796271000.5
    assert re.fullmatch(r"[0-9a-f]{32}", run["token"])
    assert action.this_run(1796279999.0)["token"] == run["token"], "every task of the run computes the same"
    assert action.this_run(1.0, pid=os.getpid())["token"] != run["token"]


def test_the_token_changes_with_every_part_of_the_runs_identity(action):
    base = action.run_token("box", "boot-1", 100, "555")
    assert base == action.run_token("box", "boot-1", 100, "555")
    others = {
        action.run_token("box2", "boot-1", 100, "555"),
        action.run_token("box", "boot-2", 100, "555"),
        action.run_token("box", "boot-1", 101, "555"),
        action.run_token("box", "boot-1", 100, "556"),  # the same pid, reused by a later process
    }
    assert base not in others
    assert len(others) == 4


def test_process_start_reads_field_22_past_a_command_name_with_spaces(action, tmp_path):
    stat = "4242 (ansible-playbook) x) S 1 4242 4242 0 -1 4194560 " + " ".join(str(n) for n in range(10, 50))
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_text(stat)
    fields_after_name = stat.rpartition(")")[2].split()
    assert action.process_start(4242, proc=str(tmp_path)) == fields_after_name[19] == "22"
    assert action.process_start(4243, proc=str(tmp_path)) == ""
    assert action.process_start(os.getpid()) != ""


def test_playbook_name_is_what_was_given_without_directories(action):
    assert action.playbook_name(("/srv/deploy/site.yml",)) == "site.yml"
    assert action.playbook_name(["sparkserve.dsv41.restart"]) == "sparkserve.dsv41.restart"
    assert action.playbook_name(("a.yml", "playbooks/b.yml")) == "a.yml b.yml"
    assert action.playbook_name(None) == action.playbook_name("head") == action.playbook_name(()) == "?"


def test_pid_alive(action):
    assert action.pid_alive(os.getpid())
    assert not action.pid_alive(dead_pid())


GONE = "its ansible-playbook (pid 42) is no longer running on this controller"
REBOOTED = "controller box has rebooted since that run took it"


@pytest.mark.parametrize(
    ("other", "alive", "reason"),
    [
        pytest.param({"controller": "box", "boot_id": "boot-1", "pid": 42}, False, GONE, id="gone"),
        pytest.param({"controller": "box", "boot_id": "boot-1", "pid": 42}, True, None, id="running"),
        pytest.param({"controller": "box", "boot_id": "boot-0", "pid": 42}, True, REBOOTED, id="rebooted"),
        pytest.param(
            {"controller": "other", "boot_id": "boot-1", "pid": 42}, False, None, id="other controller"
        ),
        pytest.param({"controller": "box", "boot_id": "boot-1", "pid": "42"}, False, None, id="pid text"),
        pytest.param({"controller": "box", "boot_id": "boot-1", "pid": 0}, False, None, id="pid 0"),
        pytest.param({"controller": "box", "boot_id": "boot-1", "pid": True}, False, None, id="pid bool"),
        pytest.param({"controller": "box", "boot_id": "boot-1"}, False, None, id="no pid"),
        pytest.param({"token": "", "unreadable": "is not JSON"}, False, None, id="unreadable"),
    ],
)
def test_stale_reason(action, other, alive, reason):
    asked: list[int] = []

    def is_alive(pid: int) -> bool:
        asked.append(pid)
        return alive

    assert action.stale_reason(other, HERE, is_alive, lambda _pid: "") == reason
    assert set(asked) <= {42}


REUSED = f"{GONE} (pid 42 is another process now)"


@pytest.mark.parametrize(
    ("start", "reason"),
    [
        pytest.param("5000", None, id="the holder's own process"),
        pytest.param("7000", REUSED, id="a later process with its pid"),
        pytest.param("", None, id="start unreadable"),
    ],
)
def test_a_pid_taken_by_a_later_process_is_a_gone_run(action, start, reason):
    token = action.run_token("box", "boot-1", 42, "5000")
    other = {"controller": "box", "boot_id": "boot-1", "pid": 42, "token": token}
    assert action.stale_reason(other, HERE, lambda _pid: True, lambda _pid: start) == reason


def test_this_process_holds_its_own_lock_and_not_one_of_another_token(action):
    here = action.this_run(0.0, pid=os.getpid())
    assert action.stale_reason(here, here) is None
    reason = action.stale_reason({**here, "token": "0" * 32}, here)
    assert reason is not None and "is another process now" in reason


def test_a_controller_without_a_name_judges_nothing(action):
    assert (
        action.stale_reason(
            {"controller": "", "boot_id": "", "pid": 42}, {**HERE, "controller": ""}, lambda _: False
        )
        is None
    )


def test_the_message_names_the_holder_and_what_to_do(action):
    other = {
        "controller": "box",
        "pid": 4242,
        "boot_id": "boot-0",
        "user": "alice",
        "playbook": "site.yml",
        "started": float(calendar.timegm((2026, 12, 3, 4, 10, 0))),
        "token": "t",
    }
    assert action.held_message("head", "/home/spark/.dsv41-two-sparks/deployment.lock", other) == (
        "Another run holds the deployment lock on head: ansible-playbook site.yml by alice on controller box "
        "(pid 4242) since 2026-12-03 04:10:00 UTC. Wait for it to finish; if it is gone (run from another "
        "controller), re-run with -e deployment_lock_force=true."
    )
    unreadable = {"token": "", "unreadable": "is not JSON (Expecting value: line 1 column 1 (char 0))"}
    assert action.held_message("head", "/s/deployment.lock", unreadable) == (
        "The deployment lock /s/deployment.lock on head is not one this collection wrote: it is not JSON "
        "(Expecting value: line 1 column 1 (char 0)). Remove it, or re-run with "
        "-e deployment_lock_force=true."
    )
