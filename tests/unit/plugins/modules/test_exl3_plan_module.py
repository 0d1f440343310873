"""sparkserve.dsv41.exl3_plan run in-process: the per-node plan copy."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.modules import exl3_plan
from dir_snapshot import snapshot

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "exl3"
PLAN = "J268-ho-v31-K5n.json"
REFERENCE = "/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """``(src, dest)``: the plan inside a model dir, and the copy's place in the state dir."""
    plan_dir = tmp_path / "models" / "DeepSeek-V4.1-Flash-Spark" / "exl3" / "plan"
    plan_dir.mkdir(parents=True)
    shutil.copyfile(FIXTURES / PLAN, plan_dir / PLAN)
    plans = tmp_path / "state" / "plans"
    plans.mkdir(parents=True)
    return plan_dir / PLAN, plans / PLAN


def args(src: Path, dest: Path, **extra) -> dict:
    return {"src": str(src), "dest": str(dest), **extra}


def test_copy_rewrites_qdir_only(run_module, layout):
    src, dest = layout
    result = run_module(exl3_plan, args(src, dest))
    assert result["changed"] is True
    assert result["qdir"] == REFERENCE
    assert (result["dest"], result["mode"]) == (str(dest), "0644")
    original = json.loads(src.read_text(encoding="utf-8"))
    copy = json.loads(dest.read_text(encoding="utf-8"))
    assert list(copy) == list(original)
    assert copy["qdir"] == REFERENCE
    assert {k: v for k, v in copy.items() if k != "qdir"} == {
        k: v for k, v in original.items() if k != "qdir"
    }
    assert dest.stat().st_mode & 0o777 == 0o644
    assert json.loads(src.read_text(encoding="utf-8")) == original  # the source is left alone


def test_second_run_writes_nothing(run_module, layout):
    src, dest = layout
    run_module(exl3_plan, args(src, dest))
    before = snapshot(dest.parent)
    second = run_module(exl3_plan, args(src, dest), diff=True)
    assert second["changed"] is False and "diff" not in second
    assert second["qdir"] == REFERENCE
    assert snapshot(dest.parent) == before


def test_source_change_is_followed(run_module, layout):
    src, dest = layout
    run_module(exl3_plan, args(src, dest))
    plan = json.loads(src.read_text(encoding="utf-8"))
    plan["qdir"] = "qn:q31"
    src.write_text(json.dumps(plan))
    result = run_module(exl3_plan, args(src, dest), diff=True)
    assert result["changed"] is True
    assert json.loads(dest.read_text())["qdir"] == "/model/exl3/qn:/model/exl3/q31"
    (content_diff,) = result["diff"]
    assert REFERENCE in content_diff["before"] and '/model/exl3/qn:/model/exl3/q31"' in content_diff["after"]


def test_wrong_mode_is_fixed_without_rewriting(run_module, layout):
    src, dest = layout
    run_module(exl3_plan, args(src, dest))
    dest.chmod(0o600)
    mtime = dest.stat().st_mtime_ns
    result = run_module(exl3_plan, args(src, dest), diff=True)
    assert result["changed"] is True
    assert dest.stat().st_mode & 0o777 == 0o644
    assert dest.stat().st_mtime_ns == mtime
    assert result["diff"] == [
        {
            "before_header": str(dest),
            "after_header": str(dest),
            "before": {"mode": "0600"},
            "after": {"mode": "0644"},
        }
    ]


@pytest.mark.parametrize(("mode", "expected"), [("0640", 0o640), ("600", 0o600), (0o444, 0o444)])
def test_mode_option(run_module, layout, mode, expected):
    src, dest = layout
    result = run_module(exl3_plan, args(src, dest, mode=mode))
    assert dest.stat().st_mode & 0o777 == expected
    assert result["mode"] == f"{expected:04o}"


def test_custom_bank_root(run_module, layout):
    src, dest = layout
    result = run_module(exl3_plan, args(src, dest, bank_root="/weights/exl3/"))
    assert result["qdir"] == "/weights/exl3/qn:/weights/exl3/q31:/weights/exl3/q31s"


def test_corrupt_copy_is_regenerated(run_module, layout):
    src, dest = layout
    dest.write_bytes(b"\xff\xfe not json")
    result = run_module(exl3_plan, args(src, dest))
    assert result["changed"] is True
    assert json.loads(dest.read_text())["qdir"] == REFERENCE


@pytest.mark.parametrize("prepared", ["nothing", "stale", "wrong-mode"])
def test_check_mode_changes_nothing(run_module, layout, prepared):
    src, dest = layout
    if prepared != "nothing":
        run_module(exl3_plan, args(src, dest))
    if prepared == "stale":
        dest.write_text('{"qdir": "qn"}\n')
    if prepared == "wrong-mode":
        dest.chmod(0o666)
    before = snapshot(dest.parent)
    result = run_module(exl3_plan, args(src, dest), check_mode=True, diff=True)
    assert result["changed"] is True
    assert result["diff"]
    assert snapshot(dest.parent) == before


