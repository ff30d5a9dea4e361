"""benchmarks/tools/tcnn_native.py without a GPU or a build: how it reads the progress lines of tcnn's
`mlp_learning_an_image` (the format of its source: `Step#i: loss=L time=T[µs]`, T the microseconds since the
previous line), the command lines it runs, its reuse of an unpacked source tree, and tinn's side at toy size."""
import lzma
import io
import os
import sys
import tarfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
from benchmarks.tools import tcnn_native  # noqa: E402
from benchmarks.tools.tcnn_native import ToolError  # noqa: E402

# What the sample prints for `mlp_learning_an_image img.png config.json 3001 result.jpg`: steps 0, 10, 100,
# then every 1000 (the last step, 3000, is a multiple of 1000).
SAMPLE_OUTPUT = """Loading custom json config 'tinn/configs/config_hash.json'.
JIT fusion is enabled.
Beginning optimization with 3001 training steps.
Step#0: loss=1.25931 time=1834511[\u00b5s]
Step#10: loss=0.487512 time=10230[\u00b5s]
Step#100: loss=0.0925341 time=81000[\u00b5s]
Step#1000: loss=0.0112453 time=810000[\u00b5s]
Step#2000: loss=0.00551231 time=900000[\u00b5s]
Step#3000: loss=-nan time=1100000[\u00b5s]
"""


def test_progress_lines_parse_to_steps_losses_and_microseconds():
    lines = tcnn_native.parse_step_lines(SAMPLE_OUTPUT)
    assert [r["step"] for r in lines] == [0, 10, 100, 1000, 2000, 3000]
    assert [r["us"] for r in lines] == [1834511, 10230, 81000, 810000, 900000, 1100000]
    assert lines[1]["loss"] == pytest.approx(0.487512)
    assert lines[-1]["loss"] != lines[-1]["loss"]  # C++'s "-nan" reads as NaN


def test_windows_cover_the_steps_between_lines():
    windows = tcnn_native.timing_windows(tcnn_native.parse_step_lines(SAMPLE_OUTPUT))
    assert [(w["first"], w["last"], w["steps"]) for w in windows] == [
        (0, 0, 1), (1, 10, 10), (11, 100, 90), (101, 1000, 900), (1001, 2000, 1000), (2001, 3000, 1000)]
    assert sum(w["steps"] for w in windows) == 3001


def test_steady_ms_per_step_counts_only_windows_after_warmup():
    windows = tcnn_native.timing_windows(tcnn_native.parse_step_lines(SAMPLE_OUTPUT))
    steady = tcnn_native.steady_ms_per_step(windows, warmup=1000)
    assert steady["timed_steps"] == 2000
    assert steady["ms_per_step"] == pytest.approx((900000 + 1100000) / 2000 / 1e3)
    assert steady["window_ms_per_step"] == pytest.approx([0.9, 1.1])
    steady = tcnn_native.steady_ms_per_step(windows, warmup=100)
    assert steady["timed_steps"] == 2900
    assert steady["ms_per_step"] == pytest.approx((810000 + 900000 + 1100000) / 2900 / 1e3)
    with pytest.raises(ToolError, match="no timed window starts at step >= 3001"):
        tcnn_native.steady_ms_per_step(windows, warmup=3001)


def test_printed_steps_follow_the_samples_growing_interval():
    assert tcnn_native.printed_steps(3001) == [0, 10, 100, 1000, 2000, 3000]
    assert tcnn_native.printed_steps(3000) == [0, 10, 100, 1000, 2000]
    assert tcnn_native.printed_steps(101) == [0, 10, 100]
    assert tcnn_native.printed_steps(1) == [0]


def test_sample_failures_are_errors_even_with_exit_code_zero():
    tcnn_native.check_sample_output(SAMPLE_OUTPUT, 0)
    with pytest.raises(ToolError, match="failed: unknown file type"):
        tcnn_native.check_sample_output("Uncaught exception: unknown file type\n", 0)
    with pytest.raises(ToolError, match="exited with 134"):
        tcnn_native.check_sample_output("Step#0: loss=1 time=5[\u00b5s]\n", 134)


def test_command_lines():
    assert tcnn_native.configure_command("/tmp/t/tiny-cuda-nn", "/tmp/t/build", "90") == [
        "cmake", "-S", "/tmp/t/tiny-cuda-nn", "-B", "/tmp/t/build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DTCNN_CUDA_ARCHITECTURES=90", "-DCMAKE_POLICY_VERSION_MINIMUM=3.5", "-DTCNN_BUILD_BENCHMARK=OFF"]
    assert tcnn_native.configure_command("s", "b", "90", "/usr/local/cuda/bin/nvcc")[-1] == \
        "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"
    assert tcnn_native.configure_command("s", "b", "90", None, ["-DTCNN_BUILD_WITH_RTC=OFF"])[-2:] == [
        "-DTCNN_BUILD_BENCHMARK=OFF", "-DTCNN_BUILD_WITH_RTC=OFF"]
    assert tcnn_native.build_command("/tmp/t/build") == ["cmake", "--build", "/tmp/t/build", "--target",
                                                         "mlp_learning_an_image"]
    assert tcnn_native.build_command("/tmp/t/build", 8)[-2:] == ["-j", "8"]
    binary = tcnn_native.sample_binary("/tmp/t/build")
    assert binary == "/tmp/t/build/mlp_learning_an_image"
    cmd = tcnn_native.sample_command(binary, "img.png", "tinn/configs/config_hash.json", 3001, "/w/result.jpg")
    assert cmd == [binary, os.path.abspath("img.png"), os.path.abspath("tinn/configs/config_hash.json"), "3001",
                   "/w/result.jpg"]


