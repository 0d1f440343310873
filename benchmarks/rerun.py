#!/usr/bin/env python3
"""Benchmark a no-op re-run of site.yml on the lab against its first converge and today's figure.

A user who runs ``site.yml`` again on a converged pair expects it to be quick and to change
nothing. In one run this script:

1. with ``--baseline-commit``, first measures that commit the same way on its own fresh lab (its
   ``labctl`` and inventory, from a git worktree): the machine's speed drifts from day to day, so
   "a third of the baseline" is judged against the baseline measured in this run;
2. brings up a fresh lab (``labctl down`` then ``labctl up``), unless ``--reuse`` keeps the running one;
3. runs ``site.yml`` once (the first converge, from nothing when the lab is fresh);
4. runs it again ``--repeat`` times (the no-op re-run) and checks that none changed anything;
5. reports wall time (the no-op's median: on a shared machine the same run varies by a few
   seconds) and task results per host (every ok, skip and failure, read from ansible-runner's
   events) of both, and the no-op's against the baseline below (and the one measured in this run).

Usage: ``python3 benchmarks/rerun.py [--baseline-commit aa81b5f] [--reuse] [--repeat N] [--json out.json]``
(the lab needs root and Docker, as ``make lab`` does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "lab"), str(REPO / "tests" / "deployment")]
from deployment_support import (  # noqa: E402 - needs the path above
    PlaybookRun,
    changed_nothing,
    run_playbook,
    site,
)

# Today's figure, as measured before re-runs were made quick (the lab's two nodes): a no-op
# site.yml took 33-35 s with about 150 task results per host.
BASELINE = {"seconds": 34.0, "task_results": {"head": 150, "worker": 150}, "commit": "aa81b5f"}
# What the re-run must meet: at most this many task results per host, a third of the baseline time.
TARGET = {"task_results": 60, "seconds": round(BASELINE["seconds"] / 3, 1)}


def labctl(*args: str, checkout: Path = REPO) -> None:
    subprocess.run([sys.executable, str(checkout / "lab" / "labctl.py"), *args], check=True)


def converge_and_rerun(checkout: Path, repeat: int) -> tuple[tuple[PlaybookRun, float], list]:
    """A fresh lab of ``checkout``'s, its first converge, then ``repeat`` no-op re-runs."""
    labctl("down", checkout=checkout)
    labctl("up", checkout=checkout)
    inventory = str(checkout / "inventory" / "lab")

    def run() -> tuple[PlaybookRun, float]:
        return run_playbook("playbooks/site.yml", cwd=checkout, inventory=inventory)

    first = run()
    if first[0].returncode != 0:
        raise RuntimeError(f"the first converge of {checkout} failed:\n{first[0].stdout[-3000:]}")
    return first, [run() for _ in range(repeat)]


def measure_baseline(commit: str, repeat: int) -> dict:
    """The no-op re-run of ``commit`` on this machine now, on its own lab (a git worktree of it)."""
    labctl("down")  # this checkout's lab holds the addresses and ports the baseline's takes
    with tempfile.TemporaryDirectory(prefix="dsv41-baseline.") as parent:
        checkout = Path(parent) / "checkout"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(checkout), commit], check=True
        )
        try:
            _first, noops = converge_and_rerun(checkout, repeat)
        finally:
            labctl("down", checkout=checkout)
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(checkout)], check=True
            )
    median = statistics.median(seconds for _run, seconds in noops)
    return {
        **summary(noops[-1][0], median),
        "commit": commit,
        "seconds_each": [round(seconds, 1) for _run, seconds in noops],
        "changed_nothing": all(changed_nothing(run) for run, _seconds in noops),
    }


def summary(run: PlaybookRun, seconds: float) -> dict:
    return {
        "seconds": round(seconds, 1),
        "returncode": run.returncode,
        "changed": {host: counts["changed"] for host, counts in sorted(run.stats.items())},
        "task_results": {host: run.task_results(host) for host in sorted(run.stats)},
    }


def markdown(result: dict) -> str:
    first, noop, measured = result["first_converge"], result["noop_rerun"], result.get("baseline_measured")
    hosts = sorted(noop["task_results"])
    lines = [
        "| run | wall time | " + " | ".join(f"task results ({host})" for host in hosts) + " |",
        "|---|---:|" + "---:|" * len(hosts),
    ]

    def each(run: dict) -> str:
        return (
            f"median of {len(run['seconds_each'])}: " + ", ".join(f"{s}" for s in run["seconds_each"]) + " s"
        )

    rows = [("first converge", first), (f"no-op re-run ({each(noop)})", noop)]
    if measured:
        rows.append(
            (f"no-op re-run at {measured['commit']}, measured in this run ({each(measured)})", measured)
        )
    rows += [
        (f"no-op re-run, baseline figure ({BASELINE['commit']}, as first measured)", BASELINE),
        (
            "target" + (" (a third of the baseline measured in this run)" if measured else ""),
            {
                "seconds": result["target"]["seconds"],
                "task_results": dict.fromkeys(hosts, TARGET["task_results"]),
            },
        ),
    ]
    for name, run in rows:
        cells = [f"{run['task_results'].get(host, '-')}" for host in hosts]
        lines.append(f"| {name} | {run['seconds']} s | " + " | ".join(cells) + " |")
    lines.append("")
    against = (
        f", {noop['seconds'] / measured['seconds']:.0%} of {measured['commit']}'s in this run"
        if measured
        else ""
    )
    lines.append(
        f"No-op re-run: {noop['seconds'] / first['seconds']:.0%} of the first converge's time, "
        f"{noop['seconds'] / BASELINE['seconds']:.0%} of the baseline figure's{against}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline-commit",
        help=f"measure this commit's no-op re-run first, in this run (the baseline is {BASELINE['commit']})",
    )
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
    if args.baseline_commit and args.reuse:
        parser.error("--baseline-commit brings up labs of its own: it cannot --reuse the running one")

    measured = measure_baseline(args.baseline_commit, args.repeat) if args.baseline_commit else None
    if args.reuse:
        labctl("up")
        first, noops = site(), None
        if first[0].returncode == 0:
            noops = [site() for _ in range(args.repeat)]
    else:
        first, noops = converge_and_rerun(REPO, args.repeat)
    if first[0].returncode != 0 or noops is None:
        print(first[0].stdout[-3000:], file=sys.stderr)
        return 1
    median = statistics.median(seconds for _run, seconds in noops)
    target = dict(TARGET)
    if measured:
        target["seconds"] = round(measured["seconds"] / 3, 1)
    result = {
        "baseline": BASELINE,
        "baseline_measured": measured,
        "target": target,
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
        and median <= target["seconds"]
        and all(count <= target["task_results"] for count in result["noop_rerun"]["task_results"].values())
    )
    result["target_met"] = bool(met)
    print(markdown(result))
    print(f"target met: {result['target_met']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
