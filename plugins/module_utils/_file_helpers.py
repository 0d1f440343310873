# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The small files this collection's modules manage: reading, parsing, planning and writing them.

Internal to sparkserve.dsv41; not a public API. Stdlib only (no Ansible import): it runs on the
managed node, and pure code without an ``AnsibleModule`` such as ``_checkpoint`` uses it too.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from typing import Any

# A name a shell, docker's --env-file and printenv all take.
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


# --------------------------------------------------------------------------- reading


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


def current_mode(path: str) -> int | None:
    """Permission bits of ``path``, or ``None`` when it does not exist."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def mode_text(path: str, requested: int | str) -> str:
    """The permissions of ``path`` as octal text; ``requested`` (as given) while ``path`` does not exist.

    What a module reports as its file's mode: after the run the file's own, so a symbolic
    ``mode`` option shows as the bits it gave; in check mode a file not created yet has only the
    requested one.
    """
    mode = current_mode(path)
    if mode is not None:
        return f"{mode:04o}"
    return f"{requested:04o}" if isinstance(requested, int) else str(requested)


def missing_parent_dir(path: str) -> str | None:
    """The parent directory of ``path`` when it does not exist (or is no directory), else ``None``."""
    parent = os.path.dirname(os.path.abspath(path))
    return None if os.path.isdir(parent) else parent


# --------------------------------------------------------------------------- JSON


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


# --------------------------------------------------------------------------- planning and writing


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


def write_atomically(module, path: str, data: bytes, mode: int | str | None = None) -> None:
    """Replace ``path`` with ``data`` through a temporary file in the same directory.

    The temporary file is created 0600 (mkstemp), so a secret is never readable by others while
    it is written, and is given ``mode`` before the rename; a reader (or a crash) sees the old or
    the new content, never half of it.

    Without a module (``module=None``: pure code such as the checkpoint state and progress files)
    ``mode`` is an int and the rename is ``os.replace``, which keeps it.

    With a module ``mode`` is anything the ``mode`` file option takes (octal or symbolic): the
    module's ``set_mode_if_different`` applies it to the temporary file, so an invalid mode fails
    the module before ``path`` is touched. The rename is ``module.atomic_move`` (SELinux contexts,
    cross-device fallbacks, the ``unsafe_writes`` option when the module has it), which gives an
    existing file back its owner, group and mode; a new one gets ``mode`` (without one, the umask's
    permissions). An existing file looser than ``mode`` loses the extra permissions first, so the
    new content (a rotated key) is never readable by more than both modes allow. The caller applies
    the file's other attributes afterwards (``module.set_fs_attributes_if_different``, which also
    reports them in diff mode), as Ansible's own modules do. An error of the rename is raised as
    ``OSError``.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if module is None:
            if mode is not None:
                os.chmod(tmp_path, mode)
            os.replace(tmp_path, path)
        else:
            module.set_mode_if_different(tmp_path, mode, False)
            if mode is not None:
                _restrict_to(path, os.stat(tmp_path).st_mode & 0o7777)
            _move_into_place(module, tmp_path, path, mode)
    finally:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)


def _restrict_to(path: str, mode: int) -> None:
    """Take from an existing regular file the permissions ``mode`` lacks: atomic_move gives the new
    content the old file's mode until the caller applies ``mode``. A link is replaced, not followed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(info.st_mode) and info.st_mode & 0o7777 & ~mode:
        os.chmod(path, info.st_mode & 0o7777 & mode)


def _move_into_place(module, tmp_path: str, path: str, mode: int | str | None) -> None:
    """``module.atomic_move`` with a new file private from the start.

    atomic_move gives a new file the umask's permissions (0644 under the usual 022): a secret would
    be readable by others until its mode is applied, and stay so if setting its owner then failed.
    Moved under a private umask, a new file is 0600 until it gets ``mode`` here.
    """
    creating = not os.path.lexists(path)
    umask = os.umask(0o077) if creating else None
    try:
        module.atomic_move(tmp_path, path, unsafe_writes=bool(module.params.get("unsafe_writes")))
    except OSError:
        raise
    except Exception as err:  # atomic_move raises its failures as a plain Exception (ansible-core 2.17+)
        cause = err.__cause__
        reason = f"{err} ({cause.strerror or cause})" if isinstance(cause, OSError) else str(err)
        raise OSError(getattr(cause, "errno", None) or errno.EIO, reason, path) from err
    finally:
        if umask is not None:
            os.umask(umask)
    if umask is not None:
        if mode is None:
            os.chmod(path, 0o666 & ~umask)
        else:
            module.set_mode_if_different(path, mode, False)


@dataclass(frozen=True)
class DirectoryPlan:
    """A directory a module makes sure of: ``exists`` is whether it is there before the run."""

    path: str
    exists: bool

    @property
    def changed(self) -> bool:
        return not self.exists


def plan_directory(path: str) -> DirectoryPlan:
    """Whether ``path`` must be created; ``FileContentError`` when something else has its name."""
    if os.path.isdir(path):
        return DirectoryPlan(path, exists=True)
    if os.path.lexists(path):
        raise FileContentError(f"{path} exists and is not a directory; move it away, it was left untouched")
    return DirectoryPlan(path, exists=False)


def plan_text_file(path: str, content: str) -> TextFilePlan:
    """What writing ``content`` to ``path`` changes; ``FileContentError`` when ``path`` is a directory.

    Read leniently: a file of other bytes than the UTF-8 wanted is only ever replaced.
    """
    if os.path.isdir(path):
        raise FileContentError(f"{path} is a directory; give the path of the file itself")
    return TextFilePlan(path, read_text(path, lenient=True), content)


def remove_if_present(path: str) -> bool:
    """Remove a file; ``False`` when it was not there (someone removed it first: same outcome)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
