# Copyright: sparkserve maintainers (@sparkserve)
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0.txt)
# SPDX-License-Identifier: Apache-2.0
"""The vLLM command line and environment of one rank, rendered from the model's recipe.

Internal to sparkserve.dsv41; not a public API. Pure functions: the rank role renders them
through the ``vllm_serve_args`` and ``vllm_rank_env`` filters. The recipe holds the templates
(``recipes/*.yml``); every value they name is a required argument, given by the rank role from the
recipe's settings and its rank_* variables; the tests show that the role's defaults with the
DeepSeek-V4.1-Flash recipe give the reference configuration value for value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.sparkserve.dsv41.plugins.module_utils._recipe import (
    DEFAULT_RECIPE,
    MissingSetting,
    find,
    load,
    render_args,
    render_env,
    template_names,
)

NO_MEDIA_DOMAIN = "media.invalid"
_DOMAIN = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


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


def serving_values(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The values a recipe's templates are filled with: ``settings`` (those given as None left out),
    plus the CUDA graph capture sizes, derived where the settings allow and none are given."""
    values = {key: value for key, value in settings.items() if value is not None}
    explicit = values.pop("capture_sizes", None) or values.get("cudagraph_capture_sizes")
    if explicit:
        sizes = capture_sizes_from(explicit)
    elif "num_speculative_tokens" in values and "max_num_seqs" in values:
        sizes = cudagraph_capture_sizes(int(values["num_speculative_tokens"]), int(values["max_num_seqs"]))
    else:
        return values
    values["capture_sizes"], values["max_capture_size"] = sizes, sizes[-1]
    return values


def typed_as_the_recipe(settings: Mapping[str, Any], recipe_settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with each number given as text (``-e rank_max_model_len=65536`` is a string)
    made the number type the recipe's own value has: a template that is a lone ``{name}`` keeps
    the value's type, so JSON arguments would otherwise carry ``"65536"``."""
    typed = dict(settings)
    for name, recipe_value in recipe_settings.items():
        given = typed.get(name)
        if not isinstance(given, str) or isinstance(recipe_value, bool):
            continue
        if isinstance(recipe_value, int | float):
            kind = type(recipe_value)
            try:
                typed[name] = kind(given.strip())
            except ValueError:
                raise ValueError(
                    f"setting {name} must be a number like the recipe's {recipe_value!r}, got {given!r}"
                ) from None
    return typed


def media_domains_args(domains: Sequence[str]) -> list[str]:
    """The head's ``--allowed-media-domains``: the domains given, else one that never resolves.

    vLLM (0.32, ``MediaConnector``) fetches an image URL of any host when the list is empty or
    unset, and refuses a host not in it when it is set: a name under the reserved ``.invalid``
    (RFC 2606) refuses every URL while ``data:`` images still work.
    """
    for domain in domains:
        if not isinstance(domain, str) or not _DOMAIN.fullmatch(domain):
            raise ValueError(
                f"rank_allowed_media_domains: {domain!r} is not a host name (e.g. images.example.com)"
            )
    return ["--allowed-media-domains", *(domains or [NO_MEDIA_DOMAIN])]


def vllm_serve_args(
    *,
    node_rank: int,
    nnodes: int,
    recipe: Mapping[str, Any] | None = None,
    extra_args: list[str] | None = None,
    allowed_media_domains: Sequence[str] = (),
    model: str = "/model",
    **settings: Any,
) -> list[str]:
    """The rank container's arguments (after the image's ``vllm serve`` entrypoint): the recipe's
    ``serve.args``, then ``head_args`` (and ``extra_args``) on rank 0 or ``worker_args`` on the others.

    ``settings`` fill the recipe's templates: the rank role passes the recipe's settings overridden
    by its rank_* variables, and the run's facts (``master_addr``, ``master_port``, ``engine_host``,
    ``engine_port``, ``served_model_name``). A value a template names that is not given is a
    TypeError naming it.
    ``recipe`` defaults to the DeepSeek-V4.1-Flash one. ``capture_sizes`` or
    ``cudagraph_capture_sizes`` (upstream ``CAPS``) replace the derived CUDA graph capture sizes;
    ``model`` is where the container sees the checkpoint.
    """
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank {node_rank} is outside 0..{nnodes - 1}")
    recipe = recipe if recipe is not None else default_recipe()
    values = serving_values(typed_as_the_recipe(settings, recipe.get("settings") or {}))
    values.update({"node_rank": node_rank, "nnodes": nnodes, "model": model})
    serve = recipe["serve"]
    # Whatever any rank's templates name is required of every rank, so a setting left out shows on
    # the first node rendered, not only on the one that uses it.
    missing = sorted(template_names([serve["args"], serve["head_args"], serve["worker_args"]]) - set(values))
    if missing:
        if {"capture_sizes", "max_capture_size"} & set(missing):
            missing = [name for name in missing if name not in ("capture_sizes", "max_capture_size")]
            missing += [
                name for name in ("num_speculative_tokens", "max_num_seqs") if name not in {*values, *missing}
            ]
        raise TypeError(f"vllm_serve_args() missing required settings: {', '.join(map(repr, missing))}")
    try:
        args = render_args(serve["args"], values)
        if node_rank == 0:
            return (
                args
                + render_args(serve["head_args"], values)
                + media_domains_args(allowed_media_domains)
                + [str(arg) for arg in extra_args or []]
            )
        return args + render_args(serve["worker_args"], values)
    except MissingSetting as error:
        raise TypeError(str(error)) from error


def vllm_rank_env(
    *,
    recipe: Mapping[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    **facts: Any,
) -> dict[str, str]:
    """The rank container's environment: the recipe's ``serve.env`` filled with this node's fabric
    facts (``ifname``, ``hcas``, ``host_ip``, ``gid_index``) and ``plan_name``; ``extra`` wins."""
    recipe = recipe if recipe is not None else default_recipe()
    values = {key: value for key, value in facts.items() if value is not None}
    try:
        env = render_env(recipe["serve"]["env"], values)
    except MissingSetting as error:
        raise TypeError(str(error)) from error
    env.update({str(key): str(value) for key, value in (extra or {}).items()})
    return env


_DEFAULT: dict[str, Any] = {}


def default_recipe() -> dict[str, Any]:
    """The DeepSeek-V4.1-Flash recipe the collection ships (read once)."""
    if not _DEFAULT:
        _DEFAULT.update(load(find(DEFAULT_RECIPE, ())))
    return _DEFAULT
