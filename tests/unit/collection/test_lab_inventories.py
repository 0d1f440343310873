"""Each lab inventory names the lab that lab/labctl.py brings up for it: its nodes' addresses, its
registry, hub, wheels and state directory, resolved by Ansible as a run resolves them, against
`labctl layout` for the inventory's lab_instance (two labs run side by side, so a wrong number
would reach the other lab)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
# What a run resolves from group_vars/all.yml (the lab's variables) and the inventory.
RESOLVED = (
    '{{ {"mgmt": ansible_host, "registry": lab_registry, "hub": lab_hub_endpoint,'
    ' "wheels": lab_pip_find_links, "state": lab_state_dir, "metrics": rank_api_metrics_sources,'
    ' "pip": checkpoint_pip_extra_args} }}'
)
INVENTORIES = {
    "lab": "inventory/lab",
    "lab-3": "inventory/lab-3/hosts.yml",
    "lab-vllm": "inventory/lab-vllm/hosts.yml",
}


def inventory_vars(inventory: str) -> dict:
    path = REPO / inventory
    hosts = path / "hosts.yml" if path.is_dir() else path
    return yaml.safe_load(hosts.read_text())["all"].get("vars", {})


def resolved(inventory: str) -> dict[str, dict]:
    env = {
        **os.environ,
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
    }
    run = subprocess.run(
        [
            "ansible",
            "all",
            "-i",
            inventory,
            "-c",
            "local",
            "-m",
            "ansible.builtin.debug",
            "-a",
            f"msg={RESOLVED}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    hosts = json.loads(run.stdout)["plays"][0]["tasks"][0]["hosts"]
    return {host: result["msg"] for host, result in hosts.items()}


def layout(instance: int, workers: int) -> dict:
    run = subprocess.run(
        [sys.executable, str(REPO / "lab" / "labctl.py"), "layout", "--workers", str(workers)],
        env={**os.environ, "SPARKSERVE_LAB_INSTANCE": str(instance)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout)


@pytest.mark.parametrize("inventory", INVENTORIES.values(), ids=INVENTORIES.keys())
def test_the_inventory_names_its_labs_addresses_services_and_state(inventory):
    instance = inventory_vars(inventory).get("lab_instance", 0)
    hosts = resolved(inventory)
    lab = layout(instance, workers=len(hosts) - 1)
    assert set(hosts) == set(lab["nodes"])
    mgmt_gateway = lab["hub"].split("//", 1)[1].rsplit(":", 1)[0]
    for host, values in hosts.items():
        assert values["mgmt"] == lab["nodes"][host]["mgmt"], host
        assert values["registry"] == lab["registry"]
        assert values["hub"] == lab["hub"]
        assert values["wheels"] == lab["wheels"]
        assert (REPO / values["state"]).resolve() == Path(lab["state"]).resolve()
        # The worker stands for a Prometheus server (group_vars): the lab's own worker.
        assert values["metrics"] == [lab["nodes"]["worker"]["fabric"]]
        assert f"--trusted-host {mgmt_gateway} " in values["pip"]


def test_the_real_engines_lab_runs_beside_the_stand_ins():
    numbers = {
        name: inventory_vars(inventory).get("lab_instance", 0) for name, inventory in INVENTORIES.items()
    }
    assert numbers["lab-vllm"] != numbers["lab"], numbers
    # make lab-vllm brings up the lab that inventory/lab-vllm names.
    makefile = (REPO / "Makefile").read_text()
    lab_vllm = re.search(r"^lab-vllm:.*?(?=^\S)", makefile, re.MULTILINE | re.DOTALL)
    assert lab_vllm and f"SPARKSERVE_LAB_INSTANCE={numbers['lab-vllm']} " in lab_vllm.group(0)
