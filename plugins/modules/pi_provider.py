#!/usr/bin/python
# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: register the DGX Spark endpoint as a provider of the Pi coding agent."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pi_provider
short_description: Add or replace the dsv41-sparks provider in the Pi coding agent's configuration
version_added: 0.1.0
author: sparkserve maintainers (@sparkserve)
description:
  - Adds or replaces only the O(name) provider (C(dsv41-sparks)) under C(providers) in Pi's
    C(models.json), with one model (C(deepseek-v4.1-flash)) - reasoning, text and image input,
    the reference context window and output limit, zero cost, the compat flags vLLM needs and the
    reference thinking level map. Every other provider and field is kept, in its order.
  - The API key is never written. The provider's C(apiKey) is C(!printenv <api_key_env>), which Pi
    1.x and 0.7x both resolve from the environment at request time.
  - In C(settings.json), appends C(<name>/<model_id>) to C(enabledModels) only when that list already
    exists and lacks it, and sets C(defaultProvider)/C(defaultModel) when O(set_default=true).
  - Creates the configuration directory (mode C(0700)) and the files (mode C(0600)) when missing;
    existing files keep their mode, owner and group. Backs up each existing file before changing it.
    Files are only written when their meaning changes, so a second run reports no change and writes
    nothing.
  - A file that is not valid JSON, whose top level is not an object, or whose C(providers) is not
    an object (C(enabledModels) not an array) makes the module fail without touching anything.
