# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Engram shard reassembly and checkpoint verification for sparkserve.dsv41.

Internal to sparkserve.dsv41; not a public API. Stdlib only, Python 3.10+, no Ansible
imports: the ``checkpoint_shards`` module and ``benchmarks/reassembly.py`` both use it.

The flow is plan first, act second:

* :func:`read_manifest` parses ``sha256-manifest.txt``;
* :func:`scan_checkpoint` looks at the directory (``stat`` only, no file data);
* :func:`load_state` reads the records of earlier verifications;
* :func:`plan_actions` (pure) decides per manifest entry: trust, verify or rebuild, and
  whether parts and stale temporary files go;
* :func:`check_free_space` refuses to start a rebuild the filesystem cannot hold;
* :func:`apply_plan` runs :func:`execute_plan` (reading, hashing, writing, renaming,
  deleting) or, in check mode, only :func:`describe_plan`, and saves the state records.

``_adoption``'s ``adopt_checkpoint`` is the other entry point: it records the whole files of a
directory prepared by another tool (upstream ``download.sh``) after hashing them, with this
module's hashing and plan entries (:func:`plan_entry`, :func:`plan_summary`,
:func:`mismatch_message`), and changes nothing else.

For the download and the copy: :func:`trusted_files` (the shards whose parts need not be
fetched again); the room for a checkpoint on a node is ``_space``'s. Progress goes to the
collection's one progress document (``_progress``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    load_json_object,
    read_bytes,
    read_text,
    write_atomically,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter, human_bytes
from ansible_collections.sparkserve.dsv41.plugins.module_utils._space import free_bytes

try:  # ctypes is stdlib, but some minimal Python builds ship without it.
    import ctypes
except ImportError:  # pragma: no cover - depends on the Python build
    ctypes = None  # type: ignore[assignment]

# 16 MiB: large enough that syscall and GIL overhead vanish and hashlib releases the GIL
# (it does above 2 KiB), small enough that a few workers stay far from memory pressure.
CHUNK_SIZE = 16 * 1024 * 1024
TEMP_SUFFIX = ".sparkserve-tmp"
STATE_VERSION = 1
DEFAULT_MANIFEST = "sha256-manifest.txt"
DEFAULT_STATE_FILE = os.path.join(".cache", "sparkserve", "verified.json")
EXL3_BANK_PATTERN = "L??.part.safetensors"
# How much written data may be in flight before the writer waits for the disk: keeps dirty
# page-cache memory bounded on a host whose RAM is shared with the GPU.
WRITE_BEHIND = 4 * CHUNK_SIZE

_MANIFEST_LINE = re.compile(r"^(?P<sha>[0-9a-fA-F]{64}) (?P<mode>[ *])(?P<name>.+)$")
_PART_SUFFIX = re.compile(r"^\.part(?P<index>[0-9]+)$")


class CheckpointError(Exception):
    """A problem the operator has to fix; the message says what and how."""


class ManifestMissing(CheckpointError):
    """The checksum manifest does not exist (yet): a fresh directory, for adoption."""


# --------------------------------------------------------------------------- data types


@dataclass(frozen=True)
class Part:
    path: str
    index: int
    size: int


@dataclass(frozen=True)
class Found:
    """What :func:`scan_checkpoint` saw for one manifest entry (metadata only)."""

    name: str
    path: str
    size: int | None = None  # None: the file does not exist
    mtime_ns: int | None = None
    parts: tuple[Part, ...] = ()
    parts_problem: str | None = None  # gap, duplicate index, ... (only fatal for a rebuild)
    stale_temp: str | None = None
    stale_temp_size: int = 0


@dataclass(frozen=True)
class Record:
    size: int
    mtime_ns: int
    sha256: str


@dataclass(frozen=True)
class Action:
    """One manifest entry's planned work.

    ``kind``: ``trust``, ``verify`` or ``rebuild``; adoption also ``skip`` (no whole file).
    """

    name: str
    path: str
    expected: str
    kind: str
    size: int  # bytes that must be read (0 for trust)
    parts: tuple[Part, ...] = ()
    delete_parts: bool = False
    discard_temp: str | None = None
    discard_temp_size: int = 0


