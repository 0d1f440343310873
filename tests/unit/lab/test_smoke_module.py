"""sparkserve.dsv41.smoke run in-process against the stand-in engine on loopback (two ranks)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.sparkserve.dsv41.plugins.modules import smoke
from standin_support import API_KEY, Rank, start_cluster


def run(capsys, **args) -> dict:
    capsys.readouterr()
    with patch_module_args({"_ansible_check_mode": False, **args}), pytest.raises(SystemExit):
        smoke.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def engines(start_rank: Callable[..., Rank], tmp_path_factory) -> dict[str, str]:
    """Base URLs of a healthy engine and of one set to answer wrongly."""
    urls = {}
    for name, faults in {"healthy": "", "faulty": "wrong_math,no_tool_call,swap_colors,no_reasoning"}.items():
        ranks = start_cluster(start_rank, tmp_path_factory.mktemp(name), settings={"STANDIN_FAULTS": faults})
        ranks[0].wait_healthy()
        urls[name] = f"http://127.0.0.1:{ranks[0].port}"
    return urls


def test_every_check_passes_on_a_healthy_engine(capsys, engines):
    result = run(capsys, base_url=engines["healthy"], api_key=API_KEY)
    assert not result.get("failed"), result
    assert result["changed"] is False and result["failed_checks"] == []
    assert [r["name"] for r in result["results"]] == ["text", "tool_call", "vision", "reasoning", "stream"]
    assert "391" in result["results"][0]["evidence"]
    assert all(line.split()[1] == "PASS" for line in result["table"].splitlines()[1:])


def test_wrong_answers_fail_naming_each_check(capsys, engines):
    result = run(capsys, base_url=engines["faulty"] + "/v1/", api_key=API_KEY)
    assert result["failed"] is True
    assert result["failed_checks"] == ["text", "tool_call", "vision", "reasoning"]
    assert "smoke check(s) failed: text, tool_call, vision, reasoning" in result["msg"]


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


def test_an_unreachable_endpoint_fails_with_the_address(capsys):
    result = run(capsys, base_url="http://127.0.0.1:9", checks=["text"], timeout=5)
    assert result["failed"] is True and "127.0.0.1:9/v1/chat/completions" in result["results"][0]["evidence"]


def test_a_base_url_that_is_not_http_is_refused(capsys):
    result = run(capsys, base_url="ftp://example.net")
    assert result["failed"] is True and "base_url must be an http(s) URL" in result["msg"]
