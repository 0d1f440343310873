"""The deployment's verdict (``_health``), from what the nodes report. (Its filter,
``deployment_health``, is tested in a child interpreter in tests/unit/plugins/filter.)"""

from __future__ import annotations

import copy

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._health import deployment_health, health_table

NOW = 1_800_000_000.0


def rank(name: str, number: int, **status) -> dict:
    base = {
        "node": name,
        "container": f"dsv41-r{number}",
        "state": "running",
        "exit_code": 0,
        "started_at": "2026-12-03T04:00:00.1Z",
        "finished_at": None,
        "restart_count": 0,
        "oom_killed": False,
        "boot_id": "b",
        "mem_available_bytes": 100 * 1024**3,
        "memguard_last_kill": None,
        "time": NOW,
    }
    return {"name": name, "rank": number, "status": {**base, **status}, "error": None, "guard": "active"}


HEALTHY_NODES = [rank("head", 0), rank("worker", 1)]
API = {"health": 200, "running": 0, "waiting": 0, "generation_tokens_total": 1234}
SUPERVISOR = {"state": "healthy", "reason": "all ranks running", "since": NOW - 600, "attempts": 0,
              "last_action": None, "updated": NOW - 2}  # fmt: skip


def verdict(nodes=HEALTHY_NODES, api=API, supervisor=SUPERVISOR, **kwargs) -> dict:
    return deployment_health(copy.deepcopy(nodes), api, supervisor, now=NOW, **kwargs)


def test_a_healthy_pair():
    report = verdict()
    assert (report["healthy"], report["problems"]) == (True, [])
    assert health_table(report).endswith("\nhealthy")


@pytest.mark.parametrize(
    ("nodes", "problem"),
    [
        pytest.param(
            [
                rank("head", 0),
                rank(
                    "worker",
                    1,
                    state="exited",
                    exit_code=137,
                    oom_killed=True,
                    finished_at="2026-12-03T04:05:00Z",
                ),
            ],
            "worker (rank 1): container dsv41-r1 exited with code 137, OOM-killed at 2026-12-03T04:05:00Z",
            id="exited",
        ),
        pytest.param(
            [rank("head", 0, state="missing"), rank("worker", 1)],
            "head (rank 0): container dsv41-r0 does not exist",
            id="missing",
        ),
        pytest.param(
            [rank("head", 0), rank("worker", 1, state="restarting")],
            "worker (rank 1): container dsv41-r1 is restarting",
            id="restarting",
        ),
        pytest.param(
            [
                rank("head", 0),
                {"name": "worker", "rank": 1, "status": None, "error": "ssh: timed out", "guard": None},
            ],
            "worker (rank 1): cannot be asked (ssh: timed out)",
            id="unreachable",
        ),
        pytest.param(
            [rank("head", 0), {**rank("worker", 1), "guard": "failed"}],
            "worker: memory guard is failed",
            id="guard",
        ),
    ],
)
def test_a_rank_or_guard_down_is_degraded_and_named(nodes, problem):
    report = verdict(nodes)
    assert report["healthy"] is False
    assert problem in report["problems"], report["problems"]
    assert health_table(report).splitlines()[-1].startswith("DEGRADED: ")


@pytest.mark.parametrize(
    ("api", "problem"),
    [
        ({**API, "health": 503}, "API: /health answered 503"),
        ({**API, "health": None}, "API: no answer on /health"),
    ],
)
def test_an_api_that_does_not_answer_200_is_degraded(api, problem):
    assert verdict(api=api)["problems"] == [problem]


STALL = "2 request(s) running, no new tokens for 61 s (hang threshold 60 s)"


@pytest.mark.parametrize(
    ("api", "problem"),
    [
        pytest.param({**API, "running": 2, "stalled": STALL}, f"API: hung - {STALL}",
                     id="the-supervisor-says-so"),
        pytest.param({**API, "running": 2, "stalled": None}, None, id="it-says-no"),
        pytest.param({**API, "running": 2}, None, id="a-supervisor-that-does-not-judge-it"),
    ],
)  # fmt: skip
def test_a_stall_is_the_supervisors_verdict_reported_as_it_stands(api, problem):
    """The rule (requests running, no new token for the hang threshold) is the supervisor's
    (dsv41_supervisor_rules.stall, tested with it): status.yml reports it, never judges again."""
    assert verdict(api=api)["problems"] == ([problem] if problem else [])


