"""The smoke module's transport against a real local HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
from typing import ClassVar

import pytest
from ansible_collections.sparkserve.dsv41.plugins.modules import smoke


class Models(http.server.BaseHTTPRequestHandler):
    bearers: ClassVar[list[str]] = []

    def do_GET(self):
        Models.bearers.append(self.headers.get("Authorization", ""))
        authorized = self.headers.get("Authorization") == "Bearer k"
        data = json.dumps({"data": [{"id": "m"}]} if authorized else {"error": "no key"}).encode()
        self.send_response(200 if authorized else 401)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Models.bearers = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(("key", "status"), [("k", 200), ("wrong", 401)])
def test_the_engine_is_asked_directly_whatever_proxy_the_environment_names(
    api, proxy_that_answers_nothing, key, status
):
    reply = smoke.http_client(api, key, timeout=5)("/v1/models", None, False)
    assert reply.status == status


def test_the_key_file_gives_the_key_and_the_key_never_reaches_the_output(api, tmp_path, run_module):
    key_file = tmp_path / "api_key"
    key_file.write_text("k\n")
    result = run_module(smoke, {"base_url": api, "api_key_file": str(key_file), "checks": []})
    assert not result.failed, result
    assert Models.bearers == ["Bearer k"]  # the model list, asked because no model was named


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param({"api_key": "k", "api_key_file": "KEY"}, "mutually exclusive", id="both"),
        pytest.param({"api_key_file": "MISSING"}, "cannot read the API key file MISSING", id="missing"),
        pytest.param({"api_key_file": "EMPTY"}, "the API key file EMPTY holds no key", id="empty"),
    ],
)
def test_a_key_that_cannot_be_had_fails_naming_the_file(api, tmp_path, run_module, args, message):
    (tmp_path / "KEY").write_text("k\n")
    (tmp_path / "EMPTY").write_text("\n")
    paths = {name: str(tmp_path / name) for name in ("KEY", "MISSING", "EMPTY")}
    args = {key: paths.get(value, value) for key, value in args.items()}
    result = run_module(smoke, {"base_url": api, "checks": [], **args})
    assert result.failed
    assert message.replace("MISSING", paths["MISSING"]).replace("EMPTY", paths["EMPTY"]) in result["msg"]
    assert Models.bearers == [], "nothing was asked"
