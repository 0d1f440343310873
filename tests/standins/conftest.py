"""Fixtures of the lab stand-in tests (helpers live in ``standin_support``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest
from standin_support import (
    ENGINE_DIR,
    Rank,
    reference_vllm_argv,
    reference_vllm_env,
    standin_command,
    standin_env,
)

# The tests that call the stand-in's functions directly import its package from the checkout.
if str(ENGINE_DIR) not in sys.path:
    sys.path.insert(0, str(ENGINE_DIR))


@pytest.fixture
def reference_argv() -> Callable[..., list[str]]:
    """``reference_argv(rank, nnodes=2, master_ip=..., port=..., master_port=..., model=..., extra=())``."""
    return reference_vllm_argv


@pytest.fixture
def reference_env() -> Callable[..., dict[str, str]]:
    """``reference_env(ifname, ip, hcas=...)``: the reference container environment of one node."""
    return reference_vllm_env


@pytest.fixture(scope="module")
def start_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Rank]]:
    """``start_rank(argv, env, port=None)`` -> Rank; every rank is stopped after the module."""
    started: list[Rank] = []
    logs = tmp_path_factory.mktemp("rank-logs")

    def start(argv: list[str], env: dict[str, str], port: int | None = None) -> Rank:
        log = logs / f"rank-{len(started)}.log"
        with log.open("wb") as handle:
            # As the image's entrypoint does: `vllm serve` before the container's arguments.
            proc = subprocess.Popen(standin_command("serve", *argv), env=standin_env(env), stderr=handle)
        rank = Rank(proc, log, env, port)
        started.append(rank)
        return rank

    yield start
    for rank in started:
        rank.stop()