@pytest.mark.parametrize(
    ("supervisor", "enabled", "problems"),
    [
        pytest.param({**SUPERVISOR, "updated": NOW - 31}, True,
                     ["supervisor: not running (its state was last written 2027-01-15 07:59:29 UTC)"],
                     id="stale"),
        pytest.param(SUPERVISOR, False, [], id="switched-off"),
    ],
)  # fmt: skip
def test_a_hang_is_not_judged_from_a_supervisor_that_no_longer_watches(supervisor, enabled, problems):
    """Its last state may say requests were running: that says nothing about now."""
    api = {**API, "running": 2, "stalled": STALL}
    assert verdict(api=api, supervisor=supervisor, supervisor_enabled=enabled)["problems"] == problems


@pytest.mark.parametrize(
    ("supervisor", "enabled", "problem"),
    [
        ({**SUPERVISOR, "state": "gave_up", "reason": "5 failed attempts: worker exited 1"}, True,
         "supervisor: gave_up - 5 failed attempts: worker exited 1"),
        ({**SUPERVISOR, "state": "memory_wait", "reason": "worker has 2.0 GiB"}, True,
         "supervisor: memory_wait - worker has 2.0 GiB"),
        ({**SUPERVISOR, "updated": NOW - 31}, True, "supervisor: not running (its state was last written "),
        (None, True, "supervisor: no state written"),
        ({**SUPERVISOR, "state": "paused", "reason": "deployment lock"}, True, None),
        (None, False, None),
    ],
)  # fmt: skip
def test_the_supervisor_is_part_of_the_verdict(supervisor, enabled, problem):
    report = verdict(supervisor=supervisor, supervisor_enabled=enabled)
    if problem is None:
        assert report["healthy"], report["problems"]
    else:
        assert [p for p in report["problems"] if p.startswith(problem)], report["problems"]


def test_the_table_shows_every_node_the_api_and_the_supervisors_last_action():
    nodes = [rank("head", 0), rank("worker", 1, memguard_last_kill=NOW - 60)]
    supervisor = {
        **SUPERVISOR,
        "last_action": {"time": NOW - 50, "action": "restart", "reason": "worker lost"},
    }
    lines = health_table(verdict(nodes, supervisor=supervisor)).splitlines()
    assert lines[0].split() == ["node", "container", "rank", "guard", "MemAvailable", "API"]
    assert lines[1].split() == [
        "head",
        "dsv41-r0",
        "running",
        "since",
        "2026-12-03T04:00:00.1Z",
        "active",
        "100.0",
        "GiB",
        "healthy",
    ]
    assert lines[2].split()[-1] == "-", "the API is the head's"
    assert lines[3] == "API: 0 running, 0 waiting, 1234 tokens generated"
    assert lines[4].startswith("memory guard killed the ranks on worker at ")
    assert "last action: restart at " in lines[5] and "(worker lost)" in lines[5]
    assert lines[6] == "healthy"


def test_an_exited_rank_and_an_unhealthy_api_in_the_table():
    nodes = [rank("head", 0), rank("worker", 1, state="exited", exit_code=1, finished_at="T")]
    lines = health_table(verdict(nodes, api={**API, "health": 503})).splitlines()
    assert lines[1].split()[-3:] == ["not", "healthy", "(503)"]
    assert "exited (1) at T" in lines[2]
    assert lines[-1].startswith("DEGRADED: worker (rank 1): container dsv41-r1 exited with code 1 at T; API:")


