"""Where a field has matter and at what detail: occupancy grids for empty-space skipping, the octree that picks
a level of detail per sample, and the budget that sizes its nodes."""
from .occupancy import OccupancyGrid
from .octree import Octree
from .octree_occupancy import LevelOccupancy

__all__ = ["OccupancyGrid", "Octree", "LevelOccupancy"]
