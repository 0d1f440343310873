"""The Pi provider's pure parts: URL normalisation, the entry, and the planned files.

``provider_entry`` has no defaults of its own: the entry is built from the pi role's defaults, the
way roles/pi/tasks/main.yml passes them to the module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._file_helpers import FileContentError
from ansible_collections.sparkserve.dsv41.plugins.module_utils._pi_provider import (
    MASK,
    PiConfigError,
    api_key_reference,
    check_provider_name,
    normalise_base_url,
    plan_pi_config,
    provider_entry,
    redacted,
    resolve_config_dir,
    with_provider,
    with_settings,
)
from role_defaults import SHARED_ROLE, role_defaults

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pi"
CONFIG_DIR = "/home/dev/.pi/agent"
MODEL_REF = "dsv41-sparks/deepseek-v4.1-flash"
PI_DEFAULTS = role_defaults(SHARED_ROLE, "pi")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def entry(**overrides) -> dict:
    """The provider entry with the pi role's defaults."""
    settings = {
        "base_url": "http://192.168.100.10:8000",
        "api_key_env": PI_DEFAULTS["pi_api_key_env"],
        "model_id": PI_DEFAULTS["pi_model_id"],
        "context_window": PI_DEFAULTS["pi_context_window"],
        "max_tokens": PI_DEFAULTS["pi_max_tokens"],
    }
    return provider_entry(**{**settings, **overrides})


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://192.168.100.10:8000", "http://192.168.100.10:8000/v1"),
        ("http://192.168.100.10:8000/", "http://192.168.100.10:8000/v1"),
        ("http://192.168.100.10:8000/v1", "http://192.168.100.10:8000/v1"),
        ("http://192.168.100.10:8000/v1/", "http://192.168.100.10:8000/v1"),
        ("http://192.168.100.10:8000/v1///", "http://192.168.100.10:8000/v1"),
        ("  http://spark-head:8000/v1  ", "http://spark-head:8000/v1"),
        ("HTTPS://sparks.example.net/dsv41", "https://sparks.example.net/dsv41/v1"),
        ("https://sparks.example.net/dsv41/v1", "https://sparks.example.net/dsv41/v1"),
        ("http://[fd00::10]:8000", "http://[fd00::10]:8000/v1"),
    ],
)
def test_normalise_base_url(given, expected):
    assert normalise_base_url(given) == expected
    assert normalise_base_url(expected) == expected


@pytest.mark.parametrize(
    "given",
    [
        "192.168.100.10:8000",
        "ftp://spark-head/v1",
        "file:///etc/passwd",
        "http://",
        "http:///v1",
        "http://spark-head:8000/v1?x=1",
        "http://spark-head:8000/v1#frag",
        "http://spark-head:8000/v1/chat/completions",
        "",
    ],
)
def test_normalise_base_url_rejects(given):
    with pytest.raises(PiConfigError, match="base_url"):
        normalise_base_url(given)


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("DSV41_API_KEY", True),
        ("_K1", True),
        ("1KEY", False),
        ("KEY; rm -rf ~", False),
        ("", False),
        ("$KEY", False),
    ],
)
def test_api_key_reference(name, valid):
    if valid:
        assert api_key_reference(name) == f"!printenv {name}"
    else:
        with pytest.raises(PiConfigError, match="api_key_env"):
            api_key_reference(name)


@pytest.mark.parametrize("name", ["", "dsv41/sparks", "dsv41 sparks"])
def test_check_provider_name_rejects(name):
    with pytest.raises(PiConfigError):
        check_provider_name(name)


@pytest.mark.parametrize(
    ("option", "environ", "expected"),
    [
        ("/opt/pi", {"PI_CODING_AGENT_DIR": "/elsewhere"}, "/opt/pi"),
        (None, {"PI_CODING_AGENT_DIR": "/srv/pi-agent"}, "/srv/pi-agent"),
        (None, {}, os.path.expanduser("~/.pi/agent")),
        (None, {"PI_CODING_AGENT_DIR": ""}, os.path.expanduser("~/.pi/agent")),
    ],
)
def test_resolve_config_dir(option, environ, expected):
    assert resolve_config_dir(option, environ) == expected


