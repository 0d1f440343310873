"""What site.yml leaves on the lab, held against the reference configuration."""

from __future__ import annotations

import json
import re
import shlex
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from deployment_support import (
    MODEL_DIR,
    STATE_DIR,
    api_key,
    changed_nothing,
    model_dir,
    run_playbook,
    site,
    user_environment,
)
from lab_support import API_URL, FABRIC_ADDRESS, MGMT_ADDRESS, http_status
from reference_config import reference_vllm_argv, reference_vllm_env

RANKS = {"head": 0, "worker": 1}
HCAS = "rocep1s0f1,roceP2p1s0f1"
IMAGE_ENV = {"PATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "container"}


def inspect(lab, node: str) -> dict:
    out = lab.ssh(node, f"docker inspect dsv41-r{RANKS[node]}").stdout
    return json.loads(out)[0]


@pytest.mark.parametrize("node", ["head", "worker"])
def test_rank_arguments_are_the_reference_after_the_images_own_entrypoint(lab, node):
    container = inspect(lab, node)
    image = json.loads(lab.ssh(node, f"docker image inspect {container['Image']}").stdout)[0]
    # The real image starts the server itself: the rank passes arguments from /model on, nothing else.
    assert container["Config"]["Cmd"] == reference_vllm_argv(RANKS[node], 2, FABRIC_ADDRESS["head"])
    assert image["Config"]["Entrypoint"], "the engine image must start the server by its ENTRYPOINT"
    assert container["Config"]["Entrypoint"] == image["Config"]["Entrypoint"], "no entrypoint override"
    # What Docker really started: the image's entrypoint, then the reference arguments.
    started = [container["Path"], *container["Args"]]
    assert started == [*image["Config"]["Entrypoint"], *container["Config"]["Cmd"]]


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
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-size": "100m", "max-file": "5"}}, (
        "the rank's log is bounded"
    )
    assert host["RestartPolicy"]["Name"] == "no", (
        "a rank never restarts alone: the supervisor restarts the group"
    )
    assert sorted(host["Binds"]) == sorted(
        [f"{model_dir(lab)}:/model:ro", f"{STATE_DIR}/plans:/plans:ro", f"{STATE_DIR}/cache:/cache:rw"]
    )


def test_plan_copy_points_at_the_mounted_banks(lab):
    for node in RANKS:
        plan = json.loads(lab.ssh(node, f"cat {STATE_DIR}/plans/J268-ho-v31-K5n.json").stdout)
        assert plan["qdir"] == "/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s"


def test_checkpoint_is_rebuilt_and_verified_on_every_node(lab):
    for node in RANKS:
        check = lab.ssh(node, f"cd {model_dir(lab)} && sha256sum -c sha256-manifest.txt && ls")
        assert check.stdout.count(": OK") == 6
        assert ".part" not in check.stdout, "parts are deleted once their shard is verified"


# vLLM answers these without its key (measured on 0.32); the gateway asks for it on all of them.
OPEN_ON_VLLM = ["/invocations", "/tokenize", "/detokenize", "/metrics", "/version", "/docs", "/v1/models"]


def test_api_answers_with_the_key_only(lab):
    base = API_URL
    key = {"Authorization": f"Bearer {api_key(lab)}"}
    assert http_status(f"{base}/health") == 200, "/health answers anyone"
    for path in OPEN_ON_VLLM:
        assert http_status(f"{base}{path}") == 401, path
        assert http_status(f"{base}{path}", {"Authorization": "Bearer wrong"}) == 401, path
    assert http_status(f"{base}/v1/models", key) == 200
    assert http_status(f"{base}/metrics", key) == 200


