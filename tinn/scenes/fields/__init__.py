"""Radiance fields made of tinn networks: torch modules mapping points (M, 3) to density (M,) and colour (M, 3)."""
from .kilonerf import KiloNeRF
from .octree_field import OctreeField
from .radiance import HashGridField, RenderedField

__all__ = ["HashGridField", "RenderedField", "KiloNeRF", "OctreeField"]
