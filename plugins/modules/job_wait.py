#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: wait a while for a background (async) job, and say how far it got (one poll of the
job_wait action)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_wait
short_description: Wait up to some seconds for a background job and report its progress in one line
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Waits up to O(seconds) for the Ansible job started with C(async) and C(poll=0) whose results
    file is O(results_file), and returns as soon as it has finished. Reads the job's O(progress_file)
    (the collection's progress document) and returns one line about it, RV(line).
  - The action of the same name runs it once per poll until the job ends, printing RV(line) each time,
    and fails with the job's own message when the job failed - use the task C(sparkserve.dsv41.job_wait)
    with O(job), not this module alone, in playbooks.
  - A job is finished when its results file no longer says it is running, as
    M(ansible.builtin.async_status) decides it. A job stopped at its C(async) timeout is finished and
    failed, with the error C(Timeout exceeded).
  - A progress document that started before the job was launched is an earlier run's and is ignored.
  - Once the job has finished, returns its own result as RV(result) and removes its results file
    (as M(ansible.builtin.async_status) with C(mode=cleanup) does; not in check mode). Never fails
    because the job failed - RV(job_failed) and RV(error) say so.
options:
  job:
    description:
      - The registered result of the task that started the job (C(async), C(poll=0)); the action reads
        its C(results_file). Only for the action, which requires it and passes O(results_file) to the
        module.
    type: dict
  timeout_minutes:
    description:
      - The job's C(async) timeout in minutes. The action stops polling a little after it and fails
        naming O(timeout_variable). Only for the action, which requires it.
    type: float
  timeout_variable:
    description:
      - The variable that sets O(timeout_minutes), named in the failure messages. Only for the action,
        which requires it.
    type: str
  note:
    description:
      - A sentence appended to the messages about time running out (what a re-run does). Only for the action.
    type: str
    default: ""
  keep_fresh:
    description:
      - A file whose modification time is set to now at each poll, while it exists (a link's own,
        never its target's) - the deployment lock, so that the head's supervisor, which counts a lock
        older than C(supervisor_pause_max_minutes) as a run that is gone, stays paused while this run
        waits hours for a download. When the run is gone, no one polls and the lock ages as before.
    type: path
  results_file:
    description:
      - The job's results file, the C(results_file) of the task that started it. The action sets it
        from O(job) and refuses it as a task option.
      - A results file that is not there is waited for a little (the job may be starting); the action
        then fails naming it - a job already waited for (its file is removed once it finished), or one
        started by another host or user.
    type: path
    required: true
  progress_file:
    description:
      - The job's progress document - C({what, phase, unit, done, total, started, updated, detail}),
        as the collection's modules and the bench program write it. Absent or unreadable - a line
        without numbers.
    type: path
  what:
    description:
      - What the job is, the start of RV(line). Empty - the document's C(what). The action requires it.
    type: str
    default: ""
  seconds:
    description: The longest time to wait (for the action, between two progress lines); 0 only looks.
    type: float
    default: 20
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details: The action polls the module until the job ends and prints its progress.
  async:
    support: none
    details: It waits for an async job; it is not one.
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details: Only reads; in check mode it leaves a finished job's results file in place.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Run it on the host that runs the job (the results file and the progress file are there).
seealso:
  - module: ansible.builtin.async_status
"""

EXAMPLES = r"""
- name: Start the download
  sparkserve.dsv41.checkpoint_download:
    repo_id: 0xSero/DeepSeek-V4.1-Flash
    model_dir: /home/spark/models/DeepSeek-V4.1-Flash
    progress_file: /home/spark/.dsv41-two-sparks/checkpoint/download-progress.json
  async: 86400
  poll: 0
  register: download_job

- name: Wait for the download, printing its progress every 20 seconds
  sparkserve.dsv41.job_wait:
    job: "{{ download_job }}"
    progress_file: /home/spark/.dsv41-two-sparks/checkpoint/download-progress.json
    what: download
    seconds: 20
    timeout_minutes: 1440
    timeout_variable: checkpoint_download_timeout_minutes
    note: A re-run resumes the download.
  register: download
"""

RETURN = r"""
result:
  description:
    - The job's own result (what its module or command returned), once it has finished; empty before.
    - The action returns these keys at the top level of its result instead.
  returned: always
  type: dict
  sample: {"changed": true, "msg": "6 files downloaded"}
finished:
  description: Whether the job has ended (successfully or not).
  returned: always
  type: bool
  sample: false
job_failed:
  description: Whether the job failed (its module failed, its command exited non-zero, or it timed out).
  returned: always
  type: bool
  sample: false
error:
  description:
    - Why the job failed - a module's C(msg), a command's last line of C(stderr), C(Timeout exceeded).
    - Empty when it did not fail.
  returned: always
  type: str
  sample: ""
line:
  description:
    - The job's progress in one line - what it is, then its phase, the amount done of the total, the
      percentage, the rate, the detail and the time since it started, each when known, separated by
      commas. The phase is C(finished) once the job ended; a failed job's line ends with the word
      failed in brackets.
  returned: always
  type: str
  sample: "download: downloading, 212.4 GiB of 462.0 GiB, 46.0%, 480.2 MiB/s, after 7m32s"
results_file_found:
  description: Whether the job's results file was there at the last look.
  returned: always
  type: bool
  sample: true
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import remove_if_present
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import wait_for_job


def keep_fresh(path: str) -> bool:
    """Set the modification time of ``path`` itself to now; False when it is not there."""
    try:
        os.utime(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "results_file": {"type": "path", "required": True},
            "keep_fresh": {"type": "path"},
            "progress_file": {"type": "path"},
            "what": {"type": "str", "default": ""},
            "seconds": {"type": "float", "default": 20},
            # The action's own options; accepted (and ignored) so the documentation is the module's.
            "job": {"type": "dict"},
            "timeout_minutes": {"type": "float"},
            "timeout_variable": {"type": "str"},
            "note": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["seconds"] < 0:
        module.fail_json(msg=f"seconds must be 0 or more, got {params['seconds']}")
    if params["keep_fresh"] and not module.check_mode:
        keep_fresh(params["keep_fresh"])
    try:
        report = wait_for_job(
            params["results_file"], params["progress_file"], params["seconds"], params["what"]
        )
    except OSError as err:
        module.fail_json(
            msg=f"cannot read the job's results file {params['results_file']}: {err.strerror or err}"
            " (wait as the user that started the job: the same become)",
            results_file=params["results_file"],
        )
    if report["finished"] and not module.check_mode:
        remove_if_present(params["results_file"])
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
