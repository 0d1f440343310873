#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: generate the serving API key once and keep it; never show it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: api_key
short_description: Generate the bearer key of the vLLM endpoint once, keep it, and never show it
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Creates the API key file with a new key and mode C(0600) when the file is missing or blank. The key
    is 32 random bytes from Python's C(secrets), URL-safe base64 without padding (what
    C(secrets.token_urlsafe) returns for 32 bytes), followed by a newline.
  - Keeps an existing key untouched (same bytes, same mtime) unless O(regenerate=always). Fixes the
    key file's mode (O(mode), C(0600) by default), owner, group and SELinux context (the file options)
    when they differ.
  - Fails without touching the file when it holds something that is not a plausible key (whitespace
    inside, characters outside C(A-Z a-z 0-9 - _), fewer than 32 characters, not text), so a wrong
    O(path) never destroys an unrelated file.
  - Optionally writes a root-only environment file for the rank containers (docker C(--env-file)
    format, C(VLLM_API_KEY=<key>)) so the key reaches vLLM without ever being on a command line.
    The key is always read from the key file, never from a module argument.
  - The key never appears in the result, in diffs or in verbose output; the result carries a
    fingerprint (the first 12 hex digits of its SHA-256) instead.
options:
  path:
    description:
      - The key file, normally C(<state dir>/api_key).
      - Its directory must exist (the role creates it with mode C(0700)).
    type: path
    required: true
  regenerate:
    description:
      - V(never) keeps a valid existing key; V(always) replaces it with a new one on every run (key
        rotation - the ranks need a restart to pick it up, which the env file change triggers).
    type: str
    choices: [never, always]
    default: never
  mode:
    description:
      - Permissions of the key file, octal (quote it in YAML, for example V('0600')) or symbolic.
      - The environment file is always C(0600).
    type: raw
    default: '0600'
  owner:
    description:
      - Owner of the key file and, unless O(env_file_owner) is set, of the environment file.
      - Unset keeps the owner a new file gets from the user running the module.
    type: str
  group:
    description:
      - Group of the key file and, unless O(env_file_group) is set, of the environment file.
    type: str
  env_file:
    description:
      - Environment file to (re)write as C(<env_var>=<key>) with mode C(0600), only when its content
        differs. Its directory must exist.
      - Unset manages the key file only.
    type: path
  env_var:
    description:
      - Variable name written to O(env_file). vLLM reads its bearer key from C(VLLM_API_KEY).
    type: str
    default: VLLM_API_KEY
  env_file_owner:
    description:
      - Owner of O(env_file) when it must differ from O(owner), for example V(root) for a root-only file.
      - Requires O(env_file).
    type: str
  env_file_group:
    description:
      - Group of O(env_file) when it must differ from O(group).
      - Requires O(env_file).
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.files
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
    details: No diff is returned, because it would contain the key.
  platform:
    platforms: posix
notes:
  - In check mode a key that would be generated has no fingerprint yet; RV(fingerprint) is then V(null).
"""

EXAMPLES = r"""
- name: Make sure the API key exists (generated once, kept afterwards)
  sparkserve.dsv41.api_key:
    path: "{{ deployment_state_dir }}/api_key"

- name: Key owned by the operator, env file for the rank containers owned by root
  become: true
  sparkserve.dsv41.api_key:
    path: /home/ubuntu/.dsv41-two-sparks/api_key
    owner: ubuntu
    group: ubuntu
    env_file: /etc/dsv41/rank.env
    env_file_owner: root
    env_file_group: root
  register: dsv41_key

- name: Rotate the key
  sparkserve.dsv41.api_key:
    path: "{{ deployment_state_dir }}/api_key"
    env_file: /etc/dsv41/rank.env
    regenerate: always
"""

RETURN = r"""
path:
  description: The key file.
  returned: always
  type: str
  sample: /home/ubuntu/.dsv41-two-sparks/api_key
mode:
  description:
    - Mode of the key file, octal (in check mode the current one; the requested one when the file
      does not exist yet).
  returned: always
  type: str
  sample: '0600'
owner:
  description: Owner of the key file (the requested one in check mode when the file does not exist yet).
  returned: always
  type: str
  sample: ubuntu
group:
  description: Group of the key file (the requested one in check mode when the file does not exist yet).
  returned: always
  type: str
  sample: ubuntu
