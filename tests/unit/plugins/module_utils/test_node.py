"""Tests of the node_facts pure functions, fed the docker CLI's captured answers."""

from __future__ import annotations

import importlib.util

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._node import (
    missing_commands,
    missing_python_modules,
    parse_docker_info,
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
