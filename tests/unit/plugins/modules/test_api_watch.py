"""The api_watch module against a real local HTTP server that stops answering and comes back."""

from __future__ import annotations

import json
import threading
import time
from typing import ClassVar

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._watch import GAP_FAILURES
from ansible_collections.sparkserve.dsv41.plugins.modules import api_watch
from local_http import JsonHandler, serving


class Api(JsonHandler):
    """A chat completions endpoint that answers 503 while ``down`` and checks the bearer."""

    down = False
    bearers: ClassVar[list[str]] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        Api.bearers.append(self.headers.get("Authorization", ""))
        if Api.down:
            self.reply(503, {})
        else:
            self.reply(200, {"choices": [{"message": {"content": "p"}}]})


@pytest.fixture
def api():
    Api.down, Api.bearers = False, []
    with serving(Api) as url:
        yield f"{url}/v1"


# A wall-clock step while the ranks are down (NTP after a node's reboot) is no downtime.
@pytest.mark.parametrize("step", [0.0, -3600.0, 3600.0], ids=["no-clock-step", "back-an-hour", "on-an-hour"])
def test_the_gap_is_measured_from_answers_and_the_key_comes_from_its_file(
    tmp_path, api, run_module, monkeypatch, step
):
    key = tmp_path / "api_key"
    key.write_text("sk-secret\n")
    wall, stepped = time.time, {"by": 0.0}
    monkeypatch.setattr(time, "time", lambda: wall() + stepped["by"])

    def switch():
        time.sleep(0.5)
        Api.down = True
        stepped["by"] = step
        time.sleep(1.0)
        Api.down = False

    threading.Thread(target=switch, daemon=True).start()
    progress = tmp_path / "p.json"
    args = {
        "url": api,
        "key_file": str(key),
        "model": "m",
        "interval": 0.1,
        "progress_file": str(progress),
    }
    result = run_module(api_watch, args)
    assert not result.failed, result
    assert 0.8 <= result["downtime_seconds"] <= 2.0
    assert result["first_new_answer"] - result["last_old_answer"] == pytest.approx(
        result["downtime_seconds"], abs=0.001
    )
    # At least a gap's worth: how many more a busy machine fits into the second down is not the point.
    assert result["failures"] >= GAP_FAILURES and result["msg"].startswith("the API did not answer for")
    assert set(Api.bearers) == {"Bearer sk-secret"}
    assert "sk-secret" not in json.dumps(result)
    assert json.loads(progress.read_text())["phase"] == "done"


def test_the_stop_file_ends_a_watch_that_saw_no_gap(tmp_path, api, run_module):
    stop = tmp_path / "stop"
    threading.Timer(0.5, stop.touch).start()
    result = run_module(api_watch, {"url": api, "model": "m", "interval": 0.1, "stop_file": str(stop)})
    assert not result.failed
    assert result["downtime_seconds"] is None and result["msg"].startswith("no gap seen in")


def test_a_stop_file_left_by_an_earlier_watch_is_removed_when_the_watch_starts(tmp_path, api, run_module):
    stop = tmp_path / "stop"
    stop.touch()
    threading.Timer(0.5, stop.touch).start()
    started = time.monotonic()
    result = run_module(api_watch, {"url": api, "model": "m", "interval": 0.1, "stop_file": str(stop)})
    assert not result.failed
    assert time.monotonic() - started >= 0.4, "the stale stop file did not end the watch at once"
    # One probe would have been all with the stale file: a count of the machine's speed is no proof.
    assert result["probes"] >= 2


def test_an_api_that_never_comes_back_fails_naming_the_timeout(tmp_path, run_module):
    args = {"url": "http://127.0.0.1:9/v1", "model": "m", "interval": 0.1, "timeout_minutes": 0}
    result = run_module(api_watch, args)
    assert result.failed and "timeout_minutes (0)" in result["msg"]


def test_the_engine_is_asked_directly_whatever_proxy_the_environment_names(api, proxy_that_answers_nothing):
    assert api_watch.answered(api, "k", "m", timeout=5)
    assert Api.bearers == ["Bearer k"]
