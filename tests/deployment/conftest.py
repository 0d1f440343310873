"""Tests of a deployment that molecule has converged on the lab (run from molecule's verify).

Unlike tests/lab they neither start nor remove the lab: they look at what site.yml left there,
and re-run the playbooks the way a user would.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
from lab_support import ENGINE_REPO, REGISTRY, STATE, Lab


@pytest.fixture(scope="session")
def lab() -> Lab:
    digest = (STATE / "engine-digest").read_text().strip()
    return Lab(
        engine_image=f"{REGISTRY}/{ENGINE_REPO}@{digest}",
        hub_token=(STATE / "hub-token").read_text().strip(),
        key=STATE / "ssh" / "id_ed25519",
    )
