# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Whether a recipe fits a node's memory, as pure functions behind ``memory_fit``.

A rank needs its share of the weights, the runtime beside them (CUDA graphs, activations, the
engine's processes) and its KV cache: the recipe's ``memory`` section says how much of each
(``weights_gib_per_rank``, ``runtime_gib_per_rank``, and ``kv_cache_bytes`` or ``kv_cache_gib``,
a number or the ``"{setting}"`` that holds it). With ``gpu_memory_utilization`` vLLM also claims
that fraction of the node's total memory at start-up and refuses to start when less is free
(vLLM 0.32, ``v1/worker/utils.py`` ``request_memory``): on a Spark's unified memory that claim is
taken from the same MemAvailable. Whichever is larger must fit in MemAvailable, read with no rank
running, less the memory guard's floor (below it the guard kills the ranks).

Internal to sparkserve.dsv41; not a public API.
"""

from __future__ import annotations

import re
from typing import Any

GIB = 1 << 30
_TEMPLATE = re.compile(r"^\{([a-z_][a-z0-9_]*)\}$")
# The recipe settings that have a rank_* variable of their own (roles/rank/defaults/main.yml);
# any other is set through rank_recipe_settings.
RANK_VARIABLES = (
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_speculative_tokens",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
)


class FitError(Exception):
    """A memory section or a setting that cannot be read as a size."""


def variable_for(setting: str) -> str:
    """The inventory variable that sets a recipe setting."""
    return f"rank_{setting}" if setting in RANK_VARIABLES else f"rank_recipe_settings.{setting}"


def _resolve(value: Any, settings: dict[str, Any], field: str) -> tuple[float | None, str | None]:
    """A number, or the setting a ``"{name}"`` names: (value, the setting's name or None)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        match = _TEMPLATE.match(value)
        if not match:
            raise FitError(f"memory.{field} must be a number or one setting's name in braces, got {value!r}")
        name = match.group(1)
        if settings.get(name) is None:
            return None, name
        value = settings[name]
        try:
            return float(value), name
        except (TypeError, ValueError):
            raise FitError(f"the setting {name} (memory.{field}) is not a number: {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FitError(f"memory.{field} must be a number, got {value!r}")
    return float(value), None


def kv_cache(memory: dict[str, Any], settings: dict[str, Any]) -> tuple[int | None, str | None, str]:
    """The KV cache bytes per rank the recipe sets, the setting that holds them and its unit."""
    if memory.get("kv_cache_bytes") is not None:
        value, name = _resolve(memory["kv_cache_bytes"], settings, "kv_cache_bytes")
        return (None if value is None else int(value)), name, "B"
    value, name = _resolve(memory.get("kv_cache_gib"), settings, "kv_cache_gib")
    return (None if value is None else int(value * GIB)), name, "GiB"


def _number(value: Any, what: str) -> float:
    """``value`` as a number; FitError naming ``what`` for anything else (text, a bool, a list)."""
    if isinstance(value, bool):
        raise FitError(f"{what} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise FitError(f"{what} must be a number, got {value!r}") from None


def plan(
    memory: dict[str, Any],
    settings: dict[str, Any],
    *,
    mem_total: int,
    mem_available: int,
    floor: int,
) -> dict[str, Any]:
    """What one node needs against what it has; the largest KV cache, utilization and context that
    fit. With gpu_memory_utilization vLLM's claim is what must be free (it sizes the weights, the
    runtime and the KV cache inside it and says so itself when they do not fit); without it, the
    recipe's weights, runtime and KV cache."""
    weights = int(_number(memory.get("weights_gib_per_rank") or 0, "memory.weights_gib_per_rank") * GIB)
    runtime = int(_number(memory.get("runtime_gib_per_rank") or 0, "memory.runtime_gib_per_rank") * GIB)
    kv, kv_setting, kv_unit = kv_cache(memory, settings)
    utilization = settings.get("gpu_memory_utilization")
    claim = (
        int(mem_total * _number(utilization, "the setting gpu_memory_utilization")) + 1
        if utilization is not None
        else None
    )
    need = claim if claim is not None else weights + runtime + (kv or 0)
    usable = mem_available - floor
    largest_kv = max(usable - weights - runtime, 0) if claim is None else None
    per_token = memory.get("kv_bytes_per_token")
    if per_token is not None:
        per_token = _number(per_token, "memory.kv_bytes_per_token")
    context_kv = largest_kv if largest_kv is not None else kv
    result = {
        "mem_total": mem_total,
        "mem_available": mem_available,
        "floor": floor,
        "usable": usable,
        "weights": weights,
        "runtime": runtime,
        "kv_cache": kv,
        "kv_cache_setting": kv_setting,
        "kv_cache_unit": kv_unit,
        "gpu_memory_utilization": utilization,
        "utilization_claim": claim,
        "need": need,
        "fits": need <= usable,
        "short_by": max(need - usable, 0),
        "largest_kv_cache": largest_kv,
        "largest_gpu_memory_utilization": (
            round(max(usable, 0) / mem_total, 3) if claim is not None and mem_total else None
        ),
        "longest_context": int(context_kv // per_token) if per_token and context_kv is not None else None,
        "problems": [],
    }
    if not result["fits"]:
        result["problems"].append(_shortfall(result))
    return result


def in_setting_unit(result: dict[str, Any]) -> str:
    """The largest KV cache in the unit of the setting that holds it (GiB to two places, down)."""
    if result["kv_cache_unit"] == "GiB":
        return f"{int(result['largest_kv_cache'] * 100 / GIB) / 100:g}"
    return str(result["largest_kv_cache"])


def gib(size: float) -> str:
    return f"{size / GIB:.1f} GiB"


def _shortfall(result: dict[str, Any]) -> str:
    if result["utilization_claim"] is not None:
        needs = (
            f"{gib(result['utilization_claim'])} (gpu_memory_utilization {result['gpu_memory_utilization']} "
            f"of {gib(result['mem_total'])}, which vLLM claims at start-up)"
        )
    else:
        what = [f"weights {gib(result['weights'])}", f"runtime {gib(result['runtime'])}"]
        if result["kv_cache"] is not None:
            what.append(f"KV cache {gib(result['kv_cache'])}")
        needs = f"{gib(result['need'])} ({', '.join(what)})"
    fixes = []
    if result["kv_cache_setting"] and result["largest_kv_cache"] is not None:
        fixes.append(f"{variable_for(result['kv_cache_setting'])} to {in_setting_unit(result)} at most")
    if result["largest_gpu_memory_utilization"] is not None:
        fixes.append(f"rank_gpu_memory_utilization to {result['largest_gpu_memory_utilization']} at most")
    advice = (
        f"lower {' or '.join(fixes)}, or free memory on this node" if fixes else "free memory on this node"
    )
    return (
        f"the recipe needs {needs} per rank and this node has {gib(result['usable'])} "
        f"(MemAvailable {gib(result['mem_available'])} with no rank running, less the memory guard's floor "
        f"{gib(result['floor'])}): short by {gib(result['short_by'])}; {advice}"
    )


def plan_lines(result: dict[str, Any], *, rank_running: bool) -> list[str]:
    """The plan for an operator (fit.yml): what the node has, what a rank needs, the largest that fits."""
    running = (
        " (this node runs its rank now: its memory counts as taken)" if rank_running else " (no rank running)"
    )
    if result["utilization_claim"] is not None:
        parts = f" (gpu_memory_utilization {result['gpu_memory_utilization']}, claimed by vLLM at start-up)"
    else:
        kv = f"{result['kv_cache'] / GIB:.2f}" if result["kv_cache"] is not None else "unknown"
        weights, runtime = result["weights"] / GIB, result["runtime"] / GIB
        parts = f" (weights {weights:.1f}, runtime {runtime:.1f}, KV cache {kv} GiB)"
    verdict = "fits" if result["fits"] else f"short by {result['short_by'] / GIB:.1f} GiB"
    if result["largest_kv_cache"] is not None:
        largest = f"KV cache {result['largest_kv_cache'] / GIB:.2f} GiB"
    else:
        largest = f"gpu_memory_utilization {result['largest_gpu_memory_utilization']}"
    context = (
        f"{result['longest_context']} tokens"
        if result["longest_context"] is not None
        else "unknown (the recipe has no memory.kv_bytes_per_token)"
    )
    return [
        f"MemTotal {result['mem_total'] / GIB:.1f} GiB, "
        f"MemAvailable {result['mem_available'] / GIB:.1f} GiB{running}, "
        f"the guard's floor {result['floor'] / GIB:.1f} GiB: {result['usable'] / GIB:.1f} GiB usable",
        f"a rank needs {result['need'] / GIB:.1f} GiB{parts}: {verdict}",
        f"largest that fits: {largest}, context {context}",
    ]
