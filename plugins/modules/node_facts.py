#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: a node's user, commands, Python modules, Docker engine, containers, peers (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_facts
short_description: Learn a node's user, what it lacks, its Docker engine and unanswered pings, in one run
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Returns, as facts, the user running the module under the names M(ansible.builtin.setup) gives
    them (C(user_id), C(user_uid), C(user_gid), C(user_dir)), at a fraction of setup's cost (the roles
    resolve C(~) with them on every run).
  - With O(commands), O(python_modules), O(python_distributions), O(docker), O(images), O(containers)
    or O(pings), also what the node lacks, which distributions another Python has, what its Docker
    engine answers, which of the images it has, the state and labels of the containers and which
    peers do not answer, so that a role checks everything it needs
    in this one module run (each module run costs about 0.3 s over SSH, a Docker module's more than
    twice that).
  - Reads only; changes nothing.
options:
  commands:
    description:
      - Commands to look up on the PATH and in the sbin directories; the ones not found are returned in
        RV(missing_commands).
    type: list
    elements: str
    default: []
  python_modules:
    description:
      - Modules to look up in the Python that runs this module (the one Ansible's modules use on the
        node); the ones it cannot import are returned in RV(missing_python_modules).
    type: list
    elements: str
    default: []
  python_distributions:
    description:
      - Distributions to look up in another Python on the node (a virtualenv's), with one run of it;
        their versions are returned in RV(python_distributions).
    type: dict
    suboptions:
      python:
        description: That Python's interpreter.
        type: path
        required: true
      names:
        description: The distributions' names.
        type: list
        elements: str
        required: true
  docker:
    description:
      - Ask the Docker engine, as the user running the module, for its version and container runtimes
        (RV(docker)). A node whose engine does not answer is reported, not failed.
    type: bool
    default: false
  images:
    description:
      - Image references (pinned by digest, as the roles pull them) to look up in the Docker engine, as
        the user running the module; the ones it has are returned in RV(present_images). An engine
        that does not answer has none.
    type: list
    elements: str
    default: []
  containers:
    description:
      - Container names to look up in the Docker engine, as the user running the module, in one call;
        their state and labels are returned in RV(containers) (never their environment, which may hold
        a secret).
    type: list
    elements: str
    default: []
  pings:
    description:
      - Peers to ping once each out of one interface, with "don't fragment" and a frame of the MTU given
        (C(ping -c 1 -W 2 -M do -s <mtu - 28> -I <interface> <address>)); the ones that do not answer
        are returned in RV(unanswered_pings).
    type: dict
    suboptions:
      interface:
        description: The interface to send from (this node's fabric interface).
        type: str
        required: true
      mtu:
        description: The interface's MTU, which both ends must share.
        type: int
        required: true
      peers:
        description: The peers' addresses by name (their inventory names), pinged in this order.
        type: dict
        required: true
  host_stack:
    description:
      - Read the host stack (kernel release, NVIDIA driver, each RDMA device's firmware, the memory
        figures of C(/proc/meminfo)) into RV(host_stack), with the problems that stop a deployment.
    type: dict
    suboptions:
      proc_root:
        description: Where C(/proc) is read (a fixture in tests).
        type: path
        default: /proc
      sysfs_root:
        description: Where C(/sys) is read (the RDMA devices' C(fw_ver)).
        type: path
        default: /sys
      known_bad:
        description: Versions that stop a deployment, each with why.
        type: list
        elements: dict
        default: []
        suboptions:
          item:
            description: What the version is of.
            type: str
            required: true
            choices: [kernel, driver, nic_firmware]
          version:
            description: The exact version string, as RV(host_stack) shows it.
            type: str
            required: true
          why:
            description: What goes wrong with it, for the message.
            type: str
            default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
attributes:
  check_mode:
    support: full
    details: Only reads; behaves the same in check mode.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
seealso:
  - module: ansible.builtin.setup
"""

EXAMPLES = r"""
- name: Learn the deployment user's home directory
  sparkserve.dsv41.node_facts:

- name: Look up the required commands and ask the Docker engine
  sparkserve.dsv41.node_facts:
    commands: [python3, rsync, curl]
    docker: true
  register: node

- name: Look up the version of huggingface_hub in a virtualenv
  sparkserve.dsv41.node_facts:
    python_distributions:
      python: /home/spark/.dsv41-two-sparks/hf-venv/bin/python
      names: [huggingface_hub]
  register: node

- name: Look up a container's state and labels
  sparkserve.dsv41.node_facts:
    containers: [dsv41-r0]
  register: node

- name: Ping a peer over the fabric, unfragmented at the interface's MTU
  sparkserve.dsv41.node_facts:
    pings:
      interface: enp1s0f1np1
      mtu: 9000
      peers: {worker: 198.18.0.11}
  register: node

- name: Fail on a missing command
  ansible.builtin.assert:
    that: node.missing_commands | length == 0
    fail_msg: "command not found: {{ node.missing_commands | join(', ') }}"
"""

RETURN = r"""
host_stack:
  description:
    - With O(host_stack), the host stack (C(kernel), C(driver), C(nic_firmware) by RDMA device,
      C(mem_total_kb), C(mem_available_kb), C(cma_total_kb), C(cma_free_kb); null where unknown) and
      C(problems), what stops a deployment on this host.
  returned: when O(host_stack) is given
  type: dict
  sample: {"kernel": "6.17.0-1014-nvidia", "driver": "580.95.05",
           "nic_firmware": {"rocep1s0f1": "28.45.4028"}, "mem_total_kb": 125000000,
           "mem_available_kb": 118000000, "cma_total_kb": 0, "cma_free_kb": 0, "problems": []}
ansible_facts:
  description: The user running the module, as M(ansible.builtin.setup) names it.
  returned: always
  type: dict
  contains:
    user_id:
      description: The user's name.
      type: str
      sample: spark
    user_uid:
      description: The user's numeric ID.
      type: int
      sample: 1000
    user_gid:
      description: The user's primary group ID.
      type: int
      sample: 1000
    user_dir:
      description: The user's home directory.
      type: str
      sample: /home/spark
missing_commands:
  description: The names of O(commands) not found on the PATH, in the order given.
  returned: always
  type: list
  elements: str
  sample: [rsync]
missing_python_modules:
  description: The names of O(python_modules) the node's Python cannot import, in the order given.
  returned: always
  type: list
  elements: str
  sample: [requests]
python_distributions:
  description:
    - For each name of O(python_distributions), the version that Python has; empty when it does not
      have it, or when that Python does not run (missing, or a broken virtualenv).
  returned: always
  type: dict
  sample: {huggingface_hub: 2.4.0}
present_images:
  description: The references of O(images) the Docker engine has, in the order given.
  returned: always
  type: list
  elements: str
  sample: [nvcr.io/nvidia/vllm@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef]
unanswered_pings:
  description: The O(pings) that got no answer, in the order given, each with why.
  returned: always
  type: list
  elements: dict
  sample:
    - name: worker
      address: 198.18.0.11
      why: "1 packets transmitted, 0 received, 100% packet loss, time 0ms"
  contains:
    name:
      description: The peer's name.
      type: str
    address:
      description: The peer's address.
      type: str
    why:
      description: "ping's error, else its loss summary (C(ping: command not found) without ping)."
      type: str
containers:
  description: For each name of O(containers), the container's state and labels.
  returned: always
  type: dict
  sample:
    dsv41-r0:
      status: running
      labels: {sparkserve.dsv41.spec-sha256: 3c1e0b0f5a5e4c0d9b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c}
  contains:
    status:
      description:
        - Docker's state of the container (C(created), C(running), C(exited), ...), or C(missing) when the
          engine has no such container or does not answer.
      type: str
    labels:
      description: The container's labels (its image's included).
      type: dict
docker:
  description: What the Docker engine answered.
  returned: when O(docker=true)
  type: dict
  contains:
    version:
      description: The engine's version; empty when it did not answer.
      type: str
      sample: 28.3.3
    runtimes:
      description: The names of the engine's container runtimes.
      type: list
      elements: str
      sample: [io.containerd.runc.v2, nvidia, runc]
    error:
      description: Why the engine did not answer (the docker CLI's message); empty when it did.
      type: str
      sample: "permission denied while trying to connect to the Docker daemon socket"
"""

import importlib.util
import os
import pwd
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._node import (
    CONTAINER_FORMAT,
    DISTRIBUTIONS_SCRIPT,
    DOCKER_INFO_FORMAT,
    HOST_STACK_ITEMS,
    distribution_versions,
    host_stack_problems,
    missing_commands,
    missing_python_modules,
    parse_container_states,
    parse_docker_info,
    ping_argv,
    ping_failure,
    present_images,
    read_host_stack,
    user_facts,
)

SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def python_distributions(module: AnsibleModule, asked: dict | None) -> dict[str, str]:
    """The versions of the distributions ``asked`` in the Python it names ("" when it does not run)."""
    if not asked:
        return {}
    if not os.access(asked["python"], os.X_OK):
        return distribution_versions(asked["names"], 127, "")
    rc, stdout, _err = module.run_command([asked["python"], "-c", DISTRIBUTIONS_SCRIPT, *asked["names"]])
    return distribution_versions(asked["names"], rc, stdout)


def unanswered_pings(module: AnsibleModule, pings: dict | None) -> list[dict]:
    """The peers of ``pings`` that gave no answer, one ping each, in the order given."""
    if not pings:
        return []
    ping_bin = module.get_bin_path("ping")
    unanswered = []
    for name, address in pings["peers"].items():
        if ping_bin:
            why = ping_failure(
                *module.run_command(ping_argv(ping_bin, pings["interface"], pings["mtu"], address))
            )
        else:
            why = "ping: command not found"
        if why:
            unanswered.append({"name": name, "address": address, "why": why})
    return unanswered


def _read_or_none(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "commands": {"type": "list", "elements": "str", "default": []},
            "python_modules": {"type": "list", "elements": "str", "default": []},
            "python_distributions": {
                "type": "dict",
                "options": {
                    "python": {"type": "path", "required": True},
                    "names": {"type": "list", "elements": "str", "required": True},
                },
            },
            "docker": {"type": "bool", "default": False},
            "images": {"type": "list", "elements": "str", "default": []},
            "containers": {"type": "list", "elements": "str", "default": []},
            "pings": {
                "type": "dict",
                "options": {
                    "interface": {"type": "str", "required": True},
                    "mtu": {"type": "int", "required": True},
                    "peers": {"type": "dict", "required": True},
                },
            },
            "host_stack": {
                "type": "dict",
                "options": {
                    "proc_root": {"type": "path", "default": "/proc"},
                    "sysfs_root": {"type": "path", "default": "/sys"},
                    "known_bad": {
                        "type": "list",
                        "elements": "dict",
                        "default": [],
                        "options": {
                            "item": {"type": "str", "required": True, "choices": list(HOST_STACK_ITEMS)},
                            "version": {"type": "str", "required": True},
                            "why": {"type": "str", "default": ""},
                        },
                    },
                },
            },
        },
        supports_check_mode=True,
    )
    params = module.params
    entry = pwd.getpwuid(os.geteuid())
    result = {
        "changed": False,
        "ansible_facts": user_facts(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir),
        # The sbin directories too, where systemd finds a unit's command (a user's PATH may lack them).
        "missing_commands": missing_commands(
            params["commands"],
            lambda name: shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *SBIN_DIRS])),
        ),
        "missing_python_modules": missing_python_modules(params["python_modules"], importlib.util.find_spec),
    }
    result["python_distributions"] = python_distributions(module, params["python_distributions"])
    asks_docker = params["docker"] or params["images"] or params["containers"]
    docker_bin = module.get_bin_path("docker") if asks_docker else None
    result["present_images"] = present_images(
        params["images"],
        lambda image: (
            bool(docker_bin)
            and module.run_command([docker_bin, "image", "inspect", "--format", "{{.Id}}", image])[0] == 0
        ),
    )
    inspected = ""
    if params["containers"] and docker_bin:
        _rc, inspected, _err = module.run_command(
            [docker_bin, "container", "inspect", "--format", CONTAINER_FORMAT, *params["containers"]]
        )
    result["containers"] = parse_container_states(params["containers"], inspected)
    result["unanswered_pings"] = unanswered_pings(module, params["pings"])
    if params["host_stack"]:
        wanted = params["host_stack"]
        stack = read_host_stack(wanted["proc_root"], wanted["sysfs_root"], _read_or_none)
        result["host_stack"] = {**stack, "problems": host_stack_problems(stack, wanted["known_bad"])}
    if params["docker"]:
        if docker_bin:
            docker = parse_docker_info(
                *module.run_command([docker_bin, "info", "--format", DOCKER_INFO_FORMAT])
            )
            if docker["error"]:
                # Some docker CLIs answer a formatted info with a template error; version says why.
                _rc, _out, why = module.run_command(
                    [docker_bin, "version", "--format", "{{.Server.Version}}"]
                )
                docker["error"] = why.strip() or docker["error"]
        else:
            docker = parse_docker_info(127, "", "docker: command not found")
        result["docker"] = docker
    module.exit_json(**result)


if __name__ == "__main__":
    main()
