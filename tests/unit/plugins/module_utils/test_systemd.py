"""Unit command lines: each argument quoted the way systemd.service(5) reads ExecStart= back.

tests/lab/test_unit_command_lines.py has systemd itself run such a line on a lab node."""

from __future__ import annotations

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._systemd import systemd_exec, systemd_quote


@pytest.mark.parametrize(
    ("argument", "written"),
    [
        pytest.param("/opt/sparkserve/dsv41.py", "/opt/sparkserve/dsv41.py", id="plain"),
        pytest.param("--floor-gib", "--floor-gib", id="option"),
        pytest.param(8, "8", id="number"),
        pytest.param("/home/spark user/state", '"/home/spark user/state"', id="space"),
        pytest.param('a "b"', '"a \\"b\\""', id="quotes"),
        pytest.param("c:\\x", '"c:\\\\x"', id="backslash"),
        pytest.param("/srv/%h", '"/srv/%%h"', id="specifier"),
        pytest.param("$HOME/x", '"$$HOME/x"', id="variable"),
        pytest.param("", '""', id="empty"),
    ],
)
def test_each_argument_is_written_as_systemd_reads_it_back(argument, written):
    assert systemd_quote(argument) == written


def test_a_command_line_joins_the_quoted_arguments():
    argv = ["/usr/bin/python3", "/opt/a b/guard.py", "--log", "/state/memguard.log"]
    assert systemd_exec(argv) == '/usr/bin/python3 "/opt/a b/guard.py" --log /state/memguard.log'


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param([], "non-empty list", id="empty"),
        pytest.param("/usr/bin/python3 x", "non-empty list", id="a-string"),
        pytest.param(["python3", "x"], "absolute path, got 'python3'", id="relative-program"),
        pytest.param(["/bin/echo", "a\nExecStartPost=/bin/rm"], "newline", id="newline-injection"),
    ],
)
def test_what_systemd_cannot_run_as_given_is_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        systemd_exec(argv)
