"""Scene data: posed images and their loaders (NeRF-synthetic, instant-ngp, nerfstudio folders), meshes made into
posed images, and an analytic procedural scene with its ground truth. `mesh` is also a command,
`python -m tinn.scenes.data.mesh model.obj out/`, that writes a mesh's views as a NeRF-synthetic folder."""
from . import mesh
from .formats import load_scene
from .mesh import read_mesh, scene_from_mesh
from .posed_images import PosedImages, load_nerf_synthetic
from .procedural import ProceduralScene, render_views, surface_points

__all__ = ["mesh", "PosedImages", "load_nerf_synthetic", "load_scene", "read_mesh", "scene_from_mesh",
           "ProceduralScene", "render_views", "surface_points"]
