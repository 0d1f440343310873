"""Tests against the REAL vLLM engine (its CPU build) that molecule's scenario real-engine has
converged on the lab from inventory/lab-vllm (run from that scenario's verify).

Like tests/deployment they neither start nor remove the lab: they look at what site.yml left and
re-run the playbooks as a user would, here with the recipe tiny-chat beside that inventory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deployment"))
from deployment_support import api_key
from lab_support import REGISTRY, REPO, STATE, Lab

INVENTORY = str(REPO / "inventory" / "lab-vllm" / "hosts.yml")


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
