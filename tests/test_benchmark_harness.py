"""`python -m benchmarks`: every suite that runs on a CPU runs at toy size (--quick) and leaves its JSON, with the
keys the docs' tables are made from, and its table; the GPU-only suites refuse this machine by name, and their
command lines follow the options."""
import json
import math
import os

import pytest
import torch

from benchmarks import __main__ as cli
from benchmarks import harness
from benchmarks.suites import SUITES, Suite, standard_argv

NO_CUDA = not torch.cuda.is_available()
# Suites that run in this process on the CPU: a test process already initialised on CUDA cannot switch.
in_process_on_the_cpu = pytest.mark.skipif(os.environ.get("TINN_ARCH", "cpu") != "cpu",
                                           reason="runs the suite in this process with --arch cpu; CPU suite only")


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    """Tables and JSON under tmp_path instead of the checkout's out/benchmarks/."""
    monkeypatch.setattr(harness, "OUT", str(tmp_path / "out"))
    return tmp_path / "out"


def run_quick(suite: str, out_dir, *extra) -> dict:
    assert cli.main(["run", suite, "--quick", "--arch", "cpu", *extra]) == 0
    table = out_dir / suite / f"{suite}.txt"
    assert table.read_text().count("\n") >= 3, "no table printed"
    with open(out_dir / suite / f"{suite}.json") as f:
        return json.load(f)


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def test_list_names_every_suite_on_one_line(capsys):
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(SUITES)
    expected = {"image", "arrays", "grid", "scenes", "sharded", "startup", "tensor_cores", "grid_kernels",
                "web_viewer", "tcnn", "octree_quality"}
    assert set(SUITES) == expected


