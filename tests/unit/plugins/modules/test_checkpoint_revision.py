"""Tests of the checkpoint_revision module and its helpers (module_utils/_revisions.py).

The layouts are built as huggingface_hub and checkpoint_shards leave them: ``<file>.metadata`` under
``.cache/huggingface/download`` (commit, etag, time) and ``.cache/sparkserve/verified.json``.
Resolving against a real hub (the lab's stand-in) is in test_checkpoint_download.py's hub fixture;
here a fake client stands in for it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _download, _revisions
from ansible_collections.sparkserve.dsv41.plugins.modules import checkpoint_revision
from dir_snapshot import snapshot

OLD = "1" * 40
NEW = "2" * 40
NEWER = "3" * 40


def single_directory(root: Path, commit: str | None = OLD) -> Path:
    """A checkpoint straight in ``root``, with huggingface_hub's metadata naming ``commit`` (or none)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "model-00001-of-00006.safetensors").write_bytes(b"x" * 64)
    if commit:
        meta = root / ".cache" / "huggingface" / "download"
        meta.mkdir(parents=True)
        for name in ("config.json", "model-00001-of-00006.safetensors"):
            (meta / f"{name}.metadata").write_text(f"{commit}\netag-{name}\n1796281902.0\n")
    state = root / ".cache" / "sparkserve"
    state.mkdir(parents=True)
    (state / "verified.json").write_text(json.dumps({"version": 1, "model_dir": str(root), "files": {}}))
    return root


def revision(root: Path, commit: str, mtime: int) -> Path:
    path = root / "revisions" / commit
    path.mkdir(parents=True)
    (path / "config.json").write_text(commit)
    os.utime(path, (mtime, mtime))
    return path


class FakeHub:
    def __init__(self, commit: str | None = None, error: Exception | None = None):
        self._commit, self._error, self.asked = commit, error, []

    def commit(self, repo_id, revision):
        self.asked.append((repo_id, revision))
        if self._error:
            raise self._error
        return self._commit


def test_a_single_directory_is_renamed_whole_and_keeps_its_inode_and_records(tmp_path, run_module):
    root = single_directory(tmp_path / "models" / "M")
    inode = root.stat().st_ino
    result = run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    assert not result.failed, result
    target = root / "revisions" / OLD
    assert result["changed"] and result["adopted"]["commit"] == OLD
    assert (result["model_dir"], result["exists"], result["adopted_commit"]) == (str(target), True, OLD)
    # The same directory (a rank that mounts it keeps its files), now under its commit.
    assert target.stat().st_ino == inode
    # A rank container made before mounts the root by path: links keep the checkpoint there,
    # relative, so they resolve inside the container too.
    assert sorted(os.listdir(root)) == sorted([*os.listdir(target), "revisions"])
    assert os.readlink(root / "config.json") == f"revisions/{OLD}/config.json"
    assert (root / "model-00001-of-00006.safetensors").read_bytes() == b"x" * 64
    assert json.loads((target / ".cache/sparkserve/verified.json").read_text())["model_dir"] == str(target)
    assert json.loads((root / "revisions" / ".adopted.json").read_text())["commit"] == OLD
    assert set(yaml.safe_load(checkpoint_revision.RETURN)) - {"removed", "removed_bytes"} == set(result) - {
        "changed",
        "invocation",
    }
    again = run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    assert (again["changed"], again["adopted"], again["adopted_commit"]) == (False, None, OLD)


def test_the_metadata_names_the_commit_over_adopt_as(tmp_path, run_module):
    root = single_directory(tmp_path / "M", commit=OLD)
    result = run_module(checkpoint_revision, {"root": str(root), "commit": NEW, "adopt_as": NEWER})
    assert result["adopted"]["commit"] == OLD and "metadata" in result["adopted"]["why"]
    # The wanted revision is another one: it is fetched next to the adopted one.
    assert (result["commit"], result["exists"]) == (NEW, False)
    assert (root / "revisions" / OLD / "config.json").is_file()


def test_a_copy_without_metadata_is_adopted_as_given(tmp_path, run_module):
    root = single_directory(tmp_path / "M", commit=None)
    result = run_module(checkpoint_revision, {"root": str(root), "commit": OLD, "adopt_as": OLD})
    assert result["adopted"]["commit"] == OLD and (root / "revisions" / OLD / "config.json").is_file()


