"""The inventory of the playbook tests that run a role's entry point on this machine.

Two hosts in the collection's default groups, a head and a worker, both this machine over the
local connection with this Python: both have this user's home and can run the modules.
"""

from __future__ import annotations

import sys

INVENTORY = {
    "all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {
            "head": {"hosts": {"spark-head": {}}},
            "workers": {"hosts": {"spark-worker": {}}},
        },
    }
}
