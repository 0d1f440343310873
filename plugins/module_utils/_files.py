# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Writing files the way every part of this collection does: atomically, mode first.

Internal to sparkserve.dsv41; not a public API. Stdlib only (no Ansible import), so pure code
such as ``_checkpoint`` can use it too.
"""

from __future__ import annotations

import os
import tempfile


def write_atomically(module, path: str, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` through a temporary file in the same directory.

    The temporary file is created 0600 (mkstemp), so a secret is never readable by others
    while it is written. With a ``module`` the rename is ``AnsibleModule.atomic_move`` (SELinux
    contexts, cross-device fallbacks); pure code without one (``module=None``, e.g. the
    checkpoint state and progress files) gets ``os.replace``. ``atomic_move`` gives a *new*
    file umask-derived permissions, hence ``mode`` is applied again after the move.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_path, mode)
        if module is None:
            os.replace(tmp_path, path)
        else:
            module.atomic_move(tmp_path, path)
    finally:
        if os.path.exists(tmp_path):
            os.unlink(tmp_path)
    if mode is not None:
        os.chmod(path, mode)