@pytest.mark.parametrize(
    ("adopt_as", "complaint"),
    [(None, "set checkpoint_adopt_revision"), ("main", "must be 40 hex digits")],
)
def test_an_unnamed_single_directory_fails_before_anything_changes(tmp_path, run_module, adopt_as, complaint):
    root = single_directory(tmp_path / "M", commit=None)
    before = snapshot(tmp_path)
    result = run_module(checkpoint_revision, {"root": str(root), "commit": OLD, "adopt_as": adopt_as})
    assert result.failed and complaint in result["msg"], result
    assert snapshot(tmp_path) == before


def test_a_resumed_adoption_refuses_to_overwrite_a_revision_of_that_name(tmp_path, run_module):
    root = single_directory(tmp_path / "M", commit=OLD)
    os.rename(root, _revisions.staging_path(str(root)))
    revision(root, OLD, 1_000)
    before = snapshot(tmp_path)
    result = run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    assert result.failed and "exists already" in result["msg"]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("obstacle", ["symlink", "revisions", "read-only"])
def test_a_single_directory_that_cannot_be_moved_whole_fails_before_anything_changes(
    tmp_path, run_module, monkeypatch, obstacle
):
    real = single_directory(tmp_path / "disk" / "M")
    root = real
    if obstacle == "symlink":
        root = tmp_path / "M"
        root.symlink_to(real)
    elif obstacle == "revisions":
        revision(real, NEW, 1_000)
    else:
        # (chmod would not do: these tests may run as root, who may write anyway.)
        monkeypatch.setattr(_revisions.os, "access", lambda path, mode: path != str(real))
    before = snapshot(tmp_path)
    result = run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    assert result.failed, result
    assert {"symlink": "symbolic link", "revisions": "both revisions/", "read-only": "not writable"}[
        obstacle
    ] in result["msg"]
    assert snapshot(tmp_path) == before


def test_an_adoption_interrupted_before_its_links_gets_them_on_the_next_run(tmp_path, run_module):
    root = single_directory(tmp_path / "M", commit=OLD)
    run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    for name in os.listdir(root):
        if name != "revisions":
            (root / name).unlink()
    again = run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    assert again["changed"] is True and (root / "config.json").is_symlink()


def test_an_interrupted_adoption_is_finished(tmp_path, run_module):
    root = single_directory(tmp_path / "M", commit=OLD)
    # Killed right after the first rename: the directory waits beside the root.
    os.rename(root, _revisions.staging_path(str(root)))
    result = run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    assert result["adopted"]["commit"] == OLD
    assert (root / "revisions" / OLD / "config.json").is_file()
    assert not os.path.exists(_revisions.staging_path(str(root)))
    target = root / "revisions" / OLD
    assert json.loads((target / ".cache/sparkserve/verified.json").read_text())["model_dir"] == str(target)


def test_check_mode_reports_the_adoption_and_changes_nothing(tmp_path, run_module):
    root = single_directory(tmp_path / "M", commit=OLD)
    before = snapshot(tmp_path)
    result = run_module(checkpoint_revision, {"root": str(root), "commit": OLD}, check_mode=True)
    assert result["changed"] and result["msg"].startswith("would adopt") and result["exists"]
    assert result["revisions"] == [OLD]
    assert snapshot(tmp_path) == before


def test_a_fresh_root_gets_its_revisions_directory_for_the_download(tmp_path, run_module):
    args = {"root": str(tmp_path / "M"), "commit": NEW}
    before = snapshot(tmp_path)
    assert run_module(checkpoint_revision, args, check_mode=True)["changed"] is True
    assert snapshot(tmp_path) == before
    result = run_module(checkpoint_revision, args)
    assert (result["changed"], result["exists"], result["adopted_commit"], result["revisions"]) == (
        True,
        False,
        None,
        [],
    )
    assert os.listdir(tmp_path / "M") == ["revisions"]
    assert run_module(checkpoint_revision, args)["changed"] is False


