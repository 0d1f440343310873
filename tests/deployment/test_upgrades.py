"""The upgrade suite: a new serving image switched in, gated by the smoke checks, rolled back.

Each case pushes a stand-in image of its own to the lab registry (the lab's engine with one
setting changed, so it has a digest of its own), runs ``site.yml`` with ``-e deployment_image=``
as an owner trying a new build would, and checks what serves afterwards: the ranks' image, the
deployment record on the head and ``smoke.yml``. Measured downtimes go to
``.lab/upgrade-suite.json`` (the README's table is taken from it). The cases run in file order:
the good switch records the previous deployment the later cases roll back to.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from deployment_support import STATE_DIR, run_playbook, site
from lab_support import ENGINE_REPO, REGISTRY, STATE, labctl, wait_for

RESULTS = STATE / "upgrade-suite.json"
LOCAL_REGISTRY = f"127.0.0.1:{labctl.REGISTRY_PORT}"


def variant(tag: str, *env: str) -> str:
    """The lab's engine image with ``env`` (``NAME=value``) baked in, pushed; its reference by digest."""
    local = f"{LOCAL_REGISTRY}/{ENGINE_REPO}:{tag}"
    dockerfile = f"FROM {LOCAL_REGISTRY}/{ENGINE_REPO}:lab\n" + "".join(f"ENV {item}\n" for item in env)
    dockerfile += f'LABEL sparkserve.lab.variant="{tag}"\n'
    subprocess.run(
        ["docker", "build", "--quiet", "--label", f"{labctl.LABEL}=image", "-t", local, "-"],
        input=dockerfile, text=True, check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(["docker", "push", "--quiet", local], check=True, capture_output=True)
    inspect = ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", local]
    digests = json.loads(subprocess.run(inspect, check=True, capture_output=True, text=True).stdout)
    digest = next(entry.split("@", 1)[1] for entry in digests if entry.startswith(f"{LOCAL_REGISTRY}/"))
    return f"{REGISTRY}/{ENGINE_REPO}@{digest}"


def lab_image() -> str:
    return f"{REGISTRY}/{ENGINE_REPO}@{(STATE / 'engine-digest').read_text().strip()}"


def short(image: str) -> str:
    """An image as status.yml names it: the digest's first 12 hex digits."""
    return image[: image.index("@sha256:") + len("@sha256:") + 12]


def supervisor(lab) -> dict:
    return json.loads(lab.ssh("head", f"cat {STATE_DIR}/supervisor-state.json").stdout)


def record_of(lab) -> dict:
    return json.loads(lab.ssh("head", f"cat {STATE_DIR}/deployments.json").stdout)


def rank_images(lab) -> set[str]:
    return {
        lab.ssh(node, f"docker inspect --format '{{{{.Config.Image}}}}' dsv41-r{rank}").stdout.strip()
        for rank, node in enumerate(("head", "worker"))
    }


def started(lab) -> list[str]:
    return [
        lab.ssh(node, f"docker inspect --format '{{{{.State.StartedAt}}}}' dsv41-r{rank}").stdout.strip()
        for rank, node in enumerate(("head", "worker"))
    ]


def record(case: str, measured: float | None, detail: str) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[case] = {"seconds": measured, "detail": detail, "at": time.time()}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def smoke_passes() -> bool:
    run, _ = run_playbook("playbooks/smoke.yml")
    return run.returncode == 0


@pytest.fixture(scope="module")
def serving(lab):
    """The converged pair serving the lab's image, recorded as current (as molecule's converge
    leaves it); put back afterwards when a case left something else."""
    if record_of(lab)["current"]["image"] != lab_image() or rank_images(lab) != {lab_image()}:
        run, _ = site()
        assert run.returncode == 0, run.stdout[-3000:]
    assert record_of(lab)["current"]["image"] == lab_image()
    yield lab
    if record_of(lab)["current"]["image"] != lab_image() or rank_images(lab) != {lab_image()}:
        back, _ = site()
        assert back.returncode == 0, back.stdout[-3000:]


def test_check_mode_on_an_upgrade_reports_the_switch_and_changes_nothing(serving):
    lab = serving
    before, record_before = started(lab), record_of(lab)
    good = variant("good", "STANDIN_VARIANT=good")
    run, _ = site("--check", "-e", f"deployment_image={good}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Check mode: switching from" in run.stdout
    assert started(lab) == before and rank_images(lab) == {lab_image()}
    assert record_of(lab) == record_before


def test_an_upgrade_to_a_good_image_switches_records_the_previous_and_reports_its_downtime(serving):
    lab = serving
    good = variant("good", "STANDIN_VARIANT=good")
    run, seconds = site("-e", f"deployment_image={good}")
    assert run.returncode == 0, run.stdout[-3000:]
    assert rank_images(lab) == {good}
    current = record_of(lab)
    assert current["current"]["image"] == good and current["previous"]["image"] == lab_image()
    downtime = current["current"]["downtime_seconds"]
    assert isinstance(downtime, float) and 0 < downtime < seconds, current
    assert "the API did not answer for" in run.stdout
    assert smoke_passes()
    record(
        "switch to a good image",
        downtime,
        f"the API's gap while the ranks switched; the run took {seconds:.0f} s",
    )


def test_rollback_on_demand_returns_to_the_previous_deployment(serving):
    lab = serving
    good = record_of(lab)["current"]["image"]
    run, seconds = run_playbook("playbooks/rollback.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "rolling back from" in run.stdout
    assert rank_images(lab) == {lab_image()}
    after = record_of(lab)
    assert after["current"]["image"] == lab_image() and after["previous"]["image"] == good
    assert smoke_passes()
    record("rollback on demand", after["current"]["downtime_seconds"], f"rollback.yml took {seconds:.0f} s")


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("wrong_math", "the smoke checks failed: text"),
        ("exit_on_start", "A rank failed to start"),
    ],
)
def test_an_upgrade_that_fails_rolls_back_by_itself(serving, fault, named):
    lab = serving
    broken = variant(f"broken-{fault}", f"STANDIN_FAULTS={fault}")
    run, seconds = site("-e", f"deployment_image={broken}")
    assert run.returncode != 0
    assert f"The switch to {broken} failed: {named}" in run.stdout, run.stdout[-3000:]
    assert f"Rolled back: {lab_image()} serves again and passes the smoke checks" in run.stdout
    assert rank_images(lab) == {lab_image()}
    after = record_of(lab)
    assert after["current"]["image"] == lab_image()
    assert after["last_failed"]["image"] == broken and named in after["last_failed"]["reason"]
    assert smoke_passes()
    lock = lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False)
    assert lock.returncode != 0, "the lock is given back, so the supervisor watches the restored ranks"
    assert wait_for(lambda: supervisor(lab)["state"] == "healthy", timeout=60), supervisor(lab)
    assert supervisor(lab)["last_action"]["action"] == "adopt", "it took the restored group over"
    shown, _ = run_playbook("playbooks/status.yml")
    assert shown.returncode == 0, shown.stdout[-3000:]
    assert f"deployment: {short(lab_image())}" in shown.stdout, shown.stdout[-3000:]
    assert f"last failed switch: {short(broken)}" in shown.stdout
    record(f"upgrade to a broken image ({fault})", None, f"rolled back by itself; run {seconds:.0f} s")


