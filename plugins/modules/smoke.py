#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: smoke-test an OpenAI-compatible endpoint (text, tool call, vision, reasoning, stream)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: smoke
short_description: Prove that an OpenAI-compatible endpoint answers correctly
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Asks the endpoint one question per check and judges the answer. C(text) - C(What is 17 * 23?)
    must contain C(391). C(tool_call) - asked about the weather in Hanoi with a C(get_weather) tool
    offered, the model must call it with C(city) Hanoi (compared in lower case without spaces,
    punctuation or accents, and accepted when it starts with C(hanoi) - C(Ha Noi) and
    C(Hanoi, Vietnam) pass). C(vision) - a generated PNG, left half red and right half blue; the
    answer must name red before blue. C(reasoning) - the answer carries C(reasoning_content) (or
    C(reasoning)). C(stream) - a streamed generation delivers several content chunks and ends with
    C([DONE]), proving the server is ready to generate, not only up.
  - Every request is greedy (C(temperature) 0) and never sends an output-token cap; each reply
    ends where the model ends it. The stream asks for its usage (C(stream_options.include_usage)).
  - Returns a PASS/FAIL table with the token usage and the evidence of each check, and fails when
    any check fails (or the endpoint refuses a request, for instance a wrong key answered with
    HTTP 401).
  - Changes nothing; C(changed) is always false. In check mode the checks run all the same,
    because asking is what the module is for.
options:
  base_url:
    description: The endpoint's base URL, ending in C(/v1) (appended when absent).
    type: str
    required: true
  api_key:
    description:
      - Bearer key. Empty (and no O(api_key_file)) sends no C(Authorization) header.
      - Prefer O(api_key_file) - a key given on the command line (C(-e)) is in C(ps) and the shell's history.
    type: str
    default: ""
  api_key_file:
    description:
      - A file holding the bearer key (its first line, without surrounding blanks), read where the
        module runs. Mutually exclusive with a non-empty O(api_key).
    type: path
  model:
    description:
      - The model name to ask for (vLLM's C(--served-model-name)).
      - Omitted or empty - the first id that C(GET /v1/models) lists.
    type: str
  checks:
    description: Which checks to run, in this order.
    type: list
    elements: str
    choices: [text, tool_call, vision, reasoning, stream]
    default: [text, tool_call, vision, reasoning, stream]
  timeout:
    description:
      - Seconds each request may take. The first long prompt on a cold engine is slow.
      - The C(sparkserve.dsv41.smoke) role passes its C(smoke_timeout_seconds), of the same default.
    type: int
    default: 3600
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: The checks only read from the endpoint; they run in check mode too.
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Smoke-test the head's API (the first model it lists)
  sparkserve.dsv41.smoke:
    base_url: http://192.168.100.10:8000/v1
    api_key_file: ~/.config/dsv41/api_key

- name: Only prove that the endpoint generates (readiness)
  sparkserve.dsv41.smoke:
    base_url: https://llm.example.net
    api_key: "{{ vault_llm_key }}"
    model: my-model
    checks: [stream]
    timeout: 600
"""

RETURN = r"""
model:
  description:
    - The model the checks asked for (the first one C(GET /v1/models) listed when none was given).
    - Empty when none was given and the endpoint listed none (or refused to list them).
  returned: always
  type: str
  sample: deepseek-v4.1-flash
results:
  description:
    - One entry per check, in the order they ran.
    - C(usage) holds the C(prompt_tokens) and C(completion_tokens) the answer reported (for the
      stream, its final usage chunk); null when the answer reported none.
  returned: always
  type: list
  elements: dict
  sample:
    - name: text
      passed: true
      evidence: "'What is 17 * 23?' -> '17 * 23 = 391.'"
      usage: {prompt_tokens: 17, completion_tokens: 7}
table:
  description: The results as a table, one line per check - name, PASS/FAIL, tokens in and out, evidence.
  returned: always
  type: str
  sample: |-
    check      result  tokens         evidence
    text       PASS    17 in, 7 out   'What is 17 * 23?' -> '17 * 23 = 391.'
    tool_call  PASS    97 in, 12 out  get_weather(city='Hanoi')
failed_checks:
  description: Names of the checks that failed.
  returned: always
  type: list
  elements: str
  sample: [vision]
"""

import json
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url
from ansible_collections.sparkserve.dsv41.plugins.module_utils._smoke import CHECKS, Reply, run_smoke, table


def http_client(base_url: str, api_key: str, timeout: int):
    """The checks' transport: POST JSON (GET when there is no payload); a JSON body or a stream's lines."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def send(path: str, payload: dict[str, Any] | None, stream: bool) -> Reply:
        method, data = ("GET", None) if payload is None else ("POST", json.dumps(payload))
        try:
            # The engine is reached directly: a proxy from the environment would get the key.
            response = open_url(
                base_url + path, method=method, data=data, headers=headers, timeout=timeout, use_proxy=False
            )
            if stream:
                lines = tuple(raw.decode("utf-8", "replace").rstrip("\r\n") for raw in response)
                return Reply(200, lines=lines)
            return Reply(200, body=json.loads(response.read()))
        except HTTPError as exc:
            try:
                body = json.loads(exc.read() or b"{}")
            except ValueError:
                body = {}
            return Reply(exc.code, body=body if isinstance(body, dict) else {})
        except (URLError, OSError, ValueError) as exc:
            return Reply(0, error=f"{base_url + path}: {exc}")

    return send


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "api_key_file": {"type": "path"},
            "model": {"type": "str"},
            "checks": {"type": "list", "elements": "str", "choices": list(CHECKS), "default": list(CHECKS)},
            "timeout": {"type": "int", "default": 3600},
        },
        supports_check_mode=True,
    )
    base_url = module.params["base_url"].rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        module.fail_json(msg=f"base_url must be an http(s) URL, got {base_url!r}")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    api_key = module.params["api_key"]
    if module.params["api_key_file"]:
        if api_key:
            module.fail_json(msg="api_key and api_key_file are mutually exclusive: give the key one way")
        try:
            with open(module.params["api_key_file"], encoding="utf-8") as handle:
                api_key = handle.readline().strip()
        except OSError as exc:
            module.fail_json(
                msg=f"cannot read the API key file {module.params['api_key_file']}: {exc.strerror or exc}"
            )
        if not api_key:
            module.fail_json(msg=f"the API key file {module.params['api_key_file']} holds no key")
    client = http_client(base_url, api_key, module.params["timeout"])
    model, results = run_smoke(client, module.params["model"], module.params["checks"])
    report = {
        "changed": False,
        "model": model,
        "results": [r.as_dict() for r in results],
        "table": table(results),
        "failed_checks": [r.name for r in results if not r.passed],
    }
    if report["failed_checks"]:
        module.fail_json(msg=f"smoke check(s) failed: {', '.join(report['failed_checks'])}", **report)
    module.exit_json(**report)


if __name__ == "__main__":
    main()
