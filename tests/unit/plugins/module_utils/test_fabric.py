"""Fabric discovery rules, against Spark-shaped sysfs trees written by the stand-in generator."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._fabric import (
    FabricError,
    device_sort_key,
    discover_fabric,
    gid_ipv4,
    ipv4_to_roce_gid,
    parse_ip_addr_json,
    parse_port_state,
)

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures" / "fabric"
GENERATOR_PATH = REPO_ROOT / "lab" / "standins" / "sysfs" / "make_rdma_sysfs.py"


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_rdma_sysfs", GENERATOR_PATH)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class body is processed.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gen = _load_generator()

# Creation order deliberately not sorted: discovery must not depend on directory order.
SPARK_NETDEVS = {
    "roceP2p1s0f1": "enP2p1s0f1np1",
    "rocep1s0f0": "enp1s0f0np0",
    "roceP2p1s0f0": "enP2p1s0f0np0",
    "rocep1s0f1": "enp1s0f1np1",
}
CABLED_PORT = ("rocep1s0f1", "roceP2p1s0f1")


def ip_json(name: str) -> str:
    return (FIXTURES / name).read_text()


def build_spark(
    root: Path,
    ip_addr_json: str,
    *,
    active: tuple[str, ...] = CABLED_PORT,
    gid_index: int = 3,
    mtu: int = 9000,
    device_overrides: dict[str, dict] | None = None,
    ipv4_by_netdev: dict[str, list[str]] | None = None,
) -> str:
    """Write a four-device Spark tree whose GIDs match the addresses in ``ip_addr_json``."""
    device_overrides = device_overrides or {}
    devices = []
    for name, netdev in SPARK_NETDEVS.items():
        fields = {"netdev": netdev, "state": "ACTIVE" if name in active else "DOWN"}
        fields.update(device_overrides.get(name, {}))
        devices.append(gen.DeviceSpec(name=name, **fields))
    gen.build_tree(
        str(root),
        devices,
        gid_index=gid_index,
        ipv4_by_netdev=ipv4_by_netdev,
        ipv4_lookup=lambda netdev: gen.ipv4_from_ip_json(ip_addr_json, netdev),
        mtu=mtu,
    )
    return str(root)


def discover(root: str, ip_addr_json: str, **overrides):
    return discover_fabric(root, ip_addr_json, **overrides)


# --- parsers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("4: ACTIVE", "ACTIVE"),
        ("1: DOWN", "DOWN"),
        ("2: INIT\n", "INIT"),
        ("ACTIVE", "ACTIVE"),
        ("5: LinkUp", "LinkUp"),
        ("", "UNKNOWN"),
        (None, "UNKNOWN"),
    ],
)
def test_parse_port_state(text, state):
    assert parse_port_state(text) == state


def test_device_sort_key_puts_spark_names_in_pci_order():
    shuffled = ["roceP2p1s0f1", "rocep1s0f1", "roceP2p1s0f0", "rocep1s0f0"]
    assert sorted(shuffled, key=device_sort_key) == [
        "rocep1s0f0",
        "rocep1s0f1",
        "roceP2p1s0f0",
        "roceP2p1s0f1",
    ]
    # Numbers compare as numbers, so a tenth function does not sort before the second.
    assert sorted(["mlx5_10", "mlx5_2", "mlx5_1"], key=device_sort_key) == ["mlx5_1", "mlx5_2", "mlx5_10"]


@pytest.mark.parametrize(
    ("ipv4", "gid"),
    [
        ("198.18.0.13", "0000:0000:0000:0000:0000:ffff:c612:000d"),
        ("10.0.0.1", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
        ("192.168.100.11", "0000:0000:0000:0000:0000:ffff:c0a8:640b"),
    ],
)
def test_roce_gid_round_trip(ipv4, gid):
    assert ipv4_to_roce_gid(ipv4) == gid
    assert gen.ipv4_to_roce_gid(ipv4) == gid  # the stand-in writes what discovery expects
    assert gid_ipv4(gid) == ipv4
    assert gid_ipv4(gid.upper()) == ipv4


@pytest.mark.parametrize(
    "gid",
    ["fe80:0000:0000:0000:5ea6:2dff:fe11:2233", "0000:0000:0000:0000:0000:0000:0000:0000", "garbage"],
)
def test_gid_ipv4_ignores_non_ipv4_gids(gid):
    assert gid_ipv4(gid) is None


def test_parse_ip_addr_json_is_robust_to_interfaces_without_addresses():
    interfaces = parse_ip_addr_json(ip_json("ip_addr_no_fabric.json"))
    # `{}` entries (old iproute2) are dropped; interfaces with IPv4 keep prefix and MTU.
    assert sorted(interfaces) == ["docker0", "enP7s7", "lo", "tailscale0", "wlP9s9"]
    assert interfaces["wlP9s9"]["ipv4"] == [{"address": "192.168.1.20", "prefix": 24}]
    assert interfaces["tailscale0"]["mtu"] == 1280
    assert interfaces["lo"]["loopback"] is True

    head = parse_ip_addr_json(ip_json("ip_addr_head.json"))
    assert head["enP2p1s0f1np1"]["ipv4"] == []
    assert head["enp1s0f1np1"]["ipv4"] == [{"address": "198.18.0.13", "prefix": 24}]


def test_parse_ip_addr_json_skips_other_families_and_missing_addr_info():
    text = json.dumps(
        [
            {"ifindex": 5, "ifname": "enp1s0f1np1", "mtu": 9000},
            {
                "ifindex": 7,
                "ifname": "enP2p1s0f1np1",
                "addr_info": [{"family": "inet6", "local": "fe80::1", "prefixlen": 64}],
            },
        ]
    )
    interfaces = parse_ip_addr_json(text)
    assert interfaces["enp1s0f1np1"]["ipv4"] == []
    assert interfaces["enP2p1s0f1np1"]["ipv4"] == []


@pytest.mark.parametrize("text", ["not json", '{"ifname": "eth0"}'])
def test_parse_ip_addr_json_rejects_garbage(text):
    with pytest.raises(FabricError, match="ip -j -4 addr show"):
        parse_ip_addr_json(text)


# --- automatic selection -------------------------------------------------------------------


def test_head_with_both_halves_active_and_one_addressed(tmp_path):
    text = ip_json("ip_addr_head.json")
    result = discover(build_spark(tmp_path, text), text)
    assert result["fabric"] == {
        "ifname": "enp1s0f1np1",
        "ipv4": "198.18.0.13",
        "prefix": 24,
        "mtu": 9000,
        "gid_index": 3,
        "hcas": ["rocep1s0f1", "roceP2p1s0f1"],
        "nccl_ib_hca": "rocep1s0f1,roceP2p1s0f1",
    }
    assert [d["name"] for d in result["rdma_devices"]] == [
        "rocep1s0f0",
        "rocep1s0f1",
        "roceP2p1s0f0",
        "roceP2p1s0f1",
    ]
    reasons = {d["name"]: d["reason"] for d in result["rdma_devices"]}
    assert reasons == {
        "rocep1s0f0": "port 1 state is DOWN (phys_state Disabled)",
        "rocep1s0f1": None,
        "roceP2p1s0f0": "port 1 state is DOWN (phys_state Disabled)",
        "roceP2p1s0f1": "netdev enP2p1s0f1np1 has no IPv4 address",
    }
    chosen = result["rdma_devices"][1]
    assert chosen["netdevs"] == [
        {
            "ifname": "enp1s0f1np1",
            "mtu": 9000,
            "operstate": "up",
            "carrier": True,
            "ipv4": [{"address": "198.18.0.13", "prefix": 24, "gid_index": 3}],
        }
    ]
    assert chosen["phys_state"] == "LinkUp"
    assert chosen["link_layer"] == "Ethernet"
    # Decoys holding IPv4 are reported, never selected.
    assert [i["ifname"] for i in result["non_rdma_interfaces"]] == [
        "docker0",
        "enP7s7",
        "tailscale0",
        "wlP9s9",
    ]
    assert result["warnings"] == []


@pytest.mark.parametrize(
    ("fixture", "gid_index", "ipv4"),
    [("ip_addr_head.json", 3, "198.18.0.13"), ("ip_addr_worker.json", 4, "198.18.0.11")],
)
def test_gid_index_follows_the_node(tmp_path, fixture, gid_index, ipv4):
    text = ip_json(fixture)
    fabric = discover(build_spark(tmp_path, text, gid_index=gid_index), text)["fabric"]
    assert (fabric["ipv4"], fabric["gid_index"]) == (ipv4, gid_index)


def test_both_halves_addressed_picks_the_first_in_sorted_order(tmp_path):
    text = ip_json("ip_addr_both_halves.json")
    fabric = discover(build_spark(tmp_path, text), text)["fabric"]
    assert (fabric["ifname"], fabric["ipv4"]) == ("enp1s0f1np1", "198.18.0.13")
    assert fabric["hcas"] == ["rocep1s0f1", "roceP2p1s0f1"]


def test_mixed_case_device_behind_the_address_comes_first(tmp_path):
    text = ip_json("ip_addr_p2_only.json")
    fabric = discover(build_spark(tmp_path, text), text)["fabric"]
    assert (fabric["ifname"], fabric["ipv4"]) == ("enP2p1s0f1np1", "198.18.1.13")
    assert fabric["nccl_ib_hca"] == "roceP2p1s0f1,rocep1s0f1"


def test_active_port_without_ipv4_is_skipped_but_kept_as_hca(tmp_path):
    # rocep1s0f0 sorts first and is ACTIVE, but its netdev has no address.
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text, active=("rocep1s0f0", "rocep1s0f1"))
    fabric = discover(root, text)["fabric"]
    assert fabric["ifname"] == "enp1s0f1np1"
    assert fabric["hcas"] == ["rocep1s0f1", "rocep1s0f0"]


@pytest.mark.parametrize(
    ("active", "hcas", "problems"),
    [
        (CABLED_PORT, None, []),
        (
            ("rocep1s0f1",),
            None,
            ["roceP2p1s0f1, the other half of rocep1s0f1's port, is DOWN: NCCL gets about half"],
        ),
        # The user's own HCA list is a choice: select_fabric warns about it, preflight does not stop.
        (CABLED_PORT, ["rocep1s0f1"], []),
        (("rocep1s0f1",), ["rocep1s0f1"], ["roceP2p1s0f1, the other half of rocep1s0f1's port, is DOWN"]),
    ],
)
def test_the_other_half_of_the_cabled_port_must_carry_traffic(tmp_path, active, hcas, problems):
    text = ip_json("ip_addr_head.json")
    result = discover(build_spark(tmp_path, text, active=active), text, hcas=hcas)
    assert len(result["problems"]) == len(problems)
    for got, expected in zip(result["problems"], problems, strict=True):
        assert got.startswith(expected)


def test_mtu_comes_from_sysfs(tmp_path):
    text = ip_json("ip_addr_head.json")
    assert discover(build_spark(tmp_path, text, mtu=1500), text)["fabric"]["mtu"] == 1500


# --- rejections and the error message ------------------------------------------------------


def test_nothing_active_names_every_device_and_the_variables(tmp_path):
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text, active=())
    with pytest.raises(FabricError) as caught:
        discover(root, text)
    message = str(caught.value)
    assert "No usable RDMA fabric port on this node" in message
    for name in SPARK_NETDEVS:
        assert f"{name}: port 1 state is DOWN (phys_state Disabled)" in message
    assert "wlP9s9 192.168.1.20/24" in message
    assert "enP7s7 10.20.0.13/24" in message
    assert "fabric_ifname, fabric_ipv4 and/or fabric_hcas" in message
    assert "module options ifname, ipv4, hcas" in message
    assert [d["usable"] for d in caught.value.details["rdma_devices"]] == [False] * 4


def test_only_decoys_hold_ipv4(tmp_path):
    text = ip_json("ip_addr_no_fabric.json")
    with pytest.raises(FabricError) as caught:
        discover(build_spark(tmp_path, text), text)
    message = str(caught.value)
    assert "rocep1s0f1: netdev enp1s0f1np1 has no IPv4 address" in message
    assert "roceP2p1s0f1: netdev enP2p1s0f1np1 has no IPv4 address" in message
    assert "never used for the fabric" in message
    assert [i["ifname"] for i in caught.value.details["non_rdma_interfaces"]] == [
        "docker0",
        "enP7s7",
        "tailscale0",
        "wlP9s9",
    ]


@pytest.mark.parametrize(
    ("state", "phys_state", "reason"),
    [
        ("DOWN", "LinkUp", "port 1 state is DOWN (phys_state LinkUp)"),
        ("DOWN", "Polling", "port 1 state is DOWN (phys_state Polling)"),
        ("INIT", "LinkUp", "port 1 state is INIT (phys_state LinkUp)"),
        ("ARMED", None, "port 1 state is ARMED (phys_state Disabled)"),
    ],
)
def test_port_state_variants_other_than_active_are_rejected(tmp_path, state, phys_state, reason):
    text = ip_json("ip_addr_head.json")
    root = build_spark(
        tmp_path,
        text,
        active=("roceP2p1s0f1",),
        device_overrides={"rocep1s0f1": {"state": state, "phys_state": phys_state}},
    )
    with pytest.raises(FabricError) as caught:
        discover(root, text)
    assert f"rocep1s0f1: {reason}" in str(caught.value)


def test_bare_state_file_without_number(tmp_path):
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text)
    (Path(root) / "class/infiniband/rocep1s0f1/ports/1/state").write_text("DOWN\n")
    with pytest.raises(FabricError, match="rocep1s0f1: port 1 state is DOWN"):
        discover(root, text)


def test_infiniband_link_layer_is_rejected(tmp_path):
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text, device_overrides={"rocep1s0f1": {"link_layer": "InfiniBand"}})
    with pytest.raises(FabricError, match="rocep1s0f1: link layer is InfiniBand, not Ethernet"):
        discover(root, text)


def test_device_without_netdev_is_rejected(tmp_path):
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text, device_overrides={"rocep1s0f1": {"netdev": None}})
    with pytest.raises(FabricError, match="rocep1s0f1: no netdev under device/net"):
        discover(root, text)


def test_address_without_roce_v2_gid_is_rejected(tmp_path):
    # The GID table still lists an old address: the node was re-addressed after the driver loaded.
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text, ipv4_by_netdev={"enp1s0f1np1": ["198.18.0.99"]})
    with pytest.raises(FabricError) as caught:
        discover(root, text)
    assert (
        "rocep1s0f1: no RoCE v2 GID in ports/1/gids for 198.18.0.13 on enp1s0f1np1 "
        "(expected 0000:0000:0000:0000:0000:ffff:c612:000d)"
    ) in str(caught.value)


def test_roce_v1_gid_alone_is_not_enough(tmp_path):
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text)
    (Path(root) / "class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3").write_text("IB/RoCE v1\n")
    with pytest.raises(FabricError, match="rocep1s0f1: no RoCE v2 GID"):
        discover(root, text)


def test_gid_of_another_netdev_does_not_count(tmp_path):
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text)
    (Path(root) / "class/infiniband/rocep1s0f1/ports/1/gid_attrs/ndevs/3").write_text("wlP9s9\n")
    with pytest.raises(FabricError, match="rocep1s0f1: no RoCE v2 GID"):
        discover(root, text)


def test_no_rdma_devices_at_all(tmp_path):
    with pytest.raises(FabricError) as caught:
        discover(str(tmp_path), ip_json("ip_addr_head.json"))
    message = str(caught.value)
    assert f"No RDMA devices under {tmp_path}/class/infiniband" in message
    assert "fabric_ifname" in message


def test_missing_sysfs_root(tmp_path):
    with pytest.raises(FabricError, match="is not a directory"):
        discover(str(tmp_path / "nope"), "[]")


# --- overrides -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "ifname", "ipv4", "hcas"),
    [
        ({"ifname": "enP2p1s0f1np1"}, "enP2p1s0f1np1", "198.18.1.13", ["roceP2p1s0f1", "rocep1s0f1"]),
        ({"ipv4": "198.18.1.13"}, "enP2p1s0f1np1", "198.18.1.13", ["roceP2p1s0f1", "rocep1s0f1"]),
        (
            {"ifname": "enp1s0f1np1", "ipv4": "198.18.0.13"},
            "enp1s0f1np1",
            "198.18.0.13",
            ["rocep1s0f1", "roceP2p1s0f1"],
        ),
        ({"hcas": ["roceP2p1s0f1"]}, "enP2p1s0f1np1", "198.18.1.13", ["roceP2p1s0f1"]),
        ({"hcas": ["rocep1s0f0", "rocep1s0f1"]}, "enp1s0f1np1", "198.18.0.13", ["rocep1s0f0", "rocep1s0f1"]),
        (
            {"hcas": ["roceP2p1s0f1", "rocep1s0f1", "roceP2p1s0f1"]},
            "enP2p1s0f1np1",
            "198.18.1.13",
            ["roceP2p1s0f1", "rocep1s0f1"],
        ),
    ],
)
def test_valid_overrides_win(tmp_path, overrides, ifname, ipv4, hcas):
    text = ip_json("ip_addr_both_halves.json")
    result = discover(build_spark(tmp_path, text), text, **overrides)
    fabric = result["fabric"]
    assert (fabric["ifname"], fabric["ipv4"], fabric["hcas"]) == (ifname, ipv4, hcas)
    assert fabric["nccl_ib_hca"] == ",".join(hcas)
    assert fabric["gid_index"] == 3


def test_hca_override_naming_a_down_device_warns(tmp_path):
    text = ip_json("ip_addr_head.json")
    result = discover(build_spark(tmp_path, text), text, hcas=["rocep1s0f1", "rocep1s0f0"])
    assert result["fabric"]["hcas"] == ["rocep1s0f1", "rocep1s0f0"]
    assert result["warnings"] == ["fabric_hcas includes rocep1s0f0, whose port 1 state is DOWN."]


def test_hca_override_without_the_fabric_device_warns(tmp_path):
    text = ip_json("ip_addr_head.json")
    result = discover(build_spark(tmp_path, text), text, ifname="enp1s0f1np1", hcas=["roceP2p1s0f1"])
    assert result["warnings"] == [
        "fabric_hcas does not include rocep1s0f1, the RDMA device behind enp1s0f1np1."
    ]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"ifname": "enp9s9np0"},
            "fabric_ifname (module option ifname) enp9s9np0 does not exist. RDMA netdevs on this node: "
            "enp1s0f0np0 (rocep1s0f0, DOWN, no IPv4); enp1s0f1np1 (rocep1s0f1, ACTIVE, 198.18.0.13/24)",
        ),
        (
            {"ifname": "wlP9s9"},
            "fabric_ifname (module option ifname) wlP9s9 exists but is not the netdev of any RDMA device",
        ),
        (
            {"ifname": "enp1s0f0np0"},
            "fabric_ifname enp1s0f0np0 (rocep1s0f0) cannot carry RDMA traffic: "
            "port 1 state is DOWN (phys_state Disabled)",
        ),
        (
            {"ifname": "enP2p1s0f1np1"},
            "fabric_ifname enP2p1s0f1np1 (roceP2p1s0f1) cannot carry RDMA traffic: "
            "enP2p1s0f1np1 has no IPv4 address",
        ),
        (
            {"ipv4": "198.18.0.99"},
            "fabric_ipv4 (module option ipv4) 198.18.0.99 is not assigned on this node. RDMA netdevs: "
            "enp1s0f0np0 (rocep1s0f0, DOWN, no IPv4)",
        ),
        (
            {"ipv4": "192.168.1.20"},
            "fabric_ipv4 (module option ipv4) 192.168.1.20 is on wlP9s9, which is not the netdev of any "
            "RDMA device",
        ),
        (
            {"ipv4": "198.18.0.13", "ifname": "enP2p1s0f1np1"},
            "fabric_ipv4 (module option ipv4) 198.18.0.13 is not on fabric_ifname enP2p1s0f1np1 but on "
            "enp1s0f1np1",
        ),
        (
            {"ipv4": "198.18.0.13/24"},
            "must be a plain IPv4 address such as 198.18.0.13, not '198.18.0.13/24'",
        ),
        (
            {"hcas": ["rocep1s0f1", "mlx5_0"]},
            "fabric_hcas (module option hcas) names RDMA device(s) that do not exist: mlx5_0. "
            "RDMA devices on this node: rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1.",
        ),
        (
            {"hcas": ["rocep1s0f0", "roceP2p1s0f1"]},
            "No usable RDMA fabric port on this node among fabric_hcas rocep1s0f0, roceP2p1s0f1",
        ),
    ],
)
def test_invalid_overrides_fail_with_what_exists(tmp_path, overrides, expected):
    text = ip_json("ip_addr_head.json")
    with pytest.raises(FabricError) as caught:
        discover(build_spark(tmp_path, text), text, **overrides)
    assert expected in str(caught.value)
    assert caught.value.details["rdma_devices"]


def test_override_on_address_without_gid_fails(tmp_path):
    text = ip_json("ip_addr_head.json")
    root = build_spark(tmp_path, text, ipv4_by_netdev={"enp1s0f1np1": []})
    with pytest.raises(
        FabricError, match=r"cannot carry RDMA traffic: no RoCE v2 GID in ports/1 for 198\.18\.0\.13"
    ):
        discover(root, text, ifname="enp1s0f1np1")
