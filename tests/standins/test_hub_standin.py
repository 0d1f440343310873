"""The synthetic checkpoint and the STAND-IN hub, exercised with the real ``huggingface_hub`` client.

``huggingface_hub`` reads ``HF_ENDPOINT`` and friends at import time, so every client call runs
in a subprocess with its own environment; the hub itself runs on a thread of the test process
(or as its CLI, for the token test) and its JSON access log says what the client fetched.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HUB_DIR = REPO_ROOT / "lab" / "standins" / "hub"
REPO_ID = "0xSero/DeepSeek-V4.1-Flash-Spark"
SIZE_MB = 4
DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "I16": 2, "F8_E4M3": 1, "U8": 1}


def _load(module_name: str, filename: str) -> ModuleType:
    """Import a lab script by path (lab/ is not a package), under a name no one else uses."""
    spec = importlib.util.spec_from_file_location(module_name, HUB_DIR / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up while executing it
    spec.loader.exec_module(module)
    return module


make_checkpoint = _load("hub_standin_make_checkpoint", "make_checkpoint.py")
hf_hub_standin = _load("hub_standin_server", "hf_hub_standin.py")


# --------------------------------------------------------------------------- helpers


def tree_bytes(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` except huggingface_hub's own ``.cache``."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(directory).parts
    }


def shard_bytes(repo: Path, name: str) -> bytes:
    """A shard as the reassembly step will see it: the file, or its parts in numeric order."""
    if (repo / name).exists():
        return (repo / name).read_bytes()
    parts = sorted(repo.glob(f"{name}.part*"), key=lambda p: int(p.name.rpartition(".part")[2]))
    return b"".join(p.read_bytes() for p in parts)


def parse_safetensors(data: bytes) -> dict[str, Any]:
    """Check the safetensors framing strictly and return the header."""
    (length,) = struct.unpack("<Q", data[:8])
    assert length % 8 == 0, "header must be padded to 8 bytes"
    header = json.loads(data[8 : 8 + length])
    assert header.pop("__metadata__") == {"format": "pt"}
    payload = len(data) - 8 - length
    offset = 0
    for info in sorted(header.values(), key=lambda i: i["data_offsets"][0]):
        begin, end = info["data_offsets"]
        assert begin == offset, "tensors must be contiguous"
        assert end - begin == math.prod(info["shape"]) * DTYPE_SIZE[info["dtype"]]
        offset = end
    assert offset == payload, "tensor data must fill the file exactly"
    return header


class AccessLog:
    """The hub's JSON-lines access log, read from a mark so each test sees its own requests."""

    def __init__(self, path: Path, server: Any = None) -> None:
        self.path = path
        self.server = server

    def mark(self) -> int:
        return len(self.records())

    def records(self, since: int = 0) -> list[dict[str, Any]]:
        if self.server is not None:
            assert self.server.wait_idle()
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()[since:]]

    def fetched(self, since: int) -> list[str]:
        """Repo paths whose content was sent (GET on resolve, 200 or 206)."""
        return sorted(
            r["path"].split("/resolve/", 1)[1].split("/", 1)[1]
            for r in self.records(since)
            if r["method"] == "GET" and "/resolve/" in r["path"] and r["status"] in (200, 206)
        )


CLIENT = r"""
import json, sys
import huggingface_hub

results = []
for call in json.load(sys.stdin):
    try:
        results.append({"path": huggingface_hub.snapshot_download(**call)})
    except Exception as exc:
        response = getattr(exc, "response", None)
        results.append({"error": type(exc).__name__, "status": getattr(response, "status_code", None)})
print(json.dumps(results))
"""


