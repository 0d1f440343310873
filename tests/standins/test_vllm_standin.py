"""The lab's STAND-IN vLLM engine: real processes on loopback, the reference command line.

Checks what the roles, the smoke test, the benchmark and Pi rely on: the CLI accepts exactly the
reference flags, bad environments fail naming the variable, rank 0 serves only after every
headless rank joined and turns unhealthy when one dies, the API answers deterministically with
OpenAI's wire format, and streaming timing matches the configured rates within 3 %.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from standin_support import (
    API_KEY,
    ENGINE_DIR,
    Rank,
    encode_png,
    free_port,
    halves_png,
    make_node_files,
    node_env,
    reference_vllm_argv,
    standin_command,
    standin_env,
    start_cluster,
)
from vllm_standin import answers, cli, png  # importable: conftest puts ENGINE_DIR on sys.path
from vllm_standin.settings import Settings

DECODE_TPS = 200.0
PREFILL_TPS = 4000.0
OUTPUT_TOKENS = 300
MODEL = "deepseek-v4.1-flash"
USER_AGENT = "standin-test/1"


# --- HTTP helpers -----------------------------------------------------------------------------


def request(
    rank: Rank, method: str, path: str, body: dict[str, Any] | None = None, key: str | None = API_KEY
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", rank.port, timeout=30)
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def stream(rank: Rank, path: str, body: dict[str, Any]) -> tuple[float, list[tuple[float, Any]]]:
    """POST a streaming request; return (time sent, [(arrival time, event)]) with '[DONE]' last."""
    conn = http.client.HTTPConnection("127.0.0.1", rank.port, timeout=30)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    sent = time.monotonic()
    conn.request("POST", path, body=json.dumps(body | {"stream": True}), headers=headers)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    assert resp.getheader("Content-Type", "").startswith("text/event-stream")
    events: list[tuple[float, Any]] = []
    for line in iter(resp.readline, b""):
        if line.startswith(b"data: "):
            payload = line[6:].strip().decode()
            events.append((time.monotonic(), payload if payload == "[DONE]" else json.loads(payload)))
    conn.close()
    return sent, events


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


NO_THINKING = {"chat_template_kwargs": {"thinking": False}}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def image_message(png: bytes) -> dict[str, Any]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    content = [
        {"type": "text", "text": "What colour is the left half and what colour is the right half?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **NO_THINKING}


def token_chunks(events: list[tuple[float, Any]]) -> list[tuple[float, dict[str, Any]]]:
    """Events that carry a token (the role-only chat chunk and the usage chunk carry none)."""
    out = []
    for at, event in events:
        if event == "[DONE]" or not event["choices"]:
            continue
        choice = event["choices"][0]
        delta = choice.get("delta", {})
        if choice.get("text") or any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls")):
            out.append((at, event))
    return out


# --- clusters ---------------------------------------------------------------------------------


RATES = {
    "STANDIN_DECODE_TOKENS_PER_S": str(DECODE_TPS),
    "STANDIN_PREFILL_TOKENS_PER_S": str(PREFILL_TPS),
    "STANDIN_OUTPUT_TOKENS": str(OUTPUT_TOKENS),
}


@pytest.fixture(scope="module")
def cluster(start_rank: Callable[..., Rank], tmp_path_factory: pytest.TempPathFactory) -> list[Rank]:
    """Two ranks with the full reference command line, worker started first (as the role does)."""
    ranks = start_cluster(start_rank, tmp_path_factory.mktemp("cluster"), settings=RATES)
    ranks[0].wait_healthy()
    return ranks


@pytest.fixture(scope="module")
def head(cluster: list[Rank]) -> Rank:
    return cluster[0]


# --- the reference transcription and the CLI --------------------------------------------------


def test_reference_argv_scales_with_nodes() -> None:
    argv = reference_vllm_argv(2, nnodes=3, master_ip="198.18.0.13")
    assert argv[0] == "/model"
    assert argv[argv.index("--tensor-parallel-size") + 1] == argv[argv.index("--nnodes") + 1] == "3"
    assert argv[argv.index("--master-addr") + 1] == "198.18.0.13"
    assert json.loads(argv[argv.index("--speculative-config") + 1])["draft_tensor_parallel_size"] == 3
    assert argv[-3:] == ["--node-rank", "2", "--headless"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        standin_command(*args),
        capture_output=True,
        text=True,
        timeout=20,
        env=standin_env(env),
        check=False,
    )


def test_help_through_the_launcher_lists_every_reference_flag() -> None:
    top = subprocess.run(
        ["sh", str(ENGINE_DIR / "vllm"), "--help"], capture_output=True, text=True, check=False
    )
    assert top.returncode == 0 and "serve" in top.stdout
    serve = subprocess.run(
        ["sh", str(ENGINE_DIR / "vllm"), "serve", "--help"], capture_output=True, text=True, check=False
    )
    assert serve.returncode == 0
    flags = {a for a in reference_vllm_argv(0) + reference_vllm_argv(1) if a.startswith("--")}
    assert flags - set(re.findall(r"--[a-z-]+", serve.stdout)) == set()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
        (["--max-model", "5"], "unrecognized arguments: --max-model"),  # no abbreviations
        (["--compilation-config", "{not json"], "argument --compilation-config"),
        (["--limit-mm-per-prompt", "[1]"], "expected a JSON object"),
        (["--max-num-seqs", "two"], "argument --max-num-seqs"),
    ],
)
def test_usage_errors_exit_2(extra: list[str], message: str) -> None:
    result = run_cli("serve", *reference_vllm_argv(0), *extra)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"--tensor-parallel-size": "1"}, "--tensor-parallel-size 1 must equal --nnodes 2"),
        ({"--node-rank": "2"}, "--node-rank 2 is outside 0..1"),
        ({"--nnodes": "0", "--tensor-parallel-size": "0"}, "--nnodes must be >= 1"),
        ({"--max-cudagraph-capture-size": "8"}, "max(cudagraph_capture_sizes) 16"),
    ],
)
def test_inconsistent_command_lines_exit_1(edit: dict[str, str], message: str) -> None:
    argv = reference_vllm_argv(0)
    for flag, value in edit.items():
        argv[argv.index(flag) + 1] = value
    result = run_cli("serve", *argv)
    assert result.returncode == 1
    assert message in result.stderr


def test_headless_rank_0_and_serving_worker_are_rejected() -> None:
    head = run_cli("serve", *reference_vllm_argv(0), "--headless")
    assert head.returncode == 1 and "rank 0 must not be --headless" in head.stderr
    worker = reference_vllm_argv(1)
    worker.remove("--headless")
    result = run_cli("serve", *worker)
    assert result.returncode == 1 and "requires --headless" in result.stderr


def test_draft_tensor_parallel_size_must_follow_the_nodes() -> None:
    argv = reference_vllm_argv(0, nnodes=3)
    argv[argv.index("--speculative-config") + 1] = argv[argv.index("--speculative-config") + 1].replace(
        '"draft_tensor_parallel_size":3', '"draft_tensor_parallel_size":2'
    )
    result = run_cli("serve", *argv)
    assert result.returncode == 1 and "draft_tensor_parallel_size 2" in result.stderr


# --- environment checks -----------------------------------------------------------------------


def _unrewritten_plan(files: dict[str, Path]) -> dict[str, str]:
    files["plan"].write_text(json.dumps({"qdir": "qn:q31:q31s"}))
    return {}


def _missing_shard(files: dict[str, Path]) -> dict[str, str]:
    (files["model"] / "model-00002-of-00002.safetensors").unlink()
    return {}


def _unwritable_cache(files: dict[str, Path]) -> dict[str, str]:
    blocker = files["model"].parent / "a-file"
    blocker.write_text("")
    return {"XDG_CACHE_HOME": str(blocker / "cache")}


@pytest.mark.parametrize(
    ("breakage", "variable"),
    [
        (lambda files: {"VLLM_HOST_IP": "127.0.0.2"}, "VLLM_HOST_IP=127.0.0.2"),
        (lambda files: {"VLLM_HOST_IP": "not-an-ip"}, "VLLM_HOST_IP"),
        (lambda files: {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"}, "NCCL_SOCKET_IFNAME='enp1s0f1np1'"),
        (lambda files: {"GLOO_SOCKET_IFNAME": "eth9"}, "GLOO_SOCKET_IFNAME"),
        (lambda files: {"ST_EXL3_PLAN": ""}, "ST_EXL3_PLAN"),
        (_unrewritten_plan, "ST_EXL3_PLAN"),
        (_missing_shard, "model-00002-of-00002.safetensors"),
        (_unwritable_cache, "XDG_CACHE_HOME"),
        (lambda files: {"STANDIN_FAULTS": "bogus"}, "STANDIN_FAULTS"),
    ],
    ids=[
        "host-ip-not-on-if",
        "host-ip-invalid",
        "no-such-if",
        "gloo-differs",
        "no-plan",
        "plan-qdir-not-rewritten",
        "missing-shard",
        "cache-not-writable",
        "unknown-fault",
    ],
)
def test_environment_errors_name_the_variable(
    tmp_path: Path, breakage: Callable[[dict[str, Path]], dict[str, str]], variable: str
) -> None:
    files = make_node_files(tmp_path)
    env = node_env(files, **breakage(files))
    result = run_cli("serve", *reference_vllm_argv(0, nnodes=1, model=str(files["model"])), env=env)
    assert result.returncode == 1, result.stderr
    assert variable in result.stderr


# --- rendezvous and health ----------------------------------------------------------------------


def test_head_serves_only_after_the_worker_joined_then_answers_500_and_exits_when_it_dies(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    files = make_node_files(tmp_path)
    port, master_port = free_port(), free_port()

    def argv(rank: int) -> list[str]:
        return reference_vllm_argv(rank, 2, port=port, master_port=master_port, model=str(files["model"]))

    head = start_rank(argv(0), node_env(files, VLLM_API_KEY=API_KEY), port)
    time.sleep(1.5)
    assert head.proc.poll() is None, head.stderr()
    assert head.health() is None  # nothing listens on the API port before the rendezvous
    worker = start_rank(argv(1), node_env(files | {"cache": files["cache"] / "w"}))
    head.wait_healthy()
    log = head.stderr()
    assert '"served_model_name": ["deepseek-v4.1-flash"]' in log and "tp 2" in log
    assert f"port {port}" in log

    # As vLLM 0.32 did (measured): /health stays 200 until the next request, which gets HTTP 500
    # "EngineCore encountered an issue", and then the API server exits.
    worker.proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 3
    while "headless rank 1 lost" not in head.stderr() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "headless rank 1 lost: connection closed" in head.stderr()
    assert head.health() == 200
    status, body = request(head, "POST", "/v1/chat/completions", chat("What is 2 + 2?"))
    assert status == 500 and body["error"]["message"].startswith("EngineCore encountered an issue.")
    assert head.wait(timeout=3) == 1
    assert "engine core dead (headless rank 1 lost: connection closed): the API server exits" in head.stderr()


def test_a_frozen_worker_freezes_the_engine_and_its_metrics_until_it_is_back(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    """As vLLM 0.32 did with a worker frozen by SIGSTOP (measured): /health stays 200, a request
    never completes, /metrics keeps its last values (0 running, 0 waiting for a request that came
    after the freeze); on SIGCONT the group answers again."""
    head, worker = start_cluster(start_rank, tmp_path)
    head.wait_healthy()
    assert request(head, "POST", "/v1/chat/completions", chat("What is 2 + 2?"))[0] == 200
    worker.proc.send_signal(signal.SIGSTOP)  # connection stays open, heartbeats stop
    try:
        deadline = time.monotonic() + 5
        while "silent for" not in head.stderr() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "headless rank 1 silent for 2 s with its link open" in head.stderr()
        before = metrics_text(head)
        answered: list[int] = []
        thread = threading.Thread(
            target=lambda: answered.append(
                request(head, "POST", "/v1/chat/completions", chat("What is 3 + 4?"))[0]
            ),
            daemon=True,
        )
        thread.start()
        time.sleep(2)
        assert answered == [] and head.health() == 200
        frozen = metrics_text(head)
        assert frozen == before
        assert "vllm:num_requests_running{" in frozen and re.search(
            r"num_requests_running\{[^}]*\} 0\.0", frozen
        )
        assert re.search(r"num_requests_waiting\{[^}]*\} 0\.0", frozen)
        assert "lost" not in head.stderr() and worker.proc.poll() is None
    finally:
        worker.proc.send_signal(signal.SIGCONT)
    thread.join(timeout=10)
    assert answered == [200]
    assert "headless rank 1 is back" in head.stderr()
    assert metrics_text(head) != before  # live again: the request that waited is counted


def metrics_text(rank: Rank) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", rank.port, timeout=5)
    conn.request("GET", "/metrics")
    data = conn.getresponse().read().decode()
    conn.close()
    return data


def test_worker_exits_non_zero_when_the_head_dies(start_rank: Callable[..., Rank], tmp_path: Path) -> None:
    head, worker = start_cluster(start_rank, tmp_path)
    head.wait_healthy()
    head.proc.send_signal(signal.SIGKILL)
    assert worker.wait(timeout=7) != 0
    assert "lost rank 0" in worker.stderr()


def test_worker_with_a_different_command_line_is_rejected(
    start_rank: Callable[..., Rank], tmp_path: Path
) -> None:
    files = make_node_files(tmp_path)
    port, master_port = free_port(), free_port()
    common = {"port": port, "master_port": master_port, "model": str(files["model"])}
    head = start_rank(reference_vllm_argv(0, **common), node_env(files), port)
    worker_argv = reference_vllm_argv(1, **common)
    worker_argv[worker_argv.index("--max-num-seqs") + 1] = "4"
    worker = start_rank(worker_argv, node_env(files | {"cache": files["cache"] / "w"}))
    assert worker.wait(timeout=10) == 1
    assert "rejected" in worker.stderr() and "max_num_seqs" in worker.stderr()
    assert "max_num_seqs: rank0=2 rank1=4" in head.stderr()
    assert head.proc.poll() is None and head.health() is None


# --- the API ----------------------------------------------------------------------------------


def test_models_and_auth(head: Rank) -> None:
    status, body = request(head, "GET", "/v1/models")
    assert status == 200
    assert [(m["id"], m["max_model_len"]) for m in body["data"]] == [(MODEL, 262144)]
    for key in (None, "wrong-key"):
        status, body = request(head, "GET", "/v1/models", key=key)
        assert status == 401 and body["error"]["message"].startswith("Unauthorized")
    assert request(head, "GET", "/health", key=None)[0] == 200
    assert request(head, "GET", "/v1/nothing-here")[0] == 404
    status, body = request(head, "POST", "/v1/chat/completions", chat("hi", model="gpt-4"))
    assert status == 404 and "gpt-4" in body["error"]["message"]


def test_text_answer_with_usage_details(head: Rank) -> None:
    status, body = request(head, "POST", "/v1/chat/completions", chat("What is 17 * 23?", **NO_THINKING))
    assert status == 200, body
    choice = body["choices"][0]
    assert "391" in choice["message"]["content"] and choice["finish_reason"] == "stop"
    assert choice["message"]["reasoning_content"] is None
    usage = body["usage"]
    assert usage["prompt_tokens"] == 5 and usage["completion_tokens"] == len(
        choice["message"]["content"].split()
    )
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


def test_reasoning_comes_first_unless_thinking_is_disabled(head: Rank) -> None:
    status, body = request(head, "POST", "/v1/chat/completions", chat("What is 6 / 4?"))
    message = body["choices"][0]["message"]
    assert status == 200 and message["reasoning_content"] and "1.5" in message["content"]
    _, events = stream(head, "/v1/chat/completions", chat("What is 6 / 4?"))
    kinds = [next(iter(e["choices"][0]["delta"])) for _, e in token_chunks(events)]
    assert kinds[0] == "reasoning_content" and kinds[-1] == "content"
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning_content")
    no_think = chat("What is 6 / 4?", chat_template_kwargs={"enable_thinking": False})
    assert (
        request(head, "POST", "/v1/chat/completions", no_think)[1]["choices"][0]["message"][
            "reasoning_content"
        ]
        is None
    )


def test_tool_call(head: Rank) -> None:
    body = chat("What's the weather in Hanoi right now?", tools=[WEATHER_TOOL], **NO_THINKING)
    status, result = request(head, "POST", "/v1/chat/completions", body)
    assert status == 200
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Hanoi"}

    _, events = stream(head, "/v1/chat/completions", body)
    chunks = [e for _, e in token_chunks(events)]
    first = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["function"]["name"] == "get_weather" and first["id"].startswith("chatcmpl-tool-")
    arguments = "".join(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in chunks)
    assert json.loads(arguments) == {"city": "Hanoi"} and len(chunks) > 2
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    follow_up = body["messages"] + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "31 C, sunny"},
    ]
    status, result = request(head, "POST", "/v1/chat/completions", body | {"messages": follow_up})
    assert status == 200 and "31 C, sunny" in result["choices"][0]["message"]["content"]


def test_vision_names_left_then_right(head: Rank) -> None:
    status, body = request(
        head, "POST", "/v1/chat/completions", image_message(halves_png((230, 20, 20), (20, 30, 220)))
    )
    text = body["choices"][0]["message"]["content"]
    assert status == 200 and text == "The left half is red and the right half is blue."
    two = image_message(halves_png((0, 0, 0), (255, 255, 255)))
    two["messages"][0]["content"].append(two["messages"][0]["content"][1])
    assert request(head, "POST", "/v1/chat/completions", two)[0] == 400  # --limit-mm-per-prompt {"image":1}


def test_an_image_url_of_a_host_not_allowed_is_refused_before_any_fetch(head: Rank) -> None:
    """The role's default --allowed-media-domains media.invalid: vLLM 0.32 refuses every http URL."""
    body = image_message(b"")
    body["messages"][0]["content"][1]["image_url"]["url"] = "http://198.18.0.1:8080/secret.png"
    status, answer = request(head, "POST", "/v1/chat/completions", body)
    assert status == 400
    assert "allowed domains: ['media.invalid']. Input URL domain: 198.18.0.1" in answer["error"]["message"]


