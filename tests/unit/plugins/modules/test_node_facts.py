"""Tests of the node_facts module, run in-process through ``run_module``."""

from __future__ import annotations

import importlib.metadata
import os
import pwd
import sys

import pytest
import yaml
from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.modules import node_facts
from dir_snapshot import snapshot

DOCKER_BIN = "/usr/bin/docker"
PING_BIN = "/usr/bin/ping"
LAB_INFO = '20.10.24+dfsg1|{"io.containerd.runc.v2":{"path":"runc"},"runc":{"path":"runc"}}\n'
TEMPLATE_ERROR = (
    'template: :1:2: executing "" at <.ServerVersion>: reflect: indirection through nil pointer\n'
)
# `docker version --format '{{.Server.Version}}'` as a user outside the docker group (lab node).
PERMISSION_DENIED = (
    "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
    'Get "http://%2Fvar%2Frun%2Fdocker.sock/v1.24/version": dial unix /var/run/docker.sock: connect: '
    "permission denied\n"
)


@pytest.fixture
def docker_cli(monkeypatch):
    """A docker CLI that answers as given; records the commands it ran."""
    state = {"answers": {}, "ran": [], "installed": True, "images": set(), "containers": {}, "pings": {}}

    def run_command(self, args, **kwargs):
        state["ran"].append(args)
        if args[1:3] == ["image", "inspect"]:
            # `docker image inspect --format '{{.Id}}' REF` as the lab's docker CLI answers it.
            if args[-1] in state["images"]:
                return 0, "sha256:2b70d76d02cceb10f62ebc37c3788024256d7cf629ba3284c74897b5c1da5ff8\n", ""
            return 1, "\n", f"Error: No such image: {args[-1]}\n"
        if args[1:3] == ["container", "inspect"]:
            # The lab's docker CLI: a line per container it has, an error per name it has not.
            names, known = args[5:], state["containers"]
            lines = "".join(f"/{name}|{known[name]}\n" for name in names if name in known)
            errors = "".join(f"Error: No such container: {name}\n" for name in names if name not in known)
            return (1 if errors else 0), lines, errors
        if args[0] == PING_BIN:
            return state["pings"][args[-1]]
        return state["answers"][args[1]]

    def get_bin_path(self, name, *args, **kwargs):
        return {"docker": DOCKER_BIN, "ping": PING_BIN}[name] if state["installed"] else None

    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(AnsibleModule, "get_bin_path", get_bin_path)
    return state


def test_the_user_is_returned_as_facts_and_nothing_else_is_asked(run_module, docker_cli, tmp_path):
    before = snapshot(tmp_path)
    result = run_module(node_facts, {}, check_mode=True)
    assert not result.failed, result
    entry = pwd.getpwuid(os.geteuid())
    assert result["ansible_facts"] == {
        "user_id": entry.pw_name,
        "user_uid": entry.pw_uid,
        "user_gid": entry.pw_gid,
        "user_dir": entry.pw_dir,
    }
    assert (result["changed"], result["missing_commands"], result["missing_python_modules"]) == (
        False,
        [],
        [],
    )
    assert "docker" not in result
    assert docker_cli["ran"] == []
    assert snapshot(tmp_path) == before
    assert set(yaml.safe_load(node_facts.RETURN)) - {"docker", "host_stack"} == set(result) - {
        "changed",
        "invocation",
    }


def test_the_host_stack_is_read_from_the_roots_given_with_its_problems(run_module, tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "osrelease").write_text("7.0.0-1019-nvidia\n")
    (proc / "meminfo").write_text("MemAvailable:   92000000 kB\nCmaTotal:  0 kB\nCmaFree:  940604 kB\n")
    known_bad = [{"item": "kernel", "version": "7.0.0-1019-nvidia", "why": "kexec handover"}]
    args = {
        "host_stack": {"proc_root": str(proc), "sysfs_root": str(tmp_path / "sys"), "known_bad": known_bad}
    }
    before = snapshot(tmp_path)
    stack = run_module(node_facts, args, check_mode=True)["host_stack"]
    assert snapshot(tmp_path) == before
    assert (stack["kernel"], stack["driver"], stack["nic_firmware"], stack["cma_free_kb"]) == (
        "7.0.0-1019-nvidia",
        None,
        {},
        940604,
    )
    assert (
        stack["problems"][0]
        == "kernel 7.0.0-1019-nvidia is known to be bad: kexec handover (preflight_known_bad_versions)"
    )
    assert "CmaTotal 0 kB with CmaFree 940604 kB" in stack["problems"][1]


