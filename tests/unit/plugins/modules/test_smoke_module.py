"""The smoke module's transport against a real local HTTP server."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from ansible_collections.sparkserve.dsv41.plugins.modules import smoke
from local_http import JsonHandler, serving

# Long and unlike any word, so that finding it in the output means the key leaked.
FILE_KEY = "sk-smoke-7f3a9c0e5b2d4168"


class Models(JsonHandler):
    bearers: ClassVar[list[str]] = []

    def do_GET(self):
        Models.bearers.append(self.headers.get("Authorization", ""))
        if self.headers.get("Authorization") in ("Bearer k", f"Bearer {FILE_KEY}"):
            self.reply(200, {"data": [{"id": "m"}]})
        else:
            self.reply(401, {"error": "no key"})


@pytest.fixture
def api():
    Models.bearers = []
    with serving(Models) as url:
        yield url


@pytest.mark.parametrize(("key", "status"), [("k", 200), ("wrong", 401)])
def test_the_engine_is_asked_directly_whatever_proxy_the_environment_names(
    api, proxy_that_answers_nothing, key, status
):
    reply = smoke.http_client(api, key, timeout=5)("/v1/models", None, False)
    assert reply.status == status


def test_the_key_file_gives_the_key_and_the_key_never_reaches_the_output(api, tmp_path, run_module):
    key_file = tmp_path / "api_key"
    key_file.write_text(f"{FILE_KEY}\n")
    result = run_module(smoke, {"base_url": api, "api_key_file": str(key_file), "checks": []})
    assert not result.failed, result
    assert Models.bearers == [f"Bearer {FILE_KEY}"]  # the model list, asked because no model was named
    # A key read from a file is outside no_log's reach: the module itself must keep it out.
    assert FILE_KEY not in json.dumps(result)


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
