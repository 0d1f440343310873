"""The documents' suite tables are written from what the suites recorded, between their markers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("suite_tables", ROOT / "benchmarks" / "suite_tables.py")
suite_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite_tables)

FAULTS = {
    "hang on the head": {"seconds": 24.5, "bound": 33, "detail": "healed in 25 s", "at": 2},
    "worker rank killed": {"seconds": 2.9, "bound": 120, "detail": "docker kill", "at": 1},
    "download killed mid-file": {"seconds": 28.7, "bound": 0, "detail": "the re-run's time", "at": 3},
}
REAL = {
    "prefill": {"measured": 17.04, "unit": "s", "bound": 12, "detail": "answered", "at": 1},
    "bench": {"measured": 1611.4, "unit": "tok/s", "bound": None, "detail": "tiny model", "at": 2},
}
README = """intro
<!-- suite-table: fault-suite -->
| old |
<!-- /suite-table -->
between
<!-- suite-table: real-engine-suite -->
| old real |
<!-- /suite-table -->
<!-- suite-table: upgrade-suite -->
| kept |
<!-- /suite-table -->
end
"""


def test_each_measured_suite_is_written_in_run_order_and_the_rest_kept():
    out = suite_tables.rewrite(README, {"fault-suite": FAULTS, "real-engine-suite": REAL})
    fault = out.split("<!-- suite-table: fault-suite -->\n", 1)[1].split("<!-- /suite-table -->", 1)[0]
    assert fault.splitlines() == [
        "| case | measured | bound | what |",
        "|---|---:|---:|---|",
        "| worker rank killed | 2.9 s | 120.0 s | docker kill |",
        "| hang on the head | 24.5 s | 33.0 s | healed in 25 s |",
        "| download killed mid-file | 28.7 s | - | the re-run's time |",
    ]
    assert "| prefill | 17.0 s | 12.0 s | answered |" in out
    assert "| bench | 1,611 tok/s | - | tiny model |" in out
    assert "| kept |" in out and "| old |" not in out and out.startswith("intro\n") and out.endswith("end\n")


@pytest.mark.parametrize("written", [True, False])
def test_check_says_whether_the_readme_is_the_last_runs(tmp_path, written):
    (tmp_path / "fault-suite.json").write_text(json.dumps(FAULTS))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    if written:
        assert suite_tables.main(["--results", str(tmp_path), "--document", str(readme)]) == 0
    assert suite_tables.main(["--results", str(tmp_path), "--document", str(readme), "--check"]) == (
        0 if written else 1
    )
