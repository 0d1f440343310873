"""Unit tests for roles/checkpoint/files/dsv41_download.py, the checkpoint role's helper.

The program is a standalone script the role installs on the nodes, so it is imported from its
path. The pure parts (which parts to skip, listings and ``changed``, progress documents and
lines, async job outcomes, rsync output) are tested directly; ``download`` runs end to end
against the lab's hub stand-in on a loopback port (a few MB, a few seconds), ``rsync`` against a
fake rsync that prints real rsync output. Nothing here needs the network, root or Docker.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _checkpoint as ck

REPO_ROOT = Path(__file__).resolve().parents[3]
PROGRAM = REPO_ROOT / "roles" / "checkpoint" / "files" / "dsv41_download.py"
HUB_DIR = REPO_ROOT / "lab" / "standins" / "hub"
REPO_ID = "0xSero/DeepSeek-V4.1-Flash-Spark"
SHARD5 = "model-00005-of-00006.safetensors"
SHARD6 = "model-00006-of-00006.safetensors"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


dl = _load("dsv41_download", PROGRAM)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def write_state(model_dir: Path, names: list[str]) -> None:
    """Record ``names`` as verified, exactly as the checkpoint_shards module writes its state."""
    records = {}
    for name in names:
        info = os.stat(model_dir / name)
        records[name] = ck.Record(info.st_size, info.st_mtime_ns, "0" * 64)
    state = Path(ck.default_state_file(str(model_dir)))
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_bytes(ck.render_state(records, str(model_dir)))


# --------------------------------------------------------------------------- which parts to skip


def test_no_state_file_skips_nothing(tmp_path):
    assert dl.ignore_patterns(str(tmp_path)) == []


def test_verified_unchanged_shards_skip_their_parts(tmp_path):
    for name in (SHARD5, SHARD6, "model-00001-of-00006.safetensors", "config.json"):
        (tmp_path / name).write_bytes(b"x" * 10)
    write_state(tmp_path, [SHARD5, SHARD6, "model-00001-of-00006.safetensors", "config.json"])
    patterns = dl.ignore_patterns(str(tmp_path))
    assert f"{SHARD5}.part*" in patterns
    assert f"{SHARD6}.part*" in patterns
    assert not any(p.startswith("config.json") for p in patterns)


def test_patterns_select_exactly_the_parts_for_huggingface_hub(tmp_path):
    from huggingface_hub.utils import filter_repo_objects

    (tmp_path / SHARD5).write_bytes(b"x")
    write_state(tmp_path, [SHARD5])
    repo = [f"{SHARD5}.part00", f"{SHARD5}.part01", f"{SHARD6}.part00", "sha256-manifest.txt"]
    kept = list(filter_repo_objects(repo, ignore_patterns=dl.ignore_patterns(str(tmp_path))))
    assert kept == [f"{SHARD6}.part00", "sha256-manifest.txt"]


def test_only_one_rebuilt_shard_keeps_the_other_shards_parts(tmp_path):
    (tmp_path / SHARD5).write_bytes(b"x")
    write_state(tmp_path, [SHARD5])
    assert dl.ignore_patterns(str(tmp_path)) == [f"{SHARD5}.part*"]


@pytest.mark.parametrize("change", ["size", "mtime", "deleted"])
def test_a_shard_changed_since_verification_gets_its_parts_again(tmp_path, change):
    shard = tmp_path / SHARD5
    shard.write_bytes(b"x" * 10)
    write_state(tmp_path, [SHARD5])
    if change == "size":
        shard.write_bytes(b"x" * 11)
    elif change == "mtime":
        info = shard.stat()
        os.utime(shard, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    else:
        shard.unlink()
    assert dl.ignore_patterns(str(tmp_path)) == []


def test_state_of_another_directory_or_format_is_ignored(tmp_path):
    (tmp_path / SHARD5).write_bytes(b"x")
    write_state(tmp_path, [SHARD5])
    state = Path(ck.default_state_file(str(tmp_path)))
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "model_dir": "/elsewhere"}))
    assert dl.ignore_patterns(str(tmp_path)) == []
    state.write_text(json.dumps({**data, "version": 99}))
    assert dl.ignore_patterns(str(tmp_path)) == []
    state.write_text("{not json")
    assert dl.ignore_patterns(str(tmp_path)) == []


def test_glob_characters_in_names_are_escaped(tmp_path):
    name = "odd[1].safetensors"
    (tmp_path / name).write_bytes(b"x")
    write_state(tmp_path, [name])
    assert dl.ignore_patterns(str(tmp_path)) == ["odd[[]1].safetensors.part*"]


# --------------------------------------------------------------------------- listings and changed


def test_listing_skips_the_top_level_cache(tmp_path):
    (tmp_path / "exl3" / "qn").mkdir(parents=True)
    (tmp_path / "exl3" / "qn" / "L00.part.safetensors").write_bytes(b"abc")
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "x.metadata").write_text("m")
    (tmp_path / "config.json").write_text("{}")
    assert sorted(dl.listing(str(tmp_path))) == ["config.json", "exl3/qn/L00.part.safetensors"]
    assert dl.listing(str(tmp_path / "absent")) == {}


def test_compare_listings():
    before = {"a": (1, 10), "b": (2, 20), "c": (3, 30)}
    assert dl.compare_listings(before, dict(before))["changed"] is False
    after = {"a": (1, 10), "b": (5, 21), "d": (4, 40)}
    result = dl.compare_listings(before, after)
    assert result["changed"] is True
    assert result["added"] == ["d"]
    assert result["updated"] == ["b"]
    assert result["removed"] == ["c"]
    assert result["bytes_added"] == 9


def test_downloaded_bytes_counts_files_in_place_and_incomplete_ones(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 100)
    cache = tmp_path / ".cache" / "huggingface" / "download"
    cache.mkdir(parents=True)
    (cache / "abc.etag.incomplete").write_bytes(b"x" * 30)
    (cache / "a.metadata").write_bytes(b"x" * 999)
    assert dl.downloaded_bytes(str(tmp_path), {"a": 100, "b": 50}) == 130
    # Never more than the total, even with stale temporaries around.
    (cache / "old.incomplete").write_bytes(b"x" * 500)
    assert dl.downloaded_bytes(str(tmp_path), {"a": 100, "b": 50}) == 150


# --------------------------------------------------------------------------- progress


def test_progress_writer_throttles_and_writes_atomically(tmp_path):
    clock = FakeClock()
    path = tmp_path / "sub" / "progress.json"
    writer = dl.ProgressWriter(str(path), bytes_total=100, clock=clock)
    assert writer.update(phase="downloading", bytes_done=10) is True
    clock.now += 1
    assert writer.update(bytes_done=20) is False  # within the interval
    assert json.loads(path.read_text())["bytes_done"] == 10
    clock.now += 1.5
    assert writer.update(bytes_done=30) is True
    doc = json.loads(path.read_text())
    assert doc == {
        "phase": "downloading",
        "file": None,
        "bytes_done": 30,
        "bytes_total": 100,
        "bytes_start": 0,
        "started": 1000.0,
        "updated": 1002.5,
    }
    assert writer.update(force=True, phase="done") is True
    assert json.loads(path.read_text())["phase"] == "done"
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]  # no temporaries left


def test_progress_writer_without_path_does_nothing(tmp_path):
    writer = dl.ProgressWriter(None)
    assert writer.update(force=True, phase="done") is False


def test_progress_line_from_checkpoint_shards_document():
    doc = {
        "phase": "rebuilding",
        "file": "/m/model-00005-of-00006.safetensors",
        "bytes_done": 50 * 1024**3,
        "bytes_total": 200 * 1024**3,
        "started": 1000.0,
        "updated": 1100.0,
    }
    line = dl.progress_line("rebuild and verification", doc, False, now=1130.0)
    assert line == (
        "rebuild and verification: rebuilding, 50.0 GiB of 200.0 GiB, 25.0%, 512.0 MiB/s, "
        "model-00005-of-00006.safetensors, after 2m10s"
    )


def test_progress_line_rate_counts_only_this_run():
    doc = {"phase": "downloading", "bytes_done": 300, "bytes_total": 400, "bytes_start": 200}
    doc.update(started=0.0, updated=10.0)
    assert "10 B/s" in dl.progress_line("download", doc, False, now=10.0)


def test_progress_line_uses_rsyncs_own_percent_and_rate():
    doc = {"phase": "copying", "bytes_done": 1024**3, "percent": 45, "rate": "120.00MB/s"}
    doc.update(file="exl3/qn/L00.part.safetensors", started=0.0, updated=5.0, bytes_total=None)
    line = dl.progress_line("copy to worker", doc, False, now=3700.0)
    assert line == "copy to worker: copying, 1.0 GiB, 45.0%, 120.00MB/s, L00.part.safetensors, after 1h01m"


def test_progress_line_without_a_document():
    assert dl.progress_line("download", None, False, now=0) == "download: starting"
    assert dl.progress_line("download", None, True, now=0) == "download: finished"


# --------------------------------------------------------------------------- async jobs and waiting


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, {"finished": False, "failed": False, "error": ""}),
        (
            {"started": 1, "finished": 0, "ansible_job_id": "j"},
            {"finished": False, "failed": False, "error": ""},
        ),
        ({"changed": False, "rc": 0, "stdout": "{}"}, {"finished": True, "failed": False, "error": ""}),
        (
            {"rc": 1, "failed": True, "msg": "non-zero return code", "stderr": "boom\n"},
            {"finished": True, "failed": True, "error": "boom"},
        ),
        (
            {"failed": True, "msg": "model_dir is not a directory", "files": []},
            {"finished": True, "failed": True, "error": "model_dir is not a directory"},
        ),
        (
            {"failed": 1, "msg": "Timeout exceeded", "child_pid": 7},
            {"finished": True, "failed": True, "error": "Timeout exceeded"},
        ),
    ],
)
def test_job_outcome(data, expected):
    assert dl.job_outcome(data) == expected


def test_wait_returns_as_soon_as_the_job_finishes(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": 1, "finished": 0}))
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 1003:
            job.write_text(json.dumps({"rc": 0, "stdout": "{}"}))

    result = dl.run_wait(str(job), None, "download", 20, clock=clock, sleep=sleep)
    assert result["finished"] is True
    assert result["failed"] is False
    assert clock.now == 1003
    assert result["line"] == "download: finished"


def test_wait_gives_up_after_its_seconds_and_shows_progress(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps({"started": 1, "finished": 0}))
    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"phase": "downloading", "bytes_done": 1024, "bytes_total": 4096}))
    clock = FakeClock()
    result = dl.run_wait(str(job), str(progress), "download", 5, clock=clock, sleep=clock.sleep)
    assert result["finished"] is False
    assert clock.now == 1005
    assert result["line"] == "download: downloading, 1.0 KiB of 4.0 KiB, 25.0%"


def test_wait_marks_a_failed_job(tmp_path):
    job = tmp_path / "job"
    job.write_text(json.dumps({"failed": 1, "msg": "Timeout exceeded"}))
    result = dl.run_wait(str(job), None, "copy", 5)
    assert result == {
        "finished": True,
        "failed": True,
        "error": "Timeout exceeded",
        "line": "copy: finished (failed)",
    }


def test_wait_command_prints_one_json_document(tmp_path, capsys):
    job = tmp_path / "job"
    job.write_text(json.dumps({"rc": 0}))
    assert dl.main(["wait", "--job", str(job), "--what", "download", "--seconds", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] is True


# --------------------------------------------------------------------------- rsync

RSYNC_OUTPUT = (
    b"cd+++++++++ exl3/\n"
    b"      32,768   0%    0.00kB/s    0:00:00 (xfr#0, to-chk=10/12)\r"
    b">f+++++++++ model-00001-of-00006.safetensors\n"
    b"  1,073,741,824  45%  120.00MB/s    0:00:08 (xfr#1, to-chk=9/12)\r"
    b"rsync: [sender] some warning\n"
    b">f.st...... exl3/qn/L00.part.safetensors\n"
    b"  2,147,483,648 100%  130.00MB/s    0:00:16 (xfr#3, to-chk=0/12)\n"
)


def test_rsync_output_sorts_items_progress_and_messages():
    output = dl.RsyncOutput()
    for start in range(0, len(RSYNC_OUTPUT), 7):  # chunks split lines anywhere
        output.feed(RSYNC_OUTPUT[start : start + 7])
    output.close()
    assert output.items == [
        "cd+++++++++ exl3/",
        ">f+++++++++ model-00001-of-00006.safetensors",
        ">f.st...... exl3/qn/L00.part.safetensors",
    ]
    assert output.bytes_done == 2 * 1024**3
    assert output.percent == 100
    assert output.rate == "130.00MB/s"
    assert output.file == "exl3/qn/L00.part.safetensors"
    assert output.messages == ["rsync: [sender] some warning"]
    summary = output.summary(0)
    assert summary["changed"] is True
    assert summary["itemized_count"] == 3


def test_rsync_output_with_only_progress_is_unchanged():
    output = dl.RsyncOutput()
    output.feed(b"              0   0%    0.00kB/s    0:00:00 (xfr#0, to-chk=0/12)\r")
    output.feed(b"              0 100%    0.00kB/s    0:00:00 (xfr#0, to-chk=0/12)\n")
    output.close()
    assert output.summary(0)["changed"] is False
    assert output.messages == []


def fake_rsync(tmp_path: Path, output: bytes, code: int = 0) -> list[str]:
    script = tmp_path / "fake_rsync.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.stdout.buffer.write({output!r})
            sys.stderr.write("args: " + " ".join(sys.argv[1:]) + "\\n")
            sys.exit({code})
            """
        )
    )
    return [sys.executable, str(script)]


