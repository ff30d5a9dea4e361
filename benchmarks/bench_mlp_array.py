"""MLP-array benchmark: tinn against the PyTorch ways of doing the same job, in one run.

PyTorch baselines: (1) samples grouped by network into a zero-padded
(N, max_count, dims) batch, then `torch.bmm` per layer, in fp32, with TF32 matmuls allowed, and under
`torch.autocast` float16 with a `torch.amp.GradScaler` (fp32 parameters; the last two CUDA only); (2)
`torch.func.vmap` of `functional_call` over the N networks' stacked parameters (the stack_module_state
recipe) on the same padded batch, fp32; (3) `torch._grouped_mm` on samples sorted by network,
bf16 (tensor cores) and fp32 where torch runs it. Training = forward, L2 loss, autograd backward,
`torch.optim.Adam` (`--torch-adam fused`: its fused kernel). tinn: `NetworkArray` inference, and
`Trainer.training_step` (forward, L2 loss kernel, hand-written backward, Adam kernel); on CUDA also the
unfused kernels (`--unfused`) for comparison. Reported: times, TFLOP/s, % of the
GPU's FP32 peak (non-tensor-core), inference samples/s, peak GPU memory. Training steps are timed two
ways: a sync around each step (median), and pipelined, steps issued back to back with one sync at the end,
as a training loop runs (the median of three such blocks' means, and the blocks' spread); the host's
lead-in of a step counts in the first only. Each row also names the fastest torch baseline that ran, for the
step, the pipelined step and inference, tinn's speedup over it, and whether that meets the goals (step
1.5x, inference 2.5x).

    python -m benchmarks.bench_mlp_array                       # GPU sizes if CUDA, tiny sizes on CPU
    python -m benchmarks.bench_mlp_array --suite               # N in 1..16384 x widths 16..128, even + ragged
    python -m benchmarks.bench_mlp_array --networks 1,64,4096 --log2-samples 20,22 --json out.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

import torch


import tinn  # noqa: E402
from benchmarks.loading import ROOT  # noqa: E402
from benchmarks.common import (peak_memory_mib, peak_memory_reset, print_table, record_pipelined, settle, tf32_matmuls,  # noqa: E402
                               time_fn, write_json)


def make_ids(batch: int, n: int, routing: str, device) -> torch.Tensor:
    if routing == "even":  # equal counts, shuffled order
        ids = torch.arange(batch, device=device) % n
        return ids[torch.randperm(batch, device=device)].to(torch.int32)
    if routing == "sorted":
        return (torch.arange(batch, device=device) * n // batch).to(torch.int32)
    w = torch.rand(n, device=device) ** 3 + 1e-3  # ragged
    return torch.multinomial(w, batch, replacement=True).to(torch.int32)


def pad_by_network(x, ids, n):
    order = torch.argsort(ids)
    counts = torch.bincount(ids, minlength=n)
    m = int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    sorted_ids = ids[order].long()
    slot = torch.arange(x.shape[0], device=x.device) - starts[sorted_ids]
    h = torch.zeros(n, m, x.shape[1], device=x.device)
    h[sorted_ids, slot] = x[order]

    def gather(y):
        # y's dtype: float16 under autocast (index_put wants the destination's dtype to match).
        out = torch.empty(x.shape[0], y.shape[2], device=x.device, dtype=y.dtype)
        out[order] = y[sorted_ids, slot]
        return out
    return h, gather


class TorchBmmArray(torch.nn.Module):
    """Reference PyTorch implementation: padded per-network batches and bmm."""

    def __init__(self, net):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(net.weights(l).detach().transpose(1, 2).contiguous()) for l in range(net.n_layers)])

    def forward(self, x, ids, n):
        h, gather = pad_by_network(x, ids, n)
        for l, w in enumerate(self.weights):
            h = torch.bmm(h, w)
            if l < len(self.weights) - 1:
                h = torch.relu(h)
        return gather(h)


class GroupedMMArray(torch.nn.Module):
    """PyTorch's grouped GEMM (`torch._grouped_mm`, what MoE layers use): samples sorted by network, one
    GEMM per layer over all groups. fp32 master weights cast to `dtype` per step (mixed precision, as
    autocast would); bf16 runs on tensor cores. Raises where torch refuses the case (group count, dtype,
    architecture); the caller records the reason."""

    def __init__(self, net, dtype):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(net.weights(l).detach().transpose(1, 2).contiguous()) for l in range(net.n_layers)])
        self.dtype = dtype

    def forward(self, x, ids, n):
        order = torch.argsort(ids)
        offs = torch.cumsum(torch.bincount(ids, minlength=n), 0).to(torch.int32)
        h = x[order].to(self.dtype)
        for l, w in enumerate(self.weights):
            h = torch._grouped_mm(h, w.to(self.dtype), offs=offs)
            if l < len(self.weights) - 1:
                h = torch.relu(h)
        out = torch.empty(x.shape[0], h.shape[1], device=x.device)
        out[order] = h.float()
        return out


def padded_bytes(ids: torch.Tensor, n: int, dims: int) -> int:
    return n * int(torch.bincount(ids.long(), minlength=n).max()) * dims * 4


class VmapArray(torch.nn.Module):
    """PyTorch's model-ensembling recipe: one functional MLP vmapped over stacked per-network weights."""

    def __init__(self, net):
        super().__init__()
        layers = []
        for l, (fan_out, fan_in) in enumerate(net.layer_shapes()):
            layers.append(torch.nn.Linear(fan_in, fan_out, bias=False, device="meta"))
            if l < net.n_layers - 1:
                layers.append(torch.nn.ReLU())
        # The template lives on the meta device and outside the module tree: it only supplies structure.
        self.__dict__["base"] = torch.nn.Sequential(*layers)
        names = [f"{i}.weight" for i, m in enumerate(layers) if isinstance(m, torch.nn.Linear)]
        self.stacked = torch.nn.ParameterDict(
            {k.replace(".", "_"): torch.nn.Parameter(net.weights(l).detach().clone()) for l, k in enumerate(names)})
        self.names = names

    def forward(self, x, ids, n):
        padded, gather = pad_by_network(x, ids, n)
        params = {k: self.stacked[k.replace(".", "_")] for k in self.names}
        y = torch.func.vmap(lambda p, h: torch.func.functional_call(self.base, p, (h,)))(params, padded)
        return gather(y)


