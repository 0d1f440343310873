# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""What a node offers the deployment, as pure functions behind ``node_facts``.

The user running the module (the facts ``setup`` gathers for its ``user`` subset, under the same
names), the commands missing from its PATH, the Python modules its interpreter cannot import, what
the Docker engine answers, which images it has, the state and labels of named containers and which
peers do not answer an unfragmented ping. Nothing here runs a command: the module passes the output
in.

Internal to sparkserve.dsv41; not a public API.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

# One docker call for the engine's version and its container runtimes, split at the bar.
DOCKER_INFO_FORMAT = "{{.ServerVersion}}|{{json .Runtimes}}"


def user_facts(pw_name: str, pw_uid: int, pw_gid: int, pw_dir: str) -> dict[str, Any]:
    """The ``setup`` user facts the roles read (a passwd entry's fields, as setup names them)."""
    return {"user_id": pw_name, "user_uid": pw_uid, "user_gid": pw_gid, "user_dir": pw_dir}


def missing_commands(names: list[str], which: Callable[[str], str | None]) -> list[str]:
    """The names ``which`` does not find, in the order given, each once."""
    return [name for name in dict.fromkeys(names) if not which(name)]


def missing_python_modules(names: list[str], find_spec: Callable[[str], Any]) -> list[str]:
    """The modules ``find_spec`` does not find (a missing parent package counts as missing)."""
    missing = []
    for name in dict.fromkeys(names):
        try:
            found = find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


# Run by another Python (a virtualenv's) with the distribution names as arguments: their versions
# as one JSON object, "" for one it does not have.
DISTRIBUTIONS_SCRIPT = """
import importlib.metadata, json, sys
versions = {}
for name in sys.argv[1:]:
    try:
        versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        versions[name] = ""
print(json.dumps(versions))
"""


def distribution_versions(names: list[str], rc: int, stdout: str) -> dict[str, str]:
    """DISTRIBUTIONS_SCRIPT's answer by the names asked: "" for each when that Python did not run."""
    versions = {}
    if rc == 0:
        try:
            answer = json.loads(stdout)
        except ValueError:
            answer = None
        versions = answer if isinstance(answer, dict) else {}
    return {name: str(versions.get(name) or "") for name in dict.fromkeys(names)}


def present_images(names: list[str], engine_has: Callable[[str], bool]) -> list[str]:
    """The image references ``engine_has`` finds, in the order given, each once."""
    return [name for name in dict.fromkeys(names) if engine_has(name)]


# One docker call for every container asked: a line each for the ones the engine has.
CONTAINER_FORMAT = "{{.Name}}|{{.State.Status}}|{{json .Config.Labels}}"


def parse_container_states(names: list[str], stdout: str) -> dict[str, dict[str, Any]]:
    """``docker container inspect --format CONTAINER_FORMAT NAME...``'s answer, by the names asked.

    docker prints one line per container it has (its name with a leading ``/``) and, on stderr, an
    error for each it does not have (exit 1). A name without a line is ``missing``: also when the
    engine did not answer, which the caller's Docker module will then report. ``null`` labels are {}.
    """
    found = {}
    for line in stdout.splitlines():
        fields = line.split("|", 2)
        if len(fields) != 3:
            continue
        name, status, labels_json = fields
        try:
            labels = json.loads(labels_json)
        except ValueError:
            labels = None
        found[name.strip().lstrip("/")] = {
            "status": status.strip(),
            "labels": labels if isinstance(labels, dict) else {},
        }
    return {name: found.get(name, {"status": "missing", "labels": {}}) for name in dict.fromkeys(names)}


# An IPv4 header and an ICMP echo header: a ping of MTU - 28 bytes of data fills one frame.
PING_HEADER_BYTES = 28


def ping_argv(ping_bin: str, interface: str, mtu: int, address: str) -> list[str]:
    """One echo request out of ``interface``, with "don't fragment", filling a frame of ``mtu`` bytes.

    Two seconds for the answer: a peer on the same link answers in well under a millisecond.
    """
    size = str(mtu - PING_HEADER_BYTES)
    return [ping_bin, "-c", "1", "-W", "2", "-M", "do", "-s", size, "-I", interface, address]


def ping_failure(rc: int, stdout: str, stderr: str) -> str:
    """Why a ping did not get its answer (empty when it did): ping's error, else its loss summary."""
    if rc == 0:
        return ""
    errors = [line.strip() for line in stderr.splitlines() if line.strip()]
    if errors:
        return errors[-1]
    losses = [line.strip() for line in stdout.splitlines() if "packet loss" in line]
    return losses[-1] if losses else f"ping exited with {rc} and printed nothing"


def parse_docker_info(rc: int, stdout: str, stderr: str) -> dict[str, Any]:
    """``docker info --format DOCKER_INFO_FORMAT``'s answer: version, runtime names and error.

    ``error`` is empty when the engine answered. Some docker CLIs exit 0 and print ``|null`` when
    the engine does not answer: no version counts as no answer.
    """
    version, _bar, runtimes_json = stdout.strip().partition("|")
    version = version.strip()
    try:
        runtimes = json.loads(runtimes_json) if runtimes_json.strip() else None
    except ValueError:
        runtimes = None
    error = ""
    if rc != 0 or not version:
        error = stderr.strip() or stdout.strip() or f"docker info exited with {rc} and printed nothing"
        version = ""
    return {
        "version": version,
        "runtimes": sorted(runtimes) if isinstance(runtimes, dict) else [],
        "error": error,
    }


