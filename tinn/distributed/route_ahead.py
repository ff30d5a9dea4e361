"""The next training step's batch routed while the current step computes.

    steps = trainer.training_steps(batches)     # tinn/trainer.py: pulls batches ahead and hands them here
    part.gradients_from_loss(x, ids, loss, target, need_dx=False, ahead=NextBatch(x2, ids2, target2, then=True))

A sharded step with the loss at the owners (`ShardedPart.gradients_from_loss`) first routes its batch: counts by
owner, a header whose split sizes the host must read, the rows' sort and packing, the all_to_all, the owner's
unpacking. The host's read of the header is the step's one synchronisation, and before it the device has nothing
to do. Given the next step's batch, the step routes it on a side stream while its own local part computes: the
count and the header go out before the local part's launches, the host reads the header after them (by then the
device has long answered it), and the packing, the rows' all_to_all and their unpacking run beside the compute.
The next step finds its rows unpacked and starts computing at once: no header wait, no exchange passes in front
of its compute.

Ranks must agree on it: each header says whether the step it routes will route the batch after it ahead
(`part.NextBatch.then`), so ranks whose batch iterators end at different steps raise together instead of issuing
mismatched collectives.

The next batch's header and rows travel on a second process group over the same ranks (`process.side_group`):
queued on the step's own group, they would stand between the step's compute and its collectives (the loss's
all-reduce would wait for the next batch's rows), and on NCCL its high-priority stream lets them move while the
step's kernels hold the GPU.

Streams: the side stream waits for the compute stream once, where the next batch was made (before this
step's compute is issued); what it issues after the compute must not wait for the compute, so it does not wait
again. Tensors it allocates come from its own allocator pool; those the compute stream reads (the unpacked rows,
the merge tables) are recorded on the compute stream when it takes them, so the side pool does not reuse their
memory while the compute stream still reads it. At the end of the step the compute stream waits for the packing
(an event, not the unpacking, which waits for the rows to arrive), so whatever the caller does next with the next
batch's tensors comes after the packing read them; the next step's compute waits for the unpacking.
On the CPU (gloo) there are no streams: the same calls run in order.
"""
from __future__ import annotations

import contextlib
from dataclasses import fields, is_dataclass

import torch


class SideStream:
    """A CUDA stream for routing ahead, or nothing on the CPU."""

    def __init__(self, device: torch.device):
        # High priority: the routing's kernels interleave with the step's instead of waiting for the SMs to drain.
        self.stream = torch.cuda.Stream(device=device, priority=-1) if device.type == "cuda" else None

    @contextlib.contextmanager
    def issue(self, after_current: bool):
        """Make the side stream current. `after_current`: first wait for what the current stream has queued (the
        next batch was made there); False for work that must not wait for the compute queued since."""
        if self.stream is None:
            yield
            return
        if after_current:
            self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield

    def record(self):
        """An event at the side stream's current end (None on the CPU)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event) -> None:
        """The current stream waits for `event` (`record`)."""
        if event is not None:
            torch.cuda.current_stream(self.stream.device).wait_event(event)

    def hand_over(self, *objects) -> None:
        """Record every tensor in `objects` (nested in lists, tuples and dataclasses) on the current stream: their
        memory came from the side stream's pool, and the current stream will read them."""
        if self.stream is None:
            return
        current = torch.cuda.current_stream(self.stream.device)
        pending = list(objects)
        while pending:
            obj = pending.pop()
            if isinstance(obj, torch.Tensor):
                if obj.is_cuda:
                    obj.record_stream(current)
            elif isinstance(obj, (list, tuple)):
                pending.extend(obj)
            elif is_dataclass(obj) and not isinstance(obj, type):
                pending.extend(getattr(obj, f.name) for f in fields(obj))
