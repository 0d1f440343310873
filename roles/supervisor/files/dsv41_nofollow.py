"""Files the node programs read and write in a directory the deployment user owns, never through a link.

The supervisor and the memory guard run as root; their logs, state and records live in the
deployment user's state directory. A symbolic link planted there (or in place of a directory on
the way to it) must not make root write the file it names, nor read a root-only file and send its
contents on (the API key is sent as a header). So every directory is opened from ``/`` one
component at a time without following a link the deployment user could have made (a link is
followed only where it sits in a root-owned directory no one else may write: ``/home`` -> ``/var/home``),
and every file is opened, created, renamed and removed relative to its directory's descriptor,
with ``O_NOFOLLOW``. A rename replaces a link; it never writes through one.

Installed beside the programs that use it (the memory guard's role installs its own copy, a link to
this file in the collection). Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_MODE = 0o644
_READ_LIMIT = 1 << 20


def _trusted(directory_fd: int) -> bool:
    """A directory only root can change: a link in it was put there by root."""
    status = os.fstat(directory_fd)
    return status.st_uid == 0 and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@contextlib.contextmanager
def directory(path: Path | str) -> Iterator[int]:
    """A descriptor of the directory ``path``; OSError (ELOOP, ENOTDIR) where a component is a
    link that the deployment user could have made."""
    parts = Path(os.path.abspath(path)).parts
    fd = os.open("/", _DIRECTORY)
    try:
        for part in parts[1:]:
            flags = _DIRECTORY if _trusted(fd) else _DIRECTORY | os.O_NOFOLLOW
            child = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def append(path: Path, data: bytes, mode: int = _FILE_MODE) -> None:
    """Append ``data`` to ``path`` (created with ``mode`` when absent)."""
    with directory(path.parent) as parent:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path.name, flags, mode, dir_fd=parent)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def size(path: Path) -> int | None:
    """The size of ``path`` itself (of a link, not of what it names); None when absent."""
    with directory(path.parent) as parent:
        try:
            return os.stat(path.name, dir_fd=parent, follow_symlinks=False).st_size
        except FileNotFoundError:
            return None


def rotate(path: Path, backups: int) -> None:
    """``path`` -> ``path.1`` -> ... -> ``path.<backups>`` (the oldest dropped); removed when
    ``backups`` is 0. Renames replace whatever is at the new name, links included."""
    with directory(path.parent) as parent:
        if backups == 0:
            os.unlink(path.name, dir_fd=parent)
            return
        for index in range(backups - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(
                    f"{path.name}.{index}", f"{path.name}.{index + 1}", src_dir_fd=parent, dst_dir_fd=parent
                )
        os.replace(path.name, f"{path.name}.1", src_dir_fd=parent, dst_dir_fd=parent)


def write_atomically(path: Path, text: str, mode: int = _FILE_MODE) -> None:
    """Replace ``path`` with ``text`` through a new temporary file beside it (a name no one could
    have prepared): a reader sees all or nothing."""
    with directory(path.parent) as parent:
        temporary = f".{path.name}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, mode, dir_fd=parent)
        try:
            try:
                os.write(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
            os.replace(temporary, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=parent)
            raise


def read_text(path: Path, limit: int = _READ_LIMIT) -> str:
    """The text of the regular file ``path`` (at most ``limit`` bytes); OSError for a link, a
    device or a FIFO (which could block), or a file that is not there."""
    with directory(path.parent) as parent:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            return os.read(fd, limit).decode("utf-8", errors="replace")
        finally:
            os.close(fd)
