"""What the rank role's start says when the fabric or fit check fails (roles/rank/tasks/start.yml),
rendered with Jinja as Ansible renders it: the rank containers it starts again are those that
served before, except in the rollback of a failed switch, where they are the switch's."""

from __future__ import annotations

import jinja2
import pytest
import yaml
from role_defaults import ROLES

START = yaml.safe_load((ROLES / "rank" / "tasks" / "start.yml").read_text())


def failure_message(groups: dict[str, list[str]]) -> str:
    (checks,) = [
        task for task in START if task.get("name") == "Check the fabric and the memory before the ranks start"
    ]
    (fail,) = [task for task in checks["rescue"] if "ansible.builtin.fail" in task]
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    values = {
        "ansible_failed_result": {"msg": "A rank does not fit: worker: 3.0 GiB short"},
        "inventory_hostname": "worker",
        "groups": groups,
    }
    return environment.from_string(fail["ansible.builtin.fail"]["msg"]).render(values)


@pytest.mark.parametrize(
    ("groups", "said"),
    [
        pytest.param({"all": ["head", "worker"]}, "(the ranks that served before run again)", id="a-switch"),
        pytest.param(
            {"all": ["head", "worker"], "release_switch_failed": ["head", "worker"]},
            "(the rollback stopped here: the failed switch's ranks are started again)",
            id="a-failed-switchs-rollback",
        ),
    ],
)
def test_a_failed_check_says_which_ranks_run_again(groups: dict, said: str) -> None:
    assert failure_message(groups) == f"A rank does not fit: worker: 3.0 GiB short {said}"
