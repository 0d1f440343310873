"""Logging: concise stderr lines tagged with the rank, and the JSONL request log."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any


class Log:
    """Concise stderr lines (``docker logs``), tagged with the rank."""

    tag = "standin"
    _lock = threading.Lock()

    @classmethod
    def info(cls, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with cls._lock:
            sys.stderr.write(f"{stamp} vllm-standin[{cls.tag}] {message}\n")
            sys.stderr.flush()

    @classmethod
    def error(cls, message: str) -> None:
        cls.info(f"ERROR: {message}")


class RequestLog:
    """One JSON line per request (never the API key), for tests that inspect what clients send."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._broken = False

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        with self._lock:
            try:
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line)
            except OSError as exc:
                if not self._broken:
                    Log.error(f"STANDIN_REQUEST_LOG={self.path} not writable ({exc}); request log disabled")
                self._broken = True
