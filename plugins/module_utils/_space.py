# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Room for a checkpoint on a node, from metadata only: the filesystem's free bytes and what the
checkpoint directory already holds. Internal to sparkserve.dsv41; stdlib only."""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Any

GIB = 1024**3


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path``."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def nearest_existing(path: str) -> str:
    """``path`` itself when it exists, else its nearest existing parent."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def tree_bytes(root: str) -> int:
    """Bytes of the regular files under ``root`` (symlinks not followed); 0 when absent."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(info.st_mode):
                    total += info.st_size
    return total


def space_report(path: str) -> dict[str, Any]:
    """Room for a checkpoint in ``path`` (which may not exist yet), from metadata only.

    ``free_bytes`` on the filesystem that holds ``path`` (measured at ``measured_at``, its nearest
    existing parent) and ``present_bytes``, what ``path`` already holds.
    """
    existing = nearest_existing(path)
    return {
        "path": os.path.abspath(path),
        "measured_at": existing,
        "free_bytes": free_bytes(existing),
        "present_bytes": tree_bytes(path) if os.path.isdir(path) else 0,
    }


def space_shortfall(report: dict[str, Any], need_gib: float, variable: str) -> str | None:
    """Why ``report`` (of :func:`space_report`) has no room for a checkpoint of ``need_gib`` GiB, set
    by ``variable``; None when it has. What is already there counts towards the checkpoint."""
    missing = max(0.0, need_gib * GIB - report["present_bytes"])
    if report["free_bytes"] >= missing:
        return None
    return (
        f"{report['measured_at']} has {report['free_bytes'] / GIB:.1f} GiB free, but the checkpoint in "
        f"{report['path']} needs {need_gib:g} GiB ({report['present_bytes'] / GIB:.1f} GiB of it already "
        f"there), so {missing / GIB:.1f} GiB more. Free some space, point the model directory at a "
        f"larger disk, or lower {variable}."
    )
