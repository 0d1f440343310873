"""Tests of _rsync: the command, rsync's output as it really comes, progress, failures.

The outputs below were captured from rsync 3.5.0 (``LC_ALL=C rsync -a --no-owner --no-group
--omit-dir-times --partial --itemize-changes --info=progress2 --exclude=... src/ dst/``), the
first with ``--bwlimit=1000`` so that progress lines appear while a file is sent.
"""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _rsync as rs
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter

FIRST_COPY = (
    b">f+++++++++ config.json\n"
    b"\r              3   0%    0.00kB/s    0:00:00  "
    b"\r              3   0%    0.00kB/s    0:00:00 (xfr#1, to-chk=4/6)\n"
    b">f+++++++++ model-00001-of-00006.safetensors\n"
    b"\r      1,081,347  36%    1.01MB/s    0:00:01  "
    b"\r      2,129,923  70% 1016.12kB/s    0:00:00  "
    b"\r      3,000,003  99%    1.02MB/s    0:00:02 (xfr#2, to-chk=3/6)\n"
    b"cd+++++++++ exl3/\n"
    b"cd+++++++++ exl3/qn/\n"
    b">f+++++++++ exl3/qn/L00.part.safetensors\n"
    b"\r      3,001,003 100%    1.02MB/s    0:00:02 (xfr#3, to-chk=0/6)"
    b"\r      3,001,003 100% 1000.23kB/s    0:00:02 (xfr#3, to-chk=0/6)"
    b"\r      3,001,003 100% 1000.23kB/s    0:00:02 (xfr#3, to-chk=0/6)"
    b"\r      3,001,003 100% 1000.23kB/s    0:00:02 (xfr#3, to-chk=0/6)\n"
)
UP_TO_DATE = (
    b"\r              0   0%    0.00kB/s    0:00:00 (xfr#0, to-chk=2/6)"
    b"\r              0   0%    0.00kB/s    0:00:00 (xfr#0, to-chk=1/6)"
    b"\r              0   0%    0.00kB/s    0:00:00 (xfr#0, to-chk=0/6)\n"
)
DRY_RUN_ONE_CHANGE = (
    b">f.st...... config.json\n"
    b"\r              8   0%    7.81kB/s    0:00:00 (xfr#1, to-chk=2/6)"
    b"\r              8   0%    7.81kB/s    0:00:00 (xfr#1, to-chk=1/6)"
    b"\r              8   0%    7.81kB/s    0:00:00 (xfr#1, to-chk=0/6)\n"
)
SSH_FAILURE = (
    "ssh: Could not resolve hostname nohost-xyz: Name or service not known\n"
    "rsync: connection unexpectedly closed (0 bytes received so far) [sender]\n"
    "rsync error: unexplained error (code 255) at io.c(285) [sender=3.5.0]\n"
)


def parse(data: bytes, step: int = 7) -> rs.RsyncOutput:
    output = rs.RsyncOutput()
    for start in range(0, len(data), step):  # chunks split lines anywhere
        output.feed(data[start : start + step])
    output.close()
    return output


def test_a_first_copy_sorts_items_progress_and_nothing_else():
    output = parse(FIRST_COPY)
    assert output.items == [
        ">f+++++++++ config.json",
        ">f+++++++++ model-00001-of-00006.safetensors",
        "cd+++++++++ exl3/",
        "cd+++++++++ exl3/qn/",
        ">f+++++++++ exl3/qn/L00.part.safetensors",
    ]
    assert output.bytes_done == 3_001_003
    assert output.percent == 100
    assert output.files == (6, 6)
    assert output.messages == []
    assert output.detail() == "exl3/qn/L00.part.safetensors, 6 of 6 files checked"
    assert output.summary(0) == {
        "changed": True,
        "rc": 0,
        "itemized_count": 5,
        "itemized": output.items,
        "messages": [],
        "bytes_transferred": 3_001_003,
    }


def test_progress_lines_between_items_are_read_as_they_come():
    output = rs.RsyncOutput()
    output.feed(FIRST_COPY[: FIRST_COPY.index(b"\r      2,129,923")])
    assert (output.bytes_done, output.percent, output.file) == (
        1_081_347,
        36,
        "model-00001-of-00006.safetensors",
    )
    assert output.files == (2, 6)  # from the end of config.json


def test_an_up_to_date_copy_is_unchanged():
    output = parse(UP_TO_DATE)
    summary = output.summary(0)
    assert (summary["changed"], summary["itemized_count"], summary["bytes_transferred"]) == (False, 0, 0)
    assert output.messages == []
    assert rs.copy_message(summary, "w:/m") == "the copy at w:/m is up to date; rsync changed nothing"


def test_a_dry_run_reports_what_would_change():
    summary = parse(DRY_RUN_ONE_CHANGE).summary(0)
    assert summary["itemized"] == [">f.st...... config.json"]
    assert rs.copy_message(summary, "w:/m", dry_run=True) == "rsync would change 1 item(s) at w:/m"


