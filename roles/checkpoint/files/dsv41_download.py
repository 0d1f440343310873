"""Checkpoint helper of the sparkserve.dsv41 ``checkpoint`` role.

Sub-commands (each prints one JSON document on stdout; errors also go to stderr):

``space --path DIR``
    Free bytes on the filesystem that holds DIR (or its nearest existing parent) and the bytes
    already under DIR, for the role's free-space check. Stdlib only.
``download --repo-id R [--revision REV] --local-dir DIR [--token-file F] [--progress-file P]``
    ``huggingface_hub.snapshot_download`` into DIR. Parts of shards that the ``checkpoint_shards``
    module has already rebuilt and verified are not fetched again. Prints a summary with
    ``changed`` (the file listing of DIR, ``.cache/`` aside, differs before and after). Needs
    ``huggingface_hub`` (the role runs it with its virtualenv's Python). ``HF_ENDPOINT`` and
    the other ``HF_*`` variables come from the environment; the token is read from a file so
    that it is never on a command line.
``rsync --progress-file P -- rsync ARGS...``
    Runs rsync (with ``--itemize-changes --info=progress2``), turns its progress into the
    progress file and prints a summary with ``changed`` (rsync itemized at least one change).
    Exits with rsync's exit code. Stdlib only.
``wait --job RESULTS_FILE [--progress-file P] [--what LABEL] [--seconds N]``
    Waits up to N seconds for an Ansible async job to finish and prints
    ``{"finished": bool, "failed": bool, "error": str, "line": "<one line of progress>"}``.
    Stdlib only.

Progress files are JSON: ``{phase, file, bytes_done, bytes_total, started, updated}`` (the
format of the ``checkpoint_shards`` module), optionally with ``bytes_start`` (bytes already
there when the job started), ``percent`` and ``rate``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

PROGRESS_INTERVAL = 2.0
STATE_FILE = os.path.join(".cache", "sparkserve", "verified.json")
STATE_VERSION = 1
HF_DOWNLOAD_CACHE = os.path.join(".cache", "huggingface", "download")
SKIPPED_TOP_DIRS = {".cache"}


class ToolError(Exception):
    """A problem the operator has to fix; the message says what."""


# --------------------------------------------------------------------------- small helpers


def human_bytes(count: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; binary units, one decimal."""
    if count is None:
        return "?"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def human_seconds(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def write_json_atomically(path: str, document: dict[str, Any]) -> None:
    """Readers see the old or the new document, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(document, handle)
            handle.write("\n")
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def read_json(path: str | None) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when absent, empty, unreadable or not an object."""
    if not path:
        return None
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class ProgressWriter:
    """Writes the progress document at most every ``interval`` seconds (always when forced)."""

    def __init__(
        self,
        path: str | None,
        bytes_total: int | None = None,
        bytes_start: int = 0,
        clock: Callable[[], float] = time.time,
        interval: float = PROGRESS_INTERVAL,
    ) -> None:
        self.path = path
        self.clock = clock
        self.interval = interval
        self.last_write: float | None = None
        now = clock()
        self.state: dict[str, Any] = {
            "phase": "starting",
            "file": None,
            "bytes_done": bytes_start,
            "bytes_total": bytes_total,
            "bytes_start": bytes_start,
            "started": round(now, 3),
            "updated": round(now, 3),
        }

    def update(self, force: bool = False, **fields: Any) -> bool:
        """Merge ``fields`` into the document; write it when due. True when written."""
        self.state.update(fields)
        if self.path is None:
            return False
        now = self.clock()
        if not force and self.last_write is not None and now - self.last_write < self.interval:
            return False
        self.last_write = now
        self.state["updated"] = round(now, 3)
        with contextlib.suppress(OSError):  # progress is a courtesy, never a failure
            write_json_atomically(self.path, self.state)
        return True


# --------------------------------------------------------------------------- space


def nearest_existing(path: str) -> str:
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
    existing = nearest_existing(path)
    info = os.statvfs(existing)
    return {
        "path": os.path.abspath(path),
        "measured_at": existing,
        "free_bytes": info.f_bavail * info.f_frsize,
        "present_bytes": tree_bytes(path) if os.path.isdir(path) else 0,
    }


# --------------------------------------------------------------------------- download planning


def verified_shards(model_dir: str, state_file: str | None = None) -> list[str]:
    """Shards (``*.safetensors``) the ``checkpoint_shards`` module verified and that are unchanged.

    Reads its state file (``<model_dir>/.cache/sparkserve/verified.json``: ``{version, model_dir,
    files: {name: {size, mtime_ns, sha256}}}``) and keeps the records whose file still has the
    recorded size and mtime_ns, exactly the files that module would trust without reading them.
    """
    model_dir = os.path.abspath(model_dir)
    data = read_json(state_file or os.path.join(model_dir, STATE_FILE))
    if not data or data.get("version") != STATE_VERSION or data.get("model_dir") != model_dir:
        return []
    files = data.get("files")
    if not isinstance(files, dict):
        return []
    shards = []
    for name, record in sorted(files.items()):
        if not name.endswith(".safetensors") or not isinstance(record, dict):
            continue
        try:
            info = os.stat(os.path.join(model_dir, name))
            unchanged = info.st_size == int(record["size"]) and info.st_mtime_ns == int(record["mtime_ns"])
        except (OSError, KeyError, TypeError, ValueError):
            continue
        if unchanged:
            shards.append(name)
    return shards


def ignore_patterns(model_dir: str, state_file: str | None = None) -> list[str]:
    """``<shard>.part*`` for every shard already rebuilt and verified.

    ``snapshot_download`` fetches every file of the repo that is missing locally, so without
    these patterns it would download the deleted parts of shards 5 and 6 again (~460 GB).
    """
    return [f"{glob.escape(name)}.part*" for name in verified_shards(model_dir, state_file)]


def listing(model_dir: str) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of the files under ``model_dir``, ``.cache/`` aside."""
    result: dict[str, tuple[int, int]] = {}
    if not os.path.isdir(model_dir):
        return result
    for dirpath, dirnames, filenames in os.walk(model_dir):
        if dirpath == model_dir:
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_TOP_DIRS]
        for name in filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                result[os.path.relpath(path, model_dir)] = (info.st_size, info.st_mtime_ns)
    return result


def compare_listings(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """What changed between two :func:`listing` results; ``changed`` is true on any difference."""
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    updated = sorted(name for name in set(before) & set(after) if before[name] != after[name])
    return {
        "changed": bool(added or removed or updated),
        "added": added,
        "updated": updated,
        "removed": removed,
        "bytes_added": sum(after[name][0] for name in added + updated),
    }


def downloaded_bytes(model_dir: str, expected: dict[str, int]) -> int:
    """Bytes of the ``expected`` files that are in place, plus the ones still downloading.

    ``huggingface_hub`` writes each file as ``.cache/huggingface/download/…/*.incomplete`` and
    renames it into place when done, so the sum grows steadily while it works.
    """
    done = 0
    for name, size in expected.items():
        with contextlib.suppress(OSError):
            done += min(os.stat(os.path.join(model_dir, name)).st_size, size)
    for dirpath, _dirnames, filenames in os.walk(os.path.join(model_dir, HF_DOWNLOAD_CACHE)):
        for name in filenames:
            if name.endswith(".incomplete"):
                with contextlib.suppress(OSError):
                    done += os.stat(os.path.join(dirpath, name)).st_size
    total = sum(expected.values())
    return min(done, total) if total else done


def download_message(repo_id: str, model_dir: str, comparison: dict[str, Any], files_total: int) -> str:
    if not comparison["changed"]:
        return f"{model_dir} is up to date with {repo_id} ({files_total} files); nothing downloaded"
    count = len(comparison["added"]) + len(comparison["updated"])
    amount = human_bytes(comparison["bytes_added"])
    return f"downloaded {count} files ({amount}) of {repo_id} into {model_dir}"


def read_token(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path) as handle:
            token = handle.read().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ToolError(f"cannot read the token file {path}: {exc.strerror or exc}") from exc
    return token or None


def clean_hf_environment(environ: dict[str, str] | os._Environ) -> None:
    """Drop empty ``HF_ENDPOINT``/``HF_TOKEN`` (an empty endpoint would break every URL) and
    keep ``huggingface_hub``'s progress bars out of the job's captured output."""
    for name in ("HF_ENDPOINT", "HF_TOKEN"):
        if name in environ and not environ[name].strip():
            del environ[name]
    environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def run_download(args: argparse.Namespace) -> dict[str, Any]:
    clean_hf_environment(os.environ)
    # Imported here: the other sub-commands run with the system Python, without huggingface_hub.
    from huggingface_hub import HfApi, snapshot_download  # noqa: PLC0415
    from huggingface_hub.utils import filter_repo_objects  # noqa: PLC0415

    model_dir = os.path.abspath(args.local_dir)
    revision = args.revision or None
    token = read_token(args.token_file)
    patterns = ignore_patterns(model_dir)
    started = time.monotonic()
    before = listing(model_dir)
    progress = ProgressWriter(args.progress_file)
    progress.update(force=True, phase="listing")

    # Passed explicitly: huggingface_hub reads HF_ENDPOINT only once, when it is imported.
    endpoint = os.environ.get("HF_ENDPOINT") or None
    expected: dict[str, int] = {}
    listing_error = None
    try:  # for progress only; snapshot_download decides what an unreachable hub means
        api = HfApi(endpoint=endpoint, token=token)
        tree = api.list_repo_tree(args.repo_id, revision=revision, recursive=True)
        sizes = {entry.path: entry.size for entry in tree if getattr(entry, "size", None) is not None}
        selected = filter_repo_objects(sizes, ignore_patterns=patterns or None)
        expected = {name: sizes[name] for name in selected}
    except Exception as exc:
        listing_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    total = sum(expected.values()) if expected else None
    start_bytes = downloaded_bytes(model_dir, expected) if expected else 0
    progress.update(
        force=True, phase="downloading", bytes_total=total, bytes_done=start_bytes, bytes_start=start_bytes
    )

    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(PROGRESS_INTERVAL):
            if expected:
                progress.update(bytes_done=downloaded_bytes(model_dir, expected))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        snapshot_download(
            args.repo_id,
            revision=revision,
            local_dir=model_dir,
            endpoint=endpoint,
            token=token,
            ignore_patterns=patterns or None,
            max_workers=args.max_workers,
        )
    except Exception as exc:
        stop.set()
        progress.update(force=True, phase="failed")
        comparison = compare_listings(before, listing(model_dir))
        raise ToolError(
            f"downloading {args.repo_id} (revision {revision or 'main'}) into {model_dir} failed: "
            f"{type(exc).__name__}: {exc}",
            comparison["changed"],
        ) from exc
    stop.set()
    watcher.join()
    done = downloaded_bytes(model_dir, expected) if expected else None
    progress.update(force=True, phase="done", bytes_done=done if done is not None else total)
    comparison = compare_listings(before, listing(model_dir))
    message = download_message(args.repo_id, model_dir, comparison, len(expected))
    if listing_error:
        # huggingface_hub keeps an existing local_dir when the hub cannot be asked (offline, 401).
        message += f"; WARNING: the hub did not list the repo ({listing_error}), the local files were kept"
    return {
        "changed": comparison["changed"],
        "repo_id": args.repo_id,
        "revision": revision or "main",
        "model_dir": model_dir,
        "ignore_patterns": patterns,
        "files_total": len(expected),
        "bytes_total": total,
        "added": comparison["added"],
        "updated": comparison["updated"],
        "bytes_downloaded": comparison["bytes_added"],
        "seconds": round(time.monotonic() - started, 3),
        "listing_error": listing_error,
        "message": message,
    }


# --------------------------------------------------------------------------- rsync

# "  1,234,567  45%  120.00MB/s    0:01:23 (xfr#3, to-chk=10/200)"
_RSYNC_PROGRESS = re.compile(
    r"^\s*(?P<bytes>[\d,.]+)(?P<unit>[KMGT]?)\s+(?P<percent>\d+)%\s+(?P<rate>\S+/s)\s"
)
# "YXcstpoguax name": update type, file type, 9 attribute flags (rsync --itemize-changes).
_RSYNC_ITEM = re.compile(r"^(?:[<>ch.][fdLDS][ .+?a-zA-Z]{9}|\*deleting\s*) (?P<name>.+)$")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class RsyncOutput:
    """Splits rsync's stdout (lines end in ``\\n``, progress updates in ``\\r``) and sorts it."""

    def __init__(self) -> None:
        self.pending = b""
        self.items: list[str] = []
        self.messages: list[str] = []
        self.bytes_done = 0
        self.percent: int | None = None
        self.rate: str | None = None
        self.file: str | None = None

    def feed(self, chunk: bytes) -> None:
        segments = re.split(rb"[\r\n]", self.pending + chunk)
        self.pending = segments.pop()
        for segment in segments:
            self.line(segment.decode(errors="replace"))

    def close(self) -> None:
        if self.pending:
            self.line(self.pending.decode(errors="replace"))
            self.pending = b""

    def line(self, text: str) -> None:
        if not text.strip():
            return
        progress = _RSYNC_PROGRESS.match(text)
        if progress:
            number = float(progress.group("bytes").replace(",", ""))
            self.bytes_done = int(number * _UNITS[progress.group("unit")])
            self.percent = int(progress.group("percent"))
            self.rate = progress.group("rate")
            return
        item = _RSYNC_ITEM.match(text)
        if item:
            self.items.append(text)
            self.file = item.group("name")
            return
        self.messages.append(text)
        del self.messages[:-20]

    def progress_fields(self) -> dict[str, Any]:
        return {"bytes_done": self.bytes_done, "percent": self.percent, "rate": self.rate, "file": self.file}

    def summary(self, returncode: int) -> dict[str, Any]:
        return {
            "changed": bool(self.items),
            "rc": returncode,
            "itemized_count": len(self.items),
            "itemized": self.items[:50],
            "messages": self.messages,
            "bytes_done": self.bytes_done,
        }


def run_rsync(progress_file: str | None, argv: list[str]) -> tuple[dict[str, Any], int]:
    if not argv:
        raise ToolError("no rsync command given after --")
    progress = ProgressWriter(progress_file)
    progress.update(force=True, phase="copying")
    output = RsyncOutput()
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE)  # noqa: S603 - argv from the role
    except OSError as exc:
        raise ToolError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    assert process.stdout is not None
    while chunk := process.stdout.read1(65536):
        output.feed(chunk)
        progress.update(**output.progress_fields())
    output.close()
    returncode = process.wait()
    progress.update(force=True, phase="done" if returncode == 0 else "failed", **output.progress_fields())
    summary = output.summary(returncode)
    count = summary["itemized_count"]
    summary["message"] = (
        f"rsync changed {count} item(s)" if count else "the copy was up to date; rsync changed nothing"
    )
    return summary, returncode


# --------------------------------------------------------------------------- waiting


def job_outcome(data: dict[str, Any] | None) -> dict[str, Any]:
    """``{finished, failed, error}`` of an Ansible async job from its results file's content.

    The async wrapper writes ``{"started": 1, "finished": 0, ...}`` when it starts the job and
    replaces it atomically with the module's result (no ``started`` key) when the job ends, or
    with ``{"failed": 1, "msg": "Timeout exceeded"}`` when it kills the job at its timeout.
    ``finished`` is decided as async_status decides it.
    """
    if data is None or ("started" in data and not data.get("finished")):
        return {"finished": False, "failed": False, "error": ""}
    rc = data.get("rc")
    failed = bool(data.get("failed")) or (isinstance(rc, int) and rc != 0)
    error = ""
    if failed:
        stderr = str(data.get("stderr") or "").strip()
        error = stderr[-2000:] if stderr else str(data.get("msg") or f"exit code {rc}")
    return {"finished": True, "failed": failed, "error": error}


def job_finished(results_file: str) -> bool:
    """Whether the Ansible async job writing ``results_file`` is done."""
    return job_outcome(read_json(results_file))["finished"]


def progress_line(what: str, doc: dict[str, Any] | None, finished: bool, now: float) -> str:
    """One human line from a progress document (``doc=None``: none written yet)."""
    if doc is None:
        return f"{what}: {'finished' if finished else 'starting'}"
    phase = "finished" if finished else str(doc.get("phase") or "running")
    done = doc.get("bytes_done")
    total = doc.get("bytes_total")
    parts = []
    if isinstance(done, (int, float)):
        amount = human_bytes(done)
        if isinstance(total, (int, float)) and total > 0:
            amount += f" of {human_bytes(total)}"
        parts.append(amount)
    percent = doc.get("percent")
    if percent is None and isinstance(done, (int, float)) and isinstance(total, (int, float)) and total > 0:
        percent = 100.0 * done / total
    if percent is not None:
        parts.append(f"{float(percent):.1f}%")
    rate = doc.get("rate")
    started, updated = doc.get("started"), doc.get("updated")
    if not rate and isinstance(done, (int, float)) and isinstance(started, (int, float)):
        span = (updated if isinstance(updated, (int, float)) else now) - started
        moved = done - (doc.get("bytes_start") or 0)
        if span > 0 and moved > 0:
            rate = f"{human_bytes(moved / span)}/s"
    if rate:
        parts.append(str(rate))
    if doc.get("file"):
        parts.append(os.path.basename(str(doc["file"]).rstrip("/")) or str(doc["file"]))
    if isinstance(started, (int, float)):
        parts.append(f"after {human_seconds(now - started)}")
    return f"{what}: {phase}" + (f", {', '.join(parts)}" if parts else "")


def run_wait(
    results_file: str,
    progress_file: str | None,
    what: str,
    seconds: float,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    deadline = clock() + seconds
    while True:
        outcome = job_outcome(read_json(results_file))
        remaining = deadline - clock()
        if outcome["finished"] or remaining <= 0:
            break
        sleep(min(1.0, remaining))
    line = progress_line(what, read_json(progress_file), outcome["finished"], clock())
    if outcome["failed"]:
        line += " (failed)"
    return {**outcome, "line": line}


# --------------------------------------------------------------------------- command line


def parse_args(argv: Iterable[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    space = commands.add_parser("space", help="free and used bytes for the checkpoint")
    space.add_argument("--path", required=True)

    download = commands.add_parser("download", help="download the checkpoint with huggingface_hub")
    download.add_argument("--repo-id", required=True)
    download.add_argument("--revision", default="")
    download.add_argument("--local-dir", required=True)
    download.add_argument("--token-file", help="file holding the token; absent or empty: none")
    download.add_argument("--progress-file")
    download.add_argument("--max-workers", type=int, default=8)

    rsync = commands.add_parser("rsync", help="run rsync, recording its progress")
    rsync.add_argument("--progress-file")
    rsync.add_argument("argv", nargs=argparse.REMAINDER, help="-- rsync ARGS...")

    wait = commands.add_parser("wait", help="wait for an Ansible async job, print its progress")
    wait.add_argument("--job", required=True, help="the job's results_file")
    wait.add_argument("--progress-file")
    wait.add_argument("--what", default="job")
    wait.add_argument("--seconds", type=float, default=20.0)
    return parser.parse_args(list(argv))


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "space":
            result, code = space_report(args.path), 0
        elif args.command == "download":
            result, code = run_download(args), 0
        elif args.command == "rsync":
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            result, code = run_rsync(args.progress_file, command)
        else:
            result, code = run_wait(args.job, args.progress_file, args.what, args.seconds), 0
    except ToolError as exc:
        changed = bool(exc.args[1]) if len(exc.args) > 1 else False
        print(exc.args[0], file=sys.stderr)
        print(json.dumps({"changed": changed, "error": exc.args[0]}))
        return 1
    print(json.dumps(result))
    return code


if __name__ == "__main__":
    sys.exit(main())
