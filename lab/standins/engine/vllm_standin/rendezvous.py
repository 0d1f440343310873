"""The TCP rendezvous between rank 0 and the headless ranks, and their heartbeats.

Rank 0 admits exactly the expected headless ranks whose arguments match its own (compared by a
fingerprint of every argument except rank identity and the head-only API flags). Afterwards, as
vLLM 0.32 behaves (measured on its CPU build): a headless rank that goes silent with its link still
open (SIGSTOP, or stuck like a rank in a collective) freezes the engine, which waits for it; one
whose link closes (killed) leaves rank 0 with a dead engine core.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import StartupError
from .log import Log

# Rendezvous link timing: a heartbeat every second, a peer silent for 5 s is gone.
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 5.0
# Rank 0: a headless rank silent this long (two heartbeats missed) with its link open is frozen.
FREEZE_AFTER_S = 2.0
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
        "allowed_media_domains",
    }
)


def shared_args(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments every rank must agree on (all but rank identity and head-only flags)."""
    return {key: value for key, value in sorted(vars(args).items()) if key not in HEAD_ONLY_ARGS}


def fingerprint(shared: dict[str, Any]) -> str:
    """Short digest of the shared arguments, exchanged at rendezvous."""
    blob = json.dumps(shared, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


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


def stuck_forever() -> None:
    """A headless rank under ``hang``: like a rank stuck in an NCCL collective, it neither sends
    nor reads on its link (left open) and never notices rank 0 going away; only a signal ends it."""
    Log.error("hang: heartbeats to rank 0 stopped; the link stays open and unread, the process stays up")
    while True:
        time.sleep(3600)  # time.sleep, not a lock wait: the SIGTERM handler must still run


def keep_alive(link: LineLink, hung: threading.Event | None = None) -> str:
    """Exchange heartbeats until the link dies; return why it died (never returns once ``hung``)."""
    last_seen = time.monotonic()
    next_send = 0.0
    while True:
        if hung is not None and hung.is_set():
            stuck_forever()
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
        self.silent: dict[int, float] = {}  # rank -> when it was last heard, while it is silent
        self.on_freeze: Callable[[bool], None] = lambda frozen: None  # the engine, once it serves
        self._cond = threading.Condition()

    def start(self) -> None:
        # As torch's TCPStore under vLLM 0.32 (measured on the real-engine lab): the head listens on
        # every interface, whatever --master-addr names; the address must still be one of its own.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as own_address:
                own_address.bind((self.addr, 0))
            listener.bind(("", self.port))
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

    def dead(self) -> str | None:
        """Why the engine core is dead (a headless rank's link closed), None while it is not."""
        with self._cond:
            if not self.lost:
                return None
            return "; ".join(f"headless rank {rank} lost: {why}" for rank, why in sorted(self.lost.items()))

    def frozen(self) -> str | None:
        """Why the engine waits (a headless rank silent, its link open), None while it does not."""
        with self._cond:
            if not self.silent:
                return None
            return "; ".join(
                f"headless rank {rank} silent since {time.strftime('%H:%M:%S', time.localtime(when))}"
                for rank, when in sorted(self.silent.items())
            )

    def _set_silent(self, rank: int, silent: bool, last_heard: float) -> None:
        with self._cond:
            if silent:
                self.silent[rank] = last_heard
            else:
                self.silent.pop(rank, None)
            frozen = bool(self.silent)
        self.on_freeze(frozen)

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
            why = self._watch_rank(rank, link)
        except OSError as exc:
            why = f"connection error ({exc})"
        link.close()
        with self._cond:
            self.lost[rank] = why
        self._set_silent(rank, False, time.time())
        Log.error(
            f"headless rank {rank} lost: {why}; the engine core is dead: /health stays 200 until the next"
            " request, which gets HTTP 500 (EngineCore encountered an issue), then this server exits"
        )

    def _watch_rank(self, rank: int, link: LineLink) -> str:
        """Heartbeats with one headless rank until its link closes; return why it closed.

        A rank that stops sending with its link open is not lost: like vLLM's engine, which waits
        in its collectives for a frozen rank, rank 0 waits for it (the engine is frozen) and goes
        on when it speaks again (SIGCONT)."""
        last_seen = time.monotonic()
        next_send = 0.0
        silent = False
        while True:
            now = time.monotonic()
            if now >= next_send:
                link.send({"hb": round(time.time(), 3)})  # OSError: the caller's connection error
                next_send = now + HEARTBEAT_INTERVAL_S
            try:
                message = link.recv(timeout=max(0.05, next_send - time.monotonic()))
            except TimeoutError:
                quiet = time.monotonic() - last_seen
                if not silent and quiet > FREEZE_AFTER_S:
                    silent = True
                    Log.error(
                        f"headless rank {rank} silent for {quiet:.0f} s with its link open: the engine waits"
                        " for it (frozen; /health stays 200, /metrics keeps its last values)"
                    )
                    self._set_silent(rank, True, time.time() - quiet)
                continue
            except ValueError as exc:
                return f"connection error ({exc})"
            if message is None:
                return "connection closed"
            last_seen = time.monotonic()
            if silent:
                silent = False
                Log.info(f"headless rank {rank} is back: the engine goes on")
                self._set_silent(rank, False, time.time())


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