def test_provider_entry_reference_values():
    """The pi role's defaults give the reference entry."""
    assert entry() == {
        "name": "DeepSeek-V4.1-Flash on DGX Sparks",
        "baseUrl": "http://192.168.100.10:8000/v1",
        "api": "openai-completions",
        "apiKey": "!printenv DSV41_API_KEY",
        "models": [
            {
                "id": "deepseek-v4.1-flash",
                "name": "DeepSeek-V4.1-Flash",
                "reasoning": True,
                "input": ["text", "image"],
                "contextWindow": 262144,
                "maxTokens": 262144,
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                "compat": {
                    "supportsDeveloperRole": False,
                    "supportsStore": False,
                    "supportsUsageInStreaming": True,
                },
                "thinkingLevelMap": {
                    "minimal": "low",
                    "low": "low",
                    "medium": "high",
                    "high": "high",
                    "xhigh": "max",
                    "max": "max",
                },
            }
        ],
    }


@pytest.mark.parametrize("setting", ["api_key_env", "model_id", "context_window", "max_tokens"])
def test_provider_entry_has_no_defaults_of_its_own(setting):
    settings = {
        "base_url": "http://h:8000",
        "api_key_env": "K",
        "model_id": "m",
        "context_window": 1,
        "max_tokens": 1,
    }
    del settings[setting]
    with pytest.raises(TypeError, match=setting):
        provider_entry(**settings)


@pytest.mark.parametrize(("option", "value"), [("context_window", 0), ("max_tokens", -1)])
def test_provider_entry_rejects_non_positive_limits(option, value):
    with pytest.raises(PiConfigError, match=option):
        entry(**{option: value})


def test_with_provider_appends_and_keeps_others_in_order():
    models = json.loads(fixture_text("models_other_providers.json"))
    updated = with_provider(models, "models.json", "dsv41-sparks", entry())
    assert list(updated["providers"]) == ["anthropic-proxy", "ollama", "dsv41-sparks"]
    assert updated["providers"]["ollama"] == models["providers"]["ollama"]
    assert "dsv41-sparks" not in models["providers"]  # the input is not modified


def test_with_provider_replaces_in_place():
    models = json.loads(fixture_text("models_stale_dsv41.json"))
    updated = with_provider(models, "models.json", "dsv41-sparks", entry())
    assert list(updated) == ["$schema", "providers"]
    assert list(updated["providers"]) == ["ollama", "dsv41-sparks", "openrouter"]
    assert updated["providers"]["dsv41-sparks"] == entry()


@pytest.mark.parametrize(
    ("settings", "set_default", "enable_model", "expected"),
    [
        ({"theme": "dark"}, False, True, {"theme": "dark"}),
        (
            {"theme": "dark"},
            True,
            True,
            {"theme": "dark", "defaultProvider": "dsv41-sparks", "defaultModel": "deepseek-v4.1-flash"},
        ),
        (
            {"defaultProvider": "ollama", "defaultModel": "llama3.1:8b"},
            False,
            True,
            {"defaultProvider": "ollama", "defaultModel": "llama3.1:8b"},
        ),
        ({"enabledModels": ["ollama/*"]}, False, True, {"enabledModels": ["ollama/*", MODEL_REF]}),
        ({"enabledModels": ["ollama/*"]}, False, False, {"enabledModels": ["ollama/*"]}),
        ({"enabledModels": [MODEL_REF, "ollama/*"]}, False, True, {"enabledModels": [MODEL_REF, "ollama/*"]}),
        ({"enabledModels": []}, False, True, {"enabledModels": [MODEL_REF]}),
    ],
    ids=["untouched", "set-default", "keep-default", "append", "enable-off", "already-there", "empty-list"],
)
def test_with_settings(settings, set_default, enable_model, expected):
    updated = with_settings(
        settings,
        "settings.json",
        provider="dsv41-sparks",
        model_id="deepseek-v4.1-flash",
        set_default=set_default,
        enable_model=enable_model,
    )
    assert updated == expected


def plan(models_text, settings_text, *, set_default=False, enable_model=True):
    return plan_pi_config(
        CONFIG_DIR,
        models_text,
        settings_text,
        provider="dsv41-sparks",
        entry=entry(),
        set_default=set_default,
        enable_model=enable_model,
    )


