"""Scenes for radiance fields, by concern: `data` (posed images, scene folders, meshes, an analytic scene with its
ground truth), `fields` (radiance fields made of tinn networks: one hash grid, KiloNeRF's grid of cells, an octree of
level-of-detail nodes), `acceleration` (occupancy grids and octrees that skip empty space and choose levels of
detail) and `training` (photometric training, distillation, level-of-detail evaluation). Rendering a field is
`tinn.render` (`render_rays`, `render_image`). The names below are the supported ones; each subpackage lists its own.
"""
from .acceleration import LevelOccupancy, OccupancyGrid, Octree
from .data import PosedImages, ProceduralScene, load_nerf_synthetic, load_scene, read_mesh, render_views, \
    scene_from_mesh, surface_points
from .fields import HashGridField, KiloNeRF, OctreeField, RenderedField
from .training import Distiller, OctreeTrainer, PhotometricTrainer

__all__ = ["PosedImages", "load_nerf_synthetic", "load_scene", "read_mesh", "scene_from_mesh", "ProceduralScene",
           "render_views", "surface_points", "HashGridField", "RenderedField", "KiloNeRF", "OctreeField",
           "OccupancyGrid", "LevelOccupancy", "Octree", "PhotometricTrainer", "OctreeTrainer", "Distiller"]
