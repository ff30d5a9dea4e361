"""benchmarks/tools/precision_seeds.py: a demo's PSNR per precision over seeds, paired with the first precision."""
import json
import os

import pytest

from benchmarks.tools import precision_seeds as ps


def test_differences_are_paired_by_seed():
    """The five-seed image runs of the performance page: means and the same-seed differences."""
    psnr = {"float32": [39.69, 40.12, 40.08, 39.81, 40.03], "float16": [39.65, 39.72, 39.35, 40.01, 39.91],
            "bfloat16": [39.69, 39.97, 40.16, 39.28, 39.75]}
    rows = ps.compare(psnr, ["float32", "float16", "bfloat16"])
    assert rows["float32"]["diff_mean"] == rows["float32"]["diff_median"] == 0.0
    assert rows["float16"]["mean"] == pytest.approx(39.728)
    assert rows["float16"]["diff_mean"] == pytest.approx(-0.218)
    assert rows["float16"]["diff_median"] == pytest.approx(-0.12)
    assert rows["bfloat16"]["diff_mean"] == pytest.approx(-0.176)
    assert rows["bfloat16"]["diff_median"] == pytest.approx(-0.15)


def test_the_precision_replaces_only_its_own_setting():
    assert ps.settings_with_precision("", "bfloat16") == "precision=bfloat16"
    assert ps.settings_with_precision("deterministic=true,precision=float32", "float16") == \
        "deterministic=true,precision=float16"


@pytest.mark.parametrize("argv,message", [
    (["--precisions", "float64"], "allowed: a comma-separated list of float32"),
    (["--seeds", "one"], "allowed: comma-separated integers"),
    (["--", "--seed", "3"], "the tool sets --seed and --out"),
    (["--", "--out=x"], "the tool sets --seed and --out"),
])
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        ps.main(argv)
    assert message in capsys.readouterr().err


def test_image_demo_runs_per_seed_and_precision(tmp_path):
    """Two seeds of the image demo at toy size on the CPU: the PSNR each run wrote, in seed order."""
    out = tmp_path / "runs"
    result = ps.main(["--seeds", "1,2", "--precisions", "float32", "--out", str(out), "--json",
                      str(tmp_path / "r.json"), "--", "--steps", "10", "--size", "16", "--arch", "cpu"])
    written = [json.load(open(os.path.join(out, f"image_float32_{s}", "summary.json")))["final_psnr"] for s in (1, 2)]
    assert result["precisions"]["float32"]["psnr"] == written
    assert written[0] != written[1]  # the seed reaches the run (networks and batches)
    assert json.load(open(tmp_path / "r.json"))["precisions"]["float32"]["psnr"] == written
