"""Tests of the checkpoint_shards module, run in-process through ``run_module``."""

from __future__ import annotations

import hashlib
import json
import random
from fnmatch import fnmatch
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _checkpoint as ck
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _download as dl
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import FIELDS
from ansible_collections.sparkserve.dsv41.plugins.modules import checkpoint_shards
from dir_snapshot import snapshot as full_snapshot

SHARDS = [f"model-{n:05d}-of-00006.safetensors" for n in range(1, 7)]


def build_checkpoint(root: Path, split: tuple[int, ...] = (5, 6), parts: int = 11) -> tuple[Path, dict]:
    """Six small shards; the ones in ``split`` exist only as ``parts`` parts."""
    rng = random.Random(3)
    model = root / "model"
    model.mkdir()
    data = {}
    lines = []
    for number, name in enumerate(SHARDS, start=1):
        blob = rng.randbytes(3000 + number)
        data[name] = blob
        lines.append(f"{hashlib.sha256(blob).hexdigest()}  {name}")
        if number in split:
            step = -(-len(blob) // parts)
            for index in range(parts):
                (model / f"{name}.part{index:02d}").write_bytes(blob[index * step : (index + 1) * step])
        else:
            (model / name).write_bytes(blob)
    (model / "sha256-manifest.txt").write_text("\n".join(lines) + "\n")
    for bank in ("qn", "q31", "q31s"):
        (model / "exl3" / bank).mkdir(parents=True)
        for layer in range(2):
            (model / "exl3" / bank / f"L{layer:02d}.part.safetensors").write_bytes(b"w")
    (model / "exl3" / "plan").mkdir()
    (model / "exl3" / "plan" / "J268-ho-v31-K5n.json").write_text('{"qdir": "qn:q31:q31s"}')
    return model, data


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_rebuilds_verifies_and_is_idempotent(tmp_path, run_module, monkeypatch):
    model, data = build_checkpoint(tmp_path)
    first = run_module(checkpoint_shards, {"model_dir": str(model)})
    assert not first.failed, first
    assert first["changed"] is True
    assert first["shards"] == {name: hashlib.sha256(blob).hexdigest() for name, blob in data.items()}
    assert first["bytes_read"] == sum(len(b) for b in data.values())
    assert first["bytes_written"] == len(data[SHARDS[4]]) + len(data[SHARDS[5]])
    assert len(first["parts_deleted"]) == 22
    assert first["exl3_file_count"] == 7
    assert first["exl3_bank_files"] == {"qn": 2, "q31": 2, "q31s": 2}
    assert first["state_file"] == str(model / ".cache/sparkserve/verified.json")
    assert [f["action"] for f in first["files"]] == ["verified"] * 4 + ["rebuilt"] * 2
    assert not list(model.glob("*.part*"))

    monkeypatch.setattr(ck, "_open_read", lambda path: pytest.fail(f"{path} read on the second run"))
    second = run_module(checkpoint_shards, {"model_dir": str(model)})
    assert not second.failed, second
    assert second["changed"] is False
    assert second["bytes_read"] == 0
    assert second["parts_deleted"] == []
    assert second["shards"] == first["shards"]


@pytest.mark.parametrize("keep_parts", [True, False])
def test_keep_parts(tmp_path, run_module, keep_parts):
    model, _data = build_checkpoint(tmp_path, split=(6,))
    result = run_module(checkpoint_shards, {"model_dir": str(model), "keep_parts": keep_parts})
    assert not result.failed, result
    assert len(list(model.glob("*.part*"))) == (11 if keep_parts else 0)
    assert (model / SHARDS[5]).exists()


def test_check_mode_changes_nothing(tmp_path, run_module, monkeypatch):
    model, _data = build_checkpoint(tmp_path)
    before = snapshot(tmp_path)
    monkeypatch.setattr(ck, "_open_read", lambda path: pytest.fail(f"{path} read in check mode"))
    result = run_module(
        checkpoint_shards,
        {"model_dir": str(model), "progress_file": str(tmp_path / "progress.json")},
        check_mode=True,
    )
    assert not result.failed, result
    assert result["changed"] is True
    assert [f["action"] for f in result["files"]] == ["would_verify"] * 4 + ["would_rebuild"] * 2
    assert result["bytes_read"] == 0
    assert snapshot(tmp_path) == before


def test_corrupted_part_fails_with_hashes(tmp_path, run_module):
    model, data = build_checkpoint(tmp_path)
    (model / f"{SHARDS[5]}.part10").write_bytes(b"oops")
    result = run_module(checkpoint_shards, {"model_dir": str(model)})
    assert result.failed
    assert SHARDS[5] in result["msg"]
    assert hashlib.sha256(data[SHARDS[5]]).hexdigest() in result["msg"]
    assert "re-download the parts" in result["msg"]
    assert len(list(model.glob(f"{SHARDS[5]}.part*"))) == 11
    assert not (model / SHARDS[5]).exists()
    # The good files were recorded: the next run reads only the bad shard's parts.
    assert SHARDS[4] in json.loads((model / ".cache/sparkserve/verified.json").read_text())["files"]


def test_missing_file_without_parts(tmp_path, run_module):
    model, _data = build_checkpoint(tmp_path)
    (model / SHARDS[0]).unlink()
    result = run_module(checkpoint_shards, {"model_dir": str(model)})
    assert result.failed
    assert f"{model / SHARDS[0]} is listed in the manifest but missing" in result["msg"]
    assert f"{SHARDS[0]}.partNN" in result["msg"]


def test_free_space_failure(tmp_path, run_module, monkeypatch):
    model, _data = build_checkpoint(tmp_path)
    monkeypatch.setattr(ck, "free_bytes", lambda path: 1024)
    before = snapshot(tmp_path)
    result = run_module(checkpoint_shards, {"model_dir": str(model)})
    assert result.failed
    assert "not enough free space" in result["msg"]
    assert "1024 bytes" in result["msg"]
    assert snapshot(tmp_path) == before


def test_exl3_count_comparison(tmp_path, run_module):
    model, _data = build_checkpoint(tmp_path, split=())
    good = run_module(checkpoint_shards, {"model_dir": str(model), "expect_exl3_file_count": 7})
    assert not good.failed, good
    bad = run_module(checkpoint_shards, {"model_dir": str(model), "expect_exl3_file_count": 8})
    assert bad.failed
    assert "holds 7 files but the head's copy holds 8" in bad["msg"]


def test_exl3_checks_can_be_skipped(tmp_path, run_module):
    model, _data = build_checkpoint(tmp_path, split=())
    (model / "exl3" / "plan" / "J268-ho-v31-K5n.json").unlink()
    assert run_module(checkpoint_shards, {"model_dir": str(model)}).failed
    result = run_module(checkpoint_shards, {"model_dir": str(model), "verify_exl3": False})
    assert not result.failed, result
    assert result["exl3_file_count"] is None


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"workers": 0}, "workers must be at least 1"),
        ({"verify_exl3": False, "expect_exl3_file_count": 3}, "needs verify_exl3=true"),
        ({"manifest": "nope.txt"}, "nope.txt not found"),
        ({"adopt": True, "expect_exl3_file_count": 7}, "cannot be used with adopt=true"),
        ({"adopt": True, "manifest": "bad.txt"}, "bad.txt line 1 is malformed"),
    ],
)
def test_bad_arguments(tmp_path, run_module, args, fragment):
    model, _data = build_checkpoint(tmp_path, split=())
    (model / "bad.txt").write_text("not a checksum line\n")
    result = run_module(checkpoint_shards, {"model_dir": str(model), **args})
    assert result.failed
    assert fragment in result["msg"]


