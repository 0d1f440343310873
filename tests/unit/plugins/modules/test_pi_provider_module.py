"""sparkserve.dsv41.pi_provider run in-process against realistic Pi configurations."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.modules import pi_provider
from dir_snapshot import snapshot

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pi"
MODEL_REF = "dsv41-sparks/deepseek-v4.1-flash"
BASE_URL = "http://192.168.100.10:8000/v1"


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    return tmp_path / "home" / ".pi" / "agent"


def install(agent_dir: Path, models: str | None = None, settings: str | None = None) -> None:
    """Put fixture files in place as Pi would have left them (0600 like Pi's own writes)."""
    agent_dir.mkdir(parents=True, exist_ok=True)
    for fixture, name in ((models, "models.json"), (settings, "settings.json")):
        if fixture:
            shutil.copyfile(FIXTURES / fixture, agent_dir / name)
            (agent_dir / name).chmod(0o600)


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def args(agent_dir: Path, **extra) -> dict:
    return {"config_dir": str(agent_dir), "base_url": BASE_URL, **extra}


# module.backup_local's names: <file>.<pid>.<YYYY-MM-DD@HH:MM:SS>~
BACKUP_NAME = re.compile(r"(models|settings)\.json\.\d+\.\d{4}-\d\d-\d\d@\d\d:\d\d:\d\d~")


def backups(agent_dir: Path) -> list[str]:
    return sorted(path.name for path in agent_dir.iterdir() if BACKUP_NAME.fullmatch(path.name))


def test_fresh_machine_creates_directory_and_models_only(run_module, agent_dir):
    result = run_module(pi_provider, args(agent_dir))
    assert result["changed"] is True
    assert agent_dir.stat().st_mode & 0o777 == 0o700
    models_file = agent_dir / "models.json"
    assert models_file.stat().st_mode & 0o777 == 0o600
    models = load(models_file)
    assert list(models["providers"]) == ["dsv41-sparks"]
    provider = models["providers"]["dsv41-sparks"]
    assert provider["baseUrl"] == BASE_URL
    assert provider["apiKey"] == "!printenv DSV41_API_KEY"
    assert models_file.read_text().endswith("}\n") and models_file.read_text().startswith('{\n  "providers"')
    assert not (agent_dir / "settings.json").exists()
    assert result["backup_files"] == []
    assert result["model"] == MODEL_REF
    assert result["changed_files"] == [str(models_file)]


def test_fresh_machine_with_set_default_creates_settings(run_module, agent_dir):
    run_module(pi_provider, args(agent_dir, set_default=True))
    assert load(agent_dir / "settings.json") == {
        "defaultProvider": "dsv41-sparks",
        "defaultModel": "deepseek-v4.1-flash",
    }
    assert (agent_dir / "settings.json").stat().st_mode & 0o777 == 0o600


def test_other_providers_and_settings_are_kept(run_module, agent_dir):
    install(agent_dir, "models_other_providers.json", "settings_enabled_models.json")
    (agent_dir / "models.json").chmod(0o644)
    original_models = load(agent_dir / "models.json")
    original_settings = load(agent_dir / "settings.json")

    result = run_module(pi_provider, args(agent_dir))
    assert result["changed"] is True
    models = load(agent_dir / "models.json")
    assert list(models["providers"]) == ["anthropic-proxy", "ollama", "dsv41-sparks"]
    for name in ("anthropic-proxy", "ollama"):
        assert models["providers"][name] == original_models["providers"][name]
    assert (agent_dir / "models.json").stat().st_mode & 0o777 == 0o644  # existing mode kept

    settings = load(agent_dir / "settings.json")
    assert list(settings) == list(original_settings)
    assert settings["enabledModels"] == [*original_settings["enabledModels"], MODEL_REF]
    assert {k: v for k, v in settings.items() if k != "enabledModels"} == {
        k: v for k, v in original_settings.items() if k != "enabledModels"
    }

    assert len(result["backup_files"]) == 2
    for backup in result["backup_files"]:
        name = Path(backup).name
        assert name.startswith(("models.json.", "settings.json.")) and BACKUP_NAME.fullmatch(name)
        original = FIXTURES / (
            "models_other_providers.json" if name.startswith("models") else "settings_enabled_models.json"
        )
        assert Path(backup).read_bytes() == original.read_bytes()


def test_second_run_changes_and_backs_up_nothing(run_module, agent_dir):
    install(agent_dir, "models_other_providers.json", "settings_enabled_models.json")
    run_module(pi_provider, args(agent_dir, set_default=True))
    before = snapshot(agent_dir)
    second = run_module(pi_provider, args(agent_dir, set_default=True))
    assert second["changed"] is False
    assert second["backup_files"] == [] and second["changed_files"] == []
    assert snapshot(agent_dir) == before


def test_stale_entry_is_replaced_in_place(run_module, agent_dir):
    install(agent_dir, "models_stale_dsv41.json")
    result = run_module(pi_provider, args(agent_dir, base_url="http://10.0.0.7:8000/"))
    models = load(agent_dir / "models.json")
    assert list(models) == ["$schema", "providers"]
    assert list(models["providers"]) == ["ollama", "dsv41-sparks", "openrouter"]
    provider = models["providers"]["dsv41-sparks"]
    assert provider["baseUrl"] == "http://10.0.0.7:8000/v1"
    assert provider["apiKey"] == "!printenv DSV41_API_KEY"
    assert provider["models"][0]["maxTokens"] == 262144
    assert [Path(p).name.split(".")[0:2] for p in result["backup_files"]] == [["models", "json"]]


@pytest.mark.parametrize(
    ("settings_fixture", "enable_model", "expect_appended"),
    [
        ("settings_enabled_models.json", True, True),
        ("settings_enabled_models.json", False, False),
        ("settings_no_enabled_models.json", True, False),
    ],
)
def test_enabled_models_only_extended_when_the_list_exists(
    run_module, agent_dir, settings_fixture, enable_model, expect_appended
):
    install(agent_dir, "models_other_providers.json", settings_fixture)
    original = (agent_dir / "settings.json").read_bytes()
    result = run_module(pi_provider, args(agent_dir, enable_model=enable_model))
    settings = load(agent_dir / "settings.json")
    if expect_appended:
        assert settings["enabledModels"][-1] == MODEL_REF
        assert str(agent_dir / "settings.json") in result["changed_files"]
    else:
        assert (agent_dir / "settings.json").read_bytes() == original
        assert "enabledModels" not in settings or MODEL_REF not in settings["enabledModels"]
        assert result["changed_files"] == [str(agent_dir / "models.json")]


def test_enabled_models_already_listed_is_not_duplicated(run_module, agent_dir):
    install(agent_dir, "models_other_providers.json", "settings_enabled_models.json")
    run_module(pi_provider, args(agent_dir))
    run_module(pi_provider, args(agent_dir))
    assert load(agent_dir / "settings.json")["enabledModels"].count(MODEL_REF) == 1


@pytest.mark.parametrize("set_default", [True, False])
def test_set_default(run_module, agent_dir, set_default):
    install(agent_dir, "models_other_providers.json", "settings_no_enabled_models.json")
    run_module(pi_provider, args(agent_dir, set_default=set_default))
    settings = load(agent_dir / "settings.json")
    expected = ("dsv41-sparks", "deepseek-v4.1-flash") if set_default else ("ollama", "llama3.1:8b")
    assert (settings["defaultProvider"], settings["defaultModel"]) == expected
    assert settings["theme"] == "light" and settings["hideThinkingBlock"] is False


@pytest.mark.parametrize(
    ("fixtures", "problem"),
    [
        (("models_trailing_comma.json", None), "models.json is not valid JSON"),
        (("models_top_level_array.json", None), "models.json must hold a JSON object"),
        (("models_providers_array.json", None), "models.json: 'providers' must be an object"),
        (
            ("models_other_providers.json", "settings_enabled_models_string.json"),
            "settings.json: 'enabledModels' must be an array",
        ),
    ],
)
def test_invalid_files_fail_without_touching_anything(run_module, agent_dir, fixtures, problem):
    install(agent_dir, *fixtures)
    before = snapshot(agent_dir)
    result = run_module(pi_provider, args(agent_dir, set_default=True))
    assert result.failed
    assert f"{agent_dir}/{problem}" in result["msg"]
    assert snapshot(agent_dir) == before


def test_malformed_json_error_gives_the_position(run_module, agent_dir):
    install(agent_dir, "models_trailing_comma.json")
    result = run_module(pi_provider, args(agent_dir))
    assert "line 6 column 5" in result["msg"]


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("http://192.168.100.10:8000", "http://192.168.100.10:8000/v1"),
        ("http://192.168.100.10:8000/", "http://192.168.100.10:8000/v1"),
        ("http://192.168.100.10:8000/v1/", "http://192.168.100.10:8000/v1"),
        ("https://sparks.example.net/dsv41", "https://sparks.example.net/dsv41/v1"),
    ],
)
def test_base_url_is_normalised(run_module, agent_dir, base_url, expected):
    result = run_module(pi_provider, args(agent_dir, base_url=base_url))
    assert result["base_url"] == expected
    assert load(agent_dir / "models.json")["providers"]["dsv41-sparks"]["baseUrl"] == expected