def test_rsync_command_reports_changes_and_writes_progress(tmp_path, capsys):
    progress = tmp_path / "progress.json"
    argv = ["rsync", "--progress-file", str(progress), "--", *fake_rsync(tmp_path, RSYNC_OUTPUT)]
    assert dl.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["changed"] is True
    assert summary["message"] == "rsync changed 3 item(s)"
    doc = json.loads(progress.read_text())
    assert doc["phase"] == "done"
    assert doc["percent"] == 100


def test_rsync_command_passes_rsyncs_exit_code(tmp_path, capsys):
    progress = tmp_path / "progress.json"
    argv = ["rsync", "--progress-file", str(progress), "--", *fake_rsync(tmp_path, b"", code=23)]
    assert dl.main(argv) == 23
    summary = json.loads(capsys.readouterr().out)
    assert summary["changed"] is False
    assert summary["rc"] == 23
    assert json.loads(progress.read_text())["phase"] == "failed"


def test_rsync_command_that_cannot_start(tmp_path, capsys):
    assert dl.main(["rsync", "--", str(tmp_path / "no-such-rsync")]) == 1
    captured = capsys.readouterr()
    assert "cannot run" in captured.err
    assert json.loads(captured.out)["changed"] is False


# --------------------------------------------------------------------------- space, token, environment


