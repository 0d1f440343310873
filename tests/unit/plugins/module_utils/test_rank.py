"""The rank's command line and environment: the rank role's defaults give the reference, value for value.

The functions have no defaults of their own: every setting is the rank role's variable, so the
tests build the settings from ``roles/rank/defaults/main.yml`` and the deployment role's defaults, the
way ``roles/rank/tasks/main.yml`` passes them to the filters.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._rank import (
    cudagraph_capture_sizes,
    vllm_rank_env,
    vllm_serve_args,
)
from reference_config import reference_vllm_argv, reference_vllm_env
from role_defaults import SHARED_ROLE, role_defaults

DEFAULTS = role_defaults(SHARED_ROLE, "rank")
# What fabric discovery finds on the reference pair (the head's side); NCCL_IB_GID_INDEX comes
# from it while rank_gid_index is unset.
IFNAME, HCAS, HOST_IP, GID_INDEX = "enp1s0f1np1", "rocep1s0f1,roceP2p1s0f1", "198.18.0.11", 3


def serve_settings(node_rank: int, nnodes: int, master_addr: str, **overrides: Any) -> dict[str, Any]:
    """The settings roles/rank/tasks/main.yml gives vllm_serve_args, with the roles' defaults."""
    settings = {
        "node_rank": node_rank,
        "nnodes": nnodes,
        "master_addr": master_addr,
        "master_port": DEFAULTS["rank_master_port"],
        "served_model_name": DEFAULTS["deployment_served_model_name"],
        "kv_cache_memory_bytes": DEFAULTS["rank_kv_cache_memory_bytes"],
        "gpu_memory_utilization": DEFAULTS["rank_gpu_memory_utilization"],
        "max_model_len": DEFAULTS["rank_max_model_len"],
        "max_num_seqs": DEFAULTS["rank_max_num_seqs"],
        "max_num_batched_tokens": DEFAULTS["rank_max_num_batched_tokens"],
        "num_speculative_tokens": DEFAULTS["rank_num_speculative_tokens"],
        "cudagraph_mode": DEFAULTS["rank_cudagraph_mode"],
        "capture_sizes": DEFAULTS["rank_cudagraph_capture_sizes"],
        "engine_host": "127.0.0.1",
        "engine_port": DEFAULTS["deployment_engine_port"],
        "allowed_media_domains": DEFAULTS["rank_allowed_media_domains"],
        "extra_args": DEFAULTS["rank_extra_args"],
    }
    return {**settings, **overrides}


def env_settings(**overrides: Any) -> dict[str, Any]:
    """The settings roles/rank/tasks/main.yml gives vllm_rank_env, with the role's defaults."""
    settings = {
        "ifname": IFNAME,
        "hcas": HCAS,
        "host_ip": HOST_IP,
        "gid_index": GID_INDEX,
        "plan_name": DEFAULTS["rank_plan_name"],
        "extra": DEFAULTS["rank_extra_env"],
    }
    return {**settings, **overrides}


@pytest.mark.parametrize(
    ("nspec", "max_seqs", "sizes"),
    [
        (7, 2, [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]),  # the reference
        (7, 1, [1, 2, 3, 4, 5, 6, 7, 8]),
        (3, 4, [1, 2, 3, 4, 8, 12, 16]),
        (0, 3, [1, 3]),  # steps of 4 from 1, plus the cap
        (5, 3, [1, 2, 3, 4, 5, 6, 10, 14, 18]),
    ],
)
def test_capture_sizes(nspec, max_seqs, sizes):
    assert cudagraph_capture_sizes(nspec, max_seqs) == sizes


@pytest.mark.parametrize(("nspec", "max_seqs"), [(-1, 2), (7, 0)])
def test_capture_sizes_reject_nonsense(nspec, max_seqs):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        cudagraph_capture_sizes(nspec, max_seqs)


def test_the_role_defaults_hold_plain_values_of_the_right_types():
    """What the YAML gives is what the role passes (its ``| int`` and ``| float`` change nothing)."""
    settings = serve_settings(0, 2, "198.18.0.13")
    assert all(isinstance(settings[key], int) for key in ("master_port", "max_num_seqs", "engine_port"))
    assert isinstance(settings["gpu_memory_utilization"], float)
    assert (settings["capture_sizes"], settings["extra_args"], env_settings()["extra"]) == ([], [], {})


@pytest.mark.parametrize(("node_rank", "nnodes"), [(0, 2), (1, 2), (0, 3), (2, 3)])
def test_args_from_the_role_defaults_equal_the_reference(node_rank, nnodes):
    expected = reference_vllm_argv(node_rank, nnodes, "198.18.0.13")
    assert vllm_serve_args(**serve_settings(node_rank, nnodes, "198.18.0.13")) == expected


def test_env_from_the_role_defaults_equals_the_reference():
    assert vllm_rank_env(**env_settings()) == reference_vllm_env(IFNAME, HOST_IP, HCAS)


@pytest.mark.parametrize(
    "setting",
    ["master_port", "served_model_name", "kv_cache_memory_bytes", "gpu_memory_utilization", "max_model_len",
     "max_num_seqs", "max_num_batched_tokens", "num_speculative_tokens", "cudagraph_mode", "engine_host",
     "engine_port"],
)  # fmt: skip
def test_every_serving_setting_is_required(setting):
    settings = serve_settings(0, 2, "198.18.0.13")
    del settings[setting]
    with pytest.raises(TypeError, match=setting):
        vllm_serve_args(**settings)


@pytest.mark.parametrize("setting", ["gid_index", "plan_name"])
def test_every_env_setting_is_required(setting):
    settings = env_settings()
    del settings[setting]
    with pytest.raises(TypeError, match=setting):
        vllm_rank_env(**settings)


