"""The deployment role's shared settings, resolved by ansible-playbook on this machine.

Two inventory hosts, a head and a worker, both this machine over the local connection (so both
have this user's home). Each case runs the `settings` entry point and prints what it resolved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from local_pair import INVENTORY

REPO = Path(__file__).resolve().parents[3]
HOME = os.path.expanduser("~")

PLAYBOOK = [
    {
        "name": "Resolve the shared settings",
        "hosts": "head:workers",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Resolve them",
                "ansible.builtin.include_role": {
                    "name": "sparkserve.dsv41.deployment",
                    "tasks_from": "settings",
                },
            },
            {
                "name": "Show them",
                "ansible.builtin.debug": {
                    "msg": "RESOLVED {{ {'node_model_path': deployment_node_model_path,"
                    " 'rank': deployment_rank_index, 'state_path': deployment_state_path} | to_json }}"
                },
            },
        ],
    }
]


def resolve(tmp_path: Path, variables: dict, *extra: str) -> dict[str, dict]:
    """Run the play; {host: what it resolved}."""
    (tmp_path / "playbook.yml").write_text(yaml.safe_dump(PLAYBOOK, sort_keys=False))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
    )
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "playbook.yml")]
    argv += ["-i", str(tmp_path / "hosts.yml"), "-e", json.dumps(variables), *extra]
    done = subprocess.run(argv, cwd=REPO, env=env, text=True, capture_output=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (play,) = json.loads(done.stdout[done.stdout.index("{") :])["plays"]
    shown = next(task for task in play["tasks"] if task["task"]["name"] == "Show them")
    return {
        host: json.loads(result["msg"].removeprefix("RESOLVED ")) for host, result in shown["hosts"].items()
    }


@pytest.mark.parametrize(
    ("variables", "extra", "expected"),
    [
        pytest.param(
            {},
            (),
            {
                "spark-head": f"{HOME}/models/DeepSeek-V4.1-Flash-Spark",
                "spark-worker": f"{HOME}/models/DeepSeek-V4.1-Flash-Spark",
            },
            id="defaults",
        ),
        pytest.param(
            {"deployment_model_dir": f"{HOME}/m"},
            (),
            {"spark-head": f"{HOME}/m", "spark-worker": f"{HOME}/m"},
            id="the-workers-follow-the-head",
        ),
        pytest.param(
            {"deployment_model_dir": "/data/m", "deployment_worker_model_dir": "~/w"},
            (),
            {"spark-head": "/data/m", "spark-worker": f"{HOME}/w"},
            id="worker-model-dir",
        ),
        pytest.param(
            {"deployment_model_dir": "~/m"},
            ("--limit", "spark-worker"),
            {"spark-worker": f"{HOME}/m"},
            id="without-the-head",
        ),
    ],
)
def test_each_node_resolves_its_model_directory_exactly(tmp_path, variables, extra, expected):
    resolved = resolve(tmp_path, {"deployment_state_dir": "~/.state", **variables}, *extra)
    assert {host: found["node_model_path"] for host, found in resolved.items()} == expected
    assert {host: found["rank"] for host, found in resolved.items()} == {
        host: ["spark-head", "spark-worker"].index(host) for host in expected
    }
    assert all(found["state_path"] == f"{HOME}/.state" for found in resolved.values())