def fp32_peak_tflops(device_name: str) -> float | None:
    """Dense FP32 (CUDA-core) peak of known GPUs; None if unknown (then no % column)."""
    name = device_name.lower()
    if "h100" in name:
        return 51.2 if "pcie" in name else 66.9
    if "h200" in name:
        return 66.9
    if "a100" in name:
        return 19.5
    return None


@dataclasses.dataclass(frozen=True)
class BmmPrecision:
    """One way a PyTorch user runs the padded-bmm baseline: the row's key prefix, the name in the tables, and the
    tensor-core mode (TF32 matmuls, or autocast to `autocast_dtype` with a gradient scaler)."""
    prefix: str
    name: str
    tf32: bool = False
    autocast_dtype: torch.dtype | None = None
    cuda_only: bool = False


BMM_FP32 = BmmPrecision("torch", "bmm fp32")
BMM_TF32 = BmmPrecision("bmm_tf32", "bmm tf32", tf32=True, cuda_only=True)
BMM_FP16 = BmmPrecision("bmm_fp16", "bmm autocast fp16", autocast_dtype=torch.float16, cuda_only=True)
BMM_PRECISIONS = (BMM_FP32, BMM_TF32, BMM_FP16)

# Every torch baseline a row can hold: key prefix, name in the tables.
TORCH_BASELINES = tuple((b.prefix, b.name) for b in BMM_PRECISIONS) + (
    ("vmap", "vmap"), ("gmm_bf16", "gmm bf16"), ("gmm_fp32", "gmm fp32"))

