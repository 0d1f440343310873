"""Unit tests for roles/bench/files/dsv41_bench.py: the arithmetic, the stream parsing, the reports."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

PROGRAM = Path(__file__).resolve().parents[3] / "roles" / "bench" / "files" / "dsv41_bench.py"
_spec = importlib.util.spec_from_file_location("dsv41_bench", PROGRAM)
bench = importlib.util.module_from_spec(_spec)
sys.modules["dsv41_bench"] = bench
_spec.loader.exec_module(bench)


@pytest.mark.parametrize(
    ("tokens", "sent", "first", "rate"), [(8192, 10.0, 14.0, 2048.0), (100, 0.0, 0.5, 200.0)]
)
def test_prefill_rate_is_prompt_tokens_over_time_to_first_token(tokens, sent, first, rate):
    assert bench.prefill_rate(tokens, bench.Timing(sent=sent, first=first)) == pytest.approx(rate)


def test_prefill_without_a_first_token_is_an_error():
    with pytest.raises(bench.BenchError, match="no first token"):
        bench.prefill_rate(10, bench.Timing(sent=1.0))


@pytest.mark.parametrize(
    ("tokens", "first", "last", "rate"),
    [(41, 1.0, 2.0, 40.0), (2, 0.0, 0.5, 2.0), (300, 5.0, 15.0, 29.9)],
)
def test_decode_rate_counts_intervals_between_first_and_last_token(tokens, first, last, rate):
    timing = bench.Timing(sent=0.0, first=first, last=last, completion_tokens=tokens)
    assert bench.decode_rate(timing) == pytest.approx(rate)


@pytest.mark.parametrize(("tokens", "first", "last"), [(1, 1.0, 2.0), (10, 2.0, 2.0), (10, None, None)])
def test_decode_needs_two_tokens_over_positive_time(tokens, first, last):
    with pytest.raises(bench.BenchError, match="at least 2 tokens"):
        bench.decode_rate(bench.Timing(sent=0.0, first=first, last=last, completion_tokens=tokens))


def test_aggregate_rate_spans_all_streams():
    a = bench.Timing(sent=0, first=1.0, last=2.0, completion_tokens=31)
    b = bench.Timing(sent=0, first=1.5, last=2.5, completion_tokens=31)
    assert bench.aggregate_rate([a, b]) == pytest.approx(60 / 1.5)


def test_random_prompts_are_fresh_and_in_range():
    rng = random.Random(7)
    first, second = bench.random_token_ids(rng, 8192), bench.random_token_ids(rng, 8192)
    assert len(first) == 8192 and first != second
    assert all(bench.TOKEN_ID_RANGE[0] <= t < bench.TOKEN_ID_RANGE[1] for t in first + second)


@pytest.mark.parametrize(
    ("tokens", "label"), [(8192, "8k"), (32768, "32k"), (131072, "128k"), (5000, "5000")]
)
def test_size_label(tokens, label):
    assert bench.size_label(tokens) == label


def test_summary_is_the_median_per_metric():
    samples = [bench.Sample("decode_code_c1", i, v) for i, v in enumerate([38.0, 41.0, 40.0], 1)]
    samples.append(bench.Sample("prefill_8k", 1, 2000.0))
    summary = bench.summarise(samples)
    assert list(summary) == ["decode_code_c1", "prefill_8k"]
    assert summary["decode_code_c1"] == {"median": 40.0, "min": 38.0, "max": 41.0, "repetitions": 3}


def test_markdown_puts_each_metric_beside_its_reference():
    summary = {
        "prefill_8k": {"median": 1025.0},
        "decode_code_c2_aggregate": {"median": 60.0},
        "x": {"median": 1.0},
    }
    meta = {"model": "m", "base_url": "http://h:8000/v1", "date": "d", "repetitions": 3}
    table = bench.markdown(summary, meta)
    assert "| prefill 8k | 1025.0 | 2050 | 0.50 |" in table
    assert "| decode code, 2 streams, aggregate | 60.0 | 60 | 1.00 |" in table
    assert "| x | 1.0 | - | - |" in table


def test_chart_is_a_png(tmp_path):
    summary = {"prefill_8k": {"median": 2000.0}, "decode_code_c1": {"median": 39.0}}
    bench.chart(summary, {"model": "m", "base_url": "u", "date": "d"}, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sse_events_stop_at_done():
    lines = [b": keep-alive\n", b'data: {"a": 1}\n', b"\n", b"data: [DONE]\n", b'data: {"b": 2}\n']
    assert list(bench.sse_events(iter(lines))) == [{"a": 1}]


@pytest.mark.parametrize(
    ("event", "output"),
    [
        ({"choices": [{"text": " word"}]}, True),
        ({"choices": [{"delta": {"content": "x"}}]}, True),
        ({"choices": [{"delta": {"reasoning_content": "x"}}]}, True),
        ({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}, True),
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, False),
        ({"choices": [], "usage": {"completion_tokens": 3}}, False),
    ],
)
def test_what_counts_as_output(event, output):
    assert bench._chunk_has_output(event) is output


def test_the_key_is_read_from_a_file_or_the_environment(tmp_path, monkeypatch):
    key_file = tmp_path / "api_key"
    key_file.write_text("from-file\n")
    assert (
        bench.read_key(bench.parse(["run", "--base-url", "http://h/v1", "--api-key-file", str(key_file)]))
        == "from-file"
    )
    monkeypatch.setenv("SPARK_KEY", "from-env")
    assert (
        bench.read_key(bench.parse(["run", "--base-url", "http://h/v1", "--api-key-env", "SPARK_KEY"]))
        == "from-env"
    )


@pytest.mark.parametrize(
    "bad", [["--repetitions", "0"], ["--concurrency", "1", "0"], ["--prefill-tokens", "-5"]]
)
def test_nonsense_counts_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        bench.parse(["run", "--base-url", "http://h/v1", *bad])
    assert "must be positive" in capsys.readouterr().err


def test_wait_reports_the_last_progress_line(tmp_path):
    job, progress = tmp_path / "job", tmp_path / "progress"
    job.write_text(json.dumps({"started": 1, "finished": 0}))
    progress.write_text("a\nb\n")
    assert bench.wait(job, progress, 0) == {"finished": False, "line": "b", "lines": 2}
    job.write_text(json.dumps({"finished": 1, "rc": 0}))
    assert bench.wait(job, progress, 5)["finished"] is True


@pytest.mark.parametrize(
    ("metric", "text"),
    [
        ("prefill_8k", "prefill 8k"),
        ("decode_prose_c1", "decode prose, 1 stream"),
        ("decode_code_c2", "decode code, 2 streams, per stream"),
        ("decode_code_c2_aggregate", "decode code, 2 streams, aggregate"),
        ("something_else", "something_else"),
    ],
)
def test_metric_labels(metric, text):
    assert bench.label(metric) == text
