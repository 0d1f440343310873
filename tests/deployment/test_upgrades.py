"""The upgrade suite: a new serving image switched in, gated by the smoke checks, rolled back.

Each case pushes a stand-in image of its own to the lab registry (the lab's engine with one
setting changed, so it has a digest of its own), runs ``site.yml`` with ``-e deployment_image=``
as an owner trying a new build would, and checks what serves afterwards: the ranks' image, the
deployment record on the head and ``smoke.yml``. Measured downtimes go to
``.lab/upgrade-suite.json`` (docs/upgrades.md's table is taken from it). The cases run in file order:
the good switch records the previous deployment the later cases roll back to.

The last case publishes new checkpoint revisions on the lab hub (a change to the repo's README is
a new commit there, as a push is on the real hub) and deploys them next to the one serving.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from deployment_support import MODEL_DIR, STATE_DIR, api_key, model_dir, run_playbook, served_revision, site
from lab_support import (
    API_URL,
    ENGINE_REPO,
    HUB_ENDPOINT,
    HUB_REPO,
    LAB_ROOT,
    REGISTRY,
    STATE,
    labctl,
    wait_for,
)

RESULTS = LAB_ROOT / "upgrade-suite.json"
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


def test_a_switch_whose_ranks_run_already_is_waited_for_gated_and_recorded(serving):
    """A run stopped while it waited for the new ranks recorded nothing: the next run finds them
    running the image it deploys, starts none, and still waits for them before the smoke checks."""
    lab = serving
    good = variant("good", "STANDIN_VARIANT=good")
    before, record_before = started(lab), record_of(lab)
    # The record as the stopped run left it: the image before the switch is still current.
    unrecorded = {**record_before, "current": {**record_before["current"], "image": good}}
    lab.ssh("head", f"cat > {STATE_DIR}/deployments.json", input_text=json.dumps(unrecorded))
    run, _ = site()
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"switching from {short(good)}" in run.stdout, run.stdout[-3000:]
    assert started(lab) == before, "the ranks ran the image already: none restarts"
    for node in ("head", "worker"):
        assert run.results_of(
            "Look at the API and at this node's rank until ready, failed or out of time", node
        )
    after = record_of(lab)
    assert after["current"]["image"] == lab_image() and after["previous"]["image"] == good, after


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


# An image that answers wrongly is stopped by the smoke checks: the same gate stops a revision that
# answers wrongly on the real engine (tests/real_engine/test_recipes_and_upgrades.py).
@pytest.mark.parametrize(("fault", "named"), [("exit_on_start", "A rank failed to start")])
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


def test_a_rollback_whose_start_fails_records_the_failed_switch_names_both_and_gives_the_lock_back(serving):
    """The switch fails its start; then the rollback's own start fails too: the image that served
    before is gone from the worker and its registry is out of reach once the switch has replaced the
    worker's rank. The run still records the failed switch, names both failures and gives the lock back."""
    lab = serving
    previous = lab_image()
    broken = variant("broken-exit_on_start", "STANDIN_FAULTS=exit_on_start")
    registry_ip, registry_port = REGISTRY.rsplit(":", 1)
    block = (
        "nft add table inet dsv41test && nft add chain inet dsv41test out"
        " '{ type filter hook output priority 0; }' &&"
        f" nft add rule inet dsv41test out ip daddr {registry_ip} tcp dport {registry_port} reject"
    )
    done = threading.Event()
    blocked: list[float] = []

    def take_the_previous_image_away() -> None:
        inspect = "docker inspect --format '{{.Config.Image}}' dsv41-r1 2>/dev/null || true"
        while not done.is_set():
            if labctl.node_exec("worker", inspect).strip() == broken:
                labctl.node_exec("worker", f"{block} && docker rmi {previous}")
                blocked.append(time.monotonic())
                return
            time.sleep(0.2)

    failed_before = record_of(lab).get("last_failed")
    watcher = threading.Thread(target=take_the_previous_image_away, daemon=True)
    watcher.start()
    try:
        run, _ = site("-e", f"deployment_image={broken}")
    finally:
        done.set()
        watcher.join(timeout=30)
        labctl.node_exec("worker", "nft delete table inet dsv41test 2>/dev/null || true")
    assert blocked, "the switch replaced the worker's rank"
    assert run.returncode != 0
    assert f"The switch to {broken} failed: A rank failed to start" in run.stdout, run.stdout[-3000:]
    assert f"Rolling back to {previous} failed: its start failed (the error above)" in run.stdout, run.stdout[
        -3000:
    ]
    assert "TASK [sparkserve.dsv41.rank : Run this node's rank container]" in run.stdout
    after = record_of(lab)
    assert after["current"]["image"] == previous, "nothing was restored, nothing recorded as serving"
    assert after["last_failed"]["image"] == broken and after["last_failed"] != failed_before, "recorded now"
    lock = lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False)
    assert lock.returncode != 0, "the lock is given back"
    back, _ = site()
    assert back.returncode == 0, back.stdout[-3000:]
    assert rank_images(lab) == {previous}
    assert smoke_passes()


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
    assert (
        "Nothing rolled back, no rank changed: no previous deployment is recorded to roll back to"
        in run.stdout
    ), run.stdout[-3000:]
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


