#!/usr/bin/env python3
"""STAND-IN Hugging Face hub: serve plain directories as model repos to ``huggingface_hub``.

The lab cannot reach huggingface.co, so this tiny server implements just the endpoints that
``huggingface_hub`` (2.x: ``snapshot_download``, ``hf_hub_download``, ``HfApi.model_info``,
``list_repo_tree``, ``get_paths_info``) calls, for every directory ``<root>/<org>/<name>/``:

``GET  /api/models/{org}/{name}[/revision/{rev}]``    repo info (``sha``, ``siblings``, ...)
``GET  /api/models/{org}/{name}/tree/{rev}[/{path}]`` tree listing, paginated via ``Link``
``POST /api/models/{org}/{name}/paths-info/{rev}``    info about given paths
``HEAD|GET /{org}/{name}/resolve/{rev}/{path}``       file metadata / content, ``Range`` aware

Each repo has exactly one revision, ``main``, whose commit id is a sha1 over the tree listing
(paths, sizes, content hashes): it changes whenever the content does, and is stable across
restarts. Content hashes are cached by (path, size, mtime), so a big repo is hashed once.
Large files (>= 1 MiB, or any ``*.safetensors*``) are presented as git-LFS files (sha256 ETag,
``X-Linked-Etag``/``X-Linked-Size``) exactly like the real hub; Xet headers are never sent, so
clients use plain HTTP downloads. Hidden files and directories (``.name``) are not served.

With a token configured, every request needs ``Authorization: Bearer <token>``. The token is
never logged; the optional access log has one JSON line per request so tests can assert what
was fetched. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

MIB = 1024 * 1024
LFS_THRESHOLD = MIB
CHUNK = MIB
THROTTLED_CHUNK = 64 * 1024
DEFAULT_PAGE_SIZE = 1000  # the real hub's page size for non-expanded tree listings
DEFAULT_BRANCH = "main"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
CREATED_AT = "2026-01-01T00:00:00.000Z"  # fixed: nothing about a repo's history is simulated


def git_blob_id(chunks: Iterable[bytes], size: int) -> str:
    """Git's object id of a blob: sha1 over ``blob <size>\\0`` + content."""
    digest = hashlib.sha1(f"blob {size}\0".encode())  # noqa: S324 - git object ids are sha1 by definition
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file the real hub stores in git for a large file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def read_chunks(path: Path, start: int = 0, length: int | None = None, chunk: int = CHUNK) -> Iterable[bytes]:
    """Stream ``length`` bytes of ``path`` from ``start`` without holding the file in memory."""
    with path.open("rb") as handle:
        handle.seek(start)
        remaining = length
        while remaining is None or remaining > 0:
            data = handle.read(chunk if remaining is None else min(chunk, remaining))
            if not data:
                return
            if remaining is not None:
                remaining -= len(data)
            yield data


def iso_utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# --------------------------------------------------------------------------- repository model


@dataclass(frozen=True)
class RepoFile:
    """A file of a repo snapshot, with the ids the hub API exposes."""

    path: str
    abspath: Path
    size: int
    git_oid: str  # blob id in git: of the content, or of the LFS pointer for LFS files
    sha256: str | None  # set for LFS files only

    @property
    def is_lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def etag(self) -> str:
        return self.sha256 or self.git_oid

    def tree_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.git_oid, "size": self.size, "path": self.path}
        if self.sha256 is not None:
            pointer = lfs_pointer(self.sha256, self.size)
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(pointer)}
        return entry


@dataclass(frozen=True)
class Snapshot:
    """The single revision of a repo: files, directories and the derived commit id."""

    repo_id: str
    commit: str
    files: dict[str, RepoFile]
    directories: dict[str, str]  # path -> tree oid
    last_modified: float

    def entries(self) -> list[dict[str, Any]]:
        """All tree entries (files and directories), sorted by path."""
        dirs = [
            {"type": "directory", "oid": oid, "size": 0, "path": p} for p, oid in self.directories.items()
        ]
        return sorted(dirs + [f.tree_entry() for f in self.files.values()], key=lambda e: e["path"])

    def tree(self, base: str, recursive: bool) -> list[dict[str, Any]] | None:
        """Entries under ``base`` (``""`` for the root); None if ``base`` is not a directory."""
        if base and base not in self.directories:
            return None
        prefix = f"{base}/" if base else ""
        selected = []
        for entry in self.entries():
            path = entry["path"]
            if path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :]):
                selected.append(entry)
        return selected

    def resolve_revision(self, revision: str) -> bool:
        return revision in (DEFAULT_BRANCH, f"refs/heads/{DEFAULT_BRANCH}", self.commit)


