#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: a role's directories and small files on a node, in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_files
short_description: Create a role's directories and write its programs and configuration files in one run
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Makes sure of several directories and text files on a node in one module run, where a loop of
    M(ansible.builtin.file) and M(ansible.builtin.copy) costs one module run per item (each about
    0.3 s over SSH), most of a no-op re-run's time.
  - Directories are created when missing, with their missing parents, which get the same owner,
    group and mode (as M(ansible.builtin.file) gives them); files are written whole, through a
    temporary file in the same directory and an atomic rename, only when their content differs.
  - Owner, group and mode of every entry are set when they differ, as the file options of
    M(ansible.builtin.file) set them; a path that is a symbolic link gets them on its target, as
    M(ansible.builtin.file) with its default C(follow=true) does.
  - Fails before changing anything when an entry's path is taken by something of the other kind (a
    file where a directory is wanted, or the reverse), or a file's directory is neither there nor
    in O(directories).
  - With O(units), also reports what systemd says of the role's services and whether each is as the
    role asks (RV(units)), read after the files are written, so that the task that enables and
    starts them need run only when one of them is not as asked or its unit file changed. A no-op
    re-run then costs no M(ansible.builtin.systemd_service) run per service.
  - Check mode changes nothing and reports what would change; diff mode shows each file's content
    before and after, and each directory that would be created.
options:
  directories:
    description:
      - The directories, created in the order given. An entry given twice counts once; the same path
        twice with other attributes fails before anything changes.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The directory.
        type: path
        required: true
      mode:
        description: Its permissions, octal (quote it in YAML) or symbolic.
        type: raw
      owner:
        description: Its owner; unset keeps the owner (a new directory gets the user running the module).
        type: str
      group:
        description: Its group; unset keeps the group.
        type: str
  files:
    description:
      - The files, written after the directories.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file.
        type: path
        required: true
      content:
        description:
          - Its whole content, as text (a program, a unit file, a configuration).
          - Take a role's file with C(lookup('ansible.builtin.file', name, rstrip=false)), so its final
            newline is kept, or a template with C(lookup('ansible.builtin.template', name)).
        type: str
        required: true
      mode:
        description: Its permissions, octal (quote it in YAML) or symbolic.
        type: raw
      owner:
        description: Its owner; unset keeps the owner (a new file gets the user running the module).
        type: str
      group:
        description: Its group; unset keeps the group.
        type: str
  secret_files:
    description:
      - Files whose content is a secret (a token), written after O(files) as they are, but whose
        content never appears in the module's arguments as logged, its result or its diffs (a diff
        says only that the secret changes).
      - An empty content writes an empty file.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: The file.
        type: path
        required: true
      content:
        description: Its whole content.
        type: str
        required: true
      mode:
        description: Its permissions, octal (quote it in YAML) or symbolic.
        type: raw
        default: '0600'
      owner:
        description: Its owner; unset keeps the owner (a new file gets the user running the module).
        type: str
      group:
        description: Its group; unset keeps the group.
        type: str
  units:
    description:
      - Systemd units whose state to report in RV(units), as C(systemctl show) gives it, with whether
        each is as asked.
      - Read only. Starting, stopping and enabling stay with M(ansible.builtin.systemd_service).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The unit's name.
        type: str
        required: true
      enabled:
        description:
          - Whether the role wants the unit enabled and running (as M(ansible.builtin.systemd_service)
            with C(enabled=true) and C(state=started) leaves it), or disabled and not running.
        type: bool
        default: true
notes:
  - The contents of O(files) appear in diffs; give secrets in O(secret_files). The API key, which
    this collection generates, has M(sparkserve.dsv41.api_key).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: posix
seealso:
  - module: ansible.builtin.copy
  - module: ansible.builtin.file
"""

EXAMPLES = r"""
- name: Install the memory guard program and its service
  sparkserve.dsv41.node_files:
    directories:
      - path: /opt/sparkserve
        mode: "0755"
        owner: root
        group: root
    files:
      - path: /opt/sparkserve/dsv41_memguard.py
        content: "{{ lookup('ansible.builtin.file', 'dsv41_memguard.py', rstrip=false) }}"
        mode: "0755"
        owner: root
        group: root
      - path: /etc/systemd/system/dsv41-memguard.service
        content: "{{ lookup('ansible.builtin.template', 'dsv41-memguard.service.j2') }}"
        mode: "0644"
        owner: root
        group: root
    units:
      - name: dsv41-memguard.service
  become: true
  register: memguard_files
  notify: Restart the memory guard

