# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Filter plugin deployment_health: see DOCUMENTATION."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.module_utils._health import deployment_health, health_table

DOCUMENTATION = r"""
---
name: deployment_health
short_description: Whether the deployment is healthy, why not, and a table for an operator
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Judges the deployment from what its nodes report, as C(status.yml) does - every rank's real
    container state, every node's memory guard, the API's C(/health) and progress, the supervisor's
    state - and lists every problem found.
options:
  _input:
    description:
      - The nodes in rank order, each C({name, rank, status, error, guard, host_stack}) - C(status) is
        the rank control's C(status) output (or null when the node could not be asked, with C(error)),
        C(guard) what C(systemctl is-active) says of the memory guard, C(host_stack) the node's kernel,
        driver and NIC firmware as C(sparkserve.dsv41.node_facts) reads them (left out, nothing is
        compared).
    type: list
    elements: dict
    required: true
  api:
    description:
      - The API - C({health, running, waiting, generation_tokens_total, stalled}); C(health) is the HTTP
        code or null; C(stalled) comes from the supervisor's state, its verdict that requests run and no
        new token came for its hang threshold (null when not), reported as a hang while its state is current.
    type: dict
    required: true
  supervisor:
    description: The supervisor's state file, or null when there is none.
    type: dict
  supervisor_enabled:
    description: Whether the supervisor should be running (C(supervisor_enabled)).
    type: bool
    default: true
  supervisor_interval:
    description: The supervisor's interval in seconds; a state older than six of them means it is not running.
    type: float
    default: 5
  deployments:
    description: The deployment record (C(<state dir>/deployments.json) on the head), shown; or null.
    type: dict
"""

EXAMPLES = r"""
- name: Judge the deployment
  ansible.builtin.set_fact:
    verdict: >-
      {{ nodes | sparkserve.dsv41.deployment_health(api=api, supervisor=supervisor_state) }}
"""

RETURN = r"""
_value:
  description: The verdict.
  type: dict
  contains:
    healthy:
      description: Whether nothing is wrong.
      type: bool
    problems:
      description: One line per problem, naming the node, the rank or the part and what is wrong.
      type: list
      elements: str
    nodes:
      description: The nodes given.
      type: list
      elements: dict
    api:
      description: The API given.
      type: dict
    supervisor:
      description: The supervisor's state given, or null.
      type: dict
    memguard_kills:
      description:
        - The memory guard's last kill on each node that had one - C({node, time}), the time in
          seconds since the epoch.
      type: list
      elements: dict
    deployments:
      description: The deployment record given, or null.
      type: dict
    host_stack_changes:
      description:
        - What differs between the nodes' kernel, driver and NIC firmware, and what changed on each
          node since the serving deployment was recorded (from the nodes' C(host_stack)).
      type: list
      elements: str
    table:
      description: The nodes, the API, the record and the supervisor as lines, ending with the verdict.
      type: str
"""


def deployment_health_filter(
    nodes, api, supervisor=None, supervisor_enabled=True, supervisor_interval=5, *, deployments=None
):
    if not isinstance(nodes, list) or not all(isinstance(node, dict) for node in nodes):
        raise AnsibleFilterError(
            f"deployment_health wants a list of nodes (dicts), got {type(nodes).__name__}"
        )
    try:
        report = deployment_health(
            nodes,
            dict(api),
            supervisor,
            supervisor_enabled=bool(supervisor_enabled),
            supervisor_interval=float(supervisor_interval),
            deployments=deployments if isinstance(deployments, dict) else None,
        )
        table = health_table(report)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"deployment_health: {exc}") from exc
    return {**report, "table": table}


class FilterModule:
    def filters(self):
        return {"deployment_health": deployment_health_filter}
