"""Tests of _download: which parts to skip, listings and ``changed``, progress, check mode.

The download logic runs against :class:`FakeHub`, a hub client with the three calls of
``_download.Hub`` that writes files the way huggingface_hub does (through
``.cache/huggingface/download/*.incomplete``). The real client against the lab's hub stand-in is
tested with the module (tests/unit/plugins/modules/test_checkpoint_download.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from fnmatch import fnmatch
from pathlib import Path
from typing import ClassVar

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _checkpoint as ck
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _download as dl
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter
from local_http import JsonHandler, serving

SHARD5 = "model-00005-of-00006.safetensors"
SHARD6 = "model-00006-of-00006.safetensors"
SHARD1 = "model-00001-of-00006.safetensors"


def write_checkpoint(model_dir: Path, files: dict[str, bytes], verified: list[str]) -> None:
    """``files`` in ``model_dir`` with a manifest of them; ``verified`` recorded as the
    checkpoint_shards module records a verification."""
    model_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, blob in files.items():
        (model_dir / name).write_bytes(blob)
        lines.append(f"{hashlib.sha256(blob).hexdigest()}  {name}")
    (model_dir / "sha256-manifest.txt").write_text("\n".join(lines) + "\n")
    records = {}
    for name in verified:
        info = os.stat(model_dir / name)
        records[name] = ck.Record(info.st_size, info.st_mtime_ns, hashlib.sha256(files[name]).hexdigest())
    state = Path(ck.default_state_file(str(model_dir)))
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_bytes(ck.render_state(records, str(model_dir)))


class FakeHub:
    """A hub client (``_download.Hub``) serving ``files``; records what it was asked."""

    def __init__(self, files: dict[str, bytes], fail_listing: Exception | None = None, fail_download=None):
        self.files = files
        self.fail_listing = fail_listing
        self.fail_download = fail_download
        self.fetched: list[str] = []
        self.during_download = None  # called after each file, e.g. to look at the progress file

    def list_files(self, repo_id, revision):
        if self.fail_listing:
            raise self.fail_listing
        return {name: len(blob) for name, blob in self.files.items()}

    def select(self, names, ignore_patterns):
        return [n for n in names if not any(fnmatch(n, p) for p in ignore_patterns)]

    def download(self, repo_id, revision, local_dir, ignore_patterns, max_workers):
        if self.fail_download:
            raise self.fail_download
        cache = Path(local_dir) / ".cache" / "huggingface" / "download"
        cache.mkdir(parents=True, exist_ok=True)
        for name in self.select(list(self.files), ignore_patterns):
            target = Path(local_dir) / name
            if target.exists() and target.read_bytes() == self.files[name]:
                continue
            incomplete = cache / f"{hashlib.sha1(name.encode()).hexdigest()}.incomplete"
            incomplete.write_bytes(self.files[name])
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(incomplete, target)
            self.fetched.append(name)
            if self.during_download:
                self.during_download(name)


# --------------------------------------------------------------------------- which parts to skip


def test_no_state_file_skips_nothing(tmp_path):
    assert dl.ignore_patterns(str(tmp_path)) == []
    assert dl.ignore_patterns(str(tmp_path / "absent")) == []


def test_verified_unchanged_shards_skip_their_parts(tmp_path):
    files = {SHARD1: b"1" * 10, SHARD5: b"5" * 10, SHARD6: b"6" * 10}
    write_checkpoint(tmp_path, files, verified=list(files))
    assert dl.ignore_patterns(str(tmp_path)) == [f"{SHARD1}.part*", f"{SHARD5}.part*", f"{SHARD6}.part*"]


def test_only_one_rebuilt_shard_keeps_the_other_shards_parts(tmp_path):
    write_checkpoint(tmp_path, {SHARD5: b"x"}, verified=[SHARD5])
    (tmp_path / "sha256-manifest.txt").write_text(
        (tmp_path / "sha256-manifest.txt").read_text() + f"{'0' * 64}  {SHARD6}\n"
    )
    assert dl.ignore_patterns(str(tmp_path)) == [f"{SHARD5}.part*"]


@pytest.mark.parametrize("change", ["size", "mtime", "deleted", "unrecorded", "manifest"])
def test_a_shard_changed_since_its_verification_gets_its_parts_again(tmp_path, change):
    shard = tmp_path / SHARD5
    write_checkpoint(tmp_path, {SHARD5: b"x" * 10}, verified=[] if change == "unrecorded" else [SHARD5])
    if change == "size":
        shard.write_bytes(b"x" * 11)
    elif change == "mtime":
        info = shard.stat()
        os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    elif change == "deleted":
        shard.unlink()
    elif change == "manifest":  # a new revision's manifest names another hash
        (tmp_path / "sha256-manifest.txt").write_text(f"{'1' * 64}  {SHARD5}\n")
    assert dl.ignore_patterns(str(tmp_path)) == []


def test_state_of_another_directory_or_format_or_no_manifest_is_ignored(tmp_path):
    write_checkpoint(tmp_path, {SHARD5: b"x"}, verified=[SHARD5])
    state = Path(ck.default_state_file(str(tmp_path)))
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "model_dir": "/elsewhere"}))
    assert dl.ignore_patterns(str(tmp_path)) == []
    state.write_text(json.dumps({**data, "version": 99}))
    assert dl.ignore_patterns(str(tmp_path)) == []
    state.write_text("{not json")
    assert dl.ignore_patterns(str(tmp_path)) == []
    state.write_text(json.dumps(data))
    assert dl.ignore_patterns(str(tmp_path)) == [f"{SHARD5}.part*"]
    (tmp_path / "sha256-manifest.txt").write_text("garbage\n")
    assert dl.ignore_patterns(str(tmp_path)) == []
    (tmp_path / "sha256-manifest.txt").unlink()
    assert dl.ignore_patterns(str(tmp_path)) == []


def test_a_state_file_elsewhere(tmp_path):
    write_checkpoint(tmp_path / "m", {SHARD5: b"x"}, verified=[SHARD5])
    moved = tmp_path / "state.json"
    os.replace(ck.default_state_file(str(tmp_path / "m")), moved)
    assert dl.ignore_patterns(str(tmp_path / "m")) == []
    assert dl.ignore_patterns(str(tmp_path / "m"), str(moved)) == [f"{SHARD5}.part*"]


def test_glob_characters_in_names_are_escaped(tmp_path):
    name = "odd[1].safetensors"
    write_checkpoint(tmp_path, {name: b"x"}, verified=[name])
    assert dl.ignore_patterns(str(tmp_path)) == ["odd[[]1].safetensors.part*"]


def test_patterns_select_exactly_the_parts_for_huggingface_hub(tmp_path):
    pytest.importorskip("huggingface_hub")
    write_checkpoint(tmp_path, {SHARD5: b"x"}, verified=[SHARD5])
    repo = [f"{SHARD5}.part00", f"{SHARD5}.part01", f"{SHARD6}.part00", "sha256-manifest.txt"]
    client = dl.HubClient(endpoint="http://127.0.0.1:9", token=None)  # select() asks no hub
    assert client.select(repo, dl.ignore_patterns(str(tmp_path))) == [
        f"{SHARD6}.part00",
        "sha256-manifest.txt",
    ]


class RecordsAuthorization(JsonHandler):
    """A hub's model info, recording the Authorization header of each request."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        self.reply(200, {"id": "org/model", "sha": "c" * 40})


