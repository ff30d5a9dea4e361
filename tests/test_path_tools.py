"""The single-network path tools at toy size (benchmarks/tools/single_network_paths.py, image_paths.py): each path
they report is the one the settings choose, and the paths' results agree, so the H100 tables come from a tool
that compares what it says it compares."""
import json

import tinn

from benchmarks.tools import image_paths, single_network_paths


def test_single_network_paths_compare_the_kernels_dense_gemms_and_torch(tmp_path, tuned):
    tuned()
    out = tmp_path / "paths.json"
    single_network_paths.main(["--shapes", "16:Tanh:1,32:Sine:2", "--log2-batch", "9", "--steps", "1", "--rounds", "1",
                               "--precisions", "float16,bfloat16", "--json", str(out)])
    rows = json.load(open(out))["rows"]
    cpu = tinn.runtime.arch() == "cpu"
    for shape in ("16 Tanh x1", "32 Sine x2"):
        paths = {r["path"]: r for r in rows if r["shape"] == shape}
        kernels = "unfused" if cpu or shape.endswith("x2") else "fused"  # Sine: never the fused kernels
        assert set(paths) == {kernels, "dense", "torch", "dense float16", "dense bfloat16", "torch float16",
                              "torch bfloat16"}
        assert paths["dense"]["out_diff"] < 1e-5 and paths["dense"]["grad_diff"] < 1e-5
        for precision, bound in (("float16", 5e-3), ("bfloat16", 3e-2)):  # against the float32 dense path
            assert 1e-6 < paths[f"dense {precision}"]["out_diff"] < bound
            assert 1e-6 < paths[f"dense {precision}"]["grad_diff"] < bound
        assert all(r["step_ms"] > 0 and r["infer_ms"] > 0 and r["host_ms"] > 0 for r in paths.values())
        assert paths["torch"]["step_x_torch"] == 1.0


def test_image_paths_train_each_variant_from_the_same_start(tmp_path, tuned):
    tuned()
    out = tmp_path / "image.json"
    image_paths.main(["--log2-batch", "9", "--steps", "1", "--rounds", "1", "--train-steps", "4",
                      "--variant", "dense_single_network=false", "--json", str(out)])
    result = json.load(open(out))
    rows = {r["variant"]: r for r in result["rows"]}
    assert rows["default"]["path"] == ("dense" if tinn.runtime.arch() == "cpu" else "fused")
    assert rows["dense_single_network=false"]["path"] in ("unfused", "fused")
    curves = result["psnr_curves"]
    assert curves["steps"] == [1, 2, 3, 4]
    # Same seed and batches: the two MLP paths compute the same functions, so the PSNR curves agree closely.
    a, b = curves["runs"]["default"][0], curves["runs"]["dense_single_network=false"][0]
    assert all(abs(x - y) < 0.05 for x, y in zip(a, b)) and a[-1] > a[0]


def test_gradient_scale_probe_trains_float16_with_the_scale_it_was_given(tuned, monkeypatch, capsys):
    from benchmarks.tools import gradient_scale_probe
    from tinn import dense_mlp

    tuned()
    monkeypatch.setitem(dense_mlp.GRADIENT_SCALES, "float16", 128.0)  # restored after the test
    built = []
    original = tinn.NetworkArray.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append((self.precision, self.gradient_scale))
    monkeypatch.setattr(tinn.NetworkArray, "__init__", spy)
    gradient_scale_probe.main(["1024", "--log2-batch", "9", "--quality-runs", "1", "--train-steps", "2"])
    assert ("float16", 1024.0) in built and ("float32", 1.0) in built
    assert "precision=float16" in capsys.readouterr().out
