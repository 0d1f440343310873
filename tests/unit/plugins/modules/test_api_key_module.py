"""sparkserve.dsv41.api_key run in-process: create, keep, rotate, repair, refuse, and never show the key."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.sparkserve.dsv41.plugins.modules import api_key
from dir_snapshot import snapshot

KEY = "Zq3d0vJ1mT6yHkq8pXwA_r2LbN-5sE9uCfGhJkLmNoP"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    directory = tmp_path / ".dsv41-two-sparks"
    directory.mkdir(mode=0o700)
    return directory


def stored_key(path: Path) -> str:
    content = path.read_text()
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}\n", content)
    return content.strip()


def fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def write_key_file(path: Path, content: str, mode: int = 0o600) -> None:
    path.write_text(content)
    path.chmod(mode)


def test_creates_the_key_once_and_keeps_it(run_module, state_dir):
    key_file = state_dir / "api_key"
    first = run_module(api_key, {"path": str(key_file)})
    assert first["changed"] is True
    key = stored_key(key_file)
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert first["fingerprint"] == fingerprint(key)
    assert (first["path"], first["mode"], first["owner"]) == (str(key_file), "0600", "root")
    assert key not in json.dumps(first)

    before = snapshot(state_dir)
    second = run_module(api_key, {"path": str(key_file)})
    assert second["changed"] is False
    assert second["fingerprint"] == first["fingerprint"]
    assert snapshot(state_dir) == before  # byte-identical, mtime untouched


def test_existing_key_is_kept_byte_identical(run_module, state_dir):
    key_file = state_dir / "api_key"
    write_key_file(key_file, KEY)  # written by the original scripts, without a newline
    before = snapshot(state_dir)
    result = run_module(api_key, {"path": str(key_file)})
    assert result["changed"] is False
    assert result["fingerprint"] == fingerprint(KEY)
    assert snapshot(state_dir) == before


def test_regenerate_always_rotates(run_module, state_dir):
    key_file = state_dir / "api_key"
    write_key_file(key_file, f"{KEY}\n")
    result = run_module(api_key, {"path": str(key_file), "regenerate": "always"})
    assert result["changed"] is True
    new_key = stored_key(key_file)
    assert new_key != KEY
    assert result["fingerprint"] == fingerprint(new_key) != fingerprint(KEY)
    assert key_file.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o400])
def test_wrong_mode_is_fixed_and_the_key_kept(run_module, state_dir, mode):
    key_file = state_dir / "api_key"
    write_key_file(key_file, f"{KEY}\n", mode)
    mtime = key_file.stat().st_mtime_ns
    result = run_module(api_key, {"path": str(key_file)})
    assert result["changed"] is True
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.read_text() == f"{KEY}\n"
    assert key_file.stat().st_mtime_ns == mtime
    assert run_module(api_key, {"path": str(key_file)})["changed"] is False


@pytest.mark.parametrize("content", ["", "\n", "  \n"])
def test_blank_file_gets_a_new_key(run_module, state_dir, content):
    key_file = state_dir / "api_key"
    write_key_file(key_file, content, 0o644)
    result = run_module(api_key, {"path": str(key_file)})
    assert result["changed"] is True
    assert result["fingerprint"] == fingerprint(stored_key(key_file))
    assert key_file.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("regenerate", ["never", "always"])
@pytest.mark.parametrize(
    "content",
    [
        "my key with spaces inside it ok-ok-ok-ok",
        "abc+def/ghi=jklmnopqrstuvwxyz0123456789",
        "tooshort",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx user@host\n",
    ],
    ids=["whitespace", "std-base64", "short", "not-a-key"],
)
def test_invalid_content_fails_without_touching_the_file(run_module, state_dir, content, regenerate):
    key_file = state_dir / "api_key"
    write_key_file(key_file, content, 0o644)
    env_file = state_dir / "rank.env"
    before = snapshot(state_dir)
    result = run_module(api_key, {"path": str(key_file), "regenerate": regenerate, "env_file": str(env_file)})
    assert result.failed
    assert str(key_file) in result["msg"]
    assert "URL-safe base64" in result["msg"]
    output = json.dumps(result)
    assert not [
        piece for piece in re.split(r"[^A-Za-z0-9_-]+", content) if len(piece) >= 8 and piece in output
    ]
    assert snapshot(state_dir) == before


def test_missing_directory_fails_clearly(run_module, tmp_path):
    missing = tmp_path / "absent"
    result = run_module(api_key, {"path": str(missing / "api_key")})
    assert result.failed
    assert str(missing) in result["msg"] and "does not exist" in result["msg"]
    assert not missing.exists()


def test_missing_env_file_directory_fails_before_the_key_is_written(run_module, state_dir, tmp_path):
    result = run_module(
        api_key, {"path": str(state_dir / "api_key"), "env_file": str(tmp_path / "etc" / "rank.env")}
    )
    assert result.failed and "env_file" in result["msg"]
    assert list(state_dir.iterdir()) == []


@pytest.mark.parametrize("env_var", ["1VAR", "VLLM API KEY", "X=Y"])
def test_invalid_env_var_name_fails(run_module, state_dir, env_var):
    result = run_module(api_key, {"path": str(state_dir / "api_key"), "env_var": env_var})
    assert result.failed and "env_var" in result["msg"]


def test_env_file_written_then_unchanged(run_module, state_dir):
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    write_key_file(key_file, f"{KEY}\n")
    first = run_module(api_key, {"path": str(key_file), "env_file": str(env_file)})
    assert first["changed"] is True
    assert first["env_file"] == str(env_file)
    assert env_file.read_text() == f"VLLM_API_KEY={KEY}\n"
    assert env_file.stat().st_mode & 0o777 == 0o600

    before = snapshot(state_dir)
    second = run_module(api_key, {"path": str(key_file), "env_file": str(env_file)})
    assert second["changed"] is False
    assert snapshot(state_dir) == before


@pytest.mark.parametrize(
    ("existing", "mode"),
    [
        ("VLLM_API_KEY=stale-key-from-an-earlier-rotation-xxxxxxxx\n", 0o600),
        (f"VLLM_API_KEY={KEY}", 0o600),  # no final newline
        (f"VLLM_API_KEY={KEY}\n", 0o644),  # right content, readable by others
    ],
    ids=["stale-key", "no-newline", "wrong-mode"],
)
def test_env_file_is_repaired(run_module, state_dir, existing, mode):
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    write_key_file(key_file, f"{KEY}\n")
    env_file.write_text(existing)
    env_file.chmod(mode)
    result = run_module(api_key, {"path": str(key_file), "env_file": str(env_file)})
    assert result["changed"] is True
    assert env_file.read_text() == f"VLLM_API_KEY={KEY}\n"
    assert env_file.stat().st_mode & 0o777 == 0o600


def test_env_file_follows_rotation_and_custom_variable(run_module, state_dir):
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    write_key_file(key_file, f"{KEY}\n")
    args = {"path": str(key_file), "env_file": str(env_file), "env_var": "DSV41_API_KEY"}
    run_module(api_key, args)
    run_module(api_key, {**args, "regenerate": "always"})
    assert env_file.read_text() == f"DSV41_API_KEY={stored_key(key_file)}\n"


@pytest.mark.parametrize(
    "prepare",
    ["nothing", "valid-key", "wrong-mode", "env-file-stale"],
)
def test_check_mode_changes_nothing(run_module, state_dir, prepare):
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    if prepare != "nothing":
        write_key_file(key_file, f"{KEY}\n", 0o644 if prepare == "wrong-mode" else 0o600)
    if prepare == "env-file-stale":
        env_file.write_text("VLLM_API_KEY=old\n")
    before = snapshot(state_dir)
    result = run_module(api_key, {"path": str(key_file), "env_file": str(env_file)}, check_mode=True)
    assert result["changed"] is True
    assert snapshot(state_dir) == before
    expected_fingerprint = None if prepare == "nothing" else fingerprint(KEY)
    assert result["fingerprint"] == expected_fingerprint


def test_check_mode_before_the_directories_are_created_says_a_key_would_be_made(run_module, tmp_path):
    """A check-mode run on a fresh node: the role's task before would create the directories."""
    key_file, env_file = tmp_path / "state" / "api_key", tmp_path / "etc" / "rank.env"
    result = run_module(api_key, {"path": str(key_file), "env_file": str(env_file)}, check_mode=True)
    assert not result.failed, result
    assert (result["changed"], result["fingerprint"]) == (True, None)
    assert list(tmp_path.iterdir()) == []


