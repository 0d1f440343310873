"""Tests of _progress: the one progress document, its one line, and waiting for an async job."""

from __future__ import annotations

import json
import os
import threading

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _progress as pr


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# --------------------------------------------------------------------------- the document


def test_a_new_document_has_every_field():
    doc = pr.new_document("download", total=100, now=5.0)
    assert tuple(doc) == pr.FIELDS
    assert doc == {
        "what": "download",
        "phase": "starting",
        "unit": "bytes",
        "done": 0,
        "total": 100,
        "started": 5.0,
        "updated": 5.0,
        "detail": None,
    }


def test_the_writer_throttles_and_writes_atomically(tmp_path):
    clock = FakeClock()
    path = tmp_path / "sub" / "progress.json"
    writer = pr.ProgressWriter(str(path), "download", total=100, clock=clock)
    assert writer.update(phase="downloading", done=10) is True  # the first update is always written
    clock.now += 1
    assert writer.update(done=20) is False  # within the interval
    assert json.loads(path.read_text())["done"] == 10
    clock.now += 1.5
    assert writer.update(advance=10, detail="config.json") is True
    assert json.loads(path.read_text()) == {
        "what": "download",
        "phase": "downloading",
        "unit": "bytes",
        "done": 30,
        "total": 100,
        "started": 1000.0,
        "updated": 1002.5,
        "detail": "config.json",
    }
    clock.now += 0.1
    assert writer.update(force=True, phase="verifying") is True
    assert writer.finish() is True
    assert json.loads(path.read_text())["phase"] == "done"
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]  # no temporaries left


def test_finish_marks_a_failure():
    writer = pr.ProgressWriter(None, "copy")
    writer.finish(failed=True, detail="rsync exited with 23")
    assert (writer.document["phase"], writer.document["detail"]) == ("failed", "rsync exited with 23")


def test_without_a_path_the_document_is_only_kept():
    writer = pr.ProgressWriter(None, "copy")
    assert writer.update(force=True, done=5) is False
    assert writer.document["done"] == 5


def test_only_the_documented_fields_can_be_set():
    writer = pr.ProgressWriter(None, "copy")
    with pytest.raises(TypeError, match="not a progress field: file"):
        writer.update(file="x")


def test_a_write_that_fails_never_fails_the_job(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    writer = pr.ProgressWriter(str(blocker / "progress.json"), "download")
    assert writer.update(force=True, done=1) is False
    assert writer.document["done"] == 1


def test_threads_advance_it_together(tmp_path):
    writer = pr.ProgressWriter(str(tmp_path / "p.json"), "verification", total=8 * 1000)

    def work() -> None:
        for _ in range(1000):
            writer.update(advance=1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.finish()
    assert json.loads((tmp_path / "p.json").read_text())["done"] == 8000


def test_read_progress_tolerates_what_is_not_a_document(tmp_path):
    assert pr.read_progress(None) is None
    assert pr.read_progress(str(tmp_path / "absent")) is None
    (tmp_path / "half").write_text('{"what": ')
    assert pr.read_progress(str(tmp_path / "half")) is None
    (tmp_path / "list").write_text("[]")
    assert pr.read_progress(str(tmp_path / "list")) is None
    (tmp_path / "doc").write_text('{"what": "copy"}')
    assert pr.read_progress(str(tmp_path / "doc")) == {"what": "copy"}


# --------------------------------------------------------------------------- one line


def test_the_line_of_a_verification():
    doc = pr.new_document("rebuild and verification", total=200 * 1024**3, now=1000.0)
    doc.update(
        phase="rebuilding", done=50 * 1024**3, updated=1100.0, detail="model-00005-of-00006.safetensors"
    )
    assert pr.progress_line(doc, False, now=1130.0) == (
        "rebuild and verification: rebuilding, 50.0 GiB of 200.0 GiB, 25.0%, 512.0 MiB/s, "
        "model-00005-of-00006.safetensors, after 2m10s"
    )


def test_the_line_of_a_copy_of_unknown_size():
    doc = pr.new_document("copy to worker", now=0.0)
    doc.update(
        phase="copying",
        done=1024**3,
        updated=3600.0,
        detail="exl3/qn/L00.part.safetensors, 3 of 12 files checked",
    )
    assert pr.progress_line(doc, False, now=3700.0) == (
        "copy to worker: copying, 1.0 GiB, 291.3 KiB/s, exl3/qn/L00.part.safetensors, 3 of 12 files checked, "
        "after 1h01m"
    )


def test_the_line_of_a_benchmark_counts_measurements_without_a_rate():
    doc = pr.new_document("benchmark", unit="measurements", total=14, now=0.0)
    doc.update(phase="measuring", done=3, updated=50.0, detail="12:00:01 prefill_8k 3/3: 2050.0 tok/s")
    assert pr.progress_line(doc, False, now=62.0) == (
        "benchmark: measuring, 3 of 14 measurements, 21.4%, "
        "12:00:01 prefill_8k 3/3: 2050.0 tok/s, after 1m02s"
    )


def test_finished_wins_over_the_documents_phase():
    doc = pr.new_document("download", total=10, now=0.0)
    doc.update(phase="downloading", done=10, updated=10.0)
    assert (
        pr.progress_line(doc, True, now=20.0) == "download: finished, 10 B of 10 B, 100.0%, 1 B/s, after 20s"
    )


def test_the_line_without_a_document():
    assert pr.progress_line(None, False, now=0) == "job: starting"
    assert pr.progress_line({"what": "download"}, True, now=0) == "download: finished"


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "0 B"), (1536, "1.5 KiB"), (462 * 1024**3, "462.0 GiB"), (3 * 1024**4, "3.0 TiB"), (None, "?")],
)
def test_human_bytes(count, text):
    assert pr.human_bytes(count) == text


