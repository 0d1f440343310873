# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""How the collection's modules that ask the Hugging Face hub reach it."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  token_file:
    description:
      - A file holding the hub token (for a private or gated repo). The token is read from it on
        the node, so that it is never a module argument, a command-line argument or an environment
        variable, and it is masked in anything the module returns.
      - Absent or empty file, or not set - no token.
    type: path
  endpoint:
    description:
      - The hub's URL. Empty - C(HF_ENDPOINT) from the environment, else C(https://huggingface.co).
      - Other C(HF_*) variables (C(HF_HUB_DISABLE_XET), a proxy) come from the task's environment.
    type: str
    default: ""
"""
