# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""Model recipes: everything that belongs to one model, in one file, checked field by field.

Internal to sparkserve.dsv41; not a public API. Used on the controller only (the ``recipe`` lookup
and the rank filters). A recipe is YAML (docs/recipes.md); :func:`validate` returns it with every
optional field filled in, or raises :class:`RecipeError` naming each field that is wrong.

Arguments and environment are templates: a string ``"{name}"`` is replaced by the value of ``name``
(a serving setting of the recipe, or a fact of the run such as ``nnodes``), keeping its type when the
string is nothing else; a mapping or list among the arguments becomes compact JSON. ``{{`` and ``}}``
stand for literal braces.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

try:
    import yaml
except ImportError:  # pragma: no cover - the controller always has PyYAML (Ansible needs it)
    yaml = None

RECIPE_VERSION = 1
DEFAULT_RECIPE = "deepseek-v4.1-flash"
# The recipes the collection ships, beside plugins/.
SHIPPED_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "recipes"
)
SMOKE_CHECKS = ("text", "tool_call", "vision", "reasoning", "stream")
PI_INPUTS = ("text", "image")
BENCH_TOKEN_IDS = (1000, 100000)
# Facts of the run a template may name besides the recipe's settings.
RUN_FACTS = (
    "model",
    "served_model_name",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "engine_host",
    "engine_port",
    "capture_sizes",
    "max_capture_size",
    "ifname",
    "hcas",
    "host_ip",
    "gid_index",
    "plan_name",
)
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


class RecipeError(ValueError):
    """The recipe cannot be used; the message names the file and every field that is wrong."""


class MissingSetting(TypeError):
    """A template names a value that was not given (a TypeError, as a missing keyword argument is)."""


# --------------------------------------------------------------------------- loading


def find(name_or_path: str, search_dirs: Sequence[str], shipped_dir: str = SHIPPED_DIR) -> str:
    """The file a ``deployment_recipe`` value names.

    A value with a ``/`` or ending in ``.yml``/``.yaml`` is a path (relative ones to the first of
    ``search_dirs``); a bare name is ``<dir>/recipes/<name>.yml`` in the first of ``search_dirs``
    that has it, else the collection's shipped recipe of that name.
    """
    value = name_or_path.strip()
    if not value:
        raise RecipeError("deployment_recipe is empty: name a recipe (e.g. deepseek-v4.1-flash) or a file")
    if "/" in value or value.endswith((".yml", ".yaml")):
        candidates = [value] if os.path.isabs(value) else [os.path.join(d, value) for d in search_dirs[:1]]
    else:
        candidates = [os.path.join(d, "recipes", f"{value}.yml") for d in search_dirs]
        candidates.append(os.path.join(shipped_dir, f"{value}.yml"))
    for candidate in candidates:
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    shipped = sorted(n[: -len(".yml")] for n in os.listdir(shipped_dir) if n.endswith(".yml"))
    raise RecipeError(
        f"deployment_recipe={value!r}: no such recipe; looked for {', '.join(candidates)}. Shipped recipes:"
        f" {', '.join(shipped)}; a recipe of your own goes in recipes/<name>.yml beside the inventory file"
    )


def search_dirs(inventory_sources: Sequence[str], playbook_dir: str | None = None) -> list[str]:
    """Where recipes of one's own are looked for: beside each inventory source (the directory of an
    inventory file, the parent of an inventory directory, since Ansible reads every file inside an
    inventory directory as inventory), then the playbook's directory."""
    dirs = [os.path.dirname(os.path.normpath(source)) for source in inventory_sources if source]
    if playbook_dir:
        dirs.append(playbook_dir)
    return list(dict.fromkeys(dirs))


def load(path: str) -> dict[str, Any]:
    """The validated recipe in ``path``."""
    if yaml is None:
        raise RecipeError("reading a recipe needs PyYAML on the controller")
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except OSError as error:
        raise RecipeError(f"{path}: cannot be read ({error.strerror})") from error
    except yaml.YAMLError as error:
        raise RecipeError(f"{path}: not valid YAML ({error})") from error
    return validate(document, path)


