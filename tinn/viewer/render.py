"""Build the viewer frame as a uint8 numpy image: panels, colour maps, loss curve, labels.

Everything here is plain numpy, so the GGUI window and the PNG fallback show (and
save) exactly the same pixels, and tests can check them without a display.
"""
from __future__ import annotations

import math

import numpy as np

from .font import GLYPH_H, draw_text
from .layout import Layout, Rect

BACKGROUND = (24, 24, 28)
PANEL_BG = (40, 40, 46)
TEXT = (225, 225, 225)
DIM = (150, 150, 160)
CURVE = (255, 170, 60)
GRID = (70, 70, 80)
ERROR_GAIN = 4.0  # mean abs error of 0.25 saturates the error map

# Dark-to-bright heat map: anchors at equal spacing, interpolated linearly per channel.
_HEAT = np.array([(0, 0, 0), (60, 20, 110), (190, 50, 80), (250, 150, 30), (255, 250, 200)], dtype=np.float32)


def as_numpy(image) -> np.ndarray:
    """torch tensor (any device) or array -> float32 numpy."""
    if hasattr(image, "detach"):
        image = image.detach().cpu().numpy()
    return np.asarray(image, dtype=np.float32)


def quantize(image: np.ndarray) -> np.ndarray:
    """[0,1] floats -> uint8, rounding to nearest (NaN shows as black)."""
    image = np.nan_to_num(np.asarray(image, dtype=np.float32), nan=0.0)
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def resize_nearest(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Nearest-neighbour resample; for an integer zoom k output pixel i shows input pixel i // k."""
    h, w = image.shape[:2]
    rows = np.minimum(((np.arange(height) + 0.5) * h / height).astype(np.int64), h - 1)
    cols = np.minimum(((np.arange(width) + 0.5) * w / width).astype(np.int64), w - 1)
    return image[rows[:, None], cols[None, :]]


def heat(values: np.ndarray) -> np.ndarray:
    """Values in [0,1] -> uint8 RGB of the heat colour map."""
    v = np.clip(np.nan_to_num(values, nan=0.0), 0.0, 1.0) * (len(_HEAT) - 1)
    lo = np.minimum(v.astype(np.int64), len(_HEAT) - 2)
    t = (v - lo)[..., None]
    return (_HEAT[lo] * (1 - t) + _HEAT[lo + 1] * t + 0.5).astype(np.uint8)


def to_rgb(image: np.ndarray) -> np.ndarray:
    """(H,W), (H,W,1), (H,W,2) or (H,W,>=3) floats -> (H,W,3): gray expanded, extra channels dropped."""
    if image.ndim == 2:
        image = image[..., None]
    c = image.shape[2]
    if c == 1:
        return np.repeat(image, 3, axis=2)
    if c == 2:  # e.g. a 2-D field: show as red/green
        return np.concatenate([image, np.zeros_like(image[..., :1])], axis=2)
    return image[..., :3]


def error_image(prediction: np.ndarray, reference: np.ndarray) -> np.ndarray:
    err = np.abs(np.clip(prediction, 0, 1) - reference).mean(axis=2)
    return heat(err * ERROR_GAIN)


def network_colors(n: int) -> np.ndarray:
    """A distinct-ish colour per network: golden-ratio hue steps, (n, 3) float in [0,1]."""
    hue = (np.arange(n) * 0.6180339887) % 1.0
    k = (np.array([5.0, 3.0, 1.0]) + hue[:, None] * 6.0) % 6.0  # HSV -> RGB with s=0.65, v=1
    return 1.0 - 0.65 * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0)


