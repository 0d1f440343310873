"""The smoke checks' judgement, on answers shaped as vLLM's OpenAI server gives them."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._smoke import (
    CHECKS,
    Reply,
    judge_reasoning,
    judge_stream,
    judge_text,
    judge_tool_call,
    judge_vision,
    png_two_halves,
    reported_usage,
    requests,
    run_checks,
    run_smoke,
    stream_events,
    table,
)


def chat(message: dict, usage: dict | None = None) -> Reply:
    body = {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    return Reply(200, body=body | ({"usage": usage} if usage else {}))


def tool_call(name: str, arguments: str) -> dict:
    return {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": name, "arguments": arguments}}


def sse(*contents: str, done: bool = True, usage: dict | None = None) -> Reply:
    """A server-sent event stream as vLLM writes it: each event, then a blank line; the usage chunk
    (``choices: []``) last, as with ``stream_options.include_usage``."""
    lines: list[str] = []
    for content in contents:
        lines += [f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': content}}]})}", ""]
    if usage:
        lines += [f"data: {json.dumps({'choices': [], 'usage': usage})}", ""]
    return Reply(200, lines=tuple(lines + (["data: [DONE]"] if done else [])))


USAGE = {"prompt_tokens": 17, "completion_tokens": 7, "total_tokens": 24}


def usage_in_every_chunk(*completion_tokens: int) -> Reply:
    """A stream with vLLM's continuous usage stats: the running usage in every chunk."""
    events = [
        {"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": n}} for n in completion_tokens
    ]
    return Reply(200, lines=(*(f"data: {json.dumps(event)}" for event in events), "data: [DONE]"))


@pytest.mark.parametrize(
    ("content", "passed"),
    [("17 * 23 = 391.", True), ("The answer is **391**", True), ("17 * 23 = 392.", False), (None, False)],
)
def test_text(content, passed):
    assert judge_text(chat({"role": "assistant", "content": content})).passed is passed


@pytest.mark.parametrize(
    ("calls", "passed"),
    [
        ([tool_call("get_weather", '{"city": "Hanoi"}')], True),
        ([tool_call("lookup", "{}"), tool_call("get_weather", '{"city": "Hanoi"}')], True),
        ([tool_call("get_weather", '{"city": ""}')], False),
        ([tool_call("get_weather", '{"location": "Hanoi"}')], False),
        ([tool_call("get_weather", "not json")], False),
        ([tool_call("get_time", '{"city": "Hanoi"}')], False),
        ([], False),
    ],
)
def test_tool_call(calls, passed):
    result = judge_tool_call(chat({"role": "assistant", "content": None, "tool_calls": calls}))
    assert result.passed is passed
    if passed:
        assert "Hanoi" in result.evidence


@pytest.mark.parametrize(
    ("city", "passed"),
    [
        ("Hanoi", True),
        (" hanoi ", True),
        ("HANOI", True),
        ("Ha Noi", True),
        ("Ha-Noi", True),
        ("Hanoi, Vietnam", True),
        ("Hà Nội", True),
        ("Paris", False),
        ("Ho Chi Minh City", False),
        ("Noi Ha", False),
    ],
)
def test_tool_call_must_ask_for_the_city_asked_about(city, passed):
    call = tool_call("get_weather", json.dumps({"city": city}))
    result = judge_tool_call(chat({"role": "assistant", "content": None, "tool_calls": [call]}))
    assert result.passed is passed
    assert f"get_weather(city={city.strip()!r})" in result.evidence  # the city called is shown
    if not passed:
        assert result.evidence.endswith("but the question is about Hanoi")


def test_tool_call_passes_when_one_of_several_calls_asks_for_the_city():
    calls = [tool_call("get_weather", '{"city": "Paris"}'), tool_call("get_weather", '{"city": "Hanoi"}')]
    result = judge_tool_call(chat({"role": "assistant", "content": None, "tool_calls": calls}))
    assert result.passed and result.evidence == "get_weather(city='Hanoi')"


@pytest.mark.parametrize(
    ("content", "passed"),
    [
        ("The left half is red and the right half is blue.", True),
        ("Red on the left, BLUE on the right", True),
        ("The left half is blue and the right half is red.", False),
        ("It is reddish and bluer", False),
        ("Only red.", False),
    ],
)
def test_vision_names_red_before_blue(content, passed):
    assert judge_vision(chat({"role": "assistant", "content": content})).passed is passed


