"""The deployment_release module, run in-process: plan, commit, fail; check mode and re-runs."""

from __future__ import annotations

import json
import stat

import yaml
from ansible_collections.sparkserve.dsv41.plugins.modules import deployment_release
from dir_snapshot import snapshot

OLD = "registry/engine@sha256:" + "a" * 64
NEW = "registry/engine@sha256:" + "b" * 64


def test_plan_commit_then_switch_and_roll_back(tmp_path, run_module):
    path = tmp_path / "deployments.json"
    first = run_module(deployment_release, {"path": str(path), "image": OLD})
    assert (first["changed"], first["plan"]["action"]) == (False, "first")
    assert not path.exists(), "planning writes nothing"

    made = run_module(
        deployment_release, {"path": str(path), "image": OLD, "state": "committed", "smoke": "passed"}
    )
    assert made["changed"] is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["current"]["image"] == OLD
    again = run_module(
        deployment_release, {"path": str(path), "image": OLD, "state": "committed", "smoke": "passed"}
    )
    assert again["changed"] is False, "a re-run records nothing new"
    assert set(yaml.safe_load(deployment_release.RETURN)) >= set(again) - {"changed", "invocation"}

    switch = run_module(deployment_release, {"path": str(path), "image": NEW})
    assert switch["plan"]["action"] == "switch" and switch["plan"]["current"]["image"] == OLD
    args = {"path": str(path), "image": NEW, "state": "committed", "smoke": "passed", "downtime_seconds": 4.5}
    run_module(deployment_release, args)
    record = json.loads(path.read_text())
    assert (record["current"]["image"], record["previous"]["image"]) == (NEW, OLD)
    assert record["current"]["downtime_seconds"] == 4.5

    back = run_module(deployment_release, {"path": str(path), "image": NEW, "rollback": True})
    assert (back["plan"]["action"], back["plan"]["target"]["image"]) == ("rollback", OLD)


def test_check_mode_and_diff_change_nothing_and_show_the_record(tmp_path, run_module):
    path = tmp_path / "deployments.json"
    run_module(deployment_release, {"path": str(path), "image": OLD, "state": "committed", "smoke": "passed"})
    before = snapshot(tmp_path)
    args = {"path": str(path), "image": NEW, "state": "failed", "reason": "the smoke checks failed: text"}
    result = run_module(deployment_release, args, check_mode=True, diff=True)
    assert result["changed"] is True
    assert '"reason": "the smoke checks failed: text"' in result["diff"]["after"]
    assert snapshot(tmp_path) == before


def test_bad_input_fails_before_anything_changes(tmp_path, run_module):
    path = tmp_path / "deployments.json"
    path.write_text("not json")
    before = snapshot(tmp_path)
    commit = {"path": str(path), "image": NEW, "state": "committed", "smoke": "ok"}
    broken = run_module(deployment_release, commit)
    assert broken.failed and broken["msg"].startswith(f"{path} is not JSON")
    assert snapshot(tmp_path) == before, "the unreadable record is left as it was"
    path.write_bytes(b"\xff\xfe")
    garbled = run_module(deployment_release, commit)
    assert garbled.failed and str(path) in garbled["msg"]
    path.unlink()
    nothing = run_module(deployment_release, {"path": str(path), "image": NEW, "rollback": True})
    assert nothing.failed and "no previous deployment is recorded" in nothing["msg"]
    missing = run_module(deployment_release, {"path": str(path), "image": NEW, "state": "failed"})
    assert missing.failed and "reason" in missing["msg"]
    assert not path.exists(), "a refused task writes no record"


def test_the_recipe_is_recorded_and_a_rollback_to_another_one_is_refused(tmp_path, run_module):
    path = tmp_path / "deployments.json"
    # A record written before entries named their recipe: the reference deployment.
    path.write_text(json.dumps({"version": 1, "current": {"image": OLD, "revision": "a" * 40}}))
    same = run_module(deployment_release, {"path": str(path), "image": OLD})
    assert (same["plan"]["action"], same["plan"]["no_rollback"]) == ("none", None)
    tiny = {"path": str(path), "image": NEW, "revision": "b" * 40, "recipe": "tiny-chat"}
    switch = run_module(deployment_release, tiny)
    assert switch["plan"]["action"] == "switch"
    assert "deployment_recipe=deepseek-v4.1-flash" in switch["plan"]["no_rollback"]
    run_module(deployment_release, {**tiny, "state": "committed", "smoke": "passed"})
    record = json.loads(path.read_text())
    assert (record["current"]["recipe"], record["previous"].get("recipe")) == ("tiny-chat", None)

    before = snapshot(tmp_path)
    refused = run_module(deployment_release, {**tiny, "rollback": True})
    assert refused.failed
    assert refused["msg"].startswith(
        "the previous deployment, registry/engine@sha256:aaaaaaaaaaaa, served recipe"
    )
    assert "run rollback.yml -e deployment_recipe=deepseek-v4.1-flash" in refused["msg"]
    assert snapshot(tmp_path) == before
    back = run_module(deployment_release, {"path": str(path), "image": NEW, "rollback": True})
    assert (back["plan"]["action"], back["plan"]["target"]["recipe"]) == ("rollback", "deepseek-v4.1-flash")
    assert "deployment_recipe=tiny-chat" in back["plan"]["no_rollback"]

    failed = {**tiny, "state": "failed", "reason": "the smoke checks failed: text", "recipe": "vllm-generic"}
    run_module(deployment_release, failed)
    assert json.loads(path.read_text())["last_failed"]["recipe"] == "vllm-generic"


def test_a_failed_switch_that_left_its_ranks_makes_going_back_a_switch(tmp_path, run_module):
    path = tmp_path / "deployments.json"
    tiny = {"path": str(path), "image": NEW, "revision": "b" * 40, "recipe": "tiny-chat"}
    run_module(deployment_release, {**tiny, "state": "committed", "smoke": "passed"})
    other = {"path": str(path), "image": OLD, "revision": "a" * 40, "recipe": "vllm-generic"}
    left = run_module(
        deployment_release, {**other, "state": "failed", "reason": "smoke", "left_serving": True}
    )
    assert left["changed"] and json.loads(path.read_text())["last_failed"]["left_serving"] is True
    back = run_module(deployment_release, tiny)
    assert back["plan"]["action"] == "switch" and back["plan"]["msg"].startswith("the ranks run ")
    passed = run_module(deployment_release, {**tiny, "state": "committed", "smoke": "passed"})
    assert passed["changed"] and "left_serving" not in json.loads(path.read_text())["last_failed"]
    assert run_module(deployment_release, tiny)["plan"]["action"] == "none"
