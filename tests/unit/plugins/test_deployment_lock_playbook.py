"""The deployment lock end to end: site.yml's own lock tasks, run by ansible-playbook on this machine.

The playbook is site.yml's task that takes the lock (in a play of its own, as the deploying play's
settings) and its last play but one (give it back) around a play that copies the lock while the run
holds it (and, for the concurrency case, waits for the test's go-ahead).
Two inventory hosts, a head and a worker, both this machine over the local connection; the state
directory is a temporary one. Independent cases run at once, each with its own state directory.
"""

from __future__ import annotations

import calendar
import getpass
import json
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from local_pair import INVENTORY

REPO = Path(__file__).resolve().parents[3]
HOST = socket.gethostname()
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
USER = getpass.getuser()
STARTED = float(calendar.timegm((2026, 12, 3, 4, 10, 0)))
SINCE = "since 2026-12-03 04:10:00 UTC"
FORCE = "re-run with -e deployment_lock_force=true"
ADVICE = f"Wait for it to finish; if it is gone (run from another controller), {FORCE}."
TOOK_OVER = "[WARNING]: Took over the deployment lock on spark-head from ansible-playbook site.yml by alice"

MIDDLE = {
    "name": "Look at the lock while the run holds it",
    "hosts": "head:workers",
    "gather_facts": False,
    "tags": ["middle"],
    "tasks": [
        {
            "name": "Wait for the test's go-ahead",
            "ansible.builtin.wait_for": {"path": "{{ test_go_file }}", "timeout": 120},
            "run_once": True,
            "when": "test_go_file | length > 0",
        },
        {
            "name": "Copy the lock as it is now",
            "ansible.builtin.command": {"argv": ["cp", "-p", "{{ test_lock_file }}", "{{ test_seen_file }}"]},
            "delegate_to": "{{ groups['head'][0] }}",
            "run_once": True,
            "changed_when": False,
        },
        {
            "name": "Let another controller's run take the lock over",
            "ansible.builtin.copy": {
                "content": "{{ test_foreign_lock }}",
                "dest": "{{ test_lock_file }}",
                "mode": "0600",
            },
            "delegate_to": "{{ groups['head'][0] }}",
            "run_once": True,
            "when": "test_foreign_lock | length > 0",
        },
    ],
}


def outcome_play(play: dict) -> bool:
    """Whether ``play`` is the one that fails a run whose switch failed (only on the gate's group)."""
    tasks_from = [t.get("ansible.builtin.include_role", {}).get("tasks_from") for t in play["tasks"]]
    hosts = "{{ groups.release_switch_failed | default([]) }}"
    return tasks_from == ["outcome"] and play["hosts"] == hosts


LOCK_ROLE = {"name": "sparkserve.dsv41.deployment", "tasks_from": "lock"}


def is_lock_task(task: dict, state: str) -> bool:
    """Whether ``task`` takes (``acquired``) or gives back (``released``) the lock, whatever the tags."""
    return (
        task.get("ansible.builtin.import_role") == LOCK_ROLE
        and task.get("vars") == {"deployment_lock_state": state}
        and task.get("tags") == ["always"]
    )


def deploying_play() -> dict:
    """site.yml's first play, the one that deploys: preflight first, the lock right after it."""
    return yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())[0]


def lock_plays() -> tuple[dict, dict]:
    """A play of site.yml's task that takes the lock, with the deploying play's settings, and
    site.yml's last play but one, which gives it back; after it, only the play that fails a run
    whose switch failed, once the lock is given back."""
    plays = yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())
    assert outcome_play(plays[-1])
    deploying, last = plays[0], plays[-2]
    (take,) = [task for task in deploying["tasks"] if is_lock_task(task, "acquired")]
    first = {
        "name": "Take the deployment lock",
        **{key: deploying[key] for key in ("hosts", "gather_facts", "any_errors_fatal")},
        "tasks": [take],
    }
    (give_back,) = last["tasks"]
    assert is_lock_task(give_back, "released")
    return first, last