- name: Enable and start the memory guard when it is not, or its unit changed
  ansible.builtin.systemd_service:
    name: dsv41-memguard.service
    enabled: true
    state: started
    daemon_reload: "{{ memguard_files is changed }}"
  become: true
  when: memguard_files is changed or not memguard_files.units['dsv41-memguard.service'].as_asked
"""

RETURN = r"""
changed_paths:
  description: The directories and files created or changed (content, owner, group or mode), in order.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/dsv41-memguard.service]
units:
  description:
    - For each unit of O(units), by the name given, its C(LoadState), C(ActiveState) and
      C(UnitFileState) as C(systemctl show) reports them, after the files are written (a unit file
      this run changed is read as systemd knew it before a reload), and C(as_asked). A unit systemd
      does not know is C(not-found), C(inactive) and an empty C(unit_file_state).
    - C(as_asked) is true for a unit enabled (C(unit_file_state=enabled)) and C(active) when asked
      C(enabled=true), and for one C(disabled) and C(inactive) or C(failed) when asked C(enabled=false).
  returned: always
  type: dict
  sample:
    dsv41-memguard.service:
      load_state: loaded
      active_state: active
      unit_file_state: enabled
      as_asked: true
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    DirectoryPlan,
    FileContentError,
    TextFilePlan,
    missing_parent_dir,
    plan_directory,
    plan_text_file,
    write_atomically,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._node import (
    UNIT_PROPERTIES,
    parse_unit_states,
    unit_as_asked,
)

