"""The collection's role defaults as a play sees them, for tests that hold them against the reference.

A role's ``defaults/main.yml`` is plain YAML values, except templates over other defaults
(``deployment_api_key_file``, ``pi_model_id``) and over the model recipe (``deployment_recipe_spec``, which a
play reads with the ``recipe`` lookup): those are rendered here with Jinja2's native types, as Ansible does,
against the defaults of the roles loaded together and the recipe ``deployment_recipe`` names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils._recipe import DEFAULT_RECIPE, load_named
from jinja2.nativetypes import NativeEnvironment

ROLES = Path(__file__).resolve().parent.parent / "roles"
# The role whose defaults are the settings every role shares (dsv41_*).
SHARED_ROLE = "deployment"


def role_defaults(*roles: str) -> dict[str, Any]:
    """The defaults of ``roles`` (later roles win, as in a play), templates rendered."""
    defaults: dict[str, Any] = {}
    for role in roles:
        defaults.update(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {})
    # What the recipe lookup gives the roles: the deployment role's fact and the client roles' own.
    recipe = load_named(defaults.get("deployment_recipe", DEFAULT_RECIPE))
    if "deployment_recipe_spec" in defaults:
        defaults["deployment_recipe_spec"] = recipe
    context = {f"__{role}_recipe": recipe for role in roles}
    environment = NativeEnvironment()
    for _ in range(len(defaults)):  # a template over a template resolves on a later pass
        templates = {
            name: value for name, value in defaults.items() if isinstance(value, str) and "{{" in value
        }
        if not templates:
            break
        for name, value in templates.items():
            defaults[name] = environment.from_string(value).render({**context, **defaults})
    return defaults
