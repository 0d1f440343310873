"""sparkserve.dsv41.ssh_keypair run in-process with the real ssh-keygen: make, keep, restore, refuse."""

from __future__ import annotations

import subprocess

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils._ssh_keypair import (
    KeyPairPlan,
    derive_argv,
    generate_argv,
    plan_keypair,
    public_key_line,
)
from ansible_collections.sparkserve.dsv41.plugins.modules import ssh_keypair
from dir_snapshot import snapshot

# What ssh-keygen 9 wrote for a key made as the supervisor's is made.
PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOr2vJq8d3kYwP0b7Hn5pF2mT6yXcQeR1sLgUaZi4oVt"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PUBLIC + " sparkserve.dsv41 supervisor on head\n", PUBLIC + " sparkserve.dsv41 supervisor on head"),
        ("  " + PUBLIC + "\n", PUBLIC),
        (None, None),
        ("", None),
        ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ comment", None),
        (PUBLIC + "\n" + PUBLIC, None),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", None),
    ],
)
def test_public_key_line_takes_one_ed25519_line_only(text, expected):
    assert public_key_line(text) == expected


OTHER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBx0m9wQy7T3kZrVnHc2LpE5aJ8uYd4fGs1NqW6tXo0R"


@pytest.mark.parametrize(
    ("derived", "public_text", "expected"),
    [
        # No private key: both are made, whatever public key file is there.
        (None, None, KeyPairPlan("generate")),
        (None, PUBLIC, KeyPairPlan("generate")),
        # The pair as made: kept, with its own comment.
        (PUBLIC + " made", PUBLIC + " made\n", KeyPairPlan("keep", PUBLIC + " made")),
        (PUBLIC, PUBLIC + " renamed\n", KeyPairPlan("keep", PUBLIC + " renamed")),
        # Missing, damaged or of another key: written again from the private key.
        (PUBLIC + " made", None, KeyPairPlan("restore", PUBLIC + " made")),
        (PUBLIC, "garbage", KeyPairPlan("restore", PUBLIC + " the comment")),
        (PUBLIC + " made", OTHER + " made\n", KeyPairPlan("restore", PUBLIC + " made")),
    ],
)
def test_plan_never_replaces_a_private_key(derived, public_text, expected):
    assert plan_keypair(derived, public_text, "the comment") == expected


def test_argv_are_argument_lists_with_no_passphrase():
    assert generate_argv("/usr/bin/ssh-keygen", "/k", "a b") == [
        "/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "a b", "-f", "/k",
    ]  # fmt: skip
    assert derive_argv("/usr/bin/ssh-keygen", "/k") == ["/usr/bin/ssh-keygen", "-y", "-P", "", "-f", "/k"]


def test_makes_the_pair_once_then_keeps_it(run_module, tmp_path):
    key = tmp_path / "id_ed25519"
    first = run_module(ssh_keypair, {"path": str(key), "comment": "sparkserve.dsv41 test"})
    assert first["changed"] is True
    assert first["public_key"] == (tmp_path / "id_ed25519.pub").read_text().strip()
    assert first["public_key"].startswith("ssh-ed25519 ") and first["public_key"].endswith(
        " sparkserve.dsv41 test"
    )
    assert key.stat().st_mode & 0o777 == 0o600
    before = snapshot(tmp_path)
    second = run_module(ssh_keypair, {"path": str(key), "comment": "another comment"})
    assert (second["changed"], second["public_key"]) == (False, first["public_key"])
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "path", ["id_ed25519", "ssh/id_ed25519"], ids=["directory there", "directory to come"]
)
def test_check_mode_makes_nothing_and_has_no_public_key_yet(run_module, tmp_path, path):
    result = run_module(ssh_keypair, {"path": str(tmp_path / path)}, check_mode=True)
    assert (result["changed"], result["public_key"]) == (True, None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("check_mode", [False, True])
def test_a_lost_or_damaged_public_key_is_restored_from_the_private_one(run_module, tmp_path, check_mode):
    key = tmp_path / "id_ed25519"
    made = run_module(ssh_keypair, {"path": str(key), "comment": "kept"})
    (tmp_path / "id_ed25519.pub").write_text("not a key\n")
    private_before = key.read_bytes()
    restored = run_module(ssh_keypair, {"path": str(key), "comment": "kept"}, check_mode=check_mode)
    assert (restored["changed"], restored["public_key"]) == (True, made["public_key"])
    assert key.read_bytes() == private_before
    on_disk = (tmp_path / "id_ed25519.pub").read_text()
    assert on_disk == ("not a key\n" if check_mode else made["public_key"] + "\n")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda tmp: (tmp / "id_ed25519").mkdir(), "is a directory"),
        (lambda tmp: None, "the directory of path does not exist"),
        (lambda tmp: (tmp / "id_ed25519").write_text("not a private key\n"), "ssh-keygen failed"),
        (lambda tmp: None, "comment cannot be used: it contains a line break"),
    ],
)
def test_bad_input_fails_and_changes_nothing(run_module, tmp_path, setup, message):
    setup(tmp_path)
    path = tmp_path / ("missing-dir/id_ed25519" if "does not exist" in message else "id_ed25519")
    comment = "two\nlines" if "comment" in message else ""
    before = snapshot(tmp_path)
    result = run_module(ssh_keypair, {"path": str(path), "comment": comment})
    assert result.failed and message in result["msg"], result
    assert snapshot(tmp_path) == before


def test_the_key_made_is_one_ssh_accepts(run_module, tmp_path):
    key = tmp_path / "id_ed25519"
    made = run_module(ssh_keypair, {"path": str(key), "comment": "c"})
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(key)], capture_output=True, text=True, check=True
    ).stdout
    assert "(ED25519)" in fingerprint and made["public_key"].endswith(" c")


def test_a_passphrase_protected_key_fails_instead_of_prompting(run_module, tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True)
    (tmp_path / "id_ed25519.pub").unlink()
    before = snapshot(tmp_path)
    result = run_module(ssh_keypair, {"path": str(key)})
    assert result.failed and "ssh-keygen failed" in result["msg"], result
    assert snapshot(tmp_path) == before


def test_a_public_key_of_another_pair_is_replaced_by_the_private_keys_own(run_module, tmp_path):
    mine, other = tmp_path / "id_ed25519", tmp_path / "other" / "id_ed25519"
    other.parent.mkdir()
    made = run_module(ssh_keypair, {"path": str(mine), "comment": "mine"})
    foreign = run_module(ssh_keypair, {"path": str(other), "comment": "other"})
    (tmp_path / "id_ed25519.pub").write_text(foreign["public_key"] + "\n")
    fixed = run_module(ssh_keypair, {"path": str(mine), "comment": "mine"})
    assert (fixed["changed"], fixed["public_key"]) == (True, made["public_key"])
    assert (tmp_path / "id_ed25519.pub").read_text() == made["public_key"] + "\n"
