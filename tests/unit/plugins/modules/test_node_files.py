"""sparkserve.dsv41.node_files run in-process: a role's directories and files in one run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.modules import node_files
from dir_snapshot import snapshot

PROGRAM = "#!/usr/bin/env python3\nprint('guard')\n"
UNIT = "[Service]\nExecStart=/opt/sparkserve/dsv41_memguard.py\n"


def install_args(root: Path, program: str = PROGRAM, mode: str = "0755") -> dict:
    return {
        "directories": [
            {"path": str(root / "opt" / "sparkserve"), "mode": "0755"},
            {"path": str(root / "state"), "mode": "0700"},
        ],
        "files": [
            {"path": str(root / "opt" / "sparkserve" / "guard.py"), "content": program, "mode": mode},
            {"path": str(root / "state" / "guard.service"), "content": UNIT, "mode": "0644"},
        ],
    }


def mode_of(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_first_run_creates_directories_and_files_with_their_modes(run_module, tmp_path):
    result = run_module(node_files, install_args(tmp_path))
    assert result["changed"] is True
    program, unit = tmp_path / "opt" / "sparkserve" / "guard.py", tmp_path / "state" / "guard.service"
    assert result["changed_paths"] == [
        str(tmp_path / "opt" / "sparkserve"), str(tmp_path / "state"), str(program), str(unit)
    ]  # fmt: skip
    assert program.read_text() == PROGRAM and unit.read_text() == UNIT
    assert (mode_of(program), mode_of(unit), mode_of(tmp_path / "state")) == (0o755, 0o644, 0o700)
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_second_run_changes_nothing(run_module, tmp_path):
    run_module(node_files, install_args(tmp_path))
    before = snapshot(tmp_path)
    second = run_module(node_files, install_args(tmp_path), diff=True)
    assert second["changed"] is False and second["changed_paths"] == [] and "diff" not in second
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"program": PROGRAM + "print('new')\n"}, "guard.py"),
        ({"mode": "0700"}, "guard.py"),
    ],
    ids=["content", "mode"],
)
def test_only_what_differs_is_reported_and_changed(run_module, tmp_path, change, expected):
    run_module(node_files, install_args(tmp_path))
    unit = tmp_path / "state" / "guard.service"
    unit_before = unit.stat().st_mtime_ns
    result = run_module(node_files, install_args(tmp_path, **change), diff=True)
    assert result["changed"] is True
    assert [Path(p).name for p in result["changed_paths"]] == [expected]
    program = tmp_path / "opt" / "sparkserve" / "guard.py"
    assert program.read_text() == change.get("program", PROGRAM)
    assert mode_of(program) == int(change.get("mode", "0755"), 8)
    assert unit.stat().st_mtime_ns == unit_before
    if "program" in change:
        assert result["diff"][0]["before"] == PROGRAM and result["diff"][0]["after"] == change["program"]


def test_check_mode_reports_and_changes_nothing(run_module, tmp_path):
    before = snapshot(tmp_path)
    result = run_module(node_files, install_args(tmp_path), check_mode=True, diff=True)
    assert result["changed"] is True and len(result["changed_paths"]) == 4
    assert result["diff"][0]["before"]["state"] == "absent"
    assert result["diff"][2]["after"] == PROGRAM
    assert snapshot(tmp_path) == before

    run_module(node_files, install_args(tmp_path))
    before = snapshot(tmp_path)
    changed = run_module(node_files, install_args(tmp_path, program="other\n", mode="0700"), check_mode=True)
    assert [Path(p).name for p in changed["changed_paths"]] == ["guard.py"]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("taken", ["directory", "file"])
def test_a_path_of_the_other_kind_fails_before_anything_changes(run_module, tmp_path, taken):
    args = install_args(tmp_path)
    if taken == "directory":
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / "guard.service").mkdir()
    else:
        (tmp_path / "state").write_text("not a directory\n")
    before = snapshot(tmp_path)
    result = run_module(node_files, args)
    assert result.failed
    taken_path = tmp_path / "state" / ("guard.service" if taken == "directory" else "")
    assert result["msg"].startswith(f"{str(taken_path).rstrip('/')} ")
    assert snapshot(tmp_path) == before


def test_a_file_whose_directory_is_neither_there_nor_listed_fails(run_module, tmp_path):
    result = run_module(
        node_files, {"files": [{"path": str(tmp_path / "missing" / "guard.py"), "content": PROGRAM}]}
    )
    assert result.failed
    missing = tmp_path / "missing"
    assert result["msg"] == (
        f"the directory of {missing}/guard.py does not exist: {missing}; add it to directories"
    )
    assert not (tmp_path / "missing").exists()


def test_missing_parents_get_the_directory_s_mode(run_module, tmp_path):
    deep = tmp_path / "home" / ".local" / "state"
    result = run_module(node_files, {"directories": [{"path": str(deep), "mode": "0700"}]})
    assert result["changed_paths"] == [str(deep)]
    assert [mode_of(p) for p in (tmp_path / "home", tmp_path / "home" / ".local", deep)] == [0o700] * 3


def test_a_directory_given_twice_counts_once(run_module, tmp_path):
    entry = {"path": str(tmp_path / "etc" / "sparkserve"), "mode": "0755"}
    result = run_module(node_files, {"directories": [entry, dict(entry)]})
    assert result["changed_paths"] == [entry["path"]]


def test_the_same_directory_twice_with_other_attributes_fails_before_anything_changes(run_module, tmp_path):
    path = str(tmp_path / "state")
    result = run_module(
        node_files, {"directories": [{"path": path, "mode": "0700"}, {"path": path, "mode": "0755"}]}
    )
    assert result.failed and f"directories lists {path} twice with other attributes" in result["msg"]
    assert not (tmp_path / "state").exists()


def test_a_directory_that_is_a_link_gets_the_attributes_on_its_target(run_module, tmp_path):
    target = tmp_path / "real-state"
    target.mkdir(mode=0o755)
    link = tmp_path / "state"
    link.symlink_to(target)
    result = run_module(node_files, {"directories": [{"path": str(link), "mode": "0700"}]})
    assert result["changed_paths"] == [str(link)]
    assert mode_of(target) == 0o700 and link.is_symlink()
    assert run_module(node_files, {"directories": [{"path": str(link), "mode": "0700"}]})["changed"] is False


def test_owner_and_group_are_set_when_they_differ(run_module, tmp_path):
    # Root (CI, the lab) can give the file to nobody; another user only to itself.
    owner = 65534 if os.geteuid() == 0 else os.geteuid()
    (tmp_path / "unit").write_text(UNIT)
    args = {
        "files": [{"path": str(tmp_path / "unit"), "content": UNIT, "owner": str(owner), "group": str(owner)}]
    }
    first = run_module(node_files, args)
    assert first["changed"] is (owner != os.geteuid())
    assert ((tmp_path / "unit").stat().st_uid, (tmp_path / "unit").stat().st_gid) == (owner, owner)
    assert run_module(node_files, args)["changed"] is False


TOKEN = "hf_dsv41SecretTokenValue"


def secret_args(root: Path, content: str = TOKEN) -> dict:
    return {
        "directories": [{"path": str(root / "state"), "mode": "0700"}],
        "secret_files": [{"path": str(root / "state" / "hf-token"), "content": content}],
    }


@pytest.mark.parametrize(
    "case",
    [
        (None, TOKEN, True),  # first run
        (TOKEN, TOKEN, False),  # re-run
        ("hf_anOlderToken", TOKEN, True),  # rotated
        (TOKEN, "", True),  # unset: an empty file, which the hub client reads as no token
    ],
    ids=["first-run", "re-run", "rotated", "unset"],
)
@pytest.mark.parametrize("check_mode", [False, True])
def test_a_secret_file_is_written_0600_and_its_content_never_shown(run_module, tmp_path, case, check_mode):
    before, content, changed = case
    token_file = tmp_path / "state" / "hf-token"
    if before is not None:
        run_module(node_files, secret_args(tmp_path, before))
    snapshot_before = snapshot(tmp_path)
    result = run_module(node_files, secret_args(tmp_path, content), check_mode=check_mode, diff=True)
    assert not result.failed, result
    assert result["changed"] is changed
    shown = repr(result)
    assert TOKEN not in shown and "hf_anOlderToken" not in shown
    if changed:
        shown_after = [entry["after"] for entry in result["diff"]]
        assert shown_after.count(node_files.REDACTED_AFTER) == 1, result["diff"]
    if check_mode:
        assert snapshot(tmp_path) == snapshot_before
    else:
        assert token_file.read_text() == content
        assert mode_of(token_file) == 0o600
    again = run_module(node_files, secret_args(tmp_path, content), check_mode=check_mode)
    assert again["changed"] is (changed and check_mode)


# `systemctl show --property=Id,LoadState,ActiveState,UnitFileState dsv41-memguard.service` on the
# lab's head, the guard running.
MEMGUARD_SHOWN = "Id=dsv41-memguard.service\nLoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
SYSTEMCTL = "/usr/bin/systemctl"


@pytest.fixture
def systemctl(monkeypatch):
    """A systemctl that answers as given; records the commands it ran."""
    state = {"installed": True, "answer": (0, MEMGUARD_SHOWN, ""), "ran": []}

    def run_command(self, args, **kwargs):
        state["ran"].append(list(args))
        return state["answer"]

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return SYSTEMCTL if name == "systemctl" and state["installed"] else None

    monkeypatch.setattr(node_files.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(node_files.AnsibleModule, "get_bin_path", get_bin_path)
    return state


@pytest.mark.parametrize("check_mode", [False, True])
def test_the_units_are_read_once_after_the_files(run_module, systemctl, tmp_path, check_mode):
    args = {**install_args(tmp_path), "units": [{"name": "dsv41-memguard.service"}]}
    result = run_module(node_files, args, check_mode=check_mode)
    assert not result.failed, result
    assert result["changed"] is True
    assert result["units"] == {
        "dsv41-memguard.service": {
            "load_state": "loaded",
            "active_state": "active",
            "unit_file_state": "enabled",
            "as_asked": True,
        }
    }
    assert systemctl["ran"] == [
        [SYSTEMCTL, "show", "--property=Id,LoadState,ActiveState,UnitFileState", "dsv41-memguard.service"]
    ]


# The supervisor stopped and disabled by hand, on the lab's head.
SUPERVISOR_SHOWN = (
    "Id=dsv41-supervisor.service\nLoadState=loaded\nActiveState=inactive\nUnitFileState=disabled\n"
)


@pytest.mark.parametrize(("enabled", "as_asked"), [(True, False), (False, True)])
def test_a_unit_is_as_asked_when_systemd_reports_what_the_role_wants(
    run_module, systemctl, tmp_path, enabled, as_asked
):
    systemctl["answer"] = (0, SUPERVISOR_SHOWN, "")
    units = [{"name": "dsv41-supervisor.service", "enabled": enabled}]
    result = run_module(node_files, {**install_args(tmp_path), "units": units})
    assert result["units"]["dsv41-supervisor.service"]["as_asked"] is as_asked


def test_without_units_systemctl_is_not_asked(run_module, systemctl, tmp_path):
    result = run_module(node_files, install_args(tmp_path))
    assert result["units"] == {}
    assert systemctl["ran"] == []


@pytest.mark.parametrize(
    "case",
    [
        pytest.param((False, (0, "", ""), "systemctl: command not found"), id="no-systemctl"),
        pytest.param(
            (
                True,
                (1, "", "Failed to connect to bus: No such file or directory"),
                "Failed to connect to bus",
            ),
            id="no-bus",
        ),
        pytest.param((True, (0, "", ""), "systemctl show answered 0 unit(s) for 1"), id="no-answer"),
    ],
)
def test_units_systemd_cannot_report_fail_naming_why_and_what_changed(run_module, systemctl, tmp_path, case):
    installed, answer, message = case
    systemctl.update(installed=installed, answer=answer)
    result = run_module(node_files, {**install_args(tmp_path), "units": [{"name": "dsv41-memguard.service"}]})
    assert result.failed
    assert message in result["msg"]
    # The files were written before the units were read: the result says so.
    assert result["changed"] is True
    assert str(tmp_path / "state" / "guard.service") in result["changed_paths"]


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_a_new_secret_file_whose_group_cannot_be_set_is_never_readable_by_others(run_module, tmp_path, umask):
    """atomic_move gives a new file the umask's permissions; the secret must not wait for its mode."""
    args = secret_args(tmp_path)
    args["secret_files"][0]["group"] = "no-such-group-dsv41"
    token_file = tmp_path / "state" / "hf-token"
    before = os.umask(umask)
    try:
        result = run_module(node_files, args)
        assert os.umask(umask) == umask, "the module's umask is given back"
    finally:
        os.umask(before)
    assert result.failed and "no-such-group-dsv41" in result["msg"], result
    assert mode_of(token_file) == 0o600


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_a_new_file_without_a_mode_gets_the_umasks_permissions(run_module, tmp_path, umask):
    target = tmp_path / "notes"
    before = os.umask(umask)
    try:
        result = run_module(node_files, {"files": [{"path": str(target), "content": "x\n"}]})
    finally:
        os.umask(before)
    assert not result.failed, result
    assert mode_of(target) == 0o666 & ~umask


def test_a_rename_that_fails_names_the_file_and_the_cause(run_module, tmp_path, monkeypatch):
    def refuse(self, src, dest, unsafe_writes=False, keep_dest_attrs=True):
        denied = PermissionError(13, "Permission denied")
        raise Exception(f"Could not replace {dest!r} with {src!r}.") from denied

    monkeypatch.setattr(node_files.AnsibleModule, "atomic_move", refuse)
    target = tmp_path / "unit"
    result = run_module(node_files, {"files": [{"path": str(target), "content": UNIT, "mode": "0644"}]})
    assert result.failed, result
    assert str(target) in result["msg"] and "Permission denied" in result["msg"], result["msg"]
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == [], "no temporary file left behind"
