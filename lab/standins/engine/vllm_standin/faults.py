"""Faults in force on this rank: set at start (``STANDIN_FAULTS``) or at run time through the fault
file, and the effects of the operational ones (hang, crash, exit_on_start, leak).

The fault file (``STANDIN_FAULTS_FILE``, default ``$XDG_CACHE_HOME/standin-faults``, i.e.
``/cache/standin-faults`` in a rank container) lets a lab test break a running rank from the node
without restarting it. A taken-in file is deleted, so a restarted rank comes up healthy; a file
naming ``exit_on_start`` is never deleted, so that fault survives restarts (a crash loop).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from .errors import StartupError
from .log import Log
from .settings import KNOWN_FAULTS, Settings

FAULT_POLL_S = 1.0
LEAK_TICK_S = 0.05
MIB = 1 << 20


def read_fault_file(path: Path) -> list[str] | None:
    """The names in the fault file (one per line; commas and blanks also separate), None if absent."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    return [name for name in re.split(r"[\s,]+", text) if name]


def _unreadable_once(path: Path, exc: OSError, noted: set[str]) -> None:
    key = f"{type(exc).__name__}:{exc.errno}"
    if key not in noted:  # a poll every second must not flood the log with the same complaint
        noted.add(key)
        Log.error(f"fault file {path} unreadable ({exc}); ignoring it")


def refuse_start_if_asked(settings: Settings) -> None:
    """exit_on_start: fail this start (before the rendezvous), leaving the fault file in place."""
    sources = []
    if "exit_on_start" in settings.faults:
        sources.append("STANDIN_FAULTS")
    try:
        names = read_fault_file(settings.faults_file) or []
    except OSError as exc:
        _unreadable_once(settings.faults_file, exc, set())
        names = []
    if "exit_on_start" in names:
        sources.append(f"fault file {settings.faults_file} (kept: delete it to let this rank start)")
    if sources:
        raise StartupError(f"fault exit_on_start from {' and '.join(sources)}: failing this start")


class Faults:
    """The faults in force, shared by every thread of the rank."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.hung = threading.Event()
        self._active: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._leaking = False
        self._leaked: list[bytes] = []  # held for the life of the process: that is the leak
        self._kept_text: tuple[str, ...] | None = None
        self._noted: set[str] = set()

    def active(self) -> frozenset[str]:
        with self._lock:
            return self._active

    def apply(self, names: Iterable[str], source: str) -> None:
        """Switch faults on (they stay on until the process ends)."""
        names = sorted(set(names) & (KNOWN_FAULTS - {"exit_on_start"}))  # exit_on_start acts at start only
        if not names:
            return
        if "crash" in names:
            Log.error(f"fault crash ({source}): exiting 1 at once, like a dead vLLM process")
            os._exit(1)
        with self._lock:
            self._active = self._active | frozenset(names)
        if "hang" in names and not self.hung.is_set():
            Log.error(
                f"fault hang ({source}): rank 0 makes no more tokens, a headless rank sends no more "
                "heartbeats; the process stays up"
            )
            self.hung.set()
        if "leak" in names:
            self._start_leak(source)

    def stall(self) -> None:
        """Called before each token: under ``hang`` it never returns (the generation is stuck)."""
        if self.hung.is_set():
            threading.Event().wait()  # an event nobody sets: blocked until the process is stopped

    # --- the fault file ----------------------------------------------------------------------

    def watch(self) -> None:
        """Poll the fault file every second, for the life of the process."""
        threading.Thread(target=self._watch, daemon=True, name="fault-file").start()

    def _watch(self) -> None:
        while True:
            self.poll()
            time.sleep(FAULT_POLL_S)

    def poll(self) -> None:
        """Take in the fault file once: delete it (unless it names exit_on_start), log, apply."""
        path = self.settings.faults_file
        try:
            names = read_fault_file(path)
        except OSError as exc:
            _unreadable_once(path, exc, self._noted)
            return
        if not names:  # absent, or empty (perhaps being written): look again at the next poll
            return
        kept = ""
        if "exit_on_start" in names:
            # Never consumed: the fault must outlive this process. The rest is applied once
            # (crash + exit_on_start = die now and crash-loop on every restart).
            kept = "it names exit_on_start, so every later start of this rank fails"
        else:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                kept = f"cannot delete it ({exc}), so a restart takes these faults again"
        if kept:
            if self._kept_text == tuple(names):  # already taken in: do not log every second
                return
            self._kept_text = tuple(names)
            Log.error(f"fault file {path} kept: {kept}")
        unknown = sorted(set(names) - KNOWN_FAULTS)
        taken = sorted(set(names) & (KNOWN_FAULTS - {"exit_on_start"}))
        if unknown:
            Log.error(f"fault file {path}: ignoring unknown fault(s) {', '.join(unknown)}")
        if taken:
            Log.info(f"fault file {path}: taking fault(s) {', '.join(taken)}")
        self.apply(taken, f"fault file {path}")

    # --- leak --------------------------------------------------------------------------------

    def _start_leak(self, source: str) -> None:
        with self._lock:
            if self._leaking:
                return
            self._leaking = True
        rate, cap = self.settings.leak_mib_per_s, self.settings.leak_max_mib
        Log.error(
            f"fault leak ({source}): resident memory grows {rate:g} MiB/s up to {cap:g} MiB "
            "(STANDIN_LEAK_MIB_PER_S, STANDIN_LEAK_MAX_MIB)"
        )
        threading.Thread(target=self._leak, args=(rate, cap), daemon=True, name="leak").start()

    def _leak(self, rate_mib: float, cap_mib: float) -> None:
        """Allocate and touch memory on an absolute clock; the cap keeps a missing guard survivable."""
        cap = int(cap_mib * MIB)
        start, total = time.monotonic(), 0
        while total < cap:
            target = min(cap, int((time.monotonic() - start) * rate_mib * MIB))
            if target > total:
                # b"\x01" * n writes every byte, so the pages are resident, not just reserved.
                self._leaked.append(b"\x01" * (target - total))
                total = target
            time.sleep(LEAK_TICK_S)
        Log.error(f"fault leak: reached the cap of {cap_mib:g} MiB (STANDIN_LEAK_MAX_MIB); holding it")
