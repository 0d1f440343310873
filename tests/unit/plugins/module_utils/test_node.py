"""Tests of the node_facts and node_files pure functions, fed docker's and systemctl's captured answers."""

from __future__ import annotations

import importlib.util

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._node import (
    distribution_versions,
    missing_commands,
    missing_python_modules,
    parse_container_states,
    parse_docker_info,
    parse_unit_states,
    ping_argv,
    ping_failure,
    present_images,
    unit_as_asked,
    user_facts,
)

# `docker info --format '{{.ServerVersion}}|{{json .Runtimes}}'` on a lab node (Docker 20.10.24).
LAB_INFO = (
    '20.10.24+dfsg1|{"io.containerd.runc.v2":{"path":"runc"},'
    '"io.containerd.runtime.v1.linux":{"path":"runc"},"runc":{"path":"runc"}}\n'
)
# The same with the engine out of reach (DOCKER_HOST to no socket, or a user outside the docker group).
UNREACHABLE_STDERR = (
    'template: :1:2: executing "" at <.ServerVersion>: reflect: indirection through nil pointer to '
    "embedded struct field Info\n"
)


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "expected"),
    [
        pytest.param(
            0,
            LAB_INFO,
            "",
            {
                "version": "20.10.24+dfsg1",
                "runtimes": ["io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc"],
                "error": "",
            },
            id="answered",
        ),
        pytest.param(
            1,
            "\n",
            UNREACHABLE_STDERR,
            {"version": "", "runtimes": [], "error": UNREACHABLE_STDERR.strip()},
            id="out-of-reach",
        ),
        # Some CLIs exit 0 without an engine, printing an empty version and null runtimes.
        pytest.param(
            0, "|null\n", "", {"version": "", "runtimes": [], "error": "|null"}, id="exit-0-without-engine"
        ),
        pytest.param(
            5,
            "",
            "",
            {"version": "", "runtimes": [], "error": "docker info exited with 5 and printed nothing"},
            id="silent",
        ),
        # An engine without runtimes, or an answer cut short: the version counts, the runtimes are none.
        pytest.param(
            0, "27.1.0|null\n", "", {"version": "27.1.0", "runtimes": [], "error": ""}, id="no-runtimes"
        ),
        pytest.param(
            0, '27.1.0|{"runc":', "", {"version": "27.1.0", "runtimes": [], "error": ""}, id="cut-short"
        ),
    ],
)
def test_docker_info_gives_the_version_the_runtimes_and_why_it_did_not_answer(rc, stdout, stderr, expected):
    assert parse_docker_info(rc, stdout, stderr) == expected


def test_the_nvidia_runtime_is_found_by_name():
    answer = '28.3.3|{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}'
    assert "nvidia" in parse_docker_info(0, answer, "")["runtimes"]


@pytest.mark.parametrize(
    ("names", "present", "missing"),
    [
        ([], set(), []),
        (["python3", "rsync", "curl"], {"python3", "rsync", "curl"}, []),
        (["python3", "rsync", "curl"], {"python3"}, ["rsync", "curl"]),
        (["rsync", "rsync"], set(), ["rsync"]),
    ],
)
def test_missing_commands_keep_the_order_given_once_each(names, present, missing):
    assert missing_commands(names, lambda name: f"/usr/bin/{name}" if name in present else None) == missing


@pytest.mark.parametrize(
    ("names", "missing"),
    [
        (["json", "os.path"], []),
        (["dsv41_no_such_module"], ["dsv41_no_such_module"]),
        # A missing parent package raises in find_spec; a missing child of a real package is None.
        (
            ["dsv41_no_such_package.sub", "xml.dsv41_no_such", "json"],
            ["dsv41_no_such_package.sub", "xml.dsv41_no_such"],
        ),
        (["", "json"], [""]),
    ],
)
def test_missing_python_modules_are_the_ones_this_python_cannot_import(names, missing):
    assert missing_python_modules(names, importlib.util.find_spec) == missing


def test_user_facts_are_named_as_setup_names_them():
    assert user_facts("spark", 1000, 1000, "/home/spark") == {
        "user_id": "spark",
        "user_uid": 1000,
        "user_gid": 1000,
        "user_dir": "/home/spark",
    }


# `systemctl show --property=Id,LoadState,ActiveState,UnitFileState dsv41-memguard.service
# dsv41-supervisor.service nope.service` on the lab's head (systemd 252), the supervisor stopped.
SYSTEMCTL_SHOW = """Id=dsv41-memguard.service
LoadState=loaded
ActiveState=active
UnitFileState=enabled

Id=dsv41-supervisor.service
LoadState=loaded
ActiveState=inactive
UnitFileState=disabled

Id=nope.service
LoadState=not-found
ActiveState=inactive
UnitFileState=
"""


