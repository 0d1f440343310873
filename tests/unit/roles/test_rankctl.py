"""Unit tests for roles/supervisor/files/dsv41_rankctl.py, the one door the supervisor has to a rank.

The program is a standalone script installed on every node, not a package module, so it is
imported from its path. Docker is replaced by a Python callable (for the verbs) or by a small
executable in tmp_path that records its argv (for the program run as a forced command would run
it), /proc by files in tmp_path, so nothing here needs root, docker or ssh.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from node_programs import load_program, program_path

REPO_ROOT = Path(__file__).resolve().parents[3]
PROGRAM = program_path("supervisor", "dsv41_rankctl")
FIXTURES = REPO_ROOT / "tests" / "unit" / "fixtures" / "rankctl"


rc = load_program("supervisor", "dsv41_rankctl")
KIB = 1024
BOOT_ID = "3f0c2b8e-5d1a-4c7e-9b26-8e4f1a0d7c53"
MEMINFO = "MemTotal:       124546616 kB\nMemFree:          912480 kB\nMemAvailable:    2411724 kB\n"
NOW = 1_764_579_600.25
IFNAME = "enp1s0f1np1"


def inspect_output(name: str) -> rc.CommandResult:
    """What `docker inspect --type container dsv41-r1` printed, from a fixture."""
    return rc.CommandResult(0, (FIXTURES / f"inspect_{name}.json").read_text(), "")


# The CLI says "Error: No such container" for --type container; the daemon's wording differs.
MISSING_CLI = rc.CommandResult(1, "[]\n", "Error: No such container: dsv41-r1\n")
MISSING_DAEMON = rc.CommandResult(1, "[]\n", "Error response from daemon: No such container: dsv41-r1\n")
MISSING_OBJECT = rc.CommandResult(1, "[]\n", "Error: No such object: dsv41-r1\n")
DAEMON_DOWN = rc.CommandResult(
    1,
    "",
    "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n",
)


class FakeDocker:
    """A runner: inspect answers from ``inspect``, start/stop from ``results``; records every call."""

    def __init__(self, inspect: rc.CommandResult, **results: rc.CommandResult) -> None:
        self.inspect = inspect
        self.results = results
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> rc.CommandResult:
        self.calls.append((list(argv), timeout))
        if argv[1] == "inspect":
            return self.inspect
        return self.results.get(argv[1], rc.CommandResult(0, "dsv41-r1\n", ""))

    def verbs(self) -> list[str]:
        return [argv[1] for argv, _ in self.calls]


@pytest.fixture
def config(tmp_path: Path) -> rc.Config:
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "boot_id").write_text(BOOT_ID + "\n")
    (tmp_path / "meminfo").write_text(MEMINFO)
    return rc.Config(
        container="dsv41-r1",
        state_dir=state,
        docker="docker",
        meminfo=tmp_path / "meminfo",
        boot_id=tmp_path / "boot_id",
    )


# --------------------------------------------------------------------------------------------
# The verb: exactly one of three, or nothing happens
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "ssh_command", "expected"),
    [
        pytest.param("status", None, "status", id="argument-status"),
        pytest.param("start", None, "start", id="argument-start"),
        pytest.param("stop", None, "stop", id="argument-stop"),
        pytest.param(None, "status", "status", id="ssh-status"),
        pytest.param(None, "start", "start", id="ssh-start"),
        pytest.param(None, "stop", "stop", id="ssh-stop"),
        pytest.param("status", "rm -rf /", "status", id="argument-wins-over-ssh"),
    ],
)
def test_choose_verb_accepts_the_three_verbs(argument, ssh_command, expected) -> None:
    assert rc.choose_verb(argument, ssh_command) == expected


@pytest.mark.parametrize(
    "verb",
    [
        pytest.param("status; rm -rf /", id="command-chained"),
        pytest.param("status && reboot", id="and-chained"),
        pytest.param("$(reboot)", id="substitution"),
        pytest.param("status\nrm -rf /", id="newline"),
        pytest.param("status ", id="trailing-space"),
        pytest.param(" status", id="leading-space"),
        pytest.param("status stop", id="two-verbs"),
        pytest.param("STATUS", id="upper-case"),
        pytest.param("restart", id="other-verb"),
        pytest.param("", id="empty"),
        pytest.param("bash -i", id="shell"),
        pytest.param("--config /tmp/evil.json status", id="options"),
    ],
)
@pytest.mark.parametrize("source", ["argument", "ssh"])
def test_choose_verb_refuses_anything_else(verb: str, source: str) -> None:
    with pytest.raises(rc.Refused, match="refused"):
        rc.choose_verb(verb if source == "argument" else None, verb if source == "ssh" else None)


def test_choose_verb_without_any_verb_is_refused() -> None:
    with pytest.raises(rc.Refused, match="no verb"):
        rc.choose_verb(None, None)


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def test_load_config_defaults() -> None:
    config = rc.load_config('{"container": "dsv41-r1", "state_dir": "/home/spark/.dsv41-two-sparks"}')
    assert config == rc.Config("dsv41-r1", Path("/home/spark/.dsv41-two-sparks"))
    assert config.docker == "docker"
    assert config.kill_record == Path("/home/spark/.dsv41-two-sparks/memguard-last-kill")
    assert config.boot_id == Path("/proc/sys/kernel/random/boot_id")
    assert config.meminfo == Path("/proc/meminfo")


def test_load_config_full() -> None:
    text = json.dumps(
        {"container": "dsv41-r0", "state_dir": "/srv/state", "docker": "/usr/bin/docker", "meminfo": "/m"}
    )
    config = rc.load_config(text)
    assert (config.container, config.docker, config.meminfo) == ("dsv41-r0", "/usr/bin/docker", Path("/m"))
    assert (config.fabric_ifname, config.sysfs_net) == (None, Path("/sys/class/net"))


@pytest.mark.parametrize(
    "ifname",
    [
        pytest.param(IFNAME, id="connectx-port"),
        pytest.param("enP2p1s0f1np1", id="second-half"),
        pytest.param("a" * 15, id="fifteen-chars"),
        pytest.param("bond0.100", id="dot-and-digits"),
        pytest.param("x", id="one-char"),
        pytest.param(None, id="null-is-none"),
    ],
)
def test_load_config_fabric(ifname: str | None) -> None:
    text = json.dumps({"container": "x", "state_dir": "/s", "fabric_ifname": ifname, "sysfs_net": "/f/net"})
    config = rc.load_config(text)
    assert (config.fabric_ifname, config.sysfs_net) == (ifname, Path("/f/net"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{", "not JSON", id="not-json"),
        pytest.param("[]", "JSON object", id="not-object"),
        pytest.param('{"state_dir": "/s"}', "container must be", id="no-container"),
        pytest.param('{"container": "-rf", "state_dir": "/s"}', "container must be", id="option-name"),
        pytest.param('{"container": "a b", "state_dir": "/s"}', "container must be", id="space-name"),
        pytest.param('{"container": "dsv41-r1"}', "state_dir must be an absolute path", id="no-state-dir"),
        pytest.param('{"container": "x", "state_dir": "~/.d"}', "state_dir must be an absolute", id="tilde"),
        pytest.param(
            '{"container": "x", "state_dir": "/s", "docker": ""}', "docker must be", id="empty-docker"
        ),
        pytest.param(
            '{"container": "x", "state_dir": "/s", "shell": "sh"}', "unknown key 'shell'", id="unknown"
        ),
        pytest.param(
            '{"container": "x", "state_dir": "/s", "sysfs_net": ""}', "sysfs_net must be", id="empty-sysfs"
        ),
    ],
)
def test_load_config_refuses_bad_configs(text: str, message: str) -> None:
    with pytest.raises(rc.Refused, match=message):
        rc.load_config(text)


@pytest.mark.parametrize(
    "ifname",
    [
        pytest.param("", id="empty"),
        pytest.param("a" * 16, id="sixteen-chars"),
        pytest.param("../../etc", id="path"),
        pytest.param("en/p1", id="slash"),
        pytest.param("enp 1", id="space"),
        pytest.param("enp1\n", id="newline"),
        pytest.param("enp1\t", id="tab"),
        pytest.param("eth0:1", id="colon"),
        pytest.param(".", id="dot"),
        pytest.param("..", id="dot-dot"),
        pytest.param(7, id="number"),
        pytest.param(["enp1"], id="list"),
    ],
)
def test_load_config_refuses_bad_fabric_ifnames(ifname: object) -> None:
    text = json.dumps({"container": "x", "state_dir": "/s", "fabric_ifname": ifname})
    with pytest.raises(rc.Refused, match="fabric_ifname must be a network interface name"):
        rc.load_config(text)


# --------------------------------------------------------------------------------------------
# docker inspect
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(
            inspect_output("running"),
            rc.ContainerFacts("running", None, "2026-12-01T08:03:17.482613054Z", None, 0, False),
            id="running-never-finished",
        ),
        pytest.param(
            inspect_output("exited_137_oom"),
            rc.ContainerFacts(
                "exited", 137, "2026-12-01T08:03:17.482613054Z", "2026-12-01T09:14:02.530981177Z", 0, True
            ),
            id="exited-137-oom-killed",
        ),
        pytest.param(
            inspect_output("restarting"),
            rc.ContainerFacts(
                "restarting", 1, "2026-12-01T09:20:41.118204833Z", "2026-12-01T09:20:58.904417210Z", 3, False
            ),
            id="restarting",
        ),
        pytest.param(
            inspect_output("created"),
            rc.ContainerFacts("created", None, None, None, 0, False),
            id="created-never-started",
        ),
        pytest.param(MISSING_CLI, rc.MISSING, id="missing-cli-wording"),
        pytest.param(MISSING_DAEMON, rc.MISSING, id="missing-daemon-wording"),
        pytest.param(MISSING_OBJECT, rc.MISSING, id="missing-object-wording"),
    ],
)
def test_parse_inspect(result: rc.CommandResult, expected: rc.ContainerFacts) -> None:
    assert rc.parse_inspect(result) == expected


@pytest.mark.parametrize(
    ("result", "message"),
    [
        pytest.param(DAEMON_DOWN, "Cannot connect to the Docker daemon", id="daemon-down"),
        pytest.param(rc.CommandResult(124, "", "timed out after 20s"), "rc=124", id="timeout"),
        pytest.param(rc.CommandResult(0, "not json", ""), "no JSON", id="garbage"),
        pytest.param(rc.CommandResult(0, "[]", ""), "exactly one", id="empty-list-rc0"),
        pytest.param(rc.CommandResult(0, '[{"State": {}}, {"State": {}}]', ""), "exactly one", id="two"),
        pytest.param(rc.CommandResult(0, '[{"Name": "/x"}]', ""), "no State.Status", id="no-state"),
    ],
)
def test_parse_inspect_does_not_mistake_a_docker_failure_for_a_missing_container(result, message) -> None:
    with pytest.raises(rc.DockerError, match=message):
        rc.parse_inspect(result)


def test_parse_meminfo_and_kill_record() -> None:
    assert rc.parse_meminfo(MEMINFO) == 2411724 * KIB
    assert rc.parse_meminfo("MemAvailable: 42\n") == 42
    with pytest.raises(ValueError, match="no MemAvailable"):
        rc.parse_meminfo("MemTotal: 1 kB\n")
    assert rc.parse_kill_record("1764579600.125\n") == 1764579600.125
    for bad in ("", "soon", "nan", "inf"):
        with pytest.raises(ValueError):
            rc.parse_kill_record(bad)


# --------------------------------------------------------------------------------------------
# status
# --------------------------------------------------------------------------------------------


def status(config: rc.Config, docker: FakeDocker) -> tuple[int, dict]:
    return rc.do_status(config, docker, hostname="spark-b", clock=lambda: NOW)


def test_status_of_a_running_rank(config: rc.Config) -> None:
    docker = FakeDocker(inspect_output("running"))
    code, doc = status(config, docker)
    assert code == 0
    assert doc == {
        "node": "spark-b",
        "container": "dsv41-r1",
        "state": "running",
        "exit_code": None,
        "started_at": "2026-12-01T08:03:17.482613054Z",
        "finished_at": None,
        "restart_count": 0,
        "oom_killed": False,
        "boot_id": BOOT_ID,
        "mem_available_bytes": 2411724 * KIB,
        "memguard_last_kill": None,
        "fabric": None,
        "time": NOW,
    }
    assert docker.calls == [(["docker", "inspect", "--type", "container", "dsv41-r1"], rc.INSPECT_TIMEOUT)]


def test_status_of_an_oom_killed_rank_with_a_memguard_record(config: rc.Config) -> None:
    config.kill_record.write_text("1764580442.500\n")
    code, doc = status(config, FakeDocker(inspect_output("exited_137_oom")))
    assert code == 0
    assert (doc["state"], doc["exit_code"], doc["oom_killed"]) == ("exited", 137, True)
    assert doc["finished_at"] == "2026-12-01T09:14:02.530981177Z"
    assert doc["memguard_last_kill"] == 1764580442.5


def test_status_of_a_missing_container(config: rc.Config) -> None:
    code, doc = status(config, FakeDocker(MISSING_CLI))
    assert code == 0
    assert (doc["state"], doc["exit_code"], doc["started_at"], doc["restart_count"]) == (
        "missing",
        None,
        None,
        0,
    )


def test_a_malformed_kill_record_still_reports_a_kill(config: rc.Config) -> None:
    config.kill_record.write_text("garbage")
    os.utime(config.kill_record, (1764580000, 1764580000))
    _, doc = status(config, FakeDocker(inspect_output("running")))
    assert doc["memguard_last_kill"] == 1764580000


def test_status_when_docker_does_not_answer_still_reports_the_node(config: rc.Config) -> None:
    code, doc = status(config, FakeDocker(DAEMON_DOWN))
    assert code == 1
    assert doc["state"] == "unknown"
    assert "Cannot connect to the Docker daemon" in doc["error"]
    assert (doc["boot_id"], doc["mem_available_bytes"]) == (BOOT_ID, 2411724 * KIB)


def test_status_with_unreadable_proc_files(config: rc.Config, tmp_path: Path) -> None:
    config = rc.Config(
        config.container, config.state_dir, meminfo=tmp_path / "nope", boot_id=tmp_path / "nope"
    )
    _, doc = status(config, FakeDocker(inspect_output("running")))
    assert (doc["boot_id"], doc["mem_available_bytes"]) == (None, None)


# --------------------------------------------------------------------------------------------
# The fabric link, from a fake sysfs tree
# --------------------------------------------------------------------------------------------

EINVAL = "EINVAL"  # a carrier file the kernel refuses to read: the link is administratively down
NO_FILE = "no file"  # the interface is listed, without that file


def fake_sysfs_net(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operstate: str | None, carrier: object
) -> Path:
    """``<tmp>/sys/class/net`` with lo and, unless operstate is None, IFNAME's operstate and carrier."""
    net = tmp_path / "sys" / "class" / "net"
    (net / "lo").mkdir(parents=True)
    (net / "lo" / "operstate").write_text("unknown\n")  # another interface: only IFNAME counts
    (net / "lo" / "carrier").write_text("1\n")
    if operstate is None:
        return net
    device = net / IFNAME
    device.mkdir()
    if operstate != NO_FILE:
        (device / "operstate").write_text(f"{operstate}\n")
    if carrier == EINVAL:
        (device / "carrier").write_text("1\n")  # readable, it would say up: only the error says otherwise
        real_read_text = Path.read_text

        def read_text(path: Path, *args: object, **kwargs: object) -> str:
            if path == device / "carrier":
                raise OSError(errno.EINVAL, "Invalid argument", str(path))
            return real_read_text(path, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(Path, "read_text", read_text)
    elif carrier != NO_FILE:
        (device / "carrier").write_text(f"{carrier}\n")
    return net


@pytest.mark.parametrize(
    ("operstate", "carrier", "expected"),
    [
        pytest.param("up", 1, ("up", 1, True), id="up"),
        pytest.param("down", 0, ("down", 0, False), id="cable-out"),
        pytest.param("down", EINVAL, ("down", None, False), id="administratively-down-einval"),
        pytest.param("lowerlayerdown", 0, ("lowerlayerdown", 0, False), id="lowerlayerdown"),
        pytest.param("up", 0, ("up", 0, False), id="up-without-carrier"),
        pytest.param("dormant", 1, ("dormant", 1, False), id="dormant"),
        pytest.param("unknown", 1, ("unknown", 1, False), id="operstate-unknown"),
        pytest.param("up", "garbage", ("up", None, False), id="carrier-garbage"),
        pytest.param("up", NO_FILE, ("up", None, False), id="no-carrier-file"),
        pytest.param(NO_FILE, 1, ("unknown", 1, False), id="no-operstate-file"),
        pytest.param("", 1, ("unknown", 1, False), id="empty-operstate"),
        pytest.param(None, None, ("missing", None, False), id="missing-interface"),
    ],
)
def test_read_fabric(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, operstate, carrier, expected: tuple
) -> None:
    net = fake_sysfs_net(tmp_path, monkeypatch, operstate, carrier)
    got = rc.read_fabric(net, IFNAME)
    assert got == dict(zip(("ifname", "operstate", "carrier", "up"), (IFNAME, *expected), strict=True))


@pytest.mark.parametrize(
    ("link", "expected"),
    [
        pytest.param(("up", 1), {"ifname": IFNAME, "operstate": "up", "carrier": 1, "up": True}, id="up"),
        pytest.param(
            ("down", EINVAL),
            {"ifname": IFNAME, "operstate": "down", "carrier": None, "up": False},
            id="administratively-down",
        ),
        pytest.param(
            (None, None),
            {"ifname": IFNAME, "operstate": "missing", "carrier": None, "up": False},
            id="missing",
        ),
    ],
)
@pytest.mark.parametrize("docker_answers", [True, False], ids=["docker-answers", "docker-down"])
def test_status_reports_the_fabric(
    config: rc.Config,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    link: tuple,
    expected: dict,
    *,
    docker_answers: bool,
) -> None:
    net = fake_sysfs_net(tmp_path, monkeypatch, *link)
    config = dataclasses.replace(config, fabric_ifname=IFNAME, sysfs_net=net)
    code, doc = status(config, FakeDocker(inspect_output("running") if docker_answers else DAEMON_DOWN))
    assert code == (0 if docker_answers else 1)  # the fabric never changes the exit code
    assert doc["fabric"] == expected
    json.dumps(doc, allow_nan=False)


def test_status_without_a_fabric_reads_no_sysfs(config: rc.Config, tmp_path: Path) -> None:
    config = dataclasses.replace(config, sysfs_net=tmp_path / "nowhere")
    _, doc = status(config, FakeDocker(inspect_output("running")))
    assert doc["fabric"] is None


# --------------------------------------------------------------------------------------------
# start / stop
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inspect", "results", "ok", "verbs", "detail"),
    [
        pytest.param(
            inspect_output("running"), {}, True, ["inspect"], "already running", id="already-running"
        ),
        pytest.param(
            inspect_output("exited_137_oom"), {}, True, ["inspect", "start"], "started", id="exited"
        ),
        pytest.param(inspect_output("created"), {}, True, ["inspect", "start"], "was created", id="created"),
        pytest.param(MISSING_CLI, {}, False, ["inspect"], "does not exist", id="missing"),
        pytest.param(DAEMON_DOWN, {}, False, ["inspect"], "Cannot connect", id="daemon-down"),
        pytest.param(
            inspect_output("exited_137_oom"),
            {
                "start": rc.CommandResult(
                    1, "", "Error response from daemon: could not select device driver\n"
                )
            },
            False,
            ["inspect", "start"],
            "docker start dsv41-r1 failed (rc=1): Error response from daemon: could not select device driver",
            id="start-fails",
        ),
    ],
)
def test_start(config: rc.Config, inspect, results, *, ok: bool, verbs: list[str], detail: str) -> None:
    docker = FakeDocker(inspect, **results)
    got_ok, got_detail = rc.do_start(config, docker)
    assert (got_ok, docker.verbs()) == (ok, verbs)
    assert detail in got_detail
    if "start" in verbs:
        assert docker.calls[-1] == (["docker", "start", "dsv41-r1"], rc.START_TIMEOUT)