@pytest.mark.parametrize("commit", ["main", "2" * 39, "G" * 40])
def test_a_commit_that_is_not_one_fails(tmp_path, run_module, commit):
    result = run_module(checkpoint_revision, {"root": str(tmp_path), "commit": commit})
    assert result.failed and "40 hex digits" in result["msg"]


def test_present_needs_a_commit_or_a_repo(tmp_path, run_module):
    result = run_module(checkpoint_revision, {"root": str(tmp_path)})
    assert result.failed and "commit, repo_id" in result["msg"]


# --------------------------------------------------------------------------- resolving


@pytest.mark.parametrize(
    ("revision", "hub", "on_disk", "expected"),
    [
        # A commit needs no hub.
        (NEW, FakeHub(error=AssertionError("not asked")), [], (NEW, None)),
        (None, FakeHub(commit=NEWER), [OLD, NEW], (NEWER, None)),
        ("v2", FakeHub(commit=NEW), [], (NEW, None)),
    ],
)
def test_a_revision_resolves_to_its_commit(revision, hub, on_disk, expected):
    assert _download.resolve_commit(hub, "o/r", revision, on_disk) == expected


def test_without_the_hub_the_only_revision_on_disk_keeps_serving():
    commit, warning = _download.resolve_commit(FakeHub(error=ConnectionError("refused")), "o/r", None, [OLD])
    assert commit == OLD
    assert warning == (
        f"the hub did not resolve o/r revision main (ConnectionError: refused); keeping the only"
        f" revision on disk, {OLD}"
    )


@pytest.mark.parametrize("on_disk", [[], [OLD, NEW]])
def test_without_the_hub_and_no_single_revision_the_run_asks_for_a_pinned_commit(on_disk):
    with pytest.raises(_download.DownloadError, match="set checkpoint_revision to the commit"):
        _download.resolve_commit(FakeHub(error=ConnectionError("refused")), "o/r", "main", on_disk)


class RevisionNotFoundError(Exception):
    """What huggingface_hub raises when the hub answers that a revision does not exist."""


def test_a_hub_that_refuses_the_revision_fails_the_run_rather_than_keep_the_one_on_disk():
    hub = FakeHub(error=RevisionNotFoundError("404 Client Error. Revision Not Found for url: ..."))
    with pytest.raises(_download.DownloadError, match="the hub has no revision v9 of o/r for this token"):
        _download.resolve_commit(hub, "o/r", "v9", [OLD])


# --------------------------------------------------------------------------- pruning


@pytest.mark.parametrize(
    "case",
    [
        # The current and the previous stay; the oldest goes.
        ([NEWER, NEW], 2, [NEWER, NEW], [OLD]),
        # Named ones stay even beyond the count (a rollback target is never removed).
        ([OLD, NEW], 1, [OLD, NEW], [NEWER]),
        # Room left: the newest others fill it.
        ([OLD], 2, [OLD, NEWER], [NEW]),
        # An empty or unknown name (a deployment recorded before revisions) keeps nothing.
        ([NEWER, ""], 2, [NEWER, NEW], [OLD]),
        ([NEWER], 3, [NEWER, NEW, OLD], []),
    ],
)
def test_prune_keeps_the_named_then_the_newest(tmp_path, run_module, case):
    keep, keep_count, kept, removed = case
    for mtime, commit in enumerate([OLD, NEW, NEWER], start=1):
        revision(tmp_path, commit, 1_000 * mtime)
    before = snapshot(tmp_path)
    check = run_module(
        checkpoint_revision,
        {"root": str(tmp_path), "state": "pruned", "keep": keep, "keep_count": keep_count},
        check_mode=True,
    )
    assert (check["changed"], check["removed"]) == (bool(removed), removed)
    assert snapshot(tmp_path) == before
    result = run_module(
        checkpoint_revision,
        {"root": str(tmp_path), "state": "pruned", "keep": keep, "keep_count": keep_count},
    )
    assert (result["changed"], result["removed"], result["revisions"]) == (bool(removed), removed, kept)
    assert sorted(os.listdir(tmp_path / "revisions")) == sorted(kept)
    again = run_module(
        checkpoint_revision,
        {"root": str(tmp_path), "state": "pruned", "keep": keep, "keep_count": keep_count},
    )
    assert again["changed"] is False


