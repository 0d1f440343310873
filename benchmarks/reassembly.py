#!/usr/bin/env python3
"""Benchmark Engram shard reassembly: the upstream shell against ``_checkpoint``.

Builds a seeded synthetic checkpoint (six shards, shards 5 and 6 stored only as parts) and,
each time starting from a cold page cache, times:

(a) the original method, exactly as the upstream shell does it: ``cat`` the parts into each
    shard, then ``sha256sum -c sha256-manifest.txt``;
(b) this collection's functions (plan, rebuild-while-hashing, parallel verification), as the
    ``checkpoint_shards`` module runs them, and a second run that trusts the state file;
(c) the disk's raw limit: reading every input file once with ``dd`` and writing the rebuilt
    bytes once with ``dd conv=fdatasync``.

Usage: ``python3 benchmarks/reassembly.py [--size-gb 3] [--dir /var/tmp] [--json out.json]``.
The data is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.sparkserve.dsv41.plugins.module_utils import _checkpoint as ck  # noqa: E402

SHARDS = [f"model-{n:05d}-of-00006.safetensors" for n in range(1, 7)]
SPLIT = SHARDS[4:]
# Share of the total size per shard: the split shards are the big ones, as in the real checkpoint.
WEIGHTS = [0.14, 0.14, 0.14, 0.14, 0.22, 0.22]
MiB = 1024 * 1024
UPSTREAM_SHELL = """set -e
cd "$1"
for s in model-00005-of-00006.safetensors model-00006-of-00006.safetensors; do
  [ -f "$s" ] || cat "$s".part* > "$s"
