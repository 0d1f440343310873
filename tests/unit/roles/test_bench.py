"""Unit tests for roles/bench/files/dsv41_bench.py: the arithmetic, the stream parsing, the reports."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from pathlib import Path

import pytest
import yaml

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
    meta = {"model": "m", "base_url": "http://h:8000/v1", "date": "d", "repetitions": 3,
            "reference": {"prefill_8k": 2050.0, "decode_code_c2_aggregate": 60.0}}  # fmt: skip
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


@pytest.mark.parametrize("source", ["file", "env"])
def test_a_key_that_is_no_key_fails_before_any_request_without_quoting_it(tmp_path, monkeypatch, source):
    """http.client would reject the header with its text in the error, which bench.json keeps."""
    edited = "first-key-0123\nsecond-key-0123"
    key_file = tmp_path / "api_key"
    key_file.write_text(edited + "\n")
    monkeypatch.setenv("SPARK_KEY", edited)
    given = ["--api-key-file", str(key_file)] if source == "file" else ["--api-key-env", "SPARK_KEY"]
    with pytest.raises(bench.BenchError, match="holds no key of A-Z a-z 0-9 - _ alone") as raised:
        bench.read_key(bench.parse(["run", "--base-url", "http://h/v1", *given]))
    assert "second-key" not in str(raised.value)


@pytest.mark.parametrize(
    "bad",
    [
        ["--repetitions", "0"],
        ["--concurrency", "1", "0"],
        ["--prefill-tokens", "-5"],
        ["--decode-context", "32768", "0"],
    ],
)
def test_nonsense_counts_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        bench.parse(["run", "--base-url", "http://h/v1", *bad])
    assert "must be positive" in capsys.readouterr().err


def test_the_progress_document_counts_the_planned_measurements(tmp_path):
    """The collection's progress document (what job_wait reads), not a file of lines."""
    args = bench.parse(["run", "--base-url", "http://h/v1", "--prefill-tokens", "8192", "32768",
                        "--decode-context", "4096", "--repetitions", "2"])  # fmt: skip
    assert (
        bench.planned_measurements(args) == (2 + 2 * 2 * 2) * 2
    )  # prefills + depths x kinds x concurrencies
    writer = bench.progress_writer(str(tmp_path / "progress.json"), 20)
    writer.update(force=True, done=3, detail="12:00:00 prefill_8k 1/2: 2050.0 tok/s")
    doc = json.loads((tmp_path / "progress.json").read_text())
    assert (doc["what"], doc["unit"], doc["done"], doc["total"]) == ("benchmark", "measurements", 3, 20)
    assert isinstance(bench.progress_writer(None, 20), bench.NoProgress)


def test_there_is_no_wait_command_any_more(capsys):
    with pytest.raises(SystemExit):
        bench.parse(["wait", "--job", "x", "--progress-file", "y"])
    assert "invalid choice: 'wait'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("metric", "text"),
    [
        ("prefill_8k", "prefill 8k"),
        ("decode_prose_c1", "decode prose, 1 stream"),
        ("decode_code_c2", "decode code, 2 streams, per stream"),
        ("decode_code_c2_aggregate", "decode code, 2 streams, aggregate"),
        ("decode_prose_32k_c1", "decode prose at 32k, 1 stream"),
        ("decode_code_128k_c2", "decode code at 128k, 2 streams, per stream"),
        ("decode_code_5000_c2_aggregate", "decode code at 5000, 2 streams, aggregate"),
        ("something_else", "something_else"),
    ],
)
def test_metric_labels(metric, text):
    assert bench.label(metric) == text


def test_decode_metrics_after_a_long_prompt_are_named_by_their_depth():
    assert bench.decode_metric("code", 1) == "decode_code_c1"
    assert bench.decode_metric("prose", 2, 32768) == "decode_prose_32k_c2"
    assert [bench.at_depth(m) for m in ("decode_code_32k_c1", "decode_code_c1", "prefill_32k")] == [
        True,
        False,
        False,
    ]


@pytest.mark.parametrize(
    ("argv", "warmup", "greedy", "depths"),
    [
        ([], True, False, []),
        (["--no-warmup", "--greedy", "--decode-context", "32768", "131072"], False, True, [32768, 131072]),
    ],
)
def test_warmup_greedy_and_decode_context_options(argv, warmup, greedy, depths):
    args = bench.parse(["run", "--base-url", "http://h/v1", *argv])
    assert (args.warmup, args.greedy, args.decode_context) == (warmup, greedy, depths)