@in_process_on_the_cpu
def test_arrays_quick_times_tinn_and_torch(out_dir):
    result = run_quick("arrays", out_dir)
    assert result["arch"] == "cpu" and [r["networks"] for r in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert row["samples"] == 256 and row["width"] == 64
        assert positive(row["tinn_fwd_ms"], row["tinn_train_ms"], row["torch_train_ms"], row["train_speedup"])


@in_process_on_the_cpu
def test_grid_quick_checks_agreement_and_times_both(out_dir, tmp_path):
    path = tmp_path / "elsewhere" / "grid.json"
    assert cli.main(["run", "grid", "--quick", "--arch", "cpu", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert not (out_dir / "grid" / "grid.json").exists()   # --json moves the JSON, the table stays
    assert (out_dir / "grid" / "grid.txt").exists()
    rows = result["results"]
    assert {(r["case"], r["impl"]) for r in rows} == {("1 grid", "tinn"), ("1 grid", "torch"),
                                                        ("4 grids", "tinn"), ("4 grids", "torch")}
    for r in rows:
        assert r["max_abs_diff"] < 1e-5 and positive(r["fwd_samples_per_s"], r["fwd_bwd_samples_per_s"])


@in_process_on_the_cpu
def test_image_quick_trains_the_same_model_both_ways(out_dir):
    result = run_quick("image", out_dir)
    (row,) = result["rows"]
    assert row["log2_batch"] == 10 and row["n_networks"] == 1
    assert positive(row["native_ms"], row["pytorch_ms"], row["pt+loss_ms"])
    # the torch loss and tinn's loss are the same formula: the two PyTorch paths train identically
    assert row["pytorch_loss"] == pytest.approx(row["pt+loss_loss"], rel=1e-4)


def test_startup_quick_reports_every_phase_in_order(out_dir):
    result = run_quick("startup", out_dir)
    (row,) = result["rows"]
    phases = [row[p] for p in ("python", "import torch", "import tinn", "tinn.init", "first step", "first inference")]
    assert phases == sorted(phases) and positive(*phases)


@in_process_on_the_cpu
def test_web_viewer_quick_measures_every_condition_of_every_task(out_dir):
    """The image task and the scene demos' sources (KiloNeRF fine-tuning, the octree), each trained with no viewer,
    served, and with a connected client at rest and moving; the client receives the frames rendered for it."""
    result = run_quick("web_viewer", out_dir)
    assert result["arch"] == "cpu" and list(result["tasks"]) == ["image", "kilonerf", "octree"]
    for name, task in result["tasks"].items():
        assert task["task"] == name
        for key in ("no_viewer", "served_no_client", "resting_client", "moving_client"):
            assert positive(task[key]), (name, key)
        for key in ("resting_client", "moving_client"):
            # What the page rendered reached the client (viser may drop a frame that a newer one replaced before
            # it went out).
            assert 1 <= task[f"{key}_frames_received"] <= task[f"{key}_frames_sent"], (name, key)
        assert task["refused_messages"] == 0, name
        # Each condition against the bare-loop windows beside it (the windows alternate): the mean of its windows.
        ratios = task["resting_client_ratios"]
        assert task["resting_client_vs_no_viewer"] == pytest.approx(sum(ratios) / len(ratios), abs=1e-3)
        assert len(task["no_viewer_windows"]) == 3 * len(ratios) + 1
        # The same windows per CPU second of the process (the hosts' own speed changes do not move these as much).
        cpu = task["moving_client_cpu_ratios"]
        assert len(cpu) == len(ratios) and all(positive(v) for v in cpu)
        assert task["moving_client_cpu_vs_no_viewer"] == pytest.approx(sum(cpu) / len(cpu), abs=1e-3)
    assert result["tasks"]["kilonerf"]["phase"] == "finetune" and result["tasks"]["kilonerf"]["networks"] == 8
    assert result["tasks"]["octree"]["nodes"] >= 1
    rows = [[cell.strip() for cell in line.split("|")]
            for line in (out_dir / "web_viewer" / "web_viewer.txt").read_text().splitlines() if line.count("|") == 7]
    assert [row[:2] for row in rows[1:]] == [[name, c] for name in ("image", "kilonerf", "octree")
                                             for c in ("no_viewer", "served_no_client", "resting_client",
                                                       "moving_client")]


def test_scenes_quick_renders_both_scenes(out_dir):
    result = run_quick("scenes", out_dir)
    assert result["res"] == [8, 8] and result["samples"] == 16
    assert positive(result["kilonerf_ms"], result["octree_ms"], result["octree_every_sample_ms"])
    assert result["octree_over_kilonerf_fps"] == pytest.approx(result["kilonerf_ms"] / result["octree_ms"])
    assert (out_dir / "scenes" / "kilonerf").is_dir() and (out_dir / "scenes" / "octree").is_dir()


@pytest.mark.skipif(not NO_CUDA, reason="the refusal is for machines without CUDA")
def test_gpu_suites_refuse_a_machine_without_cuda(out_dir, capsys):
    assert cli.main(["run", "tensor_cores", "--quick"]) == 2
    assert "needs a CUDA GPU, and this machine has none" in capsys.readouterr().err
    assert cli.main(["run", "sharded"]) == 2
    assert "needs 2 or more CUDA GPUs (asked for 0, this machine has 0)" in capsys.readouterr().err
    assert cli.main(["run", "sharded", "--gpus", "4"]) == 2
    assert "asked for 4, this machine has 0" in capsys.readouterr().err
    assert not out_dir.exists()


def test_gpu_suites_refuse_cpu_runs_they_cannot_make(capsys):
    assert cli.main(["run", "tensor_cores", "--arch", "cpu"]) == 2
    assert "runs on CUDA GPUs only" in capsys.readouterr().err
    assert cli.main(["run", "sharded", "--arch", "cpu"]) == 2
    assert "add --quick" in capsys.readouterr().err


def test_command_lines_follow_the_options(tmp_path, capsys):
    path = str(tmp_path / "s.json")
    assert cli.main(["run", "sharded", "--gpus", "4", "--json", path, "--dry-run", "--", "--skip-big"]) == 0
    command = capsys.readouterr().out.split()
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                           "-m", "benchmarks.bench_sharded", "--out", path, "--skip-big"]
    assert cli.main(["run", "sharded", "--arch", "cpu", "--quick", "--dry-run"]) == 0
    assert "--nproc_per_node 2 -m benchmarks.bench_sharded" in capsys.readouterr().out
    assert cli.main(["run", "tensor_cores", "--quick", "--json", path, "--dry-run"]) == 0
    assert capsys.readouterr().out.split()[1:] == ["-m", "benchmarks.tools.tensor_core_check", "--part", "bench",
                                                   "--out", path, "--quick"]


def test_bad_options_are_refused_by_name(capsys):
    assert cli.main(["run", "nonesuch"]) == 2
    assert "unknown suite 'nonesuch'; the suites are: image, arrays" in capsys.readouterr().err
    assert cli.main(["run", "arrays", "--gpus", "2"]) == 2
    assert "--gpus is an option of the multi-GPU suites only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "arrays", "--arch", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_a_suite_registered_ahead_of_its_module_says_so(monkeypatch, capsys):
    for name, module in (("tcnn", "benchmarks.tools.tcnn_native"), ("octree_quality", "benchmarks.tools.octree_quality")):
        assert SUITES[name].module == module and SUITES[name].argv is standard_argv
    monkeypatch.setitem(SUITES, "later", Suite("later", "benchmarks.tools.not_written_yet", "a suite to come",
                                               standard_argv))
    assert cli.main(["run", "later", "--quick"]) == 2
    assert ("suite 'later' has no module yet: benchmarks/tools/not_written_yet.py is not in this checkout"
            in capsys.readouterr().err)
    cli.main(["list"])
    assert "a suite to come  [module not in this checkout yet]" in capsys.readouterr().out


def test_standard_argv_is_the_convention_new_modules_follow():
    options = harness.options_for(SUITES["tcnn"], quick=True, arch="cuda", json_path="r.json")
    assert standard_argv(options) == ["--json", os.path.abspath("r.json"), "--quick", "--arch", "cuda"]


def test_results_index_accounts_for_every_kept_file():
    """benchmarks/results/README.md has a line per kept folder or file family, with its file count and the pages
    citing it: every file falls under one line, and the counts are right."""
    import fnmatch
    import re
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "results")
    files = sorted(os.path.relpath(os.path.join(d, n), results).replace(os.sep, "/")
                   for d, _, names in os.walk(results) for n in names if n != "README.md")
    with open(os.path.join(results, "README.md")) as f:
        rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| .* \| (.+) \|$", f.read(), flags=re.M)
    covered = []
    for shown, count, cited_by in rows:
        patterns = [p.strip().strip("`") for p in shown.split(",")]
        hits = [f for f in files if any(f.startswith(p) if p.endswith("/") else fnmatch.fnmatchcase(f, p)
                                        for p in patterns)]
        assert len(hits) == int(count), shown
        assert "](../../" in cited_by, shown
        covered += hits
    assert sorted(covered) == files



def axis_rotation(axis, degrees) -> torch.Tensor:
    """(3, 3) float64 rotation by `degrees` about `axis` (Rodrigues' formula)."""
    k = torch.tensor(axis, dtype=torch.float64)
    k = k / k.norm()
    cross = torch.tensor([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]], dtype=torch.float64)
    a = math.radians(degrees)
    return torch.eye(3, dtype=torch.float64) + math.sin(a) * cross + (1 - math.cos(a)) * cross @ cross


