"""Model recipes: finding one, checking it field by field, and rendering its templates."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _recipe as recipe
from ansible_collections.sparkserve.dsv41.plugins.module_utils._rank import vllm_rank_env, vllm_serve_args
from reference_config import reference_vllm_argv, reference_vllm_env

REPO_ROOT = Path(__file__).resolve().parents[4]
SHIPPED = sorted(path.stem for path in (REPO_ROOT / "recipes").glob("*.yml"))
DEEPSEEK = yaml.safe_load((REPO_ROOT / "recipes" / "deepseek-v4.1-flash.yml").read_text())
FACTS = {"ifname": "enp1s0f1np1", "hcas": "rocep1s0f1,roceP2p1s0f1", "host_ip": "198.18.0.11", "gid_index": 3}


def minimal(**changes: Any) -> dict[str, Any]:
    """The smallest valid recipe, with ``changes`` applied (None deletes a field)."""
    document: dict[str, Any] = {
        "recipe_version": 1,
        "name": "tiny",
        "served_model_name": "tiny",
        "image": "registry.example/tiny@sha256:" + "a" * 64,
        "checkpoint": {"repo": "org/tiny", "dir": "tiny"},
        "memory": {"weights_gib_per_rank": 0.1},
        "settings": {"max_model_len": 512},
        "serve": {
            "args": ["{model}", "--max-model-len", "{max_model_len}", "--tensor-parallel-size", "{nnodes}"],
            "head_args": ["--host", "{engine_host}", "--port", "{engine_port}"],
            "worker_args": ["--headless"],
            "env": {"GLOO_SOCKET_IFNAME": "{ifname}"},
        },
    }
    for key, value in changes.items():
        if value is None:
            document.pop(key)
        else:
            document[key] = value
    return document


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_is_valid(name):
    loaded = recipe.load_named(name)
    assert loaded["name"] == name
    assert Path(loaded["source"]).resolve() == REPO_ROOT / "recipes" / f"{name}.yml"


def test_the_shipped_recipes_are_the_deepseek_one_and_a_generic_one():
    assert {"deepseek-v4.1-flash", "vllm-generic"} <= set(SHIPPED)
    assert recipe.DEFAULT_RECIPE == "deepseek-v4.1-flash"


@pytest.mark.parametrize(("node_rank", "nnodes"), [(0, 2), (1, 2), (0, 3), (2, 3)])
def test_the_deepseek_recipe_renders_the_reference_exactly(node_rank, nnodes):
    loaded = recipe.load_named("deepseek-v4.1-flash")
    settings = {
        **loaded["settings"],
        "master_addr": "198.18.0.13",
        "master_port": 29655,
        "served_model_name": loaded["served_model_name"],
        "engine_host": "127.0.0.1",
        "engine_port": 8001,
    }
    args = vllm_serve_args(recipe=loaded, node_rank=node_rank, nnodes=nnodes, **settings)
    assert args == reference_vllm_argv(node_rank, nnodes, "198.18.0.13")
    env = vllm_rank_env(recipe=loaded, plan_name="J268-ho-v31-K5n.json", **FACTS)
    assert env == reference_vllm_env(FACTS["ifname"], FACTS["host_ip"], FACTS["hcas"])


def test_the_generic_recipe_renders_a_stock_vllm_command_line():
    loaded = recipe.load_named("vllm-generic")
    settings = {
        **loaded["settings"], "master_addr": "10.0.0.1", "master_port": 29655,
        "engine_host": "127.0.0.1", "engine_port": 8001,
    }  # fmt: skip
    head = vllm_serve_args(recipe=loaded, node_rank=0, nnodes=2, served_model_name="qwen", **settings)
    worker = vllm_serve_args(recipe=loaded, node_rank=1, nnodes=2, served_model_name="qwen", **settings)
    assert head[:3] == ["/model", "--served-model-name", "qwen"]
    assert head[-8:] == ["--node-rank", "0", "--host", "127.0.0.1", "--port", "8001",
                         "--allowed-media-domains", "media.invalid"]  # fmt: skip
    assert worker[-3:] == ["--node-rank", "1", "--headless"]
    assert "--engram-config" not in head and "--speculative-config" not in head
    env = vllm_rank_env(recipe=loaded, **FACTS)
    assert env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1" and "ST_EXL3_PLAN" not in env
    # What it leaves to the inventory is null, and the checkpoint is verified against the hub.
    assert (loaded["image"], loaded["served_model_name"], loaded["checkpoint"]["repo"]) == (None, None, None)
    assert loaded["checkpoint"]["manifest"] is None and loaded["checkpoint"]["exl3"] is None


def test_optional_fields_are_filled_in():
    loaded = recipe.validate(minimal())
    assert loaded["checkpoint"] == {
        "repo": "org/tiny",
        "revision": "",
        "dir": "tiny",
        "manifest": None,
        "split_shards": False,
        "exl3": None,
        "min_free_gib": {"head": 0, "worker": 0},
    }
    assert loaded["smoke"]["checks"] == list(recipe.SMOKE_CHECKS)
    assert loaded["pi"] == {
        "provider": "sparks",
        "model_name": None,
        "context_window": 512,
        "max_tokens": 512,
        "reasoning": False,
        "input": ["text"],
    }
    assert loaded["bench"] == {"reference": {}, "token_ids": [1000, 100000]}


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"recipe_version": 2}, "recipe_version: must be 1"),
        ({"name": None}, "name: is required"),
        ({"image": "registry.example/tiny:latest"}, "image: must be pinned by digest"),
        ({"checkpoint": {"repo": "org/tiny", "dir": "a/b"}}, "checkpoint.dir: must be one directory name"),
        (
            {"checkpoint": {"dir": "t", "split_shards": True}},
            "checkpoint.split_shards: needs checkpoint.manifest",
        ),
        (
            {"checkpoint": {"dir": "t", "exl3": {"plan": "p.json", "banks": []}}},
            "checkpoint.exl3.banks: must name",
        ),
        ({"checkpoint": {"dir": "t", "shards": 6}}, "checkpoint.shards: is not a recipe field"),
        ({"memory": {}}, "memory.weights_gib_per_rank: is required"),
        (
            {"memory": {"weights_gib_per_rank": -1}},
            "memory.weights_gib_per_rank: must be a number of 0 or more",
        ),
        (
            {"memory": {"weights_gib_per_rank": 1, "kv_cache_bytes": 1, "kv_cache_gib": 1}},
            "memory: kv_cache_bytes and kv_cache_gib are alternatives",
        ),
        (
            {"memory": {"weights_gib_per_rank": 1, "kv_cache_bytes": "{nope}"}},
            "memory.kv_cache_bytes: must be a number or one setting in braces",
        ),
        (
            {"memory": {"weights_gib_per_rank": 1, "kv_cache_gib": "{max_model_len} GiB"}},
            "memory.kv_cache_gib: must be a number or one setting in braces",
        ),
        (
            {"memory": {"weights_gib_per_rank": 1, "kv_bytes_per_token": -2}},
            "memory.kv_bytes_per_token: must be",
        ),
        ({"settings": {"nnodes": 4, "max_model_len": 512}}, "settings.nnodes: is a fact of the run"),
        ({"settings": {"Max": 1, "max_model_len": 512}}, "settings.Max: a setting's name"),
        ({"serve": {"head_args": []}}, "serve.args: is required"),
        ({"serve": {"args": ["--x", "{nope}"]}}, "serve.args[1]: names {nope}"),
        ({"serve": {"args": ["--x", "{unbalanced"]}}, "serve.args[1]: is not a valid template"),
        ({"serve": {"args": [True]}}, "serve.args[0]: must be a string"),
        ({"serve": {"args": [], "env": {"VLLM_API_KEY": "x"}}}, "serve.env.VLLM_API_KEY: the API key never"),
        ({"serve": {"args": [], "env": {"A": 1.5, "B": True}}}, "serve.env.B: must be a string"),
        ({"serve": {"args": [], "env": {"A": "{where}"}}}, "serve.env.A: names {where}"),
        ({"smoke": {"checks": ["text", "poetry"]}}, "smoke.checks: 'poetry' is not a smoke check"),
        ({"smoke": {"checks": []}}, "smoke.checks: must name at least one check"),
        ({"pi": {"input": ["audio"]}}, "pi.input: 'audio' is not an input"),
        ({"settings": {}, "pi": {}}, "pi.context_window: is required when settings has no max_model_len"),
        ({"bench": {"reference": {"prefill_8k": "fast"}}}, "bench.reference.prefill_8k: must be a number"),
        ({"bench": {"token_ids": [1000, 10]}}, "bench.token_ids: must be [low, high]"),
        ({"bench": {"token_ids": [1]}}, "bench.token_ids: must be [low, high]"),
        ({"extra": 1}, "extra: is not a recipe field"),
    ],
)
def test_a_wrong_field_is_named(changes, named):
    with pytest.raises(recipe.RecipeError, match=r"^my\.yml: ") as caught:
        recipe.validate(minimal(**changes), "my.yml")
    assert named in str(caught.value)


def test_every_wrong_field_is_named_at_once():
    with pytest.raises(recipe.RecipeError) as caught:
        recipe.validate(minimal(recipe_version=0, image="x:latest", memory={}), "my.yml")
    assert all(
        field in str(caught.value) for field in ("recipe_version:", "image:", "memory.weights_gib_per_rank:")
    )


@pytest.mark.parametrize("document", [None, [], "recipe"])
def test_a_recipe_is_a_mapping(document):
    with pytest.raises(recipe.RecipeError, match="a recipe is a YAML mapping"):
        recipe.validate(document, "my.yml")


def test_a_name_is_found_next_to_the_inventory_before_the_shipped_ones(tmp_path):
    inventory = tmp_path / "inventory"
    (inventory / "recipes").mkdir(parents=True)
    mine = inventory / "recipes" / "deepseek-v4.1-flash.yml"
    mine.write_text(yaml.safe_dump(minimal(name="deepseek-v4.1-flash")))
    assert recipe.find("deepseek-v4.1-flash", [str(inventory)]) == str(mine)
    shipped = recipe.find("vllm-generic", [str(inventory)])
    assert Path(shipped).resolve() == REPO_ROOT / "recipes" / "vllm-generic.yml"


@pytest.mark.parametrize("given", ["recipes/tiny.yml", "tiny.yaml"])
def test_a_path_is_relative_to_the_first_search_dir(tmp_path, given):
    target = tmp_path / given
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(minimal()))
    assert recipe.find(given, [str(tmp_path), str(tmp_path / "elsewhere")]) == str(target)
    assert recipe.load_named(str(target))["name"] == "tiny"
    with pytest.raises(recipe.RecipeError, match="no such recipe"):
        recipe.find(given, [str(tmp_path / "elsewhere"), str(tmp_path)])


@pytest.mark.parametrize(
    ("sources", "playbook_dir", "expected"),
    [
        # An inventory file: recipes/ beside it, inside its directory.
        (["/p/inventory/sparks/hosts.yml"], "/p", ["/p/inventory/sparks", "/p"]),
        # An inventory directory: Ansible reads every file inside it as inventory, so beside it.
        (["/p/inventory/sparks"], "/p", ["/p/inventory", "/p"]),
        (["/p/inventory/sparks/"], None, ["/p/inventory"]),
        (["/p/a/hosts.yml", "/p/b/hosts.yml", "/p/a/more.yml"], "/p/a", ["/p/a", "/p/b"]),
        ([], None, []),
    ],
)
def test_own_recipes_are_looked_for_beside_each_inventory_source(sources, playbook_dir, expected):
    assert recipe.search_dirs(sources, playbook_dir) == expected


def test_an_unknown_recipe_names_where_it_looked_and_what_ships(tmp_path):
    with pytest.raises(recipe.RecipeError) as caught:
        recipe.find("nope", [str(tmp_path)])
    message = str(caught.value)
    assert str(tmp_path / "recipes" / "nope.yml") in message
    assert "deepseek-v4.1-flash" in message and "vllm-generic" in message
    with pytest.raises(recipe.RecipeError, match="deployment_recipe is empty"):
        recipe.find("  ", [])


def test_a_file_that_is_not_yaml_is_named(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(recipe.RecipeError, match=r"broken\.yml: not valid YAML"):
        recipe.load(str(broken))


def test_templates_keep_a_lone_values_type_and_format_the_rest():
    templates = ["{n}", "x{n}y", {"a": "{n}", "b": ["{flag}", "{{lit}}"]}, "{{}}", "{flag}"]
    values = {"n": 7, "flag": True}
    mapping = json.dumps({"a": 7, "b": [True, "{lit}"]}, separators=(",", ":"))
    assert recipe.render_args(templates, values) == ["7", "x7y", mapping, "{}", "true"]
    assert recipe.render_env({"A": "/p/{n}", "B": "{n}"}, values) == {"A": "/p/7", "B": "7"}
    with pytest.raises(recipe.MissingSetting, match="no setting 'm'"):
        recipe.render_args(["{m}"], values)


def test_a_setting_the_templates_name_is_required_of_every_rank():
    loaded = recipe.validate(minimal())
    with pytest.raises(TypeError, match="'engine_port'"):
        # The worker does not use the API port, but a setting left out shows on any node.
        vllm_serve_args(recipe=loaded, node_rank=1, nnodes=2, max_model_len=512, engine_host="127.0.0.1")


@pytest.mark.parametrize(
    ("head_args", "message"),
    [
        (["--port", "{engine_port}"], 'must hold --host "{engine_host}"'),
        (["--host", "0.0.0.0", "--port", "{engine_port}"], 'must hold --host "{engine_host}"'),
        (["--host", "{engine_host}", "--port", "8000"], 'must hold --host "{engine_host}"'),
        (["--host", "{engine_host}", "--port", "{api_port}"], "names {api_port}: the engine listens behind"),
        (["--host", "{engine_host}", "--port", "{engine_port}", "--allowed-media-domains", "x.example"],
         "--allowed-media-domains is set by the collection"),
        (["--host", "{engine_host}", "--port", "{engine_port}", "--allowed-media-domains=x.example"],
         "--allowed-media-domains is set by the collection"),
    ],
    ids=["no-host", "all-interfaces", "fixed-port", "old-api-port", "media-domains", "media-domains-equals"],
)  # fmt: skip
def test_the_head_api_listens_only_behind_the_gateway(head_args, message):
    document = minimal()
    document["serve"]["head_args"] = head_args
    with pytest.raises(recipe.RecipeError, match="serve.head_args.*" + re.escape(message)):
        recipe.validate(document)


def test_the_deepseek_file_is_what_the_shipped_default_reads():
    assert (
        recipe.validate(copy.deepcopy(DEEPSEEK))["serve"] == recipe.load_named("deepseek-v4.1-flash")["serve"]
    )