def load_named(name_or_path: str, search_dirs: Sequence[str] = ()) -> dict[str, Any]:
    return load(find(name_or_path, search_dirs))


# --------------------------------------------------------------------------- validation


class _Checker:
    """Collects every problem of a recipe, so the user fixes them in one go."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, field: str, message: str) -> None:
        self.problems.append(f"{field}: {message}")

    def mapping(self, doc: Mapping[str, Any], field: str, *, required: bool = True) -> dict[str, Any]:
        value = doc.get(field.rsplit(".", 1)[-1])
        if value is None:
            if required:
                self.fail(field, "is required (a mapping)")
            return {}
        if not isinstance(value, Mapping):
            self.fail(field, f"must be a mapping, got {type(value).__name__}")
            return {}
        return dict(value)

    def text(
        self, doc: Mapping[str, Any], field: str, *, default: str | None = None, nullable: bool = False
    ) -> str | None:
        key = field.rsplit(".", 1)[-1]
        if key not in doc or doc[key] is None:
            if nullable:
                return None
            if default is None:
                self.fail(field, "is required (a string)")
            return default
        value = doc[key]
        if not isinstance(value, str):
            self.fail(field, f"must be a string, got {type(value).__name__} {value!r}")
            return default
        return value

    def number(self, doc: Mapping[str, Any], field: str, *, default: float | None = None) -> float | None:
        key = field.rsplit(".", 1)[-1]
        value = doc.get(key, default)
        if value is None and default is None:
            self.fail(field, "is required (a number)")
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            self.fail(field, f"must be a number of 0 or more, got {value!r}")
            return default
        return value

    def boolean(self, doc: Mapping[str, Any], field: str, *, default: bool) -> bool:
        value = doc.get(field.rsplit(".", 1)[-1], default)
        if not isinstance(value, bool):
            self.fail(field, f"must be true or false, got {value!r}")
            return default
        return value

    def strings(self, doc: Mapping[str, Any], field: str, *, default: Sequence[str] = ()) -> list[str]:
        value = doc.get(field.rsplit(".", 1)[-1], list(default))
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.fail(field, f"must be a list of strings, got {value!r}")
            return list(default)
        return value

    def unknown(self, doc: Mapping[str, Any], field: str, known: Sequence[str]) -> None:
        for key in doc:
            if key not in known:
                where = f"{field}.{key}" if field else str(key)
                self.fail(where, f"is not a recipe field (known here: {', '.join(known)})")


def template_names(value: Any) -> set[str]:
    """The names ``{name}`` a template value refers to."""
    if isinstance(value, str):
        return {name for _text, name, _spec, _conv in string.Formatter().parse(value) if name}
    if isinstance(value, Mapping):
        return set().union(*(template_names(item) for item in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(template_names(item) for item in value)) if value else set()
    return set()


def _check_templates(check: _Checker, field: str, value: Any, known: set[str]) -> None:
    try:
        names = template_names(value)
    except ValueError as error:  # an unbalanced brace
        check.fail(field, f"is not a valid template ({error}); write {{{{ and }}}} for literal braces")
        return
    for name in sorted(names - known):
        if name == "api_port":
            check.fail(
                field,
                "names {api_port}: the engine listens behind the API gateway now; write"
                f" {_ENGINE_ADDRESS_WORDS} in serve.head_args",
            )
            continue
        check.fail(field, f"names {{{name}}}, which is neither a setting of the recipe nor a fact of the run")


def _check_args(check: _Checker, field: str, value: Any, known: set[str]) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        check.fail(field, f"must be a list of arguments, got {type(value).__name__}")
        return []
    for index, item in enumerate(value):
        where = f"{field}[{index}]"
        if isinstance(item, bool) or not isinstance(item, str | Mapping | list):
            check.fail(where, f"must be a string, or a mapping or list (passed as JSON); got {item!r}")
            continue
        _check_templates(check, where, item, known)
    return value


# The collection owns these arguments: the head's API server listens only where the gateway reaches it,
# and media URLs are refused unless rank_allowed_media_domains names their hosts.
ENGINE_ADDRESS = {"--host": "{engine_host}", "--port": "{engine_port}"}
_ENGINE_ADDRESS_WORDS = " ".join(f'{flag} "{value}"' for flag, value in ENGINE_ADDRESS.items())
COLLECTION_ARGS = ("--allowed-media-domains",)


def _check_engine_address(check: _Checker, serve: Mapping[str, list[Any]]) -> None:
    for key in ("args", "head_args", "worker_args"):
        for index, item in enumerate(serve[key]):
            if isinstance(item, str) and item.split("=", 1)[0] in COLLECTION_ARGS:
                check.fail(
                    f"serve.{key}[{index}]",
                    f"{item.split('=', 1)[0]} is set by the collection (rank_allowed_media_domains)",
                )
    head = [item for item in serve["head_args"] if isinstance(item, str)]
    pairs = {head[i]: head[i + 1] for i in range(len(head) - 1) if head[i] in ENGINE_ADDRESS}
    if pairs != ENGINE_ADDRESS:
        check.fail(
            "serve.head_args",
            f"must hold {_ENGINE_ADDRESS_WORDS}: the API server listens on the head"
            " only, behind the gateway that asks every path but /health for the key",
        )


def _checkpoint(check: _Checker, document: Mapping[str, Any]) -> dict[str, Any]:
    checkpoint = check.mapping(document, "checkpoint")
    check.unknown(
        checkpoint,
        "checkpoint",
        ("repo", "revision", "dir", "manifest", "split_shards", "exl3", "min_free_gib"),
    )
    exl3 = check.mapping(checkpoint, "checkpoint.exl3", required=False) if checkpoint.get("exl3") else {}
    check.unknown(exl3, "checkpoint.exl3", ("plan", "banks"))
    min_free = check.mapping(checkpoint, "checkpoint.min_free_gib", required=False)
    check.unknown(min_free, "checkpoint.min_free_gib", ("head", "worker"))
    out = {
        "repo": check.text(checkpoint, "checkpoint.repo", nullable=True),
        "revision": check.text(checkpoint, "checkpoint.revision", default=""),
        "dir": check.text(checkpoint, "checkpoint.dir", nullable=True),
        "manifest": check.text(checkpoint, "checkpoint.manifest", nullable=True),
        "split_shards": check.boolean(checkpoint, "checkpoint.split_shards", default=False),
        "exl3": None,
        "min_free_gib": {
            "head": check.number(min_free, "checkpoint.min_free_gib.head", default=0),
            "worker": check.number(min_free, "checkpoint.min_free_gib.worker", default=0),
        },
    }
    if exl3:
        out["exl3"] = {
            "plan": check.text(exl3, "checkpoint.exl3.plan"),
            "banks": check.strings(exl3, "checkpoint.exl3.banks"),
        }
        if not out["exl3"]["banks"]:
            check.fail("checkpoint.exl3.banks", "must name at least one bank")
    directory = out["dir"]
    if directory is not None and (not directory or "/" in directory or directory.startswith(".")):
        check.fail(
            "checkpoint.dir", f"must be one directory name (it goes under ~/models/), got {directory!r}"
        )
    if out["split_shards"] and not out["manifest"]:
        check.fail(
            "checkpoint.split_shards", "needs checkpoint.manifest: split shards are rebuilt against it"
        )
    return out


def _settings(check: _Checker, document: Mapping[str, Any]) -> dict[str, Any]:
    settings = check.mapping(document, "settings", required=False)
    for key, value in settings.items():
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            check.fail(f"settings.{key}", "a setting's name is lower-case letters, digits and '_'")
        elif key in RUN_FACTS:
            check.fail(f"settings.{key}", "is a fact of the run, not a setting: remove it")
        elif value is None or isinstance(value, Mapping):
            check.fail(f"settings.{key}", f"must be a string, number, boolean or list, got {value!r}")
    return settings


def _serve(check: _Checker, document: Mapping[str, Any], known: set[str]) -> dict[str, Any]:
    serve = check.mapping(document, "serve")
    check.unknown(serve, "serve", ("args", "head_args", "worker_args", "env"))
    if "args" not in serve:
        check.fail("serve.args", "is required (the arguments of every rank, from the model path on)")
    out: dict[str, Any] = {
        key: _check_args(check, f"serve.{key}", serve.get(key), known)
        for key in ("args", "head_args", "worker_args")
    }
    _check_engine_address(check, out)
    env = check.mapping(serve, "serve.env", required=False)
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            check.fail(f"serve.env.{key}", "is not an environment variable name")
        elif key == "VLLM_API_KEY":
            check.fail(
                "serve.env.VLLM_API_KEY", "the API key never lives in a recipe: the collection passes it"
            )
        elif isinstance(value, bool) or not isinstance(value, str | int | float):
            check.fail(f"serve.env.{key}", f"must be a string (quote numbers), got {value!r}")
        else:
            _check_templates(check, f"serve.env.{key}", str(value), known)
    out["env"] = {str(key): str(value) for key, value in env.items()}
    return out


def _clients(check: _Checker, document: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """What the smoke checks, the benchmark and Pi are told of the model."""
    smoke = check.mapping(document, "smoke", required=False)
    check.unknown(smoke, "smoke", ("checks",))
    checks = check.strings(smoke, "smoke.checks", default=SMOKE_CHECKS)
    for item in checks:
        if item not in SMOKE_CHECKS:
            check.fail("smoke.checks", f"{item!r} is not a smoke check (known: {', '.join(SMOKE_CHECKS)})")
    if not checks:
        check.fail(
            "smoke.checks", "must name at least one check: a deployment nothing can judge is not gated"
        )

    bench = check.mapping(document, "bench", required=False)
    check.unknown(bench, "bench", ("reference", "token_ids"))
    reference = check.mapping(bench, "bench.reference", required=False)
    for key in list(reference):
        check.number(reference, f"bench.reference.{key}", default=0)
    # The prefill prompts' random token ids: ordinary vocabulary, clear of the special tokens.
    token_ids = bench.get("token_ids", list(BENCH_TOKEN_IDS))
    if not (
        isinstance(token_ids, list)
        and len(token_ids) == 2
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in token_ids)
        and token_ids[0] < token_ids[1]
    ):
        check.fail(
            "bench.token_ids",
            f"must be [low, high], 0 <= low < high, within the vocabulary; got {token_ids!r}",
        )

    pi = check.mapping(document, "pi", required=False)
    check.unknown(pi, "pi", ("provider", "model_name", "context_window", "max_tokens", "reasoning", "input"))
    tokens = settings.get("max_model_len") or 0
    pi_out = {
        "provider": check.text(pi, "pi.provider", default="sparks"),
        # None: the served model name.
        "model_name": check.text(pi, "pi.model_name", nullable=True),
        "context_window": check.number(pi, "pi.context_window", default=tokens),
        "max_tokens": check.number(pi, "pi.max_tokens", default=tokens),
        "reasoning": check.boolean(pi, "pi.reasoning", default=False),
        "input": check.strings(pi, "pi.input", default=["text"]),
    }
    for item in pi_out["input"]:
        if item not in PI_INPUTS:
            check.fail("pi.input", f"{item!r} is not an input Pi knows (known: {', '.join(PI_INPUTS)})")
    for key in ("context_window", "max_tokens"):
        if not pi_out[key]:
            check.fail(f"pi.{key}", "is required when settings has no max_model_len (a number of tokens)")
    return {
        "smoke": {"checks": checks},
        "bench": {"reference": dict(reference), "token_ids": token_ids},
        "pi": pi_out,
    }


def _kv_cache(check: _Checker, memory: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The KV cache per rank for the fit check: bytes or GiB, a number or one setting in braces."""
    given = [key for key in ("kv_cache_bytes", "kv_cache_gib") if memory.get(key) is not None]
    if len(given) > 1:
        check.fail("memory", "kv_cache_bytes and kv_cache_gib are alternatives: give one")
    kv = {"kv_cache_bytes": None, "kv_cache_gib": None}
    for key in given:
        value = memory[key]
        if isinstance(value, str):
            names = template_names(value)
            if value != "{" + next(iter(names), "") + "}" or not names <= set(settings):
                check.fail(
                    f"memory.{key}",
                    f'must be a number or one setting in braces ("{{kv_cache_memory_bytes}}"), got {value!r}',
                )
                continue
            kv[key] = value
        else:
            kv[key] = check.number(memory, f"memory.{key}")
    per_token = memory.get("kv_bytes_per_token")
    if per_token is not None:
        per_token = check.number(memory, "memory.kv_bytes_per_token")
    return {**kv, "kv_bytes_per_token": per_token}


