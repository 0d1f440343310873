#!/usr/bin/env python3
"""STAND-IN: write a fake DGX Spark RDMA sysfs tree for the lab and the unit tests.

This is NOT real hardware and NOT a real RDMA stack. Lab nodes have no ConnectX-7, so this
script writes the files ``fabric_info`` reads under a fixture root instead of ``/sys``:

    <root>/class/infiniband/<hca>/ports/1/{state,phys_state,link_layer}
    <root>/class/infiniband/<hca>/ports/1/counters/{port_rcv_data,port_xmit_data,...}   (0)
    <root>/class/infiniband/<hca>/ports/1/gids/<n>
    <root>/class/infiniband/<hca>/ports/1/gid_attrs/{types,ndevs}/<n>
    <root>/class/infiniband/<hca>/device/net/<netdev>/
    <root>/class/net -> /sys/class/net           (--link-class-net: the lab's real netdevs)
    <root>/class/net/<netdev>/{operstate,carrier,mtu}   (otherwise, for tests)

GID table per device: index 0 and 1 are link-local entries (RoCE v1, RoCE v2), the netdev's
IPv4 appears as RoCE v1 at ``gid_index - 1`` and as RoCE v2 at ``gid_index`` (3 is typical on a
Spark, 4 has been seen), slots in between hold ULA IPv6 entries. The IPv4 comes from
``--ipv4 netdev=addr`` or, when absent, from ``ip -j -4 addr show dev <netdev>``.

Usage (lab head node, one cabled port whose second half has no address):

    python3 make_rdma_sysfs.py --root /opt/sparkserve-lab/sysfs \\
        --device rocep1s0f1=enp1s0f1np1:ACTIVE --device roceP2p1s0f1=enP2p1s0f1np1:ACTIVE \\
        --device rocep1s0f0=enp1s0f0np0:DOWN --device roceP2p1s0f0=enP2p1s0f0np0:DOWN \\
        --gid-index 3 --link-class-net

Device spec: ``NAME[=NETDEV][:STATE[:PHYS_STATE]]``, e.g. ``rocep1s0f0=enp1s0f0np0:DOWN:LinkUp``.
Re-running replaces ``class/infiniband`` and ``class/net`` under the root; the JSON summary on
stdout says whether anything changed. Stdlib only (Python 3.10+); importable by tests, which
inject the address lookup (``ipv4_lookup``) instead of running ``ip``.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MARKER = "STAND-IN-RDMA-SYSFS"
PORT = 1
ROCE_V1 = "IB/RoCE v1"
ROCE_V2 = "RoCE v2"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# Real mlx5 tables are larger; a short tail of empty slots is enough to exercise readers.
DEFAULT_TABLE_SIZE = 16

PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATES = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "PhyTest": 7,
}

Ipv4Lookup = Callable[[str], list[str]]


PORT_COUNTERS = ("port_rcv_data", "port_xmit_data", "port_rcv_errors", "port_xmit_discards", "link_downed")


class StandinError(Exception):
    """Bad arguments or an unsafe root; printed without a traceback by ``main``."""


@dataclass(frozen=True)
class DeviceSpec:
    """One RDMA device of the fake tree."""

    name: str
    netdev: str | None = None
    state: str = "ACTIVE"
    phys_state: str | None = None  # None: LinkUp when ACTIVE, Disabled otherwise
    link_layer: str = "Ethernet"


def _normalise(choices: Iterable[str], value: str, what: str) -> str:
    wanted = value.replace("_", "").replace(" ", "").lower()
    for choice in choices:
        if choice.replace("_", "").lower() == wanted:
            return choice
    raise StandinError(f"unknown {what} {value!r}; choose from {', '.join(choices)}")


def parse_device_spec(text: str) -> DeviceSpec:
    """``NAME[=NETDEV][:STATE[:PHYS_STATE]]`` -> DeviceSpec."""
    head, *states = text.split(":")
    name, _, netdev = head.partition("=")
    if not name or len(states) > 2:
        raise StandinError(f"bad --device {text!r}; expected NAME[=NETDEV][:STATE[:PHYS_STATE]]")
    state = _normalise(PORT_STATES, states[0], "port state") if states else "ACTIVE"
    phys_state = _normalise(PHYS_STATES, states[1], "phys_state") if len(states) > 1 else None
    return DeviceSpec(name=name, netdev=netdev or None, state=state, phys_state=phys_state)


def parse_ipv4_option(text: str) -> tuple[str, str | None]:
    """``NETDEV=ADDR[/PREFIX]`` -> (netdev, addr); ``NETDEV=`` means "no address, skip lookup"."""
    netdev, sep, value = text.partition("=")
    if not netdev or not sep:
        raise StandinError(f"bad --ipv4 {text!r}; expected NETDEV=ADDR or NETDEV=")
    if not value:
        return netdev, None
    try:
        return netdev, str(ipaddress.IPv4Interface(value).ip)
    except ValueError:
        raise StandinError(f"bad --ipv4 {text!r}: {value!r} is not an IPv4 address") from None


def ipv4_to_roce_gid(ipv4: str) -> str:
    """The IPv4-mapped GID as sysfs prints it: ``0000:...:ffff:c612:000d``."""
    packed = ipaddress.IPv4Address(ipv4).packed
    return "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}".format(*packed)


def _sysfs_gid(address: ipaddress.IPv6Address) -> str:
    hexed = address.packed.hex()
    return ":".join(hexed[i : i + 4] for i in range(0, 32, 4))


def _interface_id(netdev: str) -> bytes:
    # Stable per netdev so re-runs write identical trees (idempotence).
    return hashlib.sha256(netdev.encode()).digest()[:8]


def gid_table(netdev: str, ipv4s: list[str], gid_index: int) -> dict[int, tuple[str, str]]:
    """``{index: (gid, type)}`` for one netdev, laid out like an mlx5 RoCE port."""
    if gid_index < 2:
        raise StandinError("--gid-index must be at least 2 (0 and 1 hold link-local GIDs)")
    interface_id = _interface_id(netdev)
    link_local = _sysfs_gid(ipaddress.IPv6Address(b"\xfe\x80" + b"\x00" * 6 + interface_id))
    table = {0: (link_local, ROCE_V1), 1: (link_local, ROCE_V2)}
    if not ipv4s:
        return table
    ula = _sysfs_gid(ipaddress.IPv6Address(b"\xfd\x00" + b"\x00" * 6 + interface_id))
    for index in range(2, gid_index - 1):
        table[index] = (ula, ROCE_V1 if index % 2 == 0 else ROCE_V2)
    index = gid_index - 1
    for position, address in enumerate(ipv4s):
        gid = ipv4_to_roce_gid(address)
        if position == 0 and index == 1:
            # gid_index 2: the v1 twin would overwrite the link-local v2 entry; skip it.
            table[gid_index] = (gid, ROCE_V2)
            index = gid_index + 1
            continue
        table[index] = (gid, ROCE_V1)
        table[index + 1] = (gid, ROCE_V2)
        index += 2
    return table


def ipv4_from_ip_json(text: str, netdev: str | None = None) -> list[str]:
    """IPv4 addresses in ``ip -j -4 addr show`` output, of ``netdev`` only when given."""
    addresses = []
    for entry in json.loads(text or "[]"):
        if not isinstance(entry, dict) or (netdev and entry.get("ifname") != netdev):
            continue
        addresses.extend(
            info["local"]
            for info in entry.get("addr_info") or []
            if info.get("family") == "inet" and info.get("local")
        )
    return addresses


def lookup_ipv4_with_ip(netdev: str) -> list[str]:
    """The netdev's IPv4 addresses via ``ip -j -4 addr show dev``; [] if it does not exist."""
    ip_bin = shutil.which("ip", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if not ip_bin:
        raise StandinError("'ip' (iproute2) not found; pass --ipv4 NETDEV=ADDR for every netdev")
    result = subprocess.run(
        [ip_bin, "-j", "-4", "addr", "show", "dev", netdev], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        # A DOWN port's netdev often does not exist on a lab node: no address, no GID.
        print(f"note: {netdev}: {result.stderr.strip() or 'ip failed'}; writing no IPv4 GID", file=sys.stderr)
        return []
    return ipv4_from_ip_json(result.stdout, netdev)


def snapshot(root: str) -> dict[str, str]:
    """Path -> content (or link target) of everything under ``root``, without following links."""
    seen: dict[str, str] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if os.path.islink(path):
                seen[relative] = "-> " + os.readlink(path)
            elif os.path.isdir(path):
                seen[relative] = "<dir>"
            else:
                with open(path, encoding="utf-8") as handle:
                    seen[relative] = handle.read()
    return seen


def _check_root(root: str) -> None:
    real = os.path.realpath(root)
    if real == "/" or any(real == top or real.startswith(top + "/") for top in ("/sys", "/proc", "/dev")):
        raise StandinError(f"refusing to write a stand-in tree at {root}")
    if os.path.isdir(real) and os.listdir(real) and not os.path.exists(os.path.join(real, MARKER)):
        raise StandinError(f"{root} is not empty and has no {MARKER} marker; refusing to replace it")


def _remove(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def _write(path: str, content: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content + "\n")


def build_tree(
    root: str,
    devices: list[DeviceSpec],
    *,
    gid_index: int = 3,
    ipv4_by_netdev: dict[str, list[str]] | None = None,
    ipv4_lookup: Ipv4Lookup = lookup_ipv4_with_ip,
    link_class_net: bool = False,
    mtu: int = 1500,
    table_size: int = DEFAULT_TABLE_SIZE,
) -> dict:
    """Write (or replace) the stand-in tree under ``root``; returns a JSON-able summary.

    ``ipv4_by_netdev`` wins over ``ipv4_lookup``; a netdev mapped to [] gets no IPv4 GID.
    """
    _check_root(root)
    names = [device.name for device in devices]
    if len(set(names)) != len(names):
        raise StandinError(f"duplicate device names in {names}")
    ipv4_by_netdev = ipv4_by_netdev or {}
    before = snapshot(root) if os.path.isdir(root) else {}

    os.makedirs(root, exist_ok=True)
    _write(os.path.join(root, MARKER), "Fake RDMA sysfs written by lab/standins/sysfs/make_rdma_sysfs.py")
    infiniband = os.path.join(root, "class", "infiniband")
    class_net = os.path.join(root, "class", "net")
    _remove(infiniband)
    _remove(class_net)
    os.makedirs(os.path.join(root, "class"), exist_ok=True)
    if link_class_net:
        os.symlink("/sys/class/net", class_net)

    summary = []
    for device in devices:
        port_dir = os.path.join(infiniband, device.name, "ports", str(PORT))
        phys_state = device.phys_state or ("LinkUp" if device.state == "ACTIVE" else "Disabled")
        _write(os.path.join(port_dir, "state"), f"{PORT_STATES[device.state]}: {device.state}")
        _write(os.path.join(port_dir, "phys_state"), f"{PHYS_STATES[phys_state]}: {phys_state}")
        _write(os.path.join(port_dir, "link_layer"), device.link_layer)
        # A real mlx5 port's counters (data in 4-byte words); the stand-in's traffic goes over the
        # netdev, whose statistics are the kernel's own.
        for counter in PORT_COUNTERS:
            _write(os.path.join(port_dir, "counters", counter), "0")

        ipv4s: list[str] = []
        table: dict[int, tuple[str, str]] = {}
        if device.netdev:
            os.makedirs(os.path.join(infiniband, device.name, "device", "net", device.netdev), exist_ok=True)
            if device.netdev in ipv4_by_netdev:
                ipv4s = list(ipv4_by_netdev[device.netdev])
            else:
                ipv4s = ipv4_lookup(device.netdev)
            table = gid_table(device.netdev, ipv4s, gid_index)
            if not link_class_net:
                up = device.state == "ACTIVE"
                netdev_dir = os.path.join(class_net, device.netdev)
                _write(os.path.join(netdev_dir, "operstate"), "up" if up else "down")
                _write(os.path.join(netdev_dir, "carrier"), "1" if up else "0")
                _write(os.path.join(netdev_dir, "mtu"), str(mtu))
        for index in range(max([table_size - 1, *table]) + 1):
            gid, gid_type = table.get(index, (ZERO_GID, None))
            _write(os.path.join(port_dir, "gids", str(index)), gid)
            if gid_type:
                _write(os.path.join(port_dir, "gid_attrs", "types", str(index)), gid_type)
                _write(os.path.join(port_dir, "gid_attrs", "ndevs", str(index)), device.netdev or "")
        summary.append(
            {
                "name": device.name,
                "netdev": device.netdev,
                "state": device.state,
                "ipv4": ipv4s,
                "roce_v2_gid_index": gid_index if ipv4s else None,
            }
        )

    return {"root": root, "changed": snapshot(root) != before, "devices": summary}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="STAND-IN: write a fake DGX Spark RDMA sysfs tree (class/infiniband, class/net)."
    )
    parser.add_argument("--root", required=True, help="fixture root that fabric_info reads as sysfs_root")
    parser.add_argument(
        "--device",
        action="append",
        required=True,
        metavar="NAME[=NETDEV][:STATE[:PHYS]]",
        help="an RDMA device, e.g. rocep1s0f1=enp1s0f1np1:ACTIVE (repeat per device)",
    )
    parser.add_argument(
        "--ipv4",
        action="append",
        default=[],
        metavar="NETDEV=ADDR",
        help="address for a netdev's RoCE GID instead of asking ip; NETDEV= writes none (repeatable)",
    )
    parser.add_argument("--gid-index", type=int, default=3, help="index of the IPv4 RoCE v2 GID (default 3)")
    parser.add_argument(
        "--link-class-net",
        action="store_true",
        help="make <root>/class/net a link to /sys/class/net instead of writing netdev files",
    )
    parser.add_argument("--mtu", type=int, default=1500, help="MTU written to class/net files (default 1500)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, ipv4_lookup: Ipv4Lookup = lookup_ipv4_with_ip) -> int:
    args = parse_args(argv)
    try:
        devices = [parse_device_spec(text) for text in args.device]
        ipv4_by_netdev: dict[str, list[str]] = {}
        for text in args.ipv4:
            netdev, address = parse_ipv4_option(text)
            ipv4_by_netdev.setdefault(netdev, [])
            if address:
                ipv4_by_netdev[netdev].append(address)
        summary = build_tree(
            args.root,
            devices,
            gid_index=args.gid_index,
            ipv4_by_netdev=ipv4_by_netdev,
            ipv4_lookup=ipv4_lookup,
            link_class_net=args.link_class_net,
            mtu=args.mtu,
        )
    except StandinError as exc:
        print(f"make_rdma_sysfs: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
