"""What check mode and idempotent runs must leave alone: names, contents, modes and mtimes."""

from __future__ import annotations

import os
from pathlib import Path


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """``{relative path: (mode, mtime_ns, content or None for a directory)}`` of all under ``root``."""
    state: dict[str, tuple[int, int, bytes | None]] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(directory, name)
            status = path.lstat()
            content = None if path.is_dir() else path.read_bytes()
            state[str(path.relative_to(root))] = (status.st_mode, status.st_mtime_ns, content)
    return state
