"""Tests of the checkpoint_download module: the real huggingface_hub against the lab's hub stand-in.

The stand-in (lab/standins/hub) serves a ~3 MB checkpoint with a token on a loopback port, in this
process; nothing here needs the network, root or Docker. The download logic alone, against a
fake hub client, is tested in tests/unit/plugins/module_utils/test_download.py.
"""

from __future__ import annotations

import builtins
import hashlib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _checkpoint as ck
from ansible_collections.sparkserve.dsv41.plugins.modules import checkpoint_download, checkpoint_revision
from dir_snapshot import snapshot

pytest.importorskip("huggingface_hub")

REPO_ROOT = Path(__file__).resolve().parents[4]
HUB_DIR = REPO_ROOT / "lab" / "standins" / "hub"
REPO_ID = "0xSero/DeepSeek-V4.1-Flash-Spark"
SHARD5 = "model-00005-of-00006.safetensors"
SHARD6 = "model-00006-of-00006.safetensors"
WRONG_TOKEN = "hf_wrong_token_value"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The lab's hub stand-in with a ~3 MB checkpoint and a token, on a loopback port."""
    make_checkpoint = _load("checkpoint_download_test_make_checkpoint", HUB_DIR / "make_checkpoint.py")
    standin = _load("checkpoint_download_test_hub", HUB_DIR / "hf_hub_standin.py")
    root = tmp_path_factory.mktemp("hub")
    make_checkpoint.generate(root / REPO_ID, size_mb=3, exl3_layers=2)
    token = "hf_test_" + "a" * 24
    log_path = tmp_path_factory.mktemp("hub-log") / "access.log"
    with log_path.open("a") as log:
        server = standin.serve_in_thread(root, token=token, access_log=log)
        try:
            yield {"url": server.url, "token": token, "log": log_path}
        finally:
            server.shutdown()
            server.server_close()


@pytest.fixture
def download(hub, tmp_path, run_module, monkeypatch):
    """``download(model_dir, token_file, check_mode=False)`` -> the module's result."""
    for name in ("HF_ENDPOINT", "HF_TOKEN", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)  # restored after the test: the module sets some
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")

    def _run(model_dir: Path, token_file: Path, check_mode: bool = False, **extra: Any):
        args = {
            **extra,
            "repo_id": REPO_ID,
            "model_dir": str(model_dir),
            "token_file": str(token_file),
            "endpoint": hub["url"],
            "workers": 4,
            "progress_file": str(tmp_path / "progress.json"),
        }
        return run_module(checkpoint_download, args, check_mode=check_mode)

    return _run


def fetched(log: Path, since: int) -> list[str]:
    records = [json.loads(line) for line in log.read_text().splitlines()[since:]]
    return [r["path"] for r in records if r["method"] == "GET" and "/resolve/" in r["path"]]


def log_length(hub) -> int:
    return len(hub["log"].read_text().splitlines())


def rebuild(model_dir: Path) -> dict[str, Any]:
    """What the checkpoint_shards module does: rebuild, verify, delete the parts, record."""
    model = str(model_dir)
    state = ck.default_state_file(model)
    manifest = ck.read_manifest(model)
    records, _ = ck.load_state(state, model)
    actions = ck.plan_actions(manifest, ck.scan_checkpoint(model, manifest), records, False)
    report, errors = ck.apply_plan(actions, model, records, state, check_mode=False, workers=2)
    assert errors == []
    return report


