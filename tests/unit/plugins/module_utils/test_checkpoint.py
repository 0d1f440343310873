"""Unit tests for module_utils/_checkpoint.py on small synthetic checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from fnmatch import fnmatch
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _adoption as ad
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _checkpoint as ck
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _download as dl
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import FIELDS

SHARDS = [f"model-{n:05d}-of-00006.safetensors" for n in range(1, 7)]
PLAN = "J268-ho-v31-K5n.json"
BANKS = ("qn", "q31", "q31s")
# Files hashed at the same time, unless a test says otherwise: more than one, so threads are exercised.
WORKERS = 2


def build_checkpoint(
    root: Path,
    parts: dict[int, int] | None = None,
    shard_size: int = 5000,
    width: int = 2,
    seed: int = 7,
) -> tuple[Path, dict[str, bytes]]:
    """A model dir with six shards; shards listed in ``parts`` (shard number -> count) are split."""
    parts = {5: 3, 6: 12} if parts is None else parts
    rng = random.Random(seed)
    model = root / "model"
    model.mkdir()
    data: dict[str, bytes] = {}
    lines = []
    for number, name in enumerate(SHARDS, start=1):
        blob = rng.randbytes(shard_size + number * 37)
        data[name] = blob
        lines.append(f"{hashlib.sha256(blob).hexdigest()}  {name}")
        count = parts.get(number, 0)
        if count:
            step = -(-len(blob) // count)
            for index in range(count):
                (model / f"{name}.part{index:0{width}d}").write_bytes(blob[index * step : (index + 1) * step])
        else:
            (model / name).write_bytes(blob)
    (model / "sha256-manifest.txt").write_text("\n".join(lines) + "\n")
    (model / "config.json").write_text("{}")
    for bank in BANKS:
        (model / "exl3" / bank).mkdir(parents=True)
        for layer in range(3):
            (model / "exl3" / bank / f"L{layer:02d}.part.safetensors").write_bytes(b"x" * 10)
    (model / "exl3" / "plan").mkdir()
    (model / "exl3" / "plan" / PLAN).write_text(json.dumps({"qdir": "qn:q31:q31s", "other": 1}))
    return model, data


def run(model: Path, check_mode: bool = False, keep_parts: bool = False, **kwargs):
    """The module's sequence without Ansible: plan, check space, act."""
    state_file = kwargs.pop("state_file", ck.default_state_file(str(model)))
    manifest = ck.read_manifest(str(model))
    found = ck.scan_checkpoint(str(model), manifest)
    records, _warning = ck.load_state(state_file, str(model))
    actions = ck.plan_actions(manifest, found, records, keep_parts)
    ck.check_free_space(actions)
    kwargs.setdefault("workers", WORKERS)
    return ck.apply_plan(actions, str(model), records, state_file, check_mode=check_mode, **kwargs)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(root)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
    }


def actions_by_file(report) -> dict[str, str]:
    return {entry["file"]: entry["action"] for entry in report["files"]}


@pytest.fixture
def small_chunks(monkeypatch):
    # Several chunks per part, and the write-behind window exercised, on KB-sized files.
    monkeypatch.setattr(ck, "CHUNK_SIZE", 1000)
    monkeypatch.setattr(ck, "WRITE_BEHIND", 2500)


# --------------------------------------------------------------------------- manifest


def test_parse_manifest_accepts_sha256sum_formats():
    text = f"{'a' * 64}  one.safetensors\n\n{'B' * 64} *two.safetensors\r\n   \n"
    assert ck.parse_manifest(text) == {"one.safetensors": "a" * 64, "two.safetensors": "b" * 64}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"{'a' * 64}  ok\nnot a checksum line\n", "line 2 is malformed"),
        (f"{'a' * 63}  short\n", "line 1 is malformed"),
        (f"{'a' * 64} one-space\n", "line 1 is malformed"),
        (f"{'a' * 64}  x\n\n{'b' * 64}  x\n", "line 3 lists x again (first on line 1)"),
        (f"{'a' * 64}  /etc/passwd\n", "outside the model directory"),
        (f"{'a' * 64}  ../escape\n", "outside the model directory"),
        ("\n\n", "lists no files"),
    ],
)
def test_parse_manifest_rejects(text, fragment):
    with pytest.raises(ck.CheckpointError, match=re.escape(fragment)):
        ck.parse_manifest(text)


