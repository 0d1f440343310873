"""Run a module's ``main()`` in-process, exactly as Ansible would hand it its arguments."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args


class ModuleResult(dict):
    """The JSON a module printed, plus whether it failed (``fail_json``)."""

    @property
    def failed(self) -> bool:
        return bool(self.get("failed"))


@pytest.fixture
def run_module(capsys):
    """Call ``run_module(module, args, check_mode=False, diff=False)`` -> ModuleResult."""

    def _run(module, args: dict[str, Any], check_mode: bool = False, diff: bool = False) -> ModuleResult:
        full_args = dict(args)
        full_args["_ansible_check_mode"] = check_mode
        full_args["_ansible_diff"] = diff
        capsys.readouterr()
        # A real module run starts with no warnings; ansible-core keeps them process-wide.
        ansible_warnings._global_warnings.clear()
        with patch_module_args(full_args), pytest.raises(SystemExit):
            module.main()
        out = capsys.readouterr().out
        return ModuleResult(json.loads(out))

    return _run
