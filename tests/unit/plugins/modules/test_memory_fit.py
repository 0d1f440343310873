"""The memory_fit module, run in-process on /proc/meminfo fixtures: the plan, a failure naming the
shortfall, the report-only mode that fit.yml uses, and check mode."""

from __future__ import annotations

import yaml
from ansible_collections.sparkserve.dsv41.plugins.modules import memory_fit
from dir_snapshot import snapshot

TINY = {"weights_gib_per_rank": 0.01, "runtime_gib_per_rank": 3, "kv_cache_gib": "{cpu_kv_cache_gib}",
        "kv_bytes_per_token": 512}  # fmt: skip


def _proc(tmp_path, available_kb: int):
    (tmp_path / "meminfo").write_text(
        f"MemTotal:       24683784 kB\nMemFree: 1 kB\nMemAvailable:   {available_kb} kB\n"
    )
    return str(tmp_path)


def test_a_rank_that_fits_reports_its_plan_and_changes_nothing(tmp_path, run_module):
    proc = _proc(tmp_path, 20 * 1024 * 1024)
    before = snapshot(tmp_path)
    result = run_module(memory_fit, {"memory": TINY, "settings": {"cpu_kv_cache_gib": 1}, "proc_root": proc},
                        check_mode=True)  # fmt: skip
    assert not result.failed and result["changed"] is False
    assert result["plan"]["fits"] and result["msg"].startswith("the rank fits: it needs 4.0 GiB of 19.0 GiB")
    assert snapshot(tmp_path) == before
    assert set(yaml.safe_load(memory_fit.RETURN)) == set(result) - {"changed", "invocation"}


def test_a_rank_that_does_not_fit_fails_naming_the_shortfall_unless_only_reported(tmp_path, run_module):
    args = {
        "memory": TINY,
        "settings": {"cpu_kv_cache_gib": 64},
        "proc_root": _proc(tmp_path, 20 * 1024 * 1024),
    }
    failed = run_module(memory_fit, args)
    assert failed.failed and "short by 48.0 GiB" in failed["msg"]
    assert "lower rank_recipe_settings.cpu_kv_cache_gib to 15.99 at most" in failed["msg"]
    reported = run_module(memory_fit, {**args, "fail_on_shortfall": False})
    assert not reported.failed and reported["plan"]["fits"] is False


def test_a_meminfo_without_memavailable_is_refused(tmp_path, run_module):
    (tmp_path / "meminfo").write_text("MemTotal: 1 kB\n")
    result = run_module(memory_fit, {"memory": TINY, "proc_root": str(tmp_path)})
    assert result.failed and "has no MemTotal or MemAvailable line" in result["msg"]