def test_a_deployment_recorded_before_revisions_keeps_the_adopted_one_and_its_links(tmp_path, run_module):
    root = single_directory(tmp_path / "M", commit=OLD)
    run_module(checkpoint_revision, {"root": str(root), "commit": OLD})
    revision(root, NEW, 2_000)
    revision(root, NEWER, 3_000)
    # Serving NEWER; the previous deployment has no revision recorded: the adopted one (OLD).
    kept = run_module(checkpoint_revision, {"root": str(root), "state": "pruned", "keep": [NEWER, ""]})
    assert (kept["removed"], (root / "config.json").is_file()) == ([NEW], True)
    gone = run_module(
        checkpoint_revision, {"root": str(root), "state": "pruned", "keep": [NEWER], "keep_count": 1}
    )
    assert gone["removed"] == [OLD]
    assert sorted(os.listdir(root)) == ["revisions"], "the links to the removed revision went with it"


def test_an_interrupted_removal_is_finished_and_never_left_under_its_commit(tmp_path, run_module):
    revision(tmp_path, NEW, 2_000)
    half = tmp_path / "revisions" / f".{OLD}.removing"
    half.mkdir(parents=True)
    (half / "model-00006-of-00006.safetensors").write_bytes(b"x")
    result = run_module(checkpoint_revision, {"root": str(tmp_path), "state": "pruned", "keep": [NEW]})
    assert result["changed"] and os.listdir(tmp_path / "revisions") == [NEW]


@pytest.mark.parametrize("check_mode", [True, False], ids=["check", "run"])
def test_present_reports_the_interrupted_removal_it_finishes(tmp_path, run_module, check_mode):
    revision(tmp_path, NEW, 2_000)
    half = tmp_path / "revisions" / f".{OLD}.removing"
    half.mkdir(parents=True)
    (half / "model-00006-of-00006.safetensors").write_bytes(b"x")
    result = present(tmp_path, run_module, check_mode=check_mode)
    assert result["changed"] is True
    verb = "would finish" if check_mode else "finished"
    assert f"{verb} the removal an interrupted run left (.{OLD}.removing)" in result["msg"]
    assert half.exists() is check_mode
    if not check_mode:
        assert present(tmp_path, run_module)["changed"] is False, "a second run changes nothing"


def test_keep_count_below_one_fails(tmp_path, run_module):
    result = run_module(checkpoint_revision, {"root": str(tmp_path), "state": "pruned", "keep_count": 0})
    assert result.failed and "checkpoint_keep_revisions" in result["msg"]


# --------------------------------------------------------------------------- seals

VERIFIED = {"exl3_file_count": 13}


def sealed_revision(tmp_path: Path, run_module) -> Path:
    path = revision(tmp_path, NEW, 2_000)
    (path / "exl3" / "q31").mkdir(parents=True)
    (path / "exl3" / "q31" / "bank.safetensors").write_bytes(b"b" * 32)
    (path / ".cache" / "sparkserve").mkdir(parents=True)
    (path / ".cache" / "sparkserve" / "verified.json").write_text("{}")
    result = run_module(
        checkpoint_revision, {"root": str(tmp_path), "state": "sealed", "commit": NEW, "verified": VERIFIED}
    )
    assert result["changed"] is True and "sealed revision" in result["msg"]
    return path


def resize_keeping_mtime(path: Path, size: int) -> None:
    status = path.stat()
    os.truncate(path, size)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))


def present(tmp_path: Path, run_module, check_mode: bool = False):
    return run_module(checkpoint_revision, {"root": str(tmp_path), "commit": NEW}, check_mode=check_mode)


def test_a_sealed_revision_is_complete_with_what_its_verification_reported(tmp_path, run_module):
    sealed_revision(tmp_path, run_module)
    result = present(tmp_path, run_module)
    assert (result["complete"], result["verified"]) == (True, VERIFIED)
    assert "complete as sealed" in result["msg"]
    seal = json.loads((tmp_path / "revisions" / f".{NEW}.complete.json").read_text())
    sizes = {name: size for name, (size, _mtime_ns) in seal["files"].items()}
    assert sizes == {"config.json": len(NEW), "exl3/q31/bank.safetensors": 32}, "not .cache/"
    assert _revisions.list_revisions(str(tmp_path)) == [NEW], "the seal is no revision"


