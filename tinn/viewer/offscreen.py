"""The fallback front end when GGUI cannot run: the numpy frame, status text included, written as PNG."""
from __future__ import annotations

import numpy as np


def write_png(path: str, image: np.ndarray) -> None:
    import imageio.v3 as iio

    iio.imwrite(path, image)


class PngFrontend:
    kind = "png"
    text_status = True  # no imgui: the status is drawn into the frame
    running = True
    visible = False

    def __init__(self, layout):
        self.layout = layout
        self.frame: np.ndarray | None = None

    def present(self, frame: np.ndarray, controller) -> None:
        self.frame = frame

    def save(self, path: str) -> None:
        if self.frame is None:
            raise RuntimeError("no frame presented yet")
        write_png(path, self.frame)

    def show(self) -> None:
        pass

    def close(self) -> None:
        pass