def test_web_viewer_client_cameras_show_the_poses_they_stand_for():
    """The headless client's camera messages decode (as the server decodes a browser's) to the scene pose they
    were made from, for rotations through every branch of the quaternion formula; a scene client starts at the
    held-out view with its field of view and turns around the scene's centre."""
    from types import SimpleNamespace

    from benchmarks.tools.web_viewer_cost import browser_pose, scene_cameras
    from tinn.viewer.web import camera_from_browser

    # trace > 0, then 180-degree turns whose largest diagonal entry is x, y and z in turn, then a generic one
    for axis, degrees in (((0, 0, 1), 30), ((1, 0, 0), 180), ((0, 1, 0), 180), ((0, 0, 1), 180), ((1, 2, 3), 150)):
        c2w = torch.eye(4, dtype=torch.float64)
        c2w[:3, :3] = axis_rotation(axis, degrees)
        c2w[:3, 3] = torch.tensor([0.5, -1.0, 2.0])
        wxyz, position = browser_pose(c2w)
        decoded, _, _, _ = camera_from_browser(wxyz, position, 1.0, 64, 48)
        assert torch.allclose(decoded.double(), c2w, atol=1e-6), (axis, degrees)

    start = torch.eye(4, dtype=torch.float64)
    # looking down -z turned about x towards +y, from (0, -3, 2): at the origin
    start[:3, :3] = axis_rotation((1, 0, 0), math.degrees(math.atan2(3, 2)))
    start[:3, 3] = torch.tensor([0.0, -3.0, 2.0])
    source = SimpleNamespace(orbit_start=lambda: (start, torch.zeros(3)),
                             test=SimpleNamespace(width=64, height=48, focal=24.0))
    camera = scene_cameras(source, degrees_per_move=90.0)
    home = camera(0)
    c2w, fov, _, _ = camera_from_browser(home["wxyz"], home["position"], home["fov"], 64, 48)
    assert torch.allclose(c2w.double(), start, atol=1e-5)
    assert fov == pytest.approx(2 * math.atan(24 / 24.0)) and home["look_at"] == (0.0, 0.0, 0.0)
    turned = camera(1)
    c2w, _, _, _ = camera_from_browser(turned["wxyz"], turned["position"], turned["fov"], 64, 48)
    # a quarter turn about world z: the same height and distance, still looking at the centre
    assert torch.allclose(c2w[:3, 3].double(), axis_rotation((0, 0, 1), 90) @ start[:3, 3], atol=1e-5)
    assert torch.allclose(-c2w[:3, 2].double(), -c2w[:3, 3].double() / c2w[:3, 3].norm(), atol=1e-5)


def test_sharded_table_shows_every_ranks_phases_under_the_profile_column():
    """bench_sharded's table: rank 0's phases on the row, each other rank's on a line below, in the same column (a
    rank that reaches a collective first waits there, so one rank's phases do not tell where the step goes)."""
    from benchmarks import bench_sharded

    phases = [dict(zip(bench_sharded.PROFILED, (r + 0.5, 3.25, 0.125, 0.5, 2.25, 0.0625))) for r in range(3)]
    row = {"model": "grid", "precision": "float16", "strategy": "sharded", "chunks": 1, "exchange_dtype": "float32",
           "single_gpu_step_ms": 12.0, "strong_step_ms": 7.0, "strong_speedup": 12 / 7, "weak_step_ms": 13.0,
           "weak_per_gpu_ratio": 12 / 13, "global_batch": 1 << 22, "networks": 4096,
           "strong_profile_per_rank": phases}
    head, first, *others, targets = bench_sharded.summary_table([row], 3)
    column = head.index("strong-run profile")
    assert first[column:] == "0.50 3.25 0.12 0.50 2.25 0.06"
    assert [line[column:] for line in others] == ["1.50 3.25 0.12 0.50 2.25 0.06", "2.50 3.25 0.12 0.50 2.25 0.06"]
    assert [line[:column].strip() for line in others] == ["rank 1:", "rank 2:"]
    assert targets.startswith("targets:")