def _archive(path, commits: str, extra: bytes):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in (("tiny-cuda-nn/COMMITS", commits.encode()), ("tiny-cuda-nn/CMakeLists.txt", extra)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(lzma.compress(raw.getvalue()))


def test_unpack_reuses_a_tree_of_the_same_commits(tmp_path):
    archive = tmp_path / "src.tar.xz"
    _archive(archive, "tiny-cuda-nn aaa\n", b"first")
    source = tcnn_native.unpack(str(archive), str(tmp_path / "x"))
    assert open(os.path.join(source, "CMakeLists.txt")).read() == "first"
    open(os.path.join(source, "build-output"), "w").close()
    _archive(archive, "tiny-cuda-nn aaa\n", b"second")  # same commits: the tree stays as it is
    assert tcnn_native.unpack(str(archive), str(tmp_path / "x")) == source
    assert os.path.exists(os.path.join(source, "build-output"))
    _archive(archive, "tiny-cuda-nn bbb\n", b"third")  # other commits: unpacked afresh
    tcnn_native.unpack(str(archive), str(tmp_path / "x"))
    assert open(os.path.join(source, "CMakeLists.txt")).read() == "third"
    assert not os.path.exists(os.path.join(source, "build-output"))
    with pytest.raises(ToolError, match="tcnn_sources.sh"):
        tcnn_native.unpack(str(tmp_path / "missing.tar.xz"), str(tmp_path / "y"))


def test_failed_commands_report_their_output(tmp_path):
    log = tmp_path / "log"
    with pytest.raises(ToolError, match="(?s)build failed with exit code 3.*boom"):
        tcnn_native.run_logged([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], str(log), 60, "build")
    assert "boom" in log.read_text()
    with pytest.raises(ToolError, match="not found on PATH"):
        tcnn_native.run_logged(["/nonexistent/cmake"], str(log), 60, "configure")


def test_tinn_side_runs_on_a_written_default_image(tmp_path):
    image = tcnn_native.write_default_image(str(tmp_path / "default.png"))
    import imageio.v3 as iio
    assert iio.imread(image).shape == (256, 256, 3)
    config = os.path.join(HERE, "..", "tinn", "configs", "config_hash.json")
    ms = tcnn_native.tinn_timings(config, image, log2_batch=8, block=2, blocks=1, with_torch=True)
    # (the loop captured in a CUDA graph is timed on CUDA only)
    assert set(ms) == {"tinn Trainer", "tinn Trainer + batch", "tinn.torch loop", "tinn.torch loop, fused Adam",
                       "_device"}
    assert all(v > 0 for k, v in ms.items() if k != "_device")


def test_run_sample_reads_a_programs_output_in_a_scratch_folder(tmp_path):
    # A stand-in for the built sample: checks it gets the four arguments (argc 5, which keeps the real one
    # from writing an image per progress line), writes the reference image into its working folder as the
    # real one does, and prints the real one's lines.
    fake = tmp_path / "mlp_learning_an_image"
    fake.write_text("#!/bin/sh\n[ $# -eq 4 ] || { echo \"Uncaught exception: got $# arguments\"; exit 0; }\n"
                    "touch reference.jpg\ncat <<'END'\n" + SAMPLE_OUTPUT + "END\n")
    fake.chmod(0o755)
    result = tcnn_native.run_sample(str(fake), "img.png", "config.json", 3001, 1000, 60)
    assert result["ms_per_step"] == pytest.approx(1.0)
    assert result["timed_steps"] == 2000 and result["jit_fusion"]
    assert result["command"][3] == "3001"
    assert not os.path.exists("reference.jpg")
    with pytest.raises(ToolError, match="missing or not executable"):
        tcnn_native.run_sample(str(tmp_path / "absent"), "img.png", "config.json", 3001, 1000, 60)


def test_a_step_count_without_a_window_after_warmup_is_refused_before_any_work():
    with pytest.raises(SystemExit, match=r"--steps 2000: .*use --steps 2001"):
        tcnn_native.main(["--steps", "2000"])
    with pytest.raises(SystemExit, match=r"use --steps 3001"):
        tcnn_native.main(["--steps", "3000", "--warmup", "2000"])