@pytest.mark.parametrize(("token", "sent"), [(None, None), ("hf_given", "Bearer hf_given")])
def test_the_hub_is_sent_the_token_given_and_no_other(monkeypatch, token, sent):
    """No token file means no token: never one from the node's environment or `hf auth login`, which
    would go to whatever endpoint is set (a mirror on the LAN, over plain HTTP)."""
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    RecordsAuthorization.seen = []
    with serving(RecordsAuthorization) as endpoint:
        assert dl.HubClient(endpoint=endpoint, token=token).commit("org/model", None) == "c" * 40
    assert RecordsAuthorization.seen == [sent]


# --------------------------------------------------------------------------- listings and changed


def test_listing_skips_the_top_level_cache(tmp_path):
    (tmp_path / "exl3" / "qn").mkdir(parents=True)
    (tmp_path / "exl3" / "qn" / "L00.part.safetensors").write_bytes(b"abc")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "x.metadata").write_text("m")
    (tmp_path / "config.json").write_text("{}")
    assert sorted(dl.listing(str(tmp_path))) == ["config.json", "exl3/qn/L00.part.safetensors"]
    assert dl.listing(str(tmp_path / "absent")) == {}


def test_compare_listings():
    before = {"a": (1, 10), "b": (2, 20), "c": (3, 30)}
    assert dl.compare_listings(before, dict(before))["changed"] is False
    after = {"a": (1, 10), "b": (5, 21), "d": (4, 40)}
    result = dl.compare_listings(before, after)
    assert result == {"changed": True, "added": ["d"], "updated": ["b"], "removed": ["c"], "bytes_added": 9}