@pytest.mark.parametrize(
    ("message", "passed"),
    [
        ({"content": "yes", "reasoning_content": "1009 is not divisible by any prime up to 31."}, True),
        ({"content": "yes", "reasoning": "Check divisors up to 31."}, True),
        ({"content": "yes", "reasoning_content": None}, False),
        ({"content": "yes", "reasoning_content": "  "}, False),
        ({"content": "yes"}, False),
    ],
)
def test_reasoning(message, passed):
    assert judge_reasoning(chat(message)).passed is passed


@pytest.mark.parametrize(
    ("reply", "passed"),
    [
        (sse("1, ", "2, ", "3"), True),
        (sse("1, 2, 3"), False),  # one chunk is not a stream
        (sse("1, ", "2, ", done=False), False),
        (sse(), False),
    ],
)
def test_stream(reply, passed):
    assert judge_stream(reply).passed is passed


def test_stream_events_skip_comments_and_stop_at_done():
    events, done = stream_events([": ping", 'data: {"a": 1}', "", "data: [DONE]", 'data: {"b": 2}'])
    assert events == [{"a": 1}] and done


def test_png_is_a_valid_rgb_image_with_two_halves():
    png = png_two_halves(4, 2, (255, 0, 0), (0, 0, 255))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, colour = struct.unpack(">IIBB", png[16:26])
    assert (width, height, depth, colour) == (4, 2, 8, 2)
    idat = png.index(b"IDAT")
    length = struct.unpack(">I", png[idat - 4 : idat])[0]
    rows = zlib.decompress(png[idat + 4 : idat + 4 + length])
    assert rows == (b"\x00" + b"\xff\x00\x00" * 2 + b"\x00\x00\xff" * 2) * 2


@pytest.mark.parametrize("size", [(1, 4), (4, 0)])
def test_png_refuses_sizes_without_two_halves(size):
    with pytest.raises(ValueError, match="width >= 2"):
        png_two_halves(*size, (0, 0, 0), (1, 1, 1))


def test_requests_never_cap_the_output_and_ask_the_model():
    for path, payload, stream in requests("m").values():
        assert path == "/chat/completions" and payload["model"] == "m"
        assert "max_tokens" not in payload and "max_completion_tokens" not in payload
        assert stream is bool(payload.get("stream"))


@pytest.mark.parametrize("name", CHECKS)
def test_every_request_is_greedy(name):
    _, payload, _ = requests("m")[name]
    assert payload["temperature"] == 0


def test_the_stream_asks_for_its_usage_and_only_the_stream_does():
    asked = requests("m")
    assert asked["stream"][1]["stream_options"] == {"include_usage": True}
    assert all("stream_options" not in payload for name, (_, payload, _) in asked.items() if name != "stream")


def test_the_tool_question_is_about_hanoi():
    _, payload, _ = requests("m")["tool_call"]
    assert "Hanoi" in payload["messages"][0]["content"]
    assert payload["tools"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("reply", "usage"),
    [
        (chat({"content": "391"}, USAGE), {"prompt_tokens": 17, "completion_tokens": 7}),
        (chat({"content": "391"}), None),
        (chat({"content": "391"}, {"prompt_tokens": 17}), None),
        (sse("1, ", "2, ", "3", usage=USAGE), {"prompt_tokens": 17, "completion_tokens": 7}),
        (sse("1, ", "2, ", "3"), None),
        (usage_in_every_chunk(1, 2, 7), {"prompt_tokens": 17, "completion_tokens": 7}),
        (Reply(401, body={"error": {"message": "Unauthorized"}}), None),
    ],
    ids=[
        "body",
        "body-none",
        "body-partial",
        "stream-final-chunk",
        "stream-none",
        "stream-every-chunk",
        "refused",
    ],
)
def test_reported_usage(reply, usage):
    assert reported_usage(reply) == usage


def test_every_check_carries_the_usage_of_its_answer():
    def client(path, payload, stream):
        if stream:
            return sse("1, ", "2, ", "3", usage={"prompt_tokens": 5, "completion_tokens": 3})
        return chat({"content": "17 * 23 = 391."}, USAGE)

    results = run_checks(client, "m", CHECKS)
    stream = results.pop()
    assert stream.passed and stream.usage == {"prompt_tokens": 5, "completion_tokens": 3}
    assert all(r.usage == {"prompt_tokens": 17, "completion_tokens": 7} for r in results)
    assert results[0].as_dict()["usage"] == {"prompt_tokens": 17, "completion_tokens": 7}


