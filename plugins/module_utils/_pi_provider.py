# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The Pi coding agent's view of the endpoint: one provider in ``models.json``, a few settings.

Only our provider entry and the settings we own are changed; everything else in the user's Pi
configuration is kept with its meaning and key order. The API key is never written: Pi runs
``printenv`` at request time, which both Pi 1.x and 0.7x resolve (``$NAME`` is sent literally
by 0.73).

Internal to sparkserve.dsv41; not a public API. Stdlib only.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import (
    ENV_VAR_NAME,
    TextFilePlan,
    dump_json,
    json_type_name,
    load_json_object,
)

MODEL_DISPLAY_NAME = "DeepSeek-V4.1-Flash"
MODELS_FILE = "models.json"
SETTINGS_FILE = "settings.json"
CONFIG_DIR_ENV = "PI_CODING_AGENT_DIR"
DEFAULT_CONFIG_DIR = "~/.pi/agent"
# Pi's thinking levels mapped onto the reasoning efforts the served model distinguishes.
THINKING_LEVEL_MAP = {
    "minimal": "low",
    "low": "low",
    "medium": "high",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}
COMPAT = {
    # vLLM's chat template knows no "developer" role and ignores "store".
    "supportsDeveloperRole": False,
    "supportsStore": False,
    "supportsUsageInStreaming": True,
}
MASK = "********"
# Values Pi resolves to credentials; masked in diffs because other providers may hold literal keys.
SECRET_FIELDS = ("apiKey", "headers")


class PiConfigError(ValueError):
    """An option value or an existing Pi file that this module cannot work with."""


