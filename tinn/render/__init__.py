"""Volume rendering: camera rays, samples along them, and differentiable compositing of packed samples."""
from .compositing import Composited, composite, composite_dense
from .rays import camera_rays, pixel_radius, ray_box
from .sampling import frame_runs, march, pack, stratified_t

__all__ = ["camera_rays", "pixel_radius", "ray_box", "stratified_t", "pack", "march", "frame_runs", "composite", "composite_dense",
           "Composited"]
