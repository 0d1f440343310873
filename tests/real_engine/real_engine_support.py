"""What the real-engine cases share: the API of the lab's head, the tiny model's answers, and the
file the measured figures go to (docs/lab.md's real-engine table is taken from it)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from conftest import INVENTORY
from deployment_support import PlaybookRun, run_playbook
from lab_support import API_URL, LAB_ROOT, PROMETHEUS_URL

MODEL = "tiny-chat"
RANKS = {"head": 0, "worker": 1}
RESULTS = LAB_ROOT / "real-engine-suite.json"
# From docker start to the API answering, measured on this 2-core machine: 45-100 s (platform facts).
ENGINE_START_SECONDS = 120


def playbook(name: str, *args: str, inventory: str = INVENTORY) -> PlaybookRun:
    run, _ = run_playbook(f"playbooks/{name}", *args, inventory=inventory)
    return run


def request(
    path: str, body: dict | None = None, key: str | None = None, timeout: float = 60
) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(API_URL + path, data=data, headers=headers), timeout=timeout
        ) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, {}
    except (urllib.error.URLError, OSError, ValueError):
        return 0, {}


def ask(key: str, question: str, timeout: float = 30, model: str = MODEL) -> str | None:
    """The model's answer at temperature 0, or None when the API does not answer."""
    body = {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0}
    status, answer = request("/v1/chat/completions", body, key, timeout)
    if status != 200:
        return None
    return answer["choices"][0]["message"]["content"]


def served_models(key: str) -> list[str]:
    status, models = request("/v1/models", key=key)
    return [m["id"] for m in models["data"]] if status == 200 else []


def record(case: str, measured: float, unit: str, bound: float | None, detail: str) -> None:
    """One measured figure (``unit``: s or tok/s) and the bound the case asserted (None: none)."""
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[case] = {
        "measured": round(measured, 1),
        "unit": unit,
        "bound": bound,
        "detail": detail,
        "at": time.time(),
    }
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


def prometheus(expr: str) -> list[dict]:
    """The lab's Prometheus (lab/labctl.py), asked for ``expr`` now: its vector's samples."""
    query = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{PROMETHEUS_URL}/api/v1/query?{query}", timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def restarts_by_cause() -> dict[str, float]:
    """The supervisor's restarts so far, by cause, as Prometheus last scraped them through the gateway."""
    return {s["metric"]["cause"]: float(s["value"][1]) for s in prometheus("dsv41_group_restarts_total")}


def start_times(lab) -> dict[str, str | None]:
    """When each rank's container last started, by node; None for a node that does not answer (a
    node rebooting, its Docker starting)."""
    started = "docker inspect --format '{{.State.StartedAt}}' dsv41-r"
    answers = {node: lab.ssh(node, f"{started}{rank}", check=False) for node, rank in RANKS.items()}
    return {node: a.stdout.strip() if a.returncode == 0 else None for node, a in answers.items()}


def restarted_since(lab, before: dict[str, str | None]) -> dict[str, str | None] | None:
    """The ranks' new start times once every rank has started anew since ``before``; else None."""
    now = start_times(lab)
    return now if all(now[node] is not None and now[node] != before[node] for node in RANKS) else None