def test_read_manifest_missing(tmp_path):
    with pytest.raises(ck.CheckpointError, match=r"sha256-manifest\.txt not found"):
        ck.read_manifest(str(tmp_path))


# --------------------------------------------------------------------------- parts


@pytest.mark.parametrize("width", [1, 2, 3])
def test_order_parts_is_numeric(width):
    names = [f"s.part{i:0{width}d}" for i in range(12)]
    random.Random(1).shuffle(names)
    ordered, problem = ck.order_parts("s", [*names, "s", "s.partial", "s.part03.tmp", "t.part00"])
    assert problem is None
    assert [index for index, _ in ordered] == list(range(12))
    assert ordered[10][1] == f"s.part{10:0{width}d}"


@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        (["s.part00", "s.part02"], "part number(s) 01 missing"),
        (["s.part01", "s.part02"], "part number(s) 00 missing"),
        (["s.part0", "s.part00", "s.part1"], "share an index"),
    ],
)
def test_order_parts_problems(names, fragment):
    _ordered, problem = ck.order_parts("s", names)
    assert fragment in problem


# --------------------------------------------------------------------------- rebuild and verify


@pytest.mark.parametrize("width", [1, 2])
@pytest.mark.parametrize("keep_parts", [False, True])
def test_rebuild_verifies_and_handles_parts(tmp_path, small_chunks, keep_parts, width):
    model, data = build_checkpoint(tmp_path, width=width)
    report, errors = run(model, keep_parts=keep_parts, workers=3)
    assert errors == []
    assert report["changed"] is True
    for name, blob in data.items():
        assert (model / name).read_bytes() == blob
        assert report["shards"][name] == hashlib.sha256(blob).hexdigest()
    assert actions_by_file(report) == {
        name: ("rebuilt" if name[10] in "56" else "verified") for name in SHARDS
    }
    parts = sorted(p.name for p in model.glob("*.part*"))
    if keep_parts:
        assert len(parts) == 15
        assert report["parts_deleted"] == []
    else:
        assert parts == []
        assert len(report["parts_deleted"]) == 15
    assert not list(model.glob(f"*{ck.TEMP_SUFFIX}"))
    total = sum(len(b) for b in data.values())
    rebuilt = len(data[SHARDS[4]]) + len(data[SHARDS[5]])
    assert report["bytes_read"] == total
    assert report["bytes_written"] == rebuilt
    state = json.loads((model / ".cache/sparkserve/verified.json").read_text())
    assert set(state["files"]) == set(SHARDS)
    assert state["files"][SHARDS[4]]["size"] == len(data[SHARDS[4]])


def test_corrupted_part_keeps_parts_and_names_hashes(tmp_path, small_chunks):
    model, data = build_checkpoint(tmp_path)
    part = model / f"{SHARDS[4]}.part01"
    part.write_bytes(b"\0" + part.read_bytes()[1:])
    parts_before = {p.name: p.read_bytes() for p in model.glob(f"{SHARDS[4]}.part*")}
    report, errors = run(model)
    assert len(errors) == 1
    expected = hashlib.sha256(data[SHARDS[4]]).hexdigest()
    actual = hashlib.sha256(b"".join(parts_before[f"{SHARDS[4]}.part{i:02d}"] for i in range(3))).hexdigest()
    assert SHARDS[4] in errors[0]
    assert f"expected sha256 {expected}, got {actual}" in errors[0]
    assert "re-download the parts" in errors[0]
    assert not (model / SHARDS[4]).exists()
    assert {p.name: p.read_bytes() for p in model.glob(f"{SHARDS[4]}.part*")} == parts_before
    assert not list(model.glob(f".*{ck.TEMP_SUFFIX}"))
    assert actions_by_file(report)[SHARDS[4]] == "failed"
    assert report["changed"] is True
    # The other shard is still rebuilt: one bad shard does not stop the rest.
    assert (model / SHARDS[5]).read_bytes() == data[SHARDS[5]]


def test_corrupted_part_other_shard_parts_deleted(tmp_path):
    model, _data = build_checkpoint(tmp_path)
    part = model / f"{SHARDS[4]}.part00"
    part.write_bytes(part.read_bytes()[:-1] + b"!")
    _report, errors = run(model)
    assert errors
    assert sorted(p.name for p in model.glob("*.part*")) == [f"{SHARDS[4]}.part{i:02d}" for i in range(3)]
    state = json.loads((model / ".cache/sparkserve/verified.json").read_text())
    assert SHARDS[4] not in state["files"]
    assert SHARDS[5] in state["files"]


