"""The Pi coding agent, installed from the npm registry by pi.yml, coding against the lab's API."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from deployment_support import STATE_DIR, PlaybookRun, api_key, changed_nothing, run_playbook

MODEL = "dsv41-sparks/deepseek-v4.1-flash"
REQUEST_LOG = f"{STATE_DIR}/cache/standin-requests.jsonl"


@pytest.fixture(scope="module")
def pi_home(tmp_path_factory) -> Path:
    """Everything Pi and pi.yml write goes under one directory, never the tester's home."""
    return tmp_path_factory.mktemp("pi")


def pi_playbook(home: Path, *args: str) -> PlaybookRun:
    paths = {"pi_prefix": home / "prefix", "pi_bin_dir": home / "bin", "pi_config_dir": home / "agent"}
    extra = [arg for name, path in paths.items() for arg in ("-e", f"{name}={path}")]
    run, _ = run_playbook("playbooks/pi.yml", *extra, *args)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


def ask_pi(lab, home: Path, prompt: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run Pi once, non-interactively, and return its run and the engine's record of its request."""
    since = time.time() - 1
    (home / "home").mkdir(exist_ok=True)
    run = subprocess.run(
        [str(home / "bin" / "pi"), "-p", prompt, "--model", MODEL, "--no-session"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180, check=False, cwd=home / "home",
        env={"PATH": "/usr/bin:/bin", "HOME": str(home / "home"), "PI_CODING_AGENT_DIR": str(home / "agent"),
             "PI_OFFLINE": "1", "DSV41_API_KEY": api_key(lab)},
    )  # fmt: skip
    records = [json.loads(line) for line in lab.ssh("head", f"cat {REQUEST_LOG}").stdout.splitlines()]
    from_pi = [
        r
        for r in records
        if r["ts"] >= since and (r.get("user_agent") or "").startswith("pi/") and r["method"] == "POST"
    ]
    assert from_pi, f"the engine saw no request from Pi; Pi said: {run.stdout[-1000:]} {run.stderr[-2000:]}"
    return run, from_pi[-1]


def test_pi_yml_installs_pi_and_a_second_run_changes_nothing(pi_home):
    checked = pi_playbook(pi_home, "--check")
    assert "changed=0" not in checked.stdout, "check mode reports the install it would do"
    assert list(pi_home.iterdir()) == [], "check mode writes nothing"
    first = pi_playbook(pi_home)
    assert "changed=0" not in first.stdout
    assert (pi_home / "prefix" / "pi" / "node_modules" / "@earendil-works" / "pi-coding-agent").is_dir()
    assert changed_nothing(pi_playbook(pi_home))
    assert changed_nothing(pi_playbook(pi_home, "--check"))


def test_pi_codes_against_the_lab_with_the_key_streaming_and_no_output_cap(lab, pi_home):
    run, request = ask_pi(lab, pi_home, "What is 17 * 23?")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "391" in run.stdout
    assert request["path"] == "/v1/chat/completions" and request["status"] == 200
    assert request["bearer_matched"] is True, "Pi authenticated with the key"
    assert request["model"] == "deepseek-v4.1-flash"
    assert request["stream"] is True
    assert not request["max_tokens_present"] and not request["max_completion_tokens_present"]


def test_no_pi_file_holds_the_key(lab, pi_home):
    key = api_key(lab).encode()
    holding = [path for path in pi_home.rglob("*") if path.is_file() and key in path.read_bytes()]
    assert holding == []


def test_without_the_extension_pi_sends_its_output_cap(lab, pi_home):
    """The control: the extension is what removes the cap (Pi sends it otherwise)."""
    pi_playbook(pi_home, "-e", "pi_remove_output_cap=false")
    try:
        _, request = ask_pi(lab, pi_home, "What is 17 * 23?")
        assert request["max_completion_tokens_present"] or request["max_tokens_present"]
    finally:
        pi_playbook(pi_home)
