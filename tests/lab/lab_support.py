"""What the lab acceptance tests know about the lab: its addresses, and how to reach the nodes."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LABCTL = [sys.executable, str(REPO / "lab" / "labctl.py")]
STATE = REPO / ".lab"
LAB_USER = "spark"
MGMT_ADDRESS = {"head": "198.19.0.13", "worker": "198.19.0.11"}
FABRIC_ADDRESS = {"head": "198.18.0.13", "worker": "198.18.0.11"}
REGISTRY = "198.18.0.1:5000"
ENGINE_REPO = "sparkserve-lab/vllm-standin"
HUB_ENDPOINT = "http://198.19.0.1:5080"
HUB_REPO = "0xSero/DeepSeek-V4.1-Flash-Spark"
WHEELS_URL = "http://198.19.0.1:5081/"


def labctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LABCTL, *args], check=True, text=True, capture_output=True)


def lab_resources() -> dict[str, list[str]]:
    def listing(*argv: str) -> list[str]:
        return subprocess.run(
            ["docker", *argv, "--filter", "label=sparkserve.lab"], check=True, text=True, capture_output=True
        ).stdout.split()

    return {
        "containers": listing("ps", "-aq"),
        "networks": listing("network", "ls", "-q"),
        "volumes": listing("volume", "ls", "-q"),
    }


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
        argv = [
            "ssh",
            "-i",
            str(self.key),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            f"UserKnownHostsFile={STATE / 'ssh' / 'known_hosts'}",
            f"{LAB_USER}@{MGMT_ADDRESS[node]}",
            command,
        ]
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
        subprocess.run(
            [
                "rsync",
                "-a",
                "-e",
                f"ssh -i {shlex.quote(str(self.key))} -o BatchMode=yes "
                f"-o UserKnownHostsFile={STATE / 'ssh' / 'known_hosts'}",
                f"{source}/",
                f"{LAB_USER}@{MGMT_ADDRESS[node]}:{dest}/",
            ],
            check=True,
        )


def wait_for(predicate, timeout: float, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
