#!/usr/bin/env python3
"""Benchmark a no-op re-run of site.yml on the lab against its first converge and today's figure.

A user who runs ``site.yml`` again on a converged pair expects it to be quick and to change
nothing. In one run this script:

1. brings up a fresh lab (``labctl down`` then ``labctl up``), unless ``--reuse`` keeps the running one;
2. runs ``site.yml`` once (the first converge, from nothing when the lab is fresh);
3. runs it again ``--repeat`` times (the no-op re-run) and checks that none changed anything;
4. reports wall time (the no-op's median: on a shared machine the same run varies by a few
   seconds) and task results per host (every ok, skip and failure, read from ansible-runner's
   events) of both, and the no-op's against the baseline below.

Usage: ``python3 benchmarks/rerun.py [--reuse] [--repeat N] [--json out.json]`` (the lab needs root
and Docker, as ``make lab`` does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "lab"), str(REPO / "tests" / "deployment")]
from deployment_support import PlaybookRun, changed_nothing, site  # noqa: E402 - needs the path above

# Today's figure, as measured before re-runs were made quick (the lab's two nodes): a no-op
# site.yml took 33-35 s with about 150 task results per host.
BASELINE = {"seconds": 34.0, "task_results": {"head": 150, "worker": 150}, "commit": "aa81b5f"}
# What the re-run must meet: at most this many task results per host, a third of the baseline time.
TARGET = {"task_results": 60, "seconds": round(BASELINE["seconds"] / 3, 1)}


def labctl(*args: str) -> None:
    subprocess.run([sys.executable, str(REPO / "lab" / "labctl.py"), *args], check=True)


def summary(run: PlaybookRun, seconds: float) -> dict:
    return {
        "seconds": round(seconds, 1),
        "returncode": run.returncode,
        "changed": {host: counts["changed"] for host, counts in sorted(run.stats.items())},
        "task_results": {host: run.task_results(host) for host in sorted(run.stats)},
    }


def markdown(result: dict) -> str:
    first, noop = result["first_converge"], result["noop_rerun"]
    hosts = sorted(noop["task_results"])
    lines = [
        "| run | wall time | " + " | ".join(f"task results ({host})" for host in hosts) + " |",
        "|---|---:|" + "---:|" * len(hosts),
    ]
    each = ", ".join(f"{seconds}" for seconds in noop["seconds_each"])
    for name, run in (
        ("first converge", first),
        (f"no-op re-run (median of {len(noop['seconds_each'])}: {each} s)", noop),
        (f"no-op re-run, baseline ({BASELINE['commit']})", BASELINE),
        (
            "target",
            {"seconds": TARGET["seconds"], "task_results": dict.fromkeys(hosts, TARGET["task_results"])},
        ),
    ):
        cells = [f"{run['task_results'].get(host, '-')}" for host in hosts]
        lines.append(f"| {name} | {run['seconds']} s | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"No-op re-run: {noop['seconds'] / first['seconds']:.0%} of the first converge's time, "
        f"{noop['seconds'] / BASELINE['seconds']:.0%} of the baseline's."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reuse", action="store_true", help="keep the running lab (first converge is then a re-run)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="no-op re-runs to take the median of (default 3)"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")

    if not args.reuse:
        labctl("down")
    labctl("up")
    first = site()
    if first[0].returncode != 0:
        print(first[0].stdout[-3000:], file=sys.stderr)
        return 1
    noops = [site() for _ in range(args.repeat)]
    median = statistics.median(seconds for _run, seconds in noops)
    result = {
        "baseline": BASELINE,
        "target": TARGET,
        "first_converge": summary(*first),
        # Every re-run has the same tasks; the last one's results stand for all.
        "noop_rerun": {
            **summary(noops[-1][0], median),
            "seconds_each": [round(seconds, 1) for _run, seconds in noops],
        },
        "noop_changed_nothing": all(changed_nothing(run) for run, _seconds in noops),
    }
    met = (
        result["noop_changed_nothing"]
        and median <= TARGET["seconds"]
        and all(count <= TARGET["task_results"] for count in result["noop_rerun"]["task_results"].values())
    )
    result["target_met"] = bool(met)
    print(markdown(result))
    print(f"target met: {result['target_met']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
