"""Tests of the job_wait module, run in-process through ``run_module``."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import new_document
from ansible_collections.sparkserve.dsv41.plugins.modules import job_wait
from dir_snapshot import snapshot


def test_a_running_job_with_progress(tmp_path, run_module):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": True, "finished": False, "ansible_job_id": "1.2"}))
    launched = time.time() - 66
    os.utime(job, (launched, launched))  # the async wrapper wrote it at launch
    progress = tmp_path / "progress.json"
    doc = new_document("verification", total=4 * 1024**3, now=launched + 1)
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
    module_options = {"results_file", "progress_file", "what", "seconds", "keep_fresh"}
    action_options = {"job", "timeout_minutes", "timeout_variable", "note"}
    assert set(options) == module_options | action_options


def test_an_earlier_runs_progress_is_not_this_jobs(tmp_path, run_module):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": True, "finished": False}))
    progress = tmp_path / "progress.json"
    doc = new_document("verification", total=10, now=time.time() - 3600)
    progress.write_text(json.dumps({**doc, "phase": "done", "done": 10}))
    result = run_module(job_wait, {"results_file": str(job), "progress_file": str(progress), "seconds": 0})
    assert result["line"] == "job: starting", "the last run's 100 % is not shown as this job's"


@pytest.mark.parametrize(("check_mode", "removed"), [(False, True), (True, False)])
def test_a_finished_jobs_result_is_handed_over_and_its_file_removed(
    tmp_path, run_module, check_mode, removed
):
    job = tmp_path / "job"
    job.write_text(
        json.dumps(
            {"changed": True, "msg": "6 files downloaded", "ansible_job_id": "7.1", "results_file": str(job)}
        )
    )
    result = run_module(job_wait, {"results_file": str(job), "seconds": 0}, check_mode=check_mode)
    assert not result.failed, result
    assert result["result"] == {"changed": True, "msg": "6 files downloaded"}
    assert result["changed"] is False, "waiting itself changes nothing on the node's configuration"
    assert job.exists() is not removed


@pytest.mark.parametrize("check_mode", [False, True])
def test_each_poll_keeps_the_lock_fresh_and_never_creates_it(tmp_path, run_module, check_mode):
    """The head's supervisor counts a lock older than supervisor_pause_max_minutes as a run that is
    gone: a run that waits hours for a download keeps it fresh at each poll."""
    lock = tmp_path / "deployment.lock"
    lock.write_text("{}")
    os.utime(lock, (1_000_000_000, 1_000_000_000))
    args = {"results_file": str(tmp_path / "job"), "seconds": 0, "keep_fresh": str(lock)}
    run_module(job_wait, args, check_mode=check_mode)
    fresh = time.time() - lock.stat().st_mtime < 60
    assert fresh is not check_mode, "check mode changes nothing"
    lock.unlink()
    result = run_module(job_wait, args)
    assert not result.failed and not lock.exists(), "a lock given back is not made again"


def test_a_link_at_the_lock_is_touched_itself_never_its_target(tmp_path, run_module):
    target = tmp_path / "elsewhere"
    target.write_text("x")
    os.utime(target, (1_000_000_000, 1_000_000_000))
    (tmp_path / "deployment.lock").symlink_to(target)
    run_module(
        job_wait,
        {
            "results_file": str(tmp_path / "job"),
            "seconds": 0,
            "keep_fresh": str(tmp_path / "deployment.lock"),
        },
    )
    assert target.stat().st_mtime == 1_000_000_000
