"""Every play of site.yml that runs a role whose main tasks notify handlers forces them: a restart
that a changed file asked for must happen even when a later task fails, since the next run finds
the file as asked and asks for nothing (the daemon would run its old configuration until a reboot)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
NOTIFYING = {
    path.parent.parent.name
    for path in (REPO / "roles").glob("*/tasks/main.yml")
    if "notify:" in path.read_text()
}


def tasks_in(tasks: list[dict]) -> list[dict]:
    """Every task, those inside blocks included."""
    found = []
    for task in tasks:
        found.append(task)
        for part in ("block", "rescue", "always"):
            found.extend(tasks_in(task.get(part, [])))
    return found


def roles_of(play: dict) -> set[str]:
    """The roles whose main tasks the play runs."""
    imports = [task.get("ansible.builtin.import_role", {}) for task in tasks_in(play.get("tasks", []))]
    return {role["name"].rsplit(".", 1)[-1] for role in imports if role and "tasks_from" not in role}


def test_the_plays_that_run_roles_with_handlers_force_them():
    plays = yaml.safe_load((REPO / "playbooks" / "site.yml").read_text())
    with_handlers = [play for play in plays if roles_of(play) & NOTIFYING]
    assert with_handlers, "site.yml runs the memory guard, the ranks and the supervisor"
    assert [play["name"] for play in with_handlers if play.get("force_handlers") is not True] == []
