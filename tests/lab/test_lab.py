"""Acceptance of the lab itself: what later roles rely on really works inside it."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time

from ansible_collections.sparkserve.dsv41.plugins.module_utils._exl3_plan import rewrite_plan
from lab_support import (
    API_URL,
    FABRIC_ADDRESS,
    HUB_ENDPOINT,
    HUB_REPO,
    LAB_USER,
    LABCTL,
    MGMT_ADDRESS,
    STATE,
    WHEELS_HOST,
    WHEELS_URL,
    http_status,
    lab_resources,
    labctl,
    labctl_run,
    wait_for,
)
from reference_config import PLAN_NAME, reference_vllm_argv, reference_vllm_env


def test_nodes_carry_the_spark_interface_names(lab):
    for node in ("head", "worker"):
        links = lab.ssh(node, "ip -br -4 addr").stdout
        assert "enp1s0f1np1" in links and FABRIC_ADDRESS[node] in links
        assert "enP2p1s0f1np1" in links
        assert "wlP9s9" in links and MGMT_ADDRESS[node] in links, "the Wi-Fi decoy holds IPv4"
        assert (
            "4: ACTIVE"
            in lab.ssh(node, "cat /opt/sparkserve-lab/sysfs/class/infiniband/rocep1s0f1/ports/1/state").stdout
        )
        assert (
            "DOWN"
            in lab.ssh(node, "cat /opt/sparkserve-lab/sysfs/class/infiniband/rocep1s0f0/ports/1/state").stdout
        )


def test_head_reaches_worker_by_ssh_over_the_fabric(lab):
    key = "/tmp/lab-fabric-test-key"
    lab.ssh("head", f"rm -f {key} {key}.pub && ssh-keygen -q -t ed25519 -N '' -C fabric-test -f {key}")
    public = lab.ssh("head", f"cat {key}.pub").stdout.strip()
    lab.ssh("worker", f"printf '%s\\n' {shlex.quote(public)} >> ~/.ssh/authorized_keys")
    try:
        route = lab.ssh("head", f"ip route get {FABRIC_ADDRESS['worker']}").stdout
        assert "dev enp1s0f1np1" in route, route
        result = lab.ssh(
            "head",
            f"ssh -i {key} -o BatchMode=yes -o StrictHostKeyChecking=accept-new "
            f"-o UserKnownHostsFile=/dev/null {LAB_USER}@{FABRIC_ADDRESS['worker']} "
            "'hostname; echo $SSH_CONNECTION'",
        )
        hostname, connection = result.stdout.split("\n")[:2]
        assert hostname == "worker"
        assert connection.split()[0] == FABRIC_ADDRESS["head"], "the session came over the fabric"
    finally:
        lab.ssh("worker", "sed -i '/ fabric-test$/d' ~/.ssh/authorized_keys")


def test_engine_image_pulls_by_digest_on_every_node(lab):
    for node in ("head", "worker"):
        lab.ssh(node, f"docker pull --quiet {lab.engine_image}")
        digests = lab.ssh(
            node, f"docker image inspect --format '{{{{json .RepoDigests}}}}' {lab.engine_image}"
        ).stdout
        assert lab.engine_image in digests


def test_huggingface_hub_downloads_the_synthetic_checkpoint(lab):
    """The real client, on the head, against the lab hub, with a token."""
    venv = "/tmp/lab-hf-venv"
    lab.ssh(
        "head",
        f"python3 -m venv {venv} && {venv}/bin/pip install --quiet --no-index "
        f"--trusted-host {WHEELS_HOST} --find-links {WHEELS_URL} huggingface_hub",
    )
    script = (
        "import os, sys; from huggingface_hub import snapshot_download; "
        f"print(snapshot_download({HUB_REPO!r}, local_dir='/tmp/lab-ckpt', token=os.environ['HF_TOKEN']))"
    )
    # The token goes through stdin: never on a command line.
    lab.ssh(
        "head",
        f"read -r HF_TOKEN; export HF_TOKEN HF_ENDPOINT={HUB_ENDPOINT} HF_HUB_DISABLE_XET=1 "
        f"HF_HUB_DISABLE_TELEMETRY=1; {venv}/bin/python -c {shlex.quote(script)}",
        input_text=lab.hub_token,
    )
    source = STATE / "hub" / HUB_REPO
    remote = dict(
        line.split(maxsplit=1)[::-1]
        for line in lab.ssh(
            "head",
            "cd /tmp/lab-ckpt && find . -type f -not -path './.cache/*' -print0 | sort -z | "
            "xargs -0 sha256sum",
        ).stdout.splitlines()
    )
    local = {
        f"./{p.relative_to(source)}": hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(source.rglob("*"))
        # Hidden files are the lab's own (the fill stamp): the hub serves none, as its docstring says.
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(source).parts)
    }
    assert remote == local
    assert any(name.endswith(".part00") for name in remote), "shards 5 and 6 come as parts"


def _prepare_model_dir(lab, node: str) -> None:
    """A rebuilt copy of the synthetic checkpoint and the plan copy, as the roles will leave them."""
    source = STATE / "hub" / HUB_REPO
    staging = STATE / "test-model"
    subprocess.run(["rm", "-rf", str(staging)], check=True)
    subprocess.run(["cp", "-a", str(source), str(staging)], check=True)
    for first_part in staging.glob("*.safetensors.part00"):
        shard = first_part.with_suffix("")
        parts = sorted(staging.glob(f"{shard.name}.part*"), key=lambda p: int(p.suffix[5:]))
        with shard.open("wb") as out:
            for part in parts:
                out.write(part.read_bytes())
                part.unlink()
    plans = STATE / "test-plans"
    plans.mkdir(exist_ok=True)
    plan = json.loads((staging / "exl3" / "plan" / PLAN_NAME).read_text())
    (plans / PLAN_NAME).write_text(json.dumps(rewrite_plan(plan)))
    lab.ssh(node, "mkdir -p ~/models/test ~/.dsv41-test/plans ~/.dsv41-test/cache")
    lab.copy_to(node, staging, f"/home/{LAB_USER}/models/test")
    lab.copy_to(node, plans, f"/home/{LAB_USER}/.dsv41-test/plans")


def _start_rank(lab, node: str, rank: int, api_key: str) -> None:
    env = reference_vllm_env("enp1s0f1np1", FABRIC_ADDRESS[node], "rocep1s0f1,roceP2p1s0f1")
    env_args = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    home = f"/home/{LAB_USER}"
    # The key reaches the engine through an env file read by docker, never through argv.
    lab.ssh(
        node,
        "umask 077; read -r key; printf 'VLLM_API_KEY=%s\\n' \"$key\" > ~/.dsv41-test/env",
        input_text=api_key,
    )
    # The reference's command line verbatim (its API on every interface, no gateway in front).
    reference = reference_vllm_argv(
        rank, 2, FABRIC_ADDRESS["head"], host="0.0.0.0", port=8000, media_domains=()
    )
    argv = " ".join(shlex.quote(a) for a in reference)
    lab.ssh(
        node,
        f"docker rm -f dsv41-r{rank} >/dev/null 2>&1; docker run -d --name dsv41-r{rank} "
        f"--network host --ipc host --shm-size 32g --env-file ~/.dsv41-test/env {env_args} "
        f"-v {home}/models/test:/model:ro -v {home}/.dsv41-test/plans:/plans:ro "
        f"-v {home}/.dsv41-test/cache:/cache:rw {lab.engine_image} {argv}",
    )


def _status(url: str, key: str | None) -> int:
    return http_status(url, {"Authorization": f"Bearer {key}"} if key else None)


def test_engine_started_by_hand_with_the_reference_command_line(lab):
    api_key = "lab-test-key-" + hashlib.sha256(b"lab").hexdigest()[:16]
    try:
        for node in ("worker", "head"):
            _prepare_model_dir(lab, node)
        _start_rank(lab, "worker", 1, api_key)
        _start_rank(lab, "head", 0, api_key)
        url = f"{API_URL}/v1/models"
        ready = wait_for(lambda: _status(url, api_key) == 200, timeout=60)
        logs = "\n".join(
            lab.ssh(n, f"docker logs --tail 20 dsv41-r{r} 2>&1", check=False).stdout
            for n, r in (("head", 0), ("worker", 1))
        )
        assert ready, logs
        assert _status(url, None) == 401
        assert _status(url, "wrong-key") == 401
        for node in ("head", "worker"):
            assert api_key not in lab.ssh(node, "ps -eo args").stdout, "the key is on no command line"
    finally:
        for node, rank in (("head", 0), ("worker", 1)):
            lab.ssh(node, f"docker rm -f dsv41-r{rank}; rm -rf ~/models/test ~/.dsv41-test", check=False)


def second_lab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*LABCTL, *args],
        env={**os.environ, "SPARKSERVE_LAB_INSTANCE": "1"},
        check=True,
        text=True,
        capture_output=True,
    )


def second_lab_status() -> tuple[list[str], list[str]]:
    """The second lab's containers and its services that run, as its `status` prints them."""
    lines = second_lab("status").stdout.splitlines()
    return [line.split("\t")[0] for line in lines if "\t" in line], [
        line.split(":")[0] for line in lines if line.endswith(": running")
    ]


