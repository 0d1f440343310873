# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""An ed25519 SSH key pair made once with ssh-keygen and kept: what to do, and how to call it.

Internal to sparkserve.dsv41; not a public API. Stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One line as ssh-keygen writes it: the type, the base64 key and an optional comment.
PUBLIC_KEY_LINE = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]+={0,3}(?: [^\r\n]*)?")


@dataclass(frozen=True)
class KeyPairPlan:
    """``keep`` both files, ``restore`` the public key file (to ``public_key``), or ``generate`` both."""

    action: str
    public_key: str | None = None


def public_key_line(text: str | None) -> str | None:
    """The public key in ``text`` (one line, surrounding whitespace stripped), or ``None``."""
    line = (text or "").strip()
    return line if PUBLIC_KEY_LINE.fullmatch(line) else None


def key_material(line: str) -> str:
    """A public key line without its comment: what tells two keys apart."""
    return " ".join(line.split()[:2])


def plan_keypair(derived: str | None, public_text: str | None, comment: str) -> KeyPairPlan:
    """What a run does, given the public key derived from the private key (``None``: there is no
    private key) and the public key file's text: a private key is never replaced, only a public key
    file that is missing, damaged or of another key written again (with ``comment`` when the
    private key holds none)."""
    if derived is None:
        return KeyPairPlan("generate")
    public_key = public_key_line(public_text)
    if public_key is not None and key_material(public_key) == key_material(derived):
        return KeyPairPlan("keep", public_key)
    restored = derived if len(derived.split()) > 2 else f"{derived} {comment}".strip()
    return KeyPairPlan("restore", restored)


def generate_argv(ssh_keygen: str, path: str, comment: str) -> list[str]:
    """ssh-keygen quietly making an ed25519 pair at ``path`` without a passphrase."""
    return [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path]


def derive_argv(ssh_keygen: str, path: str) -> list[str]:
    """ssh-keygen printing the public key of the private key at ``path``; an empty passphrase, so a
    protected key fails at once instead of prompting."""
    return [ssh_keygen, "-y", "-P", "", "-f", path]


def comment_problem(comment: str) -> str | None:
    """Why ``comment`` cannot end a public key line, or ``None``."""
    if "\n" in comment or "\r" in comment:
        return "it contains a line break, which would split the authorized_keys line"
    return None
