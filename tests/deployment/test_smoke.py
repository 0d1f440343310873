"""smoke.yml on the lab: passes on the stand-in engine, fails naming the checks it answers wrongly."""

from __future__ import annotations

import json

from deployment_support import api_key, run_playbook, site

CHECKS = ["text", "tool_call", "vision", "reasoning", "stream"]


def table_rows(output: str) -> dict[str, str]:
    """check name -> PASS/FAIL, from the table smoke.yml printed."""
    rows = {}
    for line in output.splitlines():
        words = line.strip().strip('",').split()
        if len(words) >= 2 and words[0] in CHECKS and words[1] in ("PASS", "FAIL"):
            rows[words[0]] = words[1]
    return rows


def test_smoke_passes_against_the_lab_and_never_prints_the_key(lab):
    run, _ = run_playbook("playbooks/smoke.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert table_rows(run.stdout) == dict.fromkeys(CHECKS, "PASS"), run.stdout[-3000:]
    assert "391" in run.stdout
    assert api_key(lab) not in run.stdout + run.stderr


def test_smoke_fails_naming_the_checks_the_engine_answers_wrongly():
    faults = {"rank_extra_env": {"STANDIN_FAULTS": "wrong_math,no_tool_call,swap_colors"}}
    started, _ = site("--tags", "rank", "-e", json.dumps(faults))
    try:
        assert started.returncode == 0, started.stdout[-3000:]
        run, _ = run_playbook("playbooks/smoke.yml")
        assert run.returncode != 0
        assert table_rows(run.stdout) == {
            "text": "FAIL", "tool_call": "FAIL", "vision": "FAIL", "reasoning": "PASS", "stream": "PASS",
        }, run.stdout[-3000:]  # fmt: skip
        assert "Smoke check(s) failed: text, tool_call, vision" in run.stdout
    finally:
        restored, _ = site("--tags", "rank")
        assert restored.returncode == 0, restored.stdout[-3000:]


def test_smoke_fails_with_a_wrong_key():
    run, _ = run_playbook("playbooks/smoke.yml", "-e", "smoke_api_key=not-the-key")
    assert run.returncode != 0
    assert table_rows(run.stdout) == dict.fromkeys(CHECKS, "FAIL")
    assert "HTTP 401" in run.stdout
    assert "not-the-key" not in run.stdout