# --- whole runs against a fake endpoint ------------------------------------------------------------


class FakeEndpoint:
    """Takes the Client's place: records every request and answers at fixed rates (prefill: first
    token after 0.5 s; decode: 41 tokens over 2 s); can fail or be interrupted at a given request."""

    def __init__(self, fail_at: int | None = None, interrupt_at: int | None = None):
        self.requests: list[tuple[str, dict, int | None]] = []
        self.fail_at, self.interrupt_at = fail_at, interrupt_at
        self.on_request = lambda count: None

    def stream(self, path, payload, stop_after=None):
        self.requests.append((path, payload, stop_after))
        self.on_request(len(self.requests))
        if len(self.requests) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail_at is not None and len(self.requests) >= self.fail_at:
            raise bench.BenchError(f"POST /v1{path}: HTTP 503 b'engine unavailable'")
        if path == "/completions":
            return bench.Timing(sent=0.0, first=0.5, last=0.5, chunks=1)
        words = len(payload["messages"][0]["content"].split())
        chunks = min(41, stop_after or 41)
        return bench.Timing(0.0, 1.0, 3.0, 41, words, "stop", chunks)

    def prompts(self) -> list:
        """Every prompt sent, hashable: token ids as a tuple, chat as the user message's text."""
        return [
            tuple(payload["prompt"]) if path == "/completions" else payload["messages"][0]["content"]
            for path, payload, _ in self.requests
        ]


SMALL_RUN = ["--prefill-tokens", "64", "--kinds", "code", "--concurrency", "1", "--repetitions", "2"]


def run_bench(out: Path, monkeypatch, endpoint: FakeEndpoint, *extra: str) -> tuple[int, dict]:
    """main() against the fake endpoint, writing into ``out``; the exit code and bench.json."""
    monkeypatch.setattr(bench, "Client", lambda *_: endpoint)
    monkeypatch.setattr(bench, "chart", lambda summary, meta, path: path.write_bytes(b"\x89PNG"))
    argv = ["run", "--base-url", "http://h/v1", "--api-key-env", "NO_SUCH_VARIABLE", "--out-dir", str(out)]
    code = bench.main([*argv, *SMALL_RUN, *extra])
    return code, json.loads((out / "bench.json").read_text())


def measured(results: dict) -> list[tuple[str, int]]:
    return [(s["metric"], s["repetition"]) for s in results["samples"]]


def test_a_warm_up_request_runs_first_and_is_not_counted(tmp_path, monkeypatch):
    warmed, cold = FakeEndpoint(), FakeEndpoint()
    code, with_warmup = run_bench(tmp_path / "on", monkeypatch, warmed)
    assert code == 0
    path, payload, stop_after = warmed.requests[0]
    assert path == "/chat/completions" and payload["messages"][0]["content"].endswith(bench.WARMUP_PROMPT)
    assert stop_after == bench.WARMUP_CHUNKS, "the warm-up is cut short, never capped"
    assert with_warmup["meta"]["warmup"] == {
        "ran": True,
        "output_chunks": bench.WARMUP_CHUNKS,
        "seconds": 3.0,
    }
    assert "after one warm-up request" in (tmp_path / "on" / "bench.md").read_text()

    code, without = run_bench(tmp_path / "off", monkeypatch, cold, "--no-warmup")
    assert code == 0 and cold.requests[0][0] == "/completions"
    assert len(warmed.requests) == len(cold.requests) + 1
    assert without["meta"]["warmup"] == {"ran": False}
    expected = [("prefill_64", 1), ("prefill_64", 2), ("decode_code_c1", 1), ("decode_code_c1", 2)]
    assert measured(with_warmup) == measured(without) == expected
    assert with_warmup["summary"] == without["summary"]


