#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: discover a DGX Spark node's RDMA fabric (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fabric_info
short_description: Discover the RDMA/RoCE fabric of a DGX Spark node
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Reads the RDMA devices under C(<sysfs_root>/class/infiniband), their netdevs, port state,
    link layer and RoCE v2 GID table, the netdevs' MTU, operstate and carrier from
    C(<sysfs_root>/class/net), and the node's IPv4 addresses from C(ip -j -4 addr show).
  - Picks the fabric that vLLM, NCCL and Gloo must use. Automatic selection takes the RDMA
    devices in case-insensitive natural order (C(rocep1s0f0), C(rocep1s0f1), C(roceP2p1s0f0),
    C(roceP2p1s0f1), which is PCI order) and uses the first one whose port is C(ACTIVE), whose
    link layer is C(Ethernet), and whose netdev holds an IPv4 address with a matching RoCE v2 GID.
  - The HCA list holds the device behind the chosen interface first, then every other ACTIVE
    Ethernet RDMA device (the second PCIe half of a cabled QSFP port has no address of its own).
  - Interfaces that are not the netdev of an RDMA device (Wi-Fi C(wlP9s9), management
    C(enP7s7), C(tailscale0), C(docker0)) are never selected, even when they hold IPv4.
  - Fails with every device and the reason it was rejected when nothing is usable, naming the
    role variables C(fabric_ifname), C(fabric_ipv4) and C(fabric_hcas) to set.
  - Never changes anything; RV(changed) is always false.
options:
  sysfs_root:
    description:
      - Root of the sysfs tree to read. Point it at a fixture tree (see
        C(lab/standins/sysfs/make_rdma_sysfs.py)) where there is no ConnectX hardware.
    type: path
    default: /sys
  ifname:
    description:
      - Use this netdev as the fabric interface instead of choosing one (role variable
        C(fabric_ifname)).
      - It must be the netdev of an RDMA device whose port is ACTIVE with an IPv4 address that
        has a RoCE v2 GID; otherwise the module fails listing the RDMA netdevs that exist.
    type: str
  ipv4:
    description:
      - Use this address (plain dotted quad, no prefix) as the fabric address (role variable
        C(fabric_ipv4)).
      - It must be assigned to the netdev of an RDMA device (to O(ifname) when that is set too);
        without O(ifname) the interface holding it is used.
    type: str
  hcas:
    description:
      - Use exactly these RDMA devices, in this order, for C(NCCL_IB_HCA) (role variable
        C(fabric_hcas)).
      - Every name must exist under C(class/infiniband). Without O(ifname) and O(ipv4) the
        interface is that of the first usable device in this list. A device that is not ACTIVE
        gives a warning.
    type: list
    elements: str
notes:
  - Supports check mode; it only reads, so check mode returns the same data.
  - Only port 1 is read; a DGX Spark's ConnectX-7 exposes one port per RDMA device.
  - Requires C(ip) from iproute2 with JSON output (C(-j)).
seealso:
  - name: NCCL environment variables
    description: C(NCCL_IB_HCA), C(NCCL_IB_GID_INDEX), C(NCCL_SOCKET_IFNAME).
    link: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads only; returns the same data in check mode.
  diff_mode:
    support: none
    details: Nothing is changed, so there is no diff.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Discover the fabric
  sparkserve.dsv41.fabric_info:
  register: fabric_result

- name: Use the result as facts for the rank containers
  ansible.builtin.set_fact:
    fabric: "{{ fabric_result.fabric }}"

- name: Environment for NCCL and Gloo
  ansible.builtin.debug:
    msg:
      NCCL_SOCKET_IFNAME: "{{ fabric.ifname }}"
      GLOO_SOCKET_IFNAME: "{{ fabric.ifname }}"
      NCCL_IB_HCA: "{{ fabric.nccl_ib_hca }}"
      NCCL_IB_GID_INDEX: "{{ fabric.gid_index }}"

- name: Role variables win when set
  sparkserve.dsv41.fabric_info:
    ifname: "{{ fabric_ifname | default(omit) }}"
    ipv4: "{{ fabric_ipv4 | default(omit) }}"
    hcas: "{{ fabric_hcas | default(omit) }}"
  register: fabric_result

- name: Read the lab's stand-in tree instead of /sys
  sparkserve.dsv41.fabric_info:
    sysfs_root: /opt/sparkserve-lab/sysfs
  register: fabric_result
"""

RETURN = r"""
changed:
  description: Always false; the module only reads.
  returned: always
  type: bool
  sample: false
problems:
  description:
    - What makes the fabric slower than its port allows and stops preflight, in words - the other
      PCIe half of the chosen device's QSFP port DOWN, or (discovered, not set by O(hcas)) left out
      of the HCAs.
  returned: success
  type: list
  elements: str
  sample:
    - "roceP2p1s0f1, the other half of rocep1s0f1's port, is DOWN: NCCL gets about half of the bandwidth"
