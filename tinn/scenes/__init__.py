"""Scene data: posed images (NeRF-synthetic loader) and an analytic procedural scene with its ground truth."""
from .data import PosedImages, load_nerf_synthetic
from .procedural import ProceduralScene, render_views, surface_points

__all__ = ["PosedImages", "load_nerf_synthetic", "ProceduralScene", "render_views", "surface_points"]
