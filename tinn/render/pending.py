"""A count computed on the device, read on the host later without draining the device.

Reading a device value (`int(t)`, `.item()`, `torch.nonzero`) waits until the device has finished everything
issued before the read, so the host cannot queue the next work meanwhile. `PendingCount` starts the copy to
host memory at once (non-blocking, into pinned memory) and records an event behind it; `value()` waits for that
event only. Read one step after it was started (a training step sampling its next batch ahead), the wait is over
before it begins, and the host stays a step ahead of the device.
"""
from __future__ import annotations

import torch


class PendingCount:
    """An integer held by a one-element device tensor, on its way to the host; `value()` reads it."""

    def __init__(self, count: torch.Tensor):
        count = count.reshape(1)
        if count.device.type == "cuda":
            self._host = torch.empty(1, dtype=count.dtype, pin_memory=True)
            self._host.copy_(count, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:  # the CPU's values are there already
            self._host, self._event = count, None
        self._value: int | None = None

    def ready(self) -> bool:
        """Whether `value()` would return without waiting."""
        return self._value is not None or self._event is None or self._event.query()

    def value(self) -> int:
        """The count: waits for the device only up to the work issued before the copy."""
        if self._value is None:
            if self._event is not None:
                self._event.synchronize()
            self._value = int(self._host[0])
        return self._value