def test_unit_states_are_read_by_the_names_asked_in_order():
    names = ["dsv41-memguard.service", "dsv41-supervisor.service", "nope.service"]
    assert parse_unit_states(names, SYSTEMCTL_SHOW) == {
        "dsv41-memguard.service": {
            "load_state": "loaded",
            "active_state": "active",
            "unit_file_state": "enabled",
        },
        "dsv41-supervisor.service": {
            "load_state": "loaded",
            "active_state": "inactive",
            "unit_file_state": "disabled",
        },
        "nope.service": {"load_state": "not-found", "active_state": "inactive", "unit_file_state": ""},
    }


def test_a_unit_asked_without_its_suffix_keeps_the_name_it_was_asked_by():
    answer = "Id=dsv41-memguard.service\nLoadState=loaded\nActiveState=failed\nUnitFileState=enabled\n"
    assert parse_unit_states(["dsv41-memguard"], answer)["dsv41-memguard"]["active_state"] == "failed"


def test_a_property_systemctl_left_out_is_empty():
    assert parse_unit_states(["a.service"], "Id=a.service\nActiveState=active\n")["a.service"] == {
        "load_state": "",
        "active_state": "active",
        "unit_file_state": "",
    }


@pytest.mark.parametrize(
    ("names", "answer"), [(["a.service", "b.service"], SYSTEMCTL_SHOW), (["a.service"], "")]
)
def test_an_answer_for_other_units_than_asked_is_an_error(names, answer):
    with pytest.raises(ValueError, match="systemctl show answered"):
        parse_unit_states(names, answer)


@pytest.mark.parametrize(
    ("names", "has", "expected"),
    [
        ([], {"a@sha256:1"}, []),
        (["a@sha256:1", "b@sha256:2"], {"b@sha256:2"}, ["b@sha256:2"]),
        (["a@sha256:1", "a@sha256:1"], {"a@sha256:1"}, ["a@sha256:1"]),
        (["a@sha256:1"], set(), []),
    ],
)
def test_present_images_are_the_ones_the_engine_has_in_order_each_once(names, has, expected):
    assert present_images(names, has.__contains__) == expected


# `docker container inspect --format '{{.Name}}|{{.State.Status}}|{{json .Config.Labels}}'
# dsv41-r0 dsv41-r9 dsv41-r7 dsv41-r8` on a lab node (Docker 20.10.24): r0 the running rank, r9 none
# (stderr: "Error: No such container: dsv41-r9", exit 1), r7 created, r8 exited with a label of its own.
STANDIN_DESCRIPTION = "STAND-IN for the vLLM DeepSeek-V4.1-Flash serving image (lab only)"
STANDIN_LABELS = (
    f'"org.opencontainers.image.description":"{STANDIN_DESCRIPTION}",'
    '"org.opencontainers.image.title":"sparkserve-lab-vllm-standin"'
)
CONTAINER_INSPECT = (
    f'/dsv41-r0|running|{{{STANDIN_LABELS},"sparkserve.lab":"image"}}\n'
    f'/dsv41-r7|created|{{{STANDIN_LABELS},"sparkserve.lab":"image"}}\n'
    f'/dsv41-r8|exited|{{{STANDIN_LABELS},"sparkserve.dsv41.spec-sha256":"abc","sparkserve.lab":"image"}}\n'
)
IMAGE_LABELS = {
    "org.opencontainers.image.description": STANDIN_DESCRIPTION,
    "org.opencontainers.image.title": "sparkserve-lab-vllm-standin",
    "sparkserve.lab": "image",
}


def test_container_states_are_read_by_the_names_asked_a_missing_one_included():
    assert parse_container_states(["dsv41-r0", "dsv41-r9", "dsv41-r7", "dsv41-r8"], CONTAINER_INSPECT) == {
        "dsv41-r0": {"status": "running", "labels": IMAGE_LABELS},
        "dsv41-r9": {"status": "missing", "labels": {}},
        "dsv41-r7": {"status": "created", "labels": IMAGE_LABELS},
        "dsv41-r8": {"status": "exited", "labels": {**IMAGE_LABELS, "sparkserve.dsv41.spec-sha256": "abc"}},
    }


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        pytest.param("", {"status": "missing", "labels": {}}, id="engine-did-not-answer"),
        # A container whose image and run set no label: Go prints the nil map as null.
        pytest.param("/dsv41-r1|running|null\n", {"status": "running", "labels": {}}, id="no-labels"),
        pytest.param("/dsv41-r1|running|{not\n", {"status": "running", "labels": {}}, id="garbled-labels"),
        pytest.param("/dsv41-r1|running\n", {"status": "missing", "labels": {}}, id="short-line"),
        pytest.param("/dsv41-r10|running|{}\n", {"status": "missing", "labels": {}}, id="other-name"),
    ],
)
def test_a_container_the_answer_does_not_describe_in_full_is_missing_or_unlabelled(stdout, expected):
    assert parse_container_states(["dsv41-r1"], stdout) == {"dsv41-r1": expected}


