# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Fabric acceptance: the collectives the ranks will run, timed between every node.

Run by the rank role inside the serving image, one process per node, with the ranks' own
environment (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, GLOO_SOCKET_IFNAME, ...): the same torch, the same
NCCL and the same interfaces as the engine, before the engine's long boot. For each collective
(all_reduce, all_gather) and each size it times ``--iters`` operations after ``--warmup`` ones,
checks the result, and computes the bus bandwidth as nccl-tests does
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): all_reduce
``busbw = algbw * 2(n-1)/n``, all_gather ``busbw = algbw * (n-1)/n`` where the size is the
gathered (output) bytes. Times are the slowest rank's.

Rank 0 prints one JSON object on stdout: the figures per size, torch's and NCCL's versions. Every
rank prints progress on stderr. A failure prints ``{"error": ...}`` on stdout and exits non-zero;
a collective that does not finish within ``--timeout`` seconds ends the process (a lost peer
must not hold the node). Nothing is left behind: the container runs with ``--rm``.

Needs torch (the serving image has it); stdlib otherwise. Imported by the unit tests for the
arithmetic without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

COLLECTIVES = ("all_reduce", "all_gather")
# float32: 4 bytes per element, as nccl-tests' default.
ELEMENT_BYTES = 4
# The environment a Spark owner needs to see when the fabric is the problem.
FABRIC_ENV = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_DISABLE",
    "NCCL_NET_PLUGIN",
)
EXIT_FAILED = 2
EXIT_TIMED_OUT = 3


def bus_bandwidth(collective: str, size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes, as nccl-tests) of one operation of ``size_bytes``."""
    if seconds <= 0:
        raise ValueError(f"a time must be positive, got {seconds}")
    if world_size < 2:
        raise ValueError(f"a collective between nodes needs two ranks at least, got {world_size}")
    algbw = size_bytes / seconds / 1e9
    if collective == "all_reduce":
        factor = 2 * (world_size - 1) / world_size
    elif collective == "all_gather":
        factor = (world_size - 1) / world_size
    else:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    return algbw, algbw * factor


def sizes_up_to(min_bytes: int, max_bytes: int, world_size: int) -> list[int]:
    """Doubling sizes from ``min_bytes`` to ``max_bytes``, each a whole number of float32 elements
    per rank (an all_gather splits the size between the ranks)."""
    quantum = ELEMENT_BYTES * world_size
    if min_bytes < quantum or max_bytes < min_bytes:
        raise ValueError(f"sizes need {quantum} <= min ({min_bytes}) <= max ({max_bytes})")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size - size % quantum)
        size *= 2
    return sizes


def bytes_needed(max_bytes: int, world_size: int) -> int:
    """The buffers the largest size takes on one rank: all_gather's input (its share) and output,
    more than all_reduce's one tensor (never both collectives at once)."""
    return max_bytes + max_bytes // world_size


def mem_available(meminfo: str) -> int | None:
    """MemAvailable in bytes from /proc/meminfo's text (None if absent)."""
    for line in meminfo.splitlines():
        name, _colon, value = line.partition(":")
        if name == "MemAvailable":
            return int(value.split()[0]) * 1024
    return None


def fabric_environment(environ: dict[str, str]) -> dict[str, str]:
    """The fabric variables in effect, for the report and the error message."""
    return {name: environ[name] for name in FABRIC_ENV if name in environ}


def describe_failure(error: BaseException, environ: dict[str, str]) -> str:
    """One message for a failed set-up or collective, with the variables that choose the fabric."""
    settings = ", ".join(f"{name}={value}" for name, value in fabric_environment(environ).items())
    text = " ".join(str(error).split()) or type(error).__name__
    # torch appends its C++ backtrace to a store's error: the cause is before it, never in the frames
    # (measured on NCCL 2.28.9: a peer of a rank that failed its bootstrap).
    text = text.split(" Exception raised from ", 1)[0]
    return f"{type(error).__name__}: {text[:1500]} (fabric settings: {settings or 'none set'})"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-addr", required=True, help="rank 0's fabric address")
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--min-bytes", type=int, default=1 << 20)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole test")
    parser.add_argument("--meminfo", default="/proc/meminfo")
    args = parser.parse_args(argv)
    if args.max_bytes > 1 << 30:
        parser.error("--max-bytes is at most 1 GiB: larger buffers froze Sparks (unified memory)")
    if not 0 <= args.rank < args.world_size:
        parser.error(f"--rank {args.rank} is not in 0..{args.world_size - 1}")
    return args