def test_corrupted_whole_shard_is_reported(tmp_path):
    model, data = build_checkpoint(tmp_path, parts={})
    (model / SHARDS[1]).write_bytes(b"garbage")
    _report, errors = run(model)
    assert errors == [
        f"{model / SHARDS[1]} does not match the manifest: expected sha256 "
        f"{hashlib.sha256(data[SHARDS[1]]).hexdigest()}, got {hashlib.sha256(b'garbage').hexdigest()}; "
        "re-download it."
    ]


@pytest.mark.parametrize(
    ("parts", "fragment"),
    [
        (["part00", "part02"], "part number(s) 01 missing"),
        ([], "no parts (model-00005-of-00006.safetensors.partNN) were found"),
    ],
)
def test_missing_part_or_file_fails_before_anything(tmp_path, parts, fragment):
    model, _data = build_checkpoint(tmp_path)
    for part in model.glob(f"{SHARDS[4]}.part*"):
        if part.name.rsplit(".", 1)[1] not in parts:
            part.unlink()
    before = snapshot(model)
    with pytest.raises(ck.CheckpointError) as excinfo:
        run(model)
    assert fragment in str(excinfo.value)
    assert str(model / SHARDS[4]) in str(excinfo.value)
    assert snapshot(model) == before


def test_every_missing_file_is_named(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    (model / SHARDS[0]).unlink()
    (model / SHARDS[2]).unlink()
    with pytest.raises(ck.CheckpointError) as excinfo:
        run(model)
    assert SHARDS[0] in str(excinfo.value)
    assert SHARDS[2] in str(excinfo.value)


def test_stale_temporary_file_is_discarded(tmp_path, small_chunks):
    model, data = build_checkpoint(tmp_path)
    stale = model / f".{SHARDS[5]}{ck.TEMP_SUFFIX}"
    stale.write_bytes(b"half a shard from an interrupted run")
    report, errors = run(model)
    assert errors == []
    assert not stale.exists()
    entry = next(e for e in report["files"] if e["file"] == SHARDS[5])
    assert entry["temp_discarded"] is True
    assert entry["action"] == "rebuilt"
    assert (model / SHARDS[5]).read_bytes() == data[SHARDS[5]]


@pytest.mark.parametrize("keep_parts", [False, True])
def test_shard_already_rebuilt_with_parts_left(tmp_path, keep_parts):
    model, data = build_checkpoint(tmp_path)
    run(model, keep_parts=True)  # first run keeps the parts
    (model / ".cache/sparkserve/verified.json").unlink()  # and forget it, so it re-verifies
    report, errors = run(model, keep_parts=keep_parts)
    assert errors == []
    entry = next(e for e in report["files"] if e["file"] == SHARDS[4])
    assert entry["action"] == "verified"
    assert report["bytes_written"] == 0
    assert bool(list(model.glob("*.part*"))) is keep_parts
    assert (entry["parts_deleted"] == []) is keep_parts
    assert (model / SHARDS[4]).read_bytes() == data[SHARDS[4]]


def test_trusted_shard_with_parts_deletes_parts_without_reading(tmp_path, monkeypatch):
    model, _data = build_checkpoint(tmp_path)
    run(model, keep_parts=True)
    monkeypatch.setattr(ck, "_open_read", _no_reads)
    report, errors = run(model, keep_parts=False)
    assert errors == []
    assert report["bytes_read"] == 0
    assert report["changed"] is True
    assert len(report["parts_deleted"]) == 15
    assert not list(model.glob("*.part*"))


def _no_reads(path):
    raise AssertionError(f"{path} was read")


def test_second_run_reads_nothing_and_changes_nothing(tmp_path, monkeypatch):
    model, data = build_checkpoint(tmp_path)
    first, _ = run(model)
    assert first["changed"] is True
    before = snapshot(model)
    monkeypatch.setattr(ck, "_open_read", _no_reads)
    second, errors = run(model)
    assert errors == []
    assert second["changed"] is False
    assert second["bytes_read"] == 0
    assert second["bytes_written"] == 0
    assert set(actions_by_file(second).values()) == {"trusted"}
    assert second["shards"] == {name: hashlib.sha256(blob).hexdigest() for name, blob in data.items()}
    assert snapshot(model) == before


def test_touched_file_is_hashed_again(tmp_path):
    model, data = build_checkpoint(tmp_path)
    run(model)
    os.utime(model / SHARDS[2], ns=(1, 1_000_000_000))
    report, errors = run(model)
    assert errors == []
    assert actions_by_file(report)[SHARDS[2]] == "verified"
    assert report["bytes_read"] == len(data[SHARDS[2]])
    assert report["changed"] is True  # the record's mtime changed
    third, _ = run(model)
    assert third["changed"] is False


def test_changed_manifest_hash_is_not_trusted(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    run(model)
    manifest = model / "sha256-manifest.txt"
    lines = manifest.read_text().splitlines()
    lines[0] = "0" * 64 + lines[0][64:]
    manifest.write_text("\n".join(lines) + "\n")
    _report, errors = run(model)
    assert len(errors) == 1
    assert f"expected sha256 {'0' * 64}" in errors[0]


def test_check_mode_reads_and_writes_nothing(tmp_path, monkeypatch):
    model, _data = build_checkpoint(tmp_path)
    (model / f".{SHARDS[4]}{ck.TEMP_SUFFIX}").write_bytes(b"stale")
    progress = tmp_path / "progress.json"
    before = snapshot(tmp_path)
    monkeypatch.setattr(ck, "_open_read", _no_reads)
    report, errors = run(model, check_mode=True, progress_file=str(progress))
    assert errors == []
    assert snapshot(tmp_path) == before
    assert report["changed"] is True
    assert report["bytes_read"] == 0
    actions = actions_by_file(report)
    assert actions[SHARDS[4]] == actions[SHARDS[5]] == "would_rebuild"
    assert actions[SHARDS[0]] == "would_verify"
    assert len(report["parts_deleted"]) == 15
    assert next(e for e in report["files"] if e["file"] == SHARDS[4])["temp_discarded"] is True


def test_check_mode_after_a_run_reports_no_change(tmp_path):
    model, _data = build_checkpoint(tmp_path)
    run(model)
    report, _ = run(model, check_mode=True)
    assert report["changed"] is False
    assert set(actions_by_file(report).values()) == {"trusted"}


def test_not_enough_space_fails_before_writing(tmp_path, monkeypatch):
    model, data = build_checkpoint(tmp_path)
    monkeypatch.setattr(ck, "free_bytes", lambda path: 100)
    before = snapshot(model)
    with pytest.raises(ck.CheckpointError) as excinfo:
        run(model)
    needed = len(data[SHARDS[4]]) + len(data[SHARDS[5]])
    assert f"needs {needed} bytes" in str(excinfo.value)
    assert "100 bytes" in str(excinfo.value)
    assert str(model) in str(excinfo.value)
    assert snapshot(model) == before


def test_stale_temporary_file_counts_as_free_space(tmp_path, monkeypatch):
    model, data = build_checkpoint(tmp_path, parts={5: 2})
    (model / f".{SHARDS[4]}{ck.TEMP_SUFFIX}").write_bytes(b"x" * 5000)
    needed = len(data[SHARDS[4]])
    monkeypatch.setattr(ck, "free_bytes", lambda path: needed - 5000)
    report, errors = run(model)
    assert errors == []
    assert actions_by_file(report)[SHARDS[4]] == "rebuilt"


def test_unreadable_state_file_means_rehash(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    state = model / ".cache/sparkserve/verified.json"
    state.parent.mkdir(parents=True)
    state.write_text("{not json")
    records, warning = ck.load_state(str(state), str(model))
    assert records == {}
    assert "ignoring unreadable state file" in warning
    report, errors = run(model)
    assert errors == []
    assert set(actions_by_file(report).values()) == {"verified"}
    assert json.loads(state.read_text())["version"] == ck.STATE_VERSION


@pytest.mark.parametrize("content", ["[]", '{"version": 99, "files": {}}'])
def test_state_file_of_another_shape_is_ignored_with_a_warning(tmp_path, content):
    model, _data = build_checkpoint(tmp_path, parts={})
    state = tmp_path / "state.json"
    state.write_text(content)
    records, warning = ck.load_state(str(state), str(model))
    assert records == {}
    assert str(state) in warning and "every file will be re-hashed" in warning


def test_state_of_another_directory_is_not_trusted(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    state = tmp_path / "shared-state.json"
    run(model, state_file=str(state))
    document = json.loads(state.read_text())
    document["model_dir"] = "/elsewhere"
    state.write_text(json.dumps(document))
    report, _ = run(model, state_file=str(state))
    assert set(actions_by_file(report).values()) == {"verified"}


# --------------------------------------------------------------------------- progress


def test_progress_is_the_collections_document(tmp_path, monkeypatch):
    """The rebuild writes the one progress document (_progress), the file at hand as its detail."""
    model, _data = build_checkpoint(tmp_path)
    progress = tmp_path / "progress.json"
    seen: list[dict] = []
    hash_file = ck.hash_file

    def watching(path, counters, writer, chunk_size=None):
        writer.update(force=True)
        seen.append(json.loads(progress.read_text()))
        return hash_file(path, counters, writer, chunk_size)

    monkeypatch.setattr(ck, "hash_file", watching)
    run(model, progress_file=str(progress), workers=1)
    assert len(seen) == 4  # shards 1-4 are hashed, 5 and 6 rebuilt from their parts
    assert all(tuple(doc) == FIELDS and doc["what"] == "verification" for doc in seen)
    assert all(doc["phase"] == "verifying" and doc["detail"] in SHARDS for doc in seen)
    assert json.loads(progress.read_text())["phase"] == "done"


def test_progress_file_written_by_a_run(tmp_path, small_chunks):
    model, data = build_checkpoint(tmp_path)
    progress = tmp_path / "progress.json"
    run(model, progress_file=str(progress))
    document = json.loads(progress.read_text())
    assert document["phase"] == "done"
    assert document["done"] == document["total"] == sum(len(b) for b in data.values())


# --------------------------------------------------------------------------- EXL3


def test_exl3_layout_and_count(tmp_path):
    model, _data = build_checkpoint(tmp_path)
    result = ck.check_exl3(str(model), banks=BANKS, plan_name=PLAN)
    assert result["file_count"] == 10
    assert result["bank_files"] == {"qn": 3, "q31": 3, "q31s": 3}
    assert ck.check_exl3(str(model), banks=BANKS, plan_name=PLAN, expect_file_count=10)["file_count"] == 10
    (model / "exl3" / "qn" / ".L03.part.safetensors.XyZ12").write_bytes(b"rsync temp")
    assert ck.check_exl3(str(model), banks=BANKS, plan_name=PLAN)["file_count"] == 10


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda m: shutil.rmtree(m / "exl3/q31"), "q31 is missing"),
        (lambda m: [p.unlink() for p in (m / "exl3/q31s").iterdir()], "holds no L??.part.safetensors"),
        (lambda m: (m / "exl3/plan" / PLAN).unlink(), f"plan/{PLAN} is missing"),
        (lambda m: (m / "exl3/plan" / PLAN).write_text("{"), "is not valid JSON"),
        (lambda m: (m / "exl3/plan" / PLAN).write_text('{"q": 1}'), "has no 'qdir' field"),
    ],
)
def test_exl3_layout_problems(tmp_path, damage, fragment):
    model, _data = build_checkpoint(tmp_path)
    damage(model)
    with pytest.raises(ck.CheckpointError, match=re.escape(fragment)):
        ck.check_exl3(str(model), banks=BANKS, plan_name=PLAN)


def test_exl3_count_mismatch(tmp_path):
    model, _data = build_checkpoint(tmp_path)
    with pytest.raises(ck.CheckpointError, match=r"holds 10 files but the head's copy holds 12"):
        ck.check_exl3(str(model), banks=BANKS, plan_name=PLAN, expect_file_count=12)


def test_exl3_custom_banks_and_plan(tmp_path):
    model, _data = build_checkpoint(tmp_path)
    (model / "exl3/plan" / PLAN).rename(model / "exl3/plan/other.json")
    result = ck.check_exl3(str(model), banks=["qn"], plan_name="other.json")
    assert result["bank_files"] == {"qn": 3}


# --------------------------------------------------------------------------- adoption


def adopt(model: Path, check_mode: bool = False, **kwargs):
    """The module's adoption run without Ansible: ``(report, warnings, errors)``."""
    state_file = kwargs.pop("state_file", ck.default_state_file(str(model)))
    kwargs.setdefault("workers", WORKERS)
    return ad.adopt_checkpoint(str(model), state_file, check_mode=check_mode, **kwargs)


def state_files(model: Path) -> dict[str, dict]:
    return json.loads((model / ".cache/sparkserve/verified.json").read_text())["files"]


def test_adopt_download_sh_directory_then_nothing_to_read(tmp_path, small_chunks, monkeypatch):
    # download.sh leaves six rebuilt, verified shards, no parts and no record of ours.
    model, data = build_checkpoint(tmp_path, parts={})
    progress = tmp_path / "progress.json"
    report, warnings, errors = adopt(model, workers=3, progress_file=str(progress))
    assert (errors, warnings) == ([], [])
    assert report["changed"] is True
    assert report["adopted"] == SHARDS
    assert report["mismatched"] == []
    assert set(actions_by_file(report).values()) == {"adopted"}
    assert report["bytes_read"] == sum(len(b) for b in data.values())
    assert report["bytes_written"] == 0
    assert report["shards"] == {name: hashlib.sha256(blob).hexdigest() for name, blob in data.items()}
    recorded = state_files(model)
    assert {name: entry["sha256"] for name, entry in recorded.items()} == report["shards"]
    assert recorded[SHARDS[4]]["size"] == len(data[SHARDS[4]])
    document = json.loads(progress.read_text())
    assert document["phase"] == "done"
    assert document["done"] == document["total"] == report["bytes_read"]

    before = snapshot(tmp_path)
    monkeypatch.setattr(ck, "_open_read", _no_reads)
    again, warnings, errors = adopt(model, progress_file=str(progress))
    assert (errors, warnings) == ([], [])
    assert again["changed"] is False
    assert again["bytes_read"] == 0
    assert again["adopted"] == []
    assert set(actions_by_file(again).values()) == {"trusted"}
    assert snapshot(tmp_path) == before
    # And the normal run trusts the adopted records: it reads nothing either.
    normal, errors = run(model)
    assert errors == []
    assert normal["changed"] is False
    assert normal["bytes_read"] == 0


def test_adopted_shards_keep_the_download_from_fetching_their_parts(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    assert dl.ignore_patterns(str(model)) == []
    adopt(model)
    assert ck.trusted_files(str(model)) == SHARDS
    patterns = dl.ignore_patterns(str(model))
    for number in (5, 6):
        part = f"{SHARDS[number - 1]}.part00"
        assert any(fnmatch(part, pattern) for pattern in patterns), (part, patterns)
    assert not any(fnmatch("config.json", pattern) for pattern in patterns)


@pytest.mark.parametrize("keep_parts_of_6", [False, True])
def test_adopt_skips_a_shard_that_exists_only_as_parts(tmp_path, keep_parts_of_6):
    # Shard 5 was never rebuilt (download.sh interrupted); shard 6 was, maybe with KEEP_PARTS=1.
    model, data = build_checkpoint(tmp_path, parts={5: 3, 6: 4})
    (model / SHARDS[5]).write_bytes(data[SHARDS[5]])
    if not keep_parts_of_6:
        for part in model.glob(f"{SHARDS[5]}.part*"):
            part.unlink()
    parts_before = {p.name: p.read_bytes() for p in model.glob("*.part*")}
    report, warnings, errors = adopt(model)
    assert (errors, warnings) == ([], [])
    actions = actions_by_file(report)
    assert actions[SHARDS[4]] == "skipped"
    assert {actions[name] for name in SHARDS if name != SHARDS[4]} == {"adopted"}
    entry = next(e for e in report["files"] if e["file"] == SHARDS[4])
    assert entry["parts"] == [f"{SHARDS[4]}.part{i:02d}" for i in range(3)]
    assert entry["bytes_read"] == 0
    assert report["bytes_read"] == sum(len(data[name]) for name in SHARDS if name != SHARDS[4])
    assert report["parts_deleted"] == []
    assert {p.name: p.read_bytes() for p in model.glob("*.part*")} == parts_before
    assert not (model / SHARDS[4]).exists()
    assert set(state_files(model)) == set(SHARDS) - {SHARDS[4]}
    # The normal run then rebuilds shard 5 only and reads nothing else.
    normal, errors = run(model)
    assert errors == []
    assert actions_by_file(normal)[SHARDS[4]] == "rebuilt"
    assert normal["bytes_read"] == len(data[SHARDS[4]])


@pytest.mark.parametrize("corrupt", [1, 5])
def test_adopt_reports_a_mismatch_and_deletes_nothing(tmp_path, corrupt):
    model, data = build_checkpoint(tmp_path, parts={6: 2})
    (model / SHARDS[5]).write_bytes(data[SHARDS[5]])  # rebuilt, parts kept
    name = SHARDS[corrupt]
    (model / name).write_bytes(b"garbage")
    before = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}
    report, warnings, errors = adopt(model)
    assert errors == []
    expected = hashlib.sha256(data[name]).hexdigest()
    actual = hashlib.sha256(b"garbage").hexdigest()
    assert report["mismatched"] == [{"file": name, "expected": expected, "actual": actual}]
    assert actions_by_file(report)[name] == "mismatched"
    assert report["adopted"] == [n for n in SHARDS if n != name]
    assert len(warnings) == 1
    assert f"expected sha256 {expected}, got {actual}" in warnings[0]
    assert "not adopted and nothing was deleted" in warnings[0]
    advice = "rebuilds it from its parts" if corrupt == 5 else "re-download it"
    assert advice in warnings[0]
    assert name not in state_files(model)
    assert report["changed"] is True
    assert {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()} == before
    # Still reported (and read again) on the next adoption; the normal run fails on it.
    again, warnings, _ = adopt(model)
    assert again["changed"] is False
    assert again["bytes_read"] == len(b"garbage")
    assert len(warnings) == 1
    _normal, errors = run(model)
    assert len(errors) == 1 and name in errors[0]


def test_adopt_drops_the_record_of_a_file_that_no_longer_matches(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    adopt(model)
    manifest = model / "sha256-manifest.txt"
    lines = manifest.read_text().splitlines()
    lines[2] = "0" * 64 + lines[2][64:]  # a new revision of shard 3
    manifest.write_text("\n".join(lines) + "\n")
    report, warnings, errors = adopt(model)
    assert errors == []
    assert len(warnings) == 1
    assert report["changed"] is True
    assert report["adopted"] == []
    assert [m["file"] for m in report["mismatched"]] == [SHARDS[2]]
    assert set(state_files(model)) == set(SHARDS) - {SHARDS[2]}
    assert SHARDS[2] not in ck.trusted_files(str(model))


@pytest.mark.parametrize("missing", ["manifest", "model_dir"])
def test_adopt_fresh_directory_adopts_nothing(tmp_path, missing):
    if missing == "manifest":
        model, _data = build_checkpoint(tmp_path, parts={})
        (model / "sha256-manifest.txt").unlink()
    else:
        model = tmp_path / "absent"
    before = snapshot(tmp_path)
    report, warnings, errors = adopt(model)
    assert (errors, warnings) == ([], [])
    assert report["changed"] is False
    assert report["files"] == report["adopted"] == report["mismatched"] == []
    assert "nothing to adopt" in report["msg"]
    assert snapshot(tmp_path) == before


def test_adopt_malformed_manifest_still_fails(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    (model / "sha256-manifest.txt").write_text("not a checksum line\n")
    with pytest.raises(ck.CheckpointError, match="line 1 is malformed"):
        adopt(model)


def test_adopt_ignores_exl3_and_stale_temporary_files(tmp_path):
    model, _data = build_checkpoint(tmp_path, parts={})
    shutil.rmtree(model / "exl3")
    stale = model / f".{SHARDS[4]}{ck.TEMP_SUFFIX}"
    stale.write_bytes(b"half a shard")
    report, _warnings, errors = adopt(model)
    assert errors == []
    assert report["adopted"] == SHARDS
    assert stale.read_bytes() == b"half a shard"
    assert not any(entry["temp_discarded"] for entry in report["files"])


@pytest.mark.parametrize("recorded", [0, 3, 6])
def test_adopt_check_mode_reads_and_writes_nothing(tmp_path, monkeypatch, recorded):
    model, _data = build_checkpoint(tmp_path, parts={6: 2})
    adopt(model)  # shards 1-5 recorded, shard 6 only as parts
    if recorded < 6:
        document = json.loads((model / ".cache/sparkserve/verified.json").read_text())
        document["files"] = dict(sorted(document["files"].items())[:recorded])
        (model / ".cache/sparkserve/verified.json").write_text(json.dumps(document))
    progress = tmp_path / "progress.json"
    before = snapshot(tmp_path)
    monkeypatch.setattr(ck, "_open_read", _no_reads)
    report, _warnings, errors = adopt(model, check_mode=True, progress_file=str(progress))
    assert errors == []
    assert snapshot(tmp_path) == before
    assert report["bytes_read"] == 0
    assert report["adopted"] == []
    actions = actions_by_file(report)
    assert actions[SHARDS[5]] == "skipped"
    expected = {
        name: ("trusted" if index < recorded else "would_adopt") for index, name in enumerate(SHARDS[:5])
    }
    assert {name: actions[name] for name in SHARDS[:5]} == expected
    assert report["changed"] is (recorded < 5)


def test_adopt_unreadable_file_is_an_error_but_the_rest_is_recorded(tmp_path, monkeypatch):
    model, _data = build_checkpoint(tmp_path, parts={})
    real_open = ck._open_read

    def flaky(path):
        if path.endswith(SHARDS[3]):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path)

    monkeypatch.setattr(ck, "_open_read", flaky)
    report, _warnings, errors = adopt(model)
    assert errors == [f"{model / SHARDS[3]}: Permission denied"]
    assert actions_by_file(report)[SHARDS[3]] == "failed"
    assert set(state_files(model)) == set(SHARDS) - {SHARDS[3]}


# --------------------------------------------------------------------------- revisions side by side


def hf_metadata(model: Path, name: str, etag: str, commit: str = "a" * 40) -> None:
    """What huggingface_hub leaves for a file downloaded with local_dir: commit, etag, time."""
    path = model / ".cache" / "huggingface" / "download" / f"{name}.metadata"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{commit}\n{etag}\n{os.stat(model / name).st_mtime + 1}\n")


def verified_revision(tmp_path: Path) -> Path:
    """A verified revision as the role leaves it: shards 5 and 6 rebuilt (parts gone), all recorded,
    each file with huggingface_hub's metadata."""
    model, _data = build_checkpoint(tmp_path)
    _report, errors = run(model)
    assert errors == []
    for name in [*SHARDS[:4], "sha256-manifest.txt", "config.json"]:
        hf_metadata(model, name, f"etag-{name}")
    return model


def test_a_new_revision_links_what_is_unchanged_and_fetches_only_what_changed(tmp_path):
    old = verified_revision(tmp_path)
    new = tmp_path / "new"
    files = {
        name: (os.path.getsize(old / name), f"etag-{name}") for name in [*SHARDS[:4], "sha256-manifest.txt"]
    }
    files["config.json"] = (2, "etag-changed")  # changed upstream: fetched, never linked
    files["README.md"] = (10, "etag-readme")  # new: fetched
    linked = dl.link_unchanged(str(new), [str(tmp_path / "gone"), str(old)], files)
    # Shards 1-4 and the manifest by their etag; shards 5 and 6 (parts only on the hub) because the
    # manifest is the same file and the old revision's verification vouches for them.
    assert sorted(linked) == sorted([*SHARDS, "sha256-manifest.txt"])
    for name in linked:
        assert os.path.samefile(new / name, old / name)
    assert not (new / "config.json").exists() and not (new / "README.md").exists()
    metadata = (new / ".cache/huggingface/download" / f"{SHARDS[0]}.metadata").read_text()
    assert metadata == (old / ".cache/huggingface/download" / f"{SHARDS[0]}.metadata").read_text()
    # The download then skips the parts of the linked shards: the old records vouch for them.
    assert dl.ignore_patterns(str(new), borrow_from=[str(old)]) == [f"{name}.part*" for name in SHARDS]
    assert dl.ignore_patterns(str(new)) == [], "without the other revision, nothing is trusted"
    # A second call changes nothing.
    assert dl.link_unchanged(str(new), [str(old)], files) == []


def test_a_changed_manifest_links_no_rebuilt_shard(tmp_path):
    old = verified_revision(tmp_path)
    new = tmp_path / "new"
    files = {name: (os.path.getsize(old / name), f"etag-{name}") for name in SHARDS[:4]}
    files["sha256-manifest.txt"] = (os.path.getsize(old / "sha256-manifest.txt"), "etag-new-manifest")
    assert sorted(dl.link_unchanged(str(new), [str(old)], files)) == sorted(SHARDS[:4])


def test_records_are_borrowed_only_for_the_very_same_file(tmp_path):
    old = verified_revision(tmp_path)
    new = tmp_path / "new"
    new.mkdir()
    os.link(old / SHARDS[0], new / SHARDS[0])
    shutil.copy2(old / SHARDS[1], new / SHARDS[1])  # same bytes and time, another file: read again
    manifest = ck.read_manifest(str(old))
    records: dict = {}
    assert ck.borrow_records(str(new), manifest, records, [str(old)]) == [SHARDS[0]]
    assert records[SHARDS[0]].sha256 == manifest[SHARDS[0]]
    # A record for another content (a manifest that changed) is not borrowed.
    changed = {**manifest, SHARDS[0]: "0" * 64}
    assert ck.borrow_records(str(new), changed, {}, [str(old)]) == []
