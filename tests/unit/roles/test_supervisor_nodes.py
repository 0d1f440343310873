"""How the head's supervisor reaches each rank (roles/supervisor/vars/main.yml: __supervisor_nodes),
rendered with Jinja as Ansible renders it: the head's rank control locally, a worker's over SSH on
the address and port Ansible uses."""

from __future__ import annotations

import ast

import jinja2
import pytest
import yaml
from role_defaults import ROLES, role_defaults

VARS = yaml.safe_load((ROLES / "supervisor" / "vars" / "main.yml").read_text())
RANKCTL = ["/usr/bin/python3", "/opt/dsv41/dsv41_rankctl.py", "--config", "/etc/dsv41/rankctl.json"]
HOSTVARS = {
    "spark-a": {"ansible_host": "10.0.0.1", "ansible_facts": {"user_id": "spark"}},
    "spark-b": {"ansible_host": "10.0.0.2", "ansible_port": 2222, "ansible_facts": {"user_id": "spark"},
                "fabric_selected": {"ipv4": "192.168.100.12"}},
    "spark-c": {"ansible_facts": {"user_id": "ops"}, "fabric_selected": {"ipv4": "192.168.100.13"}},
}  # fmt: skip


def nodes(**overrides) -> dict[str, list[str]]:
    values = {
        **role_defaults("deployment", "supervisor"),
        "deployment_rank_nodes": list(HOSTVARS),
        "hostvars": HOSTVARS,
        "deployment_config_dir": "/etc/dsv41",
        "__supervisor_key": "/etc/dsv41/supervisor_ed25519",
        "__supervisor_rankctl_argv": RANKCTL,
        **overrides,
    }
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    rendered = environment.from_string(VARS["__supervisor_nodes"]).render(values)
    return {node["name"]: node["rankctl"] for node in ast.literal_eval(rendered.strip())}


def ssh_target(argv: list[str]) -> tuple[list[str], str]:
    """The port option (if any) and the user@address of an SSH argv."""
    port = argv[argv.index("-p") : argv.index("-p") + 2] if "-p" in argv else []
    return port, argv[-1]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("", {"spark-b": (["-p", "2222"], "spark@10.0.0.2"), "spark-c": ([], "ops@spark-c")},
                     id="as ansible connects"),
        pytest.param("fabric", {"spark-b": (["-p", "2222"], "spark@192.168.100.12"),
                                "spark-c": ([], "ops@192.168.100.13")}, id="on the fabric"),
    ],
)  # fmt: skip
def test_a_worker_is_reached_on_ansibles_address_and_port_and_the_head_locally(address, expected):
    reached = nodes(supervisor_worker_address=address)
    workers = {name: argv for name, argv in reached.items() if name != "spark-a"}
    assert reached["spark-a"] == RANKCTL
    assert {name: ssh_target(argv) for name, argv in workers.items()} == expected
    assert all(argv[0] == "ssh" and "BatchMode=yes" in argv for argv in workers.values())
