"""Unit tests for roles/rank/files/dsv41_rank_probe.py, the rank role's look at starting ranks.

The program is a standalone script the role runs on each node, imported here from its path. The
API is a real HTTP server on loopback, docker a small executable in tmp_path that prints a
captured ``docker inspect`` answer, and time a fake clock.
"""

from __future__ import annotations

import http.server
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from node_programs import load_program, program_path

PROGRAM = program_path("rank", "dsv41_rank_probe")


probe = load_program("rank", "dsv41_rank_probe")

# `docker inspect --format '{{json .State}}|{{.RestartCount}}'` of a stand-in rank, captured on the lab.
RUNNING = (
    '{"Status":"running","Running":true,"Paused":false,"Restarting":false,"OOMKilled":false,"Dead":false,'
    '"Pid":4242,"ExitCode":0,"Error":"","StartedAt":"2026-12-04T21:14:02.1Z","FinishedAt":"0001-01-01T00:00:00Z"}|0'
)
EXITED = (
    '{"Status":"exited","Running":false,"Paused":false,"Restarting":false,"OOMKilled":false,"Dead":false,'
    '"Pid":0,"ExitCode":2,"Error":"","StartedAt":"2026-12-04T21:14:02.1Z","FinishedAt":"2026-12-04T21:14:03.9Z"}|0'
)


RESTARTED = "exited (code {}) and is being restarted"
GONE_CASES = {
    "missing": (None, 0, "does not exist"),
    "running": ({"Running": True, "RestartCount": 0}, 0, None),
    "running, restarted before the role started it": ({"Running": True, "RestartCount": 2}, 2, None),
    "restarted since": ({"Running": True, "RestartCount": 3, "ExitCode": 0}, 2, RESTARTED.format(0)),
    "restarting": ({"Restarting": True, "ExitCode": 1, "RestartCount": 0}, 0, RESTARTED.format(1)),
    "exited": ({"Running": False, "Status": "exited", "ExitCode": 2}, 0, "is exited (exit code 2)"),
    "created": ({"Running": False, "Status": "created", "ExitCode": 0}, 0, "is created (exit code 0)"),
}  # fmt: skip


@pytest.mark.parametrize(("state", "restarts_before", "reason"), GONE_CASES.values(), ids=GONE_CASES)
def test_gone_reason(state, restarts_before, reason):
    expected = None if reason is None else f"container dsv41-r1 {reason}"
    assert probe.gone_reason(state, "dsv41-r1", restarts_before) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def looks(*answers: int):
    """A look that gives ``answers`` in turn (the last one from then on), and the count of looks."""
    given: list[int] = []

    def look() -> tuple[int, str]:
        code = answers[min(len(given), len(answers) - 1)]
        given.append(code)
        return code, {0: "ready", 1: "starting", 2: "gone"}[code]

    return look, given


@pytest.mark.parametrize(
    ("answers", "wait_seconds", "expected", "count", "slept"),
    [
        ((0,), 5, (0, "ready"), 1, []),
        ((2,), 5, (2, "gone"), 1, []),
        ((1,), 0, (1, "starting"), 1, []),  # 0: one look, as before the wait existed
        ((1, 1, 0), 5, (0, "ready"), 3, [1.0, 1.0]),  # ready at the third look: no waiting for the rest
        ((1, 2), 5, (2, "gone"), 2, [1.0]),
        ((1,), 2.5, (1, "starting"), 4, [1.0, 1.0, 0.5]),  # never past the time asked
    ],
)
def test_watch_returns_at_the_first_answer_or_when_the_time_is_up(
    answers, wait_seconds, expected, count, slept
):
    clock = FakeClock()
    look, given = looks(*answers)
    assert probe.watch(look, wait_seconds, clock=clock, sleep=clock.sleep) == expected
    assert len(given) == count
    assert clock.slept == slept


class _Api(http.server.BaseHTTPRequestHandler):
    key = "k-test"

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_response(200)
        elif self.path == "/v1/models":
            self.send_response(200 if self.headers.get("Authorization") == f"Bearer {self.key}" else 401)
        else:
            self.send_response(404)
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


NO_SUCH = "Error: No such object: dsv41-r0"
DAEMON_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the daemon running?"


def fake_docker(tmp_path: Path, answer: str | None, error: str = NO_SUCH, hang: bool = False) -> Path:
    """A docker that prints ``answer``, or fails with ``error`` when it is None, or never answers."""
    docker = tmp_path / "docker"
    if hang:
        body = "import time; time.sleep(60)"
    elif answer is not None:
        body = f"print({answer!r})"
    else:
        body = f"import sys; sys.exit({error!r})"
    docker.write_text(f"#!{sys.executable}\n{body}\n")
    docker.chmod(0o755)
    return docker


@pytest.mark.parametrize(
    ("docker", "expected"),
    [
        pytest.param({"answer": None}, None, id="no such container"),
        pytest.param({"answer": None, "error": DAEMON_DOWN}, DAEMON_DOWN, id="daemon down"),
        pytest.param({"answer": None, "hang": True}, "docker inspect timed out after 0.5 s", id="timed out"),
    ],
)
def test_only_docker_saying_so_makes_a_container_missing(tmp_path, monkeypatch, docker, expected):
    monkeypatch.setattr(probe, "INSPECT_TIMEOUT_S", 0.5)
    fake = str(fake_docker(tmp_path, **docker))
    if expected is None:
        assert probe.container_state(fake, "dsv41-r0") is None
    else:
        with pytest.raises(probe.DockerUnanswered, match=re.escape(expected)):
            probe.container_state(fake, "dsv41-r0")


@pytest.mark.parametrize(
    "case",
    [
        ("k-test", RUNNING, 0, "ready"),
        ("wrong", RUNNING, 1, "starting"),  # the models endpoint refuses: not ready yet
        ("wrong", EXITED, 2, "container dsv41-r0 is exited (exit code 2)"),
        ("wrong", None, 2, "container dsv41-r0 does not exist"),
    ],
)
def test_main_exits_with_what_it_saw_and_reads_the_key_from_its_file(api, tmp_path, capsys, case):
    key, container, code, printed = case
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    argv = [
        "--container", "dsv41-r0", "--health-url", f"{api}/health", "--models-url", f"{api}/v1/models",
        "--key-file", str(key_file), "--docker", str(fake_docker(tmp_path, container)),
    ]  # fmt: skip
    assert probe.main(argv) == code
    assert capsys.readouterr().out.strip() == printed


def test_main_fails_fast_on_an_api_that_does_not_answer(tmp_path, capsys):
    argv = [
        "--container",
        "dsv41-r1",
        "--health-url",
        "http://127.0.0.1:9/health",
        "--docker",
        str(fake_docker(tmp_path, EXITED)),
    ]
    assert probe.main([*argv, "--wait-seconds", "30"]) == 2, "a gone rank ends the wait at once"
    assert "exited" in capsys.readouterr().out


def test_main_waits_on_a_docker_that_does_not_answer(tmp_path, capsys):
    argv = ["--container", "dsv41-r1", "--health-url", "http://127.0.0.1:9/health",
            "--docker", str(fake_docker(tmp_path, None, DAEMON_DOWN))]  # fmt: skip
    assert probe.main(argv) == 1, "still starting: the role asks again"
    assert capsys.readouterr().out.strip() == f"starting (docker did not answer: {DAEMON_DOWN})"


def test_the_api_is_asked_directly_whatever_proxy_the_environment_names(api, proxy_that_answers_nothing):
    assert probe.http_ok(f"{api}/v1/models", _Api.key)
