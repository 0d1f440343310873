# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The EXL3 plan copy: the same plan with its ``qdir`` bank paths pointing at the container mount.

The plan in the checkpoint names its banks relative to ``exl3/`` (``qn:q31:q31s``); inside the
rank containers the checkpoint is mounted at ``/model``, so each node gets a copy whose ``qdir``
reads ``/model/exl3/qn:/model/exl3/q31:/model/exl3/q31s``. Every other field stays as it is.

Internal to sparkserve.dsv41; not a public API. Stdlib only.
"""

from __future__ import annotations

import posixpath
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    TextFilePlan,
    dump_json,
    json_type_name,
    load_json_object,
)

DEFAULT_BANK_ROOT = "/model/exl3"
QDIR_SEPARATOR = ":"


class QdirError(ValueError):
    """``qdir`` (or the bank root) cannot be rewritten."""


def bank_name(entry: str) -> str:
    """The last path component of one ``qdir`` entry: ``qn``, ``exl3/qn/`` and ``/x/exl3/qn`` -> ``qn``."""
    name = posixpath.basename(entry.strip().rstrip("/"))
    if name in ("", ".", ".."):
        raise QdirError(f"qdir entry {entry!r} names no bank directory")
    return name


def check_bank_root(bank_root: str) -> str:
    """``bank_root`` normalised; it must be absolute because it is a path inside the container."""
    if not isinstance(bank_root, str) or not posixpath.isabs(bank_root):
        raise QdirError(f"bank_root must be an absolute path inside the container, got {bank_root!r}")
    return posixpath.normpath(bank_root)


def rewrite_qdir(qdir: str, bank_root: str = DEFAULT_BANK_ROOT) -> str:
    """Point every ``:``-separated bank of ``qdir`` at ``<bank_root>/<bank>``.

    Idempotent: an already rewritten value maps to itself.
    """
    if not isinstance(qdir, str):
        raise QdirError(
            f"qdir must be a string of ':'-separated bank directories, got {json_type_name(qdir)}"
        )
    root = check_bank_root(bank_root)
    entries = qdir.split(QDIR_SEPARATOR)
    if any(not entry.strip() for entry in entries):
        raise QdirError(f"qdir {qdir!r} has an empty entry; expected bank directories such as 'qn:q31:q31s'")
    return QDIR_SEPARATOR.join(posixpath.join(root, bank_name(entry)) for entry in entries)


def rewrite_plan(plan: dict[str, Any], bank_root: str = DEFAULT_BANK_ROOT) -> dict[str, Any]:
    """A copy of ``plan`` with only ``qdir`` rewritten; key order is kept."""
    if "qdir" not in plan:
        raise QdirError("the plan has no 'qdir' field (expected bank directories such as 'qn:q31:q31s')")
    rewritten = dict(plan)
    rewritten["qdir"] = rewrite_qdir(plan["qdir"], bank_root)
    return rewritten


def plan_copy(
    src: str, src_text: str, dest: str, dest_text: str | None, bank_root: str
) -> tuple[TextFilePlan, str]:
    """The content ``dest`` must have (given the source plan's and the current ``dest`` text) and its qdir.

    Raises ``FileContentError`` naming ``src`` when the source plan cannot be used.
    """
    plan = load_json_object(src, src_text)
    try:
        rewritten = rewrite_plan(plan, bank_root)
    except QdirError as err:
        raise FileContentError(f"{src}: {err}") from err
    return TextFilePlan(path=dest, before=dest_text, after=dump_json(rewritten)), rewritten["qdir"]