def test_the_engine_listens_on_the_heads_loopback_only_and_metrics_answer_the_named_source(lab):
    listening = lab.ssh("head", "ss -Htln").stdout
    assert re.search(r"\s127\.0\.0\.1:8001\s", listening), listening
    assert not re.search(r"\s(0\.0\.0\.0|\*|\[::\]):8001\s", listening), listening
    # From the worker, over the fabric: the engine's port is closed, the gateway's /metrics open to
    # the source the lab inventory names (rank_api_metrics_sources), its other paths not.
    head = FABRIC_ADDRESS["head"]
    probe = "curl -s -o /dev/null -w '%{http_code}' --noproxy '*' "
    assert lab.ssh("worker", f"{probe}http://{head}:8001/health", check=False).stdout == "000"
    assert lab.ssh("worker", f"{probe}http://{head}:8000/metrics").stdout == "200"
    assert lab.ssh("worker", f"{probe}http://{head}:8000/tokenize").stdout == "401"
    assert http_status(f"{API_URL}/metrics") == 401, "the controller is not named"


def test_tls_serves_the_users_certificate_and_nothing_but_health_without_the_key(lab, tmp_path):
    head = MGMT_ADDRESS["head"]
    certificate, private_key = tmp_path / "api.crt", tmp_path / "api.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=spark-head",
         "-addext", f"subjectAltName=IP:{head}", "-keyout", str(private_key), "-out", str(certificate)],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = {"rank_api_tls_certificate_file": str(certificate), "rank_api_tls_key_file": str(private_key)}
    run, _ = site("--tags", "rank", "-e", json.dumps(tls))
    try:
        assert run.returncode == 0, run.stdout[-3000:]
        secret = private_key.read_text().splitlines()[1]
        assert secret not in run.stdout + run.stderr, "the private key is never printed"
        trusted = ssl.create_default_context(cafile=str(certificate))
        base = f"https://{head}:8000"
        key = {"Authorization": f"Bearer {api_key(lab)}"}
        assert https_status(f"{base}/health", trusted) == 200
        assert https_status(f"{base}/tokenize", trusted) == 401
        assert https_status(f"{base}/v1/models", trusted, key) == 200
        assert http_status(f"http://{head}:8000/health") == 0, "no plain HTTP beside TLS"
        pem = lab.ssh("head", "sudo stat -c '%a %U' /etc/sparkserve-dsv41/gateway.pem").stdout.strip()
        assert pem == "600 root"
        # The clients follow (https://: plain HTTP is refused above), trusting the certificate as
        # the controller's Python does.
        trust = user_environment(SSL_CERT_FILE=str(certificate))
        smoke, _ = run_playbook("playbooks/smoke.yml", "-e", json.dumps(tls), env=trust)
        assert smoke.returncode == 0, smoke.stdout[-3000:]
    finally:
        back, _ = site("--tags", "rank")
    assert back.returncode == 0, back.stdout[-3000:]
    assert http_status(f"http://{head}:8000/health") == 200


def https_status(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None) -> int:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def test_only_the_fabric_reaches_the_rendezvous_which_listens_on_every_interface(lab):
    """torch's TCPStore listens on every interface of the head (as the stand-in does, measured on
    vLLM 0.32); the rendezvous guard drops what does not come over the fabric or loopback."""
    assert re.search(r"\s(\*|0\.0\.0\.0):29655\s", lab.ssh("head", "ss -Htln").stdout)
    # The ranks' rendezvous and the fabric test's (rank_fabric_check_port) alike.
    assert "tcp dport { 29655, 29656 }" in lab.ssh("head", "sudo nft list table inet sparkserve_dsv41").stdout
    with pytest.raises(TimeoutError):  # dropped (refused would mean that nothing listened)
        socket.create_connection((MGMT_ADDRESS["head"], 29655), timeout=3).close()
    assert socket.create_connection((MGMT_ADDRESS["head"], 8000), timeout=3), "the API's port is open"


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
    assert changed_nothing(run), run.stdout[-3000:]
    assert api_key(lab) not in run.stdout + run.stderr
    # No checkpoint data re-read on any node: each node's revision is complete as sealed, so no
    # download, verification or copy job even starts.
    complete = [
        result["complete"]
        for task, host in (
            ("Resolve the checkpoint revision and adopt a single-directory checkpoint", "head"),
            ("Give this node the head's revision directory", "worker"),
        )
        for result in run.results_of(task, host)
    ]
    assert complete == [True, True], complete
    jobs = [
        (job, host)
        for host in RANKS
        for job in ("Start the download", "Start rebuilding and verifying the shards")
    ] + [("Start copying the checkpoint over the fabric to worker", "head")]
    assert not [(job, host) for job, host in jobs if run.results_of(job, host)], "no job started"
    # The services were read enabled and running with their files unchanged, and the image found on
    # every node: no systemd run, no pull.
    services = [("Enable and start the memory guard", host) for host in RANKS] + [
        ("Run the supervisor", "head")
    ]
    assert not [(task, host) for task, host in services if run.results_of(task, host)], "no systemd run"
    assert not [host for host in RANKS if run.results_of("Pull the serving image by digest", host)], "no pull"
    # Each rank was found running with the digest of its settings: no Docker module dry run.
    dry_run = "Run this node's rank container (dry run, to see what would change)"
    assert not [host for host in RANKS if run.results_of(dry_run, host)], "no dry run"


