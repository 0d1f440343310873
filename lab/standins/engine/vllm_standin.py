#!/usr/bin/env python3
"""STAND-IN for the vLLM serving engine -- sparkserve lab only, never part of the shipped roles.

The lab has no GPU and cannot pull the real serving image, so the rank containers run this
single stdlib-only file instead.  It accepts the exact ``vllm serve`` command line and
environment of ``reference-config.md``, checks them the way a real start-up would fail on them,
performs a real TCP rendezvous between rank 0 and the headless ranks, and then serves a small
OpenAI-compatible API with deterministic answers and realistic (configurable) timing, so the
roles, the smoke test, the benchmark and Pi can be exercised end to end.

Token accounting (documented in README.md): one token is one whitespace-separated word; a
``/v1/completions`` prompt given as token ids counts ``len(ids)``; every streamed chunk carries
exactly one token.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import colorsys
import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

STANDIN_VERSION = "0.1.0+sparkserve.standin"

# Rendezvous link timing: a heartbeat every second, a peer silent for 5 s is gone.
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 5.0
HELLO_TIMEOUT_S = 10.0
JOIN_RETRY_S = 0.25

# Arguments a head passes but a headless rank does not (excluded from the rank fingerprint).
HEAD_ONLY_ARGS = frozenset(
    {
        "command",
        "node_rank",
        "headless",
        "host",
        "port",
        "api_key",
        "reasoning_parser",
        "tool_call_parser",
        "enable_auto_tool_choice",
        "enable_prompt_tokens_details",
        "enable_force_include_usage",
    }
)

KNOWN_FAULTS = frozenset({"wrong_math", "no_tool_call", "wrong_city", "swap_colors", "no_reasoning"})
WRONG_CITIES = ("Paris", "London")  # wrong_city calls the tool for the first that was not asked about
IMAGE_PROMPT_TOKENS = 64  # what one image adds to prompt_tokens
SIOCGIFADDR = 0x8915


class StartupError(Exception):
    """A configuration or environment problem: logged, then the process exits 1 like vLLM."""


class RequestError(Exception):
    """A client error answered with an OpenAI-style error body."""

    def __init__(
        self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param


class Log:
    """Concise stderr lines (``docker logs``), tagged with the rank."""

    tag = "standin"
    _lock = threading.Lock()

    @classmethod
    def info(cls, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with cls._lock:
            sys.stderr.write(f"{stamp} vllm-standin[{cls.tag}] {message}\n")
            sys.stderr.flush()

    @classmethod
    def error(cls, message: str) -> None:
        cls.info(f"ERROR: {message}")


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def json_object(text: str) -> dict[str, Any]:
    """argparse type for vLLM's JSON-valued options; invalid JSON is a usage error (exit 2)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _add_bool(group: argparse._ArgumentGroup, flag: str, help_text: str) -> None:
    """vLLM's boolean engine flags: ``--flag`` and ``--no-flag``, default off."""
    group.add_argument(flag, action=argparse.BooleanOptionalAction, default=False, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    """The ``vllm`` CLI, restricted to the flags of the reference deployment (unknown = exit 2)."""
    parser = argparse.ArgumentParser(
        prog="vllm",
        allow_abbrev=False,
        description="STAND-IN for vLLM (sparkserve lab): accepts the reference command line.",
    )
    parser.add_argument("--version", action="version", version=STANDIN_VERSION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve}")
    serve = commands.add_parser(
        "serve",
        allow_abbrev=False,
        help="start the OpenAI-compatible server (stand-in)",
        description="Start the stand-in OpenAI-compatible server with the vLLM reference flags.",
    )
    serve.add_argument("model_path", help="model directory (config.json, safetensors index, shards)")

    model = serve.add_argument_group("model")
    model.add_argument("--served-model-name", nargs="+", default=None, help="name(s) the API answers to")
    model.add_argument("--dtype", default="auto")
    model.add_argument("--generation-config", default="auto")
    model.add_argument("--tokenizer-mode", default="auto")
    model.add_argument("--safetensors-load-strategy", default=None)
    model.add_argument("--engram-config", type=json_object, default=None, metavar="JSON")
    model.add_argument("--limit-mm-per-prompt", type=json_object, default=None, metavar="JSON")

    parallel = serve.add_argument_group("parallelism and rendezvous")
    parallel.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parallel.add_argument("--nnodes", type=int, default=1)
    parallel.add_argument("--node-rank", type=int, default=0)
    parallel.add_argument("--master-addr", default="127.0.0.1")
    parallel.add_argument("--master-port", type=int, default=29501)
    parallel.add_argument("--headless", action="store_true", help="worker rank: no API server")

    engine = serve.add_argument_group("engine")
    engine.add_argument("--kv-cache-dtype", default="auto")
    engine.add_argument("--block-size", type=int, default=None)
    engine.add_argument("--swa-block-size", type=int, default=None)
    engine.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    engine.add_argument("--max-model-len", type=int, default=8192)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--max-cudagraph-capture-size", type=int, default=None)
    engine.add_argument("--compilation-config", "-O", type=json_object, default=None, metavar="JSON")
    engine.add_argument("--speculative-config", type=json_object, default=None, metavar="JSON")
    engine.add_argument("--attention-backend", default=None)
    engine.add_argument("--linear-backend", default=None)
    engine.add_argument("--moe-backend", default=None)
    _add_bool(engine, "--enable-chunked-prefill", "chunked prefill")
    _add_bool(engine, "--async-scheduling", "asynchronous scheduling")
    _add_bool(engine, "--enable-prefix-caching", "prefix caching")

    frontend = serve.add_argument_group("API server (head only)")
    frontend.add_argument("--host", default="0.0.0.0")  # noqa: S104 - vLLM's default: all interfaces
    frontend.add_argument("--port", type=int, default=8000)
    frontend.add_argument("--api-key", default=None, help="prefer the VLLM_API_KEY environment variable")
    frontend.add_argument("--reasoning-parser", default=None)
    frontend.add_argument("--tool-call-parser", default=None)
    _add_bool(frontend, "--enable-auto-tool-choice", "let the model decide to call tools")
    _add_bool(frontend, "--enable-prompt-tokens-details", "usage.prompt_tokens_details")
    _add_bool(frontend, "--enable-force-include-usage", "usage in every stream")
    return parser


def check_consistency(args: argparse.Namespace) -> None:
    """Cross-flag rules of a one-GPU-per-node tensor-parallel deployment."""
    if args.nnodes < 1:
        raise StartupError(f"--nnodes must be >= 1, got {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        raise StartupError(f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes)")
    if args.tensor_parallel_size != args.nnodes:
        raise StartupError(
            f"--tensor-parallel-size {args.tensor_parallel_size} must equal --nnodes {args.nnodes} "
            "(one GPU per DGX Spark node)"
        )
    if args.headless and args.node_rank == 0:
        raise StartupError("rank 0 must not be --headless: it serves the API")
    if args.node_rank > 0 and not args.headless:
        raise StartupError(f"--node-rank {args.node_rank} requires --headless (only rank 0 serves)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise StartupError(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    draft_tp = (args.speculative_config or {}).get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp != args.tensor_parallel_size:
        raise StartupError(
            f"--speculative-config draft_tensor_parallel_size {draft_tp} must equal "
            f"--tensor-parallel-size {args.tensor_parallel_size}"
        )
    sizes = (args.compilation_config or {}).get("cudagraph_capture_sizes")
    limit = args.max_cudagraph_capture_size
    if sizes and limit is not None and max(sizes) != limit:
        raise StartupError(
            f"--max-cudagraph-capture-size {limit} differs from max(cudagraph_capture_sizes) {max(sizes)} "
            "in --compilation-config"
        )


def shared_args(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments every rank must agree on (all but rank identity and head-only flags)."""
    return {key: value for key, value in sorted(vars(args).items()) if key not in HEAD_ONLY_ARGS}


def fingerprint(shared: dict[str, Any]) -> str:
    """Short digest of the shared arguments, exchanged at rendezvous."""
    blob = json.dumps(shared, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# Environment checks
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


def _positive(env: dict[str, str], name: str, default: float, allow_zero: bool = False) -> float:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise StartupError(f"{name}={raw!r} is not a number") from exc
    if value < 0 or (value == 0 and not allow_zero):
        raise StartupError(f"{name}={raw!r} must be {'>= 0' if allow_zero else '> 0'}")
    return value


@dataclass(frozen=True)
class Settings:
    """Stand-in behaviour knobs, read once from STANDIN_* variables at start."""

    decode_tps: float = 50.0
    prefill_tps: float = 2000.0
    output_tokens: int = 64
    boot_seconds: float = 0.0
    faults: frozenset[str] = frozenset()
    request_log: Path = Path("/cache/standin-requests.jsonl")

    @classmethod
    def from_env(cls, env: dict[str, str], cache_dir: Path) -> Settings:
        faults = frozenset(f.strip() for f in env.get("STANDIN_FAULTS", "").split(",") if f.strip())
        unknown = faults - KNOWN_FAULTS
        if unknown:
            raise StartupError(
                f"STANDIN_FAULTS has unknown fault(s) {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(KNOWN_FAULTS))})"
            )
        return cls(
            decode_tps=_positive(env, "STANDIN_DECODE_TOKENS_PER_S", 50.0),
            prefill_tps=_positive(env, "STANDIN_PREFILL_TOKENS_PER_S", 2000.0),
            output_tokens=max(1, int(_positive(env, "STANDIN_OUTPUT_TOKENS", 64))),
            boot_seconds=_positive(env, "STANDIN_BOOT_SECONDS", 0.0, allow_zero=True),
            faults=faults,
            request_log=Path(env.get("STANDIN_REQUEST_LOG") or cache_dir / "standin-requests.jsonl"),
        )


# --------------------------------------------------------------------------------------------
# Rendezvous
# --------------------------------------------------------------------------------------------


class LineLink:
    """Newline-delimited JSON over a TCP socket, with per-read timeouts."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def recv(self, timeout: float) -> dict[str, Any] | None:
        """Next message; None when the peer closed; TimeoutError when nothing came in time."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("message is not a JSON object")
        return message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def keep_alive(link: LineLink) -> str:
    """Exchange heartbeats until the link dies; return why it died."""
    last_seen = time.monotonic()
    next_send = 0.0
    while True:
        now = time.monotonic()
        if now >= next_send:
            try:
                link.send({"hb": round(time.time(), 3)})
            except OSError as exc:
                return f"send failed ({exc})"
            next_send = now + HEARTBEAT_INTERVAL_S
        try:
            message = link.recv(timeout=max(0.05, next_send - time.monotonic()))
        except TimeoutError:
            if time.monotonic() - last_seen > HEARTBEAT_TIMEOUT_S:
                return f"no heartbeat for {HEARTBEAT_TIMEOUT_S:.0f} s"
            continue
        except (OSError, ValueError) as exc:
            return f"connection error ({exc})"
        if message is None:
            return "connection closed"
        last_seen = time.monotonic()


class HeadRendezvous:
    """Rank 0's side: admit exactly the expected headless ranks with matching arguments."""

    def __init__(self, addr: str, port: int, nnodes: int, shared: dict[str, Any]):
        self.addr = addr
        self.port = port
        self.expected = set(range(1, nnodes))
        self.shared = shared
        self.fingerprint = fingerprint(shared)
        self.joined: dict[int, str] = {}
        self.lost: dict[int, str] = {}
        self._cond = threading.Condition()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((self.addr, self.port))
        except OSError as exc:
            raise StartupError(
                f"cannot listen on --master-addr {self.addr} --master-port {self.port}: {exc}"
            ) from exc
        listener.listen(16)
        threading.Thread(target=self._accept_loop, args=(listener,), daemon=True, name="rendezvous").start()
        Log.info(f"rendezvous: waiting for {len(self.expected)} headless rank(s) on {self.addr}:{self.port}")

    def wait_all(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: set(self.joined) == self.expected)
        Log.info(f"rendezvous: all {len(self.expected) + 1} ranks joined")

    def problem(self) -> str | None:
        with self._cond:
            if not self.lost:
                return None
            return "; ".join(f"headless rank {rank} lost: {why}" for rank, why in sorted(self.lost.items()))

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except OSError as exc:  # e.g. EMFILE: keep listening rather than lose the rendezvous
                Log.error(f"rendezvous: accept failed ({exc})")
                time.sleep(1)
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve_rank, args=(LineLink(conn), peer[0]), daemon=True).start()

    def _admit(self, hello: dict[str, Any] | None, peer_ip: str) -> tuple[int | None, str]:
        """Validate a hello; return (rank, "") or (None, reason)."""
        if not hello or not isinstance(hello.get("node_rank"), int):
            return None, "malformed hello"
        rank = hello["node_rank"]
        if rank not in self.expected:
            return None, f"node rank {rank} is not one of {sorted(self.expected)} (--nnodes differs?)"
        if hello.get("fingerprint") != self.fingerprint:
            theirs = hello.get("shared") or {}
            diffs = [
                f"{key}: rank0={self.shared.get(key)!r} rank{rank}={theirs.get(key)!r}"
                for key in sorted(set(self.shared) | set(theirs))
                if self.shared.get(key) != theirs.get(key)
            ]
            return None, "command line differs from rank 0: " + ("; ".join(diffs) or "fingerprint mismatch")
        if hello.get("host_ip") != peer_ip:
            claimed = hello.get("host_ip")
            Log.info(f"rendezvous: rank {rank} says VLLM_HOST_IP={claimed} but connects from {peer_ip}")
        with self._cond:
            if rank in self.lost:
                return None, f"rank {rank} was lost earlier; a vLLM head cannot re-admit it (restart rank 0)"
            if rank in self.joined:
                return None, f"rank {rank} has already joined from {self.joined[rank]}"
            self.joined[rank] = peer_ip
            self._cond.notify_all()
        return rank, ""

    def _serve_rank(self, link: LineLink, peer_ip: str) -> None:
        try:
            hello = link.recv(timeout=HELLO_TIMEOUT_S)
        except (TimeoutError, OSError, ValueError) as exc:
            Log.info(f"rendezvous: dropped connection from {peer_ip}: no valid hello ({exc!r})")
            link.close()
            return
        rank, reason = self._admit(hello, peer_ip)
        if rank is None:
            Log.error(f"rendezvous: rejected rank from {peer_ip}: {reason}")
            with contextlib.suppress(OSError):
                link.send({"ok": False, "reason": reason})
            link.close()
            return
        count = f"{len(self.joined)}/{len(self.expected)}"
        Log.info(f"rendezvous: headless rank {rank} joined from {peer_ip} ({count})")
        try:
            link.send({"ok": True, "fingerprint": self.fingerprint})
            why = keep_alive(link)
        except OSError as exc:
            why = f"connection error ({exc})"
        link.close()
        with self._cond:
            self.lost[rank] = why
        Log.error(f"headless rank {rank} lost: {why}; this head is now unhealthy")


def join_head(args: argparse.Namespace, host_ip: str, shared: dict[str, Any]) -> LineLink:
    """A headless rank's side: connect from VLLM_HOST_IP until rank 0 answers, then say hello."""
    target = (args.master_addr, args.master_port)
    hello = {
        "node_rank": args.node_rank,
        "host_ip": host_ip,
        "fingerprint": fingerprint(shared),
        "shared": shared,
    }
    last_note = 0.0
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host_ip, 0))
        except OSError as exc:
            sock.close()
            raise StartupError(f"cannot bind to VLLM_HOST_IP={host_ip}: {exc}") from exc
        sock.settimeout(3.0)
        try:
            sock.connect(target)
            break
        except OSError as exc:
            sock.close()
            if time.monotonic() - last_note > 10:
                Log.info(f"rendezvous: rank 0 at {target[0]}:{target[1]} not reachable yet ({exc}); retrying")
                last_note = time.monotonic()
            time.sleep(JOIN_RETRY_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    link = LineLink(sock)
    try:
        link.send(hello)
        reply = link.recv(timeout=HELLO_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        raise StartupError(f"rendezvous with rank 0 failed: {exc!r}") from exc
    if reply is None:
        raise StartupError("rank 0 closed the rendezvous connection without answering")
    if not reply.get("ok"):
        raise StartupError(f"rank 0 rejected this rank: {reply.get('reason')}")
    return link


# --------------------------------------------------------------------------------------------
# Answers: a deterministic function of the request
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One output token: its kind (reasoning, content, tool_name, tool_args) and text."""

    kind: str
    text: str


@dataclass
class Answer:
    """The planned output: one-token pieces, the natural finish reason, an optional tool call."""

    pieces: list[Piece]
    finish_reason: str = "stop"
    tool_name: str | None = None
    tool_call_id: str | None = None


def count_tokens(text: str) -> int:
    """The stand-in tokenizer: whitespace-separated words."""
    return len(text.split())


def split_pieces(text: str, kind: str) -> list[Piece]:
    """One piece per word, each keeping the whitespace before it, so pieces join back to text."""
    return [Piece(kind, match.group(0)) for match in re.finditer(r"\s*\S+", text)]


# An integer expression; \u00d7 and \u00f7 are the multiplication and division signs.
_ARITH = re.compile(r"(?<![\w.-])(\d+)(\s*)([-+*/\u00d7\u00f7])(\s*)(\d+)(?![\w.-])")
ARITH_MAX_WORDS = 40


def arithmetic(text: str, wrong: bool) -> str | None:
    """Answer a short question holding one integer expression ('What is 17 * 23?')."""
    if count_tokens(text) > ARITH_MAX_WORDS:
        return None
    for match in _ARITH.finditer(text):
        left, space_a, op, space_b, right = match.groups()
        if op == "-" and not (space_a and space_b):
            continue  # '3-4 sentences' is a range, not a subtraction
        a, b = int(left), int(right)
        op = {"\u00d7": "*", "\u00f7": "/"}.get(op, op)
        if op == "/" and b == 0:
            return f"{a} / {b} is undefined: division by zero."
        value = {"+": Fraction(a + b), "-": Fraction(a - b), "*": Fraction(a * b)}.get(op) or Fraction(a, b)
        if wrong:
            value += 1
        shown = str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
        return f"{a} {op} {b} = {shown}."
    return None


_CITY_CAPITALISED = re.compile(r"\b(?:in|at|for)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)")
_CITY_ANY = re.compile(r"\b(?:in|at|for)\s+([A-Za-z][\w'-]*)")


def extract_city(text: str) -> str:
    """The place a weather question is about: 'weather in Ho Chi Minh City today' -> that city."""
    after = text[text.lower().find("weather") :] if "weather" in text.lower() else text
    for pattern, scope in ((_CITY_CAPITALISED, after), (_CITY_CAPITALISED, text), (_CITY_ANY, after)):
        match = pattern.search(scope)
        if match:
            return match.group(1).title() if pattern is _CITY_ANY else match.group(1)
    return "unknown"


class _Lcg:
    """Tiny deterministic generator (not for security): same prompt, same filler text."""

    def __init__(self, seed: int):
        self.state = seed & 0xFFFFFFFF

    def pick(self, n: int) -> int:
        self.state = (1664525 * self.state + 1013904223) & 0xFFFFFFFF
        return (self.state >> 8) % n


_PROSE_TEXT = (
    "the cluster serves every request across two nodes while each rank holds half of the weights "
    "and tokens flow over the fabric link with steady latency so that long answers arrive in order "
    "because the scheduler keeps both streams busy without wasting memory on idle pages"
)
_PROSE_WORDS = tuple(_PROSE_TEXT.split())
_CODE_NAMES = ("route", "shard", "merge", "plan", "score", "batch", "probe", "gather")
_CODE_LINES = (
    "def {name}_{n}(items, limit={n}):",
    "    total = 0",
    "    for index, item in enumerate(items):",
    "        if index >= limit:",
    "            break",
    "        total += item * {n}",
    "    return total",
)
_CODE_HINT = re.compile(
    r"\b(code|function|python|program|implement|class|script|bash|rust|javascript)\b", re.I
)


def filler(prompt: str, tokens: int) -> str:
    """Deterministic open-ended text of exactly ``tokens`` words: code-like when asked for code."""
    rng = _Lcg(int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big"))
    words: list[str] = []
    if _CODE_HINT.search(prompt):
        while count_tokens(" ".join(words)) < tokens:
            name, n = _CODE_NAMES[rng.pick(len(_CODE_NAMES))], rng.pick(97) + 2
            words.append("\n".join(line.format(name=name, n=n) for line in _CODE_LINES) + "\n\n")
        text = "".join(words)
    else:
        sentence: list[str] = []
        while len(words) < tokens:
            sentence.append(_PROSE_WORDS[rng.pick(len(_PROSE_WORDS))])
            if len(sentence) >= 8 + rng.pick(7):
                sentence[0] = sentence[0].capitalize()
                sentence[-1] += "."
                words.extend(sentence)
                sentence = []
        text = " ".join(words)
    pieces = split_pieces(text, "content")[:tokens]
    return "".join(piece.text for piece in pieces).lstrip()


# --- PNG ---------------------------------------------------------------------------------------


def _unfilter(ftype: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    """Undo one PNG scanline filter (types 0-4)."""
    if ftype == 0:
        return line
    if ftype == 2:
        return bytes((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
    out = bytearray(line)
    if ftype == 1:
        for i in range(bpp, len(out)):
            out[i] = (out[i] + out[i - bpp]) & 0xFF
    elif ftype == 3:
        for i in range(len(out)):
            left = out[i - bpp] if i >= bpp else 0
            out[i] = (out[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif ftype == 4:
        for i in range(len(out)):
            a = out[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            out[i] = (out[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    else:
        raise ValueError(f"unknown PNG filter type {ftype}")
    return bytes(out)


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG to (width, height, bytes per pixel, rows)."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG")
    pos, header, idat = 8, None, []
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"IEND":
            break
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        raise ValueError(f"unsupported PNG (bit depth {depth}, colour type {colour}, interlace {interlace})")
    if width * height > 16_000_000:
        raise ValueError("PNG too large")
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    if len(raw) < height * (stride + 1):
        raise ValueError("truncated PNG data")
    rows, prev = [], bytes(stride)
    for y in range(height):
        start = y * (stride + 1)
        prev = _unfilter(raw[start], raw[start + 1 : start + 1 + stride], prev, bpp)
        rows.append(prev)
    return width, height, bpp, rows


def colour_name(r: int, g: int, b: int) -> str:
    """Name an sRGB colour coarsely (what a vision model would say)."""
    hue, sat, val = colorsys.rgb_to_hsv(r / 255, g / 255, b / 255)
    if val < 0.25:
        return "black"
    if sat < 0.25:
        return "white" if val > 0.8 else "gray"
    degrees = hue * 360
    for limit, name in ((15, "red"), (40, "orange"), (70, "yellow"), (160, "green"), (200, "cyan")):
        if degrees < limit:
            return name
    for limit, name in ((260, "blue"), (290, "purple"), (345, "magenta")):
        if degrees < limit:
            return name
    return "red"


def dominant_colours(png: bytes) -> tuple[str, str]:
    """Most frequent colour name in the left and in the right half (alpha over white)."""
    width, height, bpp, rows = decode_png(png)
    half = width // 2
    votes: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    step_y = max(1, height // 64)
    step_x = max(1, half // 64)
    for row in rows[::step_y]:
        for x in range(0, width, step_x):
            px = row[x * bpp : x * bpp + bpp]
            alpha = px[3] if bpp == 4 else 255
            rgb = [(c * alpha + 255 * (255 - alpha)) // 255 for c in px[:3]]
            votes[0 if x < half else 1][colour_name(*rgb)] += 1
    left = votes[0].most_common(1)[0][0] if votes[0] else "unknown"
    right = votes[1].most_common(1)[0][0] if votes[1] else "unknown"
    return left, right


# --- request interpretation --------------------------------------------------------------------


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [part for part in content if isinstance(part, dict)]
    return []


def message_text(message: dict[str, Any]) -> str:
    return " ".join(str(p.get("text", "")) for p in _parts(message.get("content")) if p.get("type") == "text")


def message_images(message: dict[str, Any]) -> list[str]:
    urls = []
    for part in _parts(message.get("content")):
        if part.get("type") == "image_url":
            image = part.get("image_url")
            urls.append(str(image.get("url", "") if isinstance(image, dict) else image))
    return urls


def chat_prompt_tokens(request: dict[str, Any]) -> int:
    """Words of every message (and tool call), 64 per image, plus words of the tool definitions."""
    total = 0
    for message in request.get("messages") or []:
        if isinstance(message, dict):
            total += count_tokens(message_text(message)) + IMAGE_PROMPT_TOKENS * len(message_images(message))
            if message.get("tool_calls"):
                total += count_tokens(json.dumps(message["tool_calls"]))
    if request.get("tools"):
        total += count_tokens(json.dumps(request["tools"]))
    return total


def thinking_enabled(request: dict[str, Any]) -> bool:
    kwargs = request.get("chat_template_kwargs") or {}
    return not (kwargs.get("thinking") is False or kwargs.get("enable_thinking") is False)


def image_answer(url: str, faults: frozenset[str]) -> str:
    prefix = "data:image/png;base64,"
    if not url.startswith(prefix):
        raise RequestError(
            400, "stand-in engine: only data:image/png;base64 image URLs are supported", param="image_url"
        )
    try:
        left, right = dominant_colours(base64.b64decode(url[len(prefix) :], validate=False))
    except (ValueError, binascii.Error, zlib.error, struct.error) as exc:
        raise RequestError(400, f"stand-in engine: cannot decode the PNG: {exc}", param="image_url") from exc
    if "swap_colors" in faults:
        left, right = right, left
    return f"The left half is {left} and the right half is {right}."


def _tool_name(tool: Any) -> str:
    return str((tool.get("function") or {}).get("name", "")) if isinstance(tool, dict) else ""


def _tool_call_answer(tool: dict[str, Any], prompt: str, seed: str, wrong_city: bool = False) -> Answer:
    """Call ``tool`` with the place named in the prompt (another with ``wrong_city``), in the
    parameter the schema offers."""
    props = ((tool.get("function") or {}).get("parameters") or {}).get("properties") or {}
    key = "location" if "location" in props and "city" not in props else "city"
    city = extract_city(prompt)
    if wrong_city:
        city = next(other for other in WRONG_CITIES if other.lower() != city.lower())
    arguments = json.dumps({key: city})
    name = _tool_name(tool)
    pieces = [Piece("tool_name", name), *split_pieces(arguments, "tool_args")]
    call_id = "chatcmpl-tool-" + hashlib.sha256(seed.encode()).hexdigest()[:24]
    return Answer(pieces, finish_reason="tool_calls", tool_name=name, tool_call_id=call_id)


class Planner:
    """Turns a validated request into an Answer; all choices are a function of the request."""

    def __init__(self, args: argparse.Namespace, settings: Settings):
        self.args = args
        self.settings = settings

    def chat(self, request: dict[str, Any]) -> Answer:
        messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
        if not messages:
            raise RequestError(400, "messages must be a non-empty list", param="messages")
        self._check_images(messages)
        answer = self._chat_content(request, messages)
        user = next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")
        wants_reasoning = self.args.reasoning_parser and thinking_enabled(request)
        if wants_reasoning and "no_reasoning" not in self.settings.faults:
            gist = " ".join(user.split()[:8]) or "this conversation"
            reasoning = f"The user asks: {gist}. I will answer directly and check the result."
            answer.pieces = split_pieces(reasoning, "reasoning") + answer.pieces
        return answer

    def completion(self, prompt_text: str) -> Answer:
        text = arithmetic(prompt_text, "wrong_math" in self.settings.faults)
        text = text or filler(prompt_text, self.settings.output_tokens)
        return Answer(split_pieces(" " + text, "content"))

    def _check_images(self, messages: list[dict[str, Any]]) -> None:
        limit = (self.args.limit_mm_per_prompt or {}).get("image")
        count = sum(len(message_images(m)) for m in messages)
        if limit is not None and count > limit:
            raise RequestError(400, f"At most {limit} image(s) may be provided in one prompt.")

    def _chat_content(self, request: dict[str, Any], messages: list[dict[str, Any]]) -> Answer:
        last = messages[-1]
        faults = self.settings.faults
        if last.get("role") == "tool":
            result = " ".join(message_text(last).split()[:30])
            return Answer(split_pieces(f"The tool returned: {result}", "content"))
        user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        prompt = message_text(user)
        images = message_images(user)
        if images:
            return Answer(split_pieces(image_answer(images[-1], faults), "content"))
        tool = self._tool_to_call(request, prompt)
        if tool is not None:
            seed = json.dumps(messages, sort_keys=True)
            return _tool_call_answer(tool, prompt, seed, wrong_city="wrong_city" in faults)
        if "weather" in prompt.lower() and request.get("tools") and "no_tool_call" in faults:
            return Answer(split_pieces("I cannot look up the weather right now.", "content"))
        text = arithmetic(prompt, "wrong_math" in faults) or filler(prompt, self.settings.output_tokens)
        return Answer(split_pieces(text, "content"))

    def _tool_to_call(self, request: dict[str, Any], prompt: str) -> dict[str, Any] | None:
        """vLLM's tool_choice rules, with 'the model decides' = a weather tool for a weather question."""
        tools = [t for t in request.get("tools") or [] if isinstance(t, dict)]
        choice = request.get("tool_choice") or ("auto" if tools else "none")
        if not tools or choice == "none":
            return None
        if choice == "auto" and not (self.args.enable_auto_tool_choice and self.args.tool_call_parser):
            raise RequestError(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        weather = next((t for t in tools if "weather" in _tool_name(t).lower()), None)
        if isinstance(choice, dict):
            wanted = str((choice.get("function") or {}).get("name", ""))
            forced = next((t for t in tools if _tool_name(t) == wanted), None)
            if forced is None:
                raise RequestError(400, f"tool_choice names unknown tool {wanted!r}", param="tool_choice")
            return forced
        if choice == "required":
            return weather if weather is not None and "weather" in prompt.lower() else tools[0]
        if weather is not None and "weather" in prompt.lower() and "no_tool_call" not in self.settings.faults:
            return weather
        return None


# --------------------------------------------------------------------------------------------
# HTTP API
# --------------------------------------------------------------------------------------------


class RequestLog:
    """One JSON line per request (never the API key), for tests that inspect what clients send."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._broken = False

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        with self._lock:
            try:
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError as exc:
                if not self._broken:
                    Log.error(f"STANDIN_REQUEST_LOG={self.path} not writable ({exc}); request log disabled")
                self._broken = True


@dataclass
class Engine:
    """Everything request handlers share."""

    args: argparse.Namespace
    settings: Settings
    api_key: str | None
    problem: Callable[[], str | None]
    request_log: RequestLog
    planner: Planner = field(init=False)
    slots: threading.BoundedSemaphore = field(init=False)
    model_names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.planner = Planner(self.args, self.settings)
        self.slots = threading.BoundedSemaphore(max(1, self.args.max_num_seqs))
        self.model_names = self.args.served_model_name or [self.args.model_path]


class ClientGone(Exception):
    """The client closed the connection while we were still sending."""


class StandinHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], engine: Engine):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.engine = engine
        super().__init__(address, Handler)


def _error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def _limit_from(request: dict[str, Any]) -> int | None:
    """vLLM: max_completion_tokens wins over the legacy max_tokens."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RequestError(400, f"{key} must be an integer >= 1, got {value!r}", param=key)
            return value
    return None


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


def completion_prompt(request: dict[str, Any]) -> tuple[str, int]:
    """(text, token count) of a /v1/completions prompt: a string, or a list of token ids."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return "", len(prompt)
    raise RequestError(400, "prompt must be one string or one list of token ids", param="prompt")


class Handler(BaseHTTPRequestHandler):
    """The OpenAI-compatible routes of a vLLM head."""

    protocol_version = "HTTP/1.1"
    server_version = "vllm-standin/" + STANDIN_VERSION
    server: StandinHTTPServer

    # --- plumbing --------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle delay per token

    def log_message(self, format: str, *args: Any) -> None:
        Log.info(f"{self.client_address[0]} {format % args}")

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        self._send_json(status, _error_body(status, message, err_type, param))

    def _write_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ClientGone from exc

    def _sse(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self._write_chunk(f"data: {text}\n\n".encode())

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # --- routing ---------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._status = 0
        path = urlsplit(self.path).path
        record: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "method": method,
            "path": path,
            "user_agent": self.headers.get("User-Agent"),
        }
        try:
            # Drain the body first: an early 401/404 must not leave it on a keep-alive connection.
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else b""
            self._route(method, path, raw, record)
        except RequestError as exc:
            record["error"] = str(exc)
            self._send_error(exc.status, str(exc), exc.err_type, exc.param)
        except ClientGone:
            record["error"] = "client closed the connection"
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a stand-in bug must answer 500, not silently drop the connection
            Log.error(f"{method} {path}: internal error {exc!r}")
            record["error"] = repr(exc)
            if self._status == 0:
                self._send_error(500, f"stand-in internal error: {exc!r}", "InternalServerError")
            self.close_connection = True
        finally:
            record["status"] = self._status
            self.server.engine.request_log.write(record)

    def _route(self, method: str, path: str, raw: bytes, record: dict[str, Any]) -> None:
        engine = self.server.engine
        routes = {"/health": "GET", "/version": "GET", "/v1/models": "GET"}
        routes |= {"/v1/chat/completions": "POST", "/v1/completions": "POST"}
        if raw:  # record what was sent, even when it is refused
            with contextlib.suppress(RequestError):
                self._note_request(_json_body(raw), record)
        if path.startswith("/v1") and not self._authorised(record):
            raise RequestError(401, "Unauthorized: missing or invalid bearer token", "AuthenticationError")
        if path not in routes:
            raise RequestError(404, f"Not Found: {path}", "NotFoundError")
        if routes[path] != method:
            raise RequestError(405, "Method Not Allowed", "MethodNotAllowed")
        if path == "/health":
            problem = engine.problem()
            if problem:
                raise RequestError(503, problem, "ServiceUnavailableError")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/version":
            self._send_json(200, {"version": STANDIN_VERSION})
        elif path == "/v1/models":
            self._send_json(200, self._models())
        else:
            self._completion(path, _json_body(raw), record)

    def _authorised(self, record: dict[str, Any]) -> bool:
        key = self.server.engine.api_key
        header = self.headers.get("Authorization", "")
        record["bearer_present"] = header.startswith("Bearer ")
        if not key:
            record["bearer_matched"] = None
            return True
        matched = hmac.compare_digest(header.encode(), f"Bearer {key}".encode())
        record["bearer_matched"] = matched
        return matched

    @staticmethod
    def _note_request(body: dict[str, Any], record: dict[str, Any]) -> None:
        """What a client sent, for the request log (the prompt itself is left out)."""
        record.update(
            {
                "model": body.get("model"),
                "stream": body.get("stream"),
                "stream_options": body.get("stream_options"),
                "max_tokens_present": "max_tokens" in body,
                "max_tokens": body.get("max_tokens"),
                "max_completion_tokens_present": "max_completion_tokens" in body,
                "max_completion_tokens": body.get("max_completion_tokens"),
                "tools": [_tool_name(t) for t in body.get("tools") or []],
                "tool_choice": body.get("tool_choice"),
                "reasoning_effort": body.get("reasoning_effort"),
                "chat_template_kwargs": body.get("chat_template_kwargs"),
            }
        )

    def _models(self) -> dict[str, Any]:
        engine = self.server.engine
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": engine.args.model_path,
                "parent": None,
                "max_model_len": engine.args.max_model_len,
            }
            for name in engine.model_names
        ]
        return {"object": "list", "data": data}

    # --- completions -----------------------------------------------------------------------

    def _completion(self, path: str, body: dict[str, Any], record: dict[str, Any]) -> None:
        engine = self.server.engine
        problem = engine.problem()
        if problem:
            raise RequestError(503, f"engine unavailable: {problem}", "ServiceUnavailableError")
        model = body.get("model")
        if model is not None and model not in engine.model_names:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        chat = path == "/v1/chat/completions"
        if chat:
            prompt_tokens = chat_prompt_tokens(body)
            answer = engine.planner.chat(body)
        else:
            text, prompt_tokens = completion_prompt(body)
            answer = engine.planner.completion(text)
        self._fit(answer, body, prompt_tokens)
        record.update(prompt_tokens=prompt_tokens, completion_tokens=len(answer.pieces))
        record["finish_reason"] = answer.finish_reason
        job = Job(
            chat=chat, model=str(model or engine.model_names[0]), answer=answer, prompt_tokens=prompt_tokens
        )
        received = time.monotonic()
        with engine.slots:  # --max-num-seqs: further requests queue, as in vLLM's scheduler
            schedule = job.schedule(engine.settings)
            if body.get("stream"):
                self._stream(job, schedule, body)
            else:
                for _ in schedule:
                    pass
                self._send_json(200, job.full_response(self._usage(job)))
        Log.info(
            f"{path} {'stream' if body.get('stream') else 'full'}: prompt {prompt_tokens} tokens, "
            f"completion {len(answer.pieces)} tokens, finish {answer.finish_reason}, "
            f"{time.monotonic() - received:.2f} s"
        )

    def _fit(self, answer: Answer, body: dict[str, Any], prompt_tokens: int) -> None:
        """Apply max_model_len, max_tokens, min_tokens and ignore_eos the way vLLM does."""
        max_len = self.server.engine.args.max_model_len
        limit = _limit_from(body)
        if prompt_tokens >= max_len or (limit is not None and prompt_tokens + limit > max_len):
            raise RequestError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{prompt_tokens + (limit or 0)} tokens ({prompt_tokens} in the messages, {limit or 0} in "
                "the completion). Please reduce the length of the messages or completion.",
            )
        cap = limit if limit is not None else max_len - prompt_tokens
        wanted = int(body.get("min_tokens") or 0)
        if body.get("ignore_eos") and limit is not None:
            wanted = limit
        if wanted > len(answer.pieces) and answer.pieces[-1].kind == "content":  # tool calls do not grow
            answer.pieces += split_pieces(" " + filler("more", wanted - len(answer.pieces)), "content")
        if len(answer.pieces) > cap:
            answer.pieces = answer.pieces[:cap]
            answer.finish_reason = "length"

    def _usage(self, job: Job) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": len(job.answer.pieces),
            "total_tokens": job.prompt_tokens + len(job.answer.pieces),
        }
        if self.server.engine.args.enable_prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def _stream(self, job: Job, schedule: Iterator[int], body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in schedule:
            if index == 0 and job.chat:
                self._sse(job.chunk({"role": "assistant", "content": ""}, None))
            self._sse(job.piece_chunk(index))
        options = body.get("stream_options") or {}
        if self.server.engine.args.enable_force_include_usage or options.get("include_usage"):
            self._sse(job.envelope([], usage=self._usage(job)))
        self._sse("[DONE]")
        self._write_chunk(b"")  # the zero-length chunk ends the chunked body


@dataclass
class Job:
    """One generation: its answer, its timing, and its OpenAI wire format."""

    chat: bool
    model: str
    answer: Answer
    prompt_tokens: int
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def schedule(self, settings: Settings) -> Iterator[int]:
        """Yield token indexes at t_first + i / decode_rate on an absolute clock (no drift)."""
        start = time.monotonic()
        first = start + self.prompt_tokens / settings.prefill_tps
        for index in range(len(self.answer.pieces)):
            delay = first + index / settings.decode_tps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            yield index

    def envelope(
        self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None, final: bool = False
    ) -> dict[str, Any]:
        """The response object around choices: a stream chunk, or (final) a whole response."""
        prefix, obj = ("chatcmpl-", "chat.completion" if final else "chat.completion.chunk")
        if not self.chat:
            prefix, obj = ("cmpl-", "text_completion")
        body: dict[str, Any] = {
            "id": prefix + self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return body

    def chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self.envelope([choice])

    def piece_chunk(self, index: int) -> dict[str, Any]:
        piece = self.answer.pieces[index]
        finish = self.answer.finish_reason if index == len(self.answer.pieces) - 1 else None
        if not self.chat:
            choice = {
                "index": 0,
                "text": piece.text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return self.envelope([choice])
        if piece.kind == "reasoning":
            return self.chunk({"reasoning_content": piece.text}, finish)
        if piece.kind == "tool_name":
            function = {"name": piece.text, "arguments": ""}
            call = {"index": 0, "id": self.answer.tool_call_id, "type": "function", "function": function}
            return self.chunk({"tool_calls": [call]}, finish)
        if piece.kind == "tool_args":
            return self.chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece.text}}]}, finish)
        return self.chunk({"content": piece.text}, finish)

    def _joined(self, kind: str) -> str:
        return "".join(p.text for p in self.answer.pieces if p.kind == kind)

    def full_response(self, usage: dict[str, Any]) -> dict[str, Any]:
        finish = self.answer.finish_reason
        if not self.chat:
            text = self._joined("content")
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return self.envelope([choice], usage=usage, final=True)
        tool_calls = []
        if self.answer.tool_name and any(p.kind == "tool_name" for p in self.answer.pieces):
            function = {"name": self.answer.tool_name, "arguments": self._joined("tool_args")}
            tool_calls.append({"id": self.answer.tool_call_id, "type": "function", "function": function})
        message = {
            "role": "assistant",
            "content": self._joined("content") or None,
            "reasoning_content": self._joined("reasoning") or None,
            "tool_calls": tool_calls,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        return self.envelope([choice], usage=usage, final=True)


# --------------------------------------------------------------------------------------------
# Start-up
# --------------------------------------------------------------------------------------------


def _redacted(args: argparse.Namespace) -> dict[str, Any]:
    config = dict(vars(args))
    if config.get("api_key"):
        config["api_key"] = "<redacted>"
    return config


def run_head(args: argparse.Namespace, settings: Settings, env: dict[str, str]) -> int:
    """Rank 0: rendezvous with every headless rank, then (and only then) serve HTTP."""
    rendezvous: HeadRendezvous | None = None
    if args.nnodes > 1:
        rendezvous = HeadRendezvous(args.master_addr, args.master_port, args.nnodes, shared_args(args))
        rendezvous.start()
        rendezvous.wait_all()
    if settings.boot_seconds:
        Log.info(f"simulating {settings.boot_seconds:g} s of model loading (STANDIN_BOOT_SECONDS)")
        time.sleep(settings.boot_seconds)
    api_key = args.api_key or env.get("VLLM_API_KEY") or None
    if not api_key:
        Log.info("no VLLM_API_KEY and no --api-key: the API accepts requests without a bearer token")
    engine = Engine(
        args=args,
        settings=settings,
        api_key=api_key,
        problem=rendezvous.problem if rendezvous else lambda: None,
        request_log=RequestLog(settings.request_log),
    )
    try:
        server = StandinHTTPServer((args.host, args.port), engine)
    except OSError as exc:
        raise StartupError(f"cannot serve on --host {args.host} --port {args.port}: {exc}") from exc
    Log.info(f"API ready on http://{args.host}:{args.port}/v1 (model {engine.model_names[0]!r})")
    server.serve_forever()
    return 0


def run_worker(args: argparse.Namespace, host_ip: str) -> int:
    """A headless rank: join rank 0 and live exactly as long as that link does."""
    link = join_head(args, host_ip, shared_args(args))
    Log.info(f"joined rank 0 at {args.master_addr}:{args.master_port} as headless rank {args.node_rank}")
    why = keep_alive(link)
    Log.error(f"lost rank 0: {why}; exiting like a dead vLLM worker")
    return 1


def _install_signal_handlers() -> None:
    """As PID 1 in a container, SIGTERM would be ignored without a handler (docker stop hangs)."""

    def stop(signum: int, _frame: object) -> None:
        Log.info(f"received {signal.Signals(signum).name}; shutting down")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2, --help exits 0
    Log.tag = f"r{args.node_rank}"
    _install_signal_handlers()
    env = dict(os.environ)
    try:
        check_consistency(args)
        facts = check_environment(args, env)
        settings = Settings.from_env(env, facts.cache_dir)
        Log.info("config " + json.dumps(_redacted(args), sort_keys=True))
        Log.info(
            f"STAND-IN engine {STANDIN_VERSION}: model {(args.served_model_name or [args.model_path])[0]!r} "
            f"port {args.port} tp {args.tensor_parallel_size} nnodes {args.nnodes} rank {args.node_rank}"
            f"{' (headless)' if args.headless else ''} ip {facts.host_ip} if {facts.ifname}; "
            f"decode {settings.decode_tps:g} tok/s prefill {settings.prefill_tps:g} tok/s "
            f"output {settings.output_tokens} faults {','.join(sorted(settings.faults)) or 'none'}"
        )
        if args.node_rank == 0:
            return run_head(args, settings, env)
        return run_worker(args, facts.host_ip)
    except StartupError as exc:
        Log.error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
