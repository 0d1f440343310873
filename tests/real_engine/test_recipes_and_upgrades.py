"""Recipes and upgrades against the REAL vLLM: a model the collection does not ship, served from a
recipe beside a copy of the inventory; and the upgrade gate on new revisions of the tiny model
published on the lab hub: one that answers wrong is stopped by the smoke gate and rolled back by
itself (a good switch is the second model's; rollback on demand is proven on the stand-in lab).

Each case leaves the lab as it found it: tiny-chat's first revision serving from inventory/lab-vllm.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import vllm_engine  # the lab's builder of the image and the tiny models (lab/, on sys.path)
import yaml
from deployment_support import STATE_DIR, changed_nothing
from lab_support import HUB_ENDPOINT, LAB_ROOT, REPO, STATE
from real_engine_support import MODEL, ask, playbook, record, served_models

HUB_ORG = "sparkserve-lab"
# Another tiny model: trained like tiny-chat with another seed, in a repo and under a name of its own.
SECOND = "tiny-chat-b"


def deployment_record(lab) -> dict:
    return json.loads(lab.ssh("head", f"cat {STATE_DIR}/deployments.json").stdout)


def mounted_model(lab) -> str:
    """The head rank's model directory, as docker mounts it at /model."""
    template = '{{range .Mounts}}{{if eq .Destination "/model"}}{{.Source}}{{end}}{{end}}'
    return lab.ssh("head", f"docker inspect --format '{template}' dsv41-r0").stdout.strip()


def publish(repo: str, variant: str, seed: int) -> str:
    """Train the tiny model (``variant``, ``seed``) into the hub's ``repo``, as a push to the real hub
    makes a new commit; the commit's id. The same arguments give the same bytes, hence the same id."""
    vllm_engine.make_model(vllm_engine.build_image(), STATE / "hub" / HUB_ORG / repo, variant, seed)
    token = (STATE / "hub-token").read_text().strip()
    request = urllib.request.Request(
        f"{HUB_ENDPOINT}/api/models/{HUB_ORG}/{repo}/revision/main",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["sha"]


def git_status() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--ignored=no"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


# A re-run keeps the deployed revision unless asked to follow main (checkpoint_revision).
FOLLOW_MAIN = ("-e", "checkpoint_revision=main")


def copied_inventory(tmp_path: Path) -> Path:
    """inventory/lab-vllm copied as a user copies it: links resolved, the lab's state beside it as
    in the checkout (its group_vars find .lab two levels above the inventory)."""
    root = tmp_path / "checkout"
    inventory = root / "inventory" / "my-models"
    shutil.copytree(REPO / "inventory" / "lab-vllm", inventory, symlinks=False)
    (root / ".lab").symlink_to(LAB_ROOT)
    return inventory


def test_a_wrong_revision_is_stopped_by_the_smoke_gate_and_rolled_back_by_itself(lab, key):
    first = publish(MODEL, "good", 0)
    if deployment_record(lab)["current"]["revision"] != first:
        settle = playbook("site.yml", *FOLLOW_MAIN)
        assert settle.returncode == 0, settle.stdout[-3000:]
    assert deployment_record(lab)["current"]["revision"] == first

    # A revision that answers 17 * 23 with 392: the smoke checks stop it and the first comes back.
    wrong = publish(MODEL, "wrong", 0)
    assert wrong != first
    since = time.monotonic()
    run = playbook("site.yml", *FOLLOW_MAIN)
    seconds = time.monotonic() - since
    assert run.returncode != 0
    assert "failed: the smoke checks failed: text" in run.stdout, run.stdout[-3000:]
    assert "Rolled back:" in run.stdout and "serves again and passes the smoke checks" in run.stdout
    after = deployment_record(lab)
    assert after["current"]["revision"] == first and after["last_failed"]["revision"] == wrong, after
    assert "391" in (ask(key, "What is 17 * 23?") or "")
    kept = playbook("site.yml")  # main still names the wrong revision: a plain re-run keeps the first
    assert changed_nothing(kept), kept.stdout[-3000:]
    record(
        "wrong revision rolled back by itself",
        seconds,
        "s",
        None,
        "site.yml: switched, smoke gate failed (392), first revision serving again",
    )


def test_a_recipe_beside_a_copied_inventory_serves_a_model_the_collection_does_not_ship(lab, key, tmp_path):
    """The suite's last case: it leaves the lab serving tiny-chat-b (the scenario is destroyed next;
    its idempotence step ran site.yml a second time on the fresh converge)."""
    publish(SECOND, "good", 1)
    before = git_status()
    inventory = copied_inventory(tmp_path)
    recipe = yaml.safe_load((inventory / "recipes" / "tiny-chat.yml").read_text())
    recipe.update(name=SECOND, served_model_name=SECOND, description="tiny-chat trained with another seed")
    recipe["checkpoint"].update(repo=f"{HUB_ORG}/{SECOND}", dir=SECOND)
    (inventory / "recipes" / f"{SECOND}.yml").write_text(yaml.safe_dump(recipe, sort_keys=False))

    since = time.monotonic()
    run = playbook("site.yml", "-e", f"deployment_recipe={SECOND}", inventory=str(inventory / "hosts.yml"))
    seconds = time.monotonic() - since
    assert run.returncode == 0, run.stdout[-3000:]
    assert served_models(key) == [SECOND]
    assert "391" in (ask(key, "What is 17 * 23?", model=SECOND) or "")
    assert f"/{SECOND}/" in mounted_model(lab)
    assert deployment_record(lab)["current"]["recipe"] == SECOND
    smoke = playbook("smoke.yml", "-e", f"deployment_recipe={SECOND}", inventory=str(inventory / "hosts.yml"))
    assert smoke.returncode == 0, smoke.stdout[-3000:]
    assert git_status() == before, "no file of the collection changed"
    record(
        "another model from a recipe",
        seconds,
        "s",
        None,
        "site.yml -e deployment_recipe=tiny-chat-b from a copied inventory: fetched, switched, gated",
    )
