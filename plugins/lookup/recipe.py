# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Lookup plugin recipe: see DOCUMENTATION."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: recipe
short_description: Read and check a model recipe
version_added: 0.2.0
author: sparkserve maintainers (@sparkserve)
description:
  - Returns the model recipe a C(deployment_recipe) value names, checked field by field, with every
    optional field filled in. The deployment role reads it once per run as C(deployment_recipe_spec).
  - A bare name is looked up as C(<dir>/recipes/<name>.yml) in each directory of O(paths), then among
    the recipes the collection ships (C(deepseek-v4.1-flash), C(vllm-generic)). By default O(paths) is
    the directory beside each inventory source - the one holding an inventory file
    (C(-i inventory/sparks/hosts.yml) looks in C(inventory/sparks/recipes/)), the parent of an inventory
    directory (Ansible reads every file inside one as inventory) - then the playbook's directory.
  - A value with a C(/) or ending in C(.yml) is a file, relative to the first of O(paths).
  - A recipe that is wrong fails the lookup with every field that is wrong named.
options:
  _terms:
    description: The recipe's name or file (one); null is the default recipe, C(deepseek-v4.1-flash).
    required: true
    type: list
    elements: str
  paths:
    description: Directories to look in before the shipped recipes.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Show the served model name of the recipe in use
  ansible.builtin.debug:
    msg: "{{ lookup('sparkserve.dsv41.recipe', deployment_recipe).served_model_name }}"
"""

RETURN = r"""
_raw:
  description: The recipe, one mapping (docs/recipes.md lists its fields).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.sparkserve.dsv41.plugins.module_utils._recipe import (
    DEFAULT_RECIPE,
    RecipeError,
    load_named,
    search_dirs,
)


def default_paths(variables):
    sources = [str(source) for source in variables.get("ansible_inventory_sources") or []]
    return search_dirs(sources, variables.get("playbook_dir"))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if len(terms) != 1:
            raise AnsibleLookupError(f"recipe takes one recipe name or file, got {len(terms)}")
        paths = self.get_option("paths")
        if paths is None:
            paths = default_paths(variables or {})
        try:
            # None (deployment_recipe unset, as on a client play's controller): the default recipe.
            name = DEFAULT_RECIPE if terms[0] is None else str(terms[0])
            return [load_named(name, [str(path) for path in paths])]
        except RecipeError as error:
            raise AnsibleLookupError(str(error)) from error
