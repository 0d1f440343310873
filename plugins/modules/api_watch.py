#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: measure how long the API stops answering while the ranks switch."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: api_watch
short_description: Measure how long the API stops answering while the ranks switch
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Asks the API a one-token chat completion every O(interval) seconds, from before the old ranks stop
    until the new ones answer, and returns the seconds between the last answer of the old ranks and the
    first of the new ones (RV(downtime_seconds)) - what a client sees of a switch.
  - Meant to run with C(async) and C(poll 0) on the head before the ranks restart, and to be collected with
    M(sparkserve.dsv41.job_wait) after. It ends when the API answered again after a gap, when O(stop_file)
    appears (the run needs the result now; no gap seen is then reported as such) or after O(timeout_minutes)
    (fails).
  - The key is read from O(key_file) on the node, so it appears in no argument, command line or log.
options:
  url:
    description: The API's base URL as seen from the node, e.g. C(http://127.0.0.1:8000/v1).
    type: str
    required: true
  key_file:
    description: The file holding the API key (bearer). Not set - the API asks for none.
    type: path
  model:
    description: The served model name to ask.
    type: str
    required: true
  interval:
    description: Seconds between two questions.
    type: float
    default: 0.5
  request_timeout:
    description: Seconds one question may take before it counts as no answer.
    type: float
    default: 5
  timeout_minutes:
    description: Minutes after which the watch fails when the API has not answered again.
    type: int
    default: 30
  stop_file:
    description:
      - When this file appears the watch ends with what it saw so far.
      - One left by an earlier watch is removed when the watch starts.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - sparkserve.dsv41.progress
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - module: sparkserve.dsv41.deployment_release
  - module: sparkserve.dsv41.job_wait
notes:
  - The progress document (O(progress_file)) counts C(probes).
"""

EXAMPLES = r"""
- name: Watch the API while the ranks switch
  sparkserve.dsv41.api_watch:
    url: http://127.0.0.1:8000/v1
    key_file: /home/spark/.dsv41-two-sparks/api_key
    model: deepseek-v4.1-flash
    stop_file: /home/spark/.dsv41-two-sparks/api-watch.stop
  async: 3600
  poll: 0
  register: watch_job
"""

RETURN = r"""
downtime_seconds:
  description:
    - Seconds between the last answer of the old ranks and the first of the new ones.
    - Null when no gap was seen.
  returned: always
  type: float
  sample: 41.2
last_old_answer:
  description: When the old ranks last answered (epoch seconds), or null.
  returned: always
  type: float
first_new_answer:
  description: When the new ranks first answered (epoch seconds), or null.
  returned: always
  type: float
probes:
  description: Questions asked.
  returned: always
  type: int
failures:
  description: Questions not answered.
  returned: always
  type: int
msg:
  description: What the watch saw, in words.
  returned: always
  type: str
"""

import http.client
import json
import os
import time

from ansible.module_utils import urls
from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._progress import ProgressWriter
from ansible_collections.sparkserve.dsv41.plugins.module_utils._watch import GapWatch


def answered(url: str, key: str | None, model: str, timeout: float) -> bool:
    """Whether a one-token chat completion comes back with a choice."""
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        response = urls.open_url(
            f"{url.rstrip('/')}/chat/completions", data=json.dumps(body), headers=headers, method="POST",
            timeout=timeout, use_proxy=False,  # the engine directly: a proxy would get the key
        )  # fmt: skip
        return bool(json.loads(response.read()).get("choices"))
    # Any failure is no answer: refused, reset, 4xx/5xx (HTTPError is an OSError), timeout, bad JSON.
    except (OSError, ValueError, http.client.HTTPException, urls.ConnectionError):
        return False


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "key_file": {"type": "path", "no_log": False},
            "model": {"type": "str", "required": True},
            "interval": {"type": "float", "default": 0.5},
            "request_timeout": {"type": "float", "default": 5},
            "timeout_minutes": {"type": "int", "default": 30},
            "stop_file": {"type": "path"},
            "progress_file": {"type": "path"},
        },
        supports_check_mode=False,
    )
    params = module.params
    key = None
    if params["key_file"]:
        try:
            with open(params["key_file"], encoding="utf-8") as handle:
                key = handle.read().strip()
        except OSError as exc:
            module.fail_json(msg=f"cannot read the API key file {params['key_file']}: {exc.strerror or exc}")
    if params["stop_file"]:
        try:
            os.remove(params["stop_file"])
        except FileNotFoundError:
            pass
        except OSError as exc:
            module.fail_json(msg=f"cannot remove the stop file {params['stop_file']}: {exc.strerror}")
    progress = ProgressWriter(params["progress_file"], "API watch", unit="probes")
    # The downtime and the deadline on the monotonic clock (a clock step mid-switch must not count);
    # the two answers' times are returned as epoch seconds.
    start = time.monotonic()
    epoch_offset = time.time() - start
    watch = GapWatch(started=start)
    deadline = start + params["timeout_minutes"] * 60
    while not watch.done:
        if params["stop_file"] and os.path.exists(params["stop_file"]):
            break
        if time.monotonic() >= deadline:
            progress.update(phase="failed", detail=watch.message(), force=True)
            module.fail_json(
                msg=f"the API did not answer again within timeout_minutes ({params['timeout_minutes']}):"
                f" {watch.message()}",
                **watch.summary(epoch_offset),
            )
        asked = time.monotonic()
        reply = answered(params["url"], key, params["model"], params["request_timeout"])
        watch.observe(reply, time.monotonic())
        progress.update(phase="running", done=watch.probes, detail=watch.message())
        time.sleep(max(0.0, params["interval"] - (time.monotonic() - asked)))
    progress.update(phase="done", done=watch.probes, detail=watch.message(), force=True)
    module.exit_json(changed=False, msg=watch.message(), **watch.summary(epoch_offset))


if __name__ == "__main__":
    main()
