# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Command lines for systemd unit files.

Internal to sparkserve.dsv41; not a public API. systemd splits ``ExecStart=`` on whitespace,
honours double quotes and C-style backslash escapes inside them, and expands ``%`` specifiers
and ``$`` variables before it runs anything (systemd.service(5), "Command lines"): a path with a
space, a ``%`` or a ``$`` must be written so that systemd gives the program exactly that path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# Arguments made only of these need no quotes: systemd gives them to the program as they are.
_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def systemd_quote(argument: Any) -> str:
    """One argument as systemd reads it back: ``%`` and ``$`` doubled (no specifier, no
    variable), and anything but plain characters in double quotes with ``\\`` and ``"`` escaped."""
    text = str(argument)
    if "\n" in text or "\x00" in text:
        raise ValueError(f"a unit's command line cannot carry a newline or NUL: {text!r}")
    text = text.replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_exec(argv: Sequence[Any]) -> str:
    """An ``ExecStart=`` value that runs ``argv`` exactly; the program must be an absolute path."""
    if isinstance(argv, str | bytes) or not argv:
        raise ValueError(f"systemd_exec wants a non-empty list of arguments, got {argv!r}")
    if not str(argv[0]).startswith("/"):
        raise ValueError(f"systemd runs programs by absolute path, got {argv[0]!r}")
    return " ".join(systemd_quote(argument) for argument in argv)
