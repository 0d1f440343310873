"""The original scripts' settings (SSH_OPTS, API_KEY_FILE, WAIT=0, CAPS, the GID index, a re-run
that restarts), each reaching the deployment on the lab."""

from __future__ import annotations

import json
import shlex
import time

import pytest
from deployment_support import MODEL_DIR, STATE_DIR, api_key, model_dir, run_playbook, served_revision, site
from lab_support import API_URL, STATE, http_status, labctl, wait_for

RANKS = {"head": 0, "worker": 1}
MODELS_URL = f"{API_URL}/v1/models"


def inspect(lab, node: str) -> dict:
    return json.loads(lab.ssh(node, f"docker inspect dsv41-r{RANKS[node]}").stdout)[0]


def env_of(lab, node: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in inspect(lab, node)["Config"]["Env"])


def sysfs_fixture(gid_indexes: dict[str, int]) -> str:
    """A second STAND-IN sysfs tree on each node, whose RoCE v2 GID sits at the index given."""
    root = "/opt/sparkserve-lab/sysfs-gid-" + "-".join(str(gid_indexes[node]) for node in RANKS)
    for node, index in gid_indexes.items():
        labctl.node_exec(node, f"rm -rf {root}; " + shlex.join(labctl.sysfs_fixture_argv(root, index)))
    return root


def test_nodes_that_disagree_on_the_gid_index_stop_preflight_naming_rank_gid_index():
    root = sysfs_fixture({"head": 3, "worker": 5})
    run, _ = site("--tags", "preflight", "-e", f"fabric_sysfs_root={root}")
    assert run.returncode != 0
    assert "the RoCE v2 GID index differs between nodes" in run.stdout
    assert "rank_gid_index" in run.stdout and '"worker": 5' in run.stdout, run.stdout[-3000:]
    pinned, _ = site("--tags", "preflight", "-e", f"fabric_sysfs_root={root}", "-e", "rank_gid_index=3")
    assert pinned.returncode == 0, pinned.stdout[-3000:]


def test_a_wrong_ssh_option_for_the_copy_reaches_ssh(lab):
    # A worker whose copy is complete as sealed gets no copy: a touched file breaks the seal.
    lab.ssh("worker", f"touch {model_dir(lab)}/config.json")
    # Port 1 answers nothing: the copy fails, which proves the option reached ssh (SSH_OPTS).
    run, _ = site("--tags", "checkpoint", "-e", '{"checkpoint_copy_ssh_options": ["-o", "Port=1"]}')
    assert run.returncode != 0
    assert "port 1" in run.stdout.lower(), run.stdout[-3000:]
    ok, _ = site("--tags", "checkpoint", "-e", '{"checkpoint_copy_ssh_options": ["-o", "ConnectTimeout=9"]}')
    assert ok.returncode == 0, ok.stdout[-3000:]


def test_restart_yml_restarts_every_rank_worker_first_even_when_nothing_changed(lab):
    before = {node: inspect(lab, node)["State"]["StartedAt"] for node in RANKS}
    run, _ = run_playbook("playbooks/restart.yml", "--tags", "rank")
    assert run.returncode == 0, run.stdout[-3000:]
    after = {node: inspect(lab, node)["State"]["StartedAt"] for node in RANKS}
    assert all(after[node] != before[node] for node in RANKS), (before, after)
    assert after["worker"] < after["head"], "workers first, then the head"
    assert http_status(MODELS_URL, {"Authorization": f"Bearer {api_key(lab)}"}) == 200


