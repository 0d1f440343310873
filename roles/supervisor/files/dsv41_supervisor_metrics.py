"""Prometheus metrics of the dsv41 supervisor: the rank group's state, each rank, the faults it
detected and the restarts it made (by cause), and the last fabric acceptance result.

The API gateway serves them under the API key at ``/metrics/supervisor``; the supervisor listens
on the head's loopback only. Built on prometheus_client (Debian and Ubuntu: python3-prometheus-client,
which the collection installs), using what its releases from 0.16 on share.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import dsv41_node as shared  # installed beside this program
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

ACCEPTANCE_RECORD = "fabric-acceptance.json"  # the fabric_acceptance module's, in the state directory
VERDICTS = ("pass", "warn", "fail")
GB = 1e9  # the acceptance record's GB/s are nccl-tests' (decimal)


def acceptance_families(record: Any) -> list[GaugeMetricFamily]:
    """The last acceptance result of a fabric-acceptance.json document; none without one."""
    last = record.get("last") if isinstance(record, dict) else None
    if not isinstance(last, dict) or last.get("verdict") not in VERDICTS:
        return []
    verdict = GaugeMetricFamily(
        "dsv41_fabric_acceptance_verdict",
        "1 for the verdict of the last fabric acceptance test (pass, warn or fail)",
        labels=["verdict"],
    )
    for name in VERDICTS:
        verdict.add_metric([name], 1.0 if last["verdict"] == name else 0.0)
    families = [verdict]
    for name, entry, text in (
        ("dsv41_fabric_acceptance_bus_bandwidth_bytes_per_second", last, "the last fabric acceptance test"),
        (
            "dsv41_fabric_acceptance_last_good_bus_bandwidth_bytes_per_second",
            record.get("last_good"),
            "the last passed one",
        ),
    ):
        figure = entry.get("figure") if isinstance(entry, dict) else None
        if isinstance(figure, dict) and isinstance(figure.get("busbw_gbps"), (int, float)):
            families.append(
                GaugeMetricFamily(
                    name,
                    f"Lowest bus bandwidth at the largest size of {text} (the record's GB/s, in bytes/s)",
                    value=float(figure["busbw_gbps"]) * GB,
                )
            )
    try:
        when = datetime.datetime.fromisoformat(str(last.get("time"))).timestamp()
    except ValueError:
        return families
    families.append(
        GaugeMetricFamily(
            "dsv41_fabric_acceptance_timestamp_seconds",
            "When the last fabric acceptance test ran (Unix time)",
            value=when,
        )
    )
    return families


class AcceptanceCollector(Collector):
    """Reads the acceptance record at each scrape: the deployment run writes it, not the supervisor."""

    def __init__(self, read: Callable[[], str]) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            record = json.loads(self.read())
        except (OSError, ValueError):  # no test run yet (or disabled), or a record being replaced
            return
        yield from acceptance_families(record)


class SupervisorMetrics:
    """The supervisor's metrics in a registry of their own (no process metrics of the library's)."""

    def __init__(self, *, states: Iterable[str], causes: Iterable[str], acceptance_record: Path) -> None:
        self.registry = CollectorRegistry()
        self.states = tuple(states)
        self.state = Gauge(
            "dsv41_group_state",
            "1 for the state the supervisor holds the rank group in (healthy, backoff, gave_up...)",
            ["state"],
            registry=self.registry,
        )
        self.rank_up = Gauge(
            "dsv41_rank_up",
            "1 while the node's rank container runs, else 0 (a node giving no status included)",
            ["node", "rank"],
            registry=self.registry,
        )
        self.attempts = Gauge(
            "dsv41_group_failed_attempts",
            "Failed attempts in a row (the supervisor gives up at its max_attempts)",
            registry=self.registry,
        )
        self.faults = Counter(
            "dsv41_group_faults",
            "Faults the supervisor detected, by cause (hang: a hang detection)",
            ["cause"],
            registry=self.registry,
        )
        self.restarts = Counter(
            "dsv41_group_restarts",
            "Restarts of the rank group the supervisor made, by the cause that led to each",
            ["cause"],
            registry=self.registry,
        )
        # Every cause present from the start at 0: the first restart is an increase Prometheus sees.
        for cause in causes:
            self.faults.labels(cause)
            self.restarts.labels(cause)
        self.registry.register(AcceptanceCollector(lambda: shared.read_text(acceptance_record)))

    def set_state(self, state: str) -> None:
        for name in self.states:
            self.state.labels(name).set(1 if name == state else 0)

    def observe(self, state: str, ranks: Sequence[tuple[str, int, bool]], attempts: int) -> None:
        self.set_state(state)
        for node, rank, running in ranks:
            self.rank_up.labels(node, str(rank)).set(1 if running else 0)
        self.attempts.set(attempts)

    def fault(self, cause: str) -> None:
        self.faults.labels(cause).inc()

    def restarted(self, cause: str) -> None:
        self.restarts.labels(cause).inc()

    def serve(self, address: str, port: int) -> None:
        """Answer /metrics on ``address``:``port`` from a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)
