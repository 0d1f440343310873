"""sparkserve.dsv41.smoke run in-process against the stand-in engine on loopback (two ranks)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.sparkserve.dsv41.plugins.modules import smoke
from standin_support import API_KEY, Rank, start_cluster

MODEL = "deepseek-v4.1-flash"  # the reference --served-model-name, the only model the stand-in lists
FAULTS = {
    "healthy": "",
    "faulty": "wrong_math,no_tool_call,swap_colors,no_reasoning",
    "wrong_city": "wrong_city",
}


def run(capsys, **args) -> dict:
    capsys.readouterr()
    with patch_module_args({"_ansible_check_mode": False, **args}), pytest.raises(SystemExit):
        smoke.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def engines(start_rank: Callable[..., Rank], tmp_path_factory) -> dict[str, str]:
    """Base URLs of a healthy engine, of one set to answer wrongly and of one asking the wrong city."""
    urls = {}
    for name, faults in FAULTS.items():
        # Fast tokens: these cases are about the checks, not the engine's speed.
        settings = {"STANDIN_FAULTS": faults, "STANDIN_DECODE_TOKENS_PER_S": "1000"}
        ranks = start_cluster(start_rank, tmp_path_factory.mktemp(name), settings=settings)
        ranks[0].wait_healthy()
        urls[name] = f"http://127.0.0.1:{ranks[0].port}"
    return urls


def test_every_check_passes_on_a_healthy_engine(capsys, engines):
    result = run(capsys, base_url=engines["healthy"], api_key=API_KEY)
    assert not result.get("failed"), result
    assert result["changed"] is False and result["failed_checks"] == []
    assert [r["name"] for r in result["results"]] == ["text", "tool_call", "vision", "reasoning", "stream"]
    assert "391" in result["results"][0]["evidence"]
    assert result["results"][1]["evidence"] == "get_weather(city='Hanoi')"
    assert all(line.split()[1] == "PASS" for line in result["table"].splitlines()[1:])


def test_without_a_model_the_first_one_listed_is_asked_and_returned(capsys, engines):
    result = run(capsys, base_url=engines["healthy"], api_key=API_KEY, checks=["text"])
    assert result["model"] == MODEL and not result.get("failed")
    given = run(capsys, base_url=engines["healthy"], api_key=API_KEY, checks=["text"], model="")
    assert given["model"] == MODEL and not given.get("failed")


def test_a_model_given_is_the_one_asked(capsys, engines):
    result = run(capsys, base_url=engines["healthy"], api_key=API_KEY, checks=["text"], model="no-such-model")
    assert result["model"] == "no-such-model" and result["failed_checks"] == ["text"]
    assert result["results"][0]["evidence"] == "HTTP 404: The model `no-such-model` does not exist."


def test_every_check_shows_the_tokens_of_its_answer(capsys, engines):
    result = run(capsys, base_url=engines["healthy"], api_key=API_KEY)
    for check in result["results"]:
        usage = check["usage"]
        assert set(usage) == {"prompt_tokens", "completion_tokens"}, check
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0, check
    header, *rows = result["table"].splitlines()
    column = header.index("tokens")
    for check, row in zip(result["results"], rows, strict=True):
        usage = check["usage"]
        assert row[column:].startswith(f"{usage['prompt_tokens']} in, {usage['completion_tokens']} out")


def test_wrong_answers_fail_naming_each_check(capsys, engines):
    result = run(capsys, base_url=engines["faulty"] + "/v1/", api_key=API_KEY)
    assert result["failed"] is True
    assert result["failed_checks"] == ["text", "tool_call", "vision", "reasoning"]
    assert "smoke check(s) failed: text, tool_call, vision, reasoning" in result["msg"]


def test_a_tool_call_for_another_city_fails_only_the_tool_check(capsys, engines):
    result = run(capsys, base_url=engines["wrong_city"], api_key=API_KEY)
    assert result["failed"] is True and result["failed_checks"] == ["tool_call"]
    assert result["results"][1]["evidence"] == "get_weather(city='Paris'), but the question is about Hanoi"


def test_a_wrong_key_fails_every_check_with_401_and_is_never_shown(capsys, engines):
    result = run(capsys, base_url=engines["healthy"], api_key="wrong-key-abc")
    assert result["failed_checks"] == ["text", "tool_call", "vision", "reasoning", "stream"]
    assert all(r["evidence"].startswith("HTTP 401") for r in result["results"])
    assert "wrong-key-abc" not in json.dumps(result)


def test_only_the_checks_asked_for_run_and_check_mode_still_asks(capsys, engines):
    result = run(
        capsys, base_url=engines["healthy"], api_key=API_KEY, checks=["stream"], _ansible_check_mode=True
    )
    assert [r["name"] for r in result["results"]] == ["stream"] and not result.get("failed")


@pytest.mark.parametrize(
    ("model", "path"),
    [({}, "/v1/models"), ({"model": MODEL}, "/v1/chat/completions")],
    ids=["listing-the-models", "asking"],
)
def test_an_unreachable_endpoint_fails_with_the_address(capsys, model, path):
    result = run(capsys, base_url="http://127.0.0.1:9", checks=["text"], timeout=5, **model)
    assert result["failed"] is True and f"127.0.0.1:9{path}" in result["results"][0]["evidence"]


def test_a_base_url_that_is_not_http_is_refused(capsys):
    result = run(capsys, base_url="ftp://example.net")
    assert result["failed"] is True and "base_url must be an http(s) URL" in result["msg"]
