"""The EXL3 plan copy's pure parts: the qdir rewrite and the planned file content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._exl3_plan import (
    QdirError,
    plan_copy,
    rewrite_plan,
    rewrite_qdir,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import FileContentError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "exl3"
REFERENCE = "/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s"


@pytest.mark.parametrize(
    ("qdir", "bank_root", "expected"),
    [
        ("qn:q31:q31s", "/model/exl3", REFERENCE),
        ("qn:q31:q31s", "/model/exl3/", REFERENCE),
        ("exl3/qn:exl3/q31:exl3/q31s", "/model/exl3", REFERENCE),
        ("/home/u/models/DSV41/exl3/qn:./q31/:q31s//", "/model/exl3", REFERENCE),
        (REFERENCE, "/model/exl3", REFERENCE),
        ("qn", "/model/exl3", "/model/exl3/qn"),
        (" qn : q31 ", "/model/exl3", "/model/exl3/qn:/model/exl3/q31"),
        ("qn:q31:q31s", "/weights/banks", "/weights/banks/qn:/weights/banks/q31:/weights/banks/q31s"),
    ],
    ids=[
        "relative",
        "root-slash",
        "exl3-prefixed",
        "absolute-and-dotted",
        "rewritten",
        "single",
        "spaces",
        "other-root",
    ],
)
def test_rewrite_qdir(qdir, bank_root, expected):
    assert rewrite_qdir(qdir, bank_root) == expected
    assert rewrite_qdir(expected, bank_root) == expected  # idempotent


@pytest.mark.parametrize(
    ("qdir", "bank_root", "problem"),
    [
        ("", "/model/exl3", "empty entry"),
        ("qn::q31s", "/model/exl3", "empty entry"),
        ("qn:q31:", "/model/exl3", "empty entry"),
        ("qn:..", "/model/exl3", "names no bank"),
        ("qn:/", "/model/exl3", "names no bank"),
        (["qn", "q31"], "/model/exl3", "got an array"),
        (None, "/model/exl3", "got null"),
        ("qn", "model/exl3", "absolute path"),
    ],
)
def test_rewrite_qdir_errors(qdir, bank_root, problem):
    with pytest.raises(QdirError, match=problem):
        rewrite_qdir(qdir, bank_root)


def test_rewrite_plan_changes_only_qdir_and_keeps_key_order():
    plan = json.loads((FIXTURES / "J268-ho-v31-K5n.json").read_text(encoding="utf-8"))
    rewritten = rewrite_plan(plan)
    assert list(rewritten) == list(plan)
    assert rewritten["qdir"] == REFERENCE
    assert {k: v for k, v in rewritten.items() if k != "qdir"} == {
        k: v for k, v in plan.items() if k != "qdir"
    }
    assert plan["qdir"] == "qn:q31:q31s"  # the input is not modified


def test_plan_copy_new_and_unchanged():
    src = str(FIXTURES / "J268-ho-v31-K5n.json")
    text = Path(src).read_text(encoding="utf-8")
    first, qdir = plan_copy(src, text, "/state/plans/J268-ho-v31-K5n.json", None, "/model/exl3")
    assert first.changed and first.before is None and qdir == REFERENCE
    assert first.after.endswith("\n") and "généré" in first.after
    second, _ = plan_copy(src, text, "/state/plans/J268-ho-v31-K5n.json", first.after, "/model/exl3")
    assert not second.changed


@pytest.mark.parametrize(
    ("fixture", "problem"),
    [
        ("plan_without_qdir.json", "has no 'qdir' field"),
        ("plan_qdir_array.json", "must be a string"),
        ("plan_qdir_empty_entry.json", "empty entry"),
        (
            "plan_malformed.json",
            "not valid JSON: Expecting property name enclosed in double quotes at line 1 column",
        ),
    ],
)
def test_plan_copy_errors_name_the_source(fixture, problem):
    src = str(FIXTURES / fixture)
    with pytest.raises(FileContentError) as caught:
        plan_copy(src, Path(src).read_text(encoding="utf-8"), "/state/plans/x.json", None, "/model/exl3")
    assert str(caught.value).startswith(src)
    assert problem in str(caught.value)