def test_missing_model_dir(tmp_path, run_module):
    result = run_module(checkpoint_shards, {"model_dir": str(tmp_path / "absent")})
    assert result.failed
    assert "is not a directory" in result["msg"]


def test_state_and_progress_files(tmp_path, run_module):
    model, data = build_checkpoint(tmp_path)
    state = tmp_path / "elsewhere" / "state.json"
    progress = tmp_path / "progress.json"
    result = run_module(
        checkpoint_shards,
        {"model_dir": str(model), "state_file": str(state), "progress_file": str(progress), "workers": 1},
    )
    assert not result.failed, result
    assert result["state_file"] == str(state)
    assert set(json.loads(state.read_text())["files"]) == set(SHARDS)
    assert not (model / ".cache").exists()
    document = json.loads(progress.read_text())
    assert tuple(document) == FIELDS
    assert (document["what"], document["phase"], document["unit"]) == ("verification", "done", "bytes")
    assert document["done"] == document["total"] == sum(len(b) for b in data.values())


# --------------------------------------------------------------------------- adopt


def sizes(data: dict, names) -> int:
    return sum(len(data[name]) for name in names)


def test_adopt_a_download_sh_directory(tmp_path, run_module, monkeypatch):
    # Six rebuilt, verified shards, no parts, the manifest, no record of ours.
    model, data = build_checkpoint(tmp_path, split=())
    args = {"model_dir": str(model), "adopt": True, "progress_file": str(tmp_path / "progress.json")}
    first = run_module(checkpoint_shards, args)
    assert not first.failed, first
    assert first["changed"] is True
    assert first["adopted"] == SHARDS
    assert first["mismatched"] == []
    assert [f["action"] for f in first["files"]] == ["adopted"] * 6
    assert first["bytes_read"] == sizes(data, SHARDS)
    assert first["bytes_written"] == 0
    assert first["shards"] == {name: hashlib.sha256(blob).hexdigest() for name, blob in data.items()}
    assert first["exl3_file_count"] is None
    assert set(json.loads((model / ".cache/sparkserve/verified.json").read_text())["files"]) == set(SHARDS)
    assert json.loads((tmp_path / "progress.json").read_text())["phase"] == "done"

    monkeypatch.setattr(ck, "_open_read", lambda path: pytest.fail(f"{path} read on the second run"))
    second = run_module(checkpoint_shards, args)
    assert not second.failed, second
    assert second["changed"] is False
    assert second["bytes_read"] == 0
    assert [f["action"] for f in second["files"]] == ["trusted"] * 6

    # The download now skips the parts of every adopted shard instead of fetching ~197 GB again.
    assert ck.trusted_files(str(model)) == SHARDS
    patterns = dl.ignore_patterns(str(model))
    for name in SHARDS[4:]:
        assert any(fnmatch(f"{name}.part00", pattern) for pattern in patterns), patterns