def test_container_names_asked_twice_are_answered_once():
    assert list(parse_container_states(["dsv41-r0", "dsv41-r0"], CONTAINER_INSPECT)) == ["dsv41-r0"]


def test_a_ping_fills_one_frame_of_the_mtu_unfragmented_out_of_the_interface():
    assert ping_argv("/usr/bin/ping", "enp1s0f1np1", 9000, "198.18.0.11") == [
        "/usr/bin/ping", "-c", "1", "-W", "2", "-M", "do", "-s", "8972", "-I", "enp1s0f1np1", "198.18.0.11",
    ]  # fmt: skip


# iputils ping's answers on a lab node (ping -c 1 -W 2 -M do -s 1472 -I enp1s0f1np1 <address>).
PING_ANSWERED = """PING 198.18.0.11 (198.18.0.11) from 198.18.0.13 enp1s0f1np1: 1472(1500) bytes of data.
1480 bytes from 198.18.0.11: icmp_seq=1 ttl=64 time=0.155 ms

--- 198.18.0.11 ping statistics ---
1 packets transmitted, 1 received, 0% packet loss, time 0ms
rtt min/avg/max/mdev = 0.155/0.155/0.155/0.000 ms
"""
PING_LOST = """PING 198.18.0.99 (198.18.0.99) from 198.18.0.13 enp1s0f1np1: 1472(1500) bytes of data.

--- 198.18.0.99 ping statistics ---
1 packets transmitted, 0 received, 100% packet loss, time 0ms

"""
# A frame larger than the interface's MTU with "don't fragment": refused before it leaves.
PING_TOO_LONG = """PING 198.18.0.11 (198.18.0.11) from 198.18.0.13 enp1s0f1np1: 64972(65000) bytes of data.

--- 198.18.0.11 ping statistics ---
1 packets transmitted, 0 received, +1 errors, 100% packet loss, time 0ms

"""


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "why"),
    [
        pytest.param(0, PING_ANSWERED, "", "", id="answered"),
        pytest.param(
            1, PING_LOST, "", "1 packets transmitted, 0 received, 100% packet loss, time 0ms", id="lost"
        ),
        pytest.param(
            1, PING_TOO_LONG, "", "1 packets transmitted, 0 received, +1 errors, 100% packet loss, time 0ms",
            id="frame-too-long",
        ),
        pytest.param(
            2, "", "ping: SO_BINDTODEVICE nosuchif: No such device\n",
            "ping: SO_BINDTODEVICE nosuchif: No such device", id="no-such-interface",
        ),
        pytest.param(1, "", "", "ping exited with 1 and printed nothing", id="silent"),
    ],
)  # fmt: skip
def test_a_ping_without_answer_says_why(rc, stdout, stderr, why):
    assert ping_failure(rc, stdout, stderr) == why


NONE = {"huggingface_hub": "", "requests": ""}
FOUND = {"huggingface_hub": "2.4.0", "requests": ""}


@pytest.mark.parametrize(
    ("rc", "stdout", "expected"),
    [
        pytest.param(0, '{"huggingface_hub": "2.4.0", "requests": ""}\n', FOUND, id="answered"),
        pytest.param(0, '{"huggingface_hub": "2.4.0"}\n', FOUND, id="left-out"),
        pytest.param(127, "", NONE, id="python-does-not-run"),
        pytest.param(1, '{"huggingface_hub": "2.4.0"}\n', NONE, id="python-failed"),
        pytest.param(0, "Traceback ...\n", NONE, id="not-json"),
        pytest.param(0, '["2.4.0"]\n', NONE, id="not-an-object"),
    ],
)
def test_distribution_versions_are_by_the_names_asked_empty_when_unknown(rc, stdout, expected):
    assert distribution_versions(["huggingface_hub", "requests"], rc, stdout) == expected


@pytest.mark.parametrize(
    ("unit_file_state", "active_state", "enabled", "as_asked"),
    [
        ("enabled", "active", True, True),
        ("enabled", "inactive", True, False),
        ("enabled", "failed", True, False),
        ("disabled", "active", True, False),
        # Enabled at runtime only (systemctl enable --runtime): gone after a reboot.
        ("enabled-runtime", "active", True, False),
        ("", "inactive", True, False),  # not found
        ("disabled", "inactive", False, True),
        ("disabled", "failed", False, True),
        ("disabled", "active", False, False),
        ("enabled", "inactive", False, False),
        ("disabled", "activating", False, False),
    ],
)
def test_a_unit_is_as_asked_only_in_the_state_systemd_service_leaves_it(
    unit_file_state, active_state, enabled, as_asked
):
    state = {"load_state": "loaded", "active_state": active_state, "unit_file_state": unit_file_state}
    assert unit_as_asked(state, enabled) is as_asked
