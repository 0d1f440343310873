"""Answers: a deterministic function of the request (tool result, image, tool call,
arithmetic, or filler text), planned as one-token pieces.

Token accounting: one token is one whitespace-separated word.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import re
import struct
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .errors import RequestError
from .png import dominant_colours
from .settings import Settings

WRONG_CITIES = ("Paris", "London")  # wrong_city calls the tool for the first that was not asked about
IMAGE_PROMPT_TOKENS = 64  # what one image adds to prompt_tokens


@dataclass(frozen=True)
class Piece:
    """One output token: its kind (reasoning, content, tool_name, tool_args) and text."""

    kind: str
    text: str


@dataclass
class Answer:
    """The planned output: one-token pieces, the natural finish reason, an optional tool call."""

    pieces: list[Piece]
    finish_reason: str = "stop"
    tool_name: str | None = None
    tool_call_id: str | None = None


def count_tokens(text: str) -> int:
    """The stand-in tokenizer: whitespace-separated words."""
    return len(text.split())


def split_pieces(text: str, kind: str) -> list[Piece]:
    """One piece per word, each keeping the whitespace before it, so pieces join back to text."""
    return [Piece(kind, match.group(0)) for match in re.finditer(r"\s*\S+", text)]


# An integer expression; \u00d7 and \u00f7 are the multiplication and division signs.
_ARITH = re.compile(r"(?<![\w.-])(\d+)(\s*)([-+*/\u00d7\u00f7])(\s*)(\d+)(?![\w.-])")
ARITH_MAX_WORDS = 40


def arithmetic(text: str, wrong: bool) -> str | None:
    """Answer a short question holding one integer expression ('What is 17 * 23?')."""
    if count_tokens(text) > ARITH_MAX_WORDS:
        return None
    for match in _ARITH.finditer(text):
        left, space_a, op, space_b, right = match.groups()
        if op == "-" and not (space_a and space_b):
            continue  # '3-4 sentences' is a range, not a subtraction
        a, b = int(left), int(right)
        op = {"\u00d7": "*", "\u00f7": "/"}.get(op, op)
        if op == "/" and b == 0:
            return f"{a} / {b} is undefined: division by zero."
        value = {"+": Fraction(a + b), "-": Fraction(a - b), "*": Fraction(a * b)}.get(op) or Fraction(a, b)
        if wrong:
            value += 1
        shown = str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
        return f"{a} {op} {b} = {shown}."
    return None


_CITY_CAPITALISED = re.compile(r"\b(?:in|at|for)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)")
_CITY_ANY = re.compile(r"\b(?:in|at|for)\s+([A-Za-z][\w'-]*)")


def extract_city(text: str) -> str:
    """The place a weather question is about: 'weather in Ho Chi Minh City today' -> that city."""
    after = text[text.lower().find("weather") :] if "weather" in text.lower() else text
    for pattern, scope in ((_CITY_CAPITALISED, after), (_CITY_CAPITALISED, text), (_CITY_ANY, after)):
        match = pattern.search(scope)
        if match:
            return match.group(1).title() if pattern is _CITY_ANY else match.group(1)
    return "unknown"


class _Lcg:
    """Tiny deterministic generator (not for security): same prompt, same filler text."""

    def __init__(self, seed: int):
        self.state = seed & 0xFFFFFFFF

    def pick(self, n: int) -> int:
        self.state = (1664525 * self.state + 1013904223) & 0xFFFFFFFF
        return (self.state >> 8) % n


_PROSE_TEXT = (
    "the cluster serves every request across two nodes while each rank holds half of the weights "
    "and tokens flow over the fabric link with steady latency so that long answers arrive in order "
    "because the scheduler keeps both streams busy without wasting memory on idle pages"
)
_PROSE_WORDS = tuple(_PROSE_TEXT.split())
_CODE_NAMES = ("route", "shard", "merge", "plan", "score", "batch", "probe", "gather")
_CODE_LINES = (
    "def {name}_{n}(items, limit={n}):",
    "    total = 0",
    "    for index, item in enumerate(items):",
    "        if index >= limit:",
    "            break",
    "        total += item * {n}",
    "    return total",
)
_CODE_HINT = re.compile(
    r"\b(code|function|python|program|implement|class|script|bash|rust|javascript)\b", re.I
)


def filler(prompt: str, tokens: int) -> str:
    """Deterministic open-ended text of exactly ``tokens`` words: code-like when asked for code."""
    rng = _Lcg(int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big"))
    words: list[str] = []
    if _CODE_HINT.search(prompt):
        while count_tokens(" ".join(words)) < tokens:
            name, n = _CODE_NAMES[rng.pick(len(_CODE_NAMES))], rng.pick(97) + 2
            words.append("\n".join(line.format(name=name, n=n) for line in _CODE_LINES) + "\n\n")
        text = "".join(words)
    else:
        sentence: list[str] = []
        while len(words) < tokens:
            sentence.append(_PROSE_WORDS[rng.pick(len(_PROSE_WORDS))])
            if len(sentence) >= 8 + rng.pick(7):
                sentence[0] = sentence[0].capitalize()
                sentence[-1] += "."
                words.extend(sentence)
                sentence = []
        text = " ".join(words)
    pieces = split_pieces(text, "content")[:tokens]
    return "".join(piece.text for piece in pieces).lstrip()


# --- request interpretation --------------------------------------------------------------------


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [part for part in content if isinstance(part, dict)]
    return []


def message_text(message: dict[str, Any]) -> str:
    return " ".join(str(p.get("text", "")) for p in _parts(message.get("content")) if p.get("type") == "text")


def message_images(message: dict[str, Any]) -> list[str]:
    urls = []
    for part in _parts(message.get("content")):
        if part.get("type") == "image_url":
            image = part.get("image_url")
            urls.append(str(image.get("url", "") if isinstance(image, dict) else image))
    return urls


def chat_prompt_tokens(request: dict[str, Any]) -> int:
    """Words of every message (and tool call), 64 per image, plus words of the tool definitions."""
    total = 0
    for message in request.get("messages") or []:
        if isinstance(message, dict):
            total += count_tokens(message_text(message)) + IMAGE_PROMPT_TOKENS * len(message_images(message))
            if message.get("tool_calls"):
                total += count_tokens(json.dumps(message["tool_calls"]))
    if request.get("tools"):
        total += count_tokens(json.dumps(request["tools"]))
    return total


def thinking_enabled(request: dict[str, Any]) -> bool:
    kwargs = request.get("chat_template_kwargs") or {}
    return not (kwargs.get("thinking") is False or kwargs.get("enable_thinking") is False)


def image_answer(url: str, faults: frozenset[str]) -> str:
    prefix = "data:image/png;base64,"
    if not url.startswith(prefix):
        raise RequestError(
            400, "stand-in engine: only data:image/png;base64 image URLs are supported", param="image_url"
        )
    try:
        left, right = dominant_colours(base64.b64decode(url[len(prefix) :], validate=False))
    except (ValueError, binascii.Error, zlib.error, struct.error) as exc:
        raise RequestError(400, f"stand-in engine: cannot decode the PNG: {exc}", param="image_url") from exc
    if "swap_colors" in faults:
        left, right = right, left
    return f"The left half is {left} and the right half is {right}."


def name_of_tool(tool: Any) -> str:
    """The function name of one entry of a request's ``tools`` ("" when there is none)."""
    return str((tool.get("function") or {}).get("name", "")) if isinstance(tool, dict) else ""


