"""The deployment record (``_release``): planning a run, committing a switch, recording a failure."""

from __future__ import annotations

import json

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _recipe
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
    assert planned["target"] == {"image": image, "revision": "", "recipe": rel.LEGACY_RECIPE}
    assert planned["current"] == current
    assert planned["no_rollback"] is None


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
    target = {"image": OLD, "revision": target_revision, "recipe": rel.LEGACY_RECIPE}
    assert (planned["action"], planned["target"]) == (action, target)


def test_with_nothing_recorded_an_unknown_revision_is_empty():
    target = {"image": NEW, "revision": "", "recipe": "tiny-chat"}
    assert rel.plan(rel.empty_record(), NEW, None, recipe="tiny-chat")["target"] == target


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
        "recipe": rel.LEGACY_RECIPE,
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
        "recipe": rel.LEGACY_RECIPE,
        "time": NOW,
        "reason": "the smoke checks failed: text",
    }


def test_a_deployment_in_words():
    words = rel.describe(deployed(OLD, downtime_seconds=4.25))
    assert words == (
        "registry/engine@sha256:aaaaaaaaaaaa, since 2027-01-15 07:00:00 UTC, smoke passed, switched in 4.2 s"
    )
    assert rel.describe(None) == "none recorded"


# ----------------------------------------------------------------------------- recipes
# Records as the head keeps them: the reference deployment (recorded before entries named their
# recipe, and after), and the lab's tiny model served through a recipe of its own.
DEEPSEEK = "ghcr.io/0xsero/deepseek-v4.1-flash-spark@sha256:" + "5668e35e5ee0" + "1" * 52
TINY = "198.18.0.1:5000/sparkserve-lab/vllm-cpu@sha256:" + "3f1c0a9b7d2e" + "2" * 52
REV_DS = "0123456789abcdef0123456789abcdef01234567"
REV_TINY = "89abcdef0123456789abcdef0123456789abcdef"


def served(image: str, revision: str, recipe: str | None, **extra) -> dict:
    """A deployment entry; ``recipe`` None: written before entries named their recipe."""
    entry = {**deployed(image, revision=revision, downtime_seconds=41.2), **extra}
    if recipe is not None:
        entry["recipe"] = recipe
    return entry


LEGACY_DS = served(DEEPSEEK, REV_DS, None)
RECORDED_DS = served(DEEPSEEK, REV_DS, "deepseek-v4.1-flash")
TINY_CHAT = served(TINY, REV_TINY, "tiny-chat")


def test_the_legacy_recipe_is_the_shipped_reference_recipe():
    assert _recipe.load_named(rel.LEGACY_RECIPE)["name"] == rel.LEGACY_RECIPE


@pytest.mark.parametrize(
    ("entry", "recipe"),
    [(LEGACY_DS, "deepseek-v4.1-flash"), (RECORDED_DS, "deepseek-v4.1-flash"), (TINY_CHAT, "tiny-chat")],
)
def test_the_recipe_of_an_entry_is_recorded_or_the_legacy_one(entry, recipe):
    assert rel.recipe_of(entry) == recipe


@pytest.mark.parametrize(
    ("current", "image", "revision", "recipe", "action"),
    [
        # The same image and revision: a run of the recipe they served switches nothing.
        (RECORDED_DS, DEEPSEEK, REV_DS, "deepseek-v4.1-flash", "none"),
        # An entry recorded before recipes served the reference recipe: nothing to switch either.
        (LEGACY_DS, DEEPSEEK, REV_DS, "deepseek-v4.1-flash", "none"),
        (LEGACY_DS, DEEPSEEK, None, "deepseek-v4.1-flash", "none"),
        # Another recipe is another model, with the image and revision unchanged: a switch, gated.
        (RECORDED_DS, DEEPSEEK, REV_DS, "vllm-generic", "switch"),
        (LEGACY_DS, DEEPSEEK, REV_DS, "vllm-generic", "switch"),
        (TINY_CHAT, TINY, REV_TINY, "tiny-chat", "none"),
    ],
)
def test_a_run_switches_when_the_recipe_differs(current, image, revision, recipe, action):
    planned = rel.plan({**rel.empty_record(), "current": current}, image, revision, recipe=recipe)
    assert planned["action"] == action
    assert planned["target"]["recipe"] == recipe
    assert (planned["no_rollback"] is None) == (action == "none")


