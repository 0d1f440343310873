"""The deployment record (``_release``): planning a run, committing a switch, recording a failure."""

from __future__ import annotations

import json

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _release as rel

OLD = "registry/engine@sha256:" + "a" * 64
NEW = "registry/engine@sha256:" + "b" * 64
NOW = 1_800_000_000.0


def deployed(image: str, **extra) -> dict:
    return {
        "image": image,
        "revision": "",
        "time": NOW - 3600,
        "smoke": "passed",
        "downtime_seconds": None,
        **extra,
    }


def test_no_file_is_an_empty_record_and_a_record_survives_its_text():
    assert rel.parse_record(None, "/r.json") == rel.empty_record()
    record = {**rel.empty_record(), "current": deployed(OLD)}
    assert rel.parse_record(rel.record_text(record), "/r.json") == record


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "/r.json is not JSON"),
        (json.dumps({"version": 9}), "/r.json is not a version 1 deployment record"),
        (json.dumps({"version": 1, "current": {"revision": "x"}}), "/r.json: current is not a deployment"),
    ],
)
def test_a_record_that_is_not_one_is_refused_naming_the_file(text, message):
    with pytest.raises(rel.ReleaseError, match=message):
        rel.parse_record(text, "/r.json")


@pytest.mark.parametrize(
    ("current", "image", "action"),
    [(None, NEW, "first"), (deployed(OLD), OLD, "none"), (deployed(OLD), NEW, "switch")],
)
def test_a_run_switches_when_the_image_differs_from_the_current_one(current, image, action):
    planned = rel.plan({**rel.empty_record(), "current": current}, image, "")
    assert planned["action"] == action
    assert planned["target"] == {"image": image, "revision": ""}
    assert planned["current"] == current


@pytest.mark.parametrize(
    ("current_revision", "revision", "action", "target_revision"),
    [
        # A new revision switches, with the image unchanged.
        ("a" * 40, "b" * 40, "switch", "b" * 40),
        ("a" * 40, "a" * 40, "none", "a" * 40),
        # A run that does not fetch the checkpoint (None) keeps the revision that serves.
        ("a" * 40, None, "none", "a" * 40),
        # A deployment recorded before revisions: the first resolved revision is a switch (the ranks
        # move to its directory).
        ("", "a" * 40, "switch", "a" * 40),
    ],
)
def test_a_run_switches_when_the_revision_differs(current_revision, revision, action, target_revision):
    record = {**rel.empty_record(), "current": {**deployed(OLD), "revision": current_revision}}
    planned = rel.plan(record, OLD, revision)
    assert (planned["action"], planned["target"]) == (action, {"image": OLD, "revision": target_revision})


def test_with_nothing_recorded_an_unknown_revision_is_empty():
    assert rel.plan(rel.empty_record(), NEW, None)["target"] == {"image": NEW, "revision": ""}


def test_a_rollback_targets_the_previous_deployment_and_needs_one():
    record = {**rel.empty_record(), "current": deployed(NEW), "previous": deployed(OLD)}
    planned = rel.plan(record, NEW, "", rollback=True)
    assert (planned["action"], planned["target"]["image"]) == ("rollback", OLD)
    assert planned["msg"].startswith("rolling back from registry/engine@sha256:bbbbbbbbbbbb")
    with pytest.raises(rel.ReleaseError, match="no previous deployment is recorded"):
        rel.plan({**rel.empty_record(), "current": deployed(NEW)}, NEW, "", rollback=True)


def test_a_passed_switch_makes_the_old_current_the_previous_and_a_rerun_changes_nothing():
    record = {**rel.empty_record(), "current": deployed(OLD)}
    after = rel.committed(record, {"image": NEW}, smoke="passed", downtime_seconds=12.5, now=NOW)
    assert after["current"] == {
        "image": NEW,
        "revision": "",
        "time": NOW,
        "smoke": "passed",
        "downtime_seconds": 12.5,
    }
    assert after["previous"] == deployed(OLD)
    assert rel.committed(after, {"image": NEW}, smoke="passed", downtime_seconds=None, now=NOW + 1) == after


def test_a_rollback_swaps_current_and_previous():
    record = {**rel.empty_record(), "current": deployed(NEW), "previous": deployed(OLD)}
    after = rel.committed(record, {"image": OLD}, smoke="passed", downtime_seconds=3.0, now=NOW)
    assert (after["current"]["image"], after["previous"]["image"]) == (OLD, NEW)


def test_a_failed_switch_keeps_current_and_previous():
    record = {**rel.empty_record(), "current": deployed(OLD), "previous": None}
    after = rel.failed(record, {"image": NEW}, reason="the smoke checks failed: text", now=NOW)
    assert (after["current"], after["previous"]) == (record["current"], None)
    assert after["last_failed"] == {
        "image": NEW,
        "revision": "",
        "time": NOW,
        "reason": "the smoke checks failed: text",
    }


def test_a_deployment_in_words():
    words = rel.describe(deployed(OLD, downtime_seconds=4.25))
    assert words == (
        "registry/engine@sha256:aaaaaaaaaaaa, since 2027-01-15 07:00:00 UTC, smoke passed, switched in 4.2 s"
    )
    assert rel.describe(None) == "none recorded"