def test_sealing_again_changes_nothing(tmp_path, run_module):
    sealed_revision(tmp_path, run_module)
    before = snapshot(tmp_path)
    args = {"root": str(tmp_path), "state": "sealed", "commit": NEW, "verified": VERIFIED}
    assert run_module(checkpoint_revision, args)["changed"] is False
    assert run_module(checkpoint_revision, args, check_mode=True)["changed"] is False
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "change",
    [
        lambda path: resize_keeping_mtime(path / "config.json", 3),
        lambda path: os.utime(path / "config.json", (5, 5)),
        lambda path: (path / "exl3" / "q31" / "bank.safetensors").unlink(),
        lambda path: (path / "extra.json").write_text("{}"),
    ],
    ids=["resized", "touched", "removed", "added"],
)
def test_any_change_to_the_files_breaks_the_seal(tmp_path, run_module, change):
    path = sealed_revision(tmp_path, run_module)
    change(path)
    result = present(tmp_path, run_module)
    assert (result["complete"], result["verified"]) == (False, None)


def test_the_download_s_and_verification_s_own_records_do_not_break_the_seal(tmp_path, run_module):
    path = sealed_revision(tmp_path, run_module)
    (path / ".cache" / "sparkserve" / "verified.json").write_text('{"rewritten": true}')
    (path / ".cache" / "huggingface").mkdir()
    (path / ".cache" / "huggingface" / "config.json.metadata").write_text(f"{NEW}\netag\n1\n")
    assert present(tmp_path, run_module)["complete"] is True


def test_an_unreadable_seal_or_another_revision_s_is_no_seal(tmp_path, run_module):
    path = revision(tmp_path, NEW, 2_000)
    seal = tmp_path / "revisions" / f".{NEW}.complete.json"
    seal.write_text("not json")
    assert present(tmp_path, run_module)["complete"] is False
    # Right files, wrong commit: only the commit check refuses it.
    listed = _revisions.listing(str(path))
    seal.write_text(json.dumps({"version": 1, "commit": OLD, "verified": VERIFIED, "files": listed}))
    assert present(tmp_path, run_module)["complete"] is False
    seal.write_text(json.dumps({"version": 1, "commit": NEW, "verified": VERIFIED, "files": listed}))
    assert present(tmp_path, run_module)["complete"] is True


def test_a_revision_that_cannot_be_listed_is_not_complete(tmp_path, run_module, monkeypatch):
    sealed_revision(tmp_path, run_module)

    def unreadable(model_dir):
        raise PermissionError(13, "Permission denied", model_dir)

    monkeypatch.setattr(_revisions, "listing", unreadable)
    assert present(tmp_path, run_module)["complete"] is False


@pytest.mark.parametrize(
    ("verified_with", "complete"),
    [
        ({}, True),
        ({"exl3_file_count": 13}, True),
        ({"keep_parts": False}, False),
        ({"source": "other"}, False),
    ],
)
def test_a_seal_counts_only_when_it_holds_what_the_run_asks(tmp_path, run_module, verified_with, complete):
    sealed_revision(tmp_path, run_module)
    result = run_module(
        checkpoint_revision, {"root": str(tmp_path), "commit": NEW, "verified_with": verified_with}
    )
    assert (result["complete"], result["verified"] is not None) == (complete, complete)


def test_the_fingerprint_follows_the_files(tmp_path, run_module):
    path = sealed_revision(tmp_path, run_module)
    args = {"root": str(tmp_path), "state": "sealed", "commit": NEW, "verified": VERIFIED}
    sealed = run_module(checkpoint_revision, args)
    assert present(tmp_path, run_module)["fingerprint"] == sealed["fingerprint"]
    (path / "extra.json").write_text("{}")
    assert present(tmp_path, run_module)["fingerprint"] is None, "not complete: no fingerprint"
    resealed = run_module(checkpoint_revision, args)
    assert resealed["changed"] is True and resealed["fingerprint"] != sealed["fingerprint"]


def test_check_mode_seals_nothing(tmp_path, run_module):
    revision(tmp_path, NEW, 2_000)
    before = snapshot(tmp_path)
    args = {"root": str(tmp_path), "state": "sealed", "commit": NEW, "verified": VERIFIED}
    result = run_module(checkpoint_revision, args, check_mode=True)
    assert result["changed"] is True and result["msg"].startswith("would seal")
    assert snapshot(tmp_path) == before