def test_serving_settings_flow_into_the_args():
    args = vllm_serve_args(
        **serve_settings(
            0, 2, "10.0.0.1", max_num_seqs=4, num_speculative_tokens=3, engine_port=9000,
            extra_args=["--foo", "1"], cudagraph_mode="PIECEWISE",
        )
    )  # fmt: skip
    value = dict(itertools.pairwise(args))
    assert value["--max-num-seqs"] == "4"
    assert value["--port"] == "9000"
    assert value["--max-cudagraph-capture-size"] == "16"
    compilation = json.loads(value["--compilation-config"])
    assert compilation == {"cudagraph_mode": "PIECEWISE", "custom_ops": ["all"],
                           "cudagraph_capture_sizes": [1, 2, 3, 4, 8, 12, 16]}  # fmt: skip
    assert json.loads(value["--speculative-config"])["num_speculative_tokens"] == 3
    assert args[-2:] == ["--foo", "1"], "extra args come last, on the head"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param({"num_speculative_tokens": "3", "max_num_seqs": "4"}, 3, id="numbers-as-text"),
        pytest.param({"num_speculative_tokens": 3, "max_num_seqs": 4}, 3, id="numbers"),
    ],
)
def test_numbers_given_as_text_reach_json_arguments_as_numbers(given, expected):
    """-e rank_num_speculative_tokens=3 is the string "3": the JSON vLLM reads must say 3."""
    value = dict(itertools.pairwise(vllm_serve_args(**serve_settings(0, 2, "10.0.0.1", **given))))
    assert json.loads(value["--speculative-config"])["num_speculative_tokens"] == expected
    assert value["--max-num-seqs"] == "4"


def test_a_number_setting_given_as_other_text_is_refused_naming_it():
    expected = r"setting max_model_len must be a number like the recipe's 262144, got 'lots'"
    with pytest.raises(ValueError, match=expected):
        vllm_serve_args(**serve_settings(0, 2, "10.0.0.1", max_model_len="lots"))


def test_extra_args_only_on_the_head():
    assert "--foo" not in vllm_serve_args(**serve_settings(1, 2, "x", extra_args=["--foo"]))


@pytest.mark.parametrize(
    ("domains", "expected"),
    [([], ["media.invalid"]), (["images.example.com"], ["images.example.com"]),
     (["a.example", "b.example"], ["a.example", "b.example"])],
    ids=["none-allowed", "one", "two"],
)  # fmt: skip
def test_the_head_refuses_media_urls_outside_the_allowed_domains(domains, expected):
    head = vllm_serve_args(**serve_settings(0, 2, "x", allowed_media_domains=domains, extra_args=["--foo"]))
    at = head.index("--allowed-media-domains")
    assert head[at + 1 : at + 1 + len(expected)] == expected
    assert head[at + 1 + len(expected)] == "--foo", "the domains end where the user's extra args begin"
    assert "--allowed-media-domains" not in vllm_serve_args(
        **serve_settings(1, 2, "x", allowed_media_domains=domains)
    )


@pytest.mark.parametrize("domain", ["", "http://images.example.com", "a b", "*.example.com", 7])
def test_a_media_domain_that_is_no_host_name_is_refused_naming_the_setting(domain):
    with pytest.raises(ValueError, match="rank_allowed_media_domains"):
        vllm_serve_args(**serve_settings(0, 2, "x", allowed_media_domains=[domain]))


def test_the_engine_listens_where_the_gateway_reaches_it():
    head = dict(itertools.pairwise(vllm_serve_args(**serve_settings(0, 2, "x"))))
    assert (head["--host"], head["--port"]) == ("127.0.0.1", str(DEFAULTS["deployment_engine_port"]))


def test_rank_outside_the_cluster_is_refused():
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        vllm_serve_args(**serve_settings(2, 2, "x"))


def test_env_takes_gid_plan_and_extra():
    extra = {"STANDIN_DECODE_TOKENS_PER_S": 100, "NCCL_DEBUG": "INFO"}
    env = vllm_rank_env(
        **env_settings(ifname="e", hcas="h", host_ip="1.2.3.4", gid_index=4, plan_name="p.json", extra=extra)
    )
    assert env["NCCL_IB_GID_INDEX"] == "4"
    assert env["ST_EXL3_PLAN"] == "/plans/p.json"
    assert env["STANDIN_DECODE_TOKENS_PER_S"] == "100"
    assert env["NCCL_DEBUG"] == "INFO", "extra wins over the reference"


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [([1, 2, 4, 8], [1, 2, 4, 8]), ([16, "8", 8, 1], [1, 8, 16]), ([32], [32])],
)
def test_capture_sizes_override_replaces_the_derived_ones(sizes, expected):
    args = vllm_serve_args(**serve_settings(1, 2, "x", capture_sizes=sizes))
    value = dict(itertools.pairwise(args))
    assert json.loads(value["--compilation-config"])["cudagraph_capture_sizes"] == expected
    assert value["--max-cudagraph-capture-size"] == str(expected[-1])


@pytest.mark.parametrize("sizes", [[0, 8], [-1], ["x"], [None]])
def test_capture_sizes_override_refuses_nonsense(sizes):
    with pytest.raises(ValueError, match="positive integers"):
        vllm_serve_args(**serve_settings(0, 2, "x", capture_sizes=sizes))


def test_no_capture_sizes_override_keeps_the_reference():
    settings = serve_settings(0, 2, "x")
    without = {key: value for key, value in settings.items() if key not in ("capture_sizes", "extra_args")}
    assert vllm_serve_args(**{**settings, "capture_sizes": []}) == vllm_serve_args(**without)