def test_messages_keep_the_last_twenty():
    output = rs.RsyncOutput()
    for number in range(30):
        output.message(f"warning {number}\n")
    output.message("   ")
    assert output.messages == [f"warning {n}" for n in range(10, 30)]


def test_human_readable_units_are_understood():
    output = parse(b"\r        1.50G  45%  120.00MB/s    0:00:08\n")
    assert output.bytes_done == int(1.5 * 1024**3)


# --------------------------------------------------------------------------- the command


def test_the_command_copies_contents_to_contents_without_parts_or_cache():
    argv = rs.rsync_argv("/usr/bin/rsync", "/m/model", "spark@10.0.0.2:/m/model/")
    assert argv == [
        "/usr/bin/rsync",
        "-a",
        "--no-owner",
        "--no-group",
        "--omit-dir-times",
        "--partial-dir=.rsync-partial",
        "--itemize-changes",
        "--info=progress2",
        "--exclude=*.safetensors.part*",
        "--exclude=.cache/",
        "--exclude=.*.sparkserve-tmp",
        "/m/model/",
        "spark@10.0.0.2:/m/model/",
    ]


def test_the_remote_shell_is_one_argument_that_keeps_each_item_whole():
    rsh = [
        "ssh",
        "-o",
        "Port=2222",
        "-o",
        "UserKnownHostsFile=/st ate/known hosts",
        "-o",
        "ProxyCommand=it's",
    ]
    argv = rs.rsync_argv("rsync", "/a", "/b", rsh=rsh, excludes=[], dry_run=True)
    assert argv[argv.index("--info=progress2") + 1] == "--dry-run"
    assert not [arg for arg in argv if arg.startswith("--bwlimit")], "no cap unless asked"
    shell = argv[argv.index("-e") + 1]
    # rsync splits the value on spaces and drops quotes as a POSIX shell does (no backslashes).
    assert shlex.split(shell) == rsh


# --------------------------------------------------------------------------- running it


def fake_rsync(tmp_path: Path, stdout: bytes, stderr: str = "", code: int = 0) -> list[str]:
    script = tmp_path / "fake_rsync.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            sys.stdout.buffer.write({stdout!r})
            sys.stderr.write({stderr!r})
            sys.exit({code})
            """
        )
    )
    return [sys.executable, str(script)]


def test_running_it_reports_the_changes_and_writes_the_progress_document(tmp_path):
    path = tmp_path / "progress.json"
    summary = rs.run_rsync(fake_rsync(tmp_path, FIRST_COPY), ProgressWriter(str(path), "copy"))
    assert (summary["changed"], summary["rc"], summary["itemized_count"]) == (True, 0, 5)
    doc = json.loads(path.read_text())
    assert (doc["what"], doc["phase"], doc["unit"], doc["done"], doc["total"]) == (
        "copy",
        "done",
        "bytes",
        3_001_003,
        None,
    )
    assert doc["detail"] == "exl3/qn/L00.part.safetensors, 6 of 6 files checked"


def test_a_failed_rsync_keeps_its_messages_and_marks_the_progress(tmp_path):
    path = tmp_path / "progress.json"
    summary = rs.run_rsync(
        fake_rsync(tmp_path, b"", SSH_FAILURE, code=255), ProgressWriter(str(path), "copy")
    )
    assert (summary["changed"], summary["rc"]) == (False, 255)
    assert summary["messages"] == SSH_FAILURE.splitlines()
    assert json.loads(path.read_text())["phase"] == "failed"
    assert rs.copy_message(summary, "w:/m") == (
        "rsync to w:/m failed with exit code 255: " + "; ".join(SSH_FAILURE.splitlines())
    )


def test_rsync_runs_in_the_c_locale_from_an_argument_list(tmp_path):
    script = tmp_path / "env.py"
    script.write_text("import os, sys\nsys.stderr.write(os.environ['LC_ALL'] + ' ' + sys.argv[1] + '\\n')\n")
    summary = rs.run_rsync([sys.executable, str(script), "a b; echo no shell"], ProgressWriter(None, "copy"))
    assert summary["messages"] == ["C a b; echo no shell"]


def test_an_rsync_that_cannot_start_raises(tmp_path):
    with pytest.raises(OSError):
        rs.run_rsync([str(tmp_path / "no-such-rsync")], ProgressWriter(None, "copy"))


def test_other_revisions_on_the_receiver_are_linked_from_not_sent():
    argv = rs.rsync_argv("rsync", "/m/r/new", "w:/m/r/new", link_dest=["/m/r/old", "/m/r/older"])
    assert [a for a in argv if a.startswith("--link-dest")] == [
        "--link-dest=/m/r/old",
        "--link-dest=/m/r/older",
    ]
    assert argv[-2:] == ["/m/r/new/", "w:/m/r/new/"]
