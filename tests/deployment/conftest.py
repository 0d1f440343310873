"""Tests of a deployment that molecule has converged on the lab (run from molecule's verify).

Unlike tests/lab they neither start nor remove the lab: they look at what site.yml left there,
and re-run the playbooks the way a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
from deployment_support import run_playbook, user_environment
from lab_support import ENGINE_REPO, REGISTRY, REPO, STATE, Lab, the_machine


def pytest_collection_modifyitems(items):
    """test_clients.py runs last: its bench measures rates within 3 % and takes the machine to itself,
    which the lab beside this one in CI (the real engine's) holds shared through each of its cases,
    but loads without it while it converges, which is over long before this suite ends."""
    items.sort(key=lambda item: item.path.name == "test_clients.py")


@pytest.fixture
def machine_to_itself():
    """No case of the lab beside this one runs meanwhile (lab_support.the_machine)."""
    with the_machine(exclusive=True):
        yield


@pytest.fixture(scope="session")
def lab() -> Lab:
    digest = (STATE / "engine-digest").read_text().strip()
    return Lab(
        engine_image=f"{REGISTRY}/{ENGINE_REPO}@{digest}",
        hub_token=(STATE / "hub-token").read_text().strip(),
        key=STATE / "ssh" / "id_ed25519",
    )


@pytest.fixture(scope="session")
def production_venv(tmp_path_factory) -> Path:
    """A controller as the README's quick start makes it: a virtualenv from requirements.txt alone
    (none of the development requirements), so a missing runtime dependency fails these tests."""
    venv = tmp_path_factory.mktemp("controller") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # --no-compile: Python compiles what the playbooks import as they import it, not all of ansible.
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile"]
    install = subprocess.run(
        [*pip, "--requirement", str(REPO / "requirements.txt")], text=True, capture_output=True, check=False
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


def production_environment(venv: Path, **extra: str) -> dict[str, str]:
    """A user's shell with the production virtualenv first on PATH and nothing of this checkout's."""
    env = user_environment(**extra)
    env.pop("VIRTUAL_ENV", None)
    path = [entry for entry in env.get("PATH", "").split(os.pathsep) if not entry.startswith(str(REPO))]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    return env


@pytest.fixture(scope="session")
def collection_artifact(tmp_path_factory, production_venv) -> Path:
    """The collection built as it is published (ansible-galaxy collection build)."""
    out = tmp_path_factory.mktemp("artifact")
    subprocess.run(
        ["ansible-galaxy", "collection", "build", "--output-path", str(out), str(REPO)],
        text=True, capture_output=True, check=True, env=production_environment(production_venv),
    )  # fmt: skip
    return next(out.glob("sparkserve-dsv41-*.tar.gz"))


@pytest.fixture(scope="session")
def installed_collection(tmp_path_factory, production_venv, collection_artifact) -> Path:
    """A directory outside the checkout with the collection installed from its artifact, as a user
    would: playbooks run there by FQCN see neither this checkout's ansible.cfg nor its collections/
    link, and take the collections they use from the production virtualenv's `ansible` package."""
    home = tmp_path_factory.mktemp("installed")
    collections = home / "collections"
    subprocess.run(
        ["ansible-galaxy", "collection", "install", "--no-deps", "-p", str(collections),
         str(collection_artifact)],
        text=True, capture_output=True, check=True, env=production_environment(production_venv), cwd=home,
    )  # fmt: skip
    assert (collections / "ansible_collections" / "sparkserve" / "dsv41" / "playbooks").is_dir()
    return home


@pytest.fixture(scope="session")
def fqcn(installed_collection, production_venv):
    """Run a playbook of the installed collection by its FQCN (sparkserve.dsv41.<name>) with the
    production virtualenv's ansible-playbook."""

    def run(name: str, *args: str):
        env = production_environment(
            production_venv, ANSIBLE_COLLECTIONS_PATH=str(installed_collection / "collections")
        )
        return run_playbook(f"sparkserve.dsv41.{name}", *args, cwd=installed_collection, env=env)

    return run
