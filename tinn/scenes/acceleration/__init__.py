"""Where a field has matter and at what detail: occupancy grids for empty-space skipping, the visual hull of
posed images, the octree that picks a level of detail per sample, and the budget that sizes its nodes."""
from .occupancy import OccupancyGrid
from .octree import Octree
from .octree_occupancy import LevelOccupancy
from .visual_hull import visual_hull

__all__ = ["OccupancyGrid", "Octree", "LevelOccupancy", "visual_hull"]