def test_space_report_measures_the_nearest_existing_parent(tmp_path):
    report = dl.space_report(str(tmp_path / "models" / "X"))
    assert report["measured_at"] == str(tmp_path)
    assert report["present_bytes"] == 0
    assert report["free_bytes"] > 0
    (tmp_path / "models" / "X" / "sub").mkdir(parents=True)
    (tmp_path / "models" / "X" / "sub" / "f").write_bytes(b"x" * 1234)
    (tmp_path / "models" / "X" / "link").symlink_to(tmp_path / "models" / "X" / "sub" / "f")
    assert dl.space_report(str(tmp_path / "models" / "X"))["present_bytes"] == 1234


def test_read_token(tmp_path):
    assert dl.read_token(None) is None
    assert dl.read_token(str(tmp_path / "absent")) is None
    (tmp_path / "empty").write_text("\n")
    assert dl.read_token(str(tmp_path / "empty")) is None
    (tmp_path / "token").write_text("hf_abc\n")
    assert dl.read_token(str(tmp_path / "token")) == "hf_abc"


def test_clean_hf_environment_drops_empty_values():
    env = {"HF_ENDPOINT": "", "HF_TOKEN": " ", "HF_HUB_DISABLE_XET": "1"}
    dl.clean_hf_environment(env)
    assert env == {"HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env = {"HF_ENDPOINT": "http://hub:5080"}
    dl.clean_hf_environment(env)
    assert env["HF_ENDPOINT"] == "http://hub:5080"


def test_human_units():
    assert dl.human_bytes(0) == "0 B"
    assert dl.human_bytes(1536) == "1.5 KiB"
    assert dl.human_bytes(462 * 1024**3) == "462.0 GiB"
    assert dl.human_bytes(3 * 1024**4) == "3.0 TiB"
    assert dl.human_seconds(59) == "59s"
    assert dl.human_seconds(61) == "1m01s"
    assert dl.human_seconds(7322) == "2h02m"


# --------------------------------------------------------------------------- download, end to end


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The lab's hub stand-in with a ~3 MB checkpoint and a token, on a loopback port."""
    make_checkpoint = _load("dsv41_download_test_make_checkpoint", HUB_DIR / "make_checkpoint.py")
    standin = _load("dsv41_download_test_hub", HUB_DIR / "hf_hub_standin.py")
    root = tmp_path_factory.mktemp("hub")
    make_checkpoint.generate(root / REPO_ID, size_mb=3, exl3_layers=2)
    token = "hf_test_" + "a" * 24
    log_path = tmp_path_factory.mktemp("hub-log") / "access.log"
    with log_path.open("a") as log:
        server = standin.serve_in_thread(root, token=token, access_log=log)
        try:
            yield {"url": server.url, "token": token, "log": log_path}
        finally:
            server.shutdown()
            server.server_close()


def run_download(
    hub: dict[str, Any], model_dir: Path, token_file: Path, tmp_path: Path
) -> tuple[int, dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub["url"], HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1")
    argv = [sys.executable, str(PROGRAM), "download", "--repo-id", REPO_ID, "--local-dir", str(model_dir)]
    argv += ["--token-file", str(token_file), "--progress-file", str(tmp_path / "progress.json")]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    return result.returncode, json.loads(result.stdout), result.stderr


def fetched(log: Path, since: int) -> list[str]:
    records = [json.loads(line) for line in log.read_text().splitlines()[since:]]
    return [r["path"] for r in records if r["method"] == "GET" and "/resolve/" in r["path"]]


def rebuild(model_dir: Path) -> dict[str, Any]:
    """What the checkpoint_shards module does: rebuild, verify, delete the parts, record."""
    model = str(model_dir)
    state = ck.default_state_file(model)
    manifest = ck.read_manifest(model)
    records, _ = ck.load_state(state, model)
    actions = ck.plan_actions(manifest, ck.scan_checkpoint(model, manifest), records, False)
    report, errors = ck.apply_plan(actions, model, records, state, check_mode=False)
    assert errors == []
    return report


def test_download_rebuild_and_rerun_fetch_nothing_again(hub, tmp_path):
    model_dir = tmp_path / "models" / "DeepSeek-V4.1-Flash-Spark"
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"] + "\n")

    code, summary, stderr = run_download(hub, model_dir, token_file, tmp_path)
    assert code == 0, stderr
    assert summary["changed"] is True
    assert summary["ignore_patterns"] == []
    assert summary["files_total"] == len(summary["added"]) > 10
    assert f"{SHARD5}.part00" in summary["added"]
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["phase"] == "done"
    assert progress["bytes_done"] == progress["bytes_total"] == summary["bytes_total"]

    report = rebuild(model_dir)
    assert {f["file"] for f in report["files"] if f["action"] == "rebuilt"} == {SHARD5, SHARD6}
    assert not list(model_dir.glob("*.part*"))

    # The re-run changes nothing and, above all, does not fetch the deleted parts again.
    since = len(hub["log"].read_text().splitlines())
    code, summary, stderr = run_download(hub, model_dir, token_file, tmp_path)
    assert code == 0, stderr
    assert summary["changed"] is False
    assert {f"{SHARD5}.part*", f"{SHARD6}.part*"} <= set(summary["ignore_patterns"])
    assert "up to date" in summary["message"]
    assert fetched(hub["log"], since) == []
    assert not list(model_dir.glob("*.part*"))

    # A file lost since is fetched again, and only that one.
    (model_dir / "config.json").unlink()
    since = len(hub["log"].read_text().splitlines())
    code, summary, stderr = run_download(hub, model_dir, token_file, tmp_path)
    assert code == 0, stderr
    assert summary["changed"] is True
    assert summary["added"] == ["config.json"]
    assert [path.rsplit("/", 1)[1] for path in fetched(hub["log"], since)] == ["config.json"]


def test_download_without_the_token_fails_clearly_and_never_shows_it(hub, tmp_path):
    model_dir = tmp_path / "model"
    code, summary, stderr = run_download(hub, model_dir, tmp_path / "no-token-file", tmp_path)
    assert code == 1
    assert summary["changed"] is False
    assert f"downloading {REPO_ID}" in summary["error"]
    assert "RepositoryNotFoundError" in stderr
    assert json.loads((tmp_path / "progress.json").read_text())["phase"] == "failed"

    (tmp_path / "wrong").write_text("hf_wrong_token_value")
    code, summary, stderr = run_download(hub, model_dir, tmp_path / "wrong", tmp_path)
    assert code == 1
    assert "hf_wrong_token_value" not in stderr + json.dumps(summary)


def test_a_hub_refusing_the_token_keeps_local_files_with_a_warning(hub, tmp_path):
    model_dir = tmp_path / "model"
    token_file = tmp_path / "hf-token"
    token_file.write_text(hub["token"])
    code, summary, stderr = run_download(hub, model_dir, token_file, tmp_path)
    assert code == 0, stderr
    token_file.write_text("hf_wrong_token_value")
    code, summary, stderr = run_download(hub, model_dir, token_file, tmp_path)
    assert code == 0, stderr
    assert summary["changed"] is False
    assert "WARNING: the hub did not list the repo" in summary["message"]
    assert "hf_wrong_token_value" not in stderr + json.dumps(summary)
