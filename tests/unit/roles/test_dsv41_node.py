"""dsv41_node.py, the node programs' shared module: their file access in the deployment user's
state directory (never through a link), their log line and their commands.

Run as root (as CI runs), the directories stand in for the deployment user's are given to another
user, as on a node; a link in a directory only root may change (``/home`` -> ``/var/home``) is
followed."""

from __future__ import annotations

import datetime
import errno
import os
import time
from pathlib import Path

import dsv41_node as shared
import pytest

NOBODY = 65534


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The deployment user's state directory, and a root-only file a link could name."""
    directory = tmp_path / "home" / "state"
    directory.mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(tmp_path / "home", NOBODY, NOBODY)
        os.chown(directory, NOBODY, NOBODY)
    return directory


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "root-only"
    path.write_text("root's secret\n")
    path.chmod(0o600)
    return path


def test_appending_creates_then_appends(state: Path) -> None:
    shared.append(state / "x.log", b"one\n")
    shared.append(state / "x.log", b"two\n")
    assert (state / "x.log").read_text() == "one\ntwo\n"
    assert shared.size(state / "x.log") == 8
    assert shared.size(state / "absent.log") is None


def test_a_link_planted_at_a_log_is_never_appended_through(state: Path, secret: Path) -> None:
    (state / "x.log").symlink_to(secret)
    with pytest.raises(OSError) as raised:
        shared.append(state / "x.log", b"owned\n")
    assert raised.value.errno == errno.ELOOP
    assert secret.read_text() == "root's secret\n"


def test_a_link_in_place_of_the_state_directory_is_never_followed(tmp_path: Path, state: Path) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    state.rmdir()
    state.symlink_to(elsewhere)
    for write in (
        lambda: shared.append(state / "x.log", b"owned\n"),
        lambda: shared.write_atomically(state / "state.json", "{}"),
    ):
        with pytest.raises(OSError):
            write()
    assert list(elsewhere.iterdir()) == []


def test_a_link_in_a_directory_only_root_may_change_is_followed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root owns a directory that root alone may change")  # CI runs as root
    real = tmp_path / "var-home"
    real.mkdir()
    trusted = tmp_path / "root-owned"
    trusted.mkdir(mode=0o755)
    (trusted / "home").symlink_to(real)
    shared.append(trusted / "home" / "x.log", b"ok\n")
    assert (real / "x.log").read_text() == "ok\n"


def test_writing_atomically_replaces_a_planted_link_and_leaves_its_target(state: Path, secret: Path) -> None:
    (state / "state.json").symlink_to(secret)
    shared.write_atomically(state / "state.json", '{"state": "healthy"}\n')
    assert not (state / "state.json").is_symlink()
    assert (state / "state.json").read_text() == '{"state": "healthy"}\n'
    assert secret.read_text() == "root's secret\n"
    assert sorted(path.name for path in state.iterdir()) == ["state.json"], "no temporary file left"


def test_the_temporary_file_has_a_name_no_one_could_prepare(state: Path, secret: Path) -> None:
    """The old fixed name (.state.json.tmp) planted as a link is neither used nor followed."""
    (state / ".state.json.tmp").symlink_to(secret)
    shared.write_atomically(state / "state.json", "{}\n")
    assert secret.read_text() == "root's secret\n"
    assert (state / "state.json").read_text() == "{}\n"


def test_rotation_renames_over_planted_links_and_never_writes_their_targets(
    state: Path, secret: Path
) -> None:
    (state / "x.log").write_text("newest\n")
    (state / "x.log.1").symlink_to(secret)
    shared.rotate(state / "x.log", backups=2)
    assert (state / "x.log.1").read_text() == "newest\n"
    assert (state / "x.log.2").is_symlink(), "the planted link was moved along, never written"
    assert secret.read_text() == "root's secret\n"
    shared.append(state / "x.log", b"next\n")
    shared.rotate(state / "x.log", backups=0)
    assert not (state / "x.log").exists()


