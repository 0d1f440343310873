# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Copy the checkpoint to another node with rsync, its progress in the collection's progress file.

Internal to sparkserve.dsv41; not a public API; used by the ``checkpoint_copy`` module. Stdlib
only, no Ansible import.

rsync runs with ``--itemize-changes --info=progress2``: one line per changed item (``>f+++++++++
name``; ``changed`` is whether there is any) and, between them, a progress line rewritten with
``\\r`` (``  1,073,741,824  45%  120.00MB/s    0:00:08 (xfr#1, to-chk=9/12)``). Ansible's
``run_command`` hands a command's output over only when it has ended, so :func:`run_rsync` reads
rsync's output as it comes, from an argument list (never a shell).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter

# Never copied: the parts of rebuilt shards, huggingface_hub's metadata and our own verification
# records (a worker verifies its copy itself), the rebuild's temporary files.
DEFAULT_EXCLUDES = ("*.safetensors.part*", ".cache/", ".*.sparkserve-tmp")
# Relative: one in each directory with a file in flight; rsync excludes it from the copy itself.
PARTIAL_DIR = ".rsync-partial"
OPTIONS = (
    "-a",
    # The files belong to the receiving user; directory times would differ again as soon as the
    # worker's verification records appear, and the next run would report a change.
    "--no-owner",
    "--no-group",
    "--omit-dir-times",
    # An interrupted copy resumes: a partly sent file is kept and completed. It is kept aside, never
    # under the file's own name, where ranks started meanwhile would load a truncated shard.
    f"--partial-dir={PARTIAL_DIR}",
    "--itemize-changes",
    "--info=progress2",
)
# Numbers as rsync prints them without a locale: 1,234,567.
RSYNC_ENV = {"LC_ALL": "C"}
MESSAGES_KEPT = 20
ITEMS_RETURNED = 50

# "  1,234,567  45%  120.00MB/s    0:01:23 (xfr#3, to-chk=10/200)" (the part in brackets only at
# the end of a file; ir-chk while the file list is still growing).
_PROGRESS = re.compile(
    r"^\s*(?P<bytes>[\d,.]+)(?P<unit>[KMGT]?)\s+(?P<percent>\d+)%\s+(?P<rate>\S+/s)\s+\S+"
    r"(?:\s+\((?:xfr#\d+, )?(?:to|ir)-chk=(?P<left>\d+)/(?P<files>\d+)\))?"
)
# "YXcstpoguax name": update type, file type, 9 attribute flags (rsync --itemize-changes).
_ITEM = re.compile(r"^(?:[<>ch.][fdLDS][ .+?a-zA-Z]{9}|\*deleting\s*) (?P<name>.+)$")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def remote_shell(argv: Iterable[str]) -> str:
    """``argv`` as one ``-e`` value: rsync splits it on spaces and honours single quotes."""
    return shlex.join(list(argv))


def rsync_argv(
    rsync: str,
    src: str,
    dest: str,
    *,
    rsh: list[str] | None = None,
    excludes: Iterable[str] = DEFAULT_EXCLUDES,
    bwlimit_kib: int = 0,
    link_dest: Iterable[str] = (),
    dry_run: bool = False,
) -> list[str]:
    """The rsync command that makes ``dest`` a copy of the directory ``src`` (contents to contents);
    ``bwlimit_kib`` caps its rate in KiB/s (0: no cap); a file identical (size, time) to one in a
    ``link_dest`` directory on the receiving side is hard-linked from there instead of sent."""
    argv = [rsync, *OPTIONS]
    argv += [f"--link-dest={directory}" for directory in link_dest]
    if dry_run:
        argv.append("--dry-run")
    if bwlimit_kib:
        argv.append(f"--bwlimit={bwlimit_kib}")
    argv += [f"--exclude={pattern}" for pattern in excludes]
    if rsh:
        argv += ["-e", remote_shell(rsh)]
    argv += [src.rstrip("/") + "/", dest.rstrip("/") + "/"]
    return argv


class RsyncOutput:
    """Splits rsync's stdout (lines end in ``\\n``, progress updates in ``\\r``) and sorts it."""

    def __init__(self) -> None:
        self.pending = b""
        self.items: list[str] = []
        self.messages: list[str] = []
        self.bytes_done = 0
        self.percent: int | None = None
        self.files: tuple[int, int] | None = None  # (checked, of)
        self.file: str | None = None

    def feed(self, chunk: bytes) -> None:
        segments = re.split(rb"[\r\n]", self.pending + chunk)
        self.pending = segments.pop()
        for segment in segments:
            self.line(segment.decode(errors="replace"))
        # rsync starts a progress update with "\r" and ends it only with the next one: read the
        # update in hand now (its numbers come first, so a match has them whole).
        self.progress(self.pending.decode(errors="replace"))

    def close(self) -> None:
        if self.pending:
            self.line(self.pending.decode(errors="replace"))
            self.pending = b""

    def message(self, text: str) -> None:
        """Keep ``text`` (an error or warning of rsync or ssh) among the last messages."""
        if text.strip():
            self.messages.append(text.rstrip())
            del self.messages[:-MESSAGES_KEPT]

    def progress(self, text: str) -> bool:
        """Take the numbers of a progress update; False when ``text`` is none."""
        progress = _PROGRESS.match(text)
        if not progress:
            return False
        number = float(progress.group("bytes").replace(",", ""))
        self.bytes_done = int(number * _UNITS[progress.group("unit")])
        self.percent = int(progress.group("percent"))
        if progress.group("files"):
            files = int(progress.group("files"))
            self.files = (files - int(progress.group("left")), files)
        return True

    def line(self, text: str) -> None:
        if not text.strip() or self.progress(text):
            return
        item = _ITEM.match(text)
        if item:
            self.items.append(text)
            self.file = item.group("name")
            return
        self.message(text)

    def detail(self) -> str | None:
        """The progress document's detail: the item at hand and how far through the tree rsync is."""
        parts = [self.file] if self.file else []
        if self.files:
            parts.append(f"{self.files[0]} of {self.files[1]} files checked")
        return ", ".join(parts) or None

    def summary(self, returncode: int) -> dict[str, Any]:
        return {
            "changed": bool(self.items),
            "rc": returncode,
            "itemized_count": len(self.items),
            "itemized": self.items[:ITEMS_RETURNED],
            "messages": self.messages,
            "bytes_transferred": self.bytes_done,
        }


def run_rsync(
    argv: list[str],
    progress: ProgressWriter,
    *,
    popen: Callable[..., subprocess.Popen] = subprocess.Popen,
) -> dict[str, Any]:
    """Run ``argv`` (an rsync command with ``--itemize-changes --info=progress2``), feeding the
    progress document as it goes; return :meth:`RsyncOutput.summary`. Raises ``OSError`` when
    rsync cannot be started."""
    output = RsyncOutput()
    progress.update(force=True, phase="copying")
    env = {**os.environ, **RSYNC_ENV}
    process = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    stdout, stderr = process.stdout, process.stderr
    if stdout is None or stderr is None:  # only a popen that ignores stdout/stderr=PIPE
        raise OSError(f"{argv[0]}: no pipes to read its output from")

    def read_errors() -> None:
        for raw in stderr:
            output.message(raw.decode(errors="replace"))

    errors = threading.Thread(target=read_errors, daemon=True)
    errors.start()
    while chunk := stdout.read1(65536):
        output.feed(chunk)
        progress.update(done=output.bytes_done, detail=output.detail())
    output.close()
    returncode = process.wait()
    errors.join()
    progress.finish(failed=returncode != 0, done=output.bytes_done, detail=output.detail())
    return output.summary(returncode)


def copy_message(summary: dict[str, Any], dest: str, dry_run: bool = False) -> str:
    """One line: what rsync changed (would change, in a dry run), or why it failed."""
    if summary["rc"] != 0:
        said = "; ".join(summary["messages"][-3:]) or "no message"
        return f"rsync to {dest} failed with exit code {summary['rc']}: {said}"
    count = summary["itemized_count"]
    if not count:
        return f"the copy at {dest} is up to date; rsync changed nothing"
    return f"rsync {'would change' if dry_run else 'changed'} {count} item(s) at {dest}"