fingerprint:
  description:
    - First 12 hex digits of the SHA-256 of the key, to tell keys apart without showing them.
    - V(null) in check mode when a new key would be generated.
  returned: always
  type: str
  sample: 3f9c2a71be04
env_file:
  description: The environment file, or V(null) when O(env_file) is not set.
  returned: always
  type: str
  sample: /etc/dsv41/rank.env
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._api_key import (
    DEFAULT_ENV_VAR,
    ENV_FILE_MODE,
    InvalidKeyFileError,
    env_file_content,
    fingerprint,
    key_file_content,
    owner_and_group,
    plan_key,
    sync_private_file,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    ENV_VAR_NAME,
    missing_parent_dir,
    mode_text,
    read_bytes,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "regenerate": {"type": "str", "choices": ["never", "always"], "default": "never"},
            # The file options (add_file_common_args) are the key file's; its mode defaults to private.
            "mode": {"type": "raw", "default": "0600"},
            "env_file": {"type": "path"},
            "env_var": {"type": "str", "default": DEFAULT_ENV_VAR},
            "env_file_owner": {"type": "str"},
            "env_file_group": {"type": "str"},
        },
        add_file_common_args=True,
        required_by={"env_file_owner": "env_file", "env_file_group": "env_file"},
        supports_check_mode=True,
    )
    params = module.params
    path: str = params["path"]
    env_file: str | None = params["env_file"]

    # Validate everything before touching anything.
    if not ENV_VAR_NAME.fullmatch(params["env_var"]):
        module.fail_json(msg=f"env_var {params['env_var']!r} is not a valid environment variable name")
    for option, file_path in (("path", path), ("env_file", env_file)):
        if file_path is None:
            continue
        if os.path.isdir(file_path):
            module.fail_json(msg=f"{option} {file_path} is a directory; give the path of the file itself")
        parent = missing_parent_dir(file_path)
        # In check mode the role's task before, which creates it, did not run for real.
        if parent and not module.check_mode:
            module.fail_json(
                msg=f"the directory of {option} does not exist: {parent}; create it first (mode 0700)",
                path=file_path,
            )
    if env_file is not None and os.path.abspath(env_file) == os.path.abspath(path):
        module.fail_json(msg="env_file must not be the key file itself", path=path)

    try:
        current_key_file = read_bytes(path)
        plan = plan_key(path, current_key_file, params["regenerate"])
        # Not a module argument, so Ansible cannot know it is secret: mask it in anything we print.
        module.no_log_values.add(plan.key)
        current_env_file = read_bytes(env_file) if env_file else None
    except InvalidKeyFileError as err:
        module.fail_json(msg=str(err), path=path)
    except OSError as err:
        module.fail_json(msg=f"cannot read {err.filename}: {err.strerror}", path=path)

    key_args = module.load_file_common_arguments(params)
    try:
        changed = sync_private_file(
            module,
            key_args,
            desired=key_file_content(plan.key) if plan.write else None,
            current=current_key_file,
        )
        if env_file:
            # The env file is read by root's docker, not by the key's user: it keeps options of its own
            # for owner and group (falling back to the key file's), is always 0600, and takes no SELinux
            # context or attributes from the file options, which describe the key file.
            env_args = module.load_file_common_arguments(
                {
                    "mode": ENV_FILE_MODE,
                    "owner": params["env_file_owner"] or params["owner"],
                    "group": params["env_file_group"] or params["group"],
                },
                path=env_file,
            )
            changed = (
                sync_private_file(
                    module,
                    env_args,
                    desired=env_file_content(params["env_var"], plan.key),
                    current=current_env_file,
                )
                or changed
            )
    except OSError as err:
        module.fail_json(msg=f"cannot write {err.filename or path}: {err.strerror}", path=path)

    owner, group = owner_and_group(path, params["owner"], params["group"])
    # A key generated in check mode is thrown away, so its fingerprint would identify nothing.
    key_exists = not (plan.write and module.check_mode)
    module.exit_json(
        changed=changed,
        path=path,
        mode=mode_text(path, key_args["mode"]),
        owner=owner,
        group=group,
        fingerprint=fingerprint(plan.key) if key_exists else None,
        env_file=env_file,
    )


if __name__ == "__main__":
    main()
