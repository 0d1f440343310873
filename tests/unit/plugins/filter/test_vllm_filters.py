"""The vllm_serve_args and vllm_rank_env filters: registered under their names, every setting required.

The filters import ``ansible.errors``, which switches the whole process to controller mode (module
warnings then go to the display instead of the result). So they are exercised in a child
interpreter, and the module tests running in this process keep seeing module behaviour.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_docs import plugin_doc

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


def documented(name: str) -> tuple[set[str], set[str]]:
    """The keys the filter's ``_input`` documentation names as required, and as optional."""
    items = plugin_doc("filter", name, "DOCUMENTATION")["options"]["_input"]["description"]

    def names(item: str) -> set[str]:
        return set(re.findall(r"C\(([a-z_]+)\)", item))

    optional = [item for item in items if item.startswith("May be left out")]
    return set().union(*(names(item) for item in items if item not in optional)), names(optional[0])


@pytest.mark.parametrize(("name", "settings"), [("vllm_serve_args", SERVE), ("vllm_rank_env", ENV)])
def test_the_settings_documented_as_required_are_exactly_those_the_filter_requires(name, settings):
    required, _ = documented(name)
    assert required == set(settings)
    each_left_out = [(name, {key: value for key, value in settings.items() if key != o}) for o in settings]
    for left_out, result in zip(settings, apply(*each_left_out), strict=True):
        assert f"'{left_out}'" in result.get("error", ""), (left_out, result)


OPTIONAL = {
    "vllm_serve_args": {"recipe": None, "cudagraph_capture_sizes": [1, 2], "extra_args": ["--x"],
                        "allowed_media_domains": ["media.example"], "model": "/m"},
    "vllm_rank_env": {"recipe": None, "extra": {"A": "1"}},
}  # fmt: skip


@pytest.mark.parametrize(("name", "settings"), [("vllm_serve_args", SERVE), ("vllm_rank_env", ENV)])
def test_the_settings_documented_as_optional_are_taken(name, settings):
    _, optional = documented(name)
    assert set(OPTIONAL[name]) <= optional
    (result,) = apply((name, {**settings, **OPTIONAL[name]}))
    assert "value" in result, result
