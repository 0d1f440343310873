"""fabric_info as Ansible runs it, and the stand-in sysfs generator's command line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.modules import fabric_info

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures" / "fabric"
GENERATOR_PATH = REPO_ROOT / "lab" / "standins" / "sysfs" / "make_rdma_sysfs.py"
IP_BIN = "/usr/sbin/ip"

HEAD_DEVICES = [
    "--device",
    "rocep1s0f1=enp1s0f1np1:ACTIVE",
    "--device",
    "roceP2p1s0f1=enP2p1s0f1np1:ACTIVE",
    "--device",
    "rocep1s0f0=enp1s0f0np0:DOWN",
    "--device",
    "roceP2p1s0f0=enP2p1s0f0np0:DOWN",
]


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_rdma_sysfs", GENERATOR_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need their module registered
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def ip_json(name: str) -> str:
    return (FIXTURES / name).read_text()


def fake_lookup(fixture: str):
    """Stands in for ``ip -j -4 addr show dev <netdev>`` on the node the fixture was taken from."""
    text = ip_json(fixture)
    return lambda netdev: gen.ipv4_from_ip_json(text, netdev)


@pytest.fixture
def ip_addr(monkeypatch):
    """Make the module see ``ip -j -4 addr show`` print a fixture; records the commands run."""
    calls: list = []
    state = {"rc": 0, "out": "[]", "err": ""}

    def run_command(self, args, **kwargs):
        calls.append(args)
        return state["rc"], state["out"], state["err"]

    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda self, name, *a, **kw: IP_BIN)

    def use(fixture: str | None = None, rc: int = 0, err: str = "") -> list:
        state.update(rc=rc, out=ip_json(fixture) if fixture else "", err=err)
        return calls

    return use


def make_tree(root: Path, fixture: str, gid_index: int = 3, extra: list[str] | None = None) -> str:
    argv = [
        "--root",
        str(root),
        *HEAD_DEVICES,
        "--gid-index",
        str(gid_index),
        "--mtu",
        "9000",
        *(extra or []),
    ]
    assert gen.main(argv, ipv4_lookup=fake_lookup(fixture)) == 0
    return str(root)


# --- the module ----------------------------------------------------------------------------


def test_head_node(run_module, ip_addr, tmp_path):
    calls = ip_addr("ip_addr_head.json")
    result = run_module(fabric_info, {"sysfs_root": make_tree(tmp_path / "sysfs", "ip_addr_head.json")})
    assert not result.failed, result.get("msg")
    assert result["changed"] is False
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
    assert "wlP9s9" in [i["ifname"] for i in result["non_rdma_interfaces"]]
    assert "warnings" not in result
    assert calls == [[IP_BIN, "-j", "-4", "addr", "show"]]  # argument list, never a shell string


def test_worker_node_with_gid_index_4(run_module, ip_addr, tmp_path):
    ip_addr("ip_addr_worker.json")
    root = make_tree(tmp_path / "sysfs", "ip_addr_worker.json", gid_index=4)
    fabric = run_module(fabric_info, {"sysfs_root": root})["fabric"]
    assert (fabric["ipv4"], fabric["gid_index"]) == ("198.18.0.11", 4)


def test_check_mode_and_second_run_change_nothing(run_module, ip_addr, tmp_path):
    ip_addr("ip_addr_head.json")
    root = make_tree(tmp_path / "sysfs", "ip_addr_head.json")
    before = gen.snapshot(root)
    first = run_module(fabric_info, {"sysfs_root": root})
    checked = run_module(fabric_info, {"sysfs_root": root}, check_mode=True)
    second = run_module(fabric_info, {"sysfs_root": root})
    assert first["changed"] is checked["changed"] is second["changed"] is False
    assert first["fabric"] == checked["fabric"] == second["fabric"]
    assert gen.snapshot(root) == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"ifname": "enP2p1s0f1np1"}, ("enP2p1s0f1np1", ["roceP2p1s0f1", "rocep1s0f1"])),
        ({"ipv4": "198.18.1.13"}, ("enP2p1s0f1np1", ["roceP2p1s0f1", "rocep1s0f1"])),
        ({"hcas": ["roceP2p1s0f1", "rocep1s0f1"]}, ("enP2p1s0f1np1", ["roceP2p1s0f1", "rocep1s0f1"])),
        ({"hcas": ["rocep1s0f1", "roceP2p1s0f1"]}, ("enp1s0f1np1", ["rocep1s0f1", "roceP2p1s0f1"])),
    ],
)
def test_overrides(run_module, ip_addr, tmp_path, args, expected):
    ip_addr("ip_addr_both_halves.json")
    root = make_tree(tmp_path / "sysfs", "ip_addr_both_halves.json")
    result = run_module(fabric_info, {"sysfs_root": root, **args})
    assert (result["fabric"]["ifname"], result["fabric"]["hcas"]) == expected


def test_override_warning_reaches_the_user(run_module, ip_addr, tmp_path):
    ip_addr("ip_addr_head.json")
    root = make_tree(tmp_path / "sysfs", "ip_addr_head.json")
    result = run_module(fabric_info, {"sysfs_root": root, "hcas": ["rocep1s0f1", "rocep1s0f0"]})
    # ansible-core 2.19 wraps warnings in WarningSummary objects; older cores print plain strings.
    messages = [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]]
    assert messages == ["fabric_hcas includes rocep1s0f0, whose port 1 state is DOWN."]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"ifname": "tailscale0"}, "tailscale0 exists but is not the netdev of any RDMA device"),
        ({"ipv4": "10.20.0.13"}, "10.20.0.13 is on enP7s7, which is not the netdev of any RDMA device"),
        ({"hcas": ["mlx5_0"]}, "do not exist: mlx5_0. RDMA devices on this node: rocep1s0f0, rocep1s0f1"),
    ],
)
def test_invalid_overrides_fail(run_module, ip_addr, tmp_path, args, expected):
    ip_addr("ip_addr_head.json")
    root = make_tree(tmp_path / "sysfs", "ip_addr_head.json")
    result = run_module(fabric_info, {"sysfs_root": root, **args})
    assert result.failed
    assert expected in result["msg"]
    assert result["changed"] is False


def test_nothing_usable_fails_with_devices_and_variables(run_module, ip_addr, tmp_path):
    ip_addr("ip_addr_no_fabric.json")
    root = make_tree(tmp_path / "sysfs", "ip_addr_no_fabric.json")
    result = run_module(fabric_info, {"sysfs_root": root})
    assert result.failed
    assert "rocep1s0f0: port 1 state is DOWN" in result["msg"]
    assert "rocep1s0f1: netdev enp1s0f1np1 has no IPv4 address" in result["msg"]
    assert "fabric_ifname, fabric_ipv4 and/or fabric_hcas" in result["msg"]
    assert [d["reason"] for d in result["rdma_devices"]][1] == "netdev enp1s0f1np1 has no IPv4 address"
    assert {i["ifname"] for i in result["non_rdma_interfaces"]} == {
        "docker0",
        "enP7s7",
        "tailscale0",
        "wlP9s9",
    }


def test_ip_failure_is_reported(run_module, ip_addr, tmp_path):
    ip_addr(None, rc=255, err='Option "-j" is unknown, try "ip -help".\n')
    result = run_module(fabric_info, {"sysfs_root": str(tmp_path)})
    assert result.failed
    assert (
        result["msg"] == f'{IP_BIN} -j -4 addr show failed (rc=255): Option "-j" is unknown, try "ip -help".'
    )


def test_return_documentation_matches_the_result(run_module, ip_addr, tmp_path):
    ip_addr("ip_addr_head.json")
    result = run_module(fabric_info, {"sysfs_root": make_tree(tmp_path / "sysfs", "ip_addr_head.json")})
    documented = yaml.safe_load(fabric_info.RETURN)
    assert set(documented["fabric"]["contains"]) == set(result["fabric"])
    device_doc = documented["rdma_devices"]["contains"]
    assert set(device_doc) == set(result["rdma_devices"][0])
    assert set(device_doc["netdevs"]["contains"]) == set(result["rdma_devices"][1]["netdevs"][0])
    options = yaml.safe_load(fabric_info.DOCUMENTATION)["options"]
    assert set(options) == {"sysfs_root", "ifname", "ipv4", "hcas"}


# --- the generator's command line ----------------------------------------------------------


def test_generator_cli_end_to_end_with_explicit_addresses(tmp_path):
    root = tmp_path / "sysfs"
    argv = [
        sys.executable,
        str(GENERATOR_PATH),
        "--root",
        str(root),
        *HEAD_DEVICES,
        "--ipv4",
        "enp1s0f1np1=198.18.0.13/24",
        "--ipv4",
        "enP2p1s0f1np1=",
        "--ipv4",
        "enp1s0f0np0=",
        "--ipv4",
        "enP2p1s0f0np0=",
        "--gid-index",
        "4",
    ]
    # PATH without ip proves that explicit addresses never run it.
    env = {**os.environ, "PATH": str(tmp_path)}
    first = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    assert summary["changed"] is True
    assert summary["devices"][0] == {
        "name": "rocep1s0f1",
        "netdev": "enp1s0f1np1",
        "state": "ACTIVE",
        "ipv4": ["198.18.0.13"],
        "roce_v2_gid_index": 4,
    }
    port = root / "class/infiniband/rocep1s0f1/ports/1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "phys_state").read_text() == "5: LinkUp\n"
    assert (port / "link_layer").read_text() == "Ethernet\n"
    assert (port / "gids/4").read_text() == "0000:0000:0000:0000:0000:ffff:c612:000d\n"
    assert (port / "gid_attrs/types/4").read_text() == "RoCE v2\n"
    assert (port / "gid_attrs/types/3").read_text() == "IB/RoCE v1\n"
    assert (port / "gid_attrs/ndevs/4").read_text() == "enp1s0f1np1\n"
    assert (root / "class/infiniband/rocep1s0f0/ports/1/state").read_text() == "1: DOWN\n"
    assert (root / "class/infiniband/roceP2p1s0f1/device/net/enP2p1s0f1np1").is_dir()
    assert (root / "class/net/enp1s0f1np1/operstate").read_text() == "up\n"
    assert (root / "class/net/enp1s0f0np0/carrier").read_text() == "0\n"

    second = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["changed"] is False


def test_generator_replaces_the_tree(tmp_path, capsys):
    root = tmp_path / "sysfs"
    make_tree(root, "ip_addr_head.json", gid_index=3)
    capsys.readouterr()
    argv = ["--root", str(root), "--device", "rocep1s0f1=enp1s0f1np1:DOWN"]
    assert gen.main(argv, fake_lookup("ip_addr_head.json")) == 0
    assert json.loads(capsys.readouterr().out)["changed"] is True
    assert sorted(os.listdir(root / "class/infiniband")) == ["rocep1s0f1"]
    assert (root / "class/infiniband/rocep1s0f1/ports/1/state").read_text() == "1: DOWN\n"


def test_generator_links_class_net_for_the_lab(tmp_path):
    root = make_tree(tmp_path / "sysfs", "ip_addr_head.json", extra=["--link-class-net"])
    class_net = Path(root) / "class/net"
    assert class_net.is_symlink()
    assert os.readlink(class_net) == "/sys/class/net"
    # Re-running swaps the link without following it into the real /sys.
    make_tree(Path(root), "ip_addr_head.json")
    assert not class_net.is_symlink()
    assert (class_net / "enp1s0f1np1/mtu").read_text() == "9000\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "rocep1s0f1=enp1s0f1np1:SLEEPY"], "unknown port state 'SLEEPY'"),
        (["--device", "=enp1s0f1np1"], "bad --device '=enp1s0f1np1'"),
        (["--device", "rocep1s0f1=enp1s0f1np1", "--ipv4", "enp1s0f1np1=fe80::1"], "is not an IPv4 address"),
        (["--device", "rocep1s0f1=enp1s0f1np1", "--gid-index", "1"], "--gid-index must be at least 2"),
        (["--device", "a=x", "--device", "a=y"], "duplicate device names"),
    ],
)
def test_generator_rejects_bad_arguments(tmp_path, capsys, argv, message):
    assert gen.main(["--root", str(tmp_path / "sysfs"), *argv], fake_lookup("ip_addr_head.json")) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("root", ["/sys", "/sys/class", "/"])
def test_generator_refuses_system_roots(capsys, root):
    assert gen.main(["--root", root, "--device", "rocep1s0f1=enp1s0f1np1"], lambda netdev: []) == 2
    assert "refusing to write a stand-in tree" in capsys.readouterr().err


def test_generator_refuses_a_foreign_non_empty_root(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    assert gen.main(["--root", str(tmp_path), "--device", "rocep1s0f1=enp1s0f1np1"], lambda netdev: []) == 2
    assert "has no STAND-IN-RDMA-SYSFS marker" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("rocep1s0f1=enp1s0f1np1:ACTIVE", ("rocep1s0f1", "enp1s0f1np1", "ACTIVE", None)),
        ("roceP2p1s0f0=enP2p1s0f0np0:down:link_up", ("roceP2p1s0f0", "enP2p1s0f0np0", "DOWN", "LinkUp")),
        ("rocep1s0f0", ("rocep1s0f0", None, "ACTIVE", None)),
        ("rocep1s0f0:INIT", ("rocep1s0f0", None, "INIT", None)),
    ],
)
def test_generator_device_spec(spec, expected):
    parsed = gen.parse_device_spec(spec)
    assert (parsed.name, parsed.netdev, parsed.state, parsed.phys_state) == expected


@pytest.mark.parametrize("gid_index", [2, 3, 4, 6])
def test_generator_gid_table_layout(gid_index):
    table = gen.gid_table("enp1s0f1np1", ["198.18.0.13", "198.18.0.14"], gid_index)
    assert table[0][1] == "IB/RoCE v1"
    assert table[1] == (table[0][0], "RoCE v2")
    assert table[0][0].startswith("fe80:")
    assert table[gid_index] == ("0000:0000:0000:0000:0000:ffff:c612:000d", "RoCE v2")
    v2_for_second = [i for i, (gid, kind) in table.items() if gid.endswith("c612:000e") and kind == "RoCE v2"]
    assert v2_for_second and v2_for_second[0] > gid_index
    assert sorted(table) == list(range(len(table)))  # no holes before the last entry


def test_generator_ip_lookup_parses_real_ip_output():
    text = ip_json("ip_addr_both_halves.json")
    assert gen.ipv4_from_ip_json(text, "enP2p1s0f1np1") == ["198.18.1.13"]
    assert gen.ipv4_from_ip_json(text, "enp1s0f0np0") == []
    assert "192.168.1.20" in gen.ipv4_from_ip_json(text)
