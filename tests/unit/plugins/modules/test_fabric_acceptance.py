"""The fabric_acceptance module, run in-process on the fabric test's output captured on the
real-engine lab: a pass recorded as the last good result, a failure recorded and failing the task,
the query that spares a re-test, check mode."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import yaml
from ansible_collections.sparkserve.dsv41.plugins.modules import fabric_acceptance

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "fabric_check"
PASSING = (FIXTURES / "gloo-rank0.stdout").read_text()
LINK = "head (enp1s0f1np1 198.18.0.13) <-> worker (enp1s0f1np1 198.18.0.11)"


def _run(stdout: str, rc: int = 0) -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": ""}


def _args(path, **extra):
    return {"path": str(path), "fingerprint": "f1", "link": LINK, "min_busbw_gbps": 0.05, **extra}


def test_a_pass_is_recorded_as_the_last_good_result_and_then_accepted(tmp_path, run_module):
    path = tmp_path / "fabric-acceptance.json"
    assert run_module(fabric_acceptance, _args(path, state="query"))["accepted"] is False
    nodes = {"head": _run(PASSING), "worker": _run("")}
    result = run_module(fabric_acceptance, _args(path, nodes=nodes))
    assert (result["verdict"], result["changed"], result["accepted"]) == ("pass", True, True)
    assert set(yaml.safe_load(fabric_acceptance.RETURN)) >= set(result) - {
        "changed",
        "invocation",
        "warnings",
    }
    record = json.loads(path.read_text())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert record["last_good"] == record["last"] and record["last"]["fingerprint"] == "f1"
    assert run_module(fabric_acceptance, _args(path, state="query"))["accepted"] is True
    # Other settings (a new image, another interface) are not accepted by this result.
    assert run_module(fabric_acceptance, _args(path, state="query", fingerprint="f2"))["accepted"] is False


def test_a_failure_is_recorded_keeps_the_last_good_result_and_fails_the_task(tmp_path, run_module):
    path = tmp_path / "fabric-acceptance.json"
    run_module(fabric_acceptance, _args(path, nodes={"head": _run(PASSING), "worker": _run("")}))
    slow = run_module(fabric_acceptance, _args(path, nodes={"head": _run(PASSING), "worker": _run("")},
                                               min_busbw_gbps=18, fingerprint="f2"))  # fmt: skip
    assert slow["failed"] is True and "is too slow: all_gather of 64 MiB at 0.361 GB/s" in slow["msg"]
    record = json.loads(path.read_text())
    assert record["last"]["verdict"] == "fail" and record["last_good"]["fingerprint"] == "f1"
    assert run_module(fabric_acceptance, _args(path, state="query", fingerprint="f2"))["accepted"] is False


def test_check_mode_judges_and_writes_nothing(tmp_path, run_module):
    path = tmp_path / "fabric-acceptance.json"
    result = run_module(fabric_acceptance, _args(path, nodes={"head": _run(PASSING), "worker": _run("")}),
                        check_mode=True)  # fmt: skip
    assert result["verdict"] == "pass" and not path.exists()