@pytest.mark.parametrize(
    ("current", "image", "revision", "recipe", "command"),
    [
        (
            RECORDED_DS,
            TINY,
            REV_TINY,
            "tiny-chat",
            "ansible-playbook site.yml -e deployment_recipe=deepseek-v4.1-flash"
            f" -e deployment_image={DEEPSEEK} -e checkpoint_revision={REV_DS}",
        ),
        # An entry recorded before recipes names the reference recipe as its own.
        (
            LEGACY_DS,
            TINY,
            REV_TINY,
            "tiny-chat",
            "ansible-playbook site.yml -e deployment_recipe=deepseek-v4.1-flash"
            f" -e deployment_image={DEEPSEEK} -e checkpoint_revision={REV_DS}",
        ),
        # A deployment recorded before revisions: no revision to pin.
        (
            served(TINY, "", "tiny-chat"),
            DEEPSEEK,
            REV_DS,
            "deepseek-v4.1-flash",
            f"ansible-playbook site.yml -e deployment_recipe=tiny-chat -e deployment_image={TINY}",
        ),
    ],
)
def test_a_switch_across_recipes_does_not_roll_back_by_itself_and_names_the_run_that_goes_back(
    current, image, revision, recipe, command
):
    planned = rel.plan({**rel.empty_record(), "current": current}, image, revision, recipe=recipe)
    assert planned["action"] == "switch"
    old = rel.recipe_of(current)
    assert planned["no_rollback"] == (
        f"No automatic rollback across recipes: {rel.short_image(current['image'])} served recipe {old}, and"
        f" this run has the serving arguments and model directory of recipe {recipe}. To go back to it, run"
        f" {command}"
    )
    assert planned["msg"].startswith(f"switching from {rel.short_image(current['image'])}")
    assert planned["msg"].endswith(
        f"; the smoke checks gate it and a failure does not roll back by itself (the current deployment"
        f" served recipe {old}, this run serves {recipe})"
    )


def test_a_change_of_recipe_that_does_not_fetch_its_checkpoint_is_refused():
    """site.yml --tags rank -e deployment_recipe=B: the ranks would mount B's model directory at A's
    revision, which does not exist there."""
    with pytest.raises(rel.ReleaseError, match="a change of recipe needs its own checkpoint") as refused:
        rel.plan({**rel.empty_record(), "current": TINY_CHAT}, TINY, None, recipe="deepseek-v4.1-flash")
    assert "serves recipe tiny-chat" in str(refused.value)
    # The same recipe without the checkpoint tag keeps the revision that serves, as before.
    planned = rel.plan({**rel.empty_record(), "current": TINY_CHAT}, TINY, None, recipe="tiny-chat")
    assert (planned["action"], planned["target"]["revision"]) == ("none", REV_TINY)


def test_going_back_after_a_failed_switch_across_recipes_is_a_gated_switch_until_one_passes():
    """The failed switch's ranks still run (nothing rolled them back): the run its message names,
    which deploys current again, must restart and gate them, not say "nothing to switch"."""
    target = {"image": DEEPSEEK, "revision": REV_DS, "recipe": "deepseek-v4.1-flash"}
    record = rel.failed(
        {**rel.empty_record(), "current": TINY_CHAT}, target, reason="smoke: text", now=NOW, left_serving=True
    )
    assert rel.stranded(record) == record["last_failed"]
    back = rel.plan(record, TINY, REV_TINY, recipe="tiny-chat")
    assert back["action"] == "switch"
    assert back["msg"].startswith(f"the ranks run {rel.describe(record['last_failed'])}, left by its failed")
    restored = rel.committed(
        record, back["target"], smoke="passed (text)", downtime_seconds=50.0, now=NOW + 60
    )
    assert restored["current"] == TINY_CHAT and "left_serving" not in restored["last_failed"]
    assert rel.stranded(restored) is None
    assert rel.plan(restored, TINY, REV_TINY, recipe="tiny-chat")["action"] == "none"
    # A failure that rolled back leaves nothing stranded.
    rolled_back = rel.failed({**rel.empty_record(), "current": TINY_CHAT}, target, reason="smoke", now=NOW)
    assert rel.stranded(rolled_back) is None
    assert rel.plan(rolled_back, TINY, REV_TINY, recipe="tiny-chat")["action"] == "none"


def test_a_switch_within_a_recipe_still_rolls_back():
    planned = rel.plan({**rel.empty_record(), "current": TINY_CHAT}, TINY, "f" * 40, recipe="tiny-chat")
    assert (planned["action"], planned["no_rollback"]) == ("switch", None)
    assert planned["msg"].endswith("; the smoke checks gate it and a failure rolls back")


@pytest.mark.parametrize(
    ("current", "previous", "recipe"),
    [
        # A switch to the tiny model passed; this run (the tiny model's inventory) asks to go back.
        (TINY_CHAT, RECORDED_DS, "tiny-chat"),
        (TINY_CHAT, LEGACY_DS, "tiny-chat"),
        # The previous deployment served the tiny model; this run is the reference inventory's.
        (RECORDED_DS, TINY_CHAT, "deepseek-v4.1-flash"),
    ],
)
def test_a_rollback_on_demand_to_another_recipe_is_refused_naming_both_and_the_run_that_goes_back(
    current, previous, recipe
):
    record = {**rel.empty_record(), "current": current, "previous": previous}
    old = rel.recipe_of(previous)
    with pytest.raises(rel.ReleaseError) as refused:
        rel.plan(record, current["image"], None, recipe=recipe, rollback=True)
    assert str(refused.value) == (
        f"the previous deployment, {rel.short_image(previous['image'])}, served recipe {old} and this run"
        f" serves recipe {recipe}: its ranks would start with the serving arguments and model directory of"
        f" {recipe}. To go back to it, run rollback.yml -e deployment_recipe={old} (with the inventory"
        " settings it was deployed with)"
    )


