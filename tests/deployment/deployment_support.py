"""Running the playbooks as a user would, from this checkout or from the installed collection."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab_support import REPO

INVENTORY = str(REPO / "inventory" / "lab")
STATE_DIR = "/home/spark/.dsv41-two-sparks"
# The model root; each checkpoint revision lives in <MODEL_DIR>/revisions/<commit>.
MODEL_DIR = "/home/spark/models/DeepSeek-V4.1-Flash-Spark"


def served_revision(lab) -> str:
    """The checkpoint revision (commit) that serves now, from the head's deployment record."""
    return json.loads(lab.ssh("head", f"cat {STATE_DIR}/deployments.json").stdout)["current"]["revision"]


def model_dir(lab) -> str:
    """The directory of the revision that serves now (the same path on every lab node)."""
    return f"{MODEL_DIR}/revisions/{served_revision(lab)}"


def user_environment(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: molecule's ANSIBLE_* settings (its own ansible.cfg,
    callbacks, paths) must not leak into the runs these tests make as that user."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "MOLECULE_"))}
    return {**env, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", **extra}


@dataclass
class PlaybookRun:
    """One ansible-playbook run through ansible-runner: its exit code, its text output, and the
    per-host results read from the runner's events (not parsed from the text)."""

    returncode: int
    stdout: str
    stderr: str
    events: list[dict[str, Any]]

    @property
    def stats(self) -> dict[str, dict[str, int]]:
        """Per host: ok (changed included), changed, failures, skipped, rescued, ignored, unreachable."""
        final = [event for event in self.events if event.get("event") == "playbook_on_stats"]
        if not final:
            return {}
        data = final[-1]["event_data"]
        keys = {"ok": "ok", "changed": "changed", "failures": "failures", "skipped": "skipped",
                "rescued": "rescued", "ignored": "ignored", "dark": "unreachable"}  # fmt: skip
        hosts = set().union(*(data.get(key) or {} for key in keys))
        return {
            host: {name: (data.get(key) or {}).get(host, 0) for key, name in keys.items()} for host in hosts
        }

    def results_of(self, task: str, host: str) -> list[dict[str, Any]]:
        """The results (``res``) the host had for the task named ``task`` (its name without the role)."""
        return [
            event["event_data"]["res"]
            for event in self.events
            if event.get("event") in ("runner_on_ok", "runner_on_failed")
            and event["event_data"].get("host") == host
            and event["event_data"].get("task", "").split(" : ")[-1] == task
        ]

    def task_results(self, host: str) -> int:
        """How many task results the host had: every ok (changed included), skip and failure."""
        counts = self.stats.get(host, {})
        return counts.get("ok", 0) + counts.get("skipped", 0) + counts.get("failures", 0)


def run_playbook(
    playbook: str,
    *args: str,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    inventory: str = INVENTORY,
) -> tuple[PlaybookRun, float]:
    """Run a playbook (a path relative to ``cwd``, or a name from the installed collection) on the
    lab with ansible-runner, from ``cwd`` (whose ansible.cfg applies); return the run and its seconds."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dsv41-runner.") as private:
        argv = [
            "ansible-runner", "run", private, "--playbook", playbook, "--project-dir", str(cwd),
            "--inventory", inventory, "--ident", "run", "--quiet", f"--cmdline={shlex.join(args)}",
        ]  # fmt: skip
        runner = subprocess.run(
            argv, text=True, capture_output=True, check=False, env=env or user_environment()
        )
        artifacts = Path(private) / "artifacts" / "run"
        if not (artifacts / "rc").is_file():
            raise AssertionError(f"ansible-runner did not run {playbook}: {runner.stdout}{runner.stderr}")
        events = [
            json.loads(path.read_text())
            for path in sorted(
                (artifacts / "job_events").glob("*.json"), key=lambda p: int(p.name.split("-")[0])
            )
        ]
        run = PlaybookRun(
            returncode=int((artifacts / "rc").read_text().strip()),
            stdout=(artifacts / "stdout").read_text(errors="replace"),
            stderr=(artifacts / "stderr").read_text(errors="replace")
            if (artifacts / "stderr").is_file()
            else "",
            events=events,
        )
    return run, time.monotonic() - started


def site(*args: str) -> tuple[PlaybookRun, float]:
    return run_playbook("playbooks/site.yml", *args)


def changed_nothing(run: PlaybookRun) -> bool:
    return bool(run.stats) and all(host["changed"] == 0 for host in run.stats.values())


def api_key(lab) -> str:
    """The key site.yml generated on the head (read over SSH, as a user would)."""
    return lab.ssh("head", f"cat {STATE_DIR}/api_key").stdout.strip()


def supervisor_state(lab) -> dict:
    """The head's supervisor's state document."""
    return json.loads(lab.ssh("head", f"cat {STATE_DIR}/supervisor-state.json").stdout)


def supervisor_log(lab) -> str:
    return lab.ssh("head", f"cat {STATE_DIR}/supervisor.log").stdout
