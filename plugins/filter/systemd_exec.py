# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Filter plugin systemd_exec: see DOCUMENTATION."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.module_utils._systemd import systemd_exec

DOCUMENTATION = r"""
---
name: systemd_exec
short_description: A command line for a systemd unit's ExecStart, each argument quoted as systemd reads it
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Joins a list of arguments into an C(ExecStart=) value that gives the program exactly those
    arguments - an argument with a space, a quote or a backslash is double-quoted and escaped, and
    C(%) and C($) are doubled so that systemd expands no specifier and no variable in a path.
  - Fails on an empty list, a program that is not an absolute path, or an argument with a newline.
options:
  _input:
    description: The program (an absolute path) and its arguments.
    type: list
    elements: raw
    required: true
"""

EXAMPLES = r"""
- name: Write a unit whose paths may hold spaces
  ansible.builtin.copy:
    dest: /etc/systemd/system/example.service
    content: |
      [Service]
      ExecStart={{ ['/usr/bin/python3', tool_dir ~ '/tool.py', '--log', log_dir ~ '/tool.log']
                   | sparkserve.dsv41.systemd_exec }}
    mode: "0644"
"""

RETURN = r"""
_value:
  description: The command line, for C(ExecStart=).
  type: str
"""


def systemd_exec_filter(argv):
    if not isinstance(argv, list):
        raise AnsibleFilterError(f"systemd_exec wants a list of arguments, got {type(argv).__name__}")
    try:
        return systemd_exec(argv)
    except ValueError as exc:
        raise AnsibleFilterError(f"systemd_exec: {exc}") from exc


class FilterModule:
    def filters(self):
        return {"systemd_exec": systemd_exec_filter}
