# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Filter plugin: rewrite an EXL3 plan's ``qdir`` to container bank paths."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.module_utils._exl3_plan import (
    DEFAULT_BANK_ROOT,
    QdirError,
    rewrite_qdir,
)

DOCUMENTATION = r"""
---
name: exl3_qdir
short_description: Point the bank directories of an EXL3 plan's qdir at the container mount
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Takes a C(qdir) value (bank directories joined by C(:), for example C(qn:q31:q31s)) and replaces
    every entry by C(<bank_root>/<last path component>).
  - The same rewrite the M(sparkserve.dsv41.exl3_plan) module applies to the plan copy; idempotent.
options:
  _input:
    description: The C(qdir) value of the plan.
    type: str
    required: true
  bank_root:
    description: Absolute directory of the banks inside the rank containers.
    type: str
    default: /model/exl3
seealso:
  - module: sparkserve.dsv41.exl3_plan
"""

EXAMPLES = r"""
- name: Show where the rank containers will look for the banks
  ansible.builtin.debug:
    msg: "{{ 'qn:q31:q31s' | sparkserve.dsv41.exl3_qdir }}"
  # -> /model/exl3/qn:/model/exl3/q31:/model/exl3/q31s

- name: Another mount point
  ansible.builtin.debug:
    msg: "{{ plan.qdir | sparkserve.dsv41.exl3_qdir(bank_root='/weights/exl3') }}"
"""

RETURN = r"""
_value:
  description: The rewritten C(qdir), entries joined by C(:).
  type: str
  sample: /model/exl3/qn:/model/exl3/q31:/model/exl3/q31s
"""


def exl3_qdir(qdir: str, bank_root: str = DEFAULT_BANK_ROOT) -> str:
    """Jinja2 entry point; turns rewrite errors into filter errors Ansible reports cleanly."""
    try:
        return rewrite_qdir(qdir, bank_root)
    except QdirError as err:
        raise AnsibleFilterError(f"exl3_qdir: {err}") from err


class FilterModule:
    """Registers ``exl3_qdir``."""

    def filters(self) -> dict:
        return {"exl3_qdir": exl3_qdir}