def test_overrides_of_the_original_scripts_reach_the_ranks(lab):
    """API_KEY_FILE, CAPS, WAIT=0 and a GID index that every node discovers alike, in one restart."""
    key_file = "/home/spark/.config/dsv41/api_key"
    old_key = api_key(lab)
    root = sysfs_fixture({"head": 5, "worker": 5})
    overrides = {
        "fabric_sysfs_root": root,
        "deployment_api_key_file": "~/.config/dsv41/api_key",
        "rank_cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24],
        "rank_wait_for_api": False,
        # A boot that takes a while, so that not waiting shows.
        "rank_extra_env": {"STANDIN_BOOT_SECONDS": "25"},
    }
    try:
        started = time.monotonic()
        # Verbose: every task's result is printed, the stopped containers' (which hold the old key) too.
        run, seconds = site("-v", "--tags", "rank", "-e", json.dumps(overrides))
        assert run.returncode == 0, run.stdout[-3000:]
        assert "rank_wait_for_api is false" in run.stdout
        new_key = lab.ssh("head", f"cat {key_file}").stdout.strip()
        assert new_key and new_key != old_key
        assert new_key not in run.stdout and old_key not in run.stdout, "no key is printed"
        assert http_status(MODELS_URL, {"Authorization": f"Bearer {new_key}"}) != 200, (
            f"returned after {seconds:.0f} s without waiting for a boot of 25 s"
        )
        assert lab.ssh("head", f"stat -c '%a' {key_file}").stdout.strip() == "600"
        for node in RANKS:
            env = env_of(lab, node)
            assert env["NCCL_IB_GID_INDEX"] == "5", f"{node}: the index discovery found"
            args = inspect(lab, node)["Config"]["Cmd"]
            compilation = json.loads(args[args.index("--compilation-config") + 1])
            assert compilation["cudagraph_capture_sizes"] == [1, 2, 4, 8, 16, 24]
            assert args[args.index("--max-cudagraph-capture-size") + 1] == "24"
        assert wait_for(lambda: http_status(MODELS_URL, {"Authorization": f"Bearer {new_key}"}) == 200, 90)
        assert time.monotonic() - started >= 25
        assert http_status(MODELS_URL, {"Authorization": f"Bearer {old_key}"}) == 401
        # The clients take the key from the same file.
        smoke, _ = run_playbook(
            "playbooks/smoke.yml",
            "-e",
            json.dumps({"deployment_api_key_file": overrides["deployment_api_key_file"]}),
        )
        assert smoke.returncode == 0 and new_key not in smoke.stdout, smoke.stdout[-3000:]
    finally:
        restored, _ = site("--tags", "rank")
        lab.ssh("head", f"rm -f {key_file}")
    assert restored.returncode == 0, restored.stdout[-3000:]
    assert env_of(lab, "worker")["NCCL_IB_GID_INDEX"] == "3"
    assert api_key(lab) == old_key, "the key in the state directory was kept"
    assert http_status(MODELS_URL, {"Authorization": f"Bearer {old_key}"}) == 200


def hub_requests_since(offset: int) -> list[str]:
    with (STATE / "hub-access.log").open(encoding="utf-8") as log:
        log.seek(offset)
        return [json.loads(line)["path"] for line in log if line.strip()]


def test_a_model_directory_prepared_by_download_sh_is_adopted_without_downloading_parts(lab):
    # download.sh leaves the rebuilt, verified shards, no parts, hf's own .cache/huggingface
    # metadata and no record of ours, straight in the model directory: put the serving revision
    # back in that layout (the ranks keep it mounted: a rename keeps its inode) and remove our record.
    served, revision = model_dir(lab), served_revision(lab)
    listing = lab.ssh("head", f"ls -a {served}").stdout.split()
    assert not [name for name in listing if ".part" in name], listing
    inode = lab.ssh("head", f"stat -c %i {served}").stdout
    lab.ssh(
        "head",
        f"mv {served} {MODEL_DIR}.single && rm -r {MODEL_DIR} && mv {MODEL_DIR}.single {MODEL_DIR}"
        f" && rm -rf {MODEL_DIR}/.cache/sparkserve",
    )
    offset = (STATE / "hub-access.log").stat().st_size

    run, _ = site("--tags", "checkpoint")
    assert run.returncode == 0, run.stdout[-3000:]
    requested = hub_requests_since(offset)
    assert requested, "the download still asks the hub what the revision holds"
    assert not [path for path in requested if ".part" in path], requested
    assert "6 shards in place match the manifest and are recorded" in run.stdout, run.stdout[-3000:]
    assert "verification of the shards already in place" in run.stdout, "progress is shown"
    assert f"adopted {MODEL_DIR} as revision {revision}" in run.stdout, run.stdout[-3000:]
    assert lab.ssh("head", f"stat -c %i {served}").stdout == inode, "renamed whole, as the ranks mount it"
    # Links keep the single directory's view for containers that mount it by path.
    assert (
        lab.ssh("head", f"readlink {MODEL_DIR}/config.json").stdout.strip()
        == f"revisions/{revision}/config.json"
    )
    record = json.loads(lab.ssh("head", f"cat {served}/.cache/sparkserve/verified.json").stdout)
    assert len([name for name in record["files"] if name.endswith(".safetensors")]) == 6

    again, _ = site("--tags", "checkpoint")
    assert again.returncode == 0, again.stdout[-3000:]
    assert again.stats["head"]["changed"] == 0, again.stdout[-3000:]
    assert "shards in place match the manifest" not in again.stdout, "the record is trusted: nothing read"
    # Sealed once verified: the re-run starts no download and no verification.
    resolved = again.results_of(
        "Resolve the checkpoint revision and adopt a single-directory checkpoint", "head"
    )
    assert [result["complete"] for result in resolved] == [True], resolved
    assert not again.results_of("Start rebuilding and verifying the shards", "head")


@pytest.fixture(autouse=True, scope="module")
def _state_dir_is_there(lab):
    assert lab.ssh("head", f"test -s {STATE_DIR}/api_key", check=False).returncode == 0