@pytest.mark.parametrize(
    ("fixture", "problem"),
    [
        ("plan_without_qdir.json", "has no 'qdir' field"),
        ("plan_qdir_array.json", "must be a string"),
        ("plan_qdir_empty_entry.json", "empty entry"),
        ("plan_malformed.json", "not valid JSON"),
    ],
)
def test_bad_plans_fail_naming_the_source(run_module, layout, fixture, problem):
    src, dest = layout
    shutil.copyfile(FIXTURES / fixture, src)
    result = run_module(exl3_plan, args(src, dest))
    assert result.failed
    assert str(src) in result["msg"] and problem in result["msg"]
    assert not dest.exists()


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"src": "/nonexistent/exl3/plan/J268-ho-v31-K5n.json"}, "does not exist"),
        ({"dest": "/nonexistent/plans/J268-ho-v31-K5n.json"}, "directory of dest does not exist"),
        ({"bank_root": "model/exl3"}, "absolute path"),
        ({"mode": "rw-r--r--"}, "octal"),
        ({"mode": "0999"}, "octal"),
    ],
)
def test_option_errors(run_module, layout, overrides, problem):
    src, dest = layout
    result = run_module(exl3_plan, {**args(src, dest), **overrides})
    assert result.failed and problem in result["msg"]
    assert not dest.exists()


def test_check_mode_before_the_checkpoint_is_fetched_says_so_and_changes_nothing(run_module, layout):
    """A check-mode run that would fetch a new checkpoint revision first: its plan is not there yet."""
    src, dest = layout
    missing = src.parent / "not-fetched" / src.name
    result = run_module(exl3_plan, args(missing, dest), check_mode=True)
    assert not result.failed, result
    assert result["changed"] is True and result["msg"] == f"would copy {missing} once it is fetched"
    assert not dest.exists()


def test_dest_directory_is_rejected(run_module, layout):
    src, dest = layout
    result = run_module(exl3_plan, args(src, dest.parent))
    assert result.failed and "is a directory" in result["msg"]


def test_symbolic_mode_then_no_change(run_module, layout):
    src, dest = layout
    first = run_module(exl3_plan, args(src, dest, mode="u=rw,g=r,o="))
    assert first["changed"] is True and first["mode"] == "0640"
    assert dest.stat().st_mode & 0o777 == 0o640
    before = snapshot(dest.parent)
    second = run_module(exl3_plan, args(src, dest, mode="u=rw,g=r,o="))
    assert second["changed"] is False and second["mode"] == "0640"
    assert snapshot(dest.parent) == before


def test_content_and_mode_both_wrong_show_in_the_diff(run_module, layout):
    src, dest = layout
    dest.write_text('{"qdir": "qn"}\n')
    dest.chmod(0o600)
    result = run_module(exl3_plan, args(src, dest), diff=True)
    assert result["changed"] is True and dest.stat().st_mode & 0o777 == 0o644
    content_diff, mode_diff = result["diff"]
    assert REFERENCE in content_diff["after"]
    assert (mode_diff["before"], mode_diff["after"]) == ({"mode": "0600"}, {"mode": "0644"})


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_owner_and_group_file_options(run_module, layout):
    src, dest = layout
    options = args(src, dest, owner="nobody", group="nogroup")
    first = run_module(exl3_plan, options)
    assert first["changed"] is True
    assert (dest.stat().st_uid, dest.stat().st_gid) == (65534, 65534)
    before = snapshot(dest.parent)
    assert run_module(exl3_plan, options)["changed"] is False
    assert snapshot(dest.parent) == before

    os.chown(dest, 0, 0)
    before = snapshot(dest.parent)
    checked = run_module(exl3_plan, options, check_mode=True, diff=True)
    assert checked["changed"] is True
    assert checked["diff"][0]["before"] == {"owner": 0, "group": 0}
    assert snapshot(dest.parent) == before and dest.stat().st_uid == 0
    assert run_module(exl3_plan, options)["changed"] is True
    assert dest.stat().st_uid == 65534


def test_unknown_owner_fails_naming_it(run_module, layout):
    src, dest = layout
    run_module(exl3_plan, args(src, dest))
    before = snapshot(dest.parent)
    result = run_module(exl3_plan, args(src, dest, owner="no-such-user-dsv41"))
    assert result.failed and "no-such-user-dsv41" in result["msg"]
    assert snapshot(dest.parent) == before


def test_check_mode_before_the_directory_is_created_says_so_and_creates_nothing(run_module, layout):
    """A check-mode run on a fresh node: the role's task before would create the plans' directory."""
    src, dest = layout
    missing = dest.parent / "plans" / dest.name
    result = run_module(exl3_plan, args(src, missing), check_mode=True)
    assert not result.failed, result
    assert result["changed"] is True
    assert result["msg"] == f"would copy {src} to {missing} once {missing.parent} exists"
    assert not missing.parent.exists()
