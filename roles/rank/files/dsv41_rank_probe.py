"""One look at a rank during start-up: is the API ready, or is this node's rank gone?

Exit 0: the API answers (``--health-url`` 200, and ``--models-url`` 200 with the key when given).
Exit 1: still starting; ask again later.
Exit 2: this node's rank container is not running, or restarted more often than
``--restarts-before`` (its count when the role started it): start-up failed, waiting is pointless.

The key is read from ``--key-file`` (never taken on the command line, so it is not in ``ps``).
Stdlib only: it runs with the node's python3.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request

READY, STARTING, GONE = 0, 1, 2


def http_ok(url: str, key: str | None = None) -> bool:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as reply:  # noqa: S310 - URLs from the role
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def container_state(docker: str, name: str) -> dict | None:
    result = subprocess.run(  # noqa: S603 - argv list
        [docker, "inspect", "--format", "{{json .State}}|{{.RestartCount}}", name],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    if result.returncode != 0:
        return None
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--health-url", required=True)
    parser.add_argument("--models-url")
    parser.add_argument("--key-file")
    parser.add_argument("--restarts-before", type=int, default=0)
    parser.add_argument("--docker", default="docker")
    args = parser.parse_args(argv)
    key = None
    if args.key_file:
        with open(args.key_file, encoding="utf-8") as handle:
            key = handle.read().strip()
    ready = http_ok(args.health_url) and (not args.models_url or http_ok(args.models_url, key))
    if ready:
        print("ready")
        return READY
    reason = gone_reason(container_state(args.docker, args.container), args.container, args.restarts_before)
    if reason:
        print(reason)
        return GONE
    print("starting")
    return STARTING


if __name__ == "__main__":
    sys.exit(main())