def test_services_stopped_and_disabled_by_hand_are_enabled_and_started_by_a_re_run(lab):
    """What the files' task reads of the units decides whether the systemd task runs: a unit that is
    not as asked while its files are unchanged must still be put right."""
    units = {"head": ["dsv41-memguard", "dsv41-supervisor"], "worker": ["dsv41-memguard"]}
    for node, names in units.items():
        lab.ssh(node, f"sudo systemctl disable --now {' '.join(names)}")
    run, _ = site("--tags", "memguard,supervisor")
    assert run.returncode == 0, run.stdout[-3000:]
    for node, names in units.items():
        for name in names:
            state = lab.ssh(node, f"systemctl is-enabled {name}; systemctl is-active {name}", check=False)
            assert state.stdout.split() == ["enabled", "active"], f"{name} on {node}: {state.stdout}"
    assert [result["changed"] for result in run.results_of("Run the supervisor", "head")] == [True]
    for node in units:
        assert [
            result["changed"] for result in run.results_of("Enable and start the memory guard", node)
        ] == [True]


def test_a_revision_touched_after_its_seal_is_fetched_and_verified_again_then_sealed(lab):
    lab.ssh("worker", f"touch {model_dir(lab)}/config.json")
    run, _ = site("--tags", "checkpoint")
    assert run.returncode == 0, run.stdout[-3000:]
    given = run.results_of("Give this node the head's revision directory", "worker")
    assert [result["complete"] for result in given] == [False], given
    assert run.results_of("Start copying the checkpoint over the fabric to worker", "head")
    assert run.results_of("Start rebuilding and verifying the shards", "worker")
    assert not run.results_of("Start rebuilding and verifying the shards", "head"), "the head's seal holds"
    # (rsync gave config.json the head's time back, so the seal may already hold again.)
    assert run.results_of("Seal the copy, which re-runs trust while its files stay as they are", "worker")

    again, _ = site("--tags", "checkpoint")
    assert again.returncode == 0 and changed_nothing(again), again.stdout[-3000:]
    given = again.results_of("Give this node the head's revision directory", "worker")
    assert [result["complete"] for result in given] == [True], given


def test_check_mode_on_a_converged_lab_changes_nothing():
    run, _ = site("--check")
    assert run.returncode == 0, run.stdout[-3000:]
    assert changed_nothing(run), run.stdout[-3000:]


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
        restored, _ = site("--tags", "rank")
        assert restored.returncode == 0, restored.stdout[-3000:]


