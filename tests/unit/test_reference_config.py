"""``tests/reference_config.py`` is a verbatim transcription of ``shared/spec/reference-config.md``.

CI (``CI`` set, as CI services do) has ``../shared/spec/`` beside the checkout, so there a missing
spec fails this test instead of letting the transcription go unchecked; elsewhere it skips.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from reference_config import REFERENCE_HEAD_ADDS, REFERENCE_VLLM_ARGS, REFERENCE_WORKER_ADDS

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC = REPO_ROOT.parent / "shared" / "spec" / "reference-config.md"


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def spec_text() -> str:
    if not SPEC.is_file():
        if in_ci():
            pytest.fail(
                f"CI is set but the reference spec {SPEC} is missing: CI must check out shared/spec/ "
                "beside this repository, so the reference transcription is compared with it",
                pytrace=False,
            )
        pytest.skip(f"reference-config.md is not next to this checkout ({SPEC}); in CI this fails")
    return SPEC.read_text()


def test_reference_transcription_matches_spec() -> None:
    text = spec_text()
    block = re.search(r"## vLLM arguments.*?```\n(.*?)```", text, re.S)
    assert block and block.group(1).split() == REFERENCE_VLLM_ARGS.split()
    assert f"`{REFERENCE_WORKER_ADDS}`" in text
    assert " ".join(REFERENCE_HEAD_ADDS.split()) in " ".join(text.replace("`", " ").split())
