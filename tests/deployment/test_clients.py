"""The clients on the lab: smoke.yml proves the answers, bench.yml measures the set rates."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from deployment_support import api_key, run_playbook, site

CHECKS = ["text", "tool_call", "vision", "reasoning", "stream"]
DECODE, PREFILL = 40.0, 8000.0


def table_rows(output: str) -> dict[str, str]:
    """check name -> PASS/FAIL, from the table smoke.yml printed."""
    return dict(re.findall(rf"^\s*({'|'.join(CHECKS)})\s+(PASS|FAIL)\b", output, re.MULTILINE))


def test_smoke_passes_against_the_lab_and_never_prints_the_key(lab):
    run, _ = run_playbook("playbooks/smoke.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    assert table_rows(run.stdout) == dict.fromkeys(CHECKS, "PASS"), run.stdout[-3000:]
    assert "391" in run.stdout
    assert api_key(lab) not in run.stdout + run.stderr


def test_smoke_fails_with_a_wrong_key_given_by_file(tmp_path):
    key_file = tmp_path / "api_key"
    key_file.write_text("not-the-key\n")
    run, _ = run_playbook("playbooks/smoke.yml", "-e", f"smoke_api_key_file={key_file}")
    assert run.returncode != 0
    assert table_rows(run.stdout) == dict.fromkeys(CHECKS, "FAIL"), run.stdout[-3000:]
    assert "HTTP 401" in run.stdout
    assert "not-the-key" not in run.stdout


@pytest.fixture(scope="module")
def tuned_engine():
    """The ranks restarted with known rates and set to answer wrongly; restored afterwards."""
    settings = {
        "STANDIN_FAULTS": "wrong_math,no_tool_call,swap_colors",
        "STANDIN_DECODE_TOKENS_PER_S": str(DECODE),
        "STANDIN_PREFILL_TOKENS_PER_S": str(PREFILL),
        "STANDIN_OUTPUT_TOKENS": "48",
    }
    started, _ = site("--tags", "rank", "-e", json.dumps({"rank_extra_env": settings}))
    assert started.returncode == 0, started.stdout[-3000:]
    yield settings
    restored, _ = site("--tags", "rank")
    assert restored.returncode == 0, restored.stdout[-3000:]


def test_smoke_fails_naming_the_checks_the_engine_answers_wrongly(tuned_engine):
    run, _ = run_playbook("playbooks/smoke.yml")
    assert run.returncode != 0
    expected = {"text": "FAIL", "tool_call": "FAIL", "vision": "FAIL", "reasoning": "PASS", "stream": "PASS"}
    assert table_rows(run.stdout) == expected, run.stdout[-3000:]
    assert "Smoke check(s) failed: text, tool_call, vision" in run.stdout


def test_bench_measures_the_set_rates_within_3_percent(lab, tuned_engine, tmp_path, machine_to_itself):
    out = tmp_path / "bench"
    run, _ = run_playbook(
        "playbooks/bench.yml",
        "-e",
        f"bench_out_dir={out}",
        "-e",
        "bench_repetitions=2",
        "-e",
        "bench_poll_seconds=2",
    )
    assert run.returncode == 0, run.stdout[-3000:]
    summary = json.loads((out / "bench.json").read_text())["summary"]
    expected = {
        "prefill_8k": PREFILL, "prefill_32k": PREFILL,
        "decode_prose_c1": DECODE, "decode_code_c1": DECODE,
        "decode_prose_c2": DECODE, "decode_code_c2": DECODE,
        "decode_prose_c2_aggregate": 2 * DECODE, "decode_code_c2_aggregate": 2 * DECODE,
    }  # fmt: skip
    measured = {metric: summary[metric]["median"] for metric in expected}
    assert measured == pytest.approx(expected, rel=0.03)
    # One line per poll (the newest progress line at that moment), so which ones appear varies.
    progress = set(re.findall(r"\d\d:\d\d:\d\d (?:prefill_\w+|decode \w+ x\d) \d/2: [^)\n]*", run.stdout))
    assert len(progress) >= 3, f"progress lines while it runs: {progress}"
    assert "| decode code, 2 streams, aggregate |" in run.stdout, "the Markdown table is shown"
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert api_key(lab) not in run.stdout + run.stderr
    assert not list(Path(tempfile.gettempdir()).glob("dsv41-bench.*")), "the private key copy is removed"