fabric:
  description:
    - The selected fabric, compact enough to store as a fact and template into the rank
      environment.
  returned: success
  type: dict
  contains:
    ifname:
      description: Fabric netdev, for C(NCCL_SOCKET_IFNAME) and C(GLOO_SOCKET_IFNAME).
      type: str
      returned: success
      sample: enp1s0f1np1
    ipv4:
      description: The fabric IPv4 address that ranks bind to (C(--master-addr) on the head).
      type: str
      returned: success
      sample: 198.18.0.13
    prefix:
      description: Prefix length of O(ipv4) on O(ifname).
      type: int
      returned: success
      sample: 24
    mtu:
      description: MTU of the fabric netdev (sysfs, else C(ip)); null when neither tells.
      type: int
      returned: success
      sample: 9000
    gid_index:
      description: Index of the RoCE v2 GID for the fabric address, for C(NCCL_IB_GID_INDEX).
      type: int
      returned: success
      sample: 3
    hcas:
      description: RDMA devices for NCCL, the one behind the fabric interface first.
      type: list
      elements: str
      returned: success
      sample: [rocep1s0f1, roceP2p1s0f1]
    nccl_ib_hca:
      description: RV(fabric.hcas) joined with commas, the value of C(NCCL_IB_HCA).
      type: str
      returned: success
      sample: rocep1s0f1,roceP2p1s0f1
rdma_devices:
  description:
    - Every RDMA device under C(class/infiniband) in selection order, with why it is or is not
      usable.
  returned: success; also on failure once the devices were read
  type: list
  elements: dict
  contains:
    name:
      description: RDMA device name.
      type: str
      returned: always
      sample: rocep1s0f1
    port:
      description: Port number read (always 1).
      type: int
      returned: always
      sample: 1
    state:
      description: >-
        Port state without its number (C(4: ACTIVE) becomes C(ACTIVE)); C(UNKNOWN) if unreadable.
      type: str
      returned: always
      sample: ACTIVE
    phys_state:
      description: Physical port state without its number; null if unreadable.
      type: str
      returned: always
      sample: LinkUp
    link_layer:
      description: Link layer of the port; null if unreadable.
      type: str
      returned: always
      sample: Ethernet
    usable:
      description: Whether automatic selection could use this device.
      type: bool
      returned: always
      sample: true
    reason:
      description: Why the device is not usable; null when it is.
      type: str
      returned: always
      sample: port 1 state is DOWN (phys_state Disabled)
    roce_v2_gids:
      description: Populated RoCE v2 GID table entries of the port.
      type: list
      elements: dict
      returned: always
      sample:
        - {index: 1, gid: "fe80:0000:0000:0000:5ea6:2dff:fe11:2233", ndev: enp1s0f1np1, ipv4: null}
        - {index: 3, gid: "0000:0000:0000:0000:0000:ffff:c612:000d", ndev: enp1s0f1np1, ipv4: 198.18.0.13}
    netdevs:
      description: Netdevs listed under C(device/net) of the device.
      type: list
      elements: dict
      returned: always
      contains:
        ifname:
          description: Netdev name.
          type: str
          returned: always
          sample: enp1s0f1np1
        mtu:
          description: MTU; null if unknown.
          type: int
          returned: always
          sample: 9000
        operstate:
          description: Content of C(class/net/<ifname>/operstate); null if unreadable.
          type: str
          returned: always
          sample: up
        carrier:
          description: Carrier from C(class/net/<ifname>/carrier); null if unreadable (interface down).
          type: bool
          returned: always
          sample: true
        ipv4:
          description: IPv4 addresses, each with the index of its RoCE v2 GID (null when none matches).
          type: list
          elements: dict
          returned: always
          sample:
            - {address: 198.18.0.13, prefix: 24, gid_index: 3}
non_rdma_interfaces:
  description:
    - Interfaces holding IPv4 that are not the netdev of any RDMA device (loopback left out);
      they are never used for the fabric.
  returned: success; also on failure once the devices were read
  type: list
  elements: dict
  sample:
    - {ifname: enP7s7, ipv4: [10.20.0.13/24]}
    - {ifname: wlP9s9, ipv4: [192.168.1.20/24]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._fabric import (
    FabricError,
    discover_fabric,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "sysfs_root": {"type": "path", "default": "/sys"},
            "ifname": {"type": "str"},
            "ipv4": {"type": "str"},
            "hcas": {"type": "list", "elements": "str"},
        },
        supports_check_mode=True,
    )
    ip_bin = module.get_bin_path("ip", required=True)
    command = [ip_bin, "-j", "-4", "addr", "show"]
    rc, stdout, stderr = module.run_command(command)
    if rc != 0:
        module.fail_json(
            msg=f"{' '.join(command)} failed (rc={rc}): {stderr.strip()}",
            rc=rc,
            stdout=stdout,
            stderr=stderr,
            changed=False,
        )

    try:
        result = discover_fabric(
            module.params["sysfs_root"],
            stdout,
            ifname=module.params["ifname"],
            ipv4=module.params["ipv4"],
            hcas=module.params["hcas"],
        )
    except FabricError as exc:
        module.fail_json(msg=str(exc), changed=False, **exc.details)

    for warning in result.pop("warnings"):
        module.warn(warning)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