def hf_client(endpoint: str, home: Path, *calls: dict[str, Any]) -> list[dict[str, Any]]:
    """Run ``snapshot_download(**call)`` for each call in one fresh interpreter.

    Calls go through stdin so that a token never shows up in a command line.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(home),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    result = subprocess.run(
        [sys.executable, "-c", CLIENT],
        input=json.dumps(list(calls)),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def http(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    """(status, headers, body) of a request, without raising on HTTP errors."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hub_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """(hub root, repo directory, generator summary) of a ~4 MB checkpoint."""
    root = tmp_path_factory.mktemp("hub-root")
    repo = root / REPO_ID
    summary = make_checkpoint.generate(repo, size_mb=SIZE_MB)
    return root, repo, summary


@pytest.fixture(scope="module")
def hub_server(
    hub_checkpoint: tuple[Path, Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, AccessLog]]:
    """A token-less hub on a free loopback port, with a small page size to exercise pagination."""
    log_path = tmp_path_factory.mktemp("hub-log") / "access.log"
    with log_path.open("a") as log:
        server = hf_hub_standin.serve_in_thread(hub_checkpoint[0], access_log=log, page_size=7)
        try:
            yield server, AccessLog(log_path, server)
        finally:
            server.shutdown()
            server.server_close()


# --------------------------------------------------------------------------- the checkpoint


def test_shards_are_real_safetensors_matching_the_index(hub_checkpoint):
    _, repo, summary = hub_checkpoint
    index = json.loads((repo / "model.safetensors.index.json").read_text())
    seen: dict[str, str] = {}
    total = 0
    for i in range(1, 7):
        name = f"model-{i:05d}-of-00006.safetensors"
        header = parse_safetensors(shard_bytes(repo, name))
        seen.update(dict.fromkeys(header, name))
        total += sum(info["data_offsets"][1] - info["data_offsets"][0] for info in header.values())
    assert seen == index["weight_map"]
    assert total == index["metadata"]["total_size"]
    sizes = [summary["shards"][f"model-{i:05d}-of-00006.safetensors"]["size"] for i in range(1, 7)]
    assert min(sizes[4:]) > max(sizes[:4]), "shards 5 and 6 are the largest, as upstream"
    assert 0.9 * SIZE_MB * 2**20 < summary["total_bytes"] < 1.1 * SIZE_MB * 2**20


def test_shards_5_and_6_exist_only_as_parts_matching_the_manifest(hub_checkpoint):
    _, repo, _ = hub_checkpoint
    manifest = dict(
        reversed(line.split("  ")) for line in (repo / "sha256-manifest.txt").read_text().splitlines()
    )
    assert sorted(manifest) == [f"model-{i:05d}-of-00006.safetensors" for i in range(1, 7)]
    for name, digest in manifest.items():
        assert hashlib.sha256(shard_bytes(repo, name)).hexdigest() == digest
    for name in list(manifest)[4:]:
        assert not (repo / name).exists()
        assert [p.name[-6:] for p in sorted(repo.glob(f"{name}.part*"))] in (
            ["part00", "part01"],
            ["part00", "part01", "part02"],
        )


def test_exl3_banks_and_plan(hub_checkpoint):
    _, repo, _ = hub_checkpoint
    for bank in ("qn", "q31", "q31s"):
        files = sorted(p.name for p in (repo / "exl3" / bank).glob("L??.part.safetensors"))
        assert files == [f"L{i:02d}.part.safetensors" for i in range(4)]
        for file in files:
            parse_safetensors((repo / "exl3" / bank / file).read_bytes())
    plan = json.loads((repo / "exl3" / "plan" / "J268-ho-v31-K5n.json").read_text())
    assert plan["qdir"] == "qn:q31:q31s"
    assert len(plan["layers"]) == 4


def test_generation_is_deterministic_and_seeded(tmp_path):
    first = make_checkpoint.generate(tmp_path / "a", size_mb=3, exl3_layers=2)
    second = make_checkpoint.generate(tmp_path / "b", size_mb=3, exl3_layers=2)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    assert first["files"] == second["files"]
    other = make_checkpoint.generate(tmp_path / "c", size_mb=3, exl3_layers=2, seed=1)
    assert other["shards"] != first["shards"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging directory left"


def test_small_part_size_gives_many_parts_in_order(tmp_path):
    summary = make_checkpoint.generate(tmp_path / "ck", size_mb=3, part_size_mb=0.1, exl3_layers=1)
    for name in ("model-00005-of-00006.safetensors", "model-00006-of-00006.safetensors"):
        parts = summary["shards"][name]["parts"]
        assert len(parts) >= 10
        assert parts == sorted(parts)
        data = b"".join((tmp_path / "ck" / p).read_bytes() for p in parts)
        assert hashlib.sha256(data).hexdigest() == summary["shards"][name]["sha256"]


def test_cli_prints_summary_and_refuses_a_non_empty_target(tmp_path):
    command = [
        sys.executable,
        str(HUB_DIR / "make_checkpoint.py"),
        "--out",
        str(tmp_path / "ck"),
        "--size-mb",
        "2",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout)
    assert summary["files"]["sha256-manifest.txt"]["size"] > 0
    again = subprocess.run(command, capture_output=True, text=True, check=False)
    assert again.returncode == 2
    assert "not an empty directory" in again.stderr


# --------------------------------------------------------------------------- the hub


def test_snapshot_download_mirrors_the_repo_and_a_rerun_fetches_nothing(hub_server, hub_checkpoint, tmp_path):
    server, log = hub_server
    _, repo, _ = hub_checkpoint
    target = tmp_path / "model"
    mark = log.mark()
    (result,) = hf_client(server.url, tmp_path / "hf", {"repo_id": REPO_ID, "local_dir": str(target)})
    assert result == {"path": str(target)}
    assert tree_bytes(target) == tree_bytes(repo)
    assert log.fetched(mark) == sorted(tree_bytes(repo))
    assert sum("/tree/" in r["path"] for r in log.records(mark)) >= 2, "listing is paginated (page size 7)"

    # huggingface_hub 2.4 keeps <local_dir>/.cache/huggingface/trees/<sha>.json and per-file
    # download/<file>.metadata (commit + etag): a rerun resolves `main` and touches nothing else.
    mark = log.mark()
    (result,) = hf_client(server.url, tmp_path / "hf", {"repo_id": REPO_ID, "local_dir": str(target)})
    assert result == {"path": str(target)}
    assert log.fetched(mark) == []
    assert [(r["method"], r["path"].split("/")[-2:]) for r in log.records(mark)] == [
        ("GET", ["revision", "main"])
    ]


def test_snapshot_download_at_a_pinned_commit_skips_revision_lookup(hub_server, hub_checkpoint, tmp_path):
    server, log = hub_server
    _, repo, _ = hub_checkpoint
    status, _, body = http(f"{server.url}/api/models/{REPO_ID}/revision/main")
    sha = json.loads(body)["sha"]
    call = {"repo_id": REPO_ID, "local_dir": str(tmp_path / "m"), "revision": sha}
    mark = log.mark()
    (result,) = hf_client(server.url, tmp_path / "hf", call)
    assert status == 200 and "error" not in result
    assert tree_bytes(tmp_path / "m") == tree_bytes(repo)
    assert not [r for r in log.records(mark) if "/revision/" in r["path"]]
    assert all(f"/resolve/{sha}/" in r["path"] for r in log.records(mark) if "/resolve/" in r["path"])

    mark = log.mark()
    assert hf_client(server.url, tmp_path / "hf", call) == [result]
    assert log.records(mark) == [], "a pinned rerun is answered from local_dir/.cache alone"


@pytest.mark.parametrize(
    ("patterns", "keep"),
    [
        (
            {"allow_patterns": ["*.json", "sha256-manifest.txt"]},
            lambda p: p.endswith(".json") or p[:6] == "sha256",
        ),
        ({"ignore_patterns": ["*.part*"]}, lambda p: not fnmatch.fnmatch(p, "*.part*")),
    ],
    ids=["allow", "ignore"],
)
def test_patterns_fetch_only_what_they_select(hub_server, hub_checkpoint, tmp_path, patterns, keep):
    server, log = hub_server
    _, repo, _ = hub_checkpoint
    mark = log.mark()
    (result,) = hf_client(
        server.url, tmp_path / "hf", {"repo_id": REPO_ID, "local_dir": str(tmp_path / "m"), **patterns}
    )
    assert "error" not in result
    expected = sorted(p for p in tree_bytes(repo) if keep(p))
    assert log.fetched(mark) == expected
    assert sorted(tree_bytes(tmp_path / "m")) == expected


def test_unknown_revision_and_repo_raise_the_hub_errors(hub_server, tmp_path):
    server, _ = hub_server
    results = hf_client(
        server.url,
        tmp_path / "hf",
        {"repo_id": REPO_ID, "local_dir": str(tmp_path / "a"), "revision": "v9.9"},
        {"repo_id": REPO_ID, "local_dir": str(tmp_path / "b"), "revision": "0" * 40},
        {"repo_id": "0xSero/no-such-repo", "local_dir": str(tmp_path / "c")},
    )
    assert results == [
        {"error": "RevisionNotFoundError", "status": 404},
        {"error": "RevisionNotFoundError", "status": 404},
        {"error": "RepositoryNotFoundError", "status": 404},
    ]


def test_resolve_headers_and_ranges(hub_server, hub_checkpoint):
    server, log = hub_server
    _, repo, _ = hub_checkpoint
    part = "model-00005-of-00006.safetensors.part01"
    data = (repo / part).read_bytes()
    url = f"{server.url}/{REPO_ID}/resolve/main/{part}"

    status, headers, body = http(url, "HEAD")
    assert (status, body) == (200, b"")
    sha256 = hashlib.sha256(data).hexdigest()
    assert headers["ETag"] == headers["X-Linked-Etag"] == f'"{sha256}"'
    assert headers["X-Linked-Size"] == headers["Content-Length"] == str(len(data))
    assert headers["Accept-Ranges"] == "bytes"
    assert len(headers["X-Repo-Commit"]) == 40
    assert not [h for h in headers if h.lower().startswith("x-xet")]

    mark = log.mark()
    for spec, expected in [
        ("bytes=1000-", data[1000:]),
        ("bytes=10-19", data[10:20]),
        ("bytes=-7", data[-7:]),
    ]:
        status, headers, body = http(url, headers={"Range": spec})
        assert (status, body) == (206, expected)
        first = len(data) - len(expected) if spec == "bytes=-7" else int(spec[6:].split("-")[0])
        assert headers["Content-Range"] == f"bytes {first}-{first + len(expected) - 1}/{len(data)}"
    assert http(url, headers={"Range": f"bytes={len(data)}-"})[0] == 416
    # Each request is logged by its own handler thread once its answer is sent: the lines of requests
    # sent one after the other may land in either order (seen in CI), so the set is what counts.
    assert sorted(r["range"] for r in log.records(mark)) == sorted(
        ["bytes=1000-", "bytes=10-19", "bytes=-7", f"bytes={len(data)}-"]
    )

    config = (repo / "config.json").read_bytes()
    status, headers, body = http(f"{server.url}/{REPO_ID}/resolve/main/config.json")
    git_oid = hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    assert (status, body, headers["ETag"]) == (200, config, f'"{git_oid}"')
    assert "X-Linked-Etag" not in headers
    status, headers, _ = http(f"{server.url}/{REPO_ID}/resolve/main/nope.bin")
    assert (status, headers["X-Error-Code"]) == (404, "EntryNotFound")


def test_tree_listing_and_model_info(hub_server, hub_checkpoint):
    server, _ = hub_server
    _, repo, _ = hub_checkpoint
    status, _, body = http(f"{server.url}/api/models/{REPO_ID}/tree/main/exl3%2Fqn?recursive=false")
    assert status == 200
    entries = json.loads(body)
    assert [e["path"] for e in entries] == [f"exl3/qn/L{i:02d}.part.safetensors" for i in range(4)]
    lfs = entries[0]["lfs"]
    data = (repo / entries[0]["path"]).read_bytes()
    assert lfs["oid"] == hashlib.sha256(data).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{lfs['oid']}\nsize {len(data)}\n"
    assert (lfs["size"], lfs["pointerSize"]) == (len(data), len(pointer))

    status, _, body = http(f"{server.url}/api/models/{REPO_ID}?blobs=true")
    info = json.loads(body)
    assert info["id"] == REPO_ID and info["private"] is False
    assert sorted(s["rfilename"] for s in info["siblings"]) == sorted(tree_bytes(repo))
    status, _, _ = http(f"{server.url}/api/models/{REPO_ID}/revision/{info['sha']}")
    assert status == 200


def test_commit_id_follows_content_not_mtime(tmp_path):
    repo = tmp_path / "org" / "repo"
    repo.mkdir(parents=True)
    (repo / "a.txt").write_text("one")
    store = hf_hub_standin.RepoStore(tmp_path)
    first = store.snapshot("org", "repo").commit
    os.utime(repo / "a.txt", (time.time() + 5, time.time() + 5))
    assert store.snapshot("org", "repo").commit == first
    (repo / "a.txt").write_text("two")
    assert store.snapshot("org", "repo").commit != first
    assert (
        hf_hub_standin.RepoStore(tmp_path).snapshot("org", "repo").commit
        == store.snapshot("org", "repo").commit
    )
    assert store.snapshot("org", "..") is None


def test_throttle_caps_the_download_rate(hub_checkpoint):
    root, repo, _ = hub_checkpoint
    server = hf_hub_standin.serve_in_thread(root, throttle_mbps=2)
    try:
        part = "model-00005-of-00006.safetensors.part00"
        started = time.monotonic()
        status, _, body = http(f"{server.url}/{REPO_ID}/resolve/main/{part}")
        elapsed = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert (status, body) == (200, (repo / part).read_bytes())
    assert elapsed >= 0.8 * len(body) / 2_000_000


def test_token_is_required_and_never_logged(hub_checkpoint, tmp_path):
    root, repo, _ = hub_checkpoint
    token = "hf_standin_" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    (tmp_path / "token").write_text(token + "\n")
    log_path = tmp_path / "access.log"
    hub = subprocess.Popen(
        [
            sys.executable,
            str(HUB_DIR / "hf_hub_standin.py"),
            "--root",
            str(root),
            "--port",
            "0",
            "--token-file",
            str(tmp_path / "token"),
            "--access-log",
            str(log_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = hub.stdout.readline()
        url = banner.split(" at ")[1].split()[0]
        status, headers, _ = http(f"{url}/api/models/{REPO_ID}")
        assert (status, headers["X-Error-Code"]) == (401, "RepoNotFound")
        status, _, _ = http(
            f"{url}/{REPO_ID}/resolve/main/config.json", headers={"Authorization": "Bearer nope"}
        )
        assert status == 401

        results = hf_client(
            url,
            tmp_path / "hf",
            {"repo_id": REPO_ID, "local_dir": str(tmp_path / "a")},
            {"repo_id": REPO_ID, "local_dir": str(tmp_path / "b"), "token": "hf_wrong"},
            {
                "repo_id": REPO_ID,
                "local_dir": str(tmp_path / "c"),
                "token": token,
                "allow_patterns": ["*.json"],
            },
        )
        assert results[0] == {"error": "RepositoryNotFoundError", "status": 401}
        assert results[1] == {"error": "HfHubHTTPError", "status": 401}
        assert results[2] == {"path": str(tmp_path / "c")}
        assert sorted(tree_bytes(tmp_path / "c")) == sorted(
            p for p in tree_bytes(repo) if p.endswith(".json")
        )
    finally:
        hub.terminate()
        output, _ = hub.communicate(timeout=10)
    records = AccessLog(log_path).records()
    assert {r["auth"] for r in records} == {"none", "invalid", "ok"}
    assert token not in log_path.read_text()
    assert token not in banner + output
