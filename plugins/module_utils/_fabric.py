# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""RDMA fabric discovery on DGX Spark nodes, as pure functions behind ``fabric_info``.

Reads ``<sysfs_root>/class/infiniband`` and ``<sysfs_root>/class/net`` plus the JSON printed
by ``ip -j -4 addr show``, and picks the interface, address, HCAs and RoCE v2 GID index that
vLLM, NCCL and Gloo must use. Nothing here runs commands or talks to Ansible, so every rule
can be unit-tested against a fixture tree.

Internal to sparkserve.dsv41; not a public API.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from typing import Any

# A Spark's ConnectX-7 exposes one port per RDMA device.
SPARK_PORT = 1
ACTIVE = "ACTIVE"
ETHERNET = "Ethernet"
ROCE_V2 = "RoCE v2"

# Users set role variables, not module options; error messages name both.
HOW_TO_OVERRIDE = (
    "Set fabric_ifname, fabric_ipv4 and/or fabric_hcas (module options ifname, ipv4, hcas) "
    "to choose the fabric explicitly."
)


class FabricError(Exception):
    """No usable fabric, or an override that does not match this node.

    ``details`` carries what was seen (devices, other interfaces) for ``fail_json``.
    """

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = details or {}


# --- small parsers -------------------------------------------------------------------------


def device_sort_key(name: str) -> tuple[list[tuple[int, int | str]], str]:
    """Case-insensitive natural order, ties broken by the exact name.

    Spark names mix case (``rocep1s0f1``, ``roceP2p1s0f1``); plain ``sorted`` would put every
    ``roceP...`` before ``rocep...``. Comparing lower-cased text with numbers as numbers gives
    PCI domain/bus/function order: rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1.
    """
    chunks: list[tuple[int, int | str]] = [
        (0, int(part)) if part.isdigit() else (1, part.lower()) for part in re.split(r"(\d+)", name) if part
    ]
    return chunks, name


def parse_port_state(text: str | None) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``; ``1: DOWN`` -> ``DOWN``; a bare name is accepted too."""
    if not text or not text.strip():
        return "UNKNOWN"
    return text.split(":", 1)[-1].strip() or "UNKNOWN"


def ipv4_to_roce_gid(ipv4: str) -> str:
    """The IPv4-mapped GID the kernel lists for an address, in sysfs spelling."""
    packed = ipaddress.IPv4Address(ipv4).packed
    return "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}".format(*packed)


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address an IPv4-mapped GID stands for, else None (link-local, IPv6, empty)."""
    try:
        mapped = ipaddress.IPv6Address(gid.strip()).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


def validate_ipv4(value: str) -> str:
    """Normalise a plain dotted-quad address; a prefix or hostname is a user error."""
    try:
        return str(ipaddress.IPv4Address(value.strip()))
    except ValueError:
        raise FabricError(
            f"fabric_ipv4 (module option ipv4) must be a plain IPv4 address such as 198.18.0.13, "
            f"not {value!r}."
        ) from None


def parse_ip_addr_json(text: str) -> dict[str, dict[str, Any]]:
    """Parse ``ip -j -4 addr show`` into ``{ifname: {mtu, operstate, loopback, ipv4: [...]}}``.

    Some iproute2 versions print ``{}`` for interfaces that the ``-4`` filter emptied, and an
    interface may lack ``addr_info``; both are kept as interfaces without addresses.
    """
    try:
        entries = json.loads(text or "[]")
    except ValueError as exc:
        raise FabricError(f"Could not parse the JSON printed by 'ip -j -4 addr show': {exc}") from None
    if not isinstance(entries, list):
        raise FabricError("'ip -j -4 addr show' did not print a JSON list.")

    interfaces: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("ifname"):
            continue
        addresses = [
            {"address": info["local"], "prefix": int(info.get("prefixlen", 32))}
            for info in entry.get("addr_info") or []
            if isinstance(info, dict) and info.get("family") == "inet" and info.get("local")
        ]
        known = interfaces.setdefault(
            entry["ifname"],
            {
                "mtu": entry.get("mtu"),
                "operstate": entry.get("operstate"),
                "loopback": "LOOPBACK" in (entry.get("flags") or []),
                "ipv4": [],
            },
        )
        known["ipv4"].extend(addresses)
    return interfaces