def unnumbered_volume(name: str) -> str:
    """A volume as the lab made them before labs were numbered: its label, no number."""
    create = ["docker", "volume", "create", "--label", labctl.LABEL, name]
    subprocess.run(create, check=True, capture_output=True)
    return name


def volume_exists(name: str) -> bool:
    inspect = subprocess.run(["docker", "volume", "inspect", name], capture_output=True, check=False)
    return inspect.returncode == 0


def test_down_leaves_nothing_of_its_lab_and_the_lab_beside_it_running_and_a_cached_up_is_quick(lab):
    """A second lab (CI runs the real engine's beside the stand-in's) has its own nodes, networks and
    services; `down` of either leaves the other serving. What a lab made before labs were numbered
    is lab 0's: its `down` removes it, the second lab's leaves it."""
    ours = lab_resources()
    second = json.loads(second_lab("layout").stdout)
    second_lab("up")
    try:
        head = second["nodes"]["head"]
        assert head["container"] != "head" and head["mgmt"] != MGMT_ADDRESS["head"]
        assert subprocess.run(["docker", "exec", head["container"], "hostname"], capture_output=True,
                              text=True, check=True).stdout.strip() == "head"  # fmt: skip
        links = subprocess.run(["docker", "exec", head["container"], "ip", "-br", "-4", "addr"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert head["fabric"] in links and head["mgmt"] in links, links
        assert http_status(f"http://{second['registry']}/v2/") == 200

        older = unnumbered_volume("sparkserve-lab-unnumbered-0")
        labctl_run("down")
        assert lab_resources() == {"containers": [], "networks": [], "volumes": []}
        assert not volume_exists(older), "lab 0's down removes what labs made before they were numbered"
        containers, services = second_lab_status()
        assert sorted(containers) == sorted(n["container"] for n in second["nodes"].values())
        assert sorted(services) == ["hub", "prometheus", "registry", "wheels"]
        assert http_status(f"{second['wheels']}") == 200, "the second lab serves on"

        started = time.monotonic()
        labctl_run("up")
        assert time.monotonic() - started < 120, "with images cached the lab starts in under two minutes"
        kept = unnumbered_volume("sparkserve-lab-unnumbered-1")
    finally:
        second_lab("down")
    assert second_lab_status() == ([], [])
    assert volume_exists(kept), "the second lab's down leaves what labs made before they were numbered"
    subprocess.run(["docker", "volume", "rm", kept], check=True, capture_output=True)
    assert lab_resources() == ours
    assert lab.ssh("worker", "hostname").stdout.strip() == "worker"
    assert http_status(WHEELS_URL) == 200
