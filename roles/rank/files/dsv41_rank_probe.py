"""A look at a rank during start-up: is the API ready, or is this node's rank gone?

It looks every second for up to ``--wait-seconds`` (0: once) and exits at the first answer, so a
rank that becomes ready is seen within a second, not at the role's next poll.

Exit 0: the API answers (``--health-url`` 200, and ``--models-url`` 200 with the key when given).
Exit 1: still starting when the time was up, or docker did not answer on the container; ask again.
Exit 2: this node's rank container is not running, or restarted more often than
``--restarts-before`` (its count when the role started it): start-up failed, waiting is pointless.

The key is read from ``--key-file`` (never taken on the command line, so it is not in ``ps``).
Stdlib only: it runs with the node's python3.
"""

from __future__ import annotations

import argparse
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

READY, STARTING, GONE = 0, 1, 2
LOOK_INTERVAL_S = 1.0
INSPECT_TIMEOUT_S = 30.0


# The node's own API, directly: an http_proxy in the environment would be sent the key. A worker
# reads the head's /health through the gateway, which may serve the user's certificate for a name
# the fabric address is not: that probe sends no key, so it does not check the certificate.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_HEALTH_OPENER = urllib.request.build_opener(
    urllib.request.ProxyHandler({}),
    urllib.request.HTTPSHandler(context=ssl._create_unverified_context()),  # noqa: S323 - no key is sent
)


def http_ok(url: str, key: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    opener = _OPENER if key else _HEALTH_OPENER
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=5) as reply:  # noqa: S310 - URLs from the role
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


class DockerUnanswered(Exception):
    """Docker gave no answer on the container (its daemon down or slow): nothing is known of it."""


def container_state(docker: str, name: str) -> dict | None:
    """The container's state; None when docker says there is no such container."""
    try:
        result = subprocess.run(  # noqa: S603 - argv list
            [docker, "inspect", "--format", "{{json .State}}|{{.RestartCount}}", name],
            capture_output=True, text=True, check=False, timeout=INSPECT_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise DockerUnanswered(f"docker inspect timed out after {INSPECT_TIMEOUT_S:g} s") from None
    if result.returncode != 0:
        if "no such" in result.stderr.lower():  # "Error: No such object: <name>"
            return None
        error = result.stderr.strip()
        raise DockerUnanswered(error.splitlines()[-1] if error else f"exit code {result.returncode}")
    state, restarts = result.stdout.strip().rsplit("|", 1)
    return {**json.loads(state), "RestartCount": int(restarts)}


def gone_reason(state: dict | None, name: str, restarts_before: int = 0) -> str | None:
    """Why the rank counts as failed, or None while it may still come up."""
    if state is None:
        return f"container {name} does not exist"
    if state.get("Restarting") or state.get("RestartCount", 0) > restarts_before:
        return f"container {name} exited (code {state.get('ExitCode')}) and is being restarted"
    if not state.get("Running"):
        return f"container {name} is {state.get('Status')} (exit code {state.get('ExitCode')})"
    return None


def watch(
    look: Callable[[], tuple[int, str]],
    wait_seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, str]:
    """Look until the answer is READY or GONE, or ``wait_seconds`` have passed (at least one look)."""
    deadline = clock() + wait_seconds
    while True:
        code, message = look()
        remaining = deadline - clock()
        if code != STARTING or remaining <= 0:
            return code, message
        sleep(min(LOOK_INTERVAL_S, remaining))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--health-url", required=True)
    parser.add_argument("--models-url")
    parser.add_argument("--key-file")
    parser.add_argument("--restarts-before", type=int, default=0)
    parser.add_argument("--wait-seconds", type=float, default=0.0)
    parser.add_argument("--docker", default="docker")
    args = parser.parse_args(argv)
    key = None
    if args.key_file:
        with open(args.key_file, encoding="utf-8") as handle:
            key = handle.read().strip()

    def look() -> tuple[int, str]:
        if http_ok(args.health_url) and (not args.models_url or http_ok(args.models_url, key)):
            return READY, "ready"
        try:
            state = container_state(args.docker, args.container)
        except DockerUnanswered as exc:  # one slow answer of the daemon fails no start-up
            return STARTING, f"starting (docker did not answer: {exc})"
        reason = gone_reason(state, args.container, args.restarts_before)
        return (GONE, reason) if reason else (STARTING, "starting")

    code, message = watch(look, args.wait_seconds)
    print(message)
    return code


if __name__ == "__main__":
    sys.exit(main())
