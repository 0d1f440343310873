"""The fit check against the real engine: fit.yml's plan for the recipe tiny-chat (vLLM's CPU
backend takes cpu_kv_cache_gib of KV cache per rank), and a KV cache larger than the lab's nodes
stopped before any new rank starts, the ranks that served before serving again."""

from __future__ import annotations

import json
import re
import time

from lab_support import wait_for
from real_engine_support import ENGINE_START_SECONDS, RANKS, ask, playbook, record

# Each node's plan: tiny-chat needs 0.01 GiB of weights, 3 GiB of runtime and 1 GiB of KV cache.
NEEDS = "a rank needs 4.0 GiB (weights 0.0, runtime 3.0, KV cache 1.00 GiB): fits"


def kv_space(lab, node: str) -> str:
    env = lab.ssh(node, f"docker inspect --format '{{{{json .Config.Env}}}}' dsv41-r{RANKS[node]}").stdout
    return next(item for item in json.loads(env) if item.startswith("VLLM_CPU_KVCACHE_SPACE="))


def test_fit_yml_prints_each_nodes_plan_with_the_largest_kv_cache_and_context():
    run = playbook("fit.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    text = " ".join(run.stdout.split())
    assert text.count(NEEDS) == 2, run.stdout[-3000:]
    plans = re.findall(r"largest that fits: KV cache ([\d.]+) GiB, context (\d+) tokens", text)
    assert len(plans) == 2, run.stdout[-3000:]
    for kv_gib, tokens in plans:
        # 512 bytes of KV per token per rank (2 layers, 1 of 2 KV heads, head size 64, bf16).
        assert abs(int(tokens) - float(kv_gib) * 2**30 / 512) <= 2**30 / 512 / 100
    assert "(this node runs its rank now: its memory counts as taken)" in text


def test_a_kv_cache_the_nodes_cannot_hold_stops_before_any_rank_starts_and_the_old_ranks_serve(lab, key):
    before = {node: kv_space(lab, node) for node in RANKS}
    since = time.monotonic()
    run = playbook("site.yml", "-e", json.dumps({"rank_recipe_settings": {"cpu_kv_cache_gib": 4000}}))
    assert run.returncode != 0
    text = " ".join(run.stdout.split())
    needs = "the recipe needs 4003.0 GiB (weights 0.0 GiB, runtime 3.0 GiB, KV cache 4000.0 GiB)"
    assert f"A rank does not fit: head: {needs}" in text, run.stdout[-3000:]
    assert re.search(
        r"short by [\d.]+ GiB; lower rank_recipe_settings.cpu_kv_cache_gib to [\d.]+ at most", text
    )
    assert "(the ranks that served before run again)" in text
    assert "TASK [sparkserve.dsv41.rank : Run this node's rank container]" not in run.stdout, (
        "no new rank started"
    )
    assert {node: kv_space(lab, node) for node in RANKS} == before
    assert wait_for(lambda: "391" in (ask(key, "What is 17 * 23?", timeout=10) or ""),
                    timeout=ENGINE_START_SECONDS + 60, interval=2)  # fmt: skip
    record("fit check refused, old ranks serving again", time.monotonic() - since, "s", None,
           "from the run's start to the old ranks answering")  # fmt: skip
    # The failed run left its lock (the supervisor pauses); the next run takes it over and changes nothing.
    again = playbook("site.yml")
    assert again.returncode == 0, again.stdout[-3000:]
