"""The node programs' file access in the deployment user's state directory: never through a link.

Run as root (as CI runs), the directories stand in for the deployment user's are given to another
user, as on a node; a link in a directory only root may change (``/home`` -> ``/var/home``) is
followed."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import dsv41_nofollow as nofollow
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
    nofollow.append(state / "x.log", b"one\n")
    nofollow.append(state / "x.log", b"two\n")
    assert (state / "x.log").read_text() == "one\ntwo\n"
    assert nofollow.size(state / "x.log") == 8
    assert nofollow.size(state / "absent.log") is None


def test_a_link_planted_at_a_log_is_never_appended_through(state: Path, secret: Path) -> None:
    (state / "x.log").symlink_to(secret)
    with pytest.raises(OSError) as raised:
        nofollow.append(state / "x.log", b"owned\n")
    assert raised.value.errno == errno.ELOOP
    assert secret.read_text() == "root's secret\n"


def test_a_link_in_place_of_the_state_directory_is_never_followed(tmp_path: Path, state: Path) -> None:
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    state.rmdir()
    state.symlink_to(elsewhere)
    for write in (
        lambda: nofollow.append(state / "x.log", b"owned\n"),
        lambda: nofollow.write_atomically(state / "state.json", "{}"),
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
    nofollow.append(trusted / "home" / "x.log", b"ok\n")
    assert (real / "x.log").read_text() == "ok\n"


def test_writing_atomically_replaces_a_planted_link_and_leaves_its_target(state: Path, secret: Path) -> None:
    (state / "state.json").symlink_to(secret)
    nofollow.write_atomically(state / "state.json", '{"state": "healthy"}\n')
    assert not (state / "state.json").is_symlink()
    assert (state / "state.json").read_text() == '{"state": "healthy"}\n'
    assert secret.read_text() == "root's secret\n"
    assert sorted(path.name for path in state.iterdir()) == ["state.json"], "no temporary file left"


def test_the_temporary_file_has_a_name_no_one_could_prepare(state: Path, secret: Path) -> None:
    """The old fixed name (.state.json.tmp) planted as a link is neither used nor followed."""
    (state / ".state.json.tmp").symlink_to(secret)
    nofollow.write_atomically(state / "state.json", "{}\n")
    assert secret.read_text() == "root's secret\n"
    assert (state / "state.json").read_text() == "{}\n"


def test_rotation_renames_over_planted_links_and_never_writes_their_targets(
    state: Path, secret: Path
) -> None:
    (state / "x.log").write_text("newest\n")
    (state / "x.log.1").symlink_to(secret)
    nofollow.rotate(state / "x.log", backups=2)
    assert (state / "x.log.1").read_text() == "newest\n"
    assert (state / "x.log.2").is_symlink(), "the planted link was moved along, never written"
    assert secret.read_text() == "root's secret\n"
    nofollow.append(state / "x.log", b"next\n")
    nofollow.rotate(state / "x.log", backups=0)
    assert not (state / "x.log").exists()


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_reading_refuses_a_link_or_a_fifo(state: Path, secret: Path, planted: str) -> None:
    if planted == "link":
        (state / "api_key").symlink_to(secret)
    else:
        os.mkfifo(state / "api_key")
    with pytest.raises(OSError):
        nofollow.read_text(state / "api_key")


def test_reading_a_regular_file(state: Path) -> None:
    (state / "api_key").write_text("k-123\n")
    assert nofollow.read_text(state / "api_key") == "k-123\n"
