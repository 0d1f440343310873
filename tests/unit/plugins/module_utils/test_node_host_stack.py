"""The host stack read by node_facts for preflight: /proc/meminfo, the NVIDIA driver's version
file, each RDMA device's firmware, and the problems that stop a deployment."""

from __future__ import annotations

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _node

# /proc/meminfo of a Spark after a kernel update with kexec handover on (reported on two pairs).
KHO_MEMINFO = (
    "MemTotal:       124657236 kB\nMemAvailable:   92000000 kB\n"
    "CmaTotal:              0 kB\nCmaFree:          940604 kB\n"
)
HEALTHY_MEMINFO = (
    "MemTotal:       124657236 kB\nMemAvailable:  118000000 kB\n"
    "CmaTotal:              0 kB\nCmaFree:               0 kB\n"
)
# This machine's kernel has no CMA at all: no Cma lines.
NO_CMA_MEMINFO = "MemTotal:       24683784 kB\nMemAvailable:   24109056 kB\nHugePages_Total:       0\n"
DRIVER = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
    "(dvs-builder@U22-I3-AF03-09-1)  Thu Sep 25 18:27:06 UTC 2025\nGCC version:  gcc version 13.3.0\n"
)


def _stack(tmp_path, meminfo: str, *, kernel: str = "6.17.0-1014-nvidia", driver: str | None = DRIVER):
    proc, sysfs = tmp_path / "proc", tmp_path / "sys"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "osrelease").write_text(kernel + "\n")
    (proc / "meminfo").write_text(meminfo)
    if driver:
        (proc / "driver" / "nvidia").mkdir(parents=True)
        (proc / "driver" / "nvidia" / "version").write_text(driver)
    for device in ("rocep1s0f1", "roceP2p1s0f1"):
        (sysfs / "class" / "infiniband" / device).mkdir(parents=True)
        (sysfs / "class" / "infiniband" / device / "fw_ver").write_text("28.45.4028\n")

    def read(path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except OSError:
            return None

    return _node.read_host_stack(str(proc), str(sysfs), read)


def test_the_host_stack_is_read_from_proc_and_sysfs(tmp_path):
    stack = _stack(tmp_path, HEALTHY_MEMINFO)
    assert stack == {
        "kernel": "6.17.0-1014-nvidia",
        "driver": "580.95.05",
        "nic_firmware": {"roceP2p1s0f1": "28.45.4028", "rocep1s0f1": "28.45.4028"},
        "mem_total_kb": 124657236,
        "mem_available_kb": 118000000,
        "cma_total_kb": 0,
        "cma_free_kb": 0,
    }
    assert _stack(tmp_path / "x", NO_CMA_MEMINFO, driver=None)["driver"] is None


@pytest.mark.parametrize(
    ("meminfo", "problem"),
    [(KHO_MEMINFO, "CmaTotal 0 kB with CmaFree 940604 kB"), (HEALTHY_MEMINFO, None), (NO_CMA_MEMINFO, None)],
)
def test_cma_pages_without_a_cma_area_stop_the_deployment(tmp_path, meminfo, problem):
    problems = _node.host_stack_problems(_stack(tmp_path, meminfo), [])
    if problem:
        assert len(problems) == 1 and problem in problems[0] and "kho=off" in problems[0]
    else:
        assert problems == []


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ({"item": "kernel", "version": "6.17.0-1014-nvidia", "why": "breaks"},
         "kernel 6.17.0-1014-nvidia is known to be bad: breaks"),
        ({"item": "nic_firmware", "version": "28.45.4028", "why": ""},
         "nic_firmware 28.45.4028 is known to be bad (preflight_known_bad_versions)"),
        ({"item": "driver", "version": "580.95.05", "why": "x"}, "driver 580.95.05"),
        ({"item": "kernel", "version": "7.0.0-1019-nvidia", "why": "x"}, None),
    ],
)  # fmt: skip
def test_a_known_bad_version_is_named(tmp_path, entry, named):
    problems = _node.host_stack_problems(_stack(tmp_path, HEALTHY_MEMINFO), [entry])
    assert problems == ([] if named is None else [problems[0]])
    if named:
        assert named in problems[0]


def test_the_shipped_list_names_the_kernel_that_breaks_memory_registration():
    from role_defaults import role_defaults

    shipped = role_defaults("preflight")["preflight_known_bad_versions"]
    assert [(entry["item"], entry["version"]) for entry in shipped] == [("kernel", "7.0.0-1019-nvidia")]
