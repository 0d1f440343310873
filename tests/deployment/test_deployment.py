"""What site.yml leaves on the lab, held against the reference configuration."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from lab_support import FABRIC_ADDRESS, MGMT_ADDRESS, REPO, http_status
from reference_config import reference_vllm_argv, reference_vllm_env

RANKS = {"head": 0, "worker": 1}
HCAS = "rocep1s0f1,roceP2p1s0f1"
IMAGE_ENV = {"PATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "container"}
STATE_DIR = "/home/spark/.dsv41-two-sparks"
MODEL_DIR = "/home/spark/models/DeepSeek-V4.1-Flash-Spark"


def site(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run site.yml on the lab as a user would; return the run and its seconds."""
    started = time.monotonic()
    run = subprocess.run(
        ["ansible-playbook", "playbooks/site.yml", "-i", "inventory/lab", *args],
        cwd=REPO, text=True, capture_output=True, check=False,
        env={**os.environ, "ANSIBLE_FORCE_COLOR": "0"},
    )  # fmt: skip
    return run, time.monotonic() - started


def recap(output: str) -> dict[str, dict[str, int]]:
    return {
        host: {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", counts)}
        for host, counts in re.findall(r"^(\w+)\s+: (ok=.*)$", output, re.MULTILINE)
    }


def inspect(lab, node: str) -> dict:
    out = lab.ssh(node, f"docker inspect dsv41-r{RANKS[node]}").stdout
    return json.loads(out)[0]


def api_key(lab) -> str:
    return lab.ssh("head", f"cat {STATE_DIR}/api_key").stdout.strip()


@pytest.mark.parametrize("node", ["head", "worker"])
def test_rank_command_line_is_the_reference(lab, node):
    container = inspect(lab, node)
    expected = ["vllm", *reference_vllm_argv(RANKS[node], 2, FABRIC_ADDRESS["head"])]
    assert [*(container["Config"]["Entrypoint"] or []), *container["Config"]["Cmd"]] == expected


@pytest.mark.parametrize("node", ["head", "worker"])
def test_rank_environment_is_the_reference_with_this_nodes_fabric(lab, node):
    env = dict(item.split("=", 1) for item in inspect(lab, node)["Config"]["Env"])
    reference = reference_vllm_env("enp1s0f1np1", FABRIC_ADDRESS[node], HCAS)
    assert {key: env.get(key) for key in reference} == reference
    extra = set(env) - set(reference) - IMAGE_ENV
    assert extra == ({"VLLM_API_KEY"} if node == "head" else set()), "the key reaches only the head"
    if node == "head":
        assert env["VLLM_API_KEY"] == api_key(lab)


@pytest.mark.parametrize("node", ["head", "worker"])
def test_rank_container_options(lab, node):
    host = inspect(lab, node)["HostConfig"]
    assert host["NetworkMode"] == "host"
    assert host["IpcMode"] == "host"
    assert host["ShmSize"] == 32 * 1024**3
    assert host["RestartPolicy"]["Name"] == "unless-stopped"
    assert sorted(host["Binds"]) == sorted(
        [f"{MODEL_DIR}:/model:ro", f"{STATE_DIR}/plans:/plans:ro", f"{STATE_DIR}/cache:/cache:rw"]
    )


def test_plan_copy_points_at_the_mounted_banks(lab):
    for node in RANKS:
        plan = json.loads(lab.ssh(node, f"cat {STATE_DIR}/plans/J268-ho-v31-K5n.json").stdout)
        assert plan["qdir"] == "/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s"


def test_checkpoint_is_rebuilt_and_verified_on_every_node(lab):
    for node in RANKS:
        check = lab.ssh(node, f"cd {MODEL_DIR} && sha256sum -c sha256-manifest.txt && ls")
        assert check.stdout.count(": OK") == 6
        assert ".part" not in check.stdout, "parts are deleted once their shard is verified"


def test_api_answers_with_the_key_only(lab):
    url = f"http://{MGMT_ADDRESS['head']}:8000/v1/models"
    assert http_status(url, {"Authorization": f"Bearer {api_key(lab)}"}) == 200
    assert http_status(url) == 401
    assert http_status(url, {"Authorization": "Bearer wrong"}) == 401


def test_key_is_in_no_command_line_and_no_unit_file(lab):
    key = api_key(lab)
    for node in RANKS:
        assert key not in lab.ssh(node, "ps -eo args").stdout
        assert key not in lab.ssh(node, "sudo cat /etc/systemd/system/*.service").stdout
    assert lab.ssh("head", f"stat -c '%a %U' {STATE_DIR}/api_key {STATE_DIR}/rank.env").stdout.split("\n")[
        :2
    ] == [
        "600 spark",
        "600 root",
    ]


def test_second_run_changes_nothing_and_never_prints_the_key(lab):
    run, _ = site("-vvv")
    assert run.returncode == 0, run.stdout[-3000:]
    assert all(counts["changed"] == 0 for counts in recap(run.stdout).values()), run.stdout[-3000:]
    assert api_key(lab) not in run.stdout + run.stderr
    assert "Bytes read" not in run.stdout or "0.00 Bytes read" in run.stdout, "no checkpoint data re-read"


def test_check_mode_on_a_converged_lab_changes_nothing():
    run, _ = site("--check")
    assert run.returncode == 0, run.stdout[-3000:]
    assert all(counts["changed"] == 0 for counts in recap(run.stdout).values()), run.stdout[-3000:]


def started_at(lab, node: str) -> str:
    return inspect(lab, node)["State"]["StartedAt"]


def test_a_serving_change_restarts_both_ranks_worker_first(lab):
    before = {node: started_at(lab, node) for node in RANKS}
    run, _ = site("-e", "rank_max_num_seqs=3")
    try:
        assert run.returncode == 0, run.stdout[-3000:]
        after = {node: started_at(lab, node) for node in RANKS}
        assert all(after[node] != before[node] for node in RANKS), "both ranks restarted"
        assert after["worker"] < after["head"], "the worker starts before the head"
        assert "--max-num-seqs" in inspect(lab, "worker")["Config"]["Cmd"]
    finally:
        restored, _ = site()
        assert restored.returncode == 0, restored.stdout[-3000:]


def test_a_rank_that_dies_at_start_up_fails_the_run_fast_with_both_logs():
    run, seconds = site("--tags", "rank", "-e", '{"rank_extra_args": ["--no-such-flag"]}')
    try:
        assert run.returncode != 0
        assert seconds < 90, f"failed after {seconds:.0f} s"
        assert "A rank failed to start" in run.stdout
        assert "unrecognized arguments: --no-such-flag" in run.stdout, "the head's log lines are shown"
        assert "===== worker (dsv41-r1)" in run.stdout, "the worker's log lines are shown"
    finally:
        restored, _ = site()
        assert restored.returncode == 0, restored.stdout[-3000:]


def test_teardown_stops_ranks_and_guards_and_site_brings_them_back(lab):
    run = subprocess.run(
        ["ansible-playbook", "playbooks/teardown.yml", "-i", "inventory/lab"],
        cwd=REPO, text=True, capture_output=True, check=False,
    )  # fmt: skip
    try:
        assert run.returncode == 0, run.stdout[-3000:]
        for node, rank in RANKS.items():
            assert (
                lab.ssh(node, f"docker inspect -f '{{{{.State.Running}}}}' dsv41-r{rank}").stdout.strip()
                == "false"
            )
            assert lab.ssh(node, "systemctl is-active dsv41-memguard", check=False).stdout.strip() != "active"
            assert (
                lab.ssh(node, f"test -s {STATE_DIR}/api_key || test {node} = worker", check=False).returncode
                == 0
            )
    finally:
        restored, _ = site()
    assert restored.returncode == 0, restored.stdout[-3000:]
    url = f"http://{MGMT_ADDRESS['head']}:8000/v1/models"
    assert http_status(url, {"Authorization": f"Bearer {api_key(lab)}"}) == 200
    for node in RANKS:
        assert lab.ssh(node, "systemctl is-active dsv41-memguard").stdout.strip() == "active"


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("dsv41_api_port=70000", "dsv41_api_port"),
        ("dsv41_image=registry.example/dsv41:latest", "dsv41_image"),
        ("rank_kv_cache_memory_bytes=-1", "rank_kv_cache_memory_bytes"),
        ("rank_master_port=0", "rank_master_port"),
        ("dsv41_worker_group=nobody", "dsv41_worker_group"),
    ],
)
def test_bad_variables_fail_in_preflight_naming_the_variable(override, named):
    run, _ = site("-e", override)
    assert run.returncode != 0
    assert named in run.stdout
    assert "PLAY [Put the verified checkpoint" not in run.stdout, "nothing after preflight ran"
    assert all(counts["changed"] == 0 for counts in recap(run.stdout).values())


def test_status_shows_every_node_in_one_table():
    run = subprocess.run(
        ["ansible-playbook", "playbooks/status.yml", "-i", "inventory/lab"],
        cwd=REPO, text=True, capture_output=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    rows = {
        line.split()[0]: line
        for line in run.stdout.splitlines()
        if re.match(r"\s*(head|worker)\s+dsv41-r", line)
    }
    assert set(rows) == {"head", "worker"}, run.stdout
    assert "running since" in rows["head"] and "healthy" in rows["head"] and "not healthy" not in rows["head"]
    assert "running since" in rows["worker"]
    assert all(" active " in row and "GiB" in row for row in rows.values())
