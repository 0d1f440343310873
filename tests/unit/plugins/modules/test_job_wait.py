"""Tests of the job_wait module, run in-process through ``run_module``."""

from __future__ import annotations

import json
import threading
import time

import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import new_document
from ansible_collections.sparkserve.dsv41.plugins.modules import job_wait
from dir_snapshot import snapshot


def test_a_running_job_with_progress(tmp_path, run_module):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "1.2"}))
    progress = tmp_path / "progress.json"
    doc = new_document("verification", total=4 * 1024**3, now=time.time() - 65)
    progress.write_text(
        json.dumps(
            {**doc, "phase": "verifying", "done": 1024**3, "detail": "model-00001-of-00006.safetensors"}
        )
    )
    before = snapshot(tmp_path)
    started = time.monotonic()
    result = run_module(
        job_wait,
        {
            "results_file": str(job),
            "progress_file": str(progress),
            "what": "rebuild and verification",
            "seconds": 0.3,
        },
    )
    assert not result.failed, result
    assert time.monotonic() - started >= 0.3
    assert (result["changed"], result["finished"], result["job_failed"], result["error"]) == (
        False,
        False,
        False,
        "",
    )
    assert result["line"].startswith("rebuild and verification: verifying, 1.0 GiB of 4.0 GiB, 25.0%, ")
    assert result["line"].endswith(", model-00001-of-00006.safetensors, after 1m05s")
    assert snapshot(tmp_path) == before, "waiting changes nothing"


def test_it_returns_when_the_job_ends(tmp_path, run_module):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": True, "finished": False}))
    timer = threading.Timer(0.5, lambda: job.write_text(json.dumps({"changed": True, "msg": "ok"})))
    timer.start()
    started = time.monotonic()
    result = run_module(job_wait, {"results_file": str(job), "what": "download", "seconds": 30})
    timer.join()
    assert time.monotonic() - started < 5
    assert (result["finished"], result["job_failed"], result["line"]) == (True, False, "download: finished")


def test_a_failed_job_does_not_fail_the_module(tmp_path, run_module):
    job = tmp_path / "job"
    job.write_text(
        json.dumps(
            {"rc": 1, "failed": True, "msg": "non-zero return code", "stderr": "x\nbenchmark failed: boom"}
        )
    )
    result = run_module(
        job_wait, {"results_file": str(job), "what": "benchmark", "seconds": 0}, check_mode=True
    )
    assert not result.failed, result
    assert (result["finished"], result["job_failed"], result["error"]) == (
        True,
        True,
        "benchmark failed: boom",
    )
    assert result["line"] == "benchmark: finished (failed)"


def test_no_results_file_yet_is_a_job_still_starting(tmp_path, run_module):
    result = run_module(job_wait, {"results_file": str(tmp_path / "absent"), "seconds": 0})
    assert (result["finished"], result["line"]) == (False, "job: starting")


def test_negative_seconds_are_refused(tmp_path, run_module):
    result = run_module(job_wait, {"results_file": str(tmp_path / "job"), "seconds": -1})
    assert result.failed
    assert "seconds must be 0 or more" in result["msg"]


def test_the_documentation_matches_the_result(tmp_path, run_module):
    result = run_module(job_wait, {"results_file": str(tmp_path / "job"), "seconds": 0})
    documented = yaml.safe_load(job_wait.RETURN)
    assert set(documented) == set(result) - {"changed", "invocation"}
    options = yaml.safe_load(job_wait.DOCUMENTATION)["options"]
    assert set(options) == {"results_file", "progress_file", "what", "seconds"}