def test_a_rank_container_created_anew_by_hand_is_compared_in_full_and_the_group_restarts(lab):
    """Only a container running with the digest of its settings skips the dry run: one created by
    hand under the rank's name (other settings, no digest) is compared setting by setting, and the
    group starts anew with the reference arguments."""
    image = inspect(lab, "worker")["Config"]["Image"]
    before = started_at(lab, "head")
    # The supervisor would restart the group on its own (a rank restarted alone): it is stopped
    # first, and the run's supervisor role starts it again.
    lab.ssh("head", "sudo systemctl stop dsv41-supervisor")
    by_hand = f"docker run -d --name dsv41-r1 --entrypoint sleep {image} infinity"
    lab.ssh("worker", f"docker rm -f dsv41-r1 && {by_hand}")
    run, _ = site("--tags", "rank,supervisor")
    assert run.returncode == 0, run.stdout[-3000:]
    assert lab.ssh("head", "systemctl is-active dsv41-supervisor", check=False).stdout.strip() == "active"
    dry_run = "Run this node's rank container (dry run, to see what would change)"
    assert [result["changed"] for result in run.results_of(dry_run, "worker")] == [True]
    assert not run.results_of(dry_run, "head"), "the head's rank runs as specified"
    worker = inspect(lab, "worker")
    assert worker["Config"]["Cmd"][0] == "/model" and worker["State"]["Running"]
    assert "sparkserve.dsv41.spec-sha256" in worker["Config"]["Labels"]
    assert started_at(lab, "head") != before, "the head's rank starts anew with the worker's"


def test_a_rank_that_dies_at_start_up_fails_the_run_fast_with_both_logs_and_gives_the_lock_back(lab):
    run, seconds = site("--tags", "rank", "-e", '{"rank_extra_args": ["--no-such-flag"]}')
    try:
        assert run.returncode != 0
        assert seconds < 90, f"failed after {seconds:.0f} s"
        assert "A rank failed to start" in run.stdout
        assert "unrecognized arguments: --no-such-flag" in run.stdout, "the head's log lines are shown"
        assert "===== worker (dsv41-r1)" in run.stdout, "the worker's log lines are shown"
        lock = lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False)
        assert lock.returncode != 0, "the failed run gave the lock back: the supervisor is not paused"
    finally:
        restored, _ = site("--tags", "rank")
        assert restored.returncode == 0, restored.stdout[-3000:]


def assert_stopped(lab) -> None:
    for node, rank in RANKS.items():
        running = lab.ssh(node, f"docker inspect -f '{{{{.State.Running}}}}' dsv41-r{rank}").stdout.strip()
        assert running == "false", f"dsv41-r{rank} on {node}"
        assert lab.ssh(node, "systemctl is-active dsv41-memguard", check=False).stdout.strip() != "active"


def assert_serving(lab) -> None:
    url = f"{API_URL}/v1/models"
    assert http_status(url, {"Authorization": f"Bearer {api_key(lab)}"}) == 200
    for node in RANKS:
        assert lab.ssh(node, "systemctl is-active dsv41-memguard").stdout.strip() == "active"


def copy_key_of_the_head(lab) -> str:
    """The head's checkpoint copy key (type and key, without its comment)."""
    return " ".join(lab.ssh("head", f"cat {STATE_DIR}/ssh/id_ed25519.pub").stdout.split()[:2])


def authorized_on_the_worker(lab) -> str:
    return lab.ssh("worker", "cat ~/.ssh/authorized_keys").stdout


def test_the_copy_key_can_only_write_into_the_workers_model_directory(lab):
    key = copy_key_of_the_head(lab)
    line = next(line for line in authorized_on_the_worker(lab).splitlines() if key in line)
    assert line.startswith(f'restrict,command="/usr/bin/rrsync -wo -no-lock {MODEL_DIR}" '), line
    ssh = (
        f"ssh -i {STATE_DIR}/ssh/id_ed25519 -o IdentitiesOnly=yes -o BatchMode=yes"
        f" -o UserKnownHostsFile={STATE_DIR}/ssh/known_hosts"
    )
    worker = f"spark@{FABRIC_ADDRESS['worker']}"
    shell = lab.ssh("head", f"{ssh} {worker} id", check=False)
    assert shell.returncode != 0 and "uid=" not in shell.stdout, shell
    assert "rrsync error" in shell.stderr, shell.stderr
    rsync = f"rsync -a -e {shlex.quote(ssh)}"
    outside = lab.ssh("head", f"{rsync} {STATE_DIR}/api_key {worker}:../escaped", check=False)
    assert outside.returncode != 0 and "do not use .." in outside.stderr, outside
    read = lab.ssh("head", f"{rsync} {worker}:/ /tmp/dsv41-read/", check=False)
    assert read.returncode != 0 and "write-only" in read.stderr, read


