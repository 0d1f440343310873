"""The vllm_serve_args and vllm_rank_env filters: registered under their names, every setting required.

The filters import ``ansible.errors``, which switches the whole process to controller mode (module
warnings then go to the display instead of the result). So they are exercised in a child
interpreter, and the module tests running in this process keep seeing module behaviour.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

COLLECTIONS = Path(__file__).resolve().parents[4] / "collections"
SERVE = {
    "node_rank": 1, "nnodes": 2, "master_addr": "198.18.0.13", "master_port": 29655,
    "served_model_name": "m", "kv_cache_memory_bytes": 1, "gpu_memory_utilization": 0.5, "max_model_len": 8,
    "max_num_seqs": 1, "max_num_batched_tokens": 8, "num_speculative_tokens": 0, "cudagraph_mode": "NONE",
    "engine_host": "127.0.0.1", "engine_port": 8001,
}  # fmt: skip
ENV = {"ifname": "e", "hcas": "h", "host_ip": "1.2.3.4", "gid_index": 3, "plan_name": "p.json"}
CHILD = """
import json, sys
from ansible.errors import AnsibleFilterError
from ansible_collections.sparkserve.dsv41.plugins.filter import vllm_rank_env, vllm_serve_args

filters = {**vllm_serve_args.FilterModule().filters(), **vllm_rank_env.FilterModule().filters()}
results = []
for name, settings in json.load(sys.stdin):
    try:
        results.append({"value": filters[name](settings)})
    except AnsibleFilterError as err:
        results.append({"error": str(err)})
json.dump(results, sys.stdout)
"""


def apply(*cases: tuple[str, object]) -> list[dict]:
    """Each ``(filter name, settings)`` through the filter in a child interpreter: value or error."""
    run = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(COLLECTIONS), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(run.stdout)


def test_the_filters_render_the_settings():
    args, env = apply(("vllm_serve_args", SERVE), ("vllm_rank_env", ENV))
    assert args["value"][:3] == ["/model", "--served-model-name", "m"]
    assert env["value"]["ST_EXL3_PLAN"] == "/plans/p.json"


@pytest.mark.parametrize(("name", "settings", "missing"), [("vllm_serve_args", SERVE, "engine_port"),
                                                           ("vllm_rank_env", ENV, "plan_name")])  # fmt: skip
def test_a_missing_setting_is_named(name, settings, missing):
    (result,) = apply((name, {key: value for key, value in settings.items() if key != missing}))
    assert result["error"].startswith(f"{name}: ") and f"'{missing}'" in result["error"]


@pytest.mark.parametrize("name", ["vllm_serve_args", "vllm_rank_env"])
def test_settings_must_be_a_dict(name):
    (result,) = apply((name, []))
    assert result == {"error": f"{name} takes a dict of settings, got list"}