@dataclass
class Counters:
    """Bytes moved, shared by worker threads."""

    bytes_read: int = 0
    bytes_written: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, read: int = 0, written: int = 0) -> None:
        with self.lock:
            self.bytes_read += read
            self.bytes_written += written


# --------------------------------------------------------------------------- small IO helpers


def write_file_atomically(path: str, data: bytes, mode: int = 0o644) -> None:
    """Atomically write the state file, creating its directory first.

    Pure code has no AnsibleModule, so ``_file_helpers.write_atomically`` renames with ``os.replace``;
    a reader (or a crash) sees the old or the new content, never half of it.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_atomically(None, path, data, mode)


def _open_read(path: str):
    """Open a file for unbuffered reading; the one place file data is read (tests patch it)."""
    return open(path, "rb", buffering=0)


def _fadvise(fd: int, offset: int, length: int, advice: int | None) -> None:
    # Hints only: a filesystem or platform without them must not fail the run.
    if advice is None or not hasattr(os, "posix_fadvise"):
        return
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, advice)


_SEQUENTIAL = getattr(os, "POSIX_FADV_SEQUENTIAL", None)
_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)

# sync_file_range(2) flags, from <fcntl.h>.
_SFR_WAIT_BEFORE, _SFR_WRITE, _SFR_WAIT_AFTER = 1, 2, 4


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux ``sync_file_range`` through ctypes, or None where it is unavailable."""
    if ctypes is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_SYNC_FILE_RANGE = _load_sync_file_range()


class _WriteBehind:
    """Start writeback of each written chunk at once and wait for chunks a window behind.

    Without it the kernel keeps gigabytes dirty and the final fsync writes them all while
    nothing else happens; with it, writing to disk overlaps reading and hashing the next
    parts, and the page cache is released behind us (the data is read again only by vLLM).
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending: list[tuple[int, int]] = []

    def wrote(self, offset: int, length: int) -> None:
        if _SYNC_FILE_RANGE is None or length == 0:
            return
        _SYNC_FILE_RANGE(self.fd, offset, length, _SFR_WRITE)
        self.pending.append((offset, length))
        while sum(pending_length for _offset, pending_length in self.pending) > WRITE_BEHIND:
            old_offset, old_length = self.pending.pop(0)
            _SYNC_FILE_RANGE(self.fd, old_offset, old_length, _SFR_WAIT_BEFORE | _SFR_WRITE | _SFR_WAIT_AFTER)
            _fadvise(self.fd, old_offset, old_length, _DONTNEED)


# --------------------------------------------------------------------------- manifest


def parse_manifest(text: str, source: str = DEFAULT_MANIFEST) -> dict[str, str]:
    """``sha256sum`` output -> {relative file name: lower-case sha256}, in file order.

    Accepts ``<sha256>  <name>`` and the binary marker ``<sha256> *<name>``; skips blank lines.
    """
    entries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        match = _MANIFEST_LINE.match(line)
        if match is None:
            raise CheckpointError(
                f"{source} line {number} is malformed: {line[:120]!r}; expected "
                "'<64 hex sha256>  <file name>' as written by sha256sum. Re-download the manifest."
            )
        name = os.path.normpath(match.group("name").strip())
        if os.path.isabs(name) or name == ".." or name.startswith("../"):
            raise CheckpointError(
                f"{source} line {number} names {name!r}, which is outside the model directory; "
                "refusing to read or write there."
            )
        if name in entries:
            raise CheckpointError(
                f"{source} line {number} lists {name} again (first on line {first_line[name]})."
            )
        entries[name] = match.group("sha").lower()
        first_line[name] = number
    if not entries:
        raise CheckpointError(f"{source} lists no files; re-download the manifest.")
    return entries


def read_manifest(model_dir: str, manifest: str = DEFAULT_MANIFEST) -> dict[str, str]:
    path = os.path.join(model_dir, manifest)
    try:
        text = read_text(path)
    except (OSError, FileContentError) as exc:
        raise CheckpointError(f"cannot read checksum manifest {path}: {exc}") from exc
    if text is None:
        raise ManifestMissing(
            f"checksum manifest {path} not found; download the checkpoint (it ships {manifest}) first."
        )
    return parse_manifest(text, source=path)


# --------------------------------------------------------------------------- scanning


def temp_name(path: str) -> str:
    """The temporary file a rebuild writes: hidden, recognisable, next to the shard."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{TEMP_SUFFIX}")


