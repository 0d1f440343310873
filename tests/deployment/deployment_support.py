"""Running the playbooks as a user would, from this checkout or from the installed collection."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from lab_support import REPO

INVENTORY = str(REPO / "inventory" / "lab")
STATE_DIR = "/home/spark/.dsv41-two-sparks"
MODEL_DIR = "/home/spark/models/DeepSeek-V4.1-Flash-Spark"


def user_environment(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: molecule's ANSIBLE_* settings (its own ansible.cfg,
    callbacks, paths) must not leak into the runs these tests make as that user."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "MOLECULE_"))}
    return {**env, "ANSIBLE_FORCE_COLOR": "0", **extra}


def run_playbook(
    playbook: str, *args: str, cwd: Path = REPO, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    """Run a playbook (a path, or a name from the installed collection) on the lab; return the run
    and its seconds."""
    started = time.monotonic()
    run = subprocess.run(
        ["ansible-playbook", playbook, "-i", INVENTORY, *args],
        cwd=cwd, text=True, capture_output=True, check=False, env=env or user_environment(),
    )  # fmt: skip
    return run, time.monotonic() - started


def site(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    return run_playbook("playbooks/site.yml", *args)


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counts per host."""
    return {
        host: {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", counts)}
        for host, counts in re.findall(r"^(\S+)\s+: (ok=.*)$", output, re.MULTILINE)
    }


def changed_nothing(run: subprocess.CompletedProcess) -> bool:
    counts = recap(run.stdout)
    return bool(counts) and all(host["changed"] == 0 for host in counts.values())


def api_key(lab) -> str:
    """The key site.yml generated on the head (read over SSH, as a user would)."""
    return lab.ssh("head", f"cat {STATE_DIR}/api_key").stdout.strip()
