#!/usr/bin/env python3
"""The documents' tables of the lab suites, from what the suites measured.

The fault suite (tests/deployment/test_faults.py), the upgrade suite (test_upgrades.py) and the
real-engine suite (tests/real_engine/) each record their cases in ``.lab/<suite>.json``; this
writes each table between its markers, wherever they are in README.md and docs/*.md
(docs/failure-handling.md, docs/upgrades.md, docs/lab.md), so the figures there are the last run's:

    python3 benchmarks/suite_tables.py            # rewrites the documents from .lab/
    python3 benchmarks/suite_tables.py --check    # exit 1 when a document differs

A suite whose file is missing keeps its table as it is.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITES = ("fault-suite", "upgrade-suite", "real-engine-suite")
_MARKED = re.compile(
    r"(<!-- suite-table: (?P<suite>[a-z-]+) -->\n)(?P<table>.*?)(<!-- /suite-table -->)", re.DOTALL
)


def _number(value: float) -> str:
    return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def _seconds(value: float | None) -> str:
    return "-" if not value else f"{_number(value)} s"


def rows(suite: str, results: dict[str, dict[str, Any]]) -> list[list[str]]:
    """One row per case, in the order the suite ran them."""
    ordered = sorted(results.items(), key=lambda item: item[1].get("at", 0))
    if suite == "fault-suite":
        return [[case, _seconds(r["seconds"]), _seconds(r["bound"]), r["detail"]] for case, r in ordered]
    if suite == "upgrade-suite":
        return [[case, _seconds(r["seconds"]), r["detail"]] for case, r in ordered]
    out = []
    for case, r in ordered:
        unit = r["unit"]
        measured = "-" if not r["measured"] else f"{_number(r['measured'])} {unit}"
        bound = "-" if r["bound"] is None else f"{_number(r['bound'])} {unit}"
        out.append([case, measured, bound, r["detail"]])
    return out


HEADERS = {
    "fault-suite": ["case", "measured", "bound", "what"],
    "upgrade-suite": ["case", "downtime", "what"],
    "real-engine-suite": ["case", "measured", "bound", "what"],
}


def table(suite: str, results: dict[str, dict[str, Any]]) -> str:
    header = HEADERS[suite]
    align = ["---"] + ["---:"] * (len(header) - 2) + ["---"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows(suite, results)]
    return "\n".join(lines) + "\n"


def rewrite(readme: str, measured: dict[str, dict[str, dict[str, Any]]]) -> str:
    """``readme`` with each marked table whose suite was measured written anew."""

    def replace(match: re.Match[str]) -> str:
        suite = match["suite"]
        if suite not in measured:
            return match[0]
        return match[1] + table(suite, measured[suite]) + match[4]

    return _MARKED.sub(replace, readme)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--results", type=Path, default=ROOT / ".lab", help="where the suites wrote their JSON"
    )
    parser.add_argument(
        "--document",
        type=Path,
        action="append",
        help="a document with suite tables (default: README.md and docs/*.md)",
    )
    parser.add_argument("--check", action="store_true", help="only say whether the documents are up to date")
    args = parser.parse_args(argv)
    documents = args.document or [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    measured = {
        suite: json.loads((args.results / f"{suite}.json").read_text())
        for suite in SUITES
        if (args.results / f"{suite}.json").exists()
    }
    stale = []
    for document in documents:
        before = document.read_text()
        after = rewrite(before, measured)
        if after == before:
            continue
        stale.append(document)
        if not args.check:
            document.write_text(after)
    if args.check:
        print(f"differ from {args.results}: {', '.join(map(str, stale))}" if stale else "up to date")
        return 1 if stale else 0
    written = ", ".join(map(str, stale)) or "no document changed"
    print(f"{', '.join(sorted(measured)) or 'no suite measured'}: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
