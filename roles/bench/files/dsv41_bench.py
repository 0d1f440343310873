"""Benchmark an OpenAI-compatible endpoint as the reference numbers were measured.

Prefill: fresh random token ids per repetition, sent to ``/v1/completions`` with streaming;
prefill tok/s = prompt tokens / time to the first token (the connection is then closed, which
makes vLLM abort the request: nothing caps the output). Decode: prose and code prompts through
``/v1/chat/completions`` with streaming, every request to its natural end, at each concurrency;
per stream tok/s = (completion tokens - 1) / (last token - first token), aggregate = the streams'
tokens over the window from the first first-token to the last token. ``--decode-context`` also
measures decode after a long prompt (decode speed at depth). Medians over repetitions.

Every request has a prompt of its own (it opens with a tag unique to the run and the request;
long contexts are random words, prefill prompts random token ids), so nothing is served from the
prefix cache. One warm-up request runs first and is not counted (``--no-warmup`` skips it);
``--greedy`` sends ``temperature: 0``. No request ever carries an output cap.

Writes ``bench.json`` and ``bench.md`` (beside the reference numbers) into ``--out-dir`` after
every measurement, atomically, so a run that fails or is stopped keeps what it measured
(``meta.status`` says how it ended); ``bench.png`` (the same comparison as a chart) when it ends.
The key comes from ``--api-key-file`` or the environment (``--api-key-env``), never from the
command line. Standard library only, except the chart (matplotlib).

Progress lines go to stderr; ``--progress-file`` also keeps the collection's progress document
there (measurements done of those planned, the last line as its detail), written by the
collection's own writer (``plugins/module_utils/_progress.py``, found beside this program), so
that the ``job_wait`` module shows the bench's progress as it shows the checkpoint jobs'.

    dsv41_bench.py run --base-url http://spark-1:8000/v1 --out-dir bench-results
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib
import io
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
WARMUP_PROMPT = "Say hello and introduce yourself in two sentences."
# The warm-up reads this many output chunks, then closes the connection (vLLM aborts the request).
WARMUP_CHUNKS = 16
# Long contexts are random common words: one token each in the usual vocabularies, so a context of
# N words is about N tokens (the tokens the server counted are recorded with each sample).
CONTEXT_INTRO = "Background notes follow; they are not needed for the task at the end."
_CONTEXT_VOCABULARY = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city name team minute idea kid body information back parent face others "
    "level office door health person art war history party result change morning reason research "
    "girl guy moment air teacher force education river garden window table paper music market"
)
CONTEXT_WORDS = _CONTEXT_VOCABULARY.split()
# Token ids drawn for prefill prompts: ordinary vocabulary, clear of the special tokens at the ends.
TOKEN_ID_RANGE = (1000, 100000)
_DECODE_METRIC = re.compile(r"decode_([a-z]+)_(?:(\d+k?)_)?c(\d+)(_aggregate)?")


class BenchError(Exception):
    """A request the benchmark cannot use (HTTP error, broken stream)."""


class Interrupted(Exception):
    """The run was stopped by a signal (SIGTERM, or SIGINT as KeyboardInterrupt)."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


@dataclass
class Timing:
    """One streamed request as the client saw it (monotonic seconds)."""

    sent: float
    first: float | None = None
    last: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    chunks: int = 0  # chunks that carried output


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


def random_token_ids(rng: random.Random, count: int, id_range: tuple[int, int] = TOKEN_ID_RANGE) -> list[int]:
    low, high = id_range
    return [rng.randrange(low, high) for _token in range(count)]


