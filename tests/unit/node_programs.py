"""The node programs (roles/*/files/dsv41_*.py) loaded as their tests use them: standalone scripts,
imported from the path the role installs them from, their sibling modules importable by name
(pyproject's pythonpath), as on a node."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]


def program_path(role: str, name: str) -> Path:
    return REPO_ROOT / "roles" / role / "files" / f"{name}.py"


def load_program(role: str, name: str, module_name: str | None = None) -> ModuleType:
    """``roles/<role>/files/<name>.py`` as the module ``module_name`` (default ``name``; another
    gives a copy of its own), registered in sys.modules: its dataclasses resolve their
    annotations through it."""
    spec = importlib.util.spec_from_file_location(module_name or name, program_path(role, name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
