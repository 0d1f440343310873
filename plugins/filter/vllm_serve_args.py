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
short_description: The arguments after C(vllm serve) for one rank of the deployment
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Renders one rank's command line from its recipe, in the recipe's order - C(serve.args), then
    C(serve.head_args) on the head or C(serve.worker_args) on a worker.
  - The rank role passes the recipe's settings overridden by its C(rank_*) variables, and the run's
    facts.
options:
  _input:
    description:
      - The settings as a dict.
      - Always required - C(node_rank) (0 for the head, i for worker i) and C(nnodes).
      - Every other value the recipe's templates name is required. For the DeepSeek-V4.1-Flash
        recipe - C(master_addr) (the head's fabric IPv4), C(master_port), C(served_model_name),
        C(engine_host) and C(engine_port) (where the engine listens, behind the API gateway), and the
        recipe's settings C(kv_cache_memory_bytes), C(gpu_memory_utilization), C(max_model_len),
        C(max_num_seqs), C(max_num_batched_tokens), C(num_speculative_tokens) and C(cudagraph_mode).
      - May be left out - C(recipe) (the recipe, as C(deployment_recipe_spec); the
        DeepSeek-V4.1-Flash one when left out), C(cudagraph_capture_sizes) (CUDA graph capture
        sizes; empty or left out derives them from C(max_num_seqs) and C(num_speculative_tokens)),
        C(extra_args) (appended to the head's arguments), C(allowed_media_domains) (the only domains
        a request's media URLs may name; none when left out) and C(model) (the checkpoint's path
        inside the container, C(/model) when left out).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Show the worker's arguments with the rank role's settings
  ansible.builtin.debug:
    msg: >-
      {{ {'node_rank': 1, 'nnodes': 2, 'master_addr': '198.18.0.13',
          'master_port': rank_master_port, 'served_model_name': deployment_served_model_name,
          'engine_host': '127.0.0.1', 'engine_port': deployment_engine_port,
          'kv_cache_memory_bytes': rank_kv_cache_memory_bytes,
          'gpu_memory_utilization': rank_gpu_memory_utilization,
          'max_model_len': rank_max_model_len, 'max_num_seqs': rank_max_num_seqs,
          'max_num_batched_tokens': rank_max_num_batched_tokens,
          'num_speculative_tokens': rank_num_speculative_tokens,
          'cudagraph_mode': rank_cudagraph_mode}
         | sparkserve.dsv41.vllm_serve_args }}
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