@pytest.mark.parametrize(
    "base_url", ["spark-head:8000", "ftp://spark-head/v1", "http://h:8000/v1/chat/completions"]
)
def test_bad_base_url_fails_before_anything_is_created(run_module, agent_dir, base_url):
    result = run_module(pi_provider, args(agent_dir, base_url=base_url))
    assert result.failed and "base_url" in result["msg"]
    assert not agent_dir.exists()


def test_custom_key_variable_and_names(run_module, agent_dir):
    result = run_module(
        pi_provider,
        args(agent_dir, name="sparks-lab", model_id="dsv41", api_key_env="SPARKS_KEY", context_window=131072),
    )
    provider = load(agent_dir / "models.json")["providers"]["sparks-lab"]
    assert provider["apiKey"] == "!printenv SPARKS_KEY"
    assert provider["models"][0]["id"] == "dsv41"
    assert provider["models"][0]["contextWindow"] == 131072
    assert result["model"] == "sparks-lab/dsv41"


def test_invalid_key_variable_fails(run_module, agent_dir):
    result = run_module(pi_provider, args(agent_dir, api_key_env="$(cat ~/.ssh/id_rsa)"))
    assert result.failed and "api_key_env" in result["msg"]


def test_config_dir_defaults(run_module, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PI_CODING_AGENT_DIR", raising=False)
    result = run_module(pi_provider, {"base_url": BASE_URL})
    assert result["config_dir"] == str(tmp_path / "home" / ".pi" / "agent")
    assert (tmp_path / "home" / ".pi" / "agent" / "models.json").is_file()

    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(tmp_path / "pi-profile"))
    result = run_module(pi_provider, {"base_url": BASE_URL})
    assert result["models_file"] == str(tmp_path / "pi-profile" / "models.json")
    assert (tmp_path / "pi-profile" / "models.json").is_file()

    result = run_module(pi_provider, {"base_url": BASE_URL, "config_dir": "~/custom"})
    assert result["config_dir"] == str(tmp_path / "home" / "custom")


