"""Where each panel sits in the viewer frame.

The frame is a fixed-size image (GGUI windows cannot change resolution on the fly):
a 3-column grid of panels with a title strip above each, and a sidebar on the right
for the controls (GGUI) or a status text (PNG fallback).

    prediction | reference | error          | sidebar
    networks   | net loss  | loss curve     |            (network arrays)
    loss curve ----------------------------  |            (single network)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

GAP = 8
TITLE = 14
SIDEBAR = 280
MIN_HEIGHT = 440  # room for the control panel's widgets


@dataclass(frozen=True)
class Rect:
    y: int
    x: int
    h: int
    w: int

    def crop(self, image: np.ndarray) -> np.ndarray:
        return image[self.y:self.y + self.h, self.x:self.x + self.w]


def auto_zoom(side: int, min_panel: int = 160, max_panel: int = 384) -> float:
    """Integer upscale for small images (crisp pixels), a shrink factor for big ones."""
    if side < min_panel:
        return float(math.ceil(min_panel / side))
    if side > max_panel:
        return max_panel / side
    return 1.0


@dataclass
class Layout:
    image_hw: tuple[int, int]
    arrays: bool  # network array: show ownership and per-network loss panels
    zoom: float | None = None
    panels: dict[str, Rect] = field(init=False)
    titles: dict[str, Rect] = field(init=False)
    sidebar: Rect = field(init=False)
    size: tuple[int, int] = field(init=False)  # (height, width) of the whole frame

    def __post_init__(self):
        h, w = self.image_hw
        if self.zoom is None:
            self.zoom = auto_zoom(max(h, w))
        ph, pw = max(1, round(h * self.zoom)), max(1, round(w * self.zoom))
        self.panel_hw = (ph, pw)
        row_h = TITLE + ph + GAP
        names = [["prediction", "reference", "error"],
                 ["ownership", "network_loss", "loss_curve"] if self.arrays else ["loss_curve"]]
        self.panels, self.titles = {}, {}
        for r, row in enumerate(names):
            for c, name in enumerate(row):
                y, x = GAP + r * row_h + TITLE, GAP + c * (pw + GAP)
                # The single-network loss curve gets the whole second row.
                width = 3 * pw + 2 * GAP if len(row) == 1 else pw
                self.panels[name] = Rect(y, x, ph, width)
                self.titles[name] = Rect(y - TITLE, x, TITLE, width)
        side_x = GAP + 3 * (pw + GAP)
        height = max(GAP + 2 * row_h, MIN_HEIGHT)
        self.sidebar = Rect(GAP, side_x, height - 2 * GAP, SIDEBAR)
        self.size = (height, side_x + SIDEBAR + GAP)