@pytest.mark.parametrize(
    ("current", "previous", "recipe", "no_rollback"),
    [
        # Within one recipe: a failed rollback rolls back to current, as any switch.
        (served(DEEPSEEK, "f" * 40, "deepseek-v4.1-flash"), LEGACY_DS, "deepseek-v4.1-flash", False),
        # The run that goes back across recipes (rollback.yml -e deployment_recipe=<previous's>): allowed,
        # but a failure cannot go back to current, which served the other recipe.
        (TINY_CHAT, RECORDED_DS, "deepseek-v4.1-flash", True),
        (TINY_CHAT, LEGACY_DS, "deepseek-v4.1-flash", True),
    ],
)
def test_a_rollback_on_demand_to_the_same_recipe_targets_the_previous_deployment(
    current, previous, recipe, no_rollback
):
    record = {**rel.empty_record(), "current": current, "previous": previous}
    planned = rel.plan(record, current["image"], None, recipe=recipe, rollback=True)
    assert planned["action"] == "rollback"
    assert planned["target"] == {
        "image": previous["image"],
        "revision": previous["revision"],
        "recipe": recipe,
    }
    assert (planned["no_rollback"] is not None) == no_rollback
    across = (
        "a failure does not roll back by itself (the current deployment served recipe tiny-chat,"
        f" this run serves {recipe})"
    )
    assert planned["msg"].endswith(across) == no_rollback


def test_commits_and_failures_record_the_recipe():
    record = {**rel.empty_record(), "current": RECORDED_DS, "previous": LEGACY_DS}
    target = {"image": TINY, "revision": REV_TINY, "recipe": "tiny-chat"}
    after = rel.committed(record, target, smoke="passed (text, stream)", downtime_seconds=2.0, now=NOW)
    assert after["current"]["recipe"] == "tiny-chat" and after["previous"] == RECORDED_DS
    # The same image and revision under another recipe is a new deployment, not a re-run.
    other = rel.committed(
        after, {**target, "recipe": "vllm-generic"}, smoke="passed", downtime_seconds=None, now=NOW
    )
    assert (other["current"]["recipe"], other["previous"]["recipe"]) == ("vllm-generic", "tiny-chat")
    fail = rel.failed(record, target, reason="the smoke checks failed: text", now=NOW)
    assert fail["last_failed"]["recipe"] == "tiny-chat" and fail["current"] == RECORDED_DS


def test_committing_the_legacy_deployment_under_its_recipe_is_a_rerun():
    record = {**rel.empty_record(), "current": LEGACY_DS}
    target = {"image": DEEPSEEK, "revision": REV_DS, "recipe": "deepseek-v4.1-flash"}
    assert rel.committed(record, target, smoke="passed", downtime_seconds=None, now=NOW) == record


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (LEGACY_DS, f"ghcr.io/0xsero/deepseek-v4.1-flash-spark@sha256:5668e35e5ee0, revision {REV_DS},"),
        (
            TINY_CHAT,
            "198.18.0.1:5000/sparkserve-lab/vllm-cpu@sha256:3f1c0a9b7d2e, recipe tiny-chat,"
            f" revision {REV_TINY},",
        ),
    ],
)
def test_a_deployment_in_words_names_its_recipe_when_recorded(entry, words):
    assert rel.describe(entry).startswith(words)


def test_a_commit_keeps_each_nodes_host_stack_and_a_rerun_changes_nothing():
    stack = {"head": {"kernel": "6.17.0-1014-nvidia"}, "worker": {"kernel": "6.17.0-1014-nvidia"}}
    target = {"image": "registry/engine@sha256:" + "c" * 64, "revision": "", "recipe": "deepseek-v4.1-flash"}
    empty = rel.parse_record(None, "deployments.json")
    record = rel.committed(empty, target, smoke="passed", downtime_seconds=None, now=NOW, host_stack=stack)
    assert record["current"]["host_stack"] == stack
    again = rel.committed(record, target, smoke="passed", downtime_seconds=None, now=NOW + 60, host_stack={})
    assert again == record
    plain = rel.committed(empty, target, smoke="passed", downtime_seconds=None, now=NOW)
    assert "host_stack" not in plain["current"]


def test_a_commit_keeps_the_images_versions_when_given():
    versions = {"torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9"}
    target = {"image": "registry/engine@sha256:" + "c" * 64, "revision": "", "recipe": "deepseek-v4.1-flash"}
    empty = rel.parse_record(None, "deployments.json")
    record = rel.committed(
        empty, target, smoke="passed", downtime_seconds=None, now=NOW, image_versions=versions
    )
    assert record["current"]["image_versions"] == versions
    plain = rel.committed(empty, target, smoke="passed", downtime_seconds=None, now=NOW, image_versions={})
    assert "image_versions" not in plain["current"]