@pytest.mark.parametrize(
    ("inspect", "results", "ok", "verbs", "detail"),
    [
        pytest.param(inspect_output("running"), {}, True, ["inspect", "stop"], "stopped", id="running"),
        pytest.param(
            inspect_output("restarting"), {}, True, ["inspect", "stop"], "was restarting", id="restarting"
        ),
        pytest.param(MISSING_CLI, {}, True, ["inspect"], "does not exist", id="missing-is-fine"),
        pytest.param(inspect_output("exited_137_oom"), {}, True, ["inspect"], "already exited", id="exited"),
        pytest.param(inspect_output("created"), {}, True, ["inspect"], "already created", id="created"),
        pytest.param(DAEMON_DOWN, {}, False, ["inspect"], "Cannot connect", id="daemon-down"),
        pytest.param(
            inspect_output("running"),
            {"stop": rc.CommandResult(124, "", "timed out after 60s")},
            False,
            ["inspect", "stop"],
            "failed (rc=124): timed out",
            id="stop-times-out",
        ),
        pytest.param(
            inspect_output("running"),
            {"stop": MISSING_DAEMON},
            True,
            ["inspect", "stop"],
            "does not exist",
            id="removed-meanwhile",
        ),
    ],
)
def test_stop(config: rc.Config, inspect, results, *, ok: bool, verbs: list[str], detail: str) -> None:
    docker = FakeDocker(inspect, **results)
    got_ok, got_detail = rc.do_stop(config, docker)
    assert (got_ok, docker.verbs()) == (ok, verbs)
    assert detail in got_detail
    if "stop" in verbs:
        assert docker.calls[-1] == (["docker", "stop", "--time", "30", "dsv41-r1"], rc.STOP_TIMEOUT)
        assert rc.STOP_TIMEOUT > rc.STOP_GRACE_SECONDS


