"""Helpers for the lab stand-in tests: the reference command line, tiny PNGs, real processes.

The reference command line itself lives in ``tests/reference_config.py``. The stand-in engine is
the package ``lab/standins/engine/vllm_standin``; ``standin_command`` runs it the way the
``vllm`` launcher does (``python3 -m vllm_standin`` with the engine directory on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reference_config import reference_vllm_argv, reference_vllm_env

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO_ROOT / "lab" / "standins" / "engine"
STANDIN = ENGINE_DIR / "vllm_standin"  # the package; ENGINE_DIR is what goes on PYTHONPATH
STANDIN_MODULE = STANDIN.name


def standin_command(*args: str) -> list[str]:
    """The stand-in's ``vllm`` command line, as the launcher runs it: ``python3 -m vllm_standin``."""
    return [sys.executable, "-m", STANDIN_MODULE, *args]


def standin_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ENGINE_DIR first on PYTHONPATH, as the launcher sets it."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINE_DIR), env.get("PYTHONPATH")]))
    return env


# --- tiny PNG encoder (all five filter types), so vision tests need no imaging library ---------


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _filter_row(ftype: int, row: bytes, prev: bytes, bpp: int) -> bytes:
    def left(i: int) -> int:
        return row[i - bpp] if i >= bpp else 0

    def upper_left(i: int) -> int:
        return prev[i - bpp] if i >= bpp else 0

    predictors: dict[int, Callable[[int], int]] = {
        0: lambda i: 0,
        1: left,
        2: lambda i: prev[i],
        3: lambda i: (left(i) + prev[i]) >> 1,
        4: lambda i: _paeth(left(i), prev[i], upper_left(i)),
    }
    predict = predictors[ftype]
    return bytes([ftype]) + bytes((row[i] - predict(i)) & 0xFF for i in range(len(row)))


def encode_png(rows: list[bytes], width: int, alpha: bool = False, filters: tuple[int, ...] = (0,)) -> bytes:
    """PNG of 8-bit RGB(A) rows; row y uses filter ``filters[y % len(filters)]``."""
    bpp = 4 if alpha else 3
    prev = bytes(width * bpp)
    raw = b""
    for y, row in enumerate(rows):
        raw += _filter_row(filters[y % len(filters)], row, prev, bpp)
        prev = row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, len(rows), 8, 6 if alpha else 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def halves_png(
    left: tuple[int, int, int], right: tuple[int, int, int], width: int = 64, height: int = 32
) -> bytes:
    """An image whose left half is one colour and right half another (the smoke test's picture)."""
    row = bytes(left) * (width // 2) + bytes(right) * (width - width // 2)
    return encode_png([row] * height, width, filters=(0, 1, 2, 3, 4))


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_node_files(root: Path) -> dict[str, Path]:
    """A tiny checkpoint with the real layout, a rewritten EXL3 plan copy and a cache dir."""
    model = root / "model"
    exl3 = model / "exl3"
    for bank in ("qn", "q31", "q31s", "plan"):
        (exl3 / bank).mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "deepseek_v41"}')
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    for shard in shards:
        (model / shard).write_bytes(b"\0" * 16)
    weight_map = {"embed.weight": shards[0], "head.weight": shards[1]}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    plans = root / "plans"
    plans.mkdir()
    plan = plans / "J268-ho-v31-K5n.json"
    plan.write_text(json.dumps({"qdir": ":".join(str(exl3 / b) for b in ("qn", "q31", "q31s")), "k": 5}))
    return {"model": model, "plan": plan, "cache": root / "cache"}


def node_env(files: dict[str, Path], **overrides: str) -> dict[str, str]:
    """Process environment of one loopback 'node': the reference env pointed at tmp files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "VLLM_"))}
    env |= reference_vllm_env("lo", "127.0.0.1")
    env |= {"XDG_CACHE_HOME": str(files["cache"]), "ST_EXL3_PLAN": str(files["plan"])}
    env |= overrides
    return env


@dataclass
class Rank:
    """One stand-in process; stderr goes to a file so a chatty rank never blocks on a pipe."""

    proc: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]
    port: int | None = None

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def health(self) -> int | None:
        """Status of GET /health, or None while nothing listens."""
        try:
            with urllib.request.urlopen(self.url("/health"), timeout=2) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def wait_healthy(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"rank exited {self.proc.returncode}:\n{self.stderr()}")
            if self.health() == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"not healthy after {timeout} s:\n{self.stderr()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


API_KEY = "lab-test-key-0123456789abcdef"


def start_cluster(
    start_rank: Callable[..., Rank],
    root: Path,
    *,
    nnodes: int = 2,
    settings: dict[str, str] | None = None,
    head_extra: tuple[str, ...] = (),
    head_first: bool = False,
    key: str | None = API_KEY,
) -> list[Rank]:
    """Start the reference command line on loopback; return [rank 0, rank 1, ...] (not yet waited)."""
    files = make_node_files(root)
    port, master_port = free_port(), free_port()
    ranks: dict[int, Rank] = {}
    order = list(range(nnodes)) if head_first else [*range(1, nnodes), 0]
    for rank in order:
        cache = {"cache": files["cache"] / f"node{rank}"}
        env = node_env(files | cache, **(settings or {}))
        if rank == 0 and key:
            env["VLLM_API_KEY"] = key
        argv = reference_vllm_argv(
            rank, nnodes, port=port, master_port=master_port, model=str(files["model"]), extra=head_extra
        )
        ranks[rank] = start_rank(argv, env, port if rank == 0 else None)
    return [ranks[i] for i in range(nnodes)]
