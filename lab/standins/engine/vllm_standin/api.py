"""The OpenAI-compatible HTTP API of rank 0: routes, auth, errors, limits and streaming."""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from . import STANDIN_VERSION
from .answers import Answer, Planner, chat_prompt_tokens, count_tokens, filler, name_of_tool, split_pieces
from .errors import EngineDead, RequestError
from .faults import Faults
from .generation import Job
from .log import Log, RequestLog
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics
from .settings import Settings

# After answering the request that found the engine core dead, the API server exits this soon
# (time for the answer and the request log line).
EXIT_AFTER_DEAD_S = 0.2
FROZEN_POLL_S = 0.05


@dataclass
class Engine:
    """Everything request handlers share. ``frozen`` and ``dead`` say why the engine waits for a
    silent rank, or why its core is dead (a rank lost); None while it does not / is not."""

    args: argparse.Namespace
    settings: Settings
    api_key: str | None
    request_log: RequestLog
    faults: Faults
    frozen: Callable[[], str | None] = lambda: None
    dead: Callable[[], str | None] = lambda: None
    planner: Planner = field(init=False)
    slots: threading.BoundedSemaphore = field(init=False)
    model_names: list[str] = field(init=False)
    metrics: Metrics = field(init=False)

    def __post_init__(self) -> None:
        self.planner = Planner(self.args, self.settings, self.faults.active)
        self.slots = threading.BoundedSemaphore(max(1, self.args.max_num_seqs))
        self.model_names = self.args.served_model_name or [self.args.model_path]
        # The KV cache holds a full batch of full contexts: --max-num-seqs x --max-model-len tokens.
        capacity = max(1, self.args.max_num_seqs) * max(1, self.args.max_model_len)
        self.metrics = Metrics(self.model_names[0], capacity)

    def stall(self) -> None:
        """Before each engine step: block for good under ``hang``, wait while a rank is frozen (as
        vLLM's collectives do), and fail once the engine core is dead."""
        self.faults.stall()
        while self.frozen() and not self.dead():
            time.sleep(FROZEN_POLL_S)
        why = self.dead()
        if why:
            raise EngineDead(why)

    def exit_soon(self, why: str) -> None:
        """vLLM's API server shuts down once a request met the dead engine core."""

        def leave() -> None:
            time.sleep(EXIT_AFTER_DEAD_S)
            Log.error(f"engine core dead ({why}): the API server exits (1)")
            os._exit(1)

        threading.Thread(target=leave, daemon=True, name="engine-dead").start()


class ClientGone(Exception):
    """The client closed the connection while we were still sending."""


class StandinHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], engine: Engine):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.engine = engine
        super().__init__(address, Handler)