def size_label(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def decode_metric(kind: str, streams: int, context_tokens: int = 0) -> str:
    """decode_code_c2; after a long prompt: decode_code_32k_c2."""
    depth = f"{size_label(context_tokens)}_" if context_tokens else ""
    return f"decode_{kind}_{depth}c{streams}"


def at_depth(metric: str) -> bool:
    """Whether a metric is a decode after a long prompt."""
    match = _DECODE_METRIC.fullmatch(metric)
    return bool(match and match.group(2))


def label(metric: str) -> str:
    """prefill_8k -> 'prefill 8k'; decode_code_32k_c2_aggregate -> 'decode code at 32k, 2 streams,
    aggregate'."""
    parts = metric.split("_")
    if parts[0] == "prefill" and len(parts) == 2:
        return f"prefill {parts[1]}"
    match = _DECODE_METRIC.fullmatch(metric)
    if not match:
        return metric
    kind, depth, streams, aggregate = match.groups()
    how = "aggregate" if aggregate else ("per stream" if streams != "1" else "")
    text = f"decode {kind}" + (f" at {depth}" if depth else "")
    text += f", {streams} stream{'s' if streams != '1' else ''}"
    return text + (f", {how}" if how else "")


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


def _how_measured(meta: dict[str, Any]) -> str:
    sampling = "greedy sampling (temperature 0)" if meta.get("greedy") else "the server's default sampling"
    warmup = meta.get("warmup") or {}
    return f"{sampling}, {'after one warm-up request' if warmup.get('ran') else 'no warm-up request'}"


def markdown(summary: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Benchmark of `{meta['model']}` at `{meta['base_url']}` ({meta['date']}), medians of "
        f"{meta['repetitions']} repetitions; {_how_measured(meta)}.",
        "",
    ]
    status = meta.get("status", "complete")
    if status != "complete":
        why = f": {meta['error']}" if meta.get("error") else ""
        lines += [f"**Incomplete ({status}{why})**: the measurements done so far.", ""]
    lines += ["| tok/s | measured | reference | measured / reference |", "|---|---:|---:|---:|"]
    for name, stats in summary.items():
        reference = meta.get("reference", {}).get(name)
        ratio = f"{stats['median'] / reference:.2f}" if reference else "-"
        shown = f"{reference:g}" if reference else "-"
        lines.append(f"| {label(name)} | {stats['median']:.1f} | {shown} | {ratio} |")
    if meta.get("reference"):
        lines += [
            "",
            "Reference: the recipe's figures (the model on two DGX Spark nodes, as its recipe reports).",
        ]
    if meta.get("label"):
        lines.append(f"Note: {meta['label']}")
    return "\n".join(lines) + "\n"


def chart(summary: dict[str, dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Measured against reference, one pair of bars per metric (prefill, decode, decode at depth)."""
    import matplotlib  # noqa: PLC0415 - only the chart needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = [
        ("Prefill", [n for n in summary if n.startswith("prefill")]),
        ("Decode", [n for n in summary if n.startswith("decode") and not at_depth(n)]),
        ("Decode after a long prompt", [n for n in summary if at_depth(n)]),
    ]
    groups = [(title, names) for title, names in groups if names]
    widths = [max(2, len(names)) for _title, names in groups]
    size = (1.6 * sum(widths) + 1.5 * len(groups), 5)
    layout = {"figsize": size, "squeeze": False, "gridspec_kw": {"width_ratios": widths}}
    figure, axes = plt.subplots(1, len(groups), **layout)
    for axis, (title, names) in zip(axes[0], groups, strict=True):
        positions = range(len(names))
        measured = [summary[n]["median"] for n in names]
        reference = [meta.get("reference", {}).get(n, 0.0) for n in names]
        axis.bar([p - 0.2 for p in positions], measured, 0.4, label="measured (median)", color="#2b7bba")
        axis.bar([p + 0.2 for p in positions], reference, 0.4, label="reference (2 Sparks)", color="#bbbbbb")
        for p, value in zip(positions, measured, strict=True):
            axis.annotate(f"{value:.0f}", (p - 0.2, value), ha="center", va="bottom", fontsize=8)
        axis.set_xticks(list(positions))
        axis.set_xticklabels([label(n).replace(", ", "\n") for n in names], fontsize=8)
        axis.set_ylim(0, max(measured + reference) * 1.3 or 1)  # headroom for the legend
        axis.set_ylabel("tokens / s")
        axis.set_title(title)
        axis.legend(fontsize=8, loc="upper left")
    title = f"{meta['model']} at {meta['base_url']} ({meta['date']})"
    if meta.get("label"):
        title += f"\n{meta['label']}"
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=110)
    plt.close(figure)
    write_atomically(path, image.getvalue())


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` in one step (a temporary file beside it, then ``os.replace``): a reader, or
    a run killed meanwhile, sees the old content or the new, never half of it."""
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


# --- prompts -------------------------------------------------------------------------------------


class Prompts:
    """A prompt of its own for every request: a prefix-cache hit would inflate the numbers.

    Chat prompts open with ``Request <run>.<n>.``, the run tag drawn once and ``n`` counting the
    requests, so no two share even their first block; prefill prompts are fresh random token ids.
    """

    def __init__(self, rng: random.Random, id_range: tuple[int, int] = TOKEN_ID_RANGE):
        self.rng = rng
        self.id_range = id_range
        self.run_tag = f"{rng.getrandbits(32):08x}"
        self.count = 0

    def _tag(self) -> str:
        self.count += 1
        return f"Request {self.run_tag}.{self.count}."

    def warmup(self) -> str:
        return f"{self._tag()} {WARMUP_PROMPT}"

    def chat(self, kind: str, context_tokens: int = 0) -> str:
        """The decode prompt of ``kind``; after about ``context_tokens`` tokens of context when set."""
        tag, task = self._tag(), PROMPTS[kind]
        if not context_tokens:
            return f"{tag} {task}"
        fixed = f"{tag} {CONTEXT_INTRO} Task: {task}"
        count = max(0, context_tokens - len(fixed.split()))
        context = " ".join(self.rng.choice(CONTEXT_WORDS) for _word in range(count))
        return f"{tag} {CONTEXT_INTRO}\n\n{context}\n\nTask: {task}"

    def token_ids(self, count: int) -> list[int]:
        return random_token_ids(self.rng, count, self.id_range)


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

    def stream(self, path: str, payload: dict[str, Any], stop_after: int | None = None) -> Timing:
        """Stream one request to its end, or close it after ``stop_after`` output chunks (closing
        the connection aborts the request)."""
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
                    timing.chunks += 1
                    if stop_after is not None and timing.chunks >= stop_after:
                        return timing
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


# --- the runs: each yields one measurement (a list of samples) at a time --------------------------


Progress = Callable[[str], None]


@dataclass
class Plan:
    """What every request shares: the model, the prompts, the sampling, where progress goes."""

    client: Client
    model: str
    prompts: Prompts
    progress: Progress
    repetitions: int = 3
    sampling: dict[str, Any] = field(default_factory=dict)  # {"temperature": 0} with --greedy

    def chat_payload(self, content: str) -> dict[str, Any]:
        return {"model": self.model, "messages": [{"role": "user", "content": content}], **self.sampling}


def warm_up(plan: Plan) -> dict[str, Any]:
    """One short chat request before measuring (kernels, caches, connections), never counted."""
    payload = plan.chat_payload(plan.prompts.warmup())
    timing = plan.client.stream("/chat/completions", payload, stop_after=WARMUP_CHUNKS)
    seconds = round((timing.last or time.monotonic()) - timing.sent, 3)
    plan.progress(f"warm-up: {timing.chunks} output chunks in {seconds:.2f} s (not counted)")
    return {"ran": True, "output_chunks": timing.chunks, "seconds": seconds}


def run_prefill(plan: Plan, sizes: list[int]) -> Iterator[list[Sample]]:
    for size in sizes:
        metric = f"prefill_{size_label(size)}"
        for rep in range(1, plan.repetitions + 1):
            payload = {"model": plan.model, "prompt": plan.prompts.token_ids(size), **plan.sampling}
            timing = plan.client.stream("/completions", payload, stop_after=1)
            rate = prefill_rate(size, timing)
            ttft = timing.first - timing.sent
            plan.progress(
                f"{metric} {rep}/{plan.repetitions}: {rate:.1f} tok/s (first token after {ttft:.2f} s)"
            )
            yield [Sample(metric, rep, rate, {"prompt_tokens": size, "ttft_s": round(ttft, 4)})]


def concurrent_streams(client: Client, path: str, payloads: list[dict[str, Any]]) -> list[Timing]:
    """Start one request per payload at once; each runs to its natural end."""
    streams = len(payloads)
    results: list[Timing | BenchError] = [BenchError("not run")] * streams
    start = threading.Barrier(streams)

    def one(index: int) -> None:
        start.wait()
        try:
            results[index] = client.stream(path, payloads[index])
        except BenchError as exc:
            results[index] = exc

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BenchError):
            raise result
    return results  # type: ignore[return-value]


def run_decode(
    plan: Plan, kinds: list[str], concurrencies: list[int], context_tokens: int = 0
) -> Iterator[list[Sample]]:
    """Decode ``kinds`` at each concurrency; after about ``context_tokens`` tokens when set."""
    where = f" at {size_label(context_tokens)}" if context_tokens else ""
    for kind in kinds:
        for conc in concurrencies:
            metric = decode_metric(kind, conc, context_tokens)
            for rep in range(1, plan.repetitions + 1):
                payloads = [
                    plan.chat_payload(plan.prompts.chat(kind, context_tokens)) for _stream in range(conc)
                ]
                done = concurrent_streams(plan.client, "/chat/completions", payloads)
                rates = [decode_rate(t) for t in done]
                detail: dict[str, Any] = {
                    "completion_tokens": [t.completion_tokens for t in done],
                    "finish_reasons": [t.finish_reason for t in done],
                    "prompt_tokens": [t.prompt_tokens for t in done],
                }
                if context_tokens:
                    detail["context_tokens"] = context_tokens
                samples = [Sample(metric, rep, r, {**detail, "stream": s}) for s, r in enumerate(rates, 1)]
                line = f"decode {kind} x{conc}{where} {rep}/{plan.repetitions}: per stream "
                line += ", ".join(f"{r:.1f}" for r in rates)
                if conc > 1:
                    aggregate = aggregate_rate(done)
                    samples.append(Sample(f"{metric}_aggregate", rep, aggregate, detail))
                    line += f", aggregate {aggregate:.1f}"
                plan.progress(line + f" tok/s ({sum(t.completion_tokens for t in done)} tokens)")
                yield samples


# --- results, on disk after every measurement ------------------------------------------------------


class Results:
    """bench.json and bench.md, rewritten atomically after every measurement; bench.png at the end."""

    def __init__(self, out_dir: Path, meta: dict[str, Any], progress: Any = None):
        self.out_dir = out_dir
        self.meta = meta
        self.progress = progress or NoProgress()  # the progress document, counting the measurements
        self.samples: list[Sample] = []
        self.measurements = 0

    @property
    def path(self) -> Path:
        return self.out_dir / "bench.json"

    def document(self) -> dict[str, Any]:
        samples = [asdict(s) for s in self.samples]
        return {
            "meta": self.meta,
            "summary": summarise(self.samples),
            "reference": self.meta.get("reference", {}),
            "samples": samples,
        }

    def save(self) -> dict[str, Any]:
        document = self.document()
        write_atomically(self.path, (json.dumps(document, indent=2) + "\n").encode())
        write_atomically(self.out_dir / "bench.md", markdown(document["summary"], self.meta).encode())
        return document

    def add(self, samples: list[Sample]) -> None:
        self.samples += samples
        self.measurements += 1
        self.meta["measurements"] = self.measurements
        self.save()
        self.progress.update(force=True, done=self.measurements)

    def finish(self, status: str, error: str | None = None) -> dict[str, Any]:
        self.meta["status"] = status
        if error:
            self.meta["error"] = error
        document = self.save()
        if self.samples:
            chart(document["summary"], self.meta, self.out_dir / "bench.png")
        return document

    def kept(self) -> str:
        return f"the {self.measurements} measurement(s) done before are in {self.path}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    key = read_key(args)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = [*args.prefill_tokens, *args.long_context_tokens]
    document = progress_writer(args.progress_file, planned_measurements(args))

    def progress(line: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} {line}"
        print(stamped, file=sys.stderr, flush=True)
        document.update(force=True, detail=stamped)

    client = Client(args.base_url, key, args.timeout)
    rng = random.Random(args.seed)  # noqa: S311 - random prompts, not secrets
    sampling = {"temperature": 0} if args.greedy else {}
    plan = Plan(client, args.model, Prompts(rng, tuple(args.token_ids)), progress, args.repetitions, sampling)
    meta = {
        "model": args.model,
        "base_url": args.base_url,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "repetitions": args.repetitions,
        "label": args.label,
        "reference": args.reference,
        "status": "running",
        "measurements": 0,
        "greedy": args.greedy,
        "sampling": sampling,
        "warmup": {"ran": False},
        "prefill_tokens": sizes,
        "decode_kinds": args.kinds,
        "decode_concurrency": args.concurrency,
        "decode_context_tokens": args.decode_context,
    }
    results = Results(out_dir, meta, document)
    results.save()
    (out_dir / "bench.png").unlink(missing_ok=True)  # a chart of an earlier run would mislead
    depths = f", decode after {args.decode_context} tokens" if args.decode_context else ""
    progress(
        f"{args.model} at {args.base_url}: prefill {sizes}, decode {args.kinds} x {args.concurrency}{depths}"
    )
    try:
        if args.warmup:
            document.update(force=True, phase="warming up")
            meta["warmup"] = warm_up(plan)
        document.update(force=True, phase="measuring")
        for measurement in run_prefill(plan, sizes):
            results.add(measurement)
        for depth in [0, *args.decode_context]:
            for measurement in run_decode(plan, args.kinds, args.concurrency, depth):
                results.add(measurement)
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        results.finish("interrupted", f"stopped by {signal.Signals(signum).name}")
        progress(f"interrupted: {results.kept()}")
        document.finish(failed=True)
        raise Interrupted(f"stopped by {signal.Signals(signum).name}; {results.kept()}", signum) from exc
    except BenchError as exc:
        results.finish("failed", str(exc))
        progress(f"failed: {exc}")
        document.finish(failed=True)
        raise BenchError(f"{exc}; {results.kept()}") from exc
    except Exception as exc:
        results.finish("failed", repr(exc))
        document.finish(failed=True, detail=f"failed: {exc!r}")
        raise
    result = results.finish("complete")
    progress(f"done: {results.path}, bench.md, bench.png")
    document.finish()
    return result


def read_key(args: argparse.Namespace) -> str:
    """The key, checked before it goes into a header: http.client rejects any other with the header's
    text in its message, which the failure would write into bench.json."""
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).expanduser().read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise BenchError(f"cannot read the key file {args.api_key_file}: {exc}") from exc
        where = f"the key file {args.api_key_file}"
    else:
        key, where = os.environ.get(args.api_key_env, "").strip(), f"${args.api_key_env}"
    if key and not re.fullmatch(r"[A-Za-z0-9_-]+", key):
        raise BenchError(f"{where} holds no key of A-Z a-z 0-9 - _ alone")
    return key


# --- progress, in the collection's progress document ----------------------------------------------

PROGRESS_MODULE = "ansible_collections.sparkserve.dsv41.plugins.module_utils._progress"


def planned_measurements(args: argparse.Namespace) -> int:
    """How many measurements the run makes (each prefill or decode repetition is one)."""
    prefills = len(args.prefill_tokens) + len(args.long_context_tokens)
    decodes = (1 + len(args.decode_context)) * len(args.kinds) * len(args.concurrency)
    return (prefills + decodes) * args.repetitions


def collection_progress() -> Any:
    """The collection's progress module, imported as Ansible imports it.

    This program lives in ``<collection>/roles/bench/files/``: in an installed collection
    ``<collection>`` is ``.../ansible_collections/sparkserve/dsv41``, in a checkout the repository,
    whose ``collections/`` holds a link of that shape.
    """
    with contextlib.suppress(ImportError):
        return importlib.import_module(PROGRESS_MODULE)
    root = Path(__file__).resolve().parents[3]
    bases = [root / "collections"]
    if root.parent.parent.name == "ansible_collections":
        bases.insert(0, root.parents[2])
    for base in bases:
        if (
            base
            / "ansible_collections"
            / "sparkserve"
            / "dsv41"
            / "plugins"
            / "module_utils"
            / "_progress.py"
        ).is_file():
            sys.path.insert(0, str(base))
            importlib.invalidate_caches()
            return importlib.import_module(PROGRESS_MODULE)
    raise BenchError(
        f"--progress-file needs the sparkserve.dsv41 collection around this program ({root} holds no "
        "plugins/module_utils/_progress.py); run it from the collection or without --progress-file"
    )


class NoProgress:
    """The progress document's stand-in without ``--progress-file``: keeps nothing."""

    def update(self, **_fields: Any) -> bool:
        return False

    def finish(self, **_fields: Any) -> bool:
        return False


def progress_writer(path: str | None, total: int) -> Any:
    """The progress document at ``path``, measurements done of ``total`` (:class:`NoProgress`
    without a path: the collection's module is then not needed)."""
    if not path:
        return NoProgress()
    writer = collection_progress().ProgressWriter(path, "benchmark", unit="measurements", total=total)
    writer.update(force=True)
    return writer


def reference_figures(text: str) -> dict[str, float]:
    """``--reference``: a JSON object of tok/s figures by metric name."""
    try:
        figures = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from error
    if not isinstance(figures, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in figures.values()
    ):
        raise argparse.ArgumentTypeError(f"must be a JSON object of numbers, got {text!r}")
    return {str(name): float(value) for name, value in figures.items()}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
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
    go.add_argument(
        "--decode-context",
        type=int,
        nargs="*",
        default=[],
        metavar="TOKENS",
        help="also decode after a prompt of about this many tokens (decode speed at depth)",
    )
    go.add_argument("--repetitions", type=int, default=3)
    go.add_argument(
        "--warmup", action=argparse.BooleanOptionalAction, default=True, help="one uncounted request first"
    )
    go.add_argument(
        "--greedy", action=argparse.BooleanOptionalAction, default=False, help="send temperature 0"
    )
    go.add_argument("--timeout", type=float, default=1800, help="seconds one request may take")
    go.add_argument("--seed", type=int, default=None, help="seed of the random prompts (default: fresh)")
    go.add_argument("--label", default="", help="a note stored with the results")
    go.add_argument(
        "--token-ids",
        type=int,
        nargs=2,
        default=list(TOKEN_ID_RANGE),
        metavar=("LOW", "HIGH"),
        help="draw the prefill prompts' random token ids from [LOW, HIGH), within the model's vocabulary",
    )
    go.add_argument(
        "--reference",
        type=reference_figures,
        default={},
        help='figures to compare with, JSON {"prefill_8k": 2050, ...} (the recipe\'s bench.reference)',
    )
    go.add_argument("--progress-file", help="also keep the progress document (JSON) here")
    args = parser.parse_args(argv)
    if args.command == "run":
        sizes = [*args.prefill_tokens, *args.long_context_tokens, *args.decode_context]
        if any(count < 1 for count in [args.repetitions, *args.concurrency, *sizes]):
            parser.error(
                "--repetitions, --concurrency, --prefill-tokens, --long-context-tokens and "
                "--decode-context must be positive"
            )
    return args


def _stop(signum: int, _frame: object) -> None:
    raise Interrupted(f"stopped by {signal.Signals(signum).name}", signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if in_main_thread else None
    try:
        result = run(args)
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        print(f"benchmark interrupted: {exc}", file=sys.stderr)
        return 128 + exc.signum
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    print(json.dumps({"summary": result["summary"], "out_dir": str(Path(args.out_dir).resolve())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