NOT_RUNNING = rc.CommandResult(
    1,
    "",
    "Error response from daemon: Cannot kill container: dsv41-r1: Container"
    " c334b1ddfd195ffdd0a6b1288f6a6b75417603caf23c389a9af740cdc161457f is not running\n",
)


@pytest.mark.parametrize(
    ("inspect", "results", "ok", "verbs", "detail"),
    [
        pytest.param(inspect_output("running"), {}, True, ["inspect", "kill"], "killed", id="running"),
        pytest.param(inspect_output("paused"), {}, True, ["inspect", "kill"], "was paused", id="paused"),
        pytest.param(MISSING_CLI, {}, True, ["inspect"], "does not exist", id="missing-is-fine"),
        pytest.param(inspect_output("exited_137_oom"), {}, True, ["inspect"], "already exited", id="exited"),
        pytest.param(DAEMON_DOWN, {}, False, ["inspect"], "Cannot connect", id="daemon-down"),
        pytest.param(
            inspect_output("running"),
            {"kill": NOT_RUNNING},
            True,
            ["inspect", "kill"],
            "exited",
            id="exited-meanwhile",
        ),
        pytest.param(
            inspect_output("running"),
            {"kill": MISSING_DAEMON},
            True,
            ["inspect", "kill"],
            "does not exist",
            id="removed-meanwhile",
        ),
        pytest.param(
            inspect_output("running"),
            {"kill": rc.CommandResult(124, "", "timed out after 60s")},
            False,
            ["inspect", "kill"],
            "docker kill dsv41-r1 failed (rc=124): timed out",
            id="kill-times-out",
        ),
    ],
)
def test_kill(config: rc.Config, inspect, results, *, ok: bool, verbs: list[str], detail: str) -> None:
    """A hung rank is killed: no grace period, which a frozen engine would only wait out."""
    docker = FakeDocker(inspect, **results)
    got_ok, got_detail = rc.do_kill(config, docker)
    assert (got_ok, docker.verbs()) == (ok, verbs)
    assert detail in got_detail
    if "kill" in verbs:
        assert docker.calls[-1] == (["docker", "kill", "dsv41-r1"], rc.STOP_TIMEOUT)


