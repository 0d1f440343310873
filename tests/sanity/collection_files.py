"""Pick, from the checkout's files, those that ``ansible-test sanity`` checks: the collection's.

Reads NUL-separated paths relative to the repository root (``git ls-files -z`` output) on standard
input and writes, NUL-separated, those that ``ansible-galaxy collection build`` puts in the
artifact: a path is left out when it or one of its parent directories matches a pattern of
galaxy.yml's ``build_ignore`` or of ansible-galaxy's own ignore list (fnmatch, as ansible-galaxy
matches them). galaxy.yml itself and tests/sanity/ (the ignore files) are kept: ansible-test reads
them. Everything else that build_ignore drops (the lab and its stand-ins, the other tests, the
benchmarks, the checkout's own wrappers and the collections/ link that lets the checkout import
itself) is development tooling, checked by ruff and pytest instead.
"""

from __future__ import annotations

import fnmatch
import sys

import yaml

# ansible-galaxy's built-in ignores (ansible/galaxy/collection/__init__.py, _build_files_manifest).
BUILTIN_PATTERNS = ["MANIFEST.json", "FILES.json", ".git", "*.pyc", "*.retry", "tests/output"]
BUILTIN_DIRS = {"CVS", ".bzr", ".hg", ".git", ".svn", "__pycache__", ".tox"}


def read_by_ansible_test(path: str) -> bool:
    """galaxy.yml (the collection's version) and tests/sanity/ (the ignore files)."""
    return path == "galaxy.yml" or path.startswith("tests/sanity/")


def shipped(path: str, patterns: list[str]) -> bool:
    """Whether ansible-galaxy would put the file at ``path`` into the artifact."""
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        if depth < len(parts) and parts[depth - 1] in BUILTIN_DIRS:
            return False
        prefix = "/".join(parts[:depth])
        if any(fnmatch.fnmatch(prefix, pattern) for pattern in patterns):
            return False
    return True


def main() -> None:
    """Filter standard input to standard output."""
    with open("galaxy.yml", encoding="utf-8") as galaxy_file:
        galaxy = yaml.safe_load(galaxy_file)
    artifacts = f"{galaxy['namespace']}-{galaxy['name']}-*.tar.gz"
    patterns = [*BUILTIN_PATTERNS, artifacts, *galaxy.get("build_ignore", [])]
    paths = sys.stdin.buffer.read().decode("utf-8").split("\0")
    kept = [path for path in paths if path and (read_by_ansible_test(path) or shipped(path, patterns))]
    sys.stdout.buffer.write("".join(f"{path}\0" for path in kept).encode("utf-8"))


if __name__ == "__main__":
    main()
