"""The one atomic writer every module and the checkpoint code use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._files import write_atomically


class FakeModule:
    """Records ``atomic_move`` calls and moves like it does for a new file (umask permissions)."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, str]] = []

    def atomic_move(self, src: str, dest: str) -> None:
        self.moves.append((src, dest))
        os.replace(src, dest)
        os.chmod(dest, 0o644)


@pytest.mark.parametrize("use_module", [False, True], ids=["os.replace", "atomic_move"])
@pytest.mark.parametrize("existing", [None, b"old content\n"], ids=["new", "replace"])
@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_write_atomically(tmp_path: Path, use_module, existing, mode):
    target = tmp_path / "file.json"
    if existing is not None:
        target.write_bytes(existing)
        target.chmod(0o666)
    module = FakeModule() if use_module else None
    write_atomically(module, str(target), b"new\n", mode)
    assert target.read_bytes() == b"new\n"
    assert target.stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["file.json"]  # no temporary file left
    if module is not None:
        ((src, dest),) = module.moves
        assert dest == str(target)
        assert os.path.dirname(src) == str(tmp_path)  # same directory, so the rename is atomic


def test_failed_move_leaves_the_old_file_and_no_temporary(tmp_path: Path):
    target = tmp_path / "settings.json"
    target.write_bytes(b"keep me\n")

    class FailingModule:
        def atomic_move(self, src: str, dest: str) -> None:
            raise OSError(28, "No space left on device", dest)

    with pytest.raises(OSError, match="No space left"):
        write_atomically(FailingModule(), str(target), b"lost\n", 0o600)
    assert target.read_bytes() == b"keep me\n"
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]