def test_every_request_has_a_prompt_of_its_own(tmp_path, monkeypatch):
    """Across kinds, depths, streams and repetitions: a shared prompt would hit the prefix cache."""
    endpoint = FakeEndpoint()
    many = ["--prefill-tokens", "64", "128", "--kinds", "prose", "code", "--concurrency", "1", "2"]
    code, _ = run_bench(
        tmp_path, monkeypatch, endpoint, *many, "--repetitions", "3", "--decode-context", "256"
    )
    assert code == 0
    prompts = endpoint.prompts()
    # warm-up + 2 sizes x 3 repetitions + 2 depths x 2 kinds x (1 + 2 streams) x 3 repetitions
    assert len(prompts) == 1 + 6 + 36
    assert len(set(prompts)) == len(prompts)
    chat = [p for p in prompts if isinstance(p, str)]
    assert len({tuple(p.split()[:2]) for p in chat}) == len(chat), "distinct from the first words on"


def test_decode_after_a_long_prompt_is_measured_and_reported(tmp_path, monkeypatch):
    endpoint = FakeEndpoint()
    depths = ["--concurrency", "1", "2", "--decode-context", "2048", "5000"]
    code, results = run_bench(tmp_path, monkeypatch, endpoint, *depths, "--repetitions", "1")
    assert code == 0
    decodes = ["c1", "c2", "c2_aggregate"]
    assert list(results["summary"]) == [
        "prefill_64",
        *(f"decode_code_{c}" for c in decodes),
        *(f"decode_code_2k_{c}" for c in decodes),
        *(f"decode_code_5000_{c}" for c in decodes),
    ]
    assert results["summary"]["decode_code_2k_c2"]["median"] == pytest.approx(20.0)
    assert results["summary"]["decode_code_2k_c2_aggregate"]["median"] == pytest.approx(40.0)
    assert results["meta"]["decode_context_tokens"] == [2048, 5000]
    at_2k = [s for s in results["samples"] if s["metric"].startswith("decode_code_2k_c2")]
    assert at_2k and all(s["detail"]["context_tokens"] == 2048 for s in at_2k)
    assert all(s["detail"]["prompt_tokens"] == [2048, 2048] for s in at_2k), "a prompt of N words"
    table = (tmp_path / "bench.md").read_text()
    assert "| decode code at 2k, 2 streams, aggregate | 40.0 | - | - |" in table
    assert "| decode code at 5000, 1 stream | 20.0 | - | - |" in table


