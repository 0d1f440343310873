#!/usr/bin/env python3
"""Generate a tiny SYNTHETIC stand-in for the ``0xSero/DeepSeek-V4.1-Flash-Spark`` checkpoint.

The real repository is ~462 GB; the lab needs something with the same *layout* so that the
download, reassembly and verification code paths run for real:

* six safetensors shards ``model-0000N-of-00006.safetensors`` in genuine safetensors format
  plus ``model.safetensors.index.json``;
* shards 5 and 6 (the largest, as upstream) stored ONLY as ``<shard>.part00``, ``.part01``, …
  because the real hub caps files at 50 GB;
* ``sha256-manifest.txt`` (sha256sum format) over the six *reassembled* shards;
* the EXL3 banks ``exl3/{qn,q31,q31s}/L??.part.safetensors`` and the plan
  ``exl3/plan/J268-ho-v31-K5n.json``.

Tensor data is deterministic pseudo-random bytes, so the same arguments always produce
byte-identical files (nothing time-dependent is written). Standard library only, so it runs on
any lab node with a bare Python 3.11.

``1 MB`` below means 1 MiB (1,048,576 bytes) for both ``--size-mb`` and ``--part-size-mb``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import struct
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

MIB = 1024 * 1024
BLOCK = MIB  # unit of random-data generation and of writes
SHARD_COUNT = 6
SPLIT_SHARDS = (5, 6)  # stored as parts only, like upstream
# Relative byte budget per shard: 5 and 6 dominate, as in the real repository.
SHARD_WEIGHTS = (1, 1, 1, 1, 4, 4)
EXL3_BANKS = {"qn": 2, "q31": 3, "q31s": 3}  # bank -> bits per weight (plausible, not meaningful)
PLAN_NAME = "J268-ho-v31-K5n"
MIN_SIZE_MB = 2.0
MAX_EXL3_LAYERS = 100  # file names keep two digits so ``L??.part.safetensors`` matches

# Model shape: small numbers, DeepSeek-flavoured names. Only used for plausible metadata.
HIDDEN = 64
VOCAB = 512
LAYERS = 12
Q_LORA_RANK = 32
KV_LORA_RANK = 16
ROPE_DIM = 8
FP8_BLOCK = 128
# DeepSeek's special tokens use fullwidth bars and U+2581, written escaped to stay unambiguous.
BEGIN_OF_SENTENCE = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
END_OF_SENTENCE = "<\uff5cend\u2581of\u2581sentence\uff5c>"

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I16": 2, "F8_E4M3": 1, "U8": 1}


def shard_name(index: int) -> str:
    """Upstream shard file name, 1-based."""
    return f"model-{index:05d}-of-{SHARD_COUNT:05d}.safetensors"


def part_name(shard: str, index: int, count: int) -> str:
    """``<shard>.partNN``; at least two digits, more only if there are 100+ parts."""
    width = max(2, len(str(count - 1)))
    return f"{shard}.part{index:0{width}d}"


# --------------------------------------------------------------------------- safetensors


@dataclass(frozen=True)
class Tensor:
    """One tensor of a safetensors file: only its description, the data is generated."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZE[self.dtype]


