"""The reference serving configuration (shared/spec/reference-config.md), written out once.

Tests compare what the roles and the stand-in engine see against these values.
"""

from __future__ import annotations

import json

SERVED_MODEL_NAME = "deepseek-v4.1-flash"
API_PORT = 8000
MASTER_PORT = 29655
PLAN_NAME = "J268-ho-v31-K5n.json"


def compilation_config(num_speculative_tokens: int = 7, max_num_seqs: int = 2) -> dict:
    cap = max_num_seqs * (num_speculative_tokens + 1)
    sizes = set(range(1, min(num_speculative_tokens + 1, cap) + 1))
    sizes.update(range(num_speculative_tokens + 1, cap + 1, 4))
    sizes.add(cap)
    return {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "custom_ops": ["all"],
        "cudagraph_capture_sizes": sorted(sizes),
    }


def _json(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"))


def reference_env(ifname: str, hcas: str, host_ip: str) -> dict[str, str]:
    return {
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
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_HCA": hcas,
        "NCCL_IB_MERGE_NICS": "1",
        "NCCL_SOCKET_IFNAME": ifname,
        "GLOO_SOCKET_IFNAME": ifname,
        "NCCL_DEBUG": "WARN",
        "VLLM_ENABLE_ROCE_ALLREDUCE": "1",
        "VLLM_ROCE_ALLREDUCE_MAX_SIZE": "2MB",
        "VLLM_ROCE_ALLGATHER_MAX_SIZE": "16MB",
        "B12X_ROCE_CACHE_DIR": "/cache/b12x-roce",
        "B12X_ROCE_TRAFFIC_CLASS": "106",
        "NCCL_IB_TC": "106",
        "B12X_COMPILE_CACHE_DIR": "/cache/b12x",
        "XDG_CACHE_HOME": "/cache",
        "ST_EXL3_PLAN": f"/plans/{PLAN_NAME}",
        "ST_EXL3_PREFILL": "st",
        "ST_EXL3_PREFILL_MIN_ROWS": "1",
        "VLLM_HOST_IP": host_ip,
    }


def reference_args(node_rank: int, nnodes: int, master_addr: str) -> list[str]:
    """vLLM's arguments after ``serve`` for one rank, in the reference order."""
    args = [
        "/model",
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--dtype",
        "bfloat16",
        "--tensor-parallel-size",
        str(nnodes),
        "--nnodes",
        str(nnodes),
        "--master-addr",
        master_addr,
        "--master-port",
        str(MASTER_PORT),
        "--kv-cache-dtype",
        "fp8",
        "--block-size",
        "256",
        "--swa-block-size",
        "128",
        "--kv-cache-memory-bytes",
        "2700000000",
        "--gpu-memory-utilization",
        "0.88",
        "--max-model-len",
        "262144",
        "--max-num-seqs",
        "2",
        "--max-num-batched-tokens",
        "2048",
        "--max-cudagraph-capture-size",
        "16",
        "--compilation-config",
        _json(compilation_config()),
        "--enable-chunked-prefill",
        "--async-scheduling",
        "--enable-prefix-caching",
        "--safetensors-load-strategy",
        "lazy",
        "--engram-config",
        _json(
            {
                "cpu_offload": False,
                "table_memory": "disk",
                "disk_resident_scales": False,
                "disk_prefetch_max_tokens": 0,
                "projection_tp": False,
            }
        ),
        "--attention-backend",
        "B12X",
        "--linear-backend",
        "b12x",
        "--moe-backend",
        "b12x",
        "--speculative-config",
        _json(
            {
                "method": "dspark",
                "num_speculative_tokens": 7,
                "draft_tensor_parallel_size": nnodes,
                "attention_backend": "B12X",
                "draft_sample_method": "greedy",
                "rejection_sample_method": "standard",
                "enable_adaptive_verification": True,
            }
        ),
        "--generation-config",
        "vllm",
        "--tokenizer-mode",
        "deepseek_v41",
        "--limit-mm-per-prompt",
        _json({"image": 1}),
    ]
    if node_rank == 0:
        args += [
            "--node-rank",
            "0",
            "--host",
            "0.0.0.0",
            "--port",
            str(API_PORT),
            "--reasoning-parser",
            "deepseek_v41",
            "--tool-call-parser",
            "deepseek_v41",
            "--enable-auto-tool-choice",
            "--enable-prompt-tokens-details",
            "--enable-force-include-usage",
        ]
    else:
        args += ["--node-rank", str(node_rank), "--headless"]
    return args