def test_sealing_a_revision_that_is_not_there_fails(tmp_path, run_module):
    result = run_module(
        checkpoint_revision, {"root": str(tmp_path), "state": "sealed", "commit": NEW, "verified": VERIFIED}
    )
    assert result.failed and "is no revision directory" in result["msg"]


def test_a_pruned_revision_takes_its_seal_with_it(tmp_path, run_module):
    sealed_revision(tmp_path, run_module)
    revision(tmp_path, NEWER, 3_000)
    result = run_module(
        checkpoint_revision, {"root": str(tmp_path), "state": "pruned", "keep": [NEWER], "keep_count": 1}
    )
    assert result["removed"] == [NEW]
    assert sorted(os.listdir(tmp_path / "revisions")) == [NEWER]


# --------------------------------------------------------------------------- purge (state=absent)


ROOT = "models/DeepSeek-V4.1-Flash"


def deployed_root(models: Path) -> Path:
    """A model root as the collection leaves it: an adopted revision, its seal and links, and a newer one."""
    root = single_directory(models / "DeepSeek-V4.1-Flash")
    _revisions.adopt(root, _revisions.adoption_plan(str(root), None))
    _revisions.keep_single_directory_view(str(root))
    revision(root, NEW, 1_800_000_000)
    (root / "revisions" / f".{NEW}.complete.json").write_text("{}")
    return root


def test_a_root_holding_only_its_revisions_is_removed_and_a_second_run_changes_nothing(tmp_path, run_module):
    models = tmp_path / "models"
    root = deployed_root(models)
    (models / "other-model").mkdir()
    result = run_module(
        checkpoint_revision, {"root": str(root), "state": "absent", "protect": [str(tmp_path)]}
    )
    assert result["changed"] and sorted(result["removed"]) == sorted([OLD, NEW]), result
    assert sorted(os.listdir(models)) == ["other-model"], "the root went, whole, and nothing beside it"
    again = run_module(checkpoint_revision, {"root": str(root), "state": "absent"})
    assert not again["changed"]


def test_check_mode_reports_the_removal_and_removes_nothing(tmp_path, run_module):
    root = deployed_root(tmp_path / "models")
    before = snapshot(tmp_path)
    result = run_module(checkpoint_revision, {"root": str(root), "state": "absent"}, check_mode=True)
    assert result["changed"] and result["msg"].startswith(f"would remove {root}")
    assert snapshot(tmp_path) == before


def test_a_removal_returns_every_key_documented_for_it(tmp_path, run_module):
    documented = yaml.safe_load(checkpoint_revision.RETURN)
    promised = {
        key for key, doc in documented.items() if doc["returned"] == "always" or "absent" in doc["returned"]
    }
    root = deployed_root(tmp_path / "models")
    args = {"root": str(root), "state": "absent"}
    checked = run_module(checkpoint_revision, args, check_mode=True)
    removed = run_module(checkpoint_revision, args)
    again = run_module(checkpoint_revision, args)
    for result in (checked, removed, again):
        assert promised <= set(result), promised - set(result)
    assert sorted(checked["revisions"]) == sorted([OLD, NEW]), "check mode removes nothing"
    assert (removed["revisions"], again["revisions"], again["removed"], again["removed_bytes"]) == (
        [],
        [],
        [],
        0,
    )


def test_an_interrupted_removal_is_finished(tmp_path, run_module):
    root = deployed_root(tmp_path / "models")
    (tmp_path / "models" / ".DeepSeek-V4.1-Flash.removing").mkdir()  # the last run's, half deleted
    run_module(checkpoint_revision, {"root": str(root), "state": "absent"})
    assert os.listdir(tmp_path / "models") == []


