"""What a user gets: the commands the README gives, and the artifact ansible-galaxy builds."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
PLAYBOOKS = sorted(path.stem for path in (REPO / "playbooks").glob("*.yml"))


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, text=True, capture_output=True, check=False)


def test_every_playbook_has_a_root_wrapper_that_imports_it():
    assert {"site", "teardown", "restart", "status"} <= set(PLAYBOOKS)
    for name in PLAYBOOKS:
        plays = yaml.safe_load((REPO / f"{name}.yml").read_text())
        expected = {
            "name": f"Run playbooks/{name}.yml",
            "ansible.builtin.import_playbook": f"playbooks/{name}.yml",
        }
        assert plays == [expected]


@pytest.mark.parametrize(
    "argv",
    [
        ["ansible-playbook", "site.yml", "-i", "inventory/sparks", "--syntax-check"],
        ["ansible-playbook", "teardown.yml", "--syntax-check"],
        ["ansible-playbook", "restart.yml", "--syntax-check"],
        ["ansible-playbook", "status.yml", "--syntax-check"],
    ],
    ids=lambda argv: " ".join(argv[1:]),
)
def test_the_design_cards_commands_work_from_the_repository_root(argv):
    result = run(*argv)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> tarfile.TarFile:
    out = tmp_path_factory.mktemp("build")
    result = run("ansible-galaxy", "collection", "build", "--output-path", str(out), str(REPO))
    assert result.returncode == 0, result.stderr
    with tarfile.open(next(out.glob("sparkserve-dsv41-*.tar.gz"))) as tar:
        yield tar


def test_the_artifact_ships_what_a_user_runs(artifact):
    names = set(artifact.getnames())
    for shipped in ("playbooks/site.yml", "playbooks/restart.yml", "roles/rank/tasks/main.yml",
                    "plugins/modules/checkpoint_shards.py", "meta/runtime.yml", "requirements.yml",
                    "inventory/sparks/hosts.yml", "README.md", "dashboards/dsv41-pair.json",
                    "roles/supervisor/files/dsv41_supervisor_metrics.py",
                    "roles/memguard/files/dsv41_memguard_metrics.py"):  # fmt: skip
        assert shipped in names


def test_the_artifact_ships_no_stand_in_and_no_test(artifact):
    top = {name.split("/", 1)[0] for name in artifact.getnames()}
    assert not top & {"lab", "tests", "molecule", "benchmarks", "collections", ".venv", ".lab", "site.yml"}
    assert not [name for name in artifact.getnames() if name.startswith("inventory/lab")]
    assert not [name for name in artifact.getnames() if "standin" in name.lower()]


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_every_role_declares_the_collections_minimum_ansible_which_the_tested_core_meets():
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    minimum = runtime["requires_ansible"].removeprefix(">=")
    roles = sorted((REPO / "roles").glob("*/meta/main.yml"))
    assert len(roles) >= 10
    declared = {
        path.parts[-3]: yaml.safe_load(path.read_text())["galaxy_info"]["min_ansible_version"]
        for path in roles
    }
    assert set(declared.values()) == {minimum.rsplit(".", 1)[0]}, declared
    # The suite runs the pinned ansible-core: the declared minimum must not be newer than it.
    pinned = re.search(r"^ansible-core==([0-9.]+)$", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert pinned, "requirements.txt pins ansible-core"
    assert version(minimum) <= version(pinned.group(1)), (minimum, pinned.group(1))


def test_runtime_requirements_bring_the_collections_the_roles_use():
    requirements = (REPO / "requirements.txt").read_text()
    assert "\nansible==" in requirements, "requirements.txt alone must bring community.docker and friends"
    galaxy = yaml.safe_load((REPO / "requirements.yml").read_text())
    names = {entry["name"] for entry in galaxy["collections"]}
    used = set()
    for path in (REPO / "roles").rglob("*.yml"):
        for prefix in ("community.docker.", "ansible.posix.", "community.general."):
            if prefix in path.read_text():
                used.add(prefix.rstrip("."))
    assert used <= names
