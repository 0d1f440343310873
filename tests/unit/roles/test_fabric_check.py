"""Unit tests for the fabric test: the node program's arithmetic (roles/rank/files/
dsv41_fabric_check.py, imported from its path without torch), the verdict
(plugins/module_utils/_fabric_acceptance.py) and the fabric_acceptance module, fed the program's
output captured on the real-engine lab (tests/unit/fixtures/fabric_check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.sparkserve.dsv41.plugins.module_utils import _fabric_acceptance as acceptance
from node_programs import load_program, program_path

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "fabric_check"
PROGRAM = program_path("rank", "dsv41_fabric_check")
LINK = "head (enp1s0f1np1 198.18.0.13) <-> worker (enp1s0f1np1 198.18.0.11)"


check = load_program("rank", "dsv41_fabric_check")
PASSING = (FIXTURES / "gloo-rank0.stdout").read_text()


def _run(stdout: str, rc: int = 0, stderr: str = "") -> dict:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


# --- the program's arithmetic: nccl-tests' PERFORMANCE.md ---------------------------------------


@pytest.mark.parametrize(
    ("collective", "size", "seconds", "world", "algbw", "busbw"),
    [
        # all_reduce: busbw = algbw * 2(n-1)/n; two ranks: equal.
        ("all_reduce", 1 << 30, 0.05, 2, 21.475, 21.475),
        ("all_reduce", 1 << 30, 0.05, 4, 21.475, 32.212),
        # all_gather: busbw = algbw * (n-1)/n, the size being the gathered bytes.
        ("all_gather", 1 << 30, 0.05, 2, 21.475, 10.737),
        ("all_gather", 8 << 20, 0.001, 8, 8.389, 7.340),
    ],
)
def test_bus_bandwidth_follows_nccl_tests(collective, size, seconds, world, algbw, busbw):  # noqa: PLR0917 - parametrised
    got = check.bus_bandwidth(collective, size, seconds, world)
    assert got == pytest.approx((algbw, busbw), abs=1e-3)


@pytest.mark.parametrize(
    ("args", "message"),
    [(("broadcast", 1, 1.0, 2), "unknown collective"), (("all_reduce", 1, 0.0, 2), "positive"),
     (("all_reduce", 1, 1.0, 1), "two ranks")],
)  # fmt: skip
def test_bus_bandwidth_refuses_what_it_cannot_compute(args, message):
    with pytest.raises(ValueError, match=message):
        check.bus_bandwidth(*args)


def test_sizes_double_up_to_the_largest_and_split_evenly_between_ranks():
    assert check.sizes_up_to(1 << 20, 1 << 30, 2) == [1 << n for n in range(20, 31)]
    assert all(size % (4 * 3) == 0 for size in check.sizes_up_to(1 << 20, 64 << 20, 3))
    with pytest.raises(ValueError):
        check.sizes_up_to(1 << 20, 1 << 19, 2)


def test_more_than_one_gib_is_refused_before_anything_runs(capsys):
    base = ["--rank", "0", "--world-size", "2", "--master-addr", "10.0.0.1", "--master-port", "29656"]
    with pytest.raises(SystemExit):
        check.parse_args([*base, "--backend", "nccl", "--max-bytes", str((1 << 30) + 1)])
    assert "at most 1 GiB" in capsys.readouterr().err


def test_the_memory_check_refuses_buffers_the_node_cannot_spare(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       125000000 kB\nMemAvailable:    2000000 kB\n")
    args = check.parse_args(
        ["--rank", "0", "--world-size", "2", "--master-addr", "10.0.0.1", "--master-port", "1",
         "--backend", "gloo", "--meminfo", str(meminfo)]
    )  # fmt: skip
    with pytest.raises(
        MemoryError, match=r"needs about 3.00 GiB and MemAvailable is 1.91 GiB.*rank_fabric_check_max_bytes"
    ):
        check.check_memory(args)
    meminfo.write_text("MemAvailable:   100000000 kB\n")
    check.check_memory(args)


def test_a_failure_names_the_variables_that_choose_the_fabric():
    environ = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "HOME": "/root"}
    message = check.describe_failure(RuntimeError("Bootstrap : no socket interface found"), environ)
    assert message == (
        "RuntimeError: Bootstrap : no socket interface found (fabric settings: "
        "NCCL_SOCKET_IFNAME=enp1s0f1np1, NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1)"
    )


# --- the verdict ------------------------------------------------------------------------------


def _nodes(head_stdout: str = PASSING, worker_stdout: str = "", worker_rc: int = 0):
    return [
        acceptance.parse_node_output("head", _run(head_stdout)),
        acceptance.parse_node_output("worker", _run(worker_stdout, rc=worker_rc)),
    ]


def test_the_captured_run_passes_and_the_lowest_collective_at_the_largest_size_decides():
    result = acceptance.judge(_nodes(), link=LINK, min_busbw_gbps=0.05, warn_drop_percent=20, last_good=None)
    assert result["verdict"] == "pass"
    assert (result["figure"]["collective"], result["figure"]["bytes"]) == ("all_gather", 64 << 20)
    assert (
        result["msg"]
        == f"The fabric {LINK} passes: all_gather of 64 MiB at 0.361 GB/s bus bandwidth (gloo, 2 ranks)."
    )


def test_below_the_threshold_fails_naming_the_link_the_figure_and_the_setting():
    result = acceptance.judge(_nodes(), link=LINK, min_busbw_gbps=18, warn_drop_percent=20, last_good=None)
    assert result["verdict"] == "fail"
    assert f"The fabric {LINK} is too slow: all_gather of 64 MiB at 0.361 GB/s" in result["msg"]
    assert "threshold of 18 GB/s (rank_fabric_check_min_busbw_gbps)" in result["msg"]


@pytest.mark.parametrize(("before", "verdict"), [(0.5, "warn"), (0.44, "pass"), (0.3, "pass")])
def test_a_drop_from_the_last_good_result_warns(before, verdict):
    last_good = {"time": "2026-12-01T10:00:00+00:00", "figure": {"busbw_gbps": before}}
    result = acceptance.judge(
        _nodes(), link=LINK, min_busbw_gbps=0.05, warn_drop_percent=20, last_good=last_good
    )
    assert result["verdict"] == verdict
    if verdict == "warn":
        assert (
            "28 % slower than its last good result, 0.500 GB/s on 2026-12-01T10:00:00+00:00" in result["msg"]
        )


@pytest.mark.parametrize(
    ("fixture", "rc", "expected"),
    [
        ("gloo-unknown-interface.stdout", 2, "worker: RuntimeError: [enforce fail"),
        ("gloo-timeout.stdout", 3, "worker: the fabric test did not finish within 300 s"),
    ],
)
def test_a_node_whose_test_failed_fails_the_fabric_with_its_own_words(fixture, rc, expected):
    nodes = _nodes(worker_stdout=(FIXTURES / fixture).read_text(), worker_rc=rc)
    result = acceptance.judge(nodes, link=LINK, min_busbw_gbps=0.05, warn_drop_percent=20, last_good=None)
    assert result["verdict"] == "fail" and result["figure"] is None
    assert result["msg"].startswith(f"The fabric test failed on {LINK}: {expected}")


def test_wrong_values_fail_whatever_the_speed():
    report = json.loads(PASSING)
    report["results"][3]["wrong"] = 5
    result = acceptance.judge(
        _nodes(json.dumps(report)), link=LINK, min_busbw_gbps=0.05, warn_drop_percent=20, last_good=None
    )
    assert result["verdict"] == "fail" and "gave 5 wrong values" in result["msg"]


@pytest.mark.parametrize("run", [{"skipped": True}, {"rc": 0, "stdout": "", "stderr": ""}])
def test_a_node_that_did_not_run_or_a_missing_report_is_not_a_pass(run):
    nodes = [acceptance.parse_node_output("head", run), acceptance.parse_node_output("worker", _run(""))]
    if "skipped" in run:
        result = acceptance.judge(nodes, link=LINK, min_busbw_gbps=0.05, warn_drop_percent=20, last_good=None)
        assert result["verdict"] == "fail" and "head: the test did not run on this node" in result["msg"]
    else:
        with pytest.raises(acceptance.AcceptanceError, match="expected one report"):
            acceptance.judge(nodes, link=LINK, min_busbw_gbps=0.05, warn_drop_percent=20, last_good=None)


def test_the_table_has_nccl_tests_columns():
    lines = acceptance.table(json.loads(PASSING))
    assert lines[0].split() == [
        "collective",
        "size",
        "(B)",
        "time",
        "(us)",
        "algbw",
        "GB/s",
        "busbw",
        "GB/s",
        "wrong",
    ]
    assert lines[-1].split() == ["all_gather", "67108864", "93071.3", "0.721", "0.361", "0"]


# --- the NCCL path, captured on one H100 (fixtures/fabric_check/README.md) ------------------


def test_an_nccl_interface_the_node_does_not_have_fails_naming_it_and_nccls_own_words():
    nodes = [
        acceptance.parse_node_output(
            "head", _run((FIXTURES / "nccl-unknown-interface-rank0.stdout").read_text(), rc=2)
        ),
        acceptance.parse_node_output(
            "worker", _run((FIXTURES / "nccl-unknown-interface-rank1.stdout").read_text(), rc=2)
        ),
    ]
    result = acceptance.judge(nodes, link=LINK, min_busbw_gbps=18, warn_drop_percent=20, last_good=None)
    assert result["verdict"] == "fail" and result["figure"] is None
    assert result["msg"].startswith(f"The fabric test failed on {LINK}: head: DistBackendError:")
    assert (
        "Last error: Bootstrap : no socket interface found (fabric settings: NCCL_SOCKET_IFNAME=enp1s0f1np1)"
        in (result["msg"])
    )


def test_torchs_cpp_backtrace_is_cut_from_a_failure_the_owner_reads():
    captured = json.loads((FIXTURES / "nccl-unknown-interface-rank1.stdout").read_text().splitlines()[-1])[
        "error"
    ]
    raw = captured.removeprefix("DistBackendError: ").rsplit(" (fabric settings:", 1)[0]
    assert "frame #0" in raw  # as the program wrote it before the cut
    message = check.describe_failure(RuntimeError(raw), {"NCCL_SOCKET_IFNAME": "enp1s0f1np1"})
    assert "frame #" not in message and "Exception raised from" not in message
    assert message.startswith("RuntimeError: ")
    assert "store->get('0') got error: Failed to recv" in message
    assert message.endswith("(fabric settings: NCCL_SOCKET_IFNAME=enp1s0f1np1)")


def test_two_ranks_on_one_gpu_fail_with_nccls_duplicate_gpu_words():
    node = acceptance.parse_node_output(
        "head", _run((FIXTURES / "nccl-duplicate-gpu.stdout").read_text(), rc=2)
    )
    assert not node["ok"]
    assert "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device" in node["error"]
