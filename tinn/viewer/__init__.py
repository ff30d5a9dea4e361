"""Interactive training viewer on Taichi GGUI, with a headless PNG mode for servers and CI.

    from tinn.viewer import Viewer, run_viewer
    run_viewer(trainer, task, steps=300, headless=True, out_dir="out/viewer")   # ImageTask + Trainer
    Viewer(my_source, headless=True).run(steps=100)                            # any source, see .source
"""
from .app import BACKEND_ENV, Viewer, open_frontend, run_viewer
from .controller import ViewerController
from .orbit import OrbitCamera
from .source import ImageTrainerSource
from .window import ViewerUnavailable, vulkan_installed

__all__ = ["BACKEND_ENV", "ImageTrainerSource", "OrbitCamera", "Viewer", "ViewerController", "ViewerUnavailable",
           "open_frontend", "run_viewer", "vulkan_installed"]
