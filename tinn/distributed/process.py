"""The process group of a sharded run: one process per GPU, started by torchrun.

`init()` must run before anything initialises CUDA or Taichi in the process: Taichi uses device 0 of
the devices it sees, so each rank's process must see only its own GPU. Under torchrun (LOCAL_RANK set)
`init()` narrows CUDA_VISIBLE_DEVICES to the rank's GPU, then initialises tinn, then the process group
(NCCL on CUDA, gloo on the CPU) with the collective timeout of the settings.

Every collective of tinn.distributed goes through `collective()`, which turns the errors a dead or
late peer causes into a `DistributedError` naming the rank and the operation.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import os

import torch
import torch.distributed as dist

from .. import runtime
from ..errors import ConfigError, DistributedError

BACKENDS = ("nccl", "gloo")


# torch renamed the flat collectives (the old names warn); either takes (output, input, ..., group=...).
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _pin_local_gpu(local_rank: int) -> None:
    """Leave this process one GPU, the LOCAL_RANK-th of those it was given (torchrun gives every rank all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e for e in visible.split(",") if e.strip()] if visible is not None else None
    if entries is not None and len(entries) == 1:
        return  # already one device per process (set by the user or a scheduler)
    if runtime.is_initialized() or torch.cuda.is_initialized():
        raise ConfigError("tinn.distributed.init() must run before tinn.init() and before any CUDA use in the "
                          "process: it narrows CUDA_VISIBLE_DEVICES to the rank's GPU, and Taichi uses device 0 "
                          "of the devices it sees (or set CUDA_VISIBLE_DEVICES to one GPU per rank yourself)")
    if entries is None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
    elif local_rank < len(entries):
        os.environ["CUDA_VISIBLE_DEVICES"] = entries[local_rank].strip()
    else:
        raise ConfigError(f"LOCAL_RANK={local_rank} but CUDA_VISIBLE_DEVICES={visible!r} lists {len(entries)} "
                          "devices; allowed: one device per local rank")


def init(arch: str | None = None, *, backend: str | None = None, collective_timeout_s: int | None = None,
         settings=None) -> str:
    """Join the process group started by torchrun (or by RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT).

    arch: tinn's arch ("cuda", "cpu", "auto"; default TINN_ARCH or auto). backend: "nccl" or "gloo"
    (default NCCL on CUDA, gloo on the CPU). collective_timeout_s: how long a collective may wait for the other
    ranks (default: the settings' `collective_timeout_s`). Returns tinn's arch. Calling it again in an
    initialised process returns the arch.
    """
    local_rank = os.environ.get("LOCAL_RANK")
    wants_cpu = (arch or os.environ.get("TINN_ARCH", "auto")) == "cpu"
    if local_rank is not None and not wants_cpu:
        _pin_local_gpu(int(local_rank))
    chosen = runtime.init(arch, settings=settings) if settings is not None else runtime.init(arch)
    if dist.is_initialized():
        return chosen
    if backend is None:
        backend = "nccl" if chosen == "cuda" else "gloo"
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r} is not supported; allowed: {list(BACKENDS)}")
    if backend == "nccl" and chosen != "cuda":
        raise ConfigError("backend='nccl' needs tinn's CUDA arch; allowed on the CPU: 'gloo'")
    timeout = runtime.settings().collective_timeout_s if collective_timeout_s is None else collective_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"collective_timeout_s={timeout!r} must be a positive number of seconds")
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"environment variables {missing} are not set: launch with torchrun "
                          "(torchrun --nproc_per_node N script.py) or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT")
    kwargs = {}
    if backend == "nccl":
        torch.cuda.set_device(0)  # the one device this process sees
        kwargs["device_id"] = torch.device("cuda", 0)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout)), **kwargs)
    return chosen


def shutdown() -> None:
    """Leave the process group (call at the end of a script so the backend shuts down cleanly)."""
    if dist.is_initialized():
        # Every rank reaches the end before any tears its connections down: a rank that left while a peer was
        # still sending made gloo abort the peer at exit.
        dist.barrier()
        # Garbage that still refers to the process group or to a collective's tensors is freed now, while the
        # interpreter runs: freed during its shutdown instead, gloo's worker thread releases the tensors of a
        # finished collective, cannot take the GIL there and aborts the process.
        gc.collect()
        _SIDE_GROUPS.clear()
        dist.destroy_process_group()
        gc.collect()


