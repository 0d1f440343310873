"""Tests of a deployment that molecule has converged on the lab (run from molecule's verify).

Unlike tests/lab they neither start nor remove the lab: they look at what site.yml left there,
and re-run the playbooks the way a user would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
from deployment_support import run_playbook, user_environment
from lab_support import ENGINE_REPO, REGISTRY, REPO, STATE, Lab


@pytest.fixture(scope="session")
def lab() -> Lab:
    digest = (STATE / "engine-digest").read_text().strip()
    return Lab(
        engine_image=f"{REGISTRY}/{ENGINE_REPO}@{digest}",
        hub_token=(STATE / "hub-token").read_text().strip(),
        key=STATE / "ssh" / "id_ed25519",
    )


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory) -> Path:
    """A directory outside the checkout, with the collection built and installed as a user would:
    playbooks run there by FQCN see neither this checkout's ansible.cfg nor its collections/ link."""
    home = tmp_path_factory.mktemp("installed")
    env = user_environment()
    build = subprocess.run(
        ["ansible-galaxy", "collection", "build", "--output-path", str(home), str(REPO)],
        text=True, capture_output=True, check=True, env=env,
    )  # fmt: skip
    tarball = next(home.glob("sparkserve-dsv41-*.tar.gz"))
    collections = home / "collections"
    subprocess.run(
        ["ansible-galaxy", "collection", "install", "--no-deps", "-p", str(collections), str(tarball)],
        text=True, capture_output=True, check=True, env=env, cwd=home,
    )  # fmt: skip
    assert (collections / "ansible_collections" / "sparkserve" / "dsv41" / "playbooks").is_dir(), build.stdout
    return home


@pytest.fixture(scope="session")
def fqcn(installed_collection):
    """Run a playbook of the installed collection by its FQCN (sparkserve.dsv41.<name>)."""

    def run(name: str, *args: str):
        env = user_environment(ANSIBLE_COLLECTIONS_PATH=str(installed_collection / "collections"))
        return run_playbook(f"sparkserve.dsv41.{name}", *args, cwd=installed_collection, env=env)

    return run
