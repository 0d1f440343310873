# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Filter plugin vllm_rank_env: see DOCUMENTATION."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.module_utils._rank import vllm_rank_env

DOCUMENTATION = r"""
---
name: vllm_rank_env
short_description: The environment of one rank container of the reference deployment
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Renders the measured reference environment with this node's fabric facts.
options:
  _input:
    description:
      - The settings as a dict. Required keys are C(ifname), C(hcas) (the C(NCCL_IB_HCA) value)
        and C(host_ip) (C(VLLM_HOST_IP)).
      - Optional keys are C(gid_index) (default 3), C(plan_name) (default C(J268-ho-v31-K5n.json))
        and C(extra), variables that are added or override the reference ones.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Show the head's environment
  ansible.builtin.debug:
    msg: "{{ {'ifname': 'enp1s0f1np1', 'hcas': 'rocep1s0f1,roceP2p1s0f1', 'host_ip': '198.18.0.13'}
      | sparkserve.dsv41.vllm_rank_env }}"
"""

RETURN = r"""
_value:
  description: Variable name to value, all strings.
  type: dict
"""


def vllm_rank_env_filter(settings):
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"vllm_rank_env takes a dict of settings, got {type(settings).__name__}")
    try:
        return vllm_rank_env(**settings)
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"vllm_rank_env: {error}") from error


class FilterModule:
    def filters(self):
        return {"vllm_rank_env": vllm_rank_env_filter}