# What node_files reports of a systemd unit, under the names systemctl show gives them.
UNIT_PROPERTIES = {
    "LoadState": "load_state",
    "ActiveState": "active_state",
    "UnitFileState": "unit_file_state",
}


def parse_unit_states(names: list[str], stdout: str) -> dict[str, dict[str, str]]:
    """``systemctl show --property=<UNIT_PROPERTIES> NAME...``'s answer, by the names asked.

    systemctl prints one block of ``Property=value`` lines per unit, in the order asked, blocks
    apart by a blank line; a unit it does not know is ``LoadState=not-found`` with an empty
    ``UnitFileState``. A property missing from a block is "". ValueError when the number of blocks
    is not the number of units asked.
    """
    blocks = [block for block in stdout.strip().split("\n\n") if block.strip()]
    if len(blocks) != len(names):
        raise ValueError(
            f"systemctl show answered {len(blocks)} unit(s) for {len(names)}: {stdout.strip()!r}"
        )
    states = {}
    for name, block in zip(names, blocks, strict=True):
        found = dict(line.partition("=")[::2] for line in block.splitlines() if "=" in line)
        states[name] = {key: found.get(prop, "") for prop, key in UNIT_PROPERTIES.items()}
    return states


def unit_as_asked(state: dict[str, str], enabled: bool) -> bool:
    """Whether a unit is as ``systemd_service`` leaves it: enabled and active when ``enabled``, else
    disabled and not running (``inactive``, or ``failed`` from an earlier run)."""
    if enabled:
        return state["unit_file_state"] == "enabled" and state["active_state"] == "active"
    return state["unit_file_state"] == "disabled" and state["active_state"] in ("inactive", "failed")


# --- the host stack: what the kernel, the driver and the NIC run (preflight and the records) ----

# The items a known-bad entry may name; each is read from the node (read_host_stack).
HOST_STACK_ITEMS = ("kernel", "driver", "nic_firmware")


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as ``{name: kB}`` (the lines without a number are left out)."""
    values = {}
    for line in text.splitlines():
        name, _colon, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            values[name.strip()] = int(fields[0])
    return values


def nvidia_driver_version(text: str | None) -> str | None:
    """The version in ``/proc/driver/nvidia/version`` ("NVRM version: ... Kernel Module for
    aarch64  580.95.05  Release Build ..."), else None (no NVIDIA driver loaded)."""
    if not text:
        return None
    match = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text.splitlines()[0] + " ")
    return match.group(1) if match else None


def read_host_stack(proc_root: str, sysfs_root: str, read: Callable[[str], str | None]) -> dict[str, Any]:
    """Kernel release, memory figures, NVIDIA driver and each RDMA device's firmware, as read
    through ``read`` (a path -> text or None function, so that tests feed fixtures)."""
    meminfo = parse_meminfo(read(os.path.join(proc_root, "meminfo")) or "")
    infiniband = os.path.join(sysfs_root, "class", "infiniband")
    try:
        devices = sorted(os.listdir(infiniband))
    except OSError:
        devices = []
    firmware = {
        device: (read(os.path.join(infiniband, device, "fw_ver")) or "").strip() or None for device in devices
    }
    return {
        "kernel": (read(os.path.join(proc_root, "sys", "kernel", "osrelease")) or "").strip() or None,
        "driver": nvidia_driver_version(read(os.path.join(proc_root, "driver", "nvidia", "version"))),
        "nic_firmware": firmware,
        "mem_total_kb": meminfo.get("MemTotal"),
        "mem_available_kb": meminfo.get("MemAvailable"),
        "cma_total_kb": meminfo.get("CmaTotal"),
        "cma_free_kb": meminfo.get("CmaFree"),
    }


def host_stack_problems(stack: dict[str, Any], known_bad: list[dict[str, str]]) -> list[str]:
    """What stops a deployment on this host: a known-bad version, or CMA pages the kernel hands
    out without a CMA area (``CmaTotal: 0`` with ``CmaFree`` above 0: memory registration then fails
    under GPU memory pressure, seen with kexec handover on kernel 7.0.0-1019-nvidia)."""
    problems = []
    for entry in known_bad:
        item, version = entry["item"], entry["version"]
        found = stack.get(item)
        versions = list(found.values()) if isinstance(found, dict) else [found]
        if version in versions:
            why = f": {entry['why']}" if entry.get("why") else ""
            problems.append(f"{item} {version} is known to be bad{why} (preflight_known_bad_versions)")
    total, free = stack.get("cma_total_kb"), stack.get("cma_free_kb")
    if total == 0 and (free or 0) > 0:
        problems.append(
            f"/proc/meminfo shows CmaTotal 0 kB with CmaFree {free} kB: the kernel hands out pages that no "
            "CMA area owns and RDMA memory registration fails under GPU memory pressure (ibv_reg_mr ENOMEM); "
            "boot with kho=off or a kernel without kexec handover enabled by default"
        )
    return problems
