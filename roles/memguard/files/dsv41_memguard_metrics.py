"""Prometheus metrics of a node's memory guard: MemAvailable against the floor, the guard's kills,
and the node's RDMA fabric ports (state, and the port and netdev counters the kernel keeps).

The guard listens on its node's fabric address only; the API gateway on the head serves each
node's metrics under the API key at ``/metrics/memguard/<node>``. Built on prometheus_client
(Debian and Ubuntu: python3-prometheus-client, which the collection installs), using what its
releases from 0.16 on share. The fabric is read from sysfs at each scrape, never cached.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# An mlx5 port counts its data in 4-byte words (the InfiniBand PortCounters unit).
PORT_DATA_WORD_BYTES = 4
# Port counters exported as they are (the RoCE ports' errors an owner looks for first).
PORT_ERROR_COUNTERS = ("port_rcv_errors", "port_xmit_discards", "link_downed", "symbol_error")
# The netdev's statistics: (metric, help, {direction: file under statistics/}).
NETDEV_COUNTERS = (
    ("dsv41_fabric_netdev_bytes", "Bytes over the RDMA port's netdev", "bytes"),
    ("dsv41_fabric_netdev_errors", "Errors on the RDMA port's netdev", "errors"),
    ("dsv41_fabric_netdev_dropped", "Packets the RDMA port's netdev dropped", "dropped"),
)
DIRECTIONS = (("receive", "rx"), ("transmit", "tx"))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def _integer(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def fabric_families(sysfs_root: Path) -> list[GaugeMetricFamily | CounterMetricFamily]:
    """Every RDMA port under ``sysfs_root``/class/infiniband with its netdev, as the kernel says now."""
    active = GaugeMetricFamily(
        "dsv41_fabric_port_active",
        "1 while the RDMA port's state is ACTIVE (NCCL uses only ACTIVE ports)",
        labels=["device", "port", "netdev"],
    )
    data = CounterMetricFamily(
        "dsv41_fabric_port_data_bytes",
        "Bytes the RDMA port received or sent (its port_rcv_data and port_xmit_data, in bytes)",
        labels=["device", "port", "direction"],
    )
    errors = CounterMetricFamily(
        "dsv41_fabric_port_errors",
        "The RDMA port's error counters (port_rcv_errors, port_xmit_discards, link_downed, symbol_error)",
        labels=["device", "port", "counter"],
    )
    link = GaugeMetricFamily(
        "dsv41_fabric_netdev_up",
        "1 while the RDMA port's netdev is up with carrier",
        labels=["netdev"],
    )
    netdev = [
        (CounterMetricFamily(name, text, labels=["netdev", "direction"]), suffix)
        for name, text, suffix in NETDEV_COUNTERS
    ]
    infiniband = sysfs_root / "class" / "infiniband"
    netdevs_seen: set[str] = set()
    devices = sorted(infiniband.iterdir()) if infiniband.is_dir() else []
    for device in devices:
        names = sorted(p.name for p in (device / "device" / "net").glob("*"))
        name = names[0] if names else ""
        for port in sorted((device / "ports").glob("*")):
            state = _read(port / "state") or ""
            labels = [device.name, port.name]
            active.add_metric([*labels, name], 1.0 if state.endswith("ACTIVE") else 0.0)
            counters = port / "counters"
            for direction, counter in (("receive", "port_rcv_data"), ("transmit", "port_xmit_data")):
                words = _integer(counters / counter)
                if words is not None:
                    data.add_metric([*labels, direction], float(words * PORT_DATA_WORD_BYTES))
            for counter in PORT_ERROR_COUNTERS:
                value = _integer(counters / counter)
                if value is not None:
                    errors.add_metric([*labels, counter], float(value))
        if name and name not in netdevs_seen:
            netdevs_seen.add(name)
            net = sysfs_root / "class" / "net" / name
            up = _read(net / "operstate") == "up" and _read(net / "carrier") == "1"
            link.add_metric([name], 1.0 if up else 0.0)
            for family, suffix in netdev:
                for direction, prefix in DIRECTIONS:
                    value = _integer(net / "statistics" / f"{prefix}_{suffix}")
                    if value is not None:
                        family.add_metric([name, direction], float(value))
    return [active, data, errors, link, *(family for family, _suffix in netdev)]


class FabricCollector(Collector):
    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield from fabric_families(self.sysfs_root)


class GuardMetrics:
    """The guard's metrics in a registry of their own (no process metrics of the library's)."""

    def __init__(self, *, floor: int, sysfs_root: Path) -> None:
        self.registry = CollectorRegistry()
        self.mem_available = Gauge(
            "dsv41_memguard_mem_available_bytes",
            "MemAvailable at the guard's last sample (the guard kills the ranks under the floor)",
            registry=self.registry,
        )
        floor_gauge = Gauge(
            "dsv41_memguard_floor_bytes",
            "The floor under which the guard kills the rank containers",
            registry=self.registry,
        )
        floor_gauge.set(floor)
        self.kills = Counter(
            "dsv41_memguard_kills",
            "Times the guard killed the rank containers under the floor",
            registry=self.registry,
        )
        self.registry.register(FabricCollector(sysfs_root))

    def sampled(self, mem_available: int) -> None:
        self.mem_available.set(mem_available)

    def killed(self) -> None:
        self.kills.inc()

    def serve(self, address: str, port: int) -> None:
        """Answer /metrics on ``address``:``port`` from a daemon thread."""
        start_http_server(port, addr=address, registry=self.registry)
