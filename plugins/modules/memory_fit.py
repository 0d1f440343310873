#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: whether a recipe's rank fits this node's memory (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: memory_fit
short_description: Check that a recipe's rank fits this node's memory, and plan the largest KV cache
version_added: 0.4.0
author: sparkserve maintainers (@sparkserve)
description:
  - Reads C(MemTotal) and C(MemAvailable) from C(/proc/meminfo) and compares what one rank of the
    recipe needs (its C(memory) section - weights, runtime, KV cache - and, with
    C(gpu_memory_utilization), the fraction of the total vLLM claims at start-up) with MemAvailable
    less the memory guard's floor.
  - Returns the plan - what is needed, what is there, the largest KV cache, GPU memory utilization
    and context length that fit - and fails, naming the shortfall and the setting to change, when
    the rank does not fit and O(fail_on_shortfall) is true.
  - Read MemAvailable with no rank running on the node; with a rank running the plan counts its
    memory as taken.
options:
  memory:
    description: The recipe's C(memory) section (C(weights_gib_per_rank), C(runtime_gib_per_rank),
      C(kv_cache_bytes) or C(kv_cache_gib), C(kv_bytes_per_token)).
    type: dict
    required: true
  settings:
    description: The recipe's settings as the ranks get them (the inventory's overrides applied).
    type: dict
    default: {}
  floor_gib:
    description: The memory guard's floor; MemAvailable below it kills the ranks.
    type: float
    default: 1.0
  proc_root:
    description: Where C(/proc) is read (a fixture in tests).
    type: path
    default: /proc
  fail_on_shortfall:
    description: Fail when the rank does not fit (false - only report, as C(fit.yml) does).
    type: bool
    default: true
  rank_running:
    description: Whether this node's rank runs now (RV(lines) says that its memory counts as taken).
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Only reads.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Check that the rank fits this node's memory
  sparkserve.dsv41.memory_fit:
    memory: "{{ deployment_recipe_spec.memory }}"
    settings: {kv_cache_memory_bytes: 2700000000, gpu_memory_utilization: 0.88}
    floor_gib: 1
"""

RETURN = r"""
plan:
  description:
    - Bytes - C(mem_total), C(mem_available), C(floor), C(usable) (MemAvailable less the floor),
      C(weights), C(runtime), C(kv_cache), C(utilization_claim), C(need), C(short_by),
      C(largest_kv_cache); C(fits); C(largest_gpu_memory_utilization); C(longest_context) (tokens,
      with C(kv_bytes_per_token)); C(kv_cache_setting) (the setting that holds the KV size);
      C(problems).
  returned: always
  type: dict
lines:
  description: The plan in three lines for an operator (what the node has, what a rank needs, what fits).
  returned: always
  type: list
  elements: str
msg:
  description: The verdict in words.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._fit import FitError, gib, plan, plan_lines
from ansible_collections.sparkserve.dsv41.plugins.module_utils._node import parse_meminfo


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "memory": {"type": "dict", "required": True},
            "settings": {"type": "dict", "default": {}},
            "floor_gib": {"type": "float", "default": 1.0},
            "proc_root": {"type": "path", "default": "/proc"},
            "fail_on_shortfall": {"type": "bool", "default": True},
            "rank_running": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    path = f"{params['proc_root']}/meminfo"
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            meminfo = parse_meminfo(handle.read())
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc.strerror or exc}")
    if "MemTotal" not in meminfo or "MemAvailable" not in meminfo:
        module.fail_json(msg=f"{path} has no MemTotal or MemAvailable line")
    try:
        result = plan(
            params["memory"],
            params["settings"],
            mem_total=meminfo["MemTotal"] * 1024,
            mem_available=meminfo["MemAvailable"] * 1024,
            floor=int(params["floor_gib"] * (1 << 30)),
        )
    except FitError as exc:
        module.fail_json(msg=f"cannot plan the memory: {exc}")
    if result["problems"]:
        msg = "; ".join(result["problems"])
    else:
        msg = f"the rank fits: it needs {gib(result['need'])} of {gib(result['usable'])}"
    lines = plan_lines(result, rank_running=params["rank_running"])
    if result["problems"] and params["fail_on_shortfall"]:
        module.fail_json(msg=msg, plan=result, lines=lines)
    module.exit_json(changed=False, plan=result, lines=lines, msg=msg)


if __name__ == "__main__":
    main()
