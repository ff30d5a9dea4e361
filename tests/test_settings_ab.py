"""benchmarks/tools/settings_ab.py: variant names, kernel-profiler task names summed per kernel, and a
whole run of two variants on this machine's backend."""
import json

import pytest

from benchmarks.tools import settings_ab


def test_tags_name_variants_as_file_names():
    assert settings_ab.tag("default") == "default"
    assert settings_ab.tag("fused_backward_tile=64,fused_tile=32") == "fused_backward_tile_64_fused_tile_32"
    assert settings_ab.tag("") == "default"


def test_kernel_totals_sum_parallel_tasks_and_leave_out_serial_ones():
    ms = {"forward_c98_0_kernel_1_range_for": 4.5, "forward_c98_0_kernel_0_serial": 0.01,
          "grid_backward_params_c140_0_kernel_1_range_for": 0.07,
          "grid_backward_params_c140_0_kernel_3_range_for": 0.23, "adam_step_c112_12_kernel_1_range_for": 0.4,
          "not a task name": 9.0}
    totals = settings_ab.kernel_totals(ms)
    assert totals == pytest.approx({"forward": 4.5, "grid_backward_params": 0.30, "adam_step": 0.4})


@pytest.mark.slow
def test_two_variants_side_by_side(tmp_path, capsys):
    """Both variants compile, run and land in ab.json with the same kernels; the table names both."""
    settings_ab.main(["--out", str(tmp_path), "--settings", "default;fused_tile=32", "--step-cases", "2:10:16",
                      "--steps", "1", "--jobs", "2"])
    results = json.load(open(tmp_path / "ab.json"))
    assert set(results) == {"default", "fused_tile=32"}
    for entry in results.values():
        assert entry["rc"] == [0]
        kernels = entry["steps"]["N=2 w=16"]
        assert kernels and all(ms > 0 for ms in kernels.values())
    assert set(results["default"]["steps"]["N=2 w=16"]) == set(results["fused_tile=32"]["steps"]["N=2 w=16"])
    out = capsys.readouterr().out
    assert "fused_tile_32" in out and "N=2 w=16 sum" in out