def check_memory(args: argparse.Namespace) -> None:
    """Refuse before allocating what the node does not have to spare (a Spark's GPU memory is its
    RAM: running it out wedges the host)."""
    try:
        with open(args.meminfo, encoding="ascii") as handle:
            available = mem_available(handle.read())
    except OSError:
        available = None
    # Twice the buffers: the collective's own staging besides the tensors.
    needed = 2 * bytes_needed(args.max_bytes, args.world_size)
    if available is not None and available < needed:
        raise MemoryError(
            f"the test needs about {needed / 2**30:.2f} GiB and MemAvailable is {available / 2**30:.2f} GiB; "
            "stop what uses the memory or lower rank_fabric_check_max_bytes"
        )


def watchdog(seconds: float, rank: int) -> None:
    """End the process when the test outlasts its time: a lost peer blocks a collective forever."""

    def expire() -> None:
        message = (
            f"the fabric test did not finish within {seconds:.0f} s on rank {rank} "
            "(a peer lost or the fabric stalled)"
        )
        print(json.dumps({"error": message}), flush=True)
        os._exit(EXIT_TIMED_OUT)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: PLC0415 - the serving image's; the unit tests import this file without it
    import torch.distributed as dist  # noqa: PLC0415

    check_memory(args)
    device = torch.device("cuda", 0) if args.backend == "nccl" else torch.device("cpu")
    if args.backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend=args.backend,
        init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=args.timeout),
    )
    world = args.world_size
    results = []
    try:
        for collective in COLLECTIVES:
            for size in sizes_up_to(args.min_bytes, args.max_bytes, world):
                row = time_collective(args, device, collective=collective, size=size)
                results.append(row)
                print(json.dumps({"rank": args.rank, **row}), file=sys.stderr, flush=True)
    finally:
        dist.destroy_process_group()
    nccl = None
    if args.backend == "nccl":
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return {
        "backend": args.backend,
        "world_size": world,
        "iters": args.iters,
        "torch": torch.__version__,
        # The CUDA torch was built with (None in a CPU build) and the NCCL it loaded.
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "environment": fabric_environment(dict(os.environ)),
        "results": results,
    }


def time_collective(args: argparse.Namespace, device: Any, *, collective: str, size: int) -> dict[str, Any]:
    """One size of one collective: warm up, time ``--iters`` operations (the slowest rank's time),
    then check one more operation's result."""
    import torch  # noqa: PLC0415 - see run()
    import torch.distributed as dist  # noqa: PLC0415

    world = args.world_size
    elements = size // ELEMENT_BYTES
    value = float(args.rank + 1)
    if collective == "all_reduce":
        tensor = torch.full((elements,), value, dtype=torch.float32, device=device)

        def operation() -> None:
            dist.all_reduce(tensor)

    else:
        share = torch.full((elements // world,), value, dtype=torch.float32, device=device)
        tensor = torch.empty((elements,), dtype=torch.float32, device=device)
        parts = list(tensor.chunk(world))

        def operation() -> None:
            if device.type == "cuda":
                dist.all_gather_into_tensor(tensor, share)
            else:
                dist.all_gather(parts, share)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _warmup in range(args.warmup):
        operation()
    synchronize()
    dist.barrier()
    started = time.perf_counter()
    for _timed in range(args.iters):
        operation()
    synchronize()
    slowest = torch.tensor([(time.perf_counter() - started) / args.iters], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = float(slowest.item())
    wrong = _count_wrong(torch, collective, tensor, args.rank)
    algbw, busbw = bus_bandwidth(collective, size, seconds, world)
    return {
        "collective": collective,
        "bytes": size,
        "time_us": round(seconds * 1e6, 1),
        "algbw_gbps": round(algbw, 3),
        "busbw_gbps": round(busbw, 3),
        "wrong": wrong,
    }


def _count_wrong(torch: Any, collective: str, tensor: Any, rank: int) -> int:
    """Elements that differ from what one more collective must give (nccl-tests' #wrong): rank r
    contributes r + 1, so a sum is n(n+1)/2 and a gather holds 1, 2, ..., n in turn."""
    import torch.distributed as dist  # noqa: PLC0415 - see run()

    world = dist.get_world_size()
    if collective == "all_reduce":
        tensor.fill_(float(rank + 1))
        dist.all_reduce(tensor)
        expected = torch.full_like(tensor, float(world * (world + 1) // 2))
        return int((tensor != expected).sum().item())
    share = torch.full((tensor.numel() // world,), float(rank + 1), dtype=tensor.dtype, device=tensor.device)
    if tensor.is_cuda:
        dist.all_gather_into_tensor(tensor, share)
    else:
        dist.all_gather(list(tensor.chunk(world)), share)
    expected = torch.cat([torch.full_like(share, float(peer + 1)) for peer in range(world)])
    return int((tensor != expected).sum().item())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    watchdog(args.timeout, args.rank)
    try:
        report = run(args)
    except Exception as error:  # any failure is the test's verdict, reported as such
        print(json.dumps({"error": describe_failure(error, dict(os.environ))}), flush=True)
        return EXIT_FAILED
    if args.rank == 0:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
