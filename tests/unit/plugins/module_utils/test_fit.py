"""The fit check's plan (plugins/module_utils/_fit.py): what a rank needs against a node's
MemAvailable, with vLLM's start-up claim (gpu_memory_utilization of the total, its
request_memory rule) or the recipe's weights, runtime and KV cache; the advice names the variable."""

from __future__ import annotations

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _fit

GIB = 1 << 30
# The DeepSeek recipe's memory section and the tiny-chat one (inventory/lab-vllm).
DEEPSEEK = {
    "weights_gib_per_rank": 231,
    "runtime_gib_per_rank": 12,
    "kv_cache_bytes": "{kv_cache_memory_bytes}",
}
TINY = {"weights_gib_per_rank": 0.01, "runtime_gib_per_rank": 3, "kv_cache_gib": "{cpu_kv_cache_gib}",
        "kv_bytes_per_token": 512}  # fmt: skip
SPARK_TOTAL = int(121.7 * GIB)


def test_a_spark_with_nothing_running_fits_the_reference_claim():
    plan = _fit.plan(DEEPSEEK, {"kv_cache_memory_bytes": 2700000000, "gpu_memory_utilization": 0.88},
                     mem_total=SPARK_TOTAL, mem_available=int(118 * GIB), floor=GIB)  # fmt: skip
    assert plan["fits"] and plan["problems"] == []
    assert plan["need"] == plan["utilization_claim"] == int(SPARK_TOTAL * 0.88) + 1
    assert plan["kv_cache"] == 2700000000 and plan["kv_cache_setting"] == "kv_cache_memory_bytes"
    # vLLM sizes the rest inside its claim: the largest utilization is what the plan offers.
    assert plan["largest_kv_cache"] is None and plan["largest_gpu_memory_utilization"] == 0.961


def test_a_spark_short_of_the_claim_names_the_shortfall_and_the_largest_utilization():
    plan = _fit.plan(DEEPSEEK, {"kv_cache_memory_bytes": 2700000000, "gpu_memory_utilization": 0.88},
                     mem_total=SPARK_TOTAL, mem_available=98 * GIB, floor=GIB)  # fmt: skip
    assert not plan["fits"] and plan["short_by"] == plan["need"] - 97 * GIB
    assert plan["problems"] == [
        "the recipe needs 107.1 GiB (gpu_memory_utilization 0.88 of 121.7 GiB, which vLLM claims at "
        "start-up) per rank and this node has 97.0 GiB (MemAvailable 98.0 GiB with no rank running, "
        "less the memory guard's floor 1.0 GiB): short by 10.1 GiB; lower rank_gpu_memory_utilization "
        "to 0.797 at most, or free memory on this node"
    ]


@pytest.mark.parametrize(
    ("kv_gib", "fits", "advice"),
    [(1, True, None), (4000, False, "lower rank_recipe_settings.cpu_kv_cache_gib to 15.99 at most")],
)
def test_without_a_claim_the_weights_runtime_and_kv_cache_must_fit(kv_gib, fits, advice):
    plan = _fit.plan(
        TINY, {"cpu_kv_cache_gib": kv_gib}, mem_total=24 * GIB, mem_available=20 * GIB, floor=GIB
    )
    assert plan["fits"] is fits
    assert plan["kv_cache"] == kv_gib * GIB and plan["kv_cache_unit"] == "GiB"
    largest = 19 * GIB - int(0.01 * GIB) - 3 * GIB
    assert plan["largest_kv_cache"] == largest
    assert plan["longest_context"] == largest // 512
    if advice:
        assert "weights 0.0 GiB, runtime 3.0 GiB, KV cache 4000.0 GiB" in plan["problems"][0]
        assert advice in plan["problems"][0]


def test_a_kv_size_in_bytes_is_advised_in_bytes_and_rank_variables_are_named():
    memory = {
        "weights_gib_per_rank": 10,
        "runtime_gib_per_rank": 2,
        "kv_cache_bytes": "{kv_cache_memory_bytes}",
    }
    plan = _fit.plan(memory, {"kv_cache_memory_bytes": 40 * GIB}, mem_total=64 * GIB, mem_available=40 * GIB,
                     floor=GIB)  # fmt: skip
    assert f"lower rank_kv_cache_memory_bytes to {27 * GIB} at most" in plan["problems"][0]


@pytest.mark.parametrize(
    ("memory", "settings", "message"),
    [
        ({"kv_cache_bytes": "{a} and {b}"}, {}, "one setting's name in braces"),
        (
            {"kv_cache_bytes": "{kv}"},
            {"kv": "lots"},
            r"the setting kv \(memory.kv_cache_bytes\) is not a number",
        ),
        ({"kv_cache_gib": True}, {}, "must be a number"),
        (
            {},
            {"gpu_memory_utilization": "auto"},
            "the setting gpu_memory_utilization must be a number, got 'auto'",
        ),
        ({}, {"gpu_memory_utilization": True}, "the setting gpu_memory_utilization must be a number"),
        ({"weights_gib_per_rank": "heavy"}, {}, "memory.weights_gib_per_rank must be a number, got 'heavy'"),
        ({"runtime_gib_per_rank": [3]}, {}, r"memory.runtime_gib_per_rank must be a number, got \[3\]"),
        ({"kv_bytes_per_token": "many"}, {}, "memory.kv_bytes_per_token must be a number"),
    ],
)
def test_a_size_that_is_not_a_number_is_refused(memory, settings, message):
    with pytest.raises(_fit.FitError, match=message):
        _fit.plan({"weights_gib_per_rank": 1, **memory}, settings, mem_total=GIB, mem_available=GIB, floor=0)


def test_an_unset_kv_setting_leaves_the_kv_cache_unknown():
    plan = _fit.plan(TINY, {}, mem_total=24 * GIB, mem_available=20 * GIB, floor=GIB)
    assert plan["kv_cache"] is None and plan["need"] == int(0.01 * GIB) + 3 * GIB and plan["fits"]


def test_the_plan_in_lines_for_an_operator():
    plan = _fit.plan(TINY, {"cpu_kv_cache_gib": 1}, mem_total=24 * GIB, mem_available=20 * GIB, floor=GIB)
    largest = (19 * GIB - int(0.01 * GIB) - 3 * GIB) / GIB
    assert _fit.plan_lines(plan, rank_running=True) == [
        "MemTotal 24.0 GiB, MemAvailable 20.0 GiB (this node runs its rank now: its memory counts as taken), "
        "the guard's floor 1.0 GiB: 19.0 GiB usable",
        "a rank needs 4.0 GiB (weights 0.0, runtime 3.0, KV cache 1.00 GiB): fits",
        f"largest that fits: KV cache {largest:.2f} GiB, context {int(largest * GIB) // 512} tokens",
    ]
    claimed = _fit.plan(DEEPSEEK, {"kv_cache_memory_bytes": 2700000000, "gpu_memory_utilization": 0.88},
                        mem_total=SPARK_TOTAL, mem_available=98 * GIB, floor=GIB)  # fmt: skip
    lines = _fit.plan_lines(claimed, rank_running=False)
    assert lines[1:] == [
        "a rank needs 107.1 GiB (gpu_memory_utilization 0.88, claimed by vLLM at start-up): "
        "short by 10.1 GiB",
        "largest that fits: gpu_memory_utilization 0.797, "
        "context unknown (the recipe has no memory.kv_bytes_per_token)",
    ]