done
sha256sum -c sha256-manifest.txt >/dev/null
"""


def build(model: Path, total: int, parts: int, seed: int) -> dict[str, int]:
    """Write the synthetic checkpoint; return the bytes per shard. Seeded: same bytes every time."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    # Random bytes are slow to generate in Python; slices of a seeded pool at seeded offsets
    # are just as incompressible and undeduplicable for the filesystem, and fast.
    pool = rng.randbytes(64 * MiB)
    model.mkdir(parents=True)
    sizes = {}
    lines = []
    for name, weight in zip(SHARDS, WEIGHTS, strict=True):
        size = int(total * weight) // 4096 * 4096
        sizes[name] = size
        digest = hashlib.sha256()
        split = name in SPLIT
        part_size = -(-size // parts) if split else size
        written = 0
        index = 0
        while written < size:
            target = model / (f"{name}.part{index:02d}" if split else name)
            with open(target, "wb") as out:
                limit = min(size, written + part_size)
                while written < limit:
                    offset = rng.randrange(0, 48 * MiB)
                    chunk = pool[offset : offset + min(16 * MiB, limit - written)]
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
            index += 1
        lines.append(f"{digest.hexdigest()}  {name}")
    (model / "sha256-manifest.txt").write_text("\n".join(lines) + "\n")
    return sizes


def drop_caches(root: Path) -> str:
    """Empty the page cache of the data; return the method that worked."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        pass
    else:
        return "drop_caches"
    # Containers usually cannot write drop_caches; evicting each (now clean) file works everywhere.
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "posix_fadvise(POSIX_FADV_DONTNEED) per file"


def timed(function) -> tuple[float, object]:
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def run_original(model: Path) -> tuple[float, float]:
    """Upstream: cat parts > shard, sha256sum -c; plus the sync that makes its writes durable."""
    seconds, _ = timed(lambda: subprocess.run(["bash", "-c", UPSTREAM_SHELL, "bash", str(model)], check=True))
    sync_seconds, _ = timed(lambda: subprocess.run(["sync"], check=True))
    return seconds, sync_seconds


def run_ours(model: Path, state_file: Path, workers: int) -> dict:
    """The module's sequence (keep_parts so the next repetition finds the parts again)."""

    def once() -> dict:
        manifest = ck.read_manifest(str(model))
        found = ck.scan_checkpoint(str(model), manifest)
        records, _warning = ck.load_state(str(state_file), str(model))
        actions = ck.plan_actions(manifest, found, records, keep_parts=True)
        ck.check_free_space(actions)
        report, errors = ck.apply_plan(
            actions, str(model), records, str(state_file), check_mode=False, workers=workers
        )
        if errors:
            raise SystemExit(f"our run failed: {errors}")
        return report

    return dict(zip(("seconds", "report"), timed(once), strict=True))


def dd(*args: str) -> None:
    subprocess.run(["dd", *args, "status=none"], check=True)


def run_raw(model: Path, written: int) -> tuple[float, float]:
    """Sequential read of every input file once, and one write of the rebuilt bytes, fsynced."""
    inputs = [p for p in sorted(model.iterdir()) if p.name != "sha256-manifest.txt" and p.is_file()]
    read_seconds, _ = timed(lambda: [dd(f"if={p}", "of=/dev/null", "bs=16M") for p in inputs])
    scratch = model / "raw-write.tmp"
    write_seconds, _ = timed(
        lambda: dd("if=/dev/zero", f"of={scratch}", "bs=1M", f"count={written // MiB}", "conv=fdatasync")
    )
    scratch.unlink()
    return read_seconds, write_seconds


def measure(model: Path, base: Path, repeat: int, workers: int, rebuilt: int) -> tuple[dict, str, dict]:
    """Time (a), (b) and (c) ``repeat`` times, each from a cold page cache."""
    runs: dict[str, list[float]] = {
        key: [] for key in ("original", "original_sync", "ours", "rerun", "raw_read", "raw_write")
    }
    method = ""
    last_report: dict = {}
    for repetition in range(repeat):
        method = drop_caches(base)
        seconds, sync_seconds = run_original(model)
        runs["original"].append(seconds)
        runs["original_sync"].append(seconds + sync_seconds)
        for name in SPLIT:  # back to parts only, for our run
            (model / name).unlink()
        state = base / f"state-{repetition}.json"
        drop_caches(base)
        ours = run_ours(model, state, workers)
        runs["ours"].append(ours["seconds"])
        last_report = ours["report"]
        rerun = run_ours(model, state, workers)
        runs["rerun"].append(rerun["seconds"])
        if rerun["report"]["bytes_read"] != 0:
            raise SystemExit("the second run read data; the state file did not work")
        for name in SPLIT:
            (model / name).unlink()
        drop_caches(base)
        read_seconds, write_seconds = run_raw(model, rebuilt)
        runs["raw_read"].append(read_seconds)
        runs["raw_write"].append(write_seconds)
        print(
            f"  repetition {repetition + 1}: original {seconds:.2f} s (+sync {sync_seconds:.2f} s), "
            f"ours {ours['seconds']:.2f} s, raw read {read_seconds:.2f} s + write {write_seconds:.2f} s",
            flush=True,
        )
    return runs, method, last_report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=3.0, help="total checkpoint size (default 3)")
    parser.add_argument("--parts", type=int, default=3, help="parts per split shard (default 3)")
    # /var/tmp, not /tmp: /tmp is often a tmpfs, which would measure memory instead of the disk.
    parser.add_argument("--dir", default="/var/tmp", help="parent directory for the data")  # noqa: S108
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="repetitions; medians are reported")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    args = parser.parse_args()

    total = int(args.size_gb * 1024**3)
    base = Path(tempfile.mkdtemp(prefix="sparkserve-reassembly-", dir=args.dir))
    model = base / "model"
    try:
        print(f"building {total / 1024**3:.2f} GiB in {model} (seed {args.seed}) ...", flush=True)
        build_seconds, sizes = timed(lambda: build(model, total, args.parts, args.seed))
        total = sum(sizes.values())
        rebuilt = sum(sizes[name] for name in SPLIT)
        print(f"  built in {build_seconds:.1f} s", flush=True)
        runs, method, last_report = measure(model, base, args.repeat, args.workers, rebuilt)
        med = {key: statistics.median(values) for key, values in runs.items()}
        raw = med["raw_read"] + med["raw_write"]
        result = {
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "kernel": platform.release(),
            },
            "config": {
                "dir": str(args.dir),
                "total_bytes": total,
                "rebuilt_bytes": rebuilt,
                "parts_per_split_shard": args.parts,
                "workers": args.workers,
                "seed": args.seed,
                "repeat": args.repeat,
                "cache_drop": method,
                "sync_file_range": ck._SYNC_FILE_RANGE is not None,
            },
            "seconds": {k: round(v, 3) for k, v in med.items()} | {"raw_copy": round(raw, 3)},
            "runs": {k: [round(v, 3) for v in values] for k, values in runs.items()},
            "rates_mb_s": {
                "raw_read": round(total / med["raw_read"] / 1e6, 1),
                "raw_write": round(rebuilt / med["raw_write"] / 1e6, 1),
                "ours_read": round(total / med["ours"] / 1e6, 1),
            },
            "ours": {"bytes_read": last_report["bytes_read"], "bytes_written": last_report["bytes_written"]},
            "ratios": {
                "original_over_ours": round(med["original"] / med["ours"], 2),
                "original_sync_over_ours": round(med["original_sync"] / med["ours"], 2),
                "ours_over_raw_copy": round(med["ours"] / raw, 2),
            },
        }
        print(json.dumps(result, indent=2))
        print(
            f"original/ours = {result['ratios']['original_over_ours']}x "
            f"(with its sync: {result['ratios']['original_sync_over_ours']}x); "
            f"ours/raw copy = {result['ratios']['ours_over_raw_copy']}x; cache drop: {method}"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if not args.keep:
            with contextlib.suppress(OSError):
                shutil.rmtree(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
