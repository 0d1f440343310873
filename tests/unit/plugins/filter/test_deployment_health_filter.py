"""The deployment_health filter: registered under its name, the table added, bad input refused.

Run in a child interpreter, as the other filters are (importing ``ansible.errors`` switches this
process to controller mode, which the module tests must not see).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from plugin_docs import plugin_doc

COLLECTIONS = Path(__file__).resolve().parents[4] / "collections"
CHILD = """
import json, sys
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.filter import deployment_health

health = deployment_health.FilterModule().filters()["deployment_health"]
results = []
for args, kwargs in json.load(sys.stdin):
    try:
        results.append({"value": health(*args, **kwargs)})
    except AnsibleFilterError as err:
        results.append({"error": str(err)})
json.dump(results, sys.stdout)
"""
STATUS = {"state": "running", "container": "dsv41-r0", "started_at": "T", "mem_available_bytes": 1}
NODE = {"name": "head", "rank": 0, "guard": "active", "error": None, "status": STATUS}
API = {"health": 200, "running": 0, "waiting": 0, "generation_tokens_total": 1}


def apply(*cases) -> list[dict]:
    run = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(COLLECTIONS), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(run.stdout)


def test_the_filter_judges_and_adds_the_table_and_refuses_what_is_not_a_node_list():
    written = time.time()
    watching = {"state": "healthy", "updated": written}
    # As the supervisor's state file says it.
    stalled = {
        **API,
        "running": 1,
        "stalled": "1 request(s) running, no new tokens for 100 s (hang threshold 60 s)",
    }
    healthy, degraded, hung, refused = apply(
        [[[NODE], API], {"supervisor_enabled": False}],
        [[[NODE], {**API, "health": 503}], {"supervisor_enabled": False}],
        [[[NODE], stalled, watching], {}],
        [["head", API], {}],
    )
    assert healthy["value"]["healthy"] is True
    assert healthy["value"]["table"].splitlines()[-1] == "healthy"
    assert degraded["value"]["problems"] == ["API: /health answered 503"]
    assert hung["value"]["problems"][0].startswith("API: hung - 1 request(s) running, no new tokens for")
    assert "deployment_health wants a list of nodes" in refused["error"]


def test_the_verdict_has_every_key_documented_and_no_other():
    documented = plugin_doc("filter", "deployment_health", "RETURN")["_value"]["contains"]
    (verdict,) = apply([[[{**NODE, "host_stack": {"kernel": "6.11"}}], API], {"supervisor_enabled": False}])
    assert set(verdict["value"]) == set(documented)