def test_missing_commands_and_python_modules_are_named(run_module, docker_cli):
    result = run_module(
        node_facts,
        {"commands": ["sh", "dsv41-no-such-tool"], "python_modules": ["json", "dsv41_no_such_module"]},
    )
    assert result["missing_commands"] == ["dsv41-no-such-tool"]
    assert result["missing_python_modules"] == ["dsv41_no_such_module"]


def test_an_engine_that_answers_gives_its_version_and_runtimes_in_one_call(run_module, docker_cli):
    docker_cli["answers"]["info"] = (0, LAB_INFO, "")
    result = run_module(node_facts, {"docker": True})
    assert result["docker"] == {
        "version": "20.10.24+dfsg1",
        "runtimes": ["io.containerd.runc.v2", "runc"],
        "error": "",
    }
    assert docker_cli["ran"] == [[DOCKER_BIN, "info", "--format", "{{.ServerVersion}}|{{json .Runtimes}}"]]


@pytest.mark.parametrize(
    ("version_answer", "error"),
    [
        pytest.param((1, "", PERMISSION_DENIED), PERMISSION_DENIED.strip(), id="version-says-why"),
        pytest.param((1, "", ""), TEMPLATE_ERROR.strip(), id="version-silent"),
    ],
)
def test_an_engine_out_of_reach_is_reported_with_the_reason_not_failed(
    run_module, docker_cli, version_answer, error
):
    docker_cli["answers"]["info"] = (1, "\n", TEMPLATE_ERROR)
    docker_cli["answers"]["version"] = version_answer
    result = run_module(node_facts, {"docker": True})
    assert not result.failed, result
    assert result["docker"] == {"version": "", "runtimes": [], "error": error}


def test_a_node_without_the_docker_cli_is_reported_not_failed(run_module, docker_cli):
    docker_cli["installed"] = False
    result = run_module(node_facts, {"docker": True})
    assert not result.failed, result
    assert result["docker"] == {"version": "", "runtimes": [], "error": "docker: command not found"}
    assert docker_cli["ran"] == []


LAB_IMAGE = (
    "198.18.0.1:5000/sparkserve-lab/vllm-standin@sha256:"
    "2b70d76d02cceb10f62ebc37c3788024256d7cf629ba3284c74897b5c1da5ff8"
)
OTHER_IMAGE = "198.18.0.1:5000/sparkserve-lab/vllm-standin@sha256:" + "0" * 64


def test_the_images_the_engine_has_are_named_one_inspect_each_without_asking_for_info(run_module, docker_cli):
    docker_cli["images"] = {LAB_IMAGE}
    result = run_module(node_facts, {"images": [OTHER_IMAGE, LAB_IMAGE]}, check_mode=True)
    assert not result.failed, result
    assert result["present_images"] == [LAB_IMAGE]
    assert "docker" not in result
    assert docker_cli["ran"] == [
        [DOCKER_BIN, "image", "inspect", "--format", "{{.Id}}", image] for image in (OTHER_IMAGE, LAB_IMAGE)
    ]


def test_without_the_docker_cli_no_image_is_present(run_module, docker_cli):
    docker_cli.update(installed=False, images={LAB_IMAGE})
    result = run_module(node_facts, {"images": [LAB_IMAGE]})
    assert result["present_images"] == []
    assert docker_cli["ran"] == []


