"""One generation (Job): its token schedule on an absolute clock, and its OpenAI wire format."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .answers import Answer
from .settings import Settings

# The stand-in's engine step during a prefill: the KV cache usage moves once per step.
PREFILL_STEP_S = 0.25


@dataclass
class Job:
    """One generation: its answer, its timing, and its OpenAI wire format."""

    chat: bool
    model: str
    answer: Answer
    prompt_tokens: int
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    produced: int = 0  # tokens yielded so far (== len(answer.pieces) once the answer is complete)
    prefilled: int = 0  # prompt tokens already in the KV cache

    def schedule(
        self,
        settings: Settings,
        stall: Callable[[], None] = lambda: None,
        cached: Callable[[int], None] = lambda tokens: None,
    ) -> Iterator[int]:
        """Yield token indexes at t_first + i / decode_rate on an absolute clock (no drift), where
        t_first = start + prompt_tokens / prefill_rate.

        The prefill runs in steps of PREFILL_STEP_S, as vLLM's chunked prefill does: each step
        puts the prompt tokens it covered into the KV cache (``cached``) and nothing else moves
        until the prompt is done. ``stall`` runs before each step and each token: the ``hang``
        fault makes it block for good, a frozen rank until it is back.
        """
        start = time.monotonic()
        first = start + self.prompt_tokens / settings.prefill_tps
        step = 1
        while start + step * PREFILL_STEP_S < first:
            self._sleep_until(start + step * PREFILL_STEP_S)
            stall()
            self._fill(min(self.prompt_tokens, int(step * PREFILL_STEP_S * settings.prefill_tps)), cached)
            step += 1
        for index in range(len(self.answer.pieces)):
            self._sleep_until(first + index / settings.decode_tps)
            stall()
            if index == 0:
                self._fill(self.prompt_tokens, cached)
            cached(1)
            self.produced = index + 1
            yield index

    @staticmethod
    def _sleep_until(when: float) -> None:
        delay = when - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _fill(self, upto: int, cached: Callable[[int], None]) -> None:
        if upto > self.prefilled:
            cached(upto - self.prefilled)
            self.prefilled = upto

    @property
    def kv_tokens(self) -> int:
        """What this job holds in the KV cache (freed when it finishes: no prefix caching)."""
        return self.prefilled + self.produced

    def envelope(
        self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None, final: bool = False
    ) -> dict[str, Any]:
        """The response object around choices: a stream chunk, or (final) a whole response."""
        prefix, obj = ("chatcmpl-", "chat.completion" if final else "chat.completion.chunk")
        if not self.chat:
            prefix, obj = ("cmpl-", "text_completion")
        body: dict[str, Any] = {
            "id": prefix + self.request_id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            body["usage"] = usage
        return body

    def chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self.envelope([choice])

    def piece_chunk(self, index: int) -> dict[str, Any]:
        piece = self.answer.pieces[index]
        finish = self.answer.finish_reason if index == len(self.answer.pieces) - 1 else None
        if not self.chat:
            choice = {
                "index": 0,
                "text": piece.text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return self.envelope([choice])
        if piece.kind == "reasoning":
            return self.chunk({"reasoning_content": piece.text}, finish)
        if piece.kind == "tool_name":
            function = {"name": piece.text, "arguments": ""}
            call = {"index": 0, "id": self.answer.tool_call_id, "type": "function", "function": function}
            return self.chunk({"tool_calls": [call]}, finish)
        if piece.kind == "tool_args":
            return self.chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece.text}}]}, finish)
        return self.chunk({"content": piece.text}, finish)

    def _joined(self, kind: str) -> str:
        return "".join(p.text for p in self.answer.pieces if p.kind == kind)

    def full_response(self, usage: dict[str, Any]) -> dict[str, Any]:
        finish = self.answer.finish_reason
        if not self.chat:
            text = self._joined("content")
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            return self.envelope([choice], usage=usage, final=True)
        tool_calls = []
        if self.answer.tool_name and any(p.kind == "tool_name" for p in self.answer.pieces):
            function = {"name": self.answer.tool_name, "arguments": self._joined("tool_args")}
            tool_calls.append({"id": self.answer.tool_call_id, "type": "function", "function": function})
        message = {
            "role": "assistant",
            "content": self._joined("content") or None,
            "reasoning_content": self._joined("reasoning") or None,
            "tool_calls": tool_calls,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        return self.envelope([choice], usage=usage, final=True)