# --- sysfs ---------------------------------------------------------------------------------


def _read_text(path: str) -> str | None:
    """File content stripped, or None: real sysfs answers EINVAL for empty GID slots."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _list_dir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def read_netdev_attributes(sysfs_root: str, ifname: str) -> dict[str, Any]:
    """MTU, operstate and carrier from ``<sysfs_root>/class/net/<ifname>/`` (None if unreadable)."""
    base = os.path.join(sysfs_root, "class", "net", ifname)
    mtu_text = _read_text(os.path.join(base, "mtu"))
    carrier_text = _read_text(os.path.join(base, "carrier"))
    return {
        "mtu": int(mtu_text) if mtu_text and mtu_text.isdigit() else None,
        "operstate": _read_text(os.path.join(base, "operstate")),
        "carrier": carrier_text == "1" if carrier_text in ("0", "1") else None,
    }


def read_roce_v2_gids(port_dir: str) -> list[dict[str, Any]]:
    """Every populated RoCE v2 GID of a port: ``[{index, gid, ndev, ipv4}]``, by index."""
    gids = []
    gid_dir = os.path.join(port_dir, "gids")
    for entry in sorted((name for name in _list_dir(gid_dir) if name.isdigit()), key=int):
        gid = _read_text(os.path.join(gid_dir, entry))
        gid_type = _read_text(os.path.join(port_dir, "gid_attrs", "types", entry))
        if not gid or gid_type != ROCE_V2:
            continue
        gids.append(
            {
                "index": int(entry),
                "gid": gid,
                "ndev": _read_text(os.path.join(port_dir, "gid_attrs", "ndevs", entry)),
                "ipv4": gid_ipv4(gid),
            }
        )
    return gids


def _gid_index_for(gids: list[dict[str, Any]], ifname: str, address: str) -> int | None:
    for gid in gids:
        # ndevs can be unreadable on some kernels; the address match alone then has to do.
        if gid["ipv4"] == address and gid["ndev"] in (ifname, None):
            return gid["index"]
    return None


def _rejection_reason(device: dict[str, Any]) -> str | None:
    """Why auto-selection cannot use this device, or None when it can."""
    if device["state"] != ACTIVE:
        phys = f" (phys_state {device['phys_state']})" if device["phys_state"] else ""
        return f"port {device['port']} state is {device['state']}{phys}"
    if device["link_layer"] != ETHERNET:
        return f"link layer is {device['link_layer'] or 'unknown'}, not {ETHERNET}"
    if not device["netdevs"]:
        return "no netdev under device/net"
    addressed = [netdev for netdev in device["netdevs"] if netdev["ipv4"]]
    if not addressed:
        names = ", ".join(netdev["ifname"] for netdev in device["netdevs"])
        return f"netdev {names} has no IPv4 address"
    if not any(address["gid_index"] is not None for netdev in addressed for address in netdev["ipv4"]):
        missing = "; ".join(
            f"{address['address']} on {netdev['ifname']} (expected {ipv4_to_roce_gid(address['address'])})"
            for netdev in addressed
            for address in netdev["ipv4"]
        )
        return f"no RoCE v2 GID in ports/{device['port']}/gids for {missing}"
    return None


def read_rdma_devices(
    sysfs_root: str, interfaces: dict[str, dict[str, Any]], port: int = SPARK_PORT
) -> list[dict[str, Any]]:
    """Every device under ``class/infiniband`` with its port, netdevs, addresses and GIDs.

    Devices and netdevs come back in ``device_sort_key`` order; each device carries
    ``usable`` and, when not usable, ``reason``.
    """
    infiniband_dir = os.path.join(sysfs_root, "class", "infiniband")
    devices = []
    for name in sorted(_list_dir(infiniband_dir), key=device_sort_key):
        device_dir = os.path.join(infiniband_dir, name)
        port_dir = os.path.join(device_dir, "ports", str(port))
        gids = read_roce_v2_gids(port_dir)
        netdevs = []
        for ifname in sorted(_list_dir(os.path.join(device_dir, "device", "net")), key=device_sort_key):
            seen = interfaces.get(ifname, {})
            attributes = read_netdev_attributes(sysfs_root, ifname)
            if attributes["mtu"] is None:
                attributes["mtu"] = seen.get("mtu")
            netdevs.append(
                {
                    "ifname": ifname,
                    **attributes,
                    "ipv4": [
                        {**address, "gid_index": _gid_index_for(gids, ifname, address["address"])}
                        for address in seen.get("ipv4", [])
                    ],
                }
            )
        phys_state = _read_text(os.path.join(port_dir, "phys_state"))
        device = {
            "name": name,
            "port": port,
            "state": parse_port_state(_read_text(os.path.join(port_dir, "state"))),
            "phys_state": parse_port_state(phys_state) if phys_state else None,
            "link_layer": _read_text(os.path.join(port_dir, "link_layer")),
            "netdevs": netdevs,
            "roce_v2_gids": gids,
        }
        reason = _rejection_reason(device)
        device["usable"] = reason is None
        device["reason"] = reason
        devices.append(device)
    return devices


def non_rdma_interfaces(
    devices: list[dict[str, Any]], interfaces: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Interfaces holding IPv4 that no RDMA device backs (Wi-Fi, management, VPN, bridges)."""
    rdma_netdevs = {netdev["ifname"] for device in devices for netdev in device["netdevs"]}
    return [
        {"ifname": ifname, "ipv4": [f"{a['address']}/{a['prefix']}" for a in info["ipv4"]]}
        for ifname, info in sorted(interfaces.items(), key=lambda item: device_sort_key(item[0]))
        if info["ipv4"] and not info["loopback"] and ifname not in rdma_netdevs
    ]


