"""dsv41_bench.py against the stand-in engine on loopback, set to known rates: it must measure them,
send every request a prompt of its own, warm up first, keep what it measured when the endpoint
goes away or the run is stopped, and run the same way from the bench role."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from standin_support import API_KEY, REPO_ROOT, Rank, free_port, start_cluster

PROGRAM = REPO_ROOT / "roles" / "bench" / "files" / "dsv41_bench.py"
DECODE, PREFILL, DEPTH = 80.0, 16000.0, 4096
RATES = {
    "STANDIN_DECODE_TOKENS_PER_S": str(DECODE),
    "STANDIN_PREFILL_TOKENS_PER_S": str(PREFILL),
    "STANDIN_OUTPUT_TOKENS": "48",
}


def load(sent: list[tuple[str, dict]] | None = None, before: Callable[[int], None] | None = None):
    """A fresh copy of the program whose client records what it sends (``sent``) and calls
    ``before(n)`` ahead of the n-th request."""
    spec = importlib.util.spec_from_file_location("dsv41_bench_run", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    sys.modules["dsv41_bench_run"] = module
    spec.loader.exec_module(module)
    stream = module.Client.stream
    log = [] if sent is None else sent

    def recording(self, path, payload, stop_after=None):
        log.append((path, payload))
        if before:
            before(len(log))
        return stream(self, path, payload, stop_after)

    module.Client.stream = recording
    return module


def engine(start_rank: Callable[..., Rank], root: Path, **settings: str) -> Rank:
    head = start_cluster(start_rank, root, settings={**RATES, **settings})[0]
    head.wait_healthy()
    return head


def bench_argv(head: Rank, out: Path, *extra: str) -> list[str]:
    key = out / "key"
    key.write_text(API_KEY)
    base = ["run", "--base-url", f"http://127.0.0.1:{head.port}/v1", "--api-key-file", str(key)]
    return [*base, "--out-dir", str(out), "--progress-file", str(out / "prog"), *extra]


@pytest.fixture(scope="module")
def head(start_rank: Callable[..., Rank], tmp_path_factory) -> tuple[Rank, Path]:
    """The stand-in at known rates, and its request log."""
    requests = tmp_path_factory.mktemp("bench-log") / "requests.jsonl"
    root = tmp_path_factory.mktemp("bench-engine")
    return engine(start_rank, root, STANDIN_REQUEST_LOG=str(requests)), requests


@pytest.fixture(scope="module")
def results(head, tmp_path_factory) -> tuple[dict, Path, list[tuple[str, dict]], list[dict]]:
    """bench.json, the results directory, what the program sent, what the stand-in logged."""
    rank, requests = head
    out = tmp_path_factory.mktemp("bench-out")
    sent: list[tuple[str, dict]] = []
    extra = [
        "--repetitions",
        "2",
        "--long-context-tokens",
        "16384",
        "--decode-context",
        str(DEPTH),
        "--greedy",
    ]
    assert load(sent).main(bench_argv(rank, out, *extra)) == 0
    logged = [json.loads(line) for line in requests.read_text().splitlines()]
    return json.loads((out / "bench.json").read_text()), out, sent, logged


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("prefill_8k", PREFILL),
        ("prefill_32k", PREFILL),
        ("prefill_16k", PREFILL),
        ("decode_prose_c1", DECODE),
        ("decode_code_c1", DECODE),
        ("decode_prose_c2", DECODE),
        ("decode_code_c2", DECODE),
        ("decode_code_c2_aggregate", 2 * DECODE),
        ("decode_prose_4k_c1", DECODE),
        ("decode_code_4k_c2", DECODE),
        ("decode_code_4k_c2_aggregate", 2 * DECODE),
    ],
)
def test_measured_rates_are_within_3_percent_of_the_set_rates(results, metric, expected):
    summary = results[0]
    assert summary["summary"][metric]["median"] == pytest.approx(expected, rel=0.03)


def test_every_decode_ran_to_its_natural_end(results):
    summary = results[0]
    decodes = [s for s in summary["samples"] if s["metric"].startswith("decode")]
    assert decodes and all(set(s["detail"]["finish_reasons"]) == {"stop"} for s in decodes)


def test_every_request_the_engine_received_had_a_prompt_of_its_own(results):
    _, _, sent, logged = results
    prompts = [
        tuple(payload["prompt"]) if path == "/completions" else payload["messages"][0]["content"]
        for path, payload in sent
    ]
    # warm-up + 3 sizes x 2 repetitions + 2 depths x 2 kinds x (1 + 2 streams) x 2 repetitions
    assert len(prompts) == 1 + 6 + 24 == len([r for r in logged if r["method"] == "POST"])
    assert len(set(prompts)) == len(prompts)


def test_decode_at_depth_followed_a_prompt_of_that_many_tokens(results):
    summary, _, _, logged = results
    chats = [r for r in logged if r["path"] == "/v1/chat/completions" and "error" not in r]
    assert sorted({r["prompt_tokens"] >= DEPTH for r in chats}) == [False, True]
    assert {r["prompt_tokens"] for r in chats if r["prompt_tokens"] >= DEPTH} == {DEPTH}
    assert [r.get("prompt_tokens") for r in logged].count(DEPTH) == 2 * (1 + 2) * 2
    at_depth = [s for s in summary["samples"] if "_4k_" in s["metric"]]
    assert at_depth and all(set(s["detail"]["prompt_tokens"]) == {DEPTH} for s in at_depth)


def test_a_warm_up_ran_first_and_was_not_counted(results):
    summary, _, sent, logged = results
    first = min((r for r in logged if r["method"] == "POST"), key=lambda r: r["ts"])
    assert first["path"] == "/v1/chat/completions" and first["error"] == "client closed the connection"
    assert sent[0][1]["messages"][0]["content"].endswith("Say hello and introduce yourself in two sentences.")
    assert summary["meta"]["warmup"]["ran"] is True
    assert (
        summary["meta"]["measurements"] == 3 * 2 + 2 * 2 * 2 * 2
    )  # prefills, then depths x kinds x concurrencies x repetitions
    assert sum(s["repetition"] == 1 for s in summary["samples"]) == len(summary["samples"]) // 2


def test_greedy_requests_sent_temperature_0_and_no_cap(results):
    summary, _, sent, logged = results
    assert all(payload["temperature"] == 0 for _, payload in sent)
    assert summary["meta"]["greedy"] is True
    posts = [r for r in logged if r["method"] == "POST"]
    assert not any(r["max_tokens_present"] or r["max_completion_tokens_present"] for r in posts)


def test_reports_and_progress_are_written(results):
    _, out, _, _ = results
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    table = (out / "bench.md").read_text()
    assert "| decode code, 1 stream |" in table and "| decode prose at 4k, 2 streams, aggregate |" in table
    # The collection's progress document, as the job_wait module reads it: every planned
    # measurement done, the last progress line as its detail.
    progress = json.loads((out / "prog").read_text())
    assert (progress["what"], progress["phase"], progress["unit"]) == ("benchmark", "done", "measurements")
    assert progress["done"] == progress["total"] == 3 * 2 + 2 * 2 * 2 * 2
    assert progress["detail"].endswith("bench.png")


def test_when_the_endpoint_goes_away_what_was_measured_is_kept(start_rank, tmp_path, capsys):
    """The head stops after the warm-up and two prefills: the run fails naming why, bench.json
    holds those two measurements."""
    # 1k-token prefills at a rate slow enough that a few ms of HTTP stay within the tolerance.
    prefill = PREFILL / 4
    head = engine(start_rank, tmp_path / "engine", STANDIN_PREFILL_TOKENS_PER_S=str(prefill))
    out = tmp_path / "out"
    out.mkdir()

    def stop_the_head(count: int) -> None:
        if count == 4:
            head.stop()

    argv = bench_argv(head, out, "--prefill-tokens", "1024", "--kinds", "code", "--concurrency", "1")
    assert load(before=stop_the_head).main([*argv, "--repetitions", "2"]) == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("benchmark failed: POST /v1/chat/completions:")
    assert "Connection refused" in message
    assert message.endswith(f"the 2 measurement(s) done before are in {out / 'bench.json'}")
    results = json.loads((out / "bench.json").read_text())
    assert results["meta"]["status"] == "failed" and "Connection refused" in results["meta"]["error"]
    assert [(s["metric"], s["repetition"]) for s in results["samples"]] == [
        ("prefill_1k", 1),
        ("prefill_1k", 2),
    ]
    assert results["summary"]["prefill_1k"]["median"] == pytest.approx(prefill, rel=0.05)
    assert "Incomplete (failed" in (out / "bench.md").read_text()


def test_a_stopped_run_keeps_what_it_measured(head, tmp_path):
    """SIGTERM (what a killed Ansible job or `kill` sends) mid-run: exit 143, the measurements so
    far on disk, marked interrupted."""
    rank, _ = head
    argv = bench_argv(rank, tmp_path, "--prefill-tokens", "8192", "--repetitions", "20", "--no-warmup")
    proc = subprocess.Popen([sys.executable, str(PROGRAM), *argv], stderr=subprocess.PIPE, text=True)
    progress = tmp_path / "prog"
    deadline = time.monotonic() + 30
    while "prefill_8k 2/20" not in (progress.read_text() if progress.exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "benchmark interrupted: stopped by SIGTERM" in err
    results = json.loads((tmp_path / "bench.json").read_text())
    assert results["meta"]["status"] == "interrupted"
    assert 2 <= results["meta"]["measurements"] == len(results["samples"]) < 20
    assert {s["metric"] for s in results["samples"]} == {"prefill_8k"}


def run_role(base_url: str, out: Path, **settings) -> subprocess.CompletedProcess:
    """playbooks/bench.yml from this checkout on the controller, as a user runs it."""
    extra = {
        "bench_base_url": base_url,
        "bench_api_key": API_KEY,
        "bench_out_dir": str(out),
        "bench_poll_seconds": 1,
        "ansible_python_interpreter": sys.executable,
        **settings,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MOLECULE_"))}
    playbook = Path(sys.executable).parent / "ansible-playbook"
    return subprocess.run(
        [str(playbook), "playbooks/bench.yml", "-i", "localhost,", "-c", "local", "-e", json.dumps(extra)],
        cwd=REPO_ROOT, env={**env, "ANSIBLE_FORCE_COLOR": "0"}, text=True, capture_output=True, check=False,
    )  # fmt: skip


def test_the_role_hands_every_setting_to_the_program(head, tmp_path):
    """The new settings, away from their defaults, reach the run and show in bench.json."""
    rank, _ = head
    out = tmp_path / "bench"
    run = run_role(
        f"http://127.0.0.1:{rank.port}/v1",
        out,
        bench_prefill_tokens=[1024],
        bench_kinds=["code"],
        bench_concurrency=[1],
        bench_repetitions=1,
        bench_decode_context_tokens=[2048],
        bench_warmup=False,
        bench_greedy=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    results = json.loads((out / "bench.json").read_text())
    meta = results["meta"]
    assert (meta["greedy"], meta["warmup"], meta["decode_context_tokens"]) == (True, {"ran": False}, [2048])
    assert list(results["summary"]) == ["prefill_1k", "decode_code_c1", "decode_code_2k_c1"]
    assert results["summary"]["decode_code_2k_c1"]["median"] == pytest.approx(DECODE, rel=0.03)
    assert "| decode code at 2k, 1 stream |" in run.stdout
    assert re.search(r"^\S+: benchmark: ", run.stdout, re.MULTILINE), (
        "the shared wait shows the progress document"
    )
    assert API_KEY not in run.stdout + run.stderr


def test_the_role_fails_naming_why_and_where_the_results_are(tmp_path):
    """Nothing answers at the endpoint: the play fails with the program's message."""
    out = tmp_path / "bench"
    run = run_role(f"http://127.0.0.1:{free_port()}/v1", out, bench_prefill_tokens=[1024])
    assert run.returncode != 0
    shown = " ".join((run.stdout + run.stderr).split())  # the callback folds long messages
    message = "benchmark failed: POST /v1/chat/completions: [Errno 111] Connection refused; "
    kept = f"the 0 measurement(s) done before are in {out / 'bench.json'}"
    assert f"msg: 'benchmark on localhost failed: {message}{kept}'" in shown
    assert json.loads((out / "bench.json").read_text())["meta"]["status"] == "failed"
    assert API_KEY not in run.stdout + run.stderr
