# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Smoke checks of an OpenAI-compatible endpoint: the requests, and the judgement of the answers.

Pure functions: the HTTP transport is passed in (``Client``), so every check is tested on captured
answers without a server.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import struct
import unicodedata
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

CHECKS = ("text", "tool_call", "vision", "reasoning", "stream")
TEXT_PROMPT = "What is 17 * 23?"
TEXT_EXPECTED = "391"
WEATHER_CITY = "Hanoi"
WEATHER_PROMPT = f"What is the weather in {WEATHER_CITY} right now? Use the tool."
VISION_PROMPT = "This image has two halves. Name the colour of the left half, then of the right half."
REASONING_PROMPT = "Is 1009 a prime number? Think it through, then answer yes or no."
STREAM_PROMPT = "Count from 1 to 5."
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}
EVIDENCE_CHARS = 120


@dataclass(frozen=True)
class Reply:
    """What the endpoint answered: HTTP status and either the JSON body or the stream's lines."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)
    lines: tuple[str, ...] = ()
    error: str = ""


class Client(Protocol):
    """The HTTP transport: ``client(path, payload, stream)`` -> Reply; a payload of None is a GET.

    A protocol rather than a ``Callable[...]`` alias: the alias was evaluated at import, and its
    ``X | None`` fails on a node with Python older than 3.10; annotations are never evaluated.
    """

    def __call__(self, path: str, payload: dict[str, Any] | None, stream: bool, /) -> Reply: ...


@dataclass(frozen=True)
class Result:
    name: str
    passed: bool
    evidence: str
    # prompt_tokens and completion_tokens as the endpoint reported them; None when it did not
    usage: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "evidence": self.evidence, "usage": self.usage}


def png_two_halves(width: int, height: int, left: tuple[int, int, int], right: tuple[int, int, int]) -> bytes:
    """An RGB PNG whose left half is ``left`` and right half ``right``."""
    if width < 2 or height < 1:
        raise ValueError(f"a two-halves image needs width >= 2 and height >= 1, got {width}x{height}")
    row = b"\x00" + bytes(left) * (width // 2) + bytes(right) * (width - width // 2)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(row * height)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def image_url() -> str:
    red_blue = png_two_halves(64, 32, (255, 0, 0), (0, 0, 255))
    return "data:image/png;base64," + base64.b64encode(red_blue).decode()


def requests(model: str) -> dict[str, tuple[str, dict[str, Any], bool]]:
    """Each check's request: (path, payload, stream). Greedy (temperature 0), so a check judges the
    model's most likely answer; no output cap: the model ends its reply."""

    def chat(content: Any, **extra: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}

    vision = [
        {"type": "text", "text": VISION_PROMPT},
        {"type": "image_url", "image_url": {"url": image_url()}},
    ]
    weather = chat(WEATHER_PROMPT, tools=[WEATHER_TOOL], tool_choice="auto")
    return {
        "text": ("/chat/completions", chat(TEXT_PROMPT), False),
        "tool_call": ("/chat/completions", weather, False),
        "vision": ("/chat/completions", chat(vision), False),
        "reasoning": ("/chat/completions", chat(REASONING_PROMPT, reasoning_effort="high"), False),
        "stream": (
            "/chat/completions",
            chat(STREAM_PROMPT, stream=True, stream_options={"include_usage": True}),
            True,
        ),
    }


def _short(text: Any) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= EVIDENCE_CHARS else flat[: EVIDENCE_CHARS - 1] + "…"


def _message(reply: Reply) -> dict[str, Any]:
    choices = reply.body.get("choices") or [{}]
    return choices[0].get("message") or {}


def _refused(reply: Reply) -> str:
    """Why a reply cannot be judged at all (HTTP error, transport error), or ''."""
    if reply.error:
        return reply.error
    if reply.status != 200:
        error = reply.body.get("error")
        detail = error.get("message") if isinstance(error, dict) else ""
        return f"HTTP {reply.status}" + (f": {_short(detail)}" if detail else "")
    return ""


def judge_text(reply: Reply) -> Result:
    content = _message(reply).get("content") or ""
    return Result("text", TEXT_EXPECTED in content, f"{TEXT_PROMPT!r} -> {_short(content)!r}")


