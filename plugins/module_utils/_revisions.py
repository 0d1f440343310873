# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Checkpoint revisions side by side under a model root.

Internal to sparkserve.dsv41; not a public API. Stdlib only (the ``checkpoint_revision`` module
resolves a revision with ``huggingface_hub`` through ``_download.HubClient``).

Each revision lives in ``<root>/revisions/<commit>``: a new one is downloaded, verified and copied
next to the one the ranks mount, which keeps serving until the switch. A directory of the older
single-directory layout (the checkpoint straight in ``<root>``, as the original ``download.sh``
and earlier versions of this collection left it) is *adopted*: renamed as a whole into
``<root>/revisions/<commit>``. A rename keeps the directory's inode, so ranks that mount it keep
their files, and its verification records move with it.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._checkpoint import (
    DEFAULT_STATE_FILE,
    write_file_atomically,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    read_text,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._release import LEGACY_RECIPE

REVISIONS = "revisions"
# What the adoption recorded: the commit the single directory became (a worker that received its
# copy from the head is adopted under the same name).
ADOPTED_FILE = ".adopted.json"
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# Names that make a directory a checkpoint of the single-directory layout.
_CHECKPOINT_MARKERS = ("config.json", "sha256-manifest.txt", "model.safetensors.index.json", ".cache")
# huggingface_hub's metadata of a file downloaded with local_dir: commit, etag, time, one per line.
HF_DOWNLOAD_CACHE = os.path.join(".cache", "huggingface", "download")


class RevisionError(ValueError):
    """The layout cannot be brought where it should be without guessing; nothing was changed."""


def is_commit(name: str) -> bool:
    return bool(COMMIT_RE.match(name))


def revisions_dir(root: str) -> str:
    return os.path.join(root, REVISIONS)


def revision_path(root: str, commit: str) -> str:
    return os.path.join(root, REVISIONS, commit)


def staging_path(root: str) -> str:
    """Where the single directory waits while the layout around it is built (a sibling of
    ``root``, so on its filesystem)."""
    parent, name = os.path.split(os.path.abspath(root))
    return os.path.join(parent, f".{name}.adopting")


def list_revisions(root: str) -> list[str]:
    """The revision directories under ``root``, newest (by modification time) first."""
    base = revisions_dir(root)
    try:
        entries = [
            entry
            for entry in os.scandir(base)
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)
        ]
    except FileNotFoundError:
        return []
    entries.sort(key=lambda entry: (entry.stat().st_mtime_ns, entry.name), reverse=True)
    return [entry.name for entry in entries]


def _own_entries(root: str) -> list[str]:
    """The names in ``root`` other than ``revisions/`` and the links into it."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return [name for name in names if name != REVISIONS and not os.path.islink(os.path.join(root, name))]


def is_single_directory(root: str) -> bool:
    """``root`` holds a checkpoint itself (the single-directory layout)."""
    names = set(_own_entries(root))
    return bool(names.intersection(_CHECKPOINT_MARKERS)) or any(".safetensors" in name for name in names)


def metadata_commits(model_dir: str) -> collections.Counter[str]:
    """How many of huggingface_hub's local-dir metadata files name each commit."""
    counts: collections.Counter[str] = collections.Counter()
    for directory, _dirs, files in os.walk(os.path.join(model_dir, HF_DOWNLOAD_CACHE)):
        for name in files:
            if not name.endswith(".metadata"):
                continue
            try:
                first = (read_text(os.path.join(directory, name)) or "").split("\n", 1)[0].strip()
            except (OSError, FileContentError):
                continue
            if is_commit(first):
                counts[first] += 1
    return counts


def read_adopted(root: str) -> str | None:
    """The commit an earlier adoption named the single directory, if one happened here."""
    try:
        data = json.loads(read_text(os.path.join(revisions_dir(root), ADOPTED_FILE)) or "null")
    except (OSError, FileContentError, ValueError):
        return None
    commit = data.get("commit") if isinstance(data, dict) else None
    return commit if isinstance(commit, str) and is_commit(commit) else None


