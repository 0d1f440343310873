"""Tests of the checkpoint_copy module with the real rsync, run in-process through ``run_module``.

Local copies need nothing but rsync; "remote" ones go through a fake ssh (``rsh``) that runs the
remote command on this machine, so the ``-e`` quoting is checked by rsync itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils._rsync import rsync_argv
from ansible_collections.sparkserve.dsv41.plugins.modules import checkpoint_copy
from dir_snapshot import snapshot


def checkpoint(root: Path) -> Path:
    """A small checkpoint directory as the head holds it after the download and the rebuild."""
    model = root / "head" / "model"
    (model / "exl3" / "qn").mkdir(parents=True)
    (model / "exl3" / "qn" / "L00.part.safetensors").write_bytes(b"w" * 100)
    (model / "model-00001-of-00006.safetensors").write_bytes(b"1" * 3000)
    (model / "model-00005-of-00006.safetensors").write_bytes(b"5" * 2000)
    (model / "model-00005-of-00006.safetensors.part00").write_bytes(b"5" * 1000)  # kept parts
    (model / ".model-00006-of-00006.safetensors.sparkserve-tmp").write_bytes(b"6")  # a rebuild's temporary
    (model / ".cache" / "sparkserve").mkdir(parents=True)
    (model / ".cache" / "sparkserve" / "verified.json").write_text("{}")
    (model / "config.json").write_text("{}")
    return model


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_copy_then_rerun_changes_nothing(tmp_path, run_module):
    model = checkpoint(tmp_path)
    dest = tmp_path / "worker" / "model"
    dest.parent.mkdir()
    progress = tmp_path / "progress.json"
    args = {"src": str(model), "dest": str(dest), "progress_file": str(progress)}
    first = run_module(checkpoint_copy, args)
    assert not first.failed, first
    assert first["changed"] is True
    assert files(dest) == ["config.json", "exl3/qn/L00.part.safetensors", "model-00001-of-00006.safetensors",
                           "model-00005-of-00006.safetensors"]  # fmt: skip
    assert ">f+++++++++ model-00001-of-00006.safetensors" in first["itemized"]
    assert first["bytes_transferred"] == 3000 + 2000 + 100 + 2
    assert first["msg"] == f"rsync changed {first['itemized_count']} item(s) at {dest}"
    assert first["cmd"][-2:] == [f"{model}/", f"{dest}/"]
    doc = json.loads(progress.read_text())
    assert (doc["what"], doc["phase"], doc["unit"], doc["done"]) == ("copy", "done", "bytes", 5102)
    assert set(yaml.safe_load(checkpoint_copy.RETURN)) == set(first) - {"changed", "invocation"}

    # The worker's own verification records appear; the next run still changes nothing.
    (dest / ".cache" / "sparkserve").mkdir(parents=True)
    (dest / ".cache" / "sparkserve" / "verified.json").write_text('{"worker": true}')
    again = run_module(checkpoint_copy, args)
    assert not again.failed, again
    assert (again["changed"], again["itemized"]) == (False, [])
    assert again["msg"] == f"the copy at {dest} is up to date; rsync changed nothing"
    assert (dest / ".cache" / "sparkserve" / "verified.json").read_text() == '{"worker": true}'


def test_check_mode_changes_nothing_and_says_what_would_change(tmp_path, run_module):
    model = checkpoint(tmp_path)
    dest = tmp_path / "worker" / "model"
    dest.parent.mkdir()
    progress = tmp_path / "progress.json"
    run_module(checkpoint_copy, {"src": str(model), "dest": str(dest)})
    (model / "config.json").write_text('{"changed": 1}')
    before = snapshot(tmp_path)
    result = run_module(
        checkpoint_copy,
        {"src": str(model), "dest": str(dest), "progress_file": str(progress)},
        check_mode=True,
    )
    assert not result.failed, result
    assert result["changed"] is True
    assert [item.split(" ", 1)[1] for item in result["itemized"]] == ["config.json"]
    assert "--dry-run" in result["cmd"]
    assert result["msg"] == f"rsync would change 1 item(s) at {dest}"
    assert snapshot(tmp_path) == before
    assert not progress.exists()


def test_an_interrupted_file_is_completed(tmp_path, run_module):
    model = checkpoint(tmp_path)
    dest = tmp_path / "worker" / "model"
    (dest / ".rsync-partial").mkdir(parents=True)
    # A third of it arrived before the copy was stopped; rsync keeps that aside (--partial-dir).
    (dest / ".rsync-partial" / "model-00001-of-00006.safetensors").write_bytes(b"1" * 1000)
    result = run_module(checkpoint_copy, {"src": str(model), "dest": str(dest), "exclude": [".cache/"]})
    assert not result.failed, result
    assert (dest / "model-00001-of-00006.safetensors").read_bytes() == b"1" * 3000
    assert not (dest / ".rsync-partial").exists(), "the partial was used up and its directory removed"
    assert (dest / "model-00005-of-00006.safetensors.part00").exists(), "exclude replaces the default list"


def test_a_copy_killed_mid_file_leaves_no_truncated_file_under_its_name_and_resumes(tmp_path, run_module):
    model = tmp_path / "head"
    model.mkdir()
    shard = model / "model-00001-of-00001.safetensors"
    shard.write_bytes(bytes(range(256)) * 4096 * 2)  # 2 MiB: 4 s at the cap below
    dest = tmp_path / "worker"
    dest.mkdir()
    (dest / shard.name).write_bytes(b"the previous revision")
    argv = rsync_argv(shutil.which("rsync"), str(model), str(dest), bwlimit_kib=512)
    assert "--bwlimit=512" in argv
    copy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = dest / ".rsync-partial" / shard.name
    deadline = time.monotonic() + 20
    while not list(dest.glob(f".{shard.name}.*")) and time.monotonic() < deadline:  # rsync's file in flight
        time.sleep(0.1)
    time.sleep(0.5)
    copy.terminate()  # as a Ctrl-C or a reboot would
    copy.wait(timeout=20)
    assert 0 < partial.stat().st_size < shard.stat().st_size, "stopped mid-file, the part kept aside"
    assert (dest / shard.name).read_bytes() == b"the previous revision", "never a truncated file"

    result = run_module(checkpoint_copy, {"src": str(model), "dest": str(dest)})
    assert not result.failed, result
    assert (dest / shard.name).read_bytes() == shard.read_bytes()
    assert not partial.exists()


def test_a_negative_rate_cap_is_refused_before_anything_runs(tmp_path, run_module):
    args = {"src": str(tmp_path), "dest": str(tmp_path / "d"), "bwlimit_kib": -1}
    result = run_module(checkpoint_copy, args)
    assert result.failed
    assert result["msg"] == "bwlimit_kib must be 0 (no cap) or more, got -1"
    assert not (tmp_path / "d").exists()


FAKE_SSH = """
import json, os, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps(args) + "\\n")
rest = list(args)
while rest[0].startswith("-"):
    option = rest.pop(0)
    if option in ("-o", "-i", "-l", "-p"):
        rest.pop(0)