def test_a_rollback_with_nothing_to_go_back_to_changes_nothing_and_gives_the_lock_back(serving):
    lab = serving
    before = started(lab)
    lab.ssh("head", f"mv {STATE_DIR}/deployments.json {STATE_DIR}/deployments.json.aside")
    try:
        run, _ = run_playbook("playbooks/rollback.yml")
        assert lab.ssh("head", f"test -e {STATE_DIR}/deployments.json", check=False).returncode != 0
    finally:
        lab.ssh("head", f"mv {STATE_DIR}/deployments.json.aside {STATE_DIR}/deployments.json")
    assert run.returncode != 0
    assert "Nothing changed: no previous deployment is recorded to roll back to" in run.stdout, run.stdout[
        -3000:
    ]
    assert started(lab) == before
    assert lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False).returncode != 0


def test_a_new_image_pulled_with_tags_image_switches_nothing(serving):
    lab = serving
    before, record_before = started(lab), record_of(lab)
    good = variant("good", "STANDIN_VARIANT=good")
    run, _ = site("--tags", "image", "-e", f"deployment_image={good}")
    assert run.returncode == 0, run.stdout[-3000:]
    pulled = lab.ssh("worker", f"docker image inspect --format '{{{{json .RepoDigests}}}}' {good}").stdout
    assert good in json.loads(pulled), "pulled ahead of the switch"
    assert started(lab) == before and rank_images(lab) == {lab_image()}
    assert record_of(lab) == record_before
    assert lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False).returncode != 0