def order_parts(base: str, names: Iterable[str]) -> tuple[list[tuple[int, str]], str | None]:
    """Pick ``<base>.partNN`` out of ``names``, in numeric order, and say what is wrong with them.

    Numeric, not lexical: ``part10`` follows ``part9``. The parts must be ``0 .. n-1`` without
    a hole or a repeated index (``part1`` and ``part01``), else the rebuilt shard would be wrong.
    """
    found: list[tuple[int, str]] = []
    for name in names:
        if not name.startswith(base):
            continue
        match = _PART_SUFFIX.match(name[len(base) :])
        if match:
            found.append((int(match.group("index")), name))
    found.sort()
    problem = None
    indexes = [index for index, _name in found]
    if found:
        repeated = sorted({i for i in indexes if indexes.count(i) > 1})
        missing = sorted(set(range(max(indexes) + 1)) - set(indexes))
        if repeated:
            problem = f"parts {', '.join(n for i, n in found if i in repeated)} share an index"
        elif missing:
            problem = f"part number(s) {', '.join(f'{i:02d}' for i in missing)} missing (have {len(found)})"
    return found, problem


def scan_checkpoint(model_dir: str, manifest: dict[str, str]) -> dict[str, Found]:
    """Stat every manifest entry, its parts and any stale temporary file; read no file data."""
    listings: dict[str, list[str]] = {}
    result: dict[str, Found] = {}
    for name in manifest:
        path = os.path.join(model_dir, name)
        directory = os.path.dirname(path)
        if directory not in listings:
            try:
                listings[directory] = os.listdir(directory)
            except (FileNotFoundError, NotADirectoryError):
                listings[directory] = []
        names = listings[directory]
        base = os.path.basename(path)
        size = mtime_ns = None
        try:
            info = os.stat(path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError(f"{path} is listed in the manifest but is not a regular file.")
            size, mtime_ns = info.st_size, info.st_mtime_ns
        ordered, problem = order_parts(base, names)
        parts = tuple(
            Part(os.path.join(directory, part), index, os.stat(os.path.join(directory, part)).st_size)
            for index, part in ordered
        )
        temp = temp_name(path)
        temp_size = 0
        if os.path.basename(temp) in names:
            temp_size = os.stat(temp).st_size
        else:
            temp = None
        result[name] = Found(name, path, size, mtime_ns, parts, problem, temp, temp_size)
    return result


# --------------------------------------------------------------------------- state records


def default_state_file(model_dir: str) -> str:
    return os.path.join(model_dir, DEFAULT_STATE_FILE)


def load_state(path: str, model_dir: str) -> tuple[dict[str, Record], str | None]:
    """Records of earlier verifications, and a warning when the file had to be ignored.

    A damaged state file only costs a re-verification, so it never fails the run.
    """
    try:
        text = read_text(path)
        if text is None:
            return {}, None
        data = load_json_object(path, text)
    except (OSError, FileContentError) as exc:
        return {}, f"ignoring unreadable state file {path} ({exc}); every file will be re-hashed"
    if data.get("version") != STATE_VERSION:
        return {}, f"ignoring state file {path} of an unknown format; every file will be re-hashed"
    if data.get("model_dir") != os.path.abspath(model_dir):
        # Records describe another directory (moved, or a shared state file): trust none.
        return {}, None
    records: dict[str, Record] = {}
    for name, entry in (data.get("files") or {}).items():
        try:
            records[name] = Record(int(entry["size"]), int(entry["mtime_ns"]), str(entry["sha256"]))
        except (KeyError, TypeError, ValueError):
            continue
    return records, None


def trusted_files(
    model_dir: str,
    state_file: str | None = None,
    manifest: str = DEFAULT_MANIFEST,
    borrow_from: Iterable[str] = (),
) -> list[str]:
    """The manifest entries a run would trust without reading them, in manifest order.

    Exactly :func:`is_trusted`'s files: recorded by an earlier verification and unchanged in size
    and mtime_ns since. The download skips the parts of these shards. Empty when there is no
    usable manifest or state file yet; never raises for a checkpoint that is not there.
    """
    model_dir = os.path.abspath(model_dir)
    try:
        entries = read_manifest(model_dir, manifest)
        found = scan_checkpoint(model_dir, entries)
    except (CheckpointError, OSError):
        return []
    records, _warning = load_state(state_file or default_state_file(model_dir), model_dir)
    borrow_records(model_dir, entries, records, borrow_from)
    return [
        name for name, expected in entries.items() if is_trusted(records.get(name), found[name], expected)
    ]


def _same_file(first: str, second: str) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def borrow_records(
    model_dir: str, manifest: dict[str, str], records: dict[str, Record], sources: Iterable[str]
) -> list[str]:
    """Add to ``records`` the verification another revision's directory (``sources``) holds for a
    file that is the very same file here (a hard link: same inode, so same bytes, size and mtime);
    returns the names borrowed. Nothing is read but the sources' state files."""
    borrowed: list[str] = []
    pending = [name for name in manifest if name not in records]
    for source in sources:
        if not pending:
            break
        source_records, _warning = load_state(default_state_file(source), source)
        for name in list(pending):
            record = source_records.get(name)
            here = os.path.join(model_dir, name)
            if (
                record is None
                or record.sha256 != manifest[name]
                or not _same_file(here, os.path.join(source, name))
            ):
                continue
            records[name] = record
            borrowed.append(name)
            pending.remove(name)
    return borrowed


def render_state(records: dict[str, Record], model_dir: str) -> bytes:
    files = {
        name: {"size": rec.size, "mtime_ns": rec.mtime_ns, "sha256": rec.sha256}
        for name, rec in sorted(records.items())
    }
    document = {"version": STATE_VERSION, "model_dir": os.path.abspath(model_dir), "files": files}
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


# --------------------------------------------------------------------------- planning


def _parts_pattern(path: str) -> str:
    return f"{os.path.basename(path)}.partNN"


def is_trusted(record: Record | None, item: Found, expected: str) -> bool:
    """True when ``record`` vouches for the file as it is now: same size, mtime_ns and hash."""
    return (
        record is not None
        and item.size is not None
        and record.size == item.size
        and record.mtime_ns == item.mtime_ns
        and record.sha256 == expected
    )


def plan_actions(
    manifest: dict[str, str],
    found: dict[str, Found],
    records: dict[str, Record],
    keep_parts: bool,
) -> list[Action]:
    """Decide what each manifest entry needs; pure. Raises when the checkpoint is incomplete.

    * present, and its record matches size, mtime_ns and the manifest hash -> ``trust``;
    * present otherwise -> ``verify``;
    * absent with a complete set of parts -> ``rebuild``;
    * absent without usable parts -> error (all such entries are named at once).

    Parts are deleted only when ``keep_parts`` is false, and only after the shard is verified
    (execution enforces the order; a trusted shard was verified by an earlier run).
    """
    actions: list[Action] = []
    problems: list[str] = []
    for name, expected in manifest.items():
        item = found[name]
        extra = {
            "parts": item.parts,
            "delete_parts": bool(item.parts) and not keep_parts,
            "discard_temp": item.stale_temp,
            "discard_temp_size": item.stale_temp_size,
        }
        if item.size is not None:
            trusted = is_trusted(records.get(name), item, expected)
            kind, size = ("trust", 0) if trusted else ("verify", item.size)
            actions.append(Action(name, item.path, expected, kind, size, **extra))
        elif not item.parts:
            problems.append(
                f"{item.path} is listed in the manifest but missing, and no parts "
                f"({_parts_pattern(item.path)}) were found next to it; re-run the download."
            )
        elif item.parts_problem:
            problems.append(
                f"cannot rebuild {item.path}: {item.parts_problem} among {_parts_pattern(item.path)}; "
                "re-download the missing parts."
            )
        else:
            size = sum(part.size for part in item.parts)
            actions.append(Action(name, item.path, expected, "rebuild", size, **extra))
    if problems:
        raise CheckpointError("checkpoint incomplete: " + " ".join(problems))
    return actions


def plan_changes(actions: list[Action]) -> bool:
    """True when acting would touch the directory (a rebuild, a deletion, a discarded temp)."""
    return any(a.kind == "rebuild" or a.delete_parts or a.discard_temp for a in actions)


def needs_work(actions: list[Action]) -> bool:
    """True when executing the plan would read data or change anything."""
    return plan_changes(actions) or any(a.kind == "verify" for a in actions)


def check_free_space(actions: list[Action], free: Callable[[str], int] | None = None) -> list[dict[str, Any]]:
    """Fail before writing anything when a filesystem cannot hold the shards to rebuild.

    A rebuilt shard needs as many bytes as its parts; rebuilds may run in parallel and the
    parts go only after verification, so each filesystem needs the sum over its shards.
    A stale temporary file about to be discarded counts as available.
    """
    free = free or free_bytes  # looked up at call time so tests can patch free_bytes
    needs: dict[int, dict[str, Any]] = {}
    for action in actions:
        if action.kind != "rebuild":
            continue
        directory = os.path.dirname(action.path)
        device = os.stat(directory).st_dev
        entry = needs.setdefault(device, {"path": directory, "needed": 0, "reclaimable": 0, "shards": []})
        entry["needed"] += action.size
        entry["reclaimable"] += action.discard_temp_size
        entry["shards"].append(action.name)
    report = []
    for entry in needs.values():
        available = free(entry["path"]) + entry["reclaimable"]
        report.append({"path": entry["path"], "needed": entry["needed"], "available": available})
        if available < entry["needed"]:
            raise CheckpointError(
                f"not enough free space in {entry['path']} to rebuild {', '.join(entry['shards'])}: "
                f"needs {entry['needed']} bytes ({entry['needed'] / 2**30:.1f} GiB), "
                f"{available} bytes ({available / 2**30:.1f} GiB) available. Free space on that "
                "filesystem; nothing was written."
            )
    return report


# --------------------------------------------------------------------------- progress


def no_progress() -> ProgressWriter:
    """A progress document kept in memory only (no ``progress_file``).

    Progress is the collection's one document (``_progress.ProgressWriter``): ``done`` and
    ``total`` are the bytes this run reads, ``detail`` the file at hand.
    """
    return ProgressWriter(None, "checkpoint")


# --------------------------------------------------------------------------- hashing and rebuilding


def _read_into(handle, buffer: memoryview, offset: int) -> int:
    count = handle.readinto(buffer)
    _fadvise(handle.fileno(), offset, count, _DONTNEED)
    return count or 0


def hash_file(
    path: str,
    counters: Counters,
    progress: ProgressWriter,
    chunk_size: int | None = None,
) -> str:
    """sha256 of ``path``, read once in large chunks with sequential-read hints."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(chunk_size or CHUNK_SIZE))
    offset = 0
    with _open_read(path) as handle:
        _fadvise(handle.fileno(), 0, 0, _SEQUENTIAL)
        while count := _read_into(handle, buffer, offset):
            digest.update(buffer[:count])
            offset += count
            counters.add(read=count)
            progress.update(advance=count, detail=os.path.basename(path))
    return digest.hexdigest()


def rebuild_shard(
    action: Action,
    counters: Counters,
    progress: ProgressWriter,
    chunk_size: int | None = None,
) -> str:
    """Concatenate the parts into the temporary file while hashing; rename only on a match.

    One pass over the data: each chunk is hashed and written from the same buffer. On a
    mismatch the temporary file is removed and the parts stay untouched.
    """
    temp = temp_name(action.path)
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(chunk_size or CHUNK_SIZE))
    first = os.stat(action.parts[0].path)
    out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, first.st_mode & 0o777)
    renamed = False
    try:
        if os.geteuid() == 0:
            # Run with become, the shard would otherwise belong to root while its parts (and
            # the rest of the checkpoint) belong to the user who downloaded them.
            os.fchown(out, first.st_uid, first.st_gid)
        behind = _WriteBehind(out)
        written = 0
        for part in action.parts:
            offset = 0
            with _open_read(part.path) as handle:
                _fadvise(handle.fileno(), 0, 0, _SEQUENTIAL)
                while count := _read_into(handle, buffer, offset):
                    offset += count
                    digest.update(buffer[:count])
                    view = buffer[:count]
                    while view:
                        done = os.write(out, view)
                        view = view[done:]
                    behind.wrote(written, count)
                    written += count
                    counters.add(read=count, written=count)
                    progress.update(advance=count, detail=action.name)
        actual = digest.hexdigest()
        if actual != action.expected:
            raise CheckpointError(
                f"rebuilt {action.name} from {len(action.parts)} parts does not match the manifest: "
                f"expected sha256 {action.expected}, got {actual}. The parts were kept and the "
                f"temporary file removed; re-download the parts ({_parts_pattern(action.path)})."
            )
        # Durable before it becomes visible: a crash must never leave a short shard whose
        # size and mtime a later run would trust.
        os.fsync(out)
        os.close(out)
        out = -1
        os.replace(temp, action.path)
        renamed = True
        _fsync_directory(os.path.dirname(action.path))
    finally:
        if out >= 0:
            os.close(out)
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
    return actual


def _fsync_directory(directory: str) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be fsynced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- execution


def _relative(model_dir: str, path: str) -> str:
    return os.path.relpath(path, model_dir)


def plan_entry(action: Action, model_dir: str, kind: str) -> dict[str, Any]:
    return {
        "file": action.name,
        "action": kind,
        "size": None,
        "sha256": None,
        "parts": [_relative(model_dir, p.path) for p in action.parts],
        "parts_deleted": [],
        "temp_discarded": False,
        "bytes_read": 0,
        "bytes_written": 0,
        "seconds": 0.0,
    }


def plan_summary(files: list[dict[str, Any]], records: dict[str, Record]) -> dict[str, Any]:
    return {
        "files": files,
        "bytes_read": sum(entry["bytes_read"] for entry in files),
        "bytes_written": sum(entry["bytes_written"] for entry in files),
        "shards": {name: rec.sha256 for name, rec in records.items()},
        "parts_deleted": [part for entry in files for part in entry["parts_deleted"]],
    }


def describe_plan(actions: list[Action], model_dir: str, records: dict[str, Record]) -> dict[str, Any]:
    """What :func:`execute_plan` would do, without reading or writing anything (check mode).

    ``parts_deleted`` and ``temp_discarded`` then say what *would* go; ``sha256`` is only
    given for trusted files, the only ones known to match without reading them.
    """
    files = []
    for action in actions:
        kind = {"trust": "trusted", "verify": "would_verify", "rebuild": "would_rebuild"}[action.kind]
        entry = plan_entry(action, model_dir, kind)
        if action.kind == "trust":
            entry["size"] = records[action.name].size
            entry["sha256"] = action.expected
        else:
            entry["size"] = action.size
        if action.delete_parts:
            entry["parts_deleted"] = list(entry["parts"])
        entry["temp_discarded"] = action.discard_temp is not None
        files.append(entry)
    return plan_summary(files, {a.name: records[a.name] for a in actions if a.kind == "trust"})


@dataclass
class Outcome:
    """Result of :func:`execute_plan`: the report, the records now known good, the errors."""

    report: dict[str, Any]
    records: dict[str, Record]
    errors: list[str]


def mismatch_message(action: Action, actual: str) -> str:
    advice = "re-download it"
    if action.parts:
        advice = "delete it so the next run rebuilds it from its parts"
    return (
        f"{action.path} does not match the manifest: expected sha256 {action.expected}, "
        f"got {actual}; {advice}."
    )


def _run_action(
    action: Action,
    model_dir: str,
    records: dict[str, Record],
    progress: ProgressWriter,
    chunk_size: int | None,
) -> tuple[dict[str, Any], Record | None, str | None]:
    started = time.monotonic()
    entry = plan_entry(action, model_dir, "trusted")
    counters = Counters()
    record = error = None
    try:
        if action.discard_temp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(action.discard_temp)
            entry["temp_discarded"] = True
        if action.kind == "trust":
            record = records[action.name]
        elif action.kind == "rebuild":
            progress.update(phase="rebuilding", detail=action.name)
            actual = rebuild_shard(action, counters, progress, chunk_size)
            entry["action"] = "rebuilt"
        else:
            progress.update(phase="verifying", detail=action.name)
            actual = hash_file(action.path, counters, progress, chunk_size)
            entry["action"] = "verified"
            if actual != action.expected:
                raise CheckpointError(mismatch_message(action, actual))
        if record is None:
            info = os.stat(action.path)
            record = Record(info.st_size, info.st_mtime_ns, actual)
        entry["size"], entry["sha256"] = record.size, record.sha256
        if action.delete_parts:  # only reached once the shard is verified
            for part in action.parts:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part.path)
                entry["parts_deleted"].append(_relative(model_dir, part.path))
    except CheckpointError as exc:
        entry["action"], error = "failed", str(exc)
    except OSError as exc:
        entry["action"] = "failed"
        error = f"{exc.filename or action.path}: {exc.strerror or exc}"
    entry["bytes_read"], entry["bytes_written"] = counters.bytes_read, counters.bytes_written
    entry["seconds"] = round(time.monotonic() - started, 3)
    return entry, record, error


def run_in_pool(actions: list[Action], workers: int, run: Callable[[Action], Any]) -> dict[str, Any]:
    """``{name: run(action)}``, ``workers`` actions at a time.

    Rebuilds start first and larger files before smaller ones, so the longest job does not
    end up alone at the end. hashlib and file IO release the GIL, so the threads hash in
    parallel. ``run`` must not raise for a single file's failure.
    """
    order = sorted(actions, key=lambda a: (a.kind != "rebuild", -a.size))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(zip((a.name for a in order), pool.map(run, order), strict=True))


def execute_plan(
    actions: list[Action],
    model_dir: str,
    records: dict[str, Record],
    *,
    workers: int,
    progress: ProgressWriter | None = None,
    chunk_size: int | None = None,
) -> Outcome:
    """Carry out the plan. Never raises for a single file's failure: see ``Outcome.errors``.

    Each file is one task of :func:`run_in_pool`. One file failing does not stop the others,
    so the caller can persist every good record before it reports the failures.
    """
    progress = progress or no_progress()
    results = run_in_pool(
        actions, workers, lambda a: _run_action(a, model_dir, records, progress, chunk_size)
    )
    files = [results[a.name][0] for a in actions]
    good = {a.name: results[a.name][1] for a in actions if results[a.name][1] is not None}
    errors = [results[a.name][2] for a in actions if results[a.name][2] is not None]
    progress.finish(failed=bool(errors))
    return Outcome(plan_summary(files, good), good, errors)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- EXL3 layout


def count_files(root: str) -> int:
    """Regular files under ``root``, skipping dot-files (rsync's and our temporaries)."""
    total = 0
    for _dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        total += sum(1 for name in filenames if not name.startswith("."))
    return total


def check_exl3(
    model_dir: str,
    *,
    banks: Iterable[str],
    plan_name: str,
    expect_file_count: int | None = None,
) -> dict[str, Any]:
    """Check the EXL3 banks and plan; return ``{file_count, bank_files, plan}``.

    ``file_count`` counts every file under ``exl3/`` so that a worker's copy can be compared
    with the head's (``expect_file_count``).
    """
    root = os.path.join(model_dir, "exl3")
    problems: list[str] = []
    bank_files: dict[str, int] = {}
    for bank in banks:
        directory = os.path.join(root, bank)
        try:
            names = os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            problems.append(f"EXL3 bank directory {directory} is missing")
            continue
        bank_files[bank] = sum(1 for name in names if fnmatch(name, EXL3_BANK_PATTERN))
        if bank_files[bank] == 0:
            problems.append(f"EXL3 bank {directory} holds no {EXL3_BANK_PATTERN} files")
    plan_path = os.path.join(root, "plan", plan_name)
    try:
        plan_text = read_text(plan_path)
        if plan_text is None:
            problems.append(f"EXL3 plan {plan_path} is missing")
        elif "qdir" not in load_json_object(plan_path, plan_text):
            problems.append(f"EXL3 plan {plan_path} has no 'qdir' field")
    except FileContentError as exc:
        problems.append(f"EXL3 plan {exc}")
    except OSError as exc:
        problems.append(f"cannot read EXL3 plan {plan_path}: {exc.strerror or exc}")
    if problems:
        raise CheckpointError("; ".join(problems) + "; re-run the download (or the copy to this node).")
    file_count = count_files(root)
    if expect_file_count is not None and expect_file_count != file_count:
        raise CheckpointError(
            f"{root} holds {file_count} files but the head's copy holds {expect_file_count}; "
            "the copy is incomplete or stale, re-run the copy to this node."
        )
    return {"file_count": file_count, "bank_files": bank_files, "plan": plan_path}


def state_differs(path: str, records: dict[str, Record], model_dir: str) -> bool:
    """True when the state file does not already hold exactly ``records``."""
    try:
        return read_bytes(path) != render_state(records, model_dir)
    except OSError as exc:
        raise CheckpointError(f"cannot read state file {path}: {exc.strerror or exc}") from exc


def save_state(path: str, records: dict[str, Record], model_dir: str) -> bool:
    """Write the state file atomically when its content changes; True when it was written."""
    if not state_differs(path, records, model_dir):
        return False
    try:
        write_file_atomically(path, render_state(records, model_dir))
    except OSError as exc:
        raise CheckpointError(
            f"cannot write state file {path}: {exc.strerror or exc}; set state_file to a writable path."
        ) from exc
    return True


def apply_plan(
    actions: list[Action],
    model_dir: str,
    records: dict[str, Record],
    state_file: str,
    *,
    check_mode: bool,
    workers: int,
    progress_file: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Act on the plan, or only describe it in check mode; persist the records.

    Returns ``(report, errors)``; ``report`` carries ``changed``. Nothing is read when every
    file is trusted, and nothing at all is read or written in check mode.
    """
    errors: list[str] = []
    if check_mode or not needs_work(actions):
        report = describe_plan(actions, model_dir, records)
        good = {a.name: records[a.name] for a in actions if a.kind == "trust"}
    else:
        progress = ProgressWriter(progress_file, "verification", total=sum(a.size for a in actions))
        outcome = execute_plan(actions, model_dir, records, workers=workers, progress=progress)
        report, good, errors = outcome.report, outcome.records, outcome.errors
    try:
        if check_mode:
            state_changed = needs_work(actions) or state_differs(state_file, good, model_dir)
        else:
            # Saved even when some file failed, so the good ones are not read again.
            state_changed = save_state(state_file, good, model_dir)
    except CheckpointError as exc:
        errors.append(str(exc))
        state_changed = False
    touched = any(
        entry["action"] in {"rebuilt", "would_rebuild"} or entry["parts_deleted"] or entry["temp_discarded"]
        for entry in report["files"]
    )
    report["changed"] = bool(state_changed or touched)
    return report, errors


# --------------------------------------------------------------------------- one line of a result


def verification_message(result: dict[str, Any]) -> str:
    """One line about a verification's result (``checkpoint_shards``' ``msg``)."""
    rebuilt = sum(1 for entry in result["files"] if entry["action"] in ("rebuilt", "would_rebuild"))
    exl3 = result.get("exl3_file_count")
    return (
        f"{len(result['files'])} shards match the manifest ({rebuilt} rebuilt, "
        f"{human_bytes(result['bytes_read'])} read)"
        + ("" if exl3 is None else f", {exl3} EXL3 files")
        + f", {len(result['parts_deleted'])} parts deleted"
    )