def _tool_call_answer(tool: dict[str, Any], prompt: str, seed: str, wrong_city: bool = False) -> Answer:
    """Call ``tool`` with the place named in the prompt (another with ``wrong_city``), in the
    parameter the schema offers."""
    props = ((tool.get("function") or {}).get("parameters") or {}).get("properties") or {}
    key = "location" if "location" in props and "city" not in props else "city"
    city = extract_city(prompt)
    if wrong_city:
        city = next(other for other in WRONG_CITIES if other.lower() != city.lower())
    arguments = json.dumps({key: city})
    name = name_of_tool(tool)
    pieces = [Piece("tool_name", name), *split_pieces(arguments, "tool_args")]
    call_id = "chatcmpl-tool-" + hashlib.sha256(seed.encode()).hexdigest()[:24]
    return Answer(pieces, finish_reason="tool_calls", tool_name=name, tool_call_id=call_id)


class Planner:
    """Turns a validated request into an Answer; all choices are a function of the request."""

    def __init__(
        self,
        args: argparse.Namespace,
        settings: Settings,
        faults: Callable[[], frozenset[str]] | None = None,
    ):
        self.args = args
        self.settings = settings
        # The faults in force now: STANDIN_FAULTS, plus those the fault file adds at run time.
        self.faults = faults or (lambda: settings.faults)

    def chat(self, request: dict[str, Any]) -> Answer:
        messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
        if not messages:
            raise RequestError(400, "messages must be a non-empty list", param="messages")
        self._check_images(messages)
        answer = self._chat_content(request, messages)
        user = next((message_text(m) for m in reversed(messages) if m.get("role") == "user"), "")
        wants_reasoning = self.args.reasoning_parser and thinking_enabled(request)
        if wants_reasoning and "no_reasoning" not in self.faults():
            gist = " ".join(user.split()[:8]) or "this conversation"
            reasoning = f"The user asks: {gist}. I will answer directly and check the result."
            answer.pieces = split_pieces(reasoning, "reasoning") + answer.pieces
        return answer

    def completion(self, prompt_text: str) -> Answer:
        text = arithmetic(prompt_text, "wrong_math" in self.faults())
        text = text or filler(prompt_text, self.settings.output_tokens)
        return Answer(split_pieces(" " + text, "content"))

    def _check_images(self, messages: list[dict[str, Any]]) -> None:
        limit = (self.args.limit_mm_per_prompt or {}).get("image")
        count = sum(len(message_images(m)) for m in messages)
        if limit is not None and count > limit:
            raise RequestError(400, f"At most {limit} image(s) may be provided in one prompt.")
        # vLLM 0.32's MediaConnector: with --allowed-media-domains set, an http(s) URL of another host
        # is refused before anything is fetched (the stand-in fetches nothing anyway).
        allowed = self.args.allowed_media_domains or []
        for message in messages:
            for url in message_images(message):
                host = urllib.parse.urlsplit(url).hostname if url.lower().startswith("http") else None
                if allowed and host is not None and host not in allowed:
                    raise RequestError(
                        400,
                        f"The URL must be from one of the allowed domains: {allowed}."
                        f" Input URL domain: {host}",
                        param="image_url",
                    )

    def _chat_content(self, request: dict[str, Any], messages: list[dict[str, Any]]) -> Answer:
        last = messages[-1]
        faults = self.faults()
        if last.get("role") == "tool":
            result = " ".join(message_text(last).split()[:30])
            return Answer(split_pieces(f"The tool returned: {result}", "content"))
        user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        prompt = message_text(user)
        images = message_images(user)
        if images:
            return Answer(split_pieces(image_answer(images[-1], faults), "content"))
        tool = self._tool_to_call(request, prompt)
        if tool is not None:
            seed = json.dumps(messages, sort_keys=True)
            return _tool_call_answer(tool, prompt, seed, wrong_city="wrong_city" in faults)
        if "weather" in prompt.lower() and request.get("tools") and "no_tool_call" in faults:
            return Answer(split_pieces("I cannot look up the weather right now.", "content"))
        text = arithmetic(prompt, "wrong_math" in faults) or filler(prompt, self.settings.output_tokens)
        return Answer(split_pieces(text, "content"))

    def _tool_to_call(self, request: dict[str, Any], prompt: str) -> dict[str, Any] | None:
        """vLLM's tool_choice rules, with 'the model decides' = a weather tool for a weather question."""
        tools = [t for t in request.get("tools") or [] if isinstance(t, dict)]
        choice = request.get("tool_choice") or ("auto" if tools else "none")
        if not tools or choice == "none":
            return None
        if choice == "auto" and not (self.args.enable_auto_tool_choice and self.args.tool_call_parser):
            raise RequestError(
                400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
            )
        weather = next((t for t in tools if "weather" in name_of_tool(t).lower()), None)
        if isinstance(choice, dict):
            wanted = str((choice.get("function") or {}).get("name", ""))
            forced = next((t for t in tools if name_of_tool(t) == wanted), None)
            if forced is None:
                raise RequestError(400, f"tool_choice names unknown tool {wanted!r}", param="tool_choice")
            return forced
        if choice == "required":
            return weather if weather is not None and "weather" in prompt.lower() else tools[0]
        if weather is not None and "weather" in prompt.lower() and "no_tool_call" not in self.faults():
            return weather
        return None