def adoption_plan(root: str, adopt_as: str | None) -> dict[str, Any] | None:
    """What adopting ``root`` does (``{source, commit, why}``), ``None`` when there is nothing to adopt.

    The name comes from the directory itself (the commit huggingface_hub recorded for its files),
    else from ``adopt_as``. Raises :class:`RevisionError`, before anything changes, when neither
    says (a wrong name would let a later download rewrite the files the ranks serve) or when the
    directory cannot be moved whole.
    """
    root = os.path.abspath(root)
    staged = staging_path(root)
    if os.path.isdir(staged):
        source = staged  # an adoption that was interrupted: go on with it
    elif is_single_directory(root):
        source = root
        if os.path.islink(root) or os.path.ismount(root):
            raise RevisionError(
                f"{root} holds a checkpoint of the single-directory layout and is a "
                f"{'symbolic link' if os.path.islink(root) else 'mount point'}, which cannot be moved into"
                f" {revisions_dir(root)}; point deployment_model_dir at a directory on that filesystem"
                " and move the checkpoint into <it>/revisions/<commit> (nothing was changed)"
            )
        if os.path.isdir(revisions_dir(root)):
            raise RevisionError(
                f"{root} holds both revisions/ and checkpoint files of its own"
                f" ({', '.join(sorted(_own_entries(root))[:5])}); move those away (nothing was changed)"
            )
        if not os.access(root, os.W_OK):
            # Moving a directory to another parent rewrites its "..": it must be writable.
            raise RevisionError(f"{root} is not writable, so it cannot be moved into {revisions_dir(root)}")
    else:
        return None
    commits = metadata_commits(source)
    if commits:
        commit, count = commits.most_common(1)[0]
        why = f"huggingface_hub's metadata names commit {commit} for {count} of its files"
    elif adopt_as:
        if not is_commit(adopt_as):
            raise RevisionError(f"the commit to adopt {root} as must be 40 hex digits, got {adopt_as!r}")
        commit, why = adopt_as, "the commit it was given (no huggingface_hub metadata in it)"
    else:
        raise RevisionError(
            f"{root} holds a checkpoint of the single-directory layout with no huggingface_hub metadata"
            " naming its commit; set checkpoint_adopt_revision to the commit it holds, so it is moved to"
            f" {revision_path(root, '<commit>')} (nothing was changed)"
        )
    target = revision_path(root, commit)
    if os.path.exists(target):
        raise RevisionError(
            f"{root} holds a checkpoint of the single-directory layout, and {target} exists already;"
            " move one of them away (nothing was changed)"
        )
    return {"source": source, "commit": commit, "why": why}