def test_an_image_that_cannot_be_pulled_fails_the_run_and_gives_the_lock_back(serving):
    """A run that fails once it holds the lock gives it back: the supervisor, paused while it is
    held, goes on watching the group the run left serving."""
    lab = serving
    before, record_before = started(lab), record_of(lab)
    missing = f"{REGISTRY}/{ENGINE_REPO}@sha256:{'0' * 64}"
    run, _ = site("-e", f"deployment_image={missing}")
    assert run.returncode != 0
    text = " ".join(run.stdout.split())
    assert (
        "Pull the serving image by digest failed (its error is above). The deployment lock is given back"
        in text
    )
    assert started(lab) == before and record_of(lab) == record_before
    assert lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False).returncode != 0
    assert wait_for(lambda: supervisor(lab)["state"] == "healthy", timeout=60), supervisor(lab)


FOLLOW_MAIN = ("-e", "checkpoint_revision=main")


def publish_revision(label: str) -> str:
    """A new commit of the checkpoint on the lab hub (its README changes); the commit's id."""
    with (STATE / "hub" / HUB_REPO / "README.md").open("a", encoding="utf-8") as readme:
        readme.write(f"\nRevision {label}, published by the upgrade suite.\n")
    token = (STATE / "hub-token").read_text().strip()
    request = urllib.request.Request(
        f"{HUB_ENDPOINT}/api/models/{HUB_REPO}/revision/main", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)["sha"]


def revisions_on(lab, node: str) -> set[str]:
    return set(lab.ssh(node, f"ls {MODEL_DIR}/revisions").stdout.split())


def mounted_revision(lab, node: str, rank: int) -> str:
    template = '{{range .Mounts}}{{if eq .Destination "/model"}}{{.Source}}{{end}}{{end}}'
    return (
        lab.ssh(node, f"docker inspect --format '{template}' dsv41-r{rank}").stdout.strip().rsplit("/", 1)[-1]
    )


