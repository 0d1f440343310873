"""Operational faults of the lab's STAND-IN vLLM engine, and its Prometheus ``/metrics``.

Real processes on loopback, like ``test_vllm_standin.py``. Faults are switched on at run time
through the fault file (``STANDIN_FAULTS_FILE`` or the default ``$XDG_CACHE_HOME/standin-faults``),
the way a lab test breaks a running rank: hang (rank 0: no more tokens while /health stays 200;
headless: no more heartbeats), crash, exit_on_start (a crash loop until the file is removed) and
leak (resident memory grows up to a cap).
"""

from __future__ import annotations

import http.client
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from standin_support import API_KEY, Rank, start_cluster
from vllm_standin.errors import StartupError  # importable: conftest puts ENGINE_DIR on sys.path
from vllm_standin.settings import Settings

MODEL = "deepseek-v4.1-flash"
NO_THINKING = {"chat_template_kwargs": {"thinking": False}}
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
GENERATED = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
SUCCESS = "vllm:request_success_total"


# --- helpers ----------------------------------------------------------------------------------


def call(
    rank: Rank, method: str, path: str, body: dict[str, Any] | None = None, key: str | None = API_KEY
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", rank.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, dict(resp.getheaders()), data


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **NO_THINKING, **extra}


def complete(rank: Rank, body: dict[str, Any]) -> dict[str, Any]:
    status, _, data = call(rank, "POST", "/v1/chat/completions", body)
    assert status == 200, data
    return json.loads(data)


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{((?:[a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*)\} (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format 0.0.4, strictly: every sample is `name{labels} value` after its
    family's HELP and TYPE lines (a histogram's samples are its name + _bucket, _count, _sum)."""
    helped: set[str] = set()
    typed: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert kind in {"counter", "gauge", "histogram"}, line
            typed[name] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a `name{{labels}} value` sample: {line!r}"
            name, labels, value = match.groups()
            family = re.sub(r"_(bucket|count|sum)$", "", name)
            family = family if typed.get(family) == "histogram" else name
            assert family in helped and family in typed, f"{name} has no HELP/TYPE before it"
            samples[(name, frozenset(_LABEL.findall(labels)))] = float(value)
    return samples


def scrape(rank: Rank) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, headers, data = call(rank, "GET", "/metrics", key=None)  # no bearer: like vLLM
    assert status == 200, data
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse_exposition(data.decode())


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def inject(rank: Rank, path: Path, *names: str) -> None:
    """Write faults into a running rank's fault file and wait until the rank took it (deleted it)."""
    path.write_text("".join(f"{name}\n" for name in names))
    wait_for(lambda: not path.exists(), 3, f"the rank to take in {path}:\n{rank.stderr()}")


def rss_mib(rank: Rank) -> float:
    status = Path(f"/proc/{rank.proc.pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def single_head(start_rank: Callable[..., Rank], root: Path, **settings: str) -> tuple[Rank, Path]:
    """One rank (nnodes 1) with its fault file at ``root/faults``, healthy."""
    faults = root / "faults"
    head = start_cluster(
        start_rank, root, nnodes=1, settings={"STANDIN_FAULTS_FILE": str(faults), **settings}
    )[0]
    head.wait_healthy()
    return head, faults


def node_fault_file(rank: Rank) -> Path:
    """The default fault file: the node's cache (mounted at /cache in a rank container)."""
    return Path(rank.env["XDG_CACHE_HOME"]) / "standin-faults"


# --- settings -----------------------------------------------------------------------------------


def test_operational_fault_settings(tmp_path: Path) -> None:
    settings = Settings.from_env({"STANDIN_FAULTS": "hang,crash,exit_on_start,leak,wrong_math"}, tmp_path)
    assert settings.faults == {"hang", "crash", "exit_on_start", "leak", "wrong_math"}
    assert settings.faults_file == tmp_path / "standin-faults"
    assert (settings.leak_mib_per_s, settings.leak_max_mib) == (256, 8192)
    for name, raw in [
        ("STANDIN_LEAK_MIB_PER_S", "fast"),
        ("STANDIN_LEAK_MIB_PER_S", "0"),
        ("STANDIN_LEAK_MAX_MIB", "-1"),
    ]:
        with pytest.raises(StartupError, match=name):
            Settings.from_env({name: raw}, tmp_path)


# --- /metrics -----------------------------------------------------------------------------------


def test_metrics_format_without_auth_and_counters_grow(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    head, _ = single_head(start_rank, tmp_path, STANDIN_OUTPUT_TOKENS="12")
    before = scrape(head)
    for name in (RUNNING, WAITING, GENERATED, PROMPT, SUCCESS):
        labels = next(dict(got) for (n, got) in before if n == name)
        assert labels["model_name"] == MODEL and labels["engine"] == "0", name
    assert {dict(got)["finished_reason"] for (n, got) in before if n == SUCCESS} >= {"stop", "length"}

    stopped = complete(head, chat("Tell me about the fabric."))
    capped = complete(head, chat("Tell me about the fabric.", max_tokens=5))
    after = scrape(head)
    usages = [stopped["usage"], capped["usage"]]
    assert value(after, GENERATED) - value(before, GENERATED) == sum(u["completion_tokens"] for u in usages)
    assert value(after, PROMPT) - value(before, PROMPT) == sum(u["prompt_tokens"] for u in usages)
    for reason in ("stop", "length"):
        grown = value(after, SUCCESS, finished_reason=reason) - value(before, SUCCESS, finished_reason=reason)
        assert grown == 1, reason
    assert value(after, RUNNING) == value(after, WAITING) == 0


# --- faults taken from the fault file at run time ------------------------------------------------


def test_answer_fault_from_the_file_at_run_time(start_rank: Callable[..., Rank], tmp_path: Path) -> None:
    head, faults = single_head(start_rank, tmp_path)
    assert "391" in complete(head, chat("What is 17 * 23?"))["choices"][0]["message"]["content"]
    inject(head, faults, "wrong_math")
    assert "391" not in complete(head, chat("What is 17 * 23?"))["choices"][0]["message"]["content"]
    assert "taking fault(s) wrong_math" in head.stderr()


def test_unknown_fault_names_in_the_file_are_logged_and_ignored(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    head, faults = single_head(start_rank, tmp_path)
    inject(head, faults, "bogus", "explode_gpu", "wrong_math")
    assert head.proc.poll() is None and head.health() == 200
    log = head.stderr()
    assert "ignoring unknown fault(s) bogus, explode_gpu" in log and "taking fault(s) wrong_math" in log
    assert "391" not in complete(head, chat("What is 17 * 23?"))["choices"][0]["message"]["content"]


def test_hang_on_rank_0_keeps_health_but_stops_tokens(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    head, faults = single_head(start_rank, tmp_path, STANDIN_DECODE_TOKENS_PER_S="50")
    conn = http.client.HTTPConnection("127.0.0.1", head.port, timeout=1.5)
    body = chat("Write a long essay about the cluster.", stream=True, max_tokens=2000, ignore_eos=True)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Authorization": f"Bearer {API_KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(5):  # tokens are flowing
        assert resp.readline().startswith(b"data: ")
        resp.readline()
    during = scrape(head)
    assert value(during, RUNNING) == 1 and value(during, GENERATED) >= 4  # counted as produced

    inject(head, faults, "hang")
    time.sleep(0.2)  # a token already on its way may still land
    # A new request is accepted and takes the second --max-num-seqs slot, a third one queues;
    # neither ever answers.
    stuck: list[BaseException] = []

    def blocked_request() -> None:
        try:
            call(head, "POST", "/v1/chat/completions", chat("What is 2 + 2?"))
        except OSError as exc:  # the 10 s client timeout, or the process stopped at teardown
            stuck.append(exc)

    for _ in range(2):
        threading.Thread(target=blocked_request, daemon=True).start()
    wait_for(lambda: value(scrape(head), WAITING) == 1, 3, "a queued request")
    frozen = scrape(head)
    time.sleep(2)
    later = scrape(head)
    assert value(later, RUNNING) == 2 and value(later, WAITING) == 1
    assert value(later, GENERATED) == value(frozen, GENERATED)
    for path in ("/health", "/version", "/v1/models"):
        assert call(head, "GET", path)[0] == 200, path
    with pytest.raises(TimeoutError):  # the stream stays open and sends nothing
        while True:
            resp.readline()
    conn.close()
    assert head.proc.poll() is None and "fault hang" in head.stderr()


def test_hang_on_a_headless_rank_freezes_the_engine_and_its_metrics(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    """A stuck headless rank (no heartbeats, link open) is a frozen worker: rank 0 waits for it as
    vLLM's engine does (measured with SIGSTOP on vLLM 0.32): /health 200, no request completes,
    /metrics frozen at its last values (0 running, 0 waiting for a request that came after)."""
    head, worker = start_cluster(start_rank, tmp_path)
    head.wait_healthy()
    complete(head, chat("What is 2 + 2?"))
    inject(worker, node_fault_file(worker), "hang")
    wait_for(lambda: "silent for" in head.stderr(), 5, "rank 0 to notice the silent rank")
    before = scrape(head)
    stuck: list[BaseException] = []

    def blocked_request() -> None:
        try:
            call(head, "POST", "/v1/chat/completions", chat("What is 3 + 4?"))
        except OSError as exc:  # the 10 s client timeout, or the process stopped at teardown
            stuck.append(exc)

    threading.Thread(target=blocked_request, daemon=True).start()
    time.sleep(2)
    after = scrape(head)
    assert after == before
    assert value(after, RUNNING) == value(after, WAITING) == 0
    for path in ("/health", "/version", "/v1/models"):
        assert call(head, "GET", path)[0] == 200, path
    assert worker.proc.poll() is None and head.proc.poll() is None
    assert "heartbeats to rank 0 stopped" in worker.stderr() and "lost" not in head.stderr()


def test_crash_of_a_headless_rank_makes_rank_0_answer_500_once_then_exit(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    head, worker = start_cluster(start_rank, tmp_path)
    head.wait_healthy()
    node_fault_file(worker).write_text("crash\n")
    assert worker.wait(timeout=3) == 1
    assert not node_fault_file(worker).exists()  # taken before dying: a restart comes up healthy
    assert "fault crash" in worker.stderr()
    wait_for(lambda: "headless rank 1 lost" in head.stderr(), 3, "rank 0 to lose the crashed rank")
    assert head.health() == 200  # until the next request, as vLLM's did
    status, _, data = call(head, "POST", "/v1/chat/completions", chat("What is 2 + 2?"))
    assert status == 500 and "EngineCore encountered an issue" in json.loads(data)["error"]["message"]
    assert head.wait(timeout=3) == 1


def test_crash_of_rank_0(start_rank: Callable[..., Rank], tmp_path: Path) -> None:
    head, faults = single_head(start_rank, tmp_path)
    faults.write_text("crash\n")
    assert head.wait(timeout=3) == 1
    assert not faults.exists()


# --- a long prefill ------------------------------------------------------------------------------


ITERATIONS = "vllm:iteration_tokens_total_count"
KV_USAGE = "vllm:kv_cache_usage_perc"


def test_a_long_prefill_moves_only_the_kv_cache(start_rank: Callable[..., Rank], tmp_path: Path) -> None:
    """As vLLM 0.32's chunked prefill (measured): running 1, the prompt, generation and iteration
    counters flat until the prompt is done, the KV cache usage rising; freed when it ends."""
    head, _ = single_head(start_rank, tmp_path, STANDIN_PREFILL_TOKENS_PER_S="400", STANDIN_OUTPUT_TOKENS="4")
    before = scrape(head)
    prompt = " ".join(["word"] * 1200)  # 3 s of prefill
    done: list[dict[str, Any]] = []
    threading.Thread(target=lambda: done.append(complete(head, chat(prompt))), daemon=True).start()
    readings = []
    for _ in range(4):
        time.sleep(0.5)
        readings.append(scrape(head))
    assert done == []
    for reading in readings:
        assert value(reading, RUNNING) == 1
        for name in (PROMPT, GENERATED, ITERATIONS):
            assert value(reading, name) == value(before, name), name
    kv = [value(reading, KV_USAGE) for reading in readings]
    assert all(b > a for a, b in itertools.pairwise([value(before, KV_USAGE), *kv])), kv
    wait_for(lambda: bool(done), 5, "the answer")
    after = scrape(head)
    assert value(after, PROMPT) - value(before, PROMPT) == done[0]["usage"]["prompt_tokens"]
    assert value(after, ITERATIONS) > value(before, ITERATIONS)
    assert value(after, KV_USAGE) == 0 and value(after, RUNNING) == 0


def test_exit_on_start_fails_every_start_until_the_file_is_removed(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    faults = tmp_path / "faults"
    head, _ = single_head(start_rank, tmp_path / "first", STANDIN_FAULTS_FILE=str(faults))
    # At run time: crash now, and exit_on_start stays in the file for every later start.
    faults.write_text("crash\nexit_on_start\n")
    assert head.wait(timeout=3) == 1
    for attempt in ("second", "third"):
        rank = start_cluster(
            start_rank, tmp_path / attempt, nnodes=1, settings={"STANDIN_FAULTS_FILE": str(faults)}
        )[0]
        assert rank.wait(timeout=10) != 0, attempt
        assert "fault exit_on_start" in rank.stderr() and rank.health() is None
        assert faults.read_text() == "crash\nexit_on_start\n"  # nothing consumed
    faults.unlink()
    single_head(start_rank, tmp_path / "fourth", STANDIN_FAULTS_FILE=str(faults))


def test_leak_grows_resident_memory_up_to_the_cap(start_rank: Callable[..., Rank], tmp_path: Path) -> None:
    cap = 160
    head, faults = single_head(
        start_rank, tmp_path, STANDIN_LEAK_MIB_PER_S="256", STANDIN_LEAK_MAX_MIB=str(cap)
    )
    baseline = rss_mib(head)
    inject(head, faults, "leak")
    wait_for(lambda: rss_mib(head) - baseline >= 100, 2, "resident memory to grow by 100 MiB")
    wait_for(lambda: "reached the cap" in head.stderr(), 2, "the leak to reach its cap")
    at_cap = rss_mib(head)
    assert 100 <= at_cap - baseline <= cap + 32
    assert complete(head, chat("What is 2 + 2?"))["choices"][0]["finish_reason"] == "stop"  # still serving
    time.sleep(1)
    assert rss_mib(head) - at_cap < 8  # stopped at the cap
