"""Tests of the checkpoint_space module, run in-process through ``run_module``."""

from __future__ import annotations

import yaml
from ansible_collections.sparkserve.dsv41.plugins.modules import checkpoint_space
from dir_snapshot import snapshot


def test_a_directory_not_there_yet_is_measured_at_its_nearest_parent(tmp_path, run_module):
    result = run_module(checkpoint_space, {"path": str(tmp_path / "models" / "X")})
    assert not result.failed, result
    assert result["changed"] is False
    assert result["path"] == str(tmp_path / "models" / "X")
    assert result["measured_at"] == str(tmp_path)
    assert result["present_bytes"] == 0
    assert result["free_bytes"] > 0
    assert set(yaml.safe_load(checkpoint_space.RETURN)) == set(result) - {"changed", "invocation"}


def test_what_is_there_counts_regular_files_only(tmp_path, run_module):
    model = tmp_path / "models" / "X"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "f").write_bytes(b"x" * 1234)
    (model / "link").symlink_to(model / "sub" / "f")
    before = snapshot(tmp_path)
    result = run_module(checkpoint_space, {"path": str(model)}, check_mode=True)
    assert (result["measured_at"], result["present_bytes"]) == (str(model), 1234)
    assert snapshot(tmp_path) == before
