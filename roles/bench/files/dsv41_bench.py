#!/usr/bin/env python3
"""Benchmark an OpenAI-compatible endpoint as the reference numbers were measured.

Prefill: fresh random token ids per repetition, sent to ``/v1/completions`` with streaming;
prefill tok/s = prompt tokens / time to the first token (the connection is then closed, which
makes vLLM abort the request: nothing caps the output). Decode: prose and code prompts through
``/v1/chat/completions`` with streaming, every request to its natural end, at each concurrency;
per stream tok/s = (completion tokens - 1) / (last token - first token), aggregate = the streams'
tokens over the window from the first first-token to the last token. Medians over repetitions.

Writes ``bench.json``, ``bench.md`` (beside the reference numbers) and ``bench.png`` (the same
comparison as a chart) into ``--out-dir``. The key comes from ``--api-key-file`` or the
environment (``--api-key-env``), never from the command line. Standard library only, except the
chart (matplotlib).

    dsv41_bench.py run --base-url http://spark-1:8000/v1 --out-dir bench-results
    dsv41_bench.py wait --job <async results file> --progress-file <file> --seconds 10
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# The original's numbers on two GB10 Sparks with the reference configuration (mission.md).
REFERENCE = {
    "prefill_8k": 2050.0,
    "prefill_32k": 2061.0,
    "decode_prose_c1": 29.0,
    "decode_code_c1": 40.0,
    "decode_code_c2_aggregate": 60.0,
}
PROMPTS = {
    "prose": (
        "Write a long, vivid essay about the history of tea: where it was first grown, how it "
        "travelled along the trade routes, and how it changed the cultures that adopted it."
    ),
    "code": (
        "Write a complete Python program that implements an LRU cache with a doubly linked list "
        "and a dict, with type hints, docstrings and a set of unit tests."
    ),
}
# Token ids drawn for prefill prompts: ordinary vocabulary, clear of the special tokens at the ends.
TOKEN_ID_RANGE = (1000, 100000)


class BenchError(Exception):
    """A request the benchmark cannot use (HTTP error, broken stream)."""


@dataclass
class Timing:
    """One streamed request as the client saw it (monotonic seconds)."""

    sent: float
    first: float | None = None
    last: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None


@dataclass
class Sample:
    """One measurement of one metric."""

    metric: str
    repetition: int
    tokens_per_s: float
    detail: dict[str, Any] = field(default_factory=dict)


# --- measurement arithmetic (pure) ---------------------------------------------------------------


def prefill_rate(prompt_tokens: int, timing: Timing) -> float:
    if timing.first is None or timing.first <= timing.sent:
        raise BenchError("no first token: cannot time the prefill")
    return prompt_tokens / (timing.first - timing.sent)


def decode_rate(timing: Timing) -> float:
    timed = timing.first is not None and timing.last is not None and timing.last > timing.first
    if not timed or timing.completion_tokens < 2:
        raise BenchError(
            f"a decode needs at least 2 tokens over a positive time (got {timing.completion_tokens} tokens)"
        )
    return (timing.completion_tokens - 1) / (timing.last - timing.first)


def aggregate_rate(timings: list[Timing]) -> float:
    """Tokens the streams decoded together, over the window they decoded in."""
    first = min(t.first for t in timings if t.first is not None)
    last = max(t.last for t in timings if t.last is not None)
    if last <= first:
        raise BenchError("the concurrent streams decoded in no time")
    return sum(t.completion_tokens - 1 for t in timings) / (last - first)


def random_token_ids(rng: random.Random, count: int) -> list[int]:
    low, high = TOKEN_ID_RANGE
    return [rng.randrange(low, high) for _ in range(count)]


def label(metric: str) -> str:
    """prefill_8k -> 'prefill 8k'; decode_code_c2_aggregate -> 'decode code, 2 streams, aggregate'."""
    parts = metric.split("_")
    if parts[0] == "prefill" and len(parts) == 2:
        return f"prefill {parts[1]}"
    if parts[0] == "decode" and len(parts) in (3, 4) and parts[2].startswith("c"):
        streams = parts[2][1:]
        how = "aggregate" if len(parts) == 4 else ("per stream" if streams != "1" else "")
        return f"decode {parts[1]}, {streams} stream{'s' if streams != '1' else ''}" + (
            f", {how}" if how else ""
        )
    return metric


def size_label(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def summarise(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Median, minimum, maximum and count of each metric, in the order first measured."""
    metrics: dict[str, list[float]] = {}
    for sample in samples:
        metrics.setdefault(sample.metric, []).append(sample.tokens_per_s)
    return {
        name: {
            "median": round(statistics.median(values), 2),
            "min": round(min(values), 2),
            "max": round(max(values), 2),
            "repetitions": len(values),
        }
        for name, values in metrics.items()
    }