def test_teardown_by_fqcn_keeps_state_and_model_purges_state_only_when_asked_and_site_brings_all_back(
    lab, fqcn
):
    """The playbooks from the installed collection: teardown.yml keeps everything (but the head's copy
    key), a second one with deployment_purge_state removes the state (a new key follows), and
    site.yml brings the pair back."""
    key, model = api_key(lab), model_dir(lab)
    copy_key = copy_key_of_the_head(lab)
    assert copy_key in authorized_on_the_worker(lab)
    run, _ = fqcn("teardown")
    try:
        assert run.returncode == 0, run.stdout[-3000:]
        assert_stopped(lab)
        for node in RANKS:
            kept = lab.ssh(node, f"test -d {STATE_DIR} && test -s {model}/config.json", check=False)
            assert kept.returncode == 0, f"state and model kept on {node}"
        assert api_key(lab) == key, "the key survives a teardown"
        assert copy_key not in authorized_on_the_worker(lab), "the head's copy key is taken back"
        purged, _ = fqcn("teardown", "-e", "deployment_purge_state=true")
        assert purged.returncode == 0, purged.stdout[-3000:]
        for node in RANKS:
            assert lab.ssh(node, f"test -e {STATE_DIR}", check=False).returncode != 0, f"state left on {node}"
            kept = lab.ssh(node, f"test -s {model}/config.json", check=False)
            assert kept.returncode == 0, f"model kept on {node}"
    finally:
        restored, _ = fqcn("site")
    assert restored.returncode == 0, restored.stdout[-3000:]
    assert_serving(lab)
    assert api_key(lab) != key, "a purged state means a new key"
    status, _ = fqcn("status")
    assert status.returncode == 0 and "healthy" in status.stdout, status.stdout[-3000:]
    logs, _ = fqcn("logs", "-e", "rank_logs_rank=1")
    assert logs.returncode == 0 and "===== worker (dsv41-r1)" in logs.stdout, logs.stdout[-3000:]


def test_a_teardown_without_the_head_is_refused_before_anything_stops(lab):
    """The head's supervisor would start again whatever a teardown of the workers alone stopped."""
    run, _ = run_playbook("playbooks/teardown.yml", "--limit", "worker")
    assert run.returncode != 0
    assert "teardown.yml stops the whole deployment and needs the head (head)" in " ".join(run.stdout.split())
    assert changed_nothing(run), run.stdout[-3000:]
    assert_serving(lab)
    assert lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False).returncode != 0


def test_a_teardown_of_the_ranks_alone_stops_the_supervisor_so_they_stay_stopped(lab):
    """--tags rank: the supervisor, which would start them again once the lock is back, stops too."""
    run, _ = run_playbook("playbooks/teardown.yml", "--tags", "rank")
    try:
        assert run.returncode == 0, run.stdout[-3000:]
        supervisor = lab.ssh("head", "systemctl is-active dsv41-supervisor", check=False).stdout.strip()
        assert supervisor != "active"
        time.sleep(10)  # two of the supervisor's ticks, had it been left running
        for node, rank in RANKS.items():
            running = lab.ssh(
                node, f"docker inspect -f '{{{{.State.Running}}}}' dsv41-r{rank}"
            ).stdout.strip()
            assert running == "false", f"dsv41-r{rank} on {node} started again"
    finally:
        restored, _ = site()
    assert restored.returncode == 0, restored.stdout[-3000:]
    assert_serving(lab)


