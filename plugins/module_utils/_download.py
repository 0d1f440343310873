# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Download the checkpoint from a Hugging Face hub into the model directory, resumably.

Internal to sparkserve.dsv41; not a public API; used by the ``checkpoint_download`` module.
Stdlib only at import time: ``huggingface_hub`` is imported by :class:`HubClient` alone, on the
node, with the Python of the download virtualenv. Tests hand :func:`run_download` a fake client
with the same three methods.

* :func:`ignore_patterns`: the parts of shards that ``checkpoint_shards`` already rebuilt and
  verified (its state file, read through ``_checkpoint.trusted_files``) are not fetched again;
* :func:`run_download`: ``snapshot_download`` with progress from the bytes arriving on disk, and
  ``changed`` from the model directory's file listing before and after;
* :func:`check_download`: what a download would fetch, from the hub's listing (check mode).
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
import time
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, Protocol

from ansible_collections.sparkserve.dsv41.plugins.module_utils._checkpoint import (
    DEFAULT_MANIFEST,
    trusted_files,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    read_text,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import (
    PROGRESS_INTERVAL,
    ProgressWriter,
    human_bytes,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._revisions import HF_DOWNLOAD_CACHE, is_commit

# Never part of the checkpoint's listing: huggingface_hub's metadata and our verification records.
SKIPPED_TOP_DIRS = frozenset({".cache"})


class DownloadError(Exception):
    """A problem the operator has to fix; the message says what. ``changed``: files changed anyway."""

    def __init__(self, message: str, changed: bool = False) -> None:
        super().__init__(message)
        self.changed = changed


class HubMissing(DownloadError):
    """``huggingface_hub`` cannot be imported by this Python."""


class Hub(Protocol):
    """What the download needs of a hub client."""

    def commit(self, repo_id: str, revision: str | None) -> str: ...

    def list_files(self, repo_id: str, revision: str | None) -> dict[str, int]: ...

    def etags(self, repo_id: str, revision: str | None) -> dict[str, str]: ...

    def select(self, names: list[str], ignore_patterns: list[str]) -> list[str]: ...

    def download(
        self, repo_id: str, revision: str | None, local_dir: str, ignore_patterns: list[str], max_workers: int
    ) -> None: ...


class HubClient:
    """``huggingface_hub`` behind the three calls of :class:`Hub`.

    ``endpoint`` and ``token`` are passed to every call: huggingface_hub reads ``HF_ENDPOINT``
    only once, when it is imported, and the token never goes through the environment.
    """

    def __init__(self, endpoint: str | None, token: str | None) -> None:
        try:
            # Imported here, never at module level: only the download virtualenv has it.
            from huggingface_hub import HfApi, snapshot_download  # noqa: PLC0415
            from huggingface_hub.utils import filter_repo_objects  # noqa: PLC0415
        except ImportError as exc:
            raise HubMissing(str(exc)) from exc
        self.endpoint = endpoint
        # False, not None: huggingface_hub sends HF_TOKEN or the `hf auth login` token for None, to
        # any endpoint. No token file means no token.
        self.token: str | bool = token or False
        self.api = HfApi(endpoint=endpoint, token=self.token)
        self._trees: dict[tuple[str, str | None], list[Any]] = {}
        self._snapshot_download = snapshot_download
        self._filter = filter_repo_objects

    def commit(self, repo_id: str, revision: str | None) -> str:
        return self.api.model_info(repo_id, revision=revision).sha

    def _files(self, repo_id: str, revision: str | None) -> list[Any]:
        key = (repo_id, revision)
        if key not in self._trees:  # one listing serves the sizes and the etags
            tree = self.api.list_repo_tree(repo_id, revision=revision, recursive=True)
            self._trees[key] = [entry for entry in tree if getattr(entry, "size", None) is not None]
        return self._trees[key]

    def list_files(self, repo_id: str, revision: str | None) -> dict[str, int]:
        return {entry.path: entry.size for entry in self._files(repo_id, revision)}

    def etags(self, repo_id: str, revision: str | None) -> dict[str, str]:
        """The ETag the hub sends for each file: the sha256 of an LFS file, else its git blob id."""
        return {
            entry.path: entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
            for entry in self._files(repo_id, revision)
        }

    def select(self, names: list[str], ignore_patterns: list[str]) -> list[str]:
        return list(self._filter(names, ignore_patterns=ignore_patterns or None))

    def download(
        self, repo_id: str, revision: str | None, local_dir: str, ignore_patterns: list[str], max_workers: int
    ) -> None:
        self._snapshot_download(
            repo_id,
            revision=revision,
            local_dir=local_dir,
            endpoint=self.endpoint,
            token=self.token,
            ignore_patterns=ignore_patterns or None,
            max_workers=max_workers,
        )


# --------------------------------------------------------------------------- inputs


def read_token(path: str | None) -> str | None:
    """The token in ``path`` (stripped); ``None`` without a path, file or content."""
    if not path:
        return None
    try:
        token = read_text(path)
    except (OSError, FileContentError) as exc:
        raise DownloadError(f"cannot read the token file {path}: {exc}") from exc
    return (token or "").strip() or None


def hub_environment(environ: MutableMapping[str, str], endpoint: str | None) -> str | None:
    """Prepare ``environ`` for huggingface_hub, before it is imported; return the endpoint to use.

    ``endpoint`` wins over ``HF_ENDPOINT``; empty ``HF_ENDPOINT``/``HF_TOKEN`` are dropped (an empty
    endpoint breaks every URL); progress bars stay out of the job's output (the progress file
    says more).
    """
    for name in ("HF_ENDPOINT", "HF_TOKEN"):
        if name in environ and not environ[name].strip():
            del environ[name]
    if endpoint:
        environ["HF_ENDPOINT"] = endpoint
    environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return environ.get("HF_ENDPOINT") or None


def ignore_patterns(
    model_dir: str, state_file: str | None = None, borrow_from: Iterable[str] = ()
) -> list[str]:
    """``<shard>.part*`` for every manifest entry a verification run would trust as it is.

    ``snapshot_download`` fetches every file of the repo missing locally, so without these
    patterns it would fetch the deleted parts of shards 5 and 6 again (~197 GB).
    """
    return [
        f"{glob.escape(name)}.part*" for name in trusted_files(model_dir, state_file, borrow_from=borrow_from)
    ]


# --------------------------------------------------------------------------- the hub's manifest

# The hub's ETag of an LFS file is the sha256 of its content (a small file's is its git blob id).
_SHA256 = frozenset("0123456789abcdef")


def hub_manifest_text(etags: dict[str, str]) -> str:
    """A ``sha256sum``-format manifest of every file the hub keeps in LFS (the weights), for a
    checkpoint that ships none: ``checkpoint_shards`` verifies the download and each copy against it."""
    lines = [
        f"{etag}  {path}"
        for path, etag in sorted(etags.items())
        if len(etag) == 64 and set(etag) <= _SHA256 and "\n" not in path
    ]
    return "".join(f"{line}\n" for line in lines)


def plan_hub_manifest(hub: Hub, repo_id: str, revision: str | None, model_dir: str, name: str) -> str | None:
    """The manifest text to write as ``<model_dir>/<name>``, or None when the one there is the same.

    Raises :class:`DownloadError` when the hub does not list the repo or lists no LFS file: a
    checkpoint nothing can be verified against is not deployed.
    """
    try:
        etags = hub.etags(repo_id, revision)
    except Exception as exc:  # the hub's errors are many; any of them means no manifest
        raise DownloadError(
            f"the hub did not list {repo_id} for its files' sha256 ({_first_line(exc)})"
        ) from exc
    text = hub_manifest_text(etags)
    if not text:
        raise DownloadError(
            f"the hub lists no LFS file of {repo_id} (revision {revision or 'main'}), so no sha256 to verify"
            " the checkpoint against; give the recipe a checkpoint.manifest shipped in the repository"
        )
    try:
        current = read_text(os.path.join(model_dir, name), lenient=True)
    except FileContentError:
        current = None
    return None if current == text else text


# --------------------------------------------------------------------------- the model directory


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


def open_paths(proc_root: str = "/proc") -> set[str]:
    """The files some process of ours has open, from ``/proc/<pid>/fd`` (others' are unreadable,
    and a download of this deployment runs as this user)."""
    paths: set[str] = set()
    with contextlib.suppress(OSError):
        pids = [name for name in os.listdir(proc_root) if name.isdigit()]
        for pid in pids:
            fd_dir = os.path.join(proc_root, pid, "fd")
            with contextlib.suppress(OSError):
                for fd in os.listdir(fd_dir):
                    with contextlib.suppress(OSError):
                        paths.add(os.readlink(os.path.join(fd_dir, fd)))
    return paths


def orphaned_partials(model_dir: str, in_use: set[str]) -> list[tuple[str, int]]:
    """``(path, size)`` of the partial downloads no process is writing: left by a download that was
    killed (a reboot, a kill). huggingface_hub names each attempt's file anew
    (``<hash>.<etag>.<random>.incomplete``) and never resumes another process's, so they only pile up."""
    found = []
    for dirpath, _dirnames, filenames in os.walk(os.path.join(model_dir, HF_DOWNLOAD_CACHE)):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if name.endswith(".incomplete") and os.path.realpath(path) not in in_use:
                with contextlib.suppress(OSError):
                    found.append((path, os.lstat(path).st_size))
    return sorted(found)


def remove_orphaned_partials(model_dir: str, proc_root: str = "/proc") -> tuple[int, int]:
    """Remove :func:`orphaned_partials`; ``(files, bytes)`` removed."""
    files = removed_bytes = 0
    for path, size in orphaned_partials(model_dir, open_paths(proc_root)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            files += 1
            removed_bytes += size
    return files, removed_bytes


def missing_files(model_dir: str, expected: dict[str, int]) -> list[str]:
    """The ``expected`` files that are absent or of another size (what a download would fetch)."""
    missing = []
    for name, size in sorted(expected.items()):
        try:
            present = os.stat(os.path.join(model_dir, name)).st_size == size
        except OSError:
            present = False
        if not present:
            missing.append(name)
    return missing


def download_message(repo_id: str, model_dir: str, comparison: dict[str, Any], files_total: int) -> str:
    if not comparison["changed"]:
        return f"{model_dir} is up to date with {repo_id} ({files_total} files); nothing downloaded"
    count = len(comparison["added"]) + len(comparison["updated"])
    amount = human_bytes(comparison["bytes_added"])
    return f"downloaded {count} files ({amount}) of {repo_id} into {model_dir}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


def list_expected(
    hub: Hub, repo_id: str, revision: str | None, patterns: list[str]
) -> tuple[dict[str, int], str | None]:
    """``({file: size} the download will fetch or keep, None)``, or ``({}, why the hub did not say)``."""
    try:
        sizes = hub.list_files(repo_id, revision)
        selected = hub.select(list(sizes), patterns)
    except Exception as exc:  # the hub's errors are many; the download itself decides what they mean
        return {}, _first_line(exc)
    return {name: sizes[name] for name in selected}, None


# The hub answered, and the answer is "no": a typo in checkpoint_revision, a repo that is gone or
# needs another token. Keeping the revision on disk would hide it.
HUB_REFUSALS = frozenset({"RevisionNotFoundError", "RepositoryNotFoundError", "GatedRepoError"})


def resolve_commit(
    hub: Hub, repo_id: str, revision: str | None, on_disk: list[str]
) -> tuple[str, str | None]:
    """``(commit, warning)``: the commit ``revision`` (a branch, tag or commit; ``None``: main) is now.

    A 40-hex ``revision`` is a commit already and needs no hub. When the hub cannot be reached (or
    errs), the only revision ``on_disk`` keeps serving, with a warning, as a single directory did
    before; with several, guessing could switch to one that failed, so :class:`DownloadError` says
    how to pin one. A hub that refuses the revision or the repo fails the run.
    """
    if revision and is_commit(revision):
        return revision, None
    try:
        return hub.commit(repo_id, revision), None
    except Exception as exc:  # the hub's errors are many; the refusals are told apart below
        why = _first_line(exc)
        refused = type(exc).__name__ in HUB_REFUSALS
    if refused:
        raise DownloadError(
            f"the hub has no revision {revision or 'main'} of {repo_id} for this token ({why}); check"
            " checkpoint_repo_id, checkpoint_revision and checkpoint_hf_token"
        )
    if len(on_disk) == 1:
        return on_disk[0], (
            f"the hub did not resolve {repo_id} revision {revision or 'main'} ({why});"
            f" keeping the only revision on disk, {on_disk[0]}"
        )
    held = ", ".join(on_disk) if on_disk else "none"
    raise DownloadError(
        f"the hub did not resolve {repo_id} revision {revision or 'main'} ({why}); revisions on disk: {held}."
        " To run without the hub, set checkpoint_revision to the commit of one of them"
    )


# --------------------------------------------------------------------------- the download


def _hf_metadata(model_dir: str, name: str) -> str:
    return os.path.join(model_dir, HF_DOWNLOAD_CACHE, f"{name}.metadata")


def _metadata_etag(model_dir: str, name: str) -> str | None:
    """The etag huggingface_hub recorded for ``name`` in ``model_dir`` (its second line)."""
    try:
        lines = (read_text(_hf_metadata(model_dir, name)) or "").splitlines()
    except (OSError, FileContentError):
        return None
    return lines[1].strip() if len(lines) >= 3 else None


def _link(source: str, target: str) -> bool:
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(source, target)
    except OSError:  # another filesystem, a race: the download fetches it instead
        return False
    return True


def link_revision(
    hub: Hub, repo_id: str, revision: str | None, model_dir: str, sources: list[str]
) -> list[str]:
    """:func:`link_unchanged` for ``revision`` as the hub lists it; nothing when it does not say
    (the download then reports why)."""
    try:
        sizes, etags = hub.list_files(repo_id, revision), hub.etags(repo_id, revision)
    except Exception:  # the download's own listing fails the same way and says why
        return []
    os.makedirs(model_dir, exist_ok=True)
    return link_unchanged(
        model_dir, sources, {name: (sizes[name], etags[name]) for name in sizes if name in etags}
    )


def link_unchanged(model_dir: str, sources: Iterable[str], files: dict[str, tuple[int, str]]) -> list[str]:
    """Hard-link into ``model_dir`` what other revisions' directories (``sources``, preferred first)
    hold unchanged, so that a new revision fetches only what changed; the names linked.

    ``files`` is the new revision's ``{name: (size, etag)}``. A file is unchanged when a source has
    it at that size with that etag in huggingface_hub's metadata, which is linked beside it, so the
    download only asks the hub (one HEAD) and keeps it. The rebuilt shards, which the hub holds only
    as parts, are linked when the manifest is the same file as the source's and the source's
    verification vouches for them (the verification borrows those records). Nothing already in
    ``model_dir`` is replaced, and files are never written through a link (every writer renames a
    new file into place), so a revision never changes another.
    """
    sources = [source for source in sources if os.path.isdir(source)]
    linked: list[str] = []
    for name, (size, etag) in sorted(files.items()):
        target = os.path.join(model_dir, name)
        if os.path.lexists(target):
            continue
        for source in sources:
            path = os.path.join(source, name)
            if (
                _metadata_etag(source, name) != etag
                or not os.path.isfile(path)
                or os.path.getsize(path) != size
            ):
                continue
            metadata = read_text(_hf_metadata(source, name)) or ""
            if _link(path, target):
                os.makedirs(os.path.dirname(_hf_metadata(model_dir, name)), exist_ok=True)
                with open(_hf_metadata(model_dir, name), "w", encoding="utf-8") as handle:
                    handle.write(metadata)
                linked.append(name)
                break
    manifest = os.path.join(model_dir, DEFAULT_MANIFEST)
    for source in sources:
        if not os.path.exists(manifest) or not os.path.samefile(
            manifest, os.path.join(source, DEFAULT_MANIFEST)
        ):
            continue
        for name in trusted_files(source):
            target = os.path.join(model_dir, name)
            if not os.path.lexists(target) and _link(os.path.join(source, name), target):
                linked.append(name)
    return linked


def check_download(
    hub: Hub, *, repo_id: str, revision: str | None, model_dir: str, patterns: list[str]
) -> dict[str, Any]:
    """What :func:`run_download` would fetch, from the hub's listing; writes nothing (check mode).

    ``would_download``: the files absent here or of another size. huggingface_hub may also
    fetch a file of the same size whose content changed upstream; that shows only in a real run.
    """
    expected, listing_error = list_expected(hub, repo_id, revision, patterns)
    would = missing_files(model_dir, expected)
    orphans = orphaned_partials(model_dir, open_paths())
    if listing_error:
        message = f"the hub did not list {repo_id} ({listing_error}); cannot tell what a download would fetch"
    elif would:
        amount = human_bytes(sum(expected[name] for name in would))
        message = f"would download {len(would)} files ({amount}) of {repo_id} into {model_dir}"
    else:
        message = f"{model_dir} holds every file of {repo_id} ({len(expected)} files); nothing to download"
    if orphans:
        message += (
            f"; would remove {len(orphans)} partial downloads left by an interrupted run"
            f" ({human_bytes(sum(size for _path, size in orphans))})"
        )
    return {
        "changed": bool(would or orphans),
        "would_download": would,
        "partials_removed": len(orphans),
        "files_total": len(expected),
        "bytes_total": sum(expected.values()) if expected else None,
        "listing_error": listing_error,
        "msg": message,
    }


def run_download(
    hub: Hub,
    *,
    repo_id: str,
    revision: str | None,
    model_dir: str,
    patterns: list[str],
    workers: int,
    progress: ProgressWriter,
    interval: float = PROGRESS_INTERVAL,
    monotonic: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Download ``repo_id`` into ``model_dir`` skipping ``patterns``; the module's result.

    ``progress`` counts the bytes this run adds (files already in place are the ``detail``).
    Raises :class:`DownloadError` (with ``changed``) when the download fails.
    """
    started = monotonic()
    before = listing(model_dir)
    # Before counting what is there: a killed run's partial files would count as progress.
    orphans, orphan_bytes = remove_orphaned_partials(model_dir)
    progress.update(force=True, phase="listing")
    expected, listing_error = list_expected(hub, repo_id, revision, patterns)
    total = sum(expected.values()) if expected else None
    present = downloaded_bytes(model_dir, expected) if expected else 0
    progress.update(
        force=True,
        phase="downloading",
        done=0,
        total=None if total is None else total - present,
        detail=f"{human_bytes(present)} of {human_bytes(total)} already there" if present else None,
    )

    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval):
            progress.update(done=max(0, downloaded_bytes(model_dir, expected) - present))

    watcher = threading.Thread(target=watch, daemon=True)
    if expected:
        watcher.start()
    try:
        hub.download(repo_id, revision, model_dir, patterns, workers)
    except Exception as exc:
        stop.set()
        progress.finish(failed=True)
        comparison = compare_listings(before, listing(model_dir))
        raise DownloadError(
            f"downloading {repo_id} (revision {revision or 'main'}) into {model_dir} failed: "
            f"{type(exc).__name__}: {exc}",
            comparison["changed"],
        ) from exc
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
    comparison = compare_listings(before, listing(model_dir))
    if expected:
        progress.finish(done=max(0, downloaded_bytes(model_dir, expected) - present))
    else:
        progress.finish(done=comparison["bytes_added"])
    message = download_message(repo_id, model_dir, comparison, len(expected))
    if orphans:
        amount = human_bytes(orphan_bytes)
        message += f"; removed {orphans} partial downloads left by an interrupted run ({amount})"
    if listing_error:
        # huggingface_hub keeps an existing local_dir when the hub cannot be asked (offline, 401).
        message += f"; WARNING: the hub did not list the repo ({listing_error}), the local files were kept"
    return {
        "changed": comparison["changed"] or orphans > 0,
        "partials_removed": orphans,
        "files_total": len(expected),
        "bytes_total": total,
        "added": comparison["added"],
        "updated": comparison["updated"],
        "bytes_downloaded": comparison["bytes_added"],
        "seconds": round(monotonic() - started, 3),
        "listing_error": listing_error,
        "msg": message,
    }
