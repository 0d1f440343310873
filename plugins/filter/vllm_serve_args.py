# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Filter plugin vllm_serve_args: see DOCUMENTATION."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.module_utils._rank import vllm_serve_args

DOCUMENTATION = r"""
---
name: vllm_serve_args
short_description: The arguments after C(vllm serve) for one rank of the reference deployment
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Renders the measured reference command line for one rank; settings left out keep their
    reference value.
options:
  _input:
    description:
      - The settings as a dict. Required keys are C(node_rank) (0 for the head, i for worker i),
        C(nnodes) and C(master_addr) (the head's fabric IPv4).
      - Optional keys, reference value by default, are C(master_port), C(served_model_name),
        C(kv_cache_memory_bytes), C(gpu_memory_utilization), C(max_model_len), C(max_num_seqs),
        C(max_num_batched_tokens), C(num_speculative_tokens), C(cudagraph_mode), C(api_port),
        C(extra_args) (appended to the head's arguments) and C(model).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Show the worker's arguments
  ansible.builtin.debug:
    msg: "{{ {'node_rank': 1, 'nnodes': 2, 'master_addr': '198.18.0.13'}
      | sparkserve.dsv41.vllm_serve_args }}"
"""

RETURN = r"""
_value:
  description: The arguments, one list item each.
  type: list
  elements: str
"""


def vllm_serve_args_filter(settings):
    if not isinstance(settings, dict):
        raise AnsibleFilterError(f"vllm_serve_args takes a dict of settings, got {type(settings).__name__}")
    try:
        return vllm_serve_args(**settings)
    except (TypeError, ValueError) as error:
        raise AnsibleFilterError(f"vllm_serve_args: {error}") from error


class FilterModule:
    def filters(self):
        return {"vllm_serve_args": vllm_serve_args_filter}
