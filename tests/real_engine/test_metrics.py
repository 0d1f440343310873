"""The pair's Prometheus metrics on the real engine: a real Prometheus (Debian's, started by the
lab) scrapes vLLM's /metrics and the supervisor's and memory guards' endpoints through the head's
gateway with the API key, and every query of the dashboard the collection ships returns data.
The restart after a lost rank, with its cause, is asserted by the fault cases (test_real_engine.py).
"""

from __future__ import annotations

import json
import re

from lab_support import API_URL, MGMT_ADDRESS, REPO, http_status, wait_for
from real_engine_support import ask, prometheus
from role_defaults import SHARED_ROLE, role_defaults

DASHBOARD = REPO / "dashboards" / "dsv41-pair.json"
# Grafana's own variables, as Grafana would fill them in for a short range.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def grafana_filled(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a dashboard variable the test does not fill: {expr}"
    return expr


def test_the_pairs_endpoints_answer_only_with_the_key(scraped, key):
    for path in ("/metrics/supervisor", "/metrics/memguard/head", "/metrics/memguard/worker"):
        assert http_status(API_URL + path) == 401, path
        assert http_status(API_URL + path, {"Authorization": f"Bearer {key}"}) == 200, path
    # The guards listen on the fabric only: the management address does not answer (status 0).
    port = role_defaults(SHARED_ROLE)["deployment_memguard_metrics_port"]
    assert http_status(f"http://{MGMT_ADDRESS['worker']}:{port}/metrics") == 0


def test_prometheus_reads_the_pair_the_fabric_and_the_engine(scraped, key):
    assert "391" in (ask(key, "What is 17 * 23?") or "")

    def state() -> set[str]:
        return {s["metric"]["state"] for s in prometheus("dsv41_group_state == 1")}

    # The case before may have just ended a deployment run: the supervisor reads "paused" until its
    # next tick after the lock is released.
    assert wait_for(lambda: state() == {"healthy"}, timeout=60, interval=2), state()
    ranks = {(s["metric"]["node"], s["value"][1]) for s in prometheus("dsv41_rank_up")}
    assert ranks == {("head", "1"), ("worker", "1")}
    # Both halves of the cabled port ACTIVE on each node, the other port's DOWN (the lab's tree).
    active = {
        (s["metric"]["node"], s["metric"]["device"]): s["value"][1]
        for s in prometheus("dsv41_fabric_port_active")
    }
    for node in ("head", "worker"):
        assert active[(node, "rocep1s0f1")] == "1" and active[(node, "roceP2p1s0f1")] == "1", active
        assert active[(node, "rocep1s0f0")] == "0", active
    headroom = prometheus("dsv41_memguard_mem_available_bytes - dsv41_memguard_floor_bytes")
    assert {s["metric"]["node"] for s in headroom} == {"head", "worker"}
    assert all(float(s["value"][1]) > 0 for s in headroom), headroom
    # The fabric test of the first start (or the fabric cases') on record.
    passed = prometheus("dsv41_fabric_acceptance_last_good_bus_bandwidth_bytes_per_second > 0")
    assert passed, "no passed fabric test"
    assert prometheus('vllm:generation_tokens_total{model_name="tiny-chat"} > 0'), "no generated tokens"


def test_every_query_of_the_shipped_dashboard_returns_data(scraped, key):
    assert "391" in (ask(key, "What is 17 * 23?") or "")
    queries = dashboard_queries()
    assert len(queries) >= 15

    def empty() -> list[str]:
        return [f"{title}: {expr}" for title, expr in queries if not prometheus(grafana_filled(expr))]

    # rate() over 1m needs two scrapes of each series: give Prometheus a few.
    assert wait_for(lambda: not empty(), timeout=30, interval=3), "queries without data: " + "; ".join(
        empty()
    )
    # Every metric the dashboard names is one the endpoints export (a regex over names included).
    named = {name for _, expr in queries for name in re.findall(r"\b(dsv41_[a-z_]+|vllm:[a-z_]+)", expr)}
    exported = {s["metric"]["__name__"] for s in prometheus('{__name__=~"dsv41_.+|vllm:.+"}')}
    assert named - exported == set(), named - exported
