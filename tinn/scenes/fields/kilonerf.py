"""KiloNeRF: the scene box cut into a regular G^3 grid of cells, one tiny MLP per cell.

All G^3 networks live in ONE tinn network array (`NetworkWithInputEncoding`, n_networks=G^3), so a
batch of samples from anywhere in the scene is evaluated in one launch: every sample carries the id
of its cell. A cell's network sees the sample's position relative to the cell (local coordinates in
[-1, 1]^3), so each network only has to model its own small piece of space.

Cell ids: cell (ix, iy, iz) has id (ix * G + iy) * G + iz; ix grows with x. A point on a face between
two cells belongs to the upper cell, a point on box_max to the last cell.

Per cell: Frequency encoding (sin/cos of 2^k pi u, k < n_frequencies) of u = local / 2 in
[-0.5, 0.5]^3 — halving keeps opposite faces of a cell apart (sin/cos of pi * local would map
local = -1 and +1 to the same code) — then an MLP of `n_neurons` (32) with `n_hidden_layers` (2)
hidden ReLU layers and 4 outputs: sigma = exp(min(raw, 15)) (`training.density_activation`) and
rgb = sigmoid. No view dependence: the scenes here are diffuse.

Training (see `demos/kilonerf.py`): a `HashGridField` teacher learns the images, an `OccupancyGrid`
is filled from its density, `Distiller` (tinn/scenes/training/distillation.py) fits every cell to the teacher
at random points of occupied space, then `PhotometricTrainer` fine-tunes the student through the compositor with
empty space skipped.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import check_points
from ...errors import InputError
from ...models import NetworkWithInputEncoding
from ..acceleration.occupancy import OccupancyGrid, as_box
from .radiance import activate

__all__ = ["CellCoords", "KiloNeRF", "cell_of"]

MAX_GRID = 64  # 262144 cells; beyond that the per-cell networks see too few samples to train


@dataclass
class CellCoords:
    ids: torch.Tensor      # (M,) int32 cell id, clamped to the nearest cell for points outside the box
    local: torch.Tensor    # (M, 3) float32 position within the cell, in [-1, 1]^3 (clamped)
    inside: torch.Tensor   # (M,) bool: the point lies in the box (faces included)


def check_grid(grid) -> int:
    if isinstance(grid, bool) or not isinstance(grid, int) or not 1 <= grid <= MAX_GRID:
        raise InputError(f"grid={grid!r} is out of range; allowed: an integer in 1..{MAX_GRID} (cells per axis)")
    return grid


def cell_of(points: torch.Tensor, box_min: torch.Tensor, box_max: torch.Tensor, grid: int) -> CellCoords:
    """The cell of each point on a `grid`^3 split of [box_min, box_max], its local coordinates and an inside flag."""
    points = check_points("points", points)
    grid = check_grid(grid)
    cell_size = (box_max - box_min) / grid
    scaled = (points - box_min) / cell_size  # in [0, grid] inside the box
    inside = ((points >= box_min) & (points <= box_max)).all(dim=1)
    q = torch.floor(scaled).clamp_(0, grid - 1)
    local = ((scaled - q) * 2.0 - 1.0).clamp_(-1.0, 1.0)
    q = q.to(torch.int32)
    ids = (q[:, 0] * grid + q[:, 1]) * grid + q[:, 2]
    return CellCoords(ids.contiguous(), local.contiguous(), inside)


class KiloNeRF(torch.nn.Module):
    """A field (see `tinn.scenes.fields`) made of grid^3 tiny networks, one per cell, in one network array."""

    def __init__(self, box_min, box_max, grid: int = 16, n_frequencies: int = 4, n_neurons: int = 32,
                 n_hidden_layers: int = 2, occupancy: OccupancyGrid | None = None, seed: int = 1337):
        super().__init__()
        self.grid = check_grid(grid)
        lo, hi = as_box(box_min, box_max)
        self.register_buffer("box_min", lo)
        self.register_buffer("box_max", hi)
        self.encoding_config = {"otype": "Frequency", "n_frequencies": n_frequencies}
        self.network_config = {"otype": "FullyFusedMLP", "n_neurons": n_neurons, "n_hidden_layers": n_hidden_layers,
                               "activation": "ReLU", "output_activation": "None"}
        self.networks = NetworkWithInputEncoding(3, 4, self.encoding_config, self.network_config,
                                                 n_networks=self.grid ** 3, seed=seed)
        self.occupancy = occupancy  # used by tinn.render.render_image(model, ...) for empty-space skipping

    @property
    def n_networks(self) -> int:
        return self.grid ** 3

    def cell_of(self, points: torch.Tensor) -> CellCoords:
        return cell_of(points, self.box_min, self.box_max, self.grid)

    def network_inputs(self, points: torch.Tensor) -> CellCoords:
        """`cell_of` in one kernel pass, with the local coordinates halved (the networks' input, see above)."""
        from ...kernels.cells import cell_coords

        points = check_points("points", points).contiguous()
        m = points.shape[0]
        ids = torch.empty(m, dtype=torch.int32, device=points.device)
        local = torch.empty(m, 3, device=points.device)
        inside = torch.empty(m, dtype=torch.uint8, device=points.device)
        if m:
            cell_coords(points, self._cell_box(points.device), self.grid, 0.5, ids, local, inside)
        return CellCoords(ids, local, inside.view(torch.bool))

    def _cell_box(self, device: torch.device) -> torch.Tensor:
        """The cell kernel's box record (box_min, box_max, cell size), built once per state of the box: three
        torch ops a call otherwise, each a launch the host pays for."""
        lo, hi = self.box_min, self.box_max
        state = (lo._version, hi._version, device)
        kept = self.__dict__.get("_cell_box_kept")
        if kept is None or kept[0] is not lo or kept[1] is not hi or kept[2] != state:
            box = torch.cat([lo, hi, (hi - lo) / self.grid]).to(device).contiguous()
            kept = self.__dict__["_cell_box_kept"] = (lo, hi, state, box)
        return kept[3]

    def raw(self, points: torch.Tensor) -> torch.Tensor:
        """(M, 4) raw outputs, every sample through its cell's network, all cells in one launch."""
        cells = self.network_inputs(points)
        return self.networks(cells.local, cells.ids)

    def forward(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sigma (M,), rgb (M, 3); points outside the box get sigma 0."""
        cells = self.network_inputs(points)
        sigma, rgb = activate(self.networks(cells.local, cells.ids))
        return torch.where(cells.inside, sigma, torch.zeros_like(sigma)), rgb

    def density(self, points: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.forward(points)[0]

    def memory_bytes(self) -> int:
        """Bytes of network parameters (plus the occupancy grid's booleans when one is attached)."""
        return self.networks.memory_bytes() + (self.occupancy.memory_bytes() if self.occupancy is not None else 0)