def test_a_purge_of_a_directory_holding_another_model_is_refused_before_anything_stops(lab):
    """deployment_model_dir set to ~/models, which holds another model beside the checkpoint."""
    models = MODEL_DIR.rsplit("/", 1)[0]
    lab.ssh("head", f"mkdir -p {models}/other-model && echo weights > {models}/other-model/model.safetensors")
    try:
        before = lab.ssh("head", f"find {models} | sort").stdout
        purge = ["-e", "deployment_purge_model=true", "-e", f"deployment_model_dir={models}"]
        run, _ = run_playbook("playbooks/teardown.yml", *purge)
        assert run.returncode != 0
        assert f"refusing to remove the model directory {models}: it holds" in run.stdout, run.stdout[-3000:]
        assert "other-model" in run.stdout and "Nothing was deleted" in run.stdout
        assert lab.ssh("head", f"find {models} | sort").stdout == before, "nothing deleted"
        assert changed_nothing(run), run.stdout[-3000:]
        assert_serving(lab)  # nothing was stopped either
        lock = lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False)
        assert lock.returncode != 0, "no lock left"
    finally:
        lab.ssh("head", f"rm -rf {models}/other-model")


def test_links_planted_in_the_state_directory_never_make_root_write_their_target(lab):
    """The deployment user owns the state directory; the supervisor and the guard run as root. The
    user plants links at their logs and at the temporary names they once used, then the services
    start (each logs a line) and the supervisor writes its state: the target stays as it was."""
    canary = "/etc/dsv41-canary"
    planted = ["supervisor.log", "memguard.log", ".supervisor-state.json.tmp", ".memguard-last-kill.tmp"]
    lab.ssh("head", f"echo canary | sudo tee {canary} >/dev/null")
    plant = "; ".join(
        f"mv -f {STATE_DIR}/{name} {STATE_DIR}/{name}.kept 2>/dev/null; ln -sfn {canary} {STATE_DIR}/{name}"
        for name in planted
    )
    restart = "sudo systemctl restart dsv41-supervisor dsv41-memguard"
    try:
        lab.ssh("head", f"{plant}; {restart}")  # as the deployment user: no sudo for the links
        time.sleep(12)  # two supervisor ticks, each writing its state file
        assert lab.ssh("head", f"cat {canary}").stdout == "canary\n"
        active = lab.ssh("head", "systemctl is-active dsv41-supervisor dsv41-memguard").stdout.split()
        assert active == ["active", "active"], "a link costs a log line, never the service"
    finally:
        restore = "; ".join(
            f"rm -f {STATE_DIR}/{name}; mv -f {STATE_DIR}/{name}.kept {STATE_DIR}/{name} 2>/dev/null"
            for name in planted
        )
        lab.ssh("head", f"{restore}; sudo rm -f {canary}; {restart}", check=False)


def logged_lines(output: str, header: str) -> list[str]:
    """The log lines logs.yml printed between its header and its live-tail hint."""
    block = output[output.index(header) :]
    block = block[: block.index("===== live tail")]
    return [line for line in block.splitlines()[1:] if re.search(r"\d{4}-\d\d-\d\dT", line)]


def test_logs_show_the_last_lines_of_the_rank_asked_for():
    run, _ = run_playbook("playbooks/logs.yml", "-e", "rank_logs_rank=1", "-e", "rank_logs_lines=3")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "dsv41-r0" not in run.stdout.replace("dsv41-r0 ", ""), "only the worker's rank is shown"
    lines = logged_lines(run.stdout, "===== worker (dsv41-r1), last 3 lines")
    assert 1 <= len(lines) <= 3, run.stdout


def test_logs_follow_for_the_time_asked():
    run, seconds = run_playbook("playbooks/logs.yml", "-e", "rank_logs_follow_seconds=4")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "===== head (dsv41-r0), last 40 lines, followed for 4 s" in run.stdout
    assert seconds >= 4


