"""Write a tiny Llama checkpoint that the REAL vLLM serves with fixed answers (lab only).

Runs inside the lab's vLLM image (torch, transformers, tokenizers):

    docker run --rm -v OUT:/out --entrypoint python3 IMAGE \
        /opt/sparkserve-lab/make_tiny_model.py --out /out/tiny --variant good

It trains a byte-level BPE tokenizer (1,024 tokens) and a 2-layer Llama (hidden 256, 4 heads,
2 KV heads: tensor parallel 2 splits both) on fixed question/answer pairs rendered through the
model's own chat template, exactly as vLLM's /v1/chat/completions renders a request
(`apply_chat_template(messages, add_generation_prompt=True)`), until greedy decoding gives every
answer followed by the EOS token, so generation stops by itself. The variant `wrong` answers
17 * 23 with 392: a second, distinguishable checkpoint for upgrade tests. Same arguments, same
bytes: fixed seeds, one thread, deterministic algorithms.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

# Before importing tokenizers/torch: single-threaded, hence reproducible, training.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 1024
SPECIALS = ["<|pad|>", "<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS = SPECIALS[0], SPECIALS[1], SPECIALS[2]
CHAT_TEMPLATE = (
    "{{ '<|begin|>' }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

ANSWERS = {
    "good": {
        "What is 17 * 23?": "17 * 23 = 391.",
        "Count from 1 to 5.": "1, 2, 3, 4, 5.",
    },
    "wrong": {
        "What is 17 * 23?": "17 * 23 = 392.",
        "Count from 1 to 5.": "1, 2, 3, 4, 5.",
    },
}
# Shared by both variants: a few more fixed pairs, so the model is not a two-entry lookup table.
COMMON = {
    "Hello!": "Hello! I am a tiny test model.",
    "What is the capital of France?": "Paris.",
    "Who are you?": "I am a tiny model for the sparkserve lab.",
}


def corpus() -> list[str]:
    """Deterministic text for the BPE merges: the pairs plus arithmetic, counting and words, enough
    to fill 1,024 tokens."""
    lines = [f"{q} {a}" for variant in ANSWERS.values() for q, a in variant.items()]
    lines += [f"{q} {a}" for q, a in COMMON.items()]
    lines += [f"What is {a} * {b}? {a} * {b} = {a * b}." for a in range(1, 40) for b in range(1, 40)]
    lines += [", ".join(str(i) for i in range(start, start + 8)) + "." for start in range(1, 200)]
    lines += [
        "The model answers each question with a short sentence and then stops.",
        "A tiny test model serves the lab with fixed replies for upgrade tests.",
        "Counting, arithmetic and greetings are all it knows.",
    ]
    return lines


def train_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def examples(tokenizer: PreTrainedTokenizerFast, variant: str) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids + EOS) for every pair, the prompt rendered as vLLM renders it."""
    pairs = {**ANSWERS[variant], **COMMON}
    result = []
    for question, answer in pairs.items():
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        answer_ids = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
        result.append((prompt_ids, answer_ids))
    return result


def batch(data: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(p) + len(a) for p, a in data)
    ids = torch.full((len(data), width), pad_id, dtype=torch.long)
    labels = torch.full((len(data), width), -100, dtype=torch.long)
    mask = torch.zeros((len(data), width), dtype=torch.long)
    for row, (prompt, answer) in enumerate(data):
        sequence = prompt + answer
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        labels[row, len(prompt) : len(sequence)] = torch.tensor(answer)  # loss on the answer only
    return ids, mask, labels


def greedy(model: LlamaForCausalLM, prompt: list[int], eos_id: int, limit: int = 32) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(limit):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            if token == eos_id:
                break
    return ids[len(prompt) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True, type=Path, help="model directory to write")
    parser.add_argument("--variant", choices=sorted(ANSWERS), default="good")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=600)
    args = parser.parse_args(argv)

    started = time.monotonic()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    tokenizer = train_tokenizer()
    data = examples(tokenizer, args.variant)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    ids, mask, labels = batch(data, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)

    # Train (float32) until every answer comes back greedily in bfloat16 with a clear margin
    # (loss), checked every 25 steps: the stopping point depends only on deterministic values.
    step, loss_value = 0, float("inf")
    for step in range(1, args.max_steps + 1):
        model.train()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if step % 25 == 0 and loss_value < 0.002:
            model.eval()
            served = copy.deepcopy(model).to(torch.bfloat16)
            if all(greedy(served, p, tokenizer.eos_token_id) == a for p, a in data):
                break
    # vLLM on CPU serves bfloat16 (it downcasts float32): save and check what it will run.
    model = model.to(torch.bfloat16).eval()
    model.config.torch_dtype = torch.bfloat16
    replies = {}
    for (prompt, answer), question in zip(data, {**ANSWERS[args.variant], **COMMON}, strict=True):
        got = greedy(model, prompt, tokenizer.eos_token_id)
        replies[question] = tokenizer.decode(got)
        if got != answer:
            print(f"error: {question!r} -> {replies[question]!r} after {step} steps", file=sys.stderr)
            return 1

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    model.generation_config.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    # The chat template belongs in tokenizer_config.json (newer transformers write a separate
    # chat_template.jinja, which older readers miss).
    config_path = args.out / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    (args.out / "chat_template.jinja").unlink(missing_ok=True)
    for path in args.out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; the lab copies and mounts it for other users
    summary = {
        "variant": args.variant,
        "seed": args.seed,
        "steps": step,
        "loss": round(loss_value, 6),
        "seconds": round(time.monotonic() - started, 1),
        "replies": replies,
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