class RepoStore:
    """Maps ``org/name`` to ``<root>/org/name`` and builds snapshots, caching content hashes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._hashes: dict[tuple[str, int, int], tuple[str, str | None]] = {}
        self._snapshots: dict[str, tuple[tuple[Any, ...], Snapshot]] = {}

    def repo_dir(self, org: str, name: str) -> Path | None:
        if not (NAME_RE.match(org) and NAME_RE.match(name)) or ".." in org + name:
            return None
        directory = self.root / org / name
        return directory if directory.is_dir() else None

    def snapshot(self, org: str, name: str) -> Snapshot | None:
        directory = self.repo_dir(org, name)
        if directory is None:
            return None
        listing = list(self._walk(directory))
        signature = tuple((rel, st.st_size, st.st_mtime_ns) for rel, _, st in listing)
        with self._lock:  # one hashing pass at a time; later requests only stat
            cached = self._snapshots.get(str(directory))
            if cached is not None and cached[0] == signature:
                return cached[1]
            snapshot = self._build(f"{org}/{name}", listing)
            self._snapshots[str(directory)] = (signature, snapshot)
            return snapshot

    @staticmethod
    def _walk(directory: Path) -> Iterable[tuple[str, Path, os.stat_result]]:
        """Regular files below ``directory``, skipping hidden names, sorted for stable output."""
        for current, dirs, files in os.walk(directory):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for filename in sorted(files):
                path = Path(current) / filename
                if filename.startswith(".") or not path.is_file():
                    continue
                yield path.relative_to(directory).as_posix(), path, path.stat()

    def _hash(self, path: Path, stat: os.stat_result) -> tuple[str, str | None]:
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in self._hashes:
            if stat.st_size >= LFS_THRESHOLD or ".safetensors" in path.name:
                sha256 = hashlib.sha256()
                for chunk in read_chunks(path):
                    sha256.update(chunk)
                digest = sha256.hexdigest()
                pointer = lfs_pointer(digest, stat.st_size)
                self._hashes[key] = (git_blob_id([pointer], len(pointer)), digest)
            else:
                self._hashes[key] = (git_blob_id(read_chunks(path), stat.st_size), None)
        return self._hashes[key]

    def _build(self, repo_id: str, listing: list[tuple[str, Path, os.stat_result]]) -> Snapshot:
        files: dict[str, RepoFile] = {}
        for rel, path, stat in listing:
            git_oid, sha256 = self._hash(path, stat)
            files[rel] = RepoFile(rel, path, stat.st_size, git_oid, sha256)
        commit = hashlib.sha1(b"standin-commit\n")  # noqa: S324 - mimics a git commit id, not security
        for rel, info in files.items():
            commit.update(f"{rel}\0{info.size}\0{info.etag}\n".encode())
        last_modified = max((stat.st_mtime for _, _, stat in listing), default=0.0)
        return Snapshot(repo_id, commit.hexdigest(), files, _directory_oids(files), last_modified)


def _directory_oids(files: dict[str, RepoFile]) -> dict[str, str]:
    """A deterministic id per directory from its children (git-like, not git's exact format)."""
    children: dict[str, list[str]] = {}
    for path, info in files.items():
        parts = path.split("/")
        for depth in range(1, len(parts)):
            children.setdefault("/".join(parts[:depth]), [])
        parent = "/".join(parts[:-1])
        children.setdefault(parent, []).append(f"blob {parts[-1]} {info.git_oid}")
    oids: dict[str, str] = {}
    for directory in sorted(children, key=lambda d: d.count("/") + 1 if d else 0, reverse=True):
        if not directory:
            continue
        digest = hashlib.sha1()  # noqa: S324 - git-like tree id
        for line in sorted(children[directory]):
            digest.update(f"{line}\n".encode())
        oids[directory] = digest.hexdigest()
        parent, _, name = directory.rpartition("/")
        children[parent].append(f"tree {name} {oids[directory]}")
    return dict(sorted(oids.items()))


# --------------------------------------------------------------------------- HTTP


class HubError(Exception):
    """An error response in the hub's style: status, ``X-Error-Code`` and a JSON body."""

    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


class HubServer(ThreadingHTTPServer):
    """The HTTP server plus the configuration the handler needs."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64  # huggingface_hub opens 8 connections at once by default

    def __init__(
        self,
        address: tuple[str, int],
        root: Path,
        *,
        token: str | None = None,
        access_log: IO[str] | None = None,
        throttle_mbps: float | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        super().__init__(address, HubHandler)
        self.store = RepoStore(root)
        self.token = token
        self.access_log = access_log
        self.throttle_bytes_per_s = throttle_mbps * 1_000_000 if throttle_mbps else None
        self.page_size = page_size
        self._log_lock = threading.Lock()
        self._idle = threading.Condition()
        self._in_flight = 0

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def request_started(self) -> None:
        with self._idle:
            self._in_flight += 1

    def request_finished(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is being handled, so every answered request is in the log.

        The log line is written after the response, so a client may already have its answer.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def log_access(self, record: dict[str, Any]) -> None:
        if self.access_log is None:
            return
        with self._log_lock:
            self.access_log.write(json.dumps(record) + "\n")
            self.access_log.flush()


class HubHandler(BaseHTTPRequestHandler):
    """Routes requests; every response carries a Content-Length so keep-alive works."""

    protocol_version = "HTTP/1.1"
    server_version = "hf-hub-standin/1"
    server: HubServer

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the stderr log: the access log is the record, and it is token-free."""

    # -- dispatch ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        self.server.request_started()
        try:
            self._handle()
        finally:
            self.server.request_finished()

    def _handle(self) -> None:
        self._status = 0
        self._sent = 0
        self._auth = "none"
        # Always consume a request body first, so an early error cannot desynchronise keep-alive.
        length = int(self.headers.get("Content-Length") or 0)
        self._body = self.rfile.read(length) if length else b""
        try:
            self._check_token()
            self._route()
        except HubError as error:
            self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # keep serving; the access log records the 500
            self.close_connection = True
            if self._status == 0:
                self._send_error(HubError(500, f"internal error: {type(exc).__name__}"))
        self.server.log_access(
            {
                "ts": iso_utc(time.time()),
                "client": self.client_address[0],
                "method": self.command,
                "path": self.path,
                "status": self._status,
                "bytes": self._sent,
                "range": self.headers.get("Range"),
                "auth": self._auth,
            }
        )

    def _check_token(self) -> None:
        header = self.headers.get("Authorization")
        self._auth = "none" if header is None else "bearer"
        expected = self.server.token
        if expected is None:
            return
        if header is None:
            # The real hub answers like this for a private repo and no credentials.
            raise HubError(401, "Invalid username or password.", "RepoNotFound")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), expected.encode()):
            self._auth = "invalid"
            raise HubError(401, "Invalid credentials in Authorization header")
        self._auth = "ok"

    def _route(self) -> None:
        url = urlsplit(self.path)
        segments = url.path.split("/")[1:]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if len(segments) >= 3 and segments[:2] == ["api", "models"]:
            self._route_api(segments[2:], query)
        elif len(segments) >= 5 and segments[2] == "resolve" and self.command in ("GET", "HEAD"):
            org, name, _, revision, *rest = segments
            snapshot = self._snapshot(org, name, unquote(revision))
            self._send_file(snapshot, unquote("/".join(rest)))
        else:
            raise HubError(404, "Not Found")

    def _route_api(self, segments: list[str], query: dict[str, str]) -> None:
        if len(segments) < 2:
            raise HubError(404, "Not Found")
        org, name, *rest = segments
        action = rest[0] if rest else None
        if self.command == "GET" and action is None:
            self._send_json(self._model_info(self._snapshot(org, name, DEFAULT_BRANCH), query))
        elif self.command == "GET" and action == "revision" and len(rest) == 2:
            snapshot = self._snapshot(org, name, unquote(rest[1]))
            self._send_json(self._model_info(snapshot, query))
        elif self.command == "GET" and action == "tree" and len(rest) >= 2:
            snapshot = self._snapshot(org, name, unquote(rest[1]))
            self._send_tree(snapshot, unquote("/".join(rest[2:])).strip("/"), query)
        elif self.command == "POST" and action == "paths-info" and len(rest) == 2:
            snapshot = self._snapshot(org, name, unquote(rest[1]))
            self._send_paths_info(snapshot)
        else:
            raise HubError(404, "Not Found")

    # -- endpoints ---------------------------------------------------------------------------

    def _snapshot(self, org: str, name: str, revision: str) -> Snapshot:
        snapshot = self.server.store.snapshot(org, name)
        if snapshot is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        if not snapshot.resolve_revision(revision):
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return snapshot

    @staticmethod
    def _model_info(snapshot: Snapshot, query: dict[str, str]) -> dict[str, Any]:
        with_blobs = query.get("blobs", "").lower() == "true"
        siblings = []
        for info in snapshot.files.values():
            sibling: dict[str, Any] = {"rfilename": info.path}
            if with_blobs:
                sibling.update(size=info.size, blobId=info.git_oid)
                if info.sha256 is not None:
                    pointer_size = len(lfs_pointer(info.sha256, info.size))
                    sibling["lfs"] = {"sha256": info.sha256, "size": info.size, "pointerSize": pointer_size}
            siblings.append(sibling)
        org = snapshot.repo_id.split("/")[0]
        return {
            "_id": snapshot.commit[:24],
            "id": snapshot.repo_id,
            "modelId": snapshot.repo_id,
            "author": org,
            "sha": snapshot.commit,
            "lastModified": iso_utc(snapshot.last_modified),
            "createdAt": CREATED_AT,
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "library_name": "transformers",
            "tags": ["transformers", "safetensors", "lab-standin"],
            "siblings": siblings,
            "usedStorage": sum(f.size for f in snapshot.files.values()),
        }

    def _send_tree(self, snapshot: Snapshot, base: str, query: dict[str, str]) -> None:
        recursive = query.get("recursive", "").lower() == "true"
        entries = snapshot.tree(base, recursive)
        if entries is None:
            raise HubError(404, f"{base} does not exist on {DEFAULT_BRANCH}", "EntryNotFound")
        if query.get("expand", "").lower() == "true":
            entries = [self._expand(snapshot, entry) for entry in entries]
        cursor = query.get("cursor", "0")
        if not cursor.isdigit():
            raise HubError(400, "Invalid cursor")
        start = int(cursor)
        page = entries[start : start + self.server.page_size]
        headers = {}
        if start + self.server.page_size < len(entries):
            host = self.headers.get("Host") or self.server.url.removeprefix("http://")
            next_query = {**query, "cursor": str(start + self.server.page_size)}
            query_string = "&".join(f"{k}={quote(v, safe='')}" for k, v in next_query.items())
            headers["Link"] = f'<http://{host}{urlsplit(self.path).path}?{query_string}>; rel="next"'
        self._send_json(page, headers)

    @staticmethod
    def _expand(snapshot: Snapshot, entry: dict[str, Any]) -> dict[str, Any]:
        """``expand=true`` adds the last commit (and, for files, a clean security scan)."""
        date = iso_utc(snapshot.last_modified)
        expanded = {
            **entry,
            "lastCommit": {"id": snapshot.commit, "title": "Stand-in snapshot", "date": date},
        }
        if entry["type"] == "file":
            expanded["securityFileStatus"] = {"status": "safe", "avScan": None, "pickleImportScan": None}
        return expanded

    def _send_paths_info(self, snapshot: Snapshot) -> None:
        form = parse_qs(self._body.decode())
        wanted = set(form.get("paths", []))
        expand = form.get("expand", ["false"])[-1].lower() == "true"
        entries = [e for e in snapshot.entries() if e["path"] in wanted]
        self._send_json([self._expand(snapshot, e) if expand else e for e in entries])

    def _send_file(self, snapshot: Snapshot, path: str) -> None:
        info = snapshot.files.get(path)
        if info is None:
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": snapshot.commit})
        headers = {
            "ETag": f'"{info.etag}"',
            "X-Repo-Commit": snapshot.commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream" if info.is_lfs else "text/plain; charset=utf-8",
        }
        if info.is_lfs:
            headers["X-Linked-Etag"] = f'"{info.etag}"'
            headers["X-Linked-Size"] = str(info.size)
        start, length = 0, info.size
        status = HTTPStatus.OK
        range_header = self.headers.get("Range")
        window = parse_range(range_header, info.size) if range_header is not None else None
        if window is not None:
            start, length = window
            status = HTTPStatus.PARTIAL_CONTENT
            headers["Content-Range"] = f"bytes {start}-{start + length - 1}/{info.size}"
        self._start_response(status, headers, length)
        if self.command == "GET":
            self._stream(info.abspath, start, length)

    # -- response helpers --------------------------------------------------------------------

    def _start_response(self, status: int, headers: dict[str, str], length: int) -> None:
        self._status = int(status)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send_json(self, data: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self._start_response(
            HTTPStatus.OK, {"Content-Type": "application/json", **(headers or {})}, len(body)
        )
        if self.command != "HEAD":
            self.wfile.write(body)
            self._sent = len(body)

    def _send_error(self, error: HubError) -> None:
        body = json.dumps({"error": error.message}).encode()
        printable = re.sub(r"[^\x20-\x7e]", "?", error.message)  # header-safe even with odd revisions
        headers = {"Content-Type": "application/json", "X-Error-Message": printable, **error.headers}
        if error.code is not None:
            headers["X-Error-Code"] = error.code
        self._start_response(error.status, headers, len(body))
        if self.command != "HEAD":
            self.wfile.write(body)
            self._sent = len(body)

    def _stream(self, path: Path, start: int, length: int) -> None:
        """Copy the byte window to the socket, optionally at a capped rate."""
        rate = self.server.throttle_bytes_per_s
        began = time.monotonic()
        for chunk in read_chunks(path, start, length, THROTTLED_CHUNK if rate else CHUNK):
            self.wfile.write(chunk)
            self._sent += len(chunk)
            if rate:
                ahead = self._sent / rate - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """Parse a single ``bytes=`` range into (start, length).

    Returns None for what we do not honour (multiple ranges, other units, malformed): RFC 9110
    lets a server ignore Range and send the whole file. Raises HubError 416 when unsatisfiable.
    """
    match = RANGE_RE.match(header.strip())
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first and last and int(last) < int(first):
        return None
    if first:
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
    else:  # suffix range: the last N bytes
        start, end = max(0, size - int(last)), size - 1
    if start >= size or end < start:
        raise HubError(416, "Requested range not satisfiable", None, {"Content-Range": f"bytes */{size}"})
    return (start, end - start + 1)


# --------------------------------------------------------------------------- entry points


def serve_in_thread(root: Path | str, host: str = "127.0.0.1", port: int = 0, **options: Any) -> HubServer:
    """Start a server on a background thread (port 0 = any free port); call ``shutdown()``."""
    server = HubServer((host, port), Path(root), **options)
    threading.Thread(target=server.serve_forever, name="hf-hub-standin", daemon=True).start()
    return server


def read_token(token: str | None, token_file: Path | None) -> str | None:
    if token_file is not None:
        value = token_file.read_text().strip()
        if not value:
            raise ValueError(f"{token_file} is empty")
        return value
    return token or None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="STAND-IN Hugging Face hub serving <root>/<org>/<name>/ as repos."
    )
    parser.add_argument("--root", required=True, type=Path, help="directory holding <org>/<name>/ repos")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5080, help="port (default 5080, 0 = any free port)")
    secret = parser.add_mutually_exclusive_group()
    secret.add_argument("--token", help="require this bearer token (prefer --token-file: argv is visible)")
    secret.add_argument("--token-file", type=Path, help="require the bearer token stored in this file")
    parser.add_argument("--access-log", type=Path, help="append one JSON line per request to this file")
    parser.add_argument(
        "--throttle-mbps", type=float, help="cap each download at this many MB/s (10^6 bytes)"
    )
    parser.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE, help="tree listing page size")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"--root {args.root} is not a directory")
    try:
        token = read_token(args.token, args.token_file)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))

    log = args.access_log.open("a", encoding="utf-8") if args.access_log else None
    server = HubServer(
        (args.host, args.port),
        args.root,
        token=token,
        access_log=log,
        throttle_mbps=args.throttle_mbps,
        page_size=args.page_size,
    )
    auth = "token required" if token else "no token"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # clean close on a service stop
    print(f"hf_hub_standin: serving {args.root} at {server.url} ({auth})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.wait_idle(timeout=5)  # let running requests finish their log lines
        if log is not None:
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
