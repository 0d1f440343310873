"""The exl3_qdir filter: registered under its name, same rewrite as the module, clean errors.

The filter imports ``ansible.errors``, which switches the whole process to controller mode
(module warnings then go to the display instead of the result). So it is exercised in a child
interpreter, and the module tests running in this process keep seeing module behaviour.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

COLLECTIONS = Path(__file__).resolve().parents[4] / "collections"
CASES: list[tuple[object, dict]] = [
    ("qn:q31:q31s", {}),
    ("exl3/qn", {"bank_root": "/weights"}),
    ("/model/exl3/qn", {}),
    ("qn::q31", {}),
    (["qn"], {}),
    (None, {}),
]
CHILD = """
import json, sys
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.filter.exl3_qdir import FilterModule

exl3_qdir = FilterModule().filters()["exl3_qdir"]
results = []
for qdir, kwargs in json.load(sys.stdin):
    try:
        results.append({"value": exl3_qdir(qdir, **kwargs)})
    except AnsibleFilterError as err:
        results.append({"error": str(err)})
json.dump(results, sys.stdout)
"""


@pytest.fixture(scope="module")
def results() -> list[dict]:
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(CASES),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(COLLECTIONS), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(child.stdout)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (0, "/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s"),
        (1, "/weights/qn"),
        (2, "/model/exl3/qn"),
    ],
)
def test_filter(results, case, expected):
    assert results[case] == {"value": expected}


@pytest.mark.parametrize(("case", "problem"), [(3, "empty entry"), (4, "got an array"), (5, "got null")])
def test_filter_errors(results, case, problem):
    error = results[case]["error"]
    assert error.startswith("exl3_qdir: ")
    assert problem in error
