"""The API gateway's configuration, as the rank role renders it, run in the real HAProxy: /health
answers anyone, every other path only the API key (vLLM itself checks /v1 only), /metrics also the
sources the user names, and the key lives in the environment, not in the file. The lab's tests
(tests/deployment, tests/real_engine) ask the gateway in front of both engines the same."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest
from local_http import JsonHandler, serving
from role_defaults import ROLES, SHARED_ROLE, role_defaults

# Installed by `make tools` (lab/labctl.py), as on the head.
HAPROXY = shutil.which("haproxy", path="/usr/sbin:/usr/bin") or "haproxy"
KEY = "k3y-" + "x" * 39  # as long as secrets.token_urlsafe(32)
# The API's own paths, open without a key on vLLM 0.32 (measured on the real-engine lab).
OPEN_ON_VLLM = ["/invocations", "/tokenize", "/detokenize", "/metrics", "/version", "/docs", "/openapi.json"]


class Engine(JsonHandler):
    """Stands for the engine behind the gateway: says what reached it; /stream sends its headers,
    then (a prefill later) two events, STREAM_GAP seconds apart each, as vLLM streams tokens."""

    def do_GET(self) -> None:
        if self.path == "/v1/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            for event in (b"data: first\n\n", b"data: second\n\n"):
                time.sleep(STREAM_GAP)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        self.reply(200, {"path": self.path, "authorization": self.headers.get("Authorization")})

    do_POST = do_GET


STREAM_GAP = 0.5


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def render(**overrides) -> str:
    """The gateway's configuration with the role's defaults and ``overrides``."""
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    values = {
        **role_defaults(SHARED_ROLE, "rank"),
        "ansible_managed": "managed",
        "__rank_gateway_tls": False,
        "__rank_gateway_tls_pem": "",
        "__rank_engine_host": "127.0.0.1",
        "__rank_metrics_backends": [],
        **overrides,
    }
    text = (ROLES / "rank" / "templates" / "dsv41-gateway.cfg.j2").read_text()
    return environment.from_string(text).render(values)


@contextlib.contextmanager
def gateway(tmp_path: Path, key: str = KEY, **overrides) -> Iterator[str]:
    """HAProxy running the rendered configuration in front of a loopback engine; its base URL."""
    with serving(Engine) as engine_url:
        port = free_port()
        config = render(
            rank_api_listen_address="127.0.0.1",
            deployment_api_port=port,
            deployment_engine_port=int(engine_url.rsplit(":", 1)[1]),
            **overrides,
        )
        if os.geteuid() == 0:  # the test needs no user switch; the node's gateway drops to haproxy
            config = config.replace("    user haproxy\n    group haproxy\n", "")
        path = tmp_path / "gateway.cfg"
        path.write_text(config)
        environment = {"PATH": os.environ["PATH"], "VLLM_API_KEY": key}
        check = subprocess.run(
            [HAPROXY, "-c", "-q", "-f", str(path)],
            env=environment,
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        process = subprocess.Popen([HAPROXY, "-db", "-f", str(path)], env=environment)
        scheme = "https" if overrides.get("__rank_gateway_tls") else "http"
        try:
            deadline = time.monotonic() + 10
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                assert time.monotonic() < deadline, "the gateway does not listen"
                time.sleep(0.05)
            yield f"{scheme}://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=10)


def ask(url: str, key: str | None = None, method: str = "GET") -> int:
    request = urllib.request.Request(
        url, method=method, headers={"Authorization": f"Bearer {key}"} if key is not None else {}
    )
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ssl._create_unverified_context())
    )
    try:
        with opener.open(request, timeout=5) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def test_health_answers_anyone_and_every_other_path_only_the_key(tmp_path):
    with gateway(tmp_path) as url:
        assert ask(f"{url}/health") == 200
        for path in [*OPEN_ON_VLLM, "/v1/models", "/v1/chat/completions", "//health", "/health/../v1/models"]:
            assert ask(f"{url}{path}", method="POST" if path == "/invocations" else "GET") == 401, path
            assert ask(f"{url}{path}", "wrong-key-" + "x" * 33) == 401, path
            assert ask(f"{url}{path}", KEY) == 200, path


def test_the_key_reaches_the_engine_and_the_file_does_not_hold_it(tmp_path):
    with gateway(tmp_path) as url:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        with opener.open(request, timeout=5) as reply:
            assert KEY in reply.read().decode(), "vLLM checks the key on /v1 as well"
    assert KEY not in (tmp_path / "gateway.cfg").read_text()


@pytest.mark.parametrize("key", ["", "short"], ids=["empty", "short"])
def test_a_missing_or_short_key_in_the_environment_opens_nothing(tmp_path, key):
    with gateway(tmp_path, key=key) as url:
        assert ask(f"{url}/health") == 200
        assert ask(f"{url}/v1/models", key or None) == 401
        assert ask(f"{url}/v1/models", "") == 401


def test_metrics_answer_the_named_sources_without_the_key_and_nothing_else(tmp_path):
    with gateway(tmp_path, rank_api_metrics_sources=["10.9.9.9", "127.0.0.0/8"]) as url:
        assert ask(f"{url}/metrics") == 200
        assert ask(f"{url}/v1/models") == 401
        assert ask(f"{url}/tokenize") == 401
    with gateway(tmp_path, rank_api_metrics_sources=["10.9.9.9"]) as url:
        assert ask(f"{url}/metrics") == 401


def test_each_streamed_event_goes_on_at_once(tmp_path):
    with gateway(tmp_path) as url:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(f"{url}/v1/stream", headers={"Authorization": f"Bearer {KEY}"})
        start = time.monotonic()
        with opener.open(request, timeout=10) as reply:
            headers_at = time.monotonic() - start
            first = reply.readline()
            first_at = time.monotonic() - start
            rest = reply.read()
    assert first == b"data: first\n"
    assert b"data: second" in rest
    # Without `option http-no-delay` the headers came 200 ms late and the first event with the rest.
    assert headers_at < 0.1, headers_at
    assert first_at - STREAM_GAP < 0.1, first_at


def test_tls_serves_the_users_certificate(tmp_path):
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=spark-head",
         "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    pem = tmp_path / "gateway.pem"
    pem.write_text((tmp_path / "tls.crt").read_text() + (tmp_path / "tls.key").read_text())
    with gateway(tmp_path, __rank_gateway_tls=True, __rank_gateway_tls_pem=str(pem)) as url:
        assert url.startswith("https://")
        assert ask(f"{url}/health") == 200
        assert ask(f"{url}/v1/models") == 401
        assert ask(f"{url}/v1/models", KEY) == 200
        with pytest.raises(urllib.error.URLError, match=r"CERTIFICATE_VERIFY_FAILED|self.signed"):
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{url}/health", timeout=5)


def test_the_supervisors_and_guards_metrics_answer_only_the_key_each_from_its_own_endpoint(tmp_path):
    with serving(Engine) as supervisor_url, serving(Engine) as guard_url:
        backends = [
            {
                "path": "/metrics/supervisor",
                "what": "the supervisor",
                "server": supervisor_url.split("//")[1],
            },
            {"path": "/metrics/memguard/spark-b", "what": "a guard", "server": guard_url.split("//")[1]},
        ]
        with gateway(tmp_path, __rank_metrics_backends=backends) as url:
            for path in ("/metrics/supervisor", "/metrics/memguard/spark-b"):
                assert ask(url + path) == 401
                assert ask(url + path, KEY) == 200
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            request = urllib.request.Request(
                url + "/metrics/memguard/spark-b", headers={"Authorization": f"Bearer {KEY}"}
            )
            with opener.open(request, timeout=5) as reply:
                reached = json.loads(reply.read())
            # The guard's own endpoint is asked for /metrics, and the key stays at the gateway (it
            # would cross the fabric for nothing).
            assert (reached["path"], reached["authorization"]) == ("/metrics", None)
            # A node the inventory does not have is the engine's path, which needs the key too.
            assert ask(url + "/metrics/memguard/spark-z") == 401
        # A Prometheus source let in without the key gets vLLM's /metrics, not the pair's.
        with gateway(
            tmp_path, __rank_metrics_backends=backends, rank_api_metrics_sources=["127.0.0.1"]
        ) as url:
            assert ask(url + "/metrics") == 200
            assert ask(url + "/metrics/supervisor") == 401
            assert ask(url + "/metrics/memguard/spark-b") == 401