def validate(document: Any, source: str = "recipe") -> dict[str, Any]:
    """``document`` as a complete recipe (optional fields filled in); :class:`RecipeError` otherwise."""
    if not isinstance(document, Mapping):
        raise RecipeError(f"{source}: a recipe is a YAML mapping, got {type(document).__name__}")
    check = _Checker()
    check.unknown(
        document,
        "",
        (
            "recipe_version", "name", "description", "served_model_name", "image", "checkpoint",
            "memory", "settings", "serve", "smoke", "bench", "pi",
        ),
    )  # fmt: skip
    version = document.get("recipe_version")
    if version != RECIPE_VERSION:
        check.fail(
            "recipe_version", f"must be {RECIPE_VERSION} (this collection's recipe format), got {version!r}"
        )
    name = check.text(document, "name")
    if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        check.fail("name", f"must be letters, digits, '.', '_' or '-', got {name!r}")
    image = check.text(document, "image", nullable=True)
    if image is not None and not _DIGEST.search(image):
        check.fail("image", f"must be pinned by digest (<repository>@sha256:<64 hex>), got {image!r}")
    memory = check.mapping(document, "memory")
    check.unknown(
        memory,
        "memory",
        (
            "weights_gib_per_rank",
            "runtime_gib_per_rank",
            "kv_cache_bytes",
            "kv_cache_gib",
            "kv_bytes_per_token",
        ),
    )
    settings = _settings(check, document)
    recipe = {
        "recipe_version": version,
        "name": name,
        "description": document.get("description") or "",
        "source": source,
        "served_model_name": check.text(document, "served_model_name", nullable=True),
        "image": image,
        "checkpoint": _checkpoint(check, document),
        "memory": {
            "weights_gib_per_rank": check.number(memory, "memory.weights_gib_per_rank"),
            "runtime_gib_per_rank": check.number(memory, "memory.runtime_gib_per_rank", default=0),
            **_kv_cache(check, memory, settings),
        },
        "settings": dict(settings),
        "serve": _serve(check, document, set(settings) | set(RUN_FACTS)),
        **_clients(check, document, settings),
    }
    if check.problems:
        raise RecipeError(f"{source}: " + "; ".join(check.problems))
    return recipe


# --------------------------------------------------------------------------- rendering


def _fill(value: Any, values: Mapping[str, Any]) -> Any:
    """One template value with ``values`` put in (a lone ``"{name}"`` keeps the value's type)."""
    if isinstance(value, Mapping):
        return {key: _fill(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, values) for item in value]
    if not isinstance(value, str):
        return value
    parsed = list(string.Formatter().parse(value))
    for _text, name, _spec, _conv in parsed:
        if name and name not in values:
            raise MissingSetting(f"the recipe names {{{name}}}, and no setting {name!r} was given")
    if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1]:
        return values[parsed[0][1]]
    return value.format_map(values)


def _argument(value: Any) -> str:
    if isinstance(value, Mapping | list):
        # Compact, as the reference passes it: vLLM parses it, humans compare it.
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render_args(templates: Sequence[Any], values: Mapping[str, Any]) -> list[str]:
    """The command-line arguments ``templates`` give with ``values``."""
    return [_argument(_fill(template, values)) for template in templates]


def render_env(templates: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, str]:
    return {key: _argument(_fill(template, values)) for key, template in templates.items()}