def test_streaming_one_token_per_chunk_and_usage(head: Rank) -> None:
    _, events = stream(head, "/v1/chat/completions", chat("Describe the fabric link.", **NO_THINKING))
    assert events[-1][1] == "[DONE]"
    first = events[0][1]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    usage_event = events[-2][1]
    assert usage_event["choices"] == []  # forced by --enable-force-include-usage
    tokens = token_chunks(events)
    assert len(tokens) == usage_event["usage"]["completion_tokens"] == OUTPUT_TOKENS
    assert all(len(e["choices"][0]["delta"]["content"].split()) == 1 for _, e in tokens)
    assert tokens[-1][1]["choices"][0]["finish_reason"] == "stop"

    _, capped = stream(
        head, "/v1/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 7}
    )
    tokens = token_chunks(capped)
    assert len(tokens) == 7 and tokens[-1][1]["choices"][0]["finish_reason"] == "length"
    assert capped[-2][1]["usage"]["completion_tokens"] == 7


def test_max_tokens_beyond_the_context_is_rejected(head: Rank) -> None:
    status, body = request(head, "POST", "/v1/chat/completions", chat("hello", max_completion_tokens=262144))
    assert status == 400 and "maximum context length is 262144" in body["error"]["message"]


def measure_decode_rates(head: Rank, concurrency: int) -> list[float]:
    """Per-stream decode rate as a benchmark computes it: (tokens - 1) / (last - first token)."""
    rates: list[float] = []

    def one(index: int) -> None:
        prompt = f"Write a long essay about distributed inference, part {index}."
        _, events = stream(head, "/v1/chat/completions", chat(prompt, **NO_THINKING))
        times = [at for at, _ in token_chunks(events)]
        assert len(times) == OUTPUT_TOKENS
        rates.append((len(times) - 1) / (times[-1] - times[0]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(rates) == concurrency
    return rates


@pytest.mark.parametrize("concurrency", [1, 2])
def test_decode_rate_per_stream(head: Rank, concurrency: int) -> None:
    """Within 3 % at concurrency 1 and 2; one re-measurement forgives a busy shared test machine."""
    for _attempt in range(2):
        rates = measure_decode_rates(head, concurrency)
        if all(abs(rate - DECODE_TPS) / DECODE_TPS < 0.03 for rate in rates):
            return
    pytest.fail(f"decode rates {rates} not within 3 % of {DECODE_TPS}")


def test_prefill_time_follows_prompt_tokens(head: Rank) -> None:
    """Within 3 %; one re-measurement forgives a busy shared test machine, as for the decode rate."""
    prompt_ids = [(i * 7919) % 120000 for i in range(2000)]
    body = {"model": MODEL, "prompt": prompt_ids, "max_tokens": 3}
    expected = len(prompt_ids) / PREFILL_TPS
    ttfts = []
    for _attempt in range(2):
        sent, events = stream(head, "/v1/completions", body)
        assert events[-2][1]["usage"]["prompt_tokens"] == 2000
        ttfts.append(token_chunks(events)[0][0] - sent)
        if abs(ttfts[-1] - expected) / expected < 0.03:
            return
    pytest.fail(f"time to first token {ttfts} not within 3 % of {expected}")


def test_request_log_records_auth_and_limits_but_never_the_key(head: Rank) -> None:
    request(
        head, "POST", "/v1/chat/completions", chat("What is 1 + 1?", max_completion_tokens=50), key="nope"
    )
    request(head, "POST", "/v1/chat/completions", chat("What is 1 + 2?", max_completion_tokens=50))
    text = (Path(head.env["XDG_CACHE_HOME"]) / "standin-requests.jsonl").read_text()
    assert API_KEY not in text
    records = [json.loads(line) for line in text.splitlines()]
    denied = [r for r in records if r.get("bearer_matched") is False and r["path"] == "/v1/chat/completions"]
    allowed = [r for r in records if r.get("bearer_matched") is True and r.get("max_completion_tokens") == 50]
    assert denied and denied[-1]["status"] == 401
    assert allowed[-1]["max_completion_tokens_present"] and not allowed[-1]["max_tokens_present"]
    assert denied[-1]["max_completion_tokens_present"] and denied[-1]["model"] == MODEL
    assert allowed[-1]["model"] == MODEL and allowed[-1]["user_agent"] == USER_AGENT


def test_faults_and_api_key_flag(start_rank: Callable[..., Rank], tmp_path: Path) -> None:
    settings = {"STANDIN_FAULTS": "swap_colors,wrong_math"}
    head = start_cluster(
        start_rank, tmp_path, nnodes=1, settings=settings, head_extra=("--api-key", API_KEY), key=None
    )[0]
    head.wait_healthy()
    assert API_KEY not in head.stderr()
    assert request(head, "GET", "/v1/models", key=None)[0] == 401
    body = request(head, "POST", "/v1/chat/completions", image_message(halves_png((255, 0, 0), (0, 0, 255))))[
        1
    ]
    assert body["choices"][0]["message"]["content"] == "The left half is blue and the right half is red."
    body = request(head, "POST", "/v1/chat/completions", chat("What is 17 * 23?", **NO_THINKING))[1]
    assert "391" not in body["choices"][0]["message"]["content"]


# --- pure functions ---------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [False, True])
def test_png_decoder_handles_every_filter_type(alpha: bool) -> None:
    width, bpp = 9, 4 if alpha else 3
    rows = [
        bytes((x * 37 + y * 91 + c * 53) % 256 for x in range(width) for c in range(bpp)) for y in range(10)
    ]
    for filters in ((0,), (1,), (2,), (3,), (4,), (0, 1, 2, 3, 4)):
        decoded = png.decode_png(encode_png(rows, width, alpha=alpha, filters=filters))
        assert decoded == (width, len(rows), bpp, rows), filters


@pytest.mark.parametrize(
    ("rgb", "name"),
    [
        ((250, 10, 10), "red"),
        ((10, 200, 30), "green"),
        ((20, 30, 220), "blue"),
        ((250, 250, 250), "white"),
        ((5, 5, 5), "black"),
        ((240, 230, 20), "yellow"),
        ((128, 128, 128), "gray"),
    ],
)
def test_colour_names(rgb: tuple[int, int, int], name: str) -> None:
    assert png.colour_name(*rgb) == name


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("What is 17 * 23?", "17 * 23 = 391."),
        ("What is 100 - 58?", "100 - 58 = 42."),
        ("Compute 7/2", "7 / 2 = 3.5."),
        ("Write 3-4 sentences about the sea", None),
        ("Summarise the report from 2024-11-05", None),
    ],
)
def test_arithmetic(prompt: str, answer: str | None) -> None:
    assert answers.arithmetic(prompt, wrong=False) == answer


