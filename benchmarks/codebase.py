#!/usr/bin/env python3
"""The size of what a maintainer must hold, measured the same way at any commit.

    python3 benchmarks/codebase.py                 # the working tree
    python3 benchmarks/codebase.py --at 3587c3c    # a commit (read with git, nothing checked out)

Shipped code is what the collection installs: plugins/, roles/ and playbooks/. The duplicated
lines are the `duplicates` tool's (not run here).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("plugins/", "roles/", "playbooks/")
SMALL_TASK_FILE = 20  # lines
INTERNAL_NAME = re.compile(r"\b__[a-z][a-z0-9_]*")
DEFAULT_NAME = re.compile(r"^([a-z][a-z0-9_]*):", re.MULTILINE)


def tree(at: str | None) -> tuple[list[str], Callable[[str], str]]:
    """The tracked files and a reader, of the working tree or of a commit."""
    if at is None:
        names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)

        def read_file(path: str) -> str:
            # A link counts as git stores it (its target's name), as at a commit.
            file = REPO / path
            return os.readlink(file) if file.is_symlink() else file.read_text(errors="replace")

        return names.stdout.split(), read_file
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", at], cwd=REPO, capture_output=True, text=True, check=True
    )

    def read(path: str) -> str:
        shown = subprocess.run(["git", "show", f"{at}:{path}"], cwd=REPO, capture_output=True, check=True)
        return shown.stdout.decode(errors="replace")

    return names.stdout.split(), read


def lines_of(text: str) -> int:
    return len(text.splitlines())


def measure(at: str | None) -> dict[str, int]:
    names, read = tree(at)
    shipped = [n for n in names if n.startswith(SHIPPED) and not n.endswith((".md", ".png"))]
    texts = {n: read(n) for n in shipped}
    tasks = [n for n in shipped if re.fullmatch(r"roles/[^/]+/tasks/[^/]+\.yml", n)]
    defaults = [n for n in shipped if re.fullmatch(r"roles/[^/]+/defaults/main\.yml", n)]
    ansible = [n for n in shipped if n.endswith((".yml", ".j2"))]
    internal = {m for n in ansible for m in INTERNAL_NAME.findall(texts[n])}
    supervisor = "roles/supervisor/files/dsv41_supervisor.py"
    checkpoint = "plugins/module_utils/_checkpoint.py"
    return {
        "shipped_lines": sum(lines_of(t) for t in texts.values()),
        "task_files": len(tasks),
        "task_files_under_20_lines": sum(lines_of(texts[n]) < SMALL_TASK_FILE for n in tasks),
        "defaults": sum(len(DEFAULT_NAME.findall(texts[n])) for n in defaults),
        "internal_names": len(internal),
        "hostvars_reads": sum(texts[n].count("hostvars[") for n in ansible),
        "supervisor_lines": lines_of(texts.get(supervisor, "")),
        "checkpoint_utils_lines": lines_of(texts.get(checkpoint, "")),
        "readme_lines": lines_of(read("README.md")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", action="append", help="a commit to measure (repeatable); default the tree")
    args = parser.parse_args()
    commits = args.at or [None]
    rows = {at or "working tree": measure(at) for at in commits}
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