def safetensors_header(tensors: Sequence[Tensor]) -> bytes:
    """Serialized header: 8-byte little-endian length, then JSON padded with spaces to 8 bytes.

    Tensors are laid out contiguously in the given order, as the safetensors loader requires
    (no holes, offsets relative to the first byte after the header).
    """
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in tensors:
        meta[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    body = json.dumps(meta, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def random_blocks(seed: str, nbytes: int) -> Iterator[bytes]:
    """Deterministic pseudo-random bytes in 1 MiB blocks (str seeds hash stably across runs)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible filler data, not cryptography
    remaining = nbytes
    while remaining > 0:
        size = min(BLOCK, remaining)
        yield rng.randbytes(size)
        remaining -= size


# --------------------------------------------------------------------------- writing


@dataclass
class WrittenFile:
    """What the summary reports about one file."""

    path: str
    size: int
    sha256: str


@dataclass
class SplitWriter:
    """Write one logical stream into ``names[i]`` files of at most ``part_size`` bytes each.

    Hashes both the logical stream (the reassembled shard) and every physical file while
    writing, so nothing is read back.
    """

    directory: Path
    names: list[str]
    part_size: int
    whole: Any = field(default_factory=hashlib.sha256)
    written: list[WrittenFile] = field(default_factory=list)
    _index: int = -1
    _handle: BinaryIO | None = None
    _hash: Any = None
    _size: int = 0

    def _next_file(self) -> None:
        self._close_current()
        self._index += 1
        self._handle = (self.directory / self.names[self._index]).open("wb")
        self._hash = hashlib.sha256()
        self._size = 0

    def _close_current(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self.written.append(WrittenFile(self.names[self._index], self._size, self._hash.hexdigest()))
            self._handle = None

    def write(self, data: bytes) -> None:
        self.whole.update(data)
        view = memoryview(data)
        while view:
            if self._handle is None or self._size >= self.part_size:
                self._next_file()
            assert self._handle is not None
            chunk = view[: self.part_size - self._size]
            self._handle.write(chunk)
            self._hash.update(chunk)
            self._size += len(chunk)
            view = view[len(chunk) :]

    def close(self) -> list[WrittenFile]:
        self._close_current()
        if self._index != len(self.names) - 1:
            raise RuntimeError(f"planned {len(self.names)} files, wrote {self._index + 1}")
        return self.written


def write_safetensors(
    directory: Path, name: str, tensors: Sequence[Tensor], seed: str, part_size: int | None = None
) -> tuple[list[WrittenFile], int, str]:
    """Write a safetensors file, optionally as ``.partNN`` pieces only.

    Returns (files written, logical size, sha256 of the logical file).
    """
    header = safetensors_header(tensors)
    data_size = sum(t.nbytes for t in tensors)
    total = len(header) + data_size
    if part_size is None:
        names, limit = [name], max(total, 1)
    else:
        count = max(1, math.ceil(total / part_size))
        names, limit = [part_name(name, i, count) for i in range(count)], part_size
    writer = SplitWriter(directory, names, limit)
    writer.write(header)
    for block in random_blocks(f"{seed}:{name}", data_size):
        writer.write(block)
    return writer.close(), total, writer.whole.hexdigest()


def write_json(path: Path, data: Any) -> WrittenFile:
    """Pretty JSON with a trailing newline; insertion order keeps it deterministic."""
    return write_text(path, json.dumps(data, indent=2) + "\n")


def write_text(path: Path, text: str) -> WrittenFile:
    data = text.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return WrittenFile(path.name, len(data), hashlib.sha256(data).hexdigest())


# --------------------------------------------------------------------------- content


def expert_tensors(prefix: str, budget: int) -> list[Tensor]:
    """FP8 block-quantised packed experts filling ``budget`` bytes (weight + block scales)."""
    per_row = HIDDEN + 4 / FP8_BLOCK  # one F32 scale per FP8_BLOCK rows
    rows = max(1, int(budget / per_row))
    while rows > 1 and rows * HIDDEN + math.ceil(rows / FP8_BLOCK) * 4 > budget:
        rows -= 1
    col_blocks = math.ceil(HIDDEN / FP8_BLOCK)
    return [
        Tensor(f"{prefix}.mlp.experts.weight", "F8_E4M3", (rows, HIDDEN)),
        Tensor(f"{prefix}.mlp.experts.weight_scale_inv", "F32", (math.ceil(rows / FP8_BLOCK), col_blocks)),
    ]


def layer_tensors(layer: int, budget: int) -> list[Tensor]:
    """Attention + norms at fixed small shapes; the experts take what is left of the budget."""
    prefix = f"model.layers.{layer}"
    fixed = [
        Tensor(f"{prefix}.input_layernorm.weight", "BF16", (HIDDEN,)),
        Tensor(f"{prefix}.self_attn.q_a_proj.weight", "BF16", (Q_LORA_RANK, HIDDEN)),
        Tensor(f"{prefix}.self_attn.kv_a_proj_with_mqa.weight", "BF16", (KV_LORA_RANK + ROPE_DIM, HIDDEN)),
        Tensor(f"{prefix}.self_attn.o_proj.weight", "BF16", (HIDDEN, HIDDEN)),
        Tensor(f"{prefix}.post_attention_layernorm.weight", "BF16", (HIDDEN,)),
    ]
    return fixed + expert_tensors(prefix, budget - sum(t.nbytes for t in fixed))


def shard_plan(total_bytes: int) -> list[list[Tensor]]:
    """Tensors per shard: two layers each, embeddings in shard 1, norm and lm_head in shard 6."""
    weight_sum = sum(SHARD_WEIGHTS)
    layers_per_shard = LAYERS // SHARD_COUNT
    plan: list[list[Tensor]] = []
    for index, weight in enumerate(SHARD_WEIGHTS, start=1):
        budget = total_bytes * weight // weight_sum
        extra: list[Tensor] = []
        if index == 1:
            extra.append(Tensor("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN)))
        if index == SHARD_COUNT:
            extra += [
                Tensor("model.norm.weight", "BF16", (HIDDEN,)),
                Tensor("lm_head.weight", "BF16", (VOCAB, HIDDEN)),
            ]
        per_layer = (budget - sum(t.nbytes for t in extra)) // layers_per_shard
        tensors: list[Tensor] = []
        first = (index - 1) * layers_per_shard
        for layer in range(first, first + layers_per_shard):
            tensors += layer_tensors(layer, per_layer)
        plan.append(extra + tensors if index == 1 else tensors + extra)
    return plan


def model_config() -> dict[str, Any]:
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "_standin": "SYNTHETIC lab checkpoint: random weights with the real file layout",
        "hidden_size": HIDDEN,
        "intermediate_size": 4 * HIDDEN,
        "moe_intermediate_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "q_lora_rank": Q_LORA_RANK,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_rope_head_dim": ROPE_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 262144,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        },
    }


def tokenizer_json() -> dict[str, Any]:
    """A minimal but well-formed ``tokenizers`` WordLevel tokenizer."""
    specials = [BEGIN_OF_SENTENCE, END_OF_SENTENCE, "<unk>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for i in range(256 - len(specials)):
        vocab[f"w{i}"] = len(vocab)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, token in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }


def model_card(size_mb: float) -> str:
    return (
        "---\nlicense: mit\nlibrary_name: transformers\ntags:\n- synthetic\n- lab-standin\n---\n\n"
        "# DeepSeek-V4.1-Flash-Spark (SYNTHETIC STAND-IN)\n\n"
        "This is NOT the real model. It is a tiny synthetic checkpoint generated by\n"
        "`lab/standins/hub/make_checkpoint.py` with the file layout of\n"
        "`0xSero/DeepSeek-V4.1-Flash-Spark`: six safetensors shards (shards 5 and 6 stored as\n"
        "`.partNN` pieces), `sha256-manifest.txt`, EXL3 banks and the EXL3 plan.\n"
        f"Tensor data is deterministic pseudo-random bytes (~{size_mb:g} MiB in total).\n"
    )


def exl3_layer_tensors(layer: int, bits: int) -> list[Tensor]:
    prefix = f"model.layers.{layer}.mlp.experts"
    return [
        Tensor(f"{prefix}.trellis", "I16", (HIDDEN // 16, HIDDEN // 16, 16 * bits)),
        Tensor(f"{prefix}.suh", "F16", (HIDDEN,)),
        Tensor(f"{prefix}.svh", "F16", (HIDDEN,)),
    ]


def exl3_plan(layers: int) -> dict[str, Any]:
    banks = list(EXL3_BANKS)
    return {
        "name": PLAN_NAME,
        "format": "exl3",
        "qdir": ":".join(banks),
        "bits": EXL3_BANKS,
        "codebook": "mcg",
        "hidden_size": HIDDEN,
        "layers": [
            {"index": i, "bank": banks[i % len(banks)], "file": f"L{i:02d}.part.safetensors"}
            for i in range(layers)
        ],
    }


# --------------------------------------------------------------------------- driver


def default_part_size(split_sizes: Sequence[int]) -> int:
    """Part size giving each split shard 2-3 parts (3 for the largest)."""
    return max(1, math.ceil(max(split_sizes) * 0.4))


def generate(
    out: Path | str,
    *,
    size_mb: float = 24,
    part_size_mb: float | None = None,
    seed: int = 0,
    exl3_layers: int = 4,
) -> dict[str, Any]:
    """Write the checkpoint into ``out`` (must not exist or be empty) and return a summary.

    Files are written into a hidden sibling directory that is renamed into place at the end,
    so a hub serving the parent directory never exposes a half-written repository.
    """
    if size_mb < MIN_SIZE_MB:
        raise ValueError(f"--size-mb must be at least {MIN_SIZE_MB:g}")
    if not 1 <= exl3_layers <= MAX_EXL3_LAYERS:
        raise ValueError(f"--exl3-layers must be between 1 and {MAX_EXL3_LAYERS}")
    if part_size_mb is not None and part_size_mb <= 0:
        raise ValueError("--part-size-mb must be positive")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")

    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        summary = _write_all(staging, size_mb, part_size_mb, seed, exl3_layers)
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary["out"] = str(out)
    return summary


def _write_all(
    root: Path, size_mb: float, part_size_mb: float | None, seed: int, exl3_layers: int
) -> dict[str, Any]:
    files: list[WrittenFile] = []
    plan = shard_plan(int(size_mb * MIB))

    files.append(write_json(root / "config.json", model_config()))
    files.append(
        write_json(
            root / "generation_config.json",
            {"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.95},
        )
    )
    files.append(
        write_json(
            root / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": BEGIN_OF_SENTENCE,
                "eos_token": END_OF_SENTENCE,
                "unk_token": "<unk>",
                "model_max_length": 262144,
            },
        )
    )
    files.append(write_json(root / "tokenizer.json", tokenizer_json()))
    files.append(write_text(root / "README.md", model_card(size_mb)))

    split_sizes = [
        len(safetensors_header(plan[i - 1])) + sum(t.nbytes for t in plan[i - 1]) for i in SPLIT_SHARDS
    ]
    part_size = int(part_size_mb * MIB) if part_size_mb is not None else default_part_size(split_sizes)
    part_size = max(1, part_size)

    shards: dict[str, dict[str, Any]] = {}
    weight_map: dict[str, str] = {}
    for index, tensors in enumerate(plan, start=1):
        name = shard_name(index)
        written, size, digest = write_safetensors(
            root, name, tensors, str(seed), part_size if index in SPLIT_SHARDS else None
        )
        files += written
        shards[name] = {"size": size, "sha256": digest}
        if index in SPLIT_SHARDS:
            shards[name]["parts"] = [w.path for w in written]
        weight_map.update(dict.fromkeys((t.name for t in tensors), name))

    total_size = sum(t.nbytes for tensors in plan for t in tensors)
    files.append(
        write_json(
            root / "model.safetensors.index.json",
            {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))},
        )
    )
    manifest = "".join(f"{info['sha256']}  {name}\n" for name, info in shards.items())
    files.append(write_text(root / "sha256-manifest.txt", manifest))

    for bank, bits in EXL3_BANKS.items():
        bank_dir = root / "exl3" / bank
        bank_dir.mkdir(parents=True)
        for layer in range(exl3_layers):
            written, _, _ = write_safetensors(
                bank_dir, f"L{layer:02d}.part.safetensors", exl3_layer_tensors(layer, bits), f"{seed}:{bank}"
            )
            files += [WrittenFile(f"exl3/{bank}/{w.path}", w.size, w.sha256) for w in written]
    plan_file = write_json(root / "exl3" / "plan" / f"{PLAN_NAME}.json", exl3_plan(exl3_layers))
    files.append(WrittenFile(f"exl3/plan/{plan_file.path}", plan_file.size, plan_file.sha256))

    files.sort(key=lambda f: f.path)
    return {
        "total_bytes": sum(f.size for f in files),
        "tensor_bytes": total_size,
        "part_size": part_size,
        "shards": shards,
        "files": {f.path: {"size": f.size, "sha256": f.sha256} for f in files},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="target directory (absent or empty)")
    parser.add_argument(
        "--size-mb", type=float, default=24, help="approximate total size in MiB (default 24)"
    )
    parser.add_argument(
        "--part-size-mb",
        type=float,
        default=None,
        help="split size for shards 5 and 6 in MiB (default: 2-3 parts per shard)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the pseudo-random tensor data")
    parser.add_argument("--exl3-layers", type=int, default=4, help="files per EXL3 bank (default 4)")
    args = parser.parse_args(argv)
    try:
        summary = generate(
            args.out,
            size_mb=args.size_mb,
            part_size_mb=args.part_size_mb,
            seed=args.seed,
            exl3_layers=args.exl3_layers,
        )
    except (ValueError, FileExistsError) as exc:
        parser.error(str(exc))
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
