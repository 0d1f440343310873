"""The STANDIN_* settings (rates, output length, boot delay, faults, fault file, leak rate, request
log path)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import StartupError

# Faults that change answers (the model is wrong), and faults of the process (the service is wrong).
ANSWER_FAULTS = frozenset({"wrong_math", "no_tool_call", "wrong_city", "swap_colors", "no_reasoning"})
OPERATIONAL_FAULTS = frozenset({"hang", "crash", "exit_on_start", "leak"})
KNOWN_FAULTS = ANSWER_FAULTS | OPERATIONAL_FAULTS


def _positive(env: dict[str, str], name: str, default: float, allow_zero: bool = False) -> float:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise StartupError(f"{name}={raw!r} is not a number") from exc
    if value < 0 or (value == 0 and not allow_zero):
        raise StartupError(f"{name}={raw!r} must be {'>= 0' if allow_zero else '> 0'}")
    return value


@dataclass(frozen=True)
class Settings:
    """Stand-in behaviour knobs, read once from STANDIN_* variables at start."""

    decode_tps: float = 50.0
    prefill_tps: float = 2000.0
    output_tokens: int = 64
    boot_seconds: float = 0.0
    faults: frozenset[str] = frozenset()
    request_log: Path = Path("/cache/standin-requests.jsonl")
    faults_file: Path = Path("/cache/standin-faults")
    leak_mib_per_s: float = 256.0
    leak_max_mib: float = 8192.0

    @classmethod
    def from_env(cls, env: dict[str, str], cache_dir: Path) -> Settings:
        faults = frozenset(f.strip() for f in env.get("STANDIN_FAULTS", "").split(",") if f.strip())
        unknown = faults - KNOWN_FAULTS
        if unknown:
            raise StartupError(
                f"STANDIN_FAULTS has unknown fault(s) {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(KNOWN_FAULTS))})"
            )
        return cls(
            decode_tps=_positive(env, "STANDIN_DECODE_TOKENS_PER_S", 50.0),
            prefill_tps=_positive(env, "STANDIN_PREFILL_TOKENS_PER_S", 2000.0),
            output_tokens=max(1, int(_positive(env, "STANDIN_OUTPUT_TOKENS", 64))),
            boot_seconds=_positive(env, "STANDIN_BOOT_SECONDS", 0.0, allow_zero=True),
            faults=faults,
            request_log=Path(env.get("STANDIN_REQUEST_LOG") or cache_dir / "standin-requests.jsonl"),
            # The rank container mounts the node's <state>/cache at /cache (= XDG_CACHE_HOME).
            faults_file=Path(env.get("STANDIN_FAULTS_FILE") or cache_dir / "standin-faults"),
            leak_mib_per_s=_positive(env, "STANDIN_LEAK_MIB_PER_S", 256.0),
            leak_max_mib=_positive(env, "STANDIN_LEAK_MAX_MIB", 8192.0),
        )