def _rewrite_state_file(directory: str, old_dir: str, new_dir: str) -> None:
    """Point the verification records in ``directory`` at ``new_dir`` (their files did not change)."""
    path = os.path.join(directory, DEFAULT_STATE_FILE)
    try:
        text = read_text(path)
        data = json.loads(text) if text else None
    except (OSError, FileContentError, ValueError):
        return
    if isinstance(data, dict) and data.get("model_dir") == old_dir:
        data["model_dir"] = new_dir
        write_file_atomically(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def adopt(root: str, plan: dict[str, Any], now: float | None = None) -> str:
    """Carry out :func:`adoption_plan`; an interrupted call is finished by the next one (which
    finds the directory at :func:`staging_path`). Returns the revision's directory."""
    root = os.path.abspath(root)
    staged = staging_path(root)
    target = revision_path(root, plan["commit"])
    mode = os.stat(plan["source"]).st_mode & 0o7777
    if plan["source"] == root:
        os.rename(root, staged)
    os.makedirs(revisions_dir(root), exist_ok=True)
    os.chmod(root, mode)
    # Before the last rename, so that once the directory stands under its commit it is complete.
    _rewrite_state_file(staged, root, target)
    document = {"commit": plan["commit"], "from": root, "time": time.time() if now is None else now}
    write_file_atomically(
        os.path.join(revisions_dir(root), ADOPTED_FILE), json.dumps(document).encode() + b"\n"
    )
    os.rename(staged, target)
    return target


def keep_single_directory_view(root: str) -> list[str]:
    """Links ``<root>/<name>`` -> ``revisions/<adopted>/<name>`` for every entry of the adopted
    revision; returns the links made.

    A rank container created before the adoption mounts ``<root>`` by path: when it is started
    again (the supervisor restarts a group with ``docker start``), it must find the checkpoint
    there, and relative links resolve inside the container too. A deployment recorded before
    revisions (no revision) is served from ``<root>`` the same way.
    """
    adopted = read_adopted(root)
    if adopted is None or not os.path.isdir(revision_path(root, adopted)):
        return []
    made = []
    for name in sorted(os.listdir(revision_path(root, adopted))):
        link = os.path.join(root, name)
        if name == REVISIONS or os.path.lexists(link):
            continue
        os.symlink(os.path.join(REVISIONS, adopted, name), link)
        made.append(name)
    return made


def drop_single_directory_view(root: str) -> list[str]:
    """Remove the links of :func:`keep_single_directory_view` that lead nowhere any more."""
    dropped = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        link = os.path.join(root, name)
        if (
            os.path.islink(link)
            and os.readlink(link).startswith(REVISIONS + os.sep)
            and not os.path.exists(link)
        ):
            os.unlink(link)
            dropped.append(name)
    return dropped


def prune_plan(root: str, keep: list[str], keep_count: int) -> dict[str, list[str]]:
    """Which revision directories stay and which go: every one named in ``keep``, then the newest
    others up to ``keep_count`` in all."""
    present = list_revisions(root)
    wanted = [name for name in dict.fromkeys(keep) if name and name in present]
    others = [name for name in present if name not in wanted]
    room = max(0, keep_count - len(wanted))
    return {"kept": wanted + others[:room], "removed": others[room:]}


def remove_revisions(root: str, names: list[str]) -> None:
    """Remove ``names`` (and their seals), what an interrupted removal left, and links to what is gone."""
    for name in names:
        unseal(root, name)
        # Renamed first, so that an interrupted removal never leaves a half revision under its name.
        os.rename(revision_path(root, name), os.path.join(revisions_dir(root), f".{name}.removing"))
    for doomed in leftover_removals(root):
        shutil.rmtree(doomed)
    drop_single_directory_view(root)


def leftover_removals(root: str) -> list[str]:
    """Removals an interrupted run did not finish."""
    try:
        return [
            os.path.join(revisions_dir(root), name)
            for name in os.listdir(revisions_dir(root))
            if name.startswith(".") and name.endswith(".removing")
        ]
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------- seals
#
# A revision fetched (downloaded or copied) and verified in full is sealed: the seal lists every
# file of its directory with size and modification time, and what the verification reported. A
# later run that finds the same listing trusts it and reads, downloads and copies nothing; any
# file added, removed, resized or touched breaks the seal, and the run fetches and verifies as
# before. The seal sits beside the revision (not in it: rsync copies the revision to the workers,
# and a worker's copy is sealed only once the worker verified it).

SEAL_VERSION = 1
# Not the checkpoint's own files: huggingface_hub's metadata and our verification records, which
# the download and the verification rewrite as they go.
_UNSEALED_TOP = ".cache"


def seal_path(root: str, commit: str) -> str:
    return os.path.join(revisions_dir(root), f".{commit}.complete.json")


def listing(model_dir: str) -> dict[str, list[int]]:
    """Every file under ``model_dir`` but ``.cache/``: ``{relative path: [size, mtime_ns]}``."""
    files: dict[str, list[int]] = {}
    for directory, dirnames, filenames in os.walk(model_dir):
        if directory == model_dir and _UNSEALED_TOP in dirnames:
            dirnames.remove(_UNSEALED_TOP)
        for name in filenames:
            path = os.path.join(directory, name)
            status = os.lstat(path)
            files[os.path.relpath(path, model_dir)] = [status.st_size, status.st_mtime_ns]
    return files


def fingerprint(files: dict[str, list[int]]) -> str:
    """A short digest of a listing: what a worker's seal records of the head's revision it copied."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:32]


def _stored_seal(root: str, commit: str) -> dict[str, Any] | None:
    """The seal file of ``commit`` as written, or ``None`` when missing, unreadable or not its."""
    try:
        text = read_text(seal_path(root, commit))
        seal = json.loads(text) if text is not None else None
    except (OSError, FileContentError, ValueError):
        return None
    if not isinstance(seal, dict) or seal.get("version") != SEAL_VERSION or seal.get("commit") != commit:
        return None
    return seal if isinstance(seal.get("verified"), dict) else None


def _current_listing(root: str, commit: str) -> dict[str, list[int]] | None:
    """The revision's listing now, or ``None`` when it is gone or cannot be listed."""
    model_dir = revision_path(root, commit)
    try:
        return listing(model_dir) if os.path.isdir(model_dir) else None
    except OSError:
        return None


def read_seal(root: str, commit: str) -> dict[str, Any] | None:
    """``{"verified": what the verification reported, "fingerprint": of the listing}`` when the
    revision is as it was sealed; ``None`` when there is no seal, it is unreadable or not this
    revision's, or any file differs from it (or cannot be listed)."""
    seal = _stored_seal(root, commit)
    files = _current_listing(root, commit) if seal is not None else None
    if files is None or seal.get("files") != files:
        return None
    return {"verified": seal["verified"], "fingerprint": fingerprint(files)}


def plan_seal(root: str, commit: str, verified: dict[str, Any]) -> tuple[bool, dict[str, list[int]]]:
    """Whether sealing the revision now would change its seal, and its listing (walked once)."""
    files = listing(revision_path(root, commit))
    seal = _stored_seal(root, commit)
    return seal is None or seal.get("files") != files or seal["verified"] != verified, files


def write_seal(
    root: str, commit: str, verified: dict[str, Any], now: float | None = None
) -> tuple[bool, str]:
    """Seal the revision as it is now: whether the seal changed, and the listing's fingerprint."""
    changed, files = plan_seal(root, commit, verified)
    if changed:
        seal = {
            "version": SEAL_VERSION,
            "commit": commit,
            "sealed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "verified": verified,
            "files": files,
        }
        write_file_atomically(seal_path(root, commit), (json.dumps(seal, indent=2) + "\n").encode(), 0o644)
    return changed, fingerprint(files)


def unseal(root: str, commit: str) -> bool:
    """Drop a revision's seal; ``False`` when it had none."""
    try:
        os.unlink(seal_path(root, commit))
    except FileNotFoundError:
        return False
    return True


# --------------------------------------------------------------------------- purge

# How many of the names that the collection did not put there a refusal lists.
_FOREIGN_SHOWN = 5


def _foreign_entries(root: str) -> list[str]:
    """What ``root`` holds that this collection did not put there: anything but ``revisions/``
    (commit directories and the collection's dot-files: seals, the adoption record, removals under
    way) and the links of the single-directory view into it."""
    foreign = []
    for entry in sorted(os.scandir(root), key=lambda entry: entry.name):
        if entry.name == REVISIONS and entry.is_dir(follow_symlinks=False):
            for inner in sorted(os.scandir(entry.path), key=lambda inner: inner.name):
                commit_dir = is_commit(inner.name) and inner.is_dir(follow_symlinks=False)
                if not (inner.name.startswith(".") or commit_dir):
                    foreign.append(f"{REVISIONS}/{inner.name}")
        elif not (entry.is_symlink() and os.readlink(entry.path).startswith(REVISIONS + os.sep)):
            foreign.append(entry.name)
    return foreign


def _place_refusal(root: str, protected: Sequence[str]) -> str | None:
    if root == os.sep:
        return "it is the root directory"
    for path in protected:
        kept = os.path.abspath(path)
        if kept == root or kept.startswith(root.rstrip(os.sep) + os.sep):
            return f"it is or holds {kept}, which is never removed"
    if os.path.islink(root):
        return f"it is a symbolic link (to {os.readlink(root)})"
    return None


def purge_refusal(root: str, protected: Sequence[str] = ()) -> str | None:
    """Why ``root`` may not be removed as a checkpoint this collection created, or None.

    Refused: ``/``, a path that is or holds one of ``protected`` (the user's home), a symbolic link,
    something not a directory, and a directory holding anything the collection did not put there
    (``deployment_model_dir`` set to ``~/models`` holds every model of the user)."""
    root = os.path.abspath(root)
    refusal = _place_refusal(root, protected)
    if refusal or not os.path.exists(root):
        return refusal
    if not os.path.isdir(root):
        return "it is not a directory"
    foreign = _foreign_entries(root)
    if not foreign:
        return None
    more = f" and {len(foreign) - _FOREIGN_SHOWN} more" if len(foreign) > _FOREIGN_SHOWN else ""
    return (
        f"it holds {', '.join(foreign[:_FOREIGN_SHOWN])}{more}, which this collection did not put"
        " there (it keeps a checkpoint as revisions/<commit> only)"
    )


def purge(root: str) -> None:
    """Remove ``root`` (judged by purge_refusal): renamed first, so an interrupted removal never
    leaves half a checkpoint under its name, then deleted."""
    doomed = os.path.join(os.path.dirname(os.path.abspath(root)), f".{os.path.basename(root)}.removing")
    if os.path.lexists(root):
        if os.path.lexists(doomed):
            shutil.rmtree(doomed)
        os.rename(root, doomed)
    if os.path.lexists(doomed):
        shutil.rmtree(doomed)


# --------------------------------------------------------------------------- the pinned revision


def deployed_revision(record_path: str | None, recipe: str | None) -> str | None:
    """The commit the deployment record says serves, when it was deployed with ``recipe``: what
    an empty ``checkpoint_revision`` keeps. None without a record, a commit, or the same recipe (a
    record written before recipes were recorded is the DeepSeek recipe's)."""
    if not record_path or not recipe:
        return None
    try:
        record = json.loads(read_text(record_path) or "null")
    except (OSError, FileContentError, ValueError):
        return None
    current = record.get("current") if isinstance(record, dict) else None
    if not isinstance(current, dict):
        return None
    revision = current.get("revision")
    if (
        (current.get("recipe") or LEGACY_RECIPE) != recipe
        or not isinstance(revision, str)
        or not is_commit(revision)
    ):
        return None
    return revision