def test_downloaded_bytes_counts_files_in_place_and_incomplete_ones(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100)
    cache = tmp_path / ".cache" / "huggingface" / "download"
    cache.mkdir(parents=True)
    (cache / "abc.etag.incomplete").write_bytes(b"x" * 30)
    (cache / "a.metadata").write_bytes(b"x" * 999)
    assert dl.downloaded_bytes(str(tmp_path), {"a": 100, "b": 50}) == 130
    # Never more than the total, even with stale temporaries around.
    (cache / "old.incomplete").write_bytes(b"x" * 500)
    assert dl.downloaded_bytes(str(tmp_path), {"a": 100, "b": 50}) == 150


def test_missing_files_are_absent_or_of_another_size(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"x" * 9)
    assert dl.missing_files(str(tmp_path), {"a": 10, "b": 10, "c": 1}) == ["b", "c"]


# --------------------------------------------------------------------------- token, environment


def test_read_token(tmp_path):
    assert dl.read_token(None) is None
    assert dl.read_token(str(tmp_path / "absent")) is None
    (tmp_path / "empty").write_text("\n")
    assert dl.read_token(str(tmp_path / "empty")) is None
    (tmp_path / "token").write_text("hf_abc\n")
    assert dl.read_token(str(tmp_path / "token")) == "hf_abc"
    with pytest.raises(dl.DownloadError, match="cannot read the token file"):
        dl.read_token(str(tmp_path))  # a directory


