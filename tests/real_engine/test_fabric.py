"""The fabric acceptance test and the host-stack checks against the real engine's image.

The serving image (vLLM's CPU build, torch 2.13) runs the collection's fabric test with gloo over
the lab's fabric bridge, as a Spark's image runs it with NCCL over RoCE. Faults are real: the
worker's fabric link rate-limited with tc; the host-stack faults are fixtures of /proc (the
lab's kernel has no CMA) and a known-bad list naming the lab's own kernel.
"""

from __future__ import annotations

import json
import re

from deployment_support import STATE_DIR
from lab_support import FABRIC_ADDRESS
from real_engine_support import playbook, record

FABRIC_IF = "enp1s0f1np1"
LINK = f"head ({FABRIC_IF} {FABRIC_ADDRESS['head']}) <-> worker ({FABRIC_IF} {FABRIC_ADDRESS['worker']})"


def acceptance_record(lab) -> dict:
    return json.loads(lab.ssh("head", f"cat {STATE_DIR}/fabric-acceptance.json").stdout)


def test_the_first_start_passed_the_fabric_test_and_fabric_check_reports_every_size(lab):
    before = acceptance_record(lab)
    # site.yml ran the test before the ranks' first start: it is the last good result.
    assert before["last_good"] and before["last_good"]["verdict"] == "pass", before.get("last")
    run = playbook("fabric_check.yml")
    assert run.returncode == 0, run.stdout[-3000:]
    sizes = re.findall(r"(all_reduce|all_gather) +(\d+) +[\d.]+ +[\d.]+ +([\d.]+) +0\b", run.stdout)
    by_collective = {
        name: [int(size) for n, size, _ in sizes if n == name] for name in ("all_reduce", "all_gather")
    }
    assert by_collective["all_reduce"] == [1 << n for n in range(20, 25)], run.stdout[-3000:]
    assert by_collective["all_gather"] == by_collective["all_reduce"]
    # A pass, or a pass with a warning when the bridge was slower than at the last good result.
    assert f"The fabric {LINK} passes" in " ".join(run.stdout.split())
    after = acceptance_record(lab)
    assert after["last"]["time"] > before["last"]["time"] and after["last"]["verdict"] in ("pass", "warn")
    figure = after["last"]["figure"]
    record("fabric test (gloo, 16 MiB)", figure["busbw_gbps"], "GB/s", None,
           f"{figure['collective']}, bus bandwidth as nccl-tests")  # fmt: skip


def test_a_rate_limited_worker_link_fails_the_fabric_naming_the_link_and_the_figure(lab):
    # 200 Mbit/s is 0.025 GB/s, half the lab's threshold; a burst above the 9000-byte MTU.
    lab.ssh("worker", f"sudo tc qdisc add dev {FABRIC_IF} root tbf rate 200mbit burst 1mbit latency 100ms")
    try:
        run = playbook("fabric_check.yml", "-e", "rank_fabric_check_max_bytes=4194304")
    finally:
        lab.ssh("worker", f"sudo tc qdisc del dev {FABRIC_IF} root")
    assert run.returncode != 0
    text = " ".join(run.stdout.split())
    slow = re.search(
        rf"The fabric {re.escape(LINK)} is too slow: \w+ of 4 MiB at (0\.0\d+) GB/s bus bandwidth", text
    )
    assert slow, run.stdout[-3000:]
    assert float(slow.group(1)) < 0.05
    assert "below the threshold of 0.05 GB/s (rank_fabric_check_min_busbw_gbps)" in text
    last = acceptance_record(lab)
    assert last["last"]["verdict"] == "fail" and last["last_good"]["verdict"] == "pass"
    assert lab.ssh("head", f"test -e {STATE_DIR}/deployment.lock", check=False).returncode != 0, (
        "lock given back"
    )


def test_a_cma_fixture_and_a_known_bad_kernel_stop_preflight_naming_them(lab):
    kernel = lab.ssh("worker", "cat /proc/sys/kernel/osrelease").stdout.strip()
    fixture = "/tmp/dsv41-proc-fixture"
    for node in ("head", "worker"):
        kernel_dir = f"{fixture}/sys/kernel"
        lab.ssh(node, f"rm -rf {fixture} && mkdir -p {kernel_dir}")
        lab.ssh(node, f"cat /proc/sys/kernel/osrelease > {kernel_dir}/osrelease")
    # The signature reported on Sparks: no CMA area, yet CMA pages free.
    lab.ssh(
        "worker",
        f"(grep -v ^Cma /proc/meminfo; printf 'CmaTotal: 0 kB\\nCmaFree: 940604 kB\\n') > {fixture}/meminfo",
    )
    lab.ssh("head", f"cat /proc/meminfo > {fixture}/meminfo")
    try:
        cma = playbook("site.yml", "--tags", "preflight", "-e", f"preflight_proc_root={fixture}")
    finally:
        for node in ("head", "worker"):
            lab.ssh(node, f"rm -rf {fixture}")
    assert cma.returncode != 0
    assert "fatal: [head]" not in cma.stdout, "the head's meminfo is the real one"
    assert "/proc/meminfo shows CmaTotal 0 kB with CmaFree 940604 kB" in " ".join(cma.stdout.split())
    bad = json.dumps(
        {"preflight_known_bad_versions": [{"item": "kernel", "version": kernel, "why": "a test"}]}
    )
    known = playbook("site.yml", "--tags", "preflight", "-e", bad)
    assert known.returncode != 0
    assert f"kernel {kernel} is known to be bad: a test (preflight_known_bad_versions)" in known.stdout
    assert "TASK [sparkserve.dsv41.memguard" not in known.stdout, "nothing after preflight ran"


def test_the_deployment_record_keeps_each_nodes_host_stack_and_status_shows_what_changed(lab):
    path = f"{STATE_DIR}/deployments.json"
    original = lab.ssh("head", f"cat {path}").stdout
    record = json.loads(original)
    kernel = lab.ssh("worker", "cat /proc/sys/kernel/osrelease").stdout.strip()
    stacks = record["current"]["host_stack"]
    assert set(stacks) == {"head", "worker"} and stacks["worker"]["kernel"] == kernel, stacks
    # The serving image's stack as the fabric test read it inside the image: vLLM's CPU build.
    accepted = json.loads(lab.ssh("head", f"cat {STATE_DIR}/fabric-acceptance.json").stdout)["last_good"]
    image = record["current"]["image_versions"]
    assert image == {key: accepted["report"][key] for key in ("torch", "cuda", "nccl")}, (image, accepted)
    assert image["torch"].endswith("+cpu") and image["cuda"] is None and image["nccl"] is None, image
    # As if the worker had run another kernel when the deployment was recorded.
    stacks["worker"]["kernel"] = "6.17.0-1014-nvidia"
    lab.ssh(
        "head",
        f"cat > {path}.edit && chmod 600 {path}.edit && mv {path}.edit {path}",
        input_text=json.dumps(record),
    )
    try:
        run = playbook("status.yml")
    finally:
        lab.ssh(
            "head",
            f"cat > {path}.edit && chmod 600 {path}.edit && mv {path}.edit {path}",
            input_text=original,
        )
    assert run.returncode == 0, run.stdout[-3000:]
    text = " ".join(run.stdout.split())
    assert f"host stack: worker: kernel 6.17.0-1014-nvidia -> {kernel} since the deployment of" in text, (
        run.stdout[-3000:]
    )
    assert f"image: torch {image['torch']}, cuda none, nccl none (as the fabric test read them" in text, (
        run.stdout[-3000:]
    )