def test_plan_fresh_config_needs_no_settings_file():
    result = plan(None, None)
    assert [p.file.path for p in result.changed_files] == [f"{CONFIG_DIR}/models.json"]
    assert result.settings is None
    assert json.loads(result.models.file.after) == {"providers": {"dsv41-sparks": entry()}}
    assert result.models.file.after.endswith("}\n")


def test_plan_fresh_config_with_default_creates_settings():
    result = plan(None, None, set_default=True)
    assert [p.file.path for p in result.changed_files] == [
        f"{CONFIG_DIR}/models.json",
        f"{CONFIG_DIR}/settings.json",
    ]


def test_plan_is_stable_and_keeps_user_formatting_when_meaning_is_unchanged():
    first = plan(fixture_text("models_other_providers.json"), fixture_text("settings_enabled_models.json"))
    assert len(first.changed_files) == 2
    # Same meaning, different formatting (indent 4, other key order): not rewritten.
    reformatted = json.dumps(json.loads(first.models.file.after), indent=4, sort_keys=True)
    second = plan(reformatted, first.settings.file.after)
    assert second.changed_files == []
    assert second.models.file.after == reformatted


def test_plan_tells_true_from_one():
    models = {"providers": {"dsv41-sparks": entry()}}
    models["providers"]["dsv41-sparks"]["models"][0]["reasoning"] = 1
    assert len(plan(json.dumps(models), None).changed_files) == 1


def test_plan_blank_models_file_is_an_empty_config():
    assert json.loads(plan("\n", None).models.file.after) == {"providers": {"dsv41-sparks": entry()}}


@pytest.mark.parametrize(
    ("models", "settings", "path", "problem"),
    [
        ("models_trailing_comma.json", None, "models.json", "not valid JSON: Expecting property name"),
        ("models_top_level_array.json", None, "models.json", "JSON object at the top level, found an array"),
        ("models_providers_array.json", None, "models.json", "'providers' must be an object, found an array"),
        (
            "models_other_providers.json",
            "settings_enabled_models_string.json",
            "settings.json",
            "'enabledModels' must be an array, found a string",
        ),
    ],
)
def test_plan_errors_name_the_file(models, settings, path, problem):
    with pytest.raises((FileContentError, PiConfigError)) as caught:
        plan(fixture_text(models), fixture_text(settings) if settings else None)
    message = str(caught.value)
    assert message.startswith(f"{CONFIG_DIR}/{path}")
    assert problem in message
    assert "left untouched" in message


def test_malformed_json_error_gives_the_position():
    with pytest.raises(FileContentError, match=r"line 6 column 5 \(character 128\)"):
        plan(fixture_text("models_trailing_comma.json"), None)


def test_redacted_masks_other_providers_credentials_only():
    models = with_provider(
        json.loads(fixture_text("models_other_providers.json")), "models.json", "dsv41-sparks", entry()
    )
    shown = redacted(models, "dsv41-sparks")
    proxy = shown["providers"]["anthropic-proxy"]
    assert proxy["apiKey"] == MASK
    assert proxy["headers"] == {"x-portkey-api-key": MASK, "x-trace": MASK}
    assert shown["providers"]["dsv41-sparks"]["apiKey"] == "!printenv DSV41_API_KEY"
    assert "LITERAL" not in json.dumps(shown)
    assert models["providers"]["anthropic-proxy"]["apiKey"].startswith("sk-ant-")  # input unchanged


def test_a_model_of_another_recipe_is_described_as_its_recipe_says():
    """A model that does not reason gets no thinking levels; text-only, under its own display name."""
    plain = entry(model_id="tiny", model_name="Tiny", reasoning=False, input_kinds=["text"])
    (model,) = plain["models"]
    assert plain["name"] == "Tiny on DGX Sparks"
    assert (model["id"], model["name"], model["reasoning"], model["input"]) == (
        "tiny",
        "Tiny",
        False,
        ["text"],
    )
    assert "thinkingLevelMap" not in model


@pytest.mark.parametrize("kinds", [[], ["text", "audio"]])
def test_an_input_pi_does_not_know_is_refused(kinds):
    with pytest.raises(PiConfigError, match="input must name text and/or image"):
        entry(input_kinds=kinds)
