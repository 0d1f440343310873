#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: wait a while for a background (async) job, and say how far it got."""

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
  - Called in a loop that shows RV(line) as its label and stops when RV(finished), it prints the
    progress of a long job once per poll - the task file C(wait) of the C(sparkserve.dsv41.deployment)
    role does that, then collects the result with M(ansible.builtin.async_status).
  - A job is finished when its results file no longer says it is running, as
    M(ansible.builtin.async_status) decides it. A job stopped at its C(async) timeout is finished and
    failed, with the error C(Timeout exceeded).
  - Changes nothing and never fails because the job failed - RV(job_failed) and RV(error) say so.
options:
  results_file:
    description: The job's results file, the C(results_file) of the task that started it.
    type: path
    required: true
  progress_file:
    description:
      - The job's progress document - C({what, phase, unit, done, total, started, updated, detail}),
        as the collection's modules and the bench program write it. Absent or unreadable - a line
        without numbers.
    type: path
  what:
    description: What the job is, the start of RV(line). Empty - the document's C(what).
    type: str
    default: ""
  seconds:
    description: The longest time to wait; 0 only looks.
    type: float
    default: 20
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Only reads; behaves the same in check mode.
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
- name: Wait for the download, printing its progress every 20 seconds
  sparkserve.dsv41.job_wait:
    results_file: "{{ download_job.results_file }}"
    progress_file: /home/spark/.dsv41-two-sparks/checkpoint/download-progress.json
    what: download
    seconds: 20
  register: poll
  loop: "{{ range(24 * 60 * 3 + 3) | list }}"
  loop_control:
    label: "{{ poll.line | default('cannot poll the job') }}"
    break_when:
      - poll is failed or poll.finished
"""

RETURN = r"""
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
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import wait_for_job


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "results_file": {"type": "path", "required": True},
            "progress_file": {"type": "path"},
            "what": {"type": "str", "default": ""},
            "seconds": {"type": "float", "default": 20},
        },
        supports_check_mode=True,
    )
    params = module.params
    if params["seconds"] < 0:
        module.fail_json(msg=f"seconds must be 0 or more, got {params['seconds']}")
    report = wait_for_job(params["results_file"], params["progress_file"], params["seconds"], params["what"])
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