# The tensor-core issue's goals: tinn's speedup over the fastest torch baseline of the same run.
GOALS = {"train": 1.5, "train_pipelined": 1.5, "fwd": 2.5}


def time_torch(row, prefix, model, x, ids, target, n, reps, autocast_dtype=None, fused_adam=False):
    """Times `model` into row[prefix_*]: inference (no grad) and the training step (forward, L2 loss, backward,
    Adam), synced and pipelined, and their peak memory. With `autocast_dtype` both run under `torch.autocast`
    and the step scales its loss with a `torch.amp.GradScaler`, as a mixed-precision training loop does."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True if fused_adam else None)
    mixed = autocast_dtype is not None
    scaler = torch.amp.GradScaler(x.device.type, enabled=mixed)

    def autocast():
        return torch.autocast(x.device.type, dtype=autocast_dtype, enabled=mixed)

    def forward():
        with autocast():
            return model(x, ids.long(), n)

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = torch.mean((model(x, ids.long(), n) - target) ** 2)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    peak_memory_reset()
    with torch.no_grad():
        row[f"{prefix}_fwd_ms"] = 1e3 * time_fn(forward, reps=reps)
    row[f"{prefix}_train_ms"] = 1e3 * time_fn(step, reps=reps)
    record_pipelined(row, prefix, step, steps=2 * reps)
    row[f"{prefix}_mem_mib"] = peak_memory_mib()
    # The steady state, as for tinn: one more step, its peak counted alone.
    peak_memory_reset()
    row[f"{prefix}_step_base_mib"] = torch.cuda.memory_allocated() / 2**20 if x.is_cuda else None
    step()
    row[f"{prefix}_step_mem_mib"] = peak_memory_mib()


def record_speedups(row, prefix):
    """tinn's speedup over the baseline `prefix`: inference, step, pipelined step. The fp32 bmm baseline's
    ratios keep their unprefixed names (fwd_speedup, train_speedup, ...), which earlier results use."""
    key = "" if prefix == BMM_FP32.prefix else f"{prefix}_"
    row[f"{key}fwd_speedup"] = row[f"{prefix}_fwd_ms"] / row["tinn_fwd_ms"]
    row[f"{key}train_speedup"] = row[f"{prefix}_train_ms"] / row["tinn_train_ms"]
    row[f"{key}train_speedup_pipelined"] = row[f"{prefix}_train_pipelined_ms"] / row["tinn_train_pipelined_ms"]


def time_bmm(row, precision: BmmPrecision, net, x, ids, target, n, reps, fused_adam=False) -> bool:
    """The padded-bmm baseline in one precision, timed into row[precision.prefix_*] with tinn's speedups over
    it; False (and a note in the row) where the precision needs CUDA and x is elsewhere. TF32 is set for the
    baseline alone: off for the others, so the fp32 row stays fp32 whatever the process set before."""
    if precision.cuda_only and x.device.type != "cuda":
        row[f"{precision.prefix}_note"] = "skipped: CUDA only (a tensor-core mode)"
        return False
    with tf32_matmuls(precision.tf32):
        time_torch(row, precision.prefix, TorchBmmArray(net).to(x.device), x, ids, target, n, reps,
                   autocast_dtype=precision.autocast_dtype, fused_adam=fused_adam)
    record_speedups(row, precision.prefix)
    return True


def fastest_torch(row: dict, timing: str) -> tuple[str, float] | None:
    """(name, ms) of the fastest torch baseline in row for `timing` ("fwd_ms", "train_ms",
    "train_pipelined_ms"): the minimum over every baseline that ran (its key present and not None). None when
    none ran. On a tie the earlier baseline of TORCH_BASELINES wins."""
    times = [(name, row[f"{prefix}_{timing}"]) for prefix, name in TORCH_BASELINES
             if row.get(f"{prefix}_{timing}") is not None]
    return min(times, key=lambda t: t[1]) if times else None


def fastest_torch_columns(row: dict) -> dict:
    """For inference ("fwd"), the step ("train") and the pipelined step ("train_pipelined"):
    fastest_torch_<kind> (its name), fastest_torch_<kind>_ms, fastest_torch_<kind>_speedup (tinn's speedup over
    it) and <kind>_goal_met (that speedup reaches GOALS[kind]); all None where no torch baseline ran."""
    out = {}
    for kind, goal in GOALS.items():
        found = fastest_torch(row, f"{kind}_ms")
        name, ms = found if found else (None, None)
        speedup = ms / row[f"tinn_{kind}_ms"] if found else None
        out.update({f"fastest_torch_{kind}": name, f"fastest_torch_{kind}_ms": ms,
                    f"fastest_torch_{kind}_speedup": speedup,
                    f"{kind}_goal_met": None if speedup is None else speedup >= goal})
    return out


def bench_case(n: int, log2_samples: int, width: int, n_in: int, n_out: int, hidden: int, routing: str,
               reps: int, skip_torch: bool, unfused: bool = False, vmap: bool = True, peak: float | None = None,
               torch_limit_gib: float | None = None, grouped: bool = True,
               gmm_dtypes: tuple[str, ...] = ("bf16", "fp32"), fused_adam: bool = False) -> dict:
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    batch = 1 << log2_samples
    cfg = {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": hidden, "activation": "ReLU",
           "output_activation": "None"}
    net = NetworkArray(n_in, n_out, cfg, n_networks=n)
    x = torch.rand(batch, n_in, device=dev)
    target = torch.rand(batch, n_out, device=dev)
    ids = make_ids(batch, n, routing, dev)
    flop = net.flops_per_sample() * batch
    row = {"networks": n, "width": width, "samples": batch, "routing": routing}

    peak_memory_reset()
    with tinn.checks.disabled():
        row["tinn_fwd_ms"] = 1e3 * time_fn(lambda: net.inference(x, ids), reps=reps)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-3})
        settle(lambda: trainer.training_step(x, target, ids))
        row["tinn_train_ms"] = 1e3 * time_fn(lambda: trainer.training_step(x, target, ids), reps=reps)
        row["tinn_step_graphs"] = trainer.step_graph_status
        record_pipelined(row, "tinn", lambda: trainer.training_step(x, target, ids), steps=2 * reps)
        row["tinn_mem_mib"] = peak_memory_mib()
        # The steady state: one more step after the timed ones, peak counted from there (the first
        # calls of a process compile and warm up; the row above includes them).
        peak_memory_reset()
        row["tinn_step_base_mib"] = torch.cuda.memory_allocated() / 2**20 if dev.type == "cuda" else None
        trainer.training_step(x, target, ids)
        row["tinn_step_mem_mib"] = peak_memory_mib()
    row["tinn_fwd_tflops"] = flop / row["tinn_fwd_ms"] / 1e9
    row["tinn_train_tflops"] = 3 * flop / row["tinn_train_ms"] / 1e9
    row["tinn_infer_samples_per_s"] = batch / row["tinn_fwd_ms"] * 1e3
    row["tinn_train_samples_per_s"] = batch / row["tinn_train_ms"] * 1e3
    if peak:
        row["tinn_fwd_pct_peak"] = 100 * row["tinn_fwd_tflops"] / peak
        row["tinn_train_pct_peak"] = 100 * row["tinn_train_tflops"] / peak
    if unfused and getattr(net, "fused", False):
        net.fused = False
        with tinn.checks.disabled():
            row["unfused_fwd_ms"] = 1e3 * time_fn(lambda: net.inference(x, ids), reps=reps)
            row["unfused_train_ms"] = 1e3 * time_fn(lambda: trainer.training_step(x, target, ids), reps=reps)
        net.fused = True
    del trainer

    # Padded PyTorch batches grow with the busiest network; skip (and say so) past the memory limit.
    if torch_limit_gib is None:
        total = torch.cuda.get_device_properties(0).total_memory if dev.type == "cuda" else 16 * 2**30
        torch_limit_gib = 0.6 * total / 2**30
    too_big = padded_bytes(ids, n, max(width, n_in)) * (hidden + 3) * 2 > torch_limit_gib * 2**30
    if too_big:
        for prefix in [b.prefix for b in BMM_PRECISIONS] + (["vmap"] if vmap else []):
            row[f"{prefix}_note"] = f"skipped: padded batch over {torch_limit_gib:g} GiB"
    if not skip_torch and not too_big:
        for precision in BMM_PRECISIONS:
            time_bmm(row, precision, net, x, ids, target, n, reps, fused_adam=fused_adam)
        row["torch_fwd_tflops"] = flop / row["torch_fwd_ms"] / 1e9
        row["torch_train_tflops"] = 3 * flop / row["torch_train_ms"] / 1e9
        if vmap:
            time_torch(row, "vmap", VmapArray(net).to(dev), x, ids, target, n, reps, fused_adam=fused_adam)
            record_speedups(row, "vmap")
    if not skip_torch and grouped and dev.type == "cuda":
        for dtype, prefix in ((torch.bfloat16, "gmm_bf16"), (torch.float32, "gmm_fp32")):
            if prefix.removeprefix("gmm_") not in gmm_dtypes:
                continue
            try:
                time_torch(row, prefix, GroupedMMArray(net, dtype).to(dev), x, ids, target, n, reps,
                           fused_adam=fused_adam)
                record_speedups(row, prefix)
            except (RuntimeError, TypeError, NotImplementedError) as e:
                # A refusal can come after the forward's timing: drop the partial timings, so the fastest-torch
                # columns only ever pick a baseline that ran both.
                for key in [k for k in row if k.startswith(prefix + "_")]:
                    del row[key]
                row[f"{prefix}_note"] = f"refused: {str(e).splitlines()[0][:120]}"
            torch.cuda.empty_cache()
    row["torch_adam"] = "fused" if fused_adam else "default"
    row.update(fastest_torch_columns(row))
    return row


def table_row(row: dict) -> dict:
    """row with what the tables show beyond its numbers: each <kind>_goal_met as "met" / "not met"
    (<kind>_goal), the torch baselines that did not run (not_run: their names) and why (notes)."""
    text = {True: "met", False: "not met", None: None}
    not_run = [name for prefix, name in TORCH_BASELINES if row.get(f"{prefix}_note")]
    notes = [f"{name}: {row[f'{prefix}_note']}" for prefix, name in TORCH_BASELINES if row.get(f"{prefix}_note")]
    return {**row, **{f"{kind}_goal": text[row.get(f"{kind}_goal_met")] for kind in GOALS},
            "not_run": ", ".join(not_run) or None, "notes": "; ".join(notes) or None}


CASE_COLUMNS = [("networks", "N", "d"), ("width", "W", "d"), ("samples", "samples", "d"),
                ("routing", "routing", "s")]

# Two tables: the goals (the fastest torch route, tinn's speedup over it, met or not), then every baseline's
# times, speedups and memory.
GOAL_COLUMNS = CASE_COLUMNS + [
    ("tinn_train_ms", "tinn step ms", ".2f"), ("fastest_torch_train", "fastest torch step", "s"),
    ("fastest_torch_train_ms", "its ms", ".2f"), ("fastest_torch_train_speedup", "x fastest", ".2f"),
    ("train_goal", f"goal {GOALS['train']:g}x", "s"),
    ("tinn_fwd_ms", "tinn fwd ms", ".2f"), ("fastest_torch_fwd", "fastest torch fwd", "s"),
    ("fastest_torch_fwd_ms", "its ms", ".2f"), ("fastest_torch_fwd_speedup", "x fastest", ".2f"),
    ("fwd_goal", f"goal {GOALS['fwd']:g}x", "s"),
    ("tinn_train_pipelined_ms", "tinn step ms, pipelined", ".2f"),
    ("fastest_torch_train_pipelined", "fastest torch, pipelined", "s"),
    ("fastest_torch_train_pipelined_speedup", "x fastest, pipelined", ".2f"),
    ("train_pipelined_goal", f"goal {GOALS['train_pipelined']:g}x, pipelined", "s"),
    ("not_run", "torch baselines not run", "s")]

DETAIL_COLUMNS = CASE_COLUMNS + [
    ("torch_fwd_ms", "bmm fwd ms", ".2f"), ("bmm_tf32_fwd_ms", "bmm tf32 fwd", ".2f"),
    ("bmm_fp16_fwd_ms", "bmm fp16 fwd", ".2f"), ("vmap_fwd_ms", "vmap fwd ms", ".2f"),
    ("gmm_bf16_fwd_ms", "gmm bf16 fwd", ".2f"), ("unfused_fwd_ms", "unfused fwd", ".2f"),
    ("tinn_fwd_tflops", "tinn TF/s", ".2f"), ("tinn_fwd_pct_peak", "% peak", ".1f"),
    ("torch_fwd_tflops", "bmm TF/s", ".2f"),
    ("torch_train_ms", "bmm step ms", ".2f"), ("bmm_tf32_train_ms", "bmm tf32 step", ".2f"),
    ("bmm_fp16_train_ms", "bmm fp16 step", ".2f"),
    ("vmap_train_ms", "vmap step ms", ".2f"), ("unfused_train_ms", "unfused step", ".2f"),
    ("gmm_bf16_train_ms", "gmm bf16 step", ".2f"), ("gmm_fp32_train_ms", "gmm fp32 step", ".2f"),
    ("train_speedup", "step x bmm", ".2f"), ("bmm_tf32_train_speedup", "step x bmm tf32", ".2f"),
    ("bmm_fp16_train_speedup", "step x bmm fp16", ".2f"), ("vmap_train_speedup", "step x vmap", ".2f"),
    ("gmm_bf16_train_speedup", "step x gmm bf16", ".2f"),
    ("torch_train_pipelined_ms", "bmm step ms, pipelined", ".2f"),
    ("tinn_train_pipelined_spread_pct", "tinn spread %", ".1f"),
    ("torch_train_pipelined_spread_pct", "bmm spread %", ".1f"),
    ("train_speedup_pipelined", "step x bmm, pipelined", ".2f"),
    ("gmm_bf16_train_speedup_pipelined", "step x gmm bf16, pipelined", ".2f"),
    ("tinn_infer_samples_per_s", "infer samples/s", ".3g"),
    ("tinn_mem_mib", "tinn MiB", ".0f"), ("tinn_step_mem_mib", "tinn step MiB", ".0f"),
    ("torch_mem_mib", "bmm MiB", ".0f"), ("torch_step_mem_mib", "bmm step MiB", ".0f"),
    ("bmm_fp16_step_mem_mib", "bmm fp16 step MiB", ".0f"),
    ("vmap_mem_mib", "vmap MiB", ".0f"), ("gmm_bf16_mem_mib", "gmm bf16 MiB", ".0f"),
    ("gmm_bf16_step_mem_mib", "gmm bf16 step MiB", ".0f"), ("notes", "notes", "s")]


def run_isolated(case: dict, arch: str | None) -> dict:
    """`bench_case(**case)` in a fresh Python process; its row."""
    cmd = [sys.executable, "-m", "benchmarks.bench_mlp_array", "--case", json.dumps(case)] + (["--arch", arch] if arch else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("CASE "):
            return json.loads(line[5:])
    raise RuntimeError(f"case {case} failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None)
    p.add_argument("--networks", default=None, help="comma list (default GPU: 1,64,4096; CPU: 1,64)")
    p.add_argument("--log2-samples", default=None, help="comma list (default GPU: 20,22; CPU: 14)")
    p.add_argument("--widths", default="64")
    p.add_argument("--n-input", type=int, default=32)
    p.add_argument("--n-output", type=int, default=16)
    p.add_argument("--hidden-layers", type=int, default=2)
    p.add_argument("--routing", default="even", help="comma list of even, sorted, ragged")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--no-vmap", action="store_true", help="skip the torch.func.vmap baseline")
    p.add_argument("--no-grouped", action="store_true", help="skip the torch._grouped_mm baselines (bf16, fp32)")
    p.add_argument("--gmm-dtypes", default="bf16,fp32",
                   help="comma list of the torch._grouped_mm dtypes to time (bf16, fp32); fp32 is the slow one")
    p.add_argument("--torch-adam", choices=("default", "fused"), default="default",
                   help="the torch baselines' Adam: torch's default implementation, or fused=True")
    p.add_argument("--torch-limit-gib", type=float, default=None,
                   help="skip the padded torch baselines (bmm, vmap) where the padded-batch estimate, twice the "
                        "activations, exceeds this (default: 0.6 of the GPU's memory)")
    p.add_argument("--unfused", action="store_true", help="also time tinn's unfused CUDA kernels")
    p.add_argument("--suite", action="store_true",
                   help="the full grid: N in 1,64,1024,4096,16384 x widths 16,32,64,128 x even,ragged")
    p.add_argument("--peak-tflops", type=float, default=None, help="FP32 peak for the %% column (default: by GPU name)")
    p.add_argument("--isolate", action="store_true",
                   help="each case in a fresh process: no allocator state, library workspaces or caches of earlier "
                        "cases count towards a case's peak memory (the memory tables use it)")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)  # one case, as JSON (for --isolate)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.case:
        tinn.init(args.arch)
        print("CASE " + json.dumps(bench_case(**json.loads(args.case))), flush=True)
        return []
    arch = tinn.init(args.arch)
    gpu = arch == "cuda"
    if args.suite:
        args.networks = args.networks or ("1,64,1024,4096,16384" if gpu else "1,64,1024")
        args.widths = "16,32,64,128"
        args.routing = "even,ragged" if args.routing == "even" else args.routing
    networks = [int(v) for v in (args.networks or ("1,64,4096" if gpu else "1,64")).split(",")]
    sizes = [int(v) for v in (args.log2_samples or ("20,22" if gpu else "14")).split(",")]
    device = torch.cuda.get_device_name(0) if gpu else "cpu"
    peak = args.peak_tflops or (fp32_peak_tflops(device) if gpu else None)
    rows = []
    for routing in args.routing.split(","):
        for width in [int(w) for w in args.widths.split(",")]:
            for n in networks:
                for s in sizes:
                    case = dict(n=n, log2_samples=s, width=width, n_in=args.n_input, n_out=args.n_output,
                                hidden=args.hidden_layers, routing=routing, reps=args.reps,
                                skip_torch=args.skip_torch, unfused=args.unfused, vmap=not args.no_vmap,
                                peak=peak, grouped=not args.no_grouped, torch_limit_gib=args.torch_limit_gib,
                                gmm_dtypes=tuple(args.gmm_dtypes.split(",")), fused_adam=args.torch_adam == "fused")
                    row = run_isolated(case, args.arch) if args.isolate else bench_case(**case)
                    rows.append(row)
                    print(row, flush=True)
    print(f"\nMLP array: in={args.n_input} out={args.n_output} hidden={args.hidden_layers}, {device}"
          + (f", FP32 peak {peak:g} TFLOP/s" if peak else ""))
    print("\nAgainst the fastest torch baseline of each row:")
    table = [table_row(r) for r in rows]
    print_table(table, GOAL_COLUMNS)
    print("\nEvery baseline:")
    print_table(table, DETAIL_COLUMNS)
    write_json(args.json, {"device": device, "arch": arch, "fp32_peak_tflops": peak, "goals": GOALS, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
