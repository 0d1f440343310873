"""Environment checks at start-up: model directory, EXL3 plan, fabric interface, cache.

Each failure is a StartupError whose message names the variable or path at fault.
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from . import STANDIN_VERSION
from .errors import StartupError

SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class HostFacts:
    """What the environment checks established about this node."""

    host_ip: str
    ifname: str
    cache_dir: Path


def check_model_dir(model_path: str) -> None:
    """The checkpoint layout vLLM opens first; weights are only stat'ed, never read."""
    root = Path(model_path)
    if not root.is_dir():
        raise StartupError(f"model path {model_path} is not a directory")
    if not (root / "config.json").is_file():
        raise StartupError(f"model path {model_path} has no config.json")
    index_path = root / "model.safetensors.index.json"
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StartupError(
            f"model path {model_path}: unreadable model.safetensors.index.json ({exc})"
        ) from exc
    missing = sorted({name for name in weight_map.values() if not (root / name).is_file()})
    if missing:
        raise StartupError(
            f"model path {model_path}: weight_map names missing shard(s): {', '.join(missing)}"
        )


def check_plan(env: dict[str, str]) -> None:
    """ST_EXL3_PLAN must be a plan copy whose qdir banks were rewritten to existing directories."""
    plan = env.get("ST_EXL3_PLAN")
    if not plan:
        raise StartupError("ST_EXL3_PLAN is not set (the EXL3 plan file)")
    try:
        qdir = json.loads(Path(plan).read_text())["qdir"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StartupError(
            f"ST_EXL3_PLAN={plan}: not a readable plan JSON with a qdir field ({exc})"
        ) from exc
    entries = [entry for entry in str(qdir).split(":") if entry]
    bad = [entry for entry in entries if not Path(entry).is_dir()]
    if not entries or bad:
        raise StartupError(
            f"ST_EXL3_PLAN={plan}: qdir entries are not existing directories: {', '.join(bad) or '(empty)'} "
            "(bank paths must be rewritten to /model/exl3/<bank>)"
        )


def interface_ipv4(ifname: str) -> str | None:
    """Primary IPv4 address of an interface via SIOCGIFADDR (the image has no iproute2)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def check_fabric(env: dict[str, str]) -> tuple[str, str]:
    """NCCL/Gloo interface and VLLM_HOST_IP must describe one real interface of this node."""
    ifname = env.get("NCCL_SOCKET_IFNAME", "")
    names = [name for _, name in socket.if_nameindex()]
    if ifname not in names:
        raise StartupError(
            f"NCCL_SOCKET_IFNAME={ifname!r} is not an interface here (have: {', '.join(names)})"
        )
    gloo = env.get("GLOO_SOCKET_IFNAME", "")
    if gloo != ifname:
        raise StartupError(f"GLOO_SOCKET_IFNAME={gloo!r} differs from NCCL_SOCKET_IFNAME={ifname!r}")
    host_ip = env.get("VLLM_HOST_IP", "")
    try:
        ipaddress.IPv4Address(host_ip)
    except ValueError as exc:
        raise StartupError(f"VLLM_HOST_IP={host_ip!r} is not an IPv4 address") from exc
    actual = interface_ipv4(ifname)
    if actual != host_ip:
        raise StartupError(
            f"VLLM_HOST_IP={host_ip} is not the IPv4 address of NCCL_SOCKET_IFNAME={ifname} (it has {actual})"
        )
    return ifname, host_ip


def check_cache(env: dict[str, str], rank: int) -> Path:
    """XDG_CACHE_HOME (kernel caches) must be writable; leave a marker proving it."""
    cache = Path(env.get("XDG_CACHE_HOME") or "/cache")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        marker = {"rank": rank, "pid": os.getpid(), "started": time.time(), "engine": STANDIN_VERSION}
        (cache / f"standin-r{rank}.marker").write_text(json.dumps(marker) + "\n")
    except OSError as exc:
        raise StartupError(f"XDG_CACHE_HOME={cache} is not writable ({exc})") from exc
    return cache


def check_environment(args: argparse.Namespace, env: dict[str, str]) -> HostFacts:
    """All start-up checks of the node environment, in the order a real start would trip."""
    check_model_dir(args.model_path)
    check_plan(env)
    ifname, host_ip = check_fabric(env)
    cache = check_cache(env, args.node_rank)
    return HostFacts(host_ip=host_ip, ifname=ifname, cache_dir=cache)
