"""A dependency-free one-line progress bar."""
from __future__ import annotations

import sys
import time


class ProgressBar:
    def __init__(self, total: int, width: int = 30, stream=None):
        self.total, self.width = total, width
        self.stream = stream or sys.stdout
        self.start = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, step: int, **fields) -> None:
        done = int(self.width * step / max(self.total, 1))
        elapsed = time.perf_counter() - self.start
        rate = step / elapsed if elapsed > 0 else 0.0
        text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        line = f"[{'#' * done}{'.' * (self.width - done)}] {step}/{self.total} {text} {rate:.1f} steps/s"
        # On a terminal redraw in place; in logs print whole lines.
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
