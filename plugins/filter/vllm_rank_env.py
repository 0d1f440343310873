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
short_description: The environment of one rank container of the deployment
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Renders the recipe's C(serve.env) with this node's fabric facts and the settings given.
  - The rank role passes the recipe's settings overridden by its C(rank_*) variables, and the
    fabric facts.
options:
  _input:
    description:
      - The settings as a dict.
      - Every value the recipe's environment names is required. For the DeepSeek-V4.1-Flash
        recipe - C(ifname), C(hcas) (the C(NCCL_IB_HCA) value), C(host_ip) (C(VLLM_HOST_IP)),
        C(gid_index) (C(NCCL_IB_GID_INDEX)) and C(plan_name) (the EXL3 plan under C(/plans/)).
      - May be left out - C(recipe) (the recipe, as C(deployment_recipe_spec); the
        DeepSeek-V4.1-Flash one when left out) and C(extra) (variables that are added or override
        the recipe's; none when left out).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Show the head's environment
  ansible.builtin.debug:
    msg: >-
      {{ {'ifname': 'enp1s0f1np1', 'hcas': 'rocep1s0f1,roceP2p1s0f1', 'host_ip': '198.18.0.13',
          'gid_index': 3, 'plan_name': rank_plan_name}
         | sparkserve.dsv41.vllm_rank_env }}
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