@pytest.mark.parametrize("workers", [1, 4])
def test_adopt_leaves_a_shard_that_exists_only_as_parts(tmp_path, run_module, workers):
    model, data = build_checkpoint(tmp_path, split=(5,))
    parts_before = full_snapshot(model)
    result = run_module(checkpoint_shards, {"model_dir": str(model), "adopt": True, "workers": workers})
    assert not result.failed, result
    assert result["changed"] is True
    actions = {f["file"]: f["action"] for f in result["files"]}
    assert actions == {name: ("skipped" if name == SHARDS[4] else "adopted") for name in SHARDS}
    assert result["adopted"] == [name for name in SHARDS if name != SHARDS[4]]
    assert result["bytes_read"] == sizes(data, result["adopted"])
    assert result["parts_deleted"] == []
    assert len(list(model.glob(f"{SHARDS[4]}.part*"))) == 11
    assert not (model / SHARDS[4]).exists()
    after = full_snapshot(model)
    assert {k: v for k, v in after.items() if not k.startswith(".cache")} == parts_before
    # Shard 5's parts are not ignored by the download: they are all there is of it.
    assert SHARDS[4] not in ck.trusted_files(str(model))


def test_adopt_reports_a_corrupted_shard_without_failing(tmp_path, run_module):
    model, data = build_checkpoint(tmp_path, split=())
    (model / SHARDS[2]).write_bytes(b"not the shard")
    before = full_snapshot(model)
    result = run_module(checkpoint_shards, {"model_dir": str(model), "adopt": True})
    assert not result.failed, result
    expected = hashlib.sha256(data[SHARDS[2]]).hexdigest()
    actual = hashlib.sha256(b"not the shard").hexdigest()
    assert result["mismatched"] == [{"file": SHARDS[2], "expected": expected, "actual": actual}]
    assert next(f for f in result["files"] if f["file"] == SHARDS[2])["action"] == "mismatched"
    assert SHARDS[2] not in result["adopted"]
    assert SHARDS[2] not in result["shards"]
    messages = [w["event"]["msg"] if isinstance(w, dict) else w for w in result["warnings"]]
    assert any(f"expected sha256 {expected}, got {actual}" in m and "not adopted" in m for m in messages), (
        messages
    )
    recorded = json.loads((model / ".cache/sparkserve/verified.json").read_text())["files"]
    assert set(recorded) == set(SHARDS) - {SHARDS[2]}
    after = full_snapshot(model)
    assert {k: v for k, v in after.items() if not k.startswith(".cache")} == before
    # The normal run is the one that fails on it.
    normal = run_module(checkpoint_shards, {"model_dir": str(model)})
    assert normal.failed
    assert SHARDS[2] in normal["msg"]