@contextlib.contextmanager
def asking_all_along(key: str):
    """Ask the API a one-token question every half second while the block runs; yields
    ``{"answered": n, "failed": [why, ...]}``."""
    tally: dict = {"answered": 0, "failed": []}
    stop = threading.Event()
    body = json.dumps({"model": "deepseek-v4.1-flash", "prompt": "2+2=", "max_tokens": 1}).encode()

    def ask() -> None:
        while not stop.wait(0.5):
            request = urllib.request.Request(
                f"{API_URL}/v1/completions",
                data=body,
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    json.load(response)
                tally["answered"] += 1
            except (urllib.error.URLError, OSError, ValueError) as exc:
                tally["failed"].append(f"{time.strftime('%H:%M:%S')} {exc}")

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    try:
        yield tally
    finally:
        stop.set()
        asker.join(timeout=15)


def test_a_new_checkpoint_revision_is_fetched_while_serving_switched_and_old_ones_pruned(serving):
    lab = serving
    first = served_revision(lab)
    ranks_before = started(lab)
    second = publish_revision("two")
    assert second != first

    # Unasked, a re-run keeps the deployed revision: nothing is fetched.
    kept, _ = site("--tags", "checkpoint")
    assert kept.returncode == 0, kept.stdout[-3000:]
    assert revisions_on(lab, "head") == {first}

    # Following main is asked for: fetched, verified and copied next to the revision that serves,
    # which keeps answering.
    offset = (STATE / "hub-access.log").stat().st_size
    with asking_all_along(api_key(lab)) as tally:
        fetched, fetch_seconds = site("--tags", "checkpoint", *FOLLOW_MAIN)
    assert fetched.returncode == 0, fetched.stdout[-3000:]
    assert tally["failed"] == [] and tally["answered"] >= 10, tally
    for node in ("head", "worker"):
        assert revisions_on(lab, node) == {first, second}, node
    # Only the README changed: it alone crossed from the hub, and the shards are the serving
    # revision's own files on both nodes (hard links), not copies.
    with (STATE / "hub-access.log").open(encoding="utf-8") as log:
        log.seek(offset)
        requests = [json.loads(line) for line in log if line.strip()]
    downloaded = sorted(
        {r["path"].rsplit("/", 1)[-1] for r in requests if r["method"] == "GET" and "/resolve/" in r["path"]}
    )
    assert downloaded == ["README.md"], downloaded
    for node in ("head", "worker"):
        shard = "model-00006-of-00006.safetensors"
        same = lab.ssh(
            node,
            f"test {MODEL_DIR}/revisions/{first}/{shard} -ef {MODEL_DIR}/revisions/{second}/{shard}",
            check=False,
        )
        assert same.returncode == 0, f"{node}: the new revision's shard is the serving one's file"
    assert started(lab) == ranks_before, "fetching a revision restarts nothing"
    assert served_revision(lab) == first

    # The switch: the ranks restart on the new revision's directory, gated by the smoke checks.
    switched, _ = site(*FOLLOW_MAIN)
    assert switched.returncode == 0, switched.stdout[-3000:]
    assert f"revision {second}" in switched.stdout
    assert {mounted_revision(lab, "head", 0), mounted_revision(lab, "worker", 1)} == {second}
    after = record_of(lab)
    assert (after["current"]["revision"], after["previous"]["revision"]) == (second, first), after
    assert smoke_passes()

    # A third revision: switched, and the oldest beyond checkpoint_keep_revisions (2) goes.
    third = publish_revision("three")
    run, _ = site(*FOLLOW_MAIN)
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"removed old revisions {first}" in run.stdout, run.stdout[-3000:]
    for node in ("head", "worker"):
        assert revisions_on(lab, node) == {second, third}, node
        check = lab.ssh(node, f"cd {model_dir(lab)} && sha256sum -c sha256-manifest.txt")
        assert check.stdout.count(": OK") == 6, "the revision that serves is intact"
    assert record_of(lab)["current"]["revision"] == third
    assert smoke_passes()
    record(
        "new checkpoint revision",
        after["current"]["downtime_seconds"],
        f"fetched next to the serving one in {fetch_seconds:.0f} s (only the changed file downloaded, the"
        f" rest linked) with {tally['answered']} questions all answered; then switched",
    )


def test_a_switch_not_waited_for_is_recorded_without_the_checks_and_kept(serving):
    """WAIT=0 (rank_wait_for_api false): the run returns while the new ranks boot, so the smoke
    checks, which need the API, are not run; nothing rolls back what they could not judge."""
    lab = serving
    good = variant("good", "STANDIN_VARIANT=good")
    not_waiting = {"deployment_image": good, "rank_wait_for_api": False}
    # A boot that outlasts the run: checks asked at once would find no API.
    not_waiting["rank_extra_env"] = {"STANDIN_BOOT_SECONDS": "20"}
    run, _ = site("-e", json.dumps(not_waiting))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "recorded without the smoke checks" in " ".join(run.stdout.split())
    assert rank_images(lab) == {good}
    current = record_of(lab)["current"]
    assert (current["image"], current["smoke"]) == (good, "not run (rank_wait_for_api is false)"), current
    assert wait_for(smoke_passes, timeout=90), "the new ranks come up after the run"