@dataclass
class Case:
    """One case's files and, once run, what happened."""

    root: Path
    rc: int = -1
    output: str = ""
    pid: int = 0
    lock_after: bytes | None = None
    # The lock as the middle play copied it (holder and mode), None when that play never ran.
    seen: dict | None = None
    seen_mode: int = 0

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def lock(self) -> Path:
        return self.state / "deployment.lock"

    @property
    def seen_file(self) -> Path:
        return self.root / "seen.json"

    @property
    def go(self) -> Path:
        return self.root / "go"

    def write_lock(self, **fields) -> None:
        self.state.mkdir(mode=0o700, exist_ok=True)
        self.lock.write_text(foreign_lock(**fields))
        self.lock.chmod(0o600)


def start(case: Case, *extra: str, wait: bool = False, foreign_lock: str = "") -> subprocess.Popen:
    first, last = lock_plays()
    playbook = case.root / "playbook.yml"
    playbook.write_text(yaml.safe_dump([first, MIDDLE, last], sort_keys=False))
    inventory = case.root / "hosts.yml"
    inventory.write_text(yaml.safe_dump(INVENTORY))
    variables = {
        "deployment_state_dir": str(case.state),
        "test_lock_file": str(case.lock),
        "test_seen_file": str(case.seen_file),
        "test_go_file": str(case.go) if wait else "",
        "test_foreign_lock": foreign_lock,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    env.update(ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(case.root / "tmp"))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook), "-i", str(inventory)]
    argv += ["-e", json.dumps(variables), *extra]
    return subprocess.Popen(
        argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def finish(case: Case, process: subprocess.Popen) -> Case:
    stdout, stderr = process.communicate(timeout=300)
    case.rc, case.pid = process.returncode, process.pid
    case.output = " ".join((stdout + "\n" + stderr).split())  # the callback folds long lines
    case.lock_after = case.lock.read_bytes() if case.lock.exists() else None
    if case.seen_file.exists():  # taken away, so that a later run in the same directory starts clean
        case.seen = json.loads(case.seen_file.read_text())["holder"]
        case.seen_mode = case.seen_file.stat().st_mode & 0o777
        case.seen_file.unlink()
    return case


def run(case: Case, *extra: str, foreign_lock: str = "") -> Case:
    return finish(case, start(case, *extra, foreign_lock=foreign_lock))


def message(controller: str, pid: int) -> str:
    return (
        "Another run holds the deployment lock on spark-head: ansible-playbook site.yml by alice on "
        f"controller {controller} (pid {pid}) {SINCE}. {ADVICE}"
    )


# --------------------------------------------------------------------------- the cases


def first_and_second(root: Path) -> tuple[Case, Case]:
    first = run(Case(root))
    return first, run(Case(root))


def dead_holder(root: Path) -> tuple[Case, int]:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    case = Case(root)
    case.write_lock(pid=gone.pid)
    return run(case), gone.pid


def token_of_this_process() -> str:
    """This process's run token as the action makes it (in a child interpreter: importing the action
    switches a process to controller mode)."""
    child = (
        "import sys\n"
        "from ansible_collections.sparkserve.dsv41.plugins.action import deployment_lock as lock\n"
        "print(lock.this_run(0.0, pid=int(sys.argv[1]))['token'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "collections")}
    argv = [sys.executable, "-c", child, str(os.getpid())]
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()


LIVE_TOKEN = token_of_this_process()


def foreign_lock(**fields) -> str:
    """A lock held by this test process (alive on this controller), unless ``fields`` say otherwise."""
    holder = {
        "controller": HOST,
        "pid": os.getpid(),
        "boot_id": BOOT_ID,
        "user": "alice",
        "playbook": "site.yml",
        "started": STARTED,
        "token": LIVE_TOKEN,
        **fields,
    }
    return json.dumps({"holder": holder})


def with_lock(root: Path, *extra: str, **fields) -> tuple[Case, bytes]:
    case = Case(root)
    case.write_lock(**fields)
    before = case.lock.read_bytes()
    return run(case, *extra), before


def two_runs_at_once(root: Path) -> tuple[Case, Case, float]:
    holding = Case(root / "a")
    holding.root.mkdir()
    process = start(holding, wait=True)
    deadline = time.monotonic() + 120
    while not holding.lock.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the first run never took the lock"
        time.sleep(0.2)
    took = time.time()
    second = Case(root / "b")
    second.root.mkdir()
    second = run(second, "-e", json.dumps({"deployment_state_dir": str(holding.state)}))
    holding.go.touch()
    return finish(holding, process), second, took


CASES = {
    "first": first_and_second,
    "dead": dead_holder,
    "rebooted": lambda root: with_lock(root, boot_id="an-earlier-boot"),
    "live": with_lock,
    # This process's pid with another process's token: the holder's pid was given to a later process.
    "reused": lambda root: with_lock(root, token="f" * 32),
    "other": lambda root: with_lock(root, controller="box", pid=4242),
    "forced": lambda root: with_lock(root, "-e", "deployment_lock_force=true", controller="box", pid=4242),
    "check_first": lambda root: run(Case(root), "--check"),
    "check_live": lambda root: with_lock(root, "--check"),
    "tags": lambda root: run(Case(root), "--tags", "middle"),
    "limit": lambda root: run(Case(root), "--limit", "spark-worker"),
    "concurrent": two_runs_at_once,
    "taken_from_it": lambda root: run(Case(root), foreign_lock=foreign_lock(controller="box", pid=4242)),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = {name: pool.submit(case, tmp_path_factory.mktemp(name)) for name, case in CASES.items()}
        return {name: future.result() for name, future in futures.items()}


def assert_this_run_held_it(case: Case) -> None:
    holder = case.seen
    assert holder is not None, case.output[-3000:]
    assert holder["pid"] == case.pid, (
        "the ansible-playbook process: the parent of the worker running the action"
    )
    assert (holder["controller"], holder["boot_id"], holder["user"]) == (HOST, BOOT_ID, USER)
    assert holder["playbook"] == "playbook.yml"
    assert re.fullmatch(r"[0-9a-f]{32}", holder["token"])
    assert case.seen_mode == 0o600


def test_a_first_run_creates_the_state_directory_takes_the_lock_and_gives_it_back(cases):
    first, second = cases["first"]
    assert first.rc == 0, first.output[-3000:]
    assert_this_run_held_it(first)
    assert time.time() - 300 < first.seen["started"] <= time.time()
    assert first.state.stat().st_mode & 0o777 == 0o700
    assert first.lock_after is None, "given back at the end"
    assert sorted(path.name for path in first.state.iterdir()) == [".deployment.lock.guard"]

    assert second.rc == 0, second.output[-3000:]
    assert second.seen["token"] != first.seen["token"], "another run, another token"
    assert second.lock_after is None
    recap = re.findall(r"spark-\w+ : ok=\d+ changed=(\d+)", second.output)
    assert recap == ["0", "0"], "taking and giving back the lock is no change to report"


def test_a_lock_left_by_a_dead_run_of_this_controller_is_taken_over(cases):
    case, pid = cases["dead"]
    assert case.rc == 0, case.output[-3000:]
    assert (
        f"{TOOK_OVER} on controller {HOST} (pid {pid}) {SINCE}: its ansible-playbook (pid {pid}) is no "
        "longer running on this controller." in case.output
    ), case.output[-3000:]
    assert_this_run_held_it(case)
    assert case.lock_after is None


def test_a_lock_whose_pid_another_process_has_now_is_taken_over(cases):
    case, _ = cases["reused"]
    assert case.rc == 0, case.output[-3000:]
    pid = os.getpid()
    assert (
        f"{TOOK_OVER} on controller {HOST} (pid {pid}) {SINCE}: its ansible-playbook (pid {pid}) is no "
        f"longer running on this controller (pid {pid} is another process now)." in case.output
    ), case.output[-3000:]
    assert_this_run_held_it(case)


def test_a_lock_from_before_the_controllers_reboot_is_taken_over_even_if_its_pid_lives(cases):
    case, _ = cases["rebooted"]
    assert case.rc == 0, case.output[-3000:]
    assert (
        f"{TOOK_OVER} on controller {HOST} (pid {os.getpid()}) {SINCE}: controller {HOST} has rebooted since "
        "that run took it." in case.output
    ), case.output[-3000:]
    assert_this_run_held_it(case)
    assert case.lock_after is None


@pytest.mark.parametrize(("name", "controller", "pid"), [("live", HOST, None), ("other", "box", 4242)])
def test_a_live_or_foreign_holder_stops_the_run_at_once_naming_it(cases, name, controller, pid):
    case, before = cases[name]
    assert case.rc != 0
    assert "fatal: [spark-head]: FAILED!" in case.output
    assert message(controller, pid or os.getpid()) in case.output, case.output[-3000:]
    assert case.seen is None, "nothing after the lock play ran"
    assert case.lock_after == before, "the holder's lock is untouched"


def test_force_takes_over_whatever_holds_it(cases):
    case, _ = cases["forced"]
    assert case.rc == 0, case.output[-3000:]
    assert f"{TOOK_OVER} on controller box (pid 4242) {SINCE}: deployment_lock_force is true." in case.output
    assert_this_run_held_it(case)
    assert case.lock_after is None


def test_check_mode_creates_nothing_and_still_stops_at_a_live_holder(cases):
    first = cases["check_first"]
    assert first.rc == 0, first.output[-3000:]
    assert not first.state.exists(), "no state directory, no lock"
    live, before = cases["check_live"]
    assert live.rc != 0
    assert message(HOST, os.getpid()) in live.output
    assert live.lock_after == before


def test_a_run_limited_by_tags_is_locked_too(cases):
    case = cases["tags"]
    assert case.rc == 0, case.output[-3000:]
    assert_this_run_held_it(case)
    assert case.lock_after is None


def test_a_run_limited_to_a_worker_locks_the_head(cases):
    case = cases["limit"]
    assert case.rc == 0, case.output[-3000:]
    assert "ok: [spark-worker -> spark-head]" in case.output
    assert_this_run_held_it(case)
    assert case.lock_after is None


def test_a_second_run_while_the_first_holds_the_lock_stops_naming_it(cases):
    holding, second, took = cases["concurrent"]
    assert second.rc != 0
    expected = (
        f"Another run holds the deployment lock on spark-head: ansible-playbook playbook.yml by {USER} on "
        f"controller {HOST} (pid {holding.pid}) since "
    )
    assert expected in second.output, second.output[-3000:]
    when = re.search(
        re.escape(expected) + r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\. " + re.escape(ADVICE), second.output
    )
    assert when, second.output[-3000:]
    assert abs(calendar.timegm(time.strptime(when.group(1), "%Y-%m-%d %H:%M:%S")) - took) < 60
    assert holding.rc == 0, holding.output[-3000:]
    assert_this_run_held_it(holding)
    assert holding.lock_after is None, "the first run gave it back at its end"


# --------------------------------------------------------------------------- the playbooks that deploy


def test_site_takes_the_lock_right_after_preflight_and_gives_it_back_last():
    plays = yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())
    deploying = plays[0]
    assert deploying["any_errors_fatal"] is True, "a refused lock stops every host"
    # Preflight changes nothing: a run that fails its checks leaves no lock (which pauses the
    # supervisor); every role after it that changes something runs under the lock.
    imported = [task.get("ansible.builtin.import_role", {}).get("name") for task in deploying["tasks"]]
    assert imported[0] == "sparkserve.dsv41.preflight"
    assert is_lock_task(deploying["tasks"][1], "acquired")
    # Whatever fails once the lock is held gives it back first: the rest of the deploying play is
    # one block, and so are the start-up report and the rollback's start, each rescued by the
    # give-back, then the failure, on every node at once (a node that went on would run unlocked).
    (deploy,) = deploying["tasks"][2:]
    report = next(play for play in plays[1:] if "failed to start" in play["name"])
    rollback = next(play for play in plays[1:] if "the ranks in order" in play["name"])
    for play, rescued in (
        (deploying, deploy),
        (report, report["tasks"][0]),
        (rollback, rollback["tasks"][0]),
    ):
        assert play["any_errors_fatal"] is True, play["name"]
        give_back, *recorded, fail = rescued["rescue"]
        assert is_lock_task(give_back, "released")
        assert all(task["tags"] == ["always"] for task in rescued["rescue"]), "rescued under any --tags"
        if play is rollback:
            # The switch failed before its rollback did: it is recorded, and the run ends naming both.
            (record,) = recorded
            assert record["ansible.builtin.include_role"]["tasks_from"] == "rollback_check"
            assert record["vars"] == {"release_rollback_start_failed": True}
            assert fail["ansible.builtin.include_role"]["tasks_from"] == "outcome"
        else:
            assert recorded == [] and "ansible.builtin.fail" in fail
    # After the lock is given back, only the play that fails a run whose switch failed.
    assert outcome_play(plays[-1])
    (give_back,) = plays[-2]["tasks"]
    assert is_lock_task(give_back, "released")
    others = [play for play in plays[1:-2] if play is not report and play is not rollback]
    assert all("deployment_lock_state" not in json.dumps(play) for play in others)


def test_teardown_takes_the_lock_first_and_gives_it_back_last():
    plays = yaml.safe_load((REPO / "playbooks" / "teardown.yml").read_text())
    first, last = lock_plays()
    assert plays[0]["any_errors_fatal"] is True, "a refused lock stops every host"
    # Only checks come before the lock: that the head is in the run (its supervisor would start
    # again what a run without it stopped), and the purge's (in check mode, changing nothing).
    head, check, *taking = plays[0]["tasks"]
    assert "ansible.builtin.assert" in head and head["tags"] == ["always"]
    assert check["vars"] == {"deployment_purge_check_only": True}
    assert [taking, plays[-1]] == [first["tasks"], last]
    assert all("deployment_lock_state" not in json.dumps(play) for play in plays[1:-1])


def test_restart_gets_the_lock_from_site_even_for_the_ranks_alone():
    plays = yaml.safe_load((REPO / "playbooks" / "restart.yml").read_text())
    assert [play["ansible.builtin.import_playbook"] for play in plays] == ["site.yml"]
    listed = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "restart.yml",
            "--list-tasks",
            "--tags",
            "rank",
        ],
        cwd=REPO,
        text=True,
        capture_output=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    tasks = re.findall(r"^ {6}(\S.*?)\tTAGS", listed.stdout, flags=re.MULTILINE)
    # The lock's entry point is imported: its tasks are listed, before any task of a role that
    # changes something (only the settings and preflight's argument checks, which change nothing,
    # come first), and last but one.
    lock = [
        "sparkserve.dsv41.deployment : Validating arguments against arg spec 'lock' - Take or give back the"
        " deployment lock on the head (site.yml, teardown.yml, restart.yml)",
        "sparkserve.dsv41.deployment : Check the shared settings a run needs",
        "sparkserve.dsv41.deployment : Take or give back the deployment lock",
    ]
    taken = tasks.index(lock[0])
    assert tasks[taken : taken + 3] == lock
    changing = ("memguard", "checkpoint", "release", "image", "rank", "supervisor")
    assert not [
        task for task in tasks[:taken] if task.startswith(tuple(f"sparkserve.dsv41.{r} :" for r in changing))
    ]
    assert tasks[-4:] == [*lock, "Fail the run naming a switch that failed"]
    # A switch of the ranks alone pulls its image first, not while the ranks are down.
    pull = tasks.index("sparkserve.dsv41.image : Pull the serving image by digest")
    assert pull < min(i for i, task in enumerate(tasks) if task.startswith("sparkserve.dsv41.rank :"))


def test_a_run_whose_lock_was_taken_over_leaves_the_new_holders_lock(cases):
    case = cases["taken_from_it"]
    assert case.rc == 0, case.output[-3000:]
    assert (
        "[WARNING]: The deployment lock on spark-head is held by ansible-playbook site.yml by alice on "
        f"controller box (pid 4242) {SINCE}, not by this run (it was taken over): left it in place."
        in case.output
    ), case.output[-3000:]
    assert case.lock_after == foreign_lock(controller="box", pid=4242).encode()