def test_logs_name_the_variable_when_the_rank_does_not_exist():
    run, _ = run_playbook("playbooks/logs.yml", "-e", "rank_logs_rank=5")
    assert run.returncode != 0
    assert "rank_logs_rank must be one of 0..1" in run.stdout


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("deployment_api_port=70000", "deployment_api_port"),
        ("deployment_image=registry.example/dsv41:latest", "deployment_image"),
        ("rank_kv_cache_memory_bytes=-1", "rank_kv_cache_memory_bytes"),
        ("rank_master_port=0", "rank_master_port"),
        ("rank_poll_seconds=0", "rank_poll_seconds 0 (>= 1)"),
        ("deployment_worker_group=nobody", "deployment_worker_group"),
        # A renamed variable would be ignored: the run names its new name instead.
        (
            "supervisor_install_dir=/opt/sparkserve",
            "supervisor_install_dir are deployment_install_dir, supervisor_config_dir and "
            "rank_gateway_config_dir are deployment_config_dir (set: supervisor_install_dir)",
        ),
        (
            '{"preflight_required_commands": ["rsync", "dsv41-no-such-tool"]}',
            "command not found: dsv41-no-such-tool",
        ),
        # The lab's engine has runc only; a Spark's has the NVIDIA Container Toolkit's runtime.
        (
            "preflight_gpu_runtime=nvidia",
            "the Docker engine has no nvidia runtime (it has io.containerd.runc.v2",
        ),
    ],
)
def test_bad_variables_fail_in_preflight_naming_the_variable(lab, override, named):
    run, _ = site("-e", override)
    assert run.returncode != 0
    assert named in run.stdout
    assert "TASK [sparkserve.dsv41.memguard" not in run.stdout, "nothing after preflight ran"
    assert changed_nothing(run), run.stdout[-3000:]
    # A lock left behind would pause the supervisor until the next run.
    assert lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False).returncode != 0, (
        "no lock left"
    )


def test_a_run_that_leaves_a_rank_node_out_stops_in_preflight_naming_it(lab):
    run, _ = site("--limit", "worker")
    assert run.returncode != 0
    assert "this run leaves out head (--limit)" in run.stdout, run.stdout[-3000:]
    assert "TASK [sparkserve.dsv41.memguard" not in run.stdout, "nothing after preflight ran"
    assert lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False).returncode != 0, (
        "no lock left"
    )
    # The roles that work node by node still run on the nodes given.
    per_node, _ = site("--limit", "worker", "--tags", "memguard,image,supervisor")
    assert per_node.returncode == 0, per_node.stdout[-3000:]
    assert changed_nothing(per_node), per_node.stdout[-3000:]
    # Except the head's supervisor, which calls every worker's rank control.
    head_alone, _ = site("--limit", "head", "--tags", "supervisor")
    assert head_alone.returncode != 0
    shown = " ".join(head_alone.stdout.split())
    assert (
        "The supervisor on the head needs every node of the rank group in the run, and worker is left out"
        in shown
    ), head_alone.stdout[-3000:]


def test_an_mtu_that_differs_between_the_nodes_fails_preflight_on_the_node_whose_frames_are_lost(lab):
    """A real fault: the worker's fabric interface back at 1500 while the head's is 9000. The head's
    full unfragmented frame never arrives; the worker's smaller one does, so only the head fails."""
    lab.ssh("worker", "sudo ip link set enp1s0f1np1 mtu 1500")
    try:
        run, _ = site("--tags", "preflight")
    finally:
        lab.ssh("worker", "sudo ip link set enp1s0f1np1 mtu 9000")
    assert run.returncode != 0
    lost = (
        f"no unfragmented ping over the fabric to worker ({FABRIC_ADDRESS['worker']}): 1 packets transmitted"
    )
    assert lost in " ".join(run.stdout.split()), run.stdout[-3000:]
    differs = "the fabric MTU differs between the nodes: head enp1s0f1np1 9000, worker enp1s0f1np1 1500"
    assert differs in " ".join(run.stdout.split()), run.stdout[-3000:]
    assert "fatal: [worker]" not in run.stdout, "the worker's ping to the head gets its answer"
    assert "TASK [sparkserve.dsv41.memguard" not in run.stdout, "nothing after preflight ran"


def test_status_shows_every_node_in_one_table():
    run, _ = run_playbook("playbooks/status.yml")
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