# --- selection -----------------------------------------------------------------------------


def _describe_devices(devices: list[dict[str, Any]]) -> str:
    return "; ".join(f"{d['name']}: {d['reason'] or 'usable'}" for d in devices) or "none"


def _describe_rdma_netdevs(devices: list[dict[str, Any]]) -> str:
    described = []
    for device in devices:
        for netdev in device["netdevs"]:
            addresses = ", ".join(f"{a['address']}/{a['prefix']}" for a in netdev["ipv4"]) or "no IPv4"
            described.append(f"{netdev['ifname']} ({device['name']}, {device['state']}, {addresses})")
    return "; ".join(described) or "none"


def _describe_others(others: list[dict[str, Any]]) -> str:
    return "; ".join(f"{o['ifname']} {', '.join(o['ipv4'])}" for o in others) or "none"


def _check_overrides(
    devices: list[dict[str, Any]],
    *,
    interfaces: dict[str, dict[str, Any]],
    others: list[dict[str, Any]],
    ifname: str | None,
    ipv4: str | None,
    hcas: list[str] | None,
) -> str | None:
    """Fail on overrides naming what does not exist; return the ifname implied by ``ipv4``."""
    device_names = [device["name"] for device in devices]
    netdev_owner = {netdev["ifname"]: device for device in devices for netdev in device["netdevs"]}

    if hcas:
        unknown = [hca for hca in hcas if hca not in device_names]
        if unknown:
            raise FabricError(
                f"fabric_hcas (module option hcas) names RDMA device(s) that do not exist: "
                f"{', '.join(unknown)}. RDMA devices on this node: {', '.join(device_names) or 'none'}."
            )

    if ifname and ifname not in netdev_owner:
        where = (
            "exists but is not the netdev of any RDMA device, so RDMA traffic cannot use it"
            if ifname in interfaces
            else "does not exist"
        )
        raise FabricError(
            f"fabric_ifname (module option ifname) {ifname} {where}. "
            f"RDMA netdevs on this node: {_describe_rdma_netdevs(devices)}."
        )

    if not ipv4:
        return ifname
    holders = [name for name, info in interfaces.items() if any(a["address"] == ipv4 for a in info["ipv4"])]
    rdma_holders = sorted((name for name in holders if name in netdev_owner), key=device_sort_key)
    if not holders:
        raise FabricError(
            f"fabric_ipv4 (module option ipv4) {ipv4} is not assigned on this node. "
            f"RDMA netdevs: {_describe_rdma_netdevs(devices)}. Other IPv4 interfaces: "
            f"{_describe_others(others)}."
        )
    if not rdma_holders:
        raise FabricError(
            f"fabric_ipv4 (module option ipv4) {ipv4} is on {', '.join(sorted(holders))}, which is not "
            f"the netdev of any RDMA device. RDMA netdevs: {_describe_rdma_netdevs(devices)}."
        )
    if ifname and ifname not in rdma_holders:
        raise FabricError(
            f"fabric_ipv4 (module option ipv4) {ipv4} is not on fabric_ifname {ifname} but on "
            f"{', '.join(rdma_holders)}. RDMA netdevs: {_describe_rdma_netdevs(devices)}."
        )
    return ifname or rdma_holders[0]


