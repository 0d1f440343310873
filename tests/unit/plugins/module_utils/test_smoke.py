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
    requests,
    run_checks,
    stream_events,
    table,
)


def chat(message: dict) -> Reply:
    return Reply(200, body={"object": "chat.completion", "choices": [{"index": 0, "message": message}]})


def tool_call(name: str, arguments: str) -> dict:
    return {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": name, "arguments": arguments}}


def sse(*contents: str, done: bool = True) -> Reply:
    """A server-sent event stream as vLLM writes it: each event, then a blank line."""
    lines: list[str] = []
    for content in contents:
        lines += [f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': content}}]})}", ""]
    return Reply(200, lines=tuple(lines + (["data: [DONE]"] if done else [])))


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


def test_a_refused_request_fails_its_check_with_the_status():
    def client(path, payload, stream):
        return Reply(401, body={"error": {"message": "Unauthorized: missing or invalid bearer token"}})

    results = run_checks(client, "m")
    assert [r.name for r in results] == list(CHECKS)
    assert all(not r.passed and r.evidence.startswith("HTTP 401: Unauthorized") for r in results)


def test_an_unreachable_endpoint_fails_with_the_reason():
    results = run_checks(lambda *_: Reply(0, error="http://x/v1/chat/completions: refused"), "m", ["text"])
    assert results[0].evidence == "http://x/v1/chat/completions: refused" and not results[0].passed


def test_table_has_one_line_per_check():
    def client(path, payload, stream):
        return chat({"content": "17 * 23 = 391."})

    lines = table(run_checks(client, "m", ["text", "vision"])).splitlines()
    assert lines[0].split() == ["check", "result", "evidence"]
    assert lines[1].split()[:2] == ["text", "PASS"] and lines[2].split()[:2] == ["vision", "FAIL"]
