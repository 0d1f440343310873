"""The file helpers every module and the checkpoint code use: read, parse, plan, write atomically."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    ENV_VAR_NAME,
    FileContentError,
    TextFilePlan,
    current_mode,
    dump_json,
    json_type_name,
    load_json_object,
    missing_parent_dir,
    mode_text,
    plan_directory,
    plan_text_file,
    read_bytes,
    read_text,
    write_atomically,
)


@pytest.fixture
def module(monkeypatch) -> Iterator[AnsibleModule]:
    """A real AnsibleModule with the file options; ``module.moves`` records its ``atomic_move`` calls."""
    with patch_module_args({}):
        ansible_module = AnsibleModule(argument_spec={}, add_file_common_args=True)
        moves: list[tuple[str, str]] = []
        atomic_move = ansible_module.atomic_move

        def recording_move(src: str, dest: str, **kwargs) -> None:
            moves.append((src, dest))
            atomic_move(src, dest, **kwargs)

        monkeypatch.setattr(ansible_module, "atomic_move", recording_move)
        ansible_module.moves = moves
        yield ansible_module  # fail_json needs the patched arguments' context


# --------------------------------------------------------------------------- writing


@pytest.mark.parametrize("existing", [None, b"old content\n"], ids=["new", "replace"])
@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_write_atomically_without_a_module_keeps_the_mode(tmp_path: Path, existing, mode):
    target = tmp_path / "file.json"
    if existing is not None:
        target.write_bytes(existing)
        target.chmod(0o666)
    write_atomically(None, str(target), b"new\n", mode)
    assert target.read_bytes() == b"new\n"
    assert target.stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["file.json"]  # no temporary file left


@pytest.mark.parametrize("mode", ["0640", 0o600, "u=rw,g=r,o="])
def test_write_atomically_with_a_module_moves_from_the_same_directory(tmp_path: Path, module, mode):
    target = tmp_path / "file.json"
    write_atomically(module, str(target), b"new\n", mode)
    assert target.read_bytes() == b"new\n"
    ((src, dest),) = module.moves
    assert dest == str(target)
    assert os.path.dirname(src) == str(tmp_path)  # same directory, so the rename is atomic
    assert [p.name for p in tmp_path.iterdir()] == ["file.json"]


@pytest.mark.parametrize(
    ("old", "mode", "expected"),
    [
        pytest.param(0o604, "0640", (0o600, True), id="looser-for-others-tighter-for-the-group"),
        pytest.param(0o644, "0600", (0o600, False), id="a-key-over-a-readable-file"),
        pytest.param(0o600, "0640", (0o600, True), id="tighter-file-kept-until-applied"),
        pytest.param(0o644, "u=rw,g=r,o=", (0o640, False), id="symbolic-mode"),
    ],
)
def test_with_a_module_the_new_content_is_never_looser_than_the_old_file_or_the_mode(
    tmp_path: Path, module, old, mode, expected
):
    """atomic_move gives the new content the old file's mode until the caller applies ``mode``: the
    old file first loses what ``mode`` does not allow, so the content is never readable by more."""
    target = tmp_path / "settings.json"
    target.write_bytes(b"old\n")
    target.chmod(old)
    seen: list[int] = []
    real_move = module.atomic_move

    def looking_move(src: str, dest: str, **kwargs) -> None:
        real_move(src, dest, **kwargs)
        seen.append(os.stat(dest).st_mode & 0o777)

    module.atomic_move = looking_move
    write_atomically(module, str(target), b"new\n", mode)
    moved, applied = expected
    assert seen == [moved]
    file_args = module.load_file_common_arguments({"mode": mode}, path=str(target))
    assert module.set_fs_attributes_if_different(file_args, False) is applied
    assert module.set_fs_attributes_if_different(file_args, False) is False


def test_with_a_module_a_link_is_replaced_and_its_target_left_alone(tmp_path: Path, module):
    outside = tmp_path / "outside"
    outside.write_bytes(b"not ours\n")
    outside.chmod(0o644)
    target = tmp_path / "api_key"
    target.symlink_to(outside)
    write_atomically(module, str(target), b"secret\n", "0600")
    assert not target.is_symlink() and target.read_bytes() == b"secret\n"
    assert outside.read_bytes() == b"not ours\n" and outside.stat().st_mode & 0o777 == 0o644


def test_the_temporary_file_is_never_readable_by_others(tmp_path: Path, module, monkeypatch):
    target = tmp_path / "api_key"
    seen: list[int] = []
    real_move = module.atomic_move

    def looking_move(src: str, dest: str, **kwargs) -> None:
        seen.append(os.stat(src).st_mode & 0o777)
        real_move(src, dest, **kwargs)

    monkeypatch.setattr(module, "atomic_move", looking_move)
    write_atomically(module, str(target), b"secret\n", None)  # no mode: mkstemp's 0600
    write_atomically(module, str(target), b"secret\n", "0640")
    assert seen == [0o600, 0o640]


@pytest.mark.parametrize("mode", ["rw-r--r--", "0999"])
def test_an_invalid_mode_fails_the_module_before_the_target_is_touched(tmp_path: Path, module, capsys, mode):
    target = tmp_path / "plan.json"
    with pytest.raises(SystemExit):
        write_atomically(module, str(target), b"new\n", mode)
    assert "mode must be in octal or symbolic form" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert module.moves == []


def test_failed_move_leaves_the_old_file_and_no_temporary(tmp_path: Path, module, monkeypatch):
    target = tmp_path / "settings.json"
    target.write_bytes(b"keep me\n")

    def failing_move(src: str, dest: str, **kwargs) -> None:
        raise OSError(28, "No space left on device", dest)

    monkeypatch.setattr(module, "atomic_move", failing_move)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(module, str(target), b"lost\n", 0o600)
    assert target.read_bytes() == b"keep me\n"
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]


def test_unsafe_writes_reaches_atomic_move(tmp_path: Path, module, monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(
        module, "atomic_move", lambda src, dest, **kwargs: (calls.append(kwargs), os.replace(src, dest))
    )
    module.params["unsafe_writes"] = True
    write_atomically(module, str(tmp_path / "f"), b"x", None)
    assert calls == [{"unsafe_writes": True}]


# --------------------------------------------------------------------------- reading


def test_read_bytes_and_text(tmp_path: Path):
    path = tmp_path / "f.txt"
    assert read_bytes(str(path)) is None
    assert read_text(str(path)) is None
    path.write_bytes("zwölf\n".encode())
    assert read_bytes(str(path)) == "zwölf\n".encode()
    assert read_text(str(path)) == "zwölf\n"


def test_read_text_refuses_undecodable_bytes_unless_lenient(tmp_path: Path):
    path = tmp_path / "copy.json"
    path.write_bytes(b'{"a": 1}\xff\n')
    with pytest.raises(FileContentError, match=rf"{path} is not UTF-8 text \(byte offset 8\)"):
        read_text(str(path))
    assert read_text(str(path), lenient=True) == '{"a": 1}\ufffd\n'


def test_read_errors_other_than_absence_propagate(tmp_path: Path):
    with pytest.raises(IsADirectoryError):
        read_bytes(str(tmp_path))


def test_current_mode_and_mode_text(tmp_path: Path):
    path = tmp_path / "f"
    assert current_mode(str(path)) is None
    assert mode_text(str(path), "0600") == "0600"  # requested, as given, while there is no file
    assert mode_text(str(path), 0o640) == "0640"
    assert mode_text(str(path), "u=rw") == "u=rw"
    path.write_text("x")
    path.chmod(0o604)
    assert current_mode(str(path)) == 0o604
    assert mode_text(str(path), "0600") == "0604"  # the file's own once it exists


def test_missing_parent_dir(tmp_path: Path):
    assert missing_parent_dir(str(tmp_path / "f")) is None
    assert missing_parent_dir(str(tmp_path / "absent" / "f")) == str(tmp_path / "absent")
    (tmp_path / "file").write_text("")
    assert missing_parent_dir(str(tmp_path / "file" / "f")) == str(tmp_path / "file")


# --------------------------------------------------------------------------- JSON and plans


def test_load_json_object():
    assert load_json_object("p.json", '{"b": 1, "a": [true]}') == {"b": 1, "a": [True]}
    assert load_json_object("p.json", "  \n", empty_ok=True) == {}
    with pytest.raises(
        FileContentError, match=r"p\.json is not valid JSON: Expecting value at line 2 column 1"
    ):
        load_json_object("p.json", "  \n")
    with pytest.raises(FileContentError, match=r"line 2 column 1 \(character 9\); fix or move the file"):
        load_json_object("p.json", '{"a": 1,\n}')
    with pytest.raises(
        FileContentError, match=r"p\.json must hold a JSON object at the top level, found an array"
    ):
        load_json_object("p.json", "[1]")


def test_dump_json_keeps_key_order_and_text():
    assert dump_json({"z": 1, "a": "ü"}) == '{\n  "z": 1,\n  "a": "ü"\n}\n'


@pytest.mark.parametrize(
    ("value", "name"),
    [(None, "null"), (True, "a boolean"), (3, "a number"), (2.5, "a number"), ("x", "a string"),
     ([], "an array"), ({}, "an object"), (b"x", "bytes")],
)  # fmt: skip
def test_json_type_name(value, name):
    assert json_type_name(value) == name


def test_text_file_plan():
    new = TextFilePlan("/p", None, "after\n")
    assert new.changed
    assert new.diff() == {
        "before_header": "/p (absent)",
        "after_header": "/p",
        "before": "",
        "after": "after\n",
    }
    same = TextFilePlan("/p", "x\n", "x\n")
    assert not same.changed
    shown = TextFilePlan("/p", "secret\n", "other\n").diff(before="***", after="+++")
    assert (shown["before_header"], shown["before"], shown["after"]) == ("/p", "***", "+++")


@pytest.mark.parametrize(
    ("name", "valid"), [("VLLM_API_KEY", True), ("_x1", True), ("1X", False), ("A B", False)]
)
def test_env_var_name(name, valid):
    assert bool(ENV_VAR_NAME.fullmatch(name)) is valid


@pytest.mark.parametrize(("present", "expected"), [(None, True), ("directory", False)])
def test_plan_directory_creates_only_what_is_missing(tmp_path, present, expected):
    path = tmp_path / "state"
    if present:
        path.mkdir()
    plan = plan_directory(str(path))
    assert (plan.path, plan.exists, plan.changed) == (str(path), not expected, expected)


def test_plan_directory_refuses_a_file_in_its_place(tmp_path):
    (tmp_path / "state").write_text("x")
    with pytest.raises(FileContentError, match="state exists and is not a directory"):
        plan_directory(str(tmp_path / "state"))


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        (None, "new\n", True),
        ("same\n", "same\n", False),
        ("old\n", "new\n", True),
        (b"\xff\n", "new\n", True),
    ],
    ids=["new", "same", "differs", "not-utf8"],
)
def test_plan_text_file_compares_the_whole_content(tmp_path, before, after, changed):
    path = tmp_path / "unit.service"
    if before is not None:
        path.write_bytes(before.encode() if isinstance(before, str) else before)
    plan = plan_text_file(str(path), after)
    assert plan.changed is changed and plan.after == after
    assert plan.before == (None if before is None else path.read_text(errors="replace"))


def test_plan_text_file_refuses_a_directory(tmp_path):
    with pytest.raises(FileContentError, match="is a directory"):
        plan_text_file(str(tmp_path), "x")