host = rest.pop(0)
os.execvp("sh", ["sh", "-c", " ".join(rest)])
"""


def test_a_remote_copy_hands_rsync_the_remote_shell_as_given(tmp_path, run_module):
    model = checkpoint(tmp_path)
    dest = tmp_path / "worker" / "model"
    dest.parent.mkdir()
    log = tmp_path / "ssh.log"
    ssh = tmp_path / "fake ssh.py"
    ssh.write_text(textwrap.dedent(FAKE_SSH.format(log=str(log))))
    rsh = [sys.executable, str(ssh), "-o", "UserKnownHostsFile=/st ate/known hosts", "-i", "/k/id_ed25519"]
    result = run_module(checkpoint_copy, {"src": str(model), "dest": f"spark@worker-1:{dest}", "rsh": rsh})
    assert not result.failed, result
    assert result["changed"] is True
    assert "model-00001-of-00006.safetensors" in files(dest)
    called = json.loads(log.read_text().splitlines()[0])
    assert called[:4] == rsh[2:] and called[4:7] == ["-l", "spark", "worker-1"]


def test_a_failed_copy_fails_with_rsyncs_words(tmp_path, run_module):
    model = checkpoint(tmp_path)
    result = run_module(checkpoint_copy, {"src": str(model), "dest": str(tmp_path / "no" / "such" / "dir")})
    assert result.failed
    assert result["rc"] != 0
    assert result["msg"].startswith(
        f"rsync to {tmp_path / 'no' / 'such' / 'dir'} failed with exit code {result['rc']}: "
    )
    assert any("No such file or directory" in message for message in result["messages"]), result["messages"]
