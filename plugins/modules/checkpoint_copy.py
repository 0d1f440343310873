#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: copy a checkpoint directory to another node with rsync, resumably."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: checkpoint_copy
short_description: Copy a checkpoint directory to another node with rsync, resumably
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Makes O(dest) a copy of the directory O(src) with C(rsync -a), run on the node that
    holds O(src) (the head pushes to a worker, over the address the copy should travel on).
  - Files matching O(exclude) are not copied - by default the parts of rebuilt shards, C(.cache/)
    (huggingface_hub's metadata and the verification records, so that the receiving node verifies
    its copy itself) and the rebuild's temporary files.
  - The owner, the group and directory times are not copied (C(--no-owner --no-group
    --omit-dir-times)), so the receiving user's files and its own C(.cache/) do not show as
    differences. C(changed) is true when rsync itemizes at least one change; a re-run on a
    complete copy reports no change.
  - An interrupted copy resumes - a partly sent file is completed. It waits in C(.rsync-partial/)
    beside where it goes (C(--partial-dir)), never under its own name, so a rank started meanwhile
    never loads a truncated file, and the receiving node's verification never sees one.
  - Meant to run with C(async) and O(progress_file); the M(sparkserve.dsv41.job_wait) module shows its
    progress.
options:
  src:
    description: The directory to copy (its contents are copied into O(dest)).
    type: path
    required: true
  dest:
    description:
      - Where the copy goes - C([user@]host:/path) on another node, or a local path. Created when
        missing (its parent must exist).
    type: str
    required: true
  rsh:
    description:
      - The remote shell, one argument per item, e.g. C([ssh, -i, /path/key, -o, BatchMode=yes]). rsync
        is given it as one C(-e) value, quoted so that each item stays one argument (items must not
        hold a backslash).
      - Not set - rsync's default (C(ssh)).
    type: list
    elements: str
  exclude:
    description: rsync patterns of files not to copy (C(--exclude)).
    type: list
    elements: str
    default: ["*.safetensors.part*", ".cache/", ".*.sparkserve-tmp"]
  bwlimit_kib:
    description:
      - Caps the copy's rate, in KiB per second (C(--bwlimit)), e.g. to leave the fabric to ranks that
        serve while it runs. V(0) - no cap.
    type: int
    default: 0
  link_dest:
    description:
      - Directories on the receiving side (absolute paths) holding other revisions of the checkpoint
        (C(--link-dest)). A file identical in size and time to theirs is hard-linked from there
        instead of sent, so a new revision crosses the fabric only with what changed.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - sparkserve.dsv41.progress
attributes:
  check_mode:
    support: full
    details: Runs rsync with C(--dry-run) - it connects to O(dest) and lists what it would change.
  diff_mode:
    support: none
    details: RV(itemized) lists the changes in rsync's C(--itemize-changes) format.
  platform:
    platforms: posix
requirements:
  - rsync on both nodes
seealso:
  - module: sparkserve.dsv41.job_wait
  - module: sparkserve.dsv41.checkpoint_shards
  - name: rsync manual
    description: C(--itemize-changes), C(--info=progress2) and the remote shell quoting rules.
    link: https://download.samba.org/pub/rsync/rsync.1
notes:
  - The progress document (O(progress_file)) counts C(bytes) - C(done) the bytes rsync sent so far,
    C(total) null, C(detail) the file at hand.
"""

EXAMPLES = r"""
- name: Copy the checkpoint to a worker over the fabric, in the background
  sparkserve.dsv41.checkpoint_copy:
    src: /home/spark/models/DeepSeek-V4.1-Flash-Spark
    dest: spark@192.168.100.11:/home/spark/models/DeepSeek-V4.1-Flash-Spark
    rsh: [ssh, -i, /home/spark/.dsv41-two-sparks/ssh/id_ed25519, -o, IdentitiesOnly=yes, -o, BatchMode=yes]
    progress_file: /home/spark/.dsv41-two-sparks/checkpoint/copy-worker-1-progress.json
  async: 43200
  poll: 0
  register: copy_job

- name: Copy to a second disk, keeping the parts
  sparkserve.dsv41.checkpoint_copy:
    src: /srv/models/DeepSeek-V4.1-Flash-Spark
    dest: /mnt/backup/DeepSeek-V4.1-Flash-Spark
    exclude: [.cache/]
"""

RETURN = r"""
rc:
  description: rsync's exit code.
  returned: always
  type: int
  sample: 0
itemized_count:
  description: Items rsync changed (would change, in check mode).
  returned: always
  type: int
  sample: 3
itemized:
  description: The first 50 of them, as rsync's C(--itemize-changes) lines.
  returned: always
  type: list
  elements: str
  sample: [">f+++++++++ model-00001-of-00006.safetensors", "cd+++++++++ exl3/"]
messages:
  description: The last 20 lines of rsync (or ssh) that are neither items nor progress (warnings, errors).
  returned: always
  type: list
  elements: str
  sample: ["rsync: connection unexpectedly closed (0 bytes received so far) [sender]"]
bytes_transferred:
  description: Bytes rsync sent (its C(--info=progress2) count).
  returned: always
  type: int
  sample: 1073741824
cmd:
  description: The rsync command that ran.
  returned: always
  type: list
  elements: str
  sample: [/usr/bin/rsync, -a, "...", /home/spark/models/M/, spark@192.168.100.11:/home/spark/models/M/]
msg:
  description: One line saying what rsync changed, or why it failed.
  returned: always
  type: str
  sample: rsync changed 3 item(s) at spark@192.168.100.11:/home/spark/models/DeepSeek-V4.1-Flash-Spark
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter
from ansible_collections.sparkserve.dsv41.plugins.module_utils._rsync import (
    DEFAULT_EXCLUDES,
    copy_message,
    rsync_argv,
    run_rsync,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "dest": {"type": "str", "required": True},
            "rsh": {"type": "list", "elements": "str"},
            "exclude": {"type": "list", "elements": "str", "default": list(DEFAULT_EXCLUDES)},
            "bwlimit_kib": {"type": "int", "default": 0},
            "link_dest": {"type": "list", "elements": "str", "default": []},
            "progress_file": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["bwlimit_kib"] < 0:
        module.fail_json(msg=f"bwlimit_kib must be 0 (no cap) or more, got {params['bwlimit_kib']}")
    argv = rsync_argv(
        module.get_bin_path("rsync", required=True),
        params["src"],
        params["dest"],
        rsh=params["rsh"],
        excludes=params["exclude"],
        bwlimit_kib=params["bwlimit_kib"],
        link_dest=params["link_dest"],
        dry_run=module.check_mode,
    )
    result = {"changed": False, "cmd": argv}
    progress = ProgressWriter(None if module.check_mode else params["progress_file"], "copy")
    try:
        summary = run_rsync(argv, progress)
    except OSError as exc:
        module.fail_json(msg=f"cannot run {argv[0]}: {exc.strerror or exc}", **result)
    result.update(summary, msg=copy_message(summary, params["dest"], dry_run=module.check_mode))
    if summary["rc"] != 0:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
