"""The ``vllm`` command line: the reference flags (argparse), the cross-flag rules, and
``main``, which runs the start-up: checks, settings, then rendezvous and serving.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

from . import STANDIN_VERSION
from .api import Engine, StandinHTTPServer
from .checks import check_environment
from .errors import StartupError
from .faults import Faults, refuse_start_if_asked
from .log import Log, RequestLog
from .rendezvous import HeadRendezvous, join_head, keep_alive, shared_args
from .settings import Settings


def json_object(text: str) -> dict[str, Any]:
    """argparse type for vLLM's JSON-valued options; invalid JSON is a usage error (exit 2)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _add_bool(group: argparse._ArgumentGroup, flag: str, help_text: str) -> None:
    """vLLM's boolean engine flags: ``--flag`` and ``--no-flag``, default off."""
    group.add_argument(flag, action=argparse.BooleanOptionalAction, default=False, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    """The ``vllm`` CLI, restricted to the flags of the reference deployment (unknown = exit 2)."""
    parser = argparse.ArgumentParser(
        prog="vllm",
        allow_abbrev=False,
        description="STAND-IN for vLLM (sparkserve lab): accepts the reference command line.",
    )
    parser.add_argument("--version", action="version", version=STANDIN_VERSION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve}")
    serve = commands.add_parser(
        "serve",
        allow_abbrev=False,
        help="start the OpenAI-compatible server (stand-in)",
        description="Start the stand-in OpenAI-compatible server with the vLLM reference flags.",
    )
    serve.add_argument("model_path", help="model directory (config.json, safetensors index, shards)")

    model = serve.add_argument_group("model")
    model.add_argument("--served-model-name", nargs="+", default=None, help="name(s) the API answers to")
    model.add_argument("--dtype", default="auto")
    model.add_argument("--generation-config", default="auto")
    model.add_argument("--tokenizer-mode", default="auto")
    model.add_argument("--safetensors-load-strategy", default=None)
    model.add_argument("--engram-config", type=json_object, default=None, metavar="JSON")
    model.add_argument("--limit-mm-per-prompt", type=json_object, default=None, metavar="JSON")

    parallel = serve.add_argument_group("parallelism and rendezvous")
    parallel.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parallel.add_argument("--nnodes", type=int, default=1)
    parallel.add_argument("--node-rank", type=int, default=0)
    parallel.add_argument("--master-addr", default="127.0.0.1")
    parallel.add_argument("--master-port", type=int, default=29501)
    parallel.add_argument("--headless", action="store_true", help="worker rank: no API server")

    engine = serve.add_argument_group("engine")
    engine.add_argument("--kv-cache-dtype", default="auto")
    engine.add_argument("--block-size", type=int, default=None)
    engine.add_argument("--swa-block-size", type=int, default=None)
    engine.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    engine.add_argument("--max-model-len", type=int, default=8192)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument("--max-num-batched-tokens", type=int, default=None)
    engine.add_argument("--max-cudagraph-capture-size", type=int, default=None)
    engine.add_argument("--compilation-config", "-O", type=json_object, default=None, metavar="JSON")
    engine.add_argument("--speculative-config", type=json_object, default=None, metavar="JSON")
    engine.add_argument("--attention-backend", default=None)
    engine.add_argument("--linear-backend", default=None)
    engine.add_argument("--moe-backend", default=None)
    _add_bool(engine, "--enable-chunked-prefill", "chunked prefill")
    _add_bool(engine, "--async-scheduling", "asynchronous scheduling")
    _add_bool(engine, "--enable-prefix-caching", "prefix caching")

    frontend = serve.add_argument_group("API server (head only)")
    frontend.add_argument("--host", default="0.0.0.0")  # noqa: S104 - vLLM's default: all interfaces
    frontend.add_argument("--port", type=int, default=8000)
    frontend.add_argument("--api-key", default=None, help="prefer the VLLM_API_KEY environment variable")
    frontend.add_argument("--allowed-media-domains", nargs="+", default=None, metavar="DOMAIN")
    frontend.add_argument("--reasoning-parser", default=None)
    frontend.add_argument("--tool-call-parser", default=None)
    _add_bool(frontend, "--enable-auto-tool-choice", "let the model decide to call tools")
    _add_bool(frontend, "--enable-prompt-tokens-details", "usage.prompt_tokens_details")
    _add_bool(frontend, "--enable-force-include-usage", "usage in every stream")
    return parser


def check_consistency(args: argparse.Namespace) -> None:
    """Cross-flag rules of a one-GPU-per-node tensor-parallel deployment."""
    if args.nnodes < 1:
        raise StartupError(f"--nnodes must be >= 1, got {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        raise StartupError(f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes)")
    if args.tensor_parallel_size != args.nnodes:
        raise StartupError(
            f"--tensor-parallel-size {args.tensor_parallel_size} must equal --nnodes {args.nnodes} "
            "(one GPU per DGX Spark node)"
        )
    if args.headless and args.node_rank == 0:
        raise StartupError("rank 0 must not be --headless: it serves the API")
    if args.node_rank > 0 and not args.headless:
        raise StartupError(f"--node-rank {args.node_rank} requires --headless (only rank 0 serves)")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise StartupError(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    draft_tp = (args.speculative_config or {}).get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp != args.tensor_parallel_size:
        raise StartupError(
            f"--speculative-config draft_tensor_parallel_size {draft_tp} must equal "
            f"--tensor-parallel-size {args.tensor_parallel_size}"
        )
    sizes = (args.compilation_config or {}).get("cudagraph_capture_sizes")
    limit = args.max_cudagraph_capture_size
    if sizes and limit is not None and max(sizes) != limit:
        raise StartupError(
            f"--max-cudagraph-capture-size {limit} differs from max(cudagraph_capture_sizes) {max(sizes)} "
            "in --compilation-config"
        )


# --- start-up: checks, settings, then the head's rendezvous and API, or a worker's link ------


def _redacted(args: argparse.Namespace) -> dict[str, Any]:
    config = dict(vars(args))
    if config.get("api_key"):
        config["api_key"] = "<redacted>"
    return config


def run_head(args: argparse.Namespace, settings: Settings, env: dict[str, str], faults: Faults) -> int:
    """Rank 0: rendezvous with every headless rank, then (and only then) serve HTTP."""
    rendezvous: HeadRendezvous | None = None
    if args.nnodes > 1:
        rendezvous = HeadRendezvous(args.master_addr, args.master_port, args.nnodes, shared_args(args))
        rendezvous.start()
        rendezvous.wait_all()
    if settings.boot_seconds:
        Log.info(f"simulating {settings.boot_seconds:g} s of model loading (STANDIN_BOOT_SECONDS)")
        time.sleep(settings.boot_seconds)
    api_key = args.api_key or env.get("VLLM_API_KEY") or None
    if not api_key:
        Log.info("no VLLM_API_KEY and no --api-key: the API accepts requests without a bearer token")
    engine = Engine(
        args=args,
        settings=settings,
        api_key=api_key,
        request_log=RequestLog(settings.request_log),
        faults=faults,
    )
    if rendezvous:
        engine.frozen, engine.dead = rendezvous.frozen, rendezvous.dead
        rendezvous.on_freeze = engine.metrics.freeze  # /metrics keeps its last values while frozen
    try:
        server = StandinHTTPServer((args.host, args.port), engine)
    except OSError as exc:
        raise StartupError(f"cannot serve on --host {args.host} --port {args.port}: {exc}") from exc
    Log.info(f"API ready on http://{args.host}:{args.port}/v1 (model {engine.model_names[0]!r})")
    server.serve_forever()
    return 0


def run_worker(args: argparse.Namespace, host_ip: str, faults: Faults) -> int:
    """A headless rank: join rank 0 and live exactly as long as that link does (unless hung)."""
    link = join_head(args, host_ip, shared_args(args))
    Log.info(f"joined rank 0 at {args.master_addr}:{args.master_port} as headless rank {args.node_rank}")
    why = keep_alive(link, faults.hung)
    Log.error(f"lost rank 0: {why}; exiting like a dead vLLM worker")
    return 1


def _install_signal_handlers() -> None:
    """As PID 1 in a container, SIGTERM would be ignored without a handler (docker stop hangs)."""

    def stop(signum: int, _frame: object) -> None:
        Log.info(f"received {signal.Signals(signum).name}; shutting down")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2, --help exits 0
    Log.tag = f"r{args.node_rank}"
    _install_signal_handlers()
    env = dict(os.environ)
    try:
        check_consistency(args)
        facts = check_environment(args, env)
        settings = Settings.from_env(env, facts.cache_dir)
        Log.info("config " + json.dumps(_redacted(args), sort_keys=True))
        Log.info(
            f"STAND-IN engine {STANDIN_VERSION}: model {(args.served_model_name or [args.model_path])[0]!r} "
            f"port {args.port} tp {args.tensor_parallel_size} nnodes {args.nnodes} rank {args.node_rank}"
            f"{' (headless)' if args.headless else ''} ip {facts.host_ip} if {facts.ifname}; "
            f"decode {settings.decode_tps:g} tok/s prefill {settings.prefill_tps:g} tok/s "
            f"output {settings.output_tokens} faults {','.join(sorted(settings.faults)) or 'none'} "
            f"fault file {settings.faults_file}"
        )
        refuse_start_if_asked(settings)  # exit_on_start: before the rendezvous, the file is kept
        faults = Faults(settings)
        faults.apply(settings.faults, "STANDIN_FAULTS")
        faults.watch()  # every rank takes run-time faults from the fault file
        if args.node_rank == 0:
            return run_head(args, settings, env, faults)
        return run_worker(args, facts.host_ip, faults)
    except StartupError as exc:
        Log.error(str(exc))
        return 1