def test_containers_are_looked_up_in_one_call_a_missing_one_included(run_module, docker_cli):
    docker_cli["containers"] = {
        "dsv41-r0": 'running|{"sparkserve.dsv41.spec-sha256":"3c1e"}',
        "dsv41-r2": "exited|null",
    }
    result = run_module(node_facts, {"containers": ["dsv41-r0", "dsv41-r1", "dsv41-r2"]}, check_mode=True)
    assert not result.failed, result
    assert result["containers"] == {
        "dsv41-r0": {"status": "running", "labels": {"sparkserve.dsv41.spec-sha256": "3c1e"}},
        "dsv41-r1": {"status": "missing", "labels": {}},
        "dsv41-r2": {"status": "exited", "labels": {}},
    }
    inspect_format = "{{.Name}}|{{.State.Status}}|{{json .Config.Labels}}"
    names = ["dsv41-r0", "dsv41-r1", "dsv41-r2"]
    assert docker_cli["ran"] == [[DOCKER_BIN, "container", "inspect", "--format", inspect_format, *names]]
    assert "docker" not in result


def test_without_the_docker_cli_every_container_is_missing(run_module, docker_cli):
    docker_cli.update(installed=False, containers={"dsv41-r0": "running|{}"})
    result = run_module(node_facts, {"containers": ["dsv41-r0"]})
    assert result["containers"] == {"dsv41-r0": {"status": "missing", "labels": {}}}
    assert docker_cli["ran"] == []


PING_LOST = (
    "\n--- 198.18.0.12 ping statistics ---\n1 packets transmitted, 0 received, 100% packet loss, time 0ms\n"
)


def test_each_peer_is_pinged_once_and_the_unanswered_are_named_with_why(run_module, docker_cli):
    docker_cli["pings"] = {
        "198.18.0.11": (0, "1 packets transmitted, 1 received\n", ""),
        "198.18.0.12": (1, PING_LOST, ""),
    }
    pings = {
        "interface": "enp1s0f1np1",
        "mtu": 9000,
        "peers": {"worker": "198.18.0.11", "worker2": "198.18.0.12"},
    }
    result = run_module(node_facts, {"pings": pings}, check_mode=True)
    assert not result.failed, result
    assert result["unanswered_pings"] == [
        {
            "name": "worker2",
            "address": "198.18.0.12",
            "why": "1 packets transmitted, 0 received, 100% packet loss, time 0ms",
        }
    ]
    assert [args[-3:] for args in docker_cli["ran"]] == [
        ["-I", "enp1s0f1np1", "198.18.0.11"],
        ["-I", "enp1s0f1np1", "198.18.0.12"],
    ]
    assert all(
        args[:9] == [PING_BIN, "-c", "1", "-W", "2", "-M", "do", "-s", "8972"] for args in docker_cli["ran"]
    )


def test_without_ping_every_peer_is_unanswered_because_ping_is_missing(run_module, docker_cli):
    docker_cli["installed"] = False
    pings = {"interface": "enp1s0f1np1", "mtu": 1500, "peers": {"worker": "198.18.0.11"}}
    result = run_module(node_facts, {"pings": pings})
    assert result["unanswered_pings"] == [
        {"name": "worker", "address": "198.18.0.11", "why": "ping: command not found"}
    ]
    assert docker_cli["ran"] == []


def test_pings_need_the_interface_the_mtu_and_the_peers(run_module, docker_cli):
    result = run_module(node_facts, {"pings": {"interface": "enp1s0f1np1", "peers": {}}})
    assert result.failed and "mtu" in result["msg"], result


def test_distributions_are_looked_up_by_running_the_python_named(run_module, tmp_path):
    """A real run of this test's own Python, as the module runs a virtualenv's."""
    names = ["pytest", "dsv41-no-such-distribution"]
    result = run_module(node_facts, {"python_distributions": {"python": sys.executable, "names": names}})
    assert not result.failed, result
    assert result["python_distributions"] == {
        "pytest": importlib.metadata.version("pytest"),
        "dsv41-no-such-distribution": "",
    }


@pytest.mark.parametrize("python", ["missing", "dangling-link"])
def test_a_python_that_cannot_run_has_no_distribution(run_module, tmp_path, python):
    """A virtualenv not created yet, or one whose interpreter link broke when the system Python changed."""
    path = tmp_path / "venv" / "bin" / "python"
    if python == "dangling-link":
        path.parent.mkdir(parents=True)
        path.symlink_to(tmp_path / "python3.99")
    result = run_module(
        node_facts, {"python_distributions": {"python": str(path), "names": ["huggingface_hub"]}}
    )
    assert not result.failed, result
    assert result["python_distributions"] == {"huggingface_hub": ""}