def require_group(group=None):
    if not dist.is_initialized():
        raise ConfigError("tinn.distributed needs a process group: call tinn.distributed.init() first "
                          "(under torchrun), or torch.distributed.init_process_group()")
    return group if group is not None else dist.group.WORLD


# side_group's groups, by the ranks of the group they stand beside.
_SIDE_GROUPS: dict = {}


def side_group(group=None):
    """A second process group over the ranks of `group` (the world for None), made at the first call on every rank
    of the group and kept until `shutdown()`: its collectives run on a communicator, and with NCCL a high-priority
    stream, of their own, so they neither wait in the group's queue nor hold it up. Routing the next step's batch
    ahead (tinn/distributed/route_ahead.py) sends on it while the step's own collectives go on `group`."""
    group = require_group(group)
    ranks = tuple(dist.get_process_group_ranks(group))
    side = _SIDE_GROUPS.get(ranks)
    if side is not None:
        try:
            dist.get_rank(side)
            return side
        except (ValueError, RuntimeError):  # destroyed with the process group it came from
            pass
    backend = dist.get_backend(group)
    options = None
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = True  # its kernels take SMs as the step's kernels free them
    with collective("making the side group", group):
        side = dist.new_group(list(ranks), backend=backend, pg_options=options, use_local_synchronization=True)
    _SIDE_GROUPS[ranks] = side
    return side


def rank(group=None) -> int:
    return dist.get_rank(require_group(group))


def world_size(group=None) -> int:
    return dist.get_world_size(require_group(group))


def collective_device(group=None) -> torch.device:
    """Where tensors for the group's collectives live: the GPU for NCCL, the CPU for gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(require_group(group)) == "nccl" \
        else torch.device("cpu")


@contextlib.contextmanager
def collective(what: str, group=None):
    """Run collectives, turning a failure (a peer exited, a timeout) into a DistributedError."""
    try:
        yield
    except DistributedError:
        raise
    except (RuntimeError, dist.DistBackendError) as e:  # gloo and NCCL report dead / late peers so
        me = dist.get_rank(group) if dist.is_initialized() else "?"
        raise DistributedError(f"rank {me}: {what} failed: another rank exited, crashed or did not reach the same "
                               f"collective within the timeout (settings.collective_timeout_s); cause: "
                               f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


def agree_on_overflow(scalers, device: torch.device, group, what: str,
                      loss: torch.Tensor | None = None) -> torch.Tensor | None:
    """Every rank's float16 gradient scalers learn whether any rank's gradients overflowed: each scaler's
    `found_inf` (1 where a rank's overflowed) summed over ranks on the device and clamped back to 1 (no host sync),
    so every rank takes the same decision to skip a step and tables several ranks hold are stepped or skipped alike.
    `loss`: a step's 0-d loss, summed over ranks in the same all-reduce (each collective costs host time and
    latency) and returned on its device; None without one."""
    flags = [s.found_inf.reshape(()) for s in scalers]
    values = ([] if loss is None else [loss.reshape(()).float()]) + flags
    if not values:
        return None
    totals = torch.stack(values).to(device)
    with collective(what, group):
        dist.all_reduce(totals, group=group)
    if flags:
        for s, total in zip(scalers, totals[len(values) - len(flags):].to(flags[0].device)):
            torch.clamp(total, max=1.0, out=s.found_inf)
    return None if loss is None else totals[0].to(loss.device)


def all_gather_objects(obj, what: str, group=None) -> list:
    """Every rank's `obj` (small, picklable), in rank order."""
    out = [None] * world_size(group)
    with collective(what, group):
        dist.all_gather_object(out, obj, group=group)
    return out


def start_script(args) -> str:
    """For scripts with `--shard`, `--arch`, `--seed` and `--out` options (the scene demos): tinn initialised,
    and with `args.shard` the process group too; each rank then draws its own batches
    (`args.batch_seed` differs per rank) and only rank 0 prints and writes to `args.out` (the others write
    under `args.out/rank<k>`). Returns the arch."""
    args.batch_seed = args.seed
    if not args.shard:
        return runtime.init(args.arch)
    arch = init(args.arch)
    k = rank()
    args.batch_seed = args.seed + 7919 * k
    if k:
        args.out = os.path.join(args.out, f"rank{k}")
        import sys
        sys.stdout = open(os.devnull, "w")
    return arch
