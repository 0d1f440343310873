"""The lab acceptance tests bring the lab up once, use it, and prove that it goes away.

They drive Docker on this machine; run them as root (``make lab-test``), never two runs at once.
"""

from __future__ import annotations

import pytest
from lab_support import ENGINE_REPO, REGISTRY, STATE, Lab, labctl_run


@pytest.fixture(scope="session")
def lab() -> Lab:
    labctl_run("up")
    digest = (STATE / "engine-digest").read_text().strip()
    yield Lab(
        engine_image=f"{REGISTRY}/{ENGINE_REPO}@{digest}",
        hub_token=(STATE / "hub-token").read_text().strip(),
        key=STATE / "ssh" / "id_ed25519",
    )
    labctl_run("down")
