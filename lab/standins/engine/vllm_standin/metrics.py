"""vLLM's Prometheus metrics that operations watch (``GET /metrics``, text format 0.0.4).

The honest health signal of a vLLM head is progress: ``vllm:num_requests_running`` > 0 while
``vllm:generation_tokens_total`` does not grow means the engine is stuck, even though ``/health``
still answers 200. Names, types, HELP texts and labels follow vLLM V1.
"""

from __future__ import annotations

import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM V1's FinishReason values; a tool call finishes with "stop" in the engine.
FINISH_REASONS = ("stop", "length", "abort")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Counters and gauges of one head, updated by the request handlers."""

    def __init__(self, model_name: str):
        self.labels = f'model_name="{_label(model_name)}",engine="0"'  # vLLM V1's label order
        self._lock = threading.Lock()
        self.running = 0  # requests holding a --max-num-seqs slot
        self.waiting = 0  # requests queued for a slot
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)

    def queued(self) -> None:
        with self._lock:
            self.waiting += 1

    def admitted(self) -> None:
        with self._lock:
            self.waiting -= 1
            self.running += 1

    def prefilled(self, prompt_tokens: int) -> None:
        """The prefill is done (the first token is out), as vLLM counts prompt tokens."""
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def token(self) -> None:
        with self._lock:
            self.generation_tokens += 1

    def finished(self, reason: str) -> None:
        with self._lock:
            self.running -= 1
            key = reason if reason in self.success else "stop"
            self.success[key] += 1

    def exposition(self) -> str:
        with self._lock:
            families = [
                (
                    "vllm:num_requests_running",
                    "gauge",
                    "Number of requests in model execution batches.",
                    [("", self.running)],
                ),
                (
                    "vllm:num_requests_waiting",
                    "gauge",
                    "Number of requests waiting to be processed.",
                    [("", self.waiting)],
                ),
                (
                    "vllm:prompt_tokens_total",
                    "counter",
                    "Number of prefill tokens processed.",
                    [("", self.prompt_tokens)],
                ),
                (
                    "vllm:generation_tokens_total",
                    "counter",
                    "Number of generation tokens processed.",
                    [("", self.generation_tokens)],
                ),
                (
                    "vllm:request_success_total",
                    "counter",
                    "Count of successfully processed requests.",
                    [(f',finished_reason="{reason}"', count) for reason, count in self.success.items()],
                ),
            ]
        lines = []
        for name, kind, help_text, samples in families:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{{{self.labels}{extra}}} {float(value)!r}" for extra, value in samples]
        return "\n".join(lines) + "\n"