@pytest.mark.parametrize("reader", [False, True], ids=["no-reader", "a-reader"])
def test_a_fifo_planted_at_a_log_is_refused_at_once(state: Path, reader: bool) -> None:
    """Without a reader, a blocking open for writing waits for ever: the guard, whose kill follows
    its log line, would stop guarding while systemd still says active."""
    os.mkfifo(state / "x.log")
    held = os.open(state / "x.log", os.O_RDONLY | os.O_NONBLOCK) if reader else None
    started = time.monotonic()
    try:
        with pytest.raises(OSError):
            shared.append(state / "x.log", b"line\n")
        if held is not None:
            assert os.read(held, 100) == b"", "nothing written into the FIFO"
    finally:
        if held is not None:
            os.close(held)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_reading_refuses_a_link_or_a_fifo(state: Path, secret: Path, planted: str) -> None:
    if planted == "link":
        (state / "api_key").symlink_to(secret)
    else:
        os.mkfifo(state / "api_key")
    with pytest.raises(OSError):
        shared.read_text(state / "api_key")


def test_reading_a_regular_file(state: Path) -> None:
    (state / "api_key").write_text("k-123\n")
    assert shared.read_text(state / "api_key") == "k-123\n"


# --- the log line all node programs write ---------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param("a\nb\tc", "a b c", id="newline-and-tab"),
        pytest.param("  spaced   out\r\n", "spaced out", id="runs-of-whitespace"),
        pytest.param("bell\x07 and\x00nul", "bell and nul", id="unprintable"),
    ],
)
def test_format_line_is_one_timestamped_line(message: str, expected: str) -> None:
    line = shared.format_line(1_760_000_000.25, "kill", message)
    assert line.endswith("\n") and line.count("\n") == 1
    stamp, event, text = line.rstrip("\n").split(" ", 2)
    parsed = datetime.datetime.fromisoformat(stamp)
    assert parsed.tzinfo is not None
    assert parsed.timestamp() == 1_760_000_000.25
    assert (event, text) == ("kill", expected)


def test_one_line_cuts_at_the_limit() -> None:
    assert shared.one_line("x" * 50, 10) == "x" * 7 + "..."
    assert shared.one_line("x" * 10, 10) == "x" * 10


@pytest.mark.parametrize(
    ("said", "expected"),
    [
        (
            "Error response from daemon:\n  No such container: dsv41-r0\n",
            "Error response from daemon: No such container: dsv41-r0",
        ),
        ("y" * 5000, "y" * 297 + "..."),
    ],
    ids=["docker stderr", "a server's whole page"],
)
def test_a_detail_is_one_line_bounded_whatever_was_said(said: str, expected: str) -> None:
    assert shared.detail(said) == expected
    assert len(shared.detail(said)) <= shared.DETAIL_MAX_CHARS


def test_run_command_folds_a_timeout_and_a_missing_program_in(tmp_path: Path) -> None:
    assert shared.run_command(["sleep", "5"], 0.2) == shared.CommandResult(124, "", "timed out after 0.2s")
    missing = shared.run_command([str(tmp_path / "absent")], 1)
    assert missing.returncode == 127 and "absent" in missing.stderr
    # No input: a command that reads stdin gets EOF at once, not the program's own stdin.
    assert shared.run_command(["cat"], 5) == shared.CommandResult(0, "", "")


def test_a_command_that_times_out_leaves_nothing_it_started_running(tmp_path: Path) -> None:
    """Rank control's docker, blocked on a hung daemon, must not outlive rank control: one more
    each tick otherwise."""
    pid_file = tmp_path / "grandchild.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    assert shared.run_command(["sh", "-c", script], 0.5).returncode == 124
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(grandchild):
        time.sleep(0.05)
    assert not _alive(grandchild), "the command's own child was killed with it"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie is dead, waiting for its parent


def test_output_that_is_not_utf8_is_kept_replaced_not_fatal() -> None:
    result = shared.run_command(["printf", r"ok\377\n"], 5)
    assert result == shared.CommandResult(0, "ok\ufffd\n", "")


def test_a_short_write_still_writes_every_byte(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a filling disk write(2) may write part; the file renamed into place is whole."""
    write = os.write
    monkeypatch.setattr(shared.os, "write", lambda fd, data: write(fd, bytes(data[:3])))
    shared.write_atomically(state / "state.json", '{"state": "healthy"}\n')
    shared.append(state / "x.log", b"one line\n")
    assert (state / "state.json").read_text() == '{"state": "healthy"}\n'
    assert (state / "x.log").read_text() == "one line\n"


def test_a_stop_while_writing_leaves_no_temporary_file(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def stopped(*_args: object, **_kwargs: object) -> None:
        raise shared.StopRequested(15)

    monkeypatch.setattr(shared.os, "replace", stopped)
    with pytest.raises(shared.StopRequested):
        shared.write_atomically(state / "state.json", "{}\n")
    assert list(state.iterdir()) == []
