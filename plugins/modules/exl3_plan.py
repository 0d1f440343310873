#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: write a node's copy of the EXL3 plan with container bank paths."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: exl3_plan
short_description: Copy the EXL3 plan with its bank paths rewritten for the rank containers
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Reads the EXL3 plan JSON from the model directory on the managed node and writes a copy whose
    C(qdir) field points at the banks as the rank containers see them.
  - C(qdir) holds bank directories joined by C(:), relative to C(exl3/) (for example C(qn:q31:q31s));
    entries may also be absolute or C(exl3/qn)-style paths. Each entry becomes
    C(<bank_root>/<last path component>), for example C(/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s).
  - Every other field is kept as it is, in its order. The copy is written with an indent of 2.
  - Idempotent - the copy is only written when its content differs, and its mode, owner, group and
    SELinux context (the file options) only fixed when they are wrong. Supports check mode and diff mode.
options:
  src:
    description:
      - Path of the plan on the managed node, normally C(<model dir>/exl3/plan/J268-ho-v31-K5n.json).
    type: path
    required: true
  dest:
    description:
      - Path of the copy, normally C(<state dir>/plans/J268-ho-v31-K5n.json).
      - The parent directory must exist.
    type: path
    required: true
  bank_root:
    description:
      - Absolute directory that holds the banks inside the rank containers (the model directory is
        mounted at C(/model)).
    type: str
    default: /model/exl3
  mode:
    description:
      - Permissions of the copy, octal (quote it in YAML, for example V('0644')) or symbolic (for
        example V(u=rw,g=r,o=r)).
    type: raw
    default: '0644'
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.files
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Write this node's copy of the EXL3 plan
  sparkserve.dsv41.exl3_plan:
    src: "{{ deployment_model_dir }}/exl3/plan/J268-ho-v31-K5n.json"
    dest: "{{ deployment_state_dir }}/plans/J268-ho-v31-K5n.json"

- name: Banks mounted somewhere else inside the container
  sparkserve.dsv41.exl3_plan:
    src: /srv/models/DeepSeek-V4.1-Flash-Spark/exl3/plan/J268-ho-v31-K5n.json
    dest: /srv/dsv41/plans/J268-ho-v31-K5n.json
    bank_root: /weights/exl3
    mode: '0640'
"""

RETURN = r"""
msg:
  description: In check mode, when O(src) is not there yet (a checkpoint revision the run would fetch first).
  returned: check mode, before O(src) exists
  type: str
  sample: would copy /home/ubuntu/models/M/revisions/4f1c.../exl3/plan/J268-ho-v31-K5n.json once it is fetched
qdir:
  description: The rewritten C(qdir) value of the copy.
  returned: success
  type: str
  sample: /model/exl3/qn:/model/exl3/q31:/model/exl3/q31s
src:
  description: The plan that was read.
  returned: success
  type: str
  sample: /home/ubuntu/models/DeepSeek-V4.1-Flash-Spark/exl3/plan/J268-ho-v31-K5n.json
dest:
  description: The copy that was written (or would be, in check mode).
  returned: success
  type: str
  sample: /home/ubuntu/.dsv41-two-sparks/plans/J268-ho-v31-K5n.json
mode:
  description:
    - Permissions of the copy, octal (in check mode the current ones; the requested ones while there
      is no copy yet).
  returned: success
  type: str
  sample: '0644'
diff:
  description: Before and after text of the copy (and its file attributes such as the mode, when they change).
  returned: changed and in diff mode
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._exl3_plan import (
    DEFAULT_BANK_ROOT,
    QdirError,
    check_bank_root,
    plan_copy,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    missing_parent_dir,
    mode_text,
    read_text,
    write_atomically,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "bank_root": {"type": "str", "default": DEFAULT_BANK_ROOT},
            "mode": {"type": "raw", "default": "0644"},
        },
        add_file_common_args=True,
        supports_check_mode=True,
    )
    src: str = module.params["src"]
    dest: str = module.params["dest"]
    try:
        bank_root = check_bank_root(module.params["bank_root"])
    except QdirError as err:
        module.fail_json(msg=str(err))
    if os.path.isdir(dest):
        module.fail_json(msg=f"dest {dest} is a directory; give the path of the plan copy itself", dest=dest)
    parent = missing_parent_dir(dest)
    if parent and module.check_mode:
        # The role creates it in the task before, which a check-mode run does not run for real.
        msg = f"would copy {src} to {dest} once {parent} exists"
        module.exit_json(changed=True, src=src, dest=dest, msg=msg)
    if parent:
        module.fail_json(msg=f"the directory of dest does not exist: {parent}; create it first", dest=dest)

    try:
        src_text = read_text(src)
        if src_text is None and module.check_mode:
            # A checkpoint revision that this check-mode run would fetch first is not there yet.
            module.exit_json(changed=True, src=src, dest=dest, msg=f"would copy {src} once it is fetched")
        if src_text is None:
            module.fail_json(
                msg=f"the EXL3 plan {src} does not exist; is the checkpoint complete (exl3/plan/)?", src=src
            )
        # The copy is ours to regenerate, so unreadable bytes there just mean "rewrite it".
        plan, qdir = plan_copy(src, src_text, dest, read_text(dest, lenient=True), bank_root)
    except FileContentError as err:
        module.fail_json(msg=str(err), src=src)
    except OSError as err:
        module.fail_json(msg=f"cannot read {err.filename}: {err.strerror}", src=src, dest=dest)

    file_args = module.load_file_common_arguments(module.params)  # for dest
    existed = os.path.exists(dest)
    if plan.changed and not module.check_mode:
        try:
            write_atomically(module, dest, plan.after.encode("utf-8"), file_args["mode"])
        except OSError as err:
            module.fail_json(msg=f"cannot write {dest}: {err.strerror}", dest=dest)
    attributes_diff: dict = {"before_header": dest, "after_header": dest, "before": {}, "after": {}}
    changed = module.set_fs_attributes_if_different(file_args, plan.changed, diff=attributes_diff)

    result = {
        "changed": changed,
        "src": src,
        "dest": dest,
        "qdir": qdir,
        "mode": mode_text(dest, file_args["mode"]),
    }
    if module._diff and changed:
        diff = [plan.diff()] if plan.changed else []
        # A new copy's attributes are part of its creation, not a change of them.
        if existed and attributes_diff["before"]:
            diff.append(attributes_diff)
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