def normalise_base_url(url: str) -> str:
    """``http(s)://host:port[/prefix]/v1`` without a trailing slash, from what a user typically types."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PiConfigError(f"base_url must be an http:// or https:// URL with a host, got {url!r}")
    if parts.query or parts.fragment:
        raise PiConfigError(f"base_url must not have a query or fragment, got {url!r}")
    path = parts.path.rstrip("/")
    if "/v1/" in f"{path}/" and not path.endswith("/v1"):
        raise PiConfigError(f"base_url must end at /v1 (Pi appends /chat/completions itself), got {url!r}")
    if not path.endswith("/v1"):
        path = f"{path}/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def api_key_reference(env_name: str) -> str:
    """The ``apiKey`` value that makes Pi read the key from ``env_name`` at request time."""
    if not ENV_VAR_NAME.fullmatch(env_name):
        raise PiConfigError(f"api_key_env {env_name!r} is not a valid environment variable name")
    return f"!printenv {env_name}"


def check_provider_name(name: str) -> str:
    """Pi refers to models as ``<provider>/<model>``, so the name must be one plain word."""
    if not name or "/" in name or any(char.isspace() for char in name):
        raise PiConfigError(f"name {name!r} must be non-empty, without '/' or whitespace")
    return name


def resolve_config_dir(config_dir: str | None, environ: Mapping[str, str]) -> str:
    """``config_dir`` if given, else ``$PI_CODING_AGENT_DIR``, else ``~/.pi/agent`` (as Pi does)."""
    chosen = config_dir or environ.get(CONFIG_DIR_ENV) or DEFAULT_CONFIG_DIR
    return os.path.abspath(os.path.expanduser(chosen))


def provider_entry(
    *,
    base_url: str,
    api_key_env: str,
    model_id: str,
    context_window: int,
    max_tokens: int,
    model_name: str = MODEL_DISPLAY_NAME,
    reasoning: bool = True,
    input_kinds: tuple[str, ...] | list[str] = ("text", "image"),
) -> dict[str, Any]:
    """The complete ``providers.<name>`` entry (the defaults are the DeepSeek recipe's model)."""
    for option, value in (("context_window", context_window), ("max_tokens", max_tokens)):
        if value <= 0:
            raise PiConfigError(f"{option} must be a positive number of tokens, got {value}")
    if not model_id.strip():
        raise PiConfigError("model_id must not be empty")
    if not input_kinds or any(kind not in ("text", "image") for kind in input_kinds):
        raise PiConfigError(f"input must name text and/or image, got {list(input_kinds)}")
    model = {
        "id": model_id,
        "name": model_name,
        "reasoning": reasoning,
        "input": list(input_kinds),
        "contextWindow": context_window,
        "maxTokens": max_tokens,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        "compat": dict(COMPAT),
    }
    if reasoning:
        model["thinkingLevelMap"] = dict(THINKING_LEVEL_MAP)
    return {
        "name": f"{model_name} on DGX Sparks",
        "baseUrl": normalise_base_url(base_url),
        "api": "openai-completions",
        "apiKey": api_key_reference(api_key_env),
        "models": [model],
    }


def with_provider(models: dict[str, Any], path: str, name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """``models`` with ``providers.<name>`` set to ``entry``; an existing entry keeps its position."""
    providers = models.get("providers", {})
    if not isinstance(providers, dict):
        raise PiConfigError(
            f"{path}: 'providers' must be an object, found {json_type_name(providers)}; "
            "the file was left untouched"
        )
    updated = dict(models)
    updated["providers"] = {**providers, name: entry}
    return updated


def with_settings(
    settings: dict[str, Any],
    path: str,
    *,
    provider: str,
    model_id: str,
    set_default: bool,
    enable_model: bool,
) -> dict[str, Any]:
    """``settings`` with our model as the default (when asked) and in ``enabledModels`` (when used)."""
    updated = dict(settings)
    if set_default:
        updated["defaultProvider"] = provider
        updated["defaultModel"] = model_id
    # Only a list the user already keeps: creating one would hide every other model from the picker.
    if enable_model and "enabledModels" in updated:
        enabled = updated["enabledModels"]
        if not isinstance(enabled, list):
            raise PiConfigError(
                f"{path}: 'enabledModels' must be an array, found {json_type_name(enabled)}; "
                "the file was left untouched"
            )
        model_ref = f"{provider}/{model_id}"
        if model_ref not in enabled:
            updated["enabledModels"] = [*enabled, model_ref]
    return updated


def same_json(left: Any, right: Any) -> bool:
    """Equal as JSON, key order aside (``==`` alone would equate ``true`` with ``1``)."""
    return json.dumps(left, sort_keys=True) == json.dumps(right, sort_keys=True)


def redacted(document: dict[str, Any], own_provider: str) -> dict[str, Any]:
    """A copy of a ``models.json`` document safe to show: other providers' credentials masked."""
    shown = copy.deepcopy(document)
    providers = shown.get("providers")
    if not isinstance(providers, dict):
        return shown
    for name, entry in providers.items():
        if name == own_provider or not isinstance(entry, dict):
            continue
        for field in SECRET_FIELDS:
            if isinstance(entry.get(field), str):
                entry[field] = MASK
            elif isinstance(entry.get(field), dict):
                entry[field] = dict.fromkeys(entry[field], MASK)
    return shown


@dataclass(frozen=True)
class JsonFilePlan:
    """One Pi file: its current text (``None``: missing), the documents before and after."""

    file: TextFilePlan
    before_doc: dict[str, Any] | None
    after_doc: dict[str, Any]

    @property
    def changed(self) -> bool:
        return self.file.changed

    def diff(self, own_provider: str) -> dict[str, str]:
        """Before/after as normalised JSON with other providers' credentials masked."""
        before = "" if self.before_doc is None else dump_json(redacted(self.before_doc, own_provider))
        return self.file.diff(before=before, after=dump_json(redacted(self.after_doc, own_provider)))


def plan_json_file(
    path: str, text: str | None, change: Callable[[dict[str, Any]], dict[str, Any]]
) -> JsonFilePlan:
    """Apply ``change(document)`` to the file's document; keep its text when the meaning is unchanged.

    Keeping the text means a file formatted differently by the user is not rewritten for nothing.
    """
    before_doc = None if text is None else load_json_object(path, text, empty_ok=True)
    after_doc = change({} if before_doc is None else before_doc)
    unchanged = text is not None and before_doc is not None and same_json(before_doc, after_doc)
    after_text = text if unchanged else dump_json(after_doc)
    return JsonFilePlan(TextFilePlan(path, text, after_text), before_doc, after_doc)


@dataclass(frozen=True)
class PiConfigPlan:
    models: JsonFilePlan
    settings: JsonFilePlan | None  # None: settings.json is neither needed nor present

    @property
    def changed_files(self) -> list[JsonFilePlan]:
        return [plan for plan in (self.models, self.settings) if plan is not None and plan.changed]


def plan_pi_config(
    config_dir: str,
    models_text: str | None,
    settings_text: str | None,
    *,
    provider: str,
    entry: dict[str, Any],
    set_default: bool,
    enable_model: bool,
) -> PiConfigPlan:
    """Both files' desired content.

    Raises ``_file_helpers.FileContentError`` or ``PiConfigError``, naming the file, before anything
    is written.
    """
    models_path = os.path.join(config_dir, MODELS_FILE)
    settings_path = os.path.join(config_dir, SETTINGS_FILE)
    models = plan_json_file(
        models_path, models_text, lambda doc: with_provider(doc, models_path, provider, entry)
    )
    settings = None
    if settings_text is not None or set_default:
        settings = plan_json_file(
            settings_path,
            settings_text,
            lambda doc: with_settings(
                doc,
                settings_path,
                provider=provider,
                model_id=entry["models"][0]["id"],
                set_default=set_default,
                enable_model=enable_model,
            ),
        )
    return PiConfigPlan(models=models, settings=settings)
