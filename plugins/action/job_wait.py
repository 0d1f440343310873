# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Action for sparkserve.dsv41.job_wait: poll a background job until it ends, one progress line per poll.

One task waits for a job: the module runs on the node once per poll (it returns after O(seconds)
at most, or as soon as the job ends), the action prints the line it returns, and once the job has
ended returns the job's own result, or fails with the job's message. Time running out is the
action's to decide: it stops a little after the job's own C(async) timeout would have stopped it.
"""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

MODULE = "sparkserve.dsv41.job_wait"
# Polls after the job's own async timeout: the wrapper kills the job at it, and the next poll sees that.
GRACE_POLLS = 3
# How long a results file may be missing: the async wrapper writes it as the job starts, so after
# this the job was waited for already (the file is removed once it finished) or is not this host's.
MISSING_RESULTS_SECONDS = 10.0


def failure_message(what: str, host: str, poll: dict, args: dict) -> str | None:
    """What to say when the job failed, was stopped at its timeout, or did not finish (``args``: the
    task's, for the timeout and its variable); None when it succeeded."""
    if poll["finished"] and not poll["job_failed"]:
        return None
    limit = (
        f"{args['timeout_variable']} ({args['timeout_minutes']:g} minutes): raise it. {args['note']}".strip()
    )
    if not poll["finished"]:
        return f"{what} on {host} did not finish within {limit}"
    if poll["error"] == "Timeout exceeded":
        return f"{what} on {host} was stopped after {limit}"
    return f"{what} on {host} failed: {poll['error']}"


class ActionModule(ActionBase):
    """Wait for a job started with ``async`` and ``poll: 0``, printing its progress."""

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(
        {"job", "progress_file", "what", "seconds", "timeout_minutes", "timeout_variable", "note"}
        | {"keep_fresh"}
    )

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # unused; the module needs no temporary files of the action
        validation, args = self.validate_argument_spec(
            argument_spec={
                "job": {"type": "dict", "required": True},
                # Paths of the node: str here, so that a `~` is the node's home, not this controller's.
                "progress_file": {"type": "str"},
                "what": {"type": "str", "required": True},
                "seconds": {"type": "float", "default": 20},
                "timeout_minutes": {"type": "float", "required": True},
                "timeout_variable": {"type": "str", "required": True},
                "note": {"type": "str", "default": ""},
                "keep_fresh": {"type": "str"},
            }
        )
        del validation  # its errors have already been raised
        results_file = args["job"].get("results_file")
        if not results_file:
            return {
                **result,
                "failed": True,
                "msg": "job must be the registered result of a task run with async and poll 0",
            }
        host = task_vars.get("inventory_hostname", "?") if task_vars else "?"
        poll_seconds = max(args["seconds"], 0.1)
        deadline = time.monotonic() + args["timeout_minutes"] * 60 + GRACE_POLLS * poll_seconds
        missing_since: float | None = None
        while True:
            poll = self._execute_module(
                module_name=MODULE,
                module_args={
                    "results_file": results_file,
                    "progress_file": args["progress_file"],
                    "what": args["what"],
                    "seconds": poll_seconds,
                    "keep_fresh": args["keep_fresh"],
                },
                task_vars=task_vars,
            )
            if poll.get("failed"):
                return {**result, **poll}
            if poll["results_file_found"]:
                missing_since = None
            elif missing_since is None:
                missing_since = time.monotonic()
            elif time.monotonic() - missing_since >= MISSING_RESULTS_SECONDS:
                return {
                    **result,
                    "failed": True,
                    "msg": (
                        f"{args['what']} on {host}: the results file {results_file} is not there: the"
                        " job was waited for already (its file is removed once it finished), or it was"
                        " started on another host or as another user"
                    ),
                }
            if poll["finished"] or time.monotonic() >= deadline:
                break
            display.display(f"{host}: {poll['line']}")
        job = poll["result"]
        message = failure_message(args["what"], host, poll, args)
        if message is not None:
            return {**result, **job, "failed": True, "msg": message, "line": poll["line"]}
        summary = f"{args['what']}: {job['msg']}" if job.get("msg") else poll["line"]
        display.display(f"{host}: {summary}")
        return {**result, **job, "changed": bool(job.get("changed")), "line": poll["line"]}
