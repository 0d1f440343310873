"""Tests against the REAL vLLM engine (its CPU build) that molecule's scenario real-engine has
converged on the lab from inventory/lab-vllm (run from that scenario's verify).

Like tests/deployment they neither start nor remove the lab: they look at what site.yml left and
re-run the playbooks as a user would, here with the recipe tiny-chat beside that inventory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

INVENTORY = str(Path(__file__).resolve().parents[2] / "inventory" / "lab-vllm" / "hosts.yml")
# The lab that inventory names runs beside inventory/lab's: lab_support takes its addresses, ports
# and state from lab/labctl.py, which reads the lab's number when it is imported, below.
os.environ["SPARKSERVE_LAB_INSTANCE"] = str(
    yaml.safe_load(Path(INVENTORY).read_text())["all"]["vars"]["lab_instance"]
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deployment"))
from deployment_support import api_key  # noqa: E402 - after the lab's number is set above
from lab_support import (  # noqa: E402 - as above
    PROMETHEUS_KEY_FILE,
    REGISTRY,
    STATE,
    Lab,
    the_machine,
    wait_for,
)


@pytest.fixture(autouse=True)
def _machine_shared_with_the_other_lab():
    """Each case starts and stops ranks: not while a case of the stand-in lab measures against the
    machine's cores or memory (lab_support.the_machine)."""
    with the_machine(exclusive=False):
        yield


@pytest.fixture(scope="session")
def lab() -> Lab:
    digest = (STATE / "vllm-engine-digest").read_text().strip()
    return Lab(
        engine_image=f"{REGISTRY}/sparkserve-lab/vllm-cpu@{digest}",
        hub_token=(STATE / "hub-token").read_text().strip(),
        key=STATE / "ssh" / "id_ed25519",
    )


@pytest.fixture(scope="session")
def key(lab) -> str:
    """The API key site.yml generated on the head."""
    return api_key(lab)


@pytest.fixture(scope="session")
def scraped(key) -> None:
    """The lab's Prometheus given the key (as an owner's would be) and reaching every endpoint:
    vLLM's, the supervisor's and each node's memory guard, all through the head's gateway."""
    from real_engine_support import prometheus  # here: that module imports this one

    descriptor = os.open(PROMETHEUS_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as key_file:
        key_file.write(key + "\n")
    expected = {
        ("vllm", ""),
        ("dsv41-supervisor", ""),
        ("dsv41-memguard", "head"),
        ("dsv41-memguard", "worker"),
    }

    def every_target_up() -> bool:
        up = {(s["metric"]["job"], s["metric"].get("node", "")) for s in prometheus("up == 1")}
        return expected <= up

    assert wait_for(every_target_up, timeout=60, interval=2), prometheus("up")
