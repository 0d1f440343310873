"""One generation (Job): its token schedule on an absolute clock, and its OpenAI wire format."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .answers import Answer
from .settings import Settings


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

    def schedule(self, settings: Settings, stall: Callable[[], None] = lambda: None) -> Iterator[int]:
        """Yield token indexes at t_first + i / decode_rate on an absolute clock (no drift).

        ``stall`` runs before each token; the ``hang`` fault makes it block for good.
        """
        start = time.monotonic()
        first = start + self.prompt_tokens / settings.prefill_tps
        for index in range(len(self.answer.pieces)):
            delay = first + index / settings.decode_tps - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            stall()
            self.produced = index + 1
            yield index

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
