# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Reading, parsing and planning small text/JSON files the way this collection's modules do.

Internal to sparkserve.dsv41; not a public API. Stdlib only: runs on the managed node.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JSON_TYPE_NAMES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (type(None), "null"),
    (bool, "a boolean"),
    ((int, float), "a number"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
)


class FileContentError(ValueError):
    """A file exists but its content is not what the module can work with."""


def read_bytes(path: str) -> bytes | None:
    """The content of ``path``, or ``None`` when it does not exist; other ``OSError``s propagate."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def read_text(path: str, *, lenient: bool = False) -> str | None:
    """Return the UTF-8 text of ``path``, or ``None`` when it does not exist.

    Raises ``FileContentError`` for undecodable bytes unless ``lenient`` (then they are replaced,
    which is enough to see that a generated file must be rewritten); other ``OSError``s propagate.
    """
    data = read_bytes(path)
    if data is None:
        return None
    if lenient:
        return data.decode("utf-8", errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileContentError(f"{path} is not UTF-8 text (byte offset {err.start}): {err.reason}") from err


def load_json_object(path: str, text: str, *, empty_ok: bool = False) -> dict[str, Any]:
    """Parse ``text`` (read from ``path``) and require a JSON object at the top level.

    ``empty_ok`` treats a blank file as ``{}`` (editors and ``touch`` leave those behind).
    Errors name the file and the line/column, so the user can fix it by hand.
    """
    if empty_ok and not text.strip():
        return {}
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise FileContentError(
            f"{path} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno} "
            f"(character {err.pos}); fix or move the file, it was left untouched"
        ) from err
    if not isinstance(document, dict):
        raise FileContentError(
            f"{path} must hold a JSON object at the top level, found {json_type_name(document)}; "
            "it was left untouched"
        )
    return document


def dump_json(document: Any) -> str:
    """Serialise like the tools that own these files do: indent 2, keys in their order, final newline."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def json_type_name(value: Any) -> str:
    """The JSON name of a Python value's type, for error messages."""
    # bool before int: bool is a subclass of int.
    for python_type, name in JSON_TYPE_NAMES:
        if isinstance(value, python_type):
            return name
    return type(value).__name__


def missing_parent_dir(path: str) -> str | None:
    """The parent directory of ``path`` when it does not exist (or is no directory), else ``None``."""
    parent = os.path.dirname(os.path.abspath(path))
    return None if os.path.isdir(parent) else parent


def current_mode(path: str) -> int | None:
    """Permission bits of ``path``, or ``None`` when it does not exist."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def parse_mode(value: Any) -> int:
    """Accept an Ansible-style file mode: an octal string (``'0644'``) or an int (YAML ``0644``)."""
    if isinstance(value, bool):
        raise ValueError(f"mode must be an octal string such as '0644', got {value!r}")
    if isinstance(value, int):
        mode = value
    else:
        text = str(value).strip()
        if not re.fullmatch(r"0?[0-7]{3,4}|0o[0-7]{3,4}", text):
            raise ValueError(f"mode must be an octal string such as '0644', got {value!r}")
        mode = int(text.removeprefix("0o"), 8)
    if not 0 <= mode <= 0o7777:
        raise ValueError(f"mode must be between 0000 and 7777 (octal), got {value!r}")
    return mode


@dataclass(frozen=True)
class TextFilePlan:
    """What a module intends to do with one text file: ``before`` is ``None`` for a new file."""

    path: str
    before: str | None
    after: str

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self, before: str | None = None, after: str | None = None) -> dict[str, str]:
        """An Ansible diff entry; callers may pass redacted texts instead of the real ones."""
        return {
            "before_header": self.path if self.before is not None else f"{self.path} (absent)",
            "after_header": self.path,
            "before": (self.before or "") if before is None else before,
            "after": self.after if after is None else after,
        }
