"""The rank's command line and environment equal the measured reference, value for value."""

from __future__ import annotations

import itertools
import json

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._rank import (
    cudagraph_capture_sizes,
    vllm_rank_env,
    vllm_serve_args,
)
from reference_config import reference_vllm_argv, reference_vllm_env


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


@pytest.mark.parametrize(("node_rank", "nnodes"), [(0, 2), (1, 2), (0, 3), (2, 3)])
def test_args_equal_the_reference(node_rank, nnodes):
    expected = reference_vllm_argv(node_rank, nnodes, "198.18.0.13")
    assert vllm_serve_args(node_rank=node_rank, nnodes=nnodes, master_addr="198.18.0.13") == expected


def test_serving_settings_flow_into_the_args():
    args = vllm_serve_args(
        node_rank=0, nnodes=2, master_addr="10.0.0.1", max_num_seqs=4, num_speculative_tokens=3,
        api_port=9000, extra_args=["--foo", "1"], cudagraph_mode="PIECEWISE",
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


def test_extra_args_only_on_the_head():
    assert "--foo" not in vllm_serve_args(node_rank=1, nnodes=2, master_addr="x", extra_args=["--foo"])


def test_rank_outside_the_cluster_is_refused():
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        vllm_serve_args(node_rank=2, nnodes=2, master_addr="x")


def test_env_equals_the_reference():
    env = vllm_rank_env(ifname="enp1s0f1np1", hcas="rocep1s0f1,roceP2p1s0f1", host_ip="198.18.0.11")
    assert env == reference_vllm_env("enp1s0f1np1", "198.18.0.11", "rocep1s0f1,roceP2p1s0f1")


def test_env_takes_gid_plan_and_extra():
    env = vllm_rank_env(ifname="e", hcas="h", host_ip="1.2.3.4", gid_index=4, plan_name="p.json",
                        extra={"STANDIN_DECODE_TOKENS_PER_S": 100, "NCCL_DEBUG": "INFO"})  # fmt: skip
    assert env["NCCL_IB_GID_INDEX"] == "4"
    assert env["ST_EXL3_PLAN"] == "/plans/p.json"
    assert env["STANDIN_DECODE_TOKENS_PER_S"] == "100"
    assert env["NCCL_DEBUG"] == "INFO", "extra wins over the reference"


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [([1, 2, 4, 8], [1, 2, 4, 8]), ([16, "8", 8, 1], [1, 8, 16]), ([32], [32])],
)
def test_capture_sizes_override_replaces_the_derived_ones(sizes, expected):
    args = vllm_serve_args(node_rank=1, nnodes=2, master_addr="x", capture_sizes=sizes)
    value = dict(itertools.pairwise(args))
    assert json.loads(value["--compilation-config"])["cudagraph_capture_sizes"] == expected
    assert value["--max-cudagraph-capture-size"] == str(expected[-1])


@pytest.mark.parametrize("sizes", [[0, 8], [-1], ["x"], [None]])
def test_capture_sizes_override_refuses_nonsense(sizes):
    with pytest.raises(ValueError, match="positive integers"):
        vllm_serve_args(node_rank=0, nnodes=2, master_addr="x", capture_sizes=sizes)


def test_no_capture_sizes_override_keeps_the_reference():
    assert vllm_serve_args(node_rank=0, nnodes=2, master_addr="x", capture_sizes=[]) == vllm_serve_args(
        node_rank=0, nnodes=2, master_addr="x"
    )
