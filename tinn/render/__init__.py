"""Volume rendering: camera rays, samples along them, differentiable compositing of packed samples, and a field's
rays and images rendered with them (`render_rays` for training, which is `sample_rays` then `shade`; `render_image`
for viewing); `octree` renders an octree field by level of detail (`tinn.scenes.OctreeField.render_image` calls
it)."""
from . import octree
from .compositing import Composited, composite, composite_dense
from .fields import (RaySamples, RenderedImage, RenderedRays, render_image, render_rays, sample_rays, seconds_per_frame,
                     shade, timed)
from .pending import PendingCount
from .rays import camera_rays, pixel_radius, ray_box
from .sampling import frame_runs, march, pack, stratified_t

__all__ = ["octree", "camera_rays", "pixel_radius", "ray_box", "stratified_t", "pack", "march", "frame_runs",
           "composite", "composite_dense", "Composited", "render_rays", "sample_rays", "shade", "RaySamples",
           "PendingCount", "render_image", "RenderedRays", "RenderedImage", "timed", "seconds_per_frame"]