@pytest.mark.parametrize(
    ("prompt", "city"),
    [
        ("What's the weather in Hanoi right now?", "Hanoi"),
        ("weather for Ho Chi Minh City today", "Ho Chi Minh City"),
        ("How is the weather in paris?", "Paris"),
    ],
)
def test_city_extraction(prompt: str, city: str) -> None:
    assert answers.extract_city(prompt) == city


@pytest.mark.parametrize(
    ("faults", "prompt", "city"),
    [
        ("", "What's the weather in Hanoi right now?", "Hanoi"),
        ("wrong_city", "What's the weather in Hanoi right now?", "Paris"),
        ("wrong_city,no_reasoning", "How is the weather in Paris?", "London"),
    ],
)
def test_wrong_city_calls_the_tool_for_a_city_not_asked_about(
    faults: str, prompt: str, city: str, tmp_path: Path
) -> None:
    args = cli.build_parser().parse_args(["serve", *reference_vllm_argv(0)])
    settings = Settings.from_env({"STANDIN_FAULTS": faults}, tmp_path)
    answer = answers.Planner(args, settings).chat(chat(prompt, tools=[WEATHER_TOOL], **NO_THINKING))
    arguments = "".join(piece.text for piece in answer.pieces if piece.kind == "tool_args")
    assert answer.tool_name == "get_weather" and answer.finish_reason == "tool_calls"
    assert json.loads(arguments) == {"city": city}
