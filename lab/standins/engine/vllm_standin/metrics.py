"""vLLM's Prometheus metrics that operations watch (``GET /metrics``, text format 0.0.4).

The honest health signal of a vLLM head is progress: the token counters, the iteration histogram
and the KV cache usage. Like vLLM 0.32 (measured on its CPU build):

- the engine publishes its metrics after a step; when a rank freezes, nothing is published any
  more and ``/metrics`` keeps its last values (``freeze``), so a request that arrives after the
  freeze is neither running nor waiting there;
- during a (chunked) prefill the prompt and generation counters and the iteration histogram stay
  flat until the prompt is done; only ``vllm:kv_cache_usage_perc`` moves, rising step by step.

Names, types, HELP texts and labels follow vLLM V1.
"""

from __future__ import annotations

import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM V1's FinishReason values; a tool call finishes with "stop" in the engine.
FINISH_REASONS = ("stop", "length", "abort")
# vllm:iteration_tokens_total's buckets (tokens scheduled in one engine step).
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Counters and gauges of one head, updated by the request handlers."""

    def __init__(self, model_name: str, kv_capacity_tokens: int = 1):
        self.labels = f'model_name="{_label(model_name)}",engine="0"'  # vLLM V1's label order
        self._lock = threading.Lock()
        self.running = 0  # requests holding a --max-num-seqs slot
        self.waiting = 0  # requests queued for a slot
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.kv_capacity = max(1, kv_capacity_tokens)
        self.kv_tokens = 0  # tokens the running requests hold in the KV cache
        self.iteration_counts = [0] * (len(ITERATION_BUCKETS) + 1)  # the last one is +Inf
        self.iteration_sum = 0
        self._frozen: str | None = None  # what /metrics keeps answering while the engine is frozen

    def queued(self) -> None:
        with self._lock:
            self.waiting += 1

    def admitted(self) -> None:
        with self._lock:
            self.waiting -= 1
            self.running += 1

    def kv(self, tokens: int) -> None:
        """Tokens entering (prefill steps, new tokens) or leaving (a finished request) the KV cache."""
        with self._lock:
            self.kv_tokens += tokens

    def _step(self, tokens: int) -> None:
        """One engine step that scheduled ``tokens`` (the iteration histogram); under the lock."""
        index = next((i for i, le in enumerate(ITERATION_BUCKETS) if tokens <= le), len(ITERATION_BUCKETS))
        self.iteration_counts[index] += 1
        self.iteration_sum += tokens

    def prefilled(self, prompt_tokens: int) -> None:
        """The prefill is done (the first token is out), as vLLM counts prompt tokens."""
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self._step(prompt_tokens)

    def token(self) -> None:
        with self._lock:
            self.generation_tokens += 1
            self._step(1)

    def finished(self, reason: str) -> None:
        with self._lock:
            self.running -= 1
            key = reason if reason in self.success else "stop"
            self.success[key] += 1

    def freeze(self, frozen: bool) -> None:
        """A rank froze (keep answering what was published last) or is back (live values again)."""
        with self._lock:
            if not frozen:
                self._frozen = None
            elif self._frozen is None:
                self._frozen = self._render()

    def exposition(self) -> str:
        with self._lock:
            return self._frozen if self._frozen is not None else self._render()

    def _render(self) -> str:
        """The exposition of the current values; under the lock."""
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
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                [("", min(1.0, self.kv_tokens / self.kv_capacity))],
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
        name = "vllm:iteration_tokens_total"
        lines += [f"# HELP {name} Histogram of number of tokens per engine_step.", f"# TYPE {name} histogram"]
        cumulative = 0
        for le, count in zip((*ITERATION_BUCKETS, "+Inf"), self.iteration_counts, strict=True):
            cumulative += count
            bound = le if isinstance(le, str) else float(le)
            lines.append(f'{name}_bucket{{{self.labels},le="{bound}"}} {float(cumulative)!r}')
        lines.append(f"{name}_count{{{self.labels}}} {float(cumulative)!r}")
        lines.append(f"{name}_sum{{{self.labels}}} {float(self.iteration_sum)!r}")
        return "\n".join(lines) + "\n"
