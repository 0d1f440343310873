#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: plan a switch of the deployment, and record what serves after it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployment_release
short_description: Plan a switch of the serving image, checkpoint revision or recipe, and record the outcome
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Keeps the deployment record on the head, O(path) (the roles use C(<state dir>/deployments.json)) - the
    deployment that serves now (C(current)), the one before it (C(previous)) and the last switch that
    failed (C(last_failed)), each with its image (by digest), checkpoint revision, model recipe (its name)
    and time; a deployment also with its smoke result and how long the switch to it kept the API from
    answering.
  - An entry recorded before entries named their recipe counts as recipe C(deepseek-v4.1-flash), the only
    model served then.
  - O(state=planned) reads the record and says what this run deploys (RV(plan)) - C(first) (nothing
    recorded yet), C(none) (O(image), O(revision) and O(recipe) serve already), C(switch) (one of them
    differs from C(current)) or, with O(rollback=true), C(rollback) (to C(previous)). It never changes
    anything.
  - A switch changes the image, the checkpoint revision (the commit of its directory under the
    model root; see M(sparkserve.dsv41.checkpoint_revision)), the recipe, or several of them.
  - A run's ranks have the serving arguments and model directory of its own recipe, so it goes back only to
    a deployment of the same recipe. A rollback to a C(previous) of another recipe fails, changing nothing,
    naming both recipes and the run that goes back. A switch away from a C(current) of another recipe is
    planned with RV(plan.no_rollback) - a failure of it cannot roll back by itself.
  - O(state=committed) records O(image), O(revision) and O(recipe) as C(current), once they serve and passed
    the smoke checks, and the old C(current) as C(previous). Recording what is current already changes
    nothing.
  - O(state=failed) records a switch to O(image), O(revision) and O(recipe) that failed, with O(reason);
    C(current) stays (it serves again after the rollback, or, across recipes, once the run that
    RV(plan.no_rollback) names deploys it again).
  - The file is written through a temporary file in the same directory and renamed, mode C(0600).