def test_a_refused_request_fails_its_check_with_the_status():
    def client(path, payload, stream):
        return Reply(401, body={"error": {"message": "Unauthorized: missing or invalid bearer token"}})

    results = run_checks(client, "m", CHECKS)
    assert [r.name for r in results] == list(CHECKS)
    assert all(not r.passed and r.evidence.startswith("HTTP 401: Unauthorized") for r in results)


def test_an_unreachable_endpoint_fails_with_the_reason():
    results = run_checks(lambda *_: Reply(0, error="http://x/v1/chat/completions: refused"), "m", ["text"])
    assert results[0].evidence == "http://x/v1/chat/completions: refused" and not results[0].passed


def test_table_has_one_line_per_check():
    def client(path, payload, stream):
        return chat({"content": "17 * 23 = 391."})

    lines = table(run_checks(client, "m", ["text", "vision"])).splitlines()
    assert lines[0].split() == ["check", "result", "tokens", "evidence"]
    assert lines[1].split()[:2] == ["text", "PASS"] and lines[2].split()[:2] == ["vision", "FAIL"]


def test_table_shows_the_tokens_in_and_out_of_each_check():
    def client(path, payload, stream):
        if payload["messages"][0]["content"] == "What is 17 * 23?":
            return chat({"content": "17 * 23 = 391."}, USAGE)
        return Reply(401, body={"error": {"message": "Unauthorized"}})

    lines = table(run_checks(client, "m", ["text", "vision"])).splitlines()
    column = lines[0].index("tokens")
    assert lines[0].index("evidence") > column
    assert lines[1][column:].startswith("17 in, 7 out  'What is 17 * 23?'")
    assert lines[2][column:].startswith("-             HTTP 401")


def models_then(answer: Reply, listed: Reply):
    """A client answering GET /models with ``listed`` and each check with ``answer``; and its calls."""
    calls: list[tuple[str, dict | None]] = []

    def client(path, payload, stream):
        calls.append((path, payload))
        return listed if payload is None else answer

    return client, calls


MODELS = Reply(200, body={"object": "list", "data": [{"id": "first", "object": "model"}, {"id": "second"}]})


@pytest.mark.parametrize("given", ["", None])
def test_without_a_model_the_first_one_listed_is_asked(given):
    client, calls = models_then(chat({"content": "17 * 23 = 391."}), MODELS)
    model, results = run_smoke(client, given, ["text", "vision"])
    assert model == "first" and [r.name for r in results] == ["text", "vision"]
    assert calls[0] == ("/models", None)
    assert [payload["model"] for _, payload in calls[1:]] == ["first", "first"]


def test_a_model_given_is_asked_without_listing_the_models():
    client, calls = models_then(chat({"content": "17 * 23 = 391."}), MODELS)
    model, results = run_smoke(client, "mine", ["text"])
    assert model == "mine" and results[0].passed
    assert [(path, payload["model"]) for path, payload in calls] == [("/chat/completions", "mine")]


@pytest.mark.parametrize(
    ("listed", "evidence"),
    [
        (
            Reply(401, body={"error": {"message": "Unauthorized: missing or invalid bearer token"}}),
            "HTTP 401: ",
        ),
        (Reply(200, body={"object": "list", "data": []}), "no model listed: "),
        (Reply(200, body={"object": "list"}), "no model listed: "),
        (Reply(0, error="http://x/v1/models: refused"), "http://x/v1/models: refused"),
    ],
    ids=["refused", "empty", "no-data", "unreachable"],
)
def test_without_a_model_every_check_fails_when_none_can_be_chosen(listed, evidence):
    client, calls = models_then(chat({"content": "17 * 23 = 391."}), listed)
    model, results = run_smoke(client, "", CHECKS)
    assert model == "" and calls == [("/models", None)]
    assert [r.name for r in results] == list(CHECKS)
    assert all(not r.passed and r.evidence.startswith(evidence) for r in results)
    assert all(r.evidence.endswith("(GET /models, to choose the model)") for r in results)
