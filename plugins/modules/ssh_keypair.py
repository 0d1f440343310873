#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: an ed25519 SSH key pair made once and kept; returns its public key."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ssh_keypair
short_description: Make an ed25519 SSH key pair once, keep it, and return its public key
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Runs C(ssh-keygen) to make an ed25519 key pair without a passphrase at O(path) (private key,
    mode C(0600)) and C(<path>.pub) (public key) when O(path) does not exist, and returns the public
    key in the same task, so nothing has to read it back.
  - Never replaces an existing private key. Its public key is read from it on every run
    (C(ssh-keygen -y), with an empty passphrase, so that a protected key fails instead of
    prompting); a public key file that is missing, not one ed25519 public key line, or of another
    key is written again from it.
  - Owner and mode are the ones C(ssh-keygen) gives a new file as the user running the module
    (C(become) makes the pair root's).
options:
  path:
    description:
      - The private key file. Its directory must exist (the roles create it with mode C(0700)).
    type: path
    required: true
  comment:
    description:
      - The comment of a new key pair, as in C(authorized_keys), naming what the key is for; one line.
      - An existing pair keeps its comment. A public key restored from a private key that holds no
        comment gets this one.
    type: str
    default: ''
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
requirements:
  - C(ssh-keygen) (OpenSSH) on the node.
notes:
  - In check mode a pair that would be made has no public key yet; RV(public_key) is then V(null).
    That includes a pair whose directory does not exist yet (an earlier task would create it).
"""

EXAMPLES = r"""
- name: Create the supervisor's SSH key
  sparkserve.dsv41.ssh_keypair:
    path: /etc/sparkserve/supervisor_ed25519
    comment: sparkserve.dsv41 supervisor on head
  become: true
  register: supervisor_key

- name: Let that key in on a worker
  ansible.posix.authorized_key:
    user: spark
    key: "{{ supervisor_key.public_key }}"
  delegate_to: worker1
  when: supervisor_key.public_key is not none
"""

RETURN = r"""
path:
  description: The private key file.
  returned: always
  type: str
  sample: /etc/sparkserve/supervisor_ed25519
public_key:
  description:
    - The public key, one C(authorized_keys) line without the options.
    - V(null) in check mode when the pair would be made.
  returned: always
  type: str
  sample: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOr2vJq8d3kYwP0b7Hn5pF2mT6yXcQeR1sLgUaZi4oVt supervisor on head
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    missing_parent_dir,
    read_text,
    write_atomically,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._ssh_keypair import (
    comment_problem,
    derive_argv,
    generate_argv,
    plan_keypair,
    public_key_line,
)


def run_ssh_keygen(module: AnsibleModule, argv: list[str], path: str) -> str:
    """ssh-keygen's output; fails the module with its error when it does not succeed."""
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"ssh-keygen failed for {path}: {(err or out).strip()}", path=path, rc=rc)
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "comment": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    path: str = module.params["path"]
    comment: str = module.params["comment"]
    public_path = path + ".pub"

    # Validate everything before touching anything.
    problem = comment_problem(comment)
    if problem:
        module.fail_json(msg=f"comment cannot be used: {problem}", path=path)
    if os.path.isdir(path):
        module.fail_json(msg=f"path {path} is a directory; give the path of the private key file", path=path)
    parent = missing_parent_dir(path)
    if parent:
        if module.check_mode:
            # A directory an earlier task would create: the pair would be made in it.
            module.exit_json(changed=True, path=path, public_key=None)
        module.fail_json(
            msg=f"the directory of path does not exist: {parent}; create it first (mode 0700)", path=path
        )
    try:
        ssh_keygen = module.get_bin_path("ssh-keygen", required=True)
        derived = None
        if os.path.exists(path):
            # The public key the private key really has: reading it changes nothing (check mode too).
            derived = public_key_line(run_ssh_keygen(module, derive_argv(ssh_keygen, path), path))
            if derived is None:
                module.fail_json(
                    msg=f"{path} is not an ed25519 private key; move it away or set another path", path=path
                )
        plan = plan_keypair(derived, read_text(public_path, lenient=True), comment)
        if plan.action == "keep":
            module.exit_json(changed=False, path=path, public_key=plan.public_key)
        if plan.action == "restore":
            if not module.check_mode:
                write_atomically(module, public_path, (plan.public_key + "\n").encode(), 0o644)
            module.exit_json(changed=True, path=path, public_key=plan.public_key)
        if module.check_mode:
            module.exit_json(changed=True, path=path, public_key=None)
        run_ssh_keygen(module, generate_argv(ssh_keygen, path, comment), path)
        public_key = public_key_line(read_text(public_path, lenient=True))
    except OSError as err:
        module.fail_json(msg=f"cannot read or write {err.filename or path}: {err.strerror or err}", path=path)
    if public_key is None:
        module.fail_json(msg=f"ssh-keygen wrote no ed25519 public key to {public_path}", path=path)
    module.exit_json(changed=True, path=path, public_key=public_key)


if __name__ == "__main__":
    main()