def _folded(text: str) -> str:
    """Lower-case ASCII letters and digits only: 'Hà Nội, Vietnam' -> 'hanoivietnam'."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]", "", ascii_text.lower())


def _weather_city(function: dict[str, Any]) -> str:
    """The non-empty ``city`` argument of a get_weather call, or ''."""
    if function.get("name") != "get_weather":
        return ""
    raw = function.get("arguments") or "{}"
    try:
        arguments = raw if isinstance(raw, dict) else json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        return ""
    city = arguments.get("city") if isinstance(arguments, dict) else None
    return city.strip() if isinstance(city, str) else ""


def judge_tool_call(reply: Reply) -> Result:
    """get_weather must be called for the city asked about ('Hanoi', 'Ha Noi', 'Hanoi, Vietnam')."""
    calls = _message(reply).get("tool_calls") or []
    cities = [city for call in calls if (city := _weather_city(call.get("function") or {}))]
    wanted = _folded(WEATHER_CITY)
    right = next((city for city in cities if _folded(city).startswith(wanted)), None)
    if right is not None:
        return Result("tool_call", True, f"get_weather(city={_short(right)!r})")
    if cities:
        called = ", ".join(f"get_weather(city={_short(city)!r})" for city in cities)
        return Result("tool_call", False, f"{called}, but the question is about {WEATHER_CITY}")
    if calls:
        return Result("tool_call", False, f"no get_weather call with a city: {_short(json.dumps(calls))}")
    content = _message(reply).get("content") or ""
    return Result("tool_call", False, f"no tool call; answered {_short(content)!r}")


def judge_vision(reply: Reply) -> Result:
    content = _message(reply).get("content") or ""
    red, blue = (re.search(rf"\b{colour}\b", content, re.IGNORECASE) for colour in ("red", "blue"))
    passed = bool(red and blue and red.start() < blue.start())
    return Result("vision", passed, f"left red, right blue -> {_short(content)!r}")


def judge_reasoning(reply: Reply) -> Result:
    message = _message(reply)
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    if reasoning.strip():
        return Result("reasoning", True, f"{len(reasoning)} characters of reasoning: {_short(reasoning)!r}")
    return Result("reasoning", False, "no reasoning_content (or reasoning) in the answer")


def stream_events(lines: Iterable[str]) -> tuple[list[dict[str, Any]], bool]:
    """The JSON events of a server-sent event stream, and whether it ended with [DONE]."""
    events, done = [], False
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            events.append(json.loads(data))
        except json.JSONDecodeError:
            continue
    return events, done


def judge_stream(reply: Reply) -> Result:
    events, done = stream_events(reply.lines)
    pieces = [
        (choice.get("delta") or {}).get("content") or ""
        for event in events
        for choice in event.get("choices") or []
    ]
    text = "".join(pieces)
    chunks = sum(1 for piece in pieces if piece)
    passed = done and chunks >= 2 and bool(text.strip())
    ending = "ended with [DONE]" if done else "no [DONE]"
    return Result("stream", passed, f"{chunks} content chunks, {ending}: {_short(text)!r}")


JUDGES: dict[str, Callable[[Reply], Result]] = {
    "text": judge_text,
    "tool_call": judge_tool_call,
    "vision": judge_vision,
    "reasoning": judge_reasoning,
    "stream": judge_stream,
}


def reported_usage(reply: Reply) -> dict[str, int] | None:
    """prompt_tokens and completion_tokens of the answer's ``usage`` (a stream's last usage chunk)."""
    if reply.lines:
        events, _done = stream_events(reply.lines)
        usages = [event["usage"] for event in events if isinstance(event.get("usage"), dict)]
        usage = usages[-1] if usages else None
    else:
        usage = reply.body.get("usage")
    if not isinstance(usage, dict):
        return None
    counts = {key: usage.get(key) for key in ("prompt_tokens", "completion_tokens")}
    return counts if all(isinstance(value, int) for value in counts.values()) else None


def run_checks(client: Client, model: str, checks: Iterable[str]) -> list[Result]:
    """Ask each check's question and judge the answer; a refused request fails that check."""
    asked = requests(model)
    results = []
    for name in checks:
        path, payload, stream = asked[name]
        reply = client(path, payload, stream)
        refused = _refused(reply)
        result = Result(name, False, refused) if refused else JUDGES[name](reply)
        results.append(dataclasses.replace(result, usage=reported_usage(reply)))
    return results


def first_model(client: Client) -> tuple[str, str]:
    """(the first model id ``GET /models`` lists, '') or ('', why there is none)."""
    reply = client("/models", None, False)
    refused = _refused(reply)
    if refused:
        return "", refused
    data = reply.body.get("data")
    ids = [entry.get("id") for entry in data if isinstance(entry, dict)] if isinstance(data, list) else []
    model = next((name for name in ids if isinstance(name, str) and name), "")
    return model, "" if model else f"no model listed: {_short(json.dumps(reply.body))}"


def run_smoke(client: Client, model: str | None, checks: Iterable[str]) -> tuple[str, list[Result]]:
    """The model asked (the endpoint's first when none is given) and each check's result."""
    checks = list(checks)
    if not model:
        model, why = first_model(client)
        if why:
            return "", [Result(name, False, f"{why} (GET /models, to choose the model)") for name in checks]
    return model, run_checks(client, model, checks)


def _tokens(usage: dict[str, int] | None) -> str:
    return f"{usage['prompt_tokens']} in, {usage['completion_tokens']} out" if usage else "-"


def table(results: list[Result]) -> str:
    """One line per check: name, PASS/FAIL, tokens (prompt in, completion out), evidence."""
    width = max([len(r.name) for r in results] + [5])
    tokens = [_tokens(r.usage) for r in results]
    tokens_width = max([len(t) for t in tokens] + [6])
    lines = [f"{'check':<{width}}  result  {'tokens':<{tokens_width}}  evidence"]
    lines += [
        f"{r.name:<{width}}  {'PASS' if r.passed else 'FAIL':<6}  {t:<{tokens_width}}  {r.evidence}"
        for r, t in zip(results, tokens, strict=True)
    ]
    return "\n".join(lines)