def test_check_mode_reports_no_change_when_all_is_in_place(run_module, state_dir):
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    args = {"path": str(key_file), "env_file": str(env_file)}
    run_module(api_key, args)
    assert run_module(api_key, args, check_mode=True)["changed"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_owner_and_group_for_both_files_with_env_file_override(run_module, state_dir):
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    args = {
        "path": str(key_file),
        "owner": "nobody",
        "group": "nogroup",
        "env_file": str(env_file),
        "env_file_owner": "root",
    }
    result = run_module(api_key, args)
    assert (result["owner"], result["group"]) == ("nobody", "nogroup")
    assert (key_file.stat().st_uid, key_file.stat().st_gid) == (65534, 65534)
    assert (env_file.stat().st_uid, env_file.stat().st_gid) == (0, 65534)
    assert run_module(api_key, args)["changed"] is False

    os.chown(key_file, 0, 0)
    fixed = run_module(api_key, args)
    assert fixed["changed"] is True
    assert key_file.stat().st_uid == 65534


def test_key_never_reaches_stdout(capsys, state_dir):
    """The raw module output, including the echoed invocation, holds no trace of the key."""
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    args = {"path": str(key_file), "env_file": str(env_file), "regenerate": "always", "_ansible_diff": True}
    write_key_file(key_file, f"{KEY}\n")
    outputs, keys = [], [KEY]
    for _ in range(2):
        with patch_module_args(args), pytest.raises(SystemExit):
            api_key.main()
        captured = capsys.readouterr()
        outputs.append(captured.out + captured.err)
        keys.append(stored_key(key_file))
    assert len(set(keys)) == 3
    for output in outputs:
        assert '"changed": true' in output
        for key in keys:
            assert key not in output


@pytest.mark.parametrize("option", ["env_file_owner", "env_file_group"])
def test_env_file_ownership_needs_an_env_file(run_module, state_dir, option):
    result = run_module(api_key, {"path": str(state_dir / "api_key"), option: "root"})
    assert result.failed and "env_file" in result["msg"]
    assert list(state_dir.iterdir()) == []


@pytest.mark.parametrize(("mode", "bits"), [("0640", 0o640), ("u=rw,g=r,o=", 0o640), (0o400, 0o400)])
def test_mode_option_sets_the_key_file_only(run_module, state_dir, mode, bits):
    key_file = state_dir / "api_key"
    env_file = state_dir / "rank.env"
    args = {"path": str(key_file), "env_file": str(env_file), "mode": mode}
    first = run_module(api_key, args)
    assert first["changed"] is True and first["mode"] == f"{bits:04o}"
    assert key_file.stat().st_mode & 0o777 == bits
    assert env_file.stat().st_mode & 0o777 == 0o600, "the env file stays root-only"

    before = snapshot(state_dir)
    assert run_module(api_key, args, check_mode=True)["changed"] is False
    second = run_module(api_key, args)
    assert second["changed"] is False and second["mode"] == f"{bits:04o}"
    assert snapshot(state_dir) == before


def test_changed_mode_option_is_applied_in_place_and_check_mode_only_reports_it(run_module, state_dir):
    key_file = state_dir / "api_key"
    write_key_file(key_file, f"{KEY}\n")
    before = snapshot(state_dir)
    checked = run_module(api_key, {"path": str(key_file), "mode": "0640"}, check_mode=True)
    assert checked["changed"] is True and checked["mode"] == "0600"  # the file's mode as it is
    assert snapshot(state_dir) == before

    result = run_module(api_key, {"path": str(key_file), "mode": "0640"})
    assert result["changed"] is True and result["mode"] == "0640"
    assert key_file.read_text() == f"{KEY}\n"
    assert key_file.stat().st_mtime_ns == before["api_key"][1]


def test_a_new_key_file_in_check_mode_reports_the_requested_mode(run_module, state_dir):
    result = run_module(api_key, {"path": str(state_dir / "api_key")}, check_mode=True)
    assert (result["changed"], result["mode"]) == (True, "0600")
    assert list(state_dir.iterdir()) == []


@pytest.mark.parametrize("mode", ["rw-------", "0999"])
def test_an_invalid_mode_fails_before_the_key_is_written(run_module, state_dir, mode):
    result = run_module(api_key, {"path": str(state_dir / "api_key"), "mode": mode})
    assert result.failed and "mode must be in octal or symbolic form" in result["msg"]
    assert list(state_dir.iterdir()) == []


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_a_new_key_whose_owner_cannot_be_set_is_never_readable_by_others(run_module, state_dir, umask):
    """atomic_move gives a new file the umask's permissions; the key must not wait for its mode."""
    key_file = state_dir / "api_key"
    before = os.umask(umask)
    try:
        result = run_module(api_key, {"path": str(key_file), "owner": "no-such-user-dsv41"})
    finally:
        os.umask(before)
    assert result.failed and "no-such-user-dsv41" in result["msg"], result
    assert key_file.stat().st_mode & 0o777 == 0o600