def _pick_override(
    devices: list[dict[str, Any]], ifname: str, ipv4: str | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The (device, netdev, address) for an explicit ifname; it must still be RoCE-usable."""
    for device in devices:
        for netdev in device["netdevs"]:
            if netdev["ifname"] != ifname:
                continue
            problem = None
            if device["state"] != ACTIVE or device["link_layer"] != ETHERNET:
                problem = device["reason"]
            elif not netdev["ipv4"]:
                problem = f"{ifname} has no IPv4 address"
            candidates = [a for a in netdev["ipv4"] if ipv4 in (None, a["address"])]
            usable = [a for a in candidates if a["gid_index"] is not None]
            if problem is None and not usable:
                problem = "no RoCE v2 GID in ports/{} for {}".format(
                    device["port"],
                    ", ".join(
                        f"{a['address']} (expected {ipv4_to_roce_gid(a['address'])})" for a in candidates
                    ),
                )
            if problem:
                raise FabricError(
                    f"fabric_ifname {ifname} ({device['name']}) cannot carry RDMA traffic: {problem}. "
                    f"RDMA devices: {_describe_devices(devices)}."
                )
            return device, netdev, usable[0]
    raise AssertionError(f"{ifname} was checked to be an RDMA netdev")  # pragma: no cover


def _pick_automatically(
    devices: list[dict[str, Any]], hcas: list[str] | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None:
    """The first usable device, its netdev and address: in sorted order, or in ``hcas`` order.

    A user who lists HCAs puts the primary one first, so their order wins over PCI order.
    """
    if hcas:
        by_name = {device["name"]: device for device in devices}
        devices = [by_name[name] for name in hcas]
    for device in devices:
        if not device["usable"]:
            continue
        for netdev in device["netdevs"]:
            for address in netdev["ipv4"]:
                if address["gid_index"] is not None:
                    return device, netdev, address
    return None


def select_fabric(
    devices: list[dict[str, Any]],
    interfaces: dict[str, dict[str, Any]],
    *,
    sysfs_root: str,
    ifname: str | None = None,
    ipv4: str | None = None,
    hcas: list[str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Choose the fabric; returns the compact ``fabric`` dict and warnings for the user.

    Auto-selection takes the first usable device in ``device_sort_key`` order and the first of
    its netdev addresses with a RoCE v2 GID. Overrides win but must name what exists.
    """
    others = non_rdma_interfaces(devices, interfaces)
    details = {"rdma_devices": devices, "non_rdma_interfaces": others}
    hcas = list(dict.fromkeys(hcas)) if hcas else None
    try:
        if ipv4:
            ipv4 = validate_ipv4(ipv4)
        if not devices:
            raise FabricError(
                f"No RDMA devices under {os.path.join(sysfs_root, 'class', 'infiniband')}: is the "
                f"ConnectX (mlx5_ib) driver loaded and the QSFP port cabled? Interfaces with IPv4 "
                f"that are not RDMA netdevs (never used for the fabric): {_describe_others(others)}. "
                f"{HOW_TO_OVERRIDE}"
            )
        ifname = _check_overrides(
            devices, interfaces=interfaces, others=others, ifname=ifname, ipv4=ipv4, hcas=hcas
        )
        if ifname:
            chosen = _pick_override(devices, ifname, ipv4)
        else:
            picked = _pick_automatically(devices, hcas)
            if picked is None:
                among = f" among fabric_hcas {', '.join(hcas)}" if hcas else ""
                raise FabricError(
                    f"No usable RDMA fabric port on this node{among} (need: port ACTIVE, link layer "
                    f"Ethernet, a netdev with IPv4 and a RoCE v2 GID for that address). RDMA devices "
                    f"seen: {_describe_devices(devices)}. Interfaces with IPv4 that are not RDMA "
                    f"netdevs (never used for the fabric): {_describe_others(others)}. Cable and "
                    f"address a QSFP port. {HOW_TO_OVERRIDE}"
                )
            chosen = picked
    except FabricError as exc:
        raise FabricError(str(exc), details) from None

    device, netdev, address = chosen
    warnings = []
    if hcas:
        selected_hcas = hcas
        by_name = {d["name"]: d for d in devices}
        warnings.extend(
            f"fabric_hcas includes {hca}, whose port {by_name[hca]['port']} state is {by_name[hca]['state']}."
            for hca in hcas
            if by_name[hca]["state"] != ACTIVE
        )
        if device["name"] not in hcas:
            warnings.append(
                f"fabric_hcas does not include {device['name']}, the RDMA device behind {netdev['ifname']}."
            )
    else:
        # The device behind the chosen address first, then the other ACTIVE RoCE devices (the
        # second PCIe half of a cabled port has no address of its own but carries traffic).
        selected_hcas = [device["name"]] + [
            d["name"]
            for d in devices
            if d is not device and d["state"] == ACTIVE and d["link_layer"] == ETHERNET
        ]

    fabric = {
        "ifname": netdev["ifname"],
        "ipv4": address["address"],
        "prefix": address["prefix"],
        "mtu": netdev["mtu"],
        "gid_index": address["gid_index"],
        "hcas": selected_hcas,
        "nccl_ib_hca": ",".join(selected_hcas),
    }
    return fabric, warnings


# A Spark's QSFP port is two PCIe halves, one RDMA device each: rocep1s0f1 and roceP2p1s0f1 (the
# same bus/slot/function, PCI domain 0 and 2). The key leaves the domain out.
_PORT_HALF = re.compile(r"^roce(?:P\d+)?(p\d+s\d+f\d+)$")


def port_half_problems(
    devices: list[dict[str, Any]], fabric: dict[str, Any], *, hcas_given: bool
) -> list[str]:
    """The other half of the fabric's port that does not carry NCCL's traffic: DOWN, or (discovered)
    left out of the HCAs. Either way collectives get about half of the port's bandwidth. A user's
    own fabric_hcas is a choice: a half it leaves out is not a problem (select_fabric warns)."""
    chosen = (
        next(device for device in devices if device["name"] == fabric["hcas"][0]) if fabric["hcas"] else None
    )
    match = _PORT_HALF.match(chosen["name"]) if chosen else None
    if not match:
        return []
    problems = []
    for device in devices:
        other = _PORT_HALF.match(device["name"])
        if device is chosen or not other or other.group(1) != match.group(1):
            continue
        if device["state"] != ACTIVE:
            problems.append(
                f"{device['name']}, the other half of {chosen['name']}'s port, is {device['state']}: NCCL "
                "gets about half of the port's bandwidth (check the cable and the NIC's PCIe link)"
            )
        elif device["name"] not in fabric["hcas"] and not hcas_given:
            problems.append(
                f"{device['name']}, the other half of {chosen['name']}'s port, is not in the HCAs"
            )
    return problems


def discover_fabric(
    sysfs_root: str,
    ip_addr_json: str,
    *,
    ifname: str | None = None,
    ipv4: str | None = None,
    hcas: list[str] | None = None,
    port: int = SPARK_PORT,
) -> dict[str, Any]:
    """What ``fabric_info`` returns: fabric, problems, rdma_devices, non_rdma_interfaces, warnings.

    Raises FabricError with ``details`` holding what was seen.
    """
    if not os.path.isdir(sysfs_root):
        raise FabricError(f"sysfs_root {sysfs_root} is not a directory.")
    interfaces = parse_ip_addr_json(ip_addr_json)
    devices = read_rdma_devices(sysfs_root, interfaces, port)
    fabric, warnings = select_fabric(
        devices, interfaces, sysfs_root=sysfs_root, ifname=ifname, ipv4=ipv4, hcas=hcas
    )
    return {
        "fabric": fabric,
        "problems": port_half_problems(devices, fabric, hcas_given=bool(hcas)),
        "rdma_devices": devices,
        "non_rdma_interfaces": non_rdma_interfaces(devices, interfaces),
        "warnings": warnings,
    }