@pytest.mark.parametrize("missing", ["manifest", "model_dir"])
def test_adopt_fresh_directory(tmp_path, run_module, missing):
    model, _data = build_checkpoint(tmp_path, split=())
    if missing == "manifest":
        (model / "sha256-manifest.txt").unlink()
    else:
        model = tmp_path / "not-yet-downloaded"
    before = full_snapshot(tmp_path)
    result = run_module(checkpoint_shards, {"model_dir": str(model), "adopt": True})
    assert not result.failed, result
    assert result["changed"] is False
    assert result["files"] == result["adopted"] == []
    assert result["bytes_read"] == 0
    assert full_snapshot(tmp_path) == before


def test_adopt_ignores_the_exl3_layout(tmp_path, run_module):
    model, _data = build_checkpoint(tmp_path, split=())
    (model / "exl3" / "plan" / "J268-ho-v31-K5n.json").unlink()
    result = run_module(checkpoint_shards, {"model_dir": str(model), "adopt": True, "verify_exl3": True})
    assert not result.failed, result
    assert result["adopted"] == SHARDS


def test_adopt_check_mode_reads_and_writes_nothing(tmp_path, run_module, monkeypatch):
    model, _data = build_checkpoint(tmp_path, split=(6,))
    before = full_snapshot(tmp_path)
    monkeypatch.setattr(ck, "_open_read", lambda path: pytest.fail(f"{path} read in check mode"))
    args = {"model_dir": str(model), "adopt": True, "progress_file": str(tmp_path / "progress.json")}
    result = run_module(checkpoint_shards, args, check_mode=True)
    assert not result.failed, result
    assert result["changed"] is True
    assert [f["action"] for f in result["files"]] == ["would_adopt"] * 5 + ["skipped"]
    assert result["bytes_read"] == 0
    assert result["adopted"] == []
    assert full_snapshot(tmp_path) == before


def test_adopt_documentation_matches_the_result(tmp_path, run_module):
    model, _data = build_checkpoint(tmp_path, split=())
    (model / SHARDS[0]).write_bytes(b"corrupt")
    result = run_module(checkpoint_shards, {"model_dir": str(model), "adopt": True})
    assert not result.failed, result
    documented = yaml.safe_load(checkpoint_shards.RETURN)
    assert set(documented) <= set(result)
    assert set(documented["files"]["contains"]) == set(result["files"][0])
    assert set(documented["mismatched"]["contains"]) == set(result["mismatched"][0])
    for action in ("adopted", "mismatched", "skipped", "would_adopt"):
        assert f"C({action})" in " ".join(documented["files"]["contains"]["action"]["description"])
    options = yaml.safe_load(checkpoint_shards.DOCUMENTATION)["options"]
    assert options["adopt"] == {
        "description": options["adopt"]["description"],
        "type": "bool",
        "default": False,
    }
    yaml.safe_load(checkpoint_shards.EXAMPLES)
