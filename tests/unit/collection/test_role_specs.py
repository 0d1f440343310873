"""Every role's `meta/argument_specs.yml` types each of its `defaults/main.yml` variables and gives
the same default, as ansible-doc shows it (a spec's default is documentation: Ansible takes the
value from defaults/main.yml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = sorted(path for path in (Path(__file__).resolve().parents[3] / "roles").iterdir() if path.is_dir())


def options(role: Path) -> dict[str, dict]:
    """Every option of every entry point of the role's argument specs."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return {name: option for spec in specs.values() for name, option in (spec.get("options") or {}).items()}


@pytest.mark.parametrize("role", ROLES, ids=[role.name for role in ROLES])
def test_each_default_is_typed_with_the_same_default(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    typed = options(role)
    assert sorted(set(defaults) - set(typed)) == [], "defaults without an argument spec"
    differing = {
        name: (typed[name].get("default"), value)
        for name, value in defaults.items()
        if typed[name].get("default") != value and not (value is None and "default" not in typed[name])
    }
    assert differing == {}, "argument spec default vs defaults/main.yml"
