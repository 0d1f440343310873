"""What the node programs share: files in a directory the deployment user owns, never through a
link; their log; the commands they run.

The supervisor, the rank control and the memory guard run as root; their logs, state and records
live in the deployment user's state directory. A symbolic link planted there (or in place of a
directory on the way to it) must not make root write the file it names, nor read a root-only file
and send its contents on (the API key is sent as a header). So every directory is opened from ``/``
one component at a time without following a link the deployment user could have made (a link is
followed only where it sits in a root-owned directory no one else may write: ``/home`` ->
``/var/home``), and every file is opened, created, renamed and removed relative to its directory's
descriptor, with ``O_NOFOLLOW``. A rename replaces a link; it never writes through one.

Installed beside the programs that use it (the memory guard's role installs its own copy, a link to
this file in the collection). Stdlib only.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import NamedTuple

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_MODE = 0o644
_READ_LIMIT = 1 << 20
# After a command's group is killed: how long to wait for its pipes to close (a process that left
# the group may hold them).
_REAP_SECONDS = 5.0


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
    """Append ``data`` to the regular file ``path`` (created with ``mode`` when absent); OSError for
    a link, a device or a FIFO, whose writer would block with no reader (the guard with it)."""
    with directory(path.parent) as parent:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path.name, flags, mode, dir_fd=parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            _write_all(fd, data)
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written: on a filling disk one call may write part."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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
                _write_all(fd, text.encode("utf-8"))
            finally:
                os.close(fd)
            os.replace(temporary, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:  # a stop signal (StopRequested) may come between any two lines
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


# --- /proc -----------------------------------------------------------------------------------

_KIB = 1024
_GIB = 1024**3


def format_gib(n_bytes: float) -> str:
    """Bytes as GiB with two decimals: the unit memory floors and margins are given in."""
    return f"{n_bytes / _GIB:.2f} GiB"


def parse_meminfo(text: str) -> int:
    """MemAvailable in bytes from /proc/meminfo text.

    ValueError when the field is missing or malformed: a guessed number could make the memory
    guard kill the ranks for nothing or, worse, never kill them.
    """
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep or key.strip() != "MemAvailable":
            continue
        fields = rest.split()
        if not fields or not fields[0].isdigit():
            raise ValueError(f"malformed MemAvailable line: {line!r}")
        unit = fields[1].lower() if len(fields) > 1 else ""
        if unit not in ("kb", ""):
            raise ValueError(f"unknown MemAvailable unit {fields[1]!r}")
        return int(fields[0]) * (_KIB if unit == "kb" else 1)  # the kernel writes "kB" and means KiB
    raise ValueError("no MemAvailable field in meminfo (kernel older than 3.14?)")


# --- the log ---------------------------------------------------------------------------------


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` as one log line whatever a process, a remote command or a server put in it: every
    run of whitespace and unprintable characters becomes one space; cut to ``limit`` characters."""
    clean = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    if limit is not None and len(clean) > limit:
        clean = clean[: limit - 3] + "..."
    return clean


DETAIL_MAX_CHARS = 300


def detail(text: str) -> str:
    """What a command, a server or an exception said, as one line of a state file or a log entry:
    bounded, whatever it sent."""
    return one_line(text, DETAIL_MAX_CHARS)


def format_line(when: float, event: str, message: str) -> str:
    """One log line: local ISO-8601 timestamp with offset, event word, message."""
    stamp = datetime.datetime.fromtimestamp(when).astimezone().isoformat(timespec="milliseconds")
    return f"{stamp} {event} {one_line(message)}\n"


class RotatingLog:
    """Append-only log with size-based rotation (log -> log.1 -> ... -> log.<backups>), written
    through no link; with ``echo``, each line also on stdout for the journal.

    Opened per write: reopening survives an operator deleting or moving the file. A failed write
    goes to stderr, the lines with it, instead of raising: a lost log line must never stop a program.
    """

    def __init__(
        self,
        path: Path,
        max_bytes: int,
        backups: int,
        clock: Callable[[], float],
        *,
        program: str = "dsv41",
        echo: bool = False,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.clock = clock
        self.program = program
        self.echo = echo

    def write(self, event: str, message: str) -> None:
        self.write_lines(event, [message])

    def write_lines(self, event: str, messages: Sequence[str]) -> None:
        """Write one event as one or more lines, all with the same timestamp."""
        when = self.clock()
        text = "".join(format_line(when, event, message) for message in messages)
        if self.echo:
            sys.stdout.write(text)
            sys.stdout.flush()
        data = text.encode()
        try:
            self._rotate_if_needed(len(data))
            append(self.path, data)
        except OSError as exc:
            sys.stderr.write(f"{self.program}: cannot write {self.path}: {exc}\n")
            if not self.echo:  # else the journal has the lines already
                sys.stderr.write(text)
            sys.stderr.flush()

    def _rotate_if_needed(self, incoming: int) -> None:
        current = size(self.path)
        if current is None or current == 0 or current + incoming <= self.max_bytes:
            return
        rotate(self.path, self.backups)


# --- commands --------------------------------------------------------------------------------


class CommandResult(NamedTuple):
    """Outcome of one command; failures to run at all are folded in (124 timeout, 127 OSError)."""

    returncode: int
    stdout: str
    stderr: str


# run_command's shape: the programs take one as an argument, so that their tests can fake it.
Runner = Callable[[Sequence[str], float], CommandResult]


def run_command(argv: Sequence[str], timeout: float) -> CommandResult:
    """Run an argv list (never a shell) with a timeout and no input: a hung Docker daemon or an
    unreachable node must not hang the program's loop.

    The command runs in a process group of its own, killed whole when the time is up or the program
    is stopped: what it started (rank control's ``docker``, blocked on a hung daemon) must not
    outlive it, one more each tick. Output that is not UTF-8 (a remote shell's) is kept, replaced.
    """
    try:
        child = subprocess.Popen(  # noqa: S603 - an argv list from the program's root-owned settings, no shell
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(127, "", str(exc))
    try:
        stdout, stderr = child.communicate(timeout=timeout)
    except BaseException as exc:  # the timeout, or a stop signal while waiting
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.communicate(timeout=_REAP_SECONDS)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        return CommandResult(124, "", f"timed out after {timeout:g}s")
    return CommandResult(child.returncode, _decoded(stdout), _decoded(stderr))


def _decoded(output: bytes) -> str:
    return output.decode("utf-8", errors="replace")


# --- the loop --------------------------------------------------------------------------------


class StopRequested(Exception):
    """Raised from the SIGTERM/SIGINT handler to leave the loop wherever it is, even mid-sleep."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stop(signum: int, _frame: FrameType | None) -> None:
    raise StopRequested(signum)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT raise StopRequested; the handlers before are put back."""
    previous = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_loop(
    step: Callable[[], object],
    *,
    interval: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
    iterations: int | None = None,
) -> None:
    """Call ``step`` every ``interval`` seconds (its own time included) until stopped or
    ``iterations`` ran."""
    done = 0
    while iterations is None or done < iterations:
        started = clock()
        step()
        done += 1
        sleep(max(0.0, interval - (clock() - started)))
