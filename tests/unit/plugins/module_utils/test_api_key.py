"""The API key's pure parts: format, validation, plan, file contents."""

from __future__ import annotations

import hashlib
import re

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._api_key import (
    MIN_KEY_LENGTH,
    InvalidKeyFileError,
    env_file_content,
    fingerprint,
    generate_key,
    key_file_content,
    key_problem,
    plan_key,
    read_key,
)

KEY = "Zq3d0vJ1mT6yHkq8pXwA_r2LbN-5sE9uCfGhJkLmNoP"  # the shape of token_urlsafe(32)
PATH = "/home/ubuntu/.dsv41-two-sparks/api_key"


def test_generated_key_is_32_random_bytes_url_safe_without_padding():
    keys = {generate_key() for _ in range(20)}
    assert len(keys) == 20
    for key in keys:
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", key)
        assert key_problem(key) is None


def test_fingerprint_is_first_12_hex_of_sha256():
    assert fingerprint(KEY) == hashlib.sha256(KEY.encode()).hexdigest()[:12]
    assert KEY not in fingerprint(KEY)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (KEY.encode(), KEY),
        (f"{KEY}\n".encode(), KEY),
        (f"  {KEY}\r\n".encode(), KEY),
        (b"a" * 64, "a" * 64),  # `openssl rand -hex 32` is acceptable too
        (b"", None),
        (b"\n", None),
        (b"  \n\t\n", None),
    ],
    ids=["bare", "newline", "crlf-and-indent", "hex", "empty", "newline-only", "blank"],
)
def test_read_key_accepts_keys_and_blank_files(content, expected):
    assert read_key(PATH, content) == expected


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (f"{KEY[:20]} {KEY[20:]}".encode(), "whitespace"),
        (f"{KEY}\n{KEY}\n".encode(), "whitespace"),
        (b"sk-ant-api03+abc/def=ghijklmnopqrstuvwxyz0123456789", "characters outside"),
        (b"VLLM_API_KEY=" + KEY.encode(), "characters outside"),
        (b"short-key", f"9 characters long, at least {MIN_KEY_LENGTH}"),
        (b"\xff\xfe" + KEY.encode(), "not ASCII"),
        (b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n", "whitespace"),
    ],
    ids=["space-inside", "two-lines", "base64-std", "env-line", "too-short", "binary", "ssh-key"],
)
def test_read_key_rejects_what_is_not_a_key_without_quoting_it(content, problem):
    with pytest.raises(InvalidKeyFileError) as caught:
        read_key(PATH, content)
    message = str(caught.value)
    assert PATH in message
    assert problem in message
    assert "URL-safe" in message
    # No piece of it either: a message quoting one line of two, or the part after a `=`, leaks as much.
    pieces = re.split(r"[^A-Za-z0-9_-]+", content.decode("ascii", errors="ignore"))
    assert not [piece for piece in pieces if len(piece) >= 8 and piece in message], message


def fixed_key() -> str:
    return "N" * 43


@pytest.mark.parametrize(
    ("current", "regenerate", "expected_key", "write", "reason"),
    [
        (None, "never", "N" * 43, True, "created"),
        (None, "always", "N" * 43, True, "created"),
        (b"", "never", "N" * 43, True, "blank"),
        (b"\n", "always", "N" * 43, True, "blank"),
        (f"{KEY}\n".encode(), "never", KEY, False, "kept"),
        (f"{KEY}\n".encode(), "always", "N" * 43, True, "rotated"),
    ],
)
def test_plan_key(current, regenerate, expected_key, write, reason):
    plan = plan_key(PATH, current, regenerate, generate=fixed_key)
    assert (plan.key, plan.write, plan.reason) == (expected_key, write, reason)


@pytest.mark.parametrize("regenerate", ["never", "always"])
def test_plan_key_refuses_to_replace_a_file_that_is_not_a_key(regenerate):
    with pytest.raises(InvalidKeyFileError):
        plan_key(PATH, b"not a key at all\n", regenerate, generate=fixed_key)


def test_file_contents():
    assert key_file_content(KEY) == f"{KEY}\n".encode()
    assert env_file_content("VLLM_API_KEY", KEY) == f"VLLM_API_KEY={KEY}\n".encode()
