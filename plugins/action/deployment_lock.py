# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Action for sparkserve.dsv41.deployment_lock: the controller's half of the deployment lock.

The module keeps the lock file on the head; what only the controller knows is here: who this run
is (host name, boot id, the ansible-playbook process - the parent of the worker process that runs
this action -, user, playbook) and whether a run that holds the lock is gone (it ran on this
controller and its process no longer exists, or it ran before the controller's last reboot). A
gone holder is taken over by token (compare-and-swap in the module); a live one, or one on another
controller, fails the task with a message naming it, unless ``force``.

The run's token is derived from its identity (host name, boot id, process id and the process's
start time), not drawn at random: every task of the run computes the same one, so giving the lock
back needs no fact carried from the task that took it, whatever plays, hosts or ``--limit`` lie
between.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible import context
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.sparkserve.dsv41.plugins.module_utils._lock import (
    HELD_BY_OTHER,
    NOT_HELD,
    TAKEN_OVER,
    describe_holder,
    token_of,
)

display = Display()

MODULE = "sparkserve.dsv41.deployment_lock"
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
PROC = "/proc"
FORCE_HINT = "re-run with -e deployment_lock_force=true"
FORCED = "deployment_lock_force is true"
# Another run may take a gone holder's lock between two looks; judge the new holder, a few times at most.
TAKE_OVER_ATTEMPTS = 3

ARGUMENT_SPEC = {
    # A str here: the module expands `~` on the head, where the lock lives, not on the controller.
    "path": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["acquired", "released"], "default": "acquired"},
    "force": {"type": "bool", "default": False},
}


# --------------------------------------------------------------------------- who this run is


def read_boot_id(path: str = BOOT_ID_FILE) -> str:
    """The controller's boot id (new at every boot); "" where the system has none."""
    try:
        return Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def process_start(pid: int, proc: str = PROC) -> str:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); "" unknown."""
    try:
        stat = Path(proc, str(pid), "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    # Field 2, the command name, is in parentheses and may hold spaces: count from the last ")".
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def run_token(controller: str, boot_id: str, pid: int, start: str) -> str:
    """The run's token: the same for every task of one ansible-playbook process, different for any other."""
    return hashlib.sha256(f"{controller}\n{boot_id}\n{pid}\n{start}".encode()).hexdigest()[:32]


def playbook_name(cli_args: Any) -> str:
    """The playbooks as given to ansible-playbook, without their directories (``site.yml``)."""
    if not isinstance(cli_args, (list, tuple)):
        return "?"
    return " ".join(os.path.basename(str(arg)) for arg in cli_args) or "?"


def controller_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        return str(os.getuid())


def this_run(now: float, pid: int | None = None) -> dict[str, Any]:
    """The holder for this run. ``pid``: the ansible-playbook process, by default this worker's parent."""
    pid = os.getppid() if pid is None else pid
    controller = socket.gethostname()
    boot_id = read_boot_id()
    return {
        "controller": controller,
        "pid": pid,
        "boot_id": boot_id,
        "user": controller_user(),
        "playbook": playbook_name(context.CLIARGS.get("args")),
        "started": now,
        "token": run_token(controller, boot_id, pid, process_start(pid)),
    }


# --------------------------------------------------------------------------- is the holder gone?


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_reason(
    other: dict[str, Any],
    here: dict[str, Any],
    alive: Callable[[int], bool] = pid_alive,
    start_of: Callable[[int], str] = process_start,
) -> str | None:
    """Why the run ``other`` that holds the lock is gone, or None when it may be running.

    Only a run of this controller can be judged: same host name and boot id and its process is
    gone, or its pid now belongs to a process that started later (the pid was reused: the run's
    token, made from its process's start, no longer matches), or same host name and another boot
    id (the controller rebooted since). A run of another controller, or a lock without a usable
    pid, is never judged gone; nor is a live pid whose start this controller cannot read.
    """
    controller = here.get("controller")
    if not controller or other.get("controller") != controller:
        return None
    boot_id = here.get("boot_id")
    if other.get("boot_id") != boot_id:
        return f"controller {controller} has rebooted since that run took it"
    pid = other.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    gone = f"its ansible-playbook (pid {pid}) is no longer running on this controller"
    if not alive(pid):
        return gone
    start = start_of(pid)
    if start and run_token(controller, boot_id or "", pid, start) != token_of(other):
        return f"{gone} (pid {pid} is another process now)"
    return None


def held_message(head: str, path: str, other: dict[str, Any]) -> str:
    """Why the task fails: who holds the lock, and what to do."""
    if other.get("unreadable"):
        return (
            f"The deployment lock {path} on {head} is not one this collection wrote: "
            f"it {other['unreadable']}. Remove it, or {FORCE_HINT}."
        )
    return (
        f"Another run holds the deployment lock on {head}: {describe_holder(other)}. Wait for it to finish; "
        f"if it is gone (run from another controller), {FORCE_HINT}."
    )


# --------------------------------------------------------------------------- the action


class ActionModule(ActionBase):
    """Take or give back the deployment lock on the host the task is delegated to (the head)."""

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused; the module needs no temporary files of the action
        validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        del validation  # its errors have already been raised
        task_vars = task_vars or {}
        head = self._task.delegate_to or task_vars.get("inventory_hostname", "?")
        here = this_run(time.time())
        module_args = {"path": args["path"], "state": args["state"], "holder": here}
        outcome = self._lock(module_args, task_vars)

        if args["state"] == "released":
            # In check mode this run never held it: another run's lock is no news then.
            if outcome.get("status") == NOT_HELD and not self._task.check_mode:
                display.warning(
                    f"The deployment lock on {head} is held by {describe_holder(outcome['holder'])}, "
                    "not by this run (it was taken over): left it in place."
                )
            return {**result, **outcome}

        for _attempt in range(TAKE_OVER_ATTEMPTS):
            if outcome.get("status") != HELD_BY_OTHER:
                return {**result, **outcome}
            other = outcome.get("previous_holder") or {}
            reason = FORCED if args["force"] else stale_reason(other, here)
            if reason is None:
                break
            outcome = self._lock({**module_args, "take_over": token_of(other)}, task_vars)
            if outcome.get("status") == TAKEN_OVER:
                verb = "Would take" if self._task.check_mode else "Took"
                display.warning(
                    f"{verb} over the deployment lock on {head} from {describe_holder(other)}: {reason}."
                )
                return {**result, **outcome, "stale_reason": reason}
        if outcome.get("status") != HELD_BY_OTHER:  # failed otherwise
            return {**result, **outcome}
        other = outcome.get("previous_holder") or {}
        # The module's lock_file: the path with `~` expanded on the head.
        lock_file = outcome.get("lock_file", args["path"])
        return {**result, **outcome, "failed": True, "msg": held_message(head, lock_file, other)}

    def _lock(self, module_args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        return self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)