def test_the_chart_has_a_panel_for_decode_after_a_long_prompt(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    titles: list[str] = []
    monkeypatch.setattr(plt.Axes, "set_title", lambda axis, title, *a, **k: titles.append(title))
    summary = {name: {"median": 10.0} for name in ("prefill_8k", "decode_code_c1", "decode_code_32k_c1")}
    bench.chart(summary, {"model": "m", "base_url": "u", "date": "d"}, tmp_path / "c.png")
    assert titles == ["Prefill", "Decode", "Decode after a long prompt"]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("greedy", [True, False])
def test_greedy_sends_temperature_0_with_every_request(tmp_path, monkeypatch, greedy):
    endpoint = FakeEndpoint()
    flag = "--greedy" if greedy else "--no-greedy"
    code, results = run_bench(tmp_path, monkeypatch, endpoint, flag, "--decode-context", "128")
    assert code == 0
    payloads = [payload for _, payload, _ in endpoint.requests]
    assert {"/completions", "/chat/completions"} == {path for path, _, _ in endpoint.requests}
    if greedy:
        assert all(payload["temperature"] == 0 for payload in payloads)
    else:
        assert not any("temperature" in payload for payload in payloads)
    capped = {"max_tokens", "max_completion_tokens", "top_p"}
    assert not any(capped & set(payload) for payload in payloads), "no cap and no other sampling setting"
    assert results["meta"]["greedy"] is greedy
    assert results["meta"]["sampling"] == ({"temperature": 0} if greedy else {})
    assert ("greedy sampling (temperature 0)" in (tmp_path / "bench.md").read_text()) is greedy


def test_results_are_on_disk_after_every_measurement(tmp_path, monkeypatch):
    endpoint = FakeEndpoint()
    on_disk: list[tuple[int, int]] = []

    def look(_count: int) -> None:
        results = json.loads((tmp_path / "bench.json").read_text())
        on_disk.append((results["meta"]["measurements"], len(results["samples"])))

    endpoint.on_request = look
    written: list[Path] = []
    write = bench.write_atomically
    monkeypatch.setattr(
        bench, "write_atomically", lambda path, data: (written.append(path), write(path, data))
    )
    code, results = run_bench(tmp_path, monkeypatch, endpoint)
    assert code == 0
    # at each request: warm-up, prefill 1, prefill 2, decode 1, decode 2
    assert on_disk == [(0, 0), (0, 0), (1, 1), (2, 2), (3, 3)]
    assert results["meta"]["status"] == "complete" and results["meta"]["measurements"] == 4
    assert written.count(tmp_path / "bench.json") == 1 + 4 + 1, "at the start, per measurement, at the end"


def test_a_failure_keeps_what_was_measured_and_says_so(tmp_path, monkeypatch, capsys):
    endpoint = FakeEndpoint(fail_at=4)  # warm-up, two prefills, then the endpoint answers 503
    code, results = run_bench(tmp_path, monkeypatch, endpoint)
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("benchmark failed: POST /v1/chat/completions: HTTP 503")
    assert err.endswith(f"the 2 measurement(s) done before are in {tmp_path / 'bench.json'}")
    assert results["meta"]["status"] == "failed" and "HTTP 503" in results["meta"]["error"]
    assert measured(results) == [("prefill_64", 1), ("prefill_64", 2)]
    assert results["summary"]["prefill_64"] == {"median": 128.0, "min": 128.0, "max": 128.0, "repetitions": 2}
    assert "**Incomplete (failed: POST /v1/chat/completions: HTTP 503" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md", "bench.png"]


def test_an_interrupted_run_keeps_what_was_measured(tmp_path, monkeypatch, capsys):
    endpoint = FakeEndpoint(interrupt_at=3)  # Ctrl-C during the second prefill
    code, results = run_bench(tmp_path, monkeypatch, endpoint)
    assert code == 130
    assert (
        "benchmark interrupted: stopped by SIGINT; the 1 measurement(s) done before"
        in capsys.readouterr().err
    )
    assert results["meta"]["status"] == "interrupted"
    assert measured(results) == [("prefill_64", 1)]


def test_a_file_is_replaced_in_one_step_or_not_at_all(tmp_path, monkeypatch):
    target = tmp_path / "bench.json"
    target.write_text("old")
    renames: list[tuple[Path, Path]] = []
    real_replace = os.replace
    monkeypatch.setattr(
        os, "replace", lambda src, dst: (renames.append((Path(src), Path(dst))), real_replace(src, dst))
    )
    bench.write_atomically(target, b"new")
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o644
    ((temp, dest),) = renames
    assert dest == target and temp.parent == tmp_path and temp != target, "a temporary file beside it"

    def disk_full(src, dst):
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="no space"):
        bench.write_atomically(target, b"newer")
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target], "old content, no leftovers"


# --- the role: every variable documented, typed and handed to the program ----------------------------

ROLE = PROGRAM.parents[1]


def test_every_role_variable_is_commented_typed_and_passed_to_the_program():
    defaults_text = (ROLE / "defaults" / "main.yml").read_text()
    defaults = yaml.safe_load(defaults_text)
    options = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    tasks = (ROLE / "tasks" / "main.yml").read_text()
    assert set(defaults) == set(options["options"])
    assert [name for name in defaults if name not in tasks] == []
    new = {
        "bench_decode_context_tokens": ([], "list"),
        "bench_warmup": (True, "bool"),
        "bench_greedy": (False, "bool"),
    }
    for name, (default, kind) in new.items():
        assert defaults[name] == default == options["options"][name]["default"]
        assert options["options"][name]["type"] == kind
    assert [name for name in defaults if "type" not in options["options"][name]] == []
    # Each variable has a comment right above it, but for these three, listed under the comment
    # that names them with the variable above them.
    grouped = {"bench_concurrency", "bench_timeout_minutes", "bench_poll_seconds"}
    lines = defaults_text.splitlines()
    uncommented = [
        name
        for index, line in enumerate(lines)
        if (name := line.partition(":")[0]) in defaults and name not in grouped
        if index == 0 or not lines[index - 1].startswith("#")
    ]
    assert uncommented == []
    for flag in ("--decode-context", "'--warmup' if bench_warmup", "'--greedy' if bench_greedy"):
        assert flag in tasks


def test_prefill_prompts_stay_within_the_range_given_for_the_models_vocabulary():
    prompts = bench.Prompts(random.Random(1), (300, 1000))
    ids = prompts.token_ids(4096)
    assert min(ids) >= 300 and max(ids) < 1000
    assert bench.parse(["run", "--base-url", "http://h:8000/v1", "--token-ids", "300", "1000"]).token_ids == [
        300,
        1000,
    ]