@pytest.mark.parametrize(
    ("layout", "target", "why"),
    [
        pytest.param(
            "models-dir", "models", "it holds DeepSeek-V4.1-Flash, other-model, which this collection",
            id="models-dir-with-another-model",
        ),
        pytest.param("stray-file", ROOT, "it holds notes.txt, which", id="a-file-of-the-user"),
        pytest.param(
            "stray-revision", ROOT, "it holds revisions/my-finetune, which", id="a-foreign-revision"
        ),
        pytest.param("models-dir", "", "it is or holds HOME, which is never", id="the-home-directory"),
        pytest.param("models-dir", "/", "it is the root directory", id="the-root-directory"),
        pytest.param("link", "models/link", "it is a symbolic link (to ", id="a-symbolic-link"),
    ],
)  # fmt: skip
def test_what_the_collection_did_not_create_is_refused_and_nothing_is_deleted(
    tmp_path, run_module, layout, target, why
):
    home = tmp_path / "home"
    models = home / "models"
    root = deployed_root(models)
    (models / "other-model").mkdir()
    (models / "other-model" / "model.safetensors").write_bytes(b"weights")
    if layout == "stray-file":
        (root / "notes.txt").write_text("mine")
    elif layout == "stray-revision":
        (root / "revisions" / "my-finetune").mkdir()
    elif layout == "link":
        (models / "link").symlink_to(root)
    path = target if target.startswith("/") else str(home / target) if target else str(home)
    before = snapshot(home)
    result = run_module(checkpoint_revision, {"root": path, "state": "absent", "protect": [str(home)]})
    assert result.failed
    assert result["msg"].startswith(f"refusing to remove the model directory {path.rstrip('/') or '/'}: "), (
        result
    )
    assert why.replace("HOME", str(home)) in result["msg"]
    assert "Nothing was deleted" in result["msg"] and "deployment_model_dir" in result["msg"]
    assert snapshot(home) == before


# --------------------------------------------------------------------------- the deployed revision stays


def record_file(tmp_path: Path, current: dict | None) -> str:
    path = tmp_path / "deployments.json"
    path.write_text(json.dumps({"current": current, "previous": None}))
    return str(path)


@pytest.mark.parametrize(
    ("current", "recipe", "kept"),
    [
        pytest.param({"revision": OLD, "recipe": "tiny-chat"}, "tiny-chat", OLD, id="same-recipe"),
        pytest.param({"revision": OLD}, "deepseek-v4.1-flash", OLD, id="a-record-from-before-recipes"),
        pytest.param({"revision": OLD, "recipe": "tiny-chat"}, "tiny-chat-b", None, id="another-recipe"),
        pytest.param({"revision": "", "recipe": "tiny-chat"}, "tiny-chat", None, id="a-single-directory"),
        pytest.param({"revision": "main", "recipe": "tiny-chat"}, "tiny-chat", None, id="not-a-commit"),
        pytest.param(None, "tiny-chat", None, id="nothing-deployed"),
    ],
)
def test_the_deployed_revision_is_the_one_an_empty_revision_keeps(tmp_path, current, recipe, kept):
    assert _revisions.deployed_revision(record_file(tmp_path, current), recipe) == kept


@pytest.mark.parametrize("content", ["", "{not json", "[]"])
def test_an_unreadable_record_keeps_nothing(tmp_path, content):
    (tmp_path / "deployments.json").write_text(content)
    assert _revisions.deployed_revision(str(tmp_path / "deployments.json"), "tiny-chat") is None
    assert _revisions.deployed_revision(str(tmp_path / "absent.json"), "tiny-chat") is None


def test_a_re_run_keeps_the_deployed_revision_without_asking_the_hub(tmp_path, run_module):
    root = tmp_path / "model"
    revision(root, OLD, 1_800_000_000)
    args = {
        "root": str(root),
        "repo_id": "deepseek-ai/DeepSeek-V4.1-Flash",
        "revision": "",
        "endpoint": "http://127.0.0.1:9",  # nothing listens: asking would fail
        "deployed_record": record_file(tmp_path, {"revision": OLD, "recipe": "tiny-chat"}),
        "recipe": "tiny-chat",
    }
    result = run_module(checkpoint_revision, args)
    assert not result.failed, result
    assert (result["commit"], result["exists"]) == (OLD, True)
    assert "the deployed revision, kept" in result["msg"]
    followed = run_module(checkpoint_revision, {**args, "revision": "main"})
    assert followed.failed or followed["commit"] != OLD or followed["warning"], "main is asked of the hub"