def test_download_rebuild_and_rerun_fetch_nothing_again(hub, download, tmp_path):
    model_dir = tmp_path / "models" / "DeepSeek-V4.1-Flash-Spark"
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"] + "\n")

    first = download(model_dir, token_file)
    assert not first.failed, first
    assert first["changed"] is True
    assert first["ignore_patterns"] == []
    assert first["files_total"] == len(first["added"]) > 10
    assert f"{SHARD5}.part00" in first["added"]
    assert (first["repo_id"], first["revision"], first["model_dir"]) == (REPO_ID, "main", str(model_dir))
    assert first["msg"].startswith(f"downloaded {len(first['added'])} files (")
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert (progress["what"], progress["phase"], progress["unit"]) == ("download", "done", "bytes")
    assert progress["done"] == progress["total"] == first["bytes_total"]
    assert hub["token"] not in json.dumps(first)
    documented = yaml.safe_load(checkpoint_download.RETURN)
    assert set(documented) - {"would_download", "manifest_written"} == set(first) - {"changed", "invocation"}

    report = rebuild(model_dir)
    assert {f["file"] for f in report["files"] if f["action"] == "rebuilt"} == {SHARD5, SHARD6}
    assert not list(model_dir.glob("*.part*"))

    # The re-run changes nothing and, above all, does not fetch the deleted parts again.
    since = log_length(hub)
    again = download(model_dir, token_file)
    assert not again.failed, again
    assert again["changed"] is False
    assert {f"{SHARD5}.part*", f"{SHARD6}.part*"} <= set(again["ignore_patterns"])
    assert "up to date" in again["msg"]
    assert fetched(hub["log"], since) == []
    assert not list(model_dir.glob("*.part*"))

    # Check mode asks the hub what it holds, and finds nothing to fetch.
    before = snapshot(tmp_path)
    checked = download(model_dir, token_file, check_mode=True)
    assert (checked["changed"], checked["would_download"]) == (False, [])
    assert snapshot(tmp_path) == before
    returned = {key: doc["returned"] for key, doc in documented.items()}
    in_check_mode = {key for key, when in returned.items() if when in ("always", "success", "check mode")}
    assert set(checked) - {"changed", "invocation"} == in_check_mode

    # A file lost since is fetched again, and only that one.
    (model_dir / "config.json").unlink()
    checked = download(model_dir, token_file, check_mode=True)
    assert (checked["changed"], checked["would_download"]) == (True, ["config.json"])
    since = log_length(hub)
    third = download(model_dir, token_file)
    assert (third["changed"], third["added"]) == (True, ["config.json"])
    assert [path.rsplit("/", 1)[1] for path in fetched(hub["log"], since)] == ["config.json"]