def markdown(summary: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Benchmark of `{meta['model']}` at `{meta['base_url']}` ({meta['date']}), medians of "
        f"{meta['repetitions']} repetitions.",
        "",
        "| tok/s | measured | reference | measured / reference |",
        "|---|---:|---:|---:|",
    ]
    for name, stats in summary.items():
        reference = REFERENCE.get(name)
        ratio = f"{stats['median'] / reference:.2f}" if reference else "-"
        shown = f"{reference:g}" if reference else "-"
        lines.append(f"| {label(name)} | {stats['median']:.1f} | {shown} | {ratio} |")
    lines += ["", "Reference: the original on two DGX Spark (GB10) nodes with the reference configuration."]
    if meta.get("label"):
        lines.append(f"Note: {meta['label']}")
    return "\n".join(lines) + "\n"


def chart(summary: dict[str, dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Measured against reference, one pair of bars per metric (prefill and decode apart)."""
    import matplotlib  # noqa: PLC0415 - only the chart needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = [
        ("Prefill", [n for n in summary if n.startswith("prefill")]),
        ("Decode", [n for n in summary if n.startswith("decode")]),
    ]
    groups = [(title, names) for title, names in groups if names]
    widths = [max(2, len(names)) for _, names in groups]
    size = (2.2 * sum(widths) + 1, 5)
    layout = {"figsize": size, "squeeze": False, "gridspec_kw": {"width_ratios": widths}}
    figure, axes = plt.subplots(1, len(groups), **layout)
    for axis, (title, names) in zip(axes[0], groups, strict=True):
        positions = range(len(names))
        measured = [summary[n]["median"] for n in names]
        reference = [REFERENCE.get(n, 0.0) for n in names]
        axis.bar([p - 0.2 for p in positions], measured, 0.4, label="measured (median)", color="#2b7bba")
        axis.bar([p + 0.2 for p in positions], reference, 0.4, label="reference (2 Sparks)", color="#bbbbbb")
        for p, value in zip(positions, measured, strict=True):
            axis.annotate(f"{value:.0f}", (p - 0.2, value), ha="center", va="bottom", fontsize=8)
        axis.set_xticks(list(positions))
        axis.set_xticklabels([label(n).replace(", ", "\n") for n in names], fontsize=8)
        axis.set_ylim(0, max(measured + reference) * 1.3)  # headroom for the legend
        axis.set_ylabel("tokens / s")
        axis.set_title(title)
        axis.legend(fontsize=8, loc="upper left")
    title = f"{meta['model']} at {meta['base_url']} ({meta['date']})"
    if meta.get("label"):
        title += f"\n{meta['label']}"
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# --- the client --------------------------------------------------------------------------------


def sse_events(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """JSON events of a server-sent event stream, up to [DONE]."""
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _chunk_has_output(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        fields = [delta.get(name) for name in ("content", "reasoning_content", "reasoning", "tool_calls")]
        if choice.get("text") or any(fields):
            return True
    return False


class Client:
    """Streams requests to one endpoint over plain HTTP(S) connections (one per request)."""

    def __init__(self, base_url: str, api_key: str, timeout: float):
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError(f"base URL must be http(s)://host[:port]/v1, got {base_url!r}")
        self.parts = parts
        self.prefix = parts.path if parts.path.endswith("/v1") else parts.path + "/v1"
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def _connection(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
        return kind(self.parts.hostname, self.parts.port, timeout=self.timeout)

    def stream(self, path: str, payload: dict[str, Any], first_token_only: bool = False) -> Timing:
        body = json.dumps({**payload, "stream": True, "stream_options": {"include_usage": True}})
        connection = self._connection()
        try:
            timing = Timing(sent=time.monotonic())
            connection.request("POST", self.prefix + path, body=body, headers=self.headers)
            response = connection.getresponse()
            if response.status != 200:
                raise BenchError(f"POST {self.prefix}{path}: HTTP {response.status} {response.read(300)!r}")
            for event in sse_events(iter(response.readline, b"")):
                now = time.monotonic()
                if _chunk_has_output(event):
                    timing.first = timing.first or now
                    timing.last = now
                    if first_token_only:
                        return timing  # closing the connection aborts the request
                for choice in event.get("choices") or []:
                    timing.finish_reason = choice.get("finish_reason") or timing.finish_reason
                usage = event.get("usage")
                if usage:
                    timing.completion_tokens = int(usage.get("completion_tokens") or 0)
                    timing.prompt_tokens = usage.get("prompt_tokens")
            return timing
        except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
            raise BenchError(f"POST {self.prefix}{path}: {exc}") from exc
        finally:
            connection.close()


# --- the runs ----------------------------------------------------------------------------------


Progress = Callable[[str], None]


def run_prefill(
    client: Client, model: str, sizes: list[int], *, repetitions: int, rng: random.Random, progress: Progress
) -> list[Sample]:
    samples = []
    for size in sizes:
        metric = f"prefill_{size_label(size)}"
        for rep in range(1, repetitions + 1):
            ids = random_token_ids(rng, size)  # fresh every time: no prefix-cache hit
            timing = client.stream("/completions", {"model": model, "prompt": ids}, first_token_only=True)
            rate = prefill_rate(size, timing)
            ttft = timing.first - timing.sent
            samples.append(Sample(metric, rep, rate, {"prompt_tokens": size, "ttft_s": round(ttft, 4)}))
            progress(f"{metric} {rep}/{repetitions}: {rate:.1f} tok/s (first token after {ttft:.2f} s)")
    return samples


def concurrent_streams(client: Client, path: str, payload: dict[str, Any], streams: int) -> list[Timing]:
    """Start ``streams`` identical requests at once; each runs to its natural end."""
    results: list[Timing | BenchError] = [BenchError("not run")] * streams
    start = threading.Barrier(streams)

    def one(index: int) -> None:
        start.wait()
        try:
            results[index] = client.stream(path, payload)
        except BenchError as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BenchError):
            raise result
    return results  # type: ignore[return-value]


def run_decode(
    client: Client,
    model: str,
    kinds: list[str],
    *,
    concurrencies: list[int],
    repetitions: int,
    progress: Progress,
) -> list[Sample]:
    samples = []
    for kind in kinds:
        payload = {"model": model, "messages": [{"role": "user", "content": PROMPTS[kind]}]}
        for conc in concurrencies:
            for rep in range(1, repetitions + 1):
                done = concurrent_streams(client, "/chat/completions", payload, conc)
                rates = [decode_rate(t) for t in done]
                detail = {
                    "completion_tokens": [t.completion_tokens for t in done],
                    "finish_reasons": [t.finish_reason for t in done],
                }
                for stream, rate in enumerate(rates, 1):
                    samples.append(Sample(f"decode_{kind}_c{conc}", rep, rate, {**detail, "stream": stream}))
                line = f"decode {kind} x{conc} {rep}/{repetitions}: per stream "
                line += ", ".join(f"{r:.1f}" for r in rates)
                if conc > 1:
                    aggregate = aggregate_rate(done)
                    samples.append(Sample(f"decode_{kind}_c{conc}_aggregate", rep, aggregate, detail))
                    line += f", aggregate {aggregate:.1f}"
                progress(line + f" tok/s ({sum(t.completion_tokens for t in done)} tokens)")
    return samples


def run(args: argparse.Namespace) -> dict[str, Any]:
    key = read_key(args)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress_file = Path(args.progress_file) if args.progress_file else None

    def progress(line: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} {line}"
        print(stamped, file=sys.stderr, flush=True)
        if progress_file:
            with progress_file.open("a", encoding="utf-8") as handle:
                handle.write(stamped + "\n")

    client = Client(args.base_url, key, args.timeout)
    rng = random.Random(args.seed)  # noqa: S311 - random prompts, not secrets
    sizes = [*args.prefill_tokens, *args.long_context_tokens]
    progress(f"{args.model} at {args.base_url}: prefill {sizes}, decode {args.kinds} x {args.concurrency}")
    samples = run_prefill(client, args.model, sizes, repetitions=args.repetitions, rng=rng, progress=progress)
    decode = {"concurrencies": args.concurrency, "repetitions": args.repetitions, "progress": progress}
    samples += run_decode(client, args.model, args.kinds, **decode)
    meta = {
        "model": args.model,
        "base_url": args.base_url,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "repetitions": args.repetitions,
        "label": args.label,
    }
    summary = summarise(samples)
    samples_out = [asdict(s) for s in samples]
    result = {"meta": meta, "summary": summary, "reference": REFERENCE, "samples": samples_out}
    (out_dir / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "bench.md").write_text(markdown(summary, meta))
    chart(summary, meta, out_dir / "bench.png")
    progress(f"done: {out_dir / 'bench.json'}, bench.md, bench.png")
    return result


def read_key(args: argparse.Namespace) -> str:
    if args.api_key_file:
        try:
            return Path(args.api_key_file).expanduser().read_text().strip()
        except OSError as exc:
            raise BenchError(f"cannot read the key file {args.api_key_file}: {exc}") from exc
    return os.environ.get(args.api_key_env, "")


# --- waiting on a background run (Ansible async), with progress -----------------------------------


def wait(job: Path, progress_file: Path, seconds: float) -> dict[str, Any]:
    """Wait up to ``seconds`` for the async job to finish; report its last progress line."""
    deadline = time.monotonic() + seconds
    while True:
        finished = _job_finished(job)
        if finished or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    lines = progress_file.read_text(errors="replace").splitlines() if progress_file.exists() else []
    return {"finished": finished, "line": lines[-1] if lines else "starting", "lines": len(lines)}


def _job_finished(job: Path) -> bool:
    try:
        return bool(json.loads(job.read_text()).get("finished")) or "rc" in json.loads(job.read_text())
    except (OSError, ValueError):
        return False


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="run the benchmark")
    go.add_argument("--base-url", required=True, help="http(s)://host:port/v1")
    go.add_argument("--model", default="deepseek-v4.1-flash")
    go.add_argument("--api-key-file", help="file holding the bearer key")
    go.add_argument("--api-key-env", default="DSV41_API_KEY", help="else: the variable holding it")
    go.add_argument("--out-dir", default="bench-results")
    go.add_argument("--prefill-tokens", type=int, nargs="*", default=[8192, 32768])
    go.add_argument("--long-context-tokens", type=int, nargs="*", default=[], help="optional longer prefills")
    go.add_argument("--kinds", nargs="*", choices=sorted(PROMPTS), default=["prose", "code"])
    go.add_argument("--concurrency", type=int, nargs="*", default=[1, 2])
    go.add_argument("--repetitions", type=int, default=3)
    go.add_argument("--timeout", type=float, default=1800, help="seconds one request may take")
    go.add_argument("--seed", type=int, default=None, help="seed of the random prompts (default: fresh)")
    go.add_argument("--label", default="", help="a note stored with the results")
    go.add_argument("--progress-file", help="also append progress lines here")
    poll = commands.add_parser("wait", help="wait for a background run, printing its progress as JSON")
    poll.add_argument("--job", required=True, type=Path)
    poll.add_argument("--progress-file", required=True, type=Path)
    poll.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args(argv)
    counts = [args.repetitions, *args.concurrency, *args.prefill_tokens] if args.command == "run" else []
    if any(count < 1 for count in counts):
        parser.error("--repetitions, --concurrency and --prefill-tokens must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command == "wait":
        print(json.dumps(wait(args.job, args.progress_file, args.seconds)))
        return 0
    try:
        result = run(args)
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"summary": result["summary"], "out_dir": str(Path(args.out_dir).resolve())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
