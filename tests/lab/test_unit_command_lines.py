"""systemd on a lab node reads back exactly the command lines the collection writes into units."""

from __future__ import annotations

import json
import shlex

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._systemd import systemd_exec

# Every character systemd treats specially in ExecStart=: whitespace, quotes, backslashes,
# specifiers (%) and variables ($).
AWKWARD_DIR = "/tmp/dsv41 unit %n $HOME dir"
ARGUMENTS = ["--log", f"{AWKWARD_DIR}/a log.txt", 'say "hi"', "back\\slash", "100%", "$USER", "plain-1.0"]
UNIT = "dsv41-command-line-test.service"


@pytest.fixture
def awkward_program(lab):
    """A program under a directory with a space, a specifier and a variable in its name, which
    writes the arguments it was given as JSON."""
    program = f"{AWKWARD_DIR}/echo args.py"
    script = "import json, sys\nopen('/tmp/dsv41-argv.json', 'w').write(json.dumps(sys.argv[1:]))\n"
    lab.ssh(
        "head",
        f"sudo mkdir -p {shlex.quote(AWKWARD_DIR)} && sudo tee {shlex.quote(program)} >/dev/null",
        input_text=script,
    )
    yield program
    lab.ssh(
        "head",
        f"sudo rm -rf {shlex.quote(AWKWARD_DIR)} /tmp/dsv41-argv.json /run/systemd/system/{UNIT};"
        " sudo systemctl daemon-reload",
        check=False,
    )


def test_systemd_gives_the_program_exactly_the_arguments_written(lab, awkward_program):
    exec_start = systemd_exec(["/usr/bin/python3", awkward_program, *ARGUMENTS])
    unit = f"[Service]\nType=oneshot\nExecStart={exec_start}\n"
    lab.ssh("head", f"sudo tee /run/systemd/system/{UNIT} >/dev/null", input_text=unit)
    lab.ssh("head", f"sudo systemctl daemon-reload && sudo systemctl start {UNIT}")
    received = json.loads(lab.ssh("head", "cat /tmp/dsv41-argv.json").stdout)
    assert received == ARGUMENTS, exec_start
