"""A plugin's documentation, read from its source: importing a filter plugin imports ansible's
controller, which switches the whole process to controller mode (the module tests must not see it)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import yaml

PLUGINS = Path(__file__).resolve().parents[2] / "collections/ansible_collections/sparkserve/dsv41/plugins"


def plugin_doc(kind: str, name: str, block: str) -> Any:
    """The ``block`` (DOCUMENTATION, EXAMPLES or RETURN) of plugin ``name`` of ``kind`` (filter, ...)."""
    source = (PLUGINS / kind / f"{name}.py").read_text()
    (text,) = [
        node.value.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == block
    ]
    return yaml.safe_load(text)