def ownership_image(base: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Tint each network's region over `base` (panel size) and outline region borders in white."""
    ids = ids.astype(np.int64)
    tint = network_colors(int(ids.max()) + 1)[ids]
    out = quantize(0.5 * np.clip(base, 0, 1) + 0.5 * tint)
    edge = np.zeros(ids.shape, dtype=bool)
    edge[:, 1:] |= ids[:, 1:] != ids[:, :-1]
    edge[1:, :] |= ids[1:, :] != ids[:-1, :]
    out[edge] = 255
    return out


def network_loss_image(losses: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, str]:
    """Per-network loss painted over each network's region, log scale; returns (image, range caption)."""
    logs = np.log10(np.maximum(losses, 1e-12))
    seen = losses > 0  # networks that got no samples report 0
    lo, hi = (logs[seen].min(), logs[seen].max()) if seen.any() else (0.0, 1.0)
    norm = np.where(seen, (logs - lo) / max(hi - lo, 1e-6), 0.0)
    return heat(norm[ids.astype(np.int64)]), f"{10 ** lo:.2g}..{10 ** hi:.2g}"


def _draw_line(img: np.ndarray, y0: float, x0: float, y1: float, x1: float, color) -> None:
    n = int(max(abs(y1 - y0), abs(x1 - x0))) + 1
    ys = np.rint(np.linspace(y0, y1, n + 1)).astype(np.int64)
    xs = np.rint(np.linspace(x0, x1, n + 1)).astype(np.int64)
    ok = (ys >= 0) & (ys < img.shape[0]) & (xs >= 0) & (xs < img.shape[1])
    img[ys[ok], xs[ok]] = color


def loss_curve_image(steps, losses, height: int, width: int) -> np.ndarray:
    """Loss against step on a log axis, with a line per decade; drawn with numpy only."""
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[:] = PANEL_BG
    steps = np.asarray(steps, dtype=np.float64)
    losses = np.asarray(losses, dtype=np.float64)
    keep = np.isfinite(losses) & (losses > 0)
    steps, logs = steps[keep], np.log10(losses[keep])
    if logs.size == 0:
        draw_text(img, "NO DATA YET", height // 2 - GLYPH_H // 2, 8, DIM)
        return img
    left, right, top, bottom = 40, width - 6, 6, height - 14
    lo, hi = math.floor(logs.min()), math.ceil(logs.max())
    hi = max(hi, lo + 1)

    def y_of(v):
        return bottom - (v - lo) / (hi - lo) * (bottom - top)

    for d in range(lo, hi + 1):
        y = int(round(y_of(d)))
        img[y, left:right + 1] = GRID
        draw_text(img, f"1E{d}", y - GLYPH_H // 2, 2, DIM)
    s0, s1 = steps.min(), max(steps.max(), steps.min() + 1)
    xs = left + (steps - s0) / (s1 - s0) * (right - left)
    # Many more steps than pixels: average per pixel column so the line stays readable.
    cols = np.rint(xs).astype(np.int64)
    uniq, inv = np.unique(cols, return_inverse=True)
    ys = y_of(np.bincount(inv, weights=logs) / np.bincount(inv))
    if uniq.size == 1:
        _draw_line(img, ys[0], uniq[0] - 2, ys[0], uniq[0] + 2, CURVE)
    for i in range(uniq.size - 1):
        _draw_line(img, ys[i], uniq[i], ys[i + 1], uniq[i + 1], CURVE)
    draw_text(img, f"{int(s0)}", height - GLYPH_H - 2, left, DIM)
    label = f"STEP {int(steps.max())}"
    draw_text(img, label, height - GLYPH_H - 2, right - len(label) * 6, DIM)
    return img


def standalone_loss_curve(steps, losses, height: int = 300, width: int = 600) -> np.ndarray:
    """The final loss-curve picture written at the end of a run: curve plus a title."""
    img = np.empty((height + 20, width, 3), dtype=np.uint8)
    img[:] = BACKGROUND
    last = f"  FINAL {losses[-1]:.4g}" if len(losses) else ""
    draw_text(img, f"TRAINING LOSS{last}", 6, 6, TEXT)
    img[20:] = loss_curve_image(steps, losses, height, width)
    return img


def compose(layout: Layout, panels: dict[str, np.ndarray], titles: dict[str, str],
            status: list[str] | None = None) -> np.ndarray:
    """Paste uint8 panels (each exactly its Rect's size) into one frame; status text goes in the sidebar."""
    frame = np.empty(layout.size + (3,), dtype=np.uint8)
    frame[:] = BACKGROUND
    for name, rect in layout.panels.items():
        image = panels.get(name)
        target = rect.crop(frame)
        if image is None:
            target[:] = PANEL_BG
        else:
            target[:] = image
        title_rect: Rect = layout.titles[name]
        draw_text(frame, titles.get(name, name.upper()), title_rect.y + 3, title_rect.x, TEXT)
    if status:
        sb = layout.sidebar
        for i, line in enumerate(status):
            draw_text(frame, line, sb.y + 4 + i * (GLYPH_H + 6), sb.x + 4, TEXT)
    return frame