def test_hub_environment():
    env = {"HF_ENDPOINT": "", "HF_TOKEN": " ", "HF_HUB_DISABLE_XET": "1"}
    assert dl.hub_environment(env, "") is None
    assert env == {"HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env = {"HF_ENDPOINT": "http://hub:5080"}
    assert dl.hub_environment(env, "") == "http://hub:5080"
    assert dl.hub_environment(env, "http://mirror:1") == "http://mirror:1" == env["HF_ENDPOINT"]


# --------------------------------------------------------------------------- the download


def download(hub: FakeHub, model_dir: Path, progress: ProgressWriter | None = None, patterns=None) -> dict:
    return dl.run_download(
        hub,
        repo_id="o/r",
        revision=None,
        model_dir=str(model_dir),
        patterns=dl.ignore_patterns(str(model_dir)) if patterns is None else patterns,
        workers=2,
        progress=progress or ProgressWriter(None, "download"),
        interval=0.01,
    )


REPO = {
    "config.json": b"{}",
    f"{SHARD5}.part00": b"a" * 300,
    f"{SHARD5}.part01": b"b" * 200,
    "x/y.bin": b"y" * 24,
}


def test_a_download_then_a_rerun_that_fetches_nothing(tmp_path):
    model = tmp_path / "model"
    hub = FakeHub(REPO)
    first = download(hub, model)
    assert first["changed"] is True
    assert first["added"] == sorted(REPO)
    assert (first["files_total"], first["bytes_total"], first["bytes_downloaded"]) == (4, 526, 526)
    assert first["msg"] == f"downloaded 4 files (526 B) of o/r into {model}"
    assert first["listing_error"] is None

    hub.fetched.clear()
    again = download(hub, model)
    assert again["changed"] is False
    assert hub.fetched == []
    assert again["msg"] == f"{model} is up to date with o/r (4 files); nothing downloaded"

    (model / "config.json").unlink()
    third = download(hub, model)
    assert (third["changed"], third["added"], hub.fetched) == (True, ["config.json"], ["config.json"])


def test_the_progress_document_counts_only_this_runs_bytes(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / f"{SHARD5}.part00").write_bytes(REPO[f"{SHARD5}.part00"])  # 300 bytes already there
    path = tmp_path / "progress.json"
    hub = FakeHub(REPO)
    seen = []
    hub.during_download = lambda name: seen.append(json.loads(path.read_text()))
    download(hub, model, ProgressWriter(str(path), "download"))
    doc = json.loads(path.read_text())
    assert (doc["what"], doc["phase"], doc["unit"]) == ("download", "done", "bytes")
    assert doc["done"] == doc["total"] == 526 - 300
    assert doc["detail"] == "300 B of 526 B already there"
    assert seen and seen[0]["phase"] == "downloading"


def test_a_failed_download_says_what_failed_and_whether_files_changed(tmp_path):
    model = tmp_path / "model"
    path = tmp_path / "progress.json"
    with pytest.raises(dl.DownloadError) as failure:
        download(
            FakeHub(REPO, fail_download=OSError("No space left on device")),
            model,
            ProgressWriter(str(path), "download"),
        )
    assert str(failure.value) == (
        f"downloading o/r (revision main) into {model} failed: OSError: No space left on device"
    )
    assert failure.value.changed is False
    assert json.loads(path.read_text())["phase"] == "failed"


def test_a_hub_that_does_not_list_the_repo_keeps_the_local_files_with_a_warning(tmp_path):
    model = tmp_path / "model"
    download(FakeHub(REPO), model)
    hub = FakeHub(REPO, fail_listing=PermissionError("401 Client Error.\nmore"))
    hub.download = lambda *args: None  # huggingface_hub keeps local_dir when it cannot ask
    result = download(hub, model)
    assert result["changed"] is False
    assert result["listing_error"] == "PermissionError: 401 Client Error."
    warning = "WARNING: the hub did not list the repo (PermissionError: 401 Client Error.)"
    assert result["msg"].endswith(f"{warning}, the local files were kept")
    assert (result["files_total"], result["bytes_total"]) == (0, None)


def test_check_mode_says_what_would_be_fetched_and_writes_nothing(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b"{}")
    (model / "x").mkdir()
    (model / "x" / "y.bin").write_bytes(b"short")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    hub = FakeHub(REPO)
    report = dl.check_download(
        hub, repo_id="o/r", revision=None, model_dir=str(model), patterns=[f"{SHARD5}.part01"]
    )
    assert report["changed"] is True
    assert report["would_download"] == [f"{SHARD5}.part00", "x/y.bin"]
    assert report["msg"] == f"would download 2 files (324 B) of o/r into {model}"
    assert hub.fetched == []
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before

    download(hub, model)
    report = dl.check_download(hub, repo_id="o/r", revision=None, model_dir=str(model), patterns=[])
    assert (report["changed"], report["would_download"]) == (False, [])

    report = dl.check_download(
        FakeHub(REPO, fail_listing=ConnectionError("refused")),
        repo_id="o/r",
        revision=None,
        model_dir=str(model),
        patterns=[],
    )
    assert (report["changed"], report["listing_error"]) == (False, "ConnectionError: refused")
    assert "cannot tell what a download would fetch" in report["msg"]


# --------------------------------------------------------------------------- an interrupted download


def partial(model: Path, name: str, size: int) -> Path:
    """A partial file as huggingface_hub leaves it when its process is killed mid-file."""
    cache = model / ".cache" / "huggingface" / "download"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{hashlib.sha1(name.encode()).hexdigest()[:8]}.etag.{os.urandom(4).hex()}.incomplete"
    path.write_bytes(b"x" * size)
    return path


def fake_proc(tmp_path: Path, open_files: list[Path]) -> Path:
    """A /proc with one process holding ``open_files`` open (fd symlinks, as the kernel shows them)."""
    fd_dir = tmp_path / "proc" / "4242" / "fd"
    fd_dir.mkdir(parents=True)
    for number, path in enumerate(open_files):
        (fd_dir / str(number)).symlink_to(path)
    (tmp_path / "proc" / "self").mkdir()  # not a pid: skipped
    return tmp_path / "proc"


def test_partials_no_process_writes_are_orphans_and_a_live_ones_is_kept(tmp_path):
    model = tmp_path / "model"
    orphan = partial(model, SHARD5, 3000)
    live = partial(model, SHARD6, 2000)
    proc = fake_proc(tmp_path, [live])
    assert dl.open_paths(str(proc)) == {str(live)}
    assert dl.orphaned_partials(str(model), dl.open_paths(str(proc))) == [(str(orphan), 3000)]
    assert dl.remove_orphaned_partials(str(model), str(proc)) == (1, 3000)
    assert not orphan.exists() and live.exists(), "a download still running keeps its file"


def test_a_rerun_after_a_killed_download_fetches_only_what_was_missing_and_leaves_no_partials(tmp_path):
    model = tmp_path / "model"
    hub = FakeHub(REPO)
    download(hub, model)
    (model / "config.json").unlink()  # the file being written when the process was killed
    for size in (100, 200):
        partial(model, "config.json", size)  # two killed attempts
    hub.fetched.clear()
    again = download(hub, model)
    assert hub.fetched == ["config.json"], "the complete files are not fetched again"
    assert again["partials_removed"] == 2
    assert again["msg"].endswith("; removed 2 partial downloads left by an interrupted run (300 B)")
    assert not list((model / ".cache").rglob("*.incomplete"))


def test_check_mode_counts_the_orphans_and_removes_nothing(tmp_path):
    model = tmp_path / "model"
    hub = FakeHub(REPO)
    download(hub, model)
    left = partial(model, SHARD1, 10)
    report = dl.check_download(hub, repo_id="o/r", revision=None, model_dir=str(model), patterns=[])
    assert (report["changed"], report["partials_removed"], report["would_download"]) == (True, 1, [])
    assert "would remove 1 partial downloads left by an interrupted run (10 B)" in report["msg"]
    assert left.exists()
