# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The vLLM command line and environment of one rank, in the reference deployment's shape.

Internal to sparkserve.dsv41; not a public API. Pure functions: the rank role renders them
through the ``vllm_serve_args`` and ``vllm_rank_env`` filters. Every serving setting is a
required argument: its value is the rank role's variable, whose default (in the role's
``defaults/main.yml``, nowhere else) is the reference value; the tests show that those defaults
give the reference configuration value for value.
"""

from __future__ import annotations

import json
from typing import Any

# Environment both ranks share, verbatim from the reference deployment.
STATIC_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": "0",
    "CUTE_DSL_ARCH": "sm_121a",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_USE_V2_MODEL_RUNNER": "1",
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "VLLM_USE_FLASHINFER_SAMPLER": "1",
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "OMP_NUM_THREADS": "16",
    "MALLOC_ARENA_MAX": "2",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "SAFETENSORS_FAST_GPU": "1",
    "VLLM_ENABLE_PCIE_ALLREDUCE": "0",
    "NCCL_IB_DISABLE": "0",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IB_MERGE_NICS": "1",
    "NCCL_DEBUG": "WARN",
    "VLLM_ENABLE_ROCE_ALLREDUCE": "1",
    "VLLM_ROCE_ALLREDUCE_MAX_SIZE": "2MB",
    "VLLM_ROCE_ALLGATHER_MAX_SIZE": "16MB",
    "B12X_ROCE_CACHE_DIR": "/cache/b12x-roce",
    "B12X_ROCE_TRAFFIC_CLASS": "106",
    "NCCL_IB_TC": "106",
    "B12X_COMPILE_CACHE_DIR": "/cache/b12x",
    "XDG_CACHE_HOME": "/cache",
    "ST_EXL3_PREFILL": "st",
    "ST_EXL3_PREFILL_MIN_ROWS": "1",
}

ENGRAM_CONFIG = {
    "cpu_offload": False,
    "table_memory": "disk",
    "disk_resident_scales": False,
    "disk_prefetch_max_tokens": 0,
    "projection_tp": False,
}


def _json(value: Any) -> str:
    # Compact, as the reference passes it: vLLM parses it, humans compare it.
    return json.dumps(value, separators=(",", ":"))


def cudagraph_capture_sizes(num_speculative_tokens: int, max_num_seqs: int) -> list[int]:
    """Sizes a decode step can take: every size up to one speculative step, then every 4, then the cap.

    ``1..min(NSPEC+1, CAP)``, then ``NSPEC+1, NSPEC+5, ... <= CAP``, plus ``CAP`` where
    ``CAP = MAX_SEQS * (NSPEC + 1)``: 7 and 2 give 1,2,3,4,5,6,7,8,12,16.
    """
    if num_speculative_tokens < 0 or max_num_seqs < 1:
        raise ValueError("num_speculative_tokens must be >= 0 and max_num_seqs >= 1")
    step = num_speculative_tokens + 1
    cap = max_num_seqs * step
    sizes = set(range(1, min(step, cap) + 1))
    sizes.update(range(step, cap + 1, 4))
    sizes.add(cap)
    return sorted(sizes)


def capture_sizes_from(sizes: list[Any]) -> list[int]:
    """An explicit list of CUDA graph capture sizes, sorted and without repeats; each a positive integer."""
    try:
        parsed = {int(size) for size in sizes}
    except (TypeError, ValueError) as error:
        raise ValueError(f"CUDA graph capture sizes must be positive integers, got {sizes!r}") from error
    if not parsed or min(parsed) < 1:
        raise ValueError(f"CUDA graph capture sizes must be positive integers, got {sizes!r}")
    return sorted(parsed)


def vllm_serve_args(
    *,
    node_rank: int,
    nnodes: int,
    master_addr: str,
    master_port: int,
    served_model_name: str,
    kv_cache_memory_bytes: int,
    gpu_memory_utilization: float,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int,
    cudagraph_mode: str,
    api_port: int,
    capture_sizes: list[int] | None = None,
    extra_args: list[str] | None = None,
    model: str = "/model",
) -> list[str]:
    """The rank container's arguments (after the image's ``vllm serve`` entrypoint), in the reference order.

    ``capture_sizes`` replaces the derived capture sizes (upstream ``CAPS``); ``extra_args`` are
    appended on the head; ``model`` is where the container sees the checkpoint.
    """
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank {node_rank} is outside 0..{nnodes - 1}")
    if capture_sizes:
        sizes = capture_sizes_from(capture_sizes)
    else:
        sizes = cudagraph_capture_sizes(num_speculative_tokens, max_num_seqs)
    speculative = {
        "method": "dspark",
        "num_speculative_tokens": num_speculative_tokens,
        "draft_tensor_parallel_size": nnodes,
        "attention_backend": "B12X",
        "draft_sample_method": "greedy",
        "rejection_sample_method": "standard",
        "enable_adaptive_verification": True,
    }
    args = [
        model,
        "--served-model-name", served_model_name,
        "--dtype", "bfloat16",
        "--tensor-parallel-size", str(nnodes),
        "--nnodes", str(nnodes),
        "--master-addr", master_addr,
        "--master-port", str(master_port),
        "--kv-cache-dtype", "fp8",
        "--block-size", "256",
        "--swa-block-size", "128",
        "--kv-cache-memory-bytes", str(kv_cache_memory_bytes),
        "--gpu-memory-utilization", str(gpu_memory_utilization),
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--max-num-batched-tokens", str(max_num_batched_tokens),
        "--max-cudagraph-capture-size", str(sizes[-1]),
        "--compilation-config",
        _json({"cudagraph_mode": cudagraph_mode, "custom_ops": ["all"], "cudagraph_capture_sizes": sizes}),
        "--enable-chunked-prefill",
        "--async-scheduling",
        "--enable-prefix-caching",
        "--safetensors-load-strategy", "lazy",
        "--engram-config", _json(ENGRAM_CONFIG),
        "--attention-backend", "B12X",
        "--linear-backend", "b12x",
        "--moe-backend", "b12x",
        "--speculative-config", _json(speculative),
        "--generation-config", "vllm",
        "--tokenizer-mode", "deepseek_v41",
        "--limit-mm-per-prompt", _json({"image": 1}),
    ]  # fmt: skip
    if node_rank == 0:
        args += [
            "--node-rank", "0",
            "--host", "0.0.0.0",  # noqa: S104 - the API serves every client network
            "--port", str(api_port),
            "--reasoning-parser", "deepseek_v41",
            "--tool-call-parser", "deepseek_v41",
            "--enable-auto-tool-choice",
            "--enable-prompt-tokens-details",
            "--enable-force-include-usage",
            *(extra_args or []),
        ]  # fmt: skip
    else:
        args += ["--node-rank", str(node_rank), "--headless"]
    return args


def vllm_rank_env(
    *,
    ifname: str,
    hcas: str,
    host_ip: str,
    gid_index: int,
    plan_name: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The rank container's environment with this node's fabric facts; ``extra`` wins."""
    env = dict(STATIC_ENV)
    env.update(
        {
            "NCCL_IB_GID_INDEX": str(gid_index),
            "NCCL_IB_HCA": hcas,
            "NCCL_SOCKET_IFNAME": ifname,
            "GLOO_SOCKET_IFNAME": ifname,
            "ST_EXL3_PLAN": f"/plans/{plan_name}",
            "VLLM_HOST_IP": host_ip,
        }
    )
    env.update({str(key): str(value) for key, value in (extra or {}).items()})
    return env
