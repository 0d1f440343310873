"""What the lab acceptance tests know about the lab: taken from lab/labctl.py, never restated."""

from __future__ import annotations

import contextlib
import fcntl
import shlex
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))
import labctl  # noqa: E402 - the lab's single source of addresses, names and SSH options

LABCTL = [sys.executable, str(REPO / "lab" / "labctl.py")]
STATE = labctl.STATE  # this lab's (SPARKSERVE_LAB_INSTANCE)
LAB_ROOT = labctl.LAB_ROOT  # every lab's: the suites' results
LAB_USER = labctl.LAB_USER
LAYOUT = labctl.layout(workers=1)
CONTAINER = {name: node["container"] for name, node in LAYOUT["nodes"].items()}
MGMT_ADDRESS = {name: node["mgmt"] for name, node in LAYOUT["nodes"].items()}
FABRIC_ADDRESS = {name: node["fabric"] for name, node in LAYOUT["nodes"].items()}
REGISTRY = LAYOUT["registry"]
ENGINE_REPO = labctl.ENGINE_REPO
HUB_ENDPOINT = LAYOUT["hub"]
HUB_REPO = labctl.HUB_REPO
WHEELS_URL = LAYOUT["wheels"]
WHEELS_HOST = urllib.parse.urlsplit(WHEELS_URL).hostname
API_URL = f"http://{MGMT_ADDRESS['head']}:{labctl.API_PORT}"
http_status = labctl.http_status
PROMETHEUS_URL = LAYOUT["prometheus"]
PROMETHEUS_KEY_FILE = labctl.PROMETHEUS_KEY_FILE


def labctl_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LABCTL, *args], check=True, text=True, capture_output=True)


def lab_resources() -> dict[str, list[str]]:
    return {kind + "s": sorted(labctl.lab_resources(kind)) for kind in ("container", "network", "volume")}


@dataclass
class Lab:
    engine_image: str
    hub_token: str
    key: Path

    def ssh(
        self,
        node: str,
        command: str,
        *,
        check: bool = True,
        timeout: int = 300,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``command`` on ``node`` over SSH as the lab user, as Ansible does."""
        argv = ["ssh", *labctl.ssh_options(self.key), f"{LAB_USER}@{MGMT_ADDRESS[node]}", command]
        result = subprocess.run(
            argv,
            check=False,
            text=True,
            capture_output=True,
            timeout=timeout,
            input=input_text if input_text is not None else "",
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{node}: {command!r} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    def copy_to(self, node: str, source: Path, dest: str) -> None:
        ssh = " ".join(shlex.quote(option) for option in ["ssh", *labctl.ssh_options(self.key)])
        subprocess.run(
            ["rsync", "-a", "-e", ssh, f"{source}/", f"{LAB_USER}@{MGMT_ADDRESS[node]}:{dest}/"], check=True
        )


@contextlib.contextmanager
def the_machine(*, exclusive: bool):
    """Labs side by side share this machine's cores and memory. A case that measures against them
    (the bench's rates within 3 %, a guard's floor set from the memory available now) holds it
    ``exclusive``; the other lab's cases, which start and stop ranks, hold it shared and wait."""
    LAB_ROOT.mkdir(parents=True, exist_ok=True)
    with open(LAB_ROOT / "machine.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def wait_for(predicate, timeout: float, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
