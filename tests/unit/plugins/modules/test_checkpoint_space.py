"""Tests of the checkpoint_space module, run in-process through ``run_module``."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils._space import GIB, space_shortfall
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


@pytest.mark.parametrize(
    ("need_gib", "present", "fails"),
    [
        (0, 0, False),
        (1e-6, 0, False),  # a few KiB: any test filesystem has them
        (1e6, 0, True),  # a petabyte: none has
        (1e6, 2048, True),
    ],
)
def test_a_need_beyond_the_free_space_fails_naming_the_variable(
    tmp_path, run_module, need_gib, present, fails
):
    model = tmp_path / "models" / "X"
    if present:
        model.mkdir(parents=True)
        (model / "shard").write_bytes(b"x" * present)
    result = run_module(
        checkpoint_space,
        {"path": str(model), "need_gib": need_gib, "variable": "checkpoint_min_free_gib_head"},
    )
    assert result.failed is fails, result
    if fails:
        assert "lower checkpoint_min_free_gib_head" in result["msg"]
        assert f"needs {need_gib:g} GiB" in result["msg"]
        assert result["present_bytes"] == present


def test_what_is_already_there_counts_towards_the_need(tmp_path):
    report = {"path": "/m/X", "measured_at": "/m", "free_bytes": GIB, "present_bytes": 9 * GIB}
    assert space_shortfall(report, 10, "v") is None
    message = space_shortfall(report, 10.5, "v")
    assert message == (
        "/m has 1.0 GiB free, but the checkpoint in /m/X needs 10.5 GiB (9.0 GiB of it already there), "
        "so 1.5 GiB more. Free some space, point the model directory at a larger disk, or lower v."
    )


def test_a_negative_need_is_refused(tmp_path, run_module):
    result = run_module(checkpoint_space, {"path": str(tmp_path), "need_gib": -1, "variable": "x"})
    assert result.failed and "x must be 0 or more" in result["msg"]