@pytest.mark.parametrize(("verb", "code"), [("start", 0), ("stop", 0), ("kill", 0), ("status", 0)])
def test_run_verb_documents(config: rc.Config, verb: str, code: int) -> None:
    got_code, doc = rc.run_verb(
        verb, config, FakeDocker(inspect_output("running")), hostname="spark-b", clock=lambda: NOW
    )
    assert got_code == code
    if verb != "status":
        assert set(doc) == {"verb", "ok", "detail"} and doc["verb"] == verb and doc["ok"] is True


def test_run_command_times_out_and_reports_a_missing_binary(tmp_path: Path) -> None:
    started = time.monotonic()
    result = rc.run_command([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert result.returncode == 124 and "timed out" in result.stderr
    assert time.monotonic() - started < 5
    assert rc.run_command([str(tmp_path / "no-docker")], 5).returncode == 127


# --------------------------------------------------------------------------------------------
# The program, as the forced command runs it
# --------------------------------------------------------------------------------------------

FAKE_DOCKER = """\
#!{python}
import json, pathlib, sys
here = pathlib.Path(__file__).resolve().parent
with (here / "calls.jsonl").open("a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "inspect":
    sys.stdout.write((here / "inspect.json").read_text())
else:
    print(sys.argv[-1])
"""


@pytest.fixture
def installed(tmp_path: Path, config: rc.Config) -> Path:
    """A config file pointing at a fake docker (an executable recording its argv) and fake /proc."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    (bin_dir / "inspect.json").write_text((FIXTURES / "inspect_exited_137_oom.json").read_text())
    path = tmp_path / "rankctl.json"
    path.write_text(
        json.dumps(
            {
                "container": config.container,
                "state_dir": str(config.state_dir),
                "docker": str(docker),
                "meminfo": str(config.meminfo),
                "boot_id": str(config.boot_id),
            }
        )
    )
    return path


def docker_calls(config_path: Path) -> list[list[str]]:
    calls = config_path.parent / "bin" / "calls.jsonl"
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def run_program(config_path: Path, *args: str, ssh: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SSH_ORIGINAL_COMMAND"}
    if ssh is not None:
        env["SSH_ORIGINAL_COMMAND"] = ssh
    argv = [sys.executable, str(PROGRAM), "--config", str(config_path), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(
    ("operstate", "carrier", "expected"),
    [
        pytest.param("up", "1", {"ifname": IFNAME, "operstate": "up", "carrier": 1, "up": True}, id="up"),
        pytest.param(
            "lowerlayerdown",
            "0",
            {"ifname": IFNAME, "operstate": "lowerlayerdown", "carrier": 0, "up": False},
            id="lowerlayerdown",
        ),
        pytest.param(
            None, None, {"ifname": IFNAME, "operstate": "missing", "carrier": None, "up": False}, id="missing"
        ),
    ],
)
def test_forced_command_status_reports_the_fabric(
    installed: Path, tmp_path: Path, operstate: str | None, carrier: str | None, expected: dict
) -> None:
    net = tmp_path / "sysfs" / "class" / "net"
    net.mkdir(parents=True)
    if operstate is not None:
        (net / IFNAME).mkdir()
        (net / IFNAME / "operstate").write_text(f"{operstate}\n")
        (net / IFNAME / "carrier").write_text(f"{carrier}\n")
    doc = json.loads(installed.read_text())
    installed.write_text(json.dumps({**doc, "fabric_ifname": IFNAME, "sysfs_net": str(net)}))
    done = run_program(installed, ssh="status")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["fabric"] == expected


def test_forced_command_status_from_ssh_original_command(installed: Path) -> None:
    done = run_program(installed, ssh="status")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert done.stdout.count("\n") == 1
    assert (doc["state"], doc["exit_code"], doc["oom_killed"], doc["boot_id"]) == (
        "exited",
        137,
        True,
        BOOT_ID,
    )
    assert isinstance(doc["node"], str) and doc["node"]
    assert doc["time"] == pytest.approx(time.time(), abs=60)
    assert docker_calls(installed) == [["inspect", "--type", "container", "dsv41-r1"]]


@pytest.mark.parametrize(
    ("args", "ssh", "argv"),
    [
        pytest.param([], "start", ["start", "dsv41-r1"], id="start-over-ssh"),
        pytest.param(["start"], None, ["start", "dsv41-r1"], id="start-locally"),
    ],
)
def test_forced_command_start(installed: Path, args: list[str], ssh: str | None, argv: list[str]) -> None:
    done = run_program(installed, *args, ssh=ssh)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"verb": "start", "ok": True, "detail": "started dsv41-r1 (was exited)"}
    assert docker_calls(installed)[-1] == argv


@pytest.mark.parametrize(
    "ssh",
    [
        pytest.param("status; rm -rf /", id="chained"),
        pytest.param("stop\nrm -rf /", id="newline"),
        pytest.param("sh -c reboot", id="shell"),
        pytest.param("", id="empty"),
    ],
)
def test_forced_command_refuses_anything_else_and_runs_nothing(installed: Path, ssh: str) -> None:
    done = run_program(installed, ssh=ssh)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "refused" in done.stderr and "only status, start, stop, kill are allowed" in done.stderr
    assert docker_calls(installed) == []


def test_no_verb_at_all_is_refused(installed: Path) -> None:
    done = run_program(installed)
    assert done.returncode == 2 and "no verb" in done.stderr
    assert docker_calls(installed) == []


def test_extra_arguments_are_a_usage_error(installed: Path) -> None:
    done = run_program(installed, "status", "extra")
    assert done.returncode == 2 and "unrecognized arguments" in done.stderr
    assert docker_calls(installed) == []


def test_bad_config_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "rankctl.json"
    path.write_text('{"container": "dsv41-r1", "state_dir": "relative"}')
    done = run_program(path, "status")
    assert done.returncode == 2
    assert "state_dir must be an absolute path" in done.stderr
    done = run_program(tmp_path / "absent.json", "status")
    assert done.returncode == 2 and "cannot read config" in done.stderr


def test_main_docker_failure_exits_1_with_a_document(
    config: rc.Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rankctl.json"
    path.write_text(
        json.dumps(
            {
                "container": "dsv41-r1",
                "state_dir": str(config.state_dir),
                "meminfo": str(config.meminfo),
                "boot_id": str(config.boot_id),
            }
        )
    )
    code = rc.main(
        ["--config", str(path), "stop"],
        {},
        run=FakeDocker(DAEMON_DOWN),
        hostname=lambda: "h",
        clock=lambda: NOW,
    )
    out, err = capsys.readouterr()
    assert code == 1
    assert json.loads(out)["ok"] is False
    assert "Cannot connect to the Docker daemon" in err