def _error_body(status: int, message: str, err_type: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def _limit_from(request: dict[str, Any]) -> int | None:
    """vLLM: max_completion_tokens wins over the legacy max_tokens."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = request.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise RequestError(400, f"{key} must be an integer >= 1, got {value!r}", param=key)
            return value
    return None


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


def completion_prompt(request: dict[str, Any]) -> tuple[str, int]:
    """(text, token count) of a /v1/completions prompt: a string, or a list of token ids."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return "", len(prompt)
    raise RequestError(400, "prompt must be one string or one list of token ids", param="prompt")


class Handler(BaseHTTPRequestHandler):
    """The OpenAI-compatible routes of a vLLM head."""

    protocol_version = "HTTP/1.1"
    server_version = "vllm-standin/" + STANDIN_VERSION
    server: StandinHTTPServer

    # --- plumbing --------------------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle delay per token

    def log_message(self, format: str, *args: Any) -> None:
        Log.info(f"{self.client_address[0]} {format % args}")

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    def _send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        self._send_json(status, _error_body(status, message, err_type, param))

    def _write_chunk(self, data: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ClientGone from exc

    def _sse(self, payload: dict[str, Any] | str) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        self._write_chunk(f"data: {text}\n\n".encode())

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # --- routing ---------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._status = 0
        path = urlsplit(self.path).path
        record: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "method": method,
            "path": path,
            "user_agent": self.headers.get("User-Agent"),
        }
        try:
            # Drain the body first: an early 401/404 must not leave it on a keep-alive connection.
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else b""
            self._route(method, path, raw, record)
        except EngineDead as exc:
            record["error"] = f"{exc} ({exc.why})"
            if self._status == 0:
                self._send_error(exc.status, str(exc), exc.err_type)
            self.close_connection = True  # a stream cut off mid-answer, as vLLM's are
            self.server.engine.exit_soon(exc.why)
        except RequestError as exc:
            record["error"] = str(exc)
            self._send_error(exc.status, str(exc), exc.err_type, exc.param)
        except ClientGone:
            record["error"] = "client closed the connection"
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a stand-in bug must answer 500, not silently drop the connection
            Log.error(f"{method} {path}: internal error {exc!r}")
            record["error"] = repr(exc)
            if self._status == 0:
                self._send_error(500, f"stand-in internal error: {exc!r}", "InternalServerError")
            self.close_connection = True
        finally:
            record["status"] = self._status
            self.server.engine.request_log.write(record)

    def _route(self, method: str, path: str, raw: bytes, record: dict[str, Any]) -> None:
        engine = self.server.engine
        routes = {"/health": "GET", "/version": "GET", "/v1/models": "GET", "/metrics": "GET"}
        routes |= {"/v1/chat/completions": "POST", "/v1/completions": "POST"}
        if raw:  # record what was sent, even when it is refused
            with contextlib.suppress(RequestError):
                self._note_request(_json_body(raw), record)
        if path.startswith("/v1") and not self._authorised(record):
            raise RequestError(401, "Unauthorized: missing or invalid bearer token", "AuthenticationError")
        if path not in routes:
            raise RequestError(404, f"Not Found: {path}", "NotFoundError")
        if routes[path] != method:
            raise RequestError(405, "Method Not Allowed", "MethodNotAllowed")
        if path == "/health":  # answered by the API server: 200 whether the engine is frozen or dead
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/version":
            self._send_json(200, {"version": STANDIN_VERSION})
        elif path == "/metrics":  # outside /v1, so no bearer token: vLLM's /metrics is not behind --api-key
            data = engine.metrics.exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", METRICS_CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif path == "/v1/models":
            self._send_json(200, self._models())
        else:
            self._completion(path, _json_body(raw), record)

    def _authorised(self, record: dict[str, Any]) -> bool:
        key = self.server.engine.api_key
        header = self.headers.get("Authorization", "")
        record["bearer_present"] = header.startswith("Bearer ")
        if not key:
            record["bearer_matched"] = None
            return True
        matched = hmac.compare_digest(header.encode(), f"Bearer {key}".encode())
        record["bearer_matched"] = matched
        return matched

    @staticmethod
    def _note_request(body: dict[str, Any], record: dict[str, Any]) -> None:
        """What a client sent, for the request log (the prompt itself is left out)."""
        record.update(
            {
                "model": body.get("model"),
                "stream": body.get("stream"),
                "stream_options": body.get("stream_options"),
                "max_tokens_present": "max_tokens" in body,
                "max_tokens": body.get("max_tokens"),
                "max_completion_tokens_present": "max_completion_tokens" in body,
                "max_completion_tokens": body.get("max_completion_tokens"),
                "tools": [name_of_tool(t) for t in body.get("tools") or []],
                "tool_choice": body.get("tool_choice"),
                "reasoning_effort": body.get("reasoning_effort"),
                "chat_template_kwargs": body.get("chat_template_kwargs"),
            }
        )

    def _models(self) -> dict[str, Any]:
        engine = self.server.engine
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": engine.args.model_path,
                "parent": None,
                "max_model_len": engine.args.max_model_len,
            }
            for name in engine.model_names
        ]
        return {"object": "list", "data": data}

    # --- completions -----------------------------------------------------------------------

    def _completion(self, path: str, body: dict[str, Any], record: dict[str, Any]) -> None:
        engine = self.server.engine
        model = body.get("model")
        if model is not None and model not in engine.model_names:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        chat = path == "/v1/chat/completions"
        if chat:
            prompt_tokens = chat_prompt_tokens(body)
            answer = engine.planner.chat(body)
        else:
            text, prompt_tokens = completion_prompt(body)
            answer = engine.planner.completion(text)
        self._fit(answer, body, prompt_tokens)
        record.update(prompt_tokens=prompt_tokens, completion_tokens=len(answer.pieces))
        record["finish_reason"] = answer.finish_reason
        job = Job(
            chat=chat, model=str(model or engine.model_names[0]), answer=answer, prompt_tokens=prompt_tokens
        )
        received = time.monotonic()
        why = engine.dead()
        if why:  # the first request that reaches the engine core finds it dead
            raise EngineDead(why)
        engine.metrics.queued()
        with engine.slots:  # --max-num-seqs: further requests queue, as in vLLM's scheduler
            engine.metrics.admitted()
            try:
                schedule = self._generate(job)
                if body.get("stream"):
                    self._stream(job, schedule, body)
                else:
                    for _ in schedule:
                        pass
                    self._send_json(200, job.full_response(self._usage(job)))
            finally:  # an answer cut short (client gone, error) is an abort, as vLLM counts it
                complete = job.produced == len(answer.pieces)
                engine.metrics.kv(-job.kv_tokens)  # no prefix caching: its blocks are freed
                engine.metrics.finished(answer.finish_reason if complete else "abort")
        Log.info(
            f"{path} {'stream' if body.get('stream') else 'full'}: prompt {prompt_tokens} tokens, "
            f"completion {len(answer.pieces)} tokens, finish {answer.finish_reason}, "
            f"{time.monotonic() - received:.2f} s"
        )

    def _generate(self, job: Job) -> Iterator[int]:
        """The job's token schedule, counted in /metrics as each token is produced."""
        engine = self.server.engine
        for index in job.schedule(engine.settings, engine.stall, engine.metrics.kv):
            if index == 0:
                engine.metrics.prefilled(job.prompt_tokens)
            engine.metrics.token()
            yield index

    def _fit(self, answer: Answer, body: dict[str, Any], prompt_tokens: int) -> None:
        """Apply max_model_len, max_tokens, min_tokens and ignore_eos the way vLLM does."""
        max_len = self.server.engine.args.max_model_len
        limit = _limit_from(body)
        if prompt_tokens >= max_len or (limit is not None and prompt_tokens + limit > max_len):
            raise RequestError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{prompt_tokens + (limit or 0)} tokens ({prompt_tokens} in the messages, {limit or 0} in "
                "the completion). Please reduce the length of the messages or completion.",
            )
        cap = limit if limit is not None else max_len - prompt_tokens
        wanted = int(body.get("min_tokens") or 0)
        if body.get("ignore_eos") and limit is not None:
            wanted = limit
        if wanted > len(answer.pieces) and answer.pieces[-1].kind == "content":  # tool calls do not grow
            answer.pieces += split_pieces(" " + filler("more", wanted - len(answer.pieces)), "content")
        if len(answer.pieces) > cap:
            answer.pieces = answer.pieces[:cap]
            answer.finish_reason = "length"

    def _usage(self, job: Job) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": len(job.answer.pieces),
            "total_tokens": job.prompt_tokens + len(job.answer.pieces),
        }
        if self.server.engine.args.enable_prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def _stream(self, job: Job, schedule: Iterator[int], body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in schedule:
            if index == 0 and job.chat:
                self._sse(job.chunk({"role": "assistant", "content": ""}, None))
            self._sse(job.piece_chunk(index))
        options = body.get("stream_options") or {}
        if self.server.engine.args.enable_force_include_usage or options.get("include_usage"):
            self._sse(job.envelope([], usage=self._usage(job)))
        self._sse("[DONE]")
        self._write_chunk(b"")  # the zero-length chunk ends the chunked body
