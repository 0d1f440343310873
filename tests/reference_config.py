"""The reference serving configuration (shared/spec/reference-config.md), written out once.

The ``vllm serve`` arguments and environment are transcribed verbatim (checked against the spec
by ``tests/unit/test_reference_config.py``: always in CI, elsewhere when the spec is at hand);
``reference_vllm_argv`` and ``reference_vllm_env`` turn them into the exact argv/env of one rank.
The stand-in engine's tests, the lab acceptance tests and the rank role's tests all compare
against these.
"""

from __future__ import annotations

import json

PLAN_NAME = "J268-ho-v31-K5n.json"


# reference-config.md, "vLLM arguments (both ranks, in this order)", verbatim.
REFERENCE_VLLM_ARGS = """
/model --served-model-name deepseek-v4.1-flash --dtype bfloat16 --tensor-parallel-size 2
--nnodes 2 --master-addr <head fabric ip> --master-port 29655
--kv-cache-dtype fp8 --block-size 256 --swa-block-size 128 --kv-cache-memory-bytes 2700000000
--gpu-memory-utilization 0.88 --max-model-len 262144 --max-num-seqs 2 --max-num-batched-tokens 2048
--max-cudagraph-capture-size 16
--compilation-config {"cudagraph_mode":"FULL_DECODE_ONLY","custom_ops":["all"],"cudagraph_capture_sizes":[1,2,3,4,5,6,7,8,12,16]}
--enable-chunked-prefill --async-scheduling --enable-prefix-caching --safetensors-load-strategy lazy
--engram-config {"cpu_offload":false,"table_memory":"disk","disk_resident_scales":false,"disk_prefetch_max_tokens":0,"projection_tp":false}
--attention-backend B12X --linear-backend b12x --moe-backend b12x
--speculative-config {"method":"dspark","num_speculative_tokens":7,"draft_tensor_parallel_size":2,"attention_backend":"B12X","draft_sample_method":"greedy","rejection_sample_method":"standard","enable_adaptive_verification":true}
--generation-config vllm --tokenizer-mode deepseek_v41 --limit-mm-per-prompt {"image":1}
"""  # noqa: E501 - verbatim transcription
REFERENCE_WORKER_ADDS = "--node-rank 1 --headless"
REFERENCE_HEAD_ADDS = (
    "--node-rank 0 --host 0.0.0.0 --port 8000 --reasoning-parser deepseek_v41"
    " --tool-call-parser deepseek_v41 --enable-auto-tool-choice --enable-prompt-tokens-details"
    " --enable-force-include-usage"
)

# reference-config.md, "Environment (both ranks)", verbatim.
REFERENCE_ENV = """
CUDA_VISIBLE_DEVICES=0  CUTE_DSL_ARCH=sm_121a  HF_HUB_OFFLINE=1  TRANSFORMERS_OFFLINE=1
VLLM_WORKER_MULTIPROC_METHOD=spawn  VLLM_USE_V2_MODEL_RUNNER=1  VLLM_USE_BREAKABLE_CUDAGRAPH=0
VLLM_USE_FLASHINFER_SAMPLER=1  VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1  VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
OMP_NUM_THREADS=16  MALLOC_ARENA_MAX=2  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  SAFETENSORS_FAST_GPU=1
VLLM_ENABLE_PCIE_ALLREDUCE=0  NCCL_IB_DISABLE=0  NCCL_NET_PLUGIN=none  NCCL_IB_GID_INDEX=3
NCCL_IB_HCA=<hcas>  NCCL_IB_MERGE_NICS=1  NCCL_SOCKET_IFNAME=<if>  GLOO_SOCKET_IFNAME=<if>  NCCL_DEBUG=WARN
VLLM_ENABLE_ROCE_ALLREDUCE=1  VLLM_ROCE_ALLREDUCE_MAX_SIZE=2MB  VLLM_ROCE_ALLGATHER_MAX_SIZE=16MB
B12X_ROCE_CACHE_DIR=/cache/b12x-roce  B12X_ROCE_TRAFFIC_CLASS=106  NCCL_IB_TC=106
B12X_COMPILE_CACHE_DIR=/cache/b12x  XDG_CACHE_HOME=/cache
ST_EXL3_PLAN=/plans/J268-ho-v31-K5n.json  ST_EXL3_PREFILL=st  ST_EXL3_PREFILL_MIN_ROWS=1
VLLM_HOST_IP=<ip>
"""  # noqa: E501 - verbatim transcription


def _set_value(argv: list[str], flag: str, value: str) -> None:
    argv[argv.index(flag) + 1] = value


def reference_vllm_argv(
    rank: int,
    nnodes: int = 2,
    master_ip: str = "127.0.0.1",
    *,
    host: str = "127.0.0.1",
    port: int = 8001,
    media_domains: tuple[str, ...] = ("media.invalid",),
    master_port: int = 29655,
    model: str = "/model",
    extra: tuple[str, ...] = (),
) -> list[str]:
    """The rank container's arguments (from ``/model`` on, after the image's ``vllm serve``
    entrypoint) of the reference deployment for one rank.

    With N nodes: ``--tensor-parallel-size N --nnodes N``, draft tensor parallel size N and
    ``--node-rank i --headless`` on worker i; the head adds its API flags, then ``extra``.

    The collection's one deliberate difference (docs/security.md): the head's API server listens
    on ``host``:``port``, the loopback behind the gateway that takes the reference's port 8000 and
    asks for the key, and refuses media URLs outside ``media_domains`` (none by default). With
    ``host="0.0.0.0", port=8000, media_domains=()`` this is the reference's command line verbatim.
    """
    argv = REFERENCE_VLLM_ARGS.replace("<head fabric ip>", master_ip).split()
    argv[0] = model
    _set_value(argv, "--tensor-parallel-size", str(nnodes))
    _set_value(argv, "--nnodes", str(nnodes))
    _set_value(argv, "--master-port", str(master_port))
    spec_index = argv.index("--speculative-config") + 1
    speculative = json.loads(argv[spec_index])
    speculative["draft_tensor_parallel_size"] = nnodes
    argv[spec_index] = json.dumps(speculative, separators=(",", ":"))
    if rank == 0:
        adds = REFERENCE_HEAD_ADDS.split()
        _set_value(adds, "--host", host)
        _set_value(adds, "--port", str(port))
        if media_domains:
            adds += ["--allowed-media-domains", *media_domains]
        adds += list(extra)
    else:
        adds = REFERENCE_WORKER_ADDS.split()
        _set_value(adds, "--node-rank", str(rank))
    return [*argv, *adds]


def reference_vllm_env(ifname: str, ip: str, hcas: str = "rocep1s0f1,roceP2p1s0f1") -> dict[str, str]:
    """The reference container environment of one node with its fabric facts filled in."""
    text = REFERENCE_ENV.replace("<if>", ifname).replace("<ip>", ip).replace("<hcas>", hcas)
    return dict(item.split("=", 1) for item in text.split())
