#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: take or give back the deployment lock on the head (run by the deployment_lock action)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployment_lock
short_description: Take or give back the deployment lock, so two runs never deploy at once
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Keeps one file on the head, O(path) (the playbooks use C(<state dir>/deployment.lock)), while an
    C(ansible-playbook) run deploys, mode C(0600). It holds a JSON object whose C(holder) names the run -
    C(controller) (the controller's host name), C(pid) (its ansible-playbook process), C(boot_id) (the
    controller's), C(user), C(playbook), C(started) (epoch seconds) and C(token) (the run's). The head's
    supervisor leaves the ranks alone while it exists.
  - The action of the same name runs on the controller; use the task C(sparkserve.dsv41.deployment_lock),
    not this module alone. It fills O(holder) from the controller and runs this module on the host the task
    is delegated to (the head).
  - O(state=acquired) creates the lock when there is none (atomically - a hard link, or C(O_EXCL), so
    never twice), and changes nothing when this run holds it already.
  - When another run holds it, the action decides whether that run is gone - it ran on this controller and
    its ansible-playbook process no longer exists, or it ran on this controller before a reboot - and then
    takes the lock over - O(take_over) - printing a warning that names the holder. Otherwise the task fails
    naming the holder, unless O(force).
  - O(state=released) removes the lock when this run holds it, and leaves another run's lock alone (it took
    the lock over); no lock is nothing to do.
  - Every change is made under an exclusive C(flock) of a guard file beside the lock (C(.<name>.guard),
    empty and kept), so a take-over replaces only the holder it judged gone (compare-and-swap).
options:
  path:
    description:
      - The lock file; C(~) is the home of the user the module runs as on the head.
      - Taking the lock creates its directory (mode C(0700)) when it is missing.
    type: path
    required: true
  state:
    description: Take the lock (V(acquired)) or give it back (V(released)).
    type: str
    choices: [acquired, released]
    default: acquired
  force:
    description:
      - Take the lock over from whatever run holds it, alive or not, on this controller or another. For a run
        that is gone and was started from another controller, whose process the action cannot see.
      - Only for the action, which decides the take-over.
    type: bool
    default: false
  holder:
    description:
      - This run - C(controller), C(pid), C(boot_id), C(user), C(playbook), C(started), C(token) (required,
        identifies the run). Filled by the action from the controller; a task does not give it.
    type: dict
  take_over:
    description:
      - With O(state=acquired), replace a lock held by this token. Only while the lock still holds it, so
        two runs taking over the same stale lock never both get it. Set by the action.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: The action builds the holder on the controller and decides whether a holder is gone.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Creates, replaces and removes nothing, and still fails when a live run holds the lock.
  diff_mode:
    support: full
    details: The lock file's content before and after.
  platform:
    platforms: posix
notes:
  - Run it once per run, on the head (C(run_once), C(delegate_to)), as the C(deployment) role's
    C(tasks_from=lock) does; C(site.yml), C(teardown.yml) and C(restart.yml) take the lock first and give
    it back last.
  - A run that is killed, or that fails on every node (which stops ansible-playbook before its last play),
    leaves the lock; the next run from the same controller takes it over, from another controller it needs
    O(force).
  - The token is derived from the run's identity (controller host name, boot id, ansible-playbook process id
    and its start time), so the release computes it again and needs no fact.
"""

EXAMPLES = r"""
- name: Take the deployment lock on the head
  sparkserve.dsv41.deployment_lock:
    path: /home/spark/.dsv41-two-sparks/deployment.lock
  delegate_to: "{{ groups['head'][0] }}"
  run_once: true

- name: Take it over from a run that is gone and was started from another controller
  sparkserve.dsv41.deployment_lock:
    path: /home/spark/.dsv41-two-sparks/deployment.lock
    force: true
  delegate_to: "{{ groups['head'][0] }}"
  run_once: true

- name: Give the lock back at the end of the run
  sparkserve.dsv41.deployment_lock:
    path: /home/spark/.dsv41-two-sparks/deployment.lock
    state: released
  delegate_to: "{{ groups['head'][0] }}"
  run_once: true
"""

RETURN = r"""
lock_file:
  description: The lock file, O(path).
  returned: always
  type: str
  sample: /home/spark/.dsv41-two-sparks/deployment.lock
status:
  description:
    - What was done (in check mode, what would be) - V(acquired) (there was no lock), V(already_held),
      V(taken_over) (from RV(previous_holder)), V(held_by_other) (the task fails), V(released), V(not_held)
      (another run holds it; left alone), V(absent) (no lock to release).
  returned: always
  type: str
  sample: acquired
holder:
  description: The lock's holder after the task (as it would be, in check mode); null when there is no lock.
  returned: always
  type: dict
  sample:
    controller: box
    pid: 4242
    boot_id: 0f9a3c52-1d4e-4f0b-9d1c-3a7e8e5b2c61
    user: alice
    playbook: site.yml
    started: 1796271000.25
    token: 5b0c6f1e9d2a4b7c8e3f1a2b3c4d5e6f
previous_holder:
  description:
    - The lock's holder before the task; null when there was no lock. A lock that is not one this module
      wrote shows as an empty C(token) and C(unreadable), why.
  returned: always
  type: dict
stale_reason:
  description: Why the action took the lock over from RV(previous_holder) (V(taken_over) only).
  returned: when the lock was taken over
  type: str
  sample: its ansible-playbook (pid 4242) is no longer running on this controller
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._lock import (
    HELD_BY_OTHER,
    LockError,
    acquire,
    describe_holder,
    release,
    token_of,
)

MESSAGES = {
    "acquired": "took the deployment lock {path}",
    "already_held": "this run holds the deployment lock {path} already",
    "taken_over": "took the deployment lock {path} over from {previous}",
    "held_by_other": "the deployment lock {path} is held by {previous}",
    "released": "gave the deployment lock {path} back",
    "not_held": "left the deployment lock {path} alone: it is held by {previous}",
    "absent": "there is no deployment lock {path} to give back",
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["acquired", "released"], "default": "acquired"},
            "holder": {"type": "dict"},
            "take_over": {"type": "str"},
            # The action's own option; accepted (and ignored) so the documentation is the module's.
            "force": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    path: str = params["path"]
    holder = params["holder"] or {}
    if not token_of(holder):
        module.fail_json(
            msg=(
                "holder with a token is missing: run the task sparkserve.dsv41.deployment_lock, "
                "whose action fills it"
            ),
            lock_file=path,
        )
    try:
        if params["state"] == "acquired":
            outcome = acquire(path, holder, take_over=params["take_over"], check_mode=module.check_mode)
        else:
            outcome = release(path, token_of(holder), check_mode=module.check_mode)
    except LockError as err:
        module.fail_json(msg=str(err), lock_file=path)
    except OSError as err:
        module.fail_json(
            msg=f"cannot change the deployment lock {err.filename or path}: {err.strerror}", lock_file=path
        )

    previous = describe_holder(outcome.previous_holder) if outcome.previous_holder else ""
    result = {
        "changed": outcome.changed,
        "msg": MESSAGES[outcome.status].format(path=path, previous=previous),
        "lock_file": path,
        "status": outcome.status,
        "holder": outcome.holder,
        "previous_holder": outcome.previous_holder,
    }
    if module._diff and outcome.changed:
        result["diff"] = {
            "before_header": path if outcome.before else f"{path} (absent)",
            "after_header": path if outcome.after else f"{path} (absent)",
            "before": outcome.before,
            "after": outcome.after,
        }
    if outcome.status == HELD_BY_OTHER:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