ENTRY_OPTIONS = {
    "path": {"type": "path", "required": True},
    "mode": {"type": "raw"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
}


def file_arguments(module: AnsibleModule, entry: dict, path: str | None = None) -> dict:
    """One entry's file options (at ``path`` if given), in the shape set_fs_attributes_if_different takes."""
    return module.load_file_common_arguments(
        {
            "path": path or entry["path"],
            "mode": entry["mode"],
            "owner": entry["owner"],
            "group": entry["group"],
            # As ansible.builtin.file: a link's target gets the attributes, not the link.
            "follow": True,
        }
    )


def missing_directories(path: str) -> list[str]:
    """``path`` and those of its parents that do not exist, outermost first."""
    missing: list[str] = []
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing[::-1]


def apply_directory(module: AnsibleModule, entry: dict, plan: DirectoryPlan) -> list[dict]:
    """Create the directory and set its attributes; the diff entries of what changed (none: nothing)."""
    diff = {"before": {"path": plan.path, "state": "directory" if plan.exists else "absent"},
            "after": {"path": plan.path, "state": "directory"}}  # fmt: skip
    if plan.changed and module.check_mode:
        return [diff]
    if plan.changed:
        # Missing parents too, each given the entry's owner, group and mode, as ansible.builtin.file
        # does: a module run as root must not leave root's directories in the deployment user's home.
        for created in missing_directories(plan.path):
            os.mkdir(created)
            module.set_fs_attributes_if_different(file_arguments(module, entry, created), True)
    changed = module.set_fs_attributes_if_different(file_arguments(module, entry), plan.changed, diff)
    return [diff] if changed else []


# What a diff of a secret file shows in place of its content.
REDACTED_BEFORE = "(a secret)\n"
REDACTED_AFTER = "(another secret)\n"


def apply_file(module: AnsibleModule, entry: dict, plan: TextFilePlan, secret: bool = False) -> list[dict]:
    """Write the file when its content differs and set its attributes; the diff entries of what changed."""
    redacted = {"before": REDACTED_BEFORE if plan.before is not None else "", "after": REDACTED_AFTER}
    diffs = [plan.diff(**(redacted if secret else {}))] if plan.changed else []
    if plan.before is None and module.check_mode:
        return diffs
    if plan.changed and not module.check_mode:
        write_atomically(module, plan.path, plan.after.encode("utf-8"), entry["mode"])
    # Attributes are a diff entry of their own: a text diff's before and after are strings.
    attributes: dict = {"before": {"path": plan.path}, "after": {"path": plan.path}}
    if module.set_fs_attributes_if_different(file_arguments(module, entry), False, attributes):
        diffs.append(attributes)
    return diffs


def unit_states(module: AnsibleModule, units: list[dict]) -> dict[str, dict]:
    """What systemd reports of ``units`` and whether each is as asked (one systemctl run, none for
    none); ValueError: why not."""
    if not units:
        return {}
    names = [unit["name"] for unit in units]
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        raise ValueError("systemctl: command not found (units needs systemd)")
    argv = [systemctl, "show", "--property=" + ",".join(["Id", *UNIT_PROPERTIES]), *names]
    rc, stdout, stderr = module.run_command(argv)
    if rc != 0:
        raise ValueError(f"{' '.join(argv)} failed (rc {rc}): {stderr.strip() or stdout.strip()}")
    states = parse_unit_states(names, stdout)
    for unit in units:
        states[unit["name"]]["as_asked"] = unit_as_asked(states[unit["name"]], unit["enabled"])
    return states


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": [], "options": ENTRY_OPTIONS},
            "files": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {**ENTRY_OPTIONS, "content": {"type": "str", "required": True}},
            },
            "secret_files": {
                # The contents are secret (no_log below), not the list's paths and modes.
                "no_log": False,
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    **ENTRY_OPTIONS,
                    "mode": {"type": "raw", "default": "0600"},
                    "content": {"type": "str", "required": True, "no_log": True},
                },
            },
            "units": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "name": {"type": "str", "required": True},
                    "enabled": {"type": "bool", "default": True},
                },
            },
        },
        supports_check_mode=True,
    )
    # The same directory twice (two settings naming one place) is one entry; twice with other
    # attributes, one would undo the other on every run.
    directories: list[dict] = []
    for entry in module.params["directories"]:
        same = [
            seen for seen in directories if os.path.abspath(seen["path"]) == os.path.abspath(entry["path"])
        ]
        if same and same[0] != entry:
            module.fail_json(
                msg=f"directories lists {entry['path']} twice with other attributes: {same[0]} and {entry}"
            )
        if not same:
            directories.append(entry)
    # Each file with whether its content is a secret.
    files = [(entry, False) for entry in module.params["files"]] + [
        (entry, True) for entry in module.params["secret_files"]
    ]

    # Plan everything before changing anything.
    try:
        directory_plans = [plan_directory(entry["path"]) for entry in directories]
        file_plans = [plan_text_file(entry["path"], entry["content"]) for entry, _secret in files]
    except FileContentError as err:
        module.fail_json(msg=str(err))
    except OSError as err:
        module.fail_json(msg=f"cannot read {err.filename}: {err.strerror}")
    planned = {os.path.abspath(plan.path) for plan in directory_plans}
    for plan in file_plans:
        parent = missing_parent_dir(plan.path)
        if parent and os.path.abspath(parent) not in planned:
            module.fail_json(
                msg=f"the directory of {plan.path} does not exist: {parent}; add it to directories",
                path=plan.path,
            )

    changed_paths: list[str] = []
    diffs: list[dict] = []

    def record(path: str, entry_diffs: list[dict]) -> None:
        if entry_diffs:
            changed_paths.append(path)
            diffs.extend(entry_diffs)

    try:
        for entry, plan in zip(directories, directory_plans, strict=True):
            record(plan.path, apply_directory(module, entry, plan))
        for (entry, secret), plan in zip(files, file_plans, strict=True):
            record(plan.path, apply_file(module, entry, plan, secret))
    except OSError as err:
        module.fail_json(msg=f"cannot write {err.filename}: {err.strerror}", changed_paths=changed_paths)

    result = {"changed": bool(changed_paths), "changed_paths": changed_paths, "units": {}}
    try:
        result["units"] = unit_states(module, module.params["units"])
    except ValueError as err:
        module.fail_json(msg=str(err), **result)
    if module._diff and diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