options:
  base_url:
    description:
      - Base URL of the OpenAI-compatible endpoint, for example C(http://<head>:8000/v1).
      - Normalised to end in C(/v1) (trailing slashes removed, C(/v1) appended when absent). Only
        C(http) and C(https) URLs are accepted.
    type: str
    required: true
  name:
    description: Name of the provider entry, as used in C(pi --model <name>/<model_id>).
    type: str
    default: dsv41-sparks
  model_id:
    description: Model id the endpoint serves (vLLM's C(--served-model-name)).
    type: str
    default: deepseek-v4.1-flash
  context_window:
    description: Context window of the model in tokens (vLLM's C(--max-model-len)).
    type: int
    default: 262144
  max_tokens:
    description: Maximum output tokens Pi assumes for the model.
    type: int
    default: 262144
  model_name:
    description: The model's display name in Pi; the provider is shown as C(<model_name> on DGX Sparks).
    type: str
    default: DeepSeek-V4.1-Flash
  reasoning:
    description: Whether the model reasons (Pi then sends C(reasoning_effort), mapped by C(thinkingLevelMap)).
    type: bool
    default: true
  input:
    description: What the model takes in.
    type: list
    elements: str
    choices: [text, image]
    default: [text, image]
  api_key_env:
    description: Environment variable Pi reads the bearer key from at request time.
    type: str
    default: DSV41_API_KEY
  config_dir:
    description:
      - Pi's configuration directory. Unset uses C($PI_CODING_AGENT_DIR) of the module's environment,
        else C(~/.pi/agent) of the user running the module.
    type: path
  set_default:
    description:
      - Also make this model Pi's default (C(defaultProvider) and C(defaultModel) in C(settings.json)).
    type: bool
    default: false
  enable_model:
    description:
      - Append C(<name>/<model_id>) to C(enabledModels) in C(settings.json) when that list exists and
        lacks it. A missing list is never created (it would hide all other models).
    type: bool
    default: true
  backup:
    description:
      - Copy each existing file before changing it, the way Ansible's modules do
        (C(<file>.<pid>.<YYYY-MM-DD@HH:MM:SS>~), with the file's mode, owner and SELinux context).
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details:
      - The diff shows the JSON content of each changed file; C(apiKey) and C(headers) values of other
        providers are masked.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Connect Pi to the head node
  sparkserve.dsv41.pi_provider:
    base_url: "http://{{ hostvars[groups['head'][0]].ansible_host }}:8000"

- name: Connect Pi and make the model its default
  sparkserve.dsv41.pi_provider:
    base_url: http://192.168.100.10:8000/v1
    set_default: true

- name: A separate Pi profile, key taken from another variable
  sparkserve.dsv41.pi_provider:
    base_url: https://sparks.example.net/dsv41
    config_dir: ~/.pi/agent-sparks
    api_key_env: SPARKS_KEY
    backup: false
"""

RETURN = r"""
config_dir:
  description: Pi's configuration directory that was used.
  returned: always
  type: str
  sample: /home/dev/.pi/agent
models_file:
  description: Path of C(models.json).
  returned: always
  type: str
  sample: /home/dev/.pi/agent/models.json
settings_file:
  description: Path of C(settings.json) (whether or not it exists).
  returned: always
  type: str
  sample: /home/dev/.pi/agent/settings.json
base_url:
  description: The normalised base URL written to the provider.
  returned: always
  type: str
  sample: http://192.168.100.10:8000/v1
model:
  description: The model reference to pass to C(pi --model).
  returned: always
  type: str
  sample: dsv41-sparks/deepseek-v4.1-flash
changed_files:
  description: Files that were changed (would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [/home/dev/.pi/agent/models.json]
backup_files:
  description:
    - Backups written by this run; empty when nothing changed, with O(backup=false) and in check mode.
  returned: always
  type: list
  elements: str
  sample: [/home/dev/.pi/agent/models.json.4711.2026-12-02@14:15:03~]
diff:
  description: Before and after content of each changed file.
  returned: changed and in diff mode
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    FileContentError,
    read_text,
    write_atomically,
)
from ansible_collections.sparkserve.dsv41.plugins.module_utils._pi_provider import (
    MODEL_DISPLAY_NAME,
    MODELS_FILE,
    SETTINGS_FILE,
    PiConfigError,
    check_provider_name,
    plan_pi_config,
    provider_entry,
    resolve_config_dir,
)

# Pi's files belong to the user running Pi: an existing file keeps its mode, owner and group (as
# atomic_move leaves them) and a new one is private, since its neighbours may hold keys. There is no
# owner, group or mode to choose, so the module takes no file arguments (add_file_common_args).
NEW_FILE_MODE = 0o600
CONFIG_DIR_MODE = 0o700


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "name": {"type": "str", "default": "dsv41-sparks"},
            "model_id": {"type": "str", "default": "deepseek-v4.1-flash"},
            "context_window": {"type": "int", "default": 262144},
            "max_tokens": {"type": "int", "default": 262144, "no_log": False},  # a token count
            "model_name": {"type": "str", "default": MODEL_DISPLAY_NAME},
            "reasoning": {"type": "bool", "default": True},
            "input": {
                "type": "list",
                "elements": "str",
                "choices": ["text", "image"],
                "default": ["text", "image"],
            },
            # A variable's name, not the key.
            "api_key_env": {"type": "str", "default": "DSV41_API_KEY", "no_log": False},
            "config_dir": {"type": "path"},
            "set_default": {"type": "bool", "default": False},
            "enable_model": {"type": "bool", "default": True},
            "backup": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    config_dir = resolve_config_dir(params["config_dir"], os.environ)
    models_file = os.path.join(config_dir, MODELS_FILE)
    settings_file = os.path.join(config_dir, SETTINGS_FILE)
    if os.path.exists(config_dir) and not os.path.isdir(config_dir):
        module.fail_json(msg=f"config_dir {config_dir} exists but is not a directory")

    try:
        provider = check_provider_name(params["name"])
        entry = provider_entry(
            base_url=params["base_url"],
            api_key_env=params["api_key_env"],
            model_id=params["model_id"],
            context_window=params["context_window"],
            max_tokens=params["max_tokens"],
            model_name=params["model_name"],
            reasoning=params["reasoning"],
            input_kinds=params["input"],
        )
        plan = plan_pi_config(
            config_dir,
            read_text(models_file),
            read_text(settings_file),
            provider=provider,
            entry=entry,
            set_default=params["set_default"],
            enable_model=params["enable_model"],
        )
    except (PiConfigError, FileContentError) as err:
        module.fail_json(msg=str(err), config_dir=config_dir)
    except OSError as err:
        module.fail_json(msg=f"cannot read {err.filename}: {err.strerror}", config_dir=config_dir)

    changed_files = plan.changed_files
    create_dir = not os.path.isdir(config_dir)
    backup_files: list[str] = []
    if not module.check_mode:
        try:
            if create_dir:
                os.makedirs(config_dir, mode=CONFIG_DIR_MODE)
                os.chmod(config_dir, CONFIG_DIR_MODE)  # makedirs' mode is filtered by the umask
            for file_plan in changed_files:
                path = file_plan.file.path
                new_file = file_plan.file.before is None
                if params["backup"] and not new_file:
                    backup_files.append(module.backup_local(path))
                write_atomically(
                    module, path, file_plan.file.after.encode("utf-8"), NEW_FILE_MODE if new_file else None
                )
        except OSError as err:
            module.fail_json(
                msg=f"cannot write {err.filename or config_dir}: {err.strerror}",
                config_dir=config_dir,
                backup_files=backup_files,
            )
        except Exception as err:  # backup_local raises its OSError as a plain Exception
            module.fail_json(msg=f"{err} ({err.__cause__})", config_dir=config_dir, backup_files=backup_files)

    result = {
        "changed": create_dir or bool(changed_files),
        "config_dir": config_dir,
        "models_file": models_file,
        "settings_file": settings_file,
        "base_url": entry["baseUrl"],
        "model": f"{provider}/{entry['models'][0]['id']}",
        "changed_files": [file_plan.file.path for file_plan in changed_files],
        "backup_files": backup_files,
    }
    if module._diff and changed_files:
        result["diff"] = [file_plan.diff(provider) for file_plan in changed_files]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
