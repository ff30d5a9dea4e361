"""Sharded arrays over 2 CPU processes with gloo, against the unsharded array in this process.

Each scenario starts two ranks of tests/distributed_worker.py (subprocesses on a free port, Taichi CPU
in each); their results are compared here with `part_factory(6)` run on the union of their batches.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch

import tinn
from tinn import step_graphs

import distributed_worker as W  # noqa: E402  (tests/ is on sys.path under pytest)

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")
HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2
# The ranks run tinn on the CPU (gloo). Gradients summed in another order, and Adam steps taken on them, are not
# comparable at these tolerances across archs, so the unsharded reference must run on the CPU too.
cpu_reference = pytest.mark.skipif(tinn.runtime.arch() != "cpu",
                                   reason="the ranks run on the CPU; the unsharded reference must run there too")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenario: str, out, timeout: float = 240, world: int = WORLD, settings: str = "", **env) -> list[dict]:
    """`settings`: TINN_SETTINGS fields for the ranks on top of this process's."""
    os.makedirs(out, exist_ok=True)
    port = _free_port()
    procs = []
    # The ranks build their networks in this process's precision (on CUDA the suite pins float32, conftest.py),
    # so that they compare with the references built here.
    precision = tinn.settings.current().precision
    tinn_settings = os.environ.get("TINN_SETTINGS", "")
    if precision != "auto" and "precision" not in tinn_settings:
        tinn_settings = ",".join(filter(None, [tinn_settings, f"precision={precision}"]))
    tinn_settings = ",".join(filter(None, [tinn_settings, settings]))
    for r in range(world):
        # The scenario's own settings (env) win over the defaults here, which win over this process's environment.
        e = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port), "TINN_ARCH": "cpu", "TINN_SETTINGS": tinn_settings,
             "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]),
             **{k: str(v) for k, v in env.items()}}
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "distributed_worker.py"), scenario, str(out)],
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0].decode(errors="replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"scenario {scenario!r} hung past {timeout} s")
    results = []
    for r in range(world):
        err = os.path.join(out, f"rank{r}.error")
        if os.path.exists(err):
            pytest.fail(f"rank {r} of {scenario!r} failed:\n{open(err).read()}\n{logs[r][-3000:]}")
        path = os.path.join(out, f"rank{r}.pt")
        if not os.path.exists(path) and procs[r].returncode != 0:
            pytest.fail(f"rank {r} of {scenario!r} exited with code {procs[r].returncode} and no result:\n"
                        f"{logs[r][-4000:]}")
        result = torch.load(path, weights_only=False) if os.path.exists(path) else None
        if isinstance(result, dict):
            result["returncode"] = procs[r].returncode
        results.append(result)
    return results


@pytest.fixture(scope="module", params=[False, True], ids=["caller_order", "grouped"])
def equal_run(request, tmp_path_factory):
    """The `equal` scenario, its local models in the caller's order and grouped by network id
    (`tuning.group_by_network`, the CUDA default for grid arrays)."""
    grouped = request.param
    results = run_ranks("equal", tmp_path_factory.mktemp("equal"),
                        settings=f"group_by_network={'true' if grouped else 'false'}")
    assert all(r[f"{tag}/grouped"] == grouped for r in results for tag in W.EQUAL_MODES)
    return results


def _full(shared):
    """The unsharded model of `shared` (False, True or a tag of `W.EQUAL_MODES`)."""
    return W.factory(**W.EQUAL_MODES[_tag(shared)])(W.N_NETWORKS)


def _tag(shared) -> str:
    return shared if isinstance(shared, str) else "shared" if shared else "sharded"


def _rows(name: str, full: torch.Tensor, owned, shared):
    """The rows of a full table a rank holds (all of a replicated one: a shared encoding's or network's)."""
    part = {"shared": "encoding", "shared_network": "network"}.get(_tag(shared))
    return full if (part and name.startswith(part)) else full[owned]


def _reference_autograd(model, batches, scale_loss):
    xs = torch.cat([b[0] for b in batches]).requires_grad_()
    ids = torch.cat([b[1] for b in batches])
    w = torch.cat([b[3] for b in batches])
    for p in model.parameters():
        p.grad = None
    y = model(xs, ids)
    ((y * w).sum() * scale_loss).backward()
    return y.detach(), xs.grad, {n: p.grad.clone() for n, p in model.named_parameters()}


@cpu_reference
@pytest.mark.parametrize("shared", [False, True, "shared_network"])
def test_forward_gradients_and_steps_equal_unsharded(equal_run, shared):
    tag = _tag(shared)
    full = _full(shared)
    owned = [r["owned"] for r in equal_run]
    assert owned == [[0, 1, 2], [3, 4, 5]]
    for r, res in enumerate(equal_run):  # the global initialisation: each rank holds the unsharded rows
        for n, p in full.named_parameters():
            assert torch.equal(res[f"{tag}/init"][f"local.{n}"], _rows(n, p.detach(), owned[r], shared)), n
    cases = {"autograd": dict(step=0), "skew": dict(step=1, skew=True)}
    for case, kw in cases.items():
        batches = [W.batch(r, kw["step"], skew=kw.get("skew", False)) for r in range(WORLD)]
        # Mean over ranks (gradients="mean"): the unsharded gradient of the mean of the ranks' losses.
        y, dx, grads = _reference_autograd(full, batches, 1.0 / WORLD)
        for r, res in enumerate(equal_run):
            got = res[f"{tag}/{case}"]
            sl = slice(r * W.BATCH, (r + 1) * W.BATCH)
            torch.testing.assert_close(got["y"], y[sl], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got["dx"], dx[sl] * WORLD, rtol=1e-4, atol=1e-6)
            for n, g in grads.items():
                torch.testing.assert_close(got["grads"][f"local.{n}"], _rows(n, g, owned[r], shared),
                                           rtol=1e-4, atol=1e-7, msg=f"{case} {n}")
    if case == "skew":  # rank 0 owned 90% of both ranks' samples
        assert sum(int((b[1] < 3).sum()) for b in batches) > 1.5 * W.BATCH
    # Rank 1 without samples: its output is empty and both ranks' gradients are half the unsharded ones.
    batches = [W.batch(0, 2), W.batch(1, 2, size=0)]
    y, dx, grads = _reference_autograd(full, batches, 1.0 / WORLD)
    assert equal_run[1][f"{tag}/empty"]["y"].shape == (0, 3)
    for r, res in enumerate(equal_run):
        got = res[f"{tag}/empty"]
        if r == 0:
            torch.testing.assert_close(got["y"], y, rtol=1e-5, atol=1e-6)
        for n, g in grads.items():
            torch.testing.assert_close(got["grads"][f"local.{n}"], _rows(n, g, owned[r], shared), rtol=1e-4, atol=1e-7)
    with torch.no_grad():
        xs = torch.cat([W.batch(r, 3)[0] for r in range(WORLD)])
        ids = torch.cat([W.batch(r, 3)[1] for r in range(WORLD)])
        y = full(xs, ids)
    for r, res in enumerate(equal_run):
        torch.testing.assert_close(res[f"{tag}/inference"], y[r * W.BATCH:(r + 1) * W.BATCH], rtol=1e-5, atol=1e-6)


def _check_against_reference(got: dict, full, batches, r: int, owned, shared: bool, what: str, atol: float = 1e-7):
    """One rank's autograd results (y, dx, gradients) against the unsharded array on every rank's batch (atol:
    the gradients' absolute tolerance; GPU atomics add in an order of their own)."""
    dev = tinn.runtime.device()
    y, dx, grads = _reference_autograd(full, [tuple(v.to(dev) for v in b) for b in batches], 1.0 / WORLD)
    start = sum(b[0].shape[0] for b in batches[:r])
    sl = slice(start, start + batches[r][0].shape[0])
    torch.testing.assert_close(got["y"], y[sl].cpu(), rtol=1e-5, atol=1e-6, msg=what)
    torch.testing.assert_close(got["dx"], dx[sl].cpu() * WORLD, rtol=1e-4, atol=1e-6, msg=what)
    for n, g in grads.items():
        torch.testing.assert_close(got["grads"][f"local.{n}"], _rows(n, g, owned, shared).cpu(), rtol=1e-4,
                                   atol=atol, msg=f"{what} {n}")


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    # The Triton case runs the bucketing kernels in Triton's interpreter on the ranks' CPUs.
    return run_ranks("pipeline", tmp_path_factory.mktemp("pipeline"), TRITON_INTERPRET=1)


def _check_pipeline(runs, shared: bool, triton_cases, atol: float = 1e-7):
    tag = "shared" if shared else "sharded"
    full = _full(shared)
    for name in W.PIPELINE_CASES:
        owned = [res[f"{tag}/{name}/owned"] for res in runs]
        assert [res[f"{tag}/{name}/triton"] for res in runs] == [name in triton_cases] * WORLD
        assert sorted(owned[0] + owned[1]) == list(range(W.N_NETWORKS))
        if name == "uneven3":
            assert owned == [[0, 5], [1, 2, 3, 4]]
        for case in ("plain", "to_rank0"):
            batches = [W.pipeline_batches(r, owned[0])[case] for r in range(WORLD)]
            if case == "to_rank0":
                assert all(bool(torch.isin(b[1], torch.tensor(owned[0])).all()) for b in batches)
                assert batches[1][0].shape[0] == 2
            for r, res in enumerate(runs):
                _check_against_reference(res[f"{tag}/{name}/{case}"], full, batches, r, owned[r], shared,
                                         f"{name} {case} rank {r}", atol)
    # Chunked and unchunked: the same numbers (the local kernels see the same samples, in other groupings).
    for r, res in enumerate(runs):
        a, b = res[f"{tag}/chunks1/plain"], res[f"{tag}/chunks3/plain"]
        torch.testing.assert_close(a["y"], b["y"], rtol=1e-6, atol=1e-7)
        for n in a["grads"]:
            torch.testing.assert_close(a["grads"][n], b["grads"][n], rtol=1e-5, atol=atol / 10)


@cpu_reference
@pytest.mark.parametrize("shared", [False, True])
def test_chunked_uneven_and_empty_exchanges_equal_unsharded(pipeline_run, shared):
    """Every exchange path (chunks of 1, 3 and 2 with the Triton kernels, uneven ownership) gives the unsharded
    array's outputs, input gradients and table gradients (replicated ones all-reduced), also when every sample
    goes to rank 0 and rank 1 receives nothing while its own 2-sample batch leaves chunks empty."""
    _check_pipeline(pipeline_run, shared, triton_cases={"triton2"})


two_gpus = pytest.mark.skipif(tinn.runtime.arch() != "cuda" or torch.cuda.device_count() < 2
                              or not torch.distributed.is_nccl_available(),
                              reason="needs tinn on CUDA, two GPUs and NCCL")


@two_gpus
@pytest.mark.parametrize("shared", [False, True])
def test_exchanges_on_two_gpus_equal_unsharded(tmp_path, shared):
    """The same scenario over NCCL, one GPU per rank: the Triton bucketing kernels (every case on CUDA), the
    asynchronous all_to_alls and all-reduces against the unsharded array on this process's GPU."""
    runs = run_ranks("pipeline", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0)
    _check_pipeline(runs, shared, triton_cases=set(W.PIPELINE_CASES), atol=1e-6)


@two_gpus
def test_replicated_reduces_over_nccl_like_one_process(tmp_path):
    """The Replicated scenario over NCCL, one GPU per rank: the bucketed, asynchronous all-reduce in float32,
    bfloat16 and float16, and Trainer steps (the fused loss where the MLP has it), against this process's GPU."""
    runs = run_ranks("replicated", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0)
    _check_replicated(runs, atol=1e-6, trained_atol=1e-5)


@two_gpus
def test_replicated_reduces_by_network_ranges_over_nccl(tmp_path):
    """The same over NCCL, one GPU per rank, with the tensor-core kernels: the ranges' all-reduces run on NCCL's
    stream while the backward computes the next range (against one bucket)."""
    runs = run_ranks("pieces", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0)
    _check_pieces(runs, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(tinn.runtime.arch() != "cuda" or not torch.distributed.is_nccl_available(),
                    reason="host syncs only exist on a GPU (NCCL)")
def test_sharded_step_syncs_the_host_once(tmp_path):
    """torch's sync debug mode over a one-rank NCCL group: the forward's header is the step's one host
    synchronisation (waited for through an event, counted too); the backward has none (it raised on any), chunked
    or not; steps routing ahead read one header each."""
    res = run_ranks("syncs", tmp_path, world=1, TINN_ARCH="cuda", TRITON_INTERPRET=0)[0]
    for chunks in (1, 2):
        assert res[chunks]["forward"] == 1 and res[chunks]["step"] == 1, res[chunks]["messages"]
        assert res[chunks]["ahead"] == 3, res[chunks]["messages"]


@cpu_reference
def test_contract_announces_dx_and_profiles_phases(pipeline_run):
    """A contract backward asking for dx that no forward announced is a clear error on every rank (which then
    still make the same calls); announced, it equals autograd's. The phase profile of trainer steps covers
    exchange, compute, idle (the header) and other. A Replicated part's gradients are the mean over ranks."""
    from tinn.networks import NetworkArray

    for r, res in enumerate(pipeline_run):
        assert res["unannounced"].startswith(f"rank {r}: ShardedPart.backward was asked for dx"), res["unannounced"]
        assert "need_dx=True" in res["unannounced"]
        want = res["announced_autograd"]
        torch.testing.assert_close(res["announced"]["y"], want["y"])
        torch.testing.assert_close(res["announced"]["dx"], want["dx"], rtol=1e-5, atol=1e-7)
        for n, g in res["announced"]["grads"].items():
            torch.testing.assert_close(g, want["grads"][n], rtol=1e-5, atol=1e-8, msg=n)
        profile = res["profile"]
        assert set(profile) == {"exchange", "compute", "reduce", "idle", "optimizer", "other"}
        assert all(v >= 0 for v in profile.values()) and profile["compute"] > 0 and profile["idle"] > 0
        marks = res["profile_marks"]
        assert marks.count("idle") == 2 and marks[-1] == "other"  # one header per step, none in the backward
    rep = NetworkArray(2, 3, W.NETWORK, n_networks=W.N_NETWORKS, seed=3)
    grads = {}
    for r in range(WORLD):
        x, ids, _, w = W.batch(r, 5)
        y, dx, g = _reference_autograd(rep, [(x, ids, None, w)], 1.0)
        torch.testing.assert_close(pipeline_run[r]["replicated"]["y"], y, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pipeline_run[r]["replicated"]["dx"], dx, rtol=1e-5, atol=1e-7)
        for n, v in g.items():
            grads[n] = grads.get(n, 0) + v / WORLD
    for res in pipeline_run:
        for n, v in grads.items():
            torch.testing.assert_close(res["replicated"]["grads"][f"inner.{n}"], v, rtol=1e-4, atol=1e-7)


@pytest.fixture(scope="module")
def pieces_run(tmp_path_factory):
    return run_ranks("pieces", tmp_path_factory.mktemp("pieces"), TRITON_INTERPRET=1)


def _check_pieces(runs, rtol: float = 1e-6, atol: float = 1e-8):
    """The all-reduce cut into 4 ranges of networks against one bucket, per rank (rtol, atol: GPU atomics add in
    an order of their own); the Trainer's steps op by op, step graphs on or off."""
    for rank, res in enumerate(runs):
        for name in ("array", "grid+array"):
            one, cut, eager = res[(1, name)], res[(4, name)], res[("4 eager", name)]
            assert one["counts"] == {"handed": 0, "reductions": 1}, (rank, name, one["counts"])
            # 6 networks in 4 ranges, each its own all-reduce; the grid's table in one bucket after them
            for c in (cut, eager):
                assert c["counts"] == {"handed": 4, "reductions": 4 + (name == "grid+array")}, (rank, name)
                torch.testing.assert_close(c["y"], one["y"], rtol=0, atol=0)
                for n, g in one["grads"].items():
                    assert g.abs().max() > 0, (name, n)
                    torch.testing.assert_close(c["grads"][n], g, rtol=rtol, atol=atol, msg=f"{name} {n}")
        for dtype in W.REDUCE_DTYPES:
            one, cut, eager = (res[(k, "trained", dtype)] for k in (1, 4, "4 eager"))
            steps = W.PIECE_STEPS  # each hands over and reduces 4 ranges
            for c in (cut, eager):
                assert c["counts"] == {"handed": 4 * steps, "reductions": 4 * steps}, (dtype, c["counts"])
                assert c["graphs"] == "steps issued op by op", c["graphs"]
            for c in (cut, eager):
                assert c["losses"] == pytest.approx(one["losses"], rel=rtol, abs=atol)
                for n, p in one["params"].items():
                    torch.testing.assert_close(c["params"][n], p, rtol=rtol, atol=atol, msg=f"{dtype} {n}")
        one, cut = res[(1, "empty")], res[(4, "empty")]
        assert cut["counts"] == {"handed": 4 if rank == 0 else 0, "reductions": 4}, (rank, cut["counts"])
        for n, g in one["grads"].items():
            torch.testing.assert_close(cut["grads"][n], g, rtol=rtol, atol=atol, msg=n)
    for key in runs[0]:  # the reduced gradients and trained tables are every rank's
        if key[1] in ("array", "grid+array", "empty"):
            for n, g in runs[0][key]["grads"].items():
                torch.testing.assert_close(runs[1][key]["grads"][n], g, rtol=0, atol=0, msg=f"{key} {n}")


def _check_captured(runs, captured: bool, rtol: float, atol: float):
    """Each case's steps with `tuning.replicated_step_graphs` on against off: the same losses and tables; `captured`:
    on CUDA over NCCL, each shape captured at its second step and every later step of it replayed."""
    for rank, res in enumerate(runs):
        for split, pieces in W.CAPTURED_CASES:
            eager, on = res[(False, split, pieces)], res[(True, split, pieces)]
            case = (rank, split, pieces)
            assert eager["status"] == "steps issued op by op" and eager["replays"] == 0, (case, eager["status"])
            if captured:
                # Each shape's second step is captured (the trainer's step count after it: 2, then the switch + 2).
                # The first shape's trial keeps its graph on both ranks (these steps are bound by the host): its
                # capture's replay, TRIAL_STEPS + 1 timed replays and the two steps after the decision; then the
                # second shape's capture.
                assert on["captures"] == [2, W.CAPTURED_SWITCH + 2], (case, on["captures"], on["status"])
                assert not on["eager_shapes"], (case, on["eager_shapes"])
                trial = 1 + step_graphs.TRIAL_STEPS
                after = W.CAPTURED_SWITCH - 2 - 2 * trial
                assert on["replays"] == 1 + trial + after + 1, (case, on["replays"])
                assert on["status"] == "captured 2 time(s)", (case, on["status"])
            else:
                assert on["status"] == "steps issued op by op" and on["replays"] == 0, (case, on["status"])
            assert on["losses"] == pytest.approx(eager["losses"], rel=rtol, abs=atol), case
            for n, p in eager["params"].items():
                assert p.abs().max() > 0
                torch.testing.assert_close(on["params"][n], p, rtol=rtol, atol=atol, msg=f"{case} {n}")
    for key in W.CAPTURED_CASES:  # every rank holds the same tables
        for graphs in (False, True):
            for n, p in runs[0][(graphs, *key)]["params"].items():
                assert torch.equal(runs[1][(graphs, *key)]["params"][n], p), (graphs, key, n)


def test_replicated_steps_with_graphs_asked_for_run_op_by_op_over_gloo(tmp_path):
    """`tuning.replicated_step_graphs` over gloo: a CPU collective cannot be captured, so the steps run op by op
    and train as with it off (Triton's interpreter)."""
    _check_captured(run_ranks("captured", tmp_path, TRITON_INTERPRET=1), captured=False, rtol=0, atol=0)


@two_gpus
def test_replicated_steps_captured_with_their_collectives_over_nccl(tmp_path):
    """Over NCCL, one GPU per rank: the Trainer's steps captured as CUDA graphs with their all-reduces (one bucket,
    4 ranges) or the split optimizer's reduce-scatter and all-gather, the step graphs' trial (steps op by op between
    the capture and the replays, each rank deciding by its own timing), replays, each loss read on the host; two
    batch shapes a rank, each rank's own: the same losses and tables as op by op."""
    runs = run_ranks("captured", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0)
    _check_captured(runs, captured=True, rtol=1e-4, atol=1e-6)


def test_replicated_reduces_by_network_ranges_like_one_bucket(pieces_run):
    """The all-reduce of a tensor-core array's gradient cut into 4 ranges of networks, each handed over by the
    backward as it finishes them (tinn/gradient_pieces.py), gives the one bucket's gradients, losses and trained
    tables, in every reduce dtype; a grid's table goes in a bucket after them; a rank with an empty batch, whose
    backward hands nothing over, issues the same ranges itself (no hang, the same gradient). Over gloo, with
    Triton's interpreter."""
    _check_pieces(pieces_run)


def _check_replicated(runs, atol: float = 1e-9, trained_atol: float = 1e-6):
    """Each rank's Replicated results against single-process references where tinn runs here (atol: the float32
    reduce's absolute tolerance, and a floor under the narrower dtypes' rounding bound; GPU atomics add in an
    order of their own)."""
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    full = W.replicated_factory()
    # Unit roundoff of each dtype: the scaled gradients and their sum each round once.
    roundoff = {"float32": 0.0, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
    per_rank = []
    for r, res in enumerate(runs):
        y, dx, grads = _reference_autograd(full, [tuple(v.to(dev) for v in W.batch(r, 6))], 1.0)
        per_rank.append({n: g.cpu() for n, g in grads.items()})
        for dtype in roundoff:  # forward and dx are each rank's own
            torch.testing.assert_close(res[dtype]["y"], y.cpu(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(res[dtype]["dx"], dx.cpu(), rtol=1e-5, atol=1e-7)
    for res in runs:
        for dtype, u in roundoff.items():
            for n in per_rank[0]:
                got = res[dtype]["grads"][f"inner.{n}"]
                want = sum(g[n] for g in per_rank) / WORLD
                if dtype == "float32":
                    torch.testing.assert_close(got, want, rtol=1e-6, atol=atol, msg=n)
                    continue
                size = sum(g[n].abs() for g in per_rank) / WORLD
                assert bool(((got - want).abs() <= 2 * u * size + max(atol, 1e-7)).all()), (dtype, n)
                low = getattr(torch, dtype)
                assert torch.equal(got, got.to(low).float()), (dtype, n)  # the sum came back in that dtype
        assert "reduce_dtype='int8' is not supported; allowed: ['float32', 'bfloat16', 'float16']" in res["bad_dtype"]
    # bfloat16 rounded something: the gradients differ from the float32 reduce's.
    assert any(not torch.equal(runs[0]["bfloat16"]["grads"][n], runs[0]["float32"]["grads"][n])
               for n in runs[0]["float32"]["grads"])
    net = NetworkArray(2, 3, W.NETWORK, n_networks=W.N_NETWORKS, seed=3)
    trainer = Trainer(net, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    losses = []
    for step in range(2):
        bs = [tuple(v.to(dev) for v in W.batch(r, 60 + step)) for r in range(WORLD)]
        losses.append(float(trainer.training_step(torch.cat([b[0] for b in bs]), torch.cat([b[2] for b in bs]),
                                                  torch.cat([b[1] for b in bs]))))
    for res in runs:
        for n, p in net.named_parameters():
            torch.testing.assert_close(res["trained"][f"inner.{n}"], p.detach().cpu(), rtol=1e-4, atol=trained_atol,
                                       msg=n)
    torch.testing.assert_close(torch.tensor([sum(x) / WORLD for x in zip(*[r["losses"] for r in runs])]),
                               torch.tensor(losses), rtol=1e-5, atol=1e-7)
    net = NetworkArray(2, 3, W.NETWORK, n_networks=W.N_NETWORKS, seed=3)
    x, ids, t, _ = (v.to(dev) for v in W.batch(0, 70))
    Trainer(net, optimizer={"otype": "Adam"}).training_step(x, t, ids, run_optimizer=False)
    for res in runs:
        for n, p in net.named_parameters():
            torch.testing.assert_close(res["empty_grads"][f"inner.{n}"], p.grad.cpu() / WORLD, rtol=1e-5,
                                       atol=atol, msg=n)


@cpu_reference
def test_replicated_reduces_in_one_bucket_in_each_dtype(tmp_path):
    """Replicated (data parallel): the all-reduced gradients are the mean of the ranks' single-process gradients,
    to float32 rounding with a float32 reduce, within the reduce dtype's rounding (and representable in it)
    with bfloat16 / float16; Trainer steps (the contract's loss-seeded backward) equal unsharded steps on the
    union of the ranks' batches; a bad reduce_dtype is a clear error."""
    _check_replicated(run_ranks("replicated", tmp_path))


@cpu_reference
def test_compact_tables_train_sharded_like_unsharded(tmp_path):
    """Owned compact (bfloat16) grid tables: the sharded forward and sparse gradients equal the unsharded ones
    (to one bfloat16 step: sums taken in another order round apart), sharded Trainer steps train them, and a
    replicated compact table is refused by name."""
    from tinn.trainer import Trainer

    runs = run_ranks("compact", tmp_path)
    full = W.compact_factory()(W.N_NETWORKS)
    batches = [W.batch(r, 0) for r in range(WORLD)]
    y, _, grads = _reference_autograd(full, batches, 1.0 / WORLD)
    trainer = Trainer(full, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    bs = [W.batch(r, 10) for r in range(WORLD)]
    first_loss = float(trainer.training_step(torch.cat([b[0] for b in bs]), torch.cat([b[2] for b in bs]),
                                             torch.cat([b[1] for b in bs])))
    for r, res in enumerate(runs):
        assert res["dtypes"]["local.encoding.params"] == torch.bfloat16
        torch.testing.assert_close(res["y"], y[r * W.BATCH:(r + 1) * W.BATCH], rtol=1e-5, atol=1e-6)
        for n, g in grads.items():
            want = _rows(n, (g.coalesce().to_dense() if g.is_sparse else g).float(), res["owned"], False)
            got = res["grads"][f"local.{n}"]
            if g.is_sparse:
                assert bool(((got - want).abs() <= want.abs() * 2.0 ** -7 + 1e-7).all()), n
                assert torch.equal(got != 0, want != 0) and int((want != 0).sum()) > 20, n
            else:
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7, msg=n)
        assert res["moved"] > 0.05  # the lazy Adam stepped the touched entries
        assert "compact (bfloat16) and replicated" in res["replicated_error"]
        assert "table_dtype='float32'" in res["replicated_error"]
    # Each rank's first loss is its own batch's; their mean is the unsharded loss.
    assert abs(sum(res["losses"][0] for res in runs) / WORLD - first_loss) <= 1e-5 * abs(first_loss)


@cpu_reference
@pytest.mark.parametrize("shared", [False, True, "shared_network"])
def test_trainer_steps_equal_unsharded(equal_run, shared):
    from tinn.trainer import Trainer

    tag = _tag(shared)
    full = _full(shared)
    trainer = Trainer(full, optimizer={"otype": "Adam", "learning_rate": 1e-2})
    losses = []
    for step in range(3):
        bs = [W.batch(r, 10 + step) for r in range(WORLD)]
        losses.append(float(trainer.training_step(torch.cat([b[0] for b in bs]), torch.cat([b[2] for b in bs]),
                                                  torch.cat([b[1] for b in bs]))))
    owned = [r["owned"] for r in equal_run]
    for r, res in enumerate(equal_run):
        for n, p in full.named_parameters():
            torch.testing.assert_close(res[f"{tag}/trained"][f"local.{n}"], _rows(n, p.detach(), owned[r], shared),
                                       rtol=1e-4, atol=1e-6, msg=n)
    # The Trainer's step computes each sample's loss at its owner and returns the mean over ranks of each rank's
    # loss, the same on every rank: with equal batches, the unsharded loss.
    for r, res in enumerate(equal_run):
        torch.testing.assert_close(torch.tensor(res[f"{tag}/losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-7)
    # The empty rank's trainer step: gradients are half the unsharded gradient of rank 0's batch.
    trainer.optimizer.zero_grad()
    x, ids, t, _ = W.batch(0, 20)
    trainer.training_step(x, t, ids, run_optimizer=False)
    for r, res in enumerate(equal_run):
        for n, p in full.named_parameters():
            torch.testing.assert_close(res[f"{tag}/trainer_empty_grads"][f"local.{n}"],
                                       _rows(n, p.grad / WORLD, owned[r], shared), rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_checkpoint_round_trip_gather_and_other_world_size(tmp_path):
    import tinn.distributed as td
    from tinn.errors import CheckpointError

    res = run_ranks("checkpoint", tmp_path)
    directory = tmp_path / "ckpt"
    manifest = td.read_manifest(directory)
    assert manifest["world_size"] == WORLD and manifest["ownership"]["ranges"] == [[0, 3], [3, 6]]
    assert [f["file"] for f in manifest["files"]] == ["rank-00000.tinn", "rank-00001.tinn"]
    assert manifest["step"] == 2 and manifest["config"] == {"tag": "ckpt"}
    for r in res:
        # Resumed: the same state, and the next step gives the same loss and the same parameters bit for bit.
        assert r["same_state"] and r["same_after_step"], r
        assert r["losses"][0] == r["losses"][1]
        # The copy with a damaged rank-1 file: every rank refused and changed nothing.
        assert "nothing was loaded on any rank" in r["damaged"] and "rank 1" in r["damaged"], r["damaged"]
        assert "sha256/size differ" in r["damaged"] and r["untouched"]
    with pytest.raises(CheckpointError, match="sha256/size differ from the manifest"):
        td.gather_model(tmp_path / "damaged", W.factory())
    # Gathered into one process: the unsharded array holds each rank's rows (saved after 2 steps; the
    # workers' parameters were taken after a third step, so compare with the files' own contents).
    full = td.gather_model(directory, W.factory())
    from tinn import checkpoint as C
    for r in range(WORLD):
        sections, meta = C.load(directory / f"rank-0000{r}.tinn")
        assert meta["rank"] == r
        for key in manifest["sharded_keys"]:
            name = key[len("local."):]
            assert torch.equal(dict(full.named_parameters())[name].detach()[3 * r:3 * r + 3].cpu(),
                               sections["model"][key])
    # One process resuming the 2-rank checkpoint: a clear error; resharding the gathered state works.
    one = run_ranks("resume_one_rank", tmp_path / "one", world=1, CKPT=directory)
    assert "saved by 2 ranks, resumed on 1" in one[0]["error"] and "--nproc_per_node 2" in one[0]["error"]
    x, ids, _, _ = W.batch(0, 50)
    with torch.no_grad():  # gathered where tinn runs here; the rank ran on the CPU
        dev = tinn.runtime.device()
        torch.testing.assert_close(one[0]["y"], full(x.to(dev), ids.to(dev)).cpu(), rtol=1e-5, atol=1e-6)


def test_rank_exit_raises_on_the_other_rank(tmp_path):
    """The peer's exit is detected, not waited out: the collective timeout is far longer than the whole run may
    take (run_ranks fails a run that hangs)."""
    res = run_ranks("exit", tmp_path, TIMEOUT_S=3600, timeout=120)
    assert res[0]["result"].startswith("DistributedError: rank 0:"), res[0]
    assert "another rank exited" in res[0]["result"]


@pytest.mark.slow
def test_stalled_rank_times_out(tmp_path):
    """A peer that stays alive without joining the collective: rank 0 raises (the timeout is its only way out),
    and it does so while the peer is still stalled."""
    res = run_ranks("stall", tmp_path, TIMEOUT_S=3, STALL_SECONDS=90, timeout=150)
    assert res[0]["result"].startswith("DistributedError: rank 0:"), res[0]
    assert "within the timeout" in res[0]["result"]
    assert res[1] == {"saw_rank0_finish_while_stalled": True, "returncode": 0}, res[1]


def test_mismatched_config_is_a_clear_error(tmp_path):
    res = run_ranks("mismatch", tmp_path)
    for r, other in ((0, 1), (1, 0)):
        text = res[r]["result"]
        assert text.startswith(f"ConfigError: rank {r}: ranks [{other}] built a different sharded model"), text
        assert "n_neurons" in text or "tables" in text
        assert res[r]["chunks"].startswith(f"ConfigError: rank {r}: ranks [{other}] built a different sharded"), \
            res[r]["chunks"]
        assert f"chunks: {1 + r} here, {1 + other} on rank {other}" in res[r]["chunks"]
        assert "chunks=0 must be a positive integer" in res[r]["bad_chunks"]
        assert "exchange_kernels='cub' is not supported; allowed: ['auto', 'triton', 'torch']" in res[r]["bad_kernels"]


def test_a_part_alive_at_shutdown_holds_no_process_group(tmp_path):
    res = run_ranks("shutdown", tmp_path)
    for r in range(WORLD):
        assert res[r]["held"] == [] and res[r]["initialized"] is False, res[r]
        assert res[r]["after"].startswith("ConfigError: tinn.distributed needs a process group"), res[r]
        assert res[r]["returncode"] == 0


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    """float16 scalers: rank 0's gradients overflowed, rank 1's did not; after the sharded backward both hold
    the overflow, so the shared encoding (replicated on both ranks) is skipped alike and cannot drift."""
    res = run_ranks("overflow", tmp_path)
    assert [r["found_inf"] for r in res] == [1.0, 1.0]
    # The step with the loss at the owners: rank 1 overflowed this time; then neither did.
    assert [r["at_owners"] for r in res] == [1.0, 1.0]
    assert [r["at_owners_clean"] for r in res] == [0.0, 0.0]
    # The loss summed over ranks in the same all-reduce: one value on every rank.
    for key in ("at_owners_loss", "at_owners_clean_loss"):
        assert res[0][key] == res[1][key] and 0 < res[0][key] < 1, key


def test_ranks_out_of_step_raise_together(tmp_path):
    res = run_ranks("disagree", tmp_path)
    for r in range(WORLD):
        assert res[r]["result"].startswith(f"DistributedError: rank {r}: ranks disagree"), res[r]
        assert "gradients enabled per rank = [1, 0]" in res[r]["result"]
        # A step with the loss at the owners on one rank, a forward on the other: the header's call kind differs.
        assert res[r]["loss_at_owners"].startswith(f"DistributedError: rank {r}: ranks disagree"), res[r]
        assert "call kind" in res[r]["loss_at_owners"] and "per rank = [1, 0]" in res[r]["loss_at_owners"]


@pytest.fixture(scope="module")
def owner_loss_run(tmp_path_factory):
    return run_ranks("owner_loss", tmp_path_factory.mktemp("owner_loss"), TRITON_INTERPRET=1)


@pytest.mark.parametrize("case", list(W.OWNER_LOSS_BATCHES))
@pytest.mark.parametrize("name", list(W.OWNER_LOSS_CASES))
def test_loss_at_owners_equals_forward_then_backward(owner_loss_run, name, case):
    """Each sample's loss computed by its network's owner gives the gradients of the forward, the caller's loss
    and the backward: with equal, unequal and empty per-rank batches (each sample weighted by its own rank's
    batch), "mean" and "sum" over ranks, and chunked, uneven ownership. The value returned is the same on every
    rank: the mean (the sum) over ranks of each rank's own loss."""
    _check_owner_loss(owner_loss_run, name, case, rtol=1e-5, atol=1e-8)


def _check_owner_loss(results, name, case, rtol, atol):
    combine = sum if name == "sum" else (lambda v: sum(v) / WORLD)
    # Every case's senders sort their rows by network too (the owners unpack them grouped); L = the most networks
    # a rank owns.
    uneven = "assignment" in W.OWNER_LOSS_CASES[name]
    most = max(map(W.UNEVEN.count, (0, 1))) if uneven else W.N_NETWORKS // WORLD
    assert results[0][f"{name}/by_network"] == (0 if name == "unsorted" else most)
    for otype in ("L2", "RelativeL2"):
        runs = [r[f"{name}/{case}/{otype}"] for r in results]
        assert results[0][f"{name}/fuses"]
        for r, run in enumerate(runs):
            assert len(run["at_owners"]) == len(run["forward"]) == 2
            for got, want in zip(run["at_owners"], run["forward"]):
                assert float(want.abs().max()) > 0, (r, otype)
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=f"rank {r} {otype}")
        if name == "grouped":
            # The local part groups its batch by network: the senders' sort is the step's only one, the owners'
            # rows arriving grouped.
            assert [r[f"{name}/{case}/{otype}/sorts"] for r in results] == [1] * WORLD
        want_value = combine([run["own"] for run in runs])
        for run in runs:
            assert run["value"] == pytest.approx(want_value, rel=rtol), otype


@two_gpus
def test_loss_at_owners_over_nccl_equals_forward_then_backward(tmp_path):
    """The same scenario over NCCL, one GPU per rank (the Triton bucketing of inputs and targets together)."""
    runs = run_ranks("owner_loss", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0)
    for name in W.OWNER_LOSS_CASES:
        for case in W.OWNER_LOSS_BATCHES:
            _check_owner_loss(runs, name, case, rtol=1e-4, atol=1e-7)
    _check_owner_loss_trainer(runs, rtol=1e-4, atol=1e-6)


def test_trainer_steps_with_the_loss_at_owners_equal_steps_through_the_forward(owner_loss_run):
    """Three Adam steps with unequal per-rank batches: parameters and losses as the forward's path gives them."""
    _check_owner_loss_trainer(owner_loss_run, rtol=1e-4, atol=1e-6)


def test_loss_at_owners_refuses_bad_targets_before_exchanging(owner_loss_run):
    for res in owner_loss_run:
        assert res["bad_width"] == "target has last dimension 2; expected 3", res["bad_width"]
        assert res["bad_batch"] == f"target has batch {W.BATCH - 1}; expected {W.BATCH} to match x"
        assert res["bad_ids"] == f"net_ids contains {W.N_NETWORKS}; allowed: 0 <= id < n_networks={W.N_NETWORKS}"
        assert res["short_ids"] == f"net_ids must have shape ({W.BATCH},) to match the batch, got ({W.BATCH - 1},)"
        assert res["after_bad"] > 0  # the ranks are still in step


def _check_owner_loss_trainer(owner_loss_run, rtol, atol):
    for r, res in enumerate(owner_loss_run):
        fused, plain = res["trainer"][True], res["trainer"][False]
        for n, p in plain["params"].items():
            torch.testing.assert_close(fused["params"][n], p, rtol=rtol, atol=atol, msg=f"rank {r} {n}")
    # The forward's path returns each rank's own loss; the loss at the owners, their mean on every rank.
    for step in range(3):
        own = [res["trainer"][False]["losses"][step] for res in owner_loss_run]
        for res in owner_loss_run:
            assert res["trainer"][True]["losses"][step] == pytest.approx(sum(own) / WORLD, rel=rtol)


@pytest.fixture(scope="module")
def route_ahead_run(tmp_path_factory):
    return run_ranks("route_ahead", tmp_path_factory.mktemp("route_ahead"), TRITON_INTERPRET=1)


def _check_route_ahead(results, exact: bool):
    check = (lambda got, want, msg: torch.testing.assert_close(got, want, rtol=0, atol=0, msg=msg)) if exact else \
        (lambda got, want, msg: torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=msg))
    for r, res in enumerate(results):
        for name in W.AHEAD_CASES:
            ahead, plain = res[name]["ahead"], res[name]["one_by_one"]
            assert len(ahead["losses"]) == len(plain["losses"]) == 5
            if exact:
                assert ahead["losses"] == plain["losses"], (r, name)
            else:
                assert ahead["losses"] == pytest.approx(plain["losses"], rel=1e-4), (r, name)
            assert len(ahead["probes"]) == 1 and float(plain["probes"][0].abs().max()) > 0
            check(ahead["probes"][0], plain["probes"][0], f"rank {r} {name}: the forward between two steps")
            for n, p in plain["params"].items():
                assert float(p.abs().max()) > 0
                check(ahead["params"][n], p, f"rank {r} {name} {n}")
            assert not ahead["held"] and not plain["held"]
            # Steps 2 to 4 took the rows routed by the step before; the first, and the step after the loop, routed
            # their own.
            assert ahead["taken"] == [False, True, True, True, False] and plain["taken"] == [False] * 5, (r, name)
        assert res["lengths"].startswith(f"DistributedError: rank {r}: ranks disagree"), res["lengths"]
        assert "routing the next step's batch ahead" in res["lengths"] and "per rank = [0, 1]" in res["lengths"]


def test_training_steps_route_ahead_like_one_step_at_a_time(route_ahead_run):
    """`Trainer.training_steps` routes each step's next batch while the step computes: the same losses and
    parameters as `training_step` per batch, bit for bit on the CPU (unequal and empty per-rank batches, rows
    grouped by network with uneven ownership, two chunks), with a forward of its own between two steps and a plain
    step after leaving the loop early. Ranks whose batches end at different steps raise together."""
    _check_route_ahead(route_ahead_run, exact=True)


@two_gpus
def test_training_steps_route_ahead_over_nccl(tmp_path):
    """The same over NCCL, one GPU per rank: the next batch's routing on a side stream, the current step's compute
    on the compute stream (the grid's atomic adds sum in another order from run to run: a tolerance)."""
    _check_route_ahead(run_ranks("route_ahead", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0),
                       exact=False)


@pytest.mark.slow
@pytest.mark.parametrize("demo,args", [
    ("kilonerf.py", ["--teacher-steps", "10", "--distill-steps", "10", "--finetune-steps", "5", "--views", "4",
                     "--test-views", "1", "--res", "16", "--samples", "16"]),
    ("octree_lod.py", ["--steps", "10", "--views", "4", "--test-views", "1", "--res", "16", "--samples", "16",
                       "--batch", "256", "--points", "1000"]),
    ("octree_lod.py", ["--steps", "10", "--views", "4", "--test-views", "1", "--res", "16", "--samples", "16",
                       "--batch", "256", "--points", "1000", "--decoder", "shared"]),
])
def test_scene_demos_run_sharded_under_torchrun(tmp_path, demo, args):
    import json

    env = dict(os.environ, TINN_ARCH="cpu",
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
           os.path.join(os.path.dirname(HERE), "demos", demo), "--shard", "--small", "--out", str(tmp_path), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.load(open(tmp_path / "summary.json"))
    psnr = summary.get("psnr_student", summary.get("psnr"))
    # Trained above the background-only image, on rank 0's output; rank 1 wrote its own folder.
    assert psnr > summary.get("psnr_background", summary.get("background_psnr")) + 1.0
    assert (tmp_path / "rank1" / "summary.json").exists()
    if "far" in summary:
        # The octree's touched counts are over every node, though each rank holds half; one shared decoder is
        # counted once.
        far, per_node = summary["far"], summary["nodes"] * summary["params_per_node"]
        decoder = far["params_total"] - per_node
        assert decoder == 0 if summary["decoder"] == "per-node" else 0 < decoder < summary["params_per_node"]
        assert far["params_touched"] == far["nodes_touched"] * summary["params_per_node"] + decoder
        assert 0 < far["fraction_touched"] <= 1.0