def test_backup_false_writes_no_backup(run_module, agent_dir):
    install(agent_dir, "models_other_providers.json")
    result = run_module(pi_provider, args(agent_dir, backup=False))
    assert result["changed"] is True and result["backup_files"] == []
    assert backups(agent_dir) == []


def test_user_formatting_is_not_rewritten_when_nothing_changes(run_module, agent_dir):
    run_module(pi_provider, args(agent_dir))
    models_file = agent_dir / "models.json"
    models_file.write_text(json.dumps(load(models_file), indent=4, sort_keys=True))
    before = snapshot(agent_dir)
    assert run_module(pi_provider, args(agent_dir))["changed"] is False
    assert snapshot(agent_dir) == before


@pytest.mark.parametrize("prepared", [False, True])
def test_check_mode_changes_nothing(run_module, agent_dir, prepared):
    if prepared:
        install(agent_dir, "models_other_providers.json", "settings_enabled_models.json")
    before = snapshot(agent_dir.parents[2])
    result = run_module(pi_provider, args(agent_dir, set_default=True), check_mode=True, diff=True)
    assert result["changed"] is True
    assert result["backup_files"] == []
    assert len(result["diff"]) == 2
    assert snapshot(agent_dir.parents[2]) == before
    assert agent_dir.exists() is prepared


def test_diff_shows_changes_and_masks_other_credentials(run_module, agent_dir):
    install(agent_dir, "models_other_providers.json", "settings_enabled_models.json")
    result = run_module(pi_provider, args(agent_dir), diff=True)
    models_diff, settings_diff = result["diff"]
    assert models_diff["before_header"] == models_diff["after_header"] == str(agent_dir / "models.json")
    assert "dsv41-sparks" not in models_diff["before"] and "dsv41-sparks" in models_diff["after"]
    assert "!printenv DSV41_API_KEY" in models_diff["after"]
    assert MODEL_REF in settings_diff["after"] and MODEL_REF not in settings_diff["before"]
    assert "LITERAL" not in json.dumps(result)
    assert '"ollama"' in models_diff["after"]  # not a secret, shown as it is
    # The files themselves keep the literal values.
    assert "LITERALSECRET" in (agent_dir / "models.json").read_text()


def test_no_diff_when_unchanged(run_module, agent_dir):
    run_module(pi_provider, args(agent_dir))
    result = run_module(pi_provider, args(agent_dir), diff=True)
    assert result["changed"] is False and "diff" not in result


def test_backups_keep_the_mode_and_are_listed(run_module, agent_dir):
    install(agent_dir, "models_other_providers.json", "settings_enabled_models.json")
    (agent_dir / "models.json").chmod(0o640)
    result = run_module(pi_provider, args(agent_dir))
    assert sorted(Path(p).name for p in result["backup_files"]) == backups(agent_dir)
    assert len(backups(agent_dir)) == 2
    modes = {name.split(".")[0]: (agent_dir / name).stat().st_mode & 0o777 for name in backups(agent_dir)}
    assert modes == {"models": 0o640, "settings": 0o600}
    assert run_module(pi_provider, args(agent_dir))["backup_files"] == []
    assert len(backups(agent_dir)) == 2
