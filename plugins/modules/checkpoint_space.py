#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: measure the room a node has for a checkpoint directory (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_space
short_description: Measure the free space for a checkpoint directory and what it already holds
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Returns the bytes an unprivileged writer may still use on the filesystem that holds O(path) -
    measured at O(path), or at its nearest existing parent when O(path) does not exist yet - and the
    bytes of the regular files already under O(path) (symbolic links not followed).
  - With O(need_gib), fails when the free space is less than the checkpoint needs beyond what is
    already there, naming O(variable) - the C(sparkserve.dsv41.checkpoint) role checks this before it
    downloads or copies anything.
  - Reads metadata only; changes nothing.
options:
  path:
    description: The checkpoint directory; it may not exist yet.
    type: path
    required: true
  need_gib:
    description:
      - GiB the whole checkpoint needs in O(path). When given, the module fails if the free space is
        less than that minus what O(path) already holds.
    type: float
  variable:
    description: The variable that sets O(need_gib), which the failure message names.
    type: str
    default: need_gib
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Only reads; behaves the same in check mode.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Measure the room for the checkpoint
  sparkserve.dsv41.checkpoint_space:
    path: /home/spark/models/DeepSeek-V4.1-Flash-Spark
  register: room

- name: Require 700 GiB for the whole checkpoint
  ansible.builtin.assert:
    that: room.free_bytes + room.present_bytes >= 700 * 1024**3
"""

RETURN = r"""
path:
  description: O(path), absolute.
  returned: always
  type: str
  sample: /home/spark/models/DeepSeek-V4.1-Flash-Spark
measured_at:
  description: Where the free space was measured - O(path) or its nearest existing parent.
  returned: always
  type: str
  sample: /home/spark
free_bytes:
  description: Bytes free for an unprivileged writer on that filesystem.
  returned: always
  type: int
  sample: 812345678848
present_bytes:
  description: Bytes of the regular files under O(path); 0 when it does not exist.
  returned: always
  type: int
  sample: 0
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._space import (
    space_report,
    space_shortfall,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "need_gib": {"type": "float"},
            "variable": {"type": "str", "default": "need_gib"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["need_gib"] is not None and params["need_gib"] < 0:
        module.fail_json(msg=f"{params['variable']} must be 0 or more, got {params['need_gib']:g}")
    try:
        report = space_report(params["path"])
    except OSError as exc:
        module.fail_json(msg=f"cannot measure {exc.filename or params['path']}: {exc.strerror or exc}")
    shortfall = (
        None
        if params["need_gib"] is None
        else space_shortfall(report, params["need_gib"], params["variable"])
    )
    if shortfall:
        module.fail_json(msg=shortfall, **report)
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