options:
  path:
    description: The record's file. Its directory must exist.
    type: path
    required: true
  state:
    description: Plan the run, or record its outcome.
    type: str
    choices: [planned, committed, failed]
    default: planned
  image:
    description: The serving image, pinned by digest, that this run deploys (or deployed).
    type: str
    required: true
  revision:
    description:
      - The checkpoint revision (its commit) this run deploys, or deployed.
      - Not set - with O(state=planned), the revision that serves now (a run that does not fetch the
        checkpoint keeps it); otherwise empty (not known).
    type: str
  recipe:
    description:
      - The name of the model recipe this run deploys (or deployed), C(deployment_recipe_spec.name).
    type: str
    default: deepseek-v4.1-flash
  rollback:
    description:
      - With O(state=planned) - plan a rollback to the previous deployment instead of deploying O(image);
        fails when no previous one is recorded, or when it served another recipe than O(recipe).
    type: bool
    default: false
  smoke:
    description: With O(state=committed) - the smoke checks' outcome, in words (for example V(passed)).
    type: str
  downtime_seconds:
    description:
      - With O(state=committed) - seconds between the last answer from the old ranks and the first from the
        new ones, when measured.
    type: float
  reason:
    description:
      - With O(state=failed) - what failed (the check and its evidence, or the rank that did not start).
    type: str
  left_serving:
    description:
      - With O(state=failed) - the failed switch's ranks still run (a switch across recipes does not
        roll back by itself). The next run that deploys C(current) again is then a switch, gated by
        the smoke checks; the mark goes once a deployment passes them.
    type: bool
    default: false
  host_stack:
    description:
      - With O(state=committed) - each node's host stack by inventory name (C(kernel), C(driver),
        C(nic_firmware)), kept with the deployment that serves now; M(sparkserve.dsv41.node_facts)
        reads it. C(status.yml) shows what changed since.
    type: dict
  image_versions:
    description:
      - With O(state=committed) - the serving image's C(torch), C(cuda) and C(nccl) versions, as the
        fabric test read them inside it (the rank role's C(rank_image_versions)), kept with the
        deployment that serves now. C(status.yml) shows them.
    type: dict
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - O(state=planned) runs as usual; O(state=committed) and O(state=failed) say what they would record.
  diff_mode:
    support: full
  platform:
    platforms: posix
seealso:
  - module: sparkserve.dsv41.smoke
  - module: sparkserve.dsv41.api_watch
"""

EXAMPLES = r"""
- name: Plan what this run deploys
  sparkserve.dsv41.deployment_release:
    path: /home/spark/.dsv41-two-sparks/deployments.json
    image: "{{ deployment_image }}"
    revision: main
    recipe: "{{ deployment_recipe_spec.name }}"
  register: release

- name: Record the new deployment once it passed its smoke checks
  sparkserve.dsv41.deployment_release:
    path: /home/spark/.dsv41-two-sparks/deployments.json
    state: committed
    image: "{{ release.plan.target.image }}"
    revision: "{{ release.plan.target.revision }}"
    recipe: "{{ release.plan.target.recipe }}"
    smoke: passed
    downtime_seconds: 41.2
"""

RETURN = r"""
plan:
  description: With O(state=planned), what this run deploys.
  returned: when state is planned
  type: dict
  contains:
    action:
      description: C(first), C(none), C(switch) or C(rollback).
      type: str
    target:
      description: The C({image, revision, recipe}) this run deploys.
      type: dict
    current:
      description: The deployment recorded as serving, or null.
      type: dict
    previous:
      description: The deployment before it, or null.
      type: dict
    no_rollback:
      description:
        - Null, or (C(current) served another recipe than O(recipe)) why a failure of this run does not roll
          back to C(current) by itself, and the command that deploys it again.
      type: str
    msg:
      description: The plan in words.
      type: str
  sample:
    action: switch
    target: {image: "registry/engine@sha256:...", revision: main, recipe: deepseek-v4.1-flash}
    current:
      {image: "registry/engine@sha256:...", revision: main, recipe: deepseek-v4.1-flash, time: 1796281902.0,
       smoke: passed}
    previous: null
    no_rollback: null
    msg: switching from ... to ...; the smoke checks gate it and a failure rolls back
record:
  description: The record after this task (what it would be, in check mode).
  returned: always
  type: dict
  sample: {version: 1, current: {image: "registry/engine@sha256:..."}, previous: null, last_failed: null}
msg:
  description: What the task found or recorded, in words.
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    read_text,
    write_atomically,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._release import (
    LEGACY_RECIPE,
    ReleaseError,
    committed,
    describe,
    failed,
    parse_record,
    plan,
    record_text,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["planned", "committed", "failed"], "default": "planned"},
            "image": {"type": "str", "required": True},
            "revision": {"type": "str"},
            "recipe": {"type": "str", "default": LEGACY_RECIPE},
            "rollback": {"type": "bool", "default": False},
            "smoke": {"type": "str"},
            "downtime_seconds": {"type": "float"},
            "reason": {"type": "str"},
            "left_serving": {"type": "bool", "default": False},
            "host_stack": {"type": "dict"},
            "image_versions": {"type": "dict"},
        },
        required_if=[("state", "committed", ["smoke"]), ("state", "failed", ["reason"])],
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    try:
        before_text = read_text(path)
        record = parse_record(before_text, path)
        target = {"image": params["image"], "revision": params["revision"] or "", "recipe": params["recipe"]}
        if params["state"] == "planned":
            planned = plan(
                record,
                params["image"],
                params["revision"],
                recipe=params["recipe"],
                rollback=params["rollback"],
            )
            module.exit_json(changed=False, plan=planned, record=record, msg=planned["msg"])
        now = time.time()
        if params["state"] == "committed":
            after = committed(
                record,
                target,
                smoke=params["smoke"],
                downtime_seconds=params["downtime_seconds"],
                now=now,
                host_stack=params["host_stack"],
                image_versions=params["image_versions"],
            )
            msg = f"serving {describe(after['current'])}; previous: {describe(after['previous'])}"
        else:
            after = failed(
                record, target, reason=params["reason"], now=now, left_serving=params["left_serving"]
            )
            msg = f"recorded the failed switch: {describe(after['last_failed'])}"
    except (ReleaseError, FileContentError) as exc:
        module.fail_json(msg=str(exc), path=path)
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc.strerror or exc}", path=path)
    changed = after != record
    result = {"changed": changed, "record": after, "msg": msg if changed else f"{msg} (unchanged)"}
    if module._diff:
        result["diff"] = {"before": before_text or "", "after": record_text(after), "before_header": path,
                          "after_header": path}  # fmt: skip
    if changed and not module.check_mode:
        try:
            write_atomically(module, path, record_text(after).encode(), mode="0600")
            # atomic_move gives a new file the umask's mode: the record is the owner's alone.
            module.set_mode_if_different(path, "0600", False)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {path}: {exc.strerror or exc}", path=path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
