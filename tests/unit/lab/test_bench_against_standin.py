"""dsv41_bench.py against the stand-in engine on loopback, set to known rates: it must measure them."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from standin_support import API_KEY, Rank, start_cluster

PROGRAM = Path(__file__).resolve().parents[3] / "roles" / "bench" / "files" / "dsv41_bench.py"
DECODE, PREFILL = 40.0, 8000.0


def load():
    spec = importlib.util.spec_from_file_location("dsv41_bench_run", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    sys.modules["dsv41_bench_run"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(start_rank: Callable[..., Rank], tmp_path_factory) -> tuple[dict, Path]:
    rates = {
        "STANDIN_DECODE_TOKENS_PER_S": str(DECODE),
        "STANDIN_PREFILL_TOKENS_PER_S": str(PREFILL),
        "STANDIN_OUTPUT_TOKENS": "48",
    }
    head = start_cluster(start_rank, tmp_path_factory.mktemp("bench-engine"), settings=rates)[0]
    head.wait_healthy()
    out = tmp_path_factory.mktemp("bench-out")
    key = out / "key"
    key.write_text(API_KEY)
    argv = ["run", "--base-url", f"http://127.0.0.1:{head.port}/v1", "--api-key-file", str(key),
            "--out-dir", str(out), "--repetitions", "2", "--progress-file", str(out / "prog"),
            "--long-context-tokens", "16384"]  # fmt: skip
    assert load().main(argv) == 0
    return json.loads((out / "bench.json").read_text()), out


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
    ],
)
def test_measured_rates_are_within_3_percent_of_the_set_rates(results, metric, expected):
    summary, _ = results
    assert summary["summary"][metric]["median"] == pytest.approx(expected, rel=0.03)


def test_every_decode_ran_to_its_natural_end(results):
    summary, _ = results
    decodes = [s for s in summary["samples"] if s["metric"].startswith("decode")]
    assert decodes and all(set(s["detail"]["finish_reasons"]) == {"stop"} for s in decodes)


def test_reports_and_progress_are_written(results):
    _, out = results
    assert (out / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "| decode code, 1 stream |" in (out / "bench.md").read_text()
    progress = (out / "prog").read_text().splitlines()
    assert any("prefill_32k 2/2" in line for line in progress) and progress[-1].endswith("bench.png")
