# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The serving API key: generated once, kept on re-runs, handed to vLLM through a root-only env file.

Nothing here logs or returns the key; callers get a fingerprint instead.

Internal to sparkserve.dsv41; not a public API. Stdlib only.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import write_atomically

KEY_BYTES = 32
# token_urlsafe(32) yields 43 characters; 32 still admits `openssl rand -hex 16`-style keys.
MIN_KEY_LENGTH = 32
URL_SAFE_KEY = re.compile(r"[A-Za-z0-9_-]+")
EXPECTED_FORM = (
    f"one line of at least {MIN_KEY_LENGTH} URL-safe base64 characters (A-Z a-z 0-9 - _), "
    f"as written by secrets.token_urlsafe({KEY_BYTES})"
)
DEFAULT_ENV_VAR = "VLLM_API_KEY"  # what vLLM reads its bearer key from
ENV_FILE_MODE = 0o600  # root-only, whatever the key file's mode


class InvalidKeyFileError(ValueError):
    """The key file holds something that is not a plausible API key; it must not be overwritten."""


def generate_key() -> str:
    """32 random bytes, URL-safe base64 without padding."""
    return secrets.token_urlsafe(KEY_BYTES)


def fingerprint(key: str) -> str:
    """Identifies a key in output and logs without revealing it."""
    return hashlib.sha256(key.encode("ascii")).hexdigest()[:12]


def key_problem(candidate: str) -> str | None:
    """Why ``candidate`` (already stripped) is not a plausible key, or ``None`` when it is one.

    The message never quotes the candidate: it may be a secret of some other kind.
    """
    if any(char.isspace() for char in candidate):
        return "it contains whitespace inside the key"
    if not URL_SAFE_KEY.fullmatch(candidate):
        return "it contains characters outside A-Z a-z 0-9 - _"
    if len(candidate) < MIN_KEY_LENGTH:
        return f"it is {len(candidate)} characters long, at least {MIN_KEY_LENGTH} are needed"
    return None


def read_key(path: str, data: bytes) -> str | None:
    """The key stored in ``data`` (the content of ``path``), or ``None`` when the file is blank.

    Surrounding whitespace (a final newline) is allowed; anything else that is not a key raises
    ``InvalidKeyFileError`` so that an unrelated file given as ``path`` is never overwritten.
    """
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        problem: str | None = "it is not ASCII text"
    else:
        text = text.strip()
        if not text:
            return None
        problem = key_problem(text)
    if problem:
        raise InvalidKeyFileError(
            f"{path} does not hold an API key ({problem}); expected {EXPECTED_FORM}. "
            "The file was left untouched: move or delete it if it is not needed, then re-run "
            "to generate a new key."
        )
    return text


def key_file_content(key: str) -> bytes:
    """One line, so ``cat`` and ``$(cat ...)`` both behave."""
    return f"{key}\n".encode("ascii")


def env_file_content(env_var: str, key: str) -> bytes:
    """docker ``--env-file`` format; the key is URL-safe, so no quoting is needed."""
    return f"{env_var}={key}\n".encode("ascii")


@dataclass(frozen=True)
class KeyPlan:
    """The key to use and whether the key file must be (re)written to hold it."""

    key: str
    write: bool
    reason: str  # created | blank | rotated | kept


def plan_key(
    path: str,
    current: bytes | None,
    regenerate: str,
    generate: Callable[[], str] = generate_key,
) -> KeyPlan:
    """Decide the key: keep a valid existing one unless ``regenerate == 'always'``.

    ``current`` is the key file's content, ``None`` when it does not exist. Invalid content fails
    even with ``regenerate: always``: the path may point at a file that is not ours.
    """
    if current is None:
        return KeyPlan(key=generate(), write=True, reason="created")
    existing = read_key(path, current)
    if existing is None:
        return KeyPlan(key=generate(), write=True, reason="blank")
    if regenerate == "always":
        return KeyPlan(key=generate(), write=True, reason="rotated")
    return KeyPlan(key=existing, write=False, reason="kept")


def sync_private_file(module, file_args: dict, *, desired: bytes | None, current: bytes | None) -> bool:
    """Give ``file_args["path"]`` the ``desired`` content (``None``: keep it) and ``file_args``' attributes.

    ``file_args`` is what ``module.load_file_common_arguments`` returns (mode, owner, group,
    SELinux context, attributes). Returns whether anything changed (or would, in check mode).
    Writes only what differs, so a kept file keeps its mtime.
    """
    changed = False
    if desired is not None and desired != current:
        changed = True
        if not module.check_mode:
            write_atomically(module, file_args["path"], desired, file_args["mode"])
    return module.set_fs_attributes_if_different(file_args, changed)


def owner_and_group(path: str, owner: str | None, group: str | None) -> tuple[str, str]:
    """Names of the file's owner/group; for a file not written yet (check mode) the requested ones."""
    try:
        status = os.stat(path)
        uid, gid = status.st_uid, status.st_gid
    except FileNotFoundError:
        uid, gid = os.geteuid(), os.getegid()
        if owner or group:
            return owner or pwd.getpwuid(uid).pw_name, group or grp.getgrgid(gid).gr_name
    try:
        owner_name = pwd.getpwuid(uid).pw_name
    except KeyError:
        owner_name = str(uid)
    try:
        group_name = grp.getgrgid(gid).gr_name
    except KeyError:
        group_name = str(gid)
    return owner_name, group_name