@pytest.mark.parametrize(("seconds", "text"), [(59, "59s"), (61, "1m01s"), (7322, "2h02m"), (-3, "0s")])
def test_human_seconds(seconds, text):
    assert pr.human_seconds(seconds) == text


# --------------------------------------------------------------------------- async jobs


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, (False, False, "")),
        ({"started": True, "finished": False, "ansible_job_id": "j"}, (False, False, "")),
        (
            {"started": 1, "finished": 0, "ansible_job_id": "j"},
            (False, False, ""),
        ),  # before ansible-core 2.19
        ({"changed": False, "rc": 0, "stdout": "{}"}, (True, False, "")),
        ({"changed": True, "files": []}, (True, False, "")),
        (
            {"rc": 1, "failed": True, "msg": "non-zero return code", "stderr": "12:00 x\nboom\n"},
            (True, True, "boom"),
        ),
        ({"rc": 3, "stderr": ""}, (True, True, "exit code 3")),
        (
            {"failed": True, "msg": "model_dir is not a directory"},
            (True, True, "model_dir is not a directory"),
        ),
        ({"failed": True, "msg": "Timeout exceeded", "child_pid": 7}, (True, True, "Timeout exceeded")),
        (
            {
                "failed": True,
                "msg": "MODULE FAILURE\nSee stdout/stderr",
                "module_stderr": "Traceback\nKeyError: 'x'",
            },
            (True, True, "KeyError: 'x'"),
        ),
    ],
)
def test_job_outcome(data, expected):
    outcome = pr.job_outcome(data)
    assert (outcome["finished"], outcome["job_failed"], outcome["error"]) == expected


def test_waiting_returns_as_soon_as_the_job_finishes(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": True, "finished": False}))
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1003:
            job.write_text(json.dumps({"rc": 0, "stdout": "{}"}))

    result = pr.wait_for_job(str(job), None, 20, "download", clock=clock, sleep=sleep)
    assert 1003 <= clock.now < 1003 + pr.JOB_CHECK_INTERVAL
    assert result == {
        "finished": True,
        "job_failed": False,
        "error": "",
        "line": "download: finished",
        "result": {"rc": 0, "stdout": "{}"},
        "results_file_found": True,
    }


def test_waiting_gives_up_after_its_seconds_and_shows_the_progress(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": True, "finished": False}))
    progress = tmp_path / "progress.json"
    doc = pr.new_document("download", total=4096, now=1000.0)
    progress.write_text(json.dumps({**doc, "phase": "downloading", "done": 1024, "updated": 1004.0}))
    os.utime(job, (1000.0, 1000.0))  # launched when the job's document started
    clock = FakeClock()
    result = pr.wait_for_job(str(job), str(progress), 5, clock=clock, sleep=clock.sleep)
    assert result["finished"] is False
    assert clock.now == pytest.approx(1005)
    assert result["line"] == "download: downloading, 1.0 KiB of 4.0 KiB, 25.0%, 256 B/s, after 5s"


def test_the_label_given_wins_over_the_documents(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps({"changed": False}))
    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"what": "verification", "phase": "done"}))
    line = pr.wait_for_job(str(job), str(progress), 0, "verification of the shards already in place")["line"]
    assert line == "verification of the shards already in place: finished"
    assert pr.wait_for_job(str(job), str(progress), 0)["line"] == "verification: finished"


def test_waiting_marks_a_failed_job(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps({"failed": True, "msg": "Timeout exceeded"}))
    assert pr.wait_for_job(str(job), None, 5, "copy") == {
        "finished": True,
        "job_failed": True,
        "error": "Timeout exceeded",
        "line": "copy: finished (failed)",
        "result": {"failed": True, "msg": "Timeout exceeded"},
        "results_file_found": True,
    }


def test_a_results_file_not_there_is_waited_for_and_said(tmp_path):
    clock = FakeClock()
    result = pr.wait_for_job(str(tmp_path / "gone"), None, 5, "copy", clock=clock, sleep=clock.sleep)
    assert (result["finished"], result["results_file_found"]) == (False, False)
    assert clock.now == pytest.approx(1005), "waited its seconds: the job may be starting"


def test_a_results_file_that_cannot_be_read_is_an_error_not_a_wait(tmp_path):
    job = tmp_path / "job"
    job.mkdir()  # reading it fails as another user's file would (EISDIR; EACCES needs a non-root user)
    with pytest.raises(OSError):
        pr.wait_for_job(str(job), None, 5, "copy")
