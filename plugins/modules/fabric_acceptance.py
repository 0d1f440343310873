#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: judge the fabric test's figures and keep the head's acceptance record."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_acceptance
short_description: Judge the fabric's collective bandwidth and keep the last good result
version_added: 0.4.0
author: sparkserve maintainers (@sparkserve)
description:
  - Reads every node's output of the fabric test (the rank role's C(dsv41_fabric_check.py), run in
    the serving image with the ranks' environment) and judges the lowest bus bandwidth of all_reduce
    and all_gather at the largest size tested.
  - C(fail) when a node's test failed, a collective gave wrong values or the figure is below
    O(min_busbw_gbps); C(warn) when it is more than O(warn_drop_percent) below the last good result;
    C(pass) otherwise. A pass becomes the last good result.
  - With O(state=query), only says whether the record already accepts O(fingerprint) (the
    settings last tested), so that a deployment tests the fabric only when the image or the fabric
    settings changed.
  - Fails (after writing the record) when the verdict is C(fail).
options:
  path:
    description: The acceptance record on the head (JSON, mode 0600).
    type: path
    required: true
  state:
    description:
      - C(judged) judges O(nodes) and records the result; C(query) reads the record only.
    type: str
    choices: [judged, query]
    default: judged
  fingerprint:
    description: What the result stands for (the image and the fabric settings, hashed by the role).
    type: str
    required: true
  nodes:
    description:
      - Every node's run of the test by inventory name, rank 0 (the head) first, as
        M(ansible.builtin.command) registered it (its C(rc), C(stdout) and C(stderr) are read; rank 0
        prints the report on its standard output). Required with O(state=judged).
    type: dict
  link:
    description: The fabric between the nodes, in words, for the messages (names, interfaces, addresses).
    type: str
    default: the fabric
  min_busbw_gbps:
    description: The bus bandwidth, in GB/s, below which the fabric fails.
    type: float
    default: 18.0
  warn_drop_percent:
    description: How far, in percent, below the last good result a passing figure is a warning.
    type: float
    default: 20.0
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Judges and reports; writes nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The bus bandwidth follows nccl-tests (algbw times 2(n-1)/n for all_reduce, (n-1)/n for
    all_gather, the size being the gathered bytes), so its figures compare with nccl-tests' busbw.
"""

EXAMPLES = r"""
- name: Judge the fabric test
  sparkserve.dsv41.fabric_acceptance:
    path: /home/spark/.local/state/sparkserve-dsv41/fabric-acceptance.json
    fingerprint: "{{ fingerprint }}"
    link: spark-1 (enp1s0f1np1 10.0.0.1) <-> spark-2 (enp1s0f1np1 10.0.0.2)
    min_busbw_gbps: 18
    nodes:
      spark-1: "{{ hostvars['spark-1'].fabric_test }}"
      spark-2: "{{ hostvars['spark-2'].fabric_test }}"

- name: Ask whether these settings were accepted already
  sparkserve.dsv41.fabric_acceptance:
    path: /home/spark/.local/state/sparkserve-dsv41/fabric-acceptance.json
    fingerprint: "{{ fingerprint }}"
    state: query
  register: acceptance
"""

RETURN = r"""
accepted:
  description: Whether the record's last result is for O(fingerprint) and did not fail.
  returned: always
  type: bool
verdict:
  description: C(pass), C(warn) or C(fail).
  returned: when state is judged
  type: str
figure:
  description: The figure that decided (collective, bytes, time_us, algbw_gbps, busbw_gbps, wrong).
  returned: when state is judged and the test ran
  type: dict
table:
  description: Bus bandwidth per collective and size, nccl-tests' columns.
  returned: when state is judged and the test ran
  type: list
  elements: str
report:
  description: Rank 0's report (backend, world size, torch and NCCL versions, environment, results).
  returned: when state is judged and the test ran
  type: dict
record:
  description: The record after this run (last and last_good).
  returned: always
  type: dict
msg:
  description: The verdict in words, naming the link and the figure.
  returned: always
  type: str
"""

import datetime

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._fabric_acceptance import (
    AcceptanceError,
    accepted,
    judge,
    parse_node_output,
    read_record,
    table,
    updated_record,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    dump_json,
    read_text,
    write_atomically,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["judged", "query"], "default": "judged"},
            "fingerprint": {"type": "str", "required": True},
            "nodes": {"type": "dict"},
            "link": {"type": "str", "default": "the fabric"},
            "min_busbw_gbps": {"type": "float", "default": 18.0},
            "warn_drop_percent": {"type": "float", "default": 20.0},
        },
        required_if=[("state", "judged", ["nodes"])],
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    try:
        record = read_record(read_text(path))
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc.strerror or exc}", path=path)
    if params["state"] == "query":
        is_accepted = accepted(record, params["fingerprint"])
        module.exit_json(
            changed=False,
            accepted=is_accepted,
            record=record,
            msg=f"these settings {'passed' if is_accepted else 'have not passed'} the fabric test",
        )
    try:
        nodes = [parse_node_output(host, run) for host, run in params["nodes"].items()]
        result = judge(
            nodes,
            link=params["link"],
            min_busbw_gbps=params["min_busbw_gbps"],
            warn_drop_percent=params["warn_drop_percent"],
            last_good=record.get("last_good"),
        )
    except AcceptanceError as exc:
        module.fail_json(msg=f"cannot read the fabric test's output: {exc}", path=path)
    report = next((node["report"] for node in nodes if node.get("report")), None)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    after = updated_record(record, result=result, report=report, fingerprint=params["fingerprint"], time=now)
    if not module.check_mode:
        try:
            write_atomically(module, path, dump_json(after).encode(), mode="0600")
            module.set_mode_if_different(path, "0600", False)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {path}: {exc.strerror or exc}", path=path)
    output = {
        # The record is rewritten on every test: the test ran, which is the change to report.
        "changed": True,
        "accepted": result["verdict"] != "fail",
        "verdict": result["verdict"],
        "figure": result["figure"],
        "table": table(report) if report else [],
        "report": report,
        "record": after,
        "msg": result["msg"],
    }
    if result["verdict"] == "fail":
        module.fail_json(**output)
    if result["verdict"] == "warn":
        module.warn(result["msg"])
    module.exit_json(**output)


if __name__ == "__main__":
    main()