def test_a_revision_linked_whole_from_another_fetches_nothing_and_reports_the_change(hub, download, tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"] + "\n")
    serving = tmp_path / "revisions" / "serving"
    assert not download(serving, token_file).failed

    since = log_length(hub)
    new = tmp_path / "revisions" / "new"
    result = download(new, token_file, link_from=[str(serving)])
    assert not result.failed, result
    assert fetched(hub["log"], since) == [], "every file was the serving revision's"
    assert "config.json" in result["linked"]
    assert (new / "config.json").samefile(serving / "config.json")
    assert result["changed"] is True, "the new directory was filled"
    assert result["msg"].startswith(f"linked {len(result['linked'])} unchanged files from another revision; ")
    assert download(new, token_file, link_from=[str(serving)])["changed"] is False


def test_check_mode_on_an_empty_directory_writes_nothing(hub, download, tmp_path):
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"])
    before = snapshot(tmp_path)
    result = download(tmp_path / "model", token_file, check_mode=True)
    assert not result.failed, result
    assert result["changed"] is True
    assert f"{SHARD5}.part00" in result["would_download"]
    assert result["msg"].startswith(f"would download {result['files_total']} files")
    assert snapshot(tmp_path) == before


def test_without_the_token_it_fails_clearly_and_never_shows_a_token(hub, download, tmp_path):
    model_dir = tmp_path / "model"
    result = download(model_dir, tmp_path / "no-token-file")
    assert result.failed
    assert result["changed"] is False
    assert result["msg"].startswith(f"downloading {REPO_ID} (revision main) into {model_dir} failed: ")
    assert "RepositoryNotFoundError" in result["msg"]
    assert json.loads((tmp_path / "progress.json").read_text())["phase"] == "failed"

    (tmp_path / "wrong").write_text(WRONG_TOKEN)
    result = download(model_dir, tmp_path / "wrong")
    assert result.failed
    assert WRONG_TOKEN not in json.dumps(result)


def test_a_hub_refusing_the_token_keeps_local_files_with_a_warning(hub, download, tmp_path):
    model_dir = tmp_path / "model"
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"])
    assert not download(model_dir, token_file).failed
    token_file.write_text(WRONG_TOKEN)
    result = download(model_dir, token_file)
    assert not result.failed, result
    assert result["changed"] is False
    assert "WARNING: the hub did not list the repo" in result["msg"]
    assert result["listing_error"]
    assert WRONG_TOKEN not in json.dumps(result)


def test_without_huggingface_hub_it_says_where_to_get_it(tmp_path, run_module, monkeypatch):
    real_import = builtins.__import__

    def no_hub(name, *args, **kwargs):
        if name.startswith("huggingface_hub"):
            raise ModuleNotFoundError("No module named 'huggingface_hub'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    for name in ("HF_ENDPOINT", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.delenv(name, raising=False)
    before = snapshot(tmp_path)
    result = run_module(checkpoint_download, {"repo_id": REPO_ID, "model_dir": str(tmp_path / "model")})
    assert result.failed
    assert "Failed to import the required Python library (huggingface_hub)" in result["msg"]
    assert "runs this module with that virtualenv's Python" in result["msg"]
    assert snapshot(tmp_path) == before


def test_workers_must_be_positive(tmp_path, run_module):
    result = run_module(checkpoint_download, {"repo_id": REPO_ID, "model_dir": str(tmp_path), "workers": 0})
    assert result.failed
    assert "workers must be at least 1" in result["msg"]


def test_checkpoint_revision_resolves_main_to_the_commit_the_download_records(
    hub, download, tmp_path, run_module
):
    """The commit names the revision directory: it must be the one huggingface_hub records."""
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"])
    args = {
        "root": str(tmp_path / "root"),
        "repo_id": REPO_ID,
        "endpoint": hub["url"],
        "token_file": str(token_file),
    }
    resolved = run_module(checkpoint_revision, args, check_mode=True)
    assert not resolved.failed, resolved
    assert (resolved["exists"], resolved["warning"]) == (False, None)
    assert hub["token"] not in json.dumps(resolved)
    downloaded = download(Path(resolved["model_dir"]), token_file)
    assert not downloaded.failed, downloaded
    metadata = Path(resolved["model_dir"]) / ".cache/huggingface/download/config.json.metadata"
    assert metadata.read_text().splitlines()[0] == resolved["commit"]
    # A wrong token: the hub does not answer, and the only revision on disk keeps serving.
    token_file.write_text(WRONG_TOKEN)
    offline = run_module(checkpoint_revision, args)
    assert (offline["commit"], offline["changed"]) == (resolved["commit"], False)
    assert offline["warning"].startswith("the hub did not resolve")
    assert WRONG_TOKEN not in json.dumps(offline)


def test_a_checkpoint_without_a_manifest_gets_the_hubs_sha256_of_its_weights(hub, download, tmp_path):
    """A plain checkpoint ships no manifest: the download writes one of the hub's LFS sha256s, once."""
    model_dir = tmp_path / "models" / "plain"
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"] + "\n")
    name = ".sparkserve-hub-sha256.txt"

    planned = download(model_dir, token_file, check_mode=True, manifest_from_hub=name)
    assert not planned.failed, planned
    assert planned["manifest_written"] is True and not (model_dir / name).exists()

    first = download(model_dir, token_file, manifest_from_hub=name)
    assert not first.failed, first
    assert first["manifest_written"] is True
    lines = (model_dir / name).read_text().splitlines()
    listed = {path: digest for digest, path in (line.split("  ", 1) for line in lines)}
    # Every safetensors file (the stand-in keeps them in LFS) and nothing small such as config.json.
    on_disk = {
        str(path.relative_to(model_dir))
        for path in model_dir.rglob("*.safetensors*")
        if ".cache" not in path.parts
    }
    assert set(listed) == on_disk and "config.json" not in listed
    for path, digest in listed.items():
        assert hashlib.sha256((model_dir / path).read_bytes()).hexdigest() == digest, path

    again = download(model_dir, token_file, manifest_from_hub=name)
    assert not again.failed, again
    assert (again["changed"], again["manifest_written"]) == (False, False)