def test_the_table_shows_the_deployment_record_without_judging_it():
    image = "registry/engine@sha256:" + "c" * 64
    record = {
        "version": 1,
        "current": {"image": image, "revision": "", "time": NOW, "smoke": "passed", "downtime_seconds": 2.5},
        "previous": None,
        "last_failed": {"image": "r@sha256:" + "d" * 64, "time": NOW, "reason": "smoke: text"},
    }
    report = verdict(deployments=record)
    assert report["healthy"] and report["deployments"] == record
    lines = health_table(report).splitlines()
    since = "since 2027-01-15 08:00:00 UTC"
    assert f"deployment: registry/engine@sha256:cccccccccccc, {since}, smoke passed" in lines[-5]
    assert lines[-4] == "previous: none recorded"
    assert lines[-3] == f"last failed switch: r@sha256:dddddddddddd, {since}: smoke: text"


def test_the_table_names_the_recipe_each_recorded_deployment_served():
    image = "registry/engine@sha256:" + "c" * 64
    record = {
        "version": 1,
        "current": {"image": image, "revision": "", "recipe": "tiny-chat", "time": NOW, "smoke": "passed"},
        # Recorded before entries named their recipe: shown without one.
        "previous": {"image": "r@sha256:" + "d" * 64, "revision": "", "time": NOW, "smoke": "passed"},
        "last_failed": None,
    }
    lines = health_table(verdict(deployments=record)).splitlines()
    assert "deployment: registry/engine@sha256:cccccccccccc, recipe tiny-chat, since" in lines[-4]
    assert lines[-3].startswith("previous: r@sha256:dddddddddddd, since")


# --- the host stack: between the nodes, and since the deployment was recorded -----------------

STACK = {"kernel": "6.17.0-1014-nvidia", "driver": "580.95.05", "nic_firmware": {"rocep1s0f1": "28.45.4028"}}


def _with_stacks(head: dict, worker: dict) -> list[dict]:
    return [{**HEALTHY_NODES[0], "host_stack": head}, {**HEALTHY_NODES[1], "host_stack": worker}]


def test_the_same_host_stack_everywhere_and_since_the_deployment_shows_nothing():
    record = {"current": {"image": "i", "time": NOW - 3600, "host_stack": {"head": STACK, "worker": STACK}}}
    report = verdict(_with_stacks(STACK, STACK), deployments=record)
    assert report["host_stack_changes"] == [] and report["healthy"]
    assert "host stack" not in health_table(report)


def test_a_kernel_updated_on_one_node_shows_between_nodes_and_since_the_deployment():
    updated = {**STACK, "kernel": "7.0.0-1019-nvidia"}
    record = {"current": {"image": "i", "time": NOW - 3600, "host_stack": {"head": STACK, "worker": STACK}}}
    report = verdict(_with_stacks(STACK, updated), deployments=record)
    assert report["host_stack_changes"] == [
        "kernel differs between nodes: head 6.17.0-1014-nvidia; worker 7.0.0-1019-nvidia",
        "worker: kernel 6.17.0-1014-nvidia -> 7.0.0-1019-nvidia"
        " since the deployment of 2027-01-15 07:00:00 UTC",
    ]
    # Shown, not judged: preflight stops on known-bad versions.
    assert report["healthy"]
    assert "host stack: kernel differs between nodes" in health_table(report)


def test_firmware_is_compared_device_by_device_and_an_old_record_without_stacks_compares_nothing():
    newer = {**STACK, "nic_firmware": {"rocep1s0f1": "28.45.5000"}}
    report = verdict(_with_stacks(STACK, newer), deployments={"current": {"image": "i", "time": NOW}})
    assert report["host_stack_changes"] == [
        "nic_firmware differs between nodes: head rocep1s0f1 28.45.4028; worker rocep1s0f1 28.45.5000"
    ]


def test_the_image_versions_recorded_with_the_deployment_are_shown():
    versions = {"torch": "2.13.0+cpu", "cuda": None, "nccl": None}
    record = {"current": {"image": "i", "time": NOW - 3600, "image_versions": versions}}
    lines = health_table(verdict(deployments=record)).splitlines()
    assert (
        "image: torch 2.13.0+cpu, cuda none, nccl none (as the fabric test read them in the serving image)"
        in lines
    )
    assert not [line for line in health_table(verdict()).splitlines() if line.startswith("image: ")]
